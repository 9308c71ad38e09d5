/*-------------------------------------------------------------------------
 *
 * stateformat.h
 *	  The state file's sections: the one list of their tags, and how a
 *	  layer writes a section of its own.
 *
 * A state file (statefile/statefile.c) is a header, then sections, each a
 * header (tag, size of one item, count) and its items, then an END section
 * and a CRC.  A reader skips a section whose tag it does not know or whose
 * items are not of the size it expects, so a new section needs no new file
 * version.  Every tag is listed here, whichever layer writes it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_STATEFORMAT_H
#define FAIRSHARE_STATEFORMAT_H

#include "lib/stringinfo.h"

typedef enum FsSectionTag
{
	FS_SECTION_QUEUES = 1,		/* FsQueueKey; a queue's index is its order */
	FS_SECTION_TENANTS = 2,		/* FsTenant, key.queue_id = queue index */
	FS_SECTION_LEASES = 3,		/* FsLeaseRecord (statefile.c) */
	FS_SECTION_STATS = 4,		/* FsGlobalStats */
	FS_SECTION_FAIRQ_QUEUES = 5,	/* each queue's fair-order state (fairq) */
	FS_SECTION_FAIRQ_CLAIMS = 6,	/* the claim map (fairq) */
	FS_SECTION_END = 0xFFFF
} FsSectionTag;

typedef struct FsSectionHeader
{
	uint32		tag;
	uint32		item_size;
	uint64		count;
} FsSectionHeader;

/*
 * Start a section in `buf`: returns where its header is, for
 * fs_state_section_end() to fill in the count once the items are written.
 */
static inline Size
fs_state_section_begin(StringInfo buf, FsSectionTag tag, uint32 item_size)
{
	FsSectionHeader header = {tag, item_size, 0};
	Size		at = buf->len;

	appendBinaryStringInfo(buf, (char *) &header, sizeof(header));
	return at;
}

static inline void
fs_state_section_end(StringInfo buf, Size at, uint64 count)
{
	((FsSectionHeader *) (buf->data + at))->count = count;
}

#endif							/* FAIRSHARE_STATEFORMAT_H */

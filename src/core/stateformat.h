/*-------------------------------------------------------------------------
 *
 * stateformat.h
 *	  The state file's sections: the one list of their tags, and how a
 *	  layer writes a section of its own.
 *
 * A state file (statefile/statefile.c) is a header, then sections, each a
 * header (tag, item size, count) and its items, then an END section and a
 * CRC.  Every tag is listed here, whichever layer writes it; a reader skips
 * a section whose tag it does not know.
 *
 * Since format version 3 an item is written field by field (item size 0
 * in its section's header): a 2-byte length of what follows, then fields,
 * each a 1-byte field id, a 1-byte length and the value's bytes.  A reader
 * takes the fields it knows, with the length it expects, and skips the
 * others; a field it finds missing keeps its default.  So a field can be
 * added (with a new id: ids are never reused) or dropped without a new
 * format version, and no struct's layout is ever on disk.  Each section's
 * field ids are listed next to the code that writes it.  Files of versions
 * 1 and 2 had fixed-size items (item size > 0), and are still read for
 * their queues and leases.
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
	FS_SECTION_LEASES_GONE = 7,	/* WAL only: ids of leases removed */
	FS_SECTION_TENANTS_GONE = 8,	/* WAL only: tenants evicted */
	FS_SECTION_HEARTBEATS = 9,	/* WAL only: the whole heartbeat table (gate) */
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

/* Start a field-by-field item: returns where its length goes. */
static inline Size
fs_state_item_begin(StringInfo buf)
{
	uint16		len = 0;
	Size		at = buf->len;

	appendBinaryStringInfo(buf, (char *) &len, sizeof(len));
	return at;
}

/* End the item begun at `at`: write its length. */
static inline void
fs_state_item_end(StringInfo buf, Size at)
{
	uint16		len = (uint16) (buf->len - at - sizeof(uint16));

	Assert(buf->len - at - sizeof(uint16) <= PG_UINT16_MAX);
	memcpy(buf->data + at, &len, sizeof(len));
}

/*
 * Is there room for one more item of at most `max_bytes` without enlarging
 * `buf`?  Writers that visit entries under a lock make room before it (for
 * every entry, at the most an item of theirs takes), and check this for
 * each item: no allocation under the lock.
 */
static inline bool
fs_state_item_fits(StringInfo buf, Size max_bytes)
{
	return (Size) (buf->maxlen - buf->len) > max_bytes;
}

/* A field of `len` bytes (at most 255). */
static inline void
fs_state_put(StringInfo buf, uint8 field, const void *value, uint8 len)
{
	appendBinaryStringInfo(buf, (char *) &field, 1);
	appendBinaryStringInfo(buf, (char *) &len, 1);
	appendBinaryStringInfo(buf, (const char *) value, len);
}

#define fs_state_put_value(buf, field, value) \
	fs_state_put((buf), (field), &(value), sizeof(value))

/*
 * A name (tenant, queue: terminated, at most FS_NAME_MAXLEN bytes) as a
 * field: its bytes, without the terminator.
 */
static inline void
fs_state_put_name(StringInfo buf, uint8 field, const char *name)
{
	size_t		len = strlen(name);

	Assert(len <= PG_UINT8_MAX);
	fs_state_put(buf, field, name, (uint8) len);
}

/* An item being read: its fields, and where the next one starts. */
typedef struct FsStateItem
{
	const char *data;
	uint16		len;
	uint16		pos;
} FsStateItem;

/*
 * The next item of a field-by-field section, from `data` (of `avail`
 * bytes) at *pos; false when it does not fit (a damaged file).
 */
static inline bool
fs_state_item_next(const char *data, Size avail, Size *pos, FsStateItem *item)
{
	uint16		len;

	if (avail - *pos < sizeof(len))
		return false;
	memcpy(&len, data + *pos, sizeof(len));
	if (avail - *pos - sizeof(len) < len)
		return false;
	item->data = data + *pos + sizeof(len);
	item->len = len;
	item->pos = 0;
	*pos += sizeof(len) + len;
	return true;
}

/* The item's next field; false at its end (or where a field does not fit). */
static inline bool
fs_state_field_next(FsStateItem *item, uint8 *field, const char **value, uint8 *len)
{
	if (item->len - item->pos < 2)
		return false;
	*field = (uint8) item->data[item->pos];
	*len = (uint8) item->data[item->pos + 1];
	if (item->len - item->pos - 2 < *len)
		return false;
	*value = item->data + item->pos + 2;
	item->pos += 2 + *len;
	return true;
}

/* A fixed-size field's value, if it has the size expected. */
static inline bool
fs_state_field_get(const char *value, uint8 len, void *out, Size size)
{
	if (len != size)
		return false;
	memcpy(out, value, size);
	return true;
}

#define fs_state_field_value(value, len, out) \
	fs_state_field_get((value), (len), &(out), sizeof(out))

/*
 * A name field, into `out` (`size` bytes): 1 to size - 1 bytes, none of
 * them a terminator.
 */
static inline bool
fs_state_field_name(const char *value, uint8 len, char *out, Size size)
{
	if (len == 0 || len >= size || memchr(value, '\0', len) != NULL)
		return false;
	memcpy(out, value, len);
	out[len] = '\0';
	return true;
}

#endif							/* FAIRSHARE_STATEFORMAT_H */

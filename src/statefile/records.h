/*-------------------------------------------------------------------------
 *
 * records.h
 *	  The state file's items, field by field (records.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_RECORDS_H
#define FAIRSHARE_RECORDS_H

#include "core/shmem.h"
#include "core/stateformat.h"
#include "slots/slots.h"

/* The most bytes an item of each section takes (room made before locks). */
#define FS_TENANT_ITEM_MAX	(2 + 6 + (2 + FS_NAME_MAXLEN) + 10 * 10 + 2 * 6 + 3 + \
							 (2 + 8 * FS_NUM_TENANT_REASONS))
#define FS_LEASE_ITEM_MAX	(2 + 10 + 6 + 2 + FS_NAME_MAXLEN + 10 + 10 + 6 + 3)

/* A lease as read, from any version. */
typedef struct FsLeaseRecord
{
	int64		lease_id;
	uint32		queue_index;
	char		tenant[FS_NAME_BUFLEN];
	TimestampTz acquired_at;
	TimestampTz expires_at;
	Oid			owner;
	uint8		state;			/* FsLeaseState (LIVE when the item has none) */
} FsLeaseRecord;

extern void fs_state_write_queue(StringInfo buf, const FsQueueKey *key);
extern void fs_state_write_queue_at(StringInfo buf, uint32 index, const FsQueueKey *key);
extern void fs_state_write_tenant(StringInfo buf, const FsTenant *tenant);
extern void fs_state_write_lease(StringInfo buf, const FsLeaseInfo *lease);
extern void fs_state_write_stats(StringInfo buf, const FsGlobalStats *stats);
extern void fs_state_read_queue(FsStateItem *item, FsQueueKey *key);
extern bool fs_state_read_queue_at(FsStateItem *item, FsQueueKey *key, uint32 *index);
extern bool fs_state_read_tenant(FsStateItem *item, FsTenant *record, uint32 *queue_index,
								 TimestampTz now);
extern bool fs_state_read_lease(FsStateItem *item, FsLeaseRecord *record);
extern void fs_state_read_stats(FsStateItem *item, FsGlobalStats *stats);

#endif							/* FAIRSHARE_RECORDS_H */

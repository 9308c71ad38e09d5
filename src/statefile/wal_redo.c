/*-------------------------------------------------------------------------
 *
 * wal_redo.c
 *	  The replay of fairshare's WAL records by the startup process: on a
 *	  standby, and in crash recovery (wal.c has the whole picture).
 *
 * The startup process has shared memory and a PGPROC but no database,
 * transaction or catalog access: replay goes through the same functions
 * that decide (fs_tenant_open() without limits, the lease table's and the
 * fair order's replay functions), under the same locks, each held briefly,
 * so hot-standby readers of the views see whole entries.  A record's items
 * are absolute: an item replayed twice changes nothing more.
 *
 * An error here stops the startup process, and with it the standby or the
 * recovery.  So no data condition raises one: an item that does not fit (a
 * full table on a standby with smaller settings) is dropped and counted in
 * fs_replication.replay_dropped.  Only a record that is not fairshare's, or
 * of a newer format than this library reads, is refused, with what to do.
 *
 * A complete snapshot clears every lease's and tenant's mark at
 * FULL_BEGIN, marks every one it names, and at FULL_END removes the leases
 * and then the tenants it did not name (the state file's orphans after a
 * crash, removals and evictions that fell in a lost interval or were not
 * listed), and the claim-map entries whose leases are gone.  A snapshot of
 * the leases alone (FS_WAL_LEASES_ONLY) does the same for leases and
 * claim-map entries only.  Between snapshots, a record's tenants gone
 * (evicted on the primary) are forgotten after its leases gone and before
 * its tenants are entered.  At the end of recovery (rm_cleanup: crash
 * recovery done, or a promotion) the server goes on from the replayed
 * state.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlogreader.h"
#include "access/xlogrecord.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "core/stateformat.h"
#include "core/tenant.h"
#include "fairq/fairqueue.h"
#include "gate/gate.h"
#include "slots/slots.h"
#include "statefile/records.h"
#include "statefile/statefile.h"
#include "statefile/wal.h"

/* Memory of one record's replay, reset after each (rm_startup makes it). */
static MemoryContext redo_cxt = NULL;

/* The snapshot being replayed names leases and claims only (FS_WAL_LEASES_ONLY). */
static bool snapshot_leases_only = false;

/* A record's queues: the primary's index, this server's queue. */
typedef struct FsRedoQueue
{
	uint32		index;
	FsQueue    *queue;
} FsRedoQueue;

/* What the replay of one record knows and did. */
typedef struct FsRedo
{
	FsRedoQueue *queues;
	int			nqueues;
	int			capacity;
	uint64		dropped;
	/* the record's tenants gone: its items of them are older (skipped) */
	FsTenantKey *gone;
	int			ngone;
	int			gone_capacity;
	bool		gone_sorted;
} FsRedo;

/* This server's queue for the primary's queue `index` in this record. */
static FsQueue *
fs_redo_queue(const FsRedo *r, uint32 index)
{
	int			i;

	for (i = 0; i < r->nqueues; i++)
		if (r->queues[i].index == index)
			return r->queues[i].queue;
	return NULL;
}

/* A queue item: enter the queue here, under the record's index for it. */
static void
fs_redo_add_queue(FsRedo *r, FsStateItem *item)
{
	FsQueueKey	key;
	uint32		index;
	FsQueue    *queue;

	memset(&key, 0, sizeof(key));
	if (!fs_state_read_queue_at(item, &key, &index) || key.name[0] == '\0')
		return;
	queue = fs_queue_enter(key.dboid, key.name, true);
	if (queue == NULL)
	{
		r->dropped++;
		return;
	}
	if (r->nqueues == r->capacity)
	{
		r->capacity = Max(8, r->capacity * 2);
		r->queues = r->queues == NULL ? palloc(sizeof(FsRedoQueue) * r->capacity) :
			repalloc(r->queues, sizeof(FsRedoQueue) * r->capacity);
	}
	r->queues[r->nqueues].index = index;
	r->queues[r->nqueues].queue = queue;
	r->nqueues++;
}

/* qsort and bsearch order of tenant keys. */
static int
fs_redo_key_cmp(const void *a, const void *b)
{
	const FsTenantKey *x = (const FsTenantKey *) a;
	const FsTenantKey *y = (const FsTenantKey *) b;

	if (x->queue_id != y->queue_id)
		return x->queue_id < y->queue_id ? -1 : 1;
	return strcmp(x->tenant, y->tenant);
}

/* Is `key` one of this record's tenants gone? */
static bool
fs_redo_is_gone(FsRedo *r, const FsTenantKey *key)
{
	if (r->ngone == 0)
		return false;
	if (!r->gone_sorted)
	{
		qsort(r->gone, r->ngone, sizeof(FsTenantKey), fs_redo_key_cmp);
		r->gone_sorted = true;
	}
	return bsearch(key, r->gone, r->ngone, sizeof(FsTenantKey), fs_redo_key_cmp) != NULL;
}

/*
 * A tenant item: the entry (made if missing, without loading limits) takes
 * the logged state, and its place in the fair order follows.  An item of a
 * tenant this record also lists as gone is older than its eviction: skipped.
 */
static void
fs_redo_tenant(FsRedo *r, FsStateItem *item)
{
	FsTenant	saved;
	uint32		index;
	FsQueue    *queue;
	FsTenantRef ref;
	FsTenant   *entry;

	if (!fs_state_read_tenant(item, &saved, &index, GetCurrentTimestamp()))
		return;
	queue = fs_redo_queue(r, index);
	if (queue == NULL)
		return;
	if (r->ngone > 0)
	{
		FsTenantKey key;

		fs_tenant_key_init(&key, queue->queue_id, saved.key.tenant);
		if (fs_redo_is_gone(r, &key))
			return;
	}
	entry = fs_tenant_open(queue, saved.key.tenant, FS_OPEN_CREATE | FS_OPEN_NO_LIMITS, &ref);
	if (entry == NULL)
	{
		r->dropped++;
		return;
	}
	fs_tenant_replay(entry, &saved);
	fs_fair_replay_tenant(queue, entry);
	fs_tenant_close(&ref);
}

/* A lease item: the lease as logged, with its slot (or pin) in its tenant. */
static void
fs_redo_lease(FsRedo *r, FsStateItem *item)
{
	FsLeaseRecord record;
	FsLeaseReplay lease;

	if (!fs_state_read_lease(item, &record))
		return;
	lease.queue = fs_redo_queue(r, record.queue_index);
	if (lease.queue == NULL || record.lease_id <= 0)
		return;
	lease.lease_id = record.lease_id;
	lease.tenant = record.tenant;
	lease.acquired_at = record.acquired_at;
	lease.expires_at = record.expires_at;
	lease.owner = record.owner;
	lease.state = (record.state == FS_LEASE_ORPHAN || record.state == FS_LEASE_RELEASING) ?
		(FsLeaseState) record.state : FS_LEASE_LIVE;
	if (!fs_lease_replay(&lease))
		r->dropped++;
}

/* fs_queue_of_index for the replay's items: the record's queue of an index. */
static FsQueue *
fs_redo_queue_of(uint32 index, void *arg)
{
	return fs_redo_queue((const FsRedo *) arg, index);
}

/*
 * Forget a tenant the primary no longer has, unless it holds a slot or an
 * orphan lease here (then its leases are still to go, or it was entered
 * again: its state follows in a later item).  Out of its fair order first:
 * no backlog, then fs_fair_replay_tenant() gives back its place and clears
 * its mark.
 */
static void
fs_redo_drop_tenant(FsQueue *queue, const char *tenant)
{
	FsTenantRef ref;
	FsTenant   *entry;
	FsTenantKey key;
	bool		held;

	entry = fs_tenant_open(queue, tenant, FS_OPEN_NO_LIMITS, &ref);
	if (entry == NULL)
		return;
	fs_tenant_lock(entry);
	held = entry->slots_in_use > 0 || entry->orphan_leases > 0;
	if (!held)
		fs_tenant_backlog_add(entry, -entry->ready_rows, true);
	fs_tenant_unlock(entry);
	if (!held)
		fs_fair_replay_tenant(queue, entry);
	fs_tenant_close(&ref);
	if (!held)
	{
		fs_tenant_key_init(&key, queue->queue_id, tenant);
		(void) fs_tenant_drop(&key);
	}
}

/* An evicted tenant's item. */
static void
fs_redo_tenant_gone(FsRedo *r, FsStateItem *item)
{
	uint8		field;
	uint8		len;
	const char *value;
	uint32		index = 0;
	bool		has_index = false;
	char		tenant[FS_NAME_BUFLEN];
	FsQueue    *queue;

	tenant[0] = '\0';
	while (fs_state_field_next(item, &field, &value, &len))
	{
		if (field == FS_GONE_TENANT_QUEUE)
			has_index = fs_state_field_value(value, len, index);
		else if (field == FS_GONE_TENANT_NAME &&
				 !fs_state_field_name(value, len, tenant, FS_NAME_BUFLEN))
			tenant[0] = '\0';
	}
	if (!has_index || tenant[0] == '\0' || (queue = fs_redo_queue(r, index)) == NULL)
		return;
	fs_redo_drop_tenant(queue, tenant);
	if (r->ngone == r->gone_capacity)
	{
		r->gone_capacity = Max(64, r->gone_capacity * 2);
		r->gone = r->gone == NULL ? palloc(sizeof(FsTenantKey) * r->gone_capacity) :
			repalloc(r->gone, sizeof(FsTenantKey) * r->gone_capacity);
	}
	fs_tenant_key_init(&r->gone[r->ngone++], queue->queue_id, tenant);
	r->gone_sorted = false;
}

/* At a complete snapshot's end: forget the tenants it did not name. */
static void
fs_redo_sweep_tenants(void)
{
	int			n;
	int			i;
	FsTenantKey *keys = fs_tenant_replay_unnamed(&n);

	if (keys == NULL)
	{
		ereport(LOG,
				(errmsg("fairshare skipped the sweep of tenants at the end of a snapshot: out of memory"),
				 errdetail("Tenants the primary no longer has stay on this server until its next snapshot.")));
		return;
	}
	for (i = 0; i < n; i++)
	{
		FsQueue    *queue = fs_queue_by_id(keys[i].queue_id);

		if (queue != NULL)
			fs_redo_drop_tenant(queue, keys[i].tenant);
	}
}

/* A removed lease's item. */
static void
fs_redo_lease_gone(FsStateItem *item)
{
	uint8		field;
	uint8		len;
	const char *value;
	int64		lease_id = 0;

	while (fs_state_field_next(item, &field, &value, &len))
		if (field == FS_GONE_LEASE_ID)
			fs_state_field_value(value, len, lease_id);
	if (lease_id > 0)
		fs_lease_replay_remove(lease_id);
}

/* A fair queue's item. */
static void
fs_redo_fair_queue(FsRedo *r, FsStateItem *item)
{
	FsFairWalState state;
	uint32		index;
	FsQueue    *queue;

	if (!fs_fair_wal_read(item, &index, &state))
		return;
	queue = fs_redo_queue(r, index);
	if (queue != NULL)
		fs_fair_wal_apply(queue, &state);
}

/*
 * Apply the sections of a BATCH or FULL_CHUNK (`data`, `len` bytes after
 * the header).  The record's CRC was checked by the WAL reader; lengths are
 * checked here all the same, and a section that does not fit ends it.
 */
static void
fs_redo_sections(FsRedo *r, const char *data, Size len)
{
	Size		pos = 0;

	while (len - pos >= sizeof(FsSectionHeader))
	{
		FsSectionHeader section;
		uint64		i;

		memcpy(&section, data + pos, sizeof(section));
		pos += sizeof(section);
		if (section.tag == FS_SECTION_END || section.item_size != 0)
			break;
		if (section.tag == FS_SECTION_HEARTBEATS)
			fs_gate_replay_clear();
		for (i = 0; i < section.count; i++)
		{
			FsStateItem item;

			if (!fs_state_item_next(data, len, &pos, &item))
				return;
			switch (section.tag)
			{
				case FS_SECTION_QUEUES:
					fs_redo_add_queue(r, &item);
					break;
				case FS_SECTION_TENANTS:
					fs_redo_tenant(r, &item);
					break;
				case FS_SECTION_LEASES:
					fs_redo_lease(r, &item);
					break;
				case FS_SECTION_LEASES_GONE:
					fs_redo_lease_gone(&item);
					break;
				case FS_SECTION_FAIRQ_QUEUES:
					fs_redo_fair_queue(r, &item);
					break;
				case FS_SECTION_FAIRQ_CLAIMS:
					if (!fs_claim_wal_apply(&item, fs_redo_queue_of, r))
						r->dropped++;
					break;
				case FS_SECTION_HEARTBEATS:
					if (!fs_gate_replay_worker(&item, fs_redo_queue_of, r))
						r->dropped++;
					break;
				case FS_SECTION_TENANTS_GONE:
					fs_redo_tenant_gone(r, &item);
					break;
				default:
					break;		/* a section of a later version */
			}
		}
		if (section.tag == FS_SECTION_HEARTBEATS)
			fs_gate_replay_recount();
	}
}

/* Read and check a record's header; an error for a record not to replay. */
static void
fs_redo_header(XLogReaderState *record, FsWalHeader *header)
{
	Size		len = XLogRecGetDataLen(record);

	if (len >= sizeof(*header))
		memcpy(header, XLogRecGetData(record), sizeof(*header));
	if (len < sizeof(*header) || header->magic != FS_WAL_MAGIC)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("WAL record at %X/%X of resource manager %d is not fairshare's",
						LSN_FORMAT_ARGS(record->ReadRecPtr), fs_wal_rmgr_id),
				 errhint("Another extension may use resource manager id %d: give each its own "
						 "(fairshare.wal_rmgr_id), the same on every server.", fs_wal_rmgr_id)));
	if (header->format > FS_WAL_FORMAT)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("fairshare WAL record at %X/%X has format %u, newer than this server's fairshare reads (%d)",
						LSN_FORMAT_ARGS(record->ReadRecPtr), header->format, FS_WAL_FORMAT),
				 errhint("Upgrade fairshare on the standbys first, then on the primary.")));
}

/* rm_redo: replay one of fairshare's records. */
void
fs_wal_redo(XLogReaderState *record)
{
	uint8		info = XLogRecGetInfo(record) & ~XLR_INFO_MASK;
	FsWalHeader header;
	FsRedo		r;
	MemoryContext old;
	bool		snapshot_end = false;

	fs_redo_header(record, &header);
	memset(&r, 0, sizeof(r));
	/*
	 * A snapshot begins: no lease or tenant is named by it yet (whatever an
	 * earlier snapshot, perhaps cut short by a crash, marked).  Every one a
	 * record enters or updates from now on is marked.
	 */
	if (info == XLOG_FS_FULL_BEGIN)
	{
		snapshot_leases_only = (header.flags & FS_WAL_LEASES_ONLY) != 0;
		fs_lease_replay_unmark_all();
		if (!snapshot_leases_only)
			fs_tenant_replay_unmark_all();
		SpinLockAcquire(&fs_wal->mutex);
		fs_wal->replay_in_snapshot = true;
		SpinLockRelease(&fs_wal->mutex);
	}

	old = MemoryContextSwitchTo(redo_cxt != NULL ? redo_cxt : CurrentMemoryContext);
	switch (info)
	{
		case XLOG_FS_BATCH:
		case XLOG_FS_FULL_CHUNK:
			fs_redo_sections(&r, XLogRecGetData(record) + sizeof(header),
							 XLogRecGetDataLen(record) - sizeof(header));
			break;
		case XLOG_FS_FULL_BEGIN:
			break;
		case XLOG_FS_FULL_END:
			/* Only a snapshot seen from its beginning says what is gone. */
			if (fs_wal->replay_in_snapshot)
			{
				(void) fs_lease_replay_sweep();
				if (!snapshot_leases_only)
					fs_redo_sweep_tenants();
				fs_claim_wal_sweep();
				snapshot_end = true;
			}
			break;
		default:
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("fairshare WAL record at %X/%X is of an unknown kind %u",
							LSN_FORMAT_ARGS(record->ReadRecPtr), info)));
	}
	MemoryContextSwitchTo(old);
	if (redo_cxt != NULL)
		MemoryContextReset(redo_cxt);

	SpinLockAcquire(&fs_wal->mutex);
	fs_wal->replayed_lsn = record->EndRecPtr;
	fs_wal->replayed_primary_now = header.primary_now;
	fs_wal->replayed_records++;
	fs_wal->replay_dropped += r.dropped;
	fs_wal->replayed_next_lease_id = Max(fs_wal->replayed_next_lease_id, header.next_lease_id);
	if (snapshot_end)
	{
		/* A snapshot of the leases alone does not make the state known. */
		fs_wal->replay_snapshot_seen |= !snapshot_leases_only;
		fs_wal->replay_in_snapshot = false;
	}
	SpinLockRelease(&fs_wal->mutex);
}

/* rm_desc: what a record holds, for pg_walinspect and redo error messages. */
void
fs_wal_desc(StringInfo buf, XLogReaderState *record)
{
	FsWalHeader header;

	if (XLogRecGetDataLen(record) < sizeof(header))
		return;
	memcpy(&header, XLogRecGetData(record), sizeof(header));
	appendStringInfo(buf, "format %u; primary at %s; next lease id " INT64_FORMAT "; %u bytes",
					 header.format, timestamptz_to_str(header.primary_now),
					 header.next_lease_id, XLogRecGetDataLen(record));
}

/* rm_identify: the name of a kind of record. */
const char *
fs_wal_identify(uint8 info)
{
	switch (info & ~XLR_INFO_MASK)
	{
		case XLOG_FS_BATCH:
			return "BATCH";
		case XLOG_FS_FULL_BEGIN:
			return "FULL_BEGIN";
		case XLOG_FS_FULL_CHUNK:
			return "FULL_CHUNK";
		case XLOG_FS_FULL_END:
			return "FULL_END";
	}
	return NULL;
}

/* rm_startup: a recovery begins; no snapshot seen in it yet. */
void
fs_wal_redo_startup(void)
{
	redo_cxt = AllocSetContextCreate(TopMemoryContext, "fairshare redo", ALLOCSET_DEFAULT_SIZES);
	SpinLockAcquire(&fs_wal->mutex);
	fs_wal->replay_in_snapshot = false;
	fs_wal->replay_snapshot_seen = false;
	SpinLockRelease(&fs_wal->mutex);
}

/*
 * rm_cleanup: recovery is over (crash recovery done, or a promotion), and
 * this server goes on deciding from the replayed state.  Lease ids move on
 * past any the old primary could have handed out after its last record;
 * cached limits are loaded again at their next use; each queue's backlog
 * is recounted from its table at its next use (the logged counts lag the
 * table's commits).  With a complete snapshot replayed, budgets are known
 * (no fail-open minute).  Without one, the state is what the state file
 * and the batches gave, as after a crash without WAL (the WAL writer warns
 * of it as it starts: recovery with nothing to redo does not come here).
 */
void
fs_wal_redo_cleanup(void)
{
	int64		next;
	bool		snapshot_seen;
	int64		replayed_next;

	SpinLockAcquire(&fs_wal->mutex);
	snapshot_seen = fs_wal->replay_snapshot_seen;
	replayed_next = fs_wal->replayed_next_lease_id;
	SpinLockRelease(&fs_wal->mutex);

	next = (int64) pg_atomic_read_u64(&fs_shared->next_lease_id);
	if (replayed_next > 0)
		next = Max(next, Min(replayed_next, FS_LEASE_ID_MAX) + FS_LEASE_ID_CRASH_MARGIN);
	pg_atomic_write_u64(&fs_shared->next_lease_id, (uint64) next);
	pg_atomic_fetch_add_u32(&fs_shared->limits_generation, 1);
	fs_fair_unsync_all();
	fs_claim_wal_sweep();		/* entries of leases removed in the last batches */
	if (snapshot_seen)
		fs_shared->start_kind = FS_START_REPLAYED;

	if (snapshot_seen)
		ereport(LOG,
				(errmsg("fairshare state replayed from WAL: %ld tenants, %ld leases",
						fs_tenant_count(), fs_lease_count())));
	if (redo_cxt != NULL)
	{
		MemoryContextDelete(redo_cxt);
		redo_cxt = NULL;
	}
}

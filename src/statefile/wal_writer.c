/*-------------------------------------------------------------------------
 *
 * wal_writer.c
 *	  The WAL writer ("fairshare wal writer"): a background worker of the
 *	  primary that logs fairshare's state changes in batches (wal.c has the
 *	  whole picture).
 *
 * Every fairshare.wal_interval it copies the tenant entries, leases and
 * fair queues marked as changed, clears their marks as it copies (in the
 * same lock hold), logs them in BATCH records and flushes.  When the
 * checkpoint redo pointer has moved since its last complete snapshot (and
 * when it starts: after a crash or a promotion), it logs a complete one
 * instead.  Copies are made a batch of entries at a time under the tables'
 * own locks, into room made before each batch; records are built and
 * inserted with no fairshare lock held.  At a shutdown it logs what is
 * left before it exits.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "access/xloginsert.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "core/stateformat.h"
#include "fairq/fairqueue.h"
#include "gate/gate.h"
#include "slots/slots.h"
#include "statefile/records.h"
#include "statefile/wal.h"

/* The record being built: its items by section, and the queues they name. */
typedef struct FsWalBuild
{
	uint8		info;			/* XLOG_FS_BATCH or XLOG_FS_FULL_CHUNK */
	StringInfoData tenants;
	StringInfoData leases;
	StringInfoData gone;
	StringInfoData fairq;
	StringInfoData claims;
	StringInfoData heartbeats;
	uint64		ntenants;
	uint64		nleases;
	uint64		ngone;
	uint64		nfairq;
	uint64		nclaims;
	uint64		nheartbeats;
	bool		has_heartbeats; /* the table (perhaps empty) is in this record */
	bool		last_of_cycle;	/* the cycle's last records: tenants gone go in */
	int			ngone_keys;		/* tenants gone this cycle (gone_keys) ... */
	int			gone_next;		/* ... and the first not yet in a record */
	uint16		header_flags;	/* of the records inserted now */
	bool	   *queue_named;	/* by queue id: an item names the queue */
	bool		lost;			/* an item found no room: log a snapshot next */
	XLogRecPtr	last_lsn;		/* end of the last record inserted */
	uint64		records;
	uint64		bytes;
} FsWalBuild;

/*
 * What the changes the lists could not hold call for: nothing, a snapshot
 * of the leases and claim-map entries (their lists overflowed), or a
 * complete one.
 */
typedef enum FsSnapshotNeed
{
	FS_SNAPSHOT_NONE = 0,
	FS_SNAPSHOT_LEASES,
	FS_SNAPSHOT_FULL
} FsSnapshotNeed;

/* Raise *need to at least `level`. */
static inline void
fs_wal_need(FsSnapshotNeed *need, FsSnapshotNeed level)
{
	if (*need < level)
		*need = level;
}

/*
 * The writer's memory: the build, the lease ids and copies, the evicted
 * tenants' keys, the fair queues' and the heartbeat table's versions.
 */
static FsWalBuild build;
static int64 *lease_ids = NULL;
static FsTenantKey *gone_keys = NULL;
static uint64 *fairq_seen = NULL;
static uint64 heartbeats_seen = PG_UINT64_MAX;
static TimestampTz heartbeats_logged_at = 0;

/* Leases copied a chunk at a time (fs_lease_wal_copy_many()). */
#define FS_WAL_LEASE_CHUNK		4096
static FsLeaseInfo *lease_infos = NULL;
static bool *lease_found = NULL;

/* The most bytes an item of TENANTS_GONE takes. */
#define FS_TENANT_GONE_ITEM_MAX	(2 + 6 + 2 + FS_NAME_MAXLEN)

/* The room a batch of the tables' scans may need (FS_SCAN_BATCH items). */
#define FS_WAL_TENANT_ROOM		(FS_SCAN_BATCH * (FS_TENANT_ITEM_MAX + 8))
#define FS_WAL_LEASE_ROOM		(FS_SCAN_BATCH * (FS_LEASE_ITEM_MAX + 8))
#define FS_WAL_CLAIM_ROOM		(FS_SCAN_BATCH * (FS_CLAIM_ITEM_MAX + 8))

/* The bytes of the record built so far (without its queues and header). */
static Size
fs_wal_build_size(const FsWalBuild *b)
{
	return (Size) b->tenants.len + b->leases.len + b->gone.len + b->fairq.len +
		b->claims.len + b->heartbeats.len;
}

/* Note that an item of this record names queue `queue_id`. */
static inline void
fs_wal_name_queue(FsWalBuild *b, uint32 queue_id)
{
	if (queue_id < (uint32) fs_max_queues)
		b->queue_named[queue_id] = true;
}

/* Append a section of `count` items, already written in `items`. */
static void
fs_wal_put_section(StringInfo rec, FsSectionTag tag, const StringInfoData *items, uint64 count)
{
	Size		at;

	if (count == 0)
		return;
	at = fs_state_section_begin(rec, tag, 0);
	appendBinaryStringInfo(rec, items->data, items->len);
	fs_state_section_end(rec, at, count);
}

/*
 * The tenants gone that go in this record (the cycle's last records): as
 * many as keep it within FS_WAL_RECORD_MAX, one at least, from gone_next;
 * their queues are named with the others.  Returns the end of the slice.
 */
static int
fs_wal_gone_slice(FsWalBuild *b)
{
	Size		used = fs_wal_build_size(b);
	int			fit;
	int			end;
	int			i;

	if (!b->last_of_cycle || b->gone_next >= b->ngone_keys)
		return b->gone_next;
	fit = used < FS_WAL_RECORD_MAX ? (int) ((FS_WAL_RECORD_MAX - used) / FS_TENANT_GONE_ITEM_MAX) : 0;
	end = Min(b->ngone_keys, b->gone_next + Max(fit, 1));
	for (i = b->gone_next; i < end; i++)
		fs_wal_name_queue(b, gone_keys[i].queue_id);
	return end;
}

/*
 * The sections of a BATCH or FULL_CHUNK, in their order: the queues named,
 * the leases gone, the tenants gone (up to `gone_end`), the tenants, the
 * leases, the claim-map entries, the fair queues, the heartbeat table.
 */
static void
fs_wal_put_sections(FsWalBuild *b, StringInfo rec, int gone_end)
{
	uint64		nqueues = 0;
	Size		at;
	int			q;
	int			i;

	at = fs_state_section_begin(rec, FS_SECTION_QUEUES, 0);
	for (q = 0; q < fs_max_queues; q++)
	{
		FsQueue    *queue;

		if (!b->queue_named[q] || (queue = fs_queue_by_id((uint32) q)) == NULL)
			continue;
		fs_state_write_queue_at(rec, (uint32) q, &queue->key);
		nqueues++;
		b->queue_named[q] = false;
	}
	fs_state_section_end(rec, at, nqueues);
	/*
	 * Leases gone before leases taken: a lease taken in place of one given
	 * back never shows next to it on a standby (ids are never reused, so
	 * the order changes nothing else).
	 */
	fs_wal_put_section(rec, FS_SECTION_LEASES_GONE, &b->gone, b->ngone);
	/*
	 * Tenants gone after the leases gone that let them be evicted, and
	 * before the tenants entered, for which they make room: a tenant listed
	 * here was missing after this cycle's changed tenants were copied, so an
	 * item of its own in this record is older than its eviction, and the
	 * standby skips it (wal_redo.c).
	 */
	if (gone_end > b->gone_next)
	{
		at = fs_state_section_begin(rec, FS_SECTION_TENANTS_GONE, 0);
		for (i = b->gone_next; i < gone_end; i++)
		{
			Size		item = fs_state_item_begin(rec);

			fs_state_put_value(rec, FS_GONE_TENANT_QUEUE, gone_keys[i].queue_id);
			fs_state_put_name(rec, FS_GONE_TENANT_NAME, gone_keys[i].tenant);
			fs_state_item_end(rec, item);
		}
		fs_state_section_end(rec, at, (uint64) (gone_end - b->gone_next));
		b->gone_next = gone_end;
	}
	fs_wal_put_section(rec, FS_SECTION_TENANTS, &b->tenants, b->ntenants);
	fs_wal_put_section(rec, FS_SECTION_LEASES, &b->leases, b->nleases);
	fs_wal_put_section(rec, FS_SECTION_FAIRQ_CLAIMS, &b->claims, b->nclaims);
	fs_wal_put_section(rec, FS_SECTION_FAIRQ_QUEUES, &b->fairq, b->nfairq);
	if (b->has_heartbeats)
	{
		/* Even empty: the table replaces a standby's. */
		at = fs_state_section_begin(rec, FS_SECTION_HEARTBEATS, 0);
		appendBinaryStringInfo(rec, b->heartbeats.data, b->heartbeats.len);
		fs_state_section_end(rec, at, b->nheartbeats);
	}
	(void) fs_state_section_begin(rec, FS_SECTION_END, 0);
}

/*
 * Insert a record of kind `info` with the build's items (none: a header
 * only), and empty the build.  No fairshare lock is held.
 */
static void
fs_wal_insert(FsWalBuild *b, uint8 info)
{
	StringInfoData rec;
	FsWalHeader header;
	bool		important;

	initStringInfo(&rec);
	memset(&header, 0, sizeof(header));
	header.magic = FS_WAL_MAGIC;
	header.format = FS_WAL_FORMAT;
	header.flags = b->header_flags;
	header.primary_now = GetCurrentTimestamp();
	header.next_lease_id = (int64) pg_atomic_read_u64(&fs_shared->next_lease_id);
	appendBinaryStringInfo(&rec, (char *) &header, sizeof(header));
	/* A record of heartbeats only is no activity (see below). */
	important = b->ntenants + b->nleases + b->ngone + b->nfairq + b->nclaims > 0 ||
		(b->last_of_cycle && b->gone_next < b->ngone_keys);
	if (info == XLOG_FS_BATCH || info == XLOG_FS_FULL_CHUNK)
		fs_wal_put_sections(b, &rec, fs_wal_gone_slice(b));

	XLogBeginInsert();
	XLogRegisterData(rec.data, rec.len);
	/*
	 * Snapshots must not make an idle server checkpoint (wal.c), nor the
	 * heartbeats of workers polling an idle queue.
	 */
	if (info != XLOG_FS_BATCH || !important)
		XLogSetRecordFlags(XLOG_MARK_UNIMPORTANT);
	b->last_lsn = XLogInsert((RmgrId) fs_wal_rmgr_id, info);
	b->records++;
	b->bytes += rec.len;
	pfree(rec.data);

	resetStringInfo(&b->tenants);
	resetStringInfo(&b->leases);
	resetStringInfo(&b->gone);
	resetStringInfo(&b->fairq);
	resetStringInfo(&b->claims);
	resetStringInfo(&b->heartbeats);
	b->ntenants = b->nleases = b->ngone = b->nfairq = b->nclaims = b->nheartbeats = 0;
	b->has_heartbeats = false;
}

/* Insert the build as a record of its kind if it holds anything. */
static void
fs_wal_emit(FsWalBuild *b)
{
	if (b->ntenants + b->nleases + b->ngone + b->nfairq + b->nclaims > 0 ||
		b->has_heartbeats || (b->last_of_cycle && b->gone_next < b->ngone_keys))
		fs_wal_insert(b, b->info);
}

/*
 * Between two batches of a scan (no lock held): insert the record if it is
 * big enough, and make room for the next batch's items.
 */
static void
fs_wal_build_pause(void *arg)
{
	FsWalBuild *b = (FsWalBuild *) arg;

	if (fs_wal_build_size(b) >= FS_WAL_RECORD_MAX)
		fs_wal_emit(b);
	enlargeStringInfo(&b->tenants, FS_WAL_TENANT_ROOM);
	enlargeStringInfo(&b->leases, FS_WAL_LEASE_ROOM);
	enlargeStringInfo(&b->claims, FS_WAL_CLAIM_ROOM);
}


/*
 * fs_tenant_foreach_for_wal() visitor (under the entry's partition lock):
 * a tenant's item, in the room made before the batch.
 */
static void
fs_wal_add_tenant(const FsTenant *copy, void *arg)
{
	FsWalBuild *b = (FsWalBuild *) arg;

	if (!fs_state_item_fits(&b->tenants, FS_TENANT_ITEM_MAX))
	{
		b->lost = true;
		return;
	}
	fs_state_write_tenant(&b->tenants, copy);
	b->ntenants++;
	fs_wal_name_queue(b, copy->key.queue_id);
}

/*
 * fs_lease_foreach_for_wal() visitor (under the lease's partition lock),
 * and the batch's way for one lease: a lease's item, in the room made.
 */
static void
fs_wal_add_lease(const FsLeaseInfo *lease, void *arg)
{
	FsWalBuild *b = (FsWalBuild *) arg;

	if (!fs_state_item_fits(&b->leases, FS_LEASE_ITEM_MAX))
	{
		b->lost = true;
		return;
	}
	fs_state_write_lease(&b->leases, lease);
	b->nleases++;
	fs_wal_name_queue(b, lease->tenant_key.queue_id);
}

/* The id of a lease removed (no lock held). */
static void
fs_wal_add_gone(FsWalBuild *b, int64 lease_id)
{
	Size		at = fs_state_item_begin(&b->gone);

	fs_state_put_value(&b->gone, FS_GONE_LEASE_ID, lease_id);
	fs_state_item_end(&b->gone, at);
	b->ngone++;
}

/*
 * The tenants evicted since the last cycle that are still gone, kept in
 * gone_keys for the cycle's last records (fs_wal_insert()).  One evicted
 * and entered again since is not: its entry's state is logged as any
 * change.
 */
static void
fs_wal_add_tenants_gone(FsWalBuild *b, FsSnapshotNeed *need)
{
	bool		overflow;
	int			n = fs_tenants_gone_drain(gone_keys, &overflow);
	int			i;

	b->ngone_keys = b->gone_next = 0;
	for (i = 0; i < n; i++)
		if (!fs_tenant_exists(&gone_keys[i]))
			gone_keys[b->ngone_keys++] = gone_keys[i];
	if (overflow)
		fs_wal_need(need, FS_SNAPSHOT_FULL);
}

/*
 * The heartbeat table, if it changed since it was last logged and that was
 * FS_WAL_HEARTBEATS_EVERY_MS ago (`all`: now, whatever changed).
 */
static void
fs_wal_add_heartbeats(FsWalBuild *b, bool all)
{
	TimestampTz now = GetCurrentTimestamp();

	if (all)
		heartbeats_seen = PG_UINT64_MAX;	/* differs from any version */
	else if (now - heartbeats_logged_at < (int64) FS_WAL_HEARTBEATS_EVERY_MS * 1000)
		return;
	if (!fs_gate_wal_write(&b->heartbeats, &heartbeats_seen, &b->nheartbeats, b->queue_named))
		return;
	b->has_heartbeats = true;
	heartbeats_logged_at = now;
}

/* The claim-map entries set since the last cycle, in records of bounded size. */
static void
fs_wal_add_claims(FsWalBuild *b, FsSnapshotNeed *need)
{
	bool		overflow;

	if (fs_claim_wal_drain(&overflow) > 0)
	{
		for (;;)
		{
			/* The claims' room: what the record's other sections leave. */
			Size		others = fs_wal_build_size(b) - b->claims.len;
			Size		limit = others < FS_WAL_RECORD_MAX ? FS_WAL_RECORD_MAX - others : 0;

			if (fs_claim_wal_write_next(&b->claims, limit, &b->nclaims, b->queue_named))
				break;
			fs_wal_emit(b);
		}
	}
	if (overflow)
		fs_wal_need(need, FS_SNAPSHOT_LEASES);
}

/* The fair queues whose state changed since it was last logged (all: `all`). */
static void
fs_wal_add_fair_queues(FsWalBuild *b, bool all)
{
	int			q;

	for (q = 0; q < fs_max_queues; q++)
	{
		FsFairWalState state;

		if (all)
			fairq_seen[q] = ~fairq_seen[q];		/* differs from any version */
		if (fs_queue_by_id((uint32) q) == NULL ||
			!fs_fair_wal_changed((uint32) q, &fairq_seen[q], &state))
			continue;
		fs_fair_wal_write(&b->fairq, (uint32) q, &state);
		b->nfairq++;
		fs_wal_name_queue(b, (uint32) q);
	}
}

/*
 * One interval's batch: the changed tenants, the evicted ones, the changed
 * and removed leases, the claim-map entries set, the changed fair queues,
 * the heartbeat table.  Raises *need when changes could not be tracked one
 * by one: a list of leases or claim-map entries overflowed (a snapshot of
 * those), the list of evicted tenants overflowed or an item found no room
 * (a complete one).
 *
 * The order matters for evictions.  A tenant is listed as gone only if it
 * is still missing after the changed tenants were copied, so any item of
 * its own in this cycle's records is older than its eviction; and the
 * evictions are listed before the leases are, so the removal of the leases
 * that let it become idle is in this cycle too.  The gone items go in the
 * cycle's last records, after those leases' removals (fs_wal_insert()).
 */
static void
fs_wal_write_batch(FsWalBuild *b, FsSnapshotNeed *need)
{
	bool		overflow;
	int			n;
	int			i;

	b->info = XLOG_FS_BATCH;
	b->last_of_cycle = false;
	fs_wal_build_pause(b);
	if (pg_atomic_read_u32(&fs_shared->wal_tenants_dirty) != 0)
		fs_tenant_foreach_for_wal(fs_wal_add_tenant, fs_wal_build_pause, b, false);
	fs_wal_add_tenants_gone(b, need);

	n = fs_lease_wal_drain(lease_ids, &overflow);
	for (i = 0; i < n; i += FS_WAL_LEASE_CHUNK)
	{
		int			count = Min(FS_WAL_LEASE_CHUNK, n - i);
		int			k;

		fs_lease_wal_copy_many(lease_ids + i, count, lease_infos, lease_found);
		for (k = 0; k < count; k++)
		{
			if (fs_wal_build_size(b) >= FS_WAL_RECORD_MAX)
				fs_wal_emit(b);
			enlargeStringInfo(&b->leases, FS_LEASE_ITEM_MAX + 8);
			if (lease_found[k])
				fs_wal_add_lease(&lease_infos[k], b);
			else if (lease_ids[i + k] > 0)
				fs_wal_add_gone(b, lease_ids[i + k]);	/* a standby has it */
		}
	}
	fs_wal_add_claims(b, need);
	fs_wal_add_fair_queues(b, false);
	fs_wal_add_heartbeats(b, false);
	b->last_of_cycle = true;
	do
		fs_wal_emit(b);
	while (b->gone_next < b->ngone_keys);
	b->last_of_cycle = false;
	b->ngone_keys = b->gone_next = 0;
	if (overflow)
		fs_wal_need(need, FS_SNAPSHOT_LEASES);
	if (b->lost)
		fs_wal_need(need, FS_SNAPSHOT_FULL);
	b->lost = false;
}

/*
 * A complete snapshot: FULL_BEGIN, every tenant, lease, claim-map entry and
 * fair queue and the heartbeat table in FULL_CHUNKs, FULL_END.  A standby
 * removes the tenants and leases it did not name, and the claim-map
 * entries whose leases are gone.  The lists of changes are emptied first:
 * what they named is in the snapshot (or gone from it, and so removed), and
 * later changes are listed anew.  Returns false if an item found no room:
 * the snapshot then has no FULL_END (a standby must not remove what it
 * missed), and the caller logs another.
 *
 * `leases_only` (FS_WAL_LEASES_ONLY): the leases and claim-map entries
 * alone, when only their lists overflowed (one backend making millions of
 * decisions a second): the tenants are tracked still, and scanning every
 * tenant entry each interval would slow the decisions down.
 */
static bool
fs_wal_write_snapshot(FsWalBuild *b, bool leases_only)
{
	bool		overflow;
	bool		complete;

	(void) fs_lease_wal_drain(lease_ids, &overflow);
	if (!leases_only)
		(void) fs_tenants_gone_drain(gone_keys, &overflow);
	(void) fs_claim_wal_drain(&overflow);
	b->header_flags = leases_only ? FS_WAL_LEASES_ONLY : 0;
	fs_wal_insert(b, XLOG_FS_FULL_BEGIN);
	b->header_flags = 0;
	b->info = XLOG_FS_FULL_CHUNK;
	fs_wal_build_pause(b);
	if (!leases_only)
		fs_tenant_foreach_for_wal(fs_wal_add_tenant, fs_wal_build_pause, b, true);
	fs_lease_foreach_for_wal(fs_wal_add_lease, fs_wal_build_pause, b);
	fs_claim_wal_write_all(&b->claims, &b->nclaims, b->queue_named, &b->lost,
						   fs_wal_build_pause, b);
	if (!leases_only)
	{
		fs_wal_add_fair_queues(b, true);
		fs_wal_add_heartbeats(b, true);
	}
	fs_wal_emit(b);
	complete = !b->lost;
	b->header_flags = leases_only ? FS_WAL_LEASES_ONLY : 0;
	if (complete)
		fs_wal_insert(b, XLOG_FS_FULL_END);
	b->header_flags = 0;
	b->lost = false;
	return complete;
}

/* Publish a finished cycle (fs_wal_sync() and fs_replication wait on it). */
static void
fs_wal_cycle_done(FsWalBuild *b, bool snapshot)
{
	if (b->records > 0)
		XLogFlush(b->last_lsn);
	SpinLockAcquire(&fs_wal->mutex);
	fs_wal->cycles++;
	if (b->records > 0)
	{
		fs_wal->written_lsn = b->last_lsn;
		fs_wal->written_at = GetCurrentTimestamp();
		fs_wal->records += b->records;
		fs_wal->bytes += b->bytes;
	}
	if (snapshot)
		fs_wal->snapshots++;
	SpinLockRelease(&fs_wal->mutex);
	ConditionVariableBroadcast(&fs_wal->cycle_done);
	b->records = 0;
	b->bytes = 0;
}

/* before_shmem_exit: no writer runs any more. */
static void
fs_wal_writer_detach(int code pg_attribute_unused(), Datum arg pg_attribute_unused())
{
	SpinLockAcquire(&fs_wal->mutex);
	fs_wal->writer_latch = NULL;
	SpinLockRelease(&fs_wal->mutex);
	ConditionVariableBroadcast(&fs_wal->cycle_done);
}

/* The WAL writer's memory, made once. */
static void
fs_wal_writer_setup(void)
{
	MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "fairshare wal writer",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);

	memset(&build, 0, sizeof(build));
	initStringInfo(&build.tenants);
	initStringInfo(&build.leases);
	initStringInfo(&build.gone);
	initStringInfo(&build.fairq);
	initStringInfo(&build.claims);
	initStringInfo(&build.heartbeats);
	gone_keys = palloc_extended(sizeof(FsTenantKey) * fs_tenants_gone_room(), MCXT_ALLOC_HUGE);
	build.queue_named = palloc0(sizeof(bool) * Max(fs_max_queues, 1));
	lease_ids = palloc_extended(sizeof(int64) * Max(fs_lease_wal_room(), 1), MCXT_ALLOC_HUGE);
	fairq_seen = palloc0(sizeof(uint64) * Max(fs_max_queues, 1));
	lease_infos = palloc(sizeof(FsLeaseInfo) * FS_WAL_LEASE_CHUNK);
	lease_found = palloc(sizeof(bool) * FS_WAL_LEASE_CHUNK);
	MemoryContextSwitchTo(old);
}

/*
 * The WAL writer's main loop.  It logs a snapshot first (it starts after a
 * crash recovery or a promotion, and a standby made from a base backup has
 * it after that backup's checkpoint anyway), then a batch every interval,
 * and a snapshot whenever a checkpoint has begun since the last one.
 */
void
fs_wal_writer_main(Datum main_arg pg_attribute_unused())
{
	XLogRecPtr	snapshot_redo = InvalidXLogRecPtr;
	FsSnapshotNeed need = FS_SNAPSHOT_FULL;
	TimestampTz cycle_start = 0;
	uint64		replayed_records;
	bool		warn;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();
	/* No database: this sets up what inserting WAL needs. */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("fairshare wal writer");

	fs_wal_writer_setup();
	SpinLockAcquire(&fs_wal->mutex);
	fs_wal->writer_latch = MyLatch;
	replayed_records = fs_wal->replayed_records;
	warn = fs_shared->start_kind == FS_START_AFTER_CRASH && fs_wal_interval_ms > 0 &&
		!fs_wal->warned_unreplayed;
	fs_wal->warned_unreplayed |= warn;
	SpinLockRelease(&fs_wal->mutex);

	/*
	 * After a crash, recovery replayed no complete snapshot (or the state
	 * would be FS_START_REPLAYED): most likely the server stopped after a
	 * checkpoint and before this writer logged the snapshot that follows
	 * it, and replay began after the snapshot before.  Said once per start
	 * of the server, whatever restarts of this worker.
	 */
	if (warn)
		ereport(WARNING,
				(errmsg("fairshare state was not replayed from WAL: recovery found no complete snapshot"),
				 errdetail("The state is the state file's and that of the " UINT64_FORMAT " fairshare records replayed "
						   "since the checkpoint recovery began at. A crash between the end of a checkpoint and the "
						   "WAL writer's next snapshot, or fairshare.wal_interval = 0 before the crash, leaves none.",
						   replayed_records),
				 errhint("Changes made before that checkpoint and not logged since may be lost, and budgets fail "
						 "open for a minute, as after a crash without WAL.")));
	before_shmem_exit(fs_wal_writer_detach, (Datum) 0);

	for (;;)
	{
		long		interval = fs_wal_interval_ms > 0 ? fs_wal_interval_ms : 1000;
		long		timeout;
		XLogRecPtr	redo;
		bool		snapshot = false;

		/*
		 * A cycle every interval from the start of the last one, so that a
		 * change waits at most one interval to be copied whatever a cycle
		 * takes (its flush).
		 */
		timeout = interval - (long) ((GetCurrentTimestamp() - cycle_start) / 1000);
		if (timeout > 0)
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 Min(timeout, interval), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		cycle_start = GetCurrentTimestamp();
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		if (fs_wal_interval_ms == 0)
			need = FS_SNAPSHOT_FULL;	/* when turned on again */
		else
		{
			redo = GetRedoRecPtr();
			if (redo != snapshot_redo)
				need = FS_SNAPSHOT_FULL;
			if (need != FS_SNAPSHOT_NONE)
			{
				snapshot = need == FS_SNAPSHOT_FULL;
				if (fs_wal_write_snapshot(&build, !snapshot))
					need = FS_SNAPSHOT_NONE;
				if (snapshot)
					snapshot_redo = redo;
			}
			else
				fs_wal_write_batch(&build, &need);
		}
		fs_wal_cycle_done(&build, snapshot);

		if (ShutdownRequestPending)
		{
			/* The last changes, before the shutdown checkpoint. */
			if (fs_wal_interval_ms > 0)
			{
				fs_wal_write_batch(&build, &need);
				if (need != FS_SNAPSHOT_NONE)	/* some changes went unlisted */
					(void) fs_wal_write_snapshot(&build, need == FS_SNAPSHOT_LEASES);
				fs_wal_cycle_done(&build, need == FS_SNAPSHOT_FULL);
			}
			proc_exit(0);
		}
	}
}

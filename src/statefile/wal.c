/*-------------------------------------------------------------------------
 *
 * wal.c
 *	  Replicating fairshare's shared state through WAL: its settings, the
 *	  resource manager's registration, what the writer and the replay
 *	  share, and the SQL functions about it.
 *
 * A decision writes no WAL: it changes shared memory and marks what it
 * changed (core/tenant.h, slots/leases.c, fairq/fairqueue_int.h: the one
 * place where each kind of state changes).  The WAL writer, a background
 * worker of the primary ("fairshare wal writer", wal_writer.c), wakes every
 * fairshare.wal_interval, copies what was marked and logs it in a BATCH
 * record of fairshare's own resource manager, then flushes it: a crash
 * loses at most the last interval, and walsenders ship it at once.  An
 * acquire and a release within one interval write nothing.
 *
 * What is logged: tenant entries (and the ones evicted), leases (and the
 * ones removed), the claim map's entries (an entry goes with its lease),
 * each fair queue's state, and the worker heartbeats (the whole table, at
 * most once a second).
 *
 * After each checkpoint the writer logs a complete snapshot (FULL_BEGIN,
 * FULL_CHUNKs, FULL_END): recovery starts at a checkpoint's redo, so the
 * snapshot after it, with the batches after that, is the whole state.  The
 * writer notices a checkpoint at its next cycle: a crash between the end of
 * a checkpoint and that snapshot finds no snapshot to replay, and recovery
 * then falls back to the state file (with a warning; wal_writer.c).  The
 * records hold absolute values, never increments: a record replayed twice,
 * or after the state file was restored, changes nothing more.
 *
 * The startup process replays the records into shared memory (wal_redo.c):
 * on a hot standby the views show the primary's state (fs_replication says
 * how far behind), and decisions are refused there (fs_check_primary()).
 * At the end of recovery, after a crash or at a promotion, the server goes
 * on from the replayed state: leases count and renew, drained budgets stay
 * drained, the fair order continues, lease ids move on past any the old
 * primary could have handed out, and each queue's backlog is recounted
 * from its table at its next use.  Not replicated: the decision log and
 * the tier counters.
 *
 * The records name queues by database and name (a queue's id is per
 * server), and carry the state file's field-by-field items, so that a
 * field added later is read by older servers as the state file is; a
 * record of a newer format is refused with a clear error.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/pg_lsn.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "core/common.h"
#include "statefile/wal.h"

PG_FUNCTION_INFO_V1(fs_wal_sync);
PG_FUNCTION_INFO_V1(fs_replication_state);

int			fs_wal_interval_ms = 100;
int			fs_wal_rmgr_id = RM_EXPERIMENTAL_ID;

FsWalShared *fs_wal = NULL;

/* How long fs_wal_sync() waits for the writer before it gives up. */
#define FS_WAL_SYNC_TIMEOUT_MS		30000

static RmgrData fs_rmgr = {
	.rm_name = "fairshare",
	.rm_redo = fs_wal_redo,
	.rm_desc = fs_wal_desc,
	.rm_identify = fs_wal_identify,
	.rm_startup = fs_wal_redo_startup,
	.rm_cleanup = fs_wal_redo_cleanup,
	.rm_mask = NULL,
	.rm_decode = NULL
};

/*
 * The settings, the resource manager (every server that replays
 * fairshare's WAL must preload fairshare with the same id), and the WAL
 * writer's registration.  At server start only (_PG_init).
 */
void
fs_wal_init(void)
{
	BackgroundWorker worker;

	DefineCustomIntVariable("fairshare.wal_interval",
							"How often fairshare's state changes are written to WAL.",
							"A crash or a failover loses at most the decisions of the last "
							"interval (plus the replication lag).  0 writes none: standbys and "
							"crash recovery then know nothing of decisions made since.",
							&fs_wal_interval_ms,
							100, 0, 10000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("fairshare.wal_rmgr_id",
							"Id of fairshare's WAL resource manager.",
							"128 is PostgreSQL's id for experiments; a distribution reserves its own "
							"(see the CustomWALResourceManagers page of the PostgreSQL wiki).  Every "
							"server that replays the WAL must use the same id.",
							&fs_wal_rmgr_id,
							RM_EXPERIMENTAL_ID, RM_MIN_CUSTOM_ID, RM_MAX_CUSTOM_ID,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	RegisterCustomRmgr((RmgrId) fs_wal_rmgr_id, &fs_rmgr);

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	/* The primary's only: it starts when recovery is over (at promotion). */
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "fairshare");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "fs_wal_writer_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "fairshare wal writer");
	snprintf(worker.bgw_type, BGW_MAXLEN, "fairshare wal writer");
	RegisterBackgroundWorker(&worker);
}

/* Ask for the shared struct (shmem request hook, module.c). */
void
fs_wal_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(FsWalShared)));
}

/* Create or attach to the shared struct.  Caller holds AddinShmemInitLock. */
void
fs_wal_shmem_init(void)
{
	bool		found;

	fs_wal = ShmemInitStruct("fairshare wal", sizeof(FsWalShared), &found);
	if (!found)
	{
		memset(fs_wal, 0, sizeof(FsWalShared));
		SpinLockInit(&fs_wal->mutex);
		ConditionVariableInit(&fs_wal->cycle_done);
	}
}

/*
 * fs_wal_sync() RETURNS pg_lsn: wait until the WAL writer has logged every
 * change made before the call, and return the end of its last record (for
 * a test or a planned switchover: a standby that has replayed up to it
 * knows those changes).  Waits for one whole writer cycle that began after
 * the call.
 */
Datum
fs_wal_sync(PG_FUNCTION_ARGS)
{
	uint64		start;
	uint64		cycles;
	XLogRecPtr	lsn;
	Latch	   *latch;
	TimestampTz deadline;

	fs_check_primary("wait for the fairshare WAL writer");
	if (fs_wal_interval_ms == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("fairshare writes no WAL: fairshare.wal_interval is 0"),
				 errhint("Set fairshare.wal_interval (for example to 100ms) and reload.")));
	SpinLockAcquire(&fs_wal->mutex);
	start = fs_wal->cycles;
	latch = fs_wal->writer_latch;
	SpinLockRelease(&fs_wal->mutex);
	if (latch != NULL)
		SetLatch(latch);

	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), FS_WAL_SYNC_TIMEOUT_MS);
	ConditionVariablePrepareToSleep(&fs_wal->cycle_done);
	for (;;)
	{
		SpinLockAcquire(&fs_wal->mutex);
		cycles = fs_wal->cycles;
		lsn = fs_wal->written_lsn;
		latch = fs_wal->writer_latch;
		SpinLockRelease(&fs_wal->mutex);
		/* The cycle under way at the call may have copied before it. */
		if (cycles >= start + 2)
			break;
		if (latch != NULL)
			SetLatch(latch);
		if (GetCurrentTimestamp() >= deadline)
		{
			ConditionVariableCancelSleep();
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the fairshare WAL writer did not finish a cycle within %d seconds",
							FS_WAL_SYNC_TIMEOUT_MS / 1000),
					 errhint("Check that the \"fairshare wal writer\" process runs (pg_stat_activity).")));
		}
		(void) ConditionVariableTimedSleep(&fs_wal->cycle_done, 100, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	PG_RETURN_LSN(lsn);
}

/* A timestamp column, NULL when never set. */
static void
fs_put_time(Datum *values, bool *nulls, int i, TimestampTz t)
{
	values[i] = TimestampTzGetDatum(t);
	nulls[i] = t == 0;
}

/*
 * fs_replication_state(): one row about replication through WAL: what the
 * writer logged (on a primary) and what was replayed (on a standby, or in
 * this server's crash recovery).
 */
Datum
fs_replication_state(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	FsWalShared copy;
	Datum		values[13];
	bool		nulls[13];
	int			i = 0;

	fs_check_loaded();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	SpinLockAcquire(&fs_wal->mutex);
	memcpy(&copy, fs_wal, sizeof(copy));
	SpinLockRelease(&fs_wal->mutex);

	memset(nulls, 0, sizeof(nulls));
	values[i++] = CStringGetTextDatum(RecoveryInProgress() ? "standby" : "primary");
	values[i++] = Int32GetDatum(fs_wal_interval_ms);
	values[i++] = BoolGetDatum(copy.writer_latch != NULL);
	values[i] = LSNGetDatum(copy.written_lsn);
	nulls[i++] = copy.written_lsn == InvalidXLogRecPtr;
	fs_put_time(values, nulls, i++, copy.written_at);
	values[i++] = Int64GetDatum((int64) copy.records);
	values[i++] = Int64GetDatum((int64) copy.bytes);
	values[i++] = Int64GetDatum((int64) copy.snapshots);
	values[i] = LSNGetDatum(copy.replayed_lsn);
	nulls[i++] = copy.replayed_lsn == InvalidXLogRecPtr;
	fs_put_time(values, nulls, i++, copy.replayed_primary_now);
	values[i++] = Int64GetDatum((int64) copy.replayed_records);
	values[i++] = Int64GetDatum((int64) copy.replay_dropped);
	values[i++] = BoolGetDatum(copy.replay_snapshot_seen);
	Assert(i == lengthof(values));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

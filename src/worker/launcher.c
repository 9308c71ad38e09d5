/*-------------------------------------------------------------------------
 *
 * launcher.c
 *	  The launcher ("fairshare launcher"): registered at server start and
 *	  connected to no database, it sweeps expired leases, saves the running
 *	  state file, and starts the scheduler in fairshare.database (worker.c
 *	  has the whole picture).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "catalog/pg_database.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "slots/slots.h"
#include "statefile/statefile.h"
#include "worker/worker.h"
#include "worker/worker_int.h"

/* How long the launcher waits before starting a scheduler again. */
#define FS_SCHEDULER_RESTART_SECS	5
/* How often it looks for fairshare.database and for a lost scheduler. */
#define FS_LAUNCHER_POLL_SECS		5

/* ----------------------------------------------------------------
 * The launcher
 * ----------------------------------------------------------------
 */

/* before_shmem_exit of the launcher: say it is gone. */
static void
fs_launcher_detach(int code pg_attribute_unused(), Datum arg pg_attribute_unused())
{
	SpinLockAcquire(&fs_worker_shared->mutex);
	if (fs_worker_shared->launcher_pid == MyProcPid)
		fs_worker_shared->launcher_pid = 0;
	SpinLockRelease(&fs_worker_shared->mutex);
}

/*
 * The database of that name that accepts connections, or InvalidOid.  A
 * heap scan: without a database, the launcher has no relcache entries for
 * catalog indexes until some other process has written the shared init
 * file.
 */
static Oid
fs_find_database(const char *name)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;
	Oid			result = InvalidOid;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);

		if (strcmp(NameStr(db->datname), name) != 0)
			continue;
#ifdef DATCONNLIMIT_INVALID_DB
		if (db->datconnlimit == DATCONNLIMIT_INVALID_DB)
			break;
#endif
		if (db->datallowconn)
			result = db->oid;
		break;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return result;
}

/*
 * Start the scheduler when none runs and fairshare.database exists.
 * Returns when to look again.
 */
static TimestampTz
fs_launcher_supervise(TimestampTz now)
{
	static BackgroundWorkerHandle *handle = NULL;
	static TimestampTz retry_at = 0;
	static char waiting_logged[NAMEDATALEN] = "";
	BackgroundWorker worker;
	pid_t		pid;
	pid_t		scheduler_pid;
	Oid			dboid;

	if (handle != NULL && GetBackgroundWorkerPid(handle, &pid) == BGWH_STOPPED)
	{
		pfree(handle);
		handle = NULL;
		retry_at = now + (TimestampTz) FS_SCHEDULER_RESTART_SECS * USECS_PER_SEC;
	}

	SpinLockAcquire(&fs_worker_shared->mutex);
	scheduler_pid = fs_worker_shared->scheduler_pid;
	strlcpy(fs_worker_shared->database, fs_worker_database, NAMEDATALEN);
	SpinLockRelease(&fs_worker_shared->mutex);

	/* Running (a scheduler for another database leaves on reload), or starting. */
	if (scheduler_pid != 0 || handle != NULL)
		return now + (TimestampTz) FS_LAUNCHER_POLL_SECS * USECS_PER_SEC;
	if (fs_worker_database[0] == '\0')
	{
		fs_worker_set_state(FS_WORKER_DISABLED);
		return now + (TimestampTz) 60 * USECS_PER_SEC;
	}
	if (now < retry_at)
		return retry_at;

	dboid = fs_find_database(fs_worker_database);
	if (!OidIsValid(dboid))
	{
		fs_worker_set_state(FS_WORKER_WAITING_DATABASE);
		if (strcmp(waiting_logged, fs_worker_database) != 0)
		{
			ereport(LOG,
					(errmsg("fairshare is waiting for database \"%s\" to exist and accept connections to run its schedules",
							fs_worker_database),
					 errhint("Create the database, or set fairshare.database to an existing one and reload.")));
			strlcpy(waiting_logged, fs_worker_database, NAMEDATALEN);
		}
		retry_at = now + (TimestampTz) FS_LAUNCHER_POLL_SECS * USECS_PER_SEC;
		return retry_at;
	}
	waiting_logged[0] = '\0';

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	worker.bgw_main_arg = ObjectIdGetDatum(dboid);
	worker.bgw_notify_pid = MyProcPid;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "fairshare");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "fs_scheduler_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "fairshare scheduler");
	snprintf(worker.bgw_type, BGW_MAXLEN, "fairshare scheduler");
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		handle = NULL;
		retry_at = now + (TimestampTz) 60 * USECS_PER_SEC;
		ereport(WARNING,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("fairshare could not start its scheduler: no background worker slot is free"),
				 errhint("Raise max_worker_processes and restart the server.")));
		return retry_at;
	}
	fs_worker_set_state(FS_WORKER_STARTING);
	return now + (TimestampTz) FS_LAUNCHER_POLL_SECS * USECS_PER_SEC;
}

/*
 * The background worker (the launcher): sweeps expired leases and saves the
 * running state file on their intervals, and starts the scheduler in
 * fairshare.database (again if it exits).
 */
void
fs_launcher_main(Datum main_arg pg_attribute_unused())
{
	MemoryContext loop_context;
	TimestampTz last_sweep = 0;
	TimestampTz last_save = 0;
	TimestampTz next_sweep = 0;
	TimestampTz next_save = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);

	/*
	 * The launcher runs no statement that a cancel could mean, and it has no
	 * error recovery: a cancel would end it, and leases would go unswept and
	 * the state file unsaved until the postmaster restarted it.
	 */
	pqsignal(SIGINT, SIG_IGN);
	BackgroundWorkerUnblockSignals();

	/* No database: shared catalogs (pg_database) are all it reads. */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	SpinLockAcquire(&fs_worker_shared->mutex);
	fs_worker_shared->launcher_pid = MyProcPid;
	SpinLockRelease(&fs_worker_shared->mutex);
	before_shmem_exit(fs_launcher_detach, (Datum) 0);

	loop_context = AllocSetContextCreate(TopMemoryContext, "fairshare launcher",
										 ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		TimestampTz now;
		TimestampTz wake;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);

			/* New intervals count from the last sweep and save, not the next. */
			if (last_sweep != 0)
				next_sweep = last_sweep + (TimestampTz) fs_sweep_interval_ms * 1000;
			if (last_save != 0 && fs_state_save_interval_secs > 0)
				next_save = last_save + (TimestampTz) fs_state_save_interval_secs * USECS_PER_SEC;
		}
		MemoryContextReset(loop_context);
		MemoryContextSwitchTo(loop_context);

		now = GetCurrentTimestamp();
		if (now >= next_sweep)
		{
			int			freed = fs_sweep_expired_leases(fs_now());

			SpinLockAcquire(&fs_worker_shared->mutex);
			fs_worker_shared->last_sweep_at = now;
			fs_worker_shared->leases_swept += freed;
			SpinLockRelease(&fs_worker_shared->mutex);
			last_sweep = now;
			next_sweep = now + (TimestampTz) fs_sweep_interval_ms * 1000;
		}
		if (fs_state_save_interval_secs > 0 && fs_save_state && now >= next_save)
		{
			last_save = now;
			if (fs_statefile_save(FS_STATE_RUNNING, LOG))
			{
				SpinLockAcquire(&fs_worker_shared->mutex);
				fs_worker_shared->last_save_at = now;
				SpinLockRelease(&fs_worker_shared->mutex);
			}
			next_save = now + (TimestampTz) fs_state_save_interval_secs * USECS_PER_SEC;
		}
		else if (fs_state_save_interval_secs == 0 || !fs_save_state)
			next_save = now + (TimestampTz) 60 * USECS_PER_SEC;

		wake = fs_launcher_supervise(now);
		wake = Min(wake, Min(next_sweep, next_save));

		MemoryContextSwitchTo(TopMemoryContext);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 fs_ms_until(GetCurrentTimestamp(), wake), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}


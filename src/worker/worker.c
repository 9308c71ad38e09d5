/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  fairshare's background worker.
 *
 * Two processes, one of each per cluster, neither on a standby:
 *
 *	 - the launcher ("fairshare launcher"), registered at server start and
 *	   connected to no database.  It sweeps expired leases and saves the
 *	   running state file periodically (both are cluster-wide), waits until
 *	   fairshare.database exists, and starts the scheduler there.  Not being
 *	   bound to a database lets it wait for one quietly, and follow a change
 *	   of fairshare.database without a restart.
 *
 *	 - the scheduler ("fairshare scheduler"), a dynamic worker connected to
 *	   fairshare.database.  At each minute boundary it lists the schedules
 *	   with a command that are due, claims their runs one per transaction,
 *	   owner by owner, least time used first (FsOwnerQueue), and runs each
 *	   command as the schedule's owner (fs_run_command()).  It waits while
 *	   the extension is not installed there, and exits when
 *	   fairshare.database changes (the launcher starts the next one).
 *
 * The time is fs_now(): fairshare.debug_clock moves it in tests, and a
 * reload wakes the scheduler at once, so tests need not wait for minutes.
 *
 * A small shared struct says who runs (one scheduler at a time, even if a
 * launcher is restarted while its scheduler lives on) and what they did,
 * for the fs_scheduler view.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "catalog/pg_db_role_setting.h"
#include "commands/async.h"
#include "commands/dbcommands.h"
#include "commands/prepare.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "lib/binaryheap.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "tcop/dest.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/wait_event.h"

#include "core/common.h"
#include "core/run_as.h"
#include "fairq/fairqueue.h"
#include "schedules/schedules.h"
#include "slots/slots.h"
#include "statefile/statefile.h"
#include "worker/worker.h"

PG_FUNCTION_INFO_V1(fs_current_run);
PG_FUNCTION_INFO_V1(fs_scheduler_state);

PGDLLEXPORT void fs_launcher_main(Datum main_arg);
PGDLLEXPORT void fs_scheduler_main(Datum main_arg);

/* How long the launcher waits before starting a scheduler again. */
#define FS_SCHEDULER_RESTART_SECS	5
/* How often it looks for fairshare.database and for a lost scheduler. */
#define FS_LAUNCHER_POLL_SECS		5
/*
 * Old ledger rows are deleted in batches of this many, each in its own
 * transaction (short locks, WAL and memory), until a batch finds fewer or
 * the pass has pruned for FS_PRUNE_MAX_SECS: the rest waits for the next.
 */
#define FS_PRUNE_BATCH				10000
#define FS_PRUNE_MAX_SECS			5

/*
 * How long a command may go on after fairshare.command_timeout cancelled
 * it before the scheduler exits to end it.  Unwinding from a cancellation
 * takes milliseconds; a command still running this long after has caught
 * it.
 */
#define FS_COMMAND_GRACE_SECS		5

int			fs_sweep_interval_ms = 1000;
int			fs_state_save_interval_secs = 30;
int			fs_command_timeout_ms = 60 * 1000;
int			fs_run_retention_secs = 7 * 24 * 3600;
int			fs_resync_interval_secs = 300;

/* The run being executed, for fs_current_run(); empty outside a run. */
static char *run_schedule_id = NULL;
static char *run_name = NULL;
static char *run_scheduled_for = NULL;
static char *run_payload = NULL;
static char *run_tenant = NULL;
static char *run_queue = NULL;

typedef enum FsWorkerState
{
	FS_WORKER_STOPPED = 0,
	FS_WORKER_DISABLED,			/* fairshare.database is empty */
	FS_WORKER_WAITING_DATABASE,
	FS_WORKER_STARTING,
	FS_WORKER_WAITING_EXTENSION,
	FS_WORKER_IDLE,				/* between minutes */
	FS_WORKER_RUNNING			/* claiming and running */
} FsWorkerState;

static const char *const worker_state_names[] = {
	"stopped", "disabled", "waiting for database", "starting",
	"waiting for extension", "idle", "running"
};

typedef struct FsWorkerShared
{
	slock_t		mutex;			/* protects everything below */
	pid_t		launcher_pid;
	pid_t		scheduler_pid;
	FsWorkerState state;
	char		database[NAMEDATALEN];
	TimestampTz last_sweep_at;
	uint64		leases_swept;
	TimestampTz last_save_at;
	TimestampTz last_pass_at;	/* fs_now() of the last pass */
	int64		last_pass_usecs;
	uint64		last_pass_runs;
	uint64		runs_succeeded;
	uint64		runs_failed;
	uint64		runs_pruned;

	/*
	 * The run whose command was executing when a scheduler exited: past
	 * its deadline (FS_COMMAND_GRACE_SECS after fairshare.command_timeout),
	 * terminated, or failing to record a run.  Its transaction rolled back,
	 * so the run is due again; the next scheduler in that database records
	 * it as failed instead of running the command once more, which could
	 * end the same way every time.  Shared memory does not survive a
	 * crash, and neither does this: after a crash the run runs again.
	 */
	Oid			lost_database;	/* InvalidOid: no lost run */
	int64		lost_schedule_id;
	TimestampTz lost_scheduled_for;
	TimestampTz lost_as_of;		/* the claim's as_of, to claim it again */
	bool		lost_timed_out; /* it ran past its deadline */
} FsWorkerShared;

static FsWorkerShared *fs_worker_shared = NULL;

/* The scheduler's run whose command is executing (valid), for its exit. */
static struct
{
	bool		valid;
	int64		schedule_id;
	TimestampTz scheduled_for;
	TimestampTz as_of;
} active_run;

/* The scheduler's timeout that ends a command which ignores its cancellation. */
static TimeoutId command_deadline = MAX_TIMEOUTS;
static volatile sig_atomic_t command_deadline_passed = false;

/* ----------------------------------------------------------------
 * Set-up
 * ----------------------------------------------------------------
 */

static Size
fs_worker_shmem_size(void)
{
	return MAXALIGN(sizeof(FsWorkerShared));
}

/* Ask for this layer's shared memory (shmem request hook, module.c). */
void
fs_worker_shmem_request(void)
{
	RequestAddinShmemSpace(fs_worker_shmem_size());
}

/* Called by shmem.c with AddinShmemInitLock held. */
void
fs_worker_shmem_init(void)
{
	bool		found;

	fs_worker_shared = ShmemInitStruct("fairshare worker", sizeof(FsWorkerShared), &found);
	if (!found)
	{
		memset(fs_worker_shared, 0, sizeof(FsWorkerShared));
		SpinLockInit(&fs_worker_shared->mutex);
	}
}

static void
fs_define_run_guc(const char *name, const char *description, char **variable)
{
	DefineCustomStringVariable(name, description,
							   "Set by the background worker while it runs a schedule's command; "
							   "empty otherwise.  See also fs_current_run().",
							   variable, "",
							   PGC_SUSET,
							   GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE | GUC_DISALLOW_IN_AUTO_FILE |
							   GUC_NO_RESET_ALL,
							   NULL, NULL, NULL);
}

/*
 * The background worker's settings (the sweep, save and recount intervals,
 * the commands' timeout, how long the run ledger is kept) and its
 * registration with the postmaster, unless fairshare.worker is off.
 */
void
fs_worker_init(void)
{
	BackgroundWorker worker;

	DefineCustomIntVariable("fairshare.sweep_interval",
							"How often the background worker frees expired leases.",
							NULL,
							&fs_sweep_interval_ms,
							1000, 10, 3600 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("fairshare.state_save_interval",
							"How often the background worker saves the running state file.",
							"After a crash, leases in the last saved file re-register when renewed.  "
							"0 turns periodic saves off.",
							&fs_state_save_interval_secs,
							30, 0, 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("fairshare.command_timeout",
							"Longest time a schedule's command may run.",
							"A command that runs longer is cancelled and its run recorded as failed; "
							"if it still runs 5 seconds later, the scheduler exits to end it.  "
							"0 means no limit.",
							&fs_command_timeout_ms,
							60 * 1000, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("fairshare.run_retention",
							"How long runs are kept in fs_schedule_runs.",
							"The scheduler deletes older runs.  0 keeps them forever.",
							&fs_run_retention_secs,
							7 * 24 * 3600, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("fairshare.resync_interval",
							"How often the scheduler recounts the ready rows of registered queues.",
							"The recount heals drift in the per-tenant backlog (rows changed while "
							"triggers were disabled, state restored after a crash).  It runs when the "
							"scheduler starts and then at this interval.  0 recounts only at start.",
							&fs_resync_interval_secs,
							300, 0, 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	fs_define_run_guc("fairshare.run_schedule_id", "Id of the schedule being run.",
					  &run_schedule_id);
	fs_define_run_guc("fairshare.run_name", "Name of the schedule being run.", &run_name);
	fs_define_run_guc("fairshare.run_scheduled_for",
					  "Scheduled time of the run (timestamptz, ISO format).", &run_scheduled_for);
	fs_define_run_guc("fairshare.run_payload", "Payload of the run (jsonb text).", &run_payload);
	fs_define_run_guc("fairshare.run_tenant", "Tenant of the run (empty: none).", &run_tenant);
	fs_define_run_guc("fairshare.run_queue", "Queue of the run.", &run_queue);

	if (!fs_worker_enabled)
		return;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	/* Not on a standby: it starts once recovery is over (at promotion). */
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "fairshare");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "fs_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "fairshare launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "fairshare launcher");
	RegisterBackgroundWorker(&worker);
}

static void
fs_worker_set_state(FsWorkerState state)
{
	SpinLockAcquire(&fs_worker_shared->mutex);
	fs_worker_shared->state = state;
	SpinLockRelease(&fs_worker_shared->mutex);
}

/* Milliseconds from now until `when` (at least 0, at most a minute). */
static long
fs_ms_until(TimestampTz now, TimestampTz when)
{
	int64		ms = (when - now + 999) / 1000;

	return (long) Max(0, Min(ms, 60 * 1000));
}

/* ----------------------------------------------------------------
 * The launcher
 * ----------------------------------------------------------------
 */

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

/* ----------------------------------------------------------------
 * Running a command as its owner
 * ----------------------------------------------------------------
 */

static void
fs_set_run_guc(const char *name, const char *value)
{
	(void) set_config_option(name, value ? value : "", PGC_SUSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
}

/*
 * The settings the owner would get at login here (ALTER ROLE ... SET, and
 * ... IN DATABASE ... SET), applied like SET commands so that they end with
 * the run.  Run as the owner, inside the security-restricted operation, so
 * that a stored "role" setting cannot take effect.
 */
static void
fs_apply_owner_settings(Oid owner)
{
	Relation	settings = table_open(DbRoleSettingRelationId, AccessShareLock);
	Snapshot	snapshot = RegisterSnapshot(GetCatalogSnapshot(DbRoleSettingRelationId));

	ApplySetting(snapshot, InvalidOid, owner, settings, PGC_S_SESSION);
	ApplySetting(snapshot, MyDatabaseId, owner, settings, PGC_S_SESSION);
	UnregisterSnapshot(snapshot);
	table_close(settings, AccessShareLock);
}

/*
 * Undo what a command may have left in this session, so that nothing of
 * one owner's run reaches the next one or the worker's own queries, like
 * DISCARD ALL does: settings (already undone with the command's GUC nest
 * level, see fs_run_command()), prepared statements, LISTEN, session
 * advisory locks, sequence state (currval, lastval), and the objects of
 * the session's temporary schema: a security-restricted operation refuses
 * temporary tables (and, in recent minor releases, types), but not
 * temporary functions or operators, which whatever runs next would find
 * as pg_temp.name (and a temporary type, where it can be made, before the
 * pg_catalog type of that name).  SET ROLE, SET SESSION AUTHORIZATION and
 * cursors WITH HOLD are refused to commands in the first place.  Runs in a
 * transaction, as the worker's own user.
 */
static void
fs_reset_session(void)
{
	ResetAllOptions();
	DropAllPreparedStatements();
	Async_UnlistenAll();
	LockReleaseAll(USER_LOCKMETHOD, true);
	ResetSequenceCaches();
	ResetTempTableNamespace();
}

/*
 * The command's uncatchable deadline has passed.  Do what die() does, so
 * that the next CHECK_FOR_INTERRUPTS() ends the process with FATAL: unlike
 * a cancellation (an ERROR), no exception handler of the command can catch
 * that.  The run's transaction rolls back with the process, and the exit
 * callback leaves word of the run for the next scheduler.  Runs in a
 * signal handler: flags and the latch only.
 */
static void
fs_command_deadline_handler(void)
{
	command_deadline_passed = true;
	if (!proc_exit_inprogress)
	{
		InterruptPending = true;
		ProcDiePending = true;
	}
	SetLatch(MyLatch);
}

static void
fs_disable_command_timeouts(void)
{
	disable_timeout(STATEMENT_TIMEOUT, false);
	if (command_deadline != MAX_TIMEOUTS)
		disable_timeout(command_deadline, false);
}

/*
 * Why no command may run in this database now, or NULL: the checks
 * PostgreSQL makes of the database when a session starts (CheckMyDatabase()).
 * The scheduler is already connected, so without them a database closed
 * to connections (ALLOW_CONNECTIONS false) or full (CONNECTION LIMIT) would
 * still have commands run in it.  `superuser`: the owner is one, and
 * passes the connection limit, as at login.
 */
static char *
fs_database_refusal(bool superuser)
{
	HeapTuple	tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(MyDatabaseId));
	Form_pg_database db;
	char	   *refusal = NULL;
	int			sessions;

	if (!HeapTupleIsValid(tuple))
		return psprintf("database %u no longer exists: no schedule runs", MyDatabaseId);
	db = (Form_pg_database) GETSTRUCT(tuple);
	if (!db->datallowconn)
		refusal = psprintf("database \"%s\" does not allow connections (ALLOW_CONNECTIONS false): no schedule runs",
						   NameStr(db->datname));
	else if (db->datconnlimit >= 0 && !superuser &&
			 (sessions = CountDBConnections(MyDatabaseId)) >= db->datconnlimit)
		refusal = psprintf("database \"%s\" has %d sessions, its CONNECTION LIMIT is %d: no schedule runs while the run would exceed it",
						   NameStr(db->datname), sessions, db->datconnlimit);
	ReleaseSysCache(tuple);
	return refusal;
}

/*
 * Why the command of `run` must not run as its owner now, or NULL.  The
 * owner is a role, kept by OID: a role dropped since is not replaced by one
 * created with its name, and a renamed one may have been renamed so as to
 * be mistaken for another (it takes its schedules back by calling
 * fs_schedule() for them again).  Nor does it run for a role that could
 * not start a session here itself, by the checks PostgreSQL makes at login
 * (InitializeSessionUserId(), CheckMyDatabase()): one that may not log in
 * (NOLOGIN), whose password expired (VALID UNTIL, which PostgreSQL checks
 * at password authentication only: here it counts as locking the role
 * out, whatever the authentication method), that has as many sessions as
 * its CONNECTION LIMIT allows (the run would be one more, as a login
 * would; superusers pass, as at login), that lacks CONNECT on this
 * database, or when the database refuses connections
 * (fs_database_refusal()).  These are checked at each run, so that
 * locking a role out stops its commands too.  The refused run is recorded
 * as failed with the reason, and not retried: the next scheduled run is
 * checked again.
 */
static char *
fs_owner_refusal(const FsClaimedRun *run)
{
	HeapTuple	tuple = SearchSysCache1(AUTHOID, ObjectIdGetDatum(run->owner_oid));
	Form_pg_authid role;
	char	   *refusal = NULL;
	Datum		valid_until;
	bool		no_valid_until;
	int			sessions;

	if (!HeapTupleIsValid(tuple))
		return psprintf("role \"%s\" (OID %u) no longer exists: its schedules do not run",
						run->owner, run->owner_oid);
	role = (Form_pg_authid) GETSTRUCT(tuple);
	valid_until = SysCacheGetAttr(AUTHOID, tuple, Anum_pg_authid_rolvaliduntil, &no_valid_until);
	if (strcmp(NameStr(role->rolname), run->owner) != 0)
		refusal = psprintf("role \"%s\" was renamed to \"%s\": its schedules do not run until it calls fs_schedule() for them again",
						   run->owner, NameStr(role->rolname));
	else if (!role->rolcanlogin)
		refusal = psprintf("role \"%s\" may not log in: its schedules do not run",
						   run->owner);
	else if (!no_valid_until && DatumGetTimestampTz(valid_until) < GetCurrentTimestamp())
		refusal = psprintf("role \"%s\" expired at %s (VALID UNTIL): its schedules do not run",
						   run->owner, timestamptz_to_str(DatumGetTimestampTz(valid_until)));
	else if (role->rolconnlimit >= 0 && !role->rolsuper &&
			 (sessions = CountUserBackends(run->owner_oid)) >= role->rolconnlimit)
		refusal = psprintf("role \"%s\" has %d sessions, its CONNECTION LIMIT is %d: its schedules do not run while the run would exceed it",
						   run->owner, sessions, role->rolconnlimit);
	else if (pg_database_aclcheck(MyDatabaseId, run->owner_oid, ACL_CONNECT) != ACLCHECK_OK)
		refusal = psprintf("role \"%s\" may not connect to database \"%s\": its schedules do not run",
						   run->owner, get_database_name(MyDatabaseId));
	else
		refusal = fs_database_refusal(role->rolsuper);
	ReleaseSysCache(tuple);
	return refusal;
}

/*
 * Raise the error for SPI's failure code `ret` running a command: what SPI
 * refused, with the SQLSTATE PostgreSQL uses for it, for the run's record.
 * fs_schedule() refuses these statements, but a schedule made before it
 * did may still have them.
 */
static void
fs_command_spi_error(int ret)
{
	switch (ret)
	{
		case SPI_ERROR_TRANSACTION:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
					 errmsg("transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, PREPARE TRANSACTION) cannot be used in a schedule's command"),
					 errhint("Remove it: each run is one transaction, committed when the command succeeds and rolled back when it fails.")));
			break;
		case SPI_ERROR_COPY:
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("COPY FROM STDIN or TO STDOUT (no client is connected to the background worker) cannot be used in a schedule's command"),
					 errhint("Use INSERT ... SELECT, or COPY to or from a file or program on the server.")));
			break;
		default:
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("the command could not be run: %s", SPI_result_code_string(ret)),
					 errhint("Change the command with fs_schedule().")));
			break;
	}
}

/*
 * Run the command of `run` as its owner in a subtransaction.  Returns NULL
 * when it succeeded, or its error message (the subtransaction is rolled
 * back: a failing command undoes only its own work).
 *
 * Privilege: the command runs with the owner as the current user, in a
 * security-restricted operation (SECURITY_LOCAL_USERID_CHANGE and
 * SECURITY_RESTRICTED_OPERATION, as for maintenance commands on a table's
 * owner's behalf): SET ROLE, SET SESSION AUTHORIZATION, temporary tables
 * and cursors WITH HOLD are refused, so the worker's own superuser session
 * cannot be reached from it.  Its GUCs start from the server's defaults
 * plus the owner's role settings, and whatever it sets ends with it; what
 * else it leaves in the session is undone by fs_reset_session() before
 * anything else runs.  Nor can it leave a deferred trigger to fire at the
 * run's commit, as the worker: PostgreSQL refuses to queue one in a
 * security-restricted operation ("cannot fire deferred trigger within
 * security-restricted operation").
 */
static char *
fs_run_command(const FsClaimedRun *run)
{
	MemoryContext context = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	Oid			owner_oid = run->owner_oid;
	char	   *volatile error = NULL;

	BeginInternalSubTransaction("fairshare run");
	MemoryContextSwitchTo(context);
	PG_TRY();
	{
		FsRunAs		run_as;
		int			ret;
		SPIExecuteOptions options;
		TimestampTz started;
		char	   *payload = JsonbToCString(NULL, &DatumGetJsonbP(run->payload)->root,
											 VARSIZE(DatumGetPointer(run->payload)));

		/*
		 * The owner's turn (run_as.c): its settings start from the server's
		 * and its role's, and every one it makes ends with it, even a
		 * session-level one (SET without LOCAL, set_config(..., false)),
		 * instead of reaching the next owner's command or the worker's own
		 * queries.
		 */
		fs_run_as_begin(&run_as, owner_oid, FS_RUN_AS_OWN_PATH);
		fs_set_run_guc("fairshare.run_schedule_id",
					   psprintf(INT64_FORMAT, run->schedule_id));
		fs_set_run_guc("fairshare.run_name", run->name);
		/* ISO whatever DateStyle says, so that it reads back the same. */
		fs_set_run_guc("fairshare.run_scheduled_for", timestamptz_to_str(run->scheduled_for));
		fs_set_run_guc("fairshare.run_payload", payload);
		fs_set_run_guc("fairshare.run_tenant", run->tenant);
		fs_set_run_guc("fairshare.run_queue", run->queue);

		fs_apply_owner_settings(owner_oid);

		/*
		 * At fairshare.command_timeout the command is cancelled: an error
		 * it may catch (PL/pgSQL's EXCEPTION WHEN query_canceled).  The
		 * deadline FS_COMMAND_GRACE_SECS later cannot be caught: it makes
		 * the scheduler exit (see fs_command_deadline_handler()).
		 */
		started = GetCurrentTimestamp();
		if (fs_command_timeout_ms > 0)
		{
			enable_timeout_after(STATEMENT_TIMEOUT, fs_command_timeout_ms);
			enable_timeout_at(command_deadline,
							  started + ((TimestampTz) fs_command_timeout_ms +
										 FS_COMMAND_GRACE_SECS * 1000) * 1000);
		}
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");

		/*
		 * Nobody reads a command's rows: they are discarded as they come.
		 * Kept (SPI's default), a command returning millions of rows would
		 * hold them all in the scheduler's memory until it ended.
		 */
		memset(&options, 0, sizeof(options));
		options.dest = None_Receiver;
		ret = SPI_execute_extended(run->command, &options);
		if (ret < 0)
			fs_command_spi_error(ret);
		SPI_finish();
		fs_disable_command_timeouts();

		/* It caught its cancellation, then ended: it still ran too long. */
		if (fs_command_timeout_ms > 0 &&
			TimestampDifferenceExceeds(started, GetCurrentTimestamp(), fs_command_timeout_ms))
			ereport(ERROR,
					(errcode(ERRCODE_QUERY_CANCELED),
					 errmsg("the command ran past fairshare.command_timeout (%d ms) and ignored its cancellation",
							fs_command_timeout_ms),
					 errhint("Let the command end when it is cancelled (do not catch query_canceled), or raise fairshare.command_timeout.")));

		fs_run_as_end(&run_as);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(context);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		fs_disable_command_timeouts();
		MemoryContextSwitchTo(context);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(context);
		CurrentResourceOwner = owner;
		error = psprintf("%s (SQLSTATE %s)", edata->message, unpack_sql_state(edata->sqlerrcode));
		FreeErrorData(edata);
	}
	PG_END_TRY();
	return error;
}

/* ----------------------------------------------------------------
 * The scheduler
 * ----------------------------------------------------------------
 */

/*
 * before_shmem_exit of the scheduler: say it is gone, and wake the launcher
 * to start another.
 */
static void
fs_scheduler_detach(int code pg_attribute_unused(), Datum arg pg_attribute_unused())
{
	pid_t		launcher;

	SpinLockAcquire(&fs_worker_shared->mutex);
	if (fs_worker_shared->scheduler_pid == MyProcPid)
	{
		fs_worker_shared->scheduler_pid = 0;
		fs_worker_shared->state = FS_WORKER_STOPPED;
		if (active_run.valid)
		{
			fs_worker_shared->lost_database = MyDatabaseId;
			fs_worker_shared->lost_schedule_id = active_run.schedule_id;
			fs_worker_shared->lost_scheduled_for = active_run.scheduled_for;
			fs_worker_shared->lost_as_of = active_run.as_of;
			fs_worker_shared->lost_timed_out = command_deadline_passed;
		}
	}
	launcher = fs_worker_shared->launcher_pid;
	SpinLockRelease(&fs_worker_shared->mutex);

	if (active_run.valid && command_deadline_passed)
		ereport(LOG,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("fairshare scheduler exited to end the command of schedule " INT64_FORMAT ", which ran past fairshare.command_timeout and ignored its cancellation",
						active_run.schedule_id),
				 errhint("The next scheduler records the run as failed and does not run it again.")));
	else if (active_run.valid)
		ereport(LOG,
				(errcode(ERRCODE_ADMIN_SHUTDOWN),
				 errmsg("fairshare scheduler exited during the run of schedule " INT64_FORMAT,
						active_run.schedule_id),
				 errhint("The next scheduler records the run as failed and does not run it again.")));

	/* A launcher that did not start this scheduler is not notified otherwise. */
	if (launcher != 0)
		kill(launcher, SIGUSR1);
}

static void
fs_count_run(bool failed)
{
	SpinLockAcquire(&fs_worker_shared->mutex);
	if (failed)
		fs_worker_shared->runs_failed++;
	else
		fs_worker_shared->runs_succeeded++;
	SpinLockRelease(&fs_worker_shared->mutex);
}

static void
fs_log_failed_run(const FsClaimedRun *run, const char *error)
{
	ereport(LOG,
			(errmsg("fairshare schedule \"%s\" of role \"%s\" failed its run for %s: %s",
					run->name, run->owner, timestamptz_to_str(run->scheduled_for), error)));
}

/*
 * Record a run as failed without running its command, in a transaction of
 * its own: claim the schedule's run again as the claim that handed it out
 * did (same schedule, same as_of), and if that gives the same run, record
 * it.  Otherwise (the schedule was changed or removed since) nothing is
 * claimed.  Returns whether the run was recorded.
 */
static bool
fs_settle_failed_run(int64 schedule_id, TimestampTz scheduled_for, TimestampTz as_of,
					 const char *error)
{
	FsClaimedRun *claimed = NULL;
	bool		settled = false;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	fs_reset_session();
	if (fs_claim_runs(true, schedule_id, 1, as_of, BOOTSTRAP_SUPERUSERID, true, &claimed, NULL) == 1 &&
		claimed->scheduled_for == scheduled_for)
	{
		fs_finish_run(claimed, error);
		fs_log_failed_run(claimed, error);
		settled = true;
	}
	PopActiveSnapshot();
	if (settled)
		CommitTransactionCommand();
	else
		AbortCurrentTransaction();
	return settled;
}

/*
 * The run a previous scheduler left when it exited during its command
 * (see FsWorkerShared), recorded as failed.  A failure to do so is logged
 * and the run is left due: ending this scheduler over it would only start
 * the next one on the same run.
 */
static void
fs_scheduler_settle_lost_run(void)
{
	MemoryContext context = CurrentMemoryContext;
	int64		schedule_id;
	TimestampTz scheduled_for;
	TimestampTz as_of;
	bool		timed_out;
	const char *error;

	SpinLockAcquire(&fs_worker_shared->mutex);
	if (fs_worker_shared->lost_database != MyDatabaseId)
	{
		SpinLockRelease(&fs_worker_shared->mutex);
		return;
	}
	fs_worker_shared->lost_database = InvalidOid;
	schedule_id = fs_worker_shared->lost_schedule_id;
	scheduled_for = fs_worker_shared->lost_scheduled_for;
	as_of = fs_worker_shared->lost_as_of;
	timed_out = fs_worker_shared->lost_timed_out;
	SpinLockRelease(&fs_worker_shared->mutex);

	error = timed_out ?
		"the command ran past fairshare.command_timeout and ignored its cancellation: the scheduler exited to end it" :
		"the scheduler exited during the command";
	PG_TRY();
	{
		if (fs_settle_failed_run(schedule_id, scheduled_for, as_of, error))
			fs_count_run(true);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(context);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		ereport(LOG,
				(errcode(edata->sqlerrcode),
				 errmsg("fairshare scheduler could not record the lost run of schedule " INT64_FORMAT " as failed: %s",
						schedule_id, edata->message),
				 errhint("The run stays due and runs again.")));
		FreeErrorData(edata);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(context);
}

/* What fs_scheduler_run_schedule() did with a schedule. */
typedef enum FsRunOutcome
{
	FS_RUN_NONE,				/* not due any more, or locked: nothing */
	FS_RUN_ADVANCED,			/* dealt with, without a run */
	FS_RUN_RAN					/* a run, succeeded or failed */
} FsRunOutcome;

/*
 * One run of one schedule, in its own transaction: claim it, run its
 * command, record how it went.  *more says whether the schedule still has
 * runs due at as_of (catch-up 'all').
 *
 * If the transaction itself fails after the command (a command can leave
 * it unable to commit: a deferred constraint, SET TRANSACTION READ ONLY),
 * everything rolls back, and the run is claimed again in a new transaction
 * and recorded as failed without running the command again, so that no
 * command can stall the scheduler or make it loop on one run.
 */
static FsRunOutcome
fs_scheduler_run_schedule(int64 id, TimestampTz as_of, bool *more)
{
	MemoryContext context = CurrentMemoryContext;
	volatile int64 schedule_id = 0;
	volatile TimestampTz scheduled_for = 0;
	char	   *volatile error = NULL;
	volatile FsRunOutcome outcome = FS_RUN_NONE;
	volatile bool more_due = false;
	FsClaimedRun *claimed = NULL;

	PG_TRY();
	{
		FsClaimInfo info;

		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, "fairshare: claiming a due run");
		if (fs_claim_runs(true, id, 1, as_of, BOOTSTRAP_SUPERUSERID, true, &claimed, &info) == 1)
		{
			char	   *failure;

			outcome = FS_RUN_RAN;
			schedule_id = claimed->schedule_id;
			scheduled_for = claimed->scheduled_for;
			active_run.schedule_id = schedule_id;
			active_run.scheduled_for = scheduled_for;
			active_run.as_of = as_of;
			active_run.valid = true;
			/*
			 * The schedule, not the command: pg_stat_activity shows this to
			 * roles (pg_read_all_stats) that may not read the command.
			 */
			pgstat_report_activity(STATE_RUNNING,
								   psprintf("fairshare: schedule " INT64_FORMAT, schedule_id));
			failure = fs_owner_refusal(claimed);
			if (failure == NULL)
				failure = fs_run_command(claimed);
			error = failure;
			fs_reset_session();
			fs_finish_run(claimed, failure);
			if (failure != NULL)
				fs_log_failed_run(claimed, failure);
		}
		else if (info.nschedules > 0)
			outcome = FS_RUN_ADVANCED;
		more_due = info.more;
		PopActiveSnapshot();
		CommitTransactionCommand();
		active_run.valid = false;
		pgstat_report_activity(STATE_IDLE, NULL);
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		char	   *failure;

		MemoryContextSwitchTo(context);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		if (schedule_id == 0)
			ReThrowError(edata);
		failure = psprintf("the run's transaction failed after its command: %s (SQLSTATE %s)",
						   edata->message, unpack_sql_state(edata->sqlerrcode));
		error = failure;

		/*
		 * Consume the run as failed.  An error here ends the scheduler, and
		 * the next one records the run (active_run is still set).  Whether
		 * more runs are due is left to the next claim to find out.
		 */
		(void) fs_settle_failed_run(schedule_id, scheduled_for, as_of, failure);
		active_run.valid = false;
		more_due = true;
		pgstat_report_activity(STATE_IDLE, NULL);
		FreeErrorData(edata);
	}
	PG_END_TRY();

	/* Back from the transactions' contexts to the pass's. */
	MemoryContextSwitchTo(context);
	if (outcome == FS_RUN_RAN)
		fs_count_run(error != NULL);
	*more = more_due;
	return outcome;
}

/*
 * The worker serves owners fairly within a pass: each owner's due
 * schedules wait in a queue of their own, and the next run is taken from
 * the owner whose commands have used the least time so far in the pass
 * (ties: the one whose next run is the oldest).  One owner's slow commands
 * then delay another owner's run by at most one command, instead of by
 * all of them.
 */
typedef struct FsOwnerQueue
{
	Oid			owner_oid;
	int64		used_usecs;		/* time its runs took in this pass */
	int			next;			/* its next schedule in the round's list */
	int			end;			/* past its last one */
} FsOwnerQueue;

/* Owners' used time, across the rounds of a pass. */
typedef struct FsOwnerUse
{
	Oid			owner_oid;		/* hash key */
	int64		used_usecs;
} FsOwnerUse;

/*
 * qsort order of due schedules: by owner, then by next run, so that a pass
 * runs each owner's schedules together, oldest first.
 */
static int
fs_due_cmp_owner(const void *a, const void *b)
{
	const FsDueSchedule *x = (const FsDueSchedule *) a;
	const FsDueSchedule *y = (const FsDueSchedule *) b;

	if (x->owner_oid != y->owner_oid)
		return x->owner_oid < y->owner_oid ? -1 : 1;
	if (x->next_run_at != y->next_run_at)
		return x->next_run_at < y->next_run_at ? -1 : 1;
	if (x->schedule_id != y->schedule_id)
		return x->schedule_id < y->schedule_id ? -1 : 1;
	return 0;
}

/* binaryheap keeps the greatest first: the owner to serve next. */
static int
fs_owner_queue_cmp(Datum a, Datum b, void *arg)
{
	const FsOwnerQueue *x = (const FsOwnerQueue *) DatumGetPointer(a);
	const FsOwnerQueue *y = (const FsOwnerQueue *) DatumGetPointer(b);
	const FsDueSchedule *due = (const FsDueSchedule *) arg;

	if (x->used_usecs != y->used_usecs)
		return x->used_usecs < y->used_usecs ? 1 : -1;
	if (due[x->next].next_run_at != due[y->next].next_run_at)
		return due[x->next].next_run_at < due[y->next].next_run_at ? 1 : -1;
	if (x->owner_oid != y->owner_oid)
		return x->owner_oid < y->owner_oid ? 1 : -1;
	return 0;
}

/* Due schedules listed per round of a pass at most. */
#define FS_PASS_ROUND				10000

/*
 * One round of a pass: list due schedules, and claim and run them, owner
 * by owner as FsOwnerQueue says.  Adds the runs to *runs; returns how many
 * schedules it dealt with (0: nothing more to do in this pass).
 */
static int
fs_scheduler_round(TimestampTz as_of, HTAB *use, uint64 *runs)
{
	MemoryContext context = CurrentMemoryContext;
	FsDueSchedule *due;
	FsOwnerQueue *queues;
	binaryheap *heap;
	int			ndue;
	int			nowners = 0;
	int			dealt = 0;
	int			i;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "fairshare: listing due runs");
	MemoryContextSwitchTo(context);
	ndue = fs_due_worker_schedules(as_of, FS_PASS_ROUND, &due);
	PopActiveSnapshot();
	CommitTransactionCommand();
	MemoryContextSwitchTo(context);
	pgstat_report_activity(STATE_IDLE, NULL);
	if (ndue == 0)
		return 0;

	qsort(due, ndue, sizeof(FsDueSchedule), fs_due_cmp_owner);
	queues = palloc(sizeof(FsOwnerQueue) * ndue);
	heap = binaryheap_allocate(ndue, fs_owner_queue_cmp, due);
	for (i = 0; i < ndue; i++)
	{
		if (i == 0 || due[i].owner_oid != due[i - 1].owner_oid)
		{
			bool		found;
			FsOwnerUse *u = hash_search(use, &due[i].owner_oid, HASH_ENTER, &found);
			FsOwnerQueue *q = &queues[nowners++];

			if (!found)
				u->used_usecs = 0;
			q->owner_oid = due[i].owner_oid;
			q->used_usecs = u->used_usecs;
			q->next = i;
		}
		queues[nowners - 1].end = i + 1;
	}
	for (i = 0; i < nowners; i++)
		binaryheap_add_unordered(heap, PointerGetDatum(&queues[i]));
	binaryheap_build(heap);

	while (!binaryheap_empty(heap))
	{
		FsOwnerQueue *q = (FsOwnerQueue *) DatumGetPointer(binaryheap_first(heap));
		TimestampTz started = GetCurrentTimestamp();
		bool		more = false;
		FsRunOutcome outcome;

		outcome = fs_scheduler_run_schedule(due[q->next].schedule_id, as_of, &more);
		if (outcome != FS_RUN_NONE)
			dealt++;
		if (outcome == FS_RUN_RAN)
		{
			(*runs)++;
			q->used_usecs += GetCurrentTimestamp() - started;
		}
		/* A schedule with more runs due stays at the head of its queue. */
		if (outcome == FS_RUN_NONE || !more)
			q->next++;
		if (q->next == q->end)
			(void) binaryheap_remove_first(heap);
		else
			binaryheap_replace_first(heap, PointerGetDatum(q));
		CHECK_FOR_INTERRUPTS();
	}

	for (i = 0; i < nowners; i++)
	{
		FsOwnerUse *u = hash_search(use, &queues[i].owner_oid, HASH_FIND, NULL);

		u->used_usecs = queues[i].used_usecs;
	}
	binaryheap_free(heap);
	pfree(queues);
	pfree(due);
	return dealt;
}

/* Is the extension, with its schedules, installed in this database? */
static bool
fs_scheduler_ready(void)
{
	bool		ready;

	StartTransactionCommand();
	ready = fs_schedules_ready();
	CommitTransactionCommand();
	return ready;
}

/*
 * Recount the backlog of every queue registered in this database: at the
 * scheduler's start, then every fairshare.resync_interval.  A failure (the
 * extension is older than fair dequeue, a queue's table is gone) is logged
 * and tried again at the next interval; it never stops the scheduler.
 */
static void
fs_scheduler_resync(void)
{
	static TimestampTz last_resync_at = 0;
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext context = CurrentMemoryContext;

	/* The interval is read each time: a reload that shortens it counts. */
	if (last_resync_at != 0 &&
		(fs_resync_interval_secs == 0 ||
		 !TimestampDifferenceExceeds(last_resync_at, now, fs_resync_interval_secs * 1000)))
		return;
	last_resync_at = now;

	pgstat_report_activity(STATE_RUNNING, "fairshare: recounting fair-dequeue queues");
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	PG_TRY();
	{
		(void) fs_fairqueue_resync_all();
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(context);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		ereport(LOG,
				(errcode(edata->sqlerrcode),
				 errmsg("fairshare scheduler could not recount fair-dequeue queues: %s", edata->message),
				 errhint("It tries again in fairshare.resync_interval; fs_resync() recounts now.")));
		FreeErrorData(edata);
	}
	PG_END_TRY();
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* Claim and run everything due at as_of; then delete old ledger rows. */
static void
fs_scheduler_pass(TimestampTz as_of)
{
	TimestampTz started = GetCurrentTimestamp();
	uint64		runs = 0;
	uint64		pruned = 0;
	MemoryContext pass_context;
	MemoryContext old;
	HASHCTL		ctl;
	HTAB	   *use;

	/*
	 * What the pass keeps between its transactions (the lists of due
	 * schedules, the owners' time, errors of failed runs) lives here and
	 * goes with the pass.
	 */
	pass_context = AllocSetContextCreate(TopMemoryContext, "fairshare scheduler pass",
										 ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(pass_context);

	fs_worker_set_state(FS_WORKER_RUNNING);
	fs_scheduler_settle_lost_run();
	fs_scheduler_resync();

	/*
	 * Rounds go on while they deal with schedules: a round lists what is
	 * due when it starts, and schedules it could not lock, or that became
	 * due during it, are left for the next.
	 */
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(FsOwnerUse);
	ctl.hcxt = pass_context;
	use = hash_create("fairshare owners' time", 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	while (fs_scheduler_round(as_of, use, &runs) > 0)
		CHECK_FOR_INTERRUPTS();

	if (fs_run_retention_secs > 0)
	{
		TimestampTz prune_started = GetCurrentTimestamp();
		TimestampTz before = prune_started - (TimestampTz) fs_run_retention_secs * USECS_PER_SEC;
		uint64		deleted;

		pgstat_report_activity(STATE_RUNNING, "fairshare: deleting old runs");
		do
		{
			CHECK_FOR_INTERRUPTS();
			StartTransactionCommand();
			PushActiveSnapshot(GetTransactionSnapshot());
			deleted = fs_prune_runs(before, FS_PRUNE_BATCH);
			PopActiveSnapshot();
			CommitTransactionCommand();
			pruned += deleted;
		} while (deleted >= FS_PRUNE_BATCH &&
				 !TimestampDifferenceExceeds(prune_started, GetCurrentTimestamp(),
											 FS_PRUNE_MAX_SECS * 1000));
		pgstat_report_activity(STATE_IDLE, NULL);
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(pass_context);

	SpinLockAcquire(&fs_worker_shared->mutex);
	fs_worker_shared->last_pass_at = as_of;
	fs_worker_shared->last_pass_usecs = GetCurrentTimestamp() - started;
	fs_worker_shared->last_pass_runs = runs;
	fs_worker_shared->runs_pruned += pruned;
	fs_worker_shared->state = FS_WORKER_IDLE;
	SpinLockRelease(&fs_worker_shared->mutex);
}

/*
 * The scheduler, in fairshare.database: waits until the extension exists,
 * then claims due runs and runs each command as its owner, in a transaction
 * of its own, recording its end in the ledger; it also recounts the
 * database's fair-dequeue queues and prunes the ledger on their intervals.
 */
void
fs_scheduler_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	char	   *dbname;
	bool		waiting_logged = false;
	bool		attached;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);

	/* One scheduler per cluster, even across a launcher restart. */
	SpinLockAcquire(&fs_worker_shared->mutex);
	attached = fs_worker_shared->scheduler_pid == 0;
	if (attached)
		fs_worker_shared->scheduler_pid = MyProcPid;
	SpinLockRelease(&fs_worker_shared->mutex);
	if (!attached)
	{
		ereport(LOG, (errmsg("fairshare scheduler not started: another one is running")));
		proc_exit(0);
	}
	before_shmem_exit(fs_scheduler_detach, (Datum) 0);
	command_deadline = RegisterTimeout(USER_TIMEOUT, fs_command_deadline_handler);

	StartTransactionCommand();
	dbname = MemoryContextStrdup(TopMemoryContext, get_database_name(dboid));
	CommitTransactionCommand();
	SetConfigOption("application_name", "fairshare scheduler", PGC_USERSET, PGC_S_OVERRIDE);
	ereport(LOG, (errmsg("fairshare scheduler started in database \"%s\"", dbname)));

	for (;;)
	{
		TimestampTz as_of;
		TimestampTz next;
		long		timeout;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			if (strcmp(fs_worker_database, dbname) != 0)
			{
				ereport(LOG,
						(errmsg("fairshare scheduler stopping in database \"%s\": fairshare.database is now \"%s\"",
								dbname, fs_worker_database)));
				proc_exit(0);
			}
		}

		as_of = fs_now();
		if (RecoveryInProgress())
			fs_worker_set_state(FS_WORKER_STOPPED);
		else if (!fs_scheduler_ready())
		{
			fs_worker_set_state(FS_WORKER_WAITING_EXTENSION);
			if (!waiting_logged)
				ereport(LOG,
						(errmsg("fairshare scheduler is waiting for the extension in database \"%s\"",
								dbname),
						 errhint("Run CREATE EXTENSION fairshare (or ALTER EXTENSION fairshare UPDATE) there.")));
			waiting_logged = true;
		}
		else
		{
			waiting_logged = false;
			fs_scheduler_pass(as_of);
		}

		/*
		 * Sleep to the next minute boundary after as_of: runs are on whole
		 * minutes.  A pass that ran past it goes again at once.  With
		 * fairshare.debug_clock the clock only moves on reload, which sets
		 * the latch.
		 */
		next = (as_of / (60 * USECS_PER_SEC) + 1) * (60 * USECS_PER_SEC);
		timeout = fs_debug_clock > 0 ? 60 * 1000L : fs_ms_until(fs_now(), next);
		if (timeout > 0)
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 timeout, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* ----------------------------------------------------------------
 * SQL functions
 * ----------------------------------------------------------------
 */

/*
 * fs_current_run() RETURNS record: the run whose command is executing, or
 * a row of NULLs outside one.
 */
Datum
fs_current_run(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[6];
	bool		nulls[6] = {true, true, true, true, true, true};

	fs_check_loaded();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	if (run_schedule_id != NULL && run_schedule_id[0] != '\0')
	{
		values[0] = DirectFunctionCall1(int8in, CStringGetDatum(run_schedule_id));
		values[1] = CStringGetTextDatum(run_name);
		values[2] = CStringGetTextDatum(run_tenant);
		nulls[2] = run_tenant[0] == '\0';
		values[3] = CStringGetTextDatum(run_queue);
		values[4] = DirectFunctionCall3(timestamptz_in, CStringGetDatum(run_scheduled_for),
										ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1));
		values[5] = DirectFunctionCall1(jsonb_in, CStringGetDatum(run_payload));
		memset(nulls, 0, sizeof(nulls));
		nulls[2] = run_tenant[0] == '\0';
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/* fs_scheduler_state(): one row about the launcher and the scheduler. */
Datum
fs_scheduler_state(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	FsWorkerShared copy;
	Datum		values[14];
	bool		nulls[14];
	int			i = 0;

	fs_check_loaded();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	SpinLockAcquire(&fs_worker_shared->mutex);
	memcpy(&copy, fs_worker_shared, sizeof(copy));
	SpinLockRelease(&fs_worker_shared->mutex);

	memset(nulls, 0, sizeof(nulls));
	values[i] = Int32GetDatum(copy.launcher_pid);
	nulls[i++] = copy.launcher_pid == 0;
	values[i] = Int32GetDatum(copy.scheduler_pid);
	nulls[i++] = copy.scheduler_pid == 0;
	values[i++] = CStringGetTextDatum(copy.database);
	values[i++] = CStringGetTextDatum(worker_state_names[copy.state]);
	values[i] = TimestampTzGetDatum(copy.last_pass_at);
	nulls[i++] = copy.last_pass_at == 0;
	values[i] = Float8GetDatum((float8) copy.last_pass_usecs / 1000.0);
	nulls[i++] = copy.last_pass_at == 0;
	values[i++] = Int64GetDatum((int64) copy.last_pass_runs);
	values[i++] = Int64GetDatum((int64) copy.runs_succeeded);
	values[i++] = Int64GetDatum((int64) copy.runs_failed);
	values[i++] = Int64GetDatum((int64) copy.runs_pruned);
	values[i] = TimestampTzGetDatum(copy.last_sweep_at);
	nulls[i++] = copy.last_sweep_at == 0;
	values[i++] = Int64GetDatum((int64) copy.leases_swept);
	values[i] = TimestampTzGetDatum(copy.last_save_at);
	nulls[i++] = copy.last_save_at == 0;
	values[i++] = BoolGetDatum(fs_worker_enabled);
	Assert(i == lengthof(values));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  fairshare's background worker: its settings, its registration, and the
 *	  shared struct that says who runs and what they did.
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

#include "funcapi.h"
#include "postmaster/bgworker.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "statefile/statefile.h"
#include "worker/worker.h"
#include "worker/worker_int.h"

PG_FUNCTION_INFO_V1(fs_scheduler_state);

int			fs_sweep_interval_ms = 1000;
int			fs_state_save_interval_secs = 30;
int			fs_command_timeout_ms = 60 * 1000;
int			fs_run_retention_secs = 7 * 24 * 3600;
int			fs_resync_interval_secs = 300;

static const char *const worker_state_names[] = {
	"stopped", "disabled", "waiting for database", "starting",
	"waiting for extension", "idle", "running"
};

FsWorkerShared *fs_worker_shared = NULL;

/* ----------------------------------------------------------------
 * Set-up
 * ----------------------------------------------------------------
 */

/* Shared memory of the background worker's struct. */
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

	fs_run_command_init();

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

/* Say what the launcher or the scheduler is doing, for fs_scheduler_state(). */
void
fs_worker_set_state(FsWorkerState state)
{
	SpinLockAcquire(&fs_worker_shared->mutex);
	fs_worker_shared->state = state;
	SpinLockRelease(&fs_worker_shared->mutex);
}

/* Milliseconds from now until `when` (at least 0, at most a minute). */
long
fs_ms_until(TimestampTz now, TimestampTz when)
{
	int64		ms = (when - now + 999) / 1000;

	return (long) Max(0, Min(ms, 60 * 1000));
}

/* ----------------------------------------------------------------
 * SQL functions
 * ----------------------------------------------------------------
 */

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

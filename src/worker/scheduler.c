/*-------------------------------------------------------------------------
 *
 * scheduler.c
 *	  The scheduler ("fairshare scheduler"): a dynamic worker connected to
 *	  fairshare.database that runs the due schedules with a command each
 *	  minute, owner by owner, least time used first (worker.c has the whole
 *	  picture).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_authid.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "lib/binaryheap.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "fairq/fairqueue.h"
#include "worker/worker.h"
#include "worker/worker_int.h"

/*
 * Old ledger rows are deleted in batches of this many, each in its own
 * transaction (short locks, WAL and memory), until a batch finds fewer or
 * the pass has pruned for FS_PRUNE_MAX_SECS: the rest waits for the next.
 */
#define FS_PRUNE_BATCH				10000
#define FS_PRUNE_MAX_SECS			5

/* The scheduler's run whose command is executing (valid), for its exit. */
static struct
{
	bool		valid;
	int64		schedule_id;
	TimestampTz scheduled_for;
	TimestampTz as_of;
} active_run;

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

	fs_route_refresher_attach(false);
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
			fs_worker_shared->lost_timed_out = fs_command_deadline_passed();
		}
	}
	launcher = fs_worker_shared->launcher_pid;
	SpinLockRelease(&fs_worker_shared->mutex);

	if (active_run.valid && fs_command_deadline_passed())
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

/* Count a finished run for fs_scheduler_state(). */
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

/* Log a run that failed, with its schedule, owner and time. */
static void
fs_log_failed_run(const FsTakenRun *run, const char *error)
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
	FsTakenRun *claimed = NULL;
	bool		settled = false;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	fs_reset_session();
	if (fs_take_runs(true, schedule_id, 1, as_of, BOOTSTRAP_SUPERUSERID, true, &claimed, NULL) == 1 &&
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
	FsTakenRun *claimed = NULL;

	PG_TRY();
	{
		FsTakeInfo info;

		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, "fairshare: claiming a due run");
		if (fs_take_runs(true, id, 1, as_of, BOOTSTRAP_SUPERUSERID, true, &claimed, &info) == 1)
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
 * Run fn(arg) in a transaction of its own.  Returns NULL when it committed,
 * else the error (the transaction aborted; the caller logs and frees it).
 * With `throw_cancel`, a cancel is thrown on rather than returned.
 */
static ErrorData *
fs_scheduler_in_transaction(void (*fn) (void *), void *arg, bool throw_cancel)
{
	MemoryContext context = CurrentMemoryContext;
	ErrorData  *volatile edata = NULL;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	PG_TRY();
	{
		fn(arg);
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(context);
		edata = CopyErrorData();
		if (throw_cancel && edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
			PG_RE_THROW();
		FlushErrorState();
		AbortCurrentTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(context);
	return edata;
}

/* One weight asked (fs_scheduler_route_refresh()), within 2 s to connect. */
static void
fs_scheduler_route_ask(void *arg)
{
	(void) set_config_option("citus.node_connection_timeout", "2000", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	fs_route_refresh_one((const FsRouteWant *) arg);
}

/*
 * Ask the nodes of a Citus cluster the claimable weights that claims
 * through this coordinator want (route.c), each in a transaction of its
 * own, until `until` (the next pass: asks never hold it up for long).  A
 * node that cannot be asked (within 2 s to connect) keeps its last weight
 * until the next round; the failure is logged once a minute at most, and
 * never stops the scheduler.  A cancel is not an ask that failed: it is
 * thrown on.
 */
static void
fs_scheduler_route_refresh(TimestampTz until)
{
	static TimestampTz logged_at = 0;
	FsRouteWant *wants = palloc(sizeof(FsRouteWant) * FS_ROUTE_WANTS_MAX);
	int			n = fs_route_wants(wants);
	int			i;

	pgstat_report_activity(STATE_RUNNING, "fairshare: asking the nodes' claimable weights");
	for (i = 0; i < n && GetCurrentTimestamp() < until; i++)
	{
		ErrorData  *edata = fs_scheduler_in_transaction(fs_scheduler_route_ask, &wants[i], true);

		if (edata == NULL)
			continue;
		fs_route_refresh_failed(&wants[i]);
		if (TimestampDifferenceExceeds(logged_at, GetCurrentTimestamp(), 60 * 1000))
		{
			ereport(LOG,
					(errcode(edata->sqlerrcode),
					 errmsg("fairshare scheduler could not ask node group %d the claimable weight of queue \"%s\": %s",
							wants[i].group, wants[i].queue_name, edata->message),
					 errhint("It asks again at its next round; claims through the coordinator use the last weight meanwhile.")));
			logged_at = GetCurrentTimestamp();
		}
		FreeErrorData(edata);
	}
	pfree(wants);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* fs_fairqueue_resync_all(), for fs_scheduler_in_transaction(). */
static void
fs_scheduler_resync_all(void *arg pg_attribute_unused())
{
	(void) fs_fairqueue_resync_all();
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
	ErrorData  *edata;

	/* The interval is read each time: a reload that shortens it counts. */
	if (last_resync_at != 0 &&
		(fs_resync_interval_secs == 0 ||
		 !TimestampDifferenceExceeds(last_resync_at, now, fs_resync_interval_secs * 1000)))
		return;
	last_resync_at = now;

	pgstat_report_activity(STATE_RUNNING, "fairshare: recounting fair-dequeue queues");
	edata = fs_scheduler_in_transaction(fs_scheduler_resync_all, NULL, false);
	if (edata != NULL)
	{
		ereport(LOG,
				(errcode(edata->sqlerrcode),
				 errmsg("fairshare scheduler could not recount fair-dequeue queues: %s", edata->message),
				 errhint("It tries again in fairshare.resync_interval; fs_resync() recounts now.")));
		FreeErrorData(edata);
	}
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
	TimestampTz pass_due_at = 0;	/* 0: a pass at once */

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
	fs_command_deadline_register();

	StartTransactionCommand();
	dbname = MemoryContextStrdup(TopMemoryContext, get_database_name(dboid));
	CommitTransactionCommand();
	SetConfigOption("application_name", "fairshare scheduler", PGC_USERSET, PGC_S_OVERRIDE);
	ereport(LOG, (errmsg("fairshare scheduler started in database \"%s\"", dbname)));

	fs_route_refresher_attach(true);
	for (;;)
	{
		TimestampTz as_of;
		TimestampTz next;
		long		timeout;
		long		route_ms;
		bool		pass_due = pass_due_at == 0 || GetCurrentTimestamp() >= pass_due_at;

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
			pass_due = true;
		}

		if (pass_due)
		{
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
			 * The next pass is at the next minute boundary after as_of: runs
			 * are on whole minutes.  A pass that ran past it goes again at
			 * once.  With fairshare.debug_clock the clock only moves on
			 * reload, which sets the latch.
			 */
			next = (as_of / (60 * USECS_PER_SEC) + 1) * (60 * USECS_PER_SEC);
			timeout = fs_debug_clock > 0 ? 60 * 1000L : fs_ms_until(fs_now(), next);
			pass_due_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), Max(timeout, 0));
		}

		/*
		 * Between passes, the nodes' claimable weights for claims through
		 * a Citus coordinator, while they are wanted (route.c).
		 */
		route_ms = fs_route_refresh_due_ms();
		if (route_ms == 0 && !RecoveryInProgress())
		{
			fs_scheduler_route_refresh(pass_due_at);
			route_ms = fs_route_refresh_due_ms();
		}

		timeout = fs_ms_until(GetCurrentTimestamp(), pass_due_at);
		if (route_ms >= 0)
			timeout = Min(timeout, Max(route_ms, 1));
		if (timeout > 0)
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 timeout, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}


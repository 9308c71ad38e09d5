/*-------------------------------------------------------------------------
 *
 * schedules.h
 *	  Durable cron schedules: fs_schedule(), fs_unschedule(), and taking
 *	  due runs exactly once (fs_claim_due_schedules() and the worker).  In
 *	  C, fair dequeue claims rows and the scheduler takes runs; the SQL name
 *	  fs_claim_due_schedules() is fixed.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_SCHEDULES_H
#define FAIRSHARE_SCHEDULES_H

#include "utils/timestamp.h"

/*
 * GUCs: whether fairshare's background worker runs (fairshare.worker) and
 * the database whose schedules it runs (fairshare.database).
 */
extern bool fs_worker_enabled;
extern char *fs_worker_database;

/* Longest schedule name, in bytes. */
#define FS_SCHEDULE_NAME_MAXLEN		200

/* Most missed runs one take makes up for with catchup 'all'. */
#define FS_CATCHUP_ALL_CAP			100

/* A run handed out by fs_take_runs(), in the caller's memory context. */
typedef struct FsTakenRun
{
	int64		schedule_id;
	TimestampTz scheduled_for;
	Oid			owner_oid;		/* the owner role */
	char	   *owner;			/* its name when it last called fs_schedule() */
	char	   *name;
	char	   *tenant;			/* NULL: no tenant */
	char	   *queue;
	Datum		payload;		/* jsonb */
	char	   *command;		/* NULL: the application runs it */
} FsTakenRun;

/* What taking runs did besides handing them out. */
typedef struct FsTakeInfo
{
	int			nschedules;		/* due schedules dealt with, with a run or
								 * without one (catch-up dropped it, or the
								 * schedule stopped) */
	bool		more;			/* max_runs left runs due */
} FsTakeInfo;

/* A due schedule with a command, as fs_due_worker_schedules() lists it. */
typedef struct FsDueSchedule
{
	int64		schedule_id;
	Oid			owner_oid;
	TimestampTz next_run_at;
} FsDueSchedule;

/* GUCs */
extern int	fs_catchup_tolerance_secs;

extern void fs_schedules_init(void);

/*
 * Take up to max_runs due runs as of `as_of`: of the schedule
 * only_schedule_id, which has a command (the worker's way), or of
 * schedules without a command (the application's; only_schedule_id 0: of
 * any), of every owner or of `taker` only.  Records each run in the
 * ledger and advances the schedules, in the caller's transaction.  Returns
 * the number of runs; fewer than max_runs only when no more are due.  Fills
 * *info if not NULL.
 */
extern int	fs_take_runs(bool with_command, int64 only_schedule_id, int max_runs,
						 TimestampTz as_of, Oid taker, bool all_owners,
						 FsTakenRun **runs, FsTakeInfo *info);

/*
 * Due schedules with a command, up to `limit`, oldest first, without
 * locking them: what the worker will take, schedule by schedule.  The
 * array is in the caller's memory context; returns its length.
 */
extern int	fs_due_worker_schedules(TimestampTz as_of, int limit, FsDueSchedule **due);

/* Record how a worker run ended (error NULL: it succeeded). */
extern void fs_finish_run(const FsTakenRun *run, const char *error);

/* Delete ledger rows of runs that ended before `before`; returns how many. */
extern uint64 fs_prune_runs(TimestampTz before, int limit);

/*
 * The latest as_of taking runs accepts: a little after now (the later of the
 * server clock and fairshare.debug_clock).
 */
extern TimestampTz fs_take_horizon(void);

/* Does `role` see every owner's schedules (superuser or admin member)? */
extern bool fs_sees_all_schedules(Oid role);

/* Is the schedules part of the extension installed in this database? */
extern bool fs_schedules_ready(void);

#endif							/* FAIRSHARE_SCHEDULES_H */

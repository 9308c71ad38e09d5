/*-------------------------------------------------------------------------
 *
 * worker_int.h
 *	  What the files of the background worker share: its shared struct
 *	  (worker.c), the launcher (launcher.c), running a command as its owner
 *	  (run_command.c) and the scheduler (scheduler.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_WORKER_INT_H
#define FAIRSHARE_WORKER_INT_H

#include "schedules/schedules.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

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

extern FsWorkerShared *fs_worker_shared;

/* worker.c */
extern void fs_worker_set_state(FsWorkerState state);
extern long fs_ms_until(TimestampTz now, TimestampTz when);

/* launcher.c and scheduler.c: the processes' entry points */
extern PGDLLEXPORT void fs_launcher_main(Datum main_arg);
extern PGDLLEXPORT void fs_scheduler_main(Datum main_arg);

/* run_command.c */
extern void fs_run_command_init(void);
extern void fs_command_deadline_register(void);
extern bool fs_command_deadline_passed(void);
extern void fs_reset_session(void);
extern char *fs_owner_refusal(const FsTakenRun *run);
extern char *fs_run_command(const FsTakenRun *run);

#endif							/* FAIRSHARE_WORKER_INT_H */

/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  fairshare's background worker: the launcher (lease sweeps, state file
 *	  saves, supervising the scheduler) and the scheduler (runs due
 *	  schedules of fairshare.database each minute).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_WORKER_H
#define FAIRSHARE_WORKER_H

/* GUCs */
extern int	fs_sweep_interval_ms;
extern int	fs_state_save_interval_secs;
extern int	fs_command_timeout_ms;
extern int	fs_run_retention_secs;
extern int	fs_resync_interval_secs;

/* Defines the GUCs and, at server start, registers the launcher. */
extern void fs_worker_init(void);
extern void fs_worker_shmem_request(void);
extern void fs_worker_shmem_init(void);

#endif							/* FAIRSHARE_WORKER_H */

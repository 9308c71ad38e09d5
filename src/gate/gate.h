/*-------------------------------------------------------------------------
 *
 * gate.h
 *	  The global gate: how many slots a tenant may hold right now, given the
 *	  live workers of its queue, the top-of-hour dampener and its throttle;
 *	  and backpressure on admission.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_GATE_H
#define FAIRSHARE_GATE_H

#include "core/shmem.h"
#include "core/stateformat.h"
#include "lib/stringinfo.h"

/* GUCs */
extern int	fs_worker_ttl_s;
extern double fs_tenant_share;
extern int	fs_dampen_window_min;
extern double fs_dampen_floor;
extern int	fs_backpressure_latency_ms;
extern int	fs_max_workers;

/* What the gate allows in a queue right now, for any tenant. */
typedef struct FsGateCapacity
{
	bool		active;			/* some worker is live: the gate is on */
	int32		live_threads;
	float8		dampener;		/* 1 outside the window around :00 */
	float8		share_threads;	/* live_threads x share x dampener */
} FsGateCapacity;

typedef enum FsBackpressure
{
	FS_BP_NONE = 0,
	FS_BP_LATENCY,				/* reported latency over the threshold */
	FS_BP_NO_FREE_THREAD		/* every live worker thread holds a slot */
} FsBackpressure;

extern void fs_gate_init(void);
extern void fs_gate_shmem_request(void);
extern void fs_gate_shmem_init(void);
extern void fs_gate_queue_init(FsQueue *queue);
extern void fs_gate_capacity(FsQueue *queue, TimestampTz now, FsGateCapacity *cap);
extern int32 fs_gate_ceiling(const FsGateCapacity *cap, const FsLimits *limits,
							 FsReason *deny_reason);
extern float8 fs_gate_dampener(TimestampTz now);
extern FsBackpressure fs_gate_backpressure(FsQueue *queue, const FsGateCapacity *cap,
										   TimestampTz now);
extern void fs_gate_set_latency(FsQueue *queue, float8 latency_ms, TimestampTz now);

/* Replication through WAL: the heartbeat table as logged, and its replay. */
extern bool fs_gate_wal_write(StringInfo buf, uint64 *seen, uint64 *count, bool *queue_named);
extern void fs_gate_replay_clear(void);
extern bool fs_gate_replay_worker(FsStateItem *item, fs_queue_of_index queue_of, void *arg);
extern void fs_gate_replay_recount(void);

#endif							/* FAIRSHARE_GATE_H */

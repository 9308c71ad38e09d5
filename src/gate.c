/*-------------------------------------------------------------------------
 *
 * gate.c
 *	  The global gate: how many slots a tenant may hold right now.
 *
 * A tenant's ceiling is its max_slots.  (With live workers reporting
 * heartbeats, the gate lowers it to the tenant's share of them.)
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "gate.h"

/* Set up the gate's part of a new queue entry (queues_lock held). */
void
fs_gate_queue_init(FsQueue *queue)
{
	(void) queue;
}

/*
 * The number of slots `limits`' tenant may hold in `queue` at `now`, and the
 * reason to give when it holds that many already.
 */
int32
fs_gate_ceiling(FsQueue *queue, const FsLimits *limits, TimestampTz now,
				FsReason *deny_reason)
{
	(void) queue;
	(void) now;
	*deny_reason = FS_REASON_TENANT_LIMIT;
	return limits->max_slots;
}

/*-------------------------------------------------------------------------
 *
 * gate.h
 *	  The global gate: how many slots a tenant may hold right now.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_GATE_H
#define FAIRSHARE_GATE_H

#include "shmem.h"

extern void fs_gate_queue_init(FsQueue *queue);
extern int32 fs_gate_ceiling(FsQueue *queue, const FsLimits *limits, TimestampTz now,
							 FsReason *deny_reason);

#endif							/* FAIRSHARE_GATE_H */

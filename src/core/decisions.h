/*-------------------------------------------------------------------------
 *
 * decisions.h
 *	  The log of recent decisions: what slots, budgets and claims decided.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_DECISIONS_H
#define FAIRSHARE_DECISIONS_H

#include "core/shmem.h"

/* What kind of decision a log record is about. */
typedef enum FsDecisionKind
{
	FS_DECISION_SLOT = 1,		/* fs_acquire_slot */
	FS_DECISION_SPEND,			/* fs_spend_tokens */
	FS_DECISION_CHARGE,			/* fs_charge_tokens */
	FS_DECISION_CLAIM			/* a row claimed in fair order */
} FsDecisionKind;

/*
 * One decision, as logged.  Token fields are NaN where they do not apply
 * (no budget, or a slot decision); runs_possible is -1 for "unlimited".
 */
typedef struct FsDecision
{
	FsDecisionKind kind;
	FsReason	reason;
	uint32		queue_id;
	const char *tenant;
	int32		requested;
	int32		runs_possible;
	int32		granted;
	float8		tokens_before;
	float8		tokens_consumed;
	float8		balance_after;
	TimestampTz at;
} FsDecision;

/* GUC */
extern int	fs_decision_log_size;

extern void fs_decisions_init(void);
extern void fs_decisions_shmem_request(void);
extern void fs_decisions_shmem_init(void);
extern void fs_decision_init(FsDecision *decision, FsDecisionKind kind,
							 const char *tenant, TimestampTz now);
extern void fs_decision_log(const FsDecision *decision);
extern void fs_decision_fail_open(FsDecision *decision, const FsQueue *queue, int32 granted);

#endif							/* FAIRSHARE_DECISIONS_H */

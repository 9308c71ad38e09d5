/*-------------------------------------------------------------------------
 *
 * telemetry.h
 *	  Views of fairshare's live state and counters, and the log of recent
 *	  decisions.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_TELEMETRY_H
#define FAIRSHARE_TELEMETRY_H

#include "core/shmem.h"

/* Column counts of the SRFs; must match their OUT parameters in SQL. */
#define FS_TENANT_STATE_COLS	(11 + FS_NUM_TENANT_REASONS + 4)
#define FS_SERVER_STATE_COLS	24

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

extern void fs_telemetry_init(void);
extern Size fs_telemetry_shmem_size(void);
extern void fs_telemetry_shmem_init(void);
extern void fs_decision_init(FsDecision *decision, FsDecisionKind kind,
							 const char *tenant, TimestampTz now);
extern void fs_decision_log(const FsDecision *decision);

#endif							/* FAIRSHARE_TELEMETRY_H */

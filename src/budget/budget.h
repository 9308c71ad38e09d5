/*-------------------------------------------------------------------------
 *
 * budget.h
 *	  Token buckets: milliseconds of worker time per tenant, accruing
 *	  continuously at budget_ms_per_minute up to a cap of the same size.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_BUDGET_H
#define FAIRSHARE_BUDGET_H

#include "core/shmem.h"
#include "core/tenant.h"

/*
 * How long after a crash a tenant's balance is unknown: a bucket refills
 * from empty to full in one minute, so after that a fresh full bucket is no
 * more than the tenant could have had.
 */
#define FS_BUDGET_LOST_USECS	USECS_PER_MINUTE

/*
 * Debt is bounded to a day of budget (1,440 minutes of accrual): long work
 * is paid for, but a mistake (microseconds passed as milliseconds) cannot
 * lock a tenant out for years.  One charge is at most a day of worker time.
 */
#define FS_BUDGET_MAX_CHARGE_MS		(24.0 * 60 * 60 * 1000)

extern void fs_budget_init(void);
extern bool fs_budget_state_lost(TimestampTz now);
extern void fs_budget_refund_at_abort(FsQueue *queue, const char *tenant, float8 tokens);

/* Fair dequeue (fairq/) */
#define FS_BUDGET_DEFAULT_COST_MS	100.0	/* as fs_spend_tokens' cost_ms */
extern bool fs_budget_claim(FsQueue *queue, const char *tenant, float8 cost_ms,
							TimestampTz now, float8 *taken);
extern void fs_budget_unclaim(FsQueue *queue, const char *tenant, float8 taken);
extern void fs_budget_charge_committed(FsQueue *queue, const char *tenant, float8 used_ms,
									   TimestampTz now);
extern float8 fs_budget_balance_now(const FsTenant *entry, TimestampTz now);

#endif							/* FAIRSHARE_BUDGET_H */

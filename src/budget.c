/*-------------------------------------------------------------------------
 *
 * budget.c
 *	  Token buckets: milliseconds of worker time per tenant.
 *
 * A bucket holds at most budget_ms_per_minute tokens and accrues
 * continuously, budget_ms_per_minute per minute of wall-clock time, in
 * proportion to the time since the tenant's last decision (touched_at).
 * A tenant without a budget (budget_ms_per_minute < 0) is never limited and
 * costs nothing to decide for.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "budget.h"

/*
 * Accrue tokens for the time between entry->touched_at and now.  Called
 * (through fs_tenant_touch) with the entry's spinlock held.  A tenant seen
 * for the first time starts with a full bucket (see fs_limits_store()).
 */
void
fs_budget_accrue(FsTenant *entry, TimestampTz now)
{
	float8		cap = entry->budget_ms_per_minute;
	float8		elapsed_minutes;

	if (cap < 0)
		return;
	elapsed_minutes = (float8) (now - entry->touched_at) / (float8) USECS_PER_MINUTE;
	entry->token_balance = Min(cap, entry->token_balance + elapsed_minutes * cap);
}

/* Would the bucket be full at `now`?  Entry spinlock held. */
bool
fs_budget_is_full(const FsTenant *entry, TimestampTz now)
{
	float8		cap = entry->budget_ms_per_minute;
	float8		elapsed_minutes;

	if (cap < 0)
		return true;
	elapsed_minutes = (float8) (now - entry->touched_at) / (float8) USECS_PER_MINUTE;
	return entry->token_balance + elapsed_minutes * cap >= cap;
}

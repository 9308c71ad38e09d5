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

#include "shmem.h"

extern void fs_budget_accrue(FsTenant *entry, TimestampTz now);
extern bool fs_budget_is_full(const FsTenant *entry, TimestampTz now);

#endif							/* FAIRSHARE_BUDGET_H */

/*-------------------------------------------------------------------------
 *
 * tenant.h
 *	  The arithmetic done on a tenant entry under its spinlock: the token
 *	  bucket's accrual, the decay of served work, and the copies of its
 *	  cached limits.
 *
 * These are the few computations on an entry that more than one layer
 * needs (the core when it touches or evicts an entry; budgets, slots, the
 * fair order and the limits cache when they decide): one inline definition
 * each, here, so that the core needs no layer above it.  Every function
 * below is called with the entry's spinlock held (core/shmem.c, rule 1).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_TENANT_H
#define FAIRSHARE_TENANT_H

#include <math.h>

#include "core/shmem.h"

/*
 * A bucket's debt is bounded: at most this many minutes of its accrual
 * (fs_charge_tokens can take a bucket below zero, down to this).
 */
#define FS_BUDGET_MAX_DEBT_MINUTES	1440.0

/* GUC: the half-life of served work (fairshare.fairness_half_life), seconds. */
extern int	fs_fairness_half_life;

/*
 * Accrue tokens for the time between entry->touched_at and now.  A tenant
 * seen for the first time starts with a full bucket (fs_limits_store()).
 */
static inline void
fs_budget_accrue(FsTenant *entry, TimestampTz now)
{
	float8		cap = entry->budget_ms_per_minute;
	float8		elapsed_minutes;

	if (cap < 0)
		return;
	elapsed_minutes = (float8) (now - entry->touched_at) / (float8) USECS_PER_MINUTE;
	entry->token_balance = Max(-FS_BUDGET_MAX_DEBT_MINUTES * cap,
							   Min(cap, entry->token_balance + elapsed_minutes * cap));
}

/* Would the bucket be full at `now`?  (No budget: always.) */
static inline bool
fs_budget_is_full(const FsTenant *entry, TimestampTz now)
{
	float8		cap = entry->budget_ms_per_minute;
	float8		elapsed_minutes;

	if (cap < 0)
		return true;
	elapsed_minutes = (float8) (now - entry->touched_at) / (float8) USECS_PER_MINUTE;
	return entry->token_balance + elapsed_minutes * cap >= cap;
}

/* Served work decayed from `since` to `now`, by fairshare.fairness_half_life. */
static inline float8
fs_served_decayed(float8 served, TimestampTz since, TimestampTz now)
{
	if (served <= 0 || now <= since)
		return Max(served, 0.0);
	return served * exp2(-(float8) (now - since) /
						 ((float8) fs_fairness_half_life * USECS_PER_SEC));
}

/* Are the limits cached in `entry` current? */
static inline bool
fs_limits_current(const FsTenant *entry)
{
	return entry->limits_generation ==
		pg_atomic_read_u32(&fs_shared->limits_generation);
}

/* The limits cached in `entry`. */
static inline void
fs_limits_copy_out(const FsTenant *entry, FsLimits *out)
{
	out->max_slots = entry->max_slots;
	out->min_slots = entry->min_slots;
	out->weight = entry->weight;
	out->budget_ms_per_minute = entry->budget_ms_per_minute;
	out->throttle = entry->throttle;
}

/*
 * Cache `limits`, loaded at `generation`, in `entry`.  A tenant seen for the
 * first time starts with a full bucket.
 */
static inline void
fs_limits_store(FsTenant *entry, const FsLimits *limits, uint32 generation)
{
	entry->max_slots = limits->max_slots;
	entry->min_slots = limits->min_slots;
	entry->weight = limits->weight;
	entry->budget_ms_per_minute = limits->budget_ms_per_minute;
	entry->throttle = limits->throttle;
	entry->limits_generation = generation;
	if (entry->flags & FS_TENANT_NEW)
	{
		entry->token_balance = Max(limits->budget_ms_per_minute, 0);
		entry->flags &= ~FS_TENANT_NEW;
	}
}

#endif							/* FAIRSHARE_TENANT_H */

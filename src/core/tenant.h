/*-------------------------------------------------------------------------
 *
 * tenant.h
 *	  Every change of a tenant entry's state, and the arithmetic done on it
 *	  under its spinlock: the token bucket's accrual, the decay of served
 *	  work, and the copies of its cached limits.
 *
 * ONE PLACE WHERE A TENANT CHANGES.  After core/shmem.c has entered an
 * entry, its fields change only through the functions of this file: a
 * slot taken or given back, tokens taken or given back, a decision counted,
 * a fair-order tag set, a backlog counted.  Each is called with the entry's
 * spinlock held (core/shmem.c, rule 1), taken with fs_tenant_lock() and let
 * go with fs_tenant_unlock(), and each ends in fs_tenant_changed(): the one
 * point that sees every change.  The debug build checks the entry's
 * invariants there; what must follow every change of a tenant (its
 * replication) hooks there too.  The layers decide; this file changes.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_TENANT_H
#define FAIRSHARE_TENANT_H

#include <math.h>

#include "access/transam.h"

#include "core/shmem.h"

/*
 * A bucket's debt is bounded: at most this many minutes of its accrual
 * (fs_charge_tokens can take a bucket below zero, down to this).
 */
#define FS_BUDGET_MAX_DEBT_MINUTES	1440.0

/* GUC: the half-life of served work (fairshare.fairness_half_life), seconds. */
extern int	fs_fairness_half_life;

#ifdef FS_DEBUG
/* The first broken invariant seen under a spinlock, raised at unlock. */
extern const char *fs_tenant_broken;
extern void fs_tenant_report_broken(const char *file, int line) pg_attribute_noreturn();

/*
 * What is wrong with `entry`, or NULL: counts never below zero, limits as
 * the cache keeps them, finite balances, tags and work.
 */
static inline const char *
fs_tenant_invalid(const FsTenant *entry)
{
	if (entry->slots_in_use < 0)
		return "slots_in_use >= 0";
	if (entry->min_slots < 0 || entry->min_slots > entry->max_slots)
		return "min_slots >= 0 && min_slots <= max_slots";
	if (!(entry->weight > 0) || isinf(entry->weight))
		return "weight > 0 && !isinf(weight)";
	if (!(entry->throttle >= 0 && entry->throttle <= 1))
		return "throttle >= 0 && throttle <= 1";
	if (isnan(entry->virtual_finish) || isinf(entry->virtual_finish))
		return "virtual_finish is finite";
	if (!(entry->served_ms >= 0) || isinf(entry->served_ms))
		return "served_ms >= 0 && !isinf(served_ms)";
	/* Its bounds hold after a touch (a change of limits moves them). */
	if (entry->budget_ms_per_minute >= 0 &&
		(isnan(entry->token_balance) || isinf(entry->token_balance)))
		return "token_balance is finite";
	return NULL;
}
#endif

/* Take an entry's spinlock, to read it or to change it. */
static inline void
fs_tenant_lock(FsTenant *entry)
{
	SpinLockAcquire(&entry->mutex);
}

/*
 * Let go of an entry's spinlock.  In the debug build, an invariant that a
 * change under it broke is raised now, naming where the lock was let go (no
 * error may be raised under a spinlock).
 */
#define fs_tenant_unlock(entry) fs_tenant_unlock_at(entry, __FILE__, __LINE__)

static inline void
fs_tenant_unlock_at(FsTenant *entry, const char *file, int line)
{
	SpinLockRelease(&entry->mutex);
#ifdef FS_DEBUG
	if (unlikely(fs_tenant_broken != NULL))
		fs_tenant_report_broken(file, line);
#else
	(void) file;
	(void) line;
#endif
}

/*
 * The end of every change of `entry`, spinlock held: the one point that
 * sees each change of a tenant's state.  The entry is marked for the WAL
 * writer (statefile/wal_writer.c), which logs marked entries and clears
 * the mark; the first mark since it last looked says so in FsShared (a
 * plain store, and only when the flag is not set already).  No lock, no
 * allocation, no error.
 */
static inline void
fs_tenant_changed(FsTenant *entry)
{
#ifdef FS_DEBUG
	if (fs_tenant_broken == NULL)
		fs_tenant_broken = fs_tenant_invalid(entry);
#endif
	if (!(entry->flags & FS_TENANT_WAL_DIRTY))
	{
		entry->flags |= FS_TENANT_WAL_DIRTY;
		if (pg_atomic_read_u32(&fs_shared->wal_tenants_dirty) == 0)
			pg_atomic_write_u32(&fs_shared->wal_tenants_dirty, 1);
	}
}

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
	fs_tenant_changed(entry);
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
	fs_tenant_changed(entry);
}

/* ----------------------------------------------------------------
 * Changes of an entry.  Each is called with the entry's spinlock held and
 * ends in fs_tenant_changed().
 * ----------------------------------------------------------------
 */

/* No live lease of the entry expires before `expires_at`, as far as known. */
static inline void
fs_tenant_note_expiry(FsTenant *entry, TimestampTz expires_at)
{
	if (expires_at < entry->earliest_expiry)
		entry->earliest_expiry = expires_at;
	fs_tenant_changed(entry);
}

/* A slot taken, by a lease that expires at `expires_at`. */
static inline void
fs_tenant_slot_take(FsTenant *entry, TimestampTz expires_at)
{
	entry->slots_in_use++;
	fs_tenant_note_expiry(entry, expires_at);
}

/*
 * A slot given back (`expired`: its lease ran out).  The count never goes
 * below zero: false when there was none to give back.  With the last slot
 * the earliest expiry is forgotten.
 */
static inline bool
fs_tenant_slot_give_back(FsTenant *entry, bool expired)
{
	bool		counted = entry->slots_in_use > 0;

	if (counted)
		entry->slots_in_use--;
	if (entry->slots_in_use == 0)
		entry->earliest_expiry = DT_NOEND;
	if (expired)
		entry->leases_expired++;
	fs_tenant_changed(entry);
	return counted;
}

/*
 * A lease restored after a crash, not yet renewed: it pins the entry but
 * counts no slot.  False (nothing changed) when the count is at its limit.
 */
static inline bool
fs_tenant_orphan_add(FsTenant *entry)
{
	if (entry->orphan_leases == PG_UINT16_MAX)
		return false;
	entry->orphan_leases++;
	fs_tenant_changed(entry);
	return true;
}

/* An orphan lease gone.  False when none was counted. */
static inline bool
fs_tenant_orphan_give_back(FsTenant *entry)
{
	bool		counted = entry->orphan_leases > 0;

	if (counted)
		entry->orphan_leases--;
	fs_tenant_changed(entry);
	return counted;
}

/*
 * An orphan lease renewed: it counts a slot again, until `expires_at`.
 * False when no orphan was counted (the slot is counted all the same).
 */
static inline bool
fs_tenant_orphan_adopt(FsTenant *entry, TimestampTz expires_at)
{
	bool		counted = fs_tenant_orphan_give_back(entry);

	fs_tenant_slot_take(entry, expires_at);
	return counted;
}

/* A decision for the tenant, counted under its reason. */
static inline void
fs_tenant_count_decision(FsTenant *entry, FsReason reason)
{
	entry->decisions[reason]++;
	fs_tenant_changed(entry);
}

/* A decision counted by mistake, taken back (never below zero). */
static inline void
fs_tenant_uncount_decision(FsTenant *entry, FsReason reason)
{
	if (entry->decisions[reason] > 0)
		entry->decisions[reason]--;
	fs_tenant_changed(entry);
}

/* A run that could have started but found no free worker thread. */
static inline void
fs_tenant_count_failed_delivery(FsTenant *entry)
{
	entry->failed_to_deliver++;
	fs_tenant_changed(entry);
}

/* The counters fs_reset() zeroes. */
static inline void
fs_tenant_reset_counters(FsTenant *entry)
{
	memset(entry->decisions, 0, sizeof(entry->decisions));
	entry->leases_expired = 0;
	entry->failed_to_deliver = 0;
	entry->served_ms = 0;
	fs_tenant_changed(entry);
}

/* Take `tokens` from the bucket (the caller checked the balance). */
static inline void
fs_tenant_tokens_take(FsTenant *entry, float8 tokens)
{
	entry->token_balance -= tokens;
	fs_tenant_changed(entry);
}

/*
 * Charge `tokens` of work measured after the fact: the bucket may go into
 * debt, down to its bound.  Returns what was taken.
 */
static inline float8
fs_tenant_tokens_charge(FsTenant *entry, float8 tokens)
{
	float8		before = entry->token_balance;

	entry->token_balance = Max(before - tokens,
							   -FS_BUDGET_MAX_DEBT_MINUTES * entry->budget_ms_per_minute);
	fs_tenant_changed(entry);
	return before - entry->token_balance;
}

/* Put `tokens` back into the bucket, up to its cap. */
static inline void
fs_tenant_tokens_give_back(FsTenant *entry, float8 tokens)
{
	entry->token_balance = Min(entry->budget_ms_per_minute, entry->token_balance + tokens);
	fs_tenant_changed(entry);
}

/* Does adding `rows` to a backlog of `ready` rows take it from none to some? */
static inline bool
fs_backlog_lists(int64 ready, int64 rows)
{
	return ready <= 0 && ready + rows > 0;
}

/*
 * Ready rows counted in (or out of, when negative) the tenant's backlog.
 * Not clamped at zero: see fs_fair_change().  `fresh`: rows came (or a
 * recount saw them), which ends a dry spell.  True when the count went from
 * none to some.
 */
static inline bool
fs_tenant_backlog_add(FsTenant *entry, int64 rows, bool fresh)
{
	bool		lists = fs_backlog_lists(entry->ready_rows, rows);

	entry->ready_rows += rows;
	if (fresh)
		entry->flags &= ~FS_TENANT_DRY;
	fs_tenant_changed(entry);
	return lists;
}

/*
 * The commit of top-level transaction `fxid` added ready rows: a claim whose
 * snapshot was taken before it may not see them.  The newest adder is kept
 * (commits apply here in no particular order).  Not a change a standby needs
 * (claims run on the primary only).
 */
static inline void
fs_tenant_note_adder(FsTenant *entry, FullTransactionId fxid)
{
	if (FullTransactionIdIsValid(fxid) && FullTransactionIdFollows(fxid, entry->backlog_fxid))
		entry->backlog_fxid = fxid;
}

/* Its last claim found fewer rows than counted: pass it over for a while. */
static inline void
fs_tenant_mark_dry(FsTenant *entry)
{
	entry->flags |= FS_TENANT_DRY;
	fs_tenant_changed(entry);
}

/* Listed in (or taken out of) its queue's fair order. */
static inline void
fs_tenant_set_queued(FsTenant *entry, bool queued)
{
	if (queued)
		entry->flags |= FS_TENANT_QUEUED;
	else
		entry->flags &= ~FS_TENANT_QUEUED;
	fs_tenant_changed(entry);
}

/* Out of its queue's fair order with no backlog (a resync forgets it). */
static inline void
fs_tenant_backlog_forget(FsTenant *entry)
{
	entry->ready_rows = 0;
	entry->flags &= ~(FS_TENANT_QUEUED | FS_TENANT_DRY);
	fs_tenant_changed(entry);
}

/* Its fair-order finish tag (under its queue's fair-order lock too). */
static inline void
fs_tenant_set_tag(FsTenant *entry, float8 virtual_finish)
{
	entry->virtual_finish = virtual_finish;
	fs_tenant_changed(entry);
}

/* Work served (or, negative, taken back), never below zero. */
static inline void
fs_tenant_served_add(FsTenant *entry, float8 ms)
{
	entry->served_ms = Max(entry->served_ms + ms, 0.0);
	fs_tenant_changed(entry);
}

/* One row claimed: its tag is now `virtual_finish`, its cost served. */
static inline void
fs_tenant_claimed(FsTenant *entry, float8 virtual_finish, float8 cost)
{
	entry->virtual_finish = virtual_finish;
	entry->ready_rows--;
	entry->served_ms += cost;
	fs_tenant_changed(entry);
}

#endif							/* FAIRSHARE_TENANT_H */

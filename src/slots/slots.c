/*-------------------------------------------------------------------------
 *
 * slots.c
 *	  Per-tenant concurrency slots, held through leases.
 *
 * fs_acquire_slot() checks a tenant's slots against its ceiling and takes
 * one in the same spinlock-protected step, so the check-and-take is atomic
 * across backends.  The slot is held by a lease: a row of the shared lease
 * table with an expiry.  A lease ends when it is released, or when it is not
 * renewed in time (whoever looks at it next, or the sweeper, frees the slot).
 *
 * Each lease partition keeps its live and orphan leases in a heap by expiry,
 * so a sweep takes off only what has expired, a batch per hold of a
 * partition lock, and never looks at the rest of the table.  A tenant's
 * earliest_expiry is a lower bound of its live leases' expiries (exact
 * until one of them ends early): a denied acquire whose tenant may hold an
 * expired lease frees a bounded number of expired leases and looks again.
 *
 * A lease keeps a pointer to its tenant entry and the entry's generation.
 * The lease pins the entry (shmem.c, rule 2) as long as the counts are
 * right; should a slot ever be given back twice, the entry may be evicted
 * and reused, and the generation tells: the lease's slot is then gone with
 * it.  Counts are kept from going below zero, and the debug build raises an
 * error where that was needed.
 *
 * Leases follow the transaction that touches them:
 *
 *	- A lease acquired in a transaction that aborts is returned at abort
 *	  (likewise for a subtransaction rolled back to its savepoint).
 *	- A release of a lease acquired in the same (sub)transaction frees the
 *	  slot at once: whatever happens, that lease will not outlive it.
 *	- Any other release takes effect at commit; until then the lease is
 *	  RELEASING (nobody else can release or renew it), and an abort makes it
 *	  live again.  An acquire for the same tenant later in that transaction
 *	  takes over the slot being released (it is granted even at the
 *	  ceiling), so "finish one job, claim the next" in one transaction needs
 *	  no spare slot.  Both leases hold a counted slot until the transaction
 *	  ends: every live or releasing lease owns exactly one, which also pins
 *	  its tenant entry.
 *	- A lease whose acquiring transaction rolls back while another one
 *	  releases it (its role may) is doomed, not dropped: the releasing
 *	  transaction may have taken over its slot, so the lease keeps it until
 *	  that transaction ends, and then goes whether it commits or not.
 *	- A prepared transaction (PREPARE TRANSACTION) parks what its end must
 *	  do in shared memory (core/prepared.c): COMMIT PREPARED frees the leases
 *	  it released, ROLLBACK PREPARED frees the ones it took and makes the
 *	  ones it released live again, in whichever backend runs them.
 *
 * Backend-local records of what this transaction did to leases drive the
 * commit and abort work; the shared lease table is the truth.
 *
 * A lease belongs to the role that took it (GetUserId() at the acquire, or
 * at the fs_claim() that took it).  fs_release_slot() and fs_renew_slot()
 * refuse, with an error, a caller that is not that role, has not its
 * privileges, is no member of fairshare_admin and no superuser: lease ids
 * are easy to guess.  The check reads the catalogs, so it never runs under
 * a lease lock: the common case (the owner itself) is decided under the
 * lock, any other is checked after dropping it, and the operation is then
 * tried again (a lease's owner only ever changes from none to the renewer,
 * see FsLease.owner).  Internal releases (fs_claim() returning unused
 * leases, the running-table triggers) are not checked: whoever writes the
 * running table ends the run, whichever role claimed it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "core/cluster.h"
#include "core/decisions.h"
#include "core/prepared.h"
#include "gate/gate.h"
#include "slots/leases_int.h"

PG_FUNCTION_INFO_V1(fs_acquire_slot);
PG_FUNCTION_INFO_V1(fs_release_slot);
PG_FUNCTION_INFO_V1(fs_renew_slot);
PG_FUNCTION_INFO_V1(fs_release_slot_at);
PG_FUNCTION_INFO_V1(fs_renew_slot_at);

/*
 * A lease's length as microseconds: positive, and at most FS_MAX_LEASE_USECS
 * (months count as 30 days, as in interval arithmetic).  `what` names the
 * argument in the errors.
 */
int64
fs_lease_usecs(const Interval *interval, const char *what)
{
	float8		usecs;

	/* In float8: exact enough for the range we accept, and cannot overflow. */
	usecs = (float8) interval->time +
		((float8) interval->month * DAYS_PER_MONTH + interval->day) * USECS_PER_DAY;
	if (usecs <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a positive interval, got %s", what,
						DatumGetCString(DirectFunctionCall1(interval_out,
															IntervalPGetDatum(interval)))),
				 errhint("Pass an interval such as '5 minutes'.")));
	if (usecs > (float8) FS_MAX_LEASE_USECS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be at most 366 days, got %s", what,
						DatumGetCString(DirectFunctionCall1(interval_out,
															IntervalPGetDatum(interval)))),
				 errhint("Renew a lease with fs_renew_slot() while the work runs instead of taking a long one.")));
	return (int64) usecs;
}

/* A lease's length argument as microseconds: not NULL, and fs_lease_usecs()'s checks. */
int64
fs_lease_interval_arg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what),
				 errhint("Pass an interval such as '5 minutes', or leave the argument out for the default.")));
	return fs_lease_usecs(PG_GETARG_INTERVAL_P(argno), what);
}

/* ----------------------------------------------------------------
 * What this transaction did to leases (backend-local)
 * ----------------------------------------------------------------
 */
typedef enum FsLocalKind
{
	FS_LOCAL_DEAD = 0,			/* settled; skipped */
	FS_LOCAL_ACQUIRED,			/* acquired in this transaction */
	FS_LOCAL_RELEASING			/* released in this transaction, at commit */
} FsLocalKind;

typedef struct FsLocalLease
{
	int64		lease_id;
	FsTenant   *tenant;			/* pinned by the lease while it exists */
	uint32		generation;		/* the tenant's, when the record was made */
	SubTransactionId subid;
	uint8		kind;			/* FsLocalKind */
	bool		handed_over;	/* RELEASING: a later acquire took its slot */
	int			took_over;		/* ACQUIRED: 1 + index of the RELEASING
								 * record whose slot it took, or 0 */
} FsLocalLease;

static FsLocalLease *local_leases = NULL;
static int	local_count = 0;
static int	local_capacity = 0;
static int	local_pending_slots = 0;	/* RELEASING records not handed over */

/*
 * Make sure one more record fits, before shared state changes: pushing the
 * record afterwards must not fail (an error then would leave a counted slot
 * that this transaction's abort does not know to return).
 */
static void
fs_local_reserve(void)
{
	if (local_count == local_capacity)
	{
		int			newcap = local_capacity == 0 ? 16 : local_capacity * 2;

		FS_FAULT_POINT("slot_record");
		if (local_leases == NULL)
			local_leases = MemoryContextAlloc(TopMemoryContext,
											  newcap * sizeof(FsLocalLease));
		else
			local_leases = repalloc(local_leases, newcap * sizeof(FsLocalLease));
		local_capacity = newcap;
	}
}

/* Add a record; fs_local_reserve() has made room for it. */
static void
fs_local_push(int64 lease_id, FsTenant *tenant, uint32 generation, FsLocalKind kind,
			  int took_over)
{
	FsLocalLease *rec;

	Assert(local_count < local_capacity);
	rec = &local_leases[local_count++];
	rec->lease_id = lease_id;
	rec->tenant = tenant;
	rec->generation = generation;
	rec->subid = GetCurrentSubTransactionId();
	rec->kind = kind;
	rec->handed_over = false;
	rec->took_over = took_over;
}

/* Drop settled records from the end (the common acquire-then-release case). */
static void
fs_local_trim(void)
{
	while (local_count > 0 && local_leases[local_count - 1].kind == FS_LOCAL_DEAD)
		local_count--;
}

/* This transaction's latest record of `lease_id` of `kind`, or -1. */
static int
fs_local_find(int64 lease_id, FsLocalKind kind)
{
	int			i;

	for (i = local_count - 1; i >= 0; i--)
		if (local_leases[i].lease_id == lease_id && local_leases[i].kind == kind)
			return i;
	return -1;
}

/*
 * A RELEASING record of this tenant whose slot is still free to take.  The
 * generation tells the tenant from a later one that reuses its entry (the
 * released lease may have gone, with its pin, in another transaction).
 */
static int
fs_local_find_pending(FsTenant *tenant, uint32 generation)
{
	int			i;

	if (local_pending_slots == 0)
		return -1;
	for (i = local_count - 1; i >= 0; i--)
		if (local_leases[i].kind == FS_LOCAL_RELEASING &&
			!local_leases[i].handed_over &&
			local_leases[i].tenant == tenant &&
			local_leases[i].generation == generation)
			return i;
	return -1;
}

/* ----------------------------------------------------------------
 * Acquire, release, renew
 * ----------------------------------------------------------------
 */

/* What a slot decision found under the tenant's entry lock. */
typedef enum FsSlotOutcome
{
	FS_SLOT_NO_ENTRY,			/* no state for the tenant: fail open */
	FS_SLOT_GRANTED,			/* a slot counted: the lease is to be made */
	FS_SLOT_DENIED,
	FS_SLOT_SWEEP_FIRST			/* at the ceiling, but a lease of it may have
								 * expired: sweep and decide again */
} FsSlotOutcome;

/*
 * Decide for `tenant` of `queue` under its entry's lock, and count a slot
 * if granted (taking over the slot of a lease this transaction releases:
 * `pending`).  Fills the decision's figures; *entry_out and *generation
 * say which entry holds the slot.
 */
static inline FsSlotOutcome
fs_slot_decide(FsQueue *queue, const char *tenant, TimestampTz now, TimestampTz expires_at,
			   bool swept, FsSlotDecision *decision, FsDecision *d, FsReason *deny_reason,
			   FsTenant **entry_out, uint32 *generation, int *pending)
{
	FsTenantRef ref;
	FsTenant   *entry;
	FsGateCapacity cap;
	FsSlotOutcome outcome;
	int32		ceiling;

	fs_gate_capacity(queue, now, &cap);
	entry = fs_tenant_open(queue, tenant, FS_OPEN_CREATE, &ref);
	if (entry == NULL)
		return FS_SLOT_NO_ENTRY;

	ceiling = fs_gate_ceiling(&cap, &ref.limits, deny_reason);
	/* Set when the entry was made, under its partition lock, which we hold. */
	*generation = entry->generation;
	*pending = fs_local_find_pending(entry, *generation);

	fs_tenant_lock(entry);
	fs_tenant_touch(entry, now);
	if (*pending >= 0 || entry->slots_in_use < ceiling)
	{
		outcome = FS_SLOT_GRANTED;
		fs_tenant_slot_take(entry, expires_at);
		fs_tenant_count_decision(entry, FS_REASON_GRANTED);
	}
	else if (entry->earliest_expiry <= now && !swept)
		outcome = FS_SLOT_SWEEP_FIRST;
	else
	{
		outcome = FS_SLOT_DENIED;
		fs_tenant_count_decision(entry, *deny_reason);
	}
	/* A tenant without a slot limit can start any number: unlimited (-1). */
	d->runs_possible = ceiling == FS_NO_SLOT_LIMIT ? -1 :
		Max(ceiling - entry->slots_in_use + (outcome == FS_SLOT_GRANTED ? 1 : 0), 0);
	decision->slots_in_use = entry->slots_in_use;
	fs_tenant_unlock(entry);
	fs_tenant_close(&ref);

	decision->ceiling = ceiling;
	*entry_out = entry;
	return outcome;
}

/*
 * Decide whether `tenant` of `queue` may take a slot, and take it.  On a
 * grant, decision->lease_id is the new lease; on a denial it is 0 and
 * decision->reason says why.  When state cannot be kept (a table is full)
 * the slot is granted anyway with reason fail_open and an untracked lease id.
 *
 * Every live or releasing lease owns one counted slot, which also pins its
 * tenant entry.  Taking over the slot of a lease this transaction is
 * releasing only skips the ceiling check: the tenant counts both until the
 * transaction ends, as both leases exist until then.
 */
void
fs_slot_acquire(FsQueue *queue, const char *tenant, int64 lease_usecs,
				TimestampTz now, FsSlotDecision *decision)
{
	FsTenant   *entry = NULL;
	FsDecision	d;
	TimestampTz expires_at = now + lease_usecs;
	FsSlotOutcome outcome;
	FsReason	deny_reason = FS_REASON_GRANTED;
	int64		lease_id = 0;
	uint32		generation = 0;
	int			pending = -1;
	bool		count_ok;

	decision->lease_id = 0;
	decision->slots_in_use = 0;
	decision->ceiling = 0;
	fs_decision_init(&d, FS_DECISION_SLOT, tenant, now);
	d.requested = 1;

	/* Nothing may fail once a slot is counted: make room for the record now. */
	fs_local_reserve();

	if (queue == NULL)
		goto fail_open;
	d.queue_id = queue->queue_id;

	outcome = fs_slot_decide(queue, tenant, now, expires_at, false, decision, &d, &deny_reason,
							 &entry, &generation, &pending);
	if (outcome == FS_SLOT_SWEEP_FIRST)
	{
		/*
		 * One of its leases may have expired: free expired leases (a bounded
		 * number: not a sweep of the table) and look again.
		 */
		(void) fs_lease_sweep(now, FS_SWEEP_INLINE_MAX);
		outcome = fs_slot_decide(queue, tenant, now, expires_at, true, decision, &d,
								 &deny_reason, &entry, &generation, &pending);
	}
	if (outcome == FS_SLOT_NO_ENTRY)
		goto fail_open;
	if (outcome == FS_SLOT_DENIED)
	{
		decision->reason = deny_reason;
		d.reason = deny_reason;
		fs_decision_log(&d);
		return;
	}
	pg_atomic_fetch_add_u32(&queue->slots_in_use, 1);

	/* The slot is ours and pins the entry.  Record the lease. */
	if (fs_lease_insert(entry, generation, now, expires_at, &lease_id) == NULL)
	{
		/* No room to track it: give the slot back and fail open. */
		fs_tenant_lock(entry);
		/* fs_reset() may have zeroed the count since. */
		fs_tenant_uncount_decision(entry, FS_REASON_GRANTED);
		fs_tenant_unlock(entry);
		count_ok = fs_lease_pin_release(entry, generation, false, false);
		fs_lease_count_was_wrong(!count_ok, false);
		FS_COUNT_GLOBAL(lease_table_full);
		goto fail_open;			/* under the untracked id drawn */
	}

	fs_local_push(lease_id, entry, generation, FS_LOCAL_ACQUIRED, pending >= 0 ? pending + 1 : 0);
	if (pending >= 0)
	{
		local_leases[pending].handed_over = true;
		local_pending_slots--;
	}
	decision->lease_id = lease_id;
	decision->reason = FS_REASON_GRANTED;
	d.reason = FS_REASON_GRANTED;
	d.granted = 1;
	fs_decision_log(&d);
	return;

fail_open:
	/* Granted without state, under an id that names no lease. */
	if (lease_id == 0)
		lease_id = (int64) pg_atomic_fetch_add_u64(&fs_shared->next_lease_id, 1);
	decision->lease_id = lease_id;
	decision->reason = FS_REASON_FAIL_OPEN;
	fs_decision_fail_open(&d, queue, 1);
}

/*
 * What a lease operation that checks its caller found.
 */
typedef enum FsLeaseOpResult
{
	FS_LEASE_OP_FALSE = 0,		/* unknown, expired or being released */
	FS_LEASE_OP_TRUE,			/* done */
	FS_LEASE_OP_CHECK_OWNER		/* another role's: check the caller, retry */
} FsLeaseOpResult;

/*
 * Under the lease's lock: may the caller act on `lease` without a catalog
 * check?  Yes when nobody checks (internal callers: check == false), when
 * the lease has no owner, when the caller is its owner, or when the caller
 * was already found allowed for this owner (`allowed`).  Otherwise *owner
 * gets the owner, for fs_lease_check_caller() once the lock is released.
 */
static inline bool
fs_lease_caller_ok(const FsLease *lease, bool check, Oid allowed, Oid *owner)
{
	if (!check || !OidIsValid(lease->owner) || lease->owner == GetUserId() ||
		lease->owner == allowed)
		return true;
	*owner = lease->owner;
	return false;
}

/*
 * May the current user release or renew a lease of `owner`?  Its owner, a
 * role with the owner's privileges (so also a superuser), or a member of
 * fairshare_admin may; anyone else gets an error.  Reads the catalogs:
 * never call it under a lease lock.
 */
static void
fs_lease_check_caller(int64 lease_id, Oid owner, const char *action)
{
	Oid			user = GetUserId();
	Oid			admin;
	char	   *owner_name;

	if (has_privs_of_role(user, owner))
		return;
	admin = get_role_oid(FS_ADMIN_ROLE, true);
	if (OidIsValid(admin) && is_member_of_role(user, admin))
		return;

	owner_name = GetUserNameFromId(owner, true);
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to %s lease " INT64_FORMAT, action, lease_id),
			 owner_name != NULL ?
			 errdetail("The lease was taken by role \"%s\".", owner_name) :
			 errdetail("The lease was taken by a role that no longer exists."),
			 errhint("%s a lease as the role that took it, or as a member of fairshare_admin.",
					 strcmp(action, "renew") == 0 ? "Renew" : "Release")));
}

/*
 * Find a lease to release or renew, and take its partition lock EXCLUSIVE.
 * Returns FS_LEASE_OP_TRUE with the lock held and the lease in *lease; or,
 * with the lock released, FS_LEASE_OP_FALSE (unknown, being released, or
 * expired, or with `need_tenant` its tenant's entry gone: then it is freed
 * here) or FS_LEASE_OP_CHECK_OWNER (see fs_lease_caller_ok()).
 */
static FsLeaseOpResult
fs_lease_open(int64 lease_id, uint32 hashvalue, LWLock *lock, TimestampTz now,
			  bool check, Oid allowed, Oid *owner, bool need_tenant, FsLease **lease)
{
	LWLockAcquire(lock, LW_EXCLUSIVE);
	*lease = hash_search_with_hash_value(fs_lease_hash, &lease_id, hashvalue,
										 HASH_FIND, NULL);
	if (*lease == NULL || (*lease)->state == FS_LEASE_RELEASING)
	{
		LWLockRelease(lock);
		return FS_LEASE_OP_FALSE;
	}
	if (!fs_lease_caller_ok(*lease, check, allowed, owner))
	{
		LWLockRelease(lock);
		return FS_LEASE_OP_CHECK_OWNER;
	}
	if ((*lease)->expires_at <= now || (need_tenant && !fs_lease_tenant_ok(*lease)))
	{
		/* Expired, or its tenant's entry is gone: so is the lease. */
		fs_lease_expire_locked(*lease, hashvalue, lock, false);
		return FS_LEASE_OP_FALSE;
	}
	return FS_LEASE_OP_TRUE;
}

/*
 * Release a lease: see fs_slot_release().  With `check`, a lease of another
 * role than the caller (and than `allowed`) is left alone and
 * FS_LEASE_OP_CHECK_OWNER returned with its owner in *owner.
 */
static FsLeaseOpResult
fs_slot_release_as(int64 lease_id, TimestampTz now, int64 *held_usecs,
				   bool check, Oid allowed, Oid *owner)
{
	uint32		hashvalue = get_hash_value(fs_lease_hash, &lease_id);
	LWLock	   *lock = fs_lease_lock(hashvalue);
	FsLease    *lease;
	FsTenant   *tenant;
	uint32		generation;
	int			acquired;
	bool		count_ok;
	FsLeaseOpResult found;

	*held_usecs = 0;
	fs_local_reserve();
	found = fs_lease_open(lease_id, hashvalue, lock, now, check, allowed, owner, false, &lease);
	if (found != FS_LEASE_OP_TRUE)
		return found;

	tenant = lease->tenant;
	generation = lease->tenant_generation;
	*held_usecs = now - lease->acquired_at;

	if (lease->state == FS_LEASE_ORPHAN)
	{
		/* Its holder finished after a crash: forget it. */
		fs_lease_remove(lease, hashvalue);
		LWLockRelease(lock);
		count_ok = fs_lease_pin_release(tenant, generation, true, false);
		fs_lease_count_was_wrong(!count_ok, false);
		return FS_LEASE_OP_TRUE;
	}

	acquired = fs_local_find(lease_id, FS_LOCAL_ACQUIRED);
	if (acquired >= 0 && local_leases[acquired].subid == GetCurrentSubTransactionId())
	{
		/* Acquired in this very (sub)transaction: free it now. */
		int			took_over = local_leases[acquired].took_over;

		fs_lease_remove(lease, hashvalue);
		LWLockRelease(lock);
		local_leases[acquired].kind = FS_LOCAL_DEAD;
		if (took_over > 0)
		{
			/* The release it took over may be taken over again. */
			local_leases[took_over - 1].handed_over = false;
			local_pending_slots++;
		}
		count_ok = fs_lease_pin_release(tenant, generation, false, false);
		fs_local_trim();
		fs_lease_count_was_wrong(!count_ok, false);
		return FS_LEASE_OP_TRUE;
	}

	/* Released at commit; until then no sweep may expire it. */
	fs_lease_set_state(lease, hashvalue, FS_LEASE_RELEASING);
	LWLockRelease(lock);
	fs_local_push(lease_id, tenant, generation, FS_LOCAL_RELEASING, 0);
	local_pending_slots++;
	return FS_LEASE_OP_TRUE;
}

/*
 * Release a lease, whoever owns it (fairshare's own callers: fs_claim() and
 * the running-table triggers).  True if it was live (or an orphan from
 * before a crash) and is now released (at once, or at commit: see the file
 * header); false if it is unknown, expired, or already released.
 */
bool
fs_slot_release(int64 lease_id, TimestampTz now, int64 *held_usecs)
{
	Oid			owner;

	return fs_slot_release_as(lease_id, now, held_usecs, false, InvalidOid, &owner) ==
		FS_LEASE_OP_TRUE;
}

/*
 * Extend a live lease to now + lease_usecs.  An orphan from before a crash is
 * counted again (re-registered); a lease without an owner becomes the
 * caller's.  False if the lease is unknown, expired, or being released.  A
 * lease of another role than the caller (and than `allowed`) is left alone
 * and FS_LEASE_OP_CHECK_OWNER returned with its owner in *owner.
 */
static FsLeaseOpResult
fs_slot_renew_as(int64 lease_id, int64 lease_usecs, TimestampTz now, Oid allowed, Oid *owner)
{
	uint32		hashvalue = get_hash_value(fs_lease_hash, &lease_id);
	LWLock	   *lock = fs_lease_lock(hashvalue);
	FsLease    *lease;
	FsTenant   *tenant;
	TimestampTz expires_at = now + lease_usecs;
	bool		count_ok = true;
	FsLeaseOpResult found;

	found = fs_lease_open(lease_id, hashvalue, lock, now, true, allowed, owner, true, &lease);
	if (found != FS_LEASE_OP_TRUE)
		return found;

	tenant = lease->tenant;
	fs_lease_extend(lease, hashvalue, expires_at, GetUserId());
	if (lease->state == FS_LEASE_ORPHAN)
	{
		fs_lease_set_state(lease, hashvalue, FS_LEASE_LIVE);
		fs_tenant_lock(tenant);
		count_ok = fs_tenant_orphan_adopt(tenant, expires_at);
		fs_tenant_unlock(tenant);
		pg_atomic_fetch_add_u32(&fs_queue_of(tenant)->slots_in_use, 1);
		LWLockRelease(lock);
		FS_COUNT_GLOBAL(leases_reregistered);
		fs_lease_count_was_wrong(!count_ok, false);
		return FS_LEASE_OP_TRUE;
	}
	fs_lease_note_expiry(tenant, expires_at);
	LWLockRelease(lock);
	return FS_LEASE_OP_TRUE;
}

/* ----------------------------------------------------------------
 * Transaction ends
 * ----------------------------------------------------------------
 */

/* Remove a lease under its lock, held on entry and released here, and free its slot. */
static void
fs_lease_drop_locked(FsLease *lease, uint32 hashvalue, LWLock *lock)
{
	FsTenant   *tenant = lease->tenant;
	uint32		generation = lease->tenant_generation;
	bool		count_ok;

	fs_lease_remove(lease, hashvalue);
	LWLockRelease(lock);
	count_ok = fs_lease_pin_release(tenant, generation, false, false);
	fs_lease_count_was_wrong(!count_ok, true);
}

/*
 * Make a lease a transaction was releasing live again: this backend's
 * (holder_pid MyProcPid), or a prepared one's (0: whichever backend
 * released it; nobody else can while it is RELEASING).  A doomed lease is
 * dropped instead: the transaction that took it rolled back.
 */
static void
fs_lease_unrelease(int64 lease_id, int32 holder_pid)
{
	uint32		hashvalue = get_hash_value(fs_lease_hash, &lease_id);
	LWLock	   *lock = fs_lease_lock(hashvalue);
	FsLease    *lease;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	lease = hash_search_with_hash_value(fs_lease_hash, &lease_id, hashvalue,
										HASH_FIND, NULL);
	if (lease != NULL && lease->state == FS_LEASE_RELEASING &&
		(holder_pid == 0 || lease->holder_pid == holder_pid))
	{
		if (lease->doomed)
		{
			fs_lease_drop_locked(lease, hashvalue, lock);
			return;
		}
		fs_lease_set_state(lease, hashvalue, FS_LEASE_LIVE);
		if (fs_lease_tenant_ok(lease))
			fs_lease_note_expiry(lease->tenant, lease->expires_at);
		else
		{
			/* Its tenant's entry is gone, and so is its slot. */
			fs_lease_expire_locked(lease, hashvalue, lock, true);
			return;
		}
	}
	LWLockRelease(lock);
}

/*
 * Remove a lease a transaction released (at its commit), or one it
 * acquired (at its rollback), and free its slot.  A lease acquired by a
 * transaction that rolls back may meanwhile be RELEASING in another one
 * (its role released it there): that release is left to end it
 * (fs_lease_doom()), since the releasing transaction may count on its slot.
 */
static void
fs_lease_drop(int64 lease_id, bool acquired)
{
	uint32		hashvalue = get_hash_value(fs_lease_hash, &lease_id);
	LWLock	   *lock = fs_lease_lock(hashvalue);
	FsLease    *lease;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	lease = hash_search_with_hash_value(fs_lease_hash, &lease_id, hashvalue,
										HASH_FIND, NULL);
	if (lease == NULL || lease->state == FS_LEASE_ORPHAN)
	{
		/* Already expired and swept: nothing left to give back. */
		LWLockRelease(lock);
		return;
	}
	if (acquired && lease->state == FS_LEASE_RELEASING && lease->holder_pid != MyProcPid)
	{
		fs_lease_doom(lease, hashvalue);
		LWLockRelease(lock);
		return;
	}
	fs_lease_drop_locked(lease, hashvalue, lock);
}

/*
 * Settle the records of the whole transaction (subid == InvalidSubTransactionId)
 * or of one aborted subtransaction.
 */
static void
fs_local_settle(bool commit, SubTransactionId subid)
{
	int			i;
	bool		all = subid == InvalidSubTransactionId;

	if (commit)
	{
		for (i = 0; i < local_count; i++)
			if (local_leases[i].kind == FS_LOCAL_RELEASING)
				fs_lease_drop(local_leases[i].lease_id, false);
		return;
	}

	/* Abort: first make releases live again, then drop what was acquired. */
	for (i = 0; i < local_count; i++)
	{
		FsLocalLease *rec = &local_leases[i];

		if (rec->kind == FS_LOCAL_RELEASING && (all || rec->subid == subid))
		{
			fs_lease_unrelease(rec->lease_id, MyProcPid);
			if (!rec->handed_over)
				local_pending_slots--;
			rec->kind = FS_LOCAL_DEAD;
		}
	}
	for (i = 0; i < local_count; i++)
	{
		FsLocalLease *rec = &local_leases[i];

		if (rec->kind == FS_LOCAL_ACQUIRED && (all || rec->subid == subid))
		{
			fs_lease_drop(rec->lease_id, true);
			if (rec->took_over > 0)
			{
				FsLocalLease *from = &local_leases[rec->took_over - 1];

				/* The release it took from lives on in an outer level. */
				if (from->kind == FS_LOCAL_RELEASING && from->handed_over)
				{
					from->handed_over = false;
					local_pending_slots++;
				}
			}
			rec->kind = FS_LOCAL_DEAD;
		}
	}
}

/*
 * The transaction is over: forget this backend's record of the leases it
 * took and released (giving back the memory of an unusually large one).
 */
static void
fs_local_reset(void)
{
	local_count = 0;
	local_pending_slots = 0;
	/* Give back memory after an unusually busy transaction. */
	if (local_capacity > 1024)
	{
		pfree(local_leases);
		local_leases = NULL;
		local_capacity = 0;
	}
}

/*
 * PREPARE TRANSACTION: park what the prepared transaction's end must do
 * with the leases it took and released (core/prepared.c), and forget them
 * here.  COMMIT PREPARED frees the leases it released; ROLLBACK PREPARED
 * (or a PREPARE that fails after this) frees the ones it took and makes the
 * ones it released live again, as fs_local_settle() does for a transaction
 * of this backend.  Until then the leases it took hold their slots, and the
 * ones it released stay RELEASING: counted, and not to be released or
 * renewed by anyone else.  The records are complete here: subtransactions
 * are over, each handed to its parent or settled.
 */
static void
fs_local_park(void)
{
	FsParkedEffect effects[FS_PREPARED_PARKED_PER_XACT + 1];
	int			n = 0;
	int			i;

	for (i = 0; i < local_count; i++)
	{
		FsLocalLease *rec = &local_leases[i];

		if (rec->kind == FS_LOCAL_DEAD)
			continue;
		if (n == FS_PREPARED_PARKED_PER_XACT + 1)
			break;				/* more than may be parked: fs_prepared_park() says so */
		memset(&effects[n], 0, sizeof(FsParkedEffect));
		effects[n].kind = rec->kind == FS_LOCAL_ACQUIRED ?
			FS_PARKED_LEASE_TAKEN : FS_PARKED_LEASE_RELEASED;
		effects[n].object_id = rec->lease_id;
		n++;
	}
	/* An error here leaves the records to this transaction's abort. */
	fs_prepared_park(effects, n);
	fs_local_reset();
}

/* ROLLBACK PREPARED: free a lease the prepared transaction took. */
static void
fs_parked_taken_undo(const FsParkedEffect *effect)
{
	fs_lease_drop(effect->object_id, true);
}

/* COMMIT PREPARED: free a lease the prepared transaction released. */
static void
fs_parked_released_finish(const FsParkedEffect *effect)
{
	fs_lease_drop(effect->object_id, false);
}

/* ROLLBACK PREPARED: a lease the prepared transaction released is live again. */
static void
fs_parked_released_undo(const FsParkedEffect *effect)
{
	fs_lease_unrelease(effect->object_id, 0);
}

/*
 * Transaction end: leases released in this transaction are freed at commit
 * and made live again at abort; leases it acquired are freed at abort; a
 * prepared transaction parks both for its COMMIT or ROLLBACK PREPARED.
 */
static void
fs_slots_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	if (local_count == 0)
		return;

	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			fs_local_trim();
			if (local_count > 0)
				fs_local_park();
			break;
		case XACT_EVENT_COMMIT:
			fs_local_settle(true, InvalidSubTransactionId);
			fs_local_reset();
			break;
		case XACT_EVENT_ABORT:
			fs_local_settle(false, InvalidSubTransactionId);
			fs_local_reset();
			break;
		default:
			break;
	}
}

/*
 * Subtransaction end: a commit hands its leases to the parent; an abort
 * frees the leases it acquired and makes the ones it released live again.
 */
static void
fs_slots_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						  SubTransactionId parentSubid, void *arg pg_attribute_unused())
{
	int			i;

	if (local_count == 0)
		return;

	switch (event)
	{
		case SUBXACT_EVENT_COMMIT_SUB:
			for (i = 0; i < local_count; i++)
				if (local_leases[i].subid == mySubid)
					local_leases[i].subid = parentSubid;
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			fs_local_settle(false, mySubid);
			fs_local_trim();
			break;
		default:
			break;
	}
}

/* Register the transaction callbacks that settle this transaction's leases. */
void
fs_slots_init(void)
{
	RegisterXactCallback(fs_slots_xact_callback, NULL);
	fs_prepared_on_settle(FS_PARKED_LEASE_TAKEN, NULL, fs_parked_taken_undo);
	fs_prepared_on_settle(FS_PARKED_LEASE_RELEASED, fs_parked_released_finish,
						  fs_parked_released_undo);
	RegisterSubXactCallback(fs_slots_subxact_callback, NULL);
}

/*
 * The lease id argument at `arg` of a release or renew, as this node's own
 * id.  False when the lease is another node's: with `arg` 0 (the plain
 * function) the call went to that node, and *result is its answer; with
 * `arg` 1 (the _at function Citus delegated here) that is an error.
 */
static bool
fs_lease_arg_here(FunctionCallInfo fcinfo, int arg, const char *function, int64 lease_usecs,
				  int64 *local_id, Datum *result)
{
	int64		lease_id = PG_GETARG_INT64(arg);
	bool		answer;
	bool		isnull = false;

	if (lease_id <= 0)
	{
		*result = BoolGetDatum(false);	/* no lease has such an id */
		return false;
	}
	if (fs_lease_id_in(lease_id, local_id))
		return true;
	if (arg > 0)
		fs_cluster_check_lease_here(function, lease_id);	/* does not return */
	if (!fs_cluster_forward_lease(fcinfo, function, lease_id, lease_usecs, &answer, &isnull))
		answer = false;			/* unknown here, and no cluster to ask */
	fcinfo->isnull = isnull;
	*result = BoolGetDatum(answer);
	return false;
}

/* fs_release_slot() and fs_release_slot_at(): the lease id at `arg`. */
static Datum
fs_release_slot_common(FunctionCallInfo fcinfo, int arg)
{
	int64		lease_id;
	int64		held_usecs;
	Datum		forwarded;

	FsLeaseOpResult result;
	Oid			allowed = InvalidOid;
	Oid			owner = InvalidOid;
	TimestampTz now;

	fs_check_primary("release a fairshare lease");
	if (PG_ARGISNULL(arg))
		PG_RETURN_NULL();
	if (!fs_lease_arg_here(fcinfo, arg, "fs_release_slot", -1, &lease_id, &forwarded))
		return forwarded;
	now = fs_now();

	/*
	 * Another role's lease: check the caller with no lock held (an error
	 * leaves the lease as it was), then try again.  An owner never changes
	 * once set, so a second round finds the one just allowed.
	 */
	while ((result = fs_slot_release_as(lease_id, now, &held_usecs, true, allowed, &owner)) ==
		   FS_LEASE_OP_CHECK_OWNER)
	{
		fs_lease_check_caller(lease_id, owner, "release");
		allowed = owner;
	}
	PG_RETURN_BOOL(result == FS_LEASE_OP_TRUE);
}

/* fs_renew_slot() and fs_renew_slot_at(): the lease id at `arg`, its length after it. */
static Datum
fs_renew_slot_common(FunctionCallInfo fcinfo, int arg)
{
	int64		lease_id;
	int64		lease_usecs;
	Datum		forwarded;

	FsLeaseOpResult result;
	Oid			allowed = InvalidOid;
	Oid			owner = InvalidOid;
	TimestampTz now;

	fs_check_primary("renew a fairshare lease");
	lease_usecs = fs_lease_interval_arg(fcinfo, arg + 1, "lease");
	if (PG_ARGISNULL(arg))
		PG_RETURN_NULL();
	if (!fs_lease_arg_here(fcinfo, arg, "fs_renew_slot", lease_usecs, &lease_id, &forwarded))
		return forwarded;
	now = fs_now();

	/* As in fs_release_slot(). */
	while ((result = fs_slot_renew_as(lease_id, lease_usecs, now, allowed, &owner)) ==
		   FS_LEASE_OP_CHECK_OWNER)
	{
		fs_lease_check_caller(lease_id, owner, "renew");
		allowed = owner;
	}
	PG_RETURN_BOOL(result == FS_LEASE_OP_TRUE);
}

/* ----------------------------------------------------------------
 * SQL functions
 * ----------------------------------------------------------------
 */

/* fs_acquire_slot(tenant text, queue text, lease interval) RETURNS bigint */
Datum
fs_acquire_slot(PG_FUNCTION_ARGS)
{
	Datum		relayed;
	char		tenant[FS_NAME_BUFLEN];
	char		queue_name[FS_NAME_BUFLEN];
	int64		lease_usecs;
	FsSlotDecision decision;
	FsQueue    *queue;

	fs_check_primary("acquire a fairshare slot");
	fs_name_arg(fcinfo, 0, "tenant", tenant);
	fs_name_arg(fcinfo, 1, "queue", queue_name);
	lease_usecs = fs_lease_interval_arg(fcinfo, 2, "lease");
	if (fs_cluster_tenant_relayed(fcinfo, "fs_acquire_slot", tenant, &relayed))
		return relayed;

	queue = fs_queue_lookup(queue_name, true);
	fs_slot_acquire(queue, tenant, lease_usecs, fs_now(), &decision);
	FS_DEBUG_CHECK_TENANT(queue, tenant);
	if (decision.lease_id == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT64(fs_lease_id_out(decision.lease_id));
}

/*
 * fs_release_slot(lease_id bigint) RETURNS boolean
 *
 * For the role that took the lease (or one allowed to act for it: see
 * fs_lease_check_caller()); false for an unknown lease, whoever asks.  A
 * NULL lease id (a denied fs_acquire_slot()) gives NULL, as a strict
 * function would: fs_release_slot(fs_acquire_slot(...)) never fails.  On a
 * cluster, another node's lease is released by that node.
 */
Datum
fs_release_slot(PG_FUNCTION_ARGS)
{
	return fs_release_slot_common(fcinfo, 0);
}

/*
 * fs_release_slot_at(node_anchor text, lease_id bigint) RETURNS boolean:
 * fs_release_slot() on the node that holds node_anchor's shard, where
 * Citus delegates it; the lease must be that node's.
 */
Datum
fs_release_slot_at(PG_FUNCTION_ARGS)
{
	return fs_release_slot_common(fcinfo, 1);
}

/*
 * fs_renew_slot(lease_id bigint, lease interval) RETURNS boolean
 *
 * Who may: as fs_release_slot().  A NULL lease id gives NULL; a NULL lease
 * interval is an error (there is no lease length to renew to).  On a
 * cluster, another node's lease is renewed by that node.
 */
Datum
fs_renew_slot(PG_FUNCTION_ARGS)
{
	return fs_renew_slot_common(fcinfo, 0);
}

/* fs_renew_slot_at(node_anchor text, lease_id bigint, lease interval): as fs_release_slot_at(). */
Datum
fs_renew_slot_at(PG_FUNCTION_ARGS)
{
	return fs_renew_slot_common(fcinfo, 1);
}

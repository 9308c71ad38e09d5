/*-------------------------------------------------------------------------
 *
 * leases_int.h
 *	  The shared lease table, for the files of the slots layer: its
 *	  partitions, its changes (the one place where a lease changes), what a
 *	  lease holds in its tenant, and the sweep of expired leases
 *	  (leases.c).  Other layers use slots.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_LEASES_INT_H
#define FAIRSHARE_LEASES_INT_H

#include "core/tenant.h"
#include "slots/slots.h"

extern HTAB *fs_lease_hash;
extern LWLockPadded *fs_lease_locks;

/* The lock of the lease partition of `hashvalue`. */
static inline LWLock *
fs_lease_lock(uint32 hashvalue)
{
	return &fs_lease_locks[hashvalue % FS_LEASE_PARTITIONS].lock;
}

/*
 * Is the entry a lease points to still the tenant that took it?  Always,
 * unless a count that pinned it was dropped twice and the entry was evicted
 * and reused: then the lease's slot no longer exists.  Under the lease's lock.
 */
static inline bool
fs_lease_tenant_ok(const FsLease *lease)
{
	return lease->tenant->generation == lease->tenant_generation;
}

/*
 * Expired leases a decision frees inline (a denied acquire, a full lease
 * table), at most: the background sweeper frees the rest.
 */
#define FS_SWEEP_INLINE_MAX	4096

/* Note in a lease's tenant (pinned by it) that the lease expires at `expires_at`. */
static inline void
fs_lease_note_expiry(FsTenant *tenant, TimestampTz expires_at)
{
	fs_tenant_lock(tenant);
	fs_tenant_note_expiry(tenant, expires_at);
	fs_tenant_unlock(tenant);
}

/* leases.c: the lease changes (partition lock held EXCLUSIVE) */
extern void fs_lease_fill(FsLease *lease, uint32 hashvalue, FsTenant *tenant,
						  uint32 generation, FsLeaseState state, Oid owner,
						  int32 holder_pid, TimestampTz acquired_at, TimestampTz expires_at);
extern void fs_lease_set_state(FsLease *lease, uint32 hashvalue, FsLeaseState state);
extern void fs_lease_doom(FsLease *lease, uint32 hashvalue);
extern void fs_lease_extend(FsLease *lease, uint32 hashvalue, TimestampTz expires_at,
							Oid owner);
extern void fs_lease_remove(FsLease *lease, uint32 hashvalue);

/* leases.c: taking, expiring and sweeping leases */
extern FsLease *fs_lease_insert(FsTenant *entry, uint32 generation, TimestampTz now,
								TimestampTz expires_at, int64 *lease_id);
extern void fs_lease_expire_locked(FsLease *lease, uint32 hashvalue, LWLock *lock,
								   bool at_xact_end);
extern int	fs_lease_sweep(TimestampTz now, int max_leases);

/* leases.c: what a lease holds in its tenant */
extern bool fs_lease_pin_release(FsTenant *tenant, uint32 generation, bool orphan,
								 bool expired);
extern void fs_lease_count_was_wrong(bool wrong, bool at_xact_end);

#endif							/* FAIRSHARE_LEASES_INT_H */

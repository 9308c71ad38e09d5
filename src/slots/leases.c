/*-------------------------------------------------------------------------
 *
 * leases.c
 *	  The shared lease table: its partitions and their heaps of leases by
 *	  expiry, the one place where a lease changes, what a lease holds in its
 *	  tenant (a slot, or an orphan's pin), the sweep of expired leases, and
 *	  listing and restoring leases (views, the state file).  slots.c has the
 *	  whole picture of slots and leases.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"

#include "slots/leases_int.h"

HTAB	   *fs_lease_hash = NULL;
LWLockPadded *fs_lease_locks = NULL;
static FsScanTable fs_lease_scan;	/* its partition lists (scanlist.h) */

/*
 * Each lease partition keeps its LIVE and ORPHAN leases in pairing heaps
 * ordered by expiry, under the partition's lock, so that freeing expired
 * leases touches only those.  A pairing heap may have to pair up every
 * lease added since its top last changed, and leases mostly come in order
 * of expiry: FS_LEASE_HEAPS heaps per partition (by the id's hash) keep
 * that one step short under the lock.  earliest_expiry is the earliest of
 * their tops, written under the lock and read without it: a sweep passes
 * over a partition with nothing expired without taking its lock.
 */
#define FS_LEASE_HEAPS		16

typedef struct FsLeasePartition
{
	pg_atomic_uint64 earliest_expiry;	/* a TimestampTz; DT_NOEND: empty */
	/* under the partition's lock: */
	pairingheap_node *roots[FS_LEASE_HEAPS];
	TimestampTz tops[FS_LEASE_HEAPS];	/* each root's expiry, or DT_NOEND */
	int32		wal_count;		/* ids listed for the WAL writer */
	bool		wal_overflow;	/* more changed than the list holds */
} FsLeasePartition;

static FsLeasePartition *fs_lease_parts = NULL;

/*
 * The leases each partition changed since the WAL writer last looked: the
 * ids of leases that became WAL-dirty (negated for a lease no standby has
 * yet, which the writer need not log as removed), and of logged leases
 * removed.  FS_LEASE_PARTITIONS lists of fs_lease_wal_capacity ids, each
 * under its partition's lock; fs_lease_wal_dirty says some list grew.
 */
static int64 *fs_lease_wal_ids = NULL;
static int32 fs_lease_wal_capacity = 0;
static pg_atomic_uint32 *fs_lease_wal_dirty = NULL;

/* Ids listed per partition for the WAL writer: its share of the table, and a margin. */
static int32
fs_lease_wal_list_size(void)
{
	return fs_max_leases / FS_LEASE_PARTITIONS + 64;
}

/* Expired leases taken off a partition under one hold of its lock, at most. */
#define FS_SWEEP_BATCH		128

/* ----------------------------------------------------------------
 * Shared memory
 * ----------------------------------------------------------------
 */

/* Shared memory of the lease table: the table, its partitions' heaps, its lists. */
static Size
fs_slots_shmem_size(void)
{
	Size		size;

	size = add_size(hash_estimate_size(fs_max_leases, sizeof(FsLease)),
					mul_size(FS_LEASE_PARTITIONS, sizeof(FsLeasePartition)));
	size = add_size(size, fs_scan_lists_size(FS_LEASE_PARTITIONS));
	size = add_size(size, MAXALIGN(sizeof(pg_atomic_uint32)));
	return add_size(size, mul_size(mul_size(FS_LEASE_PARTITIONS, fs_lease_wal_list_size()),
								   sizeof(int64)));
}

/* Ask for this layer's shared memory and locks (shmem request hook, module.c). */
void
fs_slots_shmem_request(void)
{
	RequestAddinShmemSpace(fs_slots_shmem_size());
	RequestNamedLWLockTranche("fairshare leases", FS_LEASE_PARTITIONS);
}

/*
 * Create (or attach to) the lease table, its partition lists and each
 * partition's expiry heaps, and name the lease locks. Caller holds
 * AddinShmemInitLock.
 */
void
fs_slots_shmem_init(void)
{
	HASHCTL		info;
	bool		found;
	bool		wal_found;
	int			i;
	int			h;

	fs_lease_locks = GetNamedLWLockTranche("fairshare leases");
	fs_lockstats_name_locks("lease partition", fs_lease_locks, FS_LEASE_PARTITIONS);

	fs_lease_parts = ShmemInitStruct("fairshare lease expiries",
									 mul_size(FS_LEASE_PARTITIONS, sizeof(FsLeasePartition)),
									 &found);
	fs_lease_wal_capacity = fs_lease_wal_list_size();
	fs_lease_wal_dirty = ShmemInitStruct("fairshare lease changes",
										 add_size(MAXALIGN(sizeof(pg_atomic_uint32)),
												  mul_size(mul_size(FS_LEASE_PARTITIONS,
																	fs_lease_wal_capacity),
														   sizeof(int64))),
										 &wal_found);
	fs_lease_wal_ids = (int64 *) ((char *) fs_lease_wal_dirty + MAXALIGN(sizeof(pg_atomic_uint32)));
	if (!wal_found)
		pg_atomic_init_u32(fs_lease_wal_dirty, 0);

	if (!found)
	{
		for (i = 0; i < FS_LEASE_PARTITIONS; i++)
		{
			fs_lease_parts[i].wal_count = 0;
			fs_lease_parts[i].wal_overflow = false;
			pg_atomic_init_u64(&fs_lease_parts[i].earliest_expiry, (uint64) DT_NOEND);
			for (h = 0; h < FS_LEASE_HEAPS; h++)
			{
				fs_lease_parts[i].roots[h] = NULL;
				fs_lease_parts[i].tops[h] = DT_NOEND;
			}
		}
	}

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(int64);
	info.entrysize = sizeof(FsLease);
	info.num_partitions = FS_LEASE_PARTITIONS;
	fs_lease_hash = ShmemInitHash("fairshare leases",
								  fs_max_leases, fs_max_leases,
								  &info,
								  HASH_ELEM | HASH_BLOBS | HASH_PARTITION |
								  HASH_FIXED_SIZE);
	fs_lease_scan.lists = fs_scan_lists_init("fairshare lease lists", FS_LEASE_PARTITIONS);
	fs_lease_scan.locks = fs_lease_locks;
	fs_lease_scan.nparts = FS_LEASE_PARTITIONS;
	fs_lease_scan.link_offset = offsetof(FsLease, scan_link);
}

/* The expiry heaps are min-heaps: the earlier expiry comes first. */
static int
fs_lease_expiry_cmp(const pairingheap_node *a, const pairingheap_node *b,
					void *arg pg_attribute_unused())
{
	TimestampTz ea = pairingheap_const_container(FsLease, expiry_node, a)->expires_at;
	TimestampTz eb = pairingheap_const_container(FsLease, expiry_node, b)->expires_at;

	return (ea < eb) - (ea > eb);
}

/*
 * Store heap `h` of a partition after a change, and publish the partition's
 * earliest expiry.  Shared memory keeps only the roots: the comparator is
 * each backend's own.
 */
static void
fs_lease_heap_store(FsLeasePartition *part, int h, pairingheap_node *root)
{
	TimestampTz old_top = part->tops[h];
	TimestampTz new_top = DT_NOEND;
	TimestampTz earliest = (TimestampTz) pg_atomic_read_u64(&part->earliest_expiry);
	int			i;

	if (root != NULL)
		new_top = pairingheap_container(FsLease, expiry_node, root)->expires_at;
	part->roots[h] = root;
	part->tops[h] = new_top;
	if (new_top < earliest)
		earliest = new_top;
	else if (old_top == earliest && new_top != old_top)
	{
		/* This heap had the earliest top, and it moved on: look at all. */
		earliest = part->tops[0];
		for (i = 1; i < FS_LEASE_HEAPS; i++)
			earliest = Min(earliest, part->tops[i]);
	}
	else
		return;
	pg_atomic_write_u64(&part->earliest_expiry, (uint64) earliest);
}

/* The heap of the lease with this hash: its partition's, and which one. */
static inline FsLeasePartition *
fs_lease_heap_of(uint32 hashvalue, int *h)
{
	*h = (int) ((hashvalue / FS_LEASE_PARTITIONS) % FS_LEASE_HEAPS);
	return &fs_lease_parts[hashvalue % FS_LEASE_PARTITIONS];
}

/* Put a LIVE or ORPHAN lease in its heap (partition lock held EXCLUSIVE). */
static void
fs_lease_heap_add(uint32 hashvalue, FsLease *lease)
{
	int			h;
	FsLeasePartition *part = fs_lease_heap_of(hashvalue, &h);
	pairingheap heap = {fs_lease_expiry_cmp, NULL, part->roots[h]};

	pairingheap_add(&heap, &lease->expiry_node);
	fs_lease_heap_store(part, h, heap.ph_root);
}

/* Take a LIVE or ORPHAN lease out of its heap (partition lock held EXCLUSIVE). */
static void
fs_lease_heap_remove(uint32 hashvalue, FsLease *lease)
{
	int			h;
	FsLeasePartition *part = fs_lease_heap_of(hashvalue, &h);
	pairingheap heap = {fs_lease_expiry_cmp, NULL, part->roots[h]};

	pairingheap_remove(&heap, &lease->expiry_node);
	fs_lease_heap_store(part, h, heap.ph_root);
}

/* ----------------------------------------------------------------
 * Changes of the lease table
 *
 * ONE PLACE WHERE A LEASE CHANGES.  A lease is entered, changes state, is
 * extended and is removed only by the four functions below, each called
 * with the lease's partition lock held EXCLUSIVE (shmem.c, rule 4), and each
 * ends in fs_lease_changed(): the one point that sees every change of a
 * lease.  They keep the partition's expiry heap (LIVE and ORPHAN leases are
 * on it, RELEASING ones are not) and list in step with the lease.  What a
 * lease holds in its tenant (a slot, an orphan pin) is given and taken by
 * the callers, through core/tenant.h.
 * ----------------------------------------------------------------
 */

/* List `id` for the WAL writer in the partition of `hashvalue` (its lock held EXCLUSIVE). */
static inline void
fs_lease_wal_note(uint32 hashvalue, int64 id)
{
	int			p = hashvalue % FS_LEASE_PARTITIONS;
	FsLeasePartition *part = &fs_lease_parts[p];

	if (part->wal_count < fs_lease_wal_capacity)
		fs_lease_wal_ids[(Size) p * fs_lease_wal_capacity + part->wal_count++] = id;
	else
		part->wal_overflow = true;
	if (pg_atomic_read_u32(fs_lease_wal_dirty) == 0)
		pg_atomic_write_u32(fs_lease_wal_dirty, 1);
}

/*
 * The end of every change of `lease` (`removed`: it is about to leave the
 * table).  Its first change since the WAL writer last logged it lists its
 * id for the writer (negated if no standby has it yet); the removal of a
 * logged lease does too, unless its id is listed already.  The debug build
 * checks the lease.
 */
static inline void
fs_lease_changed(FsLease *lease, uint32 hashvalue, bool removed)
{
	if (removed)
	{
		if ((lease->wal & FS_LEASE_WAL_LOGGED) && !(lease->wal & FS_LEASE_WAL_DIRTY))
			fs_lease_wal_note(hashvalue, lease->lease_id);
		return;
	}
	FS_INVARIANT(lease->tenant != NULL);
	FS_INVARIANT(lease->state == FS_LEASE_LIVE || lease->state == FS_LEASE_RELEASING ||
				 lease->state == FS_LEASE_ORPHAN);
	FS_INVARIANT(lease->state != FS_LEASE_RELEASING || lease->holder_pid != 0);
	if (!(lease->wal & FS_LEASE_WAL_DIRTY))
	{
		lease->wal |= FS_LEASE_WAL_DIRTY;
		fs_lease_wal_note(hashvalue, (lease->wal & FS_LEASE_WAL_LOGGED) ?
						  lease->lease_id : -lease->lease_id);
	}
}

/* Does a lease in `state` belong on its partition's expiry heap? */
static inline bool
fs_lease_state_expires(FsLeaseState state)
{
	return state != FS_LEASE_RELEASING;
}

/*
 * Fill a lease just entered in the table (HASH_ENTER under its partition
 * lock): it belongs to `tenant` as of `generation`, in `state`.
 */
void
fs_lease_fill(FsLease *lease, uint32 hashvalue, FsTenant *tenant, uint32 generation,
			  FsLeaseState state, Oid owner, int32 holder_pid,
			  TimestampTz acquired_at, TimestampTz expires_at)
{
	lease->tenant = tenant;
	lease->tenant_generation = generation;
	lease->acquired_at = acquired_at;
	lease->expires_at = expires_at;
	lease->holder_pid = holder_pid;
	lease->owner = owner;
	lease->state = (uint8) state;
	lease->wal = 0;
	lease->doomed = false;
	if (fs_lease_state_expires(state))
		fs_lease_heap_add(hashvalue, lease);
	fs_scan_list_add(&fs_lease_scan, hashvalue % FS_LEASE_PARTITIONS, &lease->scan_link);
	fs_lease_changed(lease, hashvalue, false);
}

/*
 * Put a lease in `state`: RELEASING takes it off its expiry heap (no sweep
 * may expire it) and names this backend as its holder; LIVE puts it back.
 */
void
fs_lease_set_state(FsLease *lease, uint32 hashvalue, FsLeaseState state)
{
	bool		was_on_heap = fs_lease_state_expires((FsLeaseState) lease->state);

	if (was_on_heap && !fs_lease_state_expires(state))
		fs_lease_heap_remove(hashvalue, lease);
	else if (!was_on_heap && fs_lease_state_expires(state))
		fs_lease_heap_add(hashvalue, lease);
	lease->state = (uint8) state;
	if (state == FS_LEASE_RELEASING)
		lease->holder_pid = MyProcPid;
	fs_lease_changed(lease, hashvalue, false);
}

/*
 * Doom a RELEASING lease whose acquire was rolled back while another
 * transaction was releasing it: that transaction's commit drops it as it
 * would anyway, and its rollback drops it instead of making it live again.
 * Until then it holds its slot, as every RELEASING lease does, so a
 * take-over of that slot in the releasing transaction stays within the
 * ceiling.
 */
void
fs_lease_doom(FsLease *lease, uint32 hashvalue)
{
	Assert(lease->state == FS_LEASE_RELEASING);
	lease->doomed = true;
	fs_lease_changed(lease, hashvalue, false);
}

/*
 * Extend a LIVE or ORPHAN lease to `expires_at` (its place in the expiry
 * heap moves with it).  A lease without an owner becomes `owner`'s.
 */
void
fs_lease_extend(FsLease *lease, uint32 hashvalue, TimestampTz expires_at, Oid owner)
{
	fs_lease_heap_remove(hashvalue, lease);
	lease->expires_at = expires_at;
	fs_lease_heap_add(hashvalue, lease);
	if (!OidIsValid(lease->owner))
		lease->owner = owner;
	fs_lease_changed(lease, hashvalue, false);
}

/* Remove a lease from the table, its expiry heap and its partition's list. */
void
fs_lease_remove(FsLease *lease, uint32 hashvalue)
{
	int64		lease_id = lease->lease_id;

	fs_lease_changed(lease, hashvalue, true);
	if (fs_lease_state_expires((FsLeaseState) lease->state))
		fs_lease_heap_remove(hashvalue, lease);
	fs_scan_list_remove(&lease->scan_link);
	hash_search_with_hash_value(fs_lease_hash, &lease_id, hashvalue, HASH_REMOVE, NULL);
}

/*
 * Report a count that had to be kept from going below zero, or a lease
 * whose tenant entry was reused: the debug build's error, where an error is
 * allowed.  At transaction end (an error there would be a PANIC) it is a
 * warning.  A no-op in the ordinary build, which clamps and goes on.
 */
void
fs_lease_count_was_wrong(bool wrong, bool at_xact_end)
{
#ifdef FS_DEBUG
	if (!wrong)
		return;
	if (!at_xact_end)
		fs_invariant_failed("a lease's slot or pin is given back once", __FILE__, __LINE__);
	ereport(WARNING,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("fairshare invariant violated: a lease's slot or pin is given back once"),
			 errhint("This is a bug in fairshare, caught by its debug build (make FS_DEBUG=1).")));
#else
	(void) wrong;
	(void) at_xact_end;
#endif
}

/*
 * Give back what a lease that is gone (or no longer counted) held in its
 * tenant: a slot, or for an orphan its pin.  `generation` is the tenant's
 * when the lease was taken; if the entry has been reused since, there is
 * nothing left to give back.  Counts never go below zero.  Returns false
 * when the count was already zero or the entry reused: something gave it
 * back twice (see fs_lease_count_was_wrong()).  After this the caller must
 * not touch the entry: the pin is gone.
 */
bool
fs_lease_pin_release(FsTenant *tenant, uint32 generation, bool orphan, bool expired)
{
	FsQueue    *queue = NULL;
	bool		ok = true;

	fs_tenant_lock(tenant);
	if (tenant->generation != generation)
		ok = false;
	else if (orphan)
		ok = fs_tenant_orphan_give_back(tenant);
	else
	{
		/* The queue before the count drops: after that the entry may go. */
		queue = fs_queue_of(tenant);
		ok = fs_tenant_slot_give_back(tenant, expired);
		if (!ok)
			queue = NULL;
	}
	fs_tenant_unlock(tenant);
	if (queue != NULL)
	{
		fs_queue_slots_sub(queue, 1);
		fs_tenant_may_be_idle();
	}
	return ok;
}

/*
 * Insert a live lease for `entry` (whose slot the caller has counted) under
 * a fresh id, sweeping expired leases once if the table is full.  Returns
 * NULL, with *lease_id set to an untracked id, when there is no room.
 */
FsLease *
fs_lease_insert(FsTenant *entry, uint32 generation, TimestampTz now, TimestampTz expires_at,
				int64 *lease_id)
{
	FsLease    *lease = NULL;
	bool		found = true;
	bool		swept = false;
	Oid			owner = GetUserId();

	while (lease == NULL || found)
	{
		uint32		hashvalue;
		LWLock	   *lock;

		*lease_id = (int64) pg_atomic_fetch_add_u64(&fs_shared->next_lease_id, 1);
		hashvalue = get_hash_value(fs_lease_hash, lease_id);
		lock = fs_lease_lock(hashvalue);
		LWLockAcquire(lock, LW_EXCLUSIVE);
		lease = hash_search_with_hash_value(fs_lease_hash, lease_id, hashvalue,
											HASH_ENTER_NULL, &found);
		if (lease != NULL && !found)
		{
			/* The decision noted its expiry in the tenant already. */
			fs_lease_fill(lease, hashvalue, entry, generation, FS_LEASE_LIVE, owner,
						  MyProcPid, now, expires_at);
		}
		LWLockRelease(lock);

		/*
		 * found: the id is taken (a lease restored from before a crash whose
		 * id came round again); draw another.
		 */
		if (lease == NULL)
		{
			if (swept)
				return NULL;
			(void) fs_lease_sweep(now, FS_SWEEP_INLINE_MAX);
			swept = true;
		}
	}
	return lease;
}

/*
 * Remove a LIVE or ORPHAN lease found under its lock (expired, or left by a
 * tenant entry that was reused), and give back its slot (or its orphan
 * pin).  Returns with the lock released.
 */
void
fs_lease_expire_locked(FsLease *lease, uint32 hashvalue, LWLock *lock, bool at_xact_end)
{
	FsTenant   *tenant = lease->tenant;
	uint32		generation = lease->tenant_generation;
	bool		orphan = lease->state == FS_LEASE_ORPHAN;
	bool		count_ok;

	fs_lease_remove(lease, hashvalue);
	LWLockRelease(lock);
	count_ok = fs_lease_pin_release(tenant, generation, orphan, !orphan);
	if (!orphan)
		FS_COUNT_GLOBAL(leases_expired);
	fs_lease_count_was_wrong(!count_ok, at_xact_end);
}

/* ----------------------------------------------------------------
 * Sweeping expired leases
 * ----------------------------------------------------------------
 */

/* What a sweep copies out of an expired lease, to give back after the lock. */
typedef struct FsExpiredLease
{
	FsTenant   *tenant;			/* pinned by the slot (or orphan pin) the
								 * lease held, until it is given back */
	uint32		generation;
	bool		orphan;
} FsExpiredLease;

/*
 * Free up to `max_leases` leases that expired by `now`, one partition at a
 * time.  Under a partition's lock only the expired tops of its heaps are
 * taken off, at most FS_SWEEP_BATCH leases per hold, and copied out; their
 * slots are given back once the lock is released.  A partition whose earliest
 * expiry is still to come is passed over without its lock, so the work is
 * in proportion to the leases that expired, not to the table.  RELEASING
 * leases are in no heap: their transactions settle them.  Returns the
 * number of leases freed.
 */
int
fs_lease_sweep(TimestampTz now, int max_leases)
{
	FsExpiredLease batch[FS_SWEEP_BATCH];
	int			freed = 0;
	bool		counts_ok = true;
	int			p;

	/* See every heap top published before this sweep began. */
	pg_memory_barrier();
	for (p = 0; p < FS_LEASE_PARTITIONS && freed < max_leases; p++)
	{
		FsLeasePartition *part = &fs_lease_parts[p];
		LWLock	   *lock = &fs_lease_locks[p].lock;

		while (freed < max_leases &&
			   (TimestampTz) pg_atomic_read_u64(&part->earliest_expiry) <= now)
		{
			int			want = Min(FS_SWEEP_BATCH, max_leases - freed);
			int			n = 0;
			int			h;
			int			i;

			LWLockAcquire(lock, LW_EXCLUSIVE);
			for (h = 0; h < FS_LEASE_HEAPS && n < want; h++)
			{
				/* Each heap's top is its earliest lease: pop while expired. */
				while (n < want && part->tops[h] <= now)
				{
					FsLease    *lease = pairingheap_container(FsLease, expiry_node,
															  part->roots[h]);

					batch[n].tenant = lease->tenant;
					batch[n].generation = lease->tenant_generation;
					batch[n].orphan = lease->state == FS_LEASE_ORPHAN;
					n++;
					fs_lease_remove(lease, get_hash_value(fs_lease_hash, &lease->lease_id));
				}
			}
			LWLockRelease(lock);

			for (i = 0; i < n; i++)
				if (!fs_lease_pin_release(batch[i].tenant, batch[i].generation,
										  batch[i].orphan, !batch[i].orphan))
					counts_ok = false;
			freed += n;
			if (n < want)
				break;			/* nothing else in this partition has expired */
		}
	}

	if (freed > 0)
	{
		SpinLockAcquire(&fs_shared->stats_mutex);
		fs_shared->stats.leases_expired += freed;
		SpinLockRelease(&fs_shared->stats_mutex);
	}
	fs_lease_count_was_wrong(!counts_ok, false);
	return freed;
}

/*
 * Free every expired lease (the background sweeper).  No lock is held for
 * more than FS_SWEEP_BATCH leases.  Returns the number of leases freed.
 */
int
fs_sweep_expired_leases(TimestampTz now)
{
	return fs_lease_sweep(now, INT_MAX);
}

/* ----------------------------------------------------------------
 * Iteration and restore (views, state file)
 * ----------------------------------------------------------------
 */

/* fs_lease_foreach()'s state: the caller's visitor and its argument. */
typedef struct FsLeaseVisit
{
	fs_lease_visitor visitor;
	void	   *arg;
	fs_scan_pause pause;		/* fs_lease_foreach_for_wal(): between batches */
} FsLeaseVisit;

/* fs_scan_table() visitor of fs_lease_foreach(): hand on the lease's facts. */
static void
fs_lease_visit_copy(void *hash_entry, void *arg)
{
	FsLease    *lease = (FsLease *) hash_entry;
	FsLeaseVisit *visit = (FsLeaseVisit *) arg;
	FsLeaseInfo info;

	info.lease_id = lease->lease_id;
	/* The key never changes while the tenant is pinned. */
	info.tenant_key = lease->tenant->key;
	info.acquired_at = lease->acquired_at;
	info.expires_at = lease->expires_at;
	info.holder_pid = lease->holder_pid;
	info.owner = lease->owner;
	info.state = lease->state;
	visit->visitor(&info, visit->arg);
}

/*
 * Call `visitor` with the facts of every lease, a batch at a time
 * (fs_scan_table(): one lease partition lock held for one batch, so a
 * sweep, an acquire or a release of that partition waits for a batch at
 * most).  A lease
 * that exists throughout is visited once; one taken or released meanwhile
 * may or may not be.  The visitor must be quick and must not fail or block.
 */
void
fs_lease_foreach(fs_lease_visitor visitor, void *arg)
{
	FsLeaseVisit visit;

	visit.visitor = visitor;
	visit.arg = arg;
	visit.pause = NULL;
	fs_scan_table(&fs_lease_scan, fs_lease_visit_copy, &visit);
}

/* Number of leases: see fs_tenant_count(). */
long
fs_lease_count(void)
{
	return hash_get_num_entries(fs_lease_hash);
}

/*
 * Put a lease back while restoring state in the postmaster (no locks: no
 * backend exists yet).  A live lease is counted in its tenant's slots; an
 * orphan only pins the tenant until it is renewed.  `owner` is InvalidOid
 * for a lease from a state file that did not record owners.
 */
bool
fs_lease_restore(int64 lease_id, FsTenant *tenant, Oid owner, TimestampTz acquired_at,
				 TimestampTz expires_at, bool orphan)
{
	FsLease    *lease;
	bool		found;
	uint32		hashvalue = get_hash_value(fs_lease_hash, &lease_id);

	Assert(!IsUnderPostmaster);
	if (orphan && tenant->orphan_leases == PG_UINT16_MAX)
		return false;
	lease = hash_search_with_hash_value(fs_lease_hash, &lease_id, hashvalue,
										HASH_ENTER_NULL, &found);
	if (lease == NULL || found)
		return false;
	fs_lease_fill(lease, hashvalue, tenant, tenant->generation,
				  orphan ? FS_LEASE_ORPHAN : FS_LEASE_LIVE, owner, 0, acquired_at, expires_at);
	fs_tenant_lock(tenant);
	if (orphan)
		(void) fs_tenant_orphan_add(tenant);	/* room: checked above */
	else
		fs_tenant_slot_take(tenant, expires_at);
	fs_tenant_unlock(tenant);
	if (!orphan)
		pg_atomic_fetch_add_u32(&fs_queue_of(tenant)->slots_in_use, 1);
	return true;
}

/* ----------------------------------------------------------------
 * Replication through WAL (statefile/wal_writer.c and wal_redo.c)
 * ----------------------------------------------------------------
 */

/* Room fs_lease_wal_drain() needs: every partition's list. */
Size
fs_lease_wal_room(void)
{
	return (Size) FS_LEASE_PARTITIONS * fs_lease_wal_capacity;
}

/*
 * Take the ids every partition listed since the last call into `ids` (room
 * for fs_lease_wal_room()): each partition's list copied and emptied under
 * its lock, a memcpy.  Returns how many; *overflow says that some changes
 * were not listed (the writer then logs every lease).
 */
int
fs_lease_wal_drain(int64 *ids, bool *overflow)
{
	int			n = 0;
	int			p;

	*overflow = false;
	if (pg_atomic_read_u32(fs_lease_wal_dirty) == 0)
		return 0;
	pg_atomic_write_u32(fs_lease_wal_dirty, 0);
	pg_memory_barrier();
	for (p = 0; p < FS_LEASE_PARTITIONS; p++)
	{
		FsLeasePartition *part = &fs_lease_parts[p];
		LWLock	   *lock = &fs_lease_locks[p].lock;

		LWLockAcquire(lock, LW_EXCLUSIVE);
		memcpy(ids + n, fs_lease_wal_ids + (Size) p * fs_lease_wal_capacity,
			   sizeof(int64) * part->wal_count);
		n += part->wal_count;
		*overflow |= part->wal_overflow;
		part->wal_count = 0;
		part->wal_overflow = false;
		LWLockRelease(lock);
	}
	return n;
}

/* The facts of a lease (its lock held), as views and the WAL see them. */
static void
fs_lease_info(const FsLease *lease, FsLeaseInfo *info)
{
	info->lease_id = lease->lease_id;
	/* The key never changes while the tenant is pinned. */
	info->tenant_key = lease->tenant->key;
	info->acquired_at = lease->acquired_at;
	info->expires_at = lease->expires_at;
	info->holder_pid = lease->holder_pid;
	info->owner = lease->owner;
	info->state = lease->state;
}

/*
 * Copy the leases of ids[0 .. n) (negated ids are leases no standby has
 * yet) for the WAL writer, as they are now, each marked logged and no
 * longer changed: found[i] says whether the lease of ids[i] still exists,
 * and infos[i] holds it.  The ids come as fs_lease_wal_drain() gives them,
 * a partition's together, so each partition's lock is taken once for a
 * batch of at most FS_SCAN_BATCH of them, not once per lease.
 */
void
fs_lease_wal_copy_many(const int64 *ids, int n, FsLeaseInfo *infos, bool *found)
{
	int			i = 0;

	while (i < n)
	{
		int64		first = ids[i] < 0 ? -ids[i] : ids[i];
		uint32		part = get_hash_value(fs_lease_hash, &first) % FS_LEASE_PARTITIONS;
		LWLock	   *lock = &fs_lease_locks[part].lock;
		int			held = 0;

		LWLockAcquire(lock, LW_EXCLUSIVE);
		while (i < n && held < FS_SCAN_BATCH)
		{
			int64		id = ids[i] < 0 ? -ids[i] : ids[i];
			uint32		hashvalue = get_hash_value(fs_lease_hash, &id);
			FsLease    *lease;

			if (hashvalue % FS_LEASE_PARTITIONS != part)
				break;
			lease = hash_search_with_hash_value(fs_lease_hash, &id, hashvalue, HASH_FIND, NULL);
			found[i] = lease != NULL;
			if (lease != NULL)
			{
				fs_lease_info(lease, &infos[i]);
				lease->wal = (lease->wal | FS_LEASE_WAL_LOGGED) & ~FS_LEASE_WAL_DIRTY;
			}
			i++;
			held++;
		}
		LWLockRelease(lock);
	}
}

/* fs_scan_table() visitor of fs_lease_foreach_for_wal(): copy and mark logged. */
static void
fs_lease_visit_for_wal(void *hash_entry, void *arg)
{
	FsLease    *lease = (FsLease *) hash_entry;
	FsLeaseVisit *visit = (FsLeaseVisit *) arg;
	FsLeaseInfo info;

	fs_lease_info(lease, &info);
	lease->wal = (lease->wal | FS_LEASE_WAL_LOGGED) & ~FS_LEASE_WAL_DIRTY;
	visit->visitor(&info, visit->arg);
}

/* Between two batches of fs_lease_foreach_for_wal(): the caller's pause. */
static void
fs_lease_visit_pause(void *arg)
{
	FsLeaseVisit *visit = (FsLeaseVisit *) arg;

	visit->pause(visit->arg);
}

/*
 * Every lease for a complete snapshot in WAL, each marked logged, a batch
 * at a time as fs_lease_foreach() does, with `pause` between batches.
 */
void
fs_lease_foreach_for_wal(fs_lease_visitor visitor, fs_scan_pause pause, void *arg)
{
	FsLeaseVisit visit;

	visit.visitor = visitor;
	visit.arg = arg;
	visit.pause = pause;
	fs_scan_table_paused(&fs_lease_scan, fs_lease_visit_for_wal, fs_lease_visit_pause, &visit);
}

/* Does a lease in `state` count a slot of its tenant (else: an orphan's pin)? */
static inline bool
fs_lease_state_counts(FsLeaseState state)
{
	return state != FS_LEASE_ORPHAN;
}

/*
 * Bring an existing lease (its lock held EXCLUSIVE) to what the primary
 * logged: its state (a slot or a pin in its tenant, moved between the
 * two), expiry, owner and mark.
 */
static void
fs_lease_replay_update(FsLease *lease, uint32 hashvalue, const FsLeaseReplay *rec)
{
	bool		counted = fs_lease_state_counts((FsLeaseState) lease->state);
	bool		counts = fs_lease_state_counts(rec->state);
	FsLeaseState state = rec->state;

	if (counted != counts && fs_lease_tenant_ok(lease))
	{
		FsTenant   *tenant = lease->tenant;
		bool		moved = true;

		fs_tenant_lock(tenant);
		if (counts)
			(void) fs_tenant_orphan_adopt(tenant, rec->expires_at);
		else if (fs_tenant_orphan_add(tenant))
			(void) fs_tenant_slot_give_back(tenant, false);
		else
			moved = false;		/* no room for one more orphan: it stays live */
		fs_tenant_unlock(tenant);
		if (counts)
			pg_atomic_fetch_add_u32(&fs_queue_of(tenant)->slots_in_use, 1);
		else if (moved)
			fs_queue_slots_sub(fs_queue_of(tenant), 1);
		else
			state = (FsLeaseState) lease->state;
	}
	if (lease->state != state)
		fs_lease_set_state(lease, hashvalue, state);
	if (lease->expires_at != rec->expires_at && fs_lease_state_expires(state))
		fs_lease_extend(lease, hashvalue, rec->expires_at, rec->owner);
	else
		lease->expires_at = rec->expires_at;
	lease->owner = rec->owner;
	lease->wal |= FS_LEASE_WAL_MARK;
}

/*
 * Replay a lease the primary logged (the startup process): bring the lease
 * up to it, or enter it with a slot (or an orphan's pin) in its tenant's
 * entry, which is made if missing.  False when there is no room for it
 * (counted by the caller).
 */
bool
fs_lease_replay(const FsLeaseReplay *logged)
{
	FsLeaseReplay copy = *logged;
	const FsLeaseReplay *rec = &copy;
	uint32		hashvalue = get_hash_value(fs_lease_hash, &rec->lease_id);
	LWLock	   *lock = fs_lease_lock(hashvalue);
	FsLease    *lease;
	FsTenantRef ref;
	FsTenant   *tenant;
	uint32		generation;
	bool		counts;
	bool		pinned;
	bool		found;

	/*
	 * A lease being released on the primary still holds its slot there; here
	 * nobody releases it, so it is live (its release comes as a removal).
	 */
	if (copy.state == FS_LEASE_RELEASING)
		copy.state = FS_LEASE_LIVE;
	counts = fs_lease_state_counts(rec->state);

	LWLockAcquire(lock, LW_EXCLUSIVE);
	lease = hash_search_with_hash_value(fs_lease_hash, &rec->lease_id, hashvalue, HASH_FIND, NULL);
	if (lease != NULL)
	{
		fs_lease_replay_update(lease, hashvalue, rec);
		LWLockRelease(lock);
		return true;
	}
	LWLockRelease(lock);

	/* A new lease: its slot (or pin) first, which pins the entry (rule 2). */
	tenant = fs_tenant_open(rec->queue, rec->tenant, FS_OPEN_CREATE | FS_OPEN_NO_LIMITS, &ref);
	if (tenant == NULL)
		return false;
	generation = tenant->generation;
	fs_tenant_lock(tenant);
	if (counts)
	{
		fs_tenant_slot_take(tenant, rec->expires_at);
		pinned = true;
	}
	else
		pinned = fs_tenant_orphan_add(tenant);
	fs_tenant_unlock(tenant);
	fs_tenant_close(&ref);
	if (!pinned)
		return false;
	if (counts)
		pg_atomic_fetch_add_u32(&rec->queue->slots_in_use, 1);

	LWLockAcquire(lock, LW_EXCLUSIVE);
	lease = hash_search_with_hash_value(fs_lease_hash, &rec->lease_id, hashvalue,
										HASH_ENTER_NULL, &found);
	if (lease != NULL && !found)
	{
		fs_lease_fill(lease, hashvalue, tenant, generation, rec->state, rec->owner, 0,
					  rec->acquired_at, rec->expires_at);
		lease->wal |= FS_LEASE_WAL_MARK;
	}
	else if (lease != NULL)
		fs_lease_replay_update(lease, hashvalue, rec);
	LWLockRelease(lock);
	if (lease == NULL || found)
	{
		/* No room (or entered meanwhile): give back what was taken for it. */
		bool		ok = fs_lease_pin_release(tenant, generation, !counts, false);

		fs_lease_count_was_wrong(!ok, false);
	}
	return lease != NULL;
}

/* Replay of a lease the primary removed: remove it, and what it held. */
void
fs_lease_replay_remove(int64 lease_id)
{
	uint32		hashvalue = get_hash_value(fs_lease_hash, &lease_id);
	LWLock	   *lock = fs_lease_lock(hashvalue);
	FsLease    *lease;
	FsTenant   *tenant;
	uint32		generation;
	bool		orphan;
	bool		ok;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	lease = hash_search_with_hash_value(fs_lease_hash, &lease_id, hashvalue, HASH_FIND, NULL);
	if (lease == NULL)
	{
		LWLockRelease(lock);
		return;
	}
	tenant = lease->tenant;
	generation = lease->tenant_generation;
	orphan = !fs_lease_state_counts((FsLeaseState) lease->state);
	fs_lease_remove(lease, hashvalue);
	LWLockRelease(lock);
	ok = fs_lease_pin_release(tenant, generation, orphan, false);
	fs_lease_count_was_wrong(!ok, false);
}

/* fs_scan_table() visitor of fs_lease_replay_unmark_all(). */
static void
fs_lease_unmark(void *hash_entry, void *arg pg_attribute_unused())
{
	((FsLease *) hash_entry)->wal &= ~FS_LEASE_WAL_MARK;
}

/* A complete snapshot in WAL begins: no lease is named by it yet. */
void
fs_lease_replay_unmark_all(void)
{
	fs_scan_table(&fs_lease_scan, fs_lease_unmark, NULL);
}

/* fs_lease_replay_sweep()'s state: the leases to remove, in room made before. */
typedef struct FsLeaseUnmarked
{
	int64	   *ids;
	int			count;
	int			capacity;
} FsLeaseUnmarked;

/* fs_scan_table() visitor of fs_lease_replay_sweep(): note a lease not seen. */
static void
fs_lease_collect_unmarked(void *hash_entry, void *arg)
{
	FsLease    *lease = (FsLease *) hash_entry;
	FsLeaseUnmarked *u = (FsLeaseUnmarked *) arg;
	if (!(lease->wal & FS_LEASE_WAL_MARK) && u->count < u->capacity)
		u->ids[u->count++] = lease->lease_id;
}

/*
 * The end of a complete snapshot in WAL: remove every lease it did not
 * name (those without a mark).  Returns how many were removed.
 */
int
fs_lease_replay_sweep(void)
{
	FsLeaseUnmarked u;
	int			i;

	u.capacity = fs_max_leases;
	u.ids = palloc_extended(sizeof(int64) * u.capacity, MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM);
	if (u.ids == NULL)
		return 0;
	u.count = 0;
	fs_scan_table(&fs_lease_scan, fs_lease_collect_unmarked, &u);
	for (i = 0; i < u.count; i++)
		fs_lease_replay_remove(u.ids[i]);
	pfree(u.ids);
	return u.count;
}

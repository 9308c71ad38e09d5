/*-------------------------------------------------------------------------
 *
 * evict.c
 *	  Making room in a full tenant table: evicting the least recently used
 *	  idle entries, one pass at a time (core/shmem.c, rule 3).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/wait_event.h"

#include "core/shmem_int.h"
#include "core/tenant.h"

/* Entries evicted by one pass, as a share of the table (at least one). */
#define FS_EVICT_FRACTION	0.05

/*
 * After a pass that found nothing idle, fail open for this long instead (or
 * until a tenant lets go of a slot: fs_tenant_may_be_idle()).
 */
#define FS_EVICT_BACKOFF_USECS	(USECS_PER_SEC)

/*
 * The tenants evicted since the WAL writer last looked, for a standby to
 * forget them too (statefile/wal_writer.c): their keys, in the order of
 * eviction, under `mutex`.  A pass that finds the list full sets `overflow`
 * instead, and the writer then logs a complete snapshot, whose end removes
 * on a standby every entry it did not name.
 */
typedef struct FsTenantsGone
{
	slock_t		mutex;
	int32		count;
	bool		overflow;
	FsTenantKey keys[FLEXIBLE_ARRAY_MEMBER];
} FsTenantsGone;

static FsTenantsGone *fs_tenants_gone = NULL;

/* Keys the list holds: two eviction passes' worth, at least 1,024. */
int
fs_tenants_gone_room(void)
{
	return Max(1024, fs_max_tenants / 10);
}

/* Shared memory of the list of evicted tenants. */
Size
fs_evict_shmem_size(void)
{
	return add_size(offsetof(FsTenantsGone, keys),
					mul_size(sizeof(FsTenantKey), fs_tenants_gone_room()));
}

/* Create (or attach to) the list.  Caller holds AddinShmemInitLock. */
void
fs_evict_shmem_init(void)
{
	bool		found;

	fs_tenants_gone = ShmemInitStruct("fairshare evicted tenants", fs_evict_shmem_size(), &found);
	if (!found)
	{
		SpinLockInit(&fs_tenants_gone->mutex);
		fs_tenants_gone->count = 0;
		fs_tenants_gone->overflow = false;
	}
}

/* List an evicted tenant's key for the WAL writer (a copy under the spinlock). */
static void
fs_tenants_gone_note(const FsTenantKey *key)
{
	SpinLockAcquire(&fs_tenants_gone->mutex);
	if (fs_tenants_gone->count < fs_tenants_gone_room())
		fs_tenants_gone->keys[fs_tenants_gone->count++] = *key;
	else
		fs_tenants_gone->overflow = true;
	SpinLockRelease(&fs_tenants_gone->mutex);
}

/*
 * Take the keys of the tenants evicted since the last call, into `keys`
 * (room for fs_tenants_gone_room()).  Returns how many; *overflow says that
 * some evictions were not listed.  The list is copied a part at a time
 * from its end, each part under the spinlock, so that no spinlock is held
 * for a long copy (the order of removals does not matter).
 */
int
fs_tenants_gone_drain(FsTenantKey *keys, bool *overflow)
{
	int			n = 0;

	*overflow = false;
	for (;;)
	{
		int			take;

		SpinLockAcquire(&fs_tenants_gone->mutex);
		take = Min(Min(fs_tenants_gone->count, 16), fs_tenants_gone_room() - n);
		fs_tenants_gone->count -= take;
		memcpy(keys + n, fs_tenants_gone->keys + fs_tenants_gone->count,
			   sizeof(FsTenantKey) * take);
		if (take == 0)
		{
			*overflow = fs_tenants_gone->overflow;
			fs_tenants_gone->overflow = false;
		}
		SpinLockRelease(&fs_tenants_gone->mutex);
		if (take == 0)
			return n;
		n += take;
	}
}

/*
 * Take an entry out of the table (its partition lock held EXCLUSIVE): off
 * its partition's list, out of the hash table, one tenant less in its queue.
 */
void
fs_tenant_remove_locked(FsTenant *entry, uint32 hashvalue)
{
	FsTenantKey key = entry->key;
	FsQueue    *queue = fs_shared->queues[key.queue_id];

	fs_scan_list_remove(&entry->scan_link);
	hash_search_with_hash_value(fs_tenant_hash, &key, hashvalue, HASH_REMOVE, NULL);
	SpinLockAcquire(&queue->mutex);
	queue->tenants--;
	SpinLockRelease(&queue->mutex);
}

/*
 * A tenant may have become idle (it let go of a slot): end any eviction
 * back-off, so that the next miss looks again.  Writes shared memory only
 * while a back-off is in force.
 */
void
fs_tenant_may_be_idle(void)
{
	if (pg_atomic_read_u64(&fs_shared->evict_not_before) != 0)
		pg_atomic_write_u64(&fs_shared->evict_not_before, 0);
}

/*
 * May this entry be evicted?  Only when forgetting it loses nothing a fresh
 * entry would not give back: no slot held, no orphan lease, no backlog, a
 * full token bucket, and nothing that the layers above keep in it and need
 * (fs_tenant_evictable_hook: the fair order's state).  Called with the
 * entry's spinlock held.
 */
static bool
fs_tenant_is_idle(FsTenant *entry, TimestampTz now)
{
	if (entry->slots_in_use > 0 || entry->orphan_leases > 0 || entry->ready_rows != 0)
		return false;
	return fs_budget_is_full(entry, now) &&
		(fs_tenant_evictable_hook == NULL || fs_tenant_evictable_hook(entry));
}

typedef struct FsEvictCandidate
{
	FsTenantKey key;
	TimestampTz touched_at;
} FsEvictCandidate;

/* What an eviction pass's scan collects (fs_evict_collect()). */
typedef struct FsEvictScan
{
	FsEvictCandidate *candidates;	/* allocated before the scan */
	int			count;
	int			capacity;
	TimestampTz now;
} FsEvictScan;

/* qsort order of eviction candidates: least recently used first. */
static int
fs_evict_candidate_cmp(const void *a, const void *b)
{
	TimestampTz ta = ((const FsEvictCandidate *) a)->touched_at;
	TimestampTz tb = ((const FsEvictCandidate *) b)->touched_at;

	return (ta > tb) - (ta < tb);
}

/*
 * fs_scan_table() visitor of an eviction pass: note the entry, with when it
 * was last used, if it is idle.  Runs with the partition locks held: copies
 * and nothing else.
 */
static void
fs_evict_collect(void *hash_entry, void *arg)
{
	FsTenant   *entry = (FsTenant *) hash_entry;
	FsEvictScan *scan = (FsEvictScan *) arg;
	bool		idle;
	TimestampTz touched_at;

	if (scan->count >= scan->capacity)
		return;
	fs_tenant_lock(entry);
	idle = fs_tenant_is_idle(entry, scan->now);
	touched_at = entry->touched_at;
	fs_tenant_unlock(entry);
	if (idle)
	{
		scan->candidates[scan->count].key = entry->key;
		scan->candidates[scan->count].touched_at = touched_at;
		scan->count++;
	}
}

/*
 * Wait until the eviction pass that runs now ends, as a backend waits for
 * an LWLock: interrupts are held, not served, because an insert may evict
 * where no error may be raised (at the end of a transaction); a cancel that
 * comes meanwhile stays pending for the next CHECK_FOR_INTERRUPTS().  The
 * pass itself never waits and never fails, so the wait is as long as one
 * pass.
 */
static void
fs_evict_wait(void)
{
	HOLD_INTERRUPTS();
	ConditionVariablePrepareToSleep(&fs_shared->evict_done);
	while (!pg_atomic_unlocked_test_flag(&fs_shared->evicting))
		ConditionVariableSleep(&fs_shared->evict_done, PG_WAIT_EXTENSION);
	ConditionVariableCancelSleep();
	RESUME_INTERRUPTS();
}

/*
 * Evict the least recently used idle entries (FS_EVICT_FRACTION of the
 * table).  Returns how many were evicted.
 *
 * This runs on a decision's path, so it must neither fail nor make
 * decisions queue up behind it for long: the work array is allocated without
 * failing on memory before any lock is taken, only one backend evicts at a
 * time (the others wait for its pass, then try again), and after a pass that
 * found nothing idle, no new pass starts for FS_EVICT_BACKOFF_USECS.
 *
 * Three steps, so that no lock is held for long and nothing is sorted under
 * one: list the idle entries a batch at a time (fs_scan_table(): one
 * partition lock for one batch, so a decision waits for one batch at
 * most), sort the list with no
 * lock held, then remove the oldest one at a time, each under its own
 * partition lock held EXCLUSIVE, after checking again that it is still
 * there and still idle (rule 2: nobody holds a pointer to an entry without
 * its partition lock or a pin).
 */
int
fs_tenant_evict(TimestampTz now)
{
	FsTenant   *entry;
	FsEvictScan scan;
	int			want;
	int			evicted = 0;
	int			i;

	if (now < (TimestampTz) pg_atomic_read_u64(&fs_shared->evict_not_before))
		return 0;
	scan.candidates = palloc_extended(sizeof(FsEvictCandidate) * fs_max_tenants,
									  MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM);
	if (scan.candidates == NULL)
		return 0;
	scan.count = 0;
	scan.capacity = fs_max_tenants;
	scan.now = now;
	/*
	 * One backend evicts at a time.  The others wait for its pass to end
	 * (rather than fail open while it frees room) and then try their insert
	 * again.  No LWLock marks the pass: it lasts longer than any LWLock may
	 * be held.
	 */
	if (!pg_atomic_test_set_flag(&fs_shared->evicting))
	{
		fs_evict_wait();
		pfree(scan.candidates);
		return 0;
	}
	want = Max(1, (int) (fs_max_tenants * FS_EVICT_FRACTION));

	fs_scan_table(&fs_tenant_scan, fs_evict_collect, &scan);

	if (scan.count > want)
		qsort(scan.candidates, scan.count, sizeof(FsEvictCandidate), fs_evict_candidate_cmp);

	for (i = 0; i < scan.count && evicted < want; i++)
	{
		const FsTenantKey *key = &scan.candidates[i].key;
		uint32		hashvalue = get_hash_value(fs_tenant_hash, key);
		LWLock	   *lock = fs_tenant_partition_lock(hashvalue);
		bool		idle = false;

		LWLockAcquire(lock, LW_EXCLUSIVE);
		entry = hash_search_with_hash_value(fs_tenant_hash, key, hashvalue, HASH_FIND, NULL);
		if (entry != NULL)
		{
			fs_tenant_lock(entry);
			idle = fs_tenant_is_idle(entry, now);
			fs_tenant_unlock(entry);
		}
		if (idle)
		{
			fs_tenant_remove_locked(entry, hashvalue);
			fs_tenants_gone_note(key);
			evicted++;
		}
		LWLockRelease(lock);
	}

	if (evicted == 0)
		pg_atomic_write_u64(&fs_shared->evict_not_before, (uint64) (now + FS_EVICT_BACKOFF_USECS));
	pg_atomic_clear_flag(&fs_shared->evicting);
	ConditionVariableBroadcast(&fs_shared->evict_done);

	pfree(scan.candidates);

	SpinLockAcquire(&fs_shared->stats_mutex);
	fs_shared->stats.evictions += evicted;
	fs_shared->stats.eviction_passes++;
	SpinLockRelease(&fs_shared->stats_mutex);

	return evicted;
}

/*
 * WAL replay: forget the entry of `key`, which the primary evicted (or a
 * complete snapshot did not name), if nothing here holds it: no slot, no
 * orphan lease, no place in a fair order (the caller takes it out of its
 * fair order first).  Returns whether it was removed.
 */
bool
fs_tenant_drop(const FsTenantKey *key)
{
	uint32		hashvalue = get_hash_value(fs_tenant_hash, key);
	LWLock	   *lock = fs_tenant_partition_lock(hashvalue);
	FsTenant   *entry;
	bool		removable = false;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	entry = hash_search_with_hash_value(fs_tenant_hash, key, hashvalue, HASH_FIND, NULL);
	if (entry != NULL)
	{
		fs_tenant_lock(entry);
		removable = entry->slots_in_use == 0 && entry->orphan_leases == 0 &&
			!(entry->flags & FS_TENANT_QUEUED);
		fs_tenant_unlock(entry);
		if (removable)
			fs_tenant_remove_locked(entry, hashvalue);
	}
	LWLockRelease(lock);
	return removable;
}

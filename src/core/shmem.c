/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  fairshare's shared memory: the control structure, the queue table and
 *	  the (queue, tenant) table (its eviction is in evict.c).
 *
 * LOCKING RULES (for all of fairshare's shared state)
 * ---------------------------------------------------
 * Hot paths take no lock that every backend shares exclusively.
 *
 * 1. Tenant table.  A partitioned, fixed-size dynahash.  FS_TENANT_PARTITIONS
 *	  LWLocks, chosen by the key's hash.  Finding an entry takes its partition
 *	  lock in SHARED mode; inserting or removing an entry takes it EXCLUSIVE.
 *	  The fields of an entry are read and written under the entry's own
 *	  spinlock (FsTenant.mutex), held for a handful of instructions: copy in,
 *	  decide, copy out.  No other lock, no palloc, no ereport under it.
 *
 * 2. An FsTenant pointer is valid while its partition lock is held (any
 *	  mode), or while the holder owns something that pins the entry: a slot
 *	  counted in slots_in_use, or an orphan lease counted in orphan_leases.
 *	  Eviction removes only entries where both are zero (checked under the
 *	  entry spinlock, with the entry's partition lock held exclusively), so a
 *	  lease may keep a pointer to its tenant and use it after taking the
 *	  lease's own lock.  Whoever drops the last pin must not touch the entry
 *	  again.
 *
 * 3. Eviction (evict.c; shared memory full) runs one pass at a time (the flag
 *	  FsShared.evicting; others wait on evict_done), lists idle entries
 *	  a batch at a time (rule 3a), sorts with no lock held, and removes
 *	  each chosen entry under its own partition lock EXCLUSIVE.  Only on a miss with a full table: never on the path of a
 *	  tenant that already has an entry.
 *
 * 3a. Every partitioned table (tenants, leases, the claim map, tier
 *	  counters) also links each entry into its partition's list, under the
 *	  partition lock EXCLUSIVE, when the entry is entered and before it is
 *	  removed (scanlist.h).  Whole-table scans (views, the state file, reset,
 *	  eviction, sweeps) walk those lists: one partition lock at a time,
 *	  EXCLUSIVE, for one batch of FS_SCAN_BATCH entries at most, then they
 *	  park a cursor in the list, let go and go on from it (fs_scan_table()).
 *	  A scan never holds two partition locks and never walks empty buckets.
 *	  An entry that exists throughout a scan is visited exactly once; one
 *	  created or removed meanwhile may or may not be.
 *
 * 4. Lease table (slots/leases.c).  A partitioned dynahash with its own
 *	  FS_LEASE_PARTITIONS LWLocks, EXCLUSIVE for every change, including the
 *	  partition's heap of leases by expiry.  Sweeping expired leases takes one
 *	  partition lock at a time, for a bounded batch.  Listing every lease
 *	  (views, the state file) is a scan of rule 3a.  A
 *	  backend never holds a tenant partition lock and a lease partition lock
 *	  at the same time; under a lease lock it may take a tenant entry's
 *	  spinlock (the entry is pinned by the lease).
 *
 * 5. Queue table.  queues_lock, SHARED to look up, EXCLUSIVE to create.
 *	  Queues are never removed while the server runs, so backends cache
 *	  FsQueue pointers and skip the lock afterwards; a queue's own fields are
 *	  under its spinlock.
 *
 * 5a. Worker heartbeats (gate/gate.c).  Their own lock, EXCLUSIVE for a
 *	  heartbeat, SHARED to recount a queue's live threads.  Taken before a tenant entry
 *	  is opened, never while a partition lock is held.
 *
 * 5b. Tier counters (tiers.c).  A partitioned table like the tenant table,
 *	  with FS_TIER_PARTITIONS locks of its own and a spinlock per entry.
 *
 * 5c. Decision log (core/decisions.c).  One ring per backend slot, written only by
 *	  the backend in that slot; readers check a sequence number per record.
 *	  No lock.
 *
 * 6. Counters for the whole server (FsShared.stats) are under stats_mutex,
 *	  copied out under it by readers.  The limits generation and the lease id
 *	  counter are atomics.
 *
 * 7. No spinlock is held across anything that can fail (palloc, ereport).
 *	  LWLocks are released by error recovery, but still no fairshare LWLock is
 *	  held across SPI or other I/O: loading limits (SPI) happens with no
 *	  fairshare lock held at all.
 *
 * 8. Fair dequeue (fairq/order.c).  Each queue has one LWLock over its fair
 *	  order (the heap of backlogged tenants and the virtual time), held
 *	  EXCLUSIVE for a claim's planning and settling (no SPI, no I/O under it)
 *	  and by commits that make a tenant backlogged.  Order: a tenant
 *	  partition lock, then a queue's fair-order lock, then entry spinlocks;
 *	  never the other way round.  Every write of FsTenant.virtual_finish is
 *	  made under the queue's fair-order lock.  A tenant listed in the fair
 *	  order carries FS_TENANT_QUEUED, which pins it like a held slot (rule 2),
 *	  so the heap may keep pointers to it.  FsTenant.heap_index, the entry's
 *	  position in that heap, is the one field of an entry NOT under its
 *	  spinlock: it is read and written only under the fair-order lock of the
 *	  entry's queue (exclusive to write), like the heap itself.  The claim map (rows claimed ->
 *	  leases, for automatic release) is a partitioned hash with its own
 *	  LWLocks, never held together with any other fairshare lock.  Each
 *	  queue also has a commit barrier (an atomic counter): a transaction that
 *	  changes the queue's backlog is inside it from pre-commit until its
 *	  changes are applied, and a recount closes it for the instant it takes
 *	  its snapshot.  Nobody waits at a barrier holding a fairshare lock.
 *	  A queue's probe starts (fairq/probe_start.c) are under a spinlock of
 *	  their own, taken with no other fairshare lock held and for a few
 *	  comparisons and copies only; its committing buckets are atomics (the
 *	  file says why that is safe).
 *
 * 9. Where shared state changes.  Each kind of entry changes through a small
 *	  set of functions in one place, under the locks above, and each set
 *	  ends in one "changed" function that sees every change of its kind (the
 *	  debug build checks invariants there):
 *	  - a tenant entry: core/tenant.h (fs_tenant_changed()); entries are
 *		entered, touched and restored here, in shmem.c;
 *	  - a lease: slots/leases.c, "Changes of the lease table"
 *		(fs_lease_changed());
 *	  - a queue's fair-order state: fairq/fairqueue_int.h
 *		(fs_fair_changed()); its heap: fairq/order.c;
 *	  - the claim map: fairq/claim_map.c (fs_claim_map_changed());
 *	  - a queue's probe starts: fairq/probe_start.c;
 *	  - worker heartbeats and a queue's gate figures: gate/gate.c
 *		(fs_worker_heartbeat(), fs_gate_recount(), fs_gate_set_latency()).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"


#include "common/hashfn.h"
#include "miscadmin.h"
#include "utils/memutils.h"

#include "core/shmem_int.h"
#include "core/tenant.h"

FsShared   *fs_shared = NULL;
static HTAB *fs_queue_hash = NULL;
HTAB	   *fs_tenant_hash = NULL;

/* Backend-local cache of queue name -> FsQueue (queues never move). */
typedef struct FsLocalQueue
{
	char		name[FS_NAME_BUFLEN];	/* hash key */
	FsQueue    *queue;
} FsLocalQueue;

/* What the layers above ask of the core (shmem.h; module.c sets them). */
fs_queue_init_hook_type fs_queue_init_hook = NULL;
fs_tenant_evictable_hook_type fs_tenant_evictable_hook = NULL;
fs_limits_resolve_hook_type fs_limits_resolve_hook = NULL;

static HTAB *fs_local_queues = NULL;

/* The tenant table's partition lists (scanlist.h). */
FsScanTable fs_tenant_scan;

StaticAssertDecl(sizeof(FsTenant) <= 256,
				 "a tenant entry must fit in 272 bytes with the hash table's overhead");

/* dynahash hash function of tenant keys (queue id, tenant name up to its end). */
static uint32
fs_tenant_key_hash(const void *key, Size keysize pg_attribute_unused())
{
	const FsTenantKey *k = (const FsTenantKey *) key;

	return hash_combine(murmurhash32(k->queue_id),
						hash_bytes((const unsigned char *) k->tenant,
								   (int) strlen(k->tenant)));
}

/* dynahash match function of tenant keys (0: equal). */
static int
fs_tenant_key_match(const void *key1, const void *key2, Size keysize pg_attribute_unused())
{
	const FsTenantKey *a = (const FsTenantKey *) key1;
	const FsTenantKey *b = (const FsTenantKey *) key2;

	if (a->queue_id != b->queue_id)
		return 1;
	return strcmp(a->tenant, b->tenant);
}

/* Size of the control structure, with its array of queue pointers. */
static Size
fs_control_size(void)
{
	return add_size(offsetof(FsShared, queues),
					mul_size(sizeof(FsQueue *), fs_max_queues));
}

/* Bytes of shared memory the tenant table takes per entry, all included. */
Size
fs_tenant_entry_bytes(void)
{
	return hash_estimate_size(fs_max_tenants, sizeof(FsTenant)) / fs_max_tenants;
}

/*
 * Shared memory of the core: the control structure, the queue and tenant
 * tables, their lists.
 */
static Size
fs_core_shmem_size(void)
{
	Size		size = MAXALIGN(fs_control_size());

	size = add_size(size, hash_estimate_size(fs_max_queues, sizeof(FsQueue)));
	size = add_size(size, hash_estimate_size(fs_max_tenants, sizeof(FsTenant)));
	size = add_size(size, fs_scan_lists_size(FS_TENANT_PARTITIONS));
	size = add_size(size, fs_scan_cursors_size());
	size = add_size(size, fs_evict_shmem_size());
	return size;
}

/*
 * Ask for the core's shared memory (the control structure, the queue and
 * tenant tables, the scan cursors) and its locks.  From the shmem request
 * hook (module.c).
 */
void
fs_core_shmem_request(void)
{
	RequestAddinShmemSpace(fs_core_shmem_size());
	RequestNamedLWLockTranche("fairshare", FS_MISC_LOCKS + FS_TENANT_PARTITIONS);
}

/*
 * Create or attach to the core's shared state.  Returns whether it was
 * there already: false in the postmaster at startup (and again after a
 * crash, when the postmaster creates shared memory anew), when the state
 * file is to be restored.  Caller holds AddinShmemInitLock.
 */
bool
fs_core_shmem_init(void)
{
	bool		found;
	HASHCTL		info;
	LWLockPadded *locks;

	fs_shared = NULL;
	fs_queue_hash = NULL;
	fs_tenant_hash = NULL;

	locks = GetNamedLWLockTranche("fairshare");
	fs_shared = ShmemInitStruct("fairshare", fs_control_size(), &found);
	if (!found)
	{
		memset(fs_shared, 0, fs_control_size());
		fs_shared->queues_lock = &locks[0].lock;
		fs_shared->tenant_locks = &locks[FS_MISC_LOCKS];
		pg_atomic_init_u32(&fs_shared->limits_generation, 1);
		pg_atomic_init_u64(&fs_shared->next_lease_id, 1);
		pg_atomic_init_u32(&fs_shared->tenant_generation, 0);
		pg_atomic_init_u64(&fs_shared->evict_not_before, 0);
		pg_atomic_init_flag(&fs_shared->evicting);
		pg_atomic_init_u32(&fs_shared->wal_tenants_dirty, 0);
		ConditionVariableInit(&fs_shared->evict_done);
		SpinLockInit(&fs_shared->stats_mutex);
		fs_shared->started_at = GetCurrentTimestamp();
		fs_shared->stats.reset_at = fs_shared->started_at;
	}
	fs_lockstats_name_locks("queues", &locks[0], 1);
	fs_lockstats_name_locks("tenant partition", &locks[FS_MISC_LOCKS], FS_TENANT_PARTITIONS);

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(FsQueueKey);
	info.entrysize = sizeof(FsQueue);
	fs_queue_hash = ShmemInitHash("fairshare queues",
								  fs_max_queues, fs_max_queues,
								  &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(FsTenantKey);
	info.entrysize = sizeof(FsTenant);
	info.hash = fs_tenant_key_hash;
	info.match = fs_tenant_key_match;
	info.num_partitions = FS_TENANT_PARTITIONS;
	fs_tenant_hash = ShmemInitHash("fairshare tenants",
								   fs_max_tenants, fs_max_tenants,
								   &info,
								   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE |
								   HASH_PARTITION | HASH_FIXED_SIZE);
	fs_tenant_scan.lists = fs_scan_lists_init("fairshare tenant lists", FS_TENANT_PARTITIONS);
	fs_tenant_scan.locks = fs_shared->tenant_locks;
	fs_tenant_scan.nparts = FS_TENANT_PARTITIONS;
	fs_tenant_scan.link_offset = offsetof(FsTenant, scan_link);
	fs_scan_cursors_init();
	fs_evict_shmem_init();
	return found;
}

/*
 * Copy the names of this database's queues, by queue id (other databases'
 * queues get ""), for views that print queue ids as names.  The room is
 * made before the lock: queues are only ever added, so the ones counted
 * before it are there under it.
 */
void
fs_queue_names(FsQueueNames *qn)
{
	int			i;

	qn->count = Min(fs_shared->num_queues, fs_max_queues);
	qn->names = palloc0(sizeof(*qn->names) * Max(qn->count, 1));
	LWLockAcquire(fs_shared->queues_lock, LW_SHARED);
	for (i = 0; i < qn->count; i++)
		if (fs_shared->queues[i]->key.dboid == MyDatabaseId)
			strlcpy(qn->names[i], fs_shared->queues[i]->key.name, FS_NAME_BUFLEN);
	LWLockRelease(fs_shared->queues_lock);
}

/* A queue's name from fs_queue_names(), or NULL if not this database's. */
const char *
fs_queue_name_of(const FsQueueNames *qn, uint32 queue_id)
{
	if (queue_id >= (uint32) qn->count || qn->names[queue_id][0] == '\0')
		return NULL;
	return qn->names[queue_id];
}

/* Count one event in the server-wide counters. */
void
fs_count_global(size_t offset)
{
	SpinLockAcquire(&fs_shared->stats_mutex);
	(*(uint64 *) ((char *) &fs_shared->stats + offset))++;
	SpinLockRelease(&fs_shared->stats_mutex);
}

/* ----------------------------------------------------------------
 * Queues
 * ----------------------------------------------------------------
 */

/* Set up a new queue entry.  Caller holds queues_lock exclusively. */
static void
fs_queue_init(FsQueue *queue)
{
	memset((char *) queue + sizeof(FsQueueKey), 0,
		   sizeof(FsQueue) - sizeof(FsQueueKey));
	queue->queue_id = fs_shared->num_queues++;
	pg_atomic_init_u32(&queue->slots_in_use, 0);
	SpinLockInit(&queue->mutex);
	if (fs_queue_init_hook != NULL)
		fs_queue_init_hook(queue);
	fs_shared->queues[queue->queue_id] = queue;
}

/*
 * Create a queue with no lock taken: for restoring state in the postmaster
 * before any backend exists.  Returns NULL when the table is full.
 */
FsQueue *
fs_queue_insert_unlocked(Oid dboid, const char *name)
{
	Assert(!IsUnderPostmaster);
	return fs_queue_enter(dboid, name, false);
}

/*
 * The queue `name` of database `dboid`, entered if missing (the WAL replay
 * names queues so: a queue's id is per server); NULL when the table is
 * full.  `locked`: take queues_lock (not in the postmaster, where nothing
 * else runs yet).
 */
FsQueue *
fs_queue_enter(Oid dboid, const char *name, bool locked)
{
	FsQueueKey	key;
	FsQueue    *queue;
	bool		found;

	memset(&key, 0, sizeof(key));
	key.dboid = dboid;
	strlcpy(key.name, name, sizeof(key.name));
	if (locked)
		LWLockAcquire(fs_shared->queues_lock, LW_EXCLUSIVE);
	queue = hash_search(fs_queue_hash, &key, HASH_ENTER_NULL, &found);
	if (queue != NULL && !found)
		fs_queue_init(queue);
	if (locked)
		LWLockRelease(fs_shared->queues_lock);
	return queue;
}

/*
 * Find (or create) the queue of the current database with the given name.
 * Returns NULL when the queue does not exist and create is false, or when
 * the queue table is full (counted; the caller fails open).
 */
FsQueue *
fs_queue_lookup(const char *name, bool create)
{
	FsQueueKey	key;
	FsQueue    *queue;
	FsLocalQueue *cached;
	bool		found;

	if (fs_local_queues == NULL)
	{
		HASHCTL		info;

		info.keysize = FS_NAME_BUFLEN;
		info.entrysize = sizeof(FsLocalQueue);
		info.hcxt = TopMemoryContext;
		fs_local_queues = hash_create("fairshare local queues", 16, &info,
									  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}

	cached = hash_search(fs_local_queues, name, HASH_FIND, NULL);
	if (cached != NULL)
		return cached->queue;

	memset(&key, 0, sizeof(key));
	key.dboid = MyDatabaseId;
	strlcpy(key.name, name, sizeof(key.name));

	LWLockAcquire(fs_shared->queues_lock, LW_SHARED);
	queue = hash_search(fs_queue_hash, &key, HASH_FIND, NULL);
	LWLockRelease(fs_shared->queues_lock);

	if (queue == NULL && create)
	{
		LWLockAcquire(fs_shared->queues_lock, LW_EXCLUSIVE);
		queue = hash_search(fs_queue_hash, &key, HASH_ENTER_NULL, &found);
		if (queue != NULL && !found)
			fs_queue_init(queue);
		LWLockRelease(fs_shared->queues_lock);
		if (queue == NULL)
			FS_COUNT_GLOBAL(queue_table_full);
	}

	if (queue != NULL)
	{
		cached = hash_search(fs_local_queues, name, HASH_ENTER, NULL);
		cached->queue = queue;
	}
	return queue;
}

/*
 * The queue a tenant entry belongs to.  Queues are never removed and the
 * entry's queue existed before the entry, so no lock is needed.
 */
FsQueue *
fs_queue_of(const FsTenant *entry)
{
	return fs_shared->queues[entry->key.queue_id];
}

/* The queue with the given id (NULL if there is none). */
FsQueue *
fs_queue_by_id(uint32 queue_id)
{
	FsQueue    *queue = NULL;

	LWLockAcquire(fs_shared->queues_lock, LW_SHARED);
	if (queue_id < (uint32) fs_shared->num_queues)
		queue = fs_shared->queues[queue_id];
	LWLockRelease(fs_shared->queues_lock);
	return queue;
}

/* ----------------------------------------------------------------
 * Tenants
 * ----------------------------------------------------------------
 */

/* The hash key of (queue, tenant), zero-padded (keys are compared as written). */
void
fs_tenant_key_init(FsTenantKey *key, uint32 queue_id, const char *tenant)
{
	memset(key, 0, sizeof(*key));
	key->queue_id = queue_id;
	strlcpy(key->tenant, tenant, sizeof(key->tenant));
}

/*
 * A generation for an entry being created or recycled: never 0, so that 0
 * can stand for "none".  It wraps after four billion entries, long after
 * anything that remembered an old one has let go of it.
 */
static uint32
fs_tenant_next_generation(void)
{
	uint32		generation;

	do
		generation = pg_atomic_add_fetch_u32(&fs_shared->tenant_generation, 1);
	while (generation == 0);
	return generation;
}

/*
 * Set up a tenant entry just entered: a new generation, no slots, the
 * built-in limits until its own load (its bucket fills then), touched now.
 */
static void
fs_tenant_init(FsTenant *entry, TimestampTz now)
{
	memset((char *) entry + sizeof(FsTenantKey), 0,
		   sizeof(FsTenant) - sizeof(FsTenantKey));
	SpinLockInit(&entry->mutex);
	entry->flags = FS_TENANT_NEW;
	entry->generation = fs_tenant_next_generation();
	entry->limits_generation = 0;	/* never current: limits load on first use */
	entry->budget_ms_per_minute = -1;
	entry->weight = 1.0;
	entry->max_slots = 1;
	entry->throttle = 1.0;
	entry->touched_at = now;
	entry->earliest_expiry = DT_NOEND;
	entry->heap_index = -1;		/* in no fair order (nobody else sees it yet) */
	/* New: a standby learns of it at the WAL writer's next cycle. */
	fs_tenant_changed(entry);
}

/*
 * Bring an entry's time-dependent state up to `now`: the token bucket
 * accrues and the served work decays for the time since the last decision.
 * Call with the entry's spinlock held, before deciding anything for it.
 */
void
fs_tenant_touch(FsTenant *entry, TimestampTz now)
{
	if (now > entry->touched_at)
	{
		fs_budget_accrue(entry, now);
		if (entry->served_ms > 0)
			entry->served_ms = fs_served_decayed(entry->served_ms, entry->touched_at, now);
		entry->touched_at = now;
		fs_tenant_changed(entry);
	}
}

/*
 * Give a restored entry (just entered, seen by no one else yet) the saved
 * state of `saved`: its counters, balance, fair-order tag, served work and
 * last limits (kept until its own load).  Saved values are checked as well
 * as where they came from: each is kept in range, and a time outside
 * [oldest, now] becomes now.  Slots come back with leases; backlogs are
 * recounted from the tables.
 */
void
fs_tenant_restore(FsTenant *entry, const FsTenant *saved, TimestampTz oldest,
				  TimestampTz now)
{
	fs_tenant_lock(entry);
	entry->token_balance = saved->token_balance;
	if (isnan(entry->token_balance) || isinf(entry->token_balance))
	{
		/* Unknown balance: refill when the limits load, like a new tenant. */
		entry->token_balance = 0;
		entry->flags |= FS_TENANT_NEW;
	}
	entry->touched_at = saved->touched_at;
	if (entry->touched_at > now || entry->touched_at < oldest)
		entry->touched_at = now;
	entry->virtual_finish = saved->virtual_finish;
	if (isnan(entry->virtual_finish) || isinf(entry->virtual_finish))
		entry->virtual_finish = 0;
	memcpy(entry->decisions, saved->decisions, sizeof(entry->decisions));
	entry->leases_expired = saved->leases_expired;
	entry->failed_to_deliver = saved->failed_to_deliver;
	entry->served_ms = saved->served_ms;
	if (isnan(entry->served_ms) || isinf(entry->served_ms) || entry->served_ms < 0)
		entry->served_ms = 0;
	entry->max_slots = Max(saved->max_slots, 0);
	entry->min_slots = Min(Max(saved->min_slots, 0), entry->max_slots);
	entry->weight = saved->weight;
	if (!(entry->weight > 0) || isinf(entry->weight))
		entry->weight = 1.0;
	entry->budget_ms_per_minute = saved->budget_ms_per_minute;
	if (isnan(entry->budget_ms_per_minute) || isinf(entry->budget_ms_per_minute) ||
		entry->budget_ms_per_minute < 0)
		entry->budget_ms_per_minute = -1;
	entry->throttle = saved->throttle;
	if (!(entry->throttle >= 0 && entry->throttle <= 1))
		entry->throttle = 1.0;
	fs_tenant_changed(entry);
	fs_tenant_unlock(entry);
}

/*
 * Look up (and optionally create) the entry of `tenant` in `queue`, with its
 * limits current.  On success the entry's partition lock is held (release it
 * with fs_tenant_close()) and ref->limits holds the limits to decide with.
 *
 * Returns NULL, holding nothing, when the entry does not exist and
 * FS_OPEN_CREATE is not given, when the table is full and nothing can be
 * evicted, or when fs_limits cannot be read (both counted: the caller fails
 * open).
 *
 * Limits are cached in the entry together with the generation they were
 * loaded at.  When they are stale we let go of every lock, load them with
 * SPI (fs_limits_resolve_hook: limits/limits.c), and store them on the way back in.  With
 * FS_OPEN_NO_LIMITS (for code that may not run SPI, such as transaction-end
 * callbacks) stale limits are handed back as they are and left for the next
 * decision.
 */
FsTenant *
fs_tenant_open(FsQueue *queue, const char *tenant, int flags, FsTenantRef *ref)
{
	bool		create = (flags & FS_OPEN_CREATE) != 0;
	FsTenantKey key;
	uint32		hashvalue;
	LWLock	   *lock;
	FsTenant   *entry;
	bool		found;
	bool		evicted = false;
	bool		resolved = false;
	uint32		generation = 0;

	fs_tenant_key_init(&key, queue->queue_id, tenant);
	hashvalue = get_hash_value(fs_tenant_hash, &key);
	lock = fs_tenant_partition_lock(hashvalue);

	for (;;)
	{
		LWLockAcquire(lock, LW_SHARED);
		entry = hash_search_with_hash_value(fs_tenant_hash, &key, hashvalue,
											HASH_FIND, NULL);
		if (entry == NULL && create)
		{
			LWLockRelease(lock);
			LWLockAcquire(lock, LW_EXCLUSIVE);
			entry = hash_search_with_hash_value(fs_tenant_hash, &key, hashvalue,
												HASH_ENTER_NULL, &found);
			if (entry == NULL)
			{
				LWLockRelease(lock);
				if (!evicted)
				{
					/* Full: evict idle entries once, then try again. */
					evicted = true;
					fs_tenant_evict(fs_now());
					continue;
				}
				FS_COUNT_GLOBAL(tenant_table_full);
				return NULL;
			}
			if (!found)
			{
				fs_tenant_init(entry, fs_now());
				fs_scan_list_add(&fs_tenant_scan, fs_tenant_partition(hashvalue), &entry->scan_link);
				SpinLockAcquire(&queue->mutex);
				queue->tenants++;
				SpinLockRelease(&queue->mutex);
			}
		}
		if (entry == NULL)
		{
			LWLockRelease(lock);
			return NULL;
		}

		fs_tenant_lock(entry);
		if (fs_limits_current(entry) || (flags & FS_OPEN_NO_LIMITS))
			fs_limits_copy_out(entry, &ref->limits);
		else if (resolved)
			fs_limits_store(entry, &ref->limits, generation);	/* loaded just now */
		else
		{
			fs_tenant_unlock(entry);
			LWLockRelease(lock);
			if (fs_limits_resolve_hook == NULL ||
				!fs_limits_resolve_hook(queue, tenant, &ref->limits, &generation))
			{
				/* Limits unreadable: the caller fails open. */
				FS_COUNT_GLOBAL(limits_unreadable);
				return NULL;
			}
			resolved = true;
			continue;
		}
		fs_tenant_unlock(entry);

		ref->entry = entry;
		ref->partition_lock = lock;
		return entry;
	}
}

/* fs_tenant_open() that never runs SPI: stale limits are returned as cached. */
FsTenant *
fs_tenant_open_cached(FsQueue *queue, const char *tenant, bool create, FsTenantRef *ref)
{
	return fs_tenant_open(queue, tenant,
						  FS_OPEN_NO_LIMITS | (create ? FS_OPEN_CREATE : 0), ref);
}

/* Let go of what fs_tenant_open() holds (the entry's partition lock). */
void
fs_tenant_close(FsTenantRef *ref)
{
	if (ref->partition_lock != NULL)
		LWLockRelease(ref->partition_lock);
	ref->partition_lock = NULL;
	ref->entry = NULL;
}

/*
 * Insert an entry with no lock taken: for restoring state in the postmaster
 * before any backend exists.  Returns NULL when the table is full.
 */
FsTenant *
fs_tenant_insert_unlocked(const FsTenantKey *key)
{
	FsTenant   *entry;
	bool		found;
	FsQueue    *queue;
	uint32		hashvalue = get_hash_value(fs_tenant_hash, key);

	Assert(!IsUnderPostmaster);
	entry = hash_search_with_hash_value(fs_tenant_hash, key, hashvalue, HASH_ENTER_NULL, &found);
	if (entry != NULL && !found)
	{
		fs_tenant_init(entry, GetCurrentTimestamp());
		fs_scan_list_add(&fs_tenant_scan, fs_tenant_partition(hashvalue), &entry->scan_link);
		entry->flags = 0;
		queue = fs_shared->queues[key->queue_id];
		queue->tenants++;
	}
	return entry;
}

/* fs_tenant_foreach()'s state: the caller's visitor and its argument. */
typedef struct FsTenantVisit
{
	fs_tenant_visitor visitor;
	fs_tenant_mutator mutator;
	void	   *arg;
	bool		all;			/* fs_tenant_foreach_for_wal(): every entry */
	fs_scan_pause pause;		/* fs_tenant_foreach_for_wal(): between batches */
} FsTenantVisit;

/* fs_scan_table() visitor of fs_tenant_foreach(): hand on a copy. */
static void
fs_tenant_visit_copy(void *hash_entry, void *arg)
{
	FsTenant   *entry = (FsTenant *) hash_entry;
	FsTenantVisit *visit = (FsTenantVisit *) arg;
	FsTenant	copy;

	fs_tenant_lock(entry);
	memcpy(&copy, entry, sizeof(FsTenant));
	fs_tenant_unlock(entry);
	visit->visitor(&copy, visit->arg);
}

/*
 * Call `visitor` with a copy of every tenant entry (taken under its
 * spinlock), a batch at a time (rule 3a): the partition locks are held in
 * shared mode for one batch, which never blocks a decision for an existing
 * tenant and holds up a new tenant for one batch at most.  The visitor must
 * be quick and must not fail, block or take fairshare locks: copy, and do
 * the work afterwards.
 */
void
fs_tenant_foreach(fs_tenant_visitor visitor, void *arg)
{
	FsTenantVisit visit = {visitor, NULL, arg, false, NULL};

	fs_scan_table(&fs_tenant_scan, fs_tenant_visit_copy, &visit);
}

/*
 * fs_scan_table() visitor of fs_tenant_foreach_for_wal(): hand on a copy of
 * each entry marked for the WAL writer (each, for a complete picture), and
 * clear the mark in the same spinlock section as the copy.
 */
static void
fs_tenant_visit_for_wal(void *hash_entry, void *arg)
{
	FsTenant   *entry = (FsTenant *) hash_entry;
	FsTenantVisit *visit = (FsTenantVisit *) arg;
	bool		take;
	FsTenant	copy;

	fs_tenant_lock(entry);
	take = visit->all || (entry->flags & FS_TENANT_WAL_DIRTY);
	if (take)
	{
		entry->flags &= ~FS_TENANT_WAL_DIRTY;
		memcpy(&copy, entry, sizeof(FsTenant));
	}
	fs_tenant_unlock(entry);
	if (take)
		visit->visitor(&copy, visit->arg);
}

/* Between two batches of fs_tenant_foreach_for_wal(): the caller's pause. */
static void
fs_tenant_visit_pause(void *arg)
{
	FsTenantVisit *visit = (FsTenantVisit *) arg;

	visit->pause(visit->arg);
}

/*
 * The WAL writer's view of the tenant table: a copy of every entry changed
 * since it last looked (or of every entry, with `all`), each handed on once
 * with its mark cleared, a batch at a time as fs_tenant_foreach() does, and
 * `pause` called between batches with no lock held.  The flag that says
 * some entry changed is cleared first, so that a change made during the
 * scan is seen by this scan or flagged for the next.
 */
void
fs_tenant_foreach_for_wal(fs_tenant_visitor visitor, fs_scan_pause pause, void *arg, bool all)
{
	FsTenantVisit visit = {visitor, NULL, arg, all, pause};

	pg_atomic_write_u32(&fs_shared->wal_tenants_dirty, 0);
	pg_memory_barrier();
	fs_scan_table_paused(&fs_tenant_scan, fs_tenant_visit_for_wal, fs_tenant_visit_pause, &visit);
}

/*
 * Give an entry the state the primary logged for it (WAL replay, in the
 * startup process): its balance, counters, fair-order tag, backlog and
 * last limits (kept until its own load after a promotion: the entry's
 * limits_generation stays stale).  Slots come with leases; `saved` comes
 * from a record that was checked field by field, and is kept in range as
 * a restored entry is.  The one write of virtual_finish outside its queue's
 * fair-order lock (rule 8): nothing claims during recovery, and the
 * caller puts the entry in its place in the fair order right after
 * (fs_fair_replay_tenant()).  The entry is marked as named by the
 * snapshot being replayed (fs_tenant_replay_unnamed()).
 */
void
fs_tenant_replay(FsTenant *entry, const FsTenant *saved)
{
	TimestampTz now = GetCurrentTimestamp();

	fs_tenant_restore(entry, saved, now - INT64CONST(3660) * USECS_PER_DAY,
					  Max(now, saved->touched_at));
	fs_tenant_lock(entry);
	entry->ready_rows = saved->ready_rows;
	entry->flags = (entry->flags & ~FS_TENANT_DRY) | (saved->flags & FS_TENANT_DRY);
	if (!(saved->flags & FS_TENANT_NEW))
		entry->flags &= ~FS_TENANT_NEW;
	entry->flags |= FS_TENANT_REPLAY_MARK;
	fs_tenant_changed(entry);
	fs_tenant_unlock(entry);
}

/* fs_scan_table() visitor of fs_tenant_mutate_all(): under the spinlock. */
static void
fs_tenant_visit_mutate(void *hash_entry, void *arg)
{
	FsTenant   *entry = (FsTenant *) hash_entry;
	FsTenantVisit *visit = (FsTenantVisit *) arg;

	fs_tenant_lock(entry);
	visit->mutator(entry, visit->arg);
	fs_tenant_unlock(entry);
}

/*
 * Apply `mutator` to every entry, under the entry's spinlock (so it must be
 * short and must not fail), a batch at a time as fs_tenant_foreach() does.
 * Used by reset.
 */
void
fs_tenant_mutate_all(fs_tenant_mutator mutator, void *arg)
{
	FsTenantVisit visit = {NULL, mutator, arg, false, NULL};

	fs_scan_table(&fs_tenant_scan, fs_tenant_visit_mutate, &visit);
}

/* fs_tenant_mutate_all() mutator: the entry is not named by a snapshot yet. */
static void
fs_tenant_unmark(FsTenant *entry, void *arg pg_attribute_unused())
{
	entry->flags &= ~FS_TENANT_REPLAY_MARK;
}

/*
 * WAL replay: a complete snapshot begins, and no entry is named by it yet
 * (whatever an earlier snapshot, perhaps cut short, marked).
 */
void
fs_tenant_replay_unmark_all(void)
{
	fs_tenant_mutate_all(fs_tenant_unmark, NULL);
}

/* What fs_tenant_replay_unnamed() collects. */
typedef struct FsUnnamed
{
	FsTenantKey *keys;
	int			count;
	int			capacity;
} FsUnnamed;

/* fs_tenant_foreach() visitor: note an entry that no record has named. */
static void
fs_tenant_collect_unnamed(const FsTenant *copy, void *arg)
{
	FsUnnamed  *unnamed = (FsUnnamed *) arg;

	if (!(copy->flags & FS_TENANT_REPLAY_MARK) && unnamed->count < unnamed->capacity)
		unnamed->keys[unnamed->count++] = copy->key;
}

/*
 * WAL replay, at the end of a complete snapshot: the keys of the entries it
 * did not name (the primary no longer has them), in a palloc'd array, and
 * how many in *count; NULL when that memory cannot be had (the startup
 * process must not fail for it).
 */
FsTenantKey *
fs_tenant_replay_unnamed(int *count)
{
	FsUnnamed	unnamed;

	unnamed.capacity = fs_max_tenants;
	unnamed.count = 0;
	unnamed.keys = palloc_extended(sizeof(FsTenantKey) * Max(fs_max_tenants, 1),
								   MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM);
	if (unnamed.keys == NULL)
		return NULL;
	fs_tenant_foreach(fs_tenant_collect_unnamed, &unnamed);
	*count = unnamed.count;
	return unnamed.keys;
}

/* Is there an entry for `key` now?  (Its partition lock, shared, briefly.) */
bool
fs_tenant_exists(const FsTenantKey *key)
{
	uint32		hashvalue = get_hash_value(fs_tenant_hash, key);
	LWLock	   *lock = fs_tenant_partition_lock(hashvalue);
	bool		found;

	LWLockAcquire(lock, LW_SHARED);
	found = hash_search_with_hash_value(fs_tenant_hash, key, hashvalue, HASH_FIND, NULL) != NULL;
	LWLockRelease(lock);
	return found;
}

/*
 * Number of tenant entries.  Read without the partition locks (as
 * fs_lease_count() does): entries entered or removed at this instant may
 * or may not be counted, which is all a view can say anyway.
 */
long
fs_tenant_count(void)
{
	return hash_get_num_entries(fs_tenant_hash);
}

#ifdef FS_DEBUG
/* See fs_tenant_changed(). */
const char *fs_tenant_broken = NULL;

/*
 * Raise the invariant a change of a tenant entry broke (noted under its
 * spinlock by fs_tenant_changed(), raised once the spinlock is let go).
 */
void
fs_tenant_report_broken(const char *file, int line)
{
	const char *what = fs_tenant_broken;

	fs_tenant_broken = NULL;
	fs_invariant_failed(what, file, line);
}

/*
 * The debug build's check of one tenant entry and its queue after a
 * decision (never under a lock of the caller's): what every change checks
 * (fs_tenant_invalid()), and, right after a touch, a balance within its
 * bounds.  Reads without SPI (stale limits are fine).
 */
void
fs_debug_check_tenant(FsQueue *queue, const char *tenant)
{
	FsTenantRef ref;
	FsTenant   *entry;
	FsTenant	copy;
	const char *broken;

	if (queue == NULL)
		return;
	FS_INVARIANT(pg_atomic_read_u32(&queue->slots_in_use) <= (uint32) PG_INT32_MAX);
	entry = fs_tenant_open(queue, tenant, FS_OPEN_NO_LIMITS, &ref);
	if (entry == NULL)
		return;
	fs_tenant_lock(entry);
	memcpy(&copy, entry, sizeof(copy));
	fs_tenant_unlock(entry);
	fs_tenant_close(&ref);

	broken = fs_tenant_invalid(&copy);
	if (broken != NULL)
		fs_invariant_failed(broken, __FILE__, __LINE__);
	if (copy.budget_ms_per_minute >= 0)
		FS_INVARIANT(copy.token_balance >=
					 -FS_BUDGET_MAX_DEBT_MINUTES * copy.budget_ms_per_minute - 1e-6);
}
#endif

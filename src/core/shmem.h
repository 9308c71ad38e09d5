/*-------------------------------------------------------------------------
 *
 * shmem.h
 *	  fairshare's shared state: queues, (queue, tenant) entries, and the
 *	  control structure.  The locking rules are written once, at the top of
 *	  shmem.c; read them before touching anything declared here.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_SHMEM_H
#define FAIRSHARE_SHMEM_H

#include "core/common.h"
#include "core/scanlist.h"

#include "access/transam.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/condition_variable.h"
#include "storage/spin.h"
#include "utils/hsearch.h"

/* Partitions of the shared tables; powers of two. */
#define FS_TENANT_PARTITIONS	128

/*
 * The core's LWLock tranche, "fairshare": FS_MISC_LOCKS named locks (the
 * queue table's), then the tenant partitions.  Each layer above asks for a
 * tranche of its own.
 */
#define FS_MISC_LOCKS			1

/*
 * A queue, per database.  Queues are created on first use and live until
 * the server stops (they are few: fairshare.max_queues).  Their addresses
 * never change, so backends cache pointers to them.
 */
typedef struct FsQueueKey
{
	Oid			dboid;
	char		name[FS_NAME_BUFLEN];
} FsQueueKey;

typedef struct FsQueue
{
	FsQueueKey	key;			/* hash key: must be first */
	uint32		queue_id;		/* index in FsShared->queues, stable */
	pg_atomic_uint32 slots_in_use;	/* all tenants' slots (busy worker threads) */
	slock_t		mutex;			/* protects the fields below */
	uint64		tenants;		/* tenant entries of this queue */
	/* global gate (gate.c) */
	int32		live_threads;	/* threads of workers with a recent heartbeat */
	int32		live_workers;
	TimestampTz live_until;		/* when the first of them drops out */
	float8		latency_ms;		/* last reported queue latency */
	TimestampTz latency_at;		/* when it was reported */
} FsQueue;

/*
 * A (queue, tenant) entry.  Everything fairshare decides for a tenant is
 * kept here; it is meant to stay within 240 bytes so that an entry with the
 * hash table's own element header (16 bytes) fits in 256 (checked at compile
 * time in shmem.c).
 */
typedef struct FsTenantKey
{
	uint32		queue_id;
	char		tenant[FS_NAME_BUFLEN];
} FsTenantKey;

/*
 * max_slots of a tenant of a queue registered for fair dequeue without
 * max_slots, that no row of fs_limits gives one: no limit.  The views show
 * it as NULL.
 */
#define FS_NO_SLOT_LIMIT		PG_INT32_MAX

/* Effective limits of a tenant, after falling back on the defaults. */
typedef struct FsLimits
{
	int32		max_slots;		/* FS_NO_SLOT_LIMIT: none */
	int32		min_slots;
	float8		weight;
	float8		budget_ms_per_minute;	/* < 0: no budget (unlimited) */
	float8		throttle;		/* throttle_pct / 100, in [0, 1] */
} FsLimits;

/*
 * A (queue, tenant) entry.  Its size is budgeted: at most 256 bytes (272 with
 * the hash table's element header; README.md's target is 288 bytes per entry
 * with the table's overhead), because a server keeps fairshare.max_tenants of
 * them and a decision touches one per call, so every field costs memory and
 * cache for every tenant.  shmem.c asserts the budget.  A field added here is
 * added to the state file by its own field id (statefile/records.c), never by
 * the struct's layout.
 */
typedef struct FsTenant
{
	FsTenantKey key;			/* hash key: must be first */
	slock_t		mutex;			/* protects everything below but
								 * heap_index */
	uint8		flags;
	uint16		orphan_leases;	/* leases restored after a crash, not yet
								 * renewed: they pin the entry */
	int32		slots_in_use;	/* live leases (and leases being released) */
	uint32		limits_generation;	/* of the cached limits below */
	int32		max_slots;
	int32		min_slots;
	float8		weight;
	float8		budget_ms_per_minute;
	float8		throttle;
	float8		token_balance;	/* exact as of touched_at */
	TimestampTz touched_at;		/* last decision; see fs_tenant_touch() */
	TimestampTz earliest_expiry;	/* no live lease expires before this */
	float8		virtual_finish; /* fair order: finish tag of the last claim */
	int64		ready_rows;		/* fair dequeue backlog */
	uint64		decisions[FS_NUM_TENANT_REASONS];
	uint64		leases_expired;
	uint64		failed_to_deliver;
	float8		served_ms;		/* work served, for fairness metrics */
	FullTransactionId backlog_fxid; /* the newest transaction whose commit
									 * added ready rows: a claim whose snapshot
									 * may not see it does not mark the tenant
									 * dry (fairq/order.c) */
	uint32		generation;		/* new for every entry created or recycled:
								 * what remembers a pointer to the entry
								 * across a lock release keeps this too, and
								 * a mismatch means the entry was reused */
	/* Not under `mutex`: under the fair-order lock of the entry's queue. */
	int32		heap_index;		/* with FS_TENANT_QUEUED: its position in
								 * the queue's fair order (fairq/order.c) */
	/* Under the entry's partition lock EXCLUSIVE: its partition's list. */
	dlist_node	scan_link;		/* scanlist.h */
} FsTenant;

/* FsTenant.flags */
#define FS_TENANT_NEW			0x01	/* created by this decision */
#define FS_TENANT_QUEUED		0x02	/* listed in its queue's fair order
										 * (fairq/order.c): pins the entry */
#define FS_TENANT_DRY			0x04	/* its last claim found fewer rows than
										 * counted: skipped for a while */
#define FS_TENANT_WAL_DIRTY		0x08	/* changed since the WAL writer last
										 * logged it (fs_tenant_changed()) */
#define FS_TENANT_REPLAY_MARK	0x10	/* on a standby: named by the complete
										 * snapshot being replayed */

/* Counters kept for the whole server, under FsShared->stats_mutex. */
typedef struct FsGlobalStats
{
	uint64		fail_open;		/* decisions granted without state */
	uint64		evictions;		/* idle tenant entries evicted */
	uint64		eviction_passes;
	uint64		tenant_table_full;	/* lookups that found no free entry */
	uint64		limits_unreadable;	/* decisions made without fs_limits */
	uint64		queue_table_full;
	uint64		lease_table_full;
	uint64		leases_expired;
	uint64		leases_orphaned;	/* restored after a crash */
	uint64		leases_reregistered;	/* orphans renewed after a crash */
	TimestampTz reset_at;
} FsGlobalStats;

/* How the state in shared memory began. */
typedef enum FsStartKind
{
	FS_START_FRESH = 0,			/* no state file: a first start */
	FS_START_RESTORED,			/* restored after a clean shutdown */
	FS_START_AFTER_CRASH,		/* the last run did not shut down cleanly */
	FS_START_REPLAYED			/* state replayed from WAL: after a crash, or
								 * a standby promoted */
} FsStartKind;

typedef struct FsShared
{
	LWLock	   *queues_lock;	/* the queue table */
	LWLockPadded *tenant_locks; /* FS_TENANT_PARTITIONS of them */

	pg_atomic_uint32 limits_generation; /* bumped when fs_limits commits */
	pg_atomic_uint64 next_lease_id;
	pg_atomic_uint32 tenant_generation; /* the last FsTenant.generation */
	pg_atomic_uint64 evict_not_before;	/* no eviction pass before this time */
	pg_atomic_flag evicting;	/* an eviction pass runs: one at a time */
	pg_atomic_uint32 wal_tenants_dirty; /* some entry became WAL-dirty since
										 * the WAL writer last looked */
	ConditionVariable evict_done;	/* broadcast when a pass ends */

	FsStartKind start_kind;
	TimestampTz started_at;

	slock_t		stats_mutex;
	FsGlobalStats stats;

	int			num_queues;		/* under queues_lock */
	FsQueue    *queues[FLEXIBLE_ARRAY_MEMBER];	/* by queue_id */
} FsShared;

extern FsShared *fs_shared;

/*
 * What fs_tenant_open() hands back: the entry, the partition lock the caller
 * now holds, and a copy of the effective limits to decide with.
 */
typedef struct FsTenantRef
{
	FsTenant   *entry;
	LWLock	   *partition_lock;
	FsLimits	limits;
} FsTenantRef;

typedef void (*fs_tenant_visitor) (const FsTenant *copy, void *arg);
/* WAL replay: this server's queue for a record's queue index (or NULL). */
typedef FsQueue *(*fs_queue_of_index) (uint32 index, void *arg);
typedef void (*fs_tenant_mutator) (FsTenant *entry, void *arg);

/*
 * The calls the core makes upwards, as hooks that module.c sets: the core
 * includes no layer above it.
 *
 * fs_queue_init_hook: a queue was just created (queues_lock held
 * exclusively, or in the postmaster with nothing running): set up the
 * layers' fields of it (the global gate's).
 *
 * fs_tenant_evictable_hook: may this otherwise idle entry be forgotten?
 * (The fair order's say; entry spinlock held: quick, no lock, no error.)
 *
 * fs_limits_resolve_hook: load the limits of (queue, tenant) from fs_limits
 * with the generation they are current at; false when they cannot be read
 * (the decision fails open).  Called with no fairshare lock held; may run
 * SQL.  Unset, every decision fails open.
 */
typedef void (*fs_queue_init_hook_type) (FsQueue *queue);
typedef bool (*fs_tenant_evictable_hook_type) (const FsTenant *entry);
typedef bool (*fs_limits_resolve_hook_type) (FsQueue *queue, const char *tenant,
											 FsLimits *out, uint32 *generation);

extern fs_queue_init_hook_type fs_queue_init_hook;
extern fs_tenant_evictable_hook_type fs_tenant_evictable_hook;
extern fs_limits_resolve_hook_type fs_limits_resolve_hook;

/* A copy of the queue table: id -> name, for this database only. */
typedef struct FsQueueNames
{
	int			count;
	char	  (*names)[FS_NAME_BUFLEN];	/* "" for other databases' queues */
} FsQueueNames;

/* shmem.c */
extern void fs_queue_names(FsQueueNames *qn);
extern const char *fs_queue_name_of(const FsQueueNames *qn, uint32 queue_id);
extern void fs_core_shmem_request(void);
extern bool fs_core_shmem_init(void);
extern FsQueue *fs_queue_lookup(const char *name, bool create);
extern FsQueue *fs_queue_by_id(uint32 queue_id);
extern FsQueue *fs_queue_insert_unlocked(Oid dboid, const char *name);
extern FsQueue *fs_queue_enter(Oid dboid, const char *name, bool locked);
extern void fs_tenant_key_init(FsTenantKey *key, uint32 queue_id, const char *tenant);
/* fs_tenant_open() flags */
#define FS_OPEN_CREATE		0x01	/* create the entry if it is missing */
#define FS_OPEN_NO_LIMITS	0x02	/* find only: no limits refresh (no SPI) */

extern FsTenant *fs_tenant_open(FsQueue *queue, const char *tenant, int flags,
								FsTenantRef *ref);
extern FsTenant *fs_tenant_open_cached(FsQueue *queue, const char *tenant, bool create,
									   FsTenantRef *ref);
extern void fs_tenant_close(FsTenantRef *ref);
extern FsTenant *fs_tenant_insert_unlocked(const FsTenantKey *key);
extern void fs_tenant_touch(FsTenant *entry, TimestampTz now);
extern void fs_tenant_restore(FsTenant *entry, const FsTenant *saved, TimestampTz oldest,
							  TimestampTz now);
extern void fs_tenant_may_be_idle(void);
extern void fs_tenant_foreach(fs_tenant_visitor visitor, void *arg);
extern void fs_tenant_foreach_for_wal(fs_tenant_visitor visitor, fs_scan_pause pause,
									  void *arg, bool all);
extern void fs_tenant_replay(FsTenant *entry, const FsTenant *saved);
extern void fs_tenant_replay_unmark_all(void);
extern FsTenantKey *fs_tenant_replay_unnamed(int *count);
extern bool fs_tenant_exists(const FsTenantKey *key);
/* evict.c */
extern bool fs_tenant_drop(const FsTenantKey *key);
extern int	fs_tenants_gone_room(void);
extern int	fs_tenants_gone_drain(FsTenantKey *keys, bool *overflow);
extern void fs_tenant_mutate_all(fs_tenant_mutator mutator, void *arg);
extern long fs_tenant_count(void);
extern void fs_count_global(size_t offset);
extern Size fs_tenant_entry_bytes(void);
extern FsQueue *fs_queue_of(const FsTenant *entry);

/* The debug build's checks after a decision (no-ops otherwise). */
#ifdef FS_DEBUG
extern void fs_debug_check_tenant(FsQueue *queue, const char *tenant);
#define FS_DEBUG_CHECK_TENANT(queue, tenant) fs_debug_check_tenant(queue, tenant)
#else
#define FS_DEBUG_CHECK_TENANT(queue, tenant) ((void) 0)
#endif

/*
 * Take `n` slots off a queue's count, never below zero: a count that went
 * below zero would wrap to four billion busy threads and hold the queue in
 * backpressure until restart.
 */
static inline void
fs_queue_slots_sub(FsQueue *queue, uint32 n)
{
	uint32		old = pg_atomic_read_u32(&queue->slots_in_use);

	while (!pg_atomic_compare_exchange_u32(&queue->slots_in_use, &old, old - Min(old, n)))
		;
}

#define FS_COUNT_GLOBAL(field) fs_count_global(offsetof(FsGlobalStats, field))

#endif							/* FAIRSHARE_SHMEM_H */

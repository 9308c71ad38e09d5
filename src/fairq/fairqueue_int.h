/*-------------------------------------------------------------------------
 *
 * fairqueue_int.h
 *	  Fair dequeue, inside: the declarations its files share.
 *
 *	  order.c               the fair order in shared memory (each queue's
 *	                        heap of backlogged tenants), backlog changes as
 *	                        commits apply them; how fair dequeue works
 *	  plan.c                planning a claim under the queue's lock
 *	  claim.c               fs_claim() and fs_ready_tenants()
 *	  route.c               fs_claim() on a Citus coordinator: claims
 *	                        shared among the worker nodes in fair order
 *	  recount.c             recounting backlogs from the table (fs_resync)
 *	  metrics.c             fs_fairness and fs_fair_shares
 *	  saved.c               fair dequeue's sections of the state file
 *	  register.c  fs_register_queue() and fs_unregister_queue():
 *	                        who may, the row in fs_fair_queues, the triggers
 *	  register_parse.c      the SQL pieces a queue is defined by: parsed,
 *	                        checked, and the index a claim uses
 *	  register_cache.c      the per-backend caches of registrations (by
 *	                        queue, and by relation for the row triggers)
 *	                        (register_int.h is what these three share)
 *	  explain.c             fs_explain_wait(): why a ready row waits
 *	  track.c     the triggers: backlog deltas applied at commit,
 *	                        what a claim undoes at rollback
 *	  claim_map.c           the claim map (claimed row -> lease) that
 *	                        releases leases automatically
 *	  subkeys.c             the second level of fair order: each tenant's
 *	                        sub-keys, their backlogs and their order
 *	  probe_start.c         where a claim's probe of a busy tenant's rows
 *	                        starts: past the index entries of rows gone
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_FAIRQUEUE_INT_H
#define FAIRSHARE_FAIRQUEUE_INT_H

#include <math.h>

#include "executor/executor.h"
#include "executor/spi.h"
#include "lib/pairingheap.h"
#include "utils/array.h"
#include "utils/relcache.h"

#include "core/run_as.h"
#include "fairq/fairqueue.h"
#include "gate/gate.h"

/*
 * Heap entries are kept in chunks of this many (a power of two), found
 * through a radix directory whose nodes hold this many ids each (also a
 * power of two), at most FS_HEAP_MAX_DEPTH nodes deep: up to 2^32 items.
 * fairqueue.c explains the layout and proves the pools' sizes.
 */
#define FS_HEAP_CHUNK_SHIFT		4
#define FS_HEAP_CHUNK			(1 << FS_HEAP_CHUNK_SHIFT)
#define FS_HEAP_FANOUT_SHIFT	7
#define FS_HEAP_FANOUT			(1 << FS_HEAP_FANOUT_SHIFT)
#define FS_HEAP_MAX_DEPTH		4

/* Partitions of the claim map; a power of two. */
#define FS_CLAIM_PARTITIONS		32

/* Most rows one fs_claim() call may ask for. */
#define FS_CLAIM_MAX_ROWS		10000

/* A tenant whose claim came back short is not probed again for this long. */
#define FS_DRY_RETRY_USECS		USECS_PER_SEC

/* How often claims measure a queue's latency (enqueued_at), at most. */
#define FS_LATENCY_SAMPLE_USECS	USECS_PER_SEC

/* A row's cost is clamped to this range; NULL or NaN costs 1. */
#define FS_MIN_COST				0.001
#define FS_MAX_COST				1e9

/* Row keys up to this many bytes are kept exactly, longer ones hashed. */
#define FS_KEY_INLINE			16

/*
 * One backlogged tenant in its queue's fair order: a binary min-heap on the
 * tenant's virtual finish tag.  `key` always equals the tenant's
 * virtual_finish (both are written under the queue's lock).
 *
 * `listed_xid`: the transaction whose commit last made the tenant's count
 * go from none to some ready rows: a claim whose snapshot does not see it
 * cannot see those rows, and leaves them to the claims that can
 * (fs_plan_sees_listing()).  InvalidTransactionId once a claim gave rows
 * back (they may be older, and seen by every snapshot), and when anything
 * else put the tenant in the order (a recount, a standby's replay); a
 * recount that finds rows keeps it.  Its 32 bits are read in the epoch that
 * puts it at or before the tenant's newest adder (FsTenant.backlog_fxid),
 * which is never before it.  Such a change of the count is made under the
 * queue's lock, with the item's.
 */
typedef struct FsHeapItem
{
	float8		key;
	FsTenant   *tenant;			/* pinned by FS_TENANT_QUEUED */
	TimestampTz dry_until;		/* with FS_TENANT_DRY: skipped until then */
	int32		min_slots;		/* cached, for the guaranteed floor */
	TransactionId listed_xid;
} FsHeapItem;

/*
 * A node of a heap's directory: the ids of the chunks (at the lowest level)
 * or of the nodes of the level below.  A free node links the free list
 * through ids[0].
 */
typedef struct FsHeapDirNode
{
	int32		ids[FS_HEAP_FANOUT];
} FsHeapDirNode;

/* Per-queue counters (fs_fairness), zeroed by fs_reset(). */
typedef struct FsFairCounters
{
	uint64		claims;			/* fs_claim() calls */
	uint64		rows_claimed;
	uint64		rows_released;	/* leases released by the running table */
	uint64		short_probes;	/* tenants that had fewer claimable rows than counted */
	uint64		resyncs;
	uint64		fail_open;		/* claims served without fair order */
	uint64		unmapped;		/* claimed rows the claim map had no room for */
} FsFairCounters;

/*
 * Probe starts (probe_start.c): for the few tenants of a queue whose claims
 * take several rows at a time, the order values (a row of the order_by
 * columns) below which the tenant has no ready row, so that a claim's probe
 * begins there instead of at the first index entry of the tenant, which
 * after a flood of claims is the first of many entries of deleted rows.
 * Values are kept as int64 (every start column's type fits), never as a
 * Datum, which may be a pointer.
 */
#define FS_PROBE_START_SLOTS	2
#define FS_PROBE_START_MAX_COLS	3
#define FS_PROBE_START_LOOKUPS	(2 * FS_PROBE_START_SLOTS)	/* per claim query */
#define FS_PROBE_START_COMMITTING	32	/* buckets of committing tenants */

typedef struct FsProbeStart
{
	uint32		tenant_hash;	/* of tenant; tenant "" when unused */
	char		tenant[FS_NAME_BUFLEN];
	bool		valid;			/* values hold a start */
	uint32		gen;			/* moves on at every change of the slot,
								 * never back (across reuse too) */
	int32		rows_since;		/* rows planned since an advance was due */
	uint64		used_at;		/* the set's clock when last planned */
	TimestampTz full_at;		/* when a start was last found from the
								 * tenant's first entry */
	int64		values[FS_PROBE_START_MAX_COLS];
} FsProbeStart;

typedef struct FsProbeStarts
{
	slock_t		mutex;			/* the slots and the fields below */
	uint32		signature;		/* the registration the values are of */
	uint64		clock;			/* moves on at every planning */
	FsProbeStart slots[FS_PROBE_START_SLOTS];
	/*
	 * Transactions between their pre-commit and the end of their commit
	 * that put rows into the ready state, by tenant hash bucket: while a
	 * bucket is not 0, its tenants' starts are neither used nor set.
	 */
	pg_atomic_uint32 committing[FS_PROBE_START_COMMITTING];
} FsProbeStarts;

/*
 * Fair-order state of a queue, by queue_id.  Everything is under `lock`
 * (shmem.c rule 8), and so are the chunks and directory nodes of its heap,
 * and the heap_index of each tenant entry in it.
 */
typedef struct FsFairQueue
{
	LWLock	   *lock;
	FsQueue    *queue;			/* set when first used */
	float8		vtime;			/* virtual time: start tag of the last claim */
	float8		max_finish;		/* largest finish tag given out: V moves
								 * there when the queue goes idle */
	float8		avg_cost;		/* moving average of a claimed row's cost */
	float8		avg_runtime_ms; /* moving average of a lease's held time */
	uint64		resync_gen;		/* moves on when a recount takes its snapshot */
	uint64		forget_gen;		/* moves on when fs_fair_forget() zeroes it */
	bool		synced;			/* counted from the table in this run */
	bool		resyncing;		/* a recount is running: entries it pinned
								 * stay in the heap even with no rows */
	bool		count_again;	/* with resyncing: asked to count again
								 * meanwhile (fs_fair_count_again()), so it
								 * leaves the queue to count at next use */
	int32		resync_pid;		/* with resyncing: the backend recounting */
	uint64		resync_owner_gen;	/* with resyncing: which of its recounts */
	pg_atomic_uint32 commit_barrier;	/* fs_commit_barrier_enter(): committers inside,
									 * and whether a recount closed it */
	pg_atomic_uint64 latency_sampled_at;	/* when a claim last measured the
											 * oldest ready row's age */
	uint32		limits_generation;	/* of the min_slots cached in the heap */
	uint32		parts_signature;	/* of the shards (and definition) a Citus
									 * node's queue was last counted over: a
									 * backend that finds others recounts */
	uint64		wal_version;	/* moves on with every fs_fair_changed() */
	int32		nitems;
	int32		nchunks;		/* chunks holding items 0 .. nitems - 1 */
	int32		heap_root;		/* the chunk (heap_depth 0) or the directory
								 * node at the top; -1 with no chunk */
	int32		heap_depth;		/* directory levels above the chunks */
	int32		nfloor;			/* heap entries with min_slots > 0 */
	int32		nleaves;		/* its entries in the leaf table (subkeys.c;
								 * under the leaf lock too) */
	int64		rows_without_tenant;	/* ready rows whose tenant is NULL or
										 * not a valid name: never claimed */
	int64		untracked_rows; /* ready rows of tenants shared memory had no
								 * room for: claimed without fair order */
	TimestampTz last_resync_at;
	FsFairCounters counters;
	FsProbeStarts probe_starts; /* under its own mutex, not `lock` */
} FsFairQueue;

typedef struct FsFairShared
{
	pg_atomic_uint32 registration_generation;	/* bumped when fs_fair_queues
												 * commits a change */
	slock_t		pool_mutex;		/* the two pools' free lists and counts */
	int32		chunk_free;		/* first free chunk, -1 if none */
	int32		node_free;		/* first free directory node, -1 if none */
	int32		chunks_unused;	/* chunks on the free list */
	int32		nodes_unused;	/* directory nodes on the free list */
	int32		pool_chunks;	/* chunks in all (fs_heap_pool_chunks()) */
	int32		pool_nodes;		/* directory nodes in all */
	int32	   *chunk_next;		/* the chunks' free list: next free chunk */
	FsHeapItem *chunks;			/* pool_chunks * FS_HEAP_CHUNK items */
	FsHeapDirNode *nodes;		/* pool_nodes directory nodes */
	LWLockPadded *claim_locks;
	FsFairQueue queues[FLEXIBLE_ARRAY_MEMBER];
} FsFairShared;

extern FsFairShared *fs_fair;

/*
 * A claimed row's identity in the claim map: its key (the registered key
 * expression) as the bytes of the value when they fit, else a 128-bit hash.
 */
typedef struct FsClaimKey
{
	uint32		queue_id;
	uint16		len;
	uint8		hashed;
	uint8		pad;
	uint8		bytes[FS_KEY_INLINE];
} FsClaimKey;

typedef struct FsClaimEntry
{
	FsClaimKey	key;			/* hash key: must be first */
	int64		lease_id;
	float8		est_cost;		/* charged at claim; corrected at release */
	char		tenant[FS_NAME_BUFLEN];
	dlist_node	scan_link;		/* in its partition's list (scanlist.h) */
} FsClaimEntry;

/*
 * The text of a query fairshare built from a registration, and which piece
 * of the registration (tenant, order_by, filter, key, ...) each part of it
 * came from, by byte offsets: an error at a position in it is reported by
 * piece and queue, without the query (fs_fair_query_error()).
 */
#define FS_QUERY_MAX_SPANS		16

typedef struct FsQuerySpan
{
	int			start;
	int			end;
	const char *piece;			/* a static string */
} FsQuerySpan;

typedef struct FsQueryText
{
	char	   *sql;
	int			nspans;
	FsQuerySpan spans[FS_QUERY_MAX_SPANS];
} FsQueryText;

/*
 * A registration as a backend uses it (fs_fair_queues row, compiled).  The
 * SQL texts are the canonical forms stored at registration: every name
 * outside pg_catalog qualified, to be parsed with search_path pg_catalog.
 */
typedef struct FsFairDesc
{
	char		queue_name[FS_NAME_BUFLEN];	/* hash key: must be first */
	bool		valid;
	uint32		generation;		/* registration generation it was loaded at */
	MemoryContext cxt;
	Oid			ready_relid;
	Oid			running_relid;	/* InvalidOid: no automatic release */
	Oid			row_type;		/* of the ready table */
	char	   *ready_name;		/* quoted, qualified */
	char	   *ready_schema;	/* quoted */
	char	   *tenant;
	char	   *order_by;
	char	   *ready_filter;	/* NULL: every row */
	char	   *claim_filter;	/* NULL: none */
	char	   *key;
	char	   *cost;			/* NULL: 1 per row */
	char	   *enqueued_at;	/* timestamptz; NULL: latency not measured */
	char	   *selector;		/* text a claim may select rows by; NULL: none */
	char	   *subkey;			/* a row's sub-key within its tenant (text);
								 * NULL: one level of fair order */
	bool		charge_runtime;
	int64		lease_usecs;	/* a claim's lease when it passes none */
	Oid			key_type;
	int16		key_len;
	bool		key_byval;
	FsQueue    *queue;			/* NULL: the queue table is full */
	FsFairQueue *fq;
	SPIPlanPtr	claim_plan;
	SPIPlanPtr	fifo_plan;
	SPIPlanPtr	count_plan;
	SPIPlanPtr	latency_plan;	/* min(enqueued_at) of the ready rows */
	SPIPlanPtr	leaf_plan;		/* with a subkey: rows of (tenant, sub-key)s */
	SPIPlanPtr	star_plan;		/* with a subkey: rows of tenants whose
								 * sub-key is no valid name */
	FsQueryText claim_q;		/* the texts of the plans */
	FsQueryText fifo_q;
	FsQueryText count_q;
	FsQueryText latency_q;
	FsQueryText leaf_q;
	FsQueryText star_q;
	/*
	 * Probe starts (probe_start.c): the order_by columns they are values
	 * of (0: the queue has none), and the query that finds a tenant's
	 * first ready row from a start.
	 */
	int			start_ncols;
	AttrNumber	start_attnums[FS_PROBE_START_MAX_COLS];
	Oid			start_types[FS_PROBE_START_MAX_COLS];
	char	   *start_columns[FS_PROBE_START_MAX_COLS];	/* quoted names */
	uint32		start_signature;
	SPIPlanPtr	start_plan;
	FsQueryText start_q;
	HTAB	   *subkey_weights; /* fs_subkey_weights of the queue (subkeys.c) */
	uint32		subkey_weights_generation;
	/*
	 * A queue on a table Citus distributes (`distributed`): this node's
	 * shards of it, in hash order, each a part whose queries name the
	 * shard's own table and return its rows as rows of the distributed
	 * table (row_cast); the desc itself then has no query and no probe
	 * starts.  A part holds the tenants whose hash is in its range
	 * (fs_fair_part_of()).
	 */
	bool		distributed;
	int			nparts;
	struct FsFairDesc *parts;
	int32		min_hash;		/* a part: its shard's hash range */
	int32		max_hash;
	const char *row_cast;		/* a part: the distributed table's name */
	bool		tenant_keys;	/* keys are unique only with the tenant (a
								 * distributed queue and its parts): a
								 * claimed row is known by both */
} FsFairDesc;

/* One registration as the triggers of one relation see it. */
typedef struct FsRelRole
{
	char		queue_name[FS_NAME_BUFLEN];
	FsQueue    *queue;
	bool		charge_runtime;
	Oid			key_type;
	int16		key_len;
	bool		key_byval;
	ExprState  *tenant;			/* ready side: text */
	ExprState  *subkey;			/* text, or NULL: no second level */
	ExprState  *filter;			/* bool, or NULL */
	ExprState  *cost;			/* float8, or NULL */
	ExprState  *key;
	ExprState  *running_filter; /* running side: bool, or NULL */
	ExprState  *running_key;
	ExprState  *running_tenant; /* a Citus shard's: its distribution column */
	bool		tenant_keys;	/* keys are unique only with the tenant (a
								 * Citus shard): rows are known by both */
	Oid			run_as_owner;	/* evaluate as this role, or InvalidOid */
} FsRelRole;

typedef struct FsRelTriggers
{
	Oid			relid;			/* hash key: must be first */
	bool		valid;
	uint32		generation;
	MemoryContext cxt;
	ExprContext *econtext;
	int			nready;
	FsRelRole  *ready;
	int			nrunning;
	FsRelRole  *running;
} FsRelTriggers;

/*
 * A change to one tenant's fair-dequeue state, applied by fs_fair_change().
 * `rows` ready rows are added if the queue was not recounted since
 * `resync_gen` (the count does not have them yet), `rows_recounted` if it
 * was; callers that do not care pass the same number for both.
 */
typedef struct FsTenantChange
{
	int64		rows;
	int64		rows_recounted;
	uint64		resync_gen;
	float8		served;			/* served work to add */
	float8		cost;			/* cost units to add to the tag (divided by
								 * the weight here) */
	float8		tag;			/* tag change already divided by the weight */
	float8		claimed_cost;	/* cost of rows served without fs_claim():
								 * charged as a claim would be */
	bool		restore_vtime;	/* put V back to vtime_before if it is still
								 * vtime_after */
	float8		vtime_before;
	float8		vtime_after;
	bool		dry;			/* the tenant had fewer rows than counted */
	FullTransactionId dry_horizon;	/* ... in a snapshot that sees every
									 * transaction before this one (its
									 * xmin); invalid: for sure */
	FullTransactionId adder;	/* its commit added ready rows */
	TimestampTz now;
} FsTenantChange;

/* ----------------------------------------------------------------
 * The second level of fair order (subkeys.c)
 *
 * A queue registered with a subkey orders each tenant's rows by sub-key:
 * each (tenant, sub-key) is a "leaf" with its own backlog and finish tag,
 * and a tenant picked by the queue's order gives its row to its leaf with
 * the smallest start tag, on the tenant's own virtual time.
 * ----------------------------------------------------------------
 */

/* The leaf of a tenant's rows whose sub-key is NULL or no valid name. */
#define FS_SUBKEY_NONE		"*"

typedef struct FsLeafKey
{
	uint32		queue_id;
	char		tenant[FS_NAME_BUFLEN];
	char		subkey[FS_NAME_BUFLEN];	/* "": the tenant's own entry */
} FsLeafKey;

/*
 * A leaf, or (subkey "") a tenant's order of its leaves.  Everything in it,
 * and the table itself, is under the leaf table's lock (subkeys.c).
 */
typedef struct FsLeaf
{
	FsLeafKey	key;			/* hash key: must be first */
	uint32		generation;		/* new for every entry made */
	bool		queued;			/* a leaf: in its tenant's order */
	TransactionId listed_xid;	/* a leaf: as FsHeapItem's, read in the
								 * epoch of its backlog_fxid */
	int64		ready_rows;		/* a leaf: its backlog; the tenant's entry:
								 * the sum of its leaves' */
	float8		virtual_finish; /* a leaf: finish tag of its last claim */
	float8		weight;			/* a leaf: from fs_subkey_weights */
	uint32		weight_generation;	/* limits generation of `weight`; 0: none */
	TimestampTz dry_until;		/* a leaf: passed over until then */
	FullTransactionId backlog_fxid; /* a leaf: newest commit that added rows */
	pairingheap_node node;		/* a leaf: in its tenant's order */
	struct FsLeaf *order;		/* a leaf: its tenant's entry */
	pairingheap_node *root;		/* the tenant's entry: its backlogged
								 * leaves, smallest tag first */
	float8		vtime;			/* the tenant's entry: start tag of its
								 * last claimed row */
	int32		nleaves;		/* the tenant's entry: its leaves */
} FsLeaf;

/* One leaf of a plan. */
typedef struct FsPlanLeaf
{
	char		subkey[FS_NAME_BUFLEN];
	FsLeaf	   *leaf;			/* only while planning, under the locks */
	int			tenant;			/* index in the plan's tenants[] */
	int32		planned;
	int32		admitted;		/* of the tenant's admitted rows, its share */
	int32		got;
	int32		unkeyed;
	float8		charge;			/* tag advance made by the plan */
	float8		est_cost;
	float8		weight;
	float8		cost_fix;		/* tag correction for real costs (unweighted) */
} FsPlanLeaf;

/* A change of the leaf (tenant, subkey), for fs_leaf_apply_many(). */
typedef struct FsLeafChange
{
	const char *tenant;
	const char *subkey;
	FsTenantChange change;
} FsLeafChange;

/* A leaf's rows as a recount counted them, and as it was at its snapshot. */
typedef struct FsLeafCount
{
	char		tenant[FS_NAME_BUFLEN];
	char		subkey[FS_NAME_BUFLEN];
	int64		rows;
} FsLeafCount;

typedef struct FsLeafCountAt
{
	FsLeafKey	key;
	uint32		generation;
	int64		rows;
} FsLeafCountAt;

/* fairqueue.c */
extern FsFairQueue *fs_fair_queue(FsQueue *queue);
extern void fs_change_init(FsTenantChange *c, TimestampTz now);
extern void fs_fair_change(FsQueue *queue, const char *tenant, bool create,
						   const FsTenantChange *c);
extern float8 fs_fair_clamp_cost(float8 cost, bool isnull);
extern void fs_fair_apply_backlog(FsQueue *queue, const char *tenant, int64 rows,
								  float8 charge, int32 leaves, TimestampTz now,
								  FullTransactionId adder);
extern void fs_fair_note_runtime(FsQueue *queue, float8 held_ms);
extern void fs_fair_forget(FsQueue *queue);
extern void fs_fair_add_without_tenant(FsQueue *queue, int64 rows, int64 untracked);
extern void fs_fair_count_again(FsQueue *queue);
extern void fs_fair_count_again_all(void);
extern int64 fs_fair_resync(FsFairDesc *desc, bool if_unsynced, int *tenants);
/* barrier.c */
extern bool fs_fair_owner_gone(int pid);
extern void fs_commit_barrier_enter(FsQueue *queue);
extern void fs_commit_barrier_leave(FsQueue *queue);
extern void fs_barriers_enter_in_order(FsQueue **queues, int n);
extern bool fs_barrier_entered(FsQueue *queue);
extern void fs_barriers_leave_all(void);
extern bool fs_commit_barrier_close(FsFairQueue *fq);
extern void fs_commit_barrier_open(FsFairQueue *fq);
extern void fs_commit_barrier_open_mine(void);

/* register.c */
extern FsFairDesc *fs_fair_desc(const char *queue_name, bool missing_ok);
extern FsFairDesc *fs_fair_part_of(FsFairDesc *desc, const char *tenant);
extern void fs_fair_triggers_init(void);
extern FsRelTriggers *fs_fair_rel_triggers(Relation rel);
extern List *fs_fair_registered_queues(void);
extern void fs_fair_check_owner(Oid relid, const char *queue_name);
extern void fs_fair_check_schema_usage(FsFairDesc *desc, const char *function);
extern void fs_fair_check_counts_readable(FsFairDesc *desc, const char *function,
										  const char *action);
extern void fs_q_piece(FsQueryText *q, StringInfo buf, const char *piece, const char *text);
extern void fs_fair_query_error(MemoryContext cxt, const FsFairDesc *desc,
								const FsQueryText *q, const char *what) pg_attribute_noreturn();
extern void fs_fair_register_init(void);
extern void fs_fair_invalidate_all(void);

/* track.c */
extern void fs_track_init(void);
extern void fs_track_claims_reserve(int n);
extern void fs_track_claim(FsFairDesc *desc, const char *tenant, int32 rows,
						   float8 charge, float8 served, uint64 resync_gen,
						   float8 vtime_before, float8 vtime_after);
extern void fs_track_leaf_claim(FsFairDesc *desc, const char *tenant, const char *subkey,
								int32 rows, float8 tag, uint64 resync_gen);
extern bool fs_track_claimed_row(FsFairDesc *desc, const char *tenant, const char *subkey,
								 Datum key, bool key_isnull, int64 lease_id, float8 est_cost,
								 bool reserved, uint64 resync_gen);
extern ArrayType *fs_track_held_keys(FsFairDesc *desc);
extern void fs_track_registration_changed(const char *queue_name, bool unregistered);
extern void fs_track_truncated(const char *queue_name);
extern bool fs_track_row_left(FsRelRole *role, Datum key, const char *tenant);
extern bool fs_track_releasing(int64 lease_id);
extern bool fs_track_row_moved(FsRelRole *role, Datum key, const char *tenant, const char *subkey);
extern void fs_track_release(FsRelRole *role, const FsClaimEntry *entry, bool released,
							 int64 held_usecs);
extern void fs_delta_add(FsQueue *queue, const char *tenant, const char *subkey, int64 rows,
						 int32 leaves, float8 charge);
extern void fs_delta_reordered(FsQueue *queue, const char *tenant, const char *subkey);
extern bool fs_track_made_ready(FsQueue *queue);
extern void fs_claim_key_make(FsClaimKey *key, uint32 queue_id, Datum value, Oid type,
							  int16 typlen, bool typbyval, const char *tenant);
extern Size fs_claim_map_shmem_size(void);
extern void fs_claim_map_shmem_init(void);
extern int	fs_claim_map_sweep(bool at_once);
/*
 * The fields of the state file's items of fair dequeue (core/stateformat.h;
 * ids are never reused).  Claim-map entries:
 */
enum
{
	FS_CLAIM_QUEUE = 1,			/* uint32: the queue's index in the file */
	FS_CLAIM_KEY_LEN = 2,		/* uint16: FsClaimKey.len */
	FS_CLAIM_KEY_HASHED = 3,	/* uint8: FsClaimKey.hashed */
	FS_CLAIM_KEY_BYTES = 4,		/* FS_KEY_INLINE bytes: FsClaimKey.bytes */
	FS_CLAIM_LEASE = 5,			/* int64 */
	FS_CLAIM_EST_COST = 6,		/* float8 */
	FS_CLAIM_TENANT = 7			/* name */
};

extern uint64 fs_claim_map_save(StringInfo buf, uint32 nqueues);
extern FsClaimEntry *fs_claim_map_collect(uint32 queue_id, int *count);
extern void fs_claim_map_release_queue(uint32 queue_id);
extern void fs_claim_map_remove(const FsClaimKey *key, int64 lease_id);
extern void fs_claim_map_remove_queue(uint32 queue_id);
extern bool fs_claim_map_insert(const FsClaimKey *key, int64 lease_id, float8 est_cost, const char *tenant);
extern bool fs_claim_map_find(const FsClaimKey *key, FsClaimEntry *copy);
extern void fs_claim_map_restore(const char *data, Size bytes, uint64 count,
								 FsQueue **queues, uint64 nqueues, int64 next_lease_id);
extern long fs_claim_map_count(uint32 queue_id);

/* ----------------------------------------------------------------
 * Shared between the files of fair dequeue (order.c, plan.c, claim.c,
 * recount.c, metrics.c)
 * ----------------------------------------------------------------
 */

/*
 * A claim's selection (fs_claim()'s selector_in and selector_not_in), for a
 * queue registered with a selector, and the tenants the claim found short
 * of rows (in its selection, or in its snapshot): passed over for the rest
 * of the claim.  With a selection they are not marked dry (other claims'
 * selections may differ).
 */
typedef struct FsSelection
{
	bool		active;
	Datum		in;				/* text[] of LIKE patterns; 0: any */
	Datum		not_in;			/* text[] of LIKE patterns; 0: none */
	/* the passed-over tenants and leaves: a set by entry, open addressing */
	const void **passed_over;
	int			npassed_over;
	int			passed_size;	/* slots of passed_over: a power of two */
} FsSelection;

/* selection.c */
extern void fs_selection_args(FunctionCallInfo fcinfo, int first, FsFairDesc *desc,
							  FsSelection *sel);
extern void fs_passed_over_reserve(FsSelection *sel, int more);
extern void fs_passed_over_add(FsSelection *sel, const void *entry);
extern bool fs_passed_over_has(const FsSelection *sel, const void *entry);

/* Weight of the newest sample in the moving averages of cost and run time. */
#define FS_EMA_ALPHA		0.05

/* Weights below this are treated as this (keeps tags finite). */
#define FS_MIN_WEIGHT		1e-6

static inline float8
fs_fair_weight(float8 weight)
{
	return Max(weight, FS_MIN_WEIGHT);
}

/* ----------------------------------------------------------------
 * Changes of a queue's fair-order state
 *
 * ONE PLACE WHERE A FAIR QUEUE CHANGES.  A queue's virtual time, largest
 * finish tag, moving averages, rows outside the order and counters change
 * only through the functions below, called with fq->lock held EXCLUSIVE
 * (or in the postmaster, restoring state before any backend exists),
 * and each ends in fs_fair_changed(): the one point that sees every change
 * of them.  (The heap itself is order.c's, under the same lock; its
 * tenants' tags and backlogs change through core/tenant.h.)
 * ----------------------------------------------------------------
 */

/*
 * The end of every change of `fq`'s state: its version moves on, for the
 * WAL writer to notice.  The debug build checks it.
 */
static inline void
fs_fair_changed(FsFairQueue *fq)
{
	fq->wal_version++;
	FS_INVARIANT(!isnan(fq->vtime) && !isinf(fq->vtime) && fq->vtime >= 0);
	FS_INVARIANT(!isnan(fq->max_finish) && !isinf(fq->max_finish));
	FS_INVARIANT(fq->avg_cost > 0 && !isinf(fq->avg_cost));
	FS_INVARIANT(fq->avg_runtime_ms > 0 && !isinf(fq->avg_runtime_ms));
	FS_INVARIANT(fq->rows_without_tenant >= 0 && fq->untracked_rows >= 0);
}

/* The queue's virtual time is `vtime` (a claim's start, or a restore). */
static inline void
fs_fair_set_vtime(FsFairQueue *fq, float8 vtime)
{
	fq->vtime = vtime;
	fs_fair_changed(fq);
}

/* The queue's virtual time and largest finish tag, as logged (WAL replay). */
static inline void
fs_fair_set_tags(FsFairQueue *fq, float8 vtime, float8 max_finish)
{
	fq->vtime = vtime;
	fq->max_finish = max_finish;
	fs_fair_changed(fq);
}

/* A finish tag was given out: the largest one moves up to it. */
static inline void
fs_fair_note_finish(FsFairQueue *fq, float8 finish)
{
	fq->max_finish = Max(fq->max_finish, finish);
	fs_fair_changed(fq);
}

/* The moving averages of a row's cost and a lease's held time. */
static inline void
fs_fair_set_averages(FsFairQueue *fq, float8 avg_cost, float8 avg_runtime_ms)
{
	fq->avg_cost = avg_cost;
	fq->avg_runtime_ms = avg_runtime_ms;
	fs_fair_changed(fq);
}

/* One more sample of a claimed row's cost. */
static inline void
fs_fair_learn_cost(FsFairQueue *fq, float8 cost)
{
	fq->avg_cost += FS_EMA_ALPHA * (cost - fq->avg_cost);
	fs_fair_changed(fq);
}

/* One more sample of a lease's held time, in ms. */
static inline void
fs_fair_learn_runtime(FsFairQueue *fq, float8 held_ms)
{
	fq->avg_runtime_ms += FS_EMA_ALPHA * (held_ms - fq->avg_runtime_ms);
	fs_fair_changed(fq);
}

/*
 * Ready rows outside the fair order: `without` whose tenant is no valid
 * name, `untracked` of tenants shared memory had no room for.  Set by a
 * recount (and zeroed when the order is forgotten); added to, never below
 * zero, by commits.
 */
static inline void
fs_fair_set_outside(FsFairQueue *fq, int64 without, int64 untracked)
{
	fq->rows_without_tenant = without;
	fq->untracked_rows = untracked;
	fs_fair_changed(fq);
}

static inline void
fs_fair_add_outside(FsFairQueue *fq, int64 without, int64 untracked)
{
	fs_fair_set_outside(fq, Max(fq->rows_without_tenant + without, 0),
						Max(fq->untracked_rows + untracked, 0));
}

/* Count `n` in one of the queue's counters (FsFairCounters). */
#define FS_FAIR_COUNT(fq, counter, n) \
	do { \
		(fq)->counters.counter += (n); \
		fs_fair_changed(fq); \
	} while (0)

/* Chunks a directory of `depth` levels can address: F^depth. */
static inline int64
fs_heap_span(int depth)
{
	return (int64) 1 << (depth * FS_HEAP_FANOUT_SHIFT);
}

/* Item i of the heap (i < nchunks * FS_HEAP_CHUNK): down the directory. */
static inline FsHeapItem *
fs_heap_at(const FsFairQueue *fq, int32 i)
{
	uint32		chunk = (uint32) i >> FS_HEAP_CHUNK_SHIFT;
	int32		id = fq->heap_root;
	int			shift;

	/* The digits of the chunk number in base F, the highest first. */
	for (shift = fq->heap_depth * FS_HEAP_FANOUT_SHIFT; shift > 0; shift -= FS_HEAP_FANOUT_SHIFT)
		id = fs_fair->nodes[id].ids[(chunk >> (shift - FS_HEAP_FANOUT_SHIFT)) & (FS_HEAP_FANOUT - 1)];
	return &fs_fair->chunks[((Size) id << FS_HEAP_CHUNK_SHIFT) + (i & (FS_HEAP_CHUNK - 1))];
}

/* Order: smaller tag first, then by name (tenant keys never change). */
static inline bool
fs_heap_less(const FsHeapItem *a, const FsHeapItem *b)
{
	if (a->key != b->key)
		return a->key < b->key;
	return strcmp(a->tenant->key.tenant, b->tenant->key.tenant) < 0;
}

#ifdef FS_DEBUG
extern void fs_fair_debug_check(FsFairQueue *fq);
#define FS_FAIR_DEBUG_CHECK(fq) fs_fair_debug_check(fq)
#else
#define FS_FAIR_DEBUG_CHECK(fq) ((void) 0)
#endif

/* An advance of a probe start that fell due (probe_start.c). */
typedef struct FsProbeDue
{
	int			element;		/* of the claim query */
	int			slot;
	uint32		gen;			/* the slot's, when read */
	bool		full;			/* from the tenant's first entry */
	Datum		from[FS_PROBE_START_MAX_COLS];
} FsProbeDue;

extern void fs_probe_start_columns(FsFairDesc *desc, Relation rel);
extern void fs_probe_starts_init(FsProbeStarts *ps);
extern void fs_probe_starts_clear(FsProbeStarts *ps);
extern int	fs_probe_starts_read(FsFairDesc *desc, int n, const char *const *tenants,
								 const int32 *rows, Datum **starts, FsProbeDue *due,
								 bool may_advance);
extern void fs_probe_starts_advance(FsFairDesc *desc, const char *const *tenants,
									const FsProbeDue *due, int ndue, TimestampTz now);
extern void fs_probe_starts_committing(FsQueue *queue, const char *tenant);
extern void fs_probe_starts_xact_end(void);
extern void fs_fair_execute(FsFairDesc *desc, const FsQueryText *q, SPIPlanPtr plan,
							Datum *values, const char *nulls, Snapshot snapshot,
							bool read_only, long count, const char *what);

/* One tenant of a plan. */
typedef struct FsPlanTenant
{
	char		name[FS_NAME_BUFLEN];
	FsTenant   *entry;			/* only while planning, under fq->lock */
	float8		weight;
	int32		planned;		/* rows reserved */
	int32		admitted;		/* of which got a lease */
	int32		got;			/* of which the query returned */
	float8		charge;			/* tag advance made by the plan */
	float8		est_cost;		/* cost charged per planned row */
	float8	   *starts;			/* start tag of each planned row (after planning) */
	int64	   *leases;			/* a lease per admitted row */
	float8	   *taken;			/* the tokens each admitted row took */
	float8		cost_fix;		/* tag correction for real costs (unweighted) */
	float8		served_fix;
	int32		unkeyed;		/* rows got without a key: reservation given back */
	int32		whole_admitted; /* with leaves: admitted rows of picks of
								 * the tenant as a whole (no leaf) */
	int32		whole_got;
} FsPlanTenant;

typedef struct FsPlan
{
	int			ntenants;
	int			capacity;		/* of tenants[] and the map */
	FsPlanTenant *tenants;
	FsTenant  **map_keys;		/* open addressing: entry -> index */
	int		   *map_values;
	int			map_size;
	int32		want;
	float8		vtime_before;
	float8		vtime_after;
	uint64		resync_gen;
	FsHeapItem *aside;			/* taken off the heap while planning */
	int			naside;
	int			aside_capacity;
	int32	   *floor_candidates;	/* heap positions, for fs_plan_floors() */
	int32		floor_capacity;
	int32		npicks;			/* rows planned, in order: */
	int		   *pick_tenant;	/* index into tenants[] */
	float8	   *pick_start;		/* start tag */
	FsGateCapacity cap;			/* the global gate, as of the plan */
	float8		budget_cost;	/* tokens (ms) a claimed row takes */
	bool		skip_dry;		/* pass over tenants that came up short lately */
	/*
	 * The claim query's snapshot, and its xmin and xmax as full ids: a
	 * tenant listed by a commit it does not see is left to other claims
	 * (NULL: none is), and xmin is the horizon of a tenant (or leaf) it
	 * finds short (FsTenantChange.dry_horizon).
	 */
	Snapshot	snapshot;
	FullTransactionId snapshot_xmin;
	FullTransactionId snapshot_xmax;
	bool		may_advance_starts; /* probe starts may advance (probe_start.c) */
	bool		skipped_dry;	/* ... and some were passed over */
	/*
	 * A claim with a selection (fs_claim()'s selector_in, selector_not_in):
	 * a tenant short of rows in it is not marked dry for other claims.
	 * Every claim passes over, for the rest of it, the tenants that came
	 * back short in it (the claim's set, read only here).
	 */
	bool		selective;
	const FsSelection *passed;
	/*
	 * A queue with a subkey (subkeys.c): the leaf of each pick (NULL: a
	 * pick of the tenant's rows as a whole, which no leaf counts), the
	 * plan's leaves, and the leaves set aside while planning.
	 */
	bool		leaves;
	HTAB	   *weights;		/* the queue's fs_subkey_weights */
	uint32		weights_generation;
	int		   *pick_leaf;		/* index in plan_leaves[], or -1 */
	FsPlanLeaf *plan_leaves;
	int			nleaves;
	FsLeaf	  **leaf_map_keys;	/* open addressing: leaf -> index */
	int		   *leaf_map_values;
	FsLeaf	  **leaf_aside;
	int			nleaf_aside;
	int			leaf_aside_capacity;
} FsPlan;

/* What planning needs to know about a tenant, read under its spinlock. */
typedef struct FsTenantView
{
	int64		ready;
	int32		slots;
	bool		dry;
	FullTransactionId newest_adder; /* the tenant's backlog_fxid */
	float8		balance;		/* tokens now; infinity without a budget */
	FsLimits	limits;
} FsTenantView;

/* Can the tenant pay for `rows` more rows of the plan's budget cost? */
static inline bool
fs_view_can_pay(const FsTenantView *v, int32 rows, float8 budget_cost)
{
	return v->balance >= budget_cost * rows;
}

extern void fs_heap_sift_down(FsFairQueue *fq, int32 i);
extern void fs_heap_rebuild(FsFairQueue *fq);
extern void fs_heap_shrink(FsFairQueue *fq, int32 reserved);
extern void fs_heap_remove(FsFairQueue *fq, int32 i);
extern int32 fs_heap_find(FsFairQueue *fq, const FsTenant *tenant);
extern void fs_fair_push_locked(FsFairQueue *fq, const FsHeapItem *item);
extern void fs_fair_enqueue_locked(FsFairQueue *fq, FsTenant *entry, bool always);
extern void fs_fair_set_listed_locked(FsFairQueue *fq, const FsTenant *entry,
									  TransactionId listed_xid);

/*
 * The listing (FsHeapItem.listed_xid) a change of `rows` leaves to a tenant
 * or a leaf, `lists` when it took the count from none to some: a commit of
 * `adder` that did lists it; rows given back without one (by a claim, or
 * its rollback) may be older, and clear it.  False when the listing stays.
 */
static inline bool
fs_listing_after(bool lists, FullTransactionId adder, int64 rows, TransactionId *listed_xid)
{
	bool		committed = FullTransactionIdIsValid(adder);

	if (committed ? !lists : rows <= 0)
		return false;
	*listed_xid = committed ? XidFromFullTransactionId(adder) : InvalidTransactionId;
	return true;
}
extern void fs_fair_shift_tag_locked(FsFairQueue *fq, FsTenant *entry, float8 delta);
extern void fs_plan_init(FsPlan *plan, int32 want, int aside_capacity, int32 floor_capacity);
extern void fs_plan_split_starts(FsPlan *plan);
extern void fs_tenant_view(FsTenant *entry, FsTenantView *v, TimestampTz now);
extern float8 fs_fair_budget_cost(FsFairDesc *desc);
extern int32 fs_plan_ceiling(const FsGateCapacity *cap, const FsTenantView *v);
extern bool fs_item_dry(const FsHeapItem *item, const FsTenantView *v, TimestampTz now);
extern void fs_plan_make(FsFairQueue *fq, FsPlan *plan, float8 est_cost, TimestampTz now);
extern FullTransactionId fs_xid_widen(TransactionId xid, FullTransactionId ref);
extern void fs_plan_set_snapshot(FsPlan *plan, Snapshot snapshot);
extern bool fs_plan_sees_listing(const FsPlan *plan, TransactionId listed_xid,
								 FullTransactionId newest_adder);
extern void fs_plan_settle(FsQueue *queue, FsPlan *plan, FsPlanTenant *pt, TimestampTz now, float8 *tag_fix, float8 *served_fix);
extern void fs_fair_measure_latency(FsFairDesc *desc, TimestampTz now);

/* subkeys.c */
extern Size fs_leaves_shmem_size(void);
extern void fs_leaves_shmem_init(LWLock *lock);
extern void fs_leaf_apply(FsQueue *queue, const char *tenant, const char *subkey,
						  const FsTenantChange *c);
extern void fs_leaf_apply_many(FsQueue *queue, const FsLeafChange *changes, int n);
extern void fs_leaves_forget(FsFairQueue *fq, uint32 queue_id);
extern void fs_subkey_weights_load(FsFairDesc *desc, HTAB **weights, uint32 *generation);
extern void fs_plan_leaves_init(FsPlan *plan, FsFairDesc *desc, int32 want);
extern void fs_plan_leaves_lock(FsPlan *plan);
extern FsLeaf *fs_plan_leaf_choose(FsPlan *plan, FsTenant *entry, int64 tenant_ready,
								   TimestampTz now, bool *blocked);
extern void fs_plan_leaf_pick(FsPlan *plan, FsLeaf *leaf, int tenant_index, float8 est_cost);
extern void fs_plan_leaves_unlock(FsPlan *plan);
extern bool fs_leaves_snapshot(FsFairQueue *fq, uint32 queue_id, FsLeafCountAt *at,
							   int32 capacity, int32 *nat, int32 *needed);
extern void fs_leaves_recounted(FsFairQueue *fq, uint32 queue_id, const FsLeafCount *counts,
								int32 ncounts, const FsLeafCountAt *at, int32 nat);
extern void fs_leaves_settle_all(FsFairQueue *fq, uint32 queue_id);
extern void fs_subkey_name(Datum value, bool isnull, char *subkey);
extern int64 fs_leaf_rows_ahead(FsQueue *queue, const char *tenant, const char *subkey,
								int64 own_ahead, float8 cost, int32 *subkeys_ahead);
/* claim.c */
extern FsFairDesc *fs_fair_desc_arg(FunctionCallInfo fcinfo, int argno);

/* route.c */
extern Size fs_route_shmem_size(void);
extern void fs_route_shmem_init(void);
extern void fs_claim_routed(FunctionCallInfo fcinfo, FsFairDesc *desc, int32 max_rows,
							ReturnSetInfo *rsinfo);

#endif							/* FAIRSHARE_FAIRQUEUE_INT_H */

/*-------------------------------------------------------------------------
 *
 * subkeys.c
 *	  The second level of fair order: each tenant's sub-keys (a user, a
 *	  workflow, a job class), their backlogs and their order.
 *
 * A queue registered with a subkey orders in two levels, as hierarchical
 * start-time fair queueing does.  The queue's order picks a tenant, as
 * order.c says, by its tag alone: however many sub-keys a tenant spreads
 * its rows over, it has one share.  The row then goes to the tenant's
 * sub-key (a "leaf") with the smallest start tag S = max(v, F) on the
 * tenant's own virtual time v: claiming it sets v = S and F = S + cost / w,
 * w being the sub-key's weight (fs_subkey_weights, default 1).  Each
 * tenant's backlogged leaves sit in a pairing heap on F (lib/pairingheap.h,
 * intrusive: no memory besides the leaves), so a pick costs O(log n)
 * amortized at each level.
 *
 * Leaves live in one shared hash table of fairshare.max_subkeys entries,
 * keyed by (queue, tenant, sub-key); each tenant with leaves has one more
 * entry, sub-key "", that holds its heap and its virtual time.
 *
 * LOCKING.  The table and every field of every entry are under the leaf
 * lock: EXCLUSIVE to change anything, SHARED to read; always taken after
 * the queue's fair-order lock (fq->lock, core/shmem.c rule 8) and before no
 * other lock but a tenant's spinlock.  Nothing under it allocates, does I/O
 * or can fail.
 *
 * COUNTS.  A leaf's backlog changes where its tenant's does, by the same
 * rules (order.c): commits add and take rows (fs_leaf_apply()), claims
 * reserve them while planning and give back what they did not get, a
 * rollback gives back what its claims took, and a recount sets them from
 * the table.  A leaf with no rows leaves the table (it starts again at the
 * tenant's virtual time when rows come back, as an idle tenant does).  When
 * the table has no room, a sub-key's rows are counted by their tenant
 * alone; once the tenant's counted leaves have drained, its claims take its
 * rows in the queue's order, sub-key aside.  Sub-key tags are not kept in
 * the state file nor logged to WAL: a queue with a subkey is recounted at
 * its first claim in each server run (its tenants' tags are kept).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/transam.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"

#include "core/common.h"
#include "fairq/fairqueue_int.h"
#include "limits/limits.h"

PG_FUNCTION_INFO_V1(fs_fair_subkeys);

typedef struct FsLeafShared
{
	LWLock	   *lock;
	uint32		next_generation;
} FsLeafShared;

static FsLeafShared *fs_leaf_shared = NULL;
static HTAB *fs_leaf_hash = NULL;

static bool fs_leaf_evict_one(const FsLeaf *keep);

/* ----------------------------------------------------------------
 * Shared memory
 * ----------------------------------------------------------------
 */

/* The leaf table's shared memory. */
Size
fs_leaves_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(FsLeafShared)),
					hash_estimate_size(fs_max_subkeys, sizeof(FsLeaf)));
}

/* Create (or attach to) the leaf table.  Caller holds AddinShmemInitLock. */
void
fs_leaves_shmem_init(LWLock *lock)
{
	HASHCTL		info;
	bool		found;

	fs_leaf_shared = ShmemInitStruct("fairshare sub-keys", sizeof(FsLeafShared), &found);
	if (!found)
	{
		fs_leaf_shared->lock = lock;
		fs_leaf_shared->next_generation = 1;
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(FsLeafKey);
	info.entrysize = sizeof(FsLeaf);
	fs_leaf_hash = ShmemInitHash("fairshare sub-key table", fs_max_subkeys, fs_max_subkeys,
								 &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
}

/*
 * The leaf name of a row's sub-key: the value, or FS_SUBKEY_NONE when it is
 * NULL or no valid name (empty, longer than FS_NAME_MAXLEN bytes, or '*').
 * The claim query of that leaf takes the rows whose sub-key is such.
 */
void
fs_subkey_name(Datum value, bool isnull, char *subkey)
{
	text	   *t;
	int			len;

	strlcpy(subkey, FS_SUBKEY_NONE, FS_NAME_BUFLEN);
	if (isnull)
		return;
	t = DatumGetTextPP(value);
	len = VARSIZE_ANY_EXHDR(t);
	if (len == 0 || len > FS_NAME_MAXLEN || (len == 1 && *VARDATA_ANY(t) == '*'))
		return;
	memcpy(subkey, VARDATA_ANY(t), len);
	subkey[len] = '\0';
}

/* ----------------------------------------------------------------
 * Leaves and their tenants' orders (leaf lock held)
 * ----------------------------------------------------------------
 */

/*
 * Pairing heap order (lib/pairingheap.h keeps the "largest" first): the
 * smaller finish tag first, then the smaller name.
 */
static int
fs_leaf_cmp(const pairingheap_node *a, const pairingheap_node *b, void *arg pg_attribute_unused())
{
	const FsLeaf *x = pairingheap_const_container(FsLeaf, node, a);
	const FsLeaf *y = pairingheap_const_container(FsLeaf, node, b);

	if (x->virtual_finish != y->virtual_finish)
		return x->virtual_finish < y->virtual_finish ? 1 : -1;
	return strcmp(y->key.subkey, x->key.subkey);
}

/* A tenant's order as a pairingheap whose root is kept in its entry. */
static inline void
fs_order_open(FsLeaf *order, pairingheap *heap)
{
	heap->ph_compare = fs_leaf_cmp;
	heap->ph_arg = NULL;
	heap->ph_root = order->root;
}

static inline void
fs_order_close(FsLeaf *order, const pairingheap *heap)
{
	order->root = heap->ph_root;
}

/* The key of (queue, tenant, subkey). */
static void
fs_leaf_key(FsLeafKey *key, uint32 queue_id, const char *tenant, const char *subkey)
{
	memset(key, 0, sizeof(*key));
	key->queue_id = queue_id;
	strlcpy(key->tenant, tenant, FS_NAME_BUFLEN);
	strlcpy(key->subkey, subkey, FS_NAME_BUFLEN);
}

static FsLeaf *
fs_leaf_find(uint32 queue_id, const char *tenant, const char *subkey)
{
	FsLeafKey	key;

	fs_leaf_key(&key, queue_id, tenant, subkey);
	return hash_search(fs_leaf_hash, &key, HASH_FIND, NULL);
}

/* A fresh entry's fields. */
static void
fs_leaf_init(FsLeaf *leaf, FsLeaf *order)
{
	leaf->generation = fs_leaf_shared->next_generation++;
	if (fs_leaf_shared->next_generation == 0)
		fs_leaf_shared->next_generation = 1;
	leaf->queued = false;
	leaf->ready_rows = 0;
	leaf->virtual_finish = order != NULL ? order->vtime : 0;
	leaf->weight = 1.0;
	leaf->weight_generation = 0;
	leaf->dry_until = 0;
	leaf->backlog_fxid = InvalidFullTransactionId;
	leaf->listed_xid = InvalidTransactionId;
	leaf->order = order;
	leaf->root = NULL;
	leaf->vtime = 0;
	leaf->nleaves = 0;
}

/*
 * The leaf (queue, tenant, subkey), made (with its tenant's entry) if need
 * be: NULL when the table has no room.  A new leaf starts at its tenant's
 * virtual time: no credit for having been away.
 */
static FsLeaf *
fs_leaf_enter(FsFairQueue *fq, uint32 queue_id, const char *tenant, const char *subkey)
{
	FsLeafKey	key;
	FsLeaf	   *order;
	FsLeaf	   *leaf;
	bool		found;

	fs_leaf_key(&key, queue_id, tenant, subkey);
	leaf = hash_search(fs_leaf_hash, &key, HASH_FIND, NULL);
	if (leaf != NULL)
		return leaf;
	fs_leaf_key(&key, queue_id, tenant, "");
	order = hash_search(fs_leaf_hash, &key, HASH_ENTER_NULL, &found);
	if (order == NULL && fs_leaf_evict_one(NULL))
		order = hash_search(fs_leaf_hash, &key, HASH_ENTER_NULL, &found);
	if (order == NULL)
		return NULL;
	if (!found)
		fs_leaf_init(order, NULL);
	fs_leaf_key(&key, queue_id, tenant, subkey);
	leaf = hash_search(fs_leaf_hash, &key, HASH_ENTER_NULL, &found);
	/* Make room, but never by removing `order` with this tenant's last leaf. */
	if (leaf == NULL && fs_leaf_evict_one(order))
		leaf = hash_search(fs_leaf_hash, &key, HASH_ENTER_NULL, &found);
	if (leaf == NULL)
	{
		if (order->nleaves == 0)
			hash_search(fs_leaf_hash, &order->key, HASH_REMOVE, NULL);
		return NULL;
	}
	fs_leaf_init(leaf, order);
	order->nleaves++;
	fq->nleaves++;
	return leaf;
}

/* `rows` more (or fewer) ready rows of `leaf`, and of its tenant's leaves. */
static inline void
fs_leaf_add_rows(FsLeaf *leaf, int64 rows)
{
	leaf->ready_rows += rows;
	leaf->order->ready_rows += rows;
}

/* Into its tenant's order, if it has rows and is not there. */
static void
fs_leaf_enqueue(FsLeaf *leaf)
{
	pairingheap heap;

	if (leaf->queued || leaf->ready_rows <= 0)
		return;
	fs_order_open(leaf->order, &heap);
	pairingheap_add(&heap, &leaf->node);
	fs_order_close(leaf->order, &heap);
	leaf->queued = true;
}

/* Out of its tenant's order, if it is there. */
static void
fs_leaf_dequeue(FsLeaf *leaf)
{
	pairingheap heap;

	if (!leaf->queued)
		return;
	fs_order_open(leaf->order, &heap);
	pairingheap_remove(&heap, &leaf->node);
	fs_order_close(leaf->order, &heap);
	leaf->queued = false;
}

/*
 * Is `leaf` idle and owed nothing: no rows, out of its tenant's order, and
 * its tag not ahead of the tenant's virtual time (a leaf served last keeps
 * its tag while it is ahead, as an idle tenant keeps its own: one that
 * drained and came back at once would otherwise start before the sub-keys
 * that waited, every time).
 */
static inline bool
fs_leaf_spent(const FsLeaf *leaf)
{
	return leaf->ready_rows == 0 && !leaf->queued &&
		leaf->virtual_finish <= leaf->order->vtime;
}

/* Remove `leaf` from the table, and its tenant's entry with its last leaf. */
static void
fs_leaf_remove(FsFairQueue *fq, FsLeaf *leaf)
{
	FsLeaf	   *order = leaf->order;

	hash_search(fs_leaf_hash, &leaf->key, HASH_REMOVE, NULL);
	if (fq != NULL)
		fq->nleaves--;
	if (--order->nleaves == 0)
		hash_search(fs_leaf_hash, &order->key, HASH_REMOVE, NULL);
}

/*
 * A spent leaf leaves the table; not while the queue is being recounted
 * (the recount adjusts the leaves it saw by what they were off, as it does
 * tenants).
 */
static void
fs_leaf_drop_if_idle(FsFairQueue *fq, FsLeaf *leaf)
{
	if (fq->resyncing || !fs_leaf_spent(leaf))
		return;
	fs_leaf_remove(fq, leaf);
}

/*
 * The table is full: make room by removing one leaf without rows (of any
 * queue whose recount is not running), spent ones first, else one still
 * ahead of its tenant (which then loses that lead); never the last leaf of
 * the tenant entry `keep`, which the caller holds (its entry would go with
 * it).  False if there is none.  Scans the table: only when it is full.
 */
static bool
fs_leaf_evict_one(const FsLeaf *keep)
{
	HASH_SEQ_STATUS seq;
	FsLeaf	   *leaf;
	FsLeaf	   *victim = NULL;

	hash_seq_init(&seq, fs_leaf_hash);
	while ((leaf = hash_seq_search(&seq)) != NULL)
	{
		if (leaf->key.subkey[0] == '\0' || leaf->ready_rows != 0 || leaf->queued ||
			fs_fair->queues[leaf->key.queue_id].resyncing ||
			(leaf->order == keep && keep->nleaves <= 1))
			continue;
		victim = leaf;
		if (fs_leaf_spent(leaf))
		{
			hash_seq_term(&seq);
			break;
		}
	}
	if (victim == NULL)
		return false;
	fs_leaf_remove(&fs_fair->queues[victim->key.queue_id], victim);
	return true;
}

/* ----------------------------------------------------------------
 * Changes applied by commits, rollbacks and claims' settlements
 * ----------------------------------------------------------------
 */

/*
 * Apply `c` to the leaf (tenant, subkey) of `queue`: its rows (as
 * fs_fair_change() applies a tenant's, by the recount generation), its tag
 * (c->tag, already divided by the leaf's weight, and c->cost, divided by
 * it here), its newest adder, and
 * whether it came back short (c->dry, by c->dry_horizon as for a tenant).
 * A leaf gets an entry only when rows are added.  Takes the queue's lock
 * and the leaf lock; nothing here fails.
 */
void
fs_leaf_apply(FsQueue *queue, const char *tenant, const char *subkey, const FsTenantChange *c)
{
	FsLeafChange change;

	change.tenant = tenant;
	change.subkey = subkey;
	change.change = *c;
	fs_leaf_apply_many(queue, &change, 1);
}

/*
 * fs_leaf_apply() for `n` changes of leaves of `queue`, under one hold of
 * the locks (a claim's settlement applies each of its leaves).
 */
void
fs_leaf_apply_many(FsQueue *queue, const FsLeafChange *changes, int n)
{
	FsFairQueue *fq = fs_fair_queue(queue);
	int			i;

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	LWLockAcquire(fs_leaf_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < n; i++)
	{
		const FsTenantChange *c = &changes[i].change;
		int64		rows = fq->resync_gen == c->resync_gen ? c->rows : c->rows_recounted;
		FsLeaf	   *leaf;
		bool		listed;

		leaf = rows > 0 ? fs_leaf_enter(fq, queue->queue_id, changes[i].tenant, changes[i].subkey) :
			fs_leaf_find(queue->queue_id, changes[i].tenant, changes[i].subkey);
		if (leaf == NULL)
			continue;
		fs_leaf_dequeue(leaf);
		listed = fs_backlog_lists(leaf->ready_rows, rows);
		fs_leaf_add_rows(leaf, rows);
		if (c->rows > 0)
			leaf->dry_until = 0;
		if (FullTransactionIdIsValid(c->adder) &&
			FullTransactionIdPrecedes(leaf->backlog_fxid, c->adder))
			leaf->backlog_fxid = c->adder;
		(void) fs_listing_after(listed, c->adder, c->rows, &leaf->listed_xid);
		leaf->virtual_finish = Max(leaf->virtual_finish + c->tag +
								   c->cost / (leaf->weight_generation != 0 ? leaf->weight : 1.0),
								   0.0);
		if (c->dry && (!FullTransactionIdIsValid(c->dry_horizon) ||
					   FullTransactionIdPrecedes(leaf->backlog_fxid, c->dry_horizon)))
		{
			leaf->dry_until = c->now + FS_DRY_RETRY_USECS;
			FS_FAIR_COUNT(fq, short_probes, 1);
		}
		fs_leaf_enqueue(leaf);
		fs_leaf_drop_if_idle(fq, leaf);
	}
	LWLockRelease(fs_leaf_shared->lock);
	LWLockRelease(fq->lock);
}

/*
 * Forget every leaf of a queue (its fair order is forgotten: order.c's
 * fs_fair_forget()).  Caller holds fq->lock exclusively.
 */
void
fs_leaves_forget(FsFairQueue *fq, uint32 queue_id)
{
	HASH_SEQ_STATUS seq;
	FsLeaf	   *leaf;

	if (fq->nleaves == 0)
		return;
	LWLockAcquire(fs_leaf_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, fs_leaf_hash);
	while ((leaf = hash_seq_search(&seq)) != NULL)
		if (leaf->key.queue_id == queue_id)
			hash_search(fs_leaf_hash, &leaf->key, HASH_REMOVE, NULL);
	fq->nleaves = 0;
	LWLockRelease(fs_leaf_shared->lock);
}

/* ----------------------------------------------------------------
 * Weights (fs_subkey_weights), cached per backend and per queue
 * ----------------------------------------------------------------
 */

typedef struct FsWeightKey
{
	char		tenant[FS_NAME_BUFLEN];	/* or "*" */
	char		subkey[FS_NAME_BUFLEN];
} FsWeightKey;

typedef struct FsWeight
{
	FsWeightKey key;
	float8		weight;
	bool		queue_exact;	/* the row named the queue, not '*' */
} FsWeight;

/*
 * The weights of `desc`'s queue's sub-keys, read from fs_subkey_weights as
 * committed (the latest snapshot) when fs_limits' generation moved (its
 * trigger is fs_subkey_weights' too).  Before planning: this runs SPI.
 */
void
fs_subkey_weights_load(FsFairDesc *desc, HTAB **weights, uint32 *generation)
{
	uint32		now_generation = pg_atomic_read_u32(&fs_shared->limits_generation);
	HASHCTL		info;
	Snapshot	snapshot;
	Datum		arg;
	Oid			argtypes[1] = {TEXTOID};
	SPIPlanPtr	plan;
	char	   *query;
	int			ret;
	uint64		r;
	HTAB	   *table;

	if (*weights != NULL && *generation == now_generation)
		return;
	pg_memory_barrier();
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(FsWeightKey);
	info.entrysize = sizeof(FsWeight);
	info.hcxt = desc->cxt;
	table = hash_create("fairshare sub-key weights", 64, &info,
						HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	query = psprintf("SELECT tenant, subkey, weight, queue OPERATOR(pg_catalog.<>) '*'"
					 "  FROM %s.fs_subkey_weights"
					 " WHERE queue OPERATOR(pg_catalog.=) ANY (ARRAY[$1, '*']::pg_catalog.text[])",
					 quote_identifier(fs_extension_schema()));
	arg = CStringGetTextDatum(desc->queue_name);
	plan = SPI_prepare(query, 1, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for fs_subkey_weights: %s",
			 SPI_result_code_string(SPI_result));
	/*
	 * The latest snapshot, blind to this transaction's own changes (as the
	 * limits are read): what it caches is shared through the leaves, so it
	 * must be what is committed.
	 */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	snapshot->curcid = FirstCommandId;
	ret = SPI_execute_snapshot(plan, &arg, NULL, snapshot, InvalidSnapshot, true, false, 0);
	UnregisterSnapshot(snapshot);
	SPI_freeplan(plan);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "reading fs_subkey_weights failed: %s", SPI_result_code_string(ret));
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[r];
		TupleDesc	tupdesc = SPI_tuptable->tupdesc;
		bool		isnull;
		FsWeightKey key;
		FsWeight   *w;
		bool		found;
		bool		exact;

		memset(&key, 0, sizeof(key));
		text_to_cstring_buffer(DatumGetTextPP(SPI_getbinval(tuple, tupdesc, 1, &isnull)),
							   key.tenant, FS_NAME_BUFLEN);
		text_to_cstring_buffer(DatumGetTextPP(SPI_getbinval(tuple, tupdesc, 2, &isnull)),
							   key.subkey, FS_NAME_BUFLEN);
		exact = DatumGetBool(SPI_getbinval(tuple, tupdesc, 4, &isnull));
		w = hash_search(table, &key, HASH_ENTER, &found);
		if (!found || (exact && !w->queue_exact))
		{
			w->weight = DatumGetFloat8(SPI_getbinval(tuple, tupdesc, 3, &isnull));
			w->queue_exact = exact;
		}
	}
	if (*weights != NULL)
		hash_destroy(*weights);
	*weights = table;
	*generation = now_generation;
}

/*
 * The weight of `leaf` by the plan's weights (no allocation: under the
 * locks): (tenant, sub-key), then ('*', sub-key), then 1.  Cached in the
 * leaf with the generation it was read at.
 */
static float8
fs_leaf_weight(const FsPlan *plan, FsLeaf *leaf)
{
	FsWeightKey key;
	FsWeight   *w;

	if (leaf->weight_generation != 0 && leaf->weight_generation == plan->weights_generation)
		return leaf->weight;
	memset(&key, 0, sizeof(key));
	strlcpy(key.tenant, leaf->key.tenant, FS_NAME_BUFLEN);
	strlcpy(key.subkey, leaf->key.subkey, FS_NAME_BUFLEN);
	w = hash_search(plan->weights, &key, HASH_FIND, NULL);
	if (w == NULL)
	{
		strlcpy(key.tenant, FS_WILDCARD, FS_NAME_BUFLEN);
		w = hash_search(plan->weights, &key, HASH_FIND, NULL);
	}
	leaf->weight = fs_fair_weight(w != NULL ? w->weight : 1.0);
	leaf->weight_generation = plan->weights_generation;
	return leaf->weight;
}

/* ----------------------------------------------------------------
 * Planning a claim (fq->lock held exclusively; plan.c)
 * ----------------------------------------------------------------
 */

/* Room for the plan's leaves, before any lock. */
void
fs_plan_leaves_init(FsPlan *plan, FsFairDesc *desc, int32 want)
{
	plan->leaves = desc->subkey != NULL;
	if (!plan->leaves)
		return;
	fs_subkey_weights_load(desc, &desc->subkey_weights, &desc->subkey_weights_generation);
	plan->weights = desc->subkey_weights;
	plan->weights_generation = desc->subkey_weights_generation;
	plan->pick_leaf = palloc(sizeof(int) * want);
	plan->plan_leaves = palloc0(sizeof(FsPlanLeaf) * want);
	plan->nleaves = 0;
	plan->leaf_map_keys = palloc0(sizeof(FsLeaf *) * plan->map_size);
	plan->leaf_map_values = palloc(sizeof(int) * plan->map_size);
	plan->leaf_aside_capacity = 4 * want + 64;
	plan->leaf_aside = palloc(sizeof(FsLeaf *) * plan->leaf_aside_capacity);
	plan->nleaf_aside = 0;
}

/* Take the leaf lock for planning (after fq->lock). */
void
fs_plan_leaves_lock(FsPlan *plan)
{
	if (plan->leaves)
		LWLockAcquire(fs_leaf_shared->lock, LW_EXCLUSIVE);
}

/* The plan's record of `leaf`, created if `create`. */
static FsPlanLeaf *
fs_plan_leaf(FsPlan *plan, FsLeaf *leaf, bool create)
{
	uint32		h = (uint32) (((uintptr_t) leaf >> 4) * 2654435761u);
	int			mask = plan->map_size - 1;
	int			i;

	for (i = h & mask;; i = (i + 1) & mask)
	{
		if (plan->leaf_map_keys[i] == leaf)
			return &plan->plan_leaves[plan->leaf_map_values[i]];
		if (plan->leaf_map_keys[i] == NULL)
			break;
	}
	if (!create || plan->nleaves >= plan->capacity)
		return NULL;
	plan->leaf_map_keys[i] = leaf;
	plan->leaf_map_values[i] = plan->nleaves;
	return &plan->plan_leaves[plan->nleaves++];
}

/*
 * The leaf the next row of `entry` comes from: the first of its tenant's
 * order that this claim does not pass over (short earlier in it, or dry
 * while the plan skips dry ones), the others set aside until the plan ends.
 * NULL with *blocked false: the tenant has no leaf to serve now but has
 * rows no leaf counts (`tenant_ready`, its count, is above the sum of its
 * leaves': the table had no room, or a commit's change of the tenant came
 * before its leaf's), taken as a whole; NULL with *blocked true: none of
 * its leaves can be served now, and neither can the tenant.
 */
FsLeaf *
fs_plan_leaf_choose(FsPlan *plan, FsTenant *entry, int64 tenant_ready, TimestampTz now,
					bool *blocked)
{
	FsLeaf	   *order = fs_leaf_find(entry->key.queue_id, entry->key.tenant, "");
	pairingheap heap;
	FsLeaf	   *leaf = NULL;
	bool		set_aside = false;

	*blocked = false;
	if (order == NULL)
		return NULL;
	fs_order_open(order, &heap);
	while (!pairingheap_is_empty(&heap))
	{
		FsLeaf	   *top = pairingheap_container(FsLeaf, node, pairingheap_first(&heap));
		bool		dry = plan->skip_dry && top->dry_until > now;
		bool		seen = fs_plan_sees_listing(plan, top->listed_xid, top->backlog_fxid);

		if (!dry && seen && (plan->passed == NULL || !fs_passed_over_has(plan->passed, top)))
		{
			leaf = top;
			break;
		}
		if (plan->nleaf_aside >= plan->leaf_aside_capacity)
			break;
		(void) pairingheap_remove_first(&heap);
		top->queued = false;
		plan->leaf_aside[plan->nleaf_aside++] = top;
		set_aside = true;
		if (dry && seen)
			plan->skipped_dry = true;	/* unseen: a pass without skip_dry skips it too */
	}
	fs_order_close(order, &heap);
	if (leaf == NULL && tenant_ready > order->ready_rows)
		*blocked = false;		/* rows no leaf counts: the tenant's as a whole */
	else if (leaf == NULL && (set_aside || order->root != NULL))
		*blocked = true;
	else if (leaf == NULL)
	{
		/* Its leaves were set aside earlier in this plan: blocked too. */
		int			i;

		for (i = 0; i < plan->nleaf_aside && !*blocked; i++)
			*blocked = plan->leaf_aside[i]->order == order;
	}
	return leaf;
}

/*
 * Reserve the next row of `leaf` for the plan's latest pick (of tenant
 * `tenant_index`): on its tenant's virtual time, as the queue's order does
 * for tenants.
 */
void
fs_plan_leaf_pick(FsPlan *plan, FsLeaf *leaf, int tenant_index, float8 est_cost)
{
	FsLeaf	   *order = leaf->order;
	FsPlanLeaf *pl = fs_plan_leaf(plan, leaf, true);
	float8		weight = fs_leaf_weight(plan, leaf);
	float8		start = Max(order->vtime, leaf->virtual_finish);
	float8		finish = start + est_cost / weight;
	pairingheap heap;

	Assert(pl != NULL && leaf->queued);
	if (pl->planned == 0)
	{
		strlcpy(pl->subkey, leaf->key.subkey, FS_NAME_BUFLEN);
		pl->leaf = leaf;
		pl->tenant = tenant_index;
		pl->est_cost = est_cost;
		pl->weight = weight;
	}
	pl->planned++;
	pl->charge += finish - leaf->virtual_finish;
	plan->pick_leaf[plan->npicks - 1] = (int) (pl - plan->plan_leaves);

	order->vtime = start;
	fs_order_open(order, &heap);
	(void) pairingheap_remove_first(&heap);
	leaf->queued = false;
	leaf->virtual_finish = finish;
	fs_leaf_add_rows(leaf, -1);
	fs_order_close(order, &heap);
	fs_leaf_enqueue(leaf);
}

/* The end of planning: leaves set aside go back, and the leaf lock goes. */
void
fs_plan_leaves_unlock(FsPlan *plan)
{
	int			i;

	if (!plan->leaves)
		return;
	for (i = 0; i < plan->nleaf_aside; i++)
		fs_leaf_enqueue(plan->leaf_aside[i]);
	plan->nleaf_aside = 0;
	LWLockRelease(fs_leaf_shared->lock);
}

/* ----------------------------------------------------------------
 * Recounts (recount.c)
 * ----------------------------------------------------------------
 */

/*
 * Copy the live counts of `fq`'s leaves into at[] (room for `capacity`):
 * false, with *needed set, if there are more.  Caller holds fq->lock
 * exclusively, with the commit barrier closed.
 */
bool
fs_leaves_snapshot(FsFairQueue *fq, uint32 queue_id, FsLeafCountAt *at, int32 capacity,
				   int32 *nat, int32 *needed)
{
	HASH_SEQ_STATUS seq;
	FsLeaf	   *leaf;

	*nat = 0;
	*needed = fq->nleaves;
	if (fq->nleaves > capacity)
		return false;
	if (fq->nleaves == 0)
		return true;
	LWLockAcquire(fs_leaf_shared->lock, LW_SHARED);
	hash_seq_init(&seq, fs_leaf_hash);
	while ((leaf = hash_seq_search(&seq)) != NULL)
	{
		if (leaf->key.queue_id != queue_id || leaf->key.subkey[0] == '\0')
			continue;
		if (*nat >= capacity)
		{
			hash_seq_term(&seq);
			break;
		}
		at[*nat].key = leaf->key;
		at[*nat].generation = leaf->generation;
		at[*nat].rows = leaf->ready_rows;
		(*nat)++;
	}
	LWLockRelease(fs_leaf_shared->lock);
	return true;
}

/*
 * The end of a recount: each leaf counted (counts[], ncounts) or live at the
 * snapshot (at[], nat) is adjusted by (counted - live at the snapshot), as
 * tenants are; a leaf made since the snapshot was not in it.  Caller holds
 * fq->lock exclusively (the queue is still `resyncing`).
 */
void
fs_leaves_recounted(FsFairQueue *fq, uint32 queue_id, const FsLeafCount *counts, int32 ncounts,
					const FsLeafCountAt *at, int32 nat)
{
	int32		i;

	LWLockAcquire(fs_leaf_shared->lock, LW_EXCLUSIVE);
	for (i = 0; i < nat; i++)
	{
		FsLeaf	   *leaf = hash_search(fs_leaf_hash, &at[i].key, HASH_FIND, NULL);

		if (leaf == NULL || leaf->generation != at[i].generation)
			continue;
		fs_leaf_dequeue(leaf);
		fs_leaf_add_rows(leaf, -at[i].rows);
		leaf->dry_until = 0;
	}
	for (i = 0; i < ncounts; i++)
	{
		FsLeaf	   *leaf = fs_leaf_enter(fq, queue_id, counts[i].tenant, counts[i].subkey);

		if (leaf == NULL)
			continue;			/* no room: counted by its tenant alone */
		fs_leaf_dequeue(leaf);
		fs_leaf_add_rows(leaf, counts[i].rows);
		leaf->dry_until = 0;
	}
	LWLockRelease(fs_leaf_shared->lock);
}

/*
 * After the recount is over (not `resyncing` any more): every leaf of the
 * queue back in its order, or out of the table without rows, and tenants'
 * entries without leaves with them.  A scan may remove only the entry it
 * just returned (dynahash), so tenants' entries go in a second scan.
 * Caller holds fq->lock exclusively.
 */
void
fs_leaves_settle_all(FsFairQueue *fq, uint32 queue_id)
{
	HASH_SEQ_STATUS seq;
	FsLeaf	   *leaf;

	if (fq->nleaves == 0)
		return;
	LWLockAcquire(fs_leaf_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, fs_leaf_hash);
	while ((leaf = hash_seq_search(&seq)) != NULL)
	{
		if (leaf->key.queue_id != queue_id || leaf->key.subkey[0] == '\0')
			continue;
		fs_leaf_enqueue(leaf);
		if (fs_leaf_spent(leaf))
		{
			/*
			 * Not fs_leaf_remove(): it may remove the tenant's entry, another
			 * element than the one a scan may remove; those go next, in a
			 * scan of their own.
			 */
			leaf->order->nleaves--;
			hash_search(fs_leaf_hash, &leaf->key, HASH_REMOVE, NULL);
			fq->nleaves--;
		}
	}
	hash_seq_init(&seq, fs_leaf_hash);
	while ((leaf = hash_seq_search(&seq)) != NULL)
		if (leaf->key.queue_id == queue_id && leaf->key.subkey[0] == '\0' && leaf->nleaves == 0)
			hash_search(fs_leaf_hash, &leaf->key, HASH_REMOVE, NULL);
	LWLockRelease(fs_leaf_shared->lock);
}

/*
 * For fs_explain_wait(): the rows of the other sub-keys of `tenant` that a
 * row of `subkey` waits for, when `own_ahead` rows of its own sub-key come
 * before it.  Its start is S = max(v, F) + own_ahead * cost / w; a sub-key
 * starting before S takes as many rows as its tag lets it until S, at most
 * its backlog.  *subkeys_ahead counts those sub-keys.  -1 when the sub-key
 * has no entry (no counted rows).  Reads only.
 */
int64
fs_leaf_rows_ahead(FsQueue *queue, const char *tenant, const char *subkey, int64 own_ahead,
				   float8 cost, int32 *subkeys_ahead)
{
	FsFairQueue *fq = fs_fair_queue(queue);
	FsLeaf	   *leaf;
	int64		rows = -1;

	*subkeys_ahead = 0;
	if (fs_leaf_hash == NULL || !(cost > 0))
		return -1;
	LWLockAcquire(fq->lock, LW_SHARED);
	LWLockAcquire(fs_leaf_shared->lock, LW_SHARED);
	leaf = fs_leaf_find(queue->queue_id, tenant, subkey);
	if (leaf != NULL)
	{
		FsLeaf	   *order = leaf->order;
		float8		weight = leaf->weight_generation != 0 ? leaf->weight : 1.0;
		float8		start = Max(order->vtime, leaf->virtual_finish) + own_ahead * cost / weight;
		HASH_SEQ_STATUS seq;
		FsLeaf	   *other;

		rows = 0;
		hash_seq_init(&seq, fs_leaf_hash);
		while ((other = hash_seq_search(&seq)) != NULL)
		{
			float8		other_start;
			float8		other_weight;
			float8		steps;
			int64		n;

			if (other == leaf || other->key.subkey[0] == '\0' || other->order != order ||
				other->ready_rows <= 0)
				continue;
			other_start = Max(order->vtime, other->virtual_finish);
			if (other_start > start ||
				(other_start == start && strcmp(other->key.subkey, subkey) > 0))
				continue;
			other_weight = other->weight_generation != 0 ? other->weight : 1.0;
			steps = Min((start - other_start) * other_weight / cost, (float8) PG_INT32_MAX);
			/* Its rows start at other_start, one step apart; a tie goes by name. */
			n = strcmp(other->key.subkey, subkey) < 0 ? (int64) floor(steps) + 1 :
				(int64) ceil(steps);
			if (n <= 0)
				continue;
			rows += Min(n, other->ready_rows);
			(*subkeys_ahead)++;
		}
	}
	LWLockRelease(fs_leaf_shared->lock);
	LWLockRelease(fq->lock);
	return rows;
}

/* ----------------------------------------------------------------
 * fs_fair_subkeys(queue text)
 * ----------------------------------------------------------------
 */

typedef struct FsLeafRow
{
	FsLeafKey	key;
	int64		ready;
	float8		weight;
	float8		tag;
	float8		start;
	TimestampTz dry_until;
	bool		weighted;
} FsLeafRow;

/*
 * fs_fair_subkeys(queue text)
 *	 RETURNS TABLE(tenant text, subkey text, ready_rows bigint,
 *				   virtual_start float8, weight float8, passed_over_until timestamptz)
 *
 * The leaves of a queue registered with a subkey, as shared memory has them
 * now.  The caller needs SELECT on the queue's table (as fs_fair_shares).
 */
Datum
fs_fair_subkeys(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	FsFairDesc *desc;
	FsFairQueue *fq;
	FsLeafRow  *rows;
	int32		capacity;
	int32		n = 0;
	HASH_SEQ_STATUS seq;
	FsLeaf	   *leaf;
	int32		i;

	desc = fs_fair_desc_arg(fcinfo, 0);
	/* As fs_ready_tenants(): the counts are of every tenant's rows. */
	fs_fair_check_counts_readable(desc, "fs_fair_subkeys", "list the sub-keys");
	InitMaterializedSRF(fcinfo, 0);
	fq = desc->fq;
	if (fq == NULL || fs_leaf_hash == NULL)
		PG_RETURN_NULL();

	for (;;)
	{
		LWLockAcquire(fq->lock, LW_SHARED);
		capacity = fq->nleaves;
		LWLockRelease(fq->lock);
		rows = palloc(sizeof(FsLeafRow) * (Max(capacity, 0) + 16));
		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		if (fq->nleaves > capacity + 16)
		{
			LWLockRelease(fq->lock);
			pfree(rows);
			continue;
		}
		LWLockAcquire(fs_leaf_shared->lock, LW_SHARED);
		hash_seq_init(&seq, fs_leaf_hash);
		while ((leaf = hash_seq_search(&seq)) != NULL)
		{
			if (leaf->key.queue_id != desc->queue->queue_id || leaf->key.subkey[0] == '\0' ||
				leaf->ready_rows == 0)
				continue;
			if (n >= capacity + 16)
			{
				hash_seq_term(&seq);
				break;
			}
			rows[n].key = leaf->key;
			rows[n].ready = leaf->ready_rows;
			rows[n].weight = leaf->weight;
			rows[n].weighted = leaf->weight_generation != 0;
			rows[n].tag = leaf->virtual_finish;
			rows[n].start = Max(leaf->order->vtime, leaf->virtual_finish);
			rows[n].dry_until = leaf->dry_until;
			n++;
		}
		LWLockRelease(fs_leaf_shared->lock);
		LWLockRelease(fq->lock);
		break;
	}

	for (i = 0; i < n; i++)
	{
		Datum		values[6];
		bool		nulls[6] = {false, false, false, false, false, false};

		values[0] = CStringGetTextDatum(rows[i].key.tenant);
		values[1] = CStringGetTextDatum(rows[i].key.subkey);
		values[2] = Int64GetDatum(rows[i].ready);
		values[3] = Float8GetDatum(rows[i].start);
		values[4] = Float8GetDatum(rows[i].weight);
		nulls[4] = !rows[i].weighted;
		values[5] = TimestampTzGetDatum(rows[i].dry_until);
		nulls[5] = rows[i].dry_until == 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	PG_RETURN_NULL();
}

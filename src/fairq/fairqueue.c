/*-------------------------------------------------------------------------
 *
 * fairqueue.c
 *	  Fair per-tenant dequeue: the fair order in shared memory, fs_claim(),
 *	  fs_ready_tenants(), recounting backlogs, and the fairness metrics.
 *
 * Fair order is start-time fair queueing (SFQ) over the tenants of a queue.
 * Each tenant has a virtual finish tag F (FsTenant.virtual_finish), the
 * queue a virtual time V (the start tag of the last claimed row).  The next
 * row goes to the backlogged tenant with the smallest start tag
 * S = max(V, F); claiming it sets V = S and F = S + cost / weight.  A
 * tenant back from idle has F < V, so it starts at V: no banked credit.
 * With charge_runtime, the lease's held time is charged when the row leaves
 * the running table, correcting the estimate charged at claim.  Tenants
 * below their min_slots are served before everyone else (a guaranteed
 * floor); the rest is shared by SFQ, and a claim keeps going down the order
 * until it has its rows or no tenant with capacity has ready rows
 * (work-conserving).
 *
 * Backlogged tenants (ready_rows > 0) sit in a binary min-heap on F per
 * queue, kept in chunks found through a radix directory, both from shared
 * pools (see "Shared memory" below), under the queue's LWLock (shmem.c rule
 * 8).  Each tenant entry keeps its position in that heap
 * (FsTenant.heap_index), which is under the queue's LWLock too, not under
 * the entry's spinlock: every heap operation writes it, and a tenant is
 * found in its heap in constant time.  Taking the smallest F picks the
 * smallest start tag: every tenant with F < V starts at V, and among equals
 * the one idle longest (smallest F) goes first, then by name, so order is
 * deterministic.
 *
 * A claim (fs_claim) plans under the lock: it takes tenants off the heap in
 * order, checks each one's capacity (slots in use and the gate's ceiling),
 * reserves its rows (ready_rows -= 1) and advances its tag, so concurrent
 * claimers are spread over different tenants at once.  Then, with no lock
 * held, it admits each planned row (a slot lease), locks the rows with one
 * LATERAL query FOR UPDATE SKIP LOCKED in the caller's snapshot, and settles:
 * reservations and tags for rows it did not get are given back, a tenant
 * with fewer claimable rows than counted is marked dry for a second.
 * Everything a claim did is recorded (fairqueue_track.c) and undone if its
 * (sub)transaction rolls back.
 *
 * Backlog counts come from triggers, applied at commit, and are recounted
 * from the table on a queue's first use in each server run, after
 * registration, on demand (fs_resync) and periodically by the background
 * worker (fs_fairqueue_resync_all).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "budget/budget.h"
#include "core/stateformat.h"
#include "core/subxact.h"
#include "fairq/fairqueue_int.h"
#include "gate/gate.h"
#include "limits/limits.h"
#include "slots/slots.h"

PG_FUNCTION_INFO_V1(fs_claim);
PG_FUNCTION_INFO_V1(fs_ready_tenants);
PG_FUNCTION_INFO_V1(fs_resync);
PG_FUNCTION_INFO_V1(fs_fairness_state);
PG_FUNCTION_INFO_V1(fs_fair_share_state);

/* Weights below this are treated as this (keeps tags finite). */
#define FS_MIN_WEIGHT		1e-6

/* Weight of the newest sample in the moving averages of cost and run time. */
#define FS_EMA_ALPHA		0.05

/* A claim takes at most this many rounds down the fair order. */
#define FS_CLAIM_MAX_ROUNDS	16


FsFairShared *fs_fair = NULL;

/* ----------------------------------------------------------------
 * Shared memory
 *
 * Each queue's fair order is a binary heap of FsHeapItem, item i in chunk
 * i / C at i % C (C = FS_HEAP_CHUNK).  A queue finds its chunks through a
 * radix directory of fan-out F (FS_HEAP_FANOUT): a heap of k chunks has
 * depth d, the least with F^d >= k (0 for one chunk: then the root is the
 * chunk itself), and the chunk of item i is found by going down d nodes by
 * the digits of i / C in base F, the highest first.  The depth grows at the
 * root (the old root becomes the new one's first child) and shrinks there
 * too, so heap_at() costs d + 1 loads: one up to C items, two up to C F
 * (2,048), three up to C F^2 (262,144), four up to C F^3 (33 million, more
 * than fairshare.max_tenants allows).
 *
 * Chunks and directory nodes come from two pools shared by every queue.
 * Nothing is sized per (queue, tenant) pair: the pools are sized so that any
 * spread of at most N = max_tenants items over at most Q = max_queues heaps
 * fits, as follows.
 *
 * Let m be the tenants of a queue marked FS_TENANT_QUEUED (in its heap, or
 * set aside by a claim's planning) and k its chunks.  A heap takes a chunk
 * only when its items fill the chunks it has, so right after k <=
 * ceil(m / C); heap_shrink() gives chunks back down to one spare beyond
 * those m items fill (all but one when m = 0), and runs before a tenant
 * leaving the heap loses its mark.  So at every instant k <= 1 when m = 0,
 * and k <= ceil(m / C) + 1 <= (m + C - 1) / C + 1 otherwise.  An entry is
 * marked in at most one heap (its queue's), and the tenant table holds at
 * most N entries: the m add up to at most N, and at most Q' = min(Q, N)
 * queues have m >= 1.  Summing over the queues:
 *
 *	 chunks <= (N + (C - 1) Q') / C + Q
 *
 * A heap of k >= 2 chunks has ceil(k / F^l) nodes at each level l = 1 .. d.
 * Over a tree's nodes, (children - 1) adds up to k - 1, so at most
 * (k - 1) / (F - 1) nodes are full; the others are the last of their level,
 * at most d of them, and d - 1 <= (k - 1) / (F - 1) because
 * k > F^(d - 1).  So a heap takes at most 1 + 2 (k - 1) / (F - 1) nodes,
 * none with k <= 1, and with k - 1 <= (m + C - 1) / C:
 *
 *	 nodes <= Q' + 2 (N + (C - 1) Q') / (C (F - 1))
 *
 * With C = 16, F = 128, FsHeapItem of 32 bytes and nodes of 512: 32 bytes
 * per tenant plus two 512-byte chunks per queue, and a node per queue plus
 * one per 1,016 tenants.  README.md gives the totals for a few settings.
 * ----------------------------------------------------------------
 */

/* Queues that can have a tenant in their fair order at once: Q' above. */
static int64
fs_heap_busy_queues(void)
{
	return Min((int64) fs_max_queues, (int64) fs_max_tenants);
}

/* Chunks in the pool: the bound proved above. */
static int32
fs_heap_pool_chunks(void)
{
	int64		busy = fs_heap_busy_queues();

	return (int32) ((fs_max_tenants + (FS_HEAP_CHUNK - 1) * busy) / FS_HEAP_CHUNK +
					fs_max_queues);
}

/* Directory nodes in the pool: the bound proved above. */
static int32
fs_heap_pool_nodes(void)
{
	int64		busy = fs_heap_busy_queues();

	return (int32) (busy + 2 * (fs_max_tenants + (FS_HEAP_CHUNK - 1) * busy) /
					((int64) FS_HEAP_CHUNK * (FS_HEAP_FANOUT - 1)));
}

static Size
fs_fair_struct_size(void)
{
	Size		size;

	size = add_size(offsetof(FsFairShared, queues),
					mul_size(sizeof(FsFairQueue), fs_max_queues));
	size = MAXALIGN(size);
	size = add_size(size, MAXALIGN(mul_size(sizeof(int32), fs_heap_pool_chunks())));
	size = add_size(size, mul_size(mul_size(sizeof(FsHeapItem), FS_HEAP_CHUNK),
								   fs_heap_pool_chunks()));
	size = add_size(size, mul_size(sizeof(FsHeapDirNode), fs_heap_pool_nodes()));
	return size;
}

static Size
fs_fairqueue_shmem_size(void)
{
	return add_size(fs_fair_struct_size(), fs_claim_map_shmem_size());
}

void
fs_fairqueue_shmem_request(void)
{
	RequestAddinShmemSpace(fs_fairqueue_shmem_size());
	RequestNamedLWLockTranche("fairshare fair dequeue", fs_max_queues + FS_CLAIM_PARTITIONS);
}

void
fs_fairqueue_shmem_init(void)
{
	bool		found;
	char	   *p;
	LWLockPadded *locks;
	int			i;

	fs_fair = ShmemInitStruct("fairshare fair dequeue", fs_fair_struct_size(), &found);
	if (!found)
	{
		int32		nchunks = fs_heap_pool_chunks();
		int32		nnodes = fs_heap_pool_nodes();

		memset(fs_fair, 0, offsetof(FsFairShared, queues) + sizeof(FsFairQueue) * fs_max_queues);
		locks = GetNamedLWLockTranche("fairshare fair dequeue");
		pg_atomic_init_u32(&fs_fair->registration_generation, 1);
		SpinLockInit(&fs_fair->pool_mutex);
		fs_fair->pool_chunks = nchunks;
		fs_fair->pool_nodes = nnodes;
		fs_fair->claim_locks = &locks[fs_max_queues];

		for (i = 0; i < fs_max_queues; i++)
		{
			FsFairQueue *fq = &fs_fair->queues[i];

			fq->lock = &locks[i].lock;
			pg_atomic_init_u32(&fq->commit_gate, 0);
			pg_atomic_init_u64(&fq->latency_sampled_at, 0);
			fq->avg_cost = 1.0;
			fq->avg_runtime_ms = 1.0;
			fq->heap_root = -1;
		}
		p = (char *) fs_fair + MAXALIGN(offsetof(FsFairShared, queues) +
										sizeof(FsFairQueue) * fs_max_queues);
		fs_fair->chunk_next = (int32 *) p;
		p += MAXALIGN(sizeof(int32) * (Size) nchunks);
		fs_fair->chunks = (FsHeapItem *) p;
		p += sizeof(FsHeapItem) * FS_HEAP_CHUNK * (Size) nchunks;
		fs_fair->nodes = (FsHeapDirNode *) p;

		for (i = 0; i < nchunks; i++)
			fs_fair->chunk_next[i] = i + 1 < nchunks ? i + 1 : -1;
		fs_fair->chunk_free = nchunks > 0 ? 0 : -1;
		fs_fair->chunks_unused = nchunks;
		for (i = 0; i < nnodes; i++)
			fs_fair->nodes[i].ids[0] = i + 1 < nnodes ? i + 1 : -1;
		fs_fair->node_free = nnodes > 0 ? 0 : -1;
		fs_fair->nodes_unused = nnodes;
	}
	locks = GetNamedLWLockTranche("fairshare fair dequeue");
	fs_lockstats_name_locks("fair order", locks, fs_max_queues);
	fs_lockstats_name_locks("claim map partition", &locks[fs_max_queues], FS_CLAIM_PARTITIONS);
	fs_claim_map_shmem_init();
}

/* The fair-order state of `queue` (which must not be NULL). */
FsFairQueue *
fs_fair_queue(FsQueue *queue)
{
	FsFairQueue *fq = &fs_fair->queues[queue->queue_id];

	/* Written once with the same value by whoever comes first. */
	if (fq->queue == NULL)
		fq->queue = queue;
	return fq;
}

/* ----------------------------------------------------------------
 * The heap (caller holds fq->lock exclusively)
 *
 * Every operation that puts an item at a position writes that position to
 * the item's tenant entry (FsTenant.heap_index), so a tenant is found in
 * its heap in constant time (heap_find).
 * ----------------------------------------------------------------
 */

/* Chunks a directory of `depth` levels can address: F^depth. */
static inline int64
heap_span(int depth)
{
	return (int64) 1 << (depth * FS_HEAP_FANOUT_SHIFT);
}

/* Item i of the heap (i < nchunks * FS_HEAP_CHUNK): down the directory. */
static inline FsHeapItem *
heap_at(const FsFairQueue *fq, int32 i)
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
heap_less(const FsHeapItem *a, const FsHeapItem *b)
{
	if (a->key != b->key)
		return a->key < b->key;
	return strcmp(a->tenant->key.tenant, b->tenant->key.tenant) < 0;
}

#ifdef FS_DEBUG
/*
 * The directory of a queue, checked: every id on the way to each chunk in
 * range, the depth the least that addresses the chunks, and no more chunks
 * than the pools' sizing allows (one spare beyond those the items fill).
 * Caller holds fq->lock (no claim is planning: no item is set aside).
 */
static bool
heap_directory_ok(const FsFairQueue *fq)
{
	int32		needed = (fq->nitems + FS_HEAP_CHUNK - 1) / FS_HEAP_CHUNK;
	int			depth = 0;
	int32		k;

	if (fq->nchunks < needed || fq->nchunks > Max(needed + 1, 1))
		return false;
	if (fq->nchunks == 0)
		return fq->heap_root == -1 && fq->heap_depth == 0;
	while (heap_span(depth) < fq->nchunks)
		depth++;
	if (fq->heap_depth != depth || depth > FS_HEAP_MAX_DEPTH)
		return false;
	for (k = 0; k < fq->nchunks; k++)
	{
		int32		id = fq->heap_root;
		int			level;

		for (level = fq->heap_depth; level > 0; level--)
		{
			if (id < 0 || id >= fs_fair->pool_nodes)
				return false;
			id = fs_fair->nodes[id].ids[(k >> ((level - 1) * FS_HEAP_FANOUT_SHIFT)) &
										(FS_HEAP_FANOUT - 1)];
		}
		if (id < 0 || id >= fs_fair->pool_chunks)
			return false;
	}
	return true;
}

/*
 * The debug build's check of a queue's fair order: its directory sound, a
 * heap (no child before its parent), every listed tenant marked as listed
 * (the mark is its pin) and knowing its position, and a finite virtual
 * time.  Takes the queue's lock shared; reports after letting go of it.
 */
static void
fs_fair_debug_check(FsFairQueue *fq)
{
	bool		directory;
	bool		ordered = true;
	bool		pinned = true;
	bool		positioned = true;
	bool		finite;
	int32		i;

	if (fq == NULL)
		return;
	LWLockAcquire(fq->lock, LW_SHARED);
	directory = heap_directory_ok(fq);
	finite = !isnan(fq->vtime) && !isinf(fq->vtime);
	for (i = 0; directory && i < fq->nitems; i++)
	{
		FsHeapItem *item = heap_at(fq, i);
		uint8		flags;

		if (i > 0 && heap_less(item, heap_at(fq, (i - 1) / 2)))
			ordered = false;
		if (item->tenant->heap_index != i)
			positioned = false;
		SpinLockAcquire(&item->tenant->mutex);
		flags = item->tenant->flags;
		SpinLockRelease(&item->tenant->mutex);
		if (!(flags & FS_TENANT_QUEUED))
			pinned = false;
	}
	LWLockRelease(fq->lock);
	FS_INVARIANT(directory);
	FS_INVARIANT(ordered);
	FS_INVARIANT(pinned);
	FS_INVARIANT(positioned);
	FS_INVARIANT(finite);
}
#define FS_FAIR_DEBUG_CHECK(fq) fs_fair_debug_check(fq)
#else
#define FS_FAIR_DEBUG_CHECK(fq) ((void) 0)
#endif

/*
 * Move the item at position i up to its place.  The item moving is held
 * aside and each parent it passes moves down into the hole: one copy and one
 * position written per level.
 */
static void
heap_sift_up(FsFairQueue *fq, int32 i)
{
	FsHeapItem *hole = heap_at(fq, i);
	FsHeapItem	moving = *hole;

	while (i > 0)
	{
		int32		parent = (i - 1) / 2;
		FsHeapItem *above = heap_at(fq, parent);

		if (!heap_less(&moving, above))
			break;
		*hole = *above;
		hole->tenant->heap_index = i;
		hole = above;
		i = parent;
	}
	*hole = moving;
	moving.tenant->heap_index = i;
}

/* Move the item at position i down to its place, as heap_sift_up() does. */
static void
heap_sift_down(FsFairQueue *fq, int32 i)
{
	FsHeapItem *hole = heap_at(fq, i);
	FsHeapItem	moving = *hole;

	for (;;)
	{
		int32		child = 2 * i + 1;
		FsHeapItem *below;

		if (child >= fq->nitems)
			break;
		below = heap_at(fq, child);
		if (child + 1 < fq->nitems)
		{
			FsHeapItem *right = heap_at(fq, child + 1);

			if (heap_less(right, below))
			{
				child++;
				below = right;
			}
		}
		if (!heap_less(below, &moving))
			break;
		*hole = *below;
		hole->tenant->heap_index = i;
		hole = below;
		i = child;
	}
	*hole = moving;
	moving.tenant->heap_index = i;
}

/* The item at position i has a new key: move it up or down to its place. */
static void
heap_fix(FsFairQueue *fq, int32 i)
{
	if (i > 0 && heap_less(heap_at(fq, i), heap_at(fq, (i - 1) / 2)))
		heap_sift_up(fq, i);
	else
		heap_sift_down(fq, i);
}

static void
heap_rebuild(FsFairQueue *fq)
{
	int32		i;

	for (i = fq->nitems / 2 - 1; i >= 0; i--)
		heap_sift_down(fq, i);
}

/*
 * Take a chunk from the pool for the items from nchunks * FS_HEAP_CHUNK on,
 * with the directory nodes its way down needs: a new root when the
 * directory is full at its depth, and a node at each level below where the
 * new chunk is the first one that node covers.  All or nothing: false, and
 * nothing changed, if a pool has too little (its sizing says it cannot).
 */
static bool
heap_grow(FsFairQueue *fq)
{
	int64		k = fq->nchunks;
	int			depth = fq->heap_depth;
	bool		new_root = k > 0 && k == heap_span(depth);
	int32		taken[FS_HEAP_MAX_DEPTH];
	int			need = 0;
	int			used = 0;
	int32		chunk;
	int32		id;
	int			level;
	int			j;

	if (new_root)
		depth++;
	if (depth > FS_HEAP_MAX_DEPTH)
		return false;
	for (level = 1; level < depth; level++)
		if (k % heap_span(level) == 0)
			need++;
	need += new_root ? 1 : 0;

	SpinLockAcquire(&fs_fair->pool_mutex);
	if (fs_fair->chunks_unused < 1 || fs_fair->nodes_unused < need)
	{
		SpinLockRelease(&fs_fair->pool_mutex);
		return false;
	}
	chunk = fs_fair->chunk_free;
	fs_fair->chunk_free = fs_fair->chunk_next[chunk];
	fs_fair->chunks_unused--;
	for (j = 0; j < need; j++)
	{
		taken[j] = fs_fair->node_free;
		fs_fair->node_free = fs_fair->nodes[taken[j]].ids[0];
	}
	fs_fair->nodes_unused -= need;
	SpinLockRelease(&fs_fair->pool_mutex);

	/* Link them in (the heap is ours: fq->lock is held exclusively). */
	if (new_root)
	{
		id = taken[used++];
		fs_fair->nodes[id].ids[0] = fq->heap_root;
		fq->heap_root = id;
		fq->heap_depth = depth;
	}
	if (depth == 0)
		fq->heap_root = chunk;
	else
	{
		id = fq->heap_root;
		for (level = depth; level > 1; level--)
		{
			int			digit = (int) ((k >> ((level - 1) * FS_HEAP_FANOUT_SHIFT)) &
									   (FS_HEAP_FANOUT - 1));

			if (k % heap_span(level - 1) == 0)
				fs_fair->nodes[id].ids[digit] = taken[used++];
			id = fs_fair->nodes[id].ids[digit];
		}
		fs_fair->nodes[id].ids[k & (FS_HEAP_FANOUT - 1)] = chunk;
	}
	Assert(used == need);
	fq->nchunks++;
	return true;
}

/*
 * Give the last chunk back to the pool, with the directory nodes that cover
 * only it, and lower the directory by a level when the chunks left fit one
 * level less.
 */
static void
heap_release_last_chunk(FsFairQueue *fq)
{
	int64		k = fq->nchunks - 1;
	int32		freed[FS_HEAP_MAX_DEPTH];
	int			nfreed = 0;
	int32		id = fq->heap_root;
	int			level;
	int			j;

	Assert(k >= 0);
	for (level = fq->heap_depth; level > 0; level--)
	{
		id = fs_fair->nodes[id].ids[(k >> ((level - 1) * FS_HEAP_FANOUT_SHIFT)) &
									(FS_HEAP_FANOUT - 1)];
		/* A node below the root whose first chunk is this one is emptied. */
		if (level > 1 && k % heap_span(level - 1) == 0)
			freed[nfreed++] = id;
	}
	/* id is the chunk now; below the root nothing is read any more. */
	fq->nchunks--;
	if (fq->nchunks == 0)
		fq->heap_root = -1;
	else if (fq->heap_depth > 0 && fq->nchunks <= heap_span(fq->heap_depth - 1))
	{
		freed[nfreed++] = fq->heap_root;
		fq->heap_root = fs_fair->nodes[fq->heap_root].ids[0];
		fq->heap_depth--;
	}

	SpinLockAcquire(&fs_fair->pool_mutex);
	fs_fair->chunk_next[id] = fs_fair->chunk_free;
	fs_fair->chunk_free = id;
	fs_fair->chunks_unused++;
	for (j = 0; j < nfreed; j++)
	{
		fs_fair->nodes[freed[j]].ids[0] = fs_fair->node_free;
		fs_fair->node_free = freed[j];
	}
	fs_fair->nodes_unused += nfreed;
	SpinLockRelease(&fs_fair->pool_mutex);
}

/*
 * Give back chunks beyond one spare, counting `reserved` items that are not
 * in the heap but will be pushed back (a plan's set-aside tenants).  Called
 * whenever the heap lost items, before the tenants that left lose their
 * FS_TENANT_QUEUED mark: that keeps the pools' sizing (above) true.
 */
static void
heap_shrink(FsFairQueue *fq, int32 reserved)
{
	while (fq->nchunks > 1 &&
		   (int64) fq->nitems + reserved <= (int64) (fq->nchunks - 2) * FS_HEAP_CHUNK)
		heap_release_last_chunk(fq);
}

static bool
heap_push(FsFairQueue *fq, const FsHeapItem *item)
{
	if (fq->nitems == fq->nchunks * FS_HEAP_CHUNK && !heap_grow(fq))
		return false;
	*heap_at(fq, fq->nitems) = *item;
	if (item->min_slots > 0)
		fq->nfloor++;
	fq->nitems++;
	heap_sift_up(fq, fq->nitems - 1);
	return true;
}

/*
 * Remove item i (chunks are kept until heap_shrink).  The tenant's position
 * is cleared; its FS_TENANT_QUEUED mark is the caller's.
 */
static void
heap_remove(FsFairQueue *fq, int32 i)
{
	FsHeapItem *hole = heap_at(fq, i);
	int32		last = fq->nitems - 1;

	if (hole->min_slots > 0)
		fq->nfloor--;
	hole->tenant->heap_index = -1;
	fq->nitems--;
	if (i != last)
	{
		*hole = *heap_at(fq, last);
		hole->tenant->heap_index = i;
		heap_fix(fq, i);
	}
}

/*
 * Position of `tenant` in the heap, or -1: from the position it keeps,
 * checked against the heap (constant time).
 */
static int32
heap_find(FsFairQueue *fq, const FsTenant *tenant)
{
	int32		i = tenant->heap_index;

	if (i >= 0 && i < fq->nitems && heap_at(fq, i)->tenant == tenant)
		return i;
	return -1;
}

/*
 * Push `item`, whose tenant the caller marked FS_TENANT_QUEUED, onto the
 * heap.  If the pools have no room (they cannot lack it, by their sizing)
 * the tenant is left out, unmarked, and counted as failing open.
 */
static void
fs_fair_push_locked(FsFairQueue *fq, const FsHeapItem *item)
{
	if (heap_push(fq, item))
		return;
	SpinLockAcquire(&item->tenant->mutex);
	item->tenant->flags &= ~FS_TENANT_QUEUED;
	SpinLockRelease(&item->tenant->mutex);
	item->tenant->heap_index = -1;
	fq->counters.fail_open++;
}

/*
 * Put `entry` (pinned by the caller) in the fair order if it has ready rows
 * (or `always`) and is not there yet.  Caller holds fq->lock exclusively.
 */
static void
fs_fair_enqueue_locked(FsFairQueue *fq, FsTenant *entry, bool always)
{
	FsHeapItem	item;
	bool		add;

	SpinLockAcquire(&entry->mutex);
	/* A negative count (a recount's window) must be adjusted too: it stays. */
	add = (always || entry->ready_rows != 0) && !(entry->flags & FS_TENANT_QUEUED);
	if (add)
	{
		entry->flags |= FS_TENANT_QUEUED;
		item.key = entry->virtual_finish;
		item.min_slots = entry->min_slots;
	}
	SpinLockRelease(&entry->mutex);
	if (!add)
		return;

	item.tenant = entry;
	item.dry_until = 0;
	item.pad = 0;
	fs_fair_push_locked(fq, &item);
}

/*
 * Change a tenant's finish tag by `delta` (and its heap position).  Caller
 * holds fq->lock exclusively and pins the entry.
 */
static void
fs_fair_shift_tag_locked(FsFairQueue *fq, FsTenant *entry, float8 delta)
{
	float8		f;
	int32		i;

	if (delta == 0)
		return;
	SpinLockAcquire(&entry->mutex);
	f = entry->virtual_finish + delta;
	/* A tag never goes below zero (a fresh tenant's tag). */
	entry->virtual_finish = f = Max(f, 0.0);
	SpinLockRelease(&entry->mutex);
	fq->max_finish = Max(fq->max_finish, f);

	i = heap_find(fq, entry);
	if (i >= 0)
	{
		heap_at(fq, i)->key = f;
		heap_fix(fq, i);
	}
}

/* ----------------------------------------------------------------
 * Backlog and charges, as commits and rollbacks apply them
 * ----------------------------------------------------------------
 */

float8
fs_fair_clamp_cost(float8 cost, bool isnull)
{
	if (isnull || isnan(cost))
		return 1.0;
	return Min(Max(cost, FS_MIN_COST), FS_MAX_COST);
}

static inline float8
fs_fair_weight(float8 weight)
{
	return Max(weight, FS_MIN_WEIGHT);
}

void
fs_change_init(FsTenantChange *c, TimestampTz now)
{
	memset(c, 0, sizeof(*c));
	c->now = now;
}

/*
 * Apply `c` to `tenant` (created if `create`).  Takes the tenant's partition
 * lock, then the queue's, as rule 8 says.  Runs in commit and abort
 * callbacks too: no SPI, nothing that errors in normal operation.
 */
void
fs_fair_change(FsQueue *queue, const char *tenant, bool create, const FsTenantChange *c)
{
	FsFairQueue *fq = fs_fair_queue(queue);
	FsTenantRef ref;
	FsTenant   *entry;
	float8		weight;
	float8		tag = c->tag;

	entry = fs_tenant_open_cached(queue, tenant, create, &ref);
	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (c->restore_vtime && fq->vtime == c->vtime_after)
		fq->vtime = c->vtime_before;
	if (entry == NULL)
	{
		LWLockRelease(fq->lock);
		return;
	}
	weight = fs_fair_weight(ref.limits.weight);

	SpinLockAcquire(&entry->mutex);
	fs_tenant_touch(entry, c->now);
	/*
	 * No clamping at zero: during a recount a claim made before its snapshot
	 * may take its row off here before the recount adds it back (the count
	 * had it), so the sum is exact only if a negative value is kept.
	 */
	entry->ready_rows += fq->resync_gen == c->resync_gen ? c->rows : c->rows_recounted;
	if (c->rows > 0)
		entry->flags &= ~FS_TENANT_DRY;
	if (c->dry)
		entry->flags |= FS_TENANT_DRY;
	entry->served_ms = Max(entry->served_ms + c->served + c->claimed_cost, 0.0);
	if (c->claimed_cost > 0)
	{
		/* As a claim would: start at max(V, F), and V moves there. */
		float8		start = Max(fq->vtime, entry->virtual_finish);

		tag += start - entry->virtual_finish;
		fq->vtime = start;
	}
	SpinLockRelease(&entry->mutex);

	fs_fair_shift_tag_locked(fq, entry, tag + (c->cost + c->claimed_cost) / weight);
	fs_fair_enqueue_locked(fq, entry, false);
	if (c->dry)
	{
		int32		i = heap_find(fq, entry);

		if (i >= 0)
			heap_at(fq, i)->dry_until = c->now + FS_DRY_RETRY_USECS;
		fq->counters.short_probes++;
	}
	heap_shrink(fq, 0);
	LWLockRelease(fq->lock);
	fs_tenant_close(&ref);
}

/*
 * Apply a committed change of `tenant`'s ready rows: `rows` more (or fewer)
 * ready rows, and `charge` cost units of `leaves` rows that left the ready
 * state without fs_claim() (an application's own claim), which advance the
 * tenant's tag as a claim would (`now` is read only then).  Only a tenant
 * that becomes backlogged (or is charged) needs the queue's lock; the rest is
 * one spinlock.
 */
void
fs_fair_apply_backlog(FsQueue *queue, const char *tenant, int64 rows, float8 charge,
					  int32 leaves, TimestampTz now)
{
	FsTenantRef ref;
	FsTenant   *entry;
	bool		enqueue;
	FsTenantChange c;

	if (leaves == 0)
	{
		entry = fs_tenant_open_cached(queue, tenant, rows > 0, &ref);
		if (entry == NULL)
		{
			/* No room in shared memory: these rows are claimed without order. */
			if (rows > 0)
				fs_fair_add_without_tenant(queue, 0, rows);
			return;
		}
		SpinLockAcquire(&entry->mutex);
		entry->ready_rows += rows;	/* not clamped: see fs_fair_change() */
		if (rows > 0)
			entry->flags &= ~FS_TENANT_DRY;
		enqueue = entry->ready_rows != 0 && !(entry->flags & FS_TENANT_QUEUED);
		SpinLockRelease(&entry->mutex);
		if (enqueue)
		{
			FsFairQueue *fq = fs_fair_queue(queue);

			LWLockAcquire(fq->lock, LW_EXCLUSIVE);
			fs_fair_enqueue_locked(fq, entry, false);
			LWLockRelease(fq->lock);
		}
		fs_tenant_close(&ref);
		return;
	}

	fs_change_init(&c, now);
	c.rows = c.rows_recounted = rows;
	c.resync_gen = fs_fair_queue(queue)->resync_gen;
	c.claimed_cost = charge;
	fs_fair_change(queue, tenant, true, &c);
}

/* A lease of this queue was held for `held_ms`: learn the average. */
void
fs_fair_note_runtime(FsQueue *queue, float8 held_ms)
{
	FsFairQueue *fq = fs_fair_queue(queue);

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	fq->avg_runtime_ms += FS_EMA_ALPHA * (held_ms - fq->avg_runtime_ms);
	LWLockRelease(fq->lock);
}

void
fs_fair_add_without_tenant(FsQueue *queue, int64 rows, int64 untracked)
{
	FsFairQueue *fq = fs_fair_queue(queue);

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	fq->rows_without_tenant = Max(fq->rows_without_tenant + rows, 0);
	fq->untracked_rows = Max(fq->untracked_rows + untracked, 0);
	LWLockRelease(fq->lock);
}

/*
 * The queue is no longer registered (or must be recounted): empty its fair
 * order, zero its tenants' backlog, and recount at its next use.
 */
void
fs_fair_forget(FsQueue *queue)
{
	FsFairQueue *fq = fs_fair_queue(queue);

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);

	/*
	 * From the last item down, each chunk given back as it empties, before
	 * the tenants it held lose their mark (the pools' sizing counts on it).
	 */
	while (fq->nitems > 0)
	{
		FsTenant   *entry = heap_at(fq, fq->nitems - 1)->tenant;

		fq->nitems--;
		entry->heap_index = -1;
		heap_shrink(fq, 0);
		SpinLockAcquire(&entry->mutex);
		entry->ready_rows = 0;
		entry->flags &= ~(FS_TENANT_QUEUED | FS_TENANT_DRY);
		SpinLockRelease(&entry->mutex);
	}
	fq->nfloor = 0;
	fq->rows_without_tenant = 0;
	fq->untracked_rows = 0;
	fq->synced = false;
	fq->forget_gen++;
	LWLockRelease(fq->lock);
}

/* ----------------------------------------------------------------
 * Planning a claim
 * ----------------------------------------------------------------
 */

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
	bool		skipped_dry;	/* ... and some were passed over */
} FsPlan;

static void
fs_plan_init(FsPlan *plan, int32 want, int aside_capacity, int32 floor_capacity)
{
	plan->want = want;
	plan->capacity = want;
	plan->ntenants = 0;
	plan->tenants = palloc0(sizeof(FsPlanTenant) * want);
	plan->map_size = 1;
	while (plan->map_size < 2 * want)
		plan->map_size <<= 1;
	plan->map_keys = palloc0(sizeof(FsTenant *) * plan->map_size);
	plan->map_values = palloc(sizeof(int) * plan->map_size);
	plan->aside_capacity = aside_capacity;
	plan->aside = palloc(sizeof(FsHeapItem) * aside_capacity);
	plan->naside = 0;
	plan->floor_capacity = floor_capacity;
	plan->floor_candidates = palloc(sizeof(int32) * floor_capacity);
	plan->npicks = 0;
	plan->pick_tenant = palloc(sizeof(int) * want);
	plan->pick_start = palloc(sizeof(float8) * want);
}

/* After planning: each tenant's start tags, in the order of its rows. */
static void
fs_plan_split_starts(FsPlan *plan)
{
	int			i;

	for (i = 0; i < plan->ntenants; i++)
	{
		FS_FAULT_POINT("claim_plan_starts");
		plan->tenants[i].starts = palloc(sizeof(float8) * plan->tenants[i].planned);
		plan->tenants[i].got = 0;
	}
	for (i = 0; i < plan->npicks; i++)
	{
		FsPlanTenant *pt = &plan->tenants[plan->pick_tenant[i]];

		pt->starts[pt->got++] = plan->pick_start[i];
	}
	for (i = 0; i < plan->ntenants; i++)
		plan->tenants[i].got = 0;
}

/* The plan's record of `entry`, created if `create` (never fails: sized). */
static FsPlanTenant *
fs_plan_tenant(FsPlan *plan, FsTenant *entry, bool create)
{
	uint32		h = (uint32) (((uintptr_t) entry >> 4) * 2654435761u);
	int			mask = plan->map_size - 1;
	int			i;

	for (i = h & mask;; i = (i + 1) & mask)
	{
		if (plan->map_keys[i] == entry)
			return &plan->tenants[plan->map_values[i]];
		if (plan->map_keys[i] == NULL)
			break;
	}
	if (!create || plan->ntenants >= plan->capacity)
		return NULL;
	plan->map_keys[i] = entry;
	plan->map_values[i] = plan->ntenants;
	return &plan->tenants[plan->ntenants++];
}

/* What planning needs to know about a tenant, read under its spinlock. */
typedef struct FsTenantView
{
	int64		ready;
	int32		slots;
	bool		dry;
	float8		balance;		/* tokens now; infinity without a budget */
	FsLimits	limits;
} FsTenantView;

static void
fs_tenant_view(FsTenant *entry, FsTenantView *v, TimestampTz now)
{
	SpinLockAcquire(&entry->mutex);
	v->ready = entry->ready_rows;
	v->slots = entry->slots_in_use;
	v->dry = (entry->flags & FS_TENANT_DRY) != 0;
	v->balance = fs_budget_balance_now(entry, now);
	fs_limits_copy_out(entry, &v->limits);
	SpinLockRelease(&entry->mutex);
}

/*
 * Tokens (milliseconds of worker time) a claimed row takes from a tenant's
 * budget: its estimated cost when the queue has a cost expression (taken
 * as milliseconds) or measures run times, otherwise the default of
 * fs_spend_tokens().
 */
static float8
fs_fair_budget_cost(FsFairDesc *desc)
{
	FsFairQueue *fq = desc->fq;

	if (desc->cost != NULL)
		return fs_fair_clamp_cost(fq->avg_cost, false);
	if (desc->charge_runtime)
		return fs_fair_clamp_cost(fq->avg_runtime_ms, false);
	return FS_BUDGET_DEFAULT_COST_MS;
}

/* Can the tenant pay for `rows` more rows of the plan's budget cost? */
static inline bool
fs_view_can_pay(const FsTenantView *v, int32 rows, float8 budget_cost)
{
	return v->balance >= budget_cost * rows;
}

/*
 * Reserve one row of `entry` for the plan: charge its tag, advance V.
 * Caller holds fq->lock; item is the entry's heap item (its key updated).
 */
static void
fs_plan_pick(FsFairQueue *fq, FsPlan *plan, FsHeapItem *item, const FsTenantView *v,
			 float8 est_cost, TimestampTz now)
{
	FsTenant   *entry = item->tenant;
	FsPlanTenant *pt = fs_plan_tenant(plan, entry, true);
	float8		start = Max(fq->vtime, item->key);
	float8		weight = fs_fair_weight(v->limits.weight);
	float8		finish = start + est_cost / weight;

	Assert(pt != NULL && plan->npicks < plan->capacity);
	if (pt->planned == 0)
	{
		strlcpy(pt->name, entry->key.tenant, FS_NAME_BUFLEN);
		pt->entry = entry;
		pt->weight = weight;
		pt->est_cost = est_cost;
	}
	pt->planned++;
	pt->charge += finish - item->key;
	plan->pick_tenant[plan->npicks] = (int) (pt - plan->tenants);
	plan->pick_start[plan->npicks] = start;
	plan->npicks++;

	fq->vtime = start;
	fq->max_finish = Max(fq->max_finish, finish);
	SpinLockAcquire(&entry->mutex);
	fs_tenant_touch(entry, now);
	entry->virtual_finish = finish;
	entry->ready_rows--;
	entry->served_ms += est_cost;
	SpinLockRelease(&entry->mutex);
	item->key = finish;
	plan->want--;
}

/*
 * Ceiling of a tenant (max_slots and the global gate), with the gate's
 * capacity computed before any lock was taken (fs_gate_capacity()).
 */
static int32
fs_plan_ceiling(const FsGateCapacity *cap, const FsTenantView *v)
{
	FsReason	reason;

	return fs_gate_ceiling(cap, &v->limits, &reason);
}

static bool
fs_item_dry(const FsHeapItem *item, const FsTenantView *v, TimestampTz now)
{
	return v->dry && item->dry_until > now;
}

/* Should the plan pass this tenant over as dry?  Notes that it did. */
static bool
fs_plan_skips_dry(FsPlan *plan, const FsHeapItem *item, const FsTenantView *v, TimestampTz now)
{
	if (!plan->skip_dry || !fs_item_dry(item, v, now))
		return false;
	plan->skipped_dry = true;
	return true;
}

/*
 * The guaranteed floor: tenants holding fewer slots than their min_slots go
 * first, smallest tag first, until each reaches its floor.  Heap positions
 * do not move while this runs; the heap is rebuilt afterwards if anything
 * was picked.  The candidates go in the room the plan made before the lock
 * (as many as there were floor tenants then, and more): should more have
 * come meanwhile, those beyond it wait for the next claim.
 */
static void
fs_plan_floors(FsFairQueue *fq, FsPlan *plan, float8 est_cost, TimestampTz now)
{
	int32	   *candidates = plan->floor_candidates;
	int32		wanted = Min(fq->nfloor, plan->floor_capacity);
	int			ncandidates = 0;
	bool		picked = false;
	int32		i;

	for (i = 0; i < fq->nitems && ncandidates < wanted; i++)
		if (heap_at(fq, i)->min_slots > 0)
			candidates[ncandidates++] = i;

	while (plan->want > 0)
	{
		int			best = -1;
		FsTenantView bestv = {0};
		int			c;

		for (c = 0; c < ncandidates; c++)
		{
			FsHeapItem *item = heap_at(fq, candidates[c]);
			FsPlanTenant *pt = fs_plan_tenant(plan, item->tenant, false);
			int32		planned = pt ? pt->planned : 0;
			FsTenantView v;
			int32		floor;

			fs_tenant_view(item->tenant, &v, now);
			floor = Min(v.limits.min_slots, fs_plan_ceiling(&plan->cap, &v));
			if (v.ready <= 0 || fs_plan_skips_dry(plan, item, &v, now) || v.slots + planned >= floor ||
				!fs_view_can_pay(&v, planned + 1, plan->budget_cost))
				continue;
			if (best < 0 || heap_less(item, heap_at(fq, candidates[best])))
			{
				best = c;
				bestv = v;
			}
		}
		if (best < 0)
			break;
		fs_plan_pick(fq, plan, heap_at(fq, candidates[best]), &bestv, est_cost, now);
		picked = true;
	}
	if (picked)
		heap_rebuild(fq);
}

/*
 * Plan up to plan->want rows: reserve rows of tenants in fair order.  Takes
 * and releases fq->lock.  Nothing in here can fail (all memory is the
 * plan's, allocated before).
 */
static void
fs_plan_make(FsFairQueue *fq, FsPlan *plan, float8 est_cost, TimestampTz now)
{
	int			i;

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	plan->vtime_before = fq->vtime;
	plan->resync_gen = fq->resync_gen;

	if (fq->nfloor > 0)
		fs_plan_floors(fq, plan, est_cost, now);

	while (plan->want > 0 && fq->nitems > 0)
	{
		FsHeapItem *top = heap_at(fq, 0);
		FsTenant   *entry = top->tenant;
		FsPlanTenant *pt = fs_plan_tenant(plan, entry, false);
		int32		planned = pt ? pt->planned : 0;
		FsTenantView v;
		int32		min_slots;
		bool		drained;

		SpinLockAcquire(&entry->mutex);
		drained = entry->ready_rows == 0 && !fq->resyncing;
		min_slots = entry->min_slots;
		SpinLockRelease(&entry->mutex);
		if (drained)
		{
			FsHeapItem	item = *top;

			/*
			 * Drained: it leaves the fair order (and stops pinning), with
			 * its chunk given back before its mark goes (the pools' sizing
			 * counts on that order).  If rows came meanwhile, their commit
			 * saw it listed: it goes back.  A negative count stays, to be
			 * adjusted by the next recount.
			 */
			heap_remove(fq, 0);
			heap_shrink(fq, plan->naside);
			SpinLockAcquire(&entry->mutex);
			drained = entry->ready_rows == 0;
			if (drained)
				entry->flags &= ~(FS_TENANT_QUEUED | FS_TENANT_DRY);
			SpinLockRelease(&entry->mutex);
			if (!drained)
			{
				fs_fair_push_locked(fq, &item);
				continue;
			}

			/*
			 * The end of a busy period: as start-time fair queueing does, V
			 * moves to the largest finish tag, so that nobody is ahead of
			 * it any more (an idle queue owes nobody anything, and its
			 * tenants may be evicted when room is needed).
			 */
			if (fq->nitems == 0)
				fq->vtime = Max(fq->vtime, fq->max_finish);
			continue;
		}

		/* Keep the cached floor current. */
		if ((top->min_slots > 0) != (min_slots > 0))
			fq->nfloor += min_slots > 0 ? 1 : -1;
		top->min_slots = min_slots;

		fs_tenant_view(entry, &v, now);
		if (v.ready <= 0 || fs_plan_skips_dry(plan, top, &v, now) ||
			v.slots + planned >= fs_plan_ceiling(&plan->cap, &v) ||
			!fs_view_can_pay(&v, planned + 1, plan->budget_cost))
		{
			/* Not now: set it aside (its tag is kept) and look further. */
			if (plan->naside >= plan->aside_capacity)
				break;
			plan->aside[plan->naside++] = *top;
			heap_remove(fq, 0);
			continue;
		}
		if (pt == NULL && plan->ntenants >= plan->capacity)
			break;

		fs_plan_pick(fq, plan, top, &v, est_cost, now);
		heap_sift_down(fq, 0);
	}

	/*
	 * Put back what was set aside: the chunks for them were kept (heap_shrink
	 * counted them), so this needs no new chunk unless a drained tenant's new
	 * rows took one.
	 */
	for (i = 0; i < plan->naside; i++)
		fs_fair_push_locked(fq, &plan->aside[i]);
	plan->naside = 0;
	heap_shrink(fq, 0);
	plan->vtime_after = fq->vtime;
	LWLockRelease(fq->lock);
}

/*
 * Settle one planned tenant after the query: give back reservations and tag
 * advances of rows it did not get, correct the tag for real costs, and mark
 * it dry if the table had fewer claimable rows than it had leases for.
 */
static void
fs_plan_settle(FsQueue *queue, FsPlan *plan, FsPlanTenant *pt, TimestampTz now,
			   float8 *tag_fix, float8 *served_fix)
{
	int32		missing = pt->planned - pt->got;
	FsTenantChange c;

	*tag_fix = pt->cost_fix / pt->weight;
	*served_fix = pt->served_fix;
	if (missing > 0)
	{
		*tag_fix -= pt->got == 0 ? pt->charge : missing * pt->est_cost / pt->weight;
		*served_fix -= missing * pt->est_cost;
	}

	fs_change_init(&c, now);
	c.rows = missing + pt->unkeyed;		/* not recounted since: give back */
	c.resync_gen = plan->resync_gen;
	c.tag = *tag_fix;
	c.served = *served_fix;
	c.dry = pt->got < pt->admitted;
	if (c.rows == 0 && c.tag == 0 && c.served == 0 && !c.dry)
		return;
	fs_fair_change(queue, pt->name, false, &c);
}

/*
 * The queue's latency, for backpressure: the age of its oldest ready row
 * (min(enqueued_at) over the ready rows), measured by one claim a second at
 * most, across backends, and reported to the gate as fs_report_latency()
 * would.  Without enqueued_at, or with backpressure off, nothing is done.
 */
static void
fs_fair_measure_latency(FsFairDesc *desc, TimestampTz now)
{
	FsFairQueue *fq = desc->fq;
	MemoryContext cxt = CurrentMemoryContext;
	uint64		last;
	int			nest;
	volatile int ret = 0;

	if (desc->latency_plan == NULL || fq == NULL || desc->queue == NULL ||
		fs_backpressure_latency_ms == 0)
		return;
	last = pg_atomic_read_u64(&fq->latency_sampled_at);
	if (now - (TimestampTz) last < FS_LATENCY_SAMPLE_USECS && now >= (TimestampTz) last)
		return;
	if (!pg_atomic_compare_exchange_u64(&fq->latency_sampled_at, &last, (uint64) now))
		return;					/* another backend measures it */

	PG_TRY();
	{
		nest = fs_search_path_begin();
		ret = SPI_execute_plan(desc->latency_plan, NULL, NULL, true, 1);
		fs_search_path_end(nest);
	}
	PG_CATCH();
	{
		fs_fair_query_error(cxt, desc, &desc->latency_q, "latency query");
	}
	PG_END_TRY();
	if (ret == SPI_OK_SELECT && SPI_processed == 1)
	{
		bool		isnull;
		Datum		oldest = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		float8		latency_ms = 0;

		if (!isnull)
			latency_ms = Max((float8) (now - DatumGetTimestampTz(oldest)) / 1000.0, 0.0);
		fs_gate_set_latency(desc->queue, latency_ms, now);
	}
}

/* ----------------------------------------------------------------
 * fs_claim()
 * ----------------------------------------------------------------
 */

/* A row claimed, before it is handed back in fair order. */
typedef struct FsClaimedRow
{
	float8		start;
	int			seq;			/* tie-break: claim order */
	int64		lease_id;
	const char *tenant;
	Datum		row;
} FsClaimedRow;

static int
fs_claimed_row_cmp(const void *a, const void *b)
{
	const FsClaimedRow *x = (const FsClaimedRow *) a;
	const FsClaimedRow *y = (const FsClaimedRow *) b;

	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	return x->seq - y->seq;
}

typedef struct FsClaimOutput
{
	FsClaimedRow *rows;
	int			count;
	int			capacity;
} FsClaimOutput;

static void
fs_claim_output_add(FsClaimOutput *out, float8 start, int64 lease_id, const char *tenant,
					Datum row)
{
	FsClaimedRow *r;

	Assert(out->count < out->capacity);
	r = &out->rows[out->count];
	r->start = start;
	r->seq = out->count;
	r->lease_id = lease_id;
	r->tenant = tenant;
	r->row = row;
	out->count++;
}

/*
 * Admission of the rows planned for one tenant: every row a claim returns
 * passes through here, and only here.  A row is admitted with a slot lease
 * (fs_slot_acquire: max_slots and the global gate); when a lease is denied
 * the tenant gets no more rows in this claim.  Returns the rows admitted.
 */
static int32
fs_claim_admit(FsQueue *queue, FsPlanTenant *pt, float8 budget_cost, int64 lease_usecs,
			   TimestampTz now)
{
	int32		i;

	FS_FAULT_POINT("claim_admit");
	pt->leases = palloc(sizeof(int64) * Max(pt->planned, 1));
	pt->taken = palloc(sizeof(float8) * Max(pt->planned, 1));
	for (i = 0; i < pt->planned; i++)
	{
		FsSlotDecision decision;
		float8		taken;

		/* The budget pays for the row, then a slot runs it. */
		if (!fs_budget_claim(queue, pt->name, budget_cost, now, &taken))
			break;
		fs_slot_acquire(queue, pt->name, lease_usecs, now, &decision);
		if (decision.lease_id == 0)
		{
			fs_budget_unclaim(queue, pt->name, taken);
			break;
		}
		pt->leases[i] = decision.lease_id;
		pt->taken[i] = taken;
	}
	pt->admitted = i;
	return i;
}

/*
 * Run a claim query of `desc` in the caller's snapshot, with a fixed
 * search_path; an error is reported by queue and piece, without the query.
 * Its second column is the rows' key, whose type is the one the table gives
 * the key expression now: DDL (ALTER COLUMN ... TYPE) may have made it
 * another than the registered one, which the keys of the claim map and the
 * claim query's parameter are of.  That is an error, not a value to
 * interpret as the registered type.
 */
static void
fs_claim_execute(FsFairDesc *desc, const FsQueryText *q, SPIPlanPtr plan, Datum *values,
				 const char *nulls, const char *what)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile int ret = 0;
	Oid			key_type;

	PG_TRY();
	{
		int			nest = fs_search_path_begin();

		ret = SPI_execute_snapshot(plan, values, nulls, GetActiveSnapshot(), InvalidSnapshot,
								   false, false, 0);
		fs_search_path_end(nest);
		if (ret != SPI_OK_SELECT)
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("the query failed: %s", SPI_result_code_string(ret))));
	}
	PG_CATCH();
	{
		fs_fair_query_error(cxt, desc, q, what);
	}
	PG_END_TRY();
	key_type = SPI_gettypeid(SPI_tuptable->tupdesc, 2);
	if (key_type != desc->key_type)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the key of queue \"%s\" is now of type %s, registered as %s",
						desc->queue_name, format_type_be(key_type),
						format_type_be(desc->key_type)),
				 errhint("Register the queue again with fs_register_queue().")));
}

/*
 * One round: plan, admit, lock the rows, settle.  Returns the rows claimed;
 * *retry says whether another round may find more (a tenant was denied a
 * lease or came back short, and is now known not to have capacity or rows).
 */
static int32
fs_claim_round(FsFairDesc *desc, int32 want, int64 lease_usecs, TimestampTz now,
			   FsClaimOutput *out, bool *retry)
{
	FsFairQueue *fq = desc->fq;
	FsPlan		plan;
	float8		est_cost;
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	ArrayType  *held;
	Datum	   *names;
	Datum	   *counts;
	int		   *index_of;
	int			nquery = 0;
	int32		claimed = 0;
	uint64		r;
	int			i;
	TupleDesc	tupdesc;

	est_cost = desc->cost != NULL ? fq->avg_cost :
		desc->charge_runtime ? fq->avg_runtime_ms : 1.0;
	est_cost = fs_fair_clamp_cost(est_cost, false);

	/*
	 * Sized before the lock.  Tenants set aside are those at their ceiling
	 * (or dry) ahead of the ones picked: a few per running job at most, so
	 * this bound is generous; if it fills, the round ends early and the
	 * next one goes on.
	 */
	*retry = false;
	fs_plan_init(&plan, want, Min(Max(fq->nitems, 0), 4 * want + 1024) + 1,
				 2 * Max(fq->nfloor, 0) + 16);
	/* Each planned tenant's reservation, and its settlement after the query. */
	fs_track_claims_reserve(2 * want);
	fs_gate_capacity(desc->queue, now, &plan.cap);
	plan.budget_cost = fs_fair_budget_cost(desc);
	plan.skip_dry = true;
	plan.skipped_dry = false;
	fs_plan_make(fq, &plan, est_cost, now);
	if (plan.ntenants == 0 && plan.skipped_dry)
	{
		/*
		 * Work-conserving: tenants that came up short lately are passed
		 * over, but not when they are all there is.
		 */
		plan.skip_dry = false;
		fs_plan_make(fq, &plan, est_cost, now);
	}
	if (plan.ntenants == 0)
		return 0;

	/*
	 * Recorded before anything can fail (in the room reserved above), so a
	 * rollback undoes it all.
	 */
	for (i = 0; i < plan.ntenants; i++)
	{
		FsPlanTenant *pt = &plan.tenants[i];

		fs_track_claim(desc, pt->name, pt->planned, pt->charge, pt->planned * pt->est_cost,
					   plan.resync_gen, plan.vtime_before, plan.vtime_after);
	}
	fs_plan_split_starts(&plan);

	FS_FAULT_POINT("claim_query_args");
	names = palloc(sizeof(Datum) * plan.ntenants);
	counts = palloc(sizeof(Datum) * plan.ntenants);
	index_of = palloc(sizeof(int) * plan.ntenants);
	for (i = 0; i < plan.ntenants; i++)
	{
		FsPlanTenant *pt = &plan.tenants[i];

		if (fs_claim_admit(desc->queue, pt, plan.budget_cost, lease_usecs, now) == 0)
			continue;
		names[nquery] = CStringGetTextDatum(pt->name);
		counts[nquery] = Int32GetDatum(pt->admitted);
		index_of[nquery] = i;
		nquery++;
	}

	if (nquery > 0)
	{
		values[0] = PointerGetDatum(construct_array(names, nquery, TEXTOID, -1, false, TYPALIGN_INT));
		values[1] = PointerGetDatum(construct_array(counts, nquery, INT4OID, 4, true, TYPALIGN_INT));
		held = fs_track_held_keys(desc);
		values[2] = PointerGetDatum(held);
		nulls[2] = held == NULL ? 'n' : ' ';
		fs_claim_execute(desc, &desc->claim_q, desc->claim_plan, values, nulls, "claim query");

		tupdesc = SPI_tuptable->tupdesc;
		for (r = 0; r < SPI_processed; r++)
		{
			HeapTuple	tuple = SPI_tuptable->vals[r];
			bool		isnull;
			int64		ord = DatumGetInt64(SPI_getbinval(tuple, tupdesc, 1, &isnull));
			FsPlanTenant *pt;
			Datum		key;
			bool		key_isnull;
			float8		cost;
			Datum		row;
			int64		lease_id;
			int			k;

			if (ord < 1 || ord > nquery)
				elog(ERROR, "fair dequeue claim query returned an unexpected row");
			pt = &plan.tenants[index_of[ord - 1]];
			k = pt->got;
			if (k >= pt->admitted)
				elog(ERROR, "fair dequeue claim query returned too many rows");
			key = SPI_getbinval(tuple, tupdesc, 2, &key_isnull);
			cost = DatumGetFloat8(SPI_getbinval(tuple, tupdesc, 3, &isnull));
			cost = desc->cost != NULL ? fs_fair_clamp_cost(cost, isnull) : pt->est_cost;
			row = SPI_getbinval(tuple, tupdesc, 4, &isnull);
			lease_id = pt->leases[k];

			pt->cost_fix += cost - pt->est_cost;
			pt->served_fix += cost - pt->est_cost;
			pt->got++;
			fs_claim_output_add(out, pt->starts[k], lease_id, pt->name, row);
			if (!fs_track_claimed_row(desc, pt->name, key, key_isnull, lease_id, cost,
									  true, plan.resync_gen))
				pt->unkeyed++;
			if (desc->cost != NULL)
				fq->avg_cost += FS_EMA_ALPHA * (cost - fq->avg_cost);
			claimed++;
		}
	}

	for (i = 0; i < plan.ntenants; i++)
	{
		FsPlanTenant *pt = &plan.tenants[i];
		float8		tag_fix;
		float8		served_fix;
		int			k;

		if (pt->got < pt->planned)
			*retry = true;
		/*
		 * Rows the query did not return (locked, or not claimable yet by
		 * the claim-time filter) give back their lease and their tokens
		 * now: a tenant pays for the rows it gets, not for the rows it was
		 * admitted to.
		 */
		for (k = pt->got; k < pt->admitted; k++)
		{
			int64		held;

			(void) fs_slot_release(pt->leases[k], now, &held);
			fs_budget_unclaim(desc->queue, pt->name, pt->taken[k]);
		}
		fs_plan_settle(desc->queue, &plan, pt, now, &tag_fix, &served_fix);
		if (pt->got != pt->planned || pt->unkeyed > 0 || tag_fix != 0 || served_fix != 0)
			fs_track_claim(desc, pt->name, pt->got - pt->unkeyed - pt->planned, tag_fix,
						   served_fix, plan.resync_gen, plan.vtime_before, plan.vtime_after);
	}

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (claimed == 0 && fq->vtime == plan.vtime_after)
		fq->vtime = plan.vtime_before;
	fq->counters.rows_claimed += claimed;
	LWLockRelease(fq->lock);
	return claimed;
}

/*
 * Fail-open: claim in the queue's own order, without fair order, when
 * fairshare cannot keep the queue's state (the queue table is full) or has
 * ready rows of tenants it could not track.  Rows still get leases (failing
 * open themselves when state cannot be kept); a row whose tenant is at its
 * limit is not returned.
 */
static int32
fs_claim_fifo(FsFairDesc *desc, int32 want, int64 lease_usecs, TimestampTz now,
			  FsClaimOutput *out)
{
	Datum		values[2];
	char		nulls[2] = {' ', ' '};
	ArrayType  *held = fs_track_held_keys(desc);
	TupleDesc	tupdesc;
	int32		claimed = 0;
	uint64		r;

	values[0] = Int64GetDatum(want);
	values[1] = PointerGetDatum(held);
	nulls[1] = held == NULL ? 'n' : ' ';
	fs_claim_execute(desc, &desc->fifo_q, desc->fifo_plan, values, nulls,
					 "fail-open claim query");
	tupdesc = SPI_tuptable->tupdesc;
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[r];
		bool		isnull;
		Datum		tenant_datum = SPI_getbinval(tuple, tupdesc, 1, &isnull);
		char	   *tenant;
		int			len;
		FsSlotDecision decision;
		Datum		key;
		bool		key_isnull;
		float8		cost;

		if (isnull)
			continue;
		tenant = TextDatumGetCString(tenant_datum);
		len = strlen(tenant);
		if (len == 0 || len > FS_NAME_MAXLEN || strcmp(tenant, FS_WILDCARD) == 0)
			continue;
		fs_slot_acquire(desc->queue, tenant, lease_usecs, now, &decision);
		if (decision.lease_id == 0)
			continue;
		key = SPI_getbinval(tuple, tupdesc, 2, &key_isnull);
		cost = fs_fair_clamp_cost(DatumGetFloat8(SPI_getbinval(tuple, tupdesc, 3, &isnull)),
								  isnull || desc->cost == NULL);
		fs_claim_output_add(out, (float8) claimed, decision.lease_id, tenant,
							SPI_getbinval(tuple, tupdesc, 4, &isnull));
		if (desc->queue != NULL)
			(void) fs_track_claimed_row(desc, tenant, key, key_isnull, decision.lease_id,
										cost, false, 0);
		claimed++;
	}
	return claimed;
}

static int32
fs_max_rows_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		max_rows;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_rows must not be null"),
				 errhint("Pass how many rows to claim, for example 10.")));
	max_rows = PG_GETARG_INT32(argno);
	if (max_rows <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_rows must be positive, got %d", max_rows),
				 errhint("Pass how many rows to claim, for example 10.")));
	if (max_rows > FS_CLAIM_MAX_ROWS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("max_rows must be at most %d, got %d", FS_CLAIM_MAX_ROWS, max_rows),
				 errhint("Claim in batches of at most %d rows.", FS_CLAIM_MAX_ROWS)));
	return max_rows;
}

/* The registration of the queue named by argument `argno`, or an error. */
static FsFairDesc *
fs_fair_desc_arg(FunctionCallInfo fcinfo, int argno)
{
	char		queue_name[FS_NAME_BUFLEN];

	fs_name_arg(fcinfo, argno, "queue", queue_name);
	return fs_fair_desc(queue_name, false);
}

/* Recount the queue if it has not been counted in this server run. */
static void
fs_fair_ensure_synced(FsFairDesc *desc)
{
	if (desc->fq == NULL || desc->fq->synced)
		return;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	(void) fs_fair_resync(desc, true, NULL);
	SPI_finish();
}

/* Items of a fair order visited per hold of its lock by a limits refresh. */
#define FS_REFRESH_BATCH	256

/*
 * Names of the tenants in `fq`'s fair order whose cached limits are not of
 * `generation`, at most `capacity`, into `names`; returns how many.  The
 * order is read a batch at a time (its lock shared for one batch): items
 * move between batches, so a tenant may be missed (or met twice).
 */
static int32
fs_fair_stale_tenants(FsFairQueue *fq, uint32 generation, char (*names)[FS_NAME_BUFLEN],
					  int32 capacity)
{
	int32		n = 0;
	int32		start;

	for (start = 0;; start += FS_REFRESH_BATCH)
	{
		int32		end;
		int32		i;

		LWLockAcquire(fq->lock, LW_SHARED);
		end = Min(start + FS_REFRESH_BATCH, fq->nitems);
		for (i = start; i < end && n < capacity; i++)
		{
			FsTenant   *entry = heap_at(fq, i)->tenant;
			uint32		cached;

			SpinLockAcquire(&entry->mutex);
			cached = entry->limits_generation;
			SpinLockRelease(&entry->mutex);
			/* The key never changes while the entry is listed (pinned). */
			if (cached != generation)
				strlcpy(names[n++], entry->key.tenant, FS_NAME_BUFLEN);
		}
		LWLockRelease(fq->lock);
		if (end < start + FS_REFRESH_BATCH || n == capacity)
			return n;
	}
}

/*
 * After fs_limits changed, reload the limits of the queue's backlogged
 * tenants (their weights and floors) before planning with them.  Done by the
 * first claim that sees the new generation; SPI runs with no lock held, and
 * the fair order is read and its floor marks updated a batch at a time, so
 * that a long order never holds its lock for long.  A second look finds the
 * tenants that moved past the first one; a tenant missed by both (or whose
 * limits cannot be read) loads them at its next decision.
 */
static void
fs_fair_refresh_limits(FsFairDesc *desc)
{
	FsFairQueue *fq = desc->fq;
	uint32		generation = pg_atomic_read_u32(&fs_shared->limits_generation);
	char	  (*names)[FS_NAME_BUFLEN];
	int32		capacity;
	int32		start;
	int			look;

	if (fq->limits_generation == generation)
		return;

	LWLockAcquire(fq->lock, LW_SHARED);
	capacity = Max(fq->nitems, 1);
	LWLockRelease(fq->lock);
	names = palloc(sizeof(*names) * capacity);
	for (look = 0; look < 2; look++)
	{
		int32		n = fs_fair_stale_tenants(fq, generation, names, capacity);
		int32		i;

		for (i = 0; i < n; i++)
		{
			FsTenantRef ref;

			if (fs_tenant_open(desc->queue, names[i], 0, &ref) != NULL)
				fs_tenant_close(&ref);
		}
		if (n == 0)
			break;
	}
	pfree(names);

	/* The floor marks, a batch at a time; nfloor follows each change. */
	for (start = 0;; start += FS_REFRESH_BATCH)
	{
		int32		end;
		int32		i;
		bool		done;

		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		end = Min(start + FS_REFRESH_BATCH, fq->nitems);
		for (i = start; i < end; i++)
		{
			FsHeapItem *item = heap_at(fq, i);
			int32		min_slots;

			SpinLockAcquire(&item->tenant->mutex);
			min_slots = item->tenant->min_slots;
			SpinLockRelease(&item->tenant->mutex);
			if ((item->min_slots > 0) != (min_slots > 0))
				fq->nfloor += min_slots > 0 ? 1 : -1;
			item->min_slots = min_slots;
		}
		done = end < start + FS_REFRESH_BATCH;
		if (done)
			fq->limits_generation = generation;
		LWLockRelease(fq->lock);
		if (done)
			break;
	}
}

/*
 * fs_claim(queue text, row_type anyelement, max_rows int, lease interval)
 *	 RETURNS TABLE(lease_id bigint, tenant text, job anyelement)
 *
 * Claims up to max_rows ready rows of the queue in fair order, locked FOR
 * UPDATE SKIP LOCKED in the caller's transaction, each with a lease; the rows
 * come back whole, as the ready table's row type, in fair order.
 */
Datum
fs_claim(PG_FUNCTION_ARGS)
{
	FsFairDesc *desc;
	Oid			row_type;
	int32		max_rows;
	int64		lease_usecs;
	ReturnSetInfo *rsinfo;
	FsClaimOutput out;
	int32		claimed = 0;
	int			rounds = 0;
	TimestampTz now;
	int			i;

	fs_check_loaded();
	desc = fs_fair_desc_arg(fcinfo, 0);
	row_type = get_fn_expr_argtype(fcinfo->flinfo, 1);
	if (row_type != desc->row_type)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("row_type of queue \"%s\" must be %s, got %s", desc->queue_name,
						format_type_be(desc->row_type), format_type_be(row_type)),
				 errhint("Pass NULL::%s as row_type.", desc->ready_name)));
	max_rows = fs_max_rows_arg(fcinfo, 2);
	lease_usecs = fs_lease_interval_arg(fcinfo, 3, "lease");
	if (pg_class_aclcheck(desc->ready_relid, GetUserId(), ACL_SELECT) != ACLCHECK_OK ||
		pg_class_aclcheck(desc->ready_relid, GetUserId(), ACL_UPDATE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to claim rows of %s", desc->ready_name),
				 errhint("fs_claim() locks rows FOR UPDATE: it needs SELECT and UPDATE on the table.")));
	fs_fair_check_schema_usage(desc, "fs_claim");

	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	out.capacity = max_rows;
	out.count = 0;
	out.rows = palloc(sizeof(FsClaimedRow) * max_rows);

	now = fs_now();
	if (desc->fq != NULL)
	{
		fs_fair_ensure_synced(desc);
		fs_fair_refresh_limits(desc);
		fs_fair_measure_latency(desc, now);
		while (claimed < max_rows && rounds++ < FS_CLAIM_MAX_ROUNDS)
		{
			bool		retry;
			int32		got = fs_claim_round(desc, max_rows - claimed, lease_usecs, now,
											 &out, &retry);

			claimed += got;
			if (got == 0 && !retry)
				break;
		}
		LWLockAcquire(desc->fq->lock, LW_EXCLUSIVE);
		desc->fq->counters.claims++;
		LWLockRelease(desc->fq->lock);
		FS_FAIR_DEBUG_CHECK(desc->fq);
	}
	if (claimed < max_rows && (desc->fq == NULL || desc->fq->untracked_rows > 0))
	{
		int32		got = fs_claim_fifo(desc, max_rows - claimed, lease_usecs, now, &out);

		if (got > 0)
		{
			claimed += got;
			if (desc->fq != NULL)
			{
				LWLockAcquire(desc->fq->lock, LW_EXCLUSIVE);
				desc->fq->counters.fail_open++;
				LWLockRelease(desc->fq->lock);
			}
			else
				FS_COUNT_GLOBAL(fail_open);
		}
	}

	qsort(out.rows, out.count, sizeof(FsClaimedRow), fs_claimed_row_cmp);
	for (i = 0; i < out.count; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = Int64GetDatum(out.rows[i].lease_id);
		values[1] = CStringGetTextDatum(out.rows[i].tenant);
		values[2] = out.rows[i].row;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	SPI_finish();
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * fs_ready_tenants()
 * ----------------------------------------------------------------
 */

typedef struct FsReadyTenant
{
	char		name[FS_NAME_BUFLEN];
	int64		ready;
	int32		free_slots;
	bool		below_floor;
	float8		tag;
	float8		start;
	float8		weight;
} FsReadyTenant;

static int
fs_ready_tenant_cmp(const void *a, const void *b)
{
	const FsReadyTenant *x = (const FsReadyTenant *) a;
	const FsReadyTenant *y = (const FsReadyTenant *) b;

	if (x->below_floor != y->below_floor)
		return x->below_floor ? -1 : 1;
	if (x->tag != y->tag)
		return x->tag < y->tag ? -1 : 1;
	return strcmp(x->name, y->name);
}

/*
 * fs_ready_tenants(queue text, max_tenants int)
 *	 RETURNS TABLE(tenant text, ready_rows bigint, free_slots int,
 *				   virtual_start float8, weight float8)
 *
 * Tenants with ready rows and free capacity, in fair order (those below
 * their min_slots first): the building block for an application's own
 * LATERAL ... FOR UPDATE SKIP LOCKED claim.  Changes nothing.
 */
Datum
fs_ready_tenants(PG_FUNCTION_ARGS)
{
	FsFairDesc *desc;
	FsFairQueue *fq;
	int32		max_tenants;
	ReturnSetInfo *rsinfo;
	FsReadyTenant *list;
	int			n = 0;
	int			capacity;
	FsGateCapacity gate;
	float8		budget_cost;
	bool		skipped_dry = false;
	int			pass;
	TimestampTz now = fs_now();
	int			i;

	fs_check_loaded();
	desc = fs_fair_desc_arg(fcinfo, 0);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_tenants must not be null"),
				 errhint("Pass how many tenants to list, for example 100.")));
	max_tenants = PG_GETARG_INT32(1);
	if (max_tenants <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_tenants must be positive, got %d", max_tenants),
				 errhint("Pass how many tenants to list, for example 100.")));
	if (pg_class_aclcheck(desc->ready_relid, GetUserId(), ACL_SELECT) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to list the tenants of %s", desc->ready_name),
				 errhint("fs_ready_tenants() needs SELECT on the queue's table.")));
	fs_fair_check_schema_usage(desc, "fs_ready_tenants");

	/*
	 * The counts are of every ready row, whoever may see it: they are kept
	 * by triggers and recounted as the table's owner.  A caller whom
	 * row-level security restricts on the table would learn of tenants and
	 * rows it hides, so only roles it does not apply to may list them (the
	 * owner, unless the table forces it, a role with BYPASSRLS, or anyone on
	 * a table without it).  fs_claim() queries as the caller and respects it.
	 */
	if (check_enable_rls(desc->ready_relid, InvalidOid, true) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to list the tenants of queue \"%s\": row-level security "
						"restricts you on %s", desc->queue_name, desc->ready_name),
				 errdetail("fs_ready_tenants() counts every ready row, including the rows the "
						   "table's policies hide from you."),
				 errhint("Call it as the table's owner or a role with BYPASSRLS, or claim with "
						 "fs_claim(), which applies the policies.")));

	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	fq = desc->fq;
	if (fq == NULL)
		return (Datum) 0;
	fs_fair_ensure_synced(desc);

	LWLockAcquire(fq->lock, LW_SHARED);
	capacity = fq->nitems;
	LWLockRelease(fq->lock);
	list = palloc(sizeof(FsReadyTenant) * Max(capacity, 1));
	fs_gate_capacity(desc->queue, now, &gate);
	budget_cost = fs_fair_budget_cost(desc);

	/*
	 * Tenants that came up short lately are left out, unless they are all
	 * there is (work-conserving, as fs_claim()).
	 */
	for (pass = 0; pass < 2 && n == 0 && (pass == 0 || skipped_dry); pass++)
	{
	LWLockAcquire(fq->lock, LW_SHARED);
	for (i = 0; i < fq->nitems && n < capacity; i++)
	{
		FsHeapItem *item = heap_at(fq, i);
		FsTenantView v;
		int32		ceiling;

		fs_tenant_view(item->tenant, &v, now);
		if (v.ready <= 0 || !fs_view_can_pay(&v, 1, budget_cost))
			continue;
		if (pass == 0 && fs_item_dry(item, &v, now))
		{
			skipped_dry = true;
			continue;
		}
		ceiling = fs_plan_ceiling(&gate, &v);
		if (v.slots >= ceiling)
			continue;
		strlcpy(list[n].name, item->tenant->key.tenant, FS_NAME_BUFLEN);
		list[n].ready = v.ready;
		list[n].free_slots = ceiling - v.slots;
		list[n].below_floor = v.slots < Min(v.limits.min_slots, ceiling);
		list[n].tag = item->key;
		list[n].start = Max(fq->vtime, item->key);
		list[n].weight = v.limits.weight;
		n++;
	}
	LWLockRelease(fq->lock);
	}

	qsort(list, n, sizeof(FsReadyTenant), fs_ready_tenant_cmp);
	for (i = 0; i < n && i < max_tenants; i++)
	{
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		values[0] = CStringGetTextDatum(list[i].name);
		values[1] = Int64GetDatum(list[i].ready);
		values[2] = Int32GetDatum(list[i].free_slots);
		values[3] = Float8GetDatum(list[i].start);
		values[4] = Float8GetDatum(list[i].weight);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * Recounting backlogs from the table
 * ----------------------------------------------------------------
 */

typedef struct FsCount
{
	char		name[FS_NAME_BUFLEN];	/* hash key */
	int64		rows;
	FsTenant   *entry;			/* its entry, once given one (else NULL) */
	uint32		generation;		/* of that entry */
} FsCount;

/*
 * The commit gate.  A transaction that changes a queue's counts enters the
 * gate before it commits (XACT_EVENT_PRE_COMMIT, before its rows become
 * visible) and leaves it once its changes are applied to shared memory
 * (after they are).  A recount closes the gate: new committers wait, and
 * once the ones inside have left, every transaction is either visible to a
 * snapshot taken now and applied, or neither.  The gate is closed only for
 * that instant; counting runs with it open.
 */
#define FS_GATE_CLOSED		0x80000000U
#define FS_GATE_WAIT_USECS	100
#define FS_GATE_MAX_WAIT	(10 * USECS_PER_SEC)

/*
 * A recount marks its queue `resyncing` and may close its commit gate:
 * shared state that must not outlive the recount, however it ends.  An
 * error ends it through fs_fair_resync()'s PG_CATCH; a backend terminated
 * (pg_terminate_backend, shutdown) leaves through proc_exit() without
 * returning there, so the recount records its owner (pid and a generation)
 * and this backend's before_shmem_exit callback undoes what it still owns.
 * Should a backend vanish without running it, the next recount of the
 * queue takes the mark over from a pid no longer alive, and a committer
 * waiting at a gate such a backend closed opens it.
 */
typedef struct FsOwnedResync
{
	FsFairQueue *fq;
	uint64		gen;
} FsOwnedResync;

#define FS_MAX_OWNED_RESYNCS	8	/* recounts nested in one backend */

static FsOwnedResync owned_resyncs[FS_MAX_OWNED_RESYNCS];
static int	nowned_resyncs = 0;
static FsFairQueue *gate_closed_by_me = NULL;
static bool resync_exit_registered = false;

static void fs_fair_gate_open(FsFairQueue *fq);

/*
 * Whether the backend with this pid is gone.  (A pid taken again by a new
 * backend counts as alive: the mark then waits for that one, which is only
 * slower, never wrong.)
 */
static bool
fs_fair_owner_gone(int pid)
{
	return pid != 0 && pid != MyProcPid && BackendPidGetProc(pid) == NULL;
}

/*
 * A committer found the gate closed for a long time: if the recount that
 * closed it belongs to a backend that is gone, open it.
 */
static void
fs_fair_gate_check_owner(FsFairQueue *fq)
{
	int			pid;
	uint64		gen;
	bool		resyncing;

	LWLockAcquire(fq->lock, LW_SHARED);
	pid = fq->resync_pid;
	gen = fq->resync_owner_gen;
	resyncing = fq->resyncing;
	LWLockRelease(fq->lock);
	if (!resyncing || !fs_fair_owner_gone(pid))
		return;

	/*
	 * Opened under the lock, and only if the mark is still the gone
	 * backend's: a recount taking it over changes the mark under the lock
	 * before it closes the gate, and its closing must stand.
	 */
	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (fq->resyncing && fq->resync_pid == pid && fq->resync_owner_gen == gen)
		pg_atomic_fetch_and_u32(&fq->commit_gate, ~FS_GATE_CLOSED);
	LWLockRelease(fq->lock);
}

/*
 * Undo the mark of a recount this backend owns (if it still owns it): the
 * queue is no longer being recounted and is counted again at its next use.
 */
static void
fs_fair_resync_disown(FsFairQueue *fq, uint64 gen)
{
	bool		held = LWLockHeldByMeInMode(fq->lock, LW_EXCLUSIVE);

	if (!held)
		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (fq->resyncing && fq->resync_pid == MyProcPid && fq->resync_owner_gen == gen)
	{
		fq->resyncing = false;
		fq->synced = false;
		fq->resync_pid = 0;
	}
	if (!held)
		LWLockRelease(fq->lock);
}

/* before_shmem_exit: undo whatever recount this backend leaves behind. */
static void
fs_fair_resync_exit(int code pg_attribute_unused(), Datum arg pg_attribute_unused())
{
	if (gate_closed_by_me != NULL)
		fs_fair_gate_open(gate_closed_by_me);
	while (nowned_resyncs > 0)
	{
		nowned_resyncs--;
		fs_fair_resync_disown(owned_resyncs[nowned_resyncs].fq,
							  owned_resyncs[nowned_resyncs].gen);
	}
}

void
fs_fair_gate_enter(FsQueue *queue)
{
	FsFairQueue *fq = fs_fair_queue(queue);
	uint32		waits = 0;

	for (;;)
	{
		uint32		old = pg_atomic_read_u32(&fq->commit_gate);

		if (old & FS_GATE_CLOSED)
		{
			/*
			 * A recount is taking its snapshot: a few milliseconds at most.
			 * Every 10000 waits (a second or two), make sure its backend is
			 * still there.
			 */
			CHECK_FOR_INTERRUPTS();
			pg_usleep(FS_GATE_WAIT_USECS);
			if (++waits % (USECS_PER_SEC / FS_GATE_WAIT_USECS) == 0)
				fs_fair_gate_check_owner(fq);
			continue;
		}
		if (pg_atomic_compare_exchange_u32(&fq->commit_gate, &old, old + 1))
			return;
	}
}

void
fs_fair_gate_leave(FsQueue *queue)
{
	pg_atomic_fetch_sub_u32(&fs_fair_queue(queue)->commit_gate, 1);
}

/*
 * Close the gate and wait for the transactions inside to leave.  False if
 * they do not within FS_GATE_MAX_WAIT (the gate is open again then).
 */
static bool
fs_fair_gate_close(FsFairQueue *fq)
{
	TimestampTz start = GetCurrentTimestamp();

	gate_closed_by_me = fq;
	pg_atomic_fetch_or_u32(&fq->commit_gate, FS_GATE_CLOSED);
	while ((pg_atomic_read_u32(&fq->commit_gate) & ~FS_GATE_CLOSED) != 0)
	{
		if (TimestampDifferenceExceeds(start, GetCurrentTimestamp(),
									   FS_GATE_MAX_WAIT / 1000))
		{
			fs_fair_gate_open(fq);
			return false;
		}
		/* A cancel here opens the gate (fs_fair_resync()), a terminate too. */
		CHECK_FOR_INTERRUPTS();
		pg_usleep(FS_GATE_WAIT_USECS);
	}
	return true;
}

static void
fs_fair_gate_open(FsFairQueue *fq)
{
	pg_atomic_fetch_and_u32(&fq->commit_gate, ~FS_GATE_CLOSED);
	if (gate_closed_by_me == fq)
		gate_closed_by_me = NULL;
}

/*
 * A tenant's live count when the recount took its snapshot.  The entry is
 * known by its address and generation: between the snapshot and the
 * adjustment it may leave the fair order, be evicted, and its memory be
 * reused by a tenant that enters it.
 */
typedef struct FsCountAt
{
	FsTenant   *tenant;
	uint32		generation;
	int64		rows;
} FsCountAt;

/* One tenant's adjustment by a recount: counted now, live at the snapshot. */
typedef struct FsAdjust
{
	FsTenant   *entry;
	uint32		generation;
	int64		counted;
	int64		live_at;
} FsAdjust;

/* Tenants adjusted per hold of the queue's lock by a recount. */
#define FS_RECOUNT_BATCH	256

/* The owner of `desc`'s ready table; an error if the table is gone. */
static Oid
fs_fair_table_owner(FsFairDesc *desc)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(desc->ready_relid));
	Oid			owner;

	if (!HeapTupleIsValid(tuple))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("the ready table of queue \"%s\" no longer exists", desc->queue_name),
				 errhint("Unregister the queue with fs_unregister_queue(), or register it again.")));
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	return owner;
}

static int
fs_count_at_cmp(const void *a, const void *b)
{
	const FsCountAt *ca = (const FsCountAt *) a;
	const FsCountAt *cb = (const FsCountAt *) b;
	uintptr_t	ta = (uintptr_t) ca->tenant;
	uintptr_t	tb = (uintptr_t) cb->tenant;

	if (ta != tb)
		return ta < tb ? -1 : 1;
	return ca->generation < cb->generation ? -1 : ca->generation > cb->generation ? 1 : 0;
}

/*
 * End a recount that did not adjust the counts: the queue is no longer
 * being recounted, and with `count_again` (the generation moved on, so
 * reservations made before it settle as if counted) it is counted again at
 * its next use.
 */
static void
fs_fair_resync_end(FsFairQueue *fq, bool count_again)
{
	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (fq->resync_pid == MyProcPid)
	{
		fq->resyncing = false;
		fq->resync_pid = 0;
	}
	if (count_again)
		fq->synced = false;
	LWLockRelease(fq->lock);
}

/*
 * The first half of a recount: snapshot and live counts with the gate
 * closed, then the count query (its rows in SPI_tuptable).  False if the
 * gate could not close.  On error the caller opens the gate; nothing here
 * can fail while holding the queue's lock.
 */
static bool
fs_fair_resync_count(FsFairDesc *desc, FsFairQueue *fq, FsCountAt **at_p, int32 *nat,
					 uint64 *forget_gen)
{
	int32		capacity;
	Oid			owner = fs_fair_table_owner(desc);

	LWLockAcquire(fq->lock, LW_SHARED);
	capacity = fq->nitems + 64;
	LWLockRelease(fq->lock);
	FS_FAULT_POINT("recount_count");
	*at_p = palloc(sizeof(FsCountAt) * capacity);

	while (fs_fair_gate_close(fq))
	{
		Snapshot	snapshot;
		FsCountAt  *at = *at_p;
		FsRunAs		run_as;
		int			ret;
		int32		i;

		/*
		 * Every tenant in the fair order needs its live count: one left out
		 * would be adjusted as if it had none and counted twice.  The order
		 * may have grown since the array was sized; then size it again (not
		 * under the lock: an error there would leave it held) and close the
		 * gate again.
		 */
		snapshot = RegisterSnapshot(GetLatestSnapshot());
		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		if (fq->nitems > capacity)
		{
			capacity = fq->nitems * 2 + 64;
			LWLockRelease(fq->lock);
			fs_fair_gate_open(fq);
			UnregisterSnapshot(snapshot);
			*at_p = repalloc(*at_p, sizeof(FsCountAt) * capacity);
			continue;
		}
		*forget_gen = fq->forget_gen;
		for (i = 0; i < fq->nitems; i++)
		{
			FsTenant   *entry = heap_at(fq, i)->tenant;

			at[*nat].tenant = entry;
			at[*nat].generation = entry->generation;
			SpinLockAcquire(&entry->mutex);
			at[*nat].rows = entry->ready_rows;
			SpinLockRelease(&entry->mutex);
			(*nat)++;
		}
		fq->resync_gen++;
		LWLockRelease(fq->lock);
		fs_fair_gate_open(fq);

		/*
		 * The count evaluates the registrant's expressions and the table's
		 * row-level security policies: run it as the ready table's owner in
		 * a read-only security-restricted operation (run_as.c), so that a
		 * recount by a superuser or the background worker gives the owner's
		 * code no more privilege than the owner has, and nothing it does
		 * outlives the count.  (On error, the abort puts the user back.)
		 */
		fs_run_as_begin(&run_as, owner, FS_RUN_AS_READ_ONLY);
		ret = SPI_execute_snapshot(desc->count_plan, NULL, NULL, snapshot, InvalidSnapshot,
								   true, false, 0);
		fs_run_as_end(&run_as);
		UnregisterSnapshot(snapshot);
		if (ret != SPI_OK_SELECT)
			elog(ERROR, "fair dequeue count query failed: %s", SPI_result_code_string(ret));
		return true;
	}
	return false;
}

/*
 * fs_fair_resync_count(), with an error of the count query reported by
 * queue and piece, without the query (the recount's own cleanup is
 * fs_fair_resync()'s).
 */
static bool
fs_fair_resync_count_reported(FsFairDesc *desc, FsFairQueue *fq, FsCountAt **at_p, int32 *nat,
							  uint64 *forget_gen)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool counted = false;

	PG_TRY();
	{
		counted = fs_fair_resync_count(desc, fq, at_p, nat, forget_gen);
	}
	PG_CATCH();
	{
		fs_fair_query_error(cxt, desc, &desc->count_q, "count query");
	}
	PG_END_TRY();
	return counted;
}

/*
 * The second half of a recount: give every counted tenant an entry in the
 * fair order and adjust each tenant by what it was off at the snapshot.
 * Returns the ready rows counted, or -1 if the queue was forgotten meanwhile.
 */
static int64
fs_fair_resync_apply(FsFairDesc *desc, FsFairQueue *fq, FsCountAt *at, int32 nat,
					 uint64 forget_gen, int *tenants)
{
	HASHCTL		info;
	HTAB	   *counts;
	HASH_SEQ_STATUS seq;
	FsCount    *c;
	int64		total = 0;
	int64		without = 0;
	int64		untracked = 0;
	int			ntenants = 0;
	uint64		r;
	int32		i;
	int32		k;
	FsAdjust   *list;
	int32		nlist = 0;
	bool	   *matched;

	memset(&info, 0, sizeof(info));
	info.keysize = FS_NAME_BUFLEN;
	info.entrysize = sizeof(FsCount);
	info.hcxt = CurrentMemoryContext;
	counts = hash_create("fairshare recount", Max(SPI_processed, 16), &info,
						 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[r];
		bool		name_null;
		bool		rows_null;
		Datum		name = SPI_getbinval(tuple, SPI_tuptable->tupdesc, 1, &name_null);
		int64		rows = DatumGetInt64(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 2, &rows_null));
		text	   *t;
		int			len;
		char		buf[FS_NAME_BUFLEN];

		if (name_null)
		{
			without += rows;
			continue;
		}
		t = DatumGetTextPP(name);
		len = VARSIZE_ANY_EXHDR(t);
		if (len == 0 || len > FS_NAME_MAXLEN || (len == 1 && *VARDATA_ANY(t) == '*'))
		{
			without += rows;
			continue;
		}
		memcpy(buf, VARDATA_ANY(t), len);
		buf[len] = '\0';
		FS_FAULT_POINT("recount_apply");
		c = hash_search(counts, buf, HASH_ENTER, NULL);
		c->rows = rows;
		c->entry = NULL;
	}

	/*
	 * Every counted tenant gets an entry, pinned in the fair order; unless
	 * the queue was forgotten since the snapshot (below), which would leave
	 * them pinned with counts that do not add up.
	 */
	hash_seq_init(&seq, counts);
	while ((c = hash_seq_search(&seq)) != NULL)
	{
		FsTenantRef ref;
		FsTenant   *entry = fs_tenant_open(desc->queue, c->name, FS_OPEN_CREATE, &ref);
		bool		forgotten;

		if (entry == NULL)
		{
			untracked += c->rows;
			c->rows = 0;
			continue;
		}
		c->entry = entry;
		c->generation = entry->generation;	/* set when the entry was made */
		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		forgotten = fq->forget_gen != forget_gen;
		if (!forgotten)
			fs_fair_enqueue_locked(fq, entry, true);
		LWLockRelease(fq->lock);
		fs_tenant_close(&ref);
		if (forgotten)
		{
			hash_seq_term(&seq);
			break;
		}
	}

	qsort(at, nat, sizeof(FsCountAt), fs_count_at_cmp);

	/*
	 * What to adjust: every tenant that had rows at the snapshot (`at`) and
	 * every counted one, each once, by what it was off.  All are pinned in
	 * the fair order while the queue is being recounted (a tenant leaves it
	 * only when drained, which a recount holds back, or when the queue is
	 * forgotten, which is checked), but for a counted tenant whose push
	 * failed; an entry is matched by its generation, so a reused one is
	 * never taken for the tenant it was.
	 */
	list = palloc(sizeof(FsAdjust) * ((Size) nat + hash_get_num_entries(counts)));
	matched = palloc0(sizeof(bool) * Max(nat, 1));
	hash_seq_init(&seq, counts);
	while ((c = hash_seq_search(&seq)) != NULL)
	{
		FsCountAt	key;
		FsCountAt  *found;
		FsAdjust   *a;

		if (c->entry == NULL)
			continue;
		key.tenant = c->entry;
		key.generation = c->generation;
		found = bsearch(&key, at, nat, sizeof(FsCountAt), fs_count_at_cmp);
		a = &list[nlist++];
		a->entry = c->entry;
		a->generation = c->generation;
		a->counted = c->rows;
		a->live_at = found != NULL ? found->rows : 0;
		if (found != NULL)
			matched[found - at] = true;
	}
	for (i = 0; i < nat; i++)
		if (!matched[i])
		{
			FsAdjust   *a = &list[nlist++];

			a->entry = at[i].tenant;
			a->generation = at[i].generation;
			a->counted = 0;
			a->live_at = at[i].rows;
		}

	/*
	 * Adjusted a batch at a time, the queue's lock held for one batch: the
	 * adjustments are deltas, so claims and commits in between lose nothing
	 * (reservations made since the snapshot stand as they are).  A queue
	 * forgotten meanwhile (TRUNCATE, a new registration) had its counts
	 * zeroed after the snapshot: the adjustment would not add up, and it is
	 * counted again at its next use.
	 */
	for (k = 0;; k += FS_RECOUNT_BATCH)
	{
		int32		end = Min(k + FS_RECOUNT_BATCH, nlist);

		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		if (fq->forget_gen != forget_gen)
		{
			LWLockRelease(fq->lock);
			fs_fair_resync_end(fq, true);
			hash_destroy(counts);
			return -1;
		}
		if (k >= nlist)
			break;				/* with the lock held, to finish below */
		for (i = k; i < end; i++)
		{
			FsAdjust   *a = &list[i];
			int32		pos = heap_find(fq, a->entry);

			if (pos < 0 || a->entry->generation != a->generation)
				continue;
			SpinLockAcquire(&a->entry->mutex);
			/* Not clamped: claims reserved since the snapshot may exceed it. */
			a->entry->ready_rows += a->counted - a->live_at;
			a->entry->flags &= ~FS_TENANT_DRY;
			SpinLockRelease(&a->entry->mutex);
			heap_at(fq, pos)->dry_until = 0;
			if (a->counted > 0)
			{
				total += a->counted;
				ntenants++;
			}
		}
		LWLockRelease(fq->lock);
	}
	fq->resyncing = false;
	fq->resync_pid = 0;
	fq->synced = true;
	fq->rows_without_tenant = without;
	fq->untracked_rows = untracked;
	fq->last_resync_at = GetCurrentTimestamp();
	fq->counters.resyncs++;
	LWLockRelease(fq->lock);

	hash_destroy(counts);
	if (tenants != NULL)
		*tenants = ntenants;
	return total;
}

/*
 * Recount the ready rows of every tenant of `desc`'s queue from its table
 * (with `if_unsynced`, only if it was not counted in this server run yet).
 * Returns the number of ready rows (with a valid tenant), or -1 if another
 * recount of the queue is running, or commits did not let the gate close.
 * Needs SPI connected.  Takes no table lock: writers and claimers go on.
 *
 * With the gate closed, the snapshot is taken and each backlogged tenant's
 * live count copied, and the recount generation moves on: reservations made
 * before it no longer stand (the count has their rows), later ones do.  The
 * table is counted with that snapshot; then each tenant's count is adjusted
 * by (counted - live count at the snapshot), which keeps every change
 * applied since.  A recount inside fs_claim() follows the caller's snapshot
 * no more than a background one does: it always counts the latest committed
 * state.
 */
/* Both halves of a recount; false if the gate could not close. */
static bool
fs_fair_resync_run(FsFairDesc *desc, FsFairQueue *fq, int *tenants, int64 *total)
{
	FsCountAt  *at;
	int32		nat = 0;
	uint64		forget_gen = 0;

	if (!fs_fair_resync_count_reported(desc, fq, &at, &nat, &forget_gen))
		return false;
	*total = fs_fair_resync_apply(desc, fq, at, nat, forget_gen, tenants);
	return true;
}

/*
 * Mark `fq` as being recounted by this backend; false if another live
 * backend is recounting it (or, with `if_unsynced`, it is counted).  A mark
 * left by a backend that is gone is taken over, with the gate it may have
 * left closed.
 */
static bool
fs_fair_resync_begin(FsFairQueue *fq, bool if_unsynced)
{
	static uint64 resync_seq = 0;
	int			owner = 0;
	uint64		owner_gen = 0;
	bool		taken_over;

	if (!resync_exit_registered)
	{
		before_shmem_exit(fs_fair_resync_exit, (Datum) 0);
		resync_exit_registered = true;
	}
	if (nowned_resyncs == FS_MAX_OWNED_RESYNCS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many nested recounts of fair-dequeue queues"),
				 errhint("Do not call fs_resync() or fs_claim() from a registered expression or a policy of a ready table.")));

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (fq->resyncing && !(if_unsynced && fq->synced))
	{
		owner = fq->resync_pid;
		owner_gen = fq->resync_owner_gen;
		LWLockRelease(fq->lock);
		/* Not under the lock: BackendPidGetProc() takes ProcArrayLock. */
		if (!fs_fair_owner_gone(owner))
			return false;
		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		if (fq->resyncing && (fq->resync_pid != owner || fq->resync_owner_gen != owner_gen))
		{
			LWLockRelease(fq->lock);
			return false;		/* someone else took it over first */
		}
	}
	if (if_unsynced && fq->synced)
	{
		LWLockRelease(fq->lock);
		return false;
	}
	taken_over = fq->resyncing;
	fq->resyncing = true;
	fq->resync_pid = MyProcPid;
	fq->resync_owner_gen = ++resync_seq;
	owned_resyncs[nowned_resyncs].fq = fq;
	owned_resyncs[nowned_resyncs].gen = fq->resync_owner_gen;
	nowned_resyncs++;
	LWLockRelease(fq->lock);

	if (taken_over)
	{
		/* The gone backend may have left the gate closed, too. */
		fs_fair_gate_open(fq);
		ereport(LOG,
				(errmsg("took over the recount of a fair-dequeue queue from backend %d, which is gone",
						owner)));
	}
	return true;
}

/* Forget this backend's record of its innermost recount. */
static void
fs_fair_resync_forget_owned(FsFairQueue *fq)
{
	if (nowned_resyncs > 0 && owned_resyncs[nowned_resyncs - 1].fq == fq)
		nowned_resyncs--;
}

int64
fs_fair_resync(FsFairDesc *desc, bool if_unsynced, int *tenants)
{
	FsFairQueue *fq = desc->fq;
	bool		gate_closed;
	int64		total = -1;

	if (fq == NULL)
		return -1;
	if (!fs_fair_resync_begin(fq, if_unsynced))
		return -1;

	PG_TRY();
	{
		gate_closed = fs_fair_resync_run(desc, fq, tenants, &total);
	}
	PG_CATCH();
	{
		fs_fair_gate_open(fq);	/* if the error came with it closed */
		fs_fair_resync_end(fq, true);
		fs_fair_resync_forget_owned(fq);
		PG_RE_THROW();
	}
	PG_END_TRY();
	fs_fair_resync_forget_owned(fq);

	if (!gate_closed)
	{
		fs_fair_resync_end(fq, false);
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not recount queue \"%s\": its commits did not pause", desc->queue_name),
				 errhint("It is recounted at its next use, or by fs_resync().")));
	}
	return total;
}

/* What fs_fair_resync_one() works on. */
typedef struct FsResyncArgs
{
	const char *queue_name;
	bool		owned_only;
	bool		done;
	int		   *tenants;
	int64	   *rows;
} FsResyncArgs;

/* fs_fair_resync_guarded()'s work, in its subtransaction. */
static void
fs_fair_resync_one(void *arg)
{
	FsResyncArgs *a = (FsResyncArgs *) arg;
	FsFairDesc *desc = fs_fair_desc(a->queue_name, true);

	if (desc != NULL && (!a->owned_only || fs_class_ownercheck(desc->ready_relid, GetUserId())))
	{
		*a->rows = fs_fair_resync(desc, false, a->tenants);
		a->done = true;
	}
}

/*
 * Recount one queue in a subtransaction: false (after a WARNING) if it
 * failed, say because its table was dropped or its expressions fail on
 * some row, so that a recount of every queue goes on with the others.  A
 * cancel, a timeout or running out of memory is not such a failure: it
 * stops the whole statement (subxact.c).  With `owned_only`, a queue whose
 * table the caller does not own is skipped (false, silently).  Needs SPI
 * connected.
 */
static bool
fs_fair_resync_guarded(const char *queue_name, bool owned_only, int *tenants, int64 *rows)
{
	FsResyncArgs args = {queue_name, owned_only, false, tenants, rows};
	ErrorData  *edata;

	if (fs_subxact_run(fs_fair_resync_one, &args, NULL, &edata))
		return args.done;
	ereport(WARNING,
			(errcode(edata->sqlerrcode),
			 errmsg("could not recount queue \"%s\": %s", queue_name, edata->message),
			 errhint("Fix or unregister the queue; the other queues are recounted.")));
	FreeErrorData(edata);
	return false;
}

/*
 * fs_resync(queue text DEFAULT NULL)
 *	 RETURNS TABLE(queue text, tenants int, ready_rows bigint)
 *
 * Recount now; NULL recounts every registered queue of this database.
 */
Datum
fs_resync(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo;
	List	   *queues;
	ListCell   *lc;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (PG_ARGISNULL(0))
		queues = fs_fair_registered_queues();
	else
	{
		char		name[FS_NAME_BUFLEN];

		fs_name_arg(fcinfo, 0, "queue", name);
		queues = list_make1(pstrdup(name));
	}

	foreach(lc, queues)
	{
		const char *queue_name = (const char *) lfirst(lc);
		Datum		values[3];
		bool		nulls[3] = {false, false, false};
		int			tenants = 0;
		int64		rows;

		if (PG_ARGISNULL(0))
		{
			/* Every queue the caller owns; one failing does not stop the rest. */
			if (!fs_fair_resync_guarded(queue_name, true, &tenants, &rows))
				continue;
		}
		else
		{
			FsFairDesc *desc = fs_fair_desc(queue_name, false);

			fs_fair_check_owner(desc->ready_relid, desc->queue_name);
			rows = fs_fair_resync(desc, false, &tenants);
		}
		values[0] = CStringGetTextDatum(queue_name);
		values[1] = Int32GetDatum(tenants);
		values[2] = Int64GetDatum(rows);
		nulls[2] = rows < 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	SPI_finish();
	return (Datum) 0;
}

int
fs_fairqueue_resync_all(void)
{
	List	   *queues;
	ListCell   *lc;
	int			done = 0;

	if (fs_fair == NULL)
		return 0;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	(void) fs_claim_map_sweep();
	queues = fs_fair_registered_queues();

	foreach(lc, queues)
	{
		int			tenants = 0;
		int64		rows = 0;

		if (fs_fair_resync_guarded((const char *) lfirst(lc), false, &tenants, &rows) && rows >= 0)
			done++;
	}
	SPI_finish();
	return done;
}

/* ----------------------------------------------------------------
 * Fairness metrics
 * ----------------------------------------------------------------
 */

bool
fs_fairqueue_may_evict(const FsTenant *entry)
{
	if (entry->flags & FS_TENANT_QUEUED)
		return false;
	if (fs_fair == NULL || entry->key.queue_id >= (uint32) fs_max_queues)
		return true;

	/*
	 * A tenant ahead of the queue's virtual time still owes what it was
	 * served; forgetting it would give that back.  (Read without the queue's
	 * lock: a stale value only delays or hastens one eviction.)
	 */
	return entry->virtual_finish <= fs_fair->queues[entry->key.queue_id].vtime;
}

void
fs_fairqueue_reset_counters(void)
{
	int			i;

	if (fs_fair == NULL)
		return;
	for (i = 0; i < fs_max_queues; i++)
	{
		FsFairQueue *fq = &fs_fair->queues[i];

		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		memset(&fq->counters, 0, sizeof(fq->counters));
		LWLockRelease(fq->lock);
	}
}

/* A tenant as the metrics see it. */
typedef struct FsShareRow
{
	char		tenant[FS_NAME_BUFLEN];
	float8		weight;
	int32		min_slots;
	int32		slots;
	int64		ready;
	float8		served;			/* decayed to now */
	float8		finish;
	uint64		failed_to_deliver;
	bool		active;			/* backlogged or running */
} FsShareRow;

typedef struct FsShareScan
{
	uint32		queue_id;
	TimestampTz now;
	FsShareRow *rows;
	int			count;
	int			capacity;
} FsShareScan;

static void
fs_share_collect(const FsTenant *t, void *arg)
{
	FsShareScan *scan = (FsShareScan *) arg;
	FsShareRow *row;

	if (t->key.queue_id != scan->queue_id)
		return;
	if (scan->count == scan->capacity)
		return;
	row = &scan->rows[scan->count++];
	strlcpy(row->tenant, t->key.tenant, FS_NAME_BUFLEN);
	row->weight = fs_fair_weight(t->weight);
	row->min_slots = t->min_slots;
	row->slots = t->slots_in_use;
	row->ready = Max(t->ready_rows, 0);
	row->served = fs_served_decayed(t->served_ms, t->touched_at, scan->now);
	row->finish = t->virtual_finish;
	row->failed_to_deliver = t->failed_to_deliver;
	row->active = t->ready_rows > 0 || t->slots_in_use > 0;
}

/* Copies of the queue's tenant entries (allocated before the scan). */
static void
fs_share_scan(FsQueue *queue, FsShareScan *scan)
{
	scan->queue_id = queue->queue_id;
	scan->now = fs_now();
	scan->count = 0;
	scan->capacity = (int) Min((int64) queue->tenants + 64, (int64) fs_max_tenants);
	scan->rows = palloc_extended(sizeof(FsShareRow) * scan->capacity, MCXT_ALLOC_HUGE);
	fs_tenant_foreach(fs_share_collect, scan);
}

static int
fs_float8_cmp(const void *a, const void *b)
{
	float8		x = *(const float8 *) a;
	float8		y = *(const float8 *) b;

	return (x > y) - (x < y);
}

/*
 * Jain's index (sum x)^2 / (n sum x^2) and the Gini coefficient of
 * x = served / weight over the active tenants; NULL (false) with fewer than
 * one active tenant or nothing served.
 */
static bool
fs_fairness_indexes(const FsShareScan *scan, float8 *jain, float8 *gini)
{
	float8	   *x;
	float8		sum = 0;
	float8		sum2 = 0;
	float8		weighted = 0;
	int			n = 0;
	int			i;

	x = palloc(sizeof(float8) * Max(scan->count, 1));
	for (i = 0; i < scan->count; i++)
		if (scan->rows[i].active)
		{
			x[n] = scan->rows[i].served / scan->rows[i].weight;
			sum += x[n];
			sum2 += x[n] * x[n];
			n++;
		}
	if (n == 0 || sum <= 0)
	{
		pfree(x);
		return false;
	}
	*jain = sum * sum / (n * sum2);

	/* Gini = sum_i (2i - n - 1) x_(i) / (n sum x), x sorted ascending. */
	qsort(x, n, sizeof(float8), fs_float8_cmp);
	for (i = 0; i < n; i++)
		weighted += (2.0 * (i + 1) - n - 1) * x[i];
	*gini = weighted / (n * sum);
	pfree(x);
	return true;
}

typedef void (*fs_queue_row_fn) (ReturnSetInfo *rsinfo, const char *name, FsQueue *queue);

/*
 * Run `fn` for every registered queue of this database (queue is NULL for a
 * queue shared memory has no room for), as a materialized SRF.
 */
static void
fs_fair_queue_rows(FunctionCallInfo fcinfo, fs_queue_row_fn fn)
{
	ReturnSetInfo *rsinfo;
	List	   *queues;
	ListCell   *lc;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	queues = fs_fair_registered_queues();
	foreach(lc, queues)
	{
		const char *name = (const char *) lfirst(lc);

		fn(rsinfo, name, fs_queue_lookup(name, false));
	}
	SPI_finish();
}

static void
fs_fairness_row(ReturnSetInfo *rsinfo, const char *name, FsQueue *queue)
{
	Datum		values[18];
	bool		nulls[18];
	FsShareScan scan;
	FsFairQueue copy;
	int			backlogged = 0;
	int			active = 0;
	int64		ready = 0;
	float8		served = 0;
	uint64		failed = 0;
	float8		jain;
	float8		gini;
	bool		have;
	int			i;
	int			k = 0;

	memset(nulls, 0, sizeof(nulls));
	memset(&copy, 0, sizeof(copy));
	scan.count = 0;
	scan.rows = NULL;
	if (queue != NULL)
	{
		FsFairQueue *fq = fs_fair_queue(queue);

		LWLockAcquire(fq->lock, LW_SHARED);
		copy = *fq;
		LWLockRelease(fq->lock);
		fs_share_scan(queue, &scan);
	}
	for (i = 0; i < scan.count; i++)
	{
		backlogged += scan.rows[i].ready > 0;
		active += scan.rows[i].active;
		ready += scan.rows[i].ready;
		served += scan.rows[i].served;
		failed += scan.rows[i].failed_to_deliver;
	}
	have = scan.count > 0 && fs_fairness_indexes(&scan, &jain, &gini);

	values[k++] = CStringGetTextDatum(name);
	values[k++] = Int32GetDatum(backlogged);
	values[k++] = Int64GetDatum(ready);
	values[k++] = Int64GetDatum(copy.rows_without_tenant);
	values[k++] = Int64GetDatum(copy.untracked_rows);
	values[k++] = Int32GetDatum(active);
	values[k] = Float8GetDatum(have ? jain : 0);
	nulls[k++] = !have;
	values[k] = Float8GetDatum(have ? gini : 0);
	nulls[k++] = !have;
	values[k++] = Float8GetDatum(served);
	values[k++] = Float8GetDatum(copy.vtime);
	values[k++] = Int64GetDatum((int64) copy.counters.claims);
	values[k++] = Int64GetDatum((int64) copy.counters.rows_claimed);
	values[k++] = Int64GetDatum((int64) copy.counters.rows_released);
	values[k++] = Int64GetDatum((int64) copy.counters.short_probes);
	values[k++] = Int64GetDatum((int64) copy.counters.fail_open);
	values[k++] = Int64GetDatum((int64) failed);
	values[k++] = Int64GetDatum((int64) copy.counters.resyncs);
	values[k] = TimestampTzGetDatum(copy.last_resync_at);
	nulls[k++] = copy.last_resync_at == 0;
	Assert(k == 18);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * fs_fairness_state(): one row per registered queue of this database; see
 * the fs_fairness view.
 */
Datum
fs_fairness_state(PG_FUNCTION_ARGS)
{
	fs_fair_queue_rows(fcinfo, fs_fairness_row);
	return (Datum) 0;
}

static void
fs_fair_share_rows(ReturnSetInfo *rsinfo, const char *name, FsQueue *queue)
{
	FsShareScan scan;
	float8		vtime;
	float8		served = 0;
	float8		weights = 0;
	int			i;

	if (queue == NULL)
		return;
	LWLockAcquire(fs_fair_queue(queue)->lock, LW_SHARED);
	vtime = fs_fair_queue(queue)->vtime;
	LWLockRelease(fs_fair_queue(queue)->lock);
	fs_share_scan(queue, &scan);
	for (i = 0; i < scan.count; i++)
		if (scan.rows[i].active)
		{
			served += scan.rows[i].served;
			weights += scan.rows[i].weight;
		}

	for (i = 0; i < scan.count; i++)
	{
		FsShareRow *row = &scan.rows[i];
		Datum		values[12];
		bool		nulls[12];
		int			k = 0;

		if (!row->active && row->served < FS_MIN_COST)
			continue;
		memset(nulls, 0, sizeof(nulls));
		values[k++] = CStringGetTextDatum(name);
		values[k++] = CStringGetTextDatum(row->tenant);
		values[k++] = Float8GetDatum(row->weight);
		values[k++] = Int32GetDatum(row->min_slots);
		values[k++] = Int32GetDatum(row->slots);
		values[k++] = Int64GetDatum(row->ready);
		values[k++] = Float8GetDatum(row->served);
		if (row->active && served > 0 && weights > 0)
		{
			float8		share = row->served / served;
			float8		fair = row->weight / weights;

			values[k++] = Float8GetDatum(share);
			values[k++] = Float8GetDatum(fair);
			values[k++] = Float8GetDatum(share / fair);
		}
		else
		{
			nulls[k++] = true;
			nulls[k++] = true;
			nulls[k++] = true;
		}
		values[k++] = Float8GetDatum(row->finish);
		values[k++] = Float8GetDatum(row->finish - vtime);
		Assert(k == 12);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
}

/*
 * fs_fair_share_state(): one row per tenant of a registered queue of this
 * database that is active or has served work; see the fs_fair_shares view.
 */
Datum
fs_fair_share_state(PG_FUNCTION_ARGS)
{
	fs_fair_queue_rows(fcinfo, fs_fair_share_rows);
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * The state file
 * ----------------------------------------------------------------
 */

/* The fields of a queue's item in the state file (ids are never reused). */
enum
{
	FS_FAIRQ_QUEUE = 1,			/* uint32: the queue's index in the file */
	FS_FAIRQ_VTIME = 2,			/* float8 */
	FS_FAIRQ_AVG_COST = 3,		/* float8 */
	FS_FAIRQ_AVG_RUNTIME_MS = 4 /* float8 */
};

/*
 * Write fair dequeue's sections of the state file: each queue's virtual time
 * and average costs (clean shutdowns only) and the claim map (every save).
 */
void
fs_fairqueue_save_state(StringInfo buf, uint32 nqueues, bool clean)
{
	Size		at;
	uint32		i;
	uint64		count;

	if (fs_fair == NULL)
		return;
	if (clean)
	{
		at = fs_state_section_begin(buf, FS_SECTION_FAIRQ_QUEUES, 0);
		for (i = 0; i < nqueues; i++)
		{
			FsFairQueue *fq = &fs_fair->queues[i];
			float8		vtime;
			float8		avg_cost;
			float8		avg_runtime_ms;
			Size		item;

			LWLockAcquire(fq->lock, LW_SHARED);
			vtime = fq->vtime;
			avg_cost = fq->avg_cost;
			avg_runtime_ms = fq->avg_runtime_ms;
			LWLockRelease(fq->lock);
			item = fs_state_item_begin(buf);
			fs_state_put_value(buf, FS_FAIRQ_QUEUE, i);
			fs_state_put_value(buf, FS_FAIRQ_VTIME, vtime);
			fs_state_put_value(buf, FS_FAIRQ_AVG_COST, avg_cost);
			fs_state_put_value(buf, FS_FAIRQ_AVG_RUNTIME_MS, avg_runtime_ms);
			fs_state_item_end(buf, item);
		}
		fs_state_section_end(buf, at, nqueues);
	}

	at = fs_state_section_begin(buf, FS_SECTION_FAIRQ_CLAIMS, 0);
	count = fs_claim_map_save(buf, nqueues);
	fs_state_section_end(buf, at, count);
}

/*
 * Restore one of fair dequeue's sections (`count` field-by-field items in
 * `bytes`), in the postmaster: the queues' state only from a clean
 * shutdown's file, the claim map from any.
 */
void
fs_fairqueue_restore_section(uint32 tag, const char *data, Size bytes, uint64 count,
							 FsQueue **queues, uint64 nqueues, bool clean, int64 next_lease_id)
{
	uint64		i;
	Size		pos = 0;

	if (fs_fair == NULL)
		return;
	if (tag == FS_SECTION_FAIRQ_QUEUES && clean)
	{
		for (i = 0; i < count; i++)
		{
			FsStateItem item;
			uint32		queue_index = PG_UINT32_MAX;
			float8		vtime = NAN;
			float8		avg_cost = 1.0;
			float8		avg_runtime_ms = 1.0;
			uint8		field;
			uint8		len;
			const char *value;
			FsFairQueue *fq;

			if (!fs_state_item_next(data, bytes, &pos, &item))
				break;
			while (fs_state_field_next(&item, &field, &value, &len))
			{
				if (field == FS_FAIRQ_QUEUE)
					fs_state_field_value(value, len, queue_index);
				else if (field == FS_FAIRQ_VTIME)
					fs_state_field_value(value, len, vtime);
				else if (field == FS_FAIRQ_AVG_COST)
					fs_state_field_value(value, len, avg_cost);
				else if (field == FS_FAIRQ_AVG_RUNTIME_MS)
					fs_state_field_value(value, len, avg_runtime_ms);
			}
			if (queue_index >= nqueues || queues[queue_index] == NULL ||
				isnan(vtime) || isinf(vtime))
				continue;
			fq = &fs_fair->queues[queues[queue_index]->queue_id];
			fq->vtime = vtime;
			fq->avg_cost = fs_fair_clamp_cost(avg_cost, false);
			fq->avg_runtime_ms = fs_fair_clamp_cost(avg_runtime_ms, false);
		}
	}
	else if (tag == FS_SECTION_FAIRQ_CLAIMS)
		fs_claim_map_restore(data, bytes, count, queues, nqueues, next_lease_id);
}

/* ----------------------------------------------------------------
 * Module start
 * ----------------------------------------------------------------
 */

void
fs_fairqueue_init(void)
{
	fs_fair_register_init();
	fs_track_init();
}

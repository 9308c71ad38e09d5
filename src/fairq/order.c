/*-------------------------------------------------------------------------
 *
 * order.c
 *	  Fair per-tenant dequeue: the fair order in shared memory (each queue's
 *	  heap of backlogged tenants), backlog changes as commits apply them,
 *	  fair dequeue's part of the state file, and its start.  Claims are in
 *	  plan.c and claim.c, recounts in recount.c, metrics in metrics.c.
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
 * Everything a claim did is recorded (track.c) and undone if its
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
 * too, so fs_heap_at() costs d + 1 loads: one up to C items, two up to C F
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
 * ceil(m / C); fs_heap_shrink() gives chunks back down to one spare beyond
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

/*
 * Shared memory of fair dequeue, but the claim map: each queue's state, and
 * the pools the fair orders' chunks and directory nodes come from.
 */
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

/* Shared memory of fair dequeue: the queues, the heap pools, the claim map. */
static Size
fs_fairqueue_shmem_size(void)
{
	return add_size(add_size(add_size(fs_fair_struct_size(), fs_claim_map_shmem_size()),
							 fs_leaves_shmem_size()),
					fs_route_shmem_size());
}

/* Ask for fair dequeue's shared memory and its lock tranche. */
void
fs_fairqueue_shmem_request(void)
{
	RequestAddinShmemSpace(fs_fairqueue_shmem_size());
	RequestNamedLWLockTranche("fairshare fair dequeue", fs_max_queues + FS_CLAIM_PARTITIONS + 1);
}

/*
 * Create (or attach to) fair dequeue's shared state: each queue's state and
 * lock, the pools, and the claim map. Caller holds AddinShmemInitLock.
 */
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
			pg_atomic_init_u32(&fq->commit_barrier, 0);
			pg_atomic_init_u64(&fq->latency_sampled_at, 0);
			fq->avg_cost = 1.0;
			fq->avg_runtime_ms = 1.0;
			fq->heap_root = -1;
			fs_probe_starts_init(&fq->probe_starts);
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
	fs_lockstats_name_locks("sub-key table", &locks[fs_max_queues + FS_CLAIM_PARTITIONS], 1);
	fs_claim_map_shmem_init();
	fs_leaves_shmem_init(&locks[fs_max_queues + FS_CLAIM_PARTITIONS].lock);
	fs_route_shmem_init();
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

/*
 * Have `queue` recounted from its table at its next use, keeping its fair
 * order meanwhile: for a change of its rows that cannot be applied exactly
 * (a prepared transaction's, finished without the frame of its COMMIT
 * PREPARED).
 */
void
fs_fair_count_again(FsQueue *queue)
{
	FsFairQueue *fq = fs_fair_queue(queue);

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	fq->synced = false;
	/* A recount running now may have taken its snapshot before the change. */
	if (fq->resyncing)
		fq->count_again = true;
	LWLockRelease(fq->lock);
}

/* fs_fair_count_again() for every queue there is. */
void
fs_fair_count_again_all(void)
{
	FsQueue    *queue;

	for (uint32 id = 0; (queue = fs_queue_by_id(id)) != NULL; id++)
		fs_fair_count_again(queue);
}

/* ----------------------------------------------------------------
 * The heap (caller holds fq->lock exclusively)
 *
 * Every operation that puts an item at a position writes that position to
 * the item's tenant entry (FsTenant.heap_index), so a tenant is found in
 * its heap in constant time (fs_heap_find).
 * ----------------------------------------------------------------
 */




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
	while (fs_heap_span(depth) < fq->nchunks)
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
void
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
		FsHeapItem *item = fs_heap_at(fq, i);
		uint8		flags;

		if (i > 0 && fs_heap_less(item, fs_heap_at(fq, (i - 1) / 2)))
			ordered = false;
		if (item->tenant->heap_index != i)
			positioned = false;
		fs_tenant_lock(item->tenant);
		flags = item->tenant->flags;
		fs_tenant_unlock(item->tenant);
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
#endif

/*
 * Move the item at position i up to its place.  The item moving is held
 * aside and each parent it passes moves down into the hole: one copy and one
 * position written per level.
 */
static void
heap_sift_up(FsFairQueue *fq, int32 i)
{
	FsHeapItem *hole = fs_heap_at(fq, i);
	FsHeapItem	moving = *hole;

	while (i > 0)
	{
		int32		parent = (i - 1) / 2;
		FsHeapItem *above = fs_heap_at(fq, parent);

		if (!fs_heap_less(&moving, above))
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
void
fs_heap_sift_down(FsFairQueue *fq, int32 i)
{
	FsHeapItem *hole = fs_heap_at(fq, i);
	FsHeapItem	moving = *hole;

	for (;;)
	{
		int32		child = 2 * i + 1;
		FsHeapItem *below;

		if (child >= fq->nitems)
			break;
		below = fs_heap_at(fq, child);
		if (child + 1 < fq->nitems)
		{
			FsHeapItem *right = fs_heap_at(fq, child + 1);

			if (fs_heap_less(right, below))
			{
				child++;
				below = right;
			}
		}
		if (!fs_heap_less(below, &moving))
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
	if (i > 0 && fs_heap_less(fs_heap_at(fq, i), fs_heap_at(fq, (i - 1) / 2)))
		heap_sift_up(fq, i);
	else
		fs_heap_sift_down(fq, i);
}

/* Restore the heap order of the whole fair order (after keys changed in bulk). */
void
fs_heap_rebuild(FsFairQueue *fq)
{
	int32		i;

	for (i = fq->nitems / 2 - 1; i >= 0; i--)
		fs_heap_sift_down(fq, i);
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
	bool		new_root = k > 0 && k == fs_heap_span(depth);
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
		if (k % fs_heap_span(level) == 0)
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

			if (k % fs_heap_span(level - 1) == 0)
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
		if (level > 1 && k % fs_heap_span(level - 1) == 0)
			freed[nfreed++] = id;
	}
	/* id is the chunk now; below the root nothing is read any more. */
	fq->nchunks--;
	if (fq->nchunks == 0)
		fq->heap_root = -1;
	else if (fq->heap_depth > 0 && fq->nchunks <= fs_heap_span(fq->heap_depth - 1))
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
void
fs_heap_shrink(FsFairQueue *fq, int32 reserved)
{
	while (fq->nchunks > 1 &&
		   (int64) fq->nitems + reserved <= (int64) (fq->nchunks - 2) * FS_HEAP_CHUNK)
		heap_release_last_chunk(fq);
}

/* Push `item` onto the fair order; false when the pools have no room. */
static bool
heap_push(FsFairQueue *fq, const FsHeapItem *item)
{
	if (fq->nitems == fq->nchunks * FS_HEAP_CHUNK && !heap_grow(fq))
		return false;
	*fs_heap_at(fq, fq->nitems) = *item;
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
void
fs_heap_remove(FsFairQueue *fq, int32 i)
{
	FsHeapItem *hole = fs_heap_at(fq, i);
	int32		last = fq->nitems - 1;

	if (hole->min_slots > 0)
		fq->nfloor--;
	hole->tenant->heap_index = -1;
	fq->nitems--;
	if (i != last)
	{
		*hole = *fs_heap_at(fq, last);
		hole->tenant->heap_index = i;
		heap_fix(fq, i);
	}
}

/*
 * Position of `tenant` in the heap, or -1: from the position it keeps,
 * checked against the heap (constant time).
 */
int32
fs_heap_find(FsFairQueue *fq, const FsTenant *tenant)
{
	int32		i = tenant->heap_index;

	if (i >= 0 && i < fq->nitems && fs_heap_at(fq, i)->tenant == tenant)
		return i;
	return -1;
}

/*
 * Push `item`, whose tenant the caller marked FS_TENANT_QUEUED, onto the
 * heap.  If the pools have no room (they cannot lack it, by their sizing)
 * the tenant is left out, unmarked, and counted as failing open.
 */
void
fs_fair_push_locked(FsFairQueue *fq, const FsHeapItem *item)
{
	if (heap_push(fq, item))
		return;
	fs_tenant_lock(item->tenant);
	fs_tenant_set_queued(item->tenant, false);
	fs_tenant_unlock(item->tenant);
	item->tenant->heap_index = -1;
	FS_FAIR_COUNT(fq, fail_open, 1);
}

/*
 * Put `entry` (pinned by the caller) in the fair order if it has ready rows
 * (or `always`) and is not there yet, with no listing: the change that
 * listed it sets that (fs_fair_set_listed_locked()).  Caller holds fq->lock
 * exclusively.
 */
void
fs_fair_enqueue_locked(FsFairQueue *fq, FsTenant *entry, bool always)
{
	FsHeapItem	item;
	bool		add;

	fs_tenant_lock(entry);
	/* A negative count (a recount's window) must be adjusted too: it stays. */
	add = (always || entry->ready_rows != 0) && !(entry->flags & FS_TENANT_QUEUED);
	if (add)
	{
		fs_tenant_set_queued(entry, true);
		item.key = entry->virtual_finish;
		item.min_slots = entry->min_slots;
	}
	fs_tenant_unlock(entry);
	if (!add)
		return;

	item.tenant = entry;
	item.dry_until = 0;
	item.listed_xid = InvalidTransactionId;
	fs_fair_push_locked(fq, &item);
}

/*
 * The commit of `listed_xid` took the count of `entry` from none to some
 * ready rows (whether it was in the fair order already, its rows all
 * reserved or claimed, or was just put there); or a claim gave rows back
 * (InvalidTransactionId).  Caller holds fq->lock exclusively.
 */
void
fs_fair_set_listed_locked(FsFairQueue *fq, const FsTenant *entry, TransactionId listed_xid)
{
	int32		i = fs_heap_find(fq, entry);

	if (i >= 0)
		fs_heap_at(fq, i)->listed_xid = listed_xid;
}

/*
 * Replay: put a tenant whose state the primary logged where its backlog and
 * tag say in its queue's fair order: listed, with its tag as its key, if it
 * has ready rows; out of the order if not.  The caller holds the entry's
 * partition lock (rule 8: before the fair-order lock); a listed entry is
 * pinned by its mark from then on.
 */
void
fs_fair_replay_tenant(FsQueue *queue, FsTenant *entry)
{
	FsFairQueue *fq = fs_fair_queue(queue);
	int64		ready;
	float8		tag;
	int32		i;

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	fs_tenant_lock(entry);
	ready = entry->ready_rows;
	tag = entry->virtual_finish;
	fs_tenant_unlock(entry);
	i = fs_heap_find(fq, entry);
	if (i >= 0 && ready == 0)
	{
		/* Its chunk given back before its mark goes (the pools' sizing). */
		fs_heap_remove(fq, i);
		fs_heap_shrink(fq, 0);
		fs_tenant_lock(entry);
		fs_tenant_set_queued(entry, false);
		fs_tenant_unlock(entry);
	}
	else if (i >= 0)
	{
		fs_heap_at(fq, i)->key = tag;
		heap_fix(fq, i);
	}
	else if (ready != 0)
		fs_fair_enqueue_locked(fq, entry, false);
	fs_fair_note_finish(fq, tag);
	LWLockRelease(fq->lock);
}

/*
 * Change a tenant's finish tag by `delta` (and its heap position).  Caller
 * holds fq->lock exclusively and pins the entry.
 */
void
fs_fair_shift_tag_locked(FsFairQueue *fq, FsTenant *entry, float8 delta)
{
	float8		f;
	int32		i;

	if (delta == 0)
		return;
	fs_tenant_lock(entry);
	f = entry->virtual_finish + delta;
	/* A tag never goes below zero (a fresh tenant's tag). */
	f = Max(f, 0.0);
	fs_tenant_set_tag(entry, f);
	fs_tenant_unlock(entry);
	fs_fair_note_finish(fq, f);

	i = fs_heap_find(fq, entry);
	if (i >= 0)
	{
		fs_heap_at(fq, i)->key = f;
		heap_fix(fq, i);
	}
}

/* ----------------------------------------------------------------
 * Backlog and charges, as commits and rollbacks apply them
 * ----------------------------------------------------------------
 */

/* A row's cost kept within [FS_MIN_COST, FS_MAX_COST]; NULL or NaN cost 1. */
float8
fs_fair_clamp_cost(float8 cost, bool isnull)
{
	if (isnull || isnan(cost))
		return 1.0;
	return Min(Max(cost, FS_MIN_COST), FS_MAX_COST);
}


/* An empty change of a tenant's fair-order state (FsTenantChange). */
void
fs_change_init(FsTenantChange *c, TimestampTz now)
{
	memset(c, 0, sizeof(*c));
	c->now = now;
}

/*
 * Should a tenant whose claim came back short be passed over for a while?
 * Not when the claim's snapshot may have missed a commit that added its
 * rows: the rows the count has may be those, and a fresh snapshot sees
 * them.  The snapshot saw every transaction before `horizon` (its xmin), so
 * the tenant is marked only if its newest adder is older than that.
 */
static bool
fs_fair_mark_dry(FsTenant *entry, FullTransactionId horizon)
{
	bool		marked = false;

	fs_tenant_lock(entry);
	if (!FullTransactionIdIsValid(horizon) ||
		FullTransactionIdPrecedes(entry->backlog_fxid, horizon))
	{
		fs_tenant_mark_dry(entry);
		marked = true;
	}
	fs_tenant_unlock(entry);
	return marked;
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
	bool		listed;
	TransactionId listed_xid;

	entry = fs_tenant_open_cached(queue, tenant, create, &ref);
	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (c->restore_vtime && fq->vtime == c->vtime_after)
		fs_fair_set_vtime(fq, c->vtime_before);
	if (entry == NULL)
	{
		LWLockRelease(fq->lock);
		return;
	}
	weight = fs_fair_weight(ref.limits.weight);

	fs_tenant_lock(entry);
	fs_tenant_touch(entry, c->now);
	/*
	 * No clamping at zero: during a recount a claim made before its snapshot
	 * may take its row off here before the recount adds it back (the count
	 * had it), so the sum is exact only if a negative value is kept.
	 */
	listed = fs_tenant_backlog_add(entry, fq->resync_gen == c->resync_gen ? c->rows : c->rows_recounted,
								   c->rows > 0);
	fs_tenant_note_adder(entry, c->adder);
	fs_tenant_served_add(entry, c->served + c->claimed_cost);
	if (c->claimed_cost > 0)
	{
		/* As a claim would: start at max(V, F), and V moves there. */
		float8		start = Max(fq->vtime, entry->virtual_finish);

		tag += start - entry->virtual_finish;
		fs_fair_set_vtime(fq, start);
	}
	fs_tenant_unlock(entry);

	fs_fair_shift_tag_locked(fq, entry, tag + (c->cost + c->claimed_cost) / weight);
	fs_fair_enqueue_locked(fq, entry, false);
	if (fs_listing_after(listed, c->adder, c->rows, &listed_xid))
		fs_fair_set_listed_locked(fq, entry, listed_xid);
	if (c->dry && fs_fair_mark_dry(entry, c->dry_horizon))
	{
		int32		i = fs_heap_find(fq, entry);

		if (i >= 0)
			fs_heap_at(fq, i)->dry_until = c->now + FS_DRY_RETRY_USECS;
		FS_FAIR_COUNT(fq, short_probes, 1);
	}
	fs_heap_shrink(fq, 0);
	LWLockRelease(fq->lock);
	fs_tenant_close(&ref);
}

/*
 * Apply a committed change of `tenant`'s ready rows: `rows` more (or fewer)
 * ready rows, and `charge` cost units of `leaves` rows that left the ready
 * state without fs_claim() (an application's own claim), which advance the
 * tenant's tag as a claim would (`now` is read only then).  `adder`: the
 * committing top-level transaction, if it added rows (invalid otherwise).  Only a tenant that becomes backlogged
 * (or is charged) needs the queue's lock; the rest is one spinlock.
 */
void
fs_fair_apply_backlog(FsQueue *queue, const char *tenant, int64 rows, float8 charge,
					  int32 leaves, TimestampTz now, FullTransactionId adder)
{
	FsTenantRef ref;
	FsTenant   *entry;
	bool		enqueue;
	bool		listed;
	FsTenantChange c;

	if (leaves == 0)
	{
		FsFairQueue *fq = fs_fair_queue(queue);
		bool		locked = false;

		entry = fs_tenant_open_cached(queue, tenant, rows > 0, &ref);
		if (entry == NULL)
		{
			/* No room in shared memory: these rows are claimed without order. */
			if (rows > 0)
				fs_fair_add_without_tenant(queue, 0, rows);
			return;
		}

		/*
		 * A change that lists the tenant (its count from none to some) is
		 * made under the queue's lock, with the item's listed_xid, so that
		 * no planning sees the one without the other.  Known only under the
		 * tenant's spinlock, taken after the queue's lock: tried without it
		 * first, which is enough for all other changes.
		 */
		for (;;)
		{
			fs_tenant_lock(entry);
			if (!locked && fs_backlog_lists(entry->ready_rows, rows))
			{
				fs_tenant_unlock(entry);
				LWLockAcquire(fq->lock, LW_EXCLUSIVE);
				locked = true;
				continue;
			}
			listed = fs_tenant_backlog_add(entry, rows, rows > 0);
			fs_tenant_note_adder(entry, adder);
			enqueue = entry->ready_rows != 0 && !(entry->flags & FS_TENANT_QUEUED);
			fs_tenant_unlock(entry);
			break;
		}
		if (enqueue && !locked)
		{
			LWLockAcquire(fq->lock, LW_EXCLUSIVE);
			locked = true;
		}
		if (locked)
		{
			TransactionId listed_xid;

			fs_fair_enqueue_locked(fq, entry, false);
			if (fs_listing_after(listed, adder, rows, &listed_xid))
				fs_fair_set_listed_locked(fq, entry, listed_xid);
			LWLockRelease(fq->lock);
		}
		fs_tenant_close(&ref);
		return;
	}

	fs_change_init(&c, now);
	c.rows = c.rows_recounted = rows;
	c.resync_gen = fs_fair_queue(queue)->resync_gen;
	c.claimed_cost = charge;
	c.adder = adder;
	fs_fair_change(queue, tenant, true, &c);
}

/* A lease of this queue was held for `held_ms`: learn the average. */
void
fs_fair_note_runtime(FsQueue *queue, float8 held_ms)
{
	FsFairQueue *fq = fs_fair_queue(queue);

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	fs_fair_learn_runtime(fq, held_ms);
	LWLockRelease(fq->lock);
}

/* Count ready rows outside the fair order (no valid tenant, or no room for it). */
void
fs_fair_add_without_tenant(FsQueue *queue, int64 rows, int64 untracked)
{
	FsFairQueue *fq = fs_fair_queue(queue);

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	fs_fair_add_outside(fq, rows, untracked);
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
		FsTenant   *entry = fs_heap_at(fq, fq->nitems - 1)->tenant;

		fq->nitems--;
		entry->heap_index = -1;
		fs_heap_shrink(fq, 0);
		fs_tenant_lock(entry);
		fs_tenant_backlog_forget(entry);
		fs_tenant_unlock(entry);
	}
	fq->nfloor = 0;
	fs_leaves_forget(fq, queue->queue_id);
	fs_fair_set_outside(fq, 0, 0);
	fq->synced = false;
	fq->forget_gen++;
	LWLockRelease(fq->lock);
	fs_probe_starts_clear(&fq->probe_starts);
}

/* ----------------------------------------------------------------
 * Module start
 * ----------------------------------------------------------------
 */

/* Fair dequeue's start in a backend: its caches' and transactions' callbacks. */
void
fs_fairqueue_init(void)
{
	fs_fair_register_init();
	fs_track_init();
	fs_fair_triggers_init();
}

/*-------------------------------------------------------------------------
 *
 * barrier.c
 *	  The commit barrier of each fair-dequeue queue, both sides: committers
 *	  that change a queue's backlog enter it (track.c), a recount
 *	  closes it for the instant it takes its snapshot (recount.c).
 *
 * A transaction that changes a queue's counts enters the barrier before it
 * commits (XACT_EVENT_PRE_COMMIT, before its rows become visible) and
 * leaves it once its changes are applied to shared memory (after they
 * are).  A recount closes the barrier: new committers wait, and once the
 * ones inside have left, every transaction is either visible to a snapshot
 * taken now and applied, or neither.  The barrier is closed only for that
 * instant; counting runs with it open.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/procarray.h"

#include "fairq/fairqueue_int.h"

#define FS_BARRIER_CLOSED		0x80000000U
#define FS_GATE_WAIT_USECS	100
#define FS_GATE_MAX_WAIT	(10 * USECS_PER_SEC)

/* The barrier this backend closed (a recount), for its exit. */
static FsFairQueue *barrier_closed_by_me = NULL;

/* The barriers this transaction entered (a committer). */
static FsQueue **barriers_entered = NULL;
static int	nbarriers_entered = 0;
static bool barrier_exit_registered = false;

/* ----------------------------------------------------------------
 * The committer's side
 * ----------------------------------------------------------------
 */

/*
 * Whether the backend with this pid is gone.  (A pid taken again by a new
 * backend counts as alive: the mark then waits for that one, which is only
 * slower, never wrong.)
 */
bool
fs_fair_owner_gone(int pid)
{
	return pid != 0 && pid != MyProcPid && BackendPidGetProc(pid) == NULL;
}

/*
 * A committer found the barrier closed for a long time: if the recount that
 * closed it belongs to a backend that is gone, open it.
 */
static void
fs_commit_barrier_check_owner(FsFairQueue *fq)
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
	 * before it closes the barrier, and its closing must stand.
	 */
	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (fq->resyncing && fq->resync_pid == pid && fq->resync_owner_gen == gen)
		pg_atomic_fetch_and_u32(&fq->commit_barrier, ~FS_BARRIER_CLOSED);
	LWLockRelease(fq->lock);
}

/*
 * Enter a queue's commit barrier before committing changes of its backlog:
 * wait while a recount has it closed (checking for interrupts, and taking
 * the barrier over from a recount whose backend is gone).
 */
void
fs_commit_barrier_enter(FsQueue *queue)
{
	FsFairQueue *fq = fs_fair_queue(queue);
	uint32		waits = 0;

	for (;;)
	{
		uint32		old = pg_atomic_read_u32(&fq->commit_barrier);

		if (old & FS_BARRIER_CLOSED)
		{
			/*
			 * A recount is taking its snapshot: a few milliseconds at most.
			 * Every 10000 waits (a second or two), make sure its backend is
			 * still there.
			 */
			CHECK_FOR_INTERRUPTS();
			pg_usleep(FS_GATE_WAIT_USECS);
			if (++waits % (USECS_PER_SEC / FS_GATE_WAIT_USECS) == 0)
				fs_commit_barrier_check_owner(fq);
			continue;
		}
		if (pg_atomic_compare_exchange_u32(&fq->commit_barrier, &old, old + 1))
			return;
	}
}

/* Leave a queue's commit barrier: this transaction's changes are applied. */
void
fs_commit_barrier_leave(FsQueue *queue)
{
	pg_atomic_fetch_sub_u32(&fs_fair_queue(queue)->commit_barrier, 1);
}

/* Whether this backend is inside `queue`'s commit barrier. */
bool
fs_barrier_entered(FsQueue *queue)
{
	for (int i = 0; i < nbarriers_entered; i++)
		if (barriers_entered[i] == queue)
			return true;
	return false;
}

/* Leave every commit barrier this transaction entered (its end, or the backend's exit). */
void
fs_barriers_leave_all(void)
{
	while (nbarriers_entered > 0)
		fs_commit_barrier_leave(barriers_entered[--nbarriers_entered]);
}

/* before_shmem_exit: a backend that leaves never stays inside a barrier. */
static void
fs_barrier_exit_callback(int code pg_attribute_unused(), Datum arg pg_attribute_unused())
{
	fs_barriers_leave_all();
}

/*
 * Enter `queue`'s commit barrier and note it, to be left at the end of the
 * transaction (fs_barriers_enter_in_order() enters each queue once).
 */
static void
fs_barrier_enter(FsQueue *queue)
{
	if (barriers_entered == NULL)
		barriers_entered = MemoryContextAlloc(TopMemoryContext, sizeof(FsQueue *) * Max(fs_max_queues, 1));
	if (!barrier_exit_registered)
	{
		before_shmem_exit(fs_barrier_exit_callback, (Datum) 0);
		barrier_exit_registered = true;
	}
	/* Queues are never more than fairshare.max_queues. */
	if (nbarriers_entered >= fs_max_queues)
		elog(ERROR, "one transaction changed more fair-dequeue queues than fairshare.max_queues (%d)",
			 fs_max_queues);
	fs_commit_barrier_enter(queue);
	barriers_entered[nbarriers_entered++] = queue;
}

/* qsort order of queues: by id. */
static int
fs_queue_id_cmp(const void *a, const void *b)
{
	uint32		qa = (*(FsQueue *const *) a)->queue_id;
	uint32		qb = (*(FsQueue *const *) b)->queue_id;

	return qa < qb ? -1 : qa > qb ? 1 : 0;
}

/*
 * Enter the commit barriers of `queues` (a set of n, sorted here) in the
 * order of the queues' ids, to be left at the end of the transaction.  A
 * committer waits at a closed barrier holding the barriers it entered
 * before; a recount closes one barrier and waits for the committers
 * inside.  Entered in one order, a committer can only be waiting for a
 * barrier further along than any it holds, so waits cannot form a circle
 * (two recounts each waiting for a committer that waits at the other's
 * barrier, until both give up).
 */
void
fs_barriers_enter_in_order(FsQueue **queues, int n)
{
	int			i;

	qsort(queues, n, sizeof(FsQueue *), fs_queue_id_cmp);
	for (i = 0; i < n; i++)
		fs_barrier_enter(queues[i]);
}

/* ----------------------------------------------------------------
 * The recount's side
 * ----------------------------------------------------------------
 */

/*
 * Close the barrier and wait for the transactions inside to leave.  False if
 * they do not within FS_GATE_MAX_WAIT (the barrier is open again then).
 */
bool
fs_commit_barrier_close(FsFairQueue *fq)
{
	TimestampTz start = GetCurrentTimestamp();

	barrier_closed_by_me = fq;
	pg_atomic_fetch_or_u32(&fq->commit_barrier, FS_BARRIER_CLOSED);
	while ((pg_atomic_read_u32(&fq->commit_barrier) & ~FS_BARRIER_CLOSED) != 0)
	{
		if (TimestampDifferenceExceeds(start, GetCurrentTimestamp(),
									   FS_GATE_MAX_WAIT / 1000))
		{
			fs_commit_barrier_open(fq);
			return false;
		}
		/* A cancel here opens the barrier (fs_fair_resync()), a terminate too. */
		CHECK_FOR_INTERRUPTS();
		pg_usleep(FS_GATE_WAIT_USECS);
	}
	return true;
}

/* Open the barrier this backend closed. */
void
fs_commit_barrier_open(FsFairQueue *fq)
{
	pg_atomic_fetch_and_u32(&fq->commit_barrier, ~FS_BARRIER_CLOSED);
	if (barrier_closed_by_me == fq)
		barrier_closed_by_me = NULL;
}

/* Open the barrier this backend closed, if any (a recount's exit). */
void
fs_commit_barrier_open_mine(void)
{
	if (barrier_closed_by_me != NULL)
		fs_commit_barrier_open(barrier_closed_by_me);
}

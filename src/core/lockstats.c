/*-------------------------------------------------------------------------
 *
 * lockstats.c
 *	  The longest hold of each kind of fairshare LWLock, in the
 *	  lock-statistics build (make FS_LOCK_STATS=1; see lockstats.h).
 *
 * Each backend keeps the locks it holds, with when and where each was
 * taken, in a small local array; a release measures the hold and, when it
 * is the longest seen for its kind of lock, writes it to shared memory
 * under a spinlock.  Kinds are told apart by the lock's place in
 * fairshare's two tranches ("fairshare" and "fairshare fair dequeue");
 * locks of other tranches taken by fairshare's code (AddinShmemInitLock)
 * are not counted.
 *
 * fs_lock_stats() is not part of the extension's SQL: bench/lockhold
 * declares it in its own database.  In a normal build it exists only to
 * say that the build has no statistics.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <time.h>

#include "funcapi.h"
#include "portability/instr_time.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"

#include "fairq/fairqueue_int.h"
#include "core/lockstats.h"
#include "core/shmem.h"

PG_FUNCTION_INFO_V1(fs_lock_stats);

#ifdef FS_LOCK_STATS

/* Holds longer than this are counted (fs_lock_stats().holds_over_1ms). */
#define FS_LOCKSTATS_LONG_HOLD_US	1000

/* Kinds of fairshare LWLock, by their place in the tranches. */
typedef enum FsLockKind
{
	FS_LOCK_QUEUES = 0,			/* FsShared.queues_lock and workers_lock, */
	FS_LOCK_WORKERS,			/* in their tranche order */
	FS_LOCK_TENANT_PARTITION,
	FS_LOCK_LEASE_PARTITION,
	FS_LOCK_TIER_PARTITION,
	FS_LOCK_FAIR_ORDER,			/* a queue's fair-order lock (fairqueue.c) */
	FS_LOCK_CLAIM_PARTITION,	/* the claim map's partitions */
	FS_NUM_LOCK_KINDS
} FsLockKind;

StaticAssertDecl(FS_LOCK_WORKERS + 1 == FS_MISC_LOCKS,
				 "every named lock of the fairshare tranche has a kind");

static const char *const fs_lock_kind_names[FS_NUM_LOCK_KINDS] = {
	"queues",
	"workers",
	"tenant partition",
	"lease partition",
	"tier partition",
	"fair order",
	"claim map partition"
};

/*
 * The longest hold of one kind of lock, in wall-clock time (what the
 * backends waiting for it see), and the longest in CPU time of the holder
 * (what the code under the lock costs: the difference is time the holder
 * spent waiting for something else, or off the CPU when the machine has
 * more runnable processes than cores).
 */
typedef struct FsLockHold
{
	uint64		longest_us;
	LWLockMode	mode;			/* of the longest hold */
	char		where[NAMEDATALEN]; /* function that took it */
	uint64		longest_cpu_us;
	char		cpu_where[NAMEDATALEN];
	uint64		long_holds;		/* holds over FS_LOCKSTATS_LONG_HOLD_US */
	uint64		long_cpu_holds; /* holds with more CPU time than that */
} FsLockHold;

typedef struct FsLockStats
{
	slock_t		mutex;			/* protects holds[] */
	FsLockHold	holds[FS_NUM_LOCK_KINDS];
	pg_atomic_uint64 nholds[FS_NUM_LOCK_KINDS]; /* every hold, counted */
} FsLockStats;

static FsLockStats *fs_lock_stats_shared = NULL;

/*
 * The fairshare locks this backend holds.  More than PostgreSQL lets a
 * backend hold at once (MAX_SIMUL_LWLOCKS, 200), so that entries left
 * behind by error recovery (LWLockReleaseAll) do not crowd out real ones.
 */
#define FS_LOCKSTATS_MAX_HELD	256

typedef struct FsHeldLock
{
	LWLock	   *lock;
	FsLockKind	kind;
	LWLockMode	mode;
	const char *where;
	instr_time	since;
	struct timespec cpu_since;	/* CLOCK_PROCESS_CPUTIME_ID */
} FsHeldLock;

static FsHeldLock fs_held_locks[FS_LOCKSTATS_MAX_HELD];
static int	fs_num_held_locks = 0;

/*
 * The kind of a lock, or -1 for a lock of no fairshare tranche.  The
 * tranches' locks are arrays of LWLockPadded: a lock belongs to one when it
 * lies inside it on an element's boundary.
 */
static int
fs_lock_kind(const LWLock *lock)
{
	const char *at = (const char *) lock;

	if (fs_shared != NULL && fs_shared->queues_lock != NULL)
	{
		const char *base = (const char *) fs_shared->queues_lock;
		Size		count = FS_TIER_LOCKS_OFFSET + FS_TIER_PARTITIONS;

		if (at >= base && at < base + count * sizeof(LWLockPadded) &&
			(at - base) % sizeof(LWLockPadded) == 0)
		{
			Size		index = (at - base) / sizeof(LWLockPadded);

			if (index < FS_MISC_LOCKS)
				return (int) index;
			if (index < FS_LEASE_LOCKS_OFFSET)
				return FS_LOCK_TENANT_PARTITION;
			if (index < FS_TIER_LOCKS_OFFSET)
				return FS_LOCK_LEASE_PARTITION;
			return FS_LOCK_TIER_PARTITION;
		}
	}
	if (fs_fair != NULL && fs_max_queues > 0 && fs_fair->queues[0].lock != NULL)
	{
		const char *base = (const char *) fs_fair->queues[0].lock;
		Size		count = (Size) fs_max_queues + FS_CLAIM_PARTITIONS;

		if (at >= base && at < base + count * sizeof(LWLockPadded) &&
			(at - base) % sizeof(LWLockPadded) == 0)
			return (at - base) / sizeof(LWLockPadded) < (Size) fs_max_queues ?
				FS_LOCK_FAIR_ORDER : FS_LOCK_CLAIM_PARTITION;
	}
	return -1;
}

/* Forget entries of locks this backend no longer holds (error recovery). */
static void
fs_lockstats_forget_released(void)
{
	int			kept = 0;
	int			i;

	for (i = 0; i < fs_num_held_locks; i++)
	{
		if (LWLockHeldByMe(fs_held_locks[i].lock))
			fs_held_locks[kept++] = fs_held_locks[i];
	}
	fs_num_held_locks = kept;
}

/*
 * A fairshare function has just taken `lock`: note when, and where.  An
 * entry already there for the same lock was left by error recovery (an
 * LWLock is never taken twice by one backend), and goes.
 */
void
fs_lockstats_acquired(LWLock *lock, LWLockMode mode, const char *where)
{
	int			kind = fs_lock_kind(lock);
	FsHeldLock *held;
	int			i;

	if (kind < 0 || fs_lock_stats_shared == NULL)
		return;
	for (i = fs_num_held_locks - 1; i >= 0; i--)
	{
		if (fs_held_locks[i].lock == lock)
		{
			fs_held_locks[i] = fs_held_locks[--fs_num_held_locks];
			break;
		}
	}
	if (fs_num_held_locks == FS_LOCKSTATS_MAX_HELD)
		fs_lockstats_forget_released();
	if (fs_num_held_locks == FS_LOCKSTATS_MAX_HELD)
		return;
	held = &fs_held_locks[fs_num_held_locks++];
	held->lock = lock;
	held->kind = (FsLockKind) kind;
	held->mode = mode;
	held->where = where;
	INSTR_TIME_SET_CURRENT(held->since);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &held->cpu_since);
}

/*
 * A fairshare function is about to release `lock`: measure the hold, and
 * keep it if it is the longest of its kind.
 */
void
fs_lockstats_releasing(LWLock *lock)
{
	int			i;
	instr_time	now;
	struct timespec cpu_now;
	uint64		held_us;
	uint64		cpu_us;
	FsHeldLock	held;
	FsLockHold *hold;

	for (i = fs_num_held_locks - 1; i >= 0; i--)
	{
		if (fs_held_locks[i].lock == lock)
			break;
	}
	if (i < 0)
		return;
	held = fs_held_locks[i];
	fs_held_locks[i] = fs_held_locks[--fs_num_held_locks];

	INSTR_TIME_SET_CURRENT(now);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu_now);
	INSTR_TIME_SUBTRACT(now, held.since);
	held_us = INSTR_TIME_GET_MICROSEC(now);
	cpu_us = (uint64) Max((int64) (cpu_now.tv_sec - held.cpu_since.tv_sec) * 1000000 +
						  (cpu_now.tv_nsec - held.cpu_since.tv_nsec) / 1000, 0);

	pg_atomic_fetch_add_u64(&fs_lock_stats_shared->nholds[held.kind], 1);
	hold = &fs_lock_stats_shared->holds[held.kind];
	if (held_us <= FS_LOCKSTATS_LONG_HOLD_US && held_us <= hold->longest_us &&
		cpu_us <= hold->longest_cpu_us)
		return;
	SpinLockAcquire(&fs_lock_stats_shared->mutex);
	if (held_us > FS_LOCKSTATS_LONG_HOLD_US)
		hold->long_holds++;
	if (cpu_us > FS_LOCKSTATS_LONG_HOLD_US)
		hold->long_cpu_holds++;
	if (held_us > hold->longest_us)
	{
		hold->longest_us = held_us;
		hold->mode = held.mode;
		strlcpy(hold->where, held.where, sizeof(hold->where));
	}
	if (cpu_us > hold->longest_cpu_us)
	{
		hold->longest_cpu_us = cpu_us;
		strlcpy(hold->cpu_where, held.where, sizeof(hold->cpu_where));
	}
	SpinLockRelease(&fs_lock_stats_shared->mutex);
}

Size
fs_lockstats_shmem_size(void)
{
	return sizeof(FsLockStats);
}

void
fs_lockstats_shmem_init(void)
{
	bool		found;

	fs_lock_stats_shared = ShmemInitStruct("fairshare lock statistics",
										   sizeof(FsLockStats), &found);
	if (!found)
	{
		int			i;

		memset(fs_lock_stats_shared, 0, sizeof(FsLockStats));
		SpinLockInit(&fs_lock_stats_shared->mutex);
		for (i = 0; i < FS_NUM_LOCK_KINDS; i++)
			pg_atomic_init_u64(&fs_lock_stats_shared->nholds[i], 0);
	}
}

/*
 * fs_lock_stats() RETURNS TABLE(lock text, longest_hold_ms float8,
 * acquired_in text, mode text, longest_cpu_ms float8, cpu_acquired_in text,
 * holds_over_1ms bigint, holds bigint, cpu_holds_over_1ms bigint): the
 * longest hold of each kind of fairshare lock since the last call (or the
 * start) and where it was taken, the longest CPU time spent holding one and
 * where, how many holds passed 1 ms, how many there were, and how many took
 * more than 1 ms of CPU time; the figures start again from zero.
 */
Datum
fs_lock_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo;
	FsLockHold	holds[FS_NUM_LOCK_KINDS];
	uint64		nholds[FS_NUM_LOCK_KINDS];
	int			i;

	fs_check_loaded();
	if (fs_lock_stats_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("fairshare lock statistics are not in shared memory"),
				 errhint("Add fairshare to shared_preload_libraries and restart the server.")));
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	SpinLockAcquire(&fs_lock_stats_shared->mutex);
	memcpy(holds, fs_lock_stats_shared->holds, sizeof(holds));
	memset(fs_lock_stats_shared->holds, 0, sizeof(holds));
	SpinLockRelease(&fs_lock_stats_shared->mutex);
	for (i = 0; i < FS_NUM_LOCK_KINDS; i++)
		nholds[i] = pg_atomic_exchange_u64(&fs_lock_stats_shared->nholds[i], 0);

	for (i = 0; i < FS_NUM_LOCK_KINDS; i++)
	{
		Datum		values[9];
		bool		nulls[9] = {false, false, false, false, false, false, false, false, false};
		const FsLockHold *hold = &holds[i];

		values[0] = CStringGetTextDatum(fs_lock_kind_names[i]);
		values[1] = Float8GetDatum((float8) hold->longest_us / 1000.0);
		if (hold->longest_us == 0 && hold->where[0] == '\0')
		{
			nulls[2] = true;
			nulls[3] = true;
		}
		else
		{
			values[2] = CStringGetTextDatum(hold->where);
			values[3] = CStringGetTextDatum(hold->mode == LW_EXCLUSIVE ? "exclusive" :
											hold->mode == LW_SHARED ? "shared" :
											"wait until free");
		}
		values[4] = Float8GetDatum((float8) hold->longest_cpu_us / 1000.0);
		if (hold->cpu_where[0] == '\0')
			nulls[5] = true;
		else
			values[5] = CStringGetTextDatum(hold->cpu_where);
		values[6] = Int64GetDatum((int64) hold->long_holds);
		values[7] = Int64GetDatum((int64) nholds[i]);
		values[8] = Int64GetDatum((int64) hold->long_cpu_holds);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

#else							/* !FS_LOCK_STATS */

Size
fs_lockstats_shmem_size(void)
{
	return 0;
}

void
fs_lockstats_shmem_init(void)
{
}

/* fs_lock_stats() in a normal build: there are no figures to return. */
Datum
fs_lock_stats(PG_FUNCTION_ARGS)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("fairshare was built without lock statistics"),
			 errhint("Build it with \"make FS_LOCK_STATS=1\" (bench/lockhold does).")));
	PG_RETURN_NULL();
}

#endif							/* FS_LOCK_STATS */

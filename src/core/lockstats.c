/*-------------------------------------------------------------------------
 *
 * lockstats.c
 *	  The longest hold of each kind of fairshare LWLock, in the
 *	  lock-statistics build (make FS_LOCK_STATS=1; see lockstats.h).
 *
 * Each backend keeps the locks it holds, with when and where each was
 * taken, in a small local array; a release measures the hold and, when it
 * is the longest seen for its kind of lock, writes it to shared memory
 * under a spinlock.  Each layer names its locks when it sets up its shared
 * memory (fs_lockstats_name_locks(): a kind of lock is an array of them);
 * locks no layer named, taken by fairshare's code (AddinShmemInitLock), are
 * not counted.
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

#include "core/common.h"
#include "core/lockstats.h"

PG_FUNCTION_INFO_V1(fs_lock_stats);

#ifdef FS_LOCK_STATS

/* Holds longer than this are counted (fs_lock_stats().holds_over_1ms). */
#define FS_LOCKSTATS_LONG_HOLD_US	1000

/*
 * The kinds of lock, as the layers named them: every process names them in
 * the same order (at shared-memory setup), so a kind's index is the same
 * everywhere.
 */
#define FS_LOCKSTATS_MAX_KINDS	16

typedef struct FsLockKindRange
{
	const char *name;
	const char *base;			/* the first lock of the array */
	Size		count;
} FsLockKindRange;

static FsLockKindRange fs_lock_kinds[FS_LOCKSTATS_MAX_KINDS];
static int	fs_num_lock_kinds = 0;

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
	FsLockHold	holds[FS_LOCKSTATS_MAX_KINDS];
	pg_atomic_uint64 nholds[FS_LOCKSTATS_MAX_KINDS]; /* every hold, counted */
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
	int			kind;
	LWLockMode	mode;
	const char *where;
	instr_time	since;
	struct timespec cpu_since;	/* CLOCK_PROCESS_CPUTIME_ID */
} FsHeldLock;

static FsHeldLock fs_held_locks[FS_LOCKSTATS_MAX_HELD];
static int	fs_num_held_locks = 0;

/*
 * The kind of a lock, or -1 for a lock no layer named.  A kind is an array
 * of LWLockPadded: a lock is of it when it lies inside it on an element's
 * boundary.
 */
static int
fs_lock_kind(const LWLock *lock)
{
	const char *at = (const char *) lock;
	int			k;

	for (k = 0; k < fs_num_lock_kinds; k++)
	{
		const FsLockKindRange *range = &fs_lock_kinds[k];

		if (at >= range->base && at < range->base + range->count * sizeof(LWLockPadded) &&
			(at - range->base) % sizeof(LWLockPadded) == 0)
			return k;
	}
	return -1;
}

/*
 * Name `count` locks from `locks` on as one kind, for the statistics.
 * Called by each layer when it sets up its shared memory, in every process
 * that does (the postmaster, and each backend where shared memory is
 * attached anew); a kind named again (shared memory set up again after a
 * crash) keeps its place.
 */
void
fs_lockstats_name_locks(const char *name, LWLockPadded *locks, int count)
{
	int			k;

	for (k = 0; k < fs_num_lock_kinds; k++)
		if (strcmp(fs_lock_kinds[k].name, name) == 0)
			break;
	if (k == FS_LOCKSTATS_MAX_KINDS)
		elog(ERROR, "too many kinds of fairshare lock named for the statistics");
	fs_lock_kinds[k].name = name;
	fs_lock_kinds[k].base = (const char *) locks;
	fs_lock_kinds[k].count = count;
	if (k == fs_num_lock_kinds)
		fs_num_lock_kinds++;
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
	held->kind = kind;
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

/* Shared memory of the lock-hold statistics. */
static Size
fs_lockstats_shmem_size(void)
{
	return sizeof(FsLockStats);
}

/* Ask for this layer's shared memory (shmem request hook, module.c). */
void
fs_lockstats_shmem_request(void)
{
	RequestAddinShmemSpace(fs_lockstats_shmem_size());
}

/*
 * Create (or attach to) the lock statistics. Caller holds
 * AddinShmemInitLock.
 */
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
		for (i = 0; i < FS_LOCKSTATS_MAX_KINDS; i++)
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
	FsLockHold	holds[FS_LOCKSTATS_MAX_KINDS];
	uint64		nholds[FS_LOCKSTATS_MAX_KINDS];
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
	for (i = 0; i < FS_LOCKSTATS_MAX_KINDS; i++)
		nholds[i] = pg_atomic_exchange_u64(&fs_lock_stats_shared->nholds[i], 0);

	for (i = 0; i < fs_num_lock_kinds; i++)
	{
		Datum		values[9];
		bool		nulls[9] = {false, false, false, false, false, false, false, false, false};
		const FsLockHold *hold = &holds[i];

		values[0] = CStringGetTextDatum(fs_lock_kinds[i].name);
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

void
fs_lockstats_shmem_request(void)
{
}

void
fs_lockstats_shmem_init(void)
{
}

void
fs_lockstats_name_locks(const char *name pg_attribute_unused(),
						LWLockPadded *locks pg_attribute_unused(),
						int count pg_attribute_unused())
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

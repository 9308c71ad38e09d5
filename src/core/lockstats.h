/*-------------------------------------------------------------------------
 *
 * lockstats.h
 *	  How long fairshare holds its LWLocks, in the lock-statistics build.
 *
 * `make FS_LOCK_STATS=1` builds fairshare with every one of its own
 * LWLockAcquire, LWLockConditionalAcquire, LWLockAcquireOrWait and
 * LWLockRelease calls going through the wrappers below: an acquisition
 * notes the time and the acquiring function (__func__), the release
 * measures the hold, and the longest hold of each kind of fairshare lock,
 * with where it was taken, is kept in shared memory (lockstats.c).
 * fs_lock_stats() returns those figures and resets them; bench/lockhold
 * creates it and reads it.
 *
 * This header is included by fairshare.h, hence by every source file, after
 * storage/lwlock.h: the macros rename the calls of fairshare's own code and
 * leave PostgreSQL's declarations alone.  In a normal build it defines
 * nothing, and the calls are PostgreSQL's own, at no cost.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_LOCKSTATS_H
#define FAIRSHARE_LOCKSTATS_H

#include "storage/lwlock.h"

extern void fs_lockstats_shmem_request(void);
extern void fs_lockstats_shmem_init(void);
extern void fs_lockstats_name_locks(const char *name, LWLockPadded *locks, int count);

#ifdef FS_LOCK_STATS

extern void fs_lockstats_acquired(LWLock *lock, LWLockMode mode, const char *where);
extern void fs_lockstats_releasing(LWLock *lock);

/* LWLockAcquire, noting when and where the lock was taken. */
static inline bool
fs_lockstats_acquire(LWLock *lock, LWLockMode mode, const char *where)
{
	bool		waited = (LWLockAcquire) (lock, mode);

	fs_lockstats_acquired(lock, mode, where);
	return waited;
}

/* LWLockConditionalAcquire, noting the acquisition when it succeeds. */
static inline bool
fs_lockstats_conditional_acquire(LWLock *lock, LWLockMode mode, const char *where)
{
	bool		acquired = (LWLockConditionalAcquire) (lock, mode);

	if (acquired)
		fs_lockstats_acquired(lock, mode, where);
	return acquired;
}

/* LWLockAcquireOrWait, noting the acquisition when it took the lock. */
static inline bool
fs_lockstats_acquire_or_wait(LWLock *lock, LWLockMode mode, const char *where)
{
	bool		acquired = (LWLockAcquireOrWait) (lock, mode);

	if (acquired)
		fs_lockstats_acquired(lock, mode, where);
	return acquired;
}

/* LWLockRelease, after measuring the hold that ends. */
static inline void
fs_lockstats_release(LWLock *lock)
{
	fs_lockstats_releasing(lock);
	(LWLockRelease) (lock);
}

#define LWLockAcquire(lock, mode) \
	fs_lockstats_acquire((lock), (mode), __func__)
#define LWLockConditionalAcquire(lock, mode) \
	fs_lockstats_conditional_acquire((lock), (mode), __func__)
#define LWLockAcquireOrWait(lock, mode) \
	fs_lockstats_acquire_or_wait((lock), (mode), __func__)
#define LWLockRelease(lock) \
	fs_lockstats_release(lock)

#endif							/* FS_LOCK_STATS */

#endif							/* FAIRSHARE_LOCKSTATS_H */

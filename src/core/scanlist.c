/*-------------------------------------------------------------------------
 *
 * scanlist.c
 *	  Whole-table scans of fairshare's partitioned shared hash tables, one
 *	  partition lock at a time, for a bounded batch of entries.
 *
 * PostgreSQL's hash_seq_search() walks every bucket of a table, and a
 * partitioned table spreads each partition's entries over all of them: a
 * scan with it must hold every partition lock at once (so that no entry
 * moves while it walks), and pays for empty buckets (two million of them in
 * a claim map sized for a million leases, a few milliseconds).  So each
 * table also links its entries into one list per partition (scanlist.h),
 * and a scan walks those: it holds one partition lock at a time, visits
 * FS_SCAN_BATCH entries at most under it, and costs what the entries cost.
 *
 * To stop in the middle of a partition and go on later, a scan parks a
 * cursor in the list: a list node of its own, in shared memory (one per
 * process, indexed by its place in the PGPROC array), put before the first
 * entry it has not visited.  Entries removed meanwhile are unlinked around
 * the cursor; entries added meanwhile go to the tail, after it.  Other
 * scans step over cursors: they are told from entries by their address.
 * The lists, cursors included, change only under the partition's lock
 * EXCLUSIVE, so a scan takes it EXCLUSIVE too (for one batch: a few tens
 * of microseconds).
 *
 * A scan does not check for interrupts: callers keep "in progress" marks in
 * shared memory across a scan (an eviction pass), and no cancel or
 * terminate may end it between two batches with the mark left behind.  A
 * scan of a million entries takes some tens of milliseconds; the interrupt
 * is served when it is over.  Should a scan still end between two batches
 * (an error in taking the next partition lock), its cursor stays parked:
 * the next scan of the same process takes it out first, and so does a
 * before_shmem_exit callback when the process exits.  A parked cursor
 * harms no one meanwhile.  The
 * postmaster, which saves the state file at startup and at shutdown, has a
 * cursor of its own after those of the PGPROCs; a process with neither
 * visits each partition in one go.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shmem.h"

#include "core/common.h"
#include "core/compat.h"
#include "core/scanlist.h"

/* The cursors, one per PGPROC, in shared memory. */
static dlist_node *fs_scan_cursors = NULL;
static int	fs_scan_ncursors = 0;

/* Where this process's cursor is parked: the lock of that partition. */
static LWLock *fs_scan_parked_lock = NULL;
static bool fs_scan_exit_registered = false;

/* One cursor per PGPROC of a process, and the postmaster's. */
static int
fs_scan_cursor_count(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + 1;
}

/* Shared memory for the lists of a table of `nparts` partitions. */
Size
fs_scan_lists_size(int nparts)
{
	return mul_size(sizeof(dlist_head), nparts);
}

/*
 * Create (or attach to) a table's partition lists.  Caller holds
 * AddinShmemInitLock.
 */
dlist_head *
fs_scan_lists_init(const char *name, int nparts)
{
	bool		found;
	dlist_head *lists;
	int			i;

	lists = ShmemInitStruct(name, fs_scan_lists_size(nparts), &found);
	if (!found)
		for (i = 0; i < nparts; i++)
			dlist_init(&lists[i]);
	return lists;
}

/* Shared memory of the scan cursors: one per PGPROC, and the postmaster's. */
Size
fs_scan_cursors_size(void)
{
	return mul_size(sizeof(dlist_node), fs_scan_cursor_count());
}

/* Create (or attach to) the cursors.  Caller holds AddinShmemInitLock. */
void
fs_scan_cursors_init(void)
{
	bool		found;

	fs_scan_ncursors = fs_scan_cursor_count();
	fs_scan_cursors = ShmemInitStruct("fairshare scan cursors", fs_scan_cursors_size(), &found);
	if (!found)
		memset(fs_scan_cursors, 0, fs_scan_cursors_size());
}

/* Is this list node a parked cursor rather than an entry? */
static inline bool
fs_scan_is_cursor(const dlist_node *node)
{
	return node >= fs_scan_cursors && node < fs_scan_cursors + fs_scan_ncursors;
}

/*
 * This process's cursor: by its place in the PGPROC array, the last one for
 * the postmaster (which saves the state file at startup and shutdown), or
 * NULL for a process with neither.
 */
static dlist_node *
fs_scan_my_cursor(void)
{
	int			index = FS_MY_PGPROC_INDEX;

	if (index < 0)
		return IsUnderPostmaster ? NULL : &fs_scan_cursors[fs_scan_ncursors - 1];
	if (index >= fs_scan_ncursors - 1)
		return NULL;
	return &fs_scan_cursors[index];
}

/* Unlink a cursor, and mark it out of every list. */
static inline void
fs_scan_cursor_out(dlist_node *cursor)
{
	dlist_delete(cursor);
	cursor->next = cursor->prev = NULL;
}

/*
 * Take this process's cursor out of the list it was left parked in (by a
 * scan that an error or a cancel ended between two batches).
 */
static void
fs_scan_unpark(void)
{
	LWLock	   *lock = fs_scan_parked_lock;
	bool		held;

	if (lock == NULL)
		return;
	held = LWLockHeldByMeInMode(lock, LW_EXCLUSIVE);
	if (!held)
		LWLockAcquire(lock, LW_EXCLUSIVE);
	fs_scan_cursor_out(fs_scan_my_cursor());
	fs_scan_parked_lock = NULL;
	if (!held)
		LWLockRelease(lock);
}

/* before_shmem_exit: no cursor of an exited process stays in a list. */
static void
fs_scan_exit(int code pg_attribute_unused(), Datum arg pg_attribute_unused())
{
	fs_scan_unpark();
}

/*
 * Visit every entry of a partitioned table, one partition at a time (shmem.c
 * rule 3a): take the partition's lock EXCLUSIVE, call `visitor` for up to
 * FS_SCAN_BATCH entries of its list, park the cursor before the next one,
 * let go, and go on from the cursor.  An entry that
 * exists throughout the scan is visited exactly once; one added or removed
 * meanwhile may or may not be.
 *
 * The visitor runs with the partition lock held: it must be quick and must
 * not fail, block or take fairshare LWLocks (an entry's spinlock is fine).
 * It may remove the entry it was given (fs_scan_list_remove(), then the
 * hash table's HASH_REMOVE), and no other.
 */
void
fs_scan_table(const FsScanTable *table, fs_scan_visitor visitor, void *arg)
{
	fs_scan_table_paused(table, visitor, NULL, arg);
}

/*
 * fs_scan_table(), with `pause` called between two batches, with no lock
 * held: where a visitor that copies into room made before the scan can
 * hand on what it has (the WAL writer writes a record).
 */
void
fs_scan_table_paused(const FsScanTable *table, fs_scan_visitor visitor, fs_scan_pause pause,
					 void *arg)
{
	dlist_node *cursor;
	int			p;

	Assert(fs_scan_cursors != NULL);
	cursor = fs_scan_my_cursor();
	if (cursor != NULL)
	{
		fs_scan_unpark();
		/* Out of every list (fs_scan_cursor_out() clears it). */
		FS_INVARIANT(cursor->next == NULL && cursor->prev == NULL);
		/* The postmaster's shared memory goes when it does. */
		if (!fs_scan_exit_registered && IsUnderPostmaster)
		{
			before_shmem_exit(fs_scan_exit, (Datum) 0);
			fs_scan_exit_registered = true;
		}
	}

	for (p = 0; p < table->nparts; p++)
	{
		dlist_head *list = &table->lists[p];
		LWLock	   *lock = &table->locks[p].lock;
		bool		parked = false;

		do
		{
			dlist_node *node;
			int			visited = 0;

			LWLockAcquire(lock, LW_EXCLUSIVE);
			if (parked)
			{
				node = cursor->next;
				fs_scan_cursor_out(cursor);
				fs_scan_parked_lock = NULL;
				parked = false;
			}
			else
				node = list->head.next;

			while (node != &list->head)
			{
				dlist_node *next = node->next;

				if (fs_scan_is_cursor(node))
				{
					node = next;
					continue;
				}
				if (cursor != NULL && visited >= FS_SCAN_BATCH)
				{
					/* Stop before `node`: the cursor marks it. */
					dlist_insert_before(node, cursor);
					fs_scan_parked_lock = lock;
					parked = true;
					break;
				}
				visitor((char *) node - table->link_offset, arg);
				visited++;
				node = next;
			}
			LWLockRelease(lock);
			if (pause != NULL)
				pause(arg);
		} while (parked);
	}
}

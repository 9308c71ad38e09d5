/*-------------------------------------------------------------------------
 *
 * scanlist.h
 *	  Entry lists of fairshare's partitioned shared hash tables, and the
 *	  whole-table scan that walks them one partition at a time.
 *
 * Every entry of a partitioned table (tenants, leases, the claim map, tier
 * counters) is linked into the list of its partition, under that
 * partition's lock taken EXCLUSIVE: fs_scan_list_add() right after the
 * entry is entered, fs_scan_list_remove() right before it is removed.  A
 * whole-table scan (fs_scan_table()) then holds one partition lock at a
 * time, for FS_SCAN_BATCH entries at most, and never walks empty buckets:
 * its cost is in entries, whatever the table's size.  See shmem.c, rule 3a.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_SCANLIST_H
#define FAIRSHARE_SCANLIST_H

#include "lib/ilist.h"
#include "storage/lwlock.h"

/*
 * A whole-table scan holds one partition lock for this many entries at most
 * (shmem.c rule 3a): some tens of microseconds of copying, where each entry
 * costs a cache miss or two.
 */
#define FS_SCAN_BATCH			128

/* What a scan calls for each entry; see fs_scan_table(). */
typedef void (*fs_scan_visitor) (void *entry, void *arg);
/* What fs_scan_table_paused() calls between batches, with no lock held. */
typedef void (*fs_scan_pause) (void *arg);

/* A partitioned table as a scan sees it (backend-local; the lists are shared). */
typedef struct FsScanTable
{
	dlist_head *lists;			/* one per partition, in shared memory */
	LWLockPadded *locks;		/* the partition locks */
	int			nparts;
	Size		link_offset;	/* of the entry's dlist_node */
} FsScanTable;

extern Size fs_scan_lists_size(int nparts);
extern dlist_head *fs_scan_lists_init(const char *name, int nparts);
extern Size fs_scan_cursors_size(void);
extern void fs_scan_cursors_init(void);
extern void fs_scan_table(const FsScanTable *table, fs_scan_visitor visitor, void *arg);
extern void fs_scan_table_paused(const FsScanTable *table, fs_scan_visitor visitor,
								 fs_scan_pause pause, void *arg);

/*
 * Link a new entry into its partition's list.  The caller holds the
 * partition's lock EXCLUSIVE and has just entered the entry.
 */
static inline void
fs_scan_list_add(const FsScanTable *table, uint32 partition, dlist_node *link)
{
	dlist_push_tail(&table->lists[partition], link);
}

/*
 * Unlink an entry from its partition's list.  The caller holds the
 * partition's lock EXCLUSIVE and removes the entry next.
 */
static inline void
fs_scan_list_remove(dlist_node *link)
{
	dlist_delete(link);
}

#endif							/* FAIRSHARE_SCANLIST_H */

/*-------------------------------------------------------------------------
 *
 * shmem_int.h
 *	  The tenant table as the core's own files see it: the table, its
 *	  partitions, and eviction (evict.c).  Layers above use shmem.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_SHMEM_INT_H
#define FAIRSHARE_SHMEM_INT_H

#include "core/scanlist.h"
#include "core/shmem.h"

extern HTAB *fs_tenant_hash;
extern FsScanTable fs_tenant_scan;	/* its partition lists (scanlist.h) */

/* The partition of a tenant key's hash value. */
static inline uint32
fs_tenant_partition(uint32 hashvalue)
{
	return hashvalue % FS_TENANT_PARTITIONS;
}


/* The lock of that partition. */
static inline LWLock *
fs_tenant_partition_lock(uint32 hashvalue)
{
	return &fs_shared->tenant_locks[fs_tenant_partition(hashvalue)].lock;
}

/* evict.c */
extern int	fs_tenant_evict(TimestampTz now);
extern void fs_tenant_remove_locked(FsTenant *entry, uint32 hashvalue);
extern Size fs_evict_shmem_size(void);
extern void fs_evict_shmem_init(void);

#endif							/* FAIRSHARE_SHMEM_INT_H */

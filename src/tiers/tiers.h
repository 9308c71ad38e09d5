/*-------------------------------------------------------------------------
 *
 * tiers.h
 *	  Greedy-tenant tiers: route a tenant's job to a slower queue while it
 *	  enqueues more than a rule allows in a sliding window.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_TIERS_H
#define FAIRSHARE_TIERS_H

#include "core/shmem.h"

/* Rules per call, and sub-buckets per rule's sliding window. */
/* Partitions of the tier table, and its LWLocks (a power of two). */
#define FS_TIER_PARTITIONS	16

#define FS_TIER_MAX_RULES	4
#define FS_TIER_BUCKETS		10

extern int	fs_max_tier_keys;

extern void fs_tiers_init(void);
extern long fs_tier_count(void);
extern Size fs_tier_bytes_per_key(void);
extern Size fs_tier_bytes_per_rule(void);
extern void fs_tiers_shmem_request(void);
extern void fs_tiers_shmem_init(void);

#endif							/* FAIRSHARE_TIERS_H */

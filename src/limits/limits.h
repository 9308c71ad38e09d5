/*-------------------------------------------------------------------------
 *
 * limits.h
 *	  The durable fs_limits table and its cache in tenant entries.
 *
 * A change to fs_limits bumps a shared generation when its transaction
 * commits; a tenant entry whose cached limits carry an older generation loads
 * them again (with a fresh snapshot) before its next decision.  A rolled-back
 * change never bumps anything and is never seen by other sessions.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_LIMITS_H
#define FAIRSHARE_LIMITS_H

#include "core/shmem.h"
#include "core/tenant.h"

/* Built-in defaults, used when no row of fs_limits says otherwise. */
#define FS_DEFAULT_MAX_SLOTS	1
#define FS_DEFAULT_MIN_SLOTS	0
#define FS_DEFAULT_WEIGHT		1.0
#define FS_DEFAULT_THROTTLE_PCT	100.0

extern bool fs_limits_resolve(FsQueue *queue, const char *tenant, FsLimits *out,
							  uint32 *generation);
extern void fs_limits_init(void);
extern const char *fs_extension_schema(void);

#endif							/* FAIRSHARE_LIMITS_H */

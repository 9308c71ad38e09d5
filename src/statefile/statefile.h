/*-------------------------------------------------------------------------
 *
 * statefile.h
 *	  Saving fairshare's shared state to a file and restoring it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_STATEFILE_H
#define FAIRSHARE_STATEFILE_H

#include "lib/stringinfo.h"

#include "core/shmem.h"

#define FS_STATE_FILE		"pg_stat/fairshare.state"

/*
 * After a crash (or a promotion), lease ids restart this far above the last save's figure:
 * more than a million grants a second for a week between two saves.
 */
#define FS_LEASE_ID_CRASH_MARGIN	(INT64CONST(1) << 40)

/*
 * The highest next lease id a file may carry.  Ids start at the clock in
 * microseconds (about 2^50 today); this leaves 2^62 ids of room, so that no
 * id handed out after a restore can wrap past INT64_MAX.  A file above it is
 * damaged, whatever its CRC says.
 */
#define FS_LEASE_ID_MAX				(PG_INT64_MAX / 2)

/*
 * What a state file holds.  A clean shutdown writes FS_STATE_CLEAN with
 * everything.  While the server runs, the file is FS_STATE_RUNNING: written
 * at startup and refreshed periodically, it holds the queues and leases
 * only.  Finding a RUNNING file at startup means the last run crashed: slot
 * counts start empty, and its leases are kept as orphans that re-register
 * when their holders renew them.
 */
typedef enum FsStateKind
{
	FS_STATE_CLEAN = 1,
	FS_STATE_RUNNING = 2
} FsStateKind;

extern void fs_statefile_startup(void);
extern bool fs_statefile_save(FsStateKind kind, int elevel);

#endif							/* FAIRSHARE_STATEFILE_H */

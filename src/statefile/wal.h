/*-------------------------------------------------------------------------
 *
 * wal.h
 *	  Replicating fairshare's shared state through WAL: a custom resource
 *	  manager whose records the WAL writer (wal_writer.c) writes in batches
 *	  and the startup process replays (wal_redo.c), on standbys and in crash
 *	  recovery.  wal.c has the whole picture.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_WAL_H
#define FAIRSHARE_WAL_H

#include "access/xlogdefs.h"
#include "access/xlogreader.h"
#include "datatype/timestamp.h"
#include "lib/stringinfo.h"
#include "storage/condition_variable.h"
#include "storage/latch.h"
#include "storage/spin.h"

/* GUCs */
extern int	fs_wal_interval_ms;
extern int	fs_wal_rmgr_id;

/*
 * The kinds of record (xl_info's high bits).  A BATCH carries what changed
 * in one interval; a complete snapshot is FULL_BEGIN, FULL_CHUNKs and
 * FULL_END, after each checkpoint.
 */
#define XLOG_FS_BATCH			0x10
#define XLOG_FS_FULL_BEGIN		0x20
#define XLOG_FS_FULL_CHUNK		0x30
#define XLOG_FS_FULL_END		0x40

#define FS_WAL_MAGIC			0x46535731	/* "FSW1" */
#define FS_WAL_FORMAT			1

/*
 * Every record starts with this header, then (BATCH and FULL_CHUNK) the
 * state file's sections (core/stateformat.h): queues by index, ids of
 * leases gone, tenants, leases, claim-map entries, fair queues, the
 * heartbeat table, tenants evicted (in a cycle's last record), END.
 */
typedef struct FsWalHeader
{
	uint32		magic;
	uint16		format;
	uint16		flags;			/* FS_WAL_LEASES_ONLY */
	TimestampTz primary_now;	/* when the primary wrote it */
	int64		next_lease_id;	/* the primary's next lease id then */
} FsWalHeader;

/*
 * FsWalHeader.flags of a FULL_BEGIN and its FULL_END: the snapshot names
 * every lease and claim-map entry, and nothing else (the writer's lists of
 * changed leases overflowed; tenants and fair queues were tracked).
 */
#define FS_WAL_LEASES_ONLY		0x0001

/* The field of an item of FS_SECTION_LEASES_GONE: the lease's id (int64). */
#define FS_GONE_LEASE_ID		1

/* The fields of an item of FS_SECTION_TENANTS_GONE: its queue's index, its name. */
#define FS_GONE_TENANT_QUEUE	1	/* uint32 */
#define FS_GONE_TENANT_NAME		2

/* The WAL writer logs the heartbeat table at most this often (ms). */
#define FS_WAL_HEARTBEATS_EVERY_MS	1000

/* Largest record the writer makes (a FULL is cut into chunks of it). */
#define FS_WAL_RECORD_MAX		(512 * 1024)

/* What the WAL writer and the replay share, for views and fs_wal_sync(). */
typedef struct FsWalShared
{
	slock_t		mutex;			/* protects everything below */
	/* the WAL writer (primary) */
	Latch	   *writer_latch;	/* NULL while no writer runs */
	uint64		cycles;			/* its finished cycles */
	XLogRecPtr	written_lsn;	/* end of its last record */
	uint64		records;
	uint64		bytes;
	uint64		snapshots;		/* complete snapshots written */
	TimestampTz written_at;
	/* the replay (standby, crash recovery) */
	XLogRecPtr	replayed_lsn;
	TimestampTz replayed_primary_now;
	uint64		replayed_records;
	uint64		replay_dropped; /* items that did not fit */
	bool		replay_snapshot_seen;	/* a complete snapshot was replayed */
	bool		replay_in_snapshot; /* between FULL_BEGIN and FULL_END */
	int64		replayed_next_lease_id;
	bool		warned_unreplayed;	/* the writer warned of a recovery
									 * without a snapshot */
	ConditionVariable cycle_done;	/* broadcast after each writer cycle */
} FsWalShared;

extern FsWalShared *fs_wal;

/* wal.c */
extern void fs_wal_init(void);
extern void fs_wal_shmem_request(void);
extern void fs_wal_shmem_init(void);

/* wal_writer.c */
extern PGDLLEXPORT void fs_wal_writer_main(Datum main_arg);

/* wal_redo.c */
extern void fs_wal_redo(XLogReaderState *record);
extern void fs_wal_desc(StringInfo buf, XLogReaderState *record);
extern const char *fs_wal_identify(uint8 info);
extern void fs_wal_redo_startup(void);
extern void fs_wal_redo_cleanup(void);

#endif							/* FAIRSHARE_WAL_H */

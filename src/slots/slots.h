/*-------------------------------------------------------------------------
 *
 * slots.h
 *	  Per-tenant concurrency slots, held through leases.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_SLOTS_H
#define FAIRSHARE_SLOTS_H

#include "datatype/timestamp.h"
#include "lib/pairingheap.h"

#include "core/shmem.h"

/* Partitions of the lease table, and its LWLocks (a power of two). */
#define FS_LEASE_PARTITIONS		64

/* Longest lease a single acquire or renew may ask for. */
#define FS_MAX_LEASE_USECS		(INT64CONST(366) * USECS_PER_DAY)
/* the lease of a claim from a queue registered without one: 5 minutes */
#define FS_DEFAULT_LEASE_USECS	(INT64CONST(5) * USECS_PER_MINUTE)

typedef enum FsLeaseState
{
	FS_LEASE_LIVE = 1,			/* holds a slot */
	FS_LEASE_RELEASING,			/* released by an open transaction: freed at
								 * its commit, live again at its abort */
	FS_LEASE_ORPHAN				/* restored after a crash, not counted in
								 * slots_in_use until renewed */
} FsLeaseState;

typedef struct FsLease
{
	int64		lease_id;		/* hash key: must be first */
	FsTenant   *tenant;			/* pinned: see shmem.c rule 2 */
	TimestampTz acquired_at;
	TimestampTz expires_at;
	int32		holder_pid;		/* backend that took it, or is releasing it */
	Oid			owner;			/* role that took it (GetUserId()); only it,
								 * roles with its privileges, fairshare_admin
								 * and superusers may release or renew it.
								 * InvalidOid: restored from a state file of
								 * a version before owners (anyone may; the
								 * first renew makes the renewer the owner) */
	uint8		state;			/* FsLeaseState */
	uint8		wal;			/* FS_LEASE_WAL_* (leases.c) */
	bool		doomed;			/* RELEASING, and the transaction that took it
								 * rolled back meanwhile: whichever way the
								 * release ends, the lease goes */
	uint32		tenant_generation;	/* tenant->generation when it was taken */
	pairingheap_node expiry_node;	/* LIVE and ORPHAN leases: in their
									 * partition's heap by expires_at */
	dlist_node	scan_link;		/* in its partition's list (scanlist.h) */
} FsLease;

/* FsLease.wal: what the WAL writer (statefile/wal_writer.c) knows of it */
#define FS_LEASE_WAL_LOGGED		0x01	/* logged: a standby has it */
#define FS_LEASE_WAL_DIRTY		0x02	/* changed since; its id is listed */
#define FS_LEASE_WAL_MARK		0x04	/* on a standby: seen by the current
										 * complete snapshot (wal_redo.c) */

/* A lease as copied out for views and the state file. */
typedef struct FsLeaseInfo
{
	int64		lease_id;
	FsTenantKey tenant_key;
	TimestampTz acquired_at;
	TimestampTz expires_at;
	int32		holder_pid;
	Oid			owner;
	uint8		state;
} FsLeaseInfo;

typedef void (*fs_lease_visitor) (const FsLeaseInfo *lease, void *arg);

/* A lease as the WAL replays it (statefile/wal_redo.c). */
typedef struct FsLeaseReplay
{
	int64		lease_id;
	FsQueue    *queue;
	const char *tenant;
	TimestampTz acquired_at;
	TimestampTz expires_at;
	Oid			owner;
	FsLeaseState state;
} FsLeaseReplay;

/* Outcome of fs_slot_acquire(). */
typedef struct FsSlotDecision
{
	int64		lease_id;		/* 0 when denied */
	FsReason	reason;
	int32		slots_in_use;	/* after the decision */
	int32		ceiling;
} FsSlotDecision;

extern void fs_slots_shmem_request(void);
extern void fs_slots_shmem_init(void);
extern void fs_slots_init(void);
extern int64 fs_lease_usecs(const Interval *interval, const char *what);
extern int64 fs_lease_interval_arg(FunctionCallInfo fcinfo, int argno, const char *what);

extern void fs_slot_acquire(FsQueue *queue, const char *tenant, int64 lease_usecs,
							TimestampTz now, FsSlotDecision *decision);
extern bool fs_slot_release(int64 lease_id, TimestampTz now, int64 *held_usecs);
extern int	fs_sweep_expired_leases(TimestampTz now);

extern void fs_lease_foreach(fs_lease_visitor visitor, void *arg);
extern bool fs_lease_restore(int64 lease_id, FsTenant *tenant, Oid owner,
							 TimestampTz acquired_at, TimestampTz expires_at, bool orphan);
extern long fs_lease_count(void);

/* leases.c: replication through WAL */
extern Size fs_lease_wal_room(void);
extern int	fs_lease_wal_drain(int64 *ids, bool *overflow);
extern void fs_lease_wal_copy_many(const int64 *ids, int n, FsLeaseInfo *infos, bool *found);
extern void fs_lease_foreach_for_wal(fs_lease_visitor visitor, fs_scan_pause pause, void *arg);
extern bool fs_lease_replay(const FsLeaseReplay *rec);
extern void fs_lease_replay_remove(int64 lease_id);
extern int	fs_lease_replay_sweep(void);
extern void fs_lease_replay_unmark_all(void);

#endif							/* FAIRSHARE_SLOTS_H */

/*-------------------------------------------------------------------------
 *
 * prepared.h
 *	  Changes of prepared transactions, published when they commit.
 *
 * Some of what a transaction changes is published when it commits: a
 * change of fs_limits bumps the limits generation, so that every cached
 * limit loads again.  A transaction that is prepared (PREPARE TRANSACTION,
 * as Citus does on each worker of a transaction that wrote on several
 * nodes) commits later, in COMMIT PREPARED, possibly in another backend and
 * after a restart, where no transaction callback of the preparing backend
 * runs.  Such a layer notes its kind of change at XACT_EVENT_PRE_PREPARE
 * (fs_prepared_note); the ProcessUtility hook here runs the kind's publish
 * function once COMMIT PREPARED has committed the transaction, and
 * publishes nothing for it after ROLLBACK PREPARED.  A layer whose changes take effect at once, and
 * are undone if the transaction aborts (tokens spent, slots taken), or that
 * take effect when it commits (slots released), parks them at PRE_PREPARE
 * (fs_prepared_park): COMMIT PREPARED finishes them, ROLLBACK PREPARED
 * undoes them.
 *
 * The notes live in shared memory, one per prepared transaction, so they do
 * not survive a restart.  A transaction prepared before the server (or its
 * shared memory, after a crash) started is therefore published for every
 * kind when it commits: more loading than needed, never a missed change.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_PREPARED_H
#define FAIRSHARE_PREPARED_H

#include "core/common.h"

/* Kinds of change, a bit each. */
#define FS_PREPARED_LIMITS		0x01	/* fs_limits (and the cluster's settings) */
#define FS_PREPARED_PARKED		0x02	/* effects parked below (settled, not
										 * published) */
#define FS_PREPARED_COUNTS		0x04	/* never noted: published for a
										 * transaction that may have parked
										 * effects no note kept (see
										 * prepared.c), whose changes are lost */
#define FS_PREPARED_REGISTRATIONS	0x08	/* fs_fair_queues (a Citus node's row,
										 * written from fs_cluster_queues) */
#define FS_PREPARED_NKINDS		4

typedef void (*FsPreparedPublish) (void);

/*
 * An effect a prepared transaction parks, to be finished if COMMIT PREPARED
 * ends it and undone if ROLLBACK PREPARED does: of the layer that
 * registered the kind's functions, on a tenant of a queue or on an object of
 * the layer's own (a lease), with a value.  At most
 * FS_PREPARED_PARKED_PER_XACT per transaction, of all layers together.
 * Parked effects live in shared memory: a restart loses them (a commit or a
 * rollback after it finishes and undoes nothing).
 */
#define FS_PARKED_DATA		32

typedef struct FsParkedEffect
{
	uint32		kind;			/* the layer's own number, 0 .. FS_PARKED_KINDS - 1 */
	uint32		queue_id;
	char		tenant[FS_NAME_BUFLEN];
	char		subkey[FS_NAME_BUFLEN];	/* the layer's own second name, or "" */
	int64		object_id;		/* the layer's own id: a lease, a transaction */
	float8		value;
	uint32		flags;			/* the layer's own */
	uint8		data[FS_PARKED_DATA];	/* the layer's own bytes */
} FsParkedEffect;

#define FS_PARKED_KINDS				5
#define FS_PARKED_REFUND			0	/* tokens to give back (budget) */
#define FS_PARKED_LEASE_TAKEN		1	/* a lease acquired: dropped at rollback */
#define FS_PARKED_LEASE_RELEASED	2	/* a lease released: dropped at commit,
										 * live again at rollback */
#define FS_PARKED_BACKLOG			3	/* rows made ready: counted at commit
										 * (fair dequeue) */
#define FS_PARKED_CLAIM_RELEASE		4	/* a claimed row's job finished (its
										 * running row left): its claim ends
										 * at commit (fair dequeue) */
#define FS_PREPARED_PARKED_PER_XACT	64

/* What COMMIT or ROLLBACK PREPARED does with one parked effect. */
typedef void (*FsParkedSettle) (const FsParkedEffect *effect);

/*
 * A kind whose finishing must be framed by the COMMIT PREPARED that commits
 * the transaction: `before` gets its parked effects (not taken out) before
 * the transaction commits, in the backend running COMMIT PREPARED, which
 * then alone finishes them (other backends' settles leave them while it
 * lives); `after` runs once they are finished.  `before` may fail (the
 * transaction then stays prepared); when the statement fails, each layer's
 * own abort callback undoes what `before` did.
 */
typedef void (*FsParkedBeforeCommit) (const FsParkedEffect *effects, int count);
typedef void (*FsParkedAfterCommit) (void);

extern void fs_prepared_init(void);
extern void fs_prepared_shmem_request(void);
extern void fs_prepared_shmem_init(void);
extern void fs_prepared_on_commit(uint32 kind, FsPreparedPublish publish);
extern void fs_prepared_on_settle(uint32 parked_kind, FsParkedSettle at_commit,
								  FsParkedSettle at_rollback);
extern void fs_prepared_on_commit_prepared(uint32 parked_kind, FsParkedBeforeCommit before,
										   FsParkedAfterCommit after);
extern void fs_prepared_note(uint32 kinds);
extern void fs_prepared_park(const FsParkedEffect *effects, int count);

#endif							/* FAIRSHARE_PREPARED_H */

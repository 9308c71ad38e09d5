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
 * function once COMMIT PREPARED has committed the transaction, and forgets
 * it on ROLLBACK PREPARED.
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

/* Kinds of change, a bit each. */
#define FS_PREPARED_LIMITS		0x01	/* fs_limits (and the cluster's settings) */
#define FS_PREPARED_NKINDS		1

typedef void (*FsPreparedPublish) (void);

extern void fs_prepared_init(void);
extern void fs_prepared_shmem_request(void);
extern void fs_prepared_shmem_init(void);
extern void fs_prepared_on_commit(uint32 kind, FsPreparedPublish publish);
extern void fs_prepared_note(uint32 kinds);

#endif							/* FAIRSHARE_PREPARED_H */

/*-------------------------------------------------------------------------
 *
 * track_int.h
 *	  What a transaction did to fair dequeue, as the files that record it
 *	  (track.c, from the triggers and fs_claim()) and settle it
 *	  (commit.c, at its end) share it.  Backend-local.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_TRACK_INT_H
#define FAIRSHARE_TRACK_INT_H

#include "fairq/fairqueue_int.h"

typedef struct FsDeltaKey
{
	uint32		queue_id;
	SubTransactionId subid;
	char		tenant[FS_NAME_BUFLEN];	/* "": rows without a valid tenant */
	char		subkey[FS_NAME_BUFLEN];	/* their leaf (subkeys.c); "": none */
} FsDeltaKey;

typedef struct FsDelta
{
	FsDeltaKey	key;
	FsQueue    *queue;
	int64		rows;
	int32		leaves;			/* rows that left without fs_claim() */
	float8		charge;			/* their cost */
	bool		added;			/* a row entered the ready state (whatever
								 * the net change) */
	bool		reordered;		/* a ready row was updated and stayed ready,
								 * maybe at another place in the order */
} FsDelta;

/*
 * One tenant of one fs_claim() round, for rollback; or, with a subkey, one
 * leaf of the tenant (rows and tag only: its tenant has its own record).
 */
typedef struct FsClaimRec
{
	FsQueue    *queue;
	SubTransactionId subid;
	char		tenant[FS_NAME_BUFLEN];
	char		subkey[FS_NAME_BUFLEN];	/* "": the tenant's record */
	int32		rows;
	float8		charge;
	float8		served;
	uint64		resync_gen;
	float8		vtime_before;
	float8		vtime_after;
} FsClaimRec;

/*
 * A claimed row's identity in this transaction: its claim-map key and the
 * type of the value it was made from.  A queue registered again in the
 * same transaction may have keys of another type, whose bytes must never
 * be taken for the same row (nor interpreted as the new type).
 */
typedef struct FsXactKey
{
	FsClaimKey	claim;
	Oid			type;
} FsXactKey;

/* A row claimed in this transaction. */
typedef struct FsClaimedRow
{
	FsXactKey	key;			/* hash key: must be first */
	FsQueue    *queue;
	SubTransactionId subid;
	SubTransactionId left_subid;	/* left the ready state, or 0 */
	bool		reserved;		/* taken off the count by the claim */
	bool		mapped;			/* in the claim map */
	int64		lease_id;
	uint64		resync_gen;
	Datum		value;			/* the key (copied), of type key.type */
	uint32		key_expr;		/* hash of the key expression it came from */
	char		tenant[FS_NAME_BUFLEN];
	char		subkey[FS_NAME_BUFLEN];	/* its leaf, or "" */
	float8		cost;			/* its cost, as its claim charged it */
} FsClaimedRow;


/* A lease released by the running-row trigger. */
typedef struct FsRelease
{
	FsQueue    *queue;
	SubTransactionId subid;
	FsClaimKey	key;
	int64		lease_id;
	int64		held_usecs;
	float8		est_cost;
	bool		released;
	bool		charge_runtime;
	char		tenant[FS_NAME_BUFLEN];
} FsRelease;

typedef struct FsQueueEvent
{
	char		queue_name[FS_NAME_BUFLEN];	/* "" = registrations in general */
	SubTransactionId subid;
	uint8		kind;
	FsQueue    *queue;			/* looked up before commit, or NULL */
} FsQueueEvent;

#define FS_EVENT_REGISTERED		1
#define FS_EVENT_UNREGISTERED	2
#define FS_EVENT_TRUNCATED		3

/*
 * Tenants whose rows left through the application's own claim, made ready
 * before commit (where allocating may still fail) and applied at commit in
 * fair order (see fs_apply_own_claims()).
 */
typedef struct FsOwnClaim
{
	FsDelta    *delta;
	float8		tag;			/* the tenant's finish tag, read at commit */
} FsOwnClaim;

/*
 * What this transaction did.  The two hash tables outlive transactions
 * (see track.c); everything else lives in `cxt`, reset at each
 * end.
 */
typedef struct FsXactState
{
	MemoryContext tables_cxt;	/* the hash tables' */
	MemoryContext cxt;			/* the transaction's */
	HTAB	   *deltas;			/* FsDelta: ready rows per tenant */
	HTAB	   *claimed;		/* FsClaimedRow: rows fs_claim() claimed */
	/*
	 * The claims of this transaction, oldest first, in an array whose room
	 * is reserved before a claim changes shared state
	 * (fs_track_claims_reserve()): recording a claim then cannot fail, so a
	 * rollback always knows what to undo.
	 */
	FsClaimRec *claims;
	int			nclaims;
	int			claims_capacity;
	List	   *releases;		/* FsRelease */
	List	   *events;			/* FsQueueEvent */
	FsOwnClaim *own_claims;		/* made ready before commit */
	int			n_own_claims;
	FullTransactionId fxid;		/* at its commit: the top-level xid */
	bool		active;			/* something was recorded */
} FsXactState;

extern FsXactState fs_xact;

/* track.c */
extern void fs_xact_begin(void);
extern void fs_xact_reset(void);

#endif							/* FAIRSHARE_TRACK_INT_H */

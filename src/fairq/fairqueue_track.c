/*-------------------------------------------------------------------------
 *
 * fairqueue_track.c
 *	  Fair dequeue's triggers and transactions: backlog counts applied at
 *	  commit, what a claim undoes at rollback, and the claim map through
 *	  which a row leaving the running table releases its lease.
 *
 * The ready-row trigger (AFTER INSERT OR DELETE OR UPDATE, FOR EACH ROW)
 * evaluates each registration's filter and tenant on the row and adds +1 or
 * -1 to a backend-local count per (queue, tenant, subtransaction).  Nothing
 * reaches shared memory before the transaction commits (after its rows are
 * visible), and a rolled-back (sub)transaction's counts are dropped: a row
 * inserted in a transaction that rolls back never counts.
 *
 * fs_claim() has already taken its rows off the count (a reservation); when
 * such a row leaves the ready state in the same transaction the trigger
 * recognises its key and does not take it off again.  At commit, a claimed
 * row that did not leave the ready state is given back (its reservation and
 * its lease: nobody runs it).  At rollback a claim gives back everything:
 * rows, leases (slots.c), tag advance, served work.  A row that leaves the
 * ready state without fs_claim() (an application's own claim) is taken off
 * and charged to its tenant's tag at commit, as a claim would be.
 *
 * The claim map (claim_map.c) maps a claimed row's key to its lease.
 * The running-row trigger (AFTER DELETE OR UPDATE on the running table)
 * finds the lease of a row that stops running and releases it with
 * fs_release_slot() semantics: at commit, undone by rollback.  With
 * charge_runtime the held time is charged to the tenant's tag at commit.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"

#include "budget/budget.h"
#include "fairq/fairqueue_int.h"
#include "slots/slots.h"

/* ----------------------------------------------------------------
 * What this transaction did (backend-local)
 * ----------------------------------------------------------------
 */

typedef struct FsDeltaKey
{
	uint32		queue_id;
	SubTransactionId subid;
	char		tenant[FS_NAME_BUFLEN];	/* "": rows without a valid tenant */
} FsDeltaKey;

typedef struct FsDelta
{
	FsDeltaKey	key;
	FsQueue    *queue;
	int64		rows;
	int32		leaves;			/* rows that left without fs_claim() */
	float8		charge;			/* their cost */
} FsDelta;

/* One tenant of one fs_claim() round, for rollback. */
typedef struct FsClaimRec
{
	FsQueue    *queue;
	SubTransactionId subid;
	char		tenant[FS_NAME_BUFLEN];
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
} FsClaimedRow;

/* Which key expression a claimed row's key came from (see FsClaimedRow). */
static uint32
fs_key_expr_hash(FsFairDesc *desc)
{
	return hash_bytes((const unsigned char *) desc->key, (int) strlen(desc->key));
}

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
 * Queues whose commit barrier this transaction entered (fairqueue.c): room for
 * every queue the server can have, allocated once, before the first barrier
 * is entered.
 */

/*
 * The two hash tables outlive transactions (emptied at each end, rebuilt
 * only after an unusually large one): making them anew for every enqueue
 * was a good part of the triggers' cost.  Everything else lives in
 * xact_cxt, reset at each end.
 */
#define FS_XACT_TABLE_KEEP	256

static MemoryContext tables_cxt = NULL;
static MemoryContext xact_cxt = NULL;

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

static FsOwnClaim *own_claims = NULL;
static int	n_own_claims = 0;
static HTAB *xact_deltas = NULL;
static HTAB *xact_claimed = NULL;
/*
 * The claims of this transaction, oldest first, in an array whose room is
 * reserved before a claim changes shared state (fs_track_claims_reserve()):
 * recording a claim then cannot fail, so a rollback always knows what to
 * undo.
 */
static FsClaimRec *xact_claims = NULL;
static int	nxact_claims = 0;
static int	xact_claims_capacity = 0;
static List *xact_releases = NIL;	/* FsRelease */
static List *xact_events = NIL;		/* FsQueueEvent */
static bool xact_active = false;

static HTAB *
fs_xact_table(const char *name, Size keysize, Size entrysize)
{
	HASHCTL		info;

	memset(&info, 0, sizeof(info));
	info.keysize = keysize;
	info.entrysize = entrysize;
	info.hcxt = tables_cxt;
	return hash_create(name, 16, &info, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/*
 * The first change of fair-dequeue state in this transaction: make its
 * backend-local tables (once per backend) and mark it active.
 */
static void
fs_xact_begin(void)
{
	if (xact_active)
		return;
	if (xact_cxt == NULL)
	{
		tables_cxt = AllocSetContextCreate(TopMemoryContext, "fairshare fair dequeue tables",
										   ALLOCSET_SMALL_SIZES);
		xact_cxt = AllocSetContextCreate(TopMemoryContext, "fairshare fair dequeue transaction",
										 ALLOCSET_DEFAULT_SIZES);
	}
	if (xact_deltas == NULL)
		xact_deltas = fs_xact_table("fairshare backlog deltas", sizeof(FsDeltaKey),
									sizeof(FsDelta));
	if (xact_claimed == NULL)
		xact_claimed = fs_xact_table("fairshare claimed rows", sizeof(FsXactKey),
									 sizeof(FsClaimedRow));
	xact_claims = NULL;
	nxact_claims = 0;
	xact_claims_capacity = 0;
	xact_releases = NIL;
	xact_events = NIL;
	xact_active = true;
}

/* Empty a table for the next transaction (or drop it if it grew large). */
static void
fs_xact_table_clear(HTAB **table)
{
	HASH_SEQ_STATUS seq;
	void	   *entry;

	if (*table == NULL || hash_get_num_entries(*table) == 0)
		return;
	if (hash_get_num_entries(*table) > FS_XACT_TABLE_KEEP)
	{
		hash_destroy(*table);
		*table = NULL;
		return;
	}
	hash_seq_init(&seq, *table);
	while ((entry = hash_seq_search(&seq)) != NULL)
		hash_search(*table, entry, HASH_REMOVE, NULL);
}

/*
 * The transaction is over: forget what it did (its tables emptied, its
 * memory reset).
 */
static void
fs_xact_reset(void)
{
	fs_xact_table_clear(&xact_deltas);
	fs_xact_table_clear(&xact_claimed);
	xact_claims = NULL;
	nxact_claims = 0;
	xact_claims_capacity = 0;
	xact_releases = NIL;
	xact_events = NIL;
	xact_active = false;
	MemoryContextReset(xact_cxt);
	own_claims = NULL;
	n_own_claims = 0;
}

/* Note an event of the queue `queue_name` (NULL: all) for the end of the transaction. */
static void
fs_xact_event_add(const char *queue_name, int kind)
{
	MemoryContext old;
	FsQueueEvent *event;

	fs_xact_begin();
	old = MemoryContextSwitchTo(xact_cxt);
	event = palloc0(sizeof(FsQueueEvent));
	if (queue_name != NULL)
		strlcpy(event->queue_name, queue_name, FS_NAME_BUFLEN);
	event->subid = GetCurrentSubTransactionId();
	event->kind = kind;
	xact_events = lappend(xact_events, event);
	MemoryContextSwitchTo(old);
}

/*
 * Count `rows` more (or fewer) ready rows of `tenant` in `queue` for this
 * subtransaction, applied to shared memory when the transaction commits.
 */
void
fs_delta_add(FsQueue *queue, const char *tenant, int64 rows, int32 leaves, float8 charge)
{
	FsDeltaKey	key;
	FsDelta    *delta;
	bool		found;

	fs_xact_begin();
	memset(&key, 0, sizeof(key));
	key.queue_id = queue->queue_id;
	key.subid = GetCurrentSubTransactionId();
	strlcpy(key.tenant, tenant, FS_NAME_BUFLEN);
	FS_FAULT_POINT("trigger_delta");
	delta = hash_search(xact_deltas, &key, HASH_ENTER, &found);
	if (!found)
	{
		delta->queue = queue;
		delta->rows = 0;
		delta->leaves = 0;
		delta->charge = 0;
	}
	delta->rows += rows;
	delta->leaves += leaves;
	delta->charge += charge;
}

/*
 * Make room for `n` more claim records, before a claim changes shared state
 * (the room lasts until the transaction ends).
 */
void
fs_track_claims_reserve(int n)
{
	int			need;

	fs_xact_begin();
	need = nxact_claims + n;
	if (need <= xact_claims_capacity)
		return;
	need = Max(need, Max(2 * xact_claims_capacity, 16));
	FS_FAULT_POINT("claim_record");
	if (xact_claims == NULL)
		xact_claims = MemoryContextAlloc(xact_cxt, sizeof(FsClaimRec) * need);
	else
		xact_claims = repalloc(xact_claims, sizeof(FsClaimRec) * need);
	xact_claims_capacity = need;
}

/*
 * Record a claim's change of `tenant` (rows reserved or given back, tag
 * advance, served work) for the rollback to undo.  Does not allocate when
 * the caller reserved room (fs_track_claims_reserve()) before it changed
 * shared state, as fs_claim() does.
 */
void
fs_track_claim(FsFairDesc *desc, const char *tenant, int32 rows, float8 charge, float8 served,
			   uint64 resync_gen, float8 vtime_before, float8 vtime_after)
{
	FsClaimRec *rec;

	fs_track_claims_reserve(1);
	rec = &xact_claims[nxact_claims++];
	rec->queue = desc->queue;
	rec->subid = GetCurrentSubTransactionId();
	strlcpy(rec->tenant, tenant, FS_NAME_BUFLEN);
	rec->rows = rows;
	rec->charge = charge;
	rec->served = served;
	rec->resync_gen = resync_gen;
	rec->vtime_before = vtime_before;
	rec->vtime_after = vtime_after;
}

/*
 * A row fs_claim() returned: remember it (to recognise it leaving the ready
 * state) and map its key to its lease (to release it when it stops
 * running).  Returns false for a row without a key: such a row cannot be
 * recognised, so the caller gives its reservation back at once.  The key
 * is of desc->key_type: the caller checked the query's result column.
 */
bool
fs_track_claimed_row(FsFairDesc *desc, const char *tenant, Datum key, bool key_isnull,
					 int64 lease_id, float8 est_cost, bool reserved, uint64 resync_gen)
{
	FsXactKey	xkey;
	FsClaimedRow *row;
	bool		found;
	MemoryContext old;

	if (key_isnull)
		return false;
	fs_xact_begin();
	memset(&xkey, 0, sizeof(xkey));
	fs_claim_key_make(&xkey.claim, desc->queue->queue_id, key, desc->key_type, desc->key_len,
					  desc->key_byval);
	xkey.type = desc->key_type;
	old = MemoryContextSwitchTo(xact_cxt);
	FS_FAULT_POINT("claim_track_row");
	row = hash_search(xact_claimed, &xkey, HASH_ENTER, &found);
	row->queue = desc->queue;
	row->subid = GetCurrentSubTransactionId();
	row->left_subid = 0;
	row->reserved = reserved;
	row->mapped = false;
	row->lease_id = lease_id;
	row->resync_gen = resync_gen;
	row->value = datumCopy(key, desc->key_byval, desc->key_len);
	row->key_expr = fs_key_expr_hash(desc);
	strlcpy(row->tenant, tenant, FS_NAME_BUFLEN);
	if (OidIsValid(desc->running_relid))
	{
		row->mapped = fs_claim_map_insert(&xkey.claim, lease_id, est_cost, tenant);
		if (!row->mapped)
		{
			LWLockAcquire(desc->fq->lock, LW_EXCLUSIVE);
			FS_FAIR_COUNT(desc->fq, unmapped, 1);
			LWLockRelease(desc->fq->lock);
		}
	}
	MemoryContextSwitchTo(old);
	return true;
}

/*
 * Keys of the rows of `queue` this transaction claimed and still holds (did
 * not take out of the ready state), as an array for the claim query, or
 * NULL when there are none.
 */
ArrayType *
fs_track_held_keys(FsFairDesc *desc)
{
	HASH_SEQ_STATUS seq;
	FsClaimedRow *row;
	Datum	   *values;
	int			n = 0;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	uint32		key_expr;

	if (!xact_active || desc->queue == NULL || hash_get_num_entries(xact_claimed) == 0)
		return NULL;
	values = palloc(sizeof(Datum) * hash_get_num_entries(xact_claimed));
	key_expr = fs_key_expr_hash(desc);
	hash_seq_init(&seq, xact_claimed);
	while ((row = hash_seq_search(&seq)) != NULL)
		if (row->queue == desc->queue && row->left_subid == 0)
		{
			/*
			 * Claimed under an earlier registration whose key was another
			 * expression (or of another type): the row cannot be left out
			 * by key, and the claim would return it again.
			 */
			if (row->key.type != desc->key_type || row->key_expr != key_expr)
			{
				hash_seq_term(&seq);
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("queue \"%s\" was registered again with another key after this transaction claimed rows from it",
								desc->queue_name),
						 errdetail("The key is now %s (%s); the rows were claimed with keys of type %s.",
								   desc->key, format_type_be(desc->key_type),
								   format_type_be(row->key.type)),
						 errhint("Commit or roll back the transaction before claiming from the queue again.")));
			}
			values[n++] = row->value;
		}
	if (n == 0)
		return NULL;
	get_typlenbyvalalign(desc->key_type, &typlen, &typbyval, &typalign);
	return construct_array(values, n, desc->key_type, typlen, typbyval, typalign);
}

/*
 * A queue was registered or unregistered in this transaction: its backends'
 * caches are told at commit, and this backend sees the change at once.
 */
void
fs_track_registration_changed(const char *queue_name, bool unregistered)
{
	fs_xact_event_add(queue_name, unregistered ? FS_EVENT_UNREGISTERED : FS_EVENT_REGISTERED);
	/* This transaction sees its own change at once. */
	fs_fair_invalidate_all();
}

/* A ready table of `queue_name` was truncated: the queue is recounted at commit. */
void
fs_track_truncated(const char *queue_name)
{
	fs_xact_event_add(queue_name, FS_EVENT_TRUNCATED);
}

/*
 * A ready row of `role`'s queue whose key is `key` leaves the ready state:
 * true if fs_claim() claimed it in this transaction (its count was taken
 * off then, and is not again), and it is marked as gone.
 */
bool
fs_track_row_left(FsRelRole *role, Datum key)
{
	FsXactKey	xkey;
	FsClaimedRow *row;

	if (!xact_active)
		return false;
	memset(&xkey, 0, sizeof(xkey));
	fs_claim_key_make(&xkey.claim, role->queue->queue_id, key, role->key_type,
					  role->key_len, role->key_byval);
	xkey.type = role->key_type;
	row = hash_search(xact_claimed, &xkey, HASH_FIND, NULL);
	if (row == NULL || !row->reserved || row->left_subid != 0)
		return false;
	row->left_subid = GetCurrentSubTransactionId();
	return true;
}

/*
 * A running row of `role` that held the claim `entry` stopped running: its
 * lease was released (`released`, held for `held_usecs`) by this
 * (sub)transaction.  Kept until it ends: a commit charges the held time and
 * forgets the claim, a rollback makes the lease live again (slots.c).
 */
void
fs_track_release(FsRelRole *role, const FsClaimEntry *entry, bool released, int64 held_usecs)
{
	MemoryContext old;
	FsRelease  *rel;

	fs_xact_begin();
	old = MemoryContextSwitchTo(xact_cxt);
	FS_FAULT_POINT("running_release");
	rel = palloc(sizeof(FsRelease));
	rel->queue = role->queue;
	rel->subid = GetCurrentSubTransactionId();
	rel->key = entry->key;
	rel->lease_id = entry->lease_id;
	rel->held_usecs = held_usecs;
	rel->est_cost = entry->est_cost;
	rel->released = released;
	rel->charge_runtime = role->charge_runtime;
	strlcpy(rel->tenant, entry->tenant, FS_NAME_BUFLEN);
	xact_releases = lappend(xact_releases, rel);
	MemoryContextSwitchTo(old);
}

/* ----------------------------------------------------------------
 * Transaction ends
 * ----------------------------------------------------------------
 */

/* Undo the claims of the whole transaction (subid 0) or one subtransaction. */
static void
fs_undo_claims(SubTransactionId subid)
{
	int			i;
	int			kept;

	/* Newest first, so virtual time unwinds in order. */
	for (i = nxact_claims - 1; i >= 0; i--)
	{
		FsClaimRec *rec = &xact_claims[i];
		FsTenantChange c;

		if (subid != InvalidSubTransactionId && rec->subid != subid)
			continue;
		/* Rows back unless recounted since; tag, served work, V back. */
		fs_change_init(&c, fs_now());
		c.rows = rec->rows;
		c.resync_gen = rec->resync_gen;
		c.served = -rec->served;
		c.tag = -rec->charge;
		c.restore_vtime = true;
		c.vtime_before = rec->vtime_before;
		c.vtime_after = rec->vtime_after;
		fs_fair_change(rec->queue, rec->tenant, false, &c);
	}
	if (subid != InvalidSubTransactionId)
	{
		/* The subtransaction's records go; the rest keep their order. */
		kept = 0;
		for (i = 0; i < nxact_claims; i++)
			if (xact_claims[i].subid != subid)
				xact_claims[kept++] = xact_claims[i];
		nxact_claims = kept;
	}

	if (xact_claimed != NULL)
	{
		HASH_SEQ_STATUS seq;
		FsClaimedRow *row;

		hash_seq_init(&seq, xact_claimed);
		while ((row = hash_seq_search(&seq)) != NULL)
		{
			if (subid != InvalidSubTransactionId && row->left_subid == subid)
				row->left_subid = 0;
			if (subid != InvalidSubTransactionId && row->subid != subid)
				continue;
			if (row->mapped)
				fs_claim_map_remove(&row->key.claim, row->lease_id);
			hash_search(xact_claimed, &row->key, HASH_REMOVE, NULL);
		}
	}
}

/* Drop what an aborted subtransaction recorded. */
static void
fs_drop_subxact(SubTransactionId subid)
{
	HASH_SEQ_STATUS seq;
	FsDelta    *delta;
	List	   *keep = NIL;
	ListCell   *lc;

	hash_seq_init(&seq, xact_deltas);
	while ((delta = hash_seq_search(&seq)) != NULL)
		if (delta->key.subid == subid)
			hash_search(xact_deltas, &delta->key, HASH_REMOVE, NULL);

	foreach(lc, xact_releases)
		if (((FsRelease *) lfirst(lc))->subid != subid)
			keep = lappend(keep, lfirst(lc));
	xact_releases = keep;

	keep = NIL;
	foreach(lc, xact_events)
		if (((FsQueueEvent *) lfirst(lc))->subid != subid)
			keep = lappend(keep, lfirst(lc));
		else if (((FsQueueEvent *) lfirst(lc))->kind != FS_EVENT_TRUNCATED)
			fs_fair_invalidate_all();
	xact_events = keep;
}

/* A committed subtransaction's records now belong to its parent. */
static void
fs_merge_subxact(SubTransactionId subid, SubTransactionId parent)
{
	HASH_SEQ_STATUS seq;
	FsDelta    *delta;
	FsClaimedRow *row;
	ListCell   *lc;
	List	   *moved = NIL;

	hash_seq_init(&seq, xact_deltas);
	while ((delta = hash_seq_search(&seq)) != NULL)
		if (delta->key.subid == subid)
			moved = lappend(moved, delta);
	foreach(lc, moved)
	{
		FsDelta    *from = lfirst(lc);
		FsDelta		copy = *from;

		hash_search(xact_deltas, &from->key, HASH_REMOVE, NULL);
		copy.key.subid = parent;
		{
			FsDelta    *to;
			bool		found;

			to = hash_search(xact_deltas, &copy.key, HASH_ENTER, &found);
			if (!found)
			{
				to->queue = copy.queue;
				to->rows = to->leaves = 0;
				to->charge = 0;
			}
			to->rows += copy.rows;
			to->leaves += copy.leaves;
			to->charge += copy.charge;
		}
	}
	list_free(moved);

	hash_seq_init(&seq, xact_claimed);
	while ((row = hash_seq_search(&seq)) != NULL)
	{
		if (row->subid == subid)
			row->subid = parent;
		if (row->left_subid == subid)
			row->left_subid = parent;
	}
	for (int i = 0; i < nxact_claims; i++)
		if (xact_claims[i].subid == subid)
			xact_claims[i].subid = parent;
	foreach(lc, xact_releases)
		if (((FsRelease *) lfirst(lc))->subid == subid)
			((FsRelease *) lfirst(lc))->subid = parent;
	foreach(lc, xact_events)
		if (((FsQueueEvent *) lfirst(lc))->subid == subid)
			((FsQueueEvent *) lfirst(lc))->subid = parent;
}

/* Add `queue` to a set of `n` queues (with room for it); returns its size. */
static int
fs_queue_set_add(FsQueue **queues, int n, FsQueue *queue)
{
	int			i;

	for (i = 0; i < n; i++)
		if (queues[i] == queue)
			return n;
	queues[n] = queue;
	return n + 1;
}

/*
 * Enter the commit barrier of every queue whose counts this transaction
 * changes (barrier.c says in which order).
 */
static void
fs_barriers_enter_changed(void)
{
	HASH_SEQ_STATUS seq;
	FsDelta    *delta;
	FsClaimedRow *row;
	FsQueue   **queues;
	int			nqueues = 0;
	long		capacity;

	/* At most one queue per entry of either table. */
	capacity = hash_get_num_entries(xact_deltas) + hash_get_num_entries(xact_claimed);
	if (capacity == 0)
		return;
	queues = palloc_extended(sizeof(FsQueue *) * capacity, MCXT_ALLOC_HUGE);
	hash_seq_init(&seq, xact_deltas);
	while ((delta = hash_seq_search(&seq)) != NULL)
		nqueues = fs_queue_set_add(queues, nqueues, delta->queue);
	hash_seq_init(&seq, xact_claimed);
	while ((row = hash_seq_search(&seq)) != NULL)
		if (row->reserved)
			nqueues = fs_queue_set_add(queues, nqueues, row->queue);
	fs_barriers_enter_in_order(queues, nqueues);
	pfree(queues);
}

/*
 * Before commit (SPI still allowed): end the leases of claimed rows that did
 * not leave the ready state (nobody runs them), and make sure every tenant
 * that gets ready rows has an entry with current limits.
 */
static void
fs_pre_commit(void)
{
	HASH_SEQ_STATUS seq;
	FsClaimedRow *row;
	FsDelta    *delta;

	/* Rows that left through the application's own claim, for fs_commit(). */
	if (hash_get_num_entries(xact_deltas) > 0)
	{
		FS_FAULT_POINT("pre_commit");
		own_claims = MemoryContextAlloc(xact_cxt,
										sizeof(FsOwnClaim) * hash_get_num_entries(xact_deltas));
		n_own_claims = 0;
		hash_seq_init(&seq, xact_deltas);
		while ((delta = hash_seq_search(&seq)) != NULL)
			if (delta->leaves != 0 && delta->key.tenant[0] != '\0')
				own_claims[n_own_claims++].delta = delta;
	}

	/*
	 * This runs in every transaction that wrote a registered table, so the
	 * common cases (only inserts; only claims) skip the empty table's scans.
	 */
	if (hash_get_num_entries(xact_claimed) > 0)
	{
		TimestampTz now = fs_now();

		hash_seq_init(&seq, xact_claimed);
		while ((row = hash_seq_search(&seq)) != NULL)
			if (row->left_subid == 0)
			{
				int64		held;

				(void) fs_slot_release(row->lease_id, now, &held);
				if (row->mapped)
					fs_claim_map_remove(&row->key.claim, row->lease_id);
				row->mapped = false;
			}
	}

	if (hash_get_num_entries(xact_deltas) > 0)
	{
		hash_seq_init(&seq, xact_deltas);
		while ((delta = hash_seq_search(&seq)) != NULL)
			if (delta->rows > 0 && delta->key.tenant[0] != '\0')
			{
				FsTenantRef ref;

				if (fs_tenant_open(delta->queue, delta->key.tenant, FS_OPEN_CREATE, &ref) != NULL)
					fs_tenant_close(&ref);
			}
	}

	/*
	 * The queues of registration events, looked up now: a lookup may add
	 * to this backend's cache (memory), which the commit itself must not.
	 */
	{
		ListCell   *lc;

		foreach(lc, xact_events)
		{
			FsQueueEvent *event = lfirst(lc);

			if (event->queue_name[0] != '\0')
				event->queue = fs_queue_lookup(event->queue_name, false);
		}
	}

	/* Last: from here until its changes are applied, a recount waits. */
	fs_barriers_enter_changed();
}

/* The clock, read once and only by a commit that needs it. */
static TimestampTz
fs_commit_now(TimestampTz *now)
{
	if (*now == 0)
		*now = fs_now();
	return *now;
}

static int
fs_own_claim_cmp(const void *a, const void *b)
{
	const FsOwnClaim *x = (const FsOwnClaim *) a;
	const FsOwnClaim *y = (const FsOwnClaim *) b;

	if (x->delta->key.queue_id != y->delta->key.queue_id)
		return x->delta->key.queue_id < y->delta->key.queue_id ? -1 : 1;
	if (x->tag != y->tag)
		return x->tag < y->tag ? -1 : 1;
	return strcmp(x->delta->key.tenant, y->delta->key.tenant);
}

/*
 * Apply the rows that left through the application's own claim.  Each
 * advances its tenant's tag as a claim would, and moves the queue's virtual
 * time to its start: to be what fs_claim() would have done, and not depend
 * on the order of a hash table, they are applied in fair order, smallest
 * tag first.  Nothing here may fail: the array was allocated before commit.
 */
static void
fs_apply_own_claims(TimestampTz now)
{
	int			i;

	for (i = 0; i < n_own_claims; i++)
	{
		FsDelta    *delta = own_claims[i].delta;
		FsTenantRef ref;
		FsTenant   *entry;

		own_claims[i].tag = 0;
		entry = fs_tenant_open(delta->queue, delta->key.tenant, FS_OPEN_NO_LIMITS, &ref);
		if (entry != NULL)
		{
			fs_tenant_lock(entry);
			own_claims[i].tag = entry->virtual_finish;
			fs_tenant_unlock(entry);
			fs_tenant_close(&ref);
		}
	}
	if (n_own_claims > 1)
		qsort(own_claims, n_own_claims, sizeof(FsOwnClaim), fs_own_claim_cmp);
	for (i = 0; i < n_own_claims; i++)
	{
		FsDelta    *delta = own_claims[i].delta;

		fs_fair_apply_backlog(delta->queue, delta->key.tenant, delta->rows,
							  delta->charge, delta->leaves, now);
	}
}

/* After commit: publish everything.  Nothing here may fail. */
static void
fs_commit(void)
{
	HASH_SEQ_STATUS seq;
	FsDelta    *delta;
	FsClaimedRow *row;
	ListCell   *lc;
	TimestampTz now = 0;
	FsTenantChange c;

	if (hash_get_num_entries(xact_deltas) > 0)
	{
		hash_seq_init(&seq, xact_deltas);
		while ((delta = hash_seq_search(&seq)) != NULL)
		{
			if (delta->key.tenant[0] == '\0')
				fs_fair_add_without_tenant(delta->queue, delta->rows, 0);
			else if (delta->leaves == 0 && delta->rows != 0)
				fs_fair_apply_backlog(delta->queue, delta->key.tenant, delta->rows, 0, 0, 0);
		}
		fs_apply_own_claims(fs_commit_now(&now));
	}

	if (hash_get_num_entries(xact_claimed) > 0)
	{
		hash_seq_init(&seq, xact_claimed);
		while ((row = hash_seq_search(&seq)) != NULL)
		{
			if (!row->reserved)
				continue;

			/*
			 * The common case, a claimed row that left the ready state with
			 * no recount since, changes nothing.  (A recount cannot be
			 * running now: this transaction changed the table and still
			 * holds its lock.)
			 */
			if (row->left_subid != 0 && fs_fair_queue(row->queue)->resync_gen == row->resync_gen)
				continue;

			/*
			 * A row still ready gets its reservation back; if the queue was
			 * recounted since the claim, the count had it, and a row that
			 * left is taken off instead.
			 */
			fs_change_init(&c, fs_commit_now(&now));
			c.rows = row->left_subid == 0 ? 1 : 0;
			c.rows_recounted = row->left_subid != 0 ? -1 : 0;
			c.resync_gen = row->resync_gen;
			fs_fair_change(row->queue, row->tenant, false, &c);
		}
	}

	foreach(lc, xact_releases)
	{
		FsRelease  *rel = lfirst(lc);
		FsFairQueue *fq = fs_fair_queue(rel->queue);

		fs_claim_map_remove(&rel->key, rel->lease_id);
		if (!rel->released)
			continue;
		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		FS_FAIR_COUNT(fq, rows_released, 1);
		LWLockRelease(fq->lock);
		if (rel->charge_runtime)
		{
			float8		held_ms = (float8) rel->held_usecs / 1000.0;
			float8		extra = held_ms - rel->est_cost;

			fs_change_init(&c, fs_commit_now(&now));
			c.resync_gen = fs_fair_queue(rel->queue)->resync_gen;
			c.cost = extra;
			c.served = extra;
			fs_fair_change(rel->queue, rel->tenant, false, &c);
			fs_fair_note_runtime(rel->queue, held_ms);
			/* The budget paid the estimate at claim: it pays the rest now. */
			fs_budget_charge_committed(rel->queue, rel->tenant, extra, fs_commit_now(&now));
		}
	}

	foreach(lc, xact_events)
	{
		FsQueueEvent *event = lfirst(lc);
		FsQueue    *queue = event->queue;

		if (queue == NULL)
			continue;
		fs_fair_forget(queue);
		if (event->kind == FS_EVENT_UNREGISTERED)
			fs_claim_map_remove_queue(queue->queue_id);
	}
	foreach(lc, xact_events)
		if (((FsQueueEvent *) lfirst(lc))->kind != FS_EVENT_TRUNCATED)
		{
			pg_atomic_add_fetch_u32(&fs_fair->registration_generation, 1);
			break;
		}
}

/*
 * Transaction end: at pre-commit, enter the commit barriers and compute what
 * to apply; at commit, apply it and leave them; at abort, undo what this
 * transaction's claims did to shared memory.
 */
static void
fs_track_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	if (!xact_active)
		return;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			fs_pre_commit();
			break;
		case XACT_EVENT_COMMIT:
			fs_commit();
			fs_barriers_leave_all();
			fs_xact_reset();
			break;
		case XACT_EVENT_ABORT:
			fs_undo_claims(InvalidSubTransactionId);
			fs_barriers_leave_all();
			if (xact_events != NIL)
				fs_fair_invalidate_all();
			fs_xact_reset();
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (nxact_claims > 0 || hash_get_num_entries(xact_deltas) > 0 ||
				xact_releases != NIL || xact_events != NIL)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot prepare a transaction that changed rows or registrations of fair-dequeue queues"),
						 errhint("Enqueue, claim and finish jobs outside prepared transactions.")));
			fs_xact_reset();
			break;
		default:
			break;
	}
}

/*
 * Subtransaction end: a commit hands its changes to the parent; an abort
 * undoes its claims and drops its deltas.
 */
static void
fs_track_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						  SubTransactionId parentSubid, void *arg pg_attribute_unused())
{
	if (!xact_active)
		return;

	switch (event)
	{
		case SUBXACT_EVENT_COMMIT_SUB:
			{
				MemoryContext old = MemoryContextSwitchTo(xact_cxt);

				fs_merge_subxact(mySubid, parentSubid);
				MemoryContextSwitchTo(old);
			}
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			{
				MemoryContext old = MemoryContextSwitchTo(xact_cxt);

				fs_undo_claims(mySubid);
				fs_drop_subxact(mySubid);
				MemoryContextSwitchTo(old);
			}
			break;
		default:
			break;
	}
}

void
fs_track_init(void)
{
	RegisterXactCallback(fs_track_xact_callback, NULL);
	RegisterSubXactCallback(fs_track_subxact_callback, NULL);
}

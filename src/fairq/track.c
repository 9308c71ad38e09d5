/*-------------------------------------------------------------------------
 *
 * track.c
 *	  What a transaction did to fair dequeue (backend-local), recorded for
 *	  its end: backlog counts from the triggers (triggers.c), the rows and
 *	  tenants fs_claim() claimed, the leases the running-row trigger
 *	  released.  commit.c applies or undoes them when the transaction ends.
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
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"

#include "fairq/fairqueue_int.h"
#include "fairq/track_int.h"

/* ----------------------------------------------------------------
 * What this transaction did (backend-local)
 * ----------------------------------------------------------------
 */

/* Which key expression a claimed row's key came from (see FsClaimedRow). */
static uint32
fs_key_expr_hash(FsFairDesc *desc)
{
	return hash_bytes((const unsigned char *) desc->key, (int) strlen(desc->key));
}

/* The transaction's state (track_int.h). */
FsXactState fs_xact;

/*
 * The two hash tables outlive transactions (emptied at each end, rebuilt
 * only after an unusually large one): making them anew for every enqueue
 * was a good part of the triggers' cost.  Everything else lives in
 * fs_xact.cxt, reset at each end.
 */
#define FS_XACT_TABLE_KEEP	256

/* One of the two backend-local hash tables, in tables_cxt. */
static HTAB *
fs_xact_table(const char *name, Size keysize, Size entrysize)
{
	HASHCTL		info;

	memset(&info, 0, sizeof(info));
	info.keysize = keysize;
	info.entrysize = entrysize;
	info.hcxt = fs_xact.tables_cxt;
	return hash_create(name, 16, &info, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/*
 * The first change of fair-dequeue state in this transaction: make its
 * backend-local tables (once per backend) and mark it active.
 */
void
fs_xact_begin(void)
{
	if (fs_xact.active)
		return;
	if (fs_xact.cxt == NULL)
	{
		fs_xact.tables_cxt = AllocSetContextCreate(TopMemoryContext, "fairshare fair dequeue tables",
										   ALLOCSET_SMALL_SIZES);
		fs_xact.cxt = AllocSetContextCreate(TopMemoryContext, "fairshare fair dequeue transaction",
										 ALLOCSET_DEFAULT_SIZES);
	}
	if (fs_xact.deltas == NULL)
		fs_xact.deltas = fs_xact_table("fairshare backlog deltas", sizeof(FsDeltaKey),
									sizeof(FsDelta));
	if (fs_xact.claimed == NULL)
		fs_xact.claimed = fs_xact_table("fairshare claimed rows", sizeof(FsXactKey),
									 sizeof(FsClaimedRow));
	fs_xact.claims = NULL;
	fs_xact.nclaims = 0;
	fs_xact.claims_capacity = 0;
	fs_xact.releases = NIL;
	fs_xact.events = NIL;
	fs_xact.active = true;
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
void
fs_xact_reset(void)
{
	fs_xact_table_clear(&fs_xact.deltas);
	fs_xact_table_clear(&fs_xact.claimed);
	fs_xact.claims = NULL;
	fs_xact.nclaims = 0;
	fs_xact.claims_capacity = 0;
	fs_xact.releases = NIL;
	fs_xact.events = NIL;
	fs_xact.active = false;
	MemoryContextReset(fs_xact.cxt);
	fs_xact.own_claims = NULL;
	fs_xact.n_own_claims = 0;
	fs_xact.fxid = InvalidFullTransactionId;
}

/* Note an event of the queue `queue_name` (NULL: all) for the end of the transaction. */
static void
fs_xact_event_add(const char *queue_name, int kind)
{
	MemoryContext old;
	FsQueueEvent *event;

	fs_xact_begin();
	old = MemoryContextSwitchTo(fs_xact.cxt);
	event = palloc0(sizeof(FsQueueEvent));
	if (queue_name != NULL)
		strlcpy(event->queue_name, queue_name, FS_NAME_BUFLEN);
	event->subid = GetCurrentSubTransactionId();
	event->kind = kind;
	fs_xact.events = lappend(fs_xact.events, event);
	MemoryContextSwitchTo(old);
}

/*
 * The record of (queue, tenant, sub-key) for this subtransaction, made
 * empty if there is none.
 */
static FsDelta *
fs_delta_enter(FsQueue *queue, const char *tenant, const char *subkey)
{
	FsDeltaKey	key;
	FsDelta    *delta;
	bool		found;

	fs_xact_begin();
	memset(&key, 0, sizeof(key));
	key.queue_id = queue->queue_id;
	key.subid = GetCurrentSubTransactionId();
	strlcpy(key.tenant, tenant, FS_NAME_BUFLEN);
	if (subkey != NULL)
		strlcpy(key.subkey, subkey, FS_NAME_BUFLEN);
	FS_FAULT_POINT("trigger_delta");
	delta = hash_search(fs_xact.deltas, &key, HASH_ENTER, &found);
	if (!found)
	{
		delta->queue = queue;
		delta->rows = 0;
		delta->leaves = 0;
		delta->charge = 0;
		delta->added = false;
		delta->reordered = false;
	}
	return delta;
}

/*
 * Count `rows` more (or fewer) ready rows of `tenant` in `queue` for this
 * subtransaction, applied to shared memory when the transaction commits.
 */
void
fs_delta_add(FsQueue *queue, const char *tenant, const char *subkey, int64 rows, int32 leaves,
			 float8 charge)
{
	FsDelta    *delta = fs_delta_enter(queue, tenant, subkey);

	if (rows > 0)
		delta->added = true;
	delta->rows += rows;
	delta->leaves += leaves;
	delta->charge += charge;
}

/*
 * A ready row of `tenant` in `queue` was updated and stayed ready: its
 * place in the order may have changed, which its commit tells the probe
 * starts (probe_start.c).
 */
void
fs_delta_reordered(FsQueue *queue, const char *tenant, const char *subkey)
{
	fs_delta_enter(queue, tenant, subkey)->reordered = true;
}

/*
 * Did this transaction put rows of `queue` into the ready state (or move
 * ready rows in their order)?  Its own rows, not committed, may sort below
 * any probe start (probe_start.c).
 */
bool
fs_track_made_ready(FsQueue *queue)
{
	HASH_SEQ_STATUS seq;
	FsDelta    *delta;
	bool		made = false;

	if (!fs_xact.active || hash_get_num_entries(fs_xact.deltas) == 0)
		return false;
	hash_seq_init(&seq, fs_xact.deltas);
	while ((delta = hash_seq_search(&seq)) != NULL)
		if (delta->queue == queue && (delta->added || delta->reordered))
		{
			made = true;
			hash_seq_term(&seq);
			break;
		}
	return made;
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
	need = fs_xact.nclaims + n;
	if (need <= fs_xact.claims_capacity)
		return;
	need = Max(need, Max(2 * fs_xact.claims_capacity, 16));
	FS_FAULT_POINT("claim_record");
	if (fs_xact.claims == NULL)
		fs_xact.claims = MemoryContextAlloc(fs_xact.cxt, sizeof(FsClaimRec) * need);
	else
		fs_xact.claims = repalloc(fs_xact.claims, sizeof(FsClaimRec) * need);
	fs_xact.claims_capacity = need;
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
	rec = &fs_xact.claims[fs_xact.nclaims++];
	rec->queue = desc->queue;
	rec->subid = GetCurrentSubTransactionId();
	strlcpy(rec->tenant, tenant, FS_NAME_BUFLEN);
	rec->subkey[0] = '\0';
	rec->rows = rows;
	rec->charge = charge;
	rec->served = served;
	rec->resync_gen = resync_gen;
	rec->vtime_before = vtime_before;
	rec->vtime_after = vtime_after;
}

/*
 * Record a claim's change of the leaf (tenant, subkey): rows reserved or
 * given back, tag advance (already divided by the leaf's weight), for the
 * rollback to undo.  Does not allocate when room was reserved.
 */
void
fs_track_leaf_claim(FsFairDesc *desc, const char *tenant, const char *subkey, int32 rows,
					float8 tag, uint64 resync_gen)
{
	FsClaimRec *rec;

	fs_track_claims_reserve(1);
	rec = &fs_xact.claims[fs_xact.nclaims++];
	memset(rec, 0, sizeof(*rec));
	rec->queue = desc->queue;
	rec->subid = GetCurrentSubTransactionId();
	strlcpy(rec->tenant, tenant, FS_NAME_BUFLEN);
	strlcpy(rec->subkey, subkey, FS_NAME_BUFLEN);
	rec->rows = rows;
	rec->charge = tag;
	rec->resync_gen = resync_gen;
}

/*
 * A row fs_claim() returned: remember it (to recognise it leaving the ready
 * state) and map its key to its lease (to release it when it stops
 * running).  Returns false for a row without a key: such a row cannot be
 * recognised, so the caller gives its reservation back at once.  The key
 * is of desc->key_type: the caller checked the query's result column.
 */
bool
fs_track_claimed_row(FsFairDesc *desc, const char *tenant, const char *subkey, Datum key,
					 bool key_isnull,
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
					  desc->key_byval, desc->tenant_keys ? tenant : NULL);
	xkey.type = desc->key_type;
	old = MemoryContextSwitchTo(fs_xact.cxt);
	FS_FAULT_POINT("claim_track_row");
	row = hash_search(fs_xact.claimed, &xkey, HASH_ENTER, &found);
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
	strlcpy(row->subkey, subkey != NULL ? subkey : "", FS_NAME_BUFLEN);
	row->cost = est_cost;
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
	Oid			output = InvalidOid;

	if (!fs_xact.active || desc->queue == NULL || hash_get_num_entries(fs_xact.claimed) == 0)
		return NULL;
	values = palloc(sizeof(Datum) * hash_get_num_entries(fs_xact.claimed));
	key_expr = fs_key_expr_hash(desc);
	if (desc->tenant_keys)
	{
		bool		varlena;

		getTypeOutputInfo(desc->key_type, &output, &varlena);
	}
	hash_seq_init(&seq, fs_xact.claimed);
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
			if (desc->tenant_keys)
				values[n++] = CStringGetTextDatum(psprintf("%d:%s%s",
														   pg_mbstrlen(row->tenant), row->tenant,
														   OidOutputFunctionCall(output, row->value)));
			else
				values[n++] = row->value;
		}
	if (n == 0)
		return NULL;
	/* Keys unique only with the tenant: named with it, as text (fs_q_held_key()). */
	if (desc->tenant_keys)
		return construct_array(values, n, TEXTOID, -1, false, TYPALIGN_INT);
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

/*
 * A ready table of `queue_name` was truncated: the queue is recounted at
 * commit.  Noted once per subtransaction (a TRUNCATE of several Citus shards
 * of the table comes here for each).
 */
void
fs_track_truncated(const char *queue_name)
{
	ListCell   *lc;

	foreach(lc, fs_xact.events)
	{
		FsQueueEvent *event = lfirst(lc);

		if (event->kind == FS_EVENT_TRUNCATED && event->subid == GetCurrentSubTransactionId() &&
			strcmp(event->queue_name, queue_name) == 0)
			return;
	}
	fs_xact_event_add(queue_name, FS_EVENT_TRUNCATED);
}

/* Whether this transaction released lease `lease_id` (its job finished). */
bool
fs_track_releasing(int64 lease_id)
{
	ListCell   *lc;

	foreach(lc, fs_xact.releases)
		if (((FsRelease *) lfirst(lc))->lease_id == lease_id)
			return true;
	return false;
}

/*
 * The row of `role`'s queue whose key is `key`, if fs_claim() claimed it in
 * this transaction, took it off the count, and it is still ready; else NULL.
 */
static FsClaimedRow *
fs_track_reserved_row(FsRelRole *role, Datum key, const char *tenant)
{
	FsXactKey	xkey;
	FsClaimedRow *row;

	if (!fs_xact.active)
		return NULL;
	memset(&xkey, 0, sizeof(xkey));
	fs_claim_key_make(&xkey.claim, role->queue->queue_id, key, role->key_type,
					  role->key_len, role->key_byval, role->tenant_keys ? tenant : NULL);
	xkey.type = role->key_type;
	row = hash_search(fs_xact.claimed, &xkey, HASH_FIND, NULL);
	if (row == NULL || !row->reserved || row->left_subid != 0)
		return NULL;
	return row;
}

/*
 * A ready row of `role`'s queue whose key is `key` leaves the ready state:
 * true if fs_claim() claimed it in this transaction (its count was taken
 * off then, and is not again), and it is marked as gone.
 */
bool
fs_track_row_left(FsRelRole *role, Datum key, const char *tenant)
{
	FsClaimedRow *row = fs_track_reserved_row(role, key, tenant);

	if (row == NULL)
		return false;
	row->left_subid = GetCurrentSubTransactionId();
	return true;
}

/*
 * A row of `role` that fs_claim() claimed (and reserved) in this
 * transaction moved, still ready, to the sub-key `subkey` of its tenant:
 * its reservation moves with it, and a commit that finds it still ready
 * gives it back to that leaf.  True if it was such a row (its leaves'
 * counts then do not change: the row left the one it was reserved from,
 * and is reserved in the other).  A move undone by a rollback to a
 * savepoint is not undone here.
 */
bool
fs_track_row_moved(FsRelRole *role, Datum key, const char *tenant, const char *subkey)
{
	FsClaimedRow *row = fs_track_reserved_row(role, key, tenant);

	if (row == NULL)
		return false;
	strlcpy(row->subkey, subkey, FS_NAME_BUFLEN);
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
	old = MemoryContextSwitchTo(fs_xact.cxt);
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
	fs_xact.releases = lappend(fs_xact.releases, rel);
	MemoryContextSwitchTo(old);
}

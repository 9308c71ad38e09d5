/*-------------------------------------------------------------------------
 *
 * commit.c
 *	  The end of a transaction for fair dequeue: before commit, the leases
 *	  of claimed rows nobody runs end and every tenant that gets rows has an
 *	  entry; at commit, the backlog changes are applied inside the queues'
 *	  commit barriers; at rollback (of a transaction or a subtransaction),
 *	  a claim gives back everything (track.c has the whole
 *	  picture).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"


#include "access/xact.h"

#include "budget/budget.h"
#include "core/prepared.h"
#include "fairq/fairqueue_int.h"
#include "fairq/track_int.h"
#include "slots/slots.h"

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
	for (i = fs_xact.nclaims - 1; i >= 0; i--)
	{
		FsClaimRec *rec = &fs_xact.claims[i];
		FsTenantChange c;

		if (subid != InvalidSubTransactionId && rec->subid != subid)
			continue;
		if (rec->subkey[0] != '\0')
		{
			/* A leaf's record: its rows and tag back (subkeys.c). */
			fs_change_init(&c, fs_now());
			c.rows = rec->rows;		/* back unless recounted since */
			c.resync_gen = rec->resync_gen;
			c.tag = -rec->charge;
			fs_leaf_apply(rec->queue, rec->tenant, rec->subkey, &c);
			continue;
		}
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
		for (i = 0; i < fs_xact.nclaims; i++)
			if (fs_xact.claims[i].subid != subid)
				fs_xact.claims[kept++] = fs_xact.claims[i];
		fs_xact.nclaims = kept;
	}

	if (fs_xact.claimed != NULL)
	{
		HASH_SEQ_STATUS seq;
		FsClaimedRow *row;

		hash_seq_init(&seq, fs_xact.claimed);
		while ((row = hash_seq_search(&seq)) != NULL)
		{
			if (subid != InvalidSubTransactionId && row->left_subid == subid)
				row->left_subid = 0;
			if (subid != InvalidSubTransactionId && row->subid != subid)
				continue;
			if (row->mapped)
				fs_claim_map_remove(&row->key.claim, row->lease_id);
			hash_search(fs_xact.claimed, &row->key, HASH_REMOVE, NULL);
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

	hash_seq_init(&seq, fs_xact.deltas);
	while ((delta = hash_seq_search(&seq)) != NULL)
		if (delta->key.subid == subid)
			hash_search(fs_xact.deltas, &delta->key, HASH_REMOVE, NULL);

	foreach(lc, fs_xact.releases)
		if (((FsRelease *) lfirst(lc))->subid != subid)
			keep = lappend(keep, lfirst(lc));
	fs_xact.releases = keep;

	keep = NIL;
	foreach(lc, fs_xact.events)
		if (((FsQueueEvent *) lfirst(lc))->subid != subid)
			keep = lappend(keep, lfirst(lc));
		else if (((FsQueueEvent *) lfirst(lc))->kind != FS_EVENT_TRUNCATED)
			fs_fair_invalidate_all();
	fs_xact.events = keep;
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

	hash_seq_init(&seq, fs_xact.deltas);
	while ((delta = hash_seq_search(&seq)) != NULL)
		if (delta->key.subid == subid)
			moved = lappend(moved, delta);
	foreach(lc, moved)
	{
		FsDelta    *from = lfirst(lc);
		FsDelta		copy = *from;

		hash_search(fs_xact.deltas, &from->key, HASH_REMOVE, NULL);
		copy.key.subid = parent;
		{
			FsDelta    *to;
			bool		found;

			to = hash_search(fs_xact.deltas, &copy.key, HASH_ENTER, &found);
			if (!found)
			{
				to->queue = copy.queue;
				to->rows = to->leaves = 0;
				to->charge = 0;
				to->added = false;
				to->reordered = false;
			}
			to->added |= copy.added;
			to->reordered |= copy.reordered;
			to->rows += copy.rows;
			to->leaves += copy.leaves;
			to->charge += copy.charge;
		}
	}
	list_free(moved);

	hash_seq_init(&seq, fs_xact.claimed);
	while ((row = hash_seq_search(&seq)) != NULL)
	{
		if (row->subid == subid)
			row->subid = parent;
		if (row->left_subid == subid)
			row->left_subid = parent;
	}
	for (int i = 0; i < fs_xact.nclaims; i++)
		if (fs_xact.claims[i].subid == subid)
			fs_xact.claims[i].subid = parent;
	foreach(lc, fs_xact.releases)
		if (((FsRelease *) lfirst(lc))->subid == subid)
			((FsRelease *) lfirst(lc))->subid = parent;
	foreach(lc, fs_xact.events)
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
	capacity = hash_get_num_entries(fs_xact.deltas) + hash_get_num_entries(fs_xact.claimed);
	if (capacity == 0)
		return;
	queues = palloc_extended(sizeof(FsQueue *) * capacity, MCXT_ALLOC_HUGE);
	hash_seq_init(&seq, fs_xact.deltas);
	while ((delta = hash_seq_search(&seq)) != NULL)
	{
		/* A ready row updated in place changes no count (probe starts only). */
		if (delta->rows == 0 && delta->leaves == 0 && delta->charge == 0 && !delta->added)
			continue;
		nqueues = fs_queue_set_add(queues, nqueues, delta->queue);
	}
	hash_seq_init(&seq, fs_xact.claimed);
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

	/*
	 * The transaction whose commit adds rows (fs_commit() runs once it is
	 * visible, when the xid may no longer be at hand).
	 */
	fs_xact.fxid = GetTopFullTransactionIdIfAny();

	/* Rows that left through the application's own claim, for fs_commit(). */
	if (hash_get_num_entries(fs_xact.deltas) > 0)
	{
		FS_FAULT_POINT("pre_commit");
		fs_xact.own_claims = MemoryContextAlloc(fs_xact.cxt,
										sizeof(FsOwnClaim) * hash_get_num_entries(fs_xact.deltas));
		fs_xact.n_own_claims = 0;
		hash_seq_init(&seq, fs_xact.deltas);
		while ((delta = hash_seq_search(&seq)) != NULL)
			if (delta->leaves != 0 && delta->key.tenant[0] != '\0')
				fs_xact.own_claims[fs_xact.n_own_claims++].delta = delta;
	}

	/*
	 * This runs in every transaction that wrote a registered table, so the
	 * common cases (only inserts; only claims) skip the empty table's scans.
	 */
	if (hash_get_num_entries(fs_xact.claimed) > 0)
	{
		TimestampTz now = fs_now();

		hash_seq_init(&seq, fs_xact.claimed);
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

	if (hash_get_num_entries(fs_xact.deltas) > 0)
	{
		hash_seq_init(&seq, fs_xact.deltas);
		while ((delta = hash_seq_search(&seq)) != NULL)
		{
			if (delta->rows > 0 && delta->key.tenant[0] != '\0')
			{
				FsTenantRef ref;

				if (fs_tenant_open(delta->queue, delta->key.tenant, FS_OPEN_CREATE, &ref) != NULL)
					fs_tenant_close(&ref);
			}
			/* Rows soon visible may sort below the tenant's probe start. */
			if ((delta->added || delta->reordered) && delta->key.tenant[0] != '\0')
				fs_probe_starts_committing(delta->queue, delta->key.tenant);
		}
	}

	/*
	 * The queues of registration events, looked up now: a lookup may add
	 * to this backend's cache (memory), which the commit itself must not.
	 */
	{
		ListCell   *lc;

		foreach(lc, fs_xact.events)
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

/* Order of the own claims applied at commit: by queue, then by tag (fair order). */
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

/* This transaction, if `delta` says it made rows ready (whatever the net). */
static FullTransactionId
fs_delta_adder(const FsDelta *delta)
{
	return delta->added ? fs_xact.fxid : InvalidFullTransactionId;
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

	for (i = 0; i < fs_xact.n_own_claims; i++)
	{
		FsDelta    *delta = fs_xact.own_claims[i].delta;
		FsTenantRef ref;
		FsTenant   *entry;

		fs_xact.own_claims[i].tag = 0;
		entry = fs_tenant_open(delta->queue, delta->key.tenant, FS_OPEN_NO_LIMITS, &ref);
		if (entry != NULL)
		{
			fs_tenant_lock(entry);
			fs_xact.own_claims[i].tag = entry->virtual_finish;
			fs_tenant_unlock(entry);
			fs_tenant_close(&ref);
		}
	}
	if (fs_xact.n_own_claims > 1)
		qsort(fs_xact.own_claims, fs_xact.n_own_claims, sizeof(FsOwnClaim), fs_own_claim_cmp);
	for (i = 0; i < fs_xact.n_own_claims; i++)
	{
		FsDelta    *delta = fs_xact.own_claims[i].delta;

		fs_fair_apply_backlog(delta->queue, delta->key.tenant, delta->rows,
							  delta->charge, delta->leaves, now, fs_delta_adder(delta));
	}
}

/* A committed delta's change of its leaf (subkeys.c). */
static void
fs_commit_leaf_delta(FsQueue *queue, const char *tenant, const char *subkey, int64 rows,
					 FullTransactionId adder)
{
	FsTenantChange c;

	fs_change_init(&c, 0);
	c.rows = c.rows_recounted = rows;
	c.resync_gen = fs_fair_queue(queue)->resync_gen;
	c.adder = adder;
	fs_leaf_apply(queue, tenant, subkey, &c);
}

/*
 * Apply a committed change of the rows of `tenant` (and its leaf `subkey`;
 * "" for none): `rows` more (fewer) ready rows, `added` if a row entered
 * the ready state, by the transaction `adder`; the tenant's own change too
 * unless `own_claims` (fs_apply_own_claims() makes it, in fair order).
 * A queue with a subkey: the leaf's rows too (subkeys.c).  Rows added reach
 * the leaf before the tenant, rows taken the tenant before the leaf, so
 * that a claim never sees the tenant with more rows than its leaves count
 * (it would take them as rows no leaf counts).  Nothing here may fail.
 */
static void
fs_commit_rows(FsQueue *queue, const char *tenant, const char *subkey, int64 rows, bool added,
			   FullTransactionId adder, bool own_claims)
{
	bool		leaf = tenant[0] != '\0' && subkey[0] != '\0' && (rows != 0 || added);

	if (leaf && rows > 0)
		fs_commit_leaf_delta(queue, tenant, subkey, rows, adder);
	if (tenant[0] == '\0')
		fs_fair_add_without_tenant(queue, rows, 0);
	else if (!own_claims && (rows != 0 || added))
		fs_fair_apply_backlog(queue, tenant, rows, 0, 0, 0, adder);
	if (leaf && rows <= 0)
		fs_commit_leaf_delta(queue, tenant, subkey, rows, adder);
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

	/* The transaction's rows are visible; nothing here has run yet. */
	FS_PAUSE_POINT("commit_visible");
	if (hash_get_num_entries(fs_xact.deltas) > 0)
	{
		hash_seq_init(&seq, fs_xact.deltas);
		while ((delta = hash_seq_search(&seq)) != NULL)
			fs_commit_rows(delta->queue, delta->key.tenant, delta->key.subkey, delta->rows,
						   delta->added, fs_delta_adder(delta), delta->leaves != 0);
		fs_apply_own_claims(fs_commit_now(&now));
	}

	if (hash_get_num_entries(fs_xact.claimed) > 0)
	{
		hash_seq_init(&seq, fs_xact.claimed);
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
			 * left is taken off instead.  A row still ready was not served:
			 * its tenant (and sub-key) get back the turn its claim charged,
			 * its cost over the weight, as a rollback gives it back (what
			 * the application's own conditions left, such as a job held by
			 * a uniqueness or priority rule, costs its tenant nothing).
			 */
			fs_change_init(&c, fs_commit_now(&now));
			c.rows = row->left_subid == 0 ? 1 : 0;
			c.rows_recounted = row->left_subid != 0 ? -1 : 0;
			c.resync_gen = row->resync_gen;
			if (row->left_subid == 0)
			{
				c.cost = -row->cost;
				c.served = -row->cost;
			}
			/* Its leaf first when a row comes back, after when one goes, as above. */
			if (row->subkey[0] != '\0' && c.rows > 0)
				fs_leaf_apply(row->queue, row->tenant, row->subkey, &c);
			fs_fair_change(row->queue, row->tenant, false, &c);
			if (row->subkey[0] != '\0' && c.rows <= 0)
				fs_leaf_apply(row->queue, row->tenant, row->subkey, &c);
		}
	}

	foreach(lc, fs_xact.releases)
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

	foreach(lc, fs_xact.events)
	{
		FsQueueEvent *event = lfirst(lc);
		FsQueue    *queue = event->queue;

		if (queue == NULL)
			continue;
		fs_fair_forget(queue);
		if (event->kind == FS_EVENT_UNREGISTERED)
			fs_claim_map_remove_queue(queue->queue_id);
	}
	foreach(lc, fs_xact.events)
		if (((FsQueueEvent *) lfirst(lc))->kind != FS_EVENT_TRUNCATED)
		{
			pg_atomic_add_fetch_u32(&fs_fair->registration_generation, 1);
			break;
		}
}

/*
 * The end of a commit's frame, once its changes are applied (fs_commit(),
 * or COMMIT PREPARED's after fs_fair_prepared_before()): its rows are
 * visible, so the probe starts they may be below are voided, and the
 * commit barriers are left.
 */
static void
fs_commit_frame_end(void)
{
	fs_probe_starts_xact_end();
	fs_barriers_leave_all();
	fs_xact_reset();
}

/* ----------------------------------------------------------------
 * Prepared transactions
 * ----------------------------------------------------------------
 */

/*
 * COMMIT PREPARED of a transaction that changed fs_fair_queues by SQL:
 * every backend reloads the registrations, as after a commit.
 */
static void
fs_fair_registrations_published(void)
{
	pg_atomic_add_fetch_u32(&fs_fair->registration_generation, 1);
}

/* FsParkedEffect.flags of a parked backlog change */
#define FS_PARKED_ROWS_ADDED		0x01	/* a row entered the ready state */
#define FS_PARKED_ROWS_REORDERED	0x02	/* a ready row moved in the order */
#define FS_PARKED_FORGET			0x04	/* the queue's table was truncated, or
											 * its registration changed: forgotten,
											 * recounted at next use */
#define FS_PARKED_UNREGISTERED		0x08	/* with FORGET: unregistered, its
											 * claims leave the claim map */

/* FsParkedEffect.flags of a parked claim's end */
#define FS_PARKED_RELEASED			0x01	/* its lease was released then */
#define FS_PARKED_CHARGE_RUNTIME	0x02	/* its held time is charged */

/* FsParkedEffect.data of a parked claim's end */
typedef struct FsParkedClaimEnd
{
	FsClaimKey	key;			/* its row in the claim map */
	float8		est_cost;		/* charged at claim */
} FsParkedClaimEnd;

StaticAssertDecl(sizeof(FsParkedClaimEnd) <= FS_PARKED_DATA,
				 "a claim's end must fit a parked effect");

/*
 * COMMIT PREPARED of a transaction that finished a claimed row's job (in
 * any backend): what fs_commit() does for it.  The row leaves the claim map;
 * a released lease is counted, and with charge_runtime its tenant is
 * charged the held time above the estimate, in fair order and budget.
 */
static void
fs_fair_prepared_claim_end(const FsParkedEffect *effect)
{
	FsQueue    *queue = fs_queue_by_id(effect->queue_id);
	FsParkedClaimEnd end;
	FsFairQueue *fq;

	if (queue == NULL)
		return;
	memcpy(&end, effect->data, sizeof(end));
	fs_claim_map_remove(&end.key, effect->object_id);
	if (!(effect->flags & FS_PARKED_RELEASED))
		return;
	fq = fs_fair_queue(queue);
	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	FS_FAIR_COUNT(fq, rows_released, 1);
	LWLockRelease(fq->lock);
	if (effect->flags & FS_PARKED_CHARGE_RUNTIME)
	{
		TimestampTz now = fs_now();
		float8		held_ms = effect->value;
		float8		extra = held_ms - end.est_cost;
		FsTenantChange c;

		fs_change_init(&c, now);
		c.resync_gen = fq->resync_gen;
		c.cost = extra;
		c.served = extra;
		fs_fair_change(queue, effect->tenant, false, &c);
		fs_fair_note_runtime(queue, held_ms);
		fs_budget_charge_committed(queue, effect->tenant, extra, now);
	}
}

/*
 * PREPARE TRANSACTION: a transaction that made rows ready (or updated ready
 * rows in place) parks its backlog changes, one per (tenant, sub-key), to
 * be applied when COMMIT PREPARED commits it, as fs_commit() applies them
 * (framed as fs_pre_commit() and the end of the transaction frame them:
 * fs_fair_prepared_before() and _after()); jobs it finished, tables it
 * truncated and registrations it changed are parked too.  ROLLBACK
 * PREPARED has nothing to undo.  A transaction that claimed rows, or took
 * ready rows itself, is refused: what those do at commit and rollback is
 * this backend's alone.
 */
static void
fs_fair_park_deltas(void)
{
	FsParkedEffect effects[FS_PREPARED_PARKED_PER_XACT + 1];
	FullTransactionId fxid = GetTopFullTransactionIdIfAny();
	bool		refused;
	int			n = 0;

	refused = fs_xact.nclaims > 0 || hash_get_num_entries(fs_xact.claimed) > 0;
	{
		ListCell   *lc;
		bool		registrations = false;

		/*
		 * Registrations changed (fs_register_queue(), fs_unregister_queue(),
		 * a dropped table, or fs_fair_queues by SQL, as fs_cluster_queues'
		 * trigger writes a Citus node's row in the transaction Citus
		 * prepares on every node) are published at COMMIT PREPARED; their
		 * queues' state is parked below, to be forgotten then.
		 */
		foreach(lc, fs_xact.events)
			if (((FsQueueEvent *) lfirst(lc))->kind != FS_EVENT_TRUNCATED)
				registrations = true;
		if (!refused && registrations)
			fs_prepared_note(FS_PREPARED_REGISTRATIONS);
	}
	if (!refused && hash_get_num_entries(fs_xact.deltas) > 0)
	{
		HASH_SEQ_STATUS seq;
		FsDelta    *delta;

		hash_seq_init(&seq, fs_xact.deltas);
		while ((delta = hash_seq_search(&seq)) != NULL)
		{
			if (delta->leaves != 0 || delta->charge != 0)
			{
				refused = true;
				hash_seq_term(&seq);
				break;
			}
			if (delta->rows == 0 && !delta->added && !delta->reordered)
				continue;
			/* More than may be parked: fs_prepared_park() says so. */
			if (n == FS_PREPARED_PARKED_PER_XACT + 1)
				continue;
			memset(&effects[n], 0, sizeof(FsParkedEffect));
			effects[n].kind = FS_PARKED_BACKLOG;
			effects[n].queue_id = delta->key.queue_id;
			strlcpy(effects[n].tenant, delta->key.tenant, FS_NAME_BUFLEN);
			strlcpy(effects[n].subkey, delta->key.subkey, FS_NAME_BUFLEN);
			effects[n].value = (float8) delta->rows;
			if (delta->added)
			{
				effects[n].flags |= FS_PARKED_ROWS_ADDED;
				effects[n].object_id = (int64) U64FromFullTransactionId(fxid);
			}
			if (delta->reordered)
				effects[n].flags |= FS_PARKED_ROWS_REORDERED;
			n++;
		}
	}
	/*
	 * A queue whose ready table was truncated or whose registration changed
	 * is forgotten once committed (recounted at next use), and an
	 * unregistered one's claims leave the claim map: one effect per queue.
	 */
	if (!refused)
	{
		ListCell   *lc;
		int			first = n;

		foreach(lc, fs_xact.events)
		{
			FsQueueEvent *event = lfirst(lc);
			FsQueue    *queue;
			int			e;

			if (event->queue_name[0] == '\0' ||
				(queue = fs_queue_lookup(event->queue_name, false)) == NULL)
				continue;
			for (e = first; e < n; e++)
				if (effects[e].queue_id == queue->queue_id)
					break;
			if (e == n)
			{
				if (n == FS_PREPARED_PARKED_PER_XACT + 1)
					break;
				memset(&effects[n], 0, sizeof(FsParkedEffect));
				effects[n].kind = FS_PARKED_BACKLOG;
				effects[n].queue_id = queue->queue_id;
				n++;
			}
			effects[e].flags |= FS_PARKED_FORGET |
				(event->kind == FS_EVENT_UNREGISTERED ? FS_PARKED_UNREGISTERED : 0);
		}
	}

	/*
	 * Jobs finished (their running rows left): each claim's end is parked
	 * (its lease's release is the slots layer's), to be settled at COMMIT
	 * PREPARED as fs_commit() settles it.  A ROLLBACK PREPARED leaves the
	 * claim as it was.
	 */
	if (!refused)
	{
		ListCell   *lc;

		foreach(lc, fs_xact.releases)
		{
			FsRelease  *rel = lfirst(lc);
			FsParkedClaimEnd end;

			if (n == FS_PREPARED_PARKED_PER_XACT + 1)
				break;
			memset(&effects[n], 0, sizeof(FsParkedEffect));
			effects[n].kind = FS_PARKED_CLAIM_RELEASE;
			effects[n].queue_id = rel->queue->queue_id;
			strlcpy(effects[n].tenant, rel->tenant, FS_NAME_BUFLEN);
			effects[n].object_id = rel->lease_id;
			effects[n].value = (float8) rel->held_usecs / 1000.0;
			effects[n].flags = (rel->released ? FS_PARKED_RELEASED : 0) |
				(rel->charge_runtime ? FS_PARKED_CHARGE_RUNTIME : 0);
			end.key = rel->key;
			end.est_cost = rel->est_cost;
			memcpy(effects[n].data, &end, sizeof(end));
			n++;
		}
	}
	if (refused)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot prepare a transaction that claimed or took rows of fair-dequeue queues"),
				 errhint("A prepared transaction may enqueue jobs, finish them and register queues; claim and take rows outside prepared transactions.")));
	fs_prepared_park(effects, n);
}

/*
 * Before COMMIT PREPARED commits a transaction that parked backlog changes
 * (in the backend that runs it): what fs_pre_commit() does before a commit.
 * Every tenant that gets rows has an entry, the probe starts its rows may
 * sort below are marked committing, and the queues' commit barriers are
 * entered; the end of the frame (fs_commit_frame_end(), or the abort
 * of a COMMIT PREPARED that fails) leaves them.
 */
static void
fs_fair_prepared_before(const FsParkedEffect *effects, int count)
{
	FsQueue   **queues;
	int			nqueues = 0;

	/* Its end would end this transaction's own changes with it. */
	if (fs_xact.active)
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("COMMIT PREPARED cannot run in a transaction that changed fair-dequeue queues"),
				 errhint("Run COMMIT PREPARED as a statement of its own.")));
	fs_xact_begin();
	queues = palloc(sizeof(FsQueue *) * Max(count, 1));
	for (int i = 0; i < count; i++)
	{
		const FsParkedEffect *e = &effects[i];
		FsQueue    *queue = fs_queue_by_id(e->queue_id);

		if (queue == NULL)
			continue;
		if (e->value > 0 && e->tenant[0] != '\0')
		{
			FsTenantRef ref;

			if (fs_tenant_open(queue, e->tenant, FS_OPEN_CREATE, &ref) != NULL)
				fs_tenant_close(&ref);
		}
		if ((e->flags & (FS_PARKED_ROWS_ADDED | FS_PARKED_ROWS_REORDERED)) && e->tenant[0] != '\0')
			fs_probe_starts_committing(queue, e->tenant);
		if (e->value != 0 || (e->flags & FS_PARKED_ROWS_ADDED))
			nqueues = fs_queue_set_add(queues, nqueues, queue);
	}
	fs_barriers_enter_in_order(queues, nqueues);
	pfree(queues);
}

/*
 * COMMIT PREPARED: apply one parked backlog change, as fs_commit() does,
 * inside the commit barrier its COMMIT PREPARED entered.  Without it (that
 * statement failed after the commit, or its backend is gone, and another
 * backend settles the transaction) the change cannot be applied exactly: a
 * recount may have counted the rows already, or count them before it is
 * applied.  The queue is then recounted at its next use instead.  Nothing
 * here may fail.
 */
static void
fs_fair_prepared_apply(const FsParkedEffect *effect)
{
	FsQueue    *queue = fs_queue_by_id(effect->queue_id);

	/* As fs_commit() settles a TRUNCATE or a registration: forgotten. */
	if (queue != NULL && (effect->flags & FS_PARKED_FORGET))
	{
		fs_fair_forget(queue);
		if (effect->flags & FS_PARKED_UNREGISTERED)
			fs_claim_map_remove_queue(queue->queue_id);
		return;
	}
	if (queue == NULL || (effect->value == 0 && !(effect->flags & FS_PARKED_ROWS_ADDED)))
		return;					/* nothing to count (probe starts only) */
	if (!fs_barrier_entered(queue))
	{
		fs_fair_count_again(queue);
		return;
	}
	fs_commit_rows(queue, effect->tenant, effect->subkey, (int64) effect->value,
				   (effect->flags & FS_PARKED_ROWS_ADDED) != 0,
				   (effect->flags & FS_PARKED_ROWS_ADDED) ?
				   FullTransactionIdFromU64((uint64) effect->object_id) : InvalidFullTransactionId,
				   false);
}


/*
 * Transaction end: at pre-commit, enter the commit barriers and compute what
 * to apply; at commit, apply it and leave them; at abort, undo what this
 * transaction's claims did to shared memory.
 */
static void
fs_track_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	if (!fs_xact.active)
		return;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			fs_pre_commit();
			break;
		case XACT_EVENT_COMMIT:
			fs_commit();
			fs_commit_frame_end();
			break;
		case XACT_EVENT_ABORT:
			fs_probe_starts_xact_end();
			fs_undo_claims(InvalidSubTransactionId);
			fs_barriers_leave_all();
			if (fs_xact.events != NIL)
				fs_fair_invalidate_all();
			fs_xact_reset();
			break;
		case XACT_EVENT_PRE_PREPARE:
			fs_fair_park_deltas();
			/* Nothing is entered before a PREPARE: this only makes sure. */
			fs_commit_frame_end();
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
	if (!fs_xact.active)
		return;

	switch (event)
	{
		case SUBXACT_EVENT_COMMIT_SUB:
			{
				MemoryContext old = MemoryContextSwitchTo(fs_xact.cxt);

				fs_merge_subxact(mySubid, parentSubid);
				MemoryContextSwitchTo(old);
			}
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			{
				MemoryContext old = MemoryContextSwitchTo(fs_xact.cxt);

				fs_undo_claims(mySubid);
				fs_drop_subxact(mySubid);
				MemoryContextSwitchTo(old);
			}
			break;
		default:
			break;
	}
}

/* Register the transaction callbacks that settle fair dequeue at transaction end. */
void
fs_track_init(void)
{
	RegisterXactCallback(fs_track_xact_callback, NULL);
	RegisterSubXactCallback(fs_track_subxact_callback, NULL);
	fs_prepared_on_settle(FS_PARKED_BACKLOG, fs_fair_prepared_apply, NULL);
	fs_prepared_on_settle(FS_PARKED_CLAIM_RELEASE, fs_fair_prepared_claim_end, NULL);
	fs_prepared_on_commit_prepared(FS_PARKED_BACKLOG, fs_fair_prepared_before,
								   fs_commit_frame_end);
	/* A transaction prepared with no note kept: its enqueues are recounted. */
	fs_prepared_on_commit(FS_PREPARED_COUNTS, fs_fair_count_again_all);
	fs_prepared_on_commit(FS_PREPARED_REGISTRATIONS, fs_fair_registrations_published);
}

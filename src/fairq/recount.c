/*-------------------------------------------------------------------------
 *
 * recount.c
 *	  Recounting a queue's backlog from its table (fs_resync() and the worker's recounts).
 *
 * See order.c for how fair dequeue works, and fairqueue_int.h for which
 * file does what.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"


#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "core/subxact.h"
#include "fairq/fairqueue_int.h"
#include "limits/limits.h"

PG_FUNCTION_INFO_V1(fs_resync);

/* ----------------------------------------------------------------
 * Recounting backlogs from the table
 * ----------------------------------------------------------------
 */

typedef struct FsCount
{
	char		name[FS_NAME_BUFLEN];	/* hash key */
	int64		rows;
	FsTenant   *entry;			/* its entry, once given one (else NULL) */
	uint32		generation;		/* of that entry */
} FsCount;

/*
 * A recount marks its queue `resyncing` and may close its commit barrier:
 * shared state that must not outlive the recount, however it ends.  An
 * error ends it through fs_fair_resync()'s PG_CATCH; a backend terminated
 * (pg_terminate_backend, shutdown) leaves through proc_exit() without
 * returning there, so the recount records its owner (pid and a generation)
 * and this backend's before_shmem_exit callback undoes what it still owns.
 * Should a backend vanish without running it, the next recount of the
 * queue takes the mark over from a pid no longer alive, and a committer
 * waiting at a barrier such a backend closed opens it.
 */
typedef struct FsOwnedResync
{
	FsFairQueue *fq;
	uint64		gen;
} FsOwnedResync;

#define FS_MAX_OWNED_RESYNCS	8	/* recounts nested in one backend */

static FsOwnedResync owned_resyncs[FS_MAX_OWNED_RESYNCS];
static int	nowned_resyncs = 0;
static bool resync_exit_registered = false;

/*
 * Undo the mark of a recount this backend owns (if it still owns it): the
 * queue is no longer being recounted and is counted again at its next use.
 */
static void
fs_fair_resync_disown(FsFairQueue *fq, uint64 gen)
{
	bool		held = LWLockHeldByMeInMode(fq->lock, LW_EXCLUSIVE);

	if (!held)
		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (fq->resyncing && fq->resync_pid == MyProcPid && fq->resync_owner_gen == gen)
	{
		fq->resyncing = false;
		fq->synced = false;
		fq->resync_pid = 0;
	}
	if (!held)
		LWLockRelease(fq->lock);
}

/* before_shmem_exit: undo whatever recount this backend leaves behind. */
static void
fs_fair_resync_exit(int code pg_attribute_unused(), Datum arg pg_attribute_unused())
{
	fs_commit_barrier_open_mine();
	while (nowned_resyncs > 0)
	{
		nowned_resyncs--;
		fs_fair_resync_disown(owned_resyncs[nowned_resyncs].fq,
							  owned_resyncs[nowned_resyncs].gen);
	}
}

/*
 * A tenant's live count when the recount took its snapshot.  The entry is
 * known by its address and generation: between the snapshot and the
 * adjustment it may leave the fair order, be evicted, and its memory be
 * reused by a tenant that enters it.
 */
typedef struct FsCountAt
{
	FsTenant   *tenant;
	uint32		generation;
	int64		rows;
} FsCountAt;

/* A queue with a subkey: its leaves at the snapshot, and as counted. */
typedef struct FsLeafRecount
{
	FsLeafCountAt *at;
	int32		nat;
	int32		capacity;
	FsLeafCount *counts;
	int32		ncounts;
} FsLeafRecount;

/* One tenant's adjustment by a recount: counted now, live at the snapshot. */
typedef struct FsAdjust
{
	FsTenant   *entry;
	uint32		generation;
	int64		counted;
	int64		live_at;
} FsAdjust;

/* Tenants adjusted per hold of the queue's lock by a recount. */
#define FS_RECOUNT_BATCH	256

/* The owner of `desc`'s ready table; an error if the table is gone. */
static Oid
fs_fair_table_owner(FsFairDesc *desc)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(desc->ready_relid));
	Oid			owner;

	if (!HeapTupleIsValid(tuple))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("the ready table of queue \"%s\" no longer exists", desc->queue_name),
				 errhint("Unregister the queue with fs_unregister_queue(), or register it again.")));
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	return owner;
}

/* Order of FsCountAt by entry address, then generation (for bsearch). */
static int
fs_count_at_cmp(const void *a, const void *b)
{
	const FsCountAt *ca = (const FsCountAt *) a;
	const FsCountAt *cb = (const FsCountAt *) b;
	uintptr_t	ta = (uintptr_t) ca->tenant;
	uintptr_t	tb = (uintptr_t) cb->tenant;

	if (ta != tb)
		return ta < tb ? -1 : 1;
	return ca->generation < cb->generation ? -1 : ca->generation > cb->generation ? 1 : 0;
}

/*
 * End a recount that did not adjust the counts: the queue is no longer
 * being recounted, and with `count_again` (the generation moved on, so
 * reservations made before it settle as if counted) it is counted again at
 * its next use.
 */
static void
fs_fair_resync_end(FsFairQueue *fq, bool count_again)
{
	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (fq->resync_pid == MyProcPid)
	{
		fq->resyncing = false;
		fq->resync_pid = 0;
	}
	if (count_again)
		fq->synced = false;
	LWLockRelease(fq->lock);
}

/*
 * The first half of a recount: snapshot and live counts with the barrier
 * closed, then the count query (its rows in SPI_tuptable).  False if the
 * barrier could not close.  On error the caller opens the barrier; nothing here
 * can fail while holding the queue's lock.
 */
static bool
fs_fair_resync_count(FsFairDesc *desc, FsFairQueue *fq, FsCountAt **at_p, int32 *nat,
					 uint64 *forget_gen, FsLeafRecount *leaves)
{
	int32		capacity;
	Oid			owner = fs_fair_table_owner(desc);

	LWLockAcquire(fq->lock, LW_SHARED);
	capacity = fq->nitems + 64;
	leaves->capacity = fq->nleaves + 64;
	LWLockRelease(fq->lock);
	FS_FAULT_POINT("recount_count");
	*at_p = palloc(sizeof(FsCountAt) * capacity);
	leaves->at = MemoryContextAllocHuge(CurrentMemoryContext,
										sizeof(FsLeafCountAt) * leaves->capacity);

	while (fs_commit_barrier_close(fq))
	{
		Snapshot	snapshot;
		FsCountAt  *at = *at_p;
		FsRunAs		run_as;
		int			ret;
		int32		i;
		int32		needed;

		/*
		 * Every tenant in the fair order needs its live count: one left out
		 * would be adjusted as if it had none and counted twice.  The order
		 * may have grown since the array was sized; then size it again (not
		 * under the lock: an error there would leave it held) and close the
		 * barrier again.
		 */
		snapshot = RegisterSnapshot(GetLatestSnapshot());
		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		if (fq->nitems > capacity)
		{
			capacity = fq->nitems * 2 + 64;
			LWLockRelease(fq->lock);
			fs_commit_barrier_open(fq);
			UnregisterSnapshot(snapshot);
			*at_p = repalloc(*at_p, sizeof(FsCountAt) * capacity);
			continue;
		}
		if (desc->subkey != NULL &&
			!fs_leaves_snapshot(fq, desc->queue->queue_id, leaves->at, leaves->capacity,
								&leaves->nat, &needed))
		{
			/* More leaves than room: as for tenants, size again. */
			LWLockRelease(fq->lock);
			fs_commit_barrier_open(fq);
			UnregisterSnapshot(snapshot);
			leaves->capacity = needed * 2 + 64;
			leaves->at = repalloc_huge(leaves->at, sizeof(FsLeafCountAt) * leaves->capacity);
			continue;
		}
		*forget_gen = fq->forget_gen;
		for (i = 0; i < fq->nitems; i++)
		{
			FsTenant   *entry = fs_heap_at(fq, i)->tenant;

			at[*nat].tenant = entry;
			at[*nat].generation = entry->generation;
			fs_tenant_lock(entry);
			at[*nat].rows = entry->ready_rows;
			fs_tenant_unlock(entry);
			(*nat)++;
		}
		fq->resync_gen++;
		LWLockRelease(fq->lock);
		fs_commit_barrier_open(fq);
		/* Rows no trigger saw may be below a start (probe_start.c). */
		fs_probe_starts_clear(&fq->probe_starts);

		/*
		 * The count evaluates the registrant's expressions and the table's
		 * row-level security policies: run it as the ready table's owner in
		 * a read-only security-restricted operation (run_as.c), so that a
		 * recount by a superuser or the background worker gives the owner's
		 * code no more privilege than the owner has, and nothing it does
		 * outlives the count.  (On error, the abort puts the user back.)
		 */
		fs_run_as_begin(&run_as, owner, FS_RUN_AS_READ_ONLY);
		ret = SPI_execute_snapshot(desc->count_plan, NULL, NULL, snapshot, InvalidSnapshot,
								   true, false, 0);
		fs_run_as_end(&run_as);
		UnregisterSnapshot(snapshot);
		if (ret != SPI_OK_SELECT)
			elog(ERROR, "fair dequeue count query failed: %s", SPI_result_code_string(ret));
		return true;
	}
	return false;
}

/*
 * fs_fair_resync_count(), with an error of the count query reported by
 * queue and piece, without the query (the recount's own cleanup is
 * fs_fair_resync()'s).
 */
static bool
fs_fair_resync_count_reported(FsFairDesc *desc, FsFairQueue *fq, FsCountAt **at_p, int32 *nat,
							  uint64 *forget_gen, FsLeafRecount *leaves)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool counted = false;

	PG_TRY();
	{
		counted = fs_fair_resync_count(desc, fq, at_p, nat, forget_gen, leaves);
	}
	PG_CATCH();
	{
		fs_fair_query_error(cxt, desc, &desc->count_q, "count query");
	}
	PG_END_TRY();
	return counted;
}

/*
 * The counted rows of the count query's result (SPI_tuptable), per tenant:
 * a hash of FsCount by name.  Rows whose tenant is NULL or not a valid name
 * are never claimed: they add to *without.
 */
static HTAB *
fs_recount_read(int64 *without, FsLeafRecount *leaves)
{
	HASHCTL		info;
	HTAB	   *counts;
	uint64		r;

	memset(&info, 0, sizeof(info));
	info.keysize = FS_NAME_BUFLEN;
	info.entrysize = sizeof(FsCount);
	info.hcxt = CurrentMemoryContext;
	counts = hash_create("fairshare recount", Max(SPI_processed, 16), &info,
						 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	if (leaves != NULL)
	{
		leaves->counts = MemoryContextAllocHuge(CurrentMemoryContext,
												sizeof(FsLeafCount) * Max(SPI_processed, 1));
		leaves->ncounts = 0;
	}
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[r];
		bool		name_null;
		bool		rows_null;
		Datum		name = SPI_getbinval(tuple, SPI_tuptable->tupdesc, 1, &name_null);
		int64		rows = DatumGetInt64(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 2, &rows_null));
		text	   *t;
		int			len;
		char		buf[FS_NAME_BUFLEN];
		FsCount    *c;
		bool		found;

		if (name_null)
		{
			*without += rows;
			continue;
		}
		t = DatumGetTextPP(name);
		len = VARSIZE_ANY_EXHDR(t);
		if (len == 0 || len > FS_NAME_MAXLEN || (len == 1 && *VARDATA_ANY(t) == '*'))
		{
			*without += rows;
			continue;
		}
		memcpy(buf, VARDATA_ANY(t), len);
		buf[len] = '\0';
		FS_FAULT_POINT("recount_apply");
		c = hash_search(counts, buf, HASH_ENTER, &found);
		if (!found)
		{
			c->rows = 0;
			c->entry = NULL;
		}
		c->rows += rows;
		if (leaves != NULL)
		{
			/* With a subkey, one row per leaf: its sub-key is the third column. */
			FsLeafCount *l = &leaves->counts[leaves->ncounts++];
			bool		subkey_null;
			Datum		subkey = SPI_getbinval(tuple, SPI_tuptable->tupdesc, 3, &subkey_null);

			strlcpy(l->tenant, buf, FS_NAME_BUFLEN);
			fs_subkey_name(subkey, subkey_null, l->subkey);
			l->rows = rows;
		}
	}
	return counts;
}

/*
 * Every counted tenant gets an entry, pinned in the fair order; unless the
 * queue was forgotten since the snapshot (then it stops: the caller sees
 * it), which would leave them pinned with counts that do not add up.  Rows
 * of tenants shared memory has no room for add to *untracked.
 */
static void
fs_recount_pin(FsFairDesc *desc, FsFairQueue *fq, HTAB *counts, uint64 forget_gen,
			   int64 *untracked)
{
	HASH_SEQ_STATUS seq;
	FsCount    *c;

	hash_seq_init(&seq, counts);
	while ((c = hash_seq_search(&seq)) != NULL)
	{
		FsTenantRef ref;
		FsTenant   *entry = fs_tenant_open(desc->queue, c->name, FS_OPEN_CREATE, &ref);
		bool		forgotten;

		if (entry == NULL)
		{
			*untracked += c->rows;
			c->rows = 0;
			continue;
		}
		c->entry = entry;
		c->generation = entry->generation;	/* set when the entry was made */
		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		forgotten = fq->forget_gen != forget_gen;
		if (!forgotten)
			fs_fair_enqueue_locked(fq, entry, true);
		LWLockRelease(fq->lock);
		fs_tenant_close(&ref);
		if (forgotten)
		{
			hash_seq_term(&seq);
			break;
		}
	}
}

/*
 * What to adjust: every tenant that had rows at the snapshot (`at`, sorted
 * here) and every counted one, each once, by what it was off.  All are
 * pinned in the fair order while the queue is being recounted (a tenant
 * leaves it only when drained, which a recount holds back, or when the
 * queue is forgotten, which is checked), but for a counted tenant whose
 * push failed; an entry is matched by its generation, so a reused one is
 * never taken for the tenant it was.  Returns the list, its length in
 * *nlist.
 */
static FsAdjust *
fs_recount_adjustments(HTAB *counts, FsCountAt *at, int32 nat, int32 *nlist)
{
	HASH_SEQ_STATUS seq;
	FsCount    *c;
	FsAdjust   *list;
	bool	   *matched;
	int32		i;

	qsort(at, nat, sizeof(FsCountAt), fs_count_at_cmp);
	list = palloc(sizeof(FsAdjust) * ((Size) nat + hash_get_num_entries(counts)));
	matched = palloc0(sizeof(bool) * Max(nat, 1));
	*nlist = 0;
	hash_seq_init(&seq, counts);
	while ((c = hash_seq_search(&seq)) != NULL)
	{
		FsCountAt	key;
		FsCountAt  *found;
		FsAdjust   *a;

		if (c->entry == NULL)
			continue;
		key.tenant = c->entry;
		key.generation = c->generation;
		found = bsearch(&key, at, nat, sizeof(FsCountAt), fs_count_at_cmp);
		a = &list[(*nlist)++];
		a->entry = c->entry;
		a->generation = c->generation;
		a->counted = c->rows;
		a->live_at = found != NULL ? found->rows : 0;
		if (found != NULL)
			matched[found - at] = true;
	}
	for (i = 0; i < nat; i++)
		if (!matched[i])
		{
			FsAdjust   *a = &list[(*nlist)++];

			a->entry = at[i].tenant;
			a->generation = at[i].generation;
			a->counted = 0;
			a->live_at = at[i].rows;
		}
	pfree(matched);
	return list;
}

/*
 * The second half of a recount: give every counted tenant an entry in the
 * fair order and adjust each tenant by what it was off at the snapshot.
 * Returns the ready rows counted, or -1 if the queue was forgotten meanwhile.
 */
static int64
fs_fair_resync_apply(FsFairDesc *desc, FsFairQueue *fq, FsCountAt *at, int32 nat,
					 uint64 forget_gen, int *tenants, FsLeafRecount *leaves)
{
	HTAB	   *counts;
	int64		total = 0;
	int64		without = 0;
	int64		untracked = 0;
	int			ntenants = 0;
	int32		i;
	int32		k;
	FsAdjust   *list;
	int32		nlist;

	counts = fs_recount_read(&without, desc->subkey != NULL ? leaves : NULL);
	fs_recount_pin(desc, fq, counts, forget_gen, &untracked);
	list = fs_recount_adjustments(counts, at, nat, &nlist);

	/*
	 * Adjusted a batch at a time, the queue's lock held for one batch: the
	 * adjustments are deltas, so claims and commits in between lose nothing
	 * (reservations made since the snapshot stand as they are).  A queue
	 * forgotten meanwhile (TRUNCATE, a new registration) had its counts
	 * zeroed after the snapshot: the adjustment would not add up, and it is
	 * counted again at its next use.
	 */
	for (k = 0;; k += FS_RECOUNT_BATCH)
	{
		int32		end = Min(k + FS_RECOUNT_BATCH, nlist);

		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		if (fq->forget_gen != forget_gen)
		{
			LWLockRelease(fq->lock);
			fs_fair_resync_end(fq, true);
			hash_destroy(counts);
			return -1;
		}
		if (k >= nlist)
			break;				/* with the lock held, to finish below */
		for (i = k; i < end; i++)
		{
			FsAdjust   *a = &list[i];
			int32		pos = fs_heap_find(fq, a->entry);

			if (pos < 0 || a->entry->generation != a->generation)
				continue;
			fs_tenant_lock(a->entry);
			/* Not clamped: claims reserved since the snapshot may exceed it. */
			fs_tenant_backlog_add(a->entry, a->counted - a->live_at, true);
			fs_tenant_unlock(a->entry);
			fs_heap_at(fq, pos)->dry_until = 0;
			if (a->counted > 0)
			{
				total += a->counted;
				ntenants++;
			}
		}
		LWLockRelease(fq->lock);
	}
	if (desc->subkey != NULL)
	{
		/*
		 * The leaves, adjusted as tenants are, while the lock is held and
		 * the queue is still marked as being recounted (no leaf of it is
		 * removed to make room meanwhile); then each back in its order, or
		 * out of the table without rows.
		 */
		fs_leaves_recounted(fq, desc->queue->queue_id, leaves->counts, leaves->ncounts,
							leaves->at, leaves->nat);
	}
	else
	{
		/*
		 * Registered without a subkey now: leaves that transactions of its
		 * former registration made after it was forgotten go.
		 */
		fs_leaves_forget(fq, desc->queue->queue_id);
	}
	fq->resyncing = false;
	fq->resync_pid = 0;
	fq->synced = !fq->count_again;
	fq->count_again = false;
	if (desc->subkey != NULL)
		fs_leaves_settle_all(fq, desc->queue->queue_id);
	fs_fair_set_outside(fq, without, untracked);
	fq->last_resync_at = GetCurrentTimestamp();
	FS_FAIR_COUNT(fq, resyncs, 1);
	LWLockRelease(fq->lock);

	hash_destroy(counts);
	if (tenants != NULL)
		*tenants = ntenants;
	return total;
}

/*
 * Recount the ready rows of every tenant of `desc`'s queue from its table
 * (with `if_unsynced`, only if it was not counted in this server run yet).
 * Returns the number of ready rows (with a valid tenant), or -1 if another
 * recount of the queue is running, or commits did not let the barrier close.
 * Needs SPI connected.  Takes no table lock: writers and claimers go on.
 *
 * With the barrier closed, the snapshot is taken and each backlogged tenant's
 * live count copied, and the recount generation moves on: reservations made
 * before it no longer stand (the count has their rows), later ones do.  The
 * table is counted with that snapshot; then each tenant's count is adjusted
 * by (counted - live count at the snapshot), which keeps every change
 * applied since.  A recount inside fs_claim() follows the caller's snapshot
 * no more than a background one does: it always counts the latest committed
 * state.
 */
/* Both halves of a recount; false if the barrier could not close. */
static bool
fs_fair_resync_run(FsFairDesc *desc, FsFairQueue *fq, int *tenants, int64 *total)
{
	FsCountAt  *at;
	int32		nat = 0;
	uint64		forget_gen = 0;
	FsLeafRecount leaves;

	memset(&leaves, 0, sizeof(leaves));
	if (!fs_fair_resync_count_reported(desc, fq, &at, &nat, &forget_gen, &leaves))
		return false;
	*total = fs_fair_resync_apply(desc, fq, at, nat, forget_gen, tenants, &leaves);
	return true;
}

/*
 * Mark `fq` as being recounted by this backend; false if another live
 * backend is recounting it (or, with `if_unsynced`, it is counted).  A mark
 * left by a backend that is gone is taken over, with the barrier it may have
 * left closed.
 */
static bool
fs_fair_resync_begin(FsFairQueue *fq, bool if_unsynced)
{
	static uint64 resync_seq = 0;
	int			owner = 0;
	uint64		owner_gen = 0;
	bool		taken_over;

	if (!resync_exit_registered)
	{
		before_shmem_exit(fs_fair_resync_exit, (Datum) 0);
		resync_exit_registered = true;
	}
	if (nowned_resyncs == FS_MAX_OWNED_RESYNCS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many nested recounts of fair-dequeue queues"),
				 errhint("Do not call fs_resync() or fs_claim() from a registered expression or a policy of a ready table.")));

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (fq->resyncing && !(if_unsynced && fq->synced))
	{
		owner = fq->resync_pid;
		owner_gen = fq->resync_owner_gen;
		LWLockRelease(fq->lock);
		/* Not under the lock: BackendPidGetProc() takes ProcArrayLock. */
		if (!fs_fair_owner_gone(owner))
			return false;
		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		if (fq->resyncing && (fq->resync_pid != owner || fq->resync_owner_gen != owner_gen))
		{
			LWLockRelease(fq->lock);
			return false;		/* someone else took it over first */
		}
	}
	if (if_unsynced && fq->synced)
	{
		LWLockRelease(fq->lock);
		return false;
	}
	taken_over = fq->resyncing;
	fq->resyncing = true;
	fq->count_again = false;
	fq->resync_pid = MyProcPid;
	fq->resync_owner_gen = ++resync_seq;
	owned_resyncs[nowned_resyncs].fq = fq;
	owned_resyncs[nowned_resyncs].gen = fq->resync_owner_gen;
	nowned_resyncs++;
	LWLockRelease(fq->lock);

	if (taken_over)
	{
		/* The gone backend may have left the barrier closed, too. */
		fs_commit_barrier_open(fq);
		ereport(LOG,
				(errmsg("took over the recount of a fair-dequeue queue from backend %d, which is gone",
						owner)));
	}
	return true;
}

/* Forget this backend's record of its innermost recount. */
static void
fs_fair_resync_forget_owned(FsFairQueue *fq)
{
	if (nowned_resyncs > 0 && owned_resyncs[nowned_resyncs - 1].fq == fq)
		nowned_resyncs--;
}

/*
 * Recount a queue's backlog from its table (both halves,
 * fs_fair_resync_run()), unless another recount runs or, with if_unsynced,
 * the queue is in sync. Returns the rows counted, or -1 when it did not
 * recount.
 */
int64
fs_fair_resync(FsFairDesc *desc, bool if_unsynced, int *tenants)
{
	FsFairQueue *fq = desc->fq;
	bool		barrier_closed;
	int64		total = -1;

	if (fq == NULL)
		return -1;
	if (!fs_fair_resync_begin(fq, if_unsynced))
		return -1;

	PG_TRY();
	{
		barrier_closed = fs_fair_resync_run(desc, fq, tenants, &total);
	}
	PG_CATCH();
	{
		fs_commit_barrier_open(fq);	/* if the error came with it closed */
		fs_fair_resync_end(fq, true);
		fs_fair_resync_forget_owned(fq);
		PG_RE_THROW();
	}
	PG_END_TRY();
	fs_fair_resync_forget_owned(fq);

	if (!barrier_closed)
	{
		fs_fair_resync_end(fq, false);
		ereport(WARNING,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not recount queue \"%s\": its commits did not pause", desc->queue_name),
				 errhint("It is recounted at its next use, or by fs_resync().")));
	}
	return total;
}

/* What fs_fair_resync_one() works on. */
typedef struct FsResyncArgs
{
	const char *queue_name;
	bool		owned_only;
	bool		done;
	int		   *tenants;
	int64	   *rows;
} FsResyncArgs;

/* fs_fair_resync_guarded()'s work, in its subtransaction. */
static void
fs_fair_resync_one(void *arg)
{
	FsResyncArgs *a = (FsResyncArgs *) arg;
	FsFairDesc *desc = fs_fair_desc(a->queue_name, true);

	if (desc != NULL && (!a->owned_only || fs_class_ownercheck(desc->ready_relid, GetUserId())))
	{
		*a->rows = fs_fair_resync(desc, false, a->tenants);
		a->done = true;
	}
}

/*
 * Recount one queue in a subtransaction: false (after a WARNING) if it
 * failed, say because its table was dropped or its expressions fail on
 * some row, so that a recount of every queue goes on with the others.  A
 * cancel, a timeout or running out of memory is not such a failure: it
 * stops the whole statement (subxact.c).  With `owned_only`, a queue whose
 * table the caller does not own is skipped (false, silently).  Needs SPI
 * connected.
 */
static bool
fs_fair_resync_guarded(const char *queue_name, bool owned_only, int *tenants, int64 *rows)
{
	FsResyncArgs args = {queue_name, owned_only, false, tenants, rows};
	ErrorData  *edata;

	if (fs_subxact_run(fs_fair_resync_one, &args, NULL, &edata))
		return args.done;
	ereport(WARNING,
			(errcode(edata->sqlerrcode),
			 errmsg("could not recount queue \"%s\": %s", queue_name, edata->message),
			 errhint("Fix or unregister the queue; the other queues are recounted.")));
	FreeErrorData(edata);
	return false;
}

/*
 * fs_resync(queue text DEFAULT NULL)
 *	 RETURNS TABLE(queue text, tenants int, ready_rows bigint)
 *
 * Recount now; NULL recounts every registered queue of this database.
 */
Datum
fs_resync(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo;
	List	   *queues;
	ListCell   *lc;

	fs_check_primary("recount a fairshare queue");
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (PG_ARGISNULL(0))
		queues = fs_fair_registered_queues();
	else
	{
		char		name[FS_NAME_BUFLEN];

		fs_name_arg(fcinfo, 0, "queue", name);
		queues = list_make1(pstrdup(name));
	}

	foreach(lc, queues)
	{
		const char *queue_name = (const char *) lfirst(lc);
		Datum		values[3];
		bool		nulls[3] = {false, false, false};
		int			tenants = 0;
		int64		rows;

		if (PG_ARGISNULL(0))
		{
			/* Every queue the caller owns; one failing does not stop the rest. */
			if (!fs_fair_resync_guarded(queue_name, true, &tenants, &rows))
				continue;
		}
		else
		{
			FsFairDesc *desc = fs_fair_desc(queue_name, false);

			fs_fair_check_owner(desc->ready_relid, desc->queue_name);
			rows = fs_fair_resync(desc, false, &tenants);
		}
		values[0] = CStringGetTextDatum(queue_name);
		values[1] = Int32GetDatum(tenants);
		values[2] = Int64GetDatum(rows);
		nulls[2] = rows < 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	SPI_finish();
	return (Datum) 0;
}

/*
 * The background worker's periodic recount: forget stale claim-map entries,
 * then recount each registered queue of this database that needs it; returns
 * how many were recounted.
 */
int
fs_fairqueue_resync_all(void)
{
	List	   *queues;
	ListCell   *lc;
	int			done = 0;

	if (fs_fair == NULL)
		return 0;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	(void) fs_claim_map_sweep(false);
	queues = fs_fair_registered_queues();

	foreach(lc, queues)
	{
		int			tenants = 0;
		int64		rows = 0;

		if (fs_fair_resync_guarded((const char *) lfirst(lc), false, &tenants, &rows) && rows >= 0)
			done++;
	}
	SPI_finish();
	return done;
}

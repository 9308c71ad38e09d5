/*-------------------------------------------------------------------------
 *
 * runs.c
 *	  A schedule's due runs and taking them, exactly once each: the due
 *	  runs and catch-up, taking runs a page at a time (the ledger rows, the
 *	  advance), fs_claim_due_schedules(), and the worker's bookkeeping of
 *	  runs that ended (see schedules.c for the whole picture).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "core/cluster.h"
#include "core/subxact.h"
#include "limits/limits.h"
#include "schedules/cron_sql.h"
#include "schedules/schedules_int.h"

PG_FUNCTION_INFO_V1(fs_claim_due_schedules);

/* ----------------------------------------------------------------
 * Due runs and catch-up
 * ----------------------------------------------------------------
 */

/* What one take does with one schedule. */
typedef struct FsDue
{
	int			nruns;			/* runs to hand out, in order */
	TimestampTz runs[FS_CATCHUP_ALL_CAP];
	bool		skipped;		/* 'skip' dropped the run at last_for */
	bool		has_missed;		/* runs before the first were dropped ... */
	TimestampTz missed_since;	/* ... from this one on */
	bool		has_last;
	TimestampTz last_for;		/* the last instant handled: the new base */
	bool		has_next;
	TimestampTz next;			/* the new next_run_at (none: never again) */
	const char *error;			/* the schedule cannot be computed any more */
} FsDue;

typedef struct FsStepper
{
	const FsCron *cron;
	pg_tz	   *zone;
	bool		failed;
} FsStepper;

/* The first run after `after`; DT_NOEND when there is none. */
static TimestampTz
fs_step(FsStepper *st, TimestampTz after)
{
	TimestampTz next;

	switch (fs_cron_next_run(st->cron, st->zone, after, &next))
	{
		case FS_NEXT_RUN_FOUND:
			return next;
		case FS_NEXT_RUN_NEVER:
			return DT_NOEND;
		case FS_NEXT_RUN_FAILED:
			st->failed = true;
			break;
	}
	return DT_NOEND;
}

/* Runs in (x, as_of], counted up to limit. */
static int
fs_count_runs(FsStepper *st, TimestampTz x, TimestampTz as_of, int limit)
{
	int			n = 0;
	TimestampTz t = fs_step(st, x);

	while (t <= as_of && n < limit)
	{
		n++;
		t = fs_step(st, t);
	}
	return n;
}

/*
 * The runs due at as_of for a schedule whose next pending run is `pending`.
 * Searches are bounded: the latest due run and the start of the last
 * FS_CATCHUP_ALL_CAP ones are found by bisection on the time axis (runs
 * are whole seconds), never by walking every missed run.
 */
static void
fs_due_runs(FsStepper *st, FsCatchup catchup, TimestampTz pending, TimestampTz as_of,
			FsDue *due)
{
	TimestampTz first;
	TimestampTz latest;
	TimestampTz lo;
	TimestampTz hi;

	memset(due, 0, sizeof(*due));

	/* `pending` is a run unless the zone's rules changed under it. */
	first = fs_step(st, pending - 1);
	if (st->failed)
		return;
	if (first > as_of)
	{
		/* Nothing is due after all: only move next_run_at to the truth. */
		due->has_next = first != DT_NOEND;
		due->next = first;
		return;
	}

	/* latest = the last run <= as_of: the largest lo with step(lo) <= as_of. */
	lo = first;
	latest = fs_step(st, first);
	if (latest <= as_of)
	{
		hi = as_of;
		while (hi - lo > USECS_PER_SEC && !st->failed)
		{
			TimestampTz mid = lo + (hi - lo) / 2;

			if (fs_step(st, mid) <= as_of)
				lo = mid;
			else
				hi = mid;
		}
		latest = fs_step(st, lo);
	}
	else
		latest = first;

	due->has_last = true;
	due->last_for = latest;
	due->next = fs_step(st, latest);
	due->has_next = due->next != DT_NOEND;

	switch (catchup)
	{
		case FS_CATCHUP_LATEST:
			due->runs[due->nruns++] = latest;
			break;
		case FS_CATCHUP_SKIP:
			if (as_of - latest <= (TimestampTz) fs_catchup_tolerance_secs * USECS_PER_SEC)
				due->runs[due->nruns++] = latest;
			else
				due->skipped = true;
			break;
		case FS_CATCHUP_ALL:
			if (fs_count_runs(st, pending - 1, as_of, FS_CATCHUP_ALL_CAP + 1) <= FS_CATCHUP_ALL_CAP)
				lo = pending - 1;
			else
			{
				/* The last CAP runs start after the largest lo with CAP runs in (lo, as_of]. */
				lo = first;
				hi = latest;
				while (hi - lo > USECS_PER_SEC && !st->failed)
				{
					TimestampTz mid = lo + (hi - lo) / 2;

					if (fs_count_runs(st, mid, as_of, FS_CATCHUP_ALL_CAP) >= FS_CATCHUP_ALL_CAP)
						lo = mid;
					else
						hi = mid;
				}
			}
			for (hi = fs_step(st, lo); hi <= as_of && due->nruns < FS_CATCHUP_ALL_CAP;
				 hi = fs_step(st, hi))
				due->runs[due->nruns++] = hi;
			break;
	}
	if ((due->nruns > 0 && due->runs[0] != first) || (due->skipped && latest != first))
	{
		due->has_missed = true;
		due->missed_since = first;
	}
}

/* ----------------------------------------------------------------
 * Taking runs
 * ----------------------------------------------------------------
 */

/* Rows for the ledger insert and the schedule update, as arrays. */
typedef struct FsTakeBatch
{
	int			nledger;
	Datum	   *l_id;
	Datum	   *l_for;
	Datum	   *l_owner_oid;
	Datum	   *l_owner;
	Datum	   *l_name;
	Datum	   *l_state;
	Datum	   *l_missed;
	bool	   *l_missed_null;
	int		   *l_source;		/* row of the due query; -1 for 'skipped' rows */

	int			nadvance;
	Datum	   *a_id;
	Datum	   *a_next;
	bool	   *a_next_null;
	Datum	   *a_last;
	bool	   *a_last_null;
	Datum	   *a_state;
	bool	   *a_state_null;
	Datum	   *a_error;
	bool	   *a_error_null;
} FsTakeBatch;

/*
 * Make room for one page of a take: the ledger rows of `max_ledger` runs
 * and the advances of `nschedules` schedules, all allocated before anything
 * is written.
 */
static void
fs_batch_init(FsTakeBatch *b, Size nschedules, Size max_ledger)
{
	memset(b, 0, sizeof(*b));
	FS_FAULT_POINT("schedule_claim");
	b->l_id = palloc(sizeof(Datum) * max_ledger);
	b->l_for = palloc(sizeof(Datum) * max_ledger);
	b->l_owner_oid = palloc(sizeof(Datum) * max_ledger);
	b->l_owner = palloc(sizeof(Datum) * max_ledger);
	b->l_name = palloc(sizeof(Datum) * max_ledger);
	b->l_state = palloc(sizeof(Datum) * max_ledger);
	b->l_missed = palloc(sizeof(Datum) * max_ledger);
	b->l_missed_null = palloc(sizeof(bool) * max_ledger);
	b->l_source = palloc(sizeof(int) * max_ledger);
	b->a_id = palloc(sizeof(Datum) * nschedules);
	b->a_next = palloc(sizeof(Datum) * nschedules);
	b->a_next_null = palloc(sizeof(bool) * nschedules);
	b->a_last = palloc(sizeof(Datum) * nschedules);
	b->a_last_null = palloc(sizeof(bool) * nschedules);
	b->a_state = palloc(sizeof(Datum) * nschedules);
	b->a_state_null = palloc(sizeof(bool) * nschedules);
	b->a_error = palloc(sizeof(Datum) * nschedules);
	b->a_error_null = palloc(sizeof(bool) * nschedules);
}

/*
 * Add a run to a take page's ledger rows (written in one statement with the
 * page's advances).
 */
static void
fs_batch_ledger(FsTakeBatch *b, Datum id, TimestampTz t, Datum owner_oid, Datum owner,
				Datum name, const char *state, bool has_missed, TimestampTz missed_since,
				int source)
{
	int			i = b->nledger++;

	b->l_id[i] = id;
	b->l_for[i] = TimestampTzGetDatum(t);
	b->l_owner_oid[i] = owner_oid;
	b->l_owner[i] = owner;
	b->l_name[i] = name;
	b->l_state[i] = CStringGetTextDatum(state);
	b->l_missed[i] = TimestampTzGetDatum(missed_since);
	b->l_missed_null[i] = !has_missed;
	b->l_source[i] = source;
}

/* A one-dimensional array of `n` values of `elemtype`, as a Datum. */
static Datum
fs_array(Datum *values, bool *nulls, int n, Oid elemtype)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			dims[1] = {n};
	int			lbs[1] = {1};

	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_md_array(values, nulls, 1, dims, lbs, elemtype,
											  typlen, typbyval, typalign));
}

/* Key of a ledger row, to find which rows a take inserted. */
typedef struct FsRunKey
{
	int64		schedule_id;
	TimestampTz scheduled_for;
} FsRunKey;

/* fs_subxact_run() work: the plain insert of the ledger rows. */
static void
fs_insert_ledger_plain(void *arg)
{
	fs_execute(Q_LEDGER, (Datum *) arg, NULL, false, 0);
}

/* The only error the plain insert may end with: a row already there. */
static bool
fs_ledger_catches(int sqlerrcode)
{
	return sqlerrcode == ERRCODE_UNIQUE_VIOLATION;
}

/*
 * Insert the ledger rows.  Normally none exists yet, and a plain insert is
 * much cheaper than ON CONFLICT; if one does (next_run_at was moved back by
 * hand), the plain insert fails, is rolled back, and the rows are inserted
 * again skipping those already there.  Returns NULL when every row was
 * inserted, or the set (FsRunKey) of the rows that were.
 */
static HTAB *
fs_insert_ledger(Datum *args)
{
	HASHCTL		ctl;
	HTAB	   *inserted;
	uint64		r;
	ErrorData  *edata;

	/*
	 * In a subtransaction that is rolled back on any error; a unique
	 * violation is ours to handle, and every other error (a lock_timeout,
	 * a cancel, a deadlock) is re-thrown only after the rollback, so the
	 * caller's transaction is left as PostgreSQL expects it.
	 */
	if (fs_subxact_run(fs_insert_ledger_plain, args, fs_ledger_catches, &edata))
		return NULL;
	FreeErrorData(edata);

	fs_execute(Q_LEDGER_CHECKED, args, NULL, false, 0);
	ctl.keysize = sizeof(FsRunKey);
	ctl.entrysize = sizeof(FsRunKey);
	ctl.hcxt = CurrentMemoryContext;
	inserted = hash_create("fairshare inserted runs", Max(SPI_processed, 16), &ctl,
						   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (r = 0; r < SPI_processed; r++)
	{
		FsRunKey	key;
		bool		isnull;

		memset(&key, 0, sizeof(key));
		key.schedule_id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[r],
													  SPI_tuptable->tupdesc, 1, &isnull));
		key.scheduled_for = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[r],
															  SPI_tuptable->tupdesc, 2, &isnull));
		hash_search(inserted, &key, HASH_ENTER, NULL);
	}
	return inserted;
}

/* A text column of an SPI row as a C string in `into`, or NULL. */
static char *
fs_copy_text(HeapTuple row, TupleDesc desc, int column, MemoryContext into)
{
	bool		isnull;
	Datum		value = SPI_getbinval(row, desc, column, &isnull);
	MemoryContext old;
	char	   *result;

	if (isnull)
		return NULL;
	old = MemoryContextSwitchTo(into);
	result = TextDatumGetCString(value);
	MemoryContextSwitchTo(old);
	return result;
}

/* A due row's place, by its schedule id (fs_reread_changed()). */
typedef struct FsRowSlot
{
	int64		schedule_id;	/* hash key */
	uint64		index;			/* its row in the due query's result */
} FsRowSlot;

/*
 * The due query locks the state rows only.  In READ COMMITTED, a state row
 * changed by fs_schedule() after the query's snapshot is re-checked and
 * locked in its new version, but the schedule row joined to it stays as
 * the snapshot saw it: the claim would pair the new timing with the old
 * command and payload.  So the rows whose state row is newer than
 * `horizon` (the xmin of a snapshot taken before the query: every version
 * written by a transaction that committed after the query's snapshot is
 * that new) are read again, with a new snapshot, which sees their schedule
 * rows as they are now: no fs_schedule() can change them while their state
 * rows are locked.  Older rows, nearly all of them, need nothing.
 * rows[i] becomes the row to use for due row i.
 */
static void
fs_reread_changed(SPITupleTable *due, uint64 ndue, TransactionId horizon, HeapTuple *rows)
{
	Datum	   *ids = palloc(sizeof(Datum) * Max(ndue, 1));
	int			nids = 0;
	uint64		i;
	Datum		args[1];
	HASHCTL		ctl;
	HTAB	   *slots;
	SPITupleTable *fresh;

	ctl.keysize = sizeof(int64);
	ctl.entrysize = sizeof(FsRowSlot);
	ctl.hcxt = CurrentMemoryContext;
	slots = hash_create("fairshare changed schedules", 16, &ctl,
						HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (i = 0; i < ndue; i++)
	{
		bool		isnull;
		TransactionId xmin = DatumGetTransactionId(SPI_getbinval(due->vals[i], due->tupdesc,
																 DUE_STATE_XMIN, &isnull));

		rows[i] = due->vals[i];
		if (!TransactionIdPrecedes(xmin, horizon))
		{
			Datum		id = SPI_getbinval(due->vals[i], due->tupdesc, DUE_ID, &isnull);
			int64		key = DatumGetInt64(id);
			FsRowSlot  *slot = hash_search(slots, &key, HASH_ENTER, NULL);

			slot->index = i;
			ids[nids++] = id;
		}
	}
	if (nids > 0)
	{
		args[0] = fs_array(ids, NULL, nids, INT8OID);
		fs_execute(Q_DUE_REREAD, args, NULL, false, 0);
		fresh = SPI_tuptable;
		for (i = 0; i < SPI_processed; i++)
		{
			bool		isnull;
			int64		key = DatumGetInt64(SPI_getbinval(fresh->vals[i], fresh->tupdesc,
														  DUE_ID, &isnull));
			FsRowSlot  *slot = hash_search(slots, &key, HASH_FIND, NULL);

			if (slot != NULL)
				rows[slot->index] = fresh->vals[i];
		}
	}
	hash_destroy(slots);
	pfree(ids);
}

/* The runs a take hands out so far, in the caller's memory context. */
typedef struct FsRunTake
{
	MemoryContext caller;
	FsTakenRun *runs;
	int			nruns;
	int			capacity;
	bool		more;			/* the limit left runs of a schedule due */
} FsRunTake;

/* Room for n more runs in c->runs. */
static void
fs_take_reserve(FsRunTake *c, int n)
{
	int			need = c->nruns + n;

	if (need <= c->capacity)
		return;
	c->capacity = Max(need, c->capacity * 2);
	if (c->runs == NULL)
		c->runs = MemoryContextAlloc(c->caller, sizeof(FsTakenRun) * c->capacity);
	else
		c->runs = repalloc(c->runs, sizeof(FsTakenRun) * c->capacity);
}

/*
 * The runs of one due schedule (a row of the due query) as of `as_of`, per
 * its catchup policy, into *d; d->error when they can no longer be
 * computed (its time zone or expression became invalid), and the schedule
 * stops.
 */
static void
fs_take_schedule_runs(HeapTuple row, TupleDesc desc, TimestampTz as_of, FsDue *d)
{
	bool		isnull;
	char	   *cron_text = TextDatumGetCString(SPI_getbinval(row, desc, DUE_CRON, &isnull));
	char	   *zone_name = TextDatumGetCString(SPI_getbinval(row, desc, DUE_TIMEZONE, &isnull));
	char	   *catchup_text = TextDatumGetCString(SPI_getbinval(row, desc, DUE_CATCHUP, &isnull));
	TimestampTz pending = DatumGetTimestampTz(SPI_getbinval(row, desc, DUE_NEXT_RUN_AT, &isnull));
	FsCron		cron;
	FsCronError cron_error;
	FsStepper	st;

	memset(d, 0, sizeof(*d));
	st.cron = &cron;
	st.failed = false;
	st.zone = fs_cron_find_zone(zone_name);
	if (st.zone == NULL)
		d->error = psprintf("time zone \"%s\" is no longer known to PostgreSQL; the schedule stopped",
							zone_name);
	else if (!fs_cron_parse_cstring(cron_text, &cron, &cron_error))
		d->error = psprintf("cron expression \"%s\" is no longer valid (%s); the schedule stopped",
							cron_text, cron_error.detail);
	else
	{
		fs_due_runs(&st, fs_catchup_from_string(catchup_text), pending, as_of, d);
		if (st.failed)
		{
			memset(d, 0, sizeof(*d));
			d->error = psprintf("cannot compute the runs of \"%s\" in time zone \"%s\" after %s; the schedule stopped",
								cron_text, zone_name, timestamptz_to_str(pending));
		}
	}
}

/* Add the advance of schedule `id` after handing out d's runs to a page. */
static void
fs_batch_advance(FsTakeBatch *b, Datum id, const FsDue *d)
{
	int			a = b->nadvance++;

	b->a_id[a] = id;
	b->a_next[a] = TimestampTzGetDatum(d->next);
	b->a_next_null[a] = !d->has_next;
	b->a_last[a] = TimestampTzGetDatum(d->last_for);
	b->a_last_null[a] = !d->has_last;
	b->a_state[a] = CStringGetTextDatum(d->nruns > 0 ? "claimed" : "skipped");
	b->a_state_null[a] = !(d->nruns > 0 || d->skipped);
	b->a_error[a] = d->error ? CStringGetTextDatum(d->error) : (Datum) 0;
	b->a_error_null[a] = d->error == NULL;
}

/*
 * Write a page: its ledger rows, then the schedules' advance.  Returns the
 * runs whose ledger row this page inserted (NULL: all of them, or none to
 * insert), see fs_insert_ledger().
 */
static HTAB *
fs_take_page_write(const FsTakeBatch *b, TimestampTz now)
{
	Datum		args[8];
	char		nulls[8];
	HTAB	   *inserted = NULL;

	if (b->nledger > 0)
	{
		args[0] = fs_array(b->l_id, NULL, b->nledger, INT8OID);
		args[1] = fs_array(b->l_for, NULL, b->nledger, TIMESTAMPTZOID);
		args[2] = fs_array(b->l_owner_oid, NULL, b->nledger, OIDOID);
		args[3] = fs_array(b->l_owner, NULL, b->nledger, TEXTOID);
		args[4] = fs_array(b->l_name, NULL, b->nledger, TEXTOID);
		args[5] = fs_array(b->l_state, NULL, b->nledger, TEXTOID);
		args[6] = fs_array(b->l_missed, b->l_missed_null, b->nledger, TIMESTAMPTZOID);
		args[7] = TimestampTzGetDatum(now);
		inserted = fs_insert_ledger(args);
	}
	if (b->nadvance > 0)
	{
		args[0] = fs_array(b->a_id, NULL, b->nadvance, INT8OID);
		args[1] = fs_array(b->a_next, b->a_next_null, b->nadvance, TIMESTAMPTZOID);
		args[2] = fs_array(b->a_last, b->a_last_null, b->nadvance, TIMESTAMPTZOID);
		args[3] = fs_array(b->a_state, b->a_state_null, b->nadvance, TEXTOID);
		args[4] = fs_array(b->a_error, b->a_error_null, b->nadvance, TEXTOID);
		args[5] = TimestampTzGetDatum(now);
		memset(nulls, ' ', sizeof(nulls));
		fs_execute(Q_ADVANCE, args, nulls, false, 0);
	}
	return inserted;
}

/*
 * Hand out the page's runs whose ledger row it inserted (`inserted`, NULL:
 * all), copied out of SPI's memory into the caller's: `rows` are the due
 * schedules they came from.
 */
static void
fs_take_page_hand_out(FsRunTake *c, const FsTakeBatch *b, HeapTuple *rows, TupleDesc desc,
					  HTAB *inserted, int nruns)
{
	int			i;

	fs_take_reserve(c, nruns);
	for (i = 0; i < b->nledger; i++)
	{
		int			source = b->l_source[i];
		HeapTuple	row;
		FsTakenRun *run;
		bool		isnull;
		Datum		payload;
		MemoryContext old;

		if (source < 0)
			continue;
		if (inserted != NULL)
		{
			FsRunKey	key;

			memset(&key, 0, sizeof(key));
			key.schedule_id = DatumGetInt64(b->l_id[i]);
			key.scheduled_for = DatumGetTimestampTz(b->l_for[i]);
			if (hash_search(inserted, &key, HASH_FIND, NULL) == NULL)
				continue;
		}
		row = rows[source];
		run = &c->runs[c->nruns++];
		run->schedule_id = DatumGetInt64(b->l_id[i]);
		run->scheduled_for = DatumGetTimestampTz(b->l_for[i]);
		run->owner_oid = DatumGetObjectId(b->l_owner_oid[i]);
		old = MemoryContextSwitchTo(c->caller);
		run->owner = TextDatumGetCString(b->l_owner[i]);
		MemoryContextSwitchTo(old);
		run->name = fs_copy_text(row, desc, DUE_NAME, c->caller);
		run->tenant = fs_copy_text(row, desc, DUE_TENANT, c->caller);
		run->queue = fs_copy_text(row, desc, DUE_QUEUE, c->caller);
		run->command = fs_copy_text(row, desc, DUE_COMMAND, c->caller);
		payload = SPI_getbinval(row, desc, DUE_PAYLOAD, &isnull);
		old = MemoryContextSwitchTo(c->caller);
		run->payload = PointerGetDatum(PG_DETOAST_DATUM_COPY(payload));
		MemoryContextSwitchTo(old);
	}
}

/*
 * One page of a take: lock up to `limit` due schedules, work out their
 * runs, take at most `want` of them, record and advance.  Appends the
 * runs it hands out to *c, and adds to *nschedules the schedules it dealt
 * with.  Returns false when it saw every due schedule (the query found
 * fewer than `limit` and each was dealt with).
 */
static bool
fs_take_page(FsRunTake *c, bool with_command, int64 only_schedule_id, int limit, int want,
			 TimestampTz as_of, Oid taker, bool all_owners, TimestampTz now,
			 int *nschedules)
{
	Datum		args[5];
	SPITupleTable *due;
	uint64		ndue;
	uint64		i;
	FsTakeBatch batch;
	int			ntaken = 0;
	HTAB	   *inserted;
	TransactionId horizon = GetLatestSnapshot()->xmin;
	HeapTuple  *rows;

	args[0] = TimestampTzGetDatum(as_of);
	args[1] = BoolGetDatum(all_owners);
	args[2] = ObjectIdGetDatum(taker);
	args[3] = Int32GetDatum(limit);
	args[4] = Int64GetDatum(only_schedule_id);
	fs_execute(with_command ? Q_DUE_WORKER : Q_DUE_APP, args, NULL, false, 0);
	due = SPI_tuptable;
	ndue = SPI_processed;
	rows = palloc(sizeof(HeapTuple) * Max(ndue, 1));
	fs_reread_changed(due, ndue, horizon, rows);
	/* Each schedule gives at most CAP runs, or one 'skipped' row. */
	fs_batch_init(&batch, (Size) Max(ndue, 1),
				  (Size) Min((uint64) want + ndue, ndue * FS_CATCHUP_ALL_CAP + 1));

	for (i = 0; i < ndue && ntaken < want; i++)
	{
		HeapTuple	row = rows[i];
		TupleDesc	desc = due->tupdesc;
		bool		isnull;
		Datum		id = SPI_getbinval(row, desc, DUE_ID, &isnull);
		Datum		owner_oid = SPI_getbinval(row, desc, DUE_OWNER_OID, &isnull);
		Datum		owner_name = SPI_getbinval(row, desc, DUE_OWNER, &isnull);
		Datum		owner = CStringGetTextDatum(NameStr(*DatumGetName(owner_name)));
		Datum		name = SPI_getbinval(row, desc, DUE_NAME, &isnull);
		FsDue		d;
		int			k;

		fs_take_schedule_runs(row, desc, as_of, &d);

		/* Within `want`: take the first runs, leave the rest pending. */
		if (d.nruns > want - ntaken)
		{
			c->more = true;
			d.nruns = want - ntaken;
			d.has_next = true;
			d.next = d.runs[d.nruns];
			d.last_for = d.runs[d.nruns - 1];
		}

		for (k = 0; k < d.nruns; k++)
			fs_batch_ledger(&batch, id, d.runs[k], owner_oid, owner, name, "claimed",
							k == 0 && d.has_missed, d.missed_since, (int) i);
		ntaken += d.nruns;
		if (d.skipped)
			fs_batch_ledger(&batch, id, d.last_for, owner_oid, owner, name, "skipped",
							d.has_missed, d.missed_since, -1);
		fs_batch_advance(&batch, id, &d);
		if (d.error)
			ereport(WARNING,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s", d.error),
					 errhint("Call fs_schedule() again for schedule \"%s\" of role \"%s\" with a valid expression and time zone.",
							 TextDatumGetCString(name), NameStr(*DatumGetName(owner_name)))));
	}
	*nschedules += batch.nadvance;

	inserted = fs_take_page_write(&batch, now);
	fs_take_page_hand_out(c, &batch, rows, due->tupdesc, inserted, ntaken);
	SPI_freetuptable(due);
	return ndue == (uint64) limit || ndue > (uint64) batch.nadvance;
}

/*
 * A page of a take locks at most this many schedules more than it still
 * wants runs, when earlier pages found schedules that gave no run.
 */
#define FS_CLAIM_MAX_PAGE			10000

/*
 * Take due runs, exactly once each: every schedule due at `as_of` (of
 * `taker`, or of every owner) gets its runs per its catchup policy,
 * recorded in the ledger and its next run advanced in the same transaction;
 * at most `max_runs`. Returns how many were taken, with the runs (and
 * their commands) in *runs_out.
 */
int
fs_take_runs(bool with_command, int64 only_schedule_id, int max_runs, TimestampTz as_of,
			 Oid taker, bool all_owners, FsTakenRun **runs_out, FsTakeInfo *info)
{
	FsRunTake	c;
	FsAsSuperuser su;
	MemoryContext page_context;
	TimestampTz now = GetCurrentTimestamp();
	int			limit = max_runs;
	int			dealt_with = 0;

	*runs_out = NULL;
	if (info)
		memset(info, 0, sizeof(*info));
	/* The worker's runs are claimed schedule by schedule, in its order. */
	if (with_command && only_schedule_id == 0)
		elog(ERROR, "runs of schedules with a command are claimed one schedule at a time");
	if (max_runs <= 0)
		return 0;
	fs_check_as_of(as_of);
	memset(&c, 0, sizeof(c));
	c.caller = CurrentMemoryContext;

	fs_tables_open(&su);

	/*
	 * A large claim sorts and joins as many rows as it claims: let it do so
	 * in memory (this ends with the claim, like the search_path above).
	 */
	if (max_runs > 10000)
		(void) set_config_option("work_mem", "64MB", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);

	/*
	 * A due schedule may give no run: catch-up 'skip' dropped a late one,
	 * its zone's rules moved the pending run after as_of, or it stopped.
	 * Such schedules must not make the claim return fewer runs than are
	 * due: while a page found as many schedules as it asked for and runs
	 * are still wanted, ask for more.  Every schedule a page deals with is
	 * advanced past as_of (or has its runs claimed up to what was wanted),
	 * so each page makes progress.  Pages grow, so that many schedules
	 * without a run cost few queries.
	 */
	page_context = AllocSetContextCreate(CurrentMemoryContext, "fairshare claim page",
										 ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		MemoryContext old = MemoryContextSwitchTo(page_context);
		int			want = max_runs - c.nruns;
		bool		more;

		more = fs_take_page(&c, with_command, only_schedule_id, limit, want, as_of,
							taker, all_owners, now, &dealt_with);
		MemoryContextSwitchTo(old);
		MemoryContextReset(page_context);
		if (only_schedule_id != 0 || c.nruns >= max_runs || !more)
			break;
		want = max_runs - c.nruns;
		limit = Max(want, Min(limit, FS_CLAIM_MAX_PAGE / 2) * 2);
	}
	MemoryContextDelete(page_context);

	fs_tables_close(&su);
	if (info)
	{
		info->nschedules = dealt_with;
		info->more = c.more;
	}
	*runs_out = c.runs;
	return c.nruns;
}

/*
 * The schedules due at `as_of` that the background worker runs (at most
 * `limit`), with their owners, for the scheduler's pass.
 */
int
fs_due_worker_schedules(TimestampTz as_of, int limit, FsDueSchedule **due_out)
{
	MemoryContext caller = CurrentMemoryContext;
	FsAsSuperuser su;
	Datum		args[2];
	FsDueSchedule *due;
	uint64		i;

	fs_tables_open(&su);
	args[0] = TimestampTzGetDatum(as_of);
	args[1] = Int32GetDatum(limit);
	fs_execute(Q_DUE_LIST, args, NULL, true, 0);
	due = MemoryContextAlloc(caller, sizeof(FsDueSchedule) * Max(SPI_processed, 1));
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		due[i].schedule_id = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));
		due[i].owner_oid = DatumGetObjectId(SPI_getbinval(row, desc, 2, &isnull));
		due[i].next_run_at = DatumGetTimestampTz(SPI_getbinval(row, desc, 3, &isnull));
	}
	fs_tables_close(&su);
	*due_out = due;
	return (int) i;
}

/*
 * fs_claim_due_schedules(max_runs int DEFAULT 1000, as_of timestamptz DEFAULT now())
 *		RETURNS TABLE(schedule_id bigint, name text, tenant text, queue text,
 *					  scheduled_for timestamptz, payload jsonb)
 *
 * Claims the due runs of schedules without a command: the calling role's,
 * or every role's for a superuser or a member of fairshare_admin.
 */
Datum
fs_claim_due_schedules(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int32		max_runs;
	TimestampTz as_of;
	FsTakenRun *runs;
	int			nruns;
	int			i;
	Oid			claimer = GetUserId();

	fs_check_primary("take due schedule runs");
	fs_cluster_check_coordinator("fs_claim_due_schedules");
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_runs must not be null"),
				 errhint("Pass how many runs to claim at most, for example 1000.")));
	max_runs = PG_GETARG_INT32(0);
	if (max_runs < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_runs must not be negative, got %d", max_runs),
				 errhint("Pass how many runs to claim at most, for example 1000.")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("as_of must not be null"),
				 errhint("Leave it out to claim the runs due now.")));
	as_of = PG_GETARG_TIMESTAMPTZ(1);
	if (TIMESTAMP_NOT_FINITE(as_of))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("as_of must be a finite time"),
				 errhint("Leave it out to claim the runs due now.")));
	fs_check_as_of(as_of);

	InitMaterializedSRF(fcinfo, 0);
	nruns = fs_take_runs(false, 0, max_runs, as_of, claimer, fs_sees_all_schedules(claimer),
						 &runs, NULL);
	for (i = 0; i < nruns; i++)
	{
		Datum		values[6];
		bool		nulls[6] = {false, false, false, false, false, false};

		values[0] = Int64GetDatum(runs[i].schedule_id);
		values[1] = CStringGetTextDatum(runs[i].name);
		values[2] = runs[i].tenant ? CStringGetTextDatum(runs[i].tenant) : (Datum) 0;
		nulls[2] = runs[i].tenant == NULL;
		values[3] = CStringGetTextDatum(runs[i].queue);
		values[4] = TimestampTzGetDatum(runs[i].scheduled_for);
		values[5] = runs[i].payload;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * Worker bookkeeping
 * ----------------------------------------------------------------
 */

/*
 * Record the end of a claimed run in the ledger: succeeded, or failed with
 * its error.
 */
void
fs_finish_run(const FsTakenRun *run, const char *error)
{
	FsAsSuperuser su;
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	fs_tables_open(&su);
	args[0] = Int64GetDatum(run->schedule_id);
	args[1] = TimestampTzGetDatum(run->scheduled_for);
	args[2] = CStringGetTextDatum(error ? "failed" : "succeeded");
	args[3] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[4] = fs_text_or_null(error, &nulls[4]);
	fs_execute(Q_RUN_RESULT, args, nulls, false, 0);
	fs_execute(Q_LAST_RESULT, args, nulls, false, 0);
	fs_tables_close(&su);
}

/*
 * Delete at most `limit` ledger rows of runs that ended before `before`;
 * returns how many.
 */
uint64
fs_prune_runs(TimestampTz before, int limit)
{
	FsAsSuperuser su;
	Datum		args[2];
	uint64		deleted;

	fs_tables_open(&su);
	args[0] = TimestampTzGetDatum(before);
	args[1] = Int32GetDatum(limit);
	fs_execute(Q_PRUNE, args, NULL, false, 0);
	deleted = SPI_processed;
	fs_tables_close(&su);
	return deleted;
}


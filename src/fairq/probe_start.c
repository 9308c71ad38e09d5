/*-------------------------------------------------------------------------
 *
 * probe_start.c
 *	  Where a claim's probe of a busy tenant's rows starts.
 *
 * A claim takes a tenant's rows with an index scan of (tenant, order_by)
 * from the tenant's first entry.  Claimed rows are deleted (or updated out
 * of the ready state), and their index entries stay until vacuum: after a
 * flood of claims every probe of the tenant walks over all of them first.
 * Solid Queue's FIFO claim walks them too, in its narrower primary key.
 *
 * A probe start is a row of order_by values below which the tenant has no
 * ready row, kept in shared memory for a few tenants per queue: the claim
 * query asks for (order_by) >= start, and the scan begins there.
 *
 * The invariant: every row of the tenant that satisfies the ready filter
 * and that a snapshot taken now would see, sorts at or above the tenant's
 * valid start.  It is kept so:
 *
 *   - A start is only ever set to the first such row in a snapshot taken
 *     after the slot's generation was read (the advance below), and only
 *     if the generation is still the same when it is written.  Rows below
 *     it were invisible to that snapshot (their insert not yet committed:
 *     see the next rule) or gone (deleted, or updated out of the ready
 *     state, by a committed transaction: for good, since a row comes back
 *     only as a new version, by the next rule).  A row locked by anyone
 *     (a claim, an application's FOR UPDATE, a foreign key check) is
 *     visible, so the start never passes it.
 *   - A transaction that put a row of the tenant into the ready state
 *     (INSERT, or an UPDATE into the state, to the tenant, or within it,
 *     which may move it in the order) makes the start invalid when it
 *     commits, after its rows became visible (commit.c), and moves the
 *     generation on: an advance whose snapshot missed the rows fails.
 *   - The advance runs only in a claim whose transaction had changed
 *     nothing before it (no transaction id), so that no row of its own,
 *     deleted but not yet committed, hides below the start; and not under
 *     SERIALIZABLE, whose snapshot rules a second snapshot would bypass.
 *
 * Which queues: no sub-key, no claim filter (one that changes with time,
 * such as run_at <= now(), would let rows become ready with no
 * transaction), no row-level security (what the caller sees is what
 * everyone sees), and an order_by of at most three columns, each NOT NULL,
 * ascending, of a type with a lowest value (smallint, integer, bigint,
 * date, timestamp, timestamptz).  A start older than a second is
 * recomputed from the tenant's first entry, so that rows put in the ready
 * state behind the triggers' back (replication apply, disabled triggers)
 * wait at most that long.
 *
 * Locking: each queue's starts are under its FsProbeStarts.mutex, held for
 * a few comparisons; commits read `nused` without it (see
 * fs_probe_start_reset()).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "datatype/timestamp.h"
#include "utils/builtins.h"
#include "utils/date.h"
#include "utils/snapmgr.h"

#include "fairq/fairqueue_int.h"
#include "fairq/register_int.h"

/* A tenant gets a slot when one claim plans this many of its rows. */
#define FS_PROBE_START_MIN_ROWS	4

/* An advance is due after this many rows planned from a start. */
#define FS_PROBE_START_EVERY	64

/* A start older than this is recomputed from the tenant's first entry. */
#define FS_PROBE_START_TTL_USECS	USECS_PER_SEC

/* The lowest value of a start column's type: a start that passes nothing. */
static Datum
fs_probe_start_lowest(Oid type)
{
	switch (type)
	{
		case INT2OID:
			return Int16GetDatum(PG_INT16_MIN);
		case INT4OID:
			return Int32GetDatum(PG_INT32_MIN);
		case INT8OID:
			return Int64GetDatum(PG_INT64_MIN);
		case DATEOID:
			return DateADTGetDatum(DATEVAL_NOBEGIN);
		case TIMESTAMPOID:
			return TimestampGetDatum(DT_NOBEGIN);
		case TIMESTAMPTZOID:
			return TimestampTzGetDatum(DT_NOBEGIN);
		default:
			elog(ERROR, "probe start column of unexpected type %u", type);
	}
	return (Datum) 0;			/* keep the compiler quiet */
}

/*
 * Decide whether the claims of `desc` (its texts set, `rel` its ready table
 * open) use probe starts, and on which columns (the file header says which
 * queues do).  Called with the registrations' search_path in effect.
 */
void
fs_probe_start_columns(FsFairDesc *desc, Relation rel)
{
	List	   *items;
	ListCell   *lc;
	int			n = 0;
	uint32		signature;

	desc->start_ncols = 0;
	if (desc->subkey != NULL || desc->claim_filter != NULL || rel->rd_rel->relrowsecurity)
		return;
	items = fs_compile_order(desc->order_by, rel, desc->queue_name);
	if (list_length(items) > FS_PROBE_START_MAX_COLS)
		return;
	foreach(lc, items)
	{
		FsOrderItem *item = lfirst(lc);
		Var		   *var = (Var *) item->expr;
		Form_pg_attribute attr;

		if (item->desc || item->nulls_first || !IsA(var, Var) || var->varattno <= 0 ||
			var->varattno > RelationGetNumberOfAttributes(rel))
			return;
		attr = TupleDescAttr(RelationGetDescr(rel), var->varattno - 1);
		if (!attr->attnotnull || attr->attisdropped)
			return;
		switch (attr->atttypid)
		{
			case INT2OID:
			case INT4OID:
			case INT8OID:
			case DATEOID:
			case TIMESTAMPOID:
			case TIMESTAMPTZOID:
				break;
			default:
				return;
		}
		desc->start_attnums[n] = var->varattno;
		desc->start_types[n] = attr->atttypid;
		desc->start_columns[n] = MemoryContextStrdup(desc->cxt,
													 quote_identifier(NameStr(attr->attname)));
		n++;
	}
	if (n == 0)
		return;

	/*
	 * The values are of these columns, this tenant expression and this
	 * filter: a registration with other ones must not read them.
	 */
	signature = hash_bytes((const unsigned char *) desc->start_attnums,
						   sizeof(AttrNumber) * n);
	signature = hash_combine(signature, hash_bytes((const unsigned char *) desc->start_types,
												   sizeof(Oid) * n));
	signature = hash_combine(signature, hash_bytes((const unsigned char *) desc->tenant,
												   strlen(desc->tenant)));
	if (desc->ready_filter != NULL)
		signature = hash_combine(signature,
								 hash_bytes((const unsigned char *) desc->ready_filter,
											strlen(desc->ready_filter)));
	desc->start_signature = signature | 1;	/* 0: a set never used */
	desc->start_ncols = n;
}

/* Set up a queue's starts in shared memory (at server start). */
void
fs_probe_starts_init(FsProbeStarts *ps)
{
	memset(ps, 0, sizeof(FsProbeStarts));
	SpinLockInit(&ps->mutex);
	pg_atomic_init_u32(&ps->nused, 0);
}

/* Empty every slot of `ps`; with its mutex held. */
static void
fs_probe_starts_empty_locked(FsProbeStarts *ps)
{
	for (int i = 0; i < FS_PROBE_START_SLOTS; i++)
	{
		FsProbeStart *slot = &ps->slots[i];

		slot->tenant_hash = 0;
		slot->tenant[0] = '\0';
		slot->valid = false;
		slot->gen++;
	}
	pg_atomic_write_u32(&ps->nused, 0);
}

/* Forget a queue's starts (its registration changed or went). */
void
fs_probe_starts_clear(FsProbeStarts *ps)
{
	SpinLockAcquire(&ps->mutex);
	fs_probe_starts_empty_locked(ps);
	SpinLockRelease(&ps->mutex);
}

static uint32
fs_probe_start_hash(const char *tenant)
{
	return hash_bytes((const unsigned char *) tenant, (int) strlen(tenant)) | 1;
}

/* The slot of `tenant` in `ps`, or -1; with its mutex held. */
static int
fs_probe_start_find_locked(FsProbeStarts *ps, uint32 hash, const char *tenant)
{
	for (int i = 0; i < FS_PROBE_START_SLOTS; i++)
		if (ps->slots[i].tenant_hash == hash && strcmp(ps->slots[i].tenant, tenant) == 0)
			return i;
	return -1;
}

/*
 * A slot for `tenant`: a free one, else the one planned longest ago.  It
 * starts without a start; with the mutex held.
 */
static int
fs_probe_start_take_locked(FsProbeStarts *ps, uint32 hash, const char *tenant)
{
	int			victim = 0;
	FsProbeStart *slot;

	for (int i = 0; i < FS_PROBE_START_SLOTS; i++)
	{
		if (ps->slots[i].tenant_hash == 0)
		{
			victim = i;
			break;
		}
		if (ps->slots[i].used_at < ps->slots[victim].used_at)
			victim = i;
	}
	slot = &ps->slots[victim];
	if (slot->tenant_hash == 0)
		pg_atomic_write_u32(&ps->nused, pg_atomic_read_u32(&ps->nused) + 1);
	slot->tenant_hash = hash;
	strlcpy(slot->tenant, tenant, FS_NAME_BUFLEN);
	slot->valid = false;
	slot->gen++;
	slot->rows_since = FS_PROBE_START_EVERY;	/* an advance is due at once */
	return victim;
}

/*
 * The starts of a claim query's `n` elements (tenants[i] asked for
 * rows[i] rows), into starts[c][i] for each start column c: a tenant's
 * start, or the columns' lowest values.  Each advance that falls due is
 * added to due[] (room for FS_PROBE_START_LOOKUPS); returns how many.
 * Only tenants asked for several rows are looked up, the first
 * FS_PROBE_START_LOOKUPS of them.
 */
int
fs_probe_starts_read(FsFairDesc *desc, int n, const char *const *tenants, const int32 *rows,
					 Datum **starts, FsProbeDue *due, TimestampTz now)
{
	FsProbeStarts *ps = &desc->fq->probe_starts;
	int			look[FS_PROBE_START_LOOKUPS];
	uint32		hashes[FS_PROBE_START_LOOKUPS];
	int			nlook = 0;
	int			ndue = 0;

	for (int c = 0; c < desc->start_ncols; c++)
	{
		Datum		lowest = fs_probe_start_lowest(desc->start_types[c]);

		for (int i = 0; i < n; i++)
			starts[c][i] = lowest;
	}
	for (int i = 0; i < n && nlook < FS_PROBE_START_LOOKUPS; i++)
		if (rows[i] >= FS_PROBE_START_MIN_ROWS)
		{
			look[nlook] = i;
			hashes[nlook++] = fs_probe_start_hash(tenants[i]);
		}
	if (nlook == 0)
		return 0;

	SpinLockAcquire(&ps->mutex);
	if (ps->signature != desc->start_signature)
	{
		fs_probe_starts_empty_locked(ps);
		ps->signature = desc->start_signature;
	}
	ps->clock++;
	for (int k = 0; k < nlook; k++)
	{
		int			i = look[k];
		int			s = fs_probe_start_find_locked(ps, hashes[k], tenants[i]);
		FsProbeStart *slot;
		bool		stale;

		if (s < 0)
			s = fs_probe_start_take_locked(ps, hashes[k], tenants[i]);
		slot = &ps->slots[s];
		slot->used_at = ps->clock;
		stale = slot->valid && now - slot->set_at >= FS_PROBE_START_TTL_USECS;
		if (slot->valid && !stale)
			for (int c = 0; c < desc->start_ncols; c++)
				starts[c][i] = slot->values[c];
		slot->rows_since = Min(slot->rows_since + rows[i], FS_PROBE_START_EVERY);
		if (slot->rows_since >= FS_PROBE_START_EVERY || stale)
		{
			FsProbeDue *d = &due[ndue++];

			d->element = i;
			d->slot = s;
			d->gen = slot->gen;
			for (int c = 0; c < desc->start_ncols; c++)
				d->from[c] = starts[c][i];
			slot->rows_since = 0;
		}
	}
	SpinLockRelease(&ps->mutex);
	return ndue;
}

/*
 * Advance the starts of due[] (from fs_probe_starts_read(), before the
 * claim query): each to the tenant's first row in the ready state in a
 * snapshot taken now, if its slot did not change since.  The caller has
 * checked that the transaction changed nothing before its claim.
 */
void
fs_probe_starts_advance(FsFairDesc *desc, const char *const *tenants, const FsProbeDue *due,
						int ndue, TimestampTz now)
{
	FsProbeStarts *ps = &desc->fq->probe_starts;

	for (int k = 0; k < ndue; k++)
	{
		const FsProbeDue *d = &due[k];
		Datum		values[1 + FS_PROBE_START_MAX_COLS];
		Datum		found[FS_PROBE_START_MAX_COLS];
		bool		isnull = false;
		FsProbeStart *slot;
		uint32		hash;

		values[0] = CStringGetTextDatum(tenants[d->element]);
		for (int c = 0; c < desc->start_ncols; c++)
			values[1 + c] = d->from[c];
		fs_fair_execute(desc, &desc->start_q, desc->start_plan, values, NULL,
						GetLatestSnapshot(), true, 1, "probe start query");
		if (SPI_processed != 1)
			continue;			/* no row at or above the start: it stays */
		for (int c = 0; c < desc->start_ncols && !isnull; c++)
			found[c] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, c + 1,
									 &isnull);
		if (isnull)
			continue;			/* NOT NULL dropped since the registration was read */

		hash = fs_probe_start_hash(tenants[d->element]);
		SpinLockAcquire(&ps->mutex);
		slot = &ps->slots[d->slot];
		if (slot->gen == d->gen && slot->tenant_hash == hash &&
			strcmp(slot->tenant, tenants[d->element]) == 0 &&
			ps->signature == desc->start_signature)
		{
			for (int c = 0; c < desc->start_ncols; c++)
				slot->values[c] = found[c];
			slot->valid = true;
			slot->set_at = now;
			slot->gen++;
		}
		SpinLockRelease(&ps->mutex);
	}
}

/*
 * A committed transaction put rows of `tenant` in `queue` into the ready
 * state (commit.c, after they became visible): its start no longer holds.
 *
 * `nused` is read without the mutex.  A claim that could advance past such
 * a row read the slot's generation, with the slot in use, before taking
 * the snapshot that missed the row; that snapshot was taken before this
 * transaction left the process array, which happened before this read, and
 * ProcArrayLock orders the two: this read sees the slot in use.
 */
void
fs_probe_start_reset(FsQueue *queue, const char *tenant)
{
	FsProbeStarts *ps = &fs_fair_queue(queue)->probe_starts;
	uint32		hash;
	int			s;

	if (pg_atomic_read_u32(&ps->nused) == 0)
		return;
	hash = fs_probe_start_hash(tenant);
	SpinLockAcquire(&ps->mutex);
	s = fs_probe_start_find_locked(ps, hash, tenant);
	if (s >= 0)
	{
		ps->slots[s].valid = false;
		ps->slots[s].gen++;
	}
	SpinLockRelease(&ps->mutex);
}

/*-------------------------------------------------------------------------
 *
 * probe_start.c
 *	  Where a claim's probe of a busy tenant's rows starts.
 *
 * A claim takes a tenant's rows with an index scan of (tenant, order_by)
 * from the tenant's first entry.  Claimed rows are deleted (or updated out
 * of the ready state), and their index entries stay until vacuum: after a
 * flood of claims every probe of the tenant walks over all of them first.
 *
 * A probe start is a row of order_by values below which the tenant has no
 * ready row, kept in shared memory for a few tenants per queue: the claim
 * query asks for (order_by) >= start, and the scan begins there.
 *
 * The invariant: a claim uses a start only if every row of the tenant that
 * satisfies the ready filter and that its snapshot sees, and that no
 * transaction has deleted or moved out of the ready state, sorts at or
 * above it.  It is kept so:
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
 *     which may move it in the order) enters the tenant's bucket of
 *     `committing` at pre-commit, before its rows can be seen; while the
 *     bucket is not 0, no claim uses a start of its tenants and no advance
 *     sets one.  After its rows became visible (commit.c) it voids the
 *     starts of the bucket's tenants and moves their generations on, and
 *     only then leaves the bucket (at abort too).  So a claim whose
 *     snapshot sees the rows finds the bucket taken or the start void, and
 *     an advance whose snapshot missed them finds the bucket taken or the
 *     generation moved.  Its own claims, before it commits, use no start
 *     of the queue (nor do claims of a statement whose own inserts' row
 *     triggers are still pending).
 *   - The advance runs only in a claim whose transaction had changed
 *     nothing before it (no transaction id), so that no row of its own,
 *     deleted but not yet committed, hides below the start; and not under
 *     SERIALIZABLE, whose snapshot rules a second snapshot would bypass.
 *     A claim under SERIALIZABLE still uses starts: it takes no predicate
 *     lock on the range below the start, which a SKIP LOCKED claim gives
 *     up being serializable for anyway.
 *
 * Which queues: no sub-key, no claim filter (one that changes with time,
 * such as run_at <= now(), would let rows become ready with no
 * transaction), no row-level security (what the caller sees is what
 * everyone sees), and an order_by of at most three columns, each NOT NULL,
 * ascending, of a type with a lowest value (smallint, integer, bigint,
 * date, timestamp, timestamptz).  Rows that reach the ready state behind
 * the triggers' back (replication apply, disabled triggers, a partition
 * attached with rows) wait at most a second: a start is not used once a
 * second has passed since one was last found from the tenant's first
 * entry, and the next advance finds it so again.  A recount forgets the
 * queue's starts.
 *
 * Locking: each queue's slots are under its FsProbeStarts.mutex, held for
 * a few comparisons and copies with no other fairshare lock; commits change
 * `committing` (atomics) without it: see fs_probe_starts_committing().
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "utils/rel.h"
#include "common/hashfn.h"
#include "datatype/timestamp.h"
#include "utils/builtins.h"
#include "utils/date.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "fairq/fairqueue_int.h"
#include "fairq/register_int.h"

/* A tenant gets a slot when one claim plans this many of its rows. */
#define FS_PROBE_START_MIN_ROWS	4

/* An advance is due after this many rows planned from a start. */
#define FS_PROBE_START_EVERY	64

/* A slot goes to another tenant once unused for this many plannings. */
#define FS_PROBE_START_IDLE		64

/* A start older than this is recomputed from the tenant's first entry. */
#define FS_PROBE_START_TTL_USECS	USECS_PER_SEC

/*
 * The width in bytes of a start column's type, 0 for a type starts do not
 * serve.  Each served type is an integer of that width whose order is the
 * type's (date and timestamps too), and whose lowest value is the type's
 * lowest (-infinity for date and timestamps): so one int64 keeps any of
 * them.
 */
static int
fs_probe_start_width(Oid type)
{
	switch (type)
	{
		case INT2OID:
			return 2;
		case INT4OID:
		case DATEOID:
			StaticAssertStmt(DATEVAL_NOBEGIN == PG_INT32_MIN, "date's -infinity is the lowest int32");
			return 4;
		case INT8OID:
		case TIMESTAMPOID:
		case TIMESTAMPTZOID:
			StaticAssertStmt(DT_NOBEGIN == PG_INT64_MIN, "timestamp's -infinity is the lowest int64");
			return 8;
		default:
			return 0;
	}
}

/* The lowest value of a start column's type: a start that passes nothing. */
static int64
fs_probe_start_lowest(Oid type)
{
	int			width = fs_probe_start_width(type);

	return width == 2 ? PG_INT16_MIN : width == 4 ? PG_INT32_MIN : PG_INT64_MIN;
}

/* A start column's value as kept in shared memory. */
static int64
fs_probe_start_int64(Oid type, Datum value)
{
	int			width = fs_probe_start_width(type);

	return width == 2 ? DatumGetInt16(value) : width == 4 ? DatumGetInt32(value) :
		DatumGetInt64(value);
}

/* A kept value as a Datum of the start column's type. */
static Datum
fs_probe_start_datum(Oid type, int64 value)
{
	int			width = fs_probe_start_width(type);

	return width == 2 ? Int16GetDatum((int16) value) : width == 4 ? Int32GetDatum((int32) value) :
		Int64GetDatum(value);
}

/*
 * Does fairshare's row trigger on `rel` fire on updates of column
 * `attnum`?  It must, for a row moved within its tenant's order to void
 * the tenant's start at commit.  A registration made before probe starts
 * existed (an upgrade) has a trigger that fires only on updates of the
 * columns it read then, until the queue is registered again.
 */
static bool
fs_probe_start_trigger_covers(Relation rel, AttrNumber attnum)
{
	TriggerDesc *td = rel->trigdesc;

	for (int i = 0; td != NULL && i < td->numtriggers; i++)
	{
		Trigger    *t = &td->triggers[i];

		if (strcmp(t->tgname, FS_TRIGGER_READY) != 0)
			continue;
		if (!TRIGGER_FOR_UPDATE(t->tgtype))
			return false;
		for (int k = 0; k < t->tgnattr; k++)
			if (t->tgattr[k] == attnum)
				return true;
		return t->tgnattr == 0;	/* no column list: every update */
	}
	return false;
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
	Oid			relfilenode = rel->rd_rel->relfilenode;

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
		if (!attr->attnotnull || attr->attisdropped || fs_probe_start_width(attr->atttypid) == 0 ||
			!fs_probe_start_trigger_covers(rel, var->varattno))
			return;
		desc->start_attnums[n] = var->varattno;
		desc->start_types[n] = attr->atttypid;
		desc->start_columns[n] = MemoryContextStrdup(desc->cxt,
													 quote_identifier(NameStr(attr->attname)));
		n++;
	}
	if (n == 0)
		return;

	/*
	 * The values are of this table (its storage too: a rewrite such as
	 * ALTER COLUMN ... TYPE ... USING changes values without triggers),
	 * these columns, this tenant expression and this filter: a
	 * registration with other ones must not read them.
	 */
	signature = hash_bytes((const unsigned char *) &desc->ready_relid, sizeof(Oid));
	signature = hash_combine(signature, hash_bytes((const unsigned char *) &relfilenode,
												   sizeof(Oid)));
	signature = hash_combine(signature, hash_bytes((const unsigned char *) desc->start_attnums,
												   sizeof(AttrNumber) * n));
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
	for (int i = 0; i < FS_PROBE_START_COMMITTING; i++)
		pg_atomic_init_u32(&ps->committing[i], 0);
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
}

/* Forget a queue's starts (its registration changed or went, a recount). */
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

/* The committing bucket of a tenant hash. */
static int
fs_probe_start_bucket_of(uint32 hash)
{
	return (int) ((hash >> 1) % FS_PROBE_START_COMMITTING);
}

static pg_atomic_uint32 *
fs_probe_start_bucket(FsProbeStarts *ps, uint32 hash)
{
	return &ps->committing[fs_probe_start_bucket_of(hash)];
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
 * A slot for `tenant`: a free one, else the one planned longest ago if that
 * was at least FS_PROBE_START_IDLE plannings ago (-1 if none was: busy
 * tenants do not take slots from each other at every claim, each time
 * paying an advance from the first entry).  It starts without a start,
 * with an advance due; with the mutex held.
 */
static int
fs_probe_start_take_locked(FsProbeStarts *ps, uint32 hash, const char *tenant)
{
	int			victim = -1;
	FsProbeStart *slot;

	for (int i = 0; i < FS_PROBE_START_SLOTS; i++)
	{
		if (ps->slots[i].tenant_hash == 0)
		{
			victim = i;
			break;
		}
		if (ps->slots[i].used_at + FS_PROBE_START_IDLE <= ps->clock &&
			(victim < 0 || ps->slots[i].used_at < ps->slots[victim].used_at))
			victim = i;
	}
	if (victim < 0)
		return -1;
	slot = &ps->slots[victim];
	slot->tenant_hash = hash;
	strlcpy(slot->tenant, tenant, FS_NAME_BUFLEN);
	slot->valid = false;
	slot->gen++;
	slot->rows_since = FS_PROBE_START_EVERY;
	slot->full_at = 0;
	return victim;
}

/*
 * The starts of a claim query's `n` elements (tenants[i] asked for
 * rows[i] rows), into starts[c][i] for each start column c: a tenant's
 * start, or the columns' lowest values (all of them in a transaction that
 * put rows of the queue into the ready state).  Each advance that falls due is
 * added to due[] (room for FS_PROBE_START_LOOKUPS); returns how many.
 * Only tenants asked for several rows are looked up, the first
 * FS_PROBE_START_LOOKUPS of them.  A claim that may not advance starts
 * (see fs_claim()) only reads them: it takes no slot and no advance.
 */
int
fs_probe_starts_read(FsFairDesc *desc, int n, const char *const *tenants, const int32 *rows,
					 Datum **starts, FsProbeDue *due, bool may_advance)
{
	FsProbeStarts *ps = &desc->fq->probe_starts;
	int			ncols = desc->start_ncols;
	int			look[FS_PROBE_START_LOOKUPS];
	uint32		hashes[FS_PROBE_START_LOOKUPS];
	bool		found[FS_PROBE_START_LOOKUPS];
	int64		values[FS_PROBE_START_LOOKUPS][FS_PROBE_START_MAX_COLS];
	Datum		lowest[FS_PROBE_START_MAX_COLS];
	int			nlook = 0;
	int			ndue = 0;
	TimestampTz now;

	for (int c = 0; c < ncols; c++)
	{
		lowest[c] = fs_probe_start_datum(desc->start_types[c],
										 fs_probe_start_lowest(desc->start_types[c]));
		for (int i = 0; i < n; i++)
			starts[c][i] = lowest[c];
	}
	/*
	 * This transaction's own rows, not committed, may be below any start:
	 * those its triggers counted, and those of this very statement whose
	 * row triggers have not fired yet (in a partition, where that cannot be
	 * looked up cheaply, any of a transaction that has written).
	 */
	if (fs_track_made_ready(desc->queue) ||
		(FullTransactionIdIsValid(GetTopFullTransactionIdIfAny()) &&
		 (get_rel_relkind(desc->ready_relid) == RELKIND_PARTITIONED_TABLE ||
		  AfterTriggerPendingOnRel(desc->ready_relid))))
		return 0;
	for (int i = 0; i < n && nlook < FS_PROBE_START_LOOKUPS; i++)
		if (rows[i] >= FS_PROBE_START_MIN_ROWS)
		{
			look[nlook] = i;
			found[nlook] = false;
			hashes[nlook++] = fs_probe_start_hash(tenants[i]);
		}
	if (nlook == 0)
		return 0;

	/* Now, not the claim's start: a start a second old is not used. */
	now = fs_now();
	SpinLockAcquire(&ps->mutex);
	if (ps->signature != desc->start_signature)
	{
		fs_probe_starts_empty_locked(ps);
		ps->signature = desc->start_signature;
	}
	ps->clock++;
	for (int k = 0; k < nlook; k++)
	{
		int			s;
		FsProbeStart *slot;
		bool		usable;

		if (pg_atomic_read_u32(fs_probe_start_bucket(ps, hashes[k])) != 0)
			continue;			/* rows of it may be coming into sight */
		s = fs_probe_start_find_locked(ps, hashes[k], tenants[look[k]]);
		if (s < 0 && may_advance)
			s = fs_probe_start_take_locked(ps, hashes[k], tenants[look[k]]);
		if (s < 0)
			continue;
		slot = &ps->slots[s];
		if (!may_advance)
		{
			/* A claim that cannot advance uses a start, nothing more. */
			if (slot->valid && now >= slot->full_at &&
				now - slot->full_at < FS_PROBE_START_TTL_USECS)
			{
				found[k] = true;
				memcpy(values[k], slot->values, sizeof(int64) * ncols);
			}
			continue;
		}
		slot->used_at = ps->clock;
		usable = slot->valid && now >= slot->full_at &&
			now - slot->full_at < FS_PROBE_START_TTL_USECS;
		if (usable)
		{
			found[k] = true;
			memcpy(values[k], slot->values, sizeof(int64) * ncols);
		}
		slot->rows_since = Min(slot->rows_since + rows[look[k]], FS_PROBE_START_EVERY);
		if (slot->rows_since >= FS_PROBE_START_EVERY || (slot->valid && !usable))
		{
			FsProbeDue *d = &due[ndue++];

			d->element = k;		/* made the element's index below */
			d->slot = s;
			d->gen = slot->gen;
			d->full = !usable;
			slot->rows_since = 0;
		}
	}
	SpinLockRelease(&ps->mutex);

	for (int k = 0; k < nlook; k++)
		for (int c = 0; found[k] && c < ncols; c++)
			starts[c][look[k]] = fs_probe_start_datum(desc->start_types[c], values[k][c]);
	for (int j = 0; j < ndue; j++)
	{
		FsProbeDue *d = &due[j];

		d->element = look[d->element];
		for (int c = 0; c < ncols; c++)
			d->from[c] = d->full ? lowest[c] : starts[c][d->element];
	}
	return ndue;
}

/*
 * Advance the starts of due[] (from fs_probe_starts_read(), before the
 * claim query): each to the tenant's first row in the ready state in a
 * snapshot taken now, if its slot did not change since and no commit of
 * its rows is under way.  The caller has checked that the transaction
 * changed nothing before its claim.
 */
void
fs_probe_starts_advance(FsFairDesc *desc, const char *const *tenants, const FsProbeDue *due,
						int ndue, TimestampTz now)
{
	FsProbeStarts *ps = &desc->fq->probe_starts;

	for (int k = 0; k < ndue; k++)
	{
		const FsProbeDue *d = &due[k];
		const char *tenant = tenants[d->element];
		Datum		args[1 + FS_PROBE_START_MAX_COLS];
		int64		first[FS_PROBE_START_MAX_COLS];
		bool		isnull = false;
		FsProbeStart *slot;
		uint32		hash = fs_probe_start_hash(tenant);

		args[0] = CStringGetTextDatum(tenant);
		for (int c = 0; c < desc->start_ncols; c++)
			args[1 + c] = d->from[c];
		fs_fair_execute(desc, &desc->start_q, desc->start_plan, args, NULL,
						GetLatestSnapshot(), true, 1, "probe start query");
		if (SPI_processed != 1)
			continue;			/* no row at or above the start: it stays */
		for (int c = 0; c < desc->start_ncols && !isnull; c++)
		{
			Datum		value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
											  c + 1, &isnull);

			if (!isnull)
				first[c] = fs_probe_start_int64(desc->start_types[c], value);
		}
		if (isnull)
			continue;			/* NOT NULL dropped since the registration was read */

		SpinLockAcquire(&ps->mutex);
		slot = &ps->slots[d->slot];
		if (slot->gen == d->gen && slot->tenant_hash == hash &&
			strcmp(slot->tenant, tenant) == 0 && ps->signature == desc->start_signature &&
			pg_atomic_read_u32(fs_probe_start_bucket(ps, hash)) == 0)
		{
			memcpy(slot->values, first, sizeof(int64) * desc->start_ncols);
			slot->valid = true;
			if (d->full)
				slot->full_at = now;
			slot->gen++;
		}
		SpinLockRelease(&ps->mutex);
	}
}

/*
 * The committing buckets this backend's transaction entered (backend-local;
 * left at its end): each queue's starts and the bucket's index.
 */
typedef struct FsCommittingBucket
{
	FsProbeStarts *ps;
	int			bucket;
} FsCommittingBucket;

static FsCommittingBucket *fs_committing;
static int	fs_ncommitting;
static int	fs_committing_capacity;

/*
 * At pre-commit, before its rows can be seen: this transaction put rows of
 * `tenant` in `queue` into the ready state.  Enters the tenant's bucket,
 * once per transaction; recorded before it is entered, so that the
 * transaction's end always leaves what it entered.
 *
 * A claim whose snapshot sees the rows took it after they became visible,
 * which is after this entry: ProcArrayLock orders the commit's leaving the
 * process array after this atomic (a full barrier), and the snapshot after
 * it, so the claim reads the bucket taken (or, later, the start void).
 */
void
fs_probe_starts_committing(FsQueue *queue, const char *tenant)
{
	FsProbeStarts *ps = &fs_fair_queue(queue)->probe_starts;
	int			bucket = fs_probe_start_bucket_of(fs_probe_start_hash(tenant));

	for (int i = 0; i < fs_ncommitting; i++)
		if (fs_committing[i].ps == ps && fs_committing[i].bucket == bucket)
			return;
	if (fs_ncommitting == fs_committing_capacity)
	{
		int			capacity = Max(16, 2 * fs_committing_capacity);

		fs_committing = fs_committing == NULL ?
			MemoryContextAlloc(TopMemoryContext, sizeof(FsCommittingBucket) * capacity) :
			repalloc(fs_committing, sizeof(FsCommittingBucket) * capacity);
		fs_committing_capacity = capacity;
	}
	fs_committing[fs_ncommitting].ps = ps;
	fs_committing[fs_ncommitting].bucket = bucket;
	fs_ncommitting++;
	pg_atomic_fetch_add_u32(&ps->committing[bucket], 1);
}

/*
 * The transaction ended (at commit, after its rows became visible): void
 * the starts of every tenant of each bucket it entered (they may be above
 * its rows), then leave the bucket.  Runs at abort too, where voiding only
 * costs the next claims their start.  Nothing here can fail.
 */
void
fs_probe_starts_xact_end(void)
{
	for (int i = 0; i < fs_ncommitting; i++)
	{
		FsProbeStarts *ps = fs_committing[i].ps;
		int			bucket = fs_committing[i].bucket;

		SpinLockAcquire(&ps->mutex);
		for (int s = 0; s < FS_PROBE_START_SLOTS; s++)
			if (ps->slots[s].tenant_hash != 0 &&
				fs_probe_start_bucket_of(ps->slots[s].tenant_hash) == bucket)
			{
				ps->slots[s].valid = false;
				ps->slots[s].gen++;
			}
		SpinLockRelease(&ps->mutex);
		pg_atomic_fetch_sub_u32(&ps->committing[bucket], 1);
	}
	fs_ncommitting = 0;
}

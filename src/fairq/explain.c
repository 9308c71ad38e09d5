/*-------------------------------------------------------------------------
 *
 * explain.c
 *	  fs_explain_wait(): why a ready row of a registered queue waits, and for
 *	  how long it is expected to.
 *
 * The answer is put together from what a claim would look at, in the order
 * a claim would meet it: the row itself (found by the registered key, with
 * the caller's rights, as fs_claim() queries), its lock, the two parts of
 * the filter, its tenant, the tenant's slots against its ceiling (max_slots
 * and the global gate), its budget, a free worker thread, and its place in
 * the queue's fair order and in its tenant's own order.  The first thing
 * that holds the row back is its reason (the closed set in
 * fs_wait_reason_names[], documented in README.md).
 *
 * Nothing here writes or waits: the row is read in the caller's snapshot,
 * its lock is looked at on its heap page (as pgrowlocks does, without
 * taking it), the fair order is read under the queue's lock SHARED, and
 * each tenant entry under its spinlock, copied out (core/shmem.c rules 1
 * and 8).  Limits are read as fs_effective_limits() reads them.
 *
 * See order.c for how fair dequeue works, and fairqueue_int.h for which
 * file does what.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "budget/budget.h"
#include "core/tenant.h"
#include "fairq/fairqueue_int.h"
#include "gate/gate.h"
#include "limits/limits.h"

PG_FUNCTION_INFO_V1(fs_explain_wait);

/* The alias of the ready table in the queries below (as in register_int.h). */
#define FS_EXPLAIN_ALIAS	"fairshare_row"

/*
 * Why a row waits: the closed set of fs_explain_wait().reason, in the order
 * they are checked.  README.md ("Why is this job waiting?") documents each.
 */
typedef enum FsWaitReason
{
	FS_WAIT_NOT_FOUND = 0,		/* no row has the key (in the caller's view) */
	FS_WAIT_LOCKED,				/* another transaction locks or changes it */
	FS_WAIT_NOT_READY,			/* a part of the filter is not true */
	FS_WAIT_NO_TENANT,			/* its tenant is NULL or no valid name */
	FS_WAIT_UNTRACKED,			/* its tenant is not in the fair order */
	FS_WAIT_TENANT_LIMIT,		/* the tenant holds max_slots */
	FS_WAIT_GLOBAL_GATE,		/* the tenant holds its share of the workers */
	FS_WAIT_THROTTLED,			/* ... lowered by throttle_pct */
	FS_WAIT_NO_BUDGET,			/* the tenant's tokens cannot pay for a row */
	FS_WAIT_BACKPRESSURE,		/* every live worker thread holds a slot */
	FS_WAIT_FAIR_ORDER,			/* other tenants come first */
	FS_WAIT_TENANT_ORDER,		/* rows of its own tenant come first */
	FS_WAIT_CLAIMABLE			/* nothing: the next claim takes it */
} FsWaitReason;

static const char *const fs_wait_reason_names[] = {
	"not_found", "locked", "not_ready", "no_tenant", "untracked", "tenant_limit",
	"global_gate", "throttled", "no_budget", "backpressure", "fair_order",
	"tenant_order", "claimable"
};

StaticAssertDecl(lengthof(fs_wait_reason_names) == FS_WAIT_CLAIMABLE + 1,
				 "a name for every wait reason");

/* The columns of fs_explain_wait(), in order. */
enum
{
	FS_W_TENANT = 0,
	FS_W_REASON,
	FS_W_DETAIL,
	FS_W_TENANT_ROWS_AHEAD,
	FS_W_TENANTS_AHEAD,
	FS_W_ROWS_AHEAD,
	FS_W_SLOTS_IN_USE,
	FS_W_MAX_SLOTS,
	FS_W_SLOT_CEILING,
	FS_W_LIVE_THREADS,
	FS_W_THROTTLE_PCT,
	FS_W_TOKEN_BALANCE,
	FS_W_TOKENS_PER_ROW,
	FS_W_BUDGET_READY_AT,
	FS_W_BACKPRESSURE,
	FS_W_CLAIM_RATE,
	FS_W_ESTIMATED_START,
	FS_W_SUBKEY,
	FS_W_SUBKEYS_AHEAD,
	FS_W_NCOLUMNS
};

/* What is known of the row and its tenant, filled in as it is found. */
typedef struct FsWait
{
	FsWaitReason reason;
	StringInfoData detail;
	Datum		values[FS_W_NCOLUMNS];
	bool		nulls[FS_W_NCOLUMNS];
	/* the row */
	char	   *tenant;			/* NULL: the expression gave NULL */
	char		subkey[FS_NAME_BUFLEN];	/* a queue with a subkey: its leaf */
	bool		ready;			/* the ready part of the filter holds */
	bool		claimable;		/* the claim-time part holds */
	Oid			relid;			/* the table (partition) holding it */
	ItemPointerData tid;
	/* its tenant */
	int64		tenant_rows_ahead;	/* -1: not counted */
	int64		subkey_rows_ahead;	/* of them, its sub-key's; -1: not counted */
	int32		subkeys_ahead;	/* its tenant's sub-keys that start before it */
	FsTenantView view;
	bool		have_view;		/* the tenant has an entry */
	bool		in_order;		/* ... listed in the fair order */
	FsLimits	limits;			/* as fs_limits says now */
	FsGateCapacity cap;
	int32		ceiling;
	FsReason	ceiling_reason;
	float8		tokens_per_row;
	float8		unit_cost;		/* a row's cost in the fair order */
	/* the fair order */
	int32		tenants_ahead;
	int64		rows_ahead;
	/* throughput, rows per second; 0: unknown */
	float8		queue_rate;
	float8		tenant_rate;
} FsWait;

static bool fs_explain_after(TimestampTz now, float8 seconds, TimestampTz *at);

/* Set column `col` of the answer. */
static inline void
fs_wait_set(FsWait *w, int col, Datum value)
{
	w->values[col] = value;
	w->nulls[col] = false;
}

/* ----------------------------------------------------------------
 * The row, read with the caller's rights
 * ----------------------------------------------------------------
 */

/*
 * Append a piece of the registration to q's text (fs_q_piece()): an
 * expression in parentheses, the table and the order as they are.
 */
static void
fs_explain_piece(FsQueryText *q, StringInfo buf, const char *piece, const char *text)
{
	bool		paren = strcmp(piece, "ready_table") != 0 && strcmp(piece, "order_by") != 0;

	if (paren)
		appendStringInfoChar(buf, '(');
	fs_q_piece(q, buf, piece, text);
	if (paren)
		appendStringInfoChar(buf, ')');
}

/*
 * Run one of the queries below in the caller's snapshot, read only, with
 * fairshare's fixed search_path; an error is reported by queue and piece
 * (fs_fair_query_error()), never with the query's text.
 */
static void
fs_explain_run(FsFairDesc *desc, FsQueryText *q, int nargs, Oid *types, Datum *values,
			   MemoryContext cxt)
{
	PG_TRY();
	{
		int			nest = fs_search_path_begin();
		int			ret;

		ret = SPI_execute_with_args(q->sql, nargs, types, values, NULL, true, 1);
		/* SPI leaves its own context current: what is made next is ours. */
		MemoryContextSwitchTo(cxt);
		fs_search_path_end(nest);
		if (ret != SPI_OK_SELECT)
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("the query failed: %s", SPI_result_code_string(ret))));
	}
	PG_CATCH();
	{
		fs_fair_query_error(cxt, desc, q, "explain query");
	}
	PG_END_TRY();
}

/*
 * The job's key as a value of the queue's key type (so that the key's
 * unique index finds the row).  Text that is no such value is an error of
 * the type's input function, said to be about job_key.
 */
static Datum
fs_explain_key(FsFairDesc *desc, const char *job_key)
{
	Oid			typinput;
	Oid			typioparam;
	volatile Datum key = (Datum) 0;
	MemoryContext cxt = CurrentMemoryContext;

	getTypeInputInfo(desc->key_type, &typinput, &typioparam);
	PG_TRY();
	{
		key = OidInputFunctionCall(typinput, unconstify(char *, job_key), typioparam, -1);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		if (ERRCODE_TO_CATEGORY(edata->sqlerrcode) != ERRCODE_DATA_EXCEPTION)
			PG_RE_THROW();
		FlushErrorState();
		ereport(ERROR,
				(errcode(edata->sqlerrcode),
				 errmsg("job_key of queue \"%s\": %s", desc->queue_name, edata->message),
				 errhint("The key of queue \"%s\" is of type %s: pass its text form.",
						 desc->queue_name, format_type_be(desc->key_type))));
	}
	PG_END_TRY();
	return key;
}

/*
 * Find the row by its key, with its tenant, whether each part of the
 * filter holds, and where it is stored.  False when there is no such row
 * (or none the caller may see).
 */
static bool
fs_explain_find_row(FsFairDesc *desc, Datum key, FsWait *w, MemoryContext cxt)
{
	FsQueryText q;
	StringInfoData buf;
	Oid			types[1] = {desc->key_type};
	Datum		values[1] = {key};
	TupleDesc	tupdesc;
	HeapTuple	tuple;
	bool		isnull;
	Datum		d;

	memset(&q, 0, sizeof(q));
	initStringInfo(&buf);
	appendStringInfoString(&buf, "SELECT ");
	fs_explain_piece(&q, &buf, "tenant", desc->tenant);
	appendStringInfoString(&buf, ", ");
	if (desc->ready_filter)
		fs_explain_piece(&q, &buf, "filter", desc->ready_filter);
	else
		appendStringInfoString(&buf, "true");
	appendStringInfoString(&buf, " IS TRUE, ");
	if (desc->claim_filter)
		fs_explain_piece(&q, &buf, "filter", desc->claim_filter);
	else
		appendStringInfoString(&buf, "true");
	appendStringInfoString(&buf, " IS TRUE, " FS_EXPLAIN_ALIAS ".tableoid, " FS_EXPLAIN_ALIAS
						   ".ctid, ");
	if (desc->subkey)
		fs_explain_piece(&q, &buf, "subkey", desc->subkey);
	else
		appendStringInfoString(&buf, "NULL::pg_catalog.text");
	appendStringInfoString(&buf, " FROM ");
	fs_explain_piece(&q, &buf, "ready_table", desc->ready_name);
	appendStringInfoString(&buf, " " FS_EXPLAIN_ALIAS " WHERE ");
	fs_explain_piece(&q, &buf, "key", desc->key);
	appendStringInfoString(&buf, " OPERATOR(pg_catalog.=) $1");
	q.sql = buf.data;

	fs_explain_run(desc, &q, 1, types, values, cxt);
	if (SPI_processed == 0)
		return false;
	tupdesc = SPI_tuptable->tupdesc;
	tuple = SPI_tuptable->vals[0];
	d = SPI_getbinval(tuple, tupdesc, 1, &isnull);
	w->tenant = isnull ? NULL : TextDatumGetCString(d);
	w->ready = DatumGetBool(SPI_getbinval(tuple, tupdesc, 2, &isnull));
	w->claimable = DatumGetBool(SPI_getbinval(tuple, tupdesc, 3, &isnull));
	w->relid = DatumGetObjectId(SPI_getbinval(tuple, tupdesc, 4, &isnull));
	ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(tuple, tupdesc, 5, &isnull)), &w->tid);
	if (desc->subkey)
	{
		d = SPI_getbinval(tuple, tupdesc, 6, &isnull);
		fs_subkey_name(d, isnull, w->subkey);
	}
	return true;
}

/*
 * Rows of the same tenant that come before this one in the tenant's order
 * (the registered order_by), among the rows both parts of the filter hold
 * for: how a claim's query reads them.  The rows are numbered in that order
 * and the count stops at this row.
 */
static int64
fs_explain_tenant_rows_ahead(FsFairDesc *desc, Datum key, const char *tenant,
							 const char *subkey, MemoryContext cxt)
{
	FsQueryText q;
	StringInfoData buf;
	Oid			types[3] = {desc->key_type, TEXTOID, TEXTOID};
	Datum		values[3] = {key, CStringGetTextDatum(tenant), CStringGetTextDatum(subkey)};
	bool		isnull;
	Datum		n;

	memset(&q, 0, sizeof(q));
	initStringInfo(&buf);
	appendStringInfoString(&buf, "SELECT s.fs_n - 1 FROM (SELECT ");
	fs_explain_piece(&q, &buf, "key", desc->key);
	appendStringInfoString(&buf, " AS fs_key, pg_catalog.row_number() OVER (ORDER BY ");
	fs_explain_piece(&q, &buf, "tenant", desc->tenant);
	appendStringInfoString(&buf, ", ");
	fs_explain_piece(&q, &buf, "order_by", desc->order_by);
	appendStringInfoString(&buf, ") AS fs_n FROM ");
	fs_explain_piece(&q, &buf, "ready_table", desc->ready_name);
	appendStringInfoString(&buf, " " FS_EXPLAIN_ALIAS " WHERE ");
	/* As the claim query: a range, so that only the (tenant, order) index gives the order. */
	fs_explain_piece(&q, &buf, "tenant", desc->tenant);
	appendStringInfoString(&buf, " OPERATOR(pg_catalog.>=) $2 AND ");
	fs_explain_piece(&q, &buf, "tenant", desc->tenant);
	appendStringInfoString(&buf, " OPERATOR(pg_catalog.<=) $2");
	if (desc->ready_filter)
	{
		appendStringInfoString(&buf, " AND ");
		fs_explain_piece(&q, &buf, "filter", desc->ready_filter);
	}
	if (desc->claim_filter)
	{
		appendStringInfoString(&buf, " AND ");
		fs_explain_piece(&q, &buf, "filter", desc->claim_filter);
	}
	if (desc->subkey)
	{
		/* Its sub-key's rows only (the leaf of fs_subkey_name()). */
		appendStringInfoString(&buf, " AND CASE WHEN ");
		fs_explain_piece(&q, &buf, "subkey", desc->subkey);
		appendStringInfoString(&buf, " IS NULL OR pg_catalog.octet_length(");
		fs_explain_piece(&q, &buf, "subkey", desc->subkey);
		appendStringInfo(&buf, ") NOT BETWEEN 1 AND %d OR ", FS_NAME_MAXLEN);
		fs_explain_piece(&q, &buf, "subkey", desc->subkey);
		appendStringInfoString(&buf, " OPERATOR(pg_catalog.=) '" FS_SUBKEY_NONE "' THEN '"
							   FS_SUBKEY_NONE "' ELSE ");
		fs_explain_piece(&q, &buf, "subkey", desc->subkey);
		appendStringInfoString(&buf, " END OPERATOR(pg_catalog.=) $3");
	}
	appendStringInfoString(&buf, ") s WHERE s.fs_key OPERATOR(pg_catalog.=) $1 LIMIT 1");
	q.sql = buf.data;

	fs_explain_run(desc, &q, desc->subkey ? 3 : 2, types, values, cxt);
	if (SPI_processed == 0)
		return -1;				/* changed since it was found */
	n = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? -1 : DatumGetInt64(n);
}

/* How another transaction holds a row, as its heap tuple says. */
typedef enum FsRowLock
{
	FS_ROW_FREE = 0,
	FS_ROW_LOCKED,				/* locked, updated or deleted by a running transaction */
	FS_ROW_LOCKED_BY_US,		/* ... by this one */
	FS_ROW_CHANGED				/* changed by a transaction that committed since */
} FsRowLock;

/*
 * Is the row locked (or being changed) by a transaction that is still
 * running?  Read off its heap tuple under the page's share lock for a
 * moment, without taking the row's lock, which would hold claims off it:
 * a SKIP LOCKED claim skips exactly the rows this finds locked.  Tables of
 * another access method (and foreign partitions) are not looked at.
 */
static FsRowLock
fs_explain_row_lock(Oid relid, ItemPointer tid)
{
	Relation	rel;
	HeapTupleData tuple;
	Buffer		buffer;
	TM_Result	result;
	TransactionId xmax;
	bool		multi;
	FsRowLock	lock = FS_ROW_FREE;

	if (RecoveryInProgress())
		return FS_ROW_FREE;		/* a standby's rows are locked by nobody */
	/* The query that found the row holds this lock already. */
	rel = table_open(relid, AccessShareLock);
	if (rel->rd_rel->relkind != RELKIND_RELATION || rel->rd_rel->relam != HEAP_TABLE_AM_OID)
	{
		table_close(rel, AccessShareLock);
		return FS_ROW_FREE;
	}
	tuple.t_self = *tid;
	if (heap_fetch(rel, SnapshotAny, &tuple, &buffer, false))
	{
		LockBuffer(buffer, BUFFER_LOCK_SHARE);
		result = HeapTupleSatisfiesUpdate(&tuple, GetCurrentCommandId(false), buffer);
		xmax = HeapTupleHeaderGetRawXmax(tuple.t_data);
		multi = (tuple.t_data->t_infomask & HEAP_XMAX_IS_MULTI) != 0;
		LockBuffer(buffer, BUFFER_LOCK_UNLOCK);
		ReleaseBuffer(buffer);
		if (result == TM_BeingModified || result == TM_SelfModified)
			lock = !multi && TransactionIdIsCurrentTransactionId(xmax) ?
				FS_ROW_LOCKED_BY_US : FS_ROW_LOCKED;
		else if (result == TM_Updated || result == TM_Deleted)
			lock = FS_ROW_CHANGED;
	}
	table_close(rel, AccessShareLock);
	return lock;
}

/* ----------------------------------------------------------------
 * The tenant, the fair order and the throughput, from shared memory
 * ----------------------------------------------------------------
 */

/* A tenant of the fair order, as copied out under the queue's lock. */
typedef struct FsWaitItem
{
	float8		tag;			/* virtual finish */
	float8		weight;
	int64		ready;
	bool		eligible;		/* a claim may serve it now */
	bool		below_floor;
	int			name_cmp;		/* its name against the row's tenant's */
} FsWaitItem;

/*
 * Read the queue's fair order (its lock SHARED, each entry under its
 * spinlock) into `items` (room for `capacity`), and the row's tenant's own
 * place in it into w.  Returns how many other tenants were copied; *vtime
 * is the queue's virtual time.
 */
static int
fs_explain_read_order(FsFairDesc *desc, FsWait *w, FsWaitItem *items, int capacity,
					  FsWaitItem *mine, float8 *vtime, TimestampTz now)
{
	FsFairQueue *fq = desc->fq;
	int			n = 0;
	int			i;

	LWLockAcquire(fq->lock, LW_SHARED);
	*vtime = fq->vtime;
	for (i = 0; i < fq->nitems; i++)
	{
		FsHeapItem *item = fs_heap_at(fq, i);
		FsTenantView v;
		FsWaitItem *it;
		int32		ceiling;
		int			cmp = strcmp(item->tenant->key.tenant, w->tenant);

		if (cmp != 0 && n >= capacity)
			continue;
		fs_tenant_view(item->tenant, &v, now);
		it = cmp == 0 ? mine : &items[n++];
		ceiling = fs_plan_ceiling(&w->cap, &v);
		it->tag = item->key;
		it->weight = fs_fair_weight(v.limits.weight);
		it->ready = v.ready;
		it->eligible = v.ready > 0 && v.slots < ceiling && fs_view_can_pay(&v, 1, w->tokens_per_row) &&
			!fs_item_dry(item, &v, now);
		it->below_floor = v.slots < Min(v.limits.min_slots, ceiling);
		it->name_cmp = cmp;
		if (cmp == 0)
		{
			w->view = v;
			w->have_view = true;
			w->in_order = v.ready > 0;
		}
	}
	LWLockRelease(fq->lock);
	return n;
}

/*
 * Does `a` come before `b` in fair order?  As fs_ready_tenants() lists
 * them: tenants below their min_slots first, then by tag, then by name.
 */
static bool
fs_wait_item_before(const FsWaitItem *a, const FsWaitItem *b)
{
	if (a->below_floor != b->below_floor)
		return a->below_floor;
	if (a->tag != b->tag)
		return a->tag < b->tag;
	return a->name_cmp < b->name_cmp;
}

/*
 * The row's place in the fair order: the tenants a claim serves before its
 * tenant now (those with ready rows, a free slot and budget), and the rows
 * the queue is expected to claim before it.  Start-time fair queueing
 * gives the row the start tag S = max(V, F) + k c / w, k its tenant's rows
 * ahead of it; each other tenant that can run now has its rows with a
 * start tag before S served first (at most its ready rows).
 */
static void
fs_explain_place(FsFairDesc *desc, FsWait *w, TimestampTz now)
{
	FsFairQueue *fq = desc->fq;
	FsWaitItem *items;
	FsWaitItem	mine;
	int			capacity;
	int			n;
	float8		vtime;
	float8		start;
	int			i;

	LWLockAcquire(fq->lock, LW_SHARED);
	capacity = Max(fq->nitems, 1);
	LWLockRelease(fq->lock);
	items = palloc_extended(sizeof(FsWaitItem) * capacity, MCXT_ALLOC_HUGE);
	memset(&mine, 0, sizeof(mine));
	n = fs_explain_read_order(desc, w, items, capacity, &mine, &vtime, now);

	w->tenants_ahead = 0;
	w->rows_ahead = Max(w->tenant_rows_ahead, 0);
	start = Max(vtime, mine.tag) +
		Max(w->tenant_rows_ahead, 0) * w->unit_cost / fs_fair_weight(w->view.limits.weight);
	for (i = 0; i < n; i++)
	{
		const FsWaitItem *it = &items[i];
		float8		its_start = Max(vtime, it->tag);
		float8		unit = w->unit_cost / it->weight;
		int64		before = 0;

		if (!it->eligible)
			continue;
		if (w->in_order && fs_wait_item_before(it, &mine))
			w->tenants_ahead++;
		if (its_start < start)
		{
			/* Compared as a double: the count may be past any int64. */
			float8		steps = ceil((start - its_start) / unit);

			before = !(steps < (float8) it->ready) ? it->ready : (int64) steps;
		}
		else if (its_start == start && it->name_cmp < 0)
			before = 1;
		w->rows_ahead += Min(before, it->ready);
	}
	pfree(items);
}

/* What the throughput scan adds up. */
typedef struct FsWaitServed
{
	uint32		queue_id;
	const char *tenant;
	TimestampTz now;
	float8		queue;
	float8		tenant_served;
} FsWaitServed;

/* fs_tenant_foreach() visitor: add up the served work of the queue's tenants. */
static void
fs_explain_served(const FsTenant *t, void *arg)
{
	FsWaitServed *s = (FsWaitServed *) arg;
	float8		served;

	if (t->key.queue_id != s->queue_id)
		return;
	served = fs_served_decayed(t->served_ms, t->touched_at, s->now);
	s->queue += served;
	if (strcmp(t->key.tenant, s->tenant) == 0)
		s->tenant_served = served;
}

/*
 * The rows per second the queue, and the row's tenant, were served lately.
 * Served work decays with the half-life H (fairshare.fairness_half_life):
 * served at a steady r cost units a second, it settles at r H / ln 2, so
 * r = served ln 2 / H, and rows are cost units over a row's average cost.
 * Nothing served lately: 0 (unknown).
 */
static void
fs_explain_rates(FsFairDesc *desc, FsWait *w, TimestampTz now)
{
	FsWaitServed s;
	float8		per_second;

	s.queue_id = desc->queue->queue_id;
	s.tenant = w->tenant;
	s.now = now;
	s.queue = 0;
	s.tenant_served = 0;
	fs_tenant_foreach(fs_explain_served, &s);
	per_second = M_LN2 / Max(fs_fairness_half_life, 1) / w->unit_cost;
	w->queue_rate = s.queue >= FS_MIN_COST ? s.queue * per_second : 0;
	w->tenant_rate = s.tenant_served >= FS_MIN_COST ? s.tenant_served * per_second : 0;
}

/* ----------------------------------------------------------------
 * The reason, the figures and the estimate
 * ----------------------------------------------------------------
 */

/* Seconds until the tenant's bucket pays for its rows up to this one; -1: never. */
static float8
fs_explain_budget_wait(const FsWait *w)
{
	float8		per_minute = w->view.limits.budget_ms_per_minute;
	float8		needed;

	if (isinf(w->view.balance))
		return 0;
	needed = w->tokens_per_row * (Max(w->tenant_rows_ahead, 0) + 1) - w->view.balance;
	if (needed <= 0)
		return 0;
	/* The bucket holds at most a minute's accrual: a row costing more never runs. */
	if (per_minute <= 0 || w->tokens_per_row > per_minute)
		return -1;
	return needed / per_minute * 60.0;
}

/*
 * The tenant's capacity, budget and place: the reason among tenant_limit,
 * global_gate, throttled, no_budget, backpressure, fair_order,
 * tenant_order and claimable, with its detail.
 */
static void
fs_explain_capacity(FsFairDesc *desc, FsWait *w, TimestampTz now)
{
	FsBackpressure bp = fs_gate_backpressure(desc->queue, &w->cap, now);
	int32		live = w->cap.live_threads;
	int32		busy = (int32) pg_atomic_read_u32(&desc->queue->slots_in_use);

	if (w->view.slots >= w->ceiling)
	{
		w->reason = w->ceiling_reason == FS_REASON_THROTTLED ? FS_WAIT_THROTTLED :
			w->ceiling_reason == FS_REASON_GLOBAL_GATE ? FS_WAIT_GLOBAL_GATE :
			FS_WAIT_TENANT_LIMIT;
		if (w->reason == FS_WAIT_TENANT_LIMIT)
			appendStringInfo(&w->detail, "tenant \"%s\" holds %d of its %d slots (max_slots): its "
							 "next row starts when one of its jobs finishes",
							 w->tenant, w->view.slots, w->ceiling);
		else
			appendStringInfo(&w->detail, "tenant \"%s\" holds %d slot%s, its share of the %d live "
							 "worker threads of queue \"%s\" (%.2f threads%s): its next row starts "
							 "when one of its jobs finishes or more workers report",
							 w->tenant, w->view.slots, w->view.slots == 1 ? "" : "s", live,
							 desc->queue_name,
							 w->cap.share_threads * w->limits.throttle,
							 w->reason == FS_WAIT_THROTTLED ? ", lowered by its throttle_pct" : "");
	}
	else if (w->limits.budget_ms_per_minute >= 0 &&
			 !fs_view_can_pay(&w->view, Max(w->tenant_rows_ahead, 0) + 1, w->tokens_per_row))
	{
		w->reason = FS_WAIT_NO_BUDGET;
		appendStringInfo(&w->detail, "tenant \"%s\" has %s ms of tokens, and a row takes %s ms",
						 w->tenant, fs_float_text(round(w->view.balance * 1000) / 1000),
						 fs_float_text(w->tokens_per_row));
		if (w->tenant_rows_ahead > 0)
			appendStringInfo(&w->detail, " (%lld rows of it come first)",
							 (long long) w->tenant_rows_ahead);
		if (fs_explain_budget_wait(w) < 0)
			appendStringInfo(&w->detail, ": its budget of %s ms a minute never holds that much",
							 fs_float_text(w->view.limits.budget_ms_per_minute));
		else
			appendStringInfo(&w->detail, ": its budget of %s ms a minute pays for it in %.1f s",
							 fs_float_text(w->view.limits.budget_ms_per_minute),
							 fs_explain_budget_wait(w));
	}
	else if (bp == FS_BP_NO_FREE_THREAD)
	{
		w->reason = FS_WAIT_BACKPRESSURE;
		appendStringInfo(&w->detail, "every live worker thread of queue \"%s\" holds a slot "
						 "(%d of %d): no worker is free to claim it", desc->queue_name, busy, live);
	}
	else if (w->tenants_ahead > 0)
	{
		w->reason = FS_WAIT_FAIR_ORDER;
		appendStringInfo(&w->detail, "%d other tenant%s with a free slot come%s first in fair "
						 "order; %lld row%s expected to be claimed before it",
						 w->tenants_ahead, w->tenants_ahead == 1 ? "" : "s",
						 w->tenants_ahead == 1 ? "s" : "", (long long) w->rows_ahead,
						 w->rows_ahead == 1 ? " is" : "s are");
	}
	else if (w->tenant_rows_ahead > 0)
	{
		w->reason = FS_WAIT_TENANT_ORDER;
		appendStringInfo(&w->detail, "%lld row%s of tenant \"%s\" come%s first in its order (%s)",
						 (long long) w->tenant_rows_ahead, w->tenant_rows_ahead == 1 ? "" : "s",
						 w->tenant, w->tenant_rows_ahead == 1 ? "s" : "", desc->order_by);
		if (w->subkey_rows_ahead >= 0)
			appendStringInfo(&w->detail, ": %lld of its sub-key \"%s\", and %lld of %d other "
							 "sub-key%s whose turn comes first",
							 (long long) w->subkey_rows_ahead, w->subkey,
							 (long long) (w->tenant_rows_ahead - w->subkey_rows_ahead),
							 w->subkeys_ahead, w->subkeys_ahead == 1 ? "" : "s");
	}
	else
	{
		w->reason = FS_WAIT_CLAIMABLE;
		appendStringInfo(&w->detail, "nothing holds it back: the next claim from queue \"%s\" "
						 "takes it", desc->queue_name);
	}
	if (bp == FS_BP_LATENCY && w->reason != FS_WAIT_CLAIMABLE)
		appendStringInfoString(&w->detail, "; the queue's latency is over "
							   "fairshare.backpressure_latency (that holds back admission, not claims)");
	if (bp != FS_BP_NONE)
		fs_wait_set(w, FS_W_BACKPRESSURE,
					CStringGetTextDatum(bp == FS_BP_LATENCY ? "latency" : "no_free_thread"));
	else
		fs_wait_set(w, FS_W_BACKPRESSURE, CStringGetTextDatum("none"));
}

/*
 * The expected start: now when it is claimable; otherwise after the rows
 * ahead of it at the queue's measured rate, and no sooner than its tenant's
 * own rows ahead at the tenant's rate (when the tenant's ceiling holds it),
 * nor than its budget pays for it.  NULL (with a word in the detail) when
 * a rate it needs was not measured, and for rows nothing estimates (not
 * ready, locked, not found, without tenant, untracked).
 */
static void
fs_explain_estimate(FsWait *w, TimestampTz now)
{
	TimestampTz at;
	float8		seconds = 0;
	float8		budget;

	switch (w->reason)
	{
		case FS_WAIT_CLAIMABLE:
			break;
		case FS_WAIT_TENANT_LIMIT:
		case FS_WAIT_GLOBAL_GATE:
		case FS_WAIT_THROTTLED:
		case FS_WAIT_NO_BUDGET:
		case FS_WAIT_BACKPRESSURE:
		case FS_WAIT_FAIR_ORDER:
		case FS_WAIT_TENANT_ORDER:
			if (w->rows_ahead > 0 && w->queue_rate <= 0)
			{
				appendStringInfoString(&w->detail, "; no estimate: nothing was claimed from the "
									   "queue lately");
				return;
			}
			if (w->rows_ahead > 0)
				seconds = w->rows_ahead / w->queue_rate;
			if (w->reason == FS_WAIT_TENANT_LIMIT || w->reason == FS_WAIT_GLOBAL_GATE ||
				w->reason == FS_WAIT_THROTTLED)
			{
				if (w->tenant_rate <= 0)
				{
					appendStringInfo(&w->detail, "; no estimate: nothing of tenant \"%s\" was "
									 "claimed lately", w->tenant);
					return;
				}
				seconds = Max(seconds, (Max(w->tenant_rows_ahead, 0) + 1) / w->tenant_rate);
			}
			if (w->reason == FS_WAIT_BACKPRESSURE && w->queue_rate > 0)
				seconds = Max(seconds, 1.0 / w->queue_rate);
			budget = fs_explain_budget_wait(w);
			if (budget < 0)
				return;
			seconds = Max(seconds, budget);
			break;
		default:
			return;
	}
	if (fs_explain_after(now, seconds, &at))
		fs_wait_set(w, FS_W_ESTIMATED_START, TimestampTzGetDatum(at));
}

/*
 * `now` + `seconds` in *at; false when that is no time a timestamptz holds
 * (not finite, negative, or past the end of time: a rate near zero).
 */
static bool
fs_explain_after(TimestampTz now, float8 seconds, TimestampTz *at)
{
	float8		usecs = seconds * USECS_PER_SEC;

	if (isnan(usecs) || usecs < 0 || usecs >= (float8) (END_TIMESTAMP - now))
		return false;
	*at = now + (TimestampTz) llround(usecs);
	return true;
}

/* The figures of the tenant that every answer about a tracked tenant has. */
static void
fs_explain_figures(FsWait *w, TimestampTz now)
{
	float8		wait;

	fs_wait_set(w, FS_W_SLOTS_IN_USE, Int32GetDatum(w->view.slots));
	if (w->limits.max_slots != FS_NO_SLOT_LIMIT)
		fs_wait_set(w, FS_W_MAX_SLOTS, Int32GetDatum(w->limits.max_slots));
	if (w->ceiling != FS_NO_SLOT_LIMIT)
		fs_wait_set(w, FS_W_SLOT_CEILING, Int32GetDatum(w->ceiling));
	fs_wait_set(w, FS_W_LIVE_THREADS, Int32GetDatum(w->cap.live_threads));
	fs_wait_set(w, FS_W_THROTTLE_PCT, Float8GetDatum(w->limits.throttle * 100.0));
	if (!isinf(w->view.balance) && w->limits.budget_ms_per_minute >= 0)
	{
		TimestampTz at;

		fs_wait_set(w, FS_W_TOKEN_BALANCE, Float8GetDatum(w->view.balance));
		wait = fs_explain_budget_wait(w);
		if (wait >= 0 && fs_explain_after(now, wait, &at))
			fs_wait_set(w, FS_W_BUDGET_READY_AT, TimestampTzGetDatum(at));
	}
	fs_wait_set(w, FS_W_TOKENS_PER_ROW, Float8GetDatum(w->tokens_per_row));
}

/*
 * Everything about a row that is ready, claimable, and has a tenant: the
 * tenant's entry and place in the fair order, its limits, and the reason.
 */
static void
fs_explain_tenant(FsFairDesc *desc, FsWait *w, Datum key, TimestampTz now, MemoryContext cxt)
{
	FsFairQueue *fq = desc->fq;
	uint32		generation;

	w->tenant_rows_ahead = fs_explain_tenant_rows_ahead(desc, key, w->tenant, w->subkey, cxt);
	if (w->tenant_rows_ahead >= 0)
		fs_wait_set(w, FS_W_TENANT_ROWS_AHEAD, Int64GetDatum(w->tenant_rows_ahead));
	if (desc->subkey)
		fs_wait_set(w, FS_W_SUBKEY, CStringGetTextDatum(w->subkey));
	if (fq == NULL)
	{
		w->reason = FS_WAIT_UNTRACKED;
		appendStringInfo(&w->detail, "shared memory has no room for queue \"%s\": its rows are "
						 "claimed in the queue's own order (fail-open)", desc->queue_name);
		return;
	}
	if (!fs_limits_resolve(desc->queue, w->tenant, &w->limits, &generation))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("could not read fs_limits"),
				 errhint("See the warning above.")));
	fs_gate_capacity(desc->queue, now, &w->cap);
	w->ceiling = fs_gate_ceiling(&w->cap, &w->limits, &w->ceiling_reason);
	w->tokens_per_row = fs_fair_budget_cost(desc);
	w->unit_cost = fs_fair_clamp_cost(desc->cost != NULL ? fq->avg_cost :
									  desc->charge_runtime ? fq->avg_runtime_ms : 1.0, false);
	if (desc->subkey && w->tenant_rows_ahead >= 0)
	{
		/*
		 * Its tenant's order is its sub-keys' (subkeys.c): the rows of its
		 * own sub-key ahead of it, and those of the sub-keys that start
		 * before it.
		 */
		int64		leaf_rows = w->tenant_rows_ahead;
		int64		other = fs_leaf_rows_ahead(desc->queue, w->tenant, w->subkey, leaf_rows,
											   w->unit_cost, &w->subkeys_ahead);

		if (other >= 0)
		{
			w->tenant_rows_ahead = leaf_rows + other;
			fs_wait_set(w, FS_W_TENANT_ROWS_AHEAD, Int64GetDatum(w->tenant_rows_ahead));
			fs_wait_set(w, FS_W_SUBKEYS_AHEAD, Int32GetDatum(w->subkeys_ahead));
			w->subkey_rows_ahead = leaf_rows;
		}
	}

	fs_explain_place(desc, w, now);
	if (!w->have_view)
	{
		FsTenantRef ref;
		FsTenant   *entry = fs_tenant_open(desc->queue, w->tenant, FS_OPEN_NO_LIMITS, &ref);

		if (entry != NULL)
		{
			fs_tenant_view(entry, &w->view, now);
			fs_tenant_close(&ref);
			w->have_view = true;
		}
	}
	/* The limits of a decision now: fs_limits as committed. */
	w->view.limits = w->limits;
	if (w->have_view)
		fs_explain_figures(w, now);
	if (!w->in_order)
	{
		w->reason = FS_WAIT_UNTRACKED;
		appendStringInfo(&w->detail, "tenant \"%s\" has no ready rows in queue \"%s\"'s fair "
						 "order: shared memory had no room for it (its rows are claimed in the "
						 "queue's own order once the fair order has none left), or its count is "
						 "behind (fs_resync() recounts it)", w->tenant, desc->queue_name);
		return;
	}
	fs_wait_set(w, FS_W_TENANTS_AHEAD, Int32GetDatum(w->tenants_ahead));
	fs_wait_set(w, FS_W_ROWS_AHEAD, Int64GetDatum(w->rows_ahead));
	fs_explain_rates(desc, w, now);
	if (w->queue_rate > 0)
		fs_wait_set(w, FS_W_CLAIM_RATE, Float8GetDatum(w->queue_rate));
	fs_explain_capacity(desc, w, now);
	if (!fq->synced)
		appendStringInfoString(&w->detail, "; the queue was not counted from its table since the "
							   "server started, so its figures may be off until the next claim");
	fs_explain_estimate(w, now);
}

/*
 * The row: found, not locked, ready, with a tenant?  Sets the reason when
 * it is one of those; returns whether to look further.
 */
static bool
fs_explain_row(FsFairDesc **desc_p, FsWait *w, Datum key, const char *job_key, MemoryContext cxt)
{
	FsFairDesc *desc = *desc_p;
	bool		found = false;
	int			len;

	/* A distributed queue's row is in one of this node's shards, or not here. */
	if (!desc->distributed)
		found = fs_explain_find_row(desc, key, w, cxt);
	for (int p = 0; desc->distributed && p < desc->nparts && !found; p++)
		if ((found = fs_explain_find_row(&desc->parts[p], key, w, cxt)))
			*desc_p = &desc->parts[p];
	if (!found)
	{
		w->reason = FS_WAIT_NOT_FOUND;
		appendStringInfo(&w->detail, "no row of %s%s has key %s: it was claimed and left the ready "
						 "table, or never was there", desc->ready_name,
						 desc->distributed ? " in this node's shards" : "", job_key);
		return false;
	}
	desc = *desc_p;
	if (w->tenant != NULL)
		fs_wait_set(w, FS_W_TENANT, CStringGetTextDatum(w->tenant));
	switch (fs_explain_row_lock(w->relid, &w->tid))
	{
		case FS_ROW_LOCKED:
			w->reason = FS_WAIT_LOCKED;
			appendStringInfoString(&w->detail, "another transaction locks or changes the row (a "
								   "claim in progress, or a worker holding it): claims skip it "
								   "until that transaction ends");
			return false;
		case FS_ROW_LOCKED_BY_US:
			w->reason = FS_WAIT_LOCKED;
			appendStringInfoString(&w->detail, "this transaction locks or changes the row (it "
								   "claimed it): other claims skip it until it ends");
			return false;
		case FS_ROW_CHANGED:
			w->reason = FS_WAIT_LOCKED;
			appendStringInfoString(&w->detail, "a transaction that committed just now changed "
								   "the row (it was claimed): call again to see it as it is");
			return false;
		case FS_ROW_FREE:
			break;
	}
	if (!w->ready || !w->claimable)
	{
		w->reason = FS_WAIT_NOT_READY;
		if (!w->ready)
			appendStringInfo(&w->detail, "the row is not in the ready state: the filter of queue "
							 "\"%s\", %s, is not true for it", desc->queue_name, desc->ready_filter);
		else
			appendStringInfo(&w->detail, "the row is not claimable yet: the claim-time part of "
							 "the filter of queue \"%s\", %s, is not true for it (scheduled for "
							 "later, or held back by the application)", desc->queue_name,
							 desc->claim_filter);
		return false;
	}
	len = w->tenant != NULL ? strlen(w->tenant) : 0;
	if (len == 0 || len > FS_NAME_MAXLEN || strcmp(w->tenant, FS_WILDCARD) == 0)
	{
		w->reason = FS_WAIT_NO_TENANT;
		appendStringInfo(&w->detail, "the row's tenant (%s) is %s: fs_claim() never claims it "
						 "(counted in fs_fairness.rows_without_tenant)", desc->tenant,
						 w->tenant == NULL ? "NULL" : len == 0 ? "empty" :
						 len > FS_NAME_MAXLEN ? "longer than 63 bytes" : "\"*\"");
		return false;
	}
	return true;
}

/*
 * fs_explain_wait(queue text, job_key text) RETURNS record
 *
 * One row saying what holds the queue's ready row with this key back right
 * now (reason, from a closed set, and detail), the figures behind it, and
 * when it is expected to start.  Reads only; takes no lock that waits.
 */
Datum
fs_explain_wait(PG_FUNCTION_ARGS)
{
	char		queue_name[FS_NAME_BUFLEN];
	char	   *job_key;
	FsFairDesc *desc;
	TupleDesc	tupdesc;
	FsWait		w;
	Datum		key;
	TimestampTz now;
	MemoryContext cxt = CurrentMemoryContext;

	fs_check_loaded();
	fs_name_arg(fcinfo, 0, "queue", queue_name);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("job_key must not be null"),
				 errhint("Pass the key of a row of the queue's table as text, for example '42'.")));
	job_key = text_to_cstring(PG_GETARG_TEXT_PP(1));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	desc = fs_fair_desc(queue_name, false);
	/* As fs_ready_tenants(): the answer counts rows of every tenant. */
	fs_fair_check_counts_readable(desc, "fs_explain_wait", "explain the rows");

	memset(&w, 0, sizeof(w));
	memset(w.nulls, true, sizeof(w.nulls));
	initStringInfo(&w.detail);
	w.tenant_rows_ahead = -1;
	w.subkey_rows_ahead = -1;
	now = fs_now();
	key = fs_explain_key(desc, job_key);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	/* Results are ours, not SPI's: they outlive SPI_finish(). */
	MemoryContextSwitchTo(cxt);
	if (fs_explain_row(&desc, &w, key, job_key, cxt))
		fs_explain_tenant(desc, &w, key, now, cxt);
	SPI_finish();

	fs_wait_set(&w, FS_W_REASON, CStringGetTextDatum(fs_wait_reason_names[w.reason]));
	fs_wait_set(&w, FS_W_DETAIL, CStringGetTextDatum(w.detail.data));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), w.values, w.nulls)));
}

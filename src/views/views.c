/*-------------------------------------------------------------------------
 *
 * telemetry.c
 *	  Views of fairshare's live state and counters, and their reset.
 *
 * Each view is a set-returning function over a copy of the shared state
 * taken under the locks shmem.c prescribes; the SQL views on top add
 * nothing but names.  Only the current database's queues are shown.
 *
 * The decision log keeps the last fairshare.decision_log_size decisions of
 * each backend slot in a ring of its own: its one writer never waits for
 * anyone and never makes anyone wait.  Each record carries a sequence number
 * that is odd while it is being written; a reader copies a record and keeps
 * it only if the number was even and unchanged around the copy.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "funcapi.h"
#include "miscadmin.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "budget/budget.h"
#include "fairq/fairqueue.h"
#include "core/shmem.h"
#include "slots/slots.h"
#include "views/views.h"
#include "tiers/tiers.h"

PG_FUNCTION_INFO_V1(fs_tenant_state);
PG_FUNCTION_INFO_V1(fs_lease_state);
PG_FUNCTION_INFO_V1(fs_server_state);
PG_FUNCTION_INFO_V1(fs_reset);
PG_FUNCTION_INFO_V1(fs_decision_state);

/* A copy of the queue table: id -> name, for this database only. */
typedef struct FsQueueNames
{
	int			count;
	char	  (*names)[FS_NAME_BUFLEN];	/* "" for other databases' queues */
} FsQueueNames;

static void
fs_queue_names(FsQueueNames *qn)
{
	int			i;

	LWLockAcquire(fs_shared->queues_lock, LW_SHARED);
	qn->count = fs_shared->num_queues;
	qn->names = palloc0(sizeof(*qn->names) * Max(qn->count, 1));
	for (i = 0; i < qn->count; i++)
		if (fs_shared->queues[i]->key.dboid == MyDatabaseId)
			strlcpy(qn->names[i], fs_shared->queues[i]->key.name, FS_NAME_BUFLEN);
	LWLockRelease(fs_shared->queues_lock);
}

static const char *
fs_queue_name_of(const FsQueueNames *qn, uint32 queue_id)
{
	if (queue_id >= (uint32) qn->count || qn->names[queue_id][0] == '\0')
		return NULL;
	return qn->names[queue_id];
}

/*
 * Copies of tenant entries, taken under the partition locks; the tuples are
 * built afterwards, with no fairshare lock held (a tuplestore may spill to
 * disk).
 */
typedef struct FsTenantCopies
{
	FsTenant   *entries;
	long		count;
	long		capacity;
} FsTenantCopies;

static void
fs_tenant_copy(const FsTenant *t, void *arg)
{
	FsTenantCopies *c = (FsTenantCopies *) arg;

	if (c->count < c->capacity)
		c->entries[c->count++] = *t;
}

static void
fs_tenant_state_row(ReturnSetInfo *rsinfo, const char *queue, FsTenant *t, TimestampTz now)
{
	Datum		values[FS_TENANT_STATE_COLS];
	bool		nulls[FS_TENANT_STATE_COLS];
	int			i = 0;
	int			r;

	memset(nulls, 0, sizeof(nulls));

	values[i++] = CStringGetTextDatum(queue);
	values[i++] = CStringGetTextDatum(t->key.tenant);
	values[i++] = Int32GetDatum(t->slots_in_use);
	values[i++] = Int32GetDatum(t->max_slots);
	values[i++] = Int32GetDatum(t->min_slots);
	values[i++] = Float8GetDatum(t->weight);
	if (t->budget_ms_per_minute < 0)
	{
		nulls[i++] = true;
		nulls[i++] = true;
	}
	else
	{
		/* The balance as of now: accrue the copy (the entry is not touched). */
		fs_budget_accrue(t, Max(now, t->touched_at));
		values[i++] = Float8GetDatum(t->budget_ms_per_minute);
		values[i++] = Float8GetDatum(t->token_balance);
	}
	values[i++] = Float8GetDatum(t->throttle * 100.0);
	values[i++] = Int64GetDatum(Max(t->ready_rows, 0));
	values[i++] = Float8GetDatum(t->virtual_finish);
	for (r = 0; r < FS_NUM_TENANT_REASONS; r++)
		values[i++] = Int64GetDatum((int64) t->decisions[r]);
	values[i++] = Int64GetDatum((int64) t->leases_expired);
	values[i++] = Int64GetDatum((int64) t->failed_to_deliver);
	values[i++] = Float8GetDatum(t->served_ms);
	values[i++] = TimestampTzGetDatum(t->touched_at);
	Assert(i == FS_TENANT_STATE_COLS);

	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/* fs_tenant_state(): one row per (queue, tenant) entry of this database. */
Datum
fs_tenant_state(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo;
	FsQueueNames queues;
	FsTenantCopies copies;
	TimestampTz now;
	long		i;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	now = fs_now();
	fs_queue_names(&queues);

	copies.capacity = fs_max_tenants;
	copies.count = 0;
	copies.entries = palloc_extended(sizeof(FsTenant) * copies.capacity, MCXT_ALLOC_HUGE);
	fs_tenant_foreach(fs_tenant_copy, &copies);

	for (i = 0; i < copies.count; i++)
	{
		FsTenant   *t = &copies.entries[i];
		const char *queue = fs_queue_name_of(&queues, t->key.queue_id);

		if (queue != NULL)
			fs_tenant_state_row(rsinfo, queue, t, now);
	}
	return (Datum) 0;
}

static const char *
fs_lease_state_name(uint8 state)
{
	switch (state)
	{
		case FS_LEASE_LIVE:
			return "live";
		case FS_LEASE_RELEASING:
			return "releasing";
		case FS_LEASE_ORPHAN:
			return "orphan";
	}
	return "unknown";
}

typedef struct FsLeaseCollect
{
	FsLeaseInfo *rows;
	int			count;
	int			capacity;
} FsLeaseCollect;

/* Copies only: building tuples waits until the lease locks are released. */
static void
fs_lease_collect(const FsLeaseInfo *lease, void *arg)
{
	FsLeaseCollect *c = (FsLeaseCollect *) arg;

	if (c->count < c->capacity)
		c->rows[c->count++] = *lease;
}

/* fs_lease_state(): one row per lease of this database's queues. */
Datum
fs_lease_state(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo;
	FsQueueNames queues;
	FsLeaseCollect collect;
	int			i;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	fs_queue_names(&queues);

	/* Allocated before the scan: the visitor runs under lease locks. */
	collect.capacity = fs_max_leases;
	collect.count = 0;
	collect.rows = palloc_extended(sizeof(FsLeaseInfo) * collect.capacity, MCXT_ALLOC_HUGE);
	fs_lease_foreach(fs_lease_collect, &collect);

	for (i = 0; i < collect.count; i++)
	{
		const FsLeaseInfo *l = &collect.rows[i];
		const char *queue = fs_queue_name_of(&queues, l->tenant_key.queue_id);
		Datum		values[8];
		bool		nulls[8] = {false, false, false, false, false, false, false, false};

		if (queue == NULL)
			continue;
		values[0] = Int64GetDatum(l->lease_id);
		values[1] = CStringGetTextDatum(queue);
		values[2] = CStringGetTextDatum(l->tenant_key.tenant);
		values[3] = CStringGetTextDatum(fs_lease_state_name(l->state));
		values[4] = TimestampTzGetDatum(l->acquired_at);
		values[5] = TimestampTzGetDatum(l->expires_at);
		if (l->holder_pid == 0)
			nulls[6] = true;
		else
			values[6] = Int32GetDatum(l->holder_pid);
		/* regrole: a dropped owner shows as its OID. */
		if (!OidIsValid(l->owner))
			nulls[7] = true;
		else
			values[7] = ObjectIdGetDatum(l->owner);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

static const char *
fs_start_kind_name(FsStartKind kind)
{
	switch (kind)
	{
		case FS_START_FRESH:
			return "fresh";
		case FS_START_RESTORED:
			return "restored";
		case FS_START_AFTER_CRASH:
			return "after_crash";
	}
	return "unknown";
}

/* fs_server_state(): one row of server-wide figures. */
Datum
fs_server_state(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	FsGlobalStats stats;
	Datum		values[FS_SERVER_STATE_COLS];
	bool		nulls[FS_SERVER_STATE_COLS];
	int			num_queues;
	int			i = 0;

	fs_check_loaded();
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	desc = BlessTupleDesc(desc);
	memset(nulls, 0, sizeof(nulls));

	SpinLockAcquire(&fs_shared->stats_mutex);
	memcpy(&stats, &fs_shared->stats, sizeof(stats));
	SpinLockRelease(&fs_shared->stats_mutex);
	LWLockAcquire(fs_shared->queues_lock, LW_SHARED);
	num_queues = fs_shared->num_queues;
	LWLockRelease(fs_shared->queues_lock);

	values[i++] = Int64GetDatum(fs_tenant_count());
	values[i++] = Int32GetDatum(fs_max_tenants);
	values[i++] = Int32GetDatum((int32) sizeof(FsTenant));
	values[i++] = Int32GetDatum((int32) fs_tenant_entry_bytes());
	values[i++] = Int64GetDatum(fs_lease_count());
	values[i++] = Int32GetDatum(fs_max_leases);
	values[i++] = Int32GetDatum(num_queues);
	values[i++] = Int32GetDatum(fs_max_queues);
	values[i++] = Int64GetDatum((int64) stats.fail_open);
	values[i++] = Int64GetDatum((int64) stats.evictions);
	values[i++] = Int64GetDatum((int64) stats.tenant_table_full);
	values[i++] = Int64GetDatum((int64) stats.queue_table_full);
	values[i++] = Int64GetDatum((int64) stats.lease_table_full);
	values[i++] = Int64GetDatum((int64) stats.limits_unreadable);
	values[i++] = Int64GetDatum((int64) stats.leases_expired);
	values[i++] = Int64GetDatum((int64) stats.leases_orphaned);
	values[i++] = Int64GetDatum((int64) stats.leases_reregistered);
	values[i++] = Int64GetDatum(fs_tier_count());
	values[i++] = Int32GetDatum(fs_max_tier_keys);
	values[i++] = Int32GetDatum((int32) fs_tier_bytes_per_key());
	values[i++] = Int32GetDatum((int32) fs_tier_bytes_per_rule());
	values[i++] = CStringGetTextDatum(fs_start_kind_name(fs_shared->start_kind));
	values[i++] = TimestampTzGetDatum(fs_shared->started_at);
	values[i++] = TimestampTzGetDatum(stats.reset_at);
	Assert(i == FS_SERVER_STATE_COLS);

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

static void
fs_reset_tenant(FsTenant *entry, void *arg pg_attribute_unused())
{
	memset(entry->decisions, 0, sizeof(entry->decisions));
	entry->leases_expired = 0;
	entry->failed_to_deliver = 0;
	entry->served_ms = 0;
}

/*
 * fs_reset(): zero every counter (per tenant and server-wide).  Live state
 * (slots, leases, balances, backlog, fair-order tags) is not touched.
 */
Datum
fs_reset(PG_FUNCTION_ARGS)
{
	fs_check_loaded();
	fs_tenant_mutate_all(fs_reset_tenant, NULL);
	fs_fairqueue_reset_counters();

	SpinLockAcquire(&fs_shared->stats_mutex);
	memset(&fs_shared->stats, 0, sizeof(fs_shared->stats));
	fs_shared->stats.reset_at = GetCurrentTimestamp();
	SpinLockRelease(&fs_shared->stats_mutex);
	PG_RETURN_VOID();
}

/* ----------------------------------------------------------------
 * The decision log
 * ----------------------------------------------------------------
 */

int			fs_decision_log_size = 64;

typedef struct FsDecisionRecord
{
	pg_atomic_uint32 seq;		/* odd while being written */
	int32		pid;
	uint64		number;			/* the backend slot's decision number */
	TimestampTz at;
	uint32		queue_id;
	uint8		kind;
	uint8		reason;
	int32		requested;
	int32		runs_possible;
	int32		granted;
	float8		tokens_before;
	float8		tokens_consumed;
	float8		balance_after;
	char		tenant[FS_NAME_BUFLEN];
} FsDecisionRecord;

typedef struct FsDecisionRing
{
	uint64		next;			/* written by the owner only */
	FsDecisionRecord records[FLEXIBLE_ARRAY_MEMBER];
} FsDecisionRing;

static char *fs_decision_rings = NULL;
static int	fs_decision_ring_count = 0;

static inline Size
fs_decision_ring_bytes(void)
{
	return MAXALIGN(add_size(offsetof(FsDecisionRing, records),
							 mul_size(sizeof(FsDecisionRecord), fs_decision_log_size)));
}

void
fs_telemetry_init(void)
{
	DefineCustomIntVariable("fairshare.decision_log_size",
							"Recent decisions kept per backend for the fs_decisions view (0 keeps none).",
							NULL,
							&fs_decision_log_size,
							64, 0, 100000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
}

Size
fs_telemetry_shmem_size(void)
{
	if (fs_decision_log_size == 0)
		return 0;
	return mul_size(fs_decision_ring_bytes(), MaxBackends);
}

void
fs_telemetry_shmem_init(void)
{
	bool		found;
	int			i;
	int			j;

	fs_decision_ring_count = fs_decision_log_size > 0 ? MaxBackends : 0;
	if (fs_decision_ring_count == 0)
		return;
	fs_decision_rings = ShmemInitStruct("fairshare decisions",
										fs_telemetry_shmem_size(), &found);
	if (found)
		return;
	for (i = 0; i < fs_decision_ring_count; i++)
	{
		FsDecisionRing *ring = (FsDecisionRing *) (fs_decision_rings + i * fs_decision_ring_bytes());

		ring->next = 0;
		for (j = 0; j < fs_decision_log_size; j++)
		{
			pg_atomic_init_u32(&ring->records[j].seq, 0);
			ring->records[j].at = 0;
		}
	}
}

/* Start a decision record: nothing granted, nothing possible, no tokens. */
void
fs_decision_init(FsDecision *d, FsDecisionKind kind, const char *tenant, TimestampTz now)
{
	memset(d, 0, sizeof(*d));
	d->kind = kind;
	d->tenant = tenant;
	d->queue_id = PG_UINT32_MAX;
	d->runs_possible = -1;
	d->tokens_before = d->tokens_consumed = d->balance_after = NAN;
	d->at = now;
}

/*
 * Log a decision in this backend's ring.  No lock: each ring has one writer
 * (the backend in that slot), and readers check the record's sequence.
 */
void
fs_decision_log(const FsDecision *d)
{
	FsDecisionRing *ring;
	FsDecisionRecord *rec;
	int			slot = (int) FS_MY_PROC_NUMBER - FS_FIRST_PROC_NUMBER;
	uint32		seq;

	if (fs_decision_ring_count == 0 || slot < 0 || slot >= fs_decision_ring_count)
		return;
	ring = (FsDecisionRing *) (fs_decision_rings + slot * fs_decision_ring_bytes());
	rec = &ring->records[ring->next % fs_decision_log_size];

	seq = pg_atomic_read_u32(&rec->seq);
	pg_atomic_write_u32(&rec->seq, seq + 1);
	pg_write_barrier();
	rec->pid = MyProcPid;
	rec->number = ring->next;
	rec->at = d->at;
	rec->queue_id = d->queue_id;
	rec->kind = (uint8) d->kind;
	rec->reason = (uint8) d->reason;
	rec->requested = d->requested;
	rec->runs_possible = d->runs_possible;
	rec->granted = d->granted;
	rec->tokens_before = d->tokens_before;
	rec->tokens_consumed = d->tokens_consumed;
	rec->balance_after = d->balance_after;
	strlcpy(rec->tenant, d->tenant, FS_NAME_BUFLEN);
	pg_write_barrier();
	pg_atomic_write_u32(&rec->seq, seq + 2);
	ring->next++;
}

static const char *
fs_decision_kind_name(uint8 kind)
{
	switch ((FsDecisionKind) kind)
	{
		case FS_DECISION_SLOT:
			return "slot";
		case FS_DECISION_SPEND:
			return "spend";
		case FS_DECISION_CHARGE:
			return "charge";
		case FS_DECISION_CLAIM:
			return "claim";
	}
	return "unknown";
}

static void
fs_put_float_or_null(Datum *values, bool *nulls, int i, float8 v)
{
	if (isnan(v))
		nulls[i] = true;
	else
		values[i] = Float8GetDatum(v);
}

/* fs_decision_state(): recent decisions of this database's queues. */
Datum
fs_decision_state(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo;
	FsQueueNames queues;
	int			i;
	int			j;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	fs_queue_names(&queues);

	for (i = 0; i < fs_decision_ring_count; i++)
	{
		FsDecisionRing *ring = (FsDecisionRing *) (fs_decision_rings + i * fs_decision_ring_bytes());

		for (j = 0; j < fs_decision_log_size; j++)
		{
			FsDecisionRecord *rec = &ring->records[j];
			FsDecisionRecord copy;
			uint32		before;
			const char *queue;
			Datum		values[13];
			bool		nulls[13];

			before = pg_atomic_read_u32(&rec->seq);
			if (before == 0 || (before & 1))
				continue;		/* never written, or being written */
			pg_read_barrier();
			memcpy(&copy, rec, sizeof(copy));
			pg_read_barrier();
			if (pg_atomic_read_u32(&rec->seq) != before)
				continue;		/* overwritten while we copied */
			copy.tenant[FS_NAME_MAXLEN] = '\0';
			queue = fs_queue_name_of(&queues, copy.queue_id);
			if (queue == NULL)
				continue;

			memset(nulls, 0, sizeof(nulls));
			values[0] = TimestampTzGetDatum(copy.at);
			values[1] = Int32GetDatum(copy.pid);
			values[2] = CStringGetTextDatum(fs_decision_kind_name(copy.kind));
			values[3] = CStringGetTextDatum(queue);
			values[4] = CStringGetTextDatum(copy.tenant);
			values[5] = Int32GetDatum(copy.requested);
			if (copy.runs_possible < 0)
				nulls[6] = true;
			else
				values[6] = Int32GetDatum(copy.runs_possible);
			values[7] = Int32GetDatum(copy.granted);
			fs_put_float_or_null(values, nulls, 8, copy.tokens_before);
			fs_put_float_or_null(values, nulls, 9, copy.tokens_consumed);
			fs_put_float_or_null(values, nulls, 10, copy.balance_after);
			values[11] = CStringGetTextDatum(copy.reason < FS_NUM_REASONS ?
											 fs_reason_names[copy.reason] : "unknown");
			values[12] = Int64GetDatum((int64) copy.number);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	return (Datum) 0;
}

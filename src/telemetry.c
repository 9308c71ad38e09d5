/*-------------------------------------------------------------------------
 *
 * telemetry.c
 *	  Views of fairshare's live state and counters, and their reset.
 *
 * Each view is a set-returning function over a copy of the shared state
 * taken under the locks shmem.c prescribes; the SQL views on top add
 * nothing but names.  Only the current database's queues are shown.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "fairqueue.h"
#include "shmem.h"
#include "slots.h"
#include "telemetry.h"

PG_FUNCTION_INFO_V1(fs_tenant_state);
PG_FUNCTION_INFO_V1(fs_lease_state);
PG_FUNCTION_INFO_V1(fs_server_state);
PG_FUNCTION_INFO_V1(fs_reset);

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

typedef struct FsTenantScan
{
	ReturnSetInfo *rsinfo;
	FsQueueNames queues;
} FsTenantScan;

static void
fs_tenant_state_row(const FsTenant *t, void *arg)
{
	FsTenantScan *scan = (FsTenantScan *) arg;
	const char *queue = fs_queue_name_of(&scan->queues, t->key.queue_id);
	Datum		values[FS_TENANT_STATE_COLS];
	bool		nulls[FS_TENANT_STATE_COLS];
	int			i = 0;
	int			r;

	if (queue == NULL)
		return;
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
		values[i++] = Float8GetDatum(t->budget_ms_per_minute);
		values[i++] = Float8GetDatum(t->token_balance);
	}
	values[i++] = Float8GetDatum(t->throttle * 100.0);
	values[i++] = Int64GetDatum(t->ready_rows);
	values[i++] = Float8GetDatum(t->virtual_finish);
	for (r = 0; r < FS_NUM_TENANT_REASONS; r++)
		values[i++] = Int64GetDatum((int64) t->decisions[r]);
	values[i++] = Int64GetDatum((int64) t->leases_expired);
	values[i++] = Int64GetDatum((int64) t->failed_to_deliver);
	values[i++] = Float8GetDatum(t->served_ms);
	values[i++] = TimestampTzGetDatum(t->touched_at);
	Assert(i == FS_TENANT_STATE_COLS);

	tuplestore_putvalues(scan->rsinfo->setResult, scan->rsinfo->setDesc, values, nulls);
}

/* fs_tenant_state(): one row per (queue, tenant) entry of this database. */
Datum
fs_tenant_state(PG_FUNCTION_ARGS)
{
	FsTenantScan scan;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	scan.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	fs_queue_names(&scan.queues);
	fs_tenant_foreach(fs_tenant_state_row, &scan);
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

typedef struct FsLeaseRow
{
	FsLeaseInfo info;
} FsLeaseRow;

typedef struct FsLeaseCollect
{
	FsLeaseRow *rows;
	int			count;
	int			capacity;
} FsLeaseCollect;

/* Copies only: building tuples waits until the lease locks are released. */
static void
fs_lease_collect(const FsLeaseInfo *lease, void *arg)
{
	FsLeaseCollect *c = (FsLeaseCollect *) arg;

	if (c->count < c->capacity)
		c->rows[c->count++].info = *lease;
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
	collect.rows = palloc_extended(sizeof(FsLeaseRow) * collect.capacity, MCXT_ALLOC_HUGE);
	fs_lease_foreach(fs_lease_collect, &collect);

	for (i = 0; i < collect.count; i++)
	{
		const FsLeaseInfo *l = &collect.rows[i].info;
		const char *queue = fs_queue_name_of(&queues, l->tenant_key.queue_id);
		Datum		values[7];
		bool		nulls[7] = {false, false, false, false, false, false, false};

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
	values[i++] = Int64GetDatum((int64) stats.leases_expired);
	values[i++] = Int64GetDatum((int64) stats.leases_orphaned);
	values[i++] = Int64GetDatum((int64) stats.leases_reregistered);
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

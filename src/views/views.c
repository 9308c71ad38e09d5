/*-------------------------------------------------------------------------
 *
 * views.c
 *	  Views of fairshare's live state and counters, and their reset.
 *
 * Each view is a set-returning function over a copy of the shared state
 * taken under the locks core/shmem.c prescribes; the SQL views on top add
 * nothing but names.  Only the current database's queues are shown.  The
 * decision log's view is core/decisions.c's.
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
#include "core/cluster.h"
#include "core/shmem.h"
#include "fairq/fairqueue.h"
#include "slots/slots.h"
#include "tiers/tiers.h"
#include "views/views.h"

PG_FUNCTION_INFO_V1(fs_tenant_state);
PG_FUNCTION_INFO_V1(fs_lease_state);
PG_FUNCTION_INFO_V1(fs_server_state);
PG_FUNCTION_INFO_V1(fs_reset);

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

/* fs_tenant_foreach() visitor: copy each entry, within the room made. */
static void
fs_tenant_copy(const FsTenant *t, void *arg)
{
	FsTenantCopies *c = (FsTenantCopies *) arg;

	if (c->count < c->capacity)
		c->entries[c->count++] = *t;
}

/*
 * One row of fs_tenants, from a copy of the entry taken under its spinlock.
 */
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
	nulls[i] = t->max_slots == FS_NO_SLOT_LIMIT;
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

/* fs_leases.state of a lease. */
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
		values[0] = Int64GetDatum(fs_lease_id_out(l->lease_id));
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

/* fs_stats.start_kind of how this run began. */
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
		case FS_START_REPLAYED:
			return "replayed";
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

/* fs_tenant_mutate_all() visitor of fs_reset(): zero an entry's counters. */
static void
fs_reset_tenant(FsTenant *entry, void *arg pg_attribute_unused())
{
	fs_tenant_reset_counters(entry);
}

/*
 * fs_reset(): zero every counter (per tenant and server-wide).  Live state
 * (slots, leases, balances, backlog, fair-order tags) is not touched.
 */
Datum
fs_reset(PG_FUNCTION_ARGS)
{
	fs_check_primary("reset fairshare counters");
	fs_tenant_mutate_all(fs_reset_tenant, NULL);
	fs_fairqueue_reset_counters();

	SpinLockAcquire(&fs_shared->stats_mutex);
	memset(&fs_shared->stats, 0, sizeof(fs_shared->stats));
	fs_shared->stats.reset_at = GetCurrentTimestamp();
	SpinLockRelease(&fs_shared->stats_mutex);
	PG_RETURN_VOID();
}

/*-------------------------------------------------------------------------
 *
 * metrics.c
 *	  The fairness metrics: fs_fairness and fs_fair_shares.
 *
 * See order.c for how fair dequeue works, and fairqueue_int.h for which
 * file does what.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "budget/budget.h"
#include "core/stateformat.h"
#include "core/subxact.h"
#include "fairq/fairqueue_int.h"
#include "gate/gate.h"
#include "limits/limits.h"
#include "slots/slots.h"

PG_FUNCTION_INFO_V1(fs_fairness_state);
PG_FUNCTION_INFO_V1(fs_fair_share_state);

/* ----------------------------------------------------------------
 * Fairness metrics
 * ----------------------------------------------------------------
 */

/*
 * The fair order's say on evicting an idle tenant entry (core/shmem.c's
 * fs_tenant_evictable_hook): not while it is listed in the fair order, nor
 * while its finish tag is ahead of the queue's virtual time.
 */
bool
fs_fairqueue_may_evict(const FsTenant *entry)
{
	if (entry->flags & FS_TENANT_QUEUED)
		return false;
	if (fs_fair == NULL || entry->key.queue_id >= (uint32) fs_max_queues)
		return true;

	/*
	 * A tenant ahead of the queue's virtual time still owes what it was
	 * served; forgetting it would give that back.  (Read without the queue's
	 * lock: a stale value only delays or hastens one eviction.)
	 */
	return entry->virtual_finish <= fs_fair->queues[entry->key.queue_id].vtime;
}

/*
 * fs_reset(): zero every queue's fairness counters; the fair order and
 * backlogs are kept.
 */
void
fs_fairqueue_reset_counters(void)
{
	int			i;

	if (fs_fair == NULL)
		return;
	for (i = 0; i < fs_max_queues; i++)
	{
		FsFairQueue *fq = &fs_fair->queues[i];

		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		memset(&fq->counters, 0, sizeof(fq->counters));
		LWLockRelease(fq->lock);
	}
}

/* A tenant as the metrics see it. */
typedef struct FsShareRow
{
	char		tenant[FS_NAME_BUFLEN];
	float8		weight;
	int32		min_slots;
	int32		slots;
	int64		ready;
	float8		served;			/* decayed to now */
	float8		finish;
	uint64		failed_to_deliver;
	bool		active;			/* backlogged or running */
} FsShareRow;

typedef struct FsShareScan
{
	uint32		queue_id;
	TimestampTz now;
	FsShareRow *rows;
	int			count;
	int			capacity;
} FsShareScan;

/*
 * fs_tenant_foreach() visitor: copy what the fairness views need of each
 * tenant of one queue, up to the room made for them.
 */
static void
fs_share_collect(const FsTenant *t, void *arg)
{
	FsShareScan *scan = (FsShareScan *) arg;
	FsShareRow *row;

	if (t->key.queue_id != scan->queue_id)
		return;
	if (scan->count == scan->capacity)
		return;
	row = &scan->rows[scan->count++];
	strlcpy(row->tenant, t->key.tenant, FS_NAME_BUFLEN);
	row->weight = fs_fair_weight(t->weight);
	row->min_slots = t->min_slots;
	row->slots = t->slots_in_use;
	row->ready = Max(t->ready_rows, 0);
	row->served = fs_served_decayed(t->served_ms, t->touched_at, scan->now);
	row->finish = t->virtual_finish;
	row->failed_to_deliver = t->failed_to_deliver;
	row->active = t->ready_rows > 0 || t->slots_in_use > 0;
}

/* Copies of the queue's tenant entries (allocated before the scan). */
static void
fs_share_scan(FsQueue *queue, FsShareScan *scan)
{
	scan->queue_id = queue->queue_id;
	scan->now = fs_now();
	scan->count = 0;
	scan->capacity = (int) Min((int64) queue->tenants + 64, (int64) fs_max_tenants);
	scan->rows = palloc_extended(sizeof(FsShareRow) * scan->capacity, MCXT_ALLOC_HUGE);
	fs_tenant_foreach(fs_share_collect, scan);
}

/* qsort order of float8s, ascending. */
static int
fs_float8_cmp(const void *a, const void *b)
{
	float8		x = *(const float8 *) a;
	float8		y = *(const float8 *) b;

	return (x > y) - (x < y);
}

/*
 * Jain's index (sum x)^2 / (n sum x^2) and the Gini coefficient of
 * x = served / weight over the active tenants; NULL (false) with fewer than
 * one active tenant or nothing served.
 */
static bool
fs_fairness_indexes(const FsShareScan *scan, float8 *jain, float8 *gini)
{
	float8	   *x;
	float8		sum = 0;
	float8		sum2 = 0;
	float8		weighted = 0;
	int			n = 0;
	int			i;

	x = palloc(sizeof(float8) * Max(scan->count, 1));
	for (i = 0; i < scan->count; i++)
		if (scan->rows[i].active)
		{
			x[n] = scan->rows[i].served / scan->rows[i].weight;
			sum += x[n];
			sum2 += x[n] * x[n];
			n++;
		}
	if (n == 0 || sum <= 0)
	{
		pfree(x);
		return false;
	}
	*jain = sum * sum / (n * sum2);

	/* Gini = sum_i (2i - n - 1) x_(i) / (n sum x), x sorted ascending. */
	qsort(x, n, sizeof(float8), fs_float8_cmp);
	for (i = 0; i < n; i++)
		weighted += (2.0 * (i + 1) - n - 1) * x[i];
	*gini = weighted / (n * sum);
	pfree(x);
	return true;
}

typedef void (*fs_queue_row_fn) (ReturnSetInfo *rsinfo, const char *name, FsQueue *queue);

/*
 * Run `fn` for every registered queue of this database (queue is NULL for a
 * queue shared memory has no room for), as a materialized SRF.
 */
static void
fs_fair_queue_rows(FunctionCallInfo fcinfo, fs_queue_row_fn fn)
{
	ReturnSetInfo *rsinfo;
	List	   *queues;
	ListCell   *lc;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	queues = fs_fair_registered_queues();
	foreach(lc, queues)
	{
		const char *name = (const char *) lfirst(lc);

		fn(rsinfo, name, fs_queue_lookup(name, false));
	}
	SPI_finish();
}

/*
 * One row of fs_fairness for a queue: its backlog, its tenants by state, its
 * served work, and Jain's index and the Gini coefficient of the active
 * tenants' served work per weight (fs_fairness_indexes()).
 */
static void
fs_fairness_row(ReturnSetInfo *rsinfo, const char *name, FsQueue *queue)
{
	Datum		values[18];
	bool		nulls[18];
	FsShareScan scan;
	FsFairQueue copy;
	int			backlogged = 0;
	int			active = 0;
	int64		ready = 0;
	float8		served = 0;
	uint64		failed = 0;
	float8		jain;
	float8		gini;
	bool		have;
	int			i;
	int			k = 0;

	memset(nulls, 0, sizeof(nulls));
	memset(&copy, 0, sizeof(copy));
	scan.count = 0;
	scan.rows = NULL;
	if (queue != NULL)
	{
		FsFairQueue *fq = fs_fair_queue(queue);

		LWLockAcquire(fq->lock, LW_SHARED);
		copy = *fq;
		LWLockRelease(fq->lock);
		fs_share_scan(queue, &scan);
	}
	for (i = 0; i < scan.count; i++)
	{
		backlogged += scan.rows[i].ready > 0;
		active += scan.rows[i].active;
		ready += scan.rows[i].ready;
		served += scan.rows[i].served;
		failed += scan.rows[i].failed_to_deliver;
	}
	have = scan.count > 0 && fs_fairness_indexes(&scan, &jain, &gini);

	values[k++] = CStringGetTextDatum(name);
	values[k++] = Int32GetDatum(backlogged);
	values[k++] = Int64GetDatum(ready);
	values[k++] = Int64GetDatum(copy.rows_without_tenant);
	values[k++] = Int64GetDatum(copy.untracked_rows);
	values[k++] = Int32GetDatum(active);
	values[k] = Float8GetDatum(have ? jain : 0);
	nulls[k++] = !have;
	values[k] = Float8GetDatum(have ? gini : 0);
	nulls[k++] = !have;
	values[k++] = Float8GetDatum(served);
	values[k++] = Float8GetDatum(copy.vtime);
	values[k++] = Int64GetDatum((int64) copy.counters.claims);
	values[k++] = Int64GetDatum((int64) copy.counters.rows_claimed);
	values[k++] = Int64GetDatum((int64) copy.counters.rows_released);
	values[k++] = Int64GetDatum((int64) copy.counters.short_probes);
	values[k++] = Int64GetDatum((int64) copy.counters.fail_open);
	values[k++] = Int64GetDatum((int64) failed);
	values[k++] = Int64GetDatum((int64) copy.counters.resyncs);
	values[k] = TimestampTzGetDatum(copy.last_resync_at);
	nulls[k++] = copy.last_resync_at == 0;
	Assert(k == 18);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * fs_fairness_state(): one row per registered queue of this database; see
 * the fs_fairness view.
 */
Datum
fs_fairness_state(PG_FUNCTION_ARGS)
{
	fs_fair_queue_rows(fcinfo, fs_fairness_row);
	return (Datum) 0;
}

/*
 * The rows of fs_fair_shares for a queue: each tenant's weight, served share
 * and the share its weight entitles it to.
 */
static void
fs_fair_share_rows(ReturnSetInfo *rsinfo, const char *name, FsQueue *queue)
{
	FsShareScan scan;
	float8		vtime;
	float8		served = 0;
	float8		weights = 0;
	int			i;

	if (queue == NULL)
		return;
	LWLockAcquire(fs_fair_queue(queue)->lock, LW_SHARED);
	vtime = fs_fair_queue(queue)->vtime;
	LWLockRelease(fs_fair_queue(queue)->lock);
	fs_share_scan(queue, &scan);
	for (i = 0; i < scan.count; i++)
		if (scan.rows[i].active)
		{
			served += scan.rows[i].served;
			weights += scan.rows[i].weight;
		}

	for (i = 0; i < scan.count; i++)
	{
		FsShareRow *row = &scan.rows[i];
		Datum		values[12];
		bool		nulls[12];
		int			k = 0;

		if (!row->active && row->served < FS_MIN_COST)
			continue;
		memset(nulls, 0, sizeof(nulls));
		values[k++] = CStringGetTextDatum(name);
		values[k++] = CStringGetTextDatum(row->tenant);
		values[k++] = Float8GetDatum(row->weight);
		values[k++] = Int32GetDatum(row->min_slots);
		values[k++] = Int32GetDatum(row->slots);
		values[k++] = Int64GetDatum(row->ready);
		values[k++] = Float8GetDatum(row->served);
		if (row->active && served > 0 && weights > 0)
		{
			float8		share = row->served / served;
			float8		fair = row->weight / weights;

			values[k++] = Float8GetDatum(share);
			values[k++] = Float8GetDatum(fair);
			values[k++] = Float8GetDatum(share / fair);
		}
		else
		{
			nulls[k++] = true;
			nulls[k++] = true;
			nulls[k++] = true;
		}
		values[k++] = Float8GetDatum(row->finish);
		values[k++] = Float8GetDatum(row->finish - vtime);
		Assert(k == 12);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
}

/*
 * fs_fair_share_state(): one row per tenant of a registered queue of this
 * database that is active or has served work; see the fs_fair_shares view.
 */
Datum
fs_fair_share_state(PG_FUNCTION_ARGS)
{
	fs_fair_queue_rows(fcinfo, fs_fair_share_rows);
	return (Datum) 0;
}

/*-------------------------------------------------------------------------
 *
 * plan.c
 *	  Planning a claim: which tenants' rows, in fair order, under the queue's lock.
 *
 * See order.c for how fair dequeue works, and fairqueue_int.h for which
 * file does what.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/transam.h"
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

/* ----------------------------------------------------------------
 * Planning a claim
 * ----------------------------------------------------------------
 */



/*
 * Make a plan's room, before any lock is taken: for `want` rows of as many
 * tenants, `aside_capacity` tenants set aside and `floor_capacity` floor
 * candidates.
 */
void
fs_plan_init(FsPlan *plan, int32 want, int aside_capacity, int32 floor_capacity)
{
	plan->want = want;
	plan->capacity = want;
	plan->ntenants = 0;
	plan->tenants = palloc0(sizeof(FsPlanTenant) * want);
	plan->map_size = 1;
	while (plan->map_size < 2 * want)
		plan->map_size <<= 1;
	plan->map_keys = palloc0(sizeof(FsTenant *) * plan->map_size);
	plan->map_values = palloc(sizeof(int) * plan->map_size);
	plan->aside_capacity = aside_capacity;
	plan->aside = palloc(sizeof(FsHeapItem) * aside_capacity);
	plan->naside = 0;
	plan->floor_capacity = floor_capacity;
	plan->floor_candidates = palloc(sizeof(int32) * floor_capacity);
	plan->npicks = 0;
	plan->pick_tenant = palloc(sizeof(int) * want);
	plan->pick_start = palloc(sizeof(float8) * want);
	plan->selective = false;
	plan->passed = NULL;
	plan->snapshot = NULL;
	plan->leaves = false;
	plan->nleaves = 0;
	plan->nleaf_aside = 0;
}

/* After planning: each tenant's start tags, in the order of its rows. */
void
fs_plan_split_starts(FsPlan *plan)
{
	int			i;

	for (i = 0; i < plan->ntenants; i++)
	{
		FS_FAULT_POINT("claim_plan_starts");
		plan->tenants[i].starts = palloc(sizeof(float8) * plan->tenants[i].planned);
		plan->tenants[i].got = 0;
	}
	for (i = 0; i < plan->npicks; i++)
	{
		FsPlanTenant *pt = &plan->tenants[plan->pick_tenant[i]];

		pt->starts[pt->got++] = plan->pick_start[i];
	}
	for (i = 0; i < plan->ntenants; i++)
		plan->tenants[i].got = 0;
}

/* The plan's record of `entry`, created if `create` (never fails: sized). */
static FsPlanTenant *
fs_plan_tenant(FsPlan *plan, FsTenant *entry, bool create)
{
	uint32		h = (uint32) (((uintptr_t) entry >> 4) * 2654435761u);
	int			mask = plan->map_size - 1;
	int			i;

	for (i = h & mask;; i = (i + 1) & mask)
	{
		if (plan->map_keys[i] == entry)
			return &plan->tenants[plan->map_values[i]];
		if (plan->map_keys[i] == NULL)
			break;
	}
	if (!create || plan->ntenants >= plan->capacity)
		return NULL;
	plan->map_keys[i] = entry;
	plan->map_values[i] = plan->ntenants;
	return &plan->tenants[plan->ntenants++];
}


/* Copy out what a plan needs of a tenant entry, under its spinlock. */
void
fs_tenant_view(FsTenant *entry, FsTenantView *v, TimestampTz now)
{
	fs_tenant_lock(entry);
	v->ready = entry->ready_rows;
	v->slots = entry->slots_in_use;
	v->dry = (entry->flags & FS_TENANT_DRY) != 0;
	v->newest_adder = entry->backlog_fxid;
	v->balance = fs_budget_balance_now(entry, now);
	fs_limits_copy_out(entry, &v->limits);
	fs_tenant_unlock(entry);
}

/*
 * Tokens (milliseconds of worker time) a claimed row takes from a tenant's
 * budget: its estimated cost when the queue has a cost expression (taken
 * as milliseconds) or measures run times, otherwise the default of
 * fs_spend_tokens().
 */
float8
fs_fair_budget_cost(FsFairDesc *desc)
{
	FsFairQueue *fq = desc->fq;

	if (desc->cost != NULL)
		return fs_fair_clamp_cost(fq->avg_cost, false);
	if (desc->charge_runtime)
		return fs_fair_clamp_cost(fq->avg_runtime_ms, false);
	return FS_BUDGET_DEFAULT_COST_MS;
}


/*
 * Reserve one row of `entry` for the plan: charge its tag, advance V; with
 * `leaf` (a queue with a subkey), the row is that leaf's (subkeys.c).
 * Caller holds fq->lock; item is the entry's heap item (its key updated).
 */
static void
fs_plan_pick(FsFairQueue *fq, FsPlan *plan, FsHeapItem *item, const FsTenantView *v,
			 FsLeaf *leaf, float8 est_cost, TimestampTz now)
{
	FsTenant   *entry = item->tenant;
	FsPlanTenant *pt = fs_plan_tenant(plan, entry, true);
	float8		start = Max(fq->vtime, item->key);
	float8		weight = fs_fair_weight(v->limits.weight);
	float8		finish = start + est_cost / weight;

	Assert(pt != NULL && plan->npicks < plan->capacity);
	if (pt->planned == 0)
	{
		strlcpy(pt->name, entry->key.tenant, FS_NAME_BUFLEN);
		pt->entry = entry;
		pt->weight = weight;
		pt->est_cost = est_cost;
	}
	pt->planned++;
	pt->charge += finish - item->key;
	plan->pick_tenant[plan->npicks] = (int) (pt - plan->tenants);
	plan->pick_start[plan->npicks] = start;
	plan->npicks++;

	fs_fair_set_vtime(fq, start);
	fs_fair_note_finish(fq, finish);
	fs_tenant_lock(entry);
	fs_tenant_touch(entry, now);
	fs_tenant_claimed(entry, finish, est_cost);
	fs_tenant_unlock(entry);
	item->key = finish;
	plan->want--;
	if (leaf != NULL)
		fs_plan_leaf_pick(plan, leaf, (int) (pt - plan->tenants), est_cost);
	else if (plan->leaves)
		plan->pick_leaf[plan->npicks - 1] = -1;
}

/*
 * Ceiling of a tenant (max_slots and the global gate), with the gate's
 * capacity computed before any lock was taken (fs_gate_capacity()).
 */
int32
fs_plan_ceiling(const FsGateCapacity *cap, const FsTenantView *v)
{
	FsReason	reason;

	return fs_gate_ceiling(cap, &v->limits, &reason);
}

/* Is a listed tenant passed over for now (it came up short lately)? */
bool
fs_item_dry(const FsHeapItem *item, const FsTenantView *v, TimestampTz now)
{
	return v->dry && item->dry_until > now;
}

/*
 * Does the claim's snapshot see the commit that listed a tenant (or a leaf:
 * made its count go from none to some), `listed_xid`, read in the epoch of
 * `newest_adder`?  If not, it sees none of the rows that commit counted:
 * were it to reserve them, the claims that do see them would pass the
 * tenant over until it gave them back.  So it leaves the tenant to them, as
 * if it had no rows.  Only claims whose snapshot was taken before that
 * commit are concerned, for as long as they last.
 */
bool
fs_plan_sees_listing(const FsPlan *plan, TransactionId listed_xid, FullTransactionId newest_adder)
{
	Snapshot	snapshot = plan->snapshot;
	FullTransactionId listed;

	if (snapshot == NULL || !TransactionIdIsNormal(listed_xid) ||
		!FullTransactionIdIsValid(newest_adder))
		return true;
	listed = fs_xid_widen(listed_xid, newest_adder);
	if (FullTransactionIdPrecedes(listed, plan->snapshot_xmin))
		return true;
	if (!FullTransactionIdPrecedes(listed, plan->snapshot_xmax))
		return false;
	/* A top-level id: in xip if it was running, even when subxip overflowed. */
	for (uint32 i = 0; i < snapshot->xcnt; i++)
		if (TransactionIdEquals(snapshot->xip[i], listed_xid))
			return false;
	return true;
}

/*
 * Should the plan pass this tenant over: as dry (it notes that it did), or
 * as short of rows earlier in this claim?
 */
static bool
fs_plan_skips_dry(FsPlan *plan, const FsHeapItem *item, const FsTenantView *v, TimestampTz now)
{
	if (plan->passed != NULL && fs_passed_over_has(plan->passed, item->tenant))
		return true;
	if (!plan->skip_dry || !fs_item_dry(item, v, now))
		return false;
	plan->skipped_dry = true;
	return true;
}

/*
 * The guaranteed floor: tenants holding fewer slots than their min_slots go
 * first, smallest tag first, until each reaches its floor.  Heap positions
 * do not move while this runs; the heap is rebuilt afterwards if anything
 * was picked.  The candidates go in the room the plan made before the lock
 * (as many as there were floor tenants then, and more): should more have
 * come meanwhile, those beyond it wait for the next claim.
 */
static void
fs_plan_floors(FsFairQueue *fq, FsPlan *plan, float8 est_cost, TimestampTz now)
{
	int32	   *candidates = plan->floor_candidates;
	int32		wanted = Min(fq->nfloor, plan->floor_capacity);
	int			ncandidates = 0;
	bool		picked = false;
	int32		i;

	for (i = 0; i < fq->nitems && ncandidates < wanted; i++)
		if (fs_heap_at(fq, i)->min_slots > 0)
			candidates[ncandidates++] = i;

	while (plan->want > 0)
	{
		int			best = -1;
		FsTenantView bestv = {0};
		int			c;

		FsLeaf	   *leaf = NULL;
		bool		blocked = false;

		for (c = 0; c < ncandidates; c++)
		{
			FsHeapItem *item;
			FsPlanTenant *pt;
			int32		planned;
			FsTenantView v;
			int32		floor;

			if (candidates[c] < 0)
				continue;		/* no leaf of it can be served now */
			item = fs_heap_at(fq, candidates[c]);
			pt = fs_plan_tenant(plan, item->tenant, false);
			planned = pt ? pt->planned : 0;

			fs_tenant_view(item->tenant, &v, now);
			floor = Min(v.limits.min_slots, fs_plan_ceiling(&plan->cap, &v));
			if (v.ready <= 0 || fs_plan_skips_dry(plan, item, &v, now) || v.slots + planned >= floor ||
				!fs_view_can_pay(&v, planned + 1, plan->budget_cost) ||
				!fs_plan_sees_listing(plan, item->listed_xid, v.newest_adder))
				continue;
			if (best < 0 || fs_heap_less(item, fs_heap_at(fq, candidates[best])))
			{
				best = c;
				bestv = v;
			}
		}
		if (best < 0)
			break;
		if (plan->leaves)
		{
			leaf = fs_plan_leaf_choose(plan, fs_heap_at(fq, candidates[best])->tenant,
									   bestv.ready, now, &blocked);
			if (blocked)
			{
				candidates[best] = -1;
				continue;
			}
		}
		fs_plan_pick(fq, plan, fs_heap_at(fq, candidates[best]), &bestv, leaf, est_cost, now);
		picked = true;
	}
	if (picked)
		fs_heap_rebuild(fq);
}

/*
 * Plan up to plan->want rows: reserve rows of tenants in fair order.  Takes
 * and releases fq->lock.  Nothing in here can fail (all memory is the
 * plan's, allocated before).
 */
void
fs_plan_make(FsFairQueue *fq, FsPlan *plan, float8 est_cost, TimestampTz now)
{
	int			i;

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	fs_plan_leaves_lock(plan);
	plan->vtime_before = fq->vtime;
	plan->resync_gen = fq->resync_gen;

	if (fq->nfloor > 0)
		fs_plan_floors(fq, plan, est_cost, now);

	while (plan->want > 0 && fq->nitems > 0)
	{
		FsHeapItem *top = fs_heap_at(fq, 0);
		FsTenant   *entry = top->tenant;
		FsPlanTenant *pt = fs_plan_tenant(plan, entry, false);
		int32		planned = pt ? pt->planned : 0;
		FsTenantView v;
		int32		min_slots;
		bool		drained;
		bool		seen;
		FsLeaf	   *leaf = NULL;
		bool		blocked = false;

		fs_tenant_lock(entry);
		drained = entry->ready_rows == 0 && !fq->resyncing;
		min_slots = entry->min_slots;
		fs_tenant_unlock(entry);
		if (drained)
		{
			FsHeapItem	item = *top;

			/*
			 * Drained: it leaves the fair order (and stops pinning), with
			 * its chunk given back before its mark goes (the pools' sizing
			 * counts on that order).  If rows came meanwhile, their commit
			 * saw it listed: it goes back.  A negative count stays, to be
			 * adjusted by the next recount.
			 */
			fs_heap_remove(fq, 0);
			fs_heap_shrink(fq, plan->naside);
			fs_tenant_lock(entry);
			drained = entry->ready_rows == 0;
			if (drained)
				fs_tenant_backlog_forget(entry);
			fs_tenant_unlock(entry);
			if (!drained)
			{
				fs_fair_push_locked(fq, &item);
				continue;
			}

			/*
			 * The end of a busy period: as start-time fair queueing does, V
			 * moves to the largest finish tag, so that nobody is ahead of
			 * it any more (an idle queue owes nobody anything, and its
			 * tenants may be evicted when room is needed).
			 */
			if (fq->nitems == 0)
				fs_fair_set_vtime(fq, Max(fq->vtime, fq->max_finish));
			continue;
		}

		/* Keep the cached floor current. */
		if ((top->min_slots > 0) != (min_slots > 0))
			fq->nfloor += min_slots > 0 ? 1 : -1;
		top->min_slots = min_slots;

		fs_tenant_view(entry, &v, now);
		seen = fs_plan_sees_listing(plan, top->listed_xid, v.newest_adder);
		if (v.ready > 0 && seen && plan->leaves)
			leaf = fs_plan_leaf_choose(plan, entry, v.ready, now, &blocked);
		if (v.ready <= 0 || !seen || blocked || fs_plan_skips_dry(plan, top, &v, now) ||
			v.slots + planned >= fs_plan_ceiling(&plan->cap, &v) ||
			!fs_view_can_pay(&v, planned + 1, plan->budget_cost))
		{
			/* Not now: set it aside (its tag is kept) and look further. */
			if (plan->naside >= plan->aside_capacity)
				break;
			plan->aside[plan->naside++] = *top;
			fs_heap_remove(fq, 0);
			continue;
		}
		if (pt == NULL && plan->ntenants >= plan->capacity)
			break;

		fs_plan_pick(fq, plan, top, &v, leaf, est_cost, now);
		fs_heap_sift_down(fq, 0);
	}

	/*
	 * Put back what was set aside: the chunks for them were kept (heap_shrink
	 * counted them), so this needs no new chunk unless a drained tenant's new
	 * rows took one.
	 */
	for (i = 0; i < plan->naside; i++)
		fs_fair_push_locked(fq, &plan->aside[i]);
	plan->naside = 0;
	fs_heap_shrink(fq, 0);
	plan->vtime_after = fq->vtime;
	fs_plan_leaves_unlock(plan);
	LWLockRelease(fq->lock);
}

/*
 * `xid` as a full transaction id: the latest one with its 32 bits that is
 * not after `ref`, which must not be before it (and is, in practice, less
 * than 2^32 transactions after it).
 */
FullTransactionId
fs_xid_widen(TransactionId xid, FullTransactionId ref)
{
	uint32		epoch = EpochFromFullTransactionId(ref);

	if (xid > XidFromFullTransactionId(ref) && epoch > 0)
		epoch--;
	return FullTransactionIdFromEpochAndXid(epoch, xid);
}

/*
 * Give `plan` the claim query's snapshot (the active one), to leave out the
 * tenants listed by a commit it does not see (fs_plan_sees_listing()).
 */
void
fs_plan_set_snapshot(FsPlan *plan, Snapshot snapshot)
{
	FullTransactionId next = ReadNextFullTransactionId();

	plan->snapshot = snapshot;
	plan->snapshot_xmin = fs_xid_widen(snapshot->xmin, next);
	plan->snapshot_xmax = fs_xid_widen(snapshot->xmax, next);
}

/*
 * Settle one planned tenant after the query: give back reservations and tag
 * advances of rows it did not get, correct the tag for real costs, and mark
 * it dry if the table had fewer claimable rows than it had leases for (not
 * for a claim with a selection: its rows may be outside the selection).
 */
void
fs_plan_settle(FsQueue *queue, FsPlan *plan, FsPlanTenant *pt, TimestampTz now,
			   float8 *tag_fix, float8 *served_fix)
{
	int32		missing = pt->planned - pt->got;
	FsTenantChange c;

	*tag_fix = pt->cost_fix / pt->weight;
	*served_fix = pt->served_fix;
	if (missing > 0)
	{
		*tag_fix -= pt->got == 0 ? pt->charge : missing * pt->est_cost / pt->weight;
		*served_fix -= missing * pt->est_cost;
	}

	fs_change_init(&c, now);
	c.rows = missing + pt->unkeyed;		/* not recounted since: give back */
	c.resync_gen = plan->resync_gen;
	c.tag = *tag_fix;
	c.served = *served_fix;
	/*
	 * With leaves, a leaf that came back short is marked, not its tenant
	 * (its other leaves may have rows): the tenant only for the rows it was
	 * planned as a whole.
	 */
	if (plan->leaves)
		c.dry = pt->whole_got < pt->whole_admitted && !plan->selective;
	else
		c.dry = pt->got < pt->admitted && !plan->selective;
	if (c.dry)
	{
		Assert(plan->snapshot != NULL);	/* set with the round's plan */
		c.dry_horizon = plan->snapshot_xmin;
	}
	if (c.rows == 0 && c.tag == 0 && c.served == 0 && !c.dry)
		return;
	fs_fair_change(queue, pt->name, false, &c);
}

/* The age of the oldest ready row of desc's table, in ms (0: none). */
static float8
fs_fair_oldest_ms(FsFairDesc *desc, TimestampTz now)
{
	MemoryContext cxt = CurrentMemoryContext;
	int			nest;
	volatile int ret = 0;
	float8		latency_ms = 0;

	PG_TRY();
	{
		nest = fs_search_path_begin();
		ret = SPI_execute_plan(desc->latency_plan, NULL, NULL, true, 1);
		fs_search_path_end(nest);
	}
	PG_CATCH();
	{
		fs_fair_query_error(cxt, desc, &desc->latency_q, "latency query");
	}
	PG_END_TRY();
	if (ret == SPI_OK_SELECT && SPI_processed == 1)
	{
		bool		isnull;
		Datum		oldest = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			latency_ms = Max((float8) (now - DatumGetTimestampTz(oldest)) / 1000.0, 0.0);
	}
	return latency_ms;
}

/*
 * The queue's latency, for backpressure: the age of its oldest ready row
 * (min(enqueued_at) over the ready rows), measured by one claim a second at
 * most, across backends, and reported to the gate as fs_report_latency()
 * would.  Without enqueued_at, or with backpressure off, nothing is done.
 */
void
fs_fair_measure_latency(FsFairDesc *desc, TimestampTz now)
{
	FsFairQueue *fq = desc->fq;
	uint64		last;
	float8		latency_ms = 0;

	if (desc->enqueued_at == NULL || fq == NULL || desc->queue == NULL ||
		fs_backpressure_latency_ms == 0)
		return;
	last = pg_atomic_read_u64(&fq->latency_sampled_at);
	if (now - (TimestampTz) last < FS_LATENCY_SAMPLE_USECS && now >= (TimestampTz) last)
		return;
	if (!pg_atomic_compare_exchange_u64(&fq->latency_sampled_at, &last, (uint64) now))
		return;					/* another backend measures it */

	/* A distributed queue's: the oldest of this node's shards. */
	if (!desc->distributed)
		latency_ms = fs_fair_oldest_ms(desc, now);
	for (int p = 0; desc->distributed && p < desc->nparts; p++)
		latency_ms = Max(latency_ms, fs_fair_oldest_ms(&desc->parts[p], now));
	fs_gate_set_latency(desc->queue, latency_ms, now);
}

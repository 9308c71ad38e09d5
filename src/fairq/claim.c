/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  fs_claim() and fs_ready_tenants(): a claim's plan admitted, its rows locked and settled.
 *
 * See order.c for how fair dequeue works, and fairqueue_int.h for which
 * file does what.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/xact.h"
#include "access/xlog.h"
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
#include "core/cluster.h"
#include "core/stateformat.h"
#include "core/subxact.h"
#include "fairq/fairqueue_int.h"
#include "gate/gate.h"
#include "limits/limits.h"
#include "slots/slots.h"

PG_FUNCTION_INFO_V1(fs_claim);
PG_FUNCTION_INFO_V1(fs_claim_at);
PG_FUNCTION_INFO_V1(fs_ready_tenants);
PG_FUNCTION_INFO_V1(fs_claimable_weight_at);

/* A claim takes at most this many rounds down the fair order. */
#define FS_CLAIM_MAX_ROUNDS	16

/* ----------------------------------------------------------------
 * fs_claim()
 * ----------------------------------------------------------------
 */

/* A row claimed, before it is handed back in fair order. */
typedef struct FsClaimedRow
{
	float8		start;
	int			seq;			/* tie-break: claim order */
	int64		lease_id;
	const char *tenant;
	Datum		row;
} FsClaimedRow;

/* Order of claimed rows in fs_claim()'s output: by start tag, then tenant, then rank. */
static int
fs_claimed_row_cmp(const void *a, const void *b)
{
	const FsClaimedRow *x = (const FsClaimedRow *) a;
	const FsClaimedRow *y = (const FsClaimedRow *) b;

	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	return x->seq - y->seq;
}

typedef struct FsClaimOutput
{
	FsClaimedRow *rows;
	int			count;
	int			capacity;
} FsClaimOutput;

/* Add a row to a claim's output (room was made for every planned row). */
static void
fs_claim_output_add(FsClaimOutput *out, float8 start, int64 lease_id, const char *tenant,
					Datum row)
{
	FsClaimedRow *r;

	Assert(out->count < out->capacity);
	r = &out->rows[out->count];
	r->start = start;
	r->seq = out->count;
	r->lease_id = lease_id;
	r->tenant = tenant;
	r->row = row;
	out->count++;
}

/*
 * Admission of the rows planned for one tenant: every row a claim returns
 * passes through here, and only here.  A row is admitted with a slot lease
 * (fs_slot_acquire: max_slots and the global gate); when a lease is denied
 * the tenant gets no more rows in this claim.  Returns the rows admitted.
 */
static int32
fs_claim_admit(FsQueue *queue, FsPlanTenant *pt, float8 budget_cost, int64 lease_usecs,
			   TimestampTz now)
{
	int32		i;

	FS_FAULT_POINT("claim_admit");
	pt->leases = palloc(sizeof(int64) * Max(pt->planned, 1));
	pt->taken = palloc(sizeof(float8) * Max(pt->planned, 1));
	for (i = 0; i < pt->planned; i++)
	{
		FsSlotDecision decision;
		float8		taken;

		/* The budget pays for the row, then a slot runs it. */
		if (!fs_budget_claim(queue, pt->name, budget_cost, now, &taken))
			break;
		fs_slot_acquire(queue, pt->name, lease_usecs, now, &decision);
		if (decision.lease_id == 0)
		{
			fs_budget_unclaim(queue, pt->name, taken);
			break;
		}
		pt->leases[i] = decision.lease_id;
		pt->taken[i] = taken;
	}
	pt->admitted = i;
	return i;
}

/*
 * Run one of a registration's kept plans with `snapshot`, reporting an error
 * by the registration's piece it came from.  A claim never JIT-compiles:
 * its LIMIT is a parameter, which the planner takes for a tenth of a
 * tenant's estimated rows, so on a table of some millions of rows the
 * plan's cost passes jit_above_cost; compiling it then takes several times
 * what running it does (4.7 ms against 0.3 ms for 10 rows of a 10M-row
 * table), on every execution of the cached plan.
 */
void
fs_fair_execute(FsFairDesc *desc, const FsQueryText *q, SPIPlanPtr plan, Datum *values,
				const char *nulls, Snapshot snapshot, bool read_only, long count,
				const char *what)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile int ret = 0;

	PG_TRY();
	{
		int			nest = fs_search_path_begin();

		(void) set_config_option("jit", "off", PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
								 true, 0, false);
		ret = SPI_execute_snapshot(plan, values, nulls, snapshot, InvalidSnapshot,
								   read_only, false, count);
		fs_search_path_end(nest);
		if (ret != SPI_OK_SELECT)
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("the query failed: %s", SPI_result_code_string(ret))));
	}
	PG_CATCH();
	{
		fs_fair_query_error(cxt, desc, q, what);
	}
	PG_END_TRY();
}

/*
 * Run a claim query (in the caller's snapshot).  Its second column is the
 * rows' key, whose type is the one the table gives the key expression now:
 * DDL (ALTER COLUMN ... TYPE) may have made it another than the registered
 * one, which the keys of the claim map and the claim query's parameter are
 * of.  That is an error, not a value to interpret as the registered type.
 */
static void
fs_claim_execute(FsFairDesc *desc, const FsQueryText *q, SPIPlanPtr plan, Datum *values,
				 const char *nulls, const char *what)
{
	Oid			key_type;

	fs_fair_execute(desc, q, plan, values, nulls, GetActiveSnapshot(), false, 0, what);
	key_type = SPI_gettypeid(SPI_tuptable->tupdesc, 2);
	if (key_type != desc->key_type)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the key of queue \"%s\" is now of type %s, registered as %s",
						desc->queue_name, format_type_be(key_type),
						format_type_be(desc->key_type)),
				 errhint("Register the queue again with fs_register_queue().")));
}

/*
 * Plan a round for `want` rows at `est_cost` each (room sized before the
 * fair-order lock), and record it before anything can fail (in the room
 * fs_track_claims_reserve() made), so that a rollback undoes it all.
 * False when no tenant can be served.
 */
static bool
fs_claim_round_plan(FsFairDesc *desc, FsPlan *plan, int32 want, float8 est_cost,
					TimestampTz now, FsSelection *sel)
{
	FsFairQueue *fq = desc->fq;
	int			i;

	/*
	 * Tenants set aside are those at their ceiling (or dry) ahead of the
	 * ones picked: a few per running job at most, so this bound is
	 * generous; if it fills, the round ends early and the next one goes on.
	 */
	fs_plan_init(plan, want, Min(Max(fq->nitems, 0), 4 * want + 1024) + 1,
				 2 * Max(fq->nfloor, 0) + 16);
	fs_plan_leaves_init(plan, desc, want);
	/*
	 * Each planned tenant's reservation, and its settlement after the
	 * query; with leaves, each leaf's too.
	 */
	fs_track_claims_reserve((plan->leaves ? 4 : 2) * want);
	fs_gate_capacity(desc->queue, now, &plan->cap);
	plan->budget_cost = fs_fair_budget_cost(desc);
	plan->skip_dry = true;
	plan->skipped_dry = false;
	plan->selective = sel->active;
	/* Room for every planned tenant, made before anything changes. */
	fs_passed_over_reserve(sel, (plan->leaves ? 2 : 1) * want);
	plan->passed = sel;
	fs_plan_set_snapshot(plan, GetActiveSnapshot());	/* the claim query's */
	fs_plan_make(fq, plan, est_cost, now);
	if (plan->ntenants == 0 && plan->skipped_dry)
	{
		/*
		 * Work-conserving: tenants that came up short lately are passed
		 * over, but not when they are all there is.
		 */
		plan->skip_dry = false;
		fs_plan_make(fq, plan, est_cost, now);
	}
	if (plan->ntenants == 0)
		return false;

	for (i = 0; i < plan->ntenants; i++)
	{
		FsPlanTenant *pt = &plan->tenants[i];

		fs_track_claim(desc, pt->name, pt->planned, pt->charge, pt->planned * pt->est_cost,
					   plan->resync_gen, plan->vtime_before, plan->vtime_after);
	}
	for (i = 0; i < plan->nleaves; i++)
	{
		FsPlanLeaf *pl = &plan->plan_leaves[i];

		fs_track_leaf_claim(desc, plan->tenants[pl->tenant].name, pl->subkey, pl->planned,
							pl->charge, plan->resync_gen);
	}
	fs_plan_split_starts(plan);
	return true;
}

/*
 * The elements of one claim query: each asks for `count` rows of a tenant
 * (and, for the leaf query, of one of its sub-keys); tenant_of[] and
 * leaf_of[] say whose they are in the plan (leaf -1: the tenant's rows as
 * a whole).
 */
typedef struct FsClaimElements
{
	int			n;
	Datum	   *tenants;
	Datum	   *subkeys;
	Datum	   *counts;
	int		   *tenant_of;
	int		   *leaf_of;
} FsClaimElements;

static void
fs_claim_elements_init(FsClaimElements *e, int capacity)
{
	e->n = 0;
	e->tenants = palloc(sizeof(Datum) * capacity);
	e->subkeys = palloc(sizeof(Datum) * capacity);
	e->counts = palloc(sizeof(Datum) * capacity);
	e->tenant_of = palloc(sizeof(int) * capacity);
	e->leaf_of = palloc(sizeof(int) * capacity);
}

static void
fs_claim_elements_add(FsClaimElements *e, FsPlan *plan, int tenant, int leaf, int32 count)
{
	e->tenants[e->n] = CStringGetTextDatum(plan->tenants[tenant].name);
	e->subkeys[e->n] = leaf >= 0 ? CStringGetTextDatum(plan->plan_leaves[leaf].subkey) : (Datum) 0;
	e->counts[e->n] = Int32GetDatum(count);
	e->tenant_of[e->n] = tenant;
	e->leaf_of[e->n] = leaf;
	e->n++;
}

/*
 * Run one claim query for the elements `e` (with their sub-keys as the
 * second argument when `subkeys`): each row it locks is handed out to `out`
 * under its tenant's next lease and tracked for the transaction's end, and
 * its cost noted in costs[] from *claimed on.  The keys claimed so far in
 * the transaction, this round's included, are left out.
 */
static void
fs_claim_run(FsFairDesc *desc, FsPlan *plan, const FsQueryText *q, SPIPlanPtr spiplan,
			 const FsClaimElements *e, bool subkeys, const FsSelection *sel,
			 FsClaimOutput *out, float8 *costs, int32 *claimed, TimestampTz now)
{
	Datum		values[6 + FS_PROBE_START_MAX_COLS];
	char		nulls[6 + FS_PROBE_START_MAX_COLS];
	ArrayType  *held;
	int			a = 0;
	uint64		r;
	TupleDesc	tupdesc;
	bool		with_starts = spiplan == desc->claim_plan && desc->start_ncols > 0;
	const char **names = NULL;
	FsProbeDue	due[FS_PROBE_START_LOOKUPS];
	int			ndue = 0;

	if (e->n == 0)
		return;
	memset(nulls, ' ', sizeof(nulls));
	values[a++] = PointerGetDatum(construct_array(e->tenants, e->n, TEXTOID, -1, false, TYPALIGN_INT));
	if (subkeys)
		values[a++] = PointerGetDatum(construct_array(e->subkeys, e->n, TEXTOID, -1, false,
													  TYPALIGN_INT));
	values[a++] = PointerGetDatum(construct_array(e->counts, e->n, INT4OID, 4, true, TYPALIGN_INT));
	held = fs_track_held_keys(desc);
	values[a] = PointerGetDatum(held);
	nulls[a++] = held == NULL ? 'n' : ' ';
	values[a] = sel->in;
	nulls[a++] = sel->in == (Datum) 0 ? 'n' : ' ';
	values[a] = sel->not_in;
	nulls[a++] = sel->not_in == (Datum) 0 ? 'n' : ' ';
	if (with_starts)
	{
		/* Where each tenant's probe starts (probe_start.c). */
		int32	   *rows = palloc(sizeof(int32) * e->n);
		Datum	   *starts[FS_PROBE_START_MAX_COLS];

		names = palloc(sizeof(char *) * e->n);
		for (int i = 0; i < e->n; i++)
		{
			names[i] = plan->tenants[e->tenant_of[i]].name;
			rows[i] = DatumGetInt32(e->counts[i]);
		}
		for (int c = 0; c < desc->start_ncols; c++)
			starts[c] = palloc(sizeof(Datum) * e->n);
		ndue = fs_probe_starts_read(desc, e->n, names, rows, starts, due,
									plan->may_advance_starts);
		for (int c = 0; c < desc->start_ncols; c++)
		{
			int16		typlen;
			bool		typbyval;
			char		typalign;

			get_typlenbyvalalign(desc->start_types[c], &typlen, &typbyval, &typalign);
			values[a++] = PointerGetDatum(construct_array(starts[c], e->n, desc->start_types[c],
														  typlen, typbyval, typalign));
		}
	}
	fs_claim_execute(desc, q, spiplan, values, nulls, "claim query");

	tupdesc = SPI_tuptable->tupdesc;
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[r];
		bool		isnull;
		int64		ord = DatumGetInt64(SPI_getbinval(tuple, tupdesc, 1, &isnull));
		FsPlanTenant *pt;
		FsPlanLeaf *pl = NULL;
		Datum		key;
		bool		key_isnull;
		float8		cost;
		Datum		row;
		int64		lease_id;
		int			k;

		if (ord < 1 || ord > e->n)
			elog(ERROR, "fair dequeue claim query returned an unexpected row");
		pt = &plan->tenants[e->tenant_of[ord - 1]];
		if (e->leaf_of[ord - 1] >= 0)
			pl = &plan->plan_leaves[e->leaf_of[ord - 1]];
		k = pt->got;
		if (k >= pt->admitted || (pl != NULL && pl->got >= pl->admitted))
			elog(ERROR, "fair dequeue claim query returned too many rows");
		key = SPI_getbinval(tuple, tupdesc, 2, &key_isnull);
		cost = DatumGetFloat8(SPI_getbinval(tuple, tupdesc, 3, &isnull));
		cost = desc->cost != NULL ? fs_fair_clamp_cost(cost, isnull) : pt->est_cost;
		row = SPI_getbinval(tuple, tupdesc, 4, &isnull);
		lease_id = pt->leases[k];

		pt->cost_fix += cost - pt->est_cost;
		pt->served_fix += cost - pt->est_cost;
		pt->got++;
		if (pl != NULL)
		{
			pl->got++;
			pl->cost_fix += cost - pl->est_cost;
		}
		else
			pt->whole_got++;
		fs_claim_output_add(out, pt->starts[k], lease_id, pt->name, row);
		if (!fs_track_claimed_row(desc, pt->name, pl != NULL ? pl->subkey : NULL, key,
								  key_isnull, lease_id, cost, true, plan->resync_gen))
		{
			pt->unkeyed++;
			if (pl != NULL)
				pl->unkeyed++;
		}
		costs[(*claimed)++] = cost;
	}
	/*
	 * An error here (a cancel too) fails the claim, as one in its query
	 * would: the transaction's abort undoes what the claim did.
	 */
	if (ndue > 0)
		fs_probe_starts_advance(desc, names, due, ndue, now);
}

/*
 * Admit the planned tenants' rows (leases, tokens) and run the claim
 * queries for them: a tenant's admitted rows are its first picks, each of
 * its leaf or of the tenant as a whole.  Returns the rows claimed, their
 * costs in costs[] (room for plan->want).
 */
static int32
fs_claim_round_query(FsFairDesc *desc, FsPlan *plan, int64 lease_usecs, TimestampTz now,
					 FsClaimOutput *out, float8 *costs, const FsSelection *sel)
{
	FsClaimElements whole;
	FsClaimElements leaves;
	FsClaimElements star;
	int32	   *assigned;
	int32		claimed = 0;
	FsFairDesc **part_of;
	int			i;
	int			p;

	FS_FAULT_POINT("claim_query_args");
	for (i = 0; i < plan->ntenants; i++)
		(void) fs_claim_admit(desc->queue, &plan->tenants[i], plan->budget_cost, lease_usecs, now);

	/* Which picks the admitted rows are: each tenant's first ones. */
	assigned = palloc0(sizeof(int32) * Max(plan->ntenants, 1));
	for (i = 0; i < plan->npicks; i++)
	{
		int			t = plan->pick_tenant[i];

		if (assigned[t] >= plan->tenants[t].admitted)
			continue;
		assigned[t]++;
		if (plan->leaves && plan->pick_leaf[i] >= 0)
			plan->plan_leaves[plan->pick_leaf[i]].admitted++;
		else
			plan->tenants[t].whole_admitted++;
	}

	/*
	 * The queries, of the queue's table, or for a distributed queue of each
	 * of this node's shards that holds planned tenants (a tenant of no shard
	 * here gets none of its rows, and comes up short).
	 */
	part_of = palloc(sizeof(FsFairDesc *) * Max(plan->ntenants, 1));
	for (i = 0; i < plan->ntenants; i++)
		part_of[i] = fs_fair_part_of(desc, plan->tenants[i].name);
	for (p = 0; p < Max(desc->nparts, 1); p++)
	{
		FsFairDesc *part = desc->distributed ? &desc->parts[p] : desc;

		if (desc->distributed && desc->nparts == 0)
			break;
		fs_claim_elements_init(&whole, Max(plan->ntenants, 1));
		for (i = 0; i < plan->ntenants; i++)
			if (plan->tenants[i].whole_admitted > 0 && part_of[i] == part)
				fs_claim_elements_add(&whole, plan, i, -1, plan->tenants[i].whole_admitted);
		if (plan->leaves)
		{
			fs_claim_elements_init(&leaves, Max(plan->nleaves, 1));
			fs_claim_elements_init(&star, Max(plan->nleaves, 1));
			for (i = 0; i < plan->nleaves; i++)
			{
				FsPlanLeaf *pl = &plan->plan_leaves[i];

				if (pl->admitted == 0 || part_of[pl->tenant] != part)
					continue;
				if (strcmp(pl->subkey, FS_SUBKEY_NONE) == 0)
					fs_claim_elements_add(&star, plan, pl->tenant, i, pl->admitted);
				else
					fs_claim_elements_add(&leaves, plan, pl->tenant, i, pl->admitted);
			}
			fs_claim_run(part, plan, &part->leaf_q, part->leaf_plan, &leaves, true, sel, out,
						 costs, &claimed, now);
			fs_claim_run(part, plan, &part->star_q, part->star_plan, &star, false, sel, out,
						 costs, &claimed, now);
		}
		fs_claim_run(part, plan, &part->claim_q, part->claim_plan, &whole, false, sel, out,
					 costs, &claimed, now);
	}
	return claimed;
}

/*
 * Settle each leaf of the plan after the queries, as fs_plan_settle() does
 * its tenant: rows not got given back with their tag advance, the tag
 * corrected for real costs, a leaf short of rows it had leases for marked
 * (and passed over for the rest of the claim); each change recorded for a
 * rollback to undo.  Every leaf is applied, so that one left without rows
 * leaves the table.
 */
static bool
fs_claim_leaves_settle(FsFairDesc *desc, FsPlan *plan, TimestampTz now, FsSelection *sel)
{
	bool		short_of_plan = false;
	FsLeafChange *changes;
	int			i;

	if (plan->nleaves == 0)
		return false;
	/* Made before anything changes: applying and recording cannot fail. */
	changes = palloc(sizeof(FsLeafChange) * plan->nleaves);
	for (i = 0; i < plan->nleaves; i++)
	{
		FsPlanLeaf *pl = &plan->plan_leaves[i];
		int32		missing = pl->planned - pl->got;
		FsTenantChange *c = &changes[i].change;

		changes[i].tenant = plan->tenants[pl->tenant].name;
		changes[i].subkey = pl->subkey;
		fs_change_init(c, now);
		c->rows = missing + pl->unkeyed;	/* not recounted since: give back */
		c->resync_gen = plan->resync_gen;
		c->tag = pl->cost_fix / pl->weight;
		if (missing > 0)
			c->tag -= pl->got == 0 ? pl->charge : missing * pl->est_cost / pl->weight;
		if (pl->got < pl->admitted)
		{
			short_of_plan = true;
			fs_passed_over_add(sel, pl->leaf);
			if (!plan->selective)
			{
				c->dry = true;
				c->dry_horizon = plan->snapshot_xmin;
			}
		}
	}
	fs_leaf_apply_many(desc->queue, changes, plan->nleaves);
	for (i = 0; i < plan->nleaves; i++)
	{
		FsPlanLeaf *pl = &plan->plan_leaves[i];
		const FsTenantChange *c = &changes[i].change;

		if (c->rows != 0 || c->tag != 0)
			fs_track_leaf_claim(desc, changes[i].tenant, pl->subkey,
								pl->got - pl->unkeyed - pl->planned, c->tag, plan->resync_gen);
	}
	pfree(changes);
	return short_of_plan;
}

/*
 * Settle each planned tenant after the query: rows the query did not
 * return (locked, or not claimable yet by the claim-time filter) give back
 * their lease and their tokens now, since a tenant pays for the rows it
 * gets, not for the rows it was admitted to; its tag and served work are
 * corrected to what it got.  True when a tenant came back short (another
 * round may find more among the other tenants): it is passed over for the
 * rest of the claim, whose snapshot would find it short again.
 */
static bool
fs_claim_round_settle(FsFairDesc *desc, FsPlan *plan, TimestampTz now, FsSelection *sel)
{
	bool		short_of_plan = false;
	int			i;

	/*
	 * Leaves first: rows given back to a tenant before its leaf would be
	 * rows no leaf counts, for a claim in between.
	 */
	if (plan->leaves && fs_claim_leaves_settle(desc, plan, now, sel))
		short_of_plan = true;

	for (i = 0; i < plan->ntenants; i++)
	{
		FsPlanTenant *pt = &plan->tenants[i];
		float8		tag_fix;
		float8		served_fix;
		int			k;

		/*
		 * Room was made in fs_claim_round_plan(): nothing fails here.  With
		 * leaves, the tenant is passed over when it had no capacity for its
		 * picks or its rows as a whole came back short; its leaves are
		 * settled below.
		 */
		if (plan->leaves ? (pt->admitted < pt->planned || pt->whole_got < pt->whole_admitted) :
			pt->got < pt->planned)
		{
			short_of_plan = true;
			fs_passed_over_add(sel, pt->entry);
		}
		for (k = pt->got; k < pt->admitted; k++)
		{
			int64		held;

			(void) fs_slot_release(pt->leases[k], now, &held);
			fs_budget_unclaim(desc->queue, pt->name, pt->taken[k]);
		}
		fs_plan_settle(desc->queue, plan, pt, now, &tag_fix, &served_fix);
		if (pt->got != pt->planned || pt->unkeyed > 0 || tag_fix != 0 || served_fix != 0)
			fs_track_claim(desc, pt->name, pt->got - pt->unkeyed - pt->planned, tag_fix,
						   served_fix, plan->resync_gen, plan->vtime_before, plan->vtime_after);
	}
	return short_of_plan;
}

/*
 * One round: plan, admit, lock the rows, settle.  Returns the rows claimed;
 * *retry says whether another round may find more (a tenant was denied a
 * lease or came back short, and is now known not to have capacity or rows).
 */
static int32
fs_claim_round(FsFairDesc *desc, int32 want, int64 lease_usecs, TimestampTz now,
			   FsClaimOutput *out, bool *retry, FsSelection *sel, bool may_advance_starts)
{
	FsFairQueue *fq = desc->fq;
	FsPlan		plan;
	float8		est_cost;
	float8	   *costs;
	int32		claimed;
	int32		i;

	est_cost = desc->cost != NULL ? fq->avg_cost :
		desc->charge_runtime ? fq->avg_runtime_ms : 1.0;
	est_cost = fs_fair_clamp_cost(est_cost, false);

	*retry = false;
	if (!fs_claim_round_plan(desc, &plan, want, est_cost, now, sel))
		return 0;
	plan.may_advance_starts = may_advance_starts;
	costs = palloc(sizeof(float8) * Max(want, 1));
	claimed = fs_claim_round_query(desc, &plan, lease_usecs, now, out, costs, sel);
	*retry = fs_claim_round_settle(desc, &plan, now, sel);

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	if (claimed == 0 && fq->vtime == plan.vtime_after)
		fs_fair_set_vtime(fq, plan.vtime_before);
	FS_FAIR_COUNT(fq, rows_claimed, claimed);
	/* The rows' measured costs, in the order they came. */
	if (desc->cost != NULL)
		for (i = 0; i < claimed; i++)
			fs_fair_learn_cost(fq, costs[i]);
	LWLockRelease(fq->lock);
	pfree(costs);
	return claimed;
}

/*
 * Fail-open: claim in the queue's own order, without fair order, when
 * fairshare cannot keep the queue's state (the queue table is full) or has
 * ready rows of tenants it could not track.  Rows still get leases (failing
 * open themselves when state cannot be kept); a row whose tenant is at its
 * limit is not returned.  Up to `want` rows of desc's table, after the
 * `claimed` rows the claim has; returns how many it has then.
 */
static int32
fs_claim_fifo_table(FsFairDesc *desc, int32 want, int32 claimed, int64 lease_usecs,
					TimestampTz now, FsClaimOutput *out, const FsSelection *sel)
{
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	ArrayType  *held = fs_track_held_keys(desc);
	TupleDesc	tupdesc;
	uint64		r;

	values[0] = Int64GetDatum(want);
	values[1] = PointerGetDatum(held);
	nulls[1] = held == NULL ? 'n' : ' ';
	values[2] = sel->in;
	nulls[2] = sel->in == (Datum) 0 ? 'n' : ' ';
	values[3] = sel->not_in;
	nulls[3] = sel->not_in == (Datum) 0 ? 'n' : ' ';
	fs_claim_execute(desc, &desc->fifo_q, desc->fifo_plan, values, nulls,
					 "fail-open claim query");
	tupdesc = SPI_tuptable->tupdesc;
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[r];
		bool		isnull;
		Datum		tenant_datum = SPI_getbinval(tuple, tupdesc, 1, &isnull);
		char	   *tenant;
		int			len;
		FsSlotDecision decision;
		Datum		key;
		bool		key_isnull;
		float8		cost;

		if (isnull)
			continue;
		tenant = TextDatumGetCString(tenant_datum);
		len = strlen(tenant);
		if (len == 0 || len > FS_NAME_MAXLEN || strcmp(tenant, FS_WILDCARD) == 0)
			continue;
		fs_slot_acquire(desc->queue, tenant, lease_usecs, now, &decision);
		if (decision.lease_id == 0)
			continue;
		key = SPI_getbinval(tuple, tupdesc, 2, &key_isnull);
		cost = fs_fair_clamp_cost(DatumGetFloat8(SPI_getbinval(tuple, tupdesc, 3, &isnull)),
								  isnull || desc->cost == NULL);
		fs_claim_output_add(out, (float8) claimed, decision.lease_id, tenant,
							SPI_getbinval(tuple, tupdesc, 4, &isnull));
		if (desc->queue != NULL)
			(void) fs_track_claimed_row(desc, tenant, NULL, key, key_isnull, decision.lease_id,
										cost, false, 0);
		claimed++;
	}
	return claimed;
}

/*
 * fs_claim_fifo_table() on the queue's table, or on each of this node's
 * shards of a distributed queue in turn until `want` rows are claimed.
 */
static int32
fs_claim_fifo(FsFairDesc *desc, int32 want, int64 lease_usecs, TimestampTz now,
			  FsClaimOutput *out, const FsSelection *sel)
{
	int32		claimed = 0;

	if (!desc->distributed)
		return fs_claim_fifo_table(desc, want, 0, lease_usecs, now, out, sel);
	for (int p = 0; p < desc->nparts && claimed < want; p++)
		claimed = fs_claim_fifo_table(&desc->parts[p], want - claimed, claimed, lease_usecs, now,
									  out, sel);
	return claimed;
}

/*
 * fs_claim()'s max_rows: not NULL, positive, and at most FS_CLAIM_MAX_ROWS.
 */
static int32
fs_max_rows_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		max_rows;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_rows must not be null"),
				 errhint("Pass how many rows to claim, for example 10.")));
	max_rows = PG_GETARG_INT32(argno);
	if (max_rows <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_rows must be positive, got %d", max_rows),
				 errhint("Pass how many rows to claim, for example 10.")));
	if (max_rows > FS_CLAIM_MAX_ROWS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("max_rows must be at most %d, got %d", FS_CLAIM_MAX_ROWS, max_rows),
				 errhint("Claim in batches of at most %d rows.", FS_CLAIM_MAX_ROWS)));
	return max_rows;
}

/* The registration of the queue named by argument `argno`, or an error. */
FsFairDesc *
fs_fair_desc_arg(FunctionCallInfo fcinfo, int argno)
{
	char		queue_name[FS_NAME_BUFLEN];

	fs_name_arg(fcinfo, argno, "queue", queue_name);
	return fs_fair_desc(queue_name, false);
}

/* Recount the queue if it has not been counted in this server run. */
static void
fs_fair_ensure_synced(FsFairDesc *desc)
{
	/* A standby's counts are the primary's, replayed. */
	if (desc->fq == NULL || desc->fq->synced || RecoveryInProgress())
		return;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	(void) fs_fair_resync(desc, true, NULL);
	SPI_finish();
}

/* Items of a fair order visited per hold of its lock by a limits refresh. */
#define FS_REFRESH_BATCH	256

/*
 * Names of the tenants in `fq`'s fair order whose cached limits are not of
 * `generation`, at most `capacity`, into `names`; returns how many.  The
 * order is read a batch at a time (its lock shared for one batch): items
 * move between batches, so a tenant may be missed (or met twice).
 */
static int32
fs_fair_stale_tenants(FsFairQueue *fq, uint32 generation, char (*names)[FS_NAME_BUFLEN],
					  int32 capacity)
{
	int32		n = 0;
	int32		start;

	for (start = 0;; start += FS_REFRESH_BATCH)
	{
		int32		end;
		int32		i;

		LWLockAcquire(fq->lock, LW_SHARED);
		end = Min(start + FS_REFRESH_BATCH, fq->nitems);
		for (i = start; i < end && n < capacity; i++)
		{
			FsTenant   *entry = fs_heap_at(fq, i)->tenant;
			uint32		cached;

			fs_tenant_lock(entry);
			cached = entry->limits_generation;
			fs_tenant_unlock(entry);
			/* The key never changes while the entry is listed (pinned). */
			if (cached != generation)
				strlcpy(names[n++], entry->key.tenant, FS_NAME_BUFLEN);
		}
		LWLockRelease(fq->lock);
		if (end < start + FS_REFRESH_BATCH || n == capacity)
			return n;
	}
}

/*
 * After fs_limits changed, reload the limits of the queue's backlogged
 * tenants (their weights and floors) before planning with them.  Done by the
 * first claim that sees the new generation; SPI runs with no lock held, and
 * the fair order is read and its floor marks updated a batch at a time, so
 * that a long order never holds its lock for long.  A second look finds the
 * tenants that moved past the first one; a tenant missed by both (or whose
 * limits cannot be read) loads them at its next decision.
 */
static void
fs_fair_refresh_limits(FsFairDesc *desc)
{
	FsFairQueue *fq = desc->fq;
	uint32		generation = pg_atomic_read_u32(&fs_shared->limits_generation);
	char	  (*names)[FS_NAME_BUFLEN];
	int32		capacity;
	int32		start;
	int			look;

	if (fq->limits_generation == generation)
		return;

	LWLockAcquire(fq->lock, LW_SHARED);
	capacity = Max(fq->nitems, 1);
	LWLockRelease(fq->lock);
	names = palloc(sizeof(*names) * capacity);
	for (look = 0; look < 2; look++)
	{
		int32		n = fs_fair_stale_tenants(fq, generation, names, capacity);
		int32		i;

		for (i = 0; i < n; i++)
		{
			FsTenantRef ref;

			if (fs_tenant_open(desc->queue, names[i], 0, &ref) != NULL)
				fs_tenant_close(&ref);
		}
		if (n == 0)
			break;
	}
	pfree(names);

	/* The floor marks, a batch at a time; nfloor follows each change. */
	for (start = 0;; start += FS_REFRESH_BATCH)
	{
		int32		end;
		int32		i;
		bool		done;

		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		end = Min(start + FS_REFRESH_BATCH, fq->nitems);
		for (i = start; i < end; i++)
		{
			FsHeapItem *item = fs_heap_at(fq, i);
			int32		min_slots;

			fs_tenant_lock(item->tenant);
			min_slots = item->tenant->min_slots;
			fs_tenant_unlock(item->tenant);
			if ((item->min_slots > 0) != (min_slots > 0))
				fq->nfloor += min_slots > 0 ? 1 : -1;
			item->min_slots = min_slots;
		}
		done = end < start + FS_REFRESH_BATCH;
		if (done)
			fq->limits_generation = generation;
		LWLockRelease(fq->lock);
		if (done)
			break;
	}
}

static Datum fs_claim_common(FunctionCallInfo fcinfo, int first);

/*
 * May the caller claim rows of `desc`'s queue?  fs_claim() locks them FOR
 * UPDATE: SELECT and UPDATE on the table, and USAGE on its schema.
 */
static void
fs_claim_check_access(FsFairDesc *desc)
{
	if (pg_class_aclcheck(desc->ready_relid, GetUserId(), ACL_SELECT) != ACLCHECK_OK ||
		pg_class_aclcheck(desc->ready_relid, GetUserId(), ACL_UPDATE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to claim rows of %s", desc->ready_name),
				 errhint("fs_claim() locks rows FOR UPDATE: it needs SELECT and UPDATE on the table.")));
	fs_fair_check_schema_usage(desc, "fs_claim");
}


/*
 * fs_claim(queue text, row_type anyelement, max_rows int, lease interval,
 *			selector_in text[], selector_not_in text[])
 *	 RETURNS TABLE(lease_id bigint, tenant text, job anyelement)
 *
 * Claims up to max_rows ready rows of the queue in fair order, locked FOR
 * UPDATE SKIP LOCKED in the caller's transaction, each with a lease (NULL:
 * the queue's registered lease, or 5 minutes); the rows come back whole, as
 * the ready table's row type, in fair order.  With a selection, only rows
 * in it; if the fair rounds passed over so many tenants without rows in it
 * that they end short, the rest come in the queue's own order within the
 * selection (fs_claim_fifo()), so that a selection's rows are never held
 * back by tenants ahead of them in the fair order that have none.
 */
Datum
fs_claim(PG_FUNCTION_ARGS)
{
	return fs_claim_common(fcinfo, 0);
}

/*
 * fs_claim_at(node_anchor text, queue text, row_type anyelement, ...)
 *	 RETURNS TABLE(lease_id bigint, tenant text, job anyelement)
 *
 * fs_claim() of this node's own shards, on the node that holds
 * node_anchor's shard, where Citus delegates it: what a claim on the
 * coordinator sends to the node it chose (route.c).  Never routed on.
 */
Datum
fs_claim_at(PG_FUNCTION_ARGS)
{
	fs_cluster_check_anchor_arg(fcinfo, "fs_claim_at");
	return fs_claim_common(fcinfo, 1);
}

/*
 * fs_claim() with its arguments from `first` on (the queue's; before it,
 * fs_claim_at()'s anchor).  On the coordinator of a Citus cluster, a claim
 * of a queue on a distributed table is sent to the nodes (route.c); on a
 * node, or through fs_claim_at(), it claims the rows of this node's shards.
 */
static Datum
fs_claim_common(FunctionCallInfo fcinfo, int first)
{
	FsFairDesc *desc;
	Oid			row_type;
	int32		max_rows;
	int64		lease_usecs;
	ReturnSetInfo *rsinfo;
	FsClaimOutput out;
	FsSelection sel;
	int32		claimed = 0;
	int			rounds = 0;
	TimestampTz now;
	bool		may_advance_starts;
	int			i;

	/*
	 * Probe starts advance only in a claim whose transaction changed
	 * nothing before it, and not under SERIALIZABLE (probe_start.c).
	 */
	may_advance_starts = !FullTransactionIdIsValid(GetTopFullTransactionIdIfAny()) &&
		!IsolationIsSerializable();
	fs_check_primary("claim rows with fairshare");
	desc = fs_fair_desc_arg(fcinfo, first);
	row_type = get_fn_expr_argtype(fcinfo->flinfo, first + 1);
	if (row_type != desc->row_type)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("row_type of queue \"%s\" must be %s, got %s", desc->queue_name,
						format_type_be(desc->row_type), format_type_be(row_type)),
				 errhint("Pass NULL::%s as row_type.", desc->ready_name)));
	max_rows = fs_max_rows_arg(fcinfo, first + 2);
	lease_usecs = PG_ARGISNULL(first + 3) ? desc->lease_usecs :
		fs_lease_interval_arg(fcinfo, first + 3, "lease");
	fs_selection_args(fcinfo, first + 4, desc, &sel);
	fs_claim_check_access(desc);

	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	if (desc->distributed && first == 0 && fs_cluster_group() == 0)
	{
		fs_claim_routed(fcinfo, desc, max_rows, rsinfo);
		return (Datum) 0;
	}

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	out.capacity = max_rows;
	out.count = 0;
	out.rows = palloc(sizeof(FsClaimedRow) * max_rows);

	now = fs_now();
	if (desc->fq != NULL)
	{
		fs_fair_ensure_synced(desc);
		fs_fair_refresh_limits(desc);
		fs_fair_measure_latency(desc, now);
		while (claimed < max_rows && rounds++ < FS_CLAIM_MAX_ROUNDS)
		{
			bool		retry;
			int32		got = fs_claim_round(desc, max_rows - claimed, lease_usecs, now,
											 &out, &retry, &sel, may_advance_starts);

			claimed += got;
			if (got == 0 && !retry)
				break;
		}
		LWLockAcquire(desc->fq->lock, LW_EXCLUSIVE);
		FS_FAIR_COUNT(desc->fq, claims, 1);
		LWLockRelease(desc->fq->lock);
		FS_FAIR_DEBUG_CHECK(desc->fq);
	}
	if (claimed < max_rows && desc->fq != NULL && sel.active && sel.npassed_over > 0)
		claimed += fs_claim_fifo(desc, max_rows - claimed, lease_usecs, now, &out, &sel);
	if (claimed < max_rows && (desc->fq == NULL || desc->fq->untracked_rows > 0))
	{
		int32		got = fs_claim_fifo(desc, max_rows - claimed, lease_usecs, now, &out, &sel);

		if (got > 0)
		{
			claimed += got;
			if (desc->fq != NULL)
			{
				LWLockAcquire(desc->fq->lock, LW_EXCLUSIVE);
				FS_FAIR_COUNT(desc->fq, fail_open, 1);
				LWLockRelease(desc->fq->lock);
			}
			else
				FS_COUNT_GLOBAL(fail_open);
		}
	}

	qsort(out.rows, out.count, sizeof(FsClaimedRow), fs_claimed_row_cmp);
	for (i = 0; i < out.count; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = Int64GetDatum(fs_lease_id_out(out.rows[i].lease_id));
		values[1] = CStringGetTextDatum(out.rows[i].tenant);
		values[2] = out.rows[i].row;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	SPI_finish();
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * fs_ready_tenants()
 * ----------------------------------------------------------------
 */

typedef struct FsReadyTenant
{
	char		name[FS_NAME_BUFLEN];
	int64		ready;
	int32		free_slots;		/* -1: no limit */
	bool		below_floor;
	float8		tag;
	float8		start;
	float8		weight;
} FsReadyTenant;

/*
 * Order of fs_ready_tenants(): tenants below their floor first, then by
 * start tag, then by name.
 */
static int
fs_ready_tenant_cmp(const void *a, const void *b)
{
	const FsReadyTenant *x = (const FsReadyTenant *) a;
	const FsReadyTenant *y = (const FsReadyTenant *) b;

	if (x->below_floor != y->below_floor)
		return x->below_floor ? -1 : 1;
	if (x->tag != y->tag)
		return x->tag < y->tag ? -1 : 1;
	return strcmp(x->name, y->name);
}

/*
 * May the caller list the tenants of `desc`'s queue?  It needs SELECT on
 * the ready table, and row-level security must not restrict it there: the
 * counts are of every ready row, whoever may see it (they are kept by
 * triggers and recounted as the table's owner), so a caller the policies
 * restrict would learn of tenants and rows they hide.  Only roles they do
 * not apply to may list them (the owner, unless the table forces it, a
 * role with BYPASSRLS, or anyone on a table without policies).  fs_claim()
 * queries as the caller and respects them.
 */
static void
fs_ready_tenants_check(FsFairDesc *desc)
{
	if (pg_class_aclcheck(desc->ready_relid, GetUserId(), ACL_SELECT) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to list the tenants of %s", desc->ready_name),
				 errhint("fs_ready_tenants() needs SELECT on the queue's table.")));
	fs_fair_check_schema_usage(desc, "fs_ready_tenants");
	if (check_enable_rls(desc->ready_relid, InvalidOid, true) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to list the tenants of queue \"%s\": row-level security "
						"restricts you on %s", desc->queue_name, desc->ready_name),
				 errdetail("fs_ready_tenants() counts every ready row, including the rows the "
						   "table's policies hide from you."),
				 errhint("Call it as the table's owner or a role with BYPASSRLS, or claim with "
						 "fs_claim(), which applies the policies.")));
}

/*
 * List into `list` (room for `capacity`) the tenants of the fair order with
 * ready rows, budget and a free slot; with `skip_dry`, not those that came
 * up short lately (*skipped_dry says whether any was left out).  Returns
 * how many.
 */
static int
fs_ready_tenants_collect(FsFairQueue *fq, FsReadyTenant *list, int capacity,
						 const FsGateCapacity *gate, float8 budget_cost, TimestampTz now,
						 bool skip_dry, bool *skipped_dry)
{
	int			n = 0;
	int			i;

	LWLockAcquire(fq->lock, LW_SHARED);
	for (i = 0; i < fq->nitems && n < capacity; i++)
	{
		FsHeapItem *item = fs_heap_at(fq, i);
		FsTenantView v;
		int32		ceiling;

		fs_tenant_view(item->tenant, &v, now);
		if (v.ready <= 0 || !fs_view_can_pay(&v, 1, budget_cost))
			continue;
		if (skip_dry && fs_item_dry(item, &v, now))
		{
			*skipped_dry = true;
			continue;
		}
		ceiling = fs_plan_ceiling(gate, &v);
		if (v.slots >= ceiling)
			continue;
		strlcpy(list[n].name, item->tenant->key.tenant, FS_NAME_BUFLEN);
		list[n].ready = v.ready;
		list[n].free_slots = ceiling == FS_NO_SLOT_LIMIT ? -1 : ceiling - v.slots;
		list[n].below_floor = v.slots < Min(v.limits.min_slots, ceiling);
		list[n].tag = item->key;
		list[n].start = Max(fq->vtime, item->key);
		list[n].weight = v.limits.weight;
		n++;
	}
	LWLockRelease(fq->lock);
	return n;
}

/*
 * The tenants of `desc`'s queue that a claim could serve now, as
 * fs_ready_tenants_collect() lists them, in no order; *n says how many.
 * Tenants that came up short lately are left out, unless they are all
 * there is (work-conserving, as fs_claim()).
 */
static FsReadyTenant *
fs_ready_tenants_list(FsFairDesc *desc, int *n)
{
	FsFairQueue *fq = desc->fq;
	FsReadyTenant *list;
	FsGateCapacity gate;
	float8		budget_cost;
	bool		skipped_dry = false;
	TimestampTz now = fs_now();
	int			capacity;

	*n = 0;
	if (fq == NULL)
		return NULL;
	fs_fair_ensure_synced(desc);

	LWLockAcquire(fq->lock, LW_SHARED);
	capacity = fq->nitems;
	LWLockRelease(fq->lock);
	list = palloc(sizeof(FsReadyTenant) * Max(capacity, 1));
	fs_gate_capacity(desc->queue, now, &gate);
	budget_cost = fs_fair_budget_cost(desc);
	*n = fs_ready_tenants_collect(fq, list, capacity, &gate, budget_cost, now, true, &skipped_dry);
	if (*n == 0 && skipped_dry)
		*n = fs_ready_tenants_collect(fq, list, capacity, &gate, budget_cost, now, false,
									  &skipped_dry);
	return list;
}

/*
 * fs_ready_tenants(queue text, max_tenants int)
 *	 RETURNS TABLE(tenant text, ready_rows bigint, free_slots int,
 *				   virtual_start float8, weight float8)
 *
 * Tenants with ready rows and free capacity, in fair order (those below
 * their min_slots first): the building block for an application's own
 * LATERAL ... FOR UPDATE SKIP LOCKED claim.  Changes nothing.
 */
Datum
fs_ready_tenants(PG_FUNCTION_ARGS)
{
	FsFairDesc *desc;
	int32		max_tenants;
	ReturnSetInfo *rsinfo;
	FsReadyTenant *list;
	int			n;
	int			i;

	fs_check_loaded();
	desc = fs_fair_desc_arg(fcinfo, 0);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_tenants must not be null"),
				 errhint("Pass how many tenants to list, for example 100.")));
	max_tenants = PG_GETARG_INT32(1);
	if (max_tenants <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_tenants must be positive, got %d", max_tenants),
				 errhint("Pass how many tenants to list, for example 100.")));
	fs_ready_tenants_check(desc);

	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	list = fs_ready_tenants_list(desc, &n);
	if (n > 1)
		qsort(list, n, sizeof(FsReadyTenant), fs_ready_tenant_cmp);
	for (i = 0; i < n && i < max_tenants; i++)
	{
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		values[0] = CStringGetTextDatum(list[i].name);
		values[1] = Int64GetDatum(list[i].ready);
		values[2] = Int32GetDatum(list[i].free_slots);
		nulls[2] = list[i].free_slots < 0;	/* no limit */
		values[3] = Float8GetDatum(list[i].start);
		values[4] = Float8GetDatum(list[i].weight);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * fs_claimable_weight_at(node_anchor text, queue text) RETURNS float8
 *
 * On the node that holds node_anchor's shard: the sum of the weights of
 * the queue's tenants there that a claim could serve now (ready rows,
 * budget and a free slot), as fs_ready_tenants() lists them.  A claim on
 * the coordinator shares its claims among the nodes by these sums
 * (route.c).  Needs what fs_claim() needs of the caller.
 */
Datum
fs_claimable_weight_at(PG_FUNCTION_ARGS)
{
	FsFairDesc *desc;
	FsReadyTenant *list;
	float8		sum = 0;
	int			n;
	int			i;

	fs_check_loaded();
	fs_cluster_check_anchor_arg(fcinfo, "fs_claimable_weight_at");
	desc = fs_fair_desc_arg(fcinfo, 1);
	fs_claim_check_access(desc);
	if (desc->nparts == 0)
		PG_RETURN_FLOAT8(0);
	list = fs_ready_tenants_list(desc, &n);
	for (i = 0; i < n; i++)
		sum += list[i].weight;
	if (list != NULL)
		pfree(list);
	PG_RETURN_FLOAT8(sum);
}

/*-------------------------------------------------------------------------
 *
 * triggers.c
 *	  Fair dequeue's triggers on a registered queue's tables: the ready-row
 *	  trigger counts rows entering and leaving the ready state per tenant,
 *	  the running-row trigger releases the lease of a row that stops
 *	  running, and the truncate trigger has the queue recounted.  What they
 *	  note is kept for the end of the transaction by track.c.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/relation.h"
#include "catalog/namespace.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/datum.h"

#include "core/cluster.h"
#include "fairq/fairqueue_int.h"
#include "fairq/register_int.h"
#include "slots/slots.h"

PG_FUNCTION_INFO_V1(fs_fair_ready_trigger);
PG_FUNCTION_INFO_V1(fs_fair_running_trigger);
PG_FUNCTION_INFO_V1(fs_fair_truncate_trigger);

/* ----------------------------------------------------------------
 * The triggers
 * ----------------------------------------------------------------
 */

/*
 * The trigger data of a fair-dequeue trigger, refused unless it fires AFTER,
 * per row or per statement as `row` says.
 */
static TriggerData *
fs_trigger_data(FunctionCallInfo fcinfo, const char *name, bool row)
{
	TriggerData *td = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(td->tg_event) ||
		(TRIGGER_FIRED_FOR_ROW(td->tg_event) != 0) != row)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s() must be fired AFTER ... FOR EACH %s", name, row ? "ROW" : "STATEMENT")));
	return td;
}

/*
 * Error context of a trigger: an expression of a registration that fails
 * on a row (a cost dividing by zero, say) names its queue.
 */
static void
fs_trigger_error_callback(void *arg)
{
	errcontext("expressions of queue \"%s\", evaluated by fairshare's trigger",
			   (const char *) arg);
}

/*
 * Evaluate a registration on a ready-table row: false if the row is not
 * ready; else true, with its tenant in `tenant` ("" if NULL or not a valid
 * tenant name) and, for a queue with a subkey, its leaf in `subkey`
 * (fs_subkey_name(); "" without a subkey).
 */
static bool
fs_ready_eval(FsRelRole *role, ExprContext *econtext, TupleTableSlot *slot, char *tenant,
			  char *subkey)
{
	bool		isnull;
	Datum		value;
	text	   *t;
	int			len;

	econtext->ecxt_scantuple = slot;
	if (role->filter != NULL)
	{
		value = ExecEvalExprSwitchContext(role->filter, econtext, &isnull);
		if (isnull || !DatumGetBool(value))
			return false;
	}
	subkey[0] = '\0';
	if (role->subkey != NULL)
	{
		value = ExecEvalExprSwitchContext(role->subkey, econtext, &isnull);
		fs_subkey_name(value, isnull, subkey);
	}
	tenant[0] = '\0';
	value = ExecEvalExprSwitchContext(role->tenant, econtext, &isnull);
	if (isnull)
		return true;
	t = DatumGetTextPP(value);
	len = VARSIZE_ANY_EXHDR(t);
	if (len == 0 || len > FS_NAME_MAXLEN || (len == 1 && *VARDATA_ANY(t) == '*'))
		return true;
	memcpy(tenant, VARDATA_ANY(t), len);
	tenant[len] = '\0';
	return true;
}

/* A ready row of `tenant` left the ready state (deleted or updated out). */
static void
fs_ready_leave(FsRelRole *role, ExprContext *econtext, TupleTableSlot *slot, const char *tenant,
			   const char *subkey)
{
	bool		isnull;
	Datum		key;
	float8		cost;

	if (tenant[0] == '\0')
	{
		fs_delta_add(role->queue, "", NULL, -1, 0, 0);
		return;
	}

	econtext->ecxt_scantuple = slot;
	key = ExecEvalExprSwitchContext(role->key, econtext, &isnull);
	/* Claimed by fs_claim() in this transaction: already taken off. */
	if (!isnull && fs_track_row_left(role, key, tenant))
		return;

	if (role->cost != NULL)
		cost = fs_fair_clamp_cost(DatumGetFloat8(ExecEvalExprSwitchContext(role->cost, econtext,
																		   &isnull)), isnull);
	else
		cost = role->charge_runtime ? fs_fair_queue(role->queue)->avg_runtime_ms : 1.0;
	fs_delta_add(role->queue, tenant, subkey, -1, 1, cost);
}

/*
 * A ready row that moved to another sub-key of its tenant: was it one that
 * fs_claim() claimed in this transaction (its reservation then moves with
 * it, fs_track_row_moved())?
 */
static bool
fs_ready_moved_claimed(FsRelRole *role, ExprContext *econtext, TupleTableSlot *slot,
					   const char *tenant, const char *subkey)
{
	bool		isnull;
	Datum		key;

	econtext->ecxt_scantuple = slot;
	key = ExecEvalExprSwitchContext(role->key, econtext, &isnull);
	return !isnull && fs_track_row_moved(role, key, tenant, subkey);
}

static void fs_fair_truncated(Relation rel, bool ready, bool running);

/* AFTER INSERT OR DELETE OR UPDATE FOR EACH ROW on a ready table. */
Datum
fs_fair_ready_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *td = fs_trigger_data(fcinfo, "fs_fair_ready_trigger", true);
	FsRelTriggers *rt;
	int			i;
	ErrorContextCallback errcb;

	/* Not preloaded: nothing to keep (the queue is recounted when it is). */
	if (fs_fair == NULL)
		return PointerGetDatum(NULL);
	rt = fs_fair_rel_triggers(td->tg_relation);

	errcb.callback = fs_trigger_error_callback;
	errcb.previous = error_context_stack;
	for (i = 0; i < rt->nready; i++)
	{
		FsRelRole  *role = &rt->ready[i];
		char		old_tenant[FS_NAME_BUFLEN];
		char		new_tenant[FS_NAME_BUFLEN];
		char		old_subkey[FS_NAME_BUFLEN];
		char		new_subkey[FS_NAME_BUFLEN];
		bool		old_in = false;
		bool		new_in = false;
		FsRunAs		run_as;

		if (role->queue == NULL)
			continue;			/* no room for the queue: claims fail open */
		errcb.arg = role->queue_name;
		error_context_stack = &errcb;
		if (OidIsValid(role->run_as_owner))
			fs_run_as_begin(&run_as, role->run_as_owner, FS_RUN_AS_READ_ONLY);
		if (TRIGGER_FIRED_BY_INSERT(td->tg_event))
			new_in = fs_ready_eval(role, rt->econtext, td->tg_trigslot, new_tenant, new_subkey);
		else if (TRIGGER_FIRED_BY_DELETE(td->tg_event))
			old_in = fs_ready_eval(role, rt->econtext, td->tg_trigslot, old_tenant, old_subkey);
		else
		{
			old_in = fs_ready_eval(role, rt->econtext, td->tg_trigslot, old_tenant, old_subkey);
			new_in = fs_ready_eval(role, rt->econtext, td->tg_newslot, new_tenant, new_subkey);
			if (old_in && new_in && strcmp(old_tenant, new_tenant) == 0)
			{
				/*
				 * Still ready, same tenant: nothing left it.  A row moved to
				 * another sub-key moves between its leaves only (its tenant
				 * is not charged as for a row that left).
				 */
				if (strcmp(old_subkey, new_subkey) != 0 && old_tenant[0] != '\0' &&
					!fs_ready_moved_claimed(role, rt->econtext, td->tg_trigslot, old_tenant,
											new_subkey))
				{
					fs_delta_add(role->queue, old_tenant, old_subkey, -1, 0, 0);
					fs_delta_add(role->queue, new_tenant, new_subkey, 1, 0, 0);
				}
				else if (new_tenant[0] != '\0')
					fs_delta_reordered(role->queue, new_tenant, new_subkey);
				old_in = new_in = false;
			}
		}
		if (old_in)
			fs_ready_leave(role, rt->econtext, td->tg_trigslot, old_tenant, old_subkey);
		if (new_in)
			fs_delta_add(role->queue, new_tenant, new_subkey, 1, 0, 0);
		if (OidIsValid(role->run_as_owner))
			fs_run_as_end(&run_as);
		error_context_stack = errcb.previous;
		ResetExprContext(rt->econtext);
	}
	return PointerGetDatum(NULL);
}

/* Does a running-table row pass the registration's running_filter (none: yes)? */
static bool
fs_running_eval(FsRelRole *role, ExprContext *econtext, TupleTableSlot *slot)
{
	bool		isnull;
	Datum		value;

	if (role->running_filter == NULL)
		return true;
	econtext->ecxt_scantuple = slot;
	value = ExecEvalExprSwitchContext(role->running_filter, econtext, &isnull);
	return !isnull && DatumGetBool(value);
}

/* Release the lease of a claimed row (found in the claim map). */
static void
fs_release_claim(FsRelRole *role, const FsClaimEntry *entry)
{
	int64		held = 0;
	bool		released;

	released = fs_slot_release(entry->lease_id, fs_now(), &held);
	fs_track_release(role, entry, released, held);
}

/*
 * A row left a queue's running table: if a claim's lease is mapped to its
 * key, release it (the job is done).
 */
static void
fs_running_leave(FsRelRole *role, ExprContext *econtext, TupleTableSlot *slot)
{
	bool		isnull;
	Datum		key;
	FsClaimKey	ckey;
	FsClaimEntry entry;

	char	   *tenant = NULL;

	econtext->ecxt_scantuple = slot;
	key = ExecEvalExprSwitchContext(role->running_key, econtext, &isnull);
	if (isnull)
		return;
	/* A Citus shard's key is known with its tenant, its distribution column. */
	if (role->tenant_keys)
	{
		Datum		t = ExecEvalExprSwitchContext(role->running_tenant, econtext, &isnull);

		if (isnull)
			return;
		tenant = TextDatumGetCString(t);
	}
	fs_claim_key_make(&ckey, role->queue->queue_id, key, role->key_type, role->key_len,
					  role->key_byval, tenant);
	if (fs_claim_map_find(&ckey, &entry))
		fs_release_claim(role, &entry);
}

/* AFTER DELETE OR UPDATE FOR EACH ROW on a running table. */
Datum
fs_fair_running_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *td = fs_trigger_data(fcinfo, "fs_fair_running_trigger", true);
	FsRelTriggers *rt;
	int			i;
	ErrorContextCallback errcb;

	if (fs_fair == NULL)
		return PointerGetDatum(NULL);
	rt = fs_fair_rel_triggers(td->tg_relation);

	errcb.callback = fs_trigger_error_callback;
	errcb.previous = error_context_stack;
	for (i = 0; i < rt->nrunning; i++)
	{
		FsRelRole  *role = &rt->running[i];
		FsRunAs		run_as;

		if (role->queue == NULL)
			continue;
		errcb.arg = role->queue_name;
		error_context_stack = &errcb;
		if (OidIsValid(role->run_as_owner))
			fs_run_as_begin(&run_as, role->run_as_owner, FS_RUN_AS_READ_ONLY);
		if (TRIGGER_FIRED_BY_DELETE(td->tg_event))
		{
			if (fs_running_eval(role, rt->econtext, td->tg_trigslot))
				fs_running_leave(role, rt->econtext, td->tg_trigslot);
		}
		else if (TRIGGER_FIRED_BY_UPDATE(td->tg_event) &&
				 fs_running_eval(role, rt->econtext, td->tg_trigslot))
		{
			bool		still = fs_running_eval(role, rt->econtext, td->tg_newslot);

			if (still)
			{
				bool		old_null;
				bool		new_null;
				Datum		old_key;
				Datum		new_key;

				/* Still running, unless it became another job. */
				rt->econtext->ecxt_scantuple = td->tg_trigslot;
				old_key = ExecEvalExprSwitchContext(role->running_key, rt->econtext, &old_null);
				rt->econtext->ecxt_scantuple = td->tg_newslot;
				new_key = ExecEvalExprSwitchContext(role->running_key, rt->econtext, &new_null);
				still = old_null == new_null &&
					(old_null || datumIsEqual(old_key, new_key, role->key_byval, role->key_len));
			}
			if (!still)
				fs_running_leave(role, rt->econtext, td->tg_trigslot);
		}
		if (OidIsValid(role->run_as_owner))
			fs_run_as_end(&run_as);
		error_context_stack = errcb.previous;
		ResetExprContext(rt->econtext);
	}
	return PointerGetDatum(NULL);
}

/*
 * AFTER TRUNCATE FOR EACH STATEMENT: a truncated ready table is recounted
 * at its queue's next use; a truncated running table releases the leases of
 * all its claimed rows.
 */
Datum
fs_fair_truncate_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *td = fs_trigger_data(fcinfo, "fs_fair_truncate_trigger", false);
	bool		running;

	if (fs_fair == NULL)
		return PointerGetDatum(NULL);
	running = td->tg_trigger->tgnargs > 0 && strcmp(td->tg_trigger->tgargs[0], "running") == 0;
	fs_fair_truncated(td->tg_relation, !running, running);
	return PointerGetDatum(NULL);
}

/*
 * Table `rel` was truncated, as a ready table of its registrations
 * (`ready`: their queues are recounted) or a running table (`running`: the
 * leases of all their claimed rows are released).
 */
static void
fs_fair_truncated(Relation rel, bool ready, bool running)
{
	FsRelTriggers *rt = fs_fair_rel_triggers(rel);

	for (int i = 0; ready && i < rt->nready; i++)
		if (rt->ready[i].queue != NULL)
			fs_track_truncated(rt->ready[i].queue_name);
	for (int i = 0; running && i < rt->nrunning; i++)
	{
		FsRelRole  *role = &rt->running[i];
		FsClaimEntry *entries;
		int			n;

		if (role->queue == NULL)
			continue;
		entries = fs_claim_map_collect(role->queue->queue_id, &n);
		/* Once per lease: a TRUNCATE of several shards comes here for each. */
		for (int k = 0; k < n; k++)
			if (!fs_track_releasing(entries[k].lease_id))
				fs_release_claim(role, &entries[k]);
		pfree(entries);
	}
}

/* ----------------------------------------------------------------
 * TRUNCATE of a Citus shard
 *
 * Citus gives shards the row triggers of their distributed table but no
 * TRUNCATE trigger: a node learns that its shard of a queue's table was
 * truncated from the statement itself (which Citus sends each node).
 * ----------------------------------------------------------------
 */

static ProcessUtility_hook_type prev_process_utility = NULL;

/*
 * ProcessUtility hook: a TRUNCATE of Citus shards of registered tables
 * is what their TRUNCATE triggers would have seen, once it succeeded.
 */
static void
fs_fair_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
						ProcessUtilityContext context, ParamListInfo params,
						QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	bool		truncate = IsA(pstmt->utilityStmt, TruncateStmt);
	ListCell   *lc;

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv,
								dest, qc);
	if (!truncate || fs_fair == NULL || fs_cluster_absent ||
		!OidIsValid(get_extension_oid("fairshare", true)))
		return;
	foreach(lc, ((TruncateStmt *) pstmt->utilityStmt)->relations)
	{
		/* Truncated: the statement holds this lock, so no wait and no other table. */
		Oid			relid = RangeVarGetRelid(lfirst_node(RangeVar, lc), AccessExclusiveLock, true);
		Relation	rel;
		bool		ready = false;
		bool		running = false;

		if (!OidIsValid(relid) || !OidIsValid(fs_cluster_shard_parent(relid)))
			continue;
		rel = relation_open(relid, NoLock);
		/* A shard of a registered table has fairshare's row triggers (Citus's copies). */
		for (int i = 0; rel->trigdesc != NULL && i < rel->trigdesc->numtriggers; i++)
		{
			const char *name = rel->trigdesc->triggers[i].tgname;

			ready |= strncmp(name, FS_TRIGGER_READY "_", strlen(FS_TRIGGER_READY) + 1) == 0;
			running |= strncmp(name, FS_TRIGGER_RUN "_", strlen(FS_TRIGGER_RUN) + 1) == 0;
		}
		if (ready || running)
			fs_fair_truncated(rel, ready, running);
		relation_close(rel, NoLock);
	}
}

/* Install the ProcessUtility hook (at _PG_init). */
void
fs_fair_triggers_init(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = fs_fair_process_utility;
}

/*-------------------------------------------------------------------------
 *
 * budget.c
 *	  Token buckets: milliseconds of worker time per tenant.
 *
 * A bucket holds at most budget_ms_per_minute tokens and accrues
 * continuously, budget_ms_per_minute per minute of wall-clock time, in
 * proportion to the time since the tenant's last decision (touched_at).  A
 * tenant seen for the first time starts with a full bucket.  A tenant
 * without a budget is never limited and costs nothing to decide for.
 *
 * fs_spend_tokens() admits runs: granted = min(requested, floor(balance /
 * cost_ms)), and only what is granted is consumed.  fs_charge_tokens() pays
 * for work as it runs and may take the balance below zero; accrual repays
 * the debt.  Both are undone if their transaction (or savepoint) rolls
 * back: the tokens go back into the bucket, up to its cap.
 *
 * Admission also answers to the gate's backpressure (gate.c), and fails
 * open when state cannot be kept: the tenant table is full, or the server
 * crashed less than a minute ago and the tenant's balance is unknown.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "budget/budget.h"
#include "core/cluster.h"
#include "core/decisions.h"
#include "core/prepared.h"
#include "gate/gate.h"

PG_FUNCTION_INFO_V1(fs_spend_tokens);
PG_FUNCTION_INFO_V1(fs_charge_tokens);

/* Are balances unknown at `now` because the server crashed just before? */
bool
fs_budget_state_lost(TimestampTz now)
{
	return fs_shared->start_kind == FS_START_AFTER_CRASH &&
		now - fs_shared->started_at < FS_BUDGET_LOST_USECS;
}

/* ----------------------------------------------------------------
 * Refunds at abort
 *
 * Tokens taken in this transaction, per (queue, tenant, subtransaction).
 * At abort they go back; at commit they are forgotten.  The refund finds
 * the entry again by its key, without loading limits (no SPI at abort).
 * ----------------------------------------------------------------
 */
typedef struct FsRefundKey
{
	uint32		queue_id;
	SubTransactionId subid;
	char		tenant[FS_NAME_BUFLEN];
} FsRefundKey;

typedef struct FsRefund
{
	FsRefundKey key;
	float8		tokens;
} FsRefund;

static HTAB *refunds = NULL;
static long refund_count = 0;

/*
 * The refund entry of (queue, tenant) in this subtransaction, created if
 * need be.  Deciders make it before they take any token, so that nothing
 * can fail (out of memory) between taking tokens and recording their
 * refund.  Entries never move, so the pointer stays good until the
 * transaction ends.
 */
static FsRefund *
fs_budget_refund_entry(FsQueue *queue, const char *tenant)
{
	FsRefundKey key;
	FsRefund   *refund;
	bool		found;

	if (refunds == NULL)
	{
		HASHCTL		info;

		info.keysize = sizeof(FsRefundKey);
		info.entrysize = sizeof(FsRefund);
		info.hcxt = TopMemoryContext;
		refunds = hash_create("fairshare refunds", 16, &info,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	memset(&key, 0, sizeof(key));
	key.queue_id = queue->queue_id;
	key.subid = GetCurrentSubTransactionId();
	strlcpy(key.tenant, tenant, sizeof(key.tenant));
	FS_FAULT_POINT("refund_entry");
	refund = hash_search(refunds, &key, HASH_ENTER, &found);
	if (!found)
	{
		refund->tokens = 0;
		refund_count++;
	}
	return refund;
}

/* Give `tokens` back to the tenant's bucket if this transaction aborts. */
void
fs_budget_refund_at_abort(FsQueue *queue, const char *tenant, float8 tokens)
{
	if (tokens == 0)
		return;
	fs_budget_refund_entry(queue, tenant)->tokens += tokens;
}

/* Record tokens taken in an entry made beforehand (or, without one, now). */
static inline void
fs_budget_refund_add(FsRefund *prepared, FsQueue *queue, const char *tenant, float8 tokens)
{
	if (tokens == 0)
		return;
	if (prepared != NULL)
		prepared->tokens += tokens;
	else
		fs_budget_refund_at_abort(queue, tenant, tokens);
}

/* Put tokens back into a bucket, up to its cap. */
static void
fs_budget_refund(const FsRefundKey *key, float8 tokens)
{
	FsQueue    *queue = fs_queue_by_id(key->queue_id);
	FsTenantRef ref;
	FsTenant   *entry;

	if (queue == NULL)
		return;
	entry = fs_tenant_open(queue, key->tenant, FS_OPEN_NO_LIMITS, &ref);
	if (entry == NULL)
		return;					/* evicted: it had a full bucket anyway */
	fs_tenant_lock(entry);
	fs_tenant_touch(entry, fs_now());
	if (entry->budget_ms_per_minute >= 0)
		fs_tenant_tokens_give_back(entry, tokens);
	fs_tenant_unlock(entry);
	fs_tenant_close(&ref);
}

/* Settle refunds: give back those of subid (all, if invalid) or forget all. */
static void
fs_refunds_settle(bool give_back, SubTransactionId subid)
{
	HASH_SEQ_STATUS seq;
	FsRefund   *refund;

	if (refund_count == 0)
		return;
	hash_seq_init(&seq, refunds);
	while ((refund = hash_seq_search(&seq)) != NULL)
	{
		if (subid != InvalidSubTransactionId && refund->key.subid != subid)
			continue;
		if (give_back)
			fs_budget_refund(&refund->key, refund->tokens);
		hash_search(refunds, &refund->key, HASH_REMOVE, NULL);
		refund_count--;
	}
}

/*
 * A prepared transaction's refunds: parked in shared memory, given back if
 * ROLLBACK PREPARED ends it, or if the PREPARE fails (core/prepared.c,
 * which refuses the PREPARE when they do not fit).
 */
static void
fs_budget_park_refunds(void)
{
	FsParkedEffect effects[FS_PREPARED_PARKED_PER_XACT + 1];
	HASH_SEQ_STATUS seq;
	FsRefund   *refund;
	int			n = 0;

	hash_seq_init(&seq, refunds);
	while ((refund = hash_seq_search(&seq)) != NULL)
	{
		if (refund->tokens == 0)
			continue;
		if (n == FS_PREPARED_PARKED_PER_XACT + 1)
		{
			/* More than may be parked: fs_prepared_park() says so. */
			hash_seq_term(&seq);
			break;
		}
		memset(&effects[n], 0, sizeof(FsParkedEffect));
		effects[n].kind = FS_PARKED_REFUND;
		effects[n].queue_id = refund->key.queue_id;
		strlcpy(effects[n].tenant, refund->key.tenant, FS_NAME_BUFLEN);
		effects[n].value = refund->tokens;
		n++;
	}
	fs_prepared_park(effects, n);

	/*
	 * Parked: from now on whoever takes them out of shared memory gives them
	 * back (ROLLBACK PREPARED, or this backend if the PREPARE fails), once.
	 */
	fs_refunds_settle(false, InvalidSubTransactionId);
}

/* ROLLBACK PREPARED: give back the tokens a prepared transaction took. */
static void
fs_budget_undo_parked(const FsParkedEffect *effect)
{
	FsRefundKey key;

	memset(&key, 0, sizeof(key));
	key.queue_id = effect->queue_id;
	strlcpy(key.tenant, effect->tenant, sizeof(key.tenant));
	fs_budget_refund(&key, effect->value);
}

/*
 * Transaction end: a commit forgets this transaction's refunds (the tokens
 * stay spent), an abort gives them back; a prepared transaction parks them
 * for ROLLBACK PREPARED, and forgets them here once prepared.
 */
static void
fs_budget_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (refund_count > 0)
				fs_budget_park_refunds();
			break;
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			fs_refunds_settle(false, InvalidSubTransactionId);
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			fs_refunds_settle(true, InvalidSubTransactionId);
			break;
		default:
			break;
	}
}

/*
 * Subtransaction end: an aborted subtransaction gives back the tokens it
 * took; a committed one hands its refunds to its parent, so that the
 * parent's abort gives them back.
 */
static void
fs_budget_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						   SubTransactionId parentSubid, void *arg pg_attribute_unused())
{
	HASH_SEQ_STATUS seq;
	FsRefund   *refund;

	if (refund_count == 0)
		return;
	if (event == SUBXACT_EVENT_ABORT_SUB)
		fs_refunds_settle(true, mySubid);
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		/*
		 * What the subtransaction took now belongs to its parent.  Collect
		 * first, then re-key: no insertion while the table is scanned.
		 */
		FsRefund   *moved = palloc(sizeof(FsRefund) * refund_count);
		long		nmoved = 0;
		long		i;

		hash_seq_init(&seq, refunds);
		while ((refund = hash_seq_search(&seq)) != NULL)
		{
			if (refund->key.subid == mySubid)
				moved[nmoved++] = *refund;
		}
		for (i = 0; i < nmoved; i++)
		{
			FsRefund   *parent;
			bool		found;

			hash_search(refunds, &moved[i].key, HASH_REMOVE, NULL);
			moved[i].key.subid = parentSubid;
			parent = hash_search(refunds, &moved[i].key, HASH_ENTER, &found);
			if (found)
			{
				parent->tokens += moved[i].tokens;
				refund_count--;
			}
			else
				parent->tokens = moved[i].tokens;
		}
		pfree(moved);
	}
}

/* Register the transaction callbacks that give tokens back at abort. */
void
fs_budget_init(void)
{
	RegisterXactCallback(fs_budget_xact_callback, NULL);
	RegisterSubXactCallback(fs_budget_subxact_callback, NULL);
	fs_prepared_on_settle(FS_PARKED_REFUND, NULL, fs_budget_undo_parked);
}

/* ----------------------------------------------------------------
 * SQL functions
 * ----------------------------------------------------------------
 */

/*
 * An integer argument that must not be NULL and must be at least `min`; a
 * clear error with `hint` otherwise.
 */
static int32
fs_int_arg(FunctionCallInfo fcinfo, int argno, const char *what, int32 min, const char *hint)
{
	int32		value;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what),
				 errhint("%s", hint)));
	value = PG_GETARG_INT32(argno);
	if (value < min)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be at least %d, got %d", what, min, value),
				 errhint("%s", hint)));
	return value;
}

/*
 * fs_spend_tokens(tenant text, requested_runs int, cost_ms int, queue text)
 * RETURNS int: the runs admitted, 0..requested_runs.
 */
Datum
fs_spend_tokens(PG_FUNCTION_ARGS)
{
	Datum		relayed;
	char		tenant[FS_NAME_BUFLEN];
	char		queue_name[FS_NAME_BUFLEN];
	int32		requested;
	int32		cost_ms;
	FsQueue    *queue;
	FsTenantRef ref;
	FsTenant   *entry;
	FsGateCapacity cap = {0};
	FsBackpressure bp = FS_BP_NONE;
	FsDecision	d;
	FsRefund   *refund = NULL;
	TimestampTz now;
	int32		ceiling;
	FsReason	deny_reason;
	bool		lost;

	fs_check_primary("spend fairshare tokens");
	fs_name_arg(fcinfo, 0, "tenant", tenant);
	if (fs_cluster_tenant_relayed(fcinfo, "fs_spend_tokens", tenant, &relayed))
		return relayed;
	requested = fs_int_arg(fcinfo, 1, "requested_runs", 0,
						   "Pass how many runs the tenant wants to start now (0 only asks).");
	cost_ms = fs_int_arg(fcinfo, 2, "cost_ms", 1,
						 "Pass the estimated milliseconds of worker time one run takes.");
	fs_name_arg(fcinfo, 3, "queue", queue_name);

	now = fs_now();
	fs_decision_init(&d, FS_DECISION_SPEND, tenant, now);
	d.requested = requested;

	queue = fs_queue_lookup(queue_name, true);
	entry = NULL;
	if (queue != NULL)
	{
		fs_gate_capacity(queue, now, &cap);
		bp = fs_gate_backpressure(queue, &cap, now);
		entry = fs_tenant_open(queue, tenant, FS_OPEN_CREATE, &ref);
	}
	if (entry == NULL)
	{
		/* No state can be kept for this tenant: admit everything. */
		fs_decision_fail_open(&d, queue, requested);
		PG_RETURN_INT32(requested);
	}
	d.queue_id = queue->queue_id;
	ceiling = fs_gate_ceiling(&cap, &ref.limits, &deny_reason);
	lost = ref.limits.budget_ms_per_minute >= 0 && fs_budget_state_lost(now);
	if (ref.limits.budget_ms_per_minute >= 0)
		refund = fs_budget_refund_entry(queue, tenant);

	fs_tenant_lock(entry);
	fs_tenant_touch(entry, now);
	if (entry->budget_ms_per_minute >= 0)
	{
		d.tokens_before = entry->token_balance;
		d.runs_possible = entry->token_balance <= 0 ? 0 :
			(int32) Min(floor(entry->token_balance / cost_ms), (float8) PG_INT32_MAX);
	}
	if (bp != FS_BP_NONE)
	{
		d.reason = FS_REASON_BACKPRESSURE;
		/* It could have run: budget and headroom, but no free worker. */
		if (bp == FS_BP_NO_FREE_THREAD && requested > 0 &&
			d.runs_possible != 0 && entry->slots_in_use < ceiling)
			fs_tenant_count_failed_delivery(entry);
	}
	else if (entry->budget_ms_per_minute < 0)
	{
		d.reason = FS_REASON_GRANTED;
		d.granted = requested;
	}
	else if (lost)
	{
		d.reason = FS_REASON_FAIL_OPEN;
		d.granted = requested;
	}
	else
	{
		d.granted = Min(requested, d.runs_possible);
		d.tokens_consumed = (float8) d.granted * cost_ms;
		fs_tenant_tokens_take(entry, d.tokens_consumed);
		d.reason = (d.granted > 0 || requested == 0) ? FS_REASON_GRANTED : FS_REASON_NO_BUDGET;
	}
	if (d.reason != FS_REASON_FAIL_OPEN)
		fs_tenant_count_decision(entry, d.reason);
	if (entry->budget_ms_per_minute >= 0)
		d.balance_after = entry->token_balance;
	fs_tenant_unlock(entry);
	fs_tenant_close(&ref);

	if (d.reason == FS_REASON_FAIL_OPEN)
		FS_COUNT_GLOBAL(fail_open);
	if (d.tokens_consumed > 0)
		fs_budget_refund_add(refund, queue, tenant, d.tokens_consumed);
	fs_decision_log(&d);
	FS_DEBUG_CHECK_TENANT(queue, tenant);
	PG_RETURN_INT32(d.granted);
}

/*
 * fs_charge_tokens(tenant text, used_ms float8, queue text) RETURNS float8:
 * pays used_ms from the tenant's bucket (the balance may go below zero) and
 * returns the balance after, or NULL for a tenant without a budget.
 */
Datum
fs_charge_tokens(PG_FUNCTION_ARGS)
{
	Datum		relayed;
	char		tenant[FS_NAME_BUFLEN];
	char		queue_name[FS_NAME_BUFLEN];
	float8		used_ms;
	FsQueue    *queue;
	FsTenantRef ref;
	FsTenant   *entry = NULL;
	FsDecision	d;
	FsRefund   *refund = NULL;
	TimestampTz now;

	fs_check_primary("charge fairshare tokens");
	fs_name_arg(fcinfo, 0, "tenant", tenant);
	if (fs_cluster_tenant_relayed(fcinfo, "fs_charge_tokens", tenant, &relayed))
		return relayed;
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("used_ms must not be null"),
				 errhint("Pass the milliseconds of worker time used since the last charge.")));
	used_ms = PG_GETARG_FLOAT8(1);
	if (isnan(used_ms) || isinf(used_ms) || used_ms < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("used_ms must be a finite number of milliseconds, zero or more, got %s", fs_float_text(used_ms)),
				 errhint("Pass the milliseconds of worker time used since the last charge.")));
	if (used_ms > FS_BUDGET_MAX_CHARGE_MS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("used_ms must be at most a day (86400000 ms), got %s", fs_float_text(used_ms)),
				 errhint("Charge in milliseconds, as the work runs (for example once a second).")));
	fs_name_arg(fcinfo, 2, "queue", queue_name);

	now = fs_now();
	fs_decision_init(&d, FS_DECISION_CHARGE, tenant, now);

	queue = fs_queue_lookup(queue_name, true);
	if (queue != NULL)
		entry = fs_tenant_open(queue, tenant, FS_OPEN_CREATE, &ref);
	if (entry == NULL)
	{
		fs_decision_fail_open(&d, queue, 0);
		PG_RETURN_NULL();
	}
	d.queue_id = queue->queue_id;
	d.reason = FS_REASON_GRANTED;
	if (ref.limits.budget_ms_per_minute >= 0)
		refund = fs_budget_refund_entry(queue, tenant);

	fs_tenant_lock(entry);
	fs_tenant_touch(entry, now);
	if (entry->budget_ms_per_minute >= 0)
	{
		d.tokens_before = entry->token_balance;
		d.tokens_consumed = fs_tenant_tokens_charge(entry, used_ms);
		d.balance_after = entry->token_balance;
	}
	fs_tenant_unlock(entry);
	fs_tenant_close(&ref);

	fs_decision_log(&d);
	FS_DEBUG_CHECK_TENANT(queue, tenant);
	if (isnan(d.balance_after))
		PG_RETURN_NULL();
	/* Refund only what was taken: the debt bound may have kept some. */
	fs_budget_refund_add(refund, queue, tenant, d.tokens_consumed);
	PG_RETURN_FLOAT8(d.balance_after);
}

/* ----------------------------------------------------------------
 * Fair dequeue
 *
 * A claimed row is admitted like a run of fs_spend_tokens(): it takes its
 * estimated cost from the tenant's bucket, or is refused (no_budget).  No
 * backpressure applies: claiming starts work that was already admitted.
 * ----------------------------------------------------------------
 */

/*
 * What the bucket of an entry holds at `now` (without touching it), or
 * infinity when it has no budget or its balance is unknown (after a crash).
 * Entry spinlock held.
 */
float8
fs_budget_balance_now(const FsTenant *entry, TimestampTz now)
{
	FsTenant	copy;

	if (entry->budget_ms_per_minute < 0 || fs_budget_state_lost(now))
		return INFINITY;
	copy = *entry;
	fs_budget_accrue(&copy, Max(now, copy.touched_at));
	return copy.token_balance;
}

/*
 * Take cost_ms from `tenant`'s bucket for one claimed row.  Returns false
 * (nothing taken) when it cannot pay; *taken says what was taken, to give
 * back with fs_budget_unclaim() if the row is not claimed after all.  The
 * entry is found by name: fair dequeue's pointers may have lost their pin.
 */
bool
fs_budget_claim(FsQueue *queue, const char *tenant, float8 cost_ms, TimestampTz now,
				float8 *taken)
{
	FsTenantRef ref;
	FsTenant   *entry;
	FsDecision	d;
	FsRefund   *refund = NULL;
	bool		lost;

	*taken = 0;
	fs_decision_init(&d, FS_DECISION_CLAIM, tenant, now);
	d.queue_id = queue->queue_id;
	d.requested = 1;
	entry = fs_tenant_open(queue, tenant, FS_OPEN_CREATE, &ref);
	if (entry == NULL)
	{
		fs_decision_fail_open(&d, queue, 1);
		return true;
	}
	if (ref.limits.budget_ms_per_minute < 0)
	{
		/* No budget: nothing to take, nothing to log (the slot decision is). */
		fs_tenant_close(&ref);
		return true;
	}
	lost = fs_budget_state_lost(now);
	refund = fs_budget_refund_entry(queue, tenant);

	fs_tenant_lock(entry);
	fs_tenant_touch(entry, now);
	d.tokens_before = entry->token_balance;
	d.runs_possible = entry->token_balance < cost_ms ? 0 : 1;
	if (lost)
		d.reason = FS_REASON_FAIL_OPEN;
	else if (entry->token_balance >= cost_ms)
	{
		fs_tenant_tokens_take(entry, cost_ms);
		*taken = cost_ms;
		d.reason = FS_REASON_GRANTED;
	}
	else
	{
		d.reason = FS_REASON_NO_BUDGET;
		fs_tenant_count_decision(entry, FS_REASON_NO_BUDGET);
	}
	d.tokens_consumed = *taken;
	d.balance_after = entry->token_balance;
	fs_tenant_unlock(entry);
	fs_tenant_close(&ref);

	if (d.reason == FS_REASON_FAIL_OPEN)
		FS_COUNT_GLOBAL(fail_open);
	d.granted = d.reason == FS_REASON_NO_BUDGET ? 0 : 1;
	fs_decision_log(&d);
	if (*taken > 0)
		fs_budget_refund_add(refund, queue, tenant, *taken);
	return d.granted > 0;
}

/* Give back what fs_budget_claim() took, for a row not claimed after all. */
void
fs_budget_unclaim(FsQueue *queue, const char *tenant, float8 taken)
{
	FsTenantRef ref;
	FsTenant   *entry;

	if (taken <= 0)
		return;
	entry = fs_tenant_open(queue, tenant, FS_OPEN_NO_LIMITS, &ref);
	if (entry != NULL)
	{
		fs_tenant_lock(entry);
		if (entry->budget_ms_per_minute >= 0)
			fs_tenant_tokens_give_back(entry, taken);
		fs_tenant_unlock(entry);
		fs_tenant_close(&ref);
	}
	/* ... and no refund of it at abort. */
	fs_budget_refund_at_abort(queue, tenant, -taken);
}

/*
 * Charge work measured after the fact (a claimed row that ran longer than
 * its estimate), from a commit callback: no SPI, no error, no refund.
 */
void
fs_budget_charge_committed(FsQueue *queue, const char *tenant, float8 used_ms, TimestampTz now)
{
	FsTenantRef ref;
	FsTenant   *entry;

	if (!(used_ms > 0))
		return;
	used_ms = Min(used_ms, FS_BUDGET_MAX_CHARGE_MS);
	entry = fs_tenant_open(queue, tenant, FS_OPEN_NO_LIMITS, &ref);
	if (entry == NULL)
		return;
	fs_tenant_lock(entry);
	fs_tenant_touch(entry, now);
	if (entry->budget_ms_per_minute >= 0)
		(void) fs_tenant_tokens_charge(entry, used_ms);
	fs_tenant_unlock(entry);
	fs_tenant_close(&ref);
}

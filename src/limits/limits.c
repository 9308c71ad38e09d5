/*-------------------------------------------------------------------------
 *
 * limits.c
 *	  The durable fs_limits table: validation, commit-time publication, and
 *	  resolution of a tenant's effective limits.
 *
 * fs_limits has one row per (queue, tenant) that someone configured; '*'
 * stands for any queue or any tenant.  Each field of a tenant's effective
 * limits comes from the most specific row where it is not NULL:
 *
 *		(queue, tenant)  >  ('*', tenant)  >  (queue, '*')  >  ('*', '*')
 *
 * then, for max_slots, from the queue's registration for fair dequeue
 * (fs_fair_queues.max_slots: a queue registered without one lets a tenant
 * hold any number of slots, FS_NO_SLOT_LIMIT), and then from the built-in
 * defaults (limits.h).  Rows are edited with
 * fs_set_limit() or plain SQL; a BEFORE ROW trigger validates them, and an
 * AFTER STATEMENT trigger notes that this transaction changed them.  When
 * such a transaction commits, the shared limits generation is bumped and
 * every tenant entry reloads its limits before its next decision.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

#include "core/cluster.h"
#include "core/prepared.h"
#include "core/subxact.h"
#include "limits/limits.h"

PG_FUNCTION_INFO_V1(fs_limits_validate);
PG_FUNCTION_INFO_V1(fs_limits_changed);
PG_FUNCTION_INFO_V1(fs_effective_limits);

/* This transaction changed fs_limits: publish at commit. */
static bool limits_changed_in_xact = false;

/*
 * The prepared lookup, the extension it was prepared for, and whether that
 * extension's fs_fair_queues had its max_slots column (not before 0.5.0).
 */
static SPIPlanPtr resolve_plan = NULL;
static Oid	resolve_plan_extension = InvalidOid;
static bool resolve_plan_queue_defaults = false;

/*
 * Publish a committed change of fs_limits: the limits generation goes up,
 * and every cached limit loads again before its next decision.
 */
static void
fs_limits_publish(void)
{
	if (fs_shared == NULL)
		return;
	/* Generation 0 means "never loaded": skip it on wraparound. */
	if (pg_atomic_add_fetch_u32(&fs_shared->limits_generation, 1) == 0)
		pg_atomic_add_fetch_u32(&fs_shared->limits_generation, 1);
}

/*
 * Transaction end: a commit that changed fs_limits publishes the change; an
 * abort publishes nothing; a prepared one publishes it when COMMIT PREPARED
 * commits it.
 */
static void
fs_limits_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			/* COMMIT PREPARED publishes it (core/prepared.c). */
			if (limits_changed_in_xact)
				fs_prepared_note(FS_PREPARED_LIMITS);
			break;
		case XACT_EVENT_COMMIT:
			if (limits_changed_in_xact)
				fs_limits_publish();
			limits_changed_in_xact = false;
			break;
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PARALLEL_COMMIT:
			limits_changed_in_xact = false;
			break;
		default:
			break;
	}
}

/* The limits' settings. */
void
fs_limits_init(void)
{
	RegisterXactCallback(fs_limits_xact_callback, NULL);
	fs_prepared_on_commit(FS_PREPARED_LIMITS, fs_limits_publish);
}

/* Schema the extension lives in, in the current database. */
const char *
fs_extension_schema(void)
{
	Oid			extoid = get_extension_oid("fairshare", true);
	char	   *schema;

	if (!OidIsValid(extoid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension \"fairshare\" is not installed in database \"%s\"",
						get_database_name(MyDatabaseId)),
				 errhint("Run CREATE EXTENSION fairshare in this database.")));
	schema = get_namespace_name(fs_get_extension_schema(extoid));
	if (schema == NULL)
		elog(ERROR, "cache lookup failed for the schema of extension \"fairshare\"");
	return schema;
}

/*
 * Whether the extension's fs_fair_queues has the column max_slots: between
 * installing this library and ALTER EXTENSION fairshare UPDATE, the tables
 * are still an older version's.
 */
static bool
fs_limits_queue_defaults_exist(Oid extoid)
{
	Oid			relid = get_relname_relid("fs_fair_queues", fs_get_extension_schema(extoid));

	return OidIsValid(relid) && get_attnum(relid, "max_slots") != InvalidAttrNumber;
}

/*
 * The prepared query that reads a tenant's limits from fs_limits, made again
 * when the extension was dropped and created since, or updated to a version
 * with queue defaults.
 */
static SPIPlanPtr
fs_limits_plan(void)
{
	Oid			extoid = get_extension_oid("fairshare", true);
	Oid			argtypes[2] = {TEXTOID, TEXTOID};
	bool		queue_defaults = OidIsValid(extoid) && fs_limits_queue_defaults_exist(extoid);
	const char *schema;
	char	   *query;
	SPIPlanPtr	plan;

	if (resolve_plan != NULL && extoid == resolve_plan_extension &&
		queue_defaults == resolve_plan_queue_defaults)
		return resolve_plan;
	if (resolve_plan != NULL)
	{
		SPI_freeplan(resolve_plan);
		resolve_plan = NULL;
	}
	schema = quote_identifier(fs_extension_schema());

	query = psprintf("SELECT max_slots, min_slots, weight, budget_ms_per_minute, throttle_pct FROM ("
					 " SELECT l.max_slots, l.min_slots, l.weight, l.budget_ms_per_minute, l.throttle_pct,"
					 "        (l.tenant OPERATOR(pg_catalog.=) '*'::pg_catalog.text)::pg_catalog.int4"
					 "          OPERATOR(pg_catalog.*) 2 OPERATOR(pg_catalog.+)"
					 "        (l.queue OPERATOR(pg_catalog.=) '*'::pg_catalog.text)::pg_catalog.int4 AS rank"
					 "   FROM %s.fs_limits l"
					 "  WHERE l.queue OPERATOR(pg_catalog.=) ANY (ARRAY[$1, '*']::pg_catalog.text[])"
					 "    AND l.tenant OPERATOR(pg_catalog.=) ANY (ARRAY[$2, '*']::pg_catalog.text[])"
					 " %s) candidates"
					 " ORDER BY rank",
					 schema,
					 queue_defaults ?
					 psprintf(" UNION ALL"
							  " SELECT COALESCE(q.max_slots, %d), NULL::pg_catalog.int4,"
							  "        NULL::pg_catalog.float8, NULL::pg_catalog.float8,"
							  "        NULL::pg_catalog.float8, 4"
							  "   FROM %s.fs_fair_queues q"
							  "  WHERE q.queue OPERATOR(pg_catalog.=) $1",
							  FS_NO_SLOT_LIMIT, schema) : "");
	plan = SPI_prepare(query, 2, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for the fs_limits lookup: %s",
			 SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	resolve_plan = plan;
	resolve_plan_extension = extoid;
	resolve_plan_queue_defaults = queue_defaults;
	pfree(query);
	return plan;
}

/* Read the rows of fs_limits for (queue, tenant) into *out (see below). */
static void
fs_limits_lookup(const char *queue, const char *tenant, FsLimits *out)
{
	Datum		args[2];
	bool		have[5] = {false, false, false, false, false};
	SPIPlanPtr	plan;
	Snapshot	snapshot;
	int			ret;
	uint64		row;

	args[0] = CStringGetTextDatum(queue);
	args[1] = CStringGetTextDatum(tenant);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = fs_limits_plan();

	/*
	 * The latest snapshot (a private copy), blind to this transaction's own
	 * changes: rows it inserted (cmin >= 0) are invisible and rows it deleted
	 * still visible once curcid is the first command id.
	 */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	if (limits_changed_in_xact)
		snapshot->curcid = FirstCommandId;
	ret = SPI_execute_snapshot(plan, args, NULL, snapshot, InvalidSnapshot, true, false, 0);
	UnregisterSnapshot(snapshot);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "fs_limits lookup failed: %s", SPI_result_code_string(ret));

	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		value;

		value = SPI_getbinval(tuple, desc, 1, &isnull);
		if (!isnull && !have[0])
		{
			out->max_slots = DatumGetInt32(value);
			have[0] = true;
		}
		value = SPI_getbinval(tuple, desc, 2, &isnull);
		if (!isnull && !have[1])
		{
			out->min_slots = DatumGetInt32(value);
			have[1] = true;
		}
		value = SPI_getbinval(tuple, desc, 3, &isnull);
		if (!isnull && !have[2])
		{
			out->weight = DatumGetFloat8(value);
			have[2] = true;
		}
		value = SPI_getbinval(tuple, desc, 4, &isnull);
		if (!isnull && !have[3])
		{
			float8		budget = DatumGetFloat8(value);

			/* 'infinity' says "no budget" explicitly, over a default. */
			out->budget_ms_per_minute = isinf(budget) ? -1 : budget;
			have[3] = true;
		}
		value = SPI_getbinval(tuple, desc, 5, &isnull);
		if (!isnull && !have[4])
		{
			out->throttle = DatumGetFloat8(value) / 100.0;
			have[4] = true;
		}
	}
	SPI_finish();
}

typedef struct FsLimitsLookup
{
	const char *queue;
	const char *tenant;
	FsLimits   *out;
} FsLimitsLookup;

/* fs_subxact_run() work: read the limits. */
static void
fs_limits_lookup_one(void *arg)
{
	FsLimitsLookup *l = (FsLimitsLookup *) arg;

	fs_limits_lookup(l->queue, l->tenant, l->out);
}

/*
 * Load the effective limits of (queue, tenant) from fs_limits into *out, as
 * committed: a transaction that changed fs_limits does not see its own change
 * here either (it applies when it commits, for everyone at once).
 *
 * The generation is read before the snapshot is taken, so whatever commit
 * bumped it to that value is visible to the read, and the result may be
 * cached in shared memory with that generation.
 *
 * Returns false when fs_limits cannot be read (its privileges were revoked,
 * row-level security hides it): the caller's decision then fails open
 * rather than fail the caller's transaction.  The read runs in a
 * subtransaction so that its error can be set aside; a cancel, a timeout
 * (statement or lock), running out of memory and a serialization failure
 * or deadlock are the statement's, not the limits', and are re-raised
 * (fs_subxact_run()).
 */
bool
fs_limits_resolve(FsQueue *queue, const char *tenant, FsLimits *out, uint32 *generation)
{
	FsLimitsLookup lookup;
	ErrorData  *edata;
	bool		ok;

	*generation = pg_atomic_read_u32(&fs_shared->limits_generation);
	pg_memory_barrier();

	out->max_slots = FS_DEFAULT_MAX_SLOTS;
	out->min_slots = FS_DEFAULT_MIN_SLOTS;
	out->weight = FS_DEFAULT_WEIGHT;
	out->budget_ms_per_minute = -1;
	out->throttle = FS_DEFAULT_THROTTLE_PCT / 100.0;

	lookup.queue = queue->key.name;
	lookup.tenant = tenant;
	lookup.out = out;
	ok = fs_subxact_run(fs_limits_lookup_one, &lookup, NULL, &edata);
	if (!ok)
	{
		ereport(WARNING,
				(errcode(edata->sqlerrcode),
				 errmsg("fairshare could not read fs_limits, so this decision fails open: %s",
						edata->message),
				 errhint("Make fs_limits and fs_fair_queues readable by the roles that call fairshare (both are granted to PUBLIC at install).")));
		FreeErrorData(edata);
	}

	/* Rows are validated one by one; inherited fields can still cross. */
	if (out->min_slots > out->max_slots)
		out->min_slots = out->max_slots;
	return ok;
}

/* ----------------------------------------------------------------
 * Triggers on fs_limits
 * ----------------------------------------------------------------
 */

/*
 * A tenant or queue name of a row written to fs_limits: not NULL, not empty,
 * at most FS_NAME_MAXLEN bytes.
 */
static void
fs_limits_check_name(HeapTuple tuple, TupleDesc desc, const char *column)
{
	bool		isnull;
	Datum		value = SPI_getbinval(tuple, desc, SPI_fnumber(desc, column), &isnull);
	text	   *name;
	int			len;

	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("%s in fs_limits must not be null", column),
				 errhint("Use '*' for the default of every %s.", column)));
	name = DatumGetTextPP(value);
	len = VARSIZE_ANY_EXHDR(name);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s in fs_limits must not be empty", column),
				 errhint("Use '*' for the default of every %s.", column)));
	if (len > FS_NAME_MAXLEN)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("%s name in fs_limits is %d bytes long, longer than the limit of %d bytes",
						column, len, FS_NAME_MAXLEN),
				 errhint("Use a shorter %s name, for example a key or id instead of a display name.",
						 column)));
}

/* An int column of an fs_limits row into *value, unless NULL (the default stays). */
static bool
fs_limits_get_int(HeapTuple tuple, TupleDesc desc, const char *column, int32 *value)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tuple, desc, SPI_fnumber(desc, column), &isnull);

	if (!isnull)
		*value = DatumGetInt32(d);
	return !isnull;
}

/* A float8 column of an fs_limits row into *value, unless NULL (the default stays). */
static bool
fs_limits_get_float(HeapTuple tuple, TupleDesc desc, const char *column, float8 *value)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tuple, desc, SPI_fnumber(desc, column), &isnull);

	if (!isnull)
		*value = DatumGetFloat8(d);
	return !isnull;
}

/*
 * BEFORE INSERT OR UPDATE FOR EACH ROW: validate a row of fs_limits.  Shared
 * by fs_set_limit() and plain SQL, so both give the same errors.
 */
Datum
fs_limits_validate(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	HeapTuple	tuple;
	TupleDesc	desc;
	int32		max_slots = 0;
	int32		min_slots = 0;
	float8		value;
	bool		have_max;
	bool		have_min;

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("fs_limits_validate() must be fired BEFORE ... FOR EACH ROW")));

	tuple = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ?
		trigdata->tg_newtuple : trigdata->tg_trigtuple;
	desc = trigdata->tg_relation->rd_att;

	fs_limits_check_name(tuple, desc, "queue");
	fs_limits_check_name(tuple, desc, "tenant");

	have_max = fs_limits_get_int(tuple, desc, "max_slots", &max_slots);
	if (have_max && max_slots < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_slots must not be negative, got %d", max_slots),
				 errhint("Use 0 to stop a tenant from taking slots, or NULL to inherit the default.")));
	have_min = fs_limits_get_int(tuple, desc, "min_slots", &min_slots);
	if (have_min && min_slots < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("min_slots must not be negative, got %d", min_slots),
				 errhint("Use 0 for no guaranteed slots, or NULL to inherit the default.")));
	if (have_max && have_min && min_slots > max_slots)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("min_slots (%d) must not be greater than max_slots (%d)",
						min_slots, max_slots),
				 errhint("Raise max_slots or lower min_slots.")));

	if (fs_limits_get_float(tuple, desc, "weight", &value) &&
		!(value > 0 && !isinf(value)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("weight must be a positive finite number, got %s", fs_float_text(value)),
				 errhint("Weights are relative shares: 1 is the default, 2 gets twice as much.")));
	if (fs_limits_get_float(tuple, desc, "budget_ms_per_minute", &value) &&
		(isnan(value) || value < 0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("budget_ms_per_minute must be zero or positive, got %s", fs_float_text(value)),
				 errhint("Use 'infinity' for no budget, or NULL to inherit the default.")));
	if (fs_limits_get_float(tuple, desc, "throttle_pct", &value) &&
		(isnan(value) || value < 0 || value > 100))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("throttle_pct must be between 0 and 100, got %s", fs_float_text(value)),
				 errhint("100 means no throttling; 25 gives the tenant a quarter of its share.")));

	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
	{
		int			attnum = SPI_fnumber(desc, "updated_at");
		Datum		now = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
		bool		isnull = false;

		if (attnum > 0)
			tuple = heap_modify_tuple_by_cols(tuple, desc, 1, &attnum, &now, &isnull);
	}
	return PointerGetDatum(tuple);
}

/*
 * AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE FOR EACH STATEMENT: this
 * transaction changed fs_limits; tell everyone when it commits.
 */
Datum
fs_limits_changed(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("fs_limits_changed() must be fired as a trigger")));
	limits_changed_in_xact = true;
	fs_cluster_forget();		/* fs_cluster fires it too */
	return PointerGetDatum(NULL);
}

/*
 * fs_effective_limits(tenant, queue): the limits a decision for this tenant
 * would use right now (committed rows of fs_limits, after defaults);
 * max_slots NULL: no limit.
 */
Datum
fs_effective_limits(PG_FUNCTION_ARGS)
{
	char		tenant[FS_NAME_BUFLEN];
	char		queue_name[FS_NAME_BUFLEN];
	FsQueue		queue;
	FsLimits	limits;
	uint32		generation;
	TupleDesc	desc;
	Datum		values[5];
	bool		nulls[5] = {false, false, false, false, false};

	fs_check_loaded();
	fs_name_arg(fcinfo, 0, "tenant", tenant);
	fs_name_arg(fcinfo, 1, "queue", queue_name);

	/* A throwaway queue key: resolution needs only its name. */
	memset(&queue, 0, sizeof(queue));
	strlcpy(queue.key.name, queue_name, sizeof(queue.key.name));
	if (!fs_limits_resolve(&queue, tenant, &limits, &generation))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("could not read fs_limits"),
				 errhint("See the warning above.")));

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	desc = BlessTupleDesc(desc);
	values[0] = Int32GetDatum(limits.max_slots);
	nulls[0] = limits.max_slots == FS_NO_SLOT_LIMIT;	/* no limit */
	values[1] = Int32GetDatum(limits.min_slots);
	values[2] = Float8GetDatum(limits.weight);
	if (limits.budget_ms_per_minute < 0)
		nulls[3] = true;
	else
		values[3] = Float8GetDatum(limits.budget_ms_per_minute);
	values[4] = Float8GetDatum(limits.throttle * 100.0);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

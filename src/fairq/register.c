/*-------------------------------------------------------------------------
 *
 * register.c
 *	  fs_register_queue() and fs_unregister_queue(): making an existing
 *	  ready table known to fair dequeue, and the per-backend caches of what
 *	  a registration compiles to.
 *
 * A registration is a row of fs_fair_queues holding SQL: the tenant of a
 * row, the order within a tenant, the row filter, the row key, and the
 * running table that marks a claimed row as running.  Every piece is
 * checked by PostgreSQL's own parser and parse analysis against the table,
 * as a single expression (a comment, a second statement, a FROM clause or a
 * subquery is refused), and stored in canonical form: deparsed with every
 * function, operator and type outside pg_catalog schema-qualified.  Every
 * query fairshare builds from it names its tables schema-qualified and runs
 * with search_path set to pg_catalog, pg_temp, so neither the caller's
 * search_path nor objects created later can change what it means.
 *
 * Registration is an administrator's action: EXECUTE is revoked from
 * PUBLIC, and the caller must also own the ready and running tables, since
 * fairshare adds triggers (and, unless a usable one exists, an index) to
 * them.  The row in fs_fair_queues is written with the extension owner's
 * rights once those checks pass; the DDL on the tables runs as the caller.
 *
 * The filter is split into its conjuncts: those that depend on the row
 * alone (immutable) define the backlog the triggers count and the partial
 * index; the rest (such as scheduled_at <= now()) are checked at claim
 * time only.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/nbtree.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_index.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "commands/event_trigger.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/clauses.h"
#include "optimizer/optimizer.h"
#include "parser/parse_coerce.h"
#include "parser/parse_collate.h"
#include "parser/parse_expr.h"
#include "parser/parse_relation.h"
#include "parser/parser.h"
#include "catalog/indexing.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/ruleutils.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "core/cluster.h"
#include "core/subxact.h"
#include "fairq/fairqueue_int.h"
#include "fairq/register_int.h"
#include "slots/slots.h"
#include "limits/limits.h"

PG_FUNCTION_INFO_V1(fs_register_queue);
PG_FUNCTION_INFO_V1(fs_unregister_queue);
PG_FUNCTION_INFO_V1(fs_fair_queues_changed);
PG_FUNCTION_INFO_V1(fs_fair_tables_dropped);


/* ----------------------------------------------------------------
 * Running SQL
 * ----------------------------------------------------------------
 */

/* Run `sql` (SPI connected) with the fixed search_path; returns SPI's code. */
int
fs_spi(const char *sql, int nargs, Oid *argtypes, Datum *values, const char *nulls,
	   bool read_only)
{
	int			nest = fs_search_path_begin();
	int			ret;

	if (nargs > 0)
		ret = SPI_execute_with_args(sql, nargs, argtypes, values, nulls, read_only, 0);
	else
		ret = SPI_execute(sql, read_only, 0);
	fs_search_path_end(nest);
	if (ret < 0)
		elog(ERROR, "fair dequeue statement failed (%s): %s", SPI_result_code_string(ret), sql);
	return ret;
}

/* The role that owns the extension (and so fs_fair_queues). */
static Oid
fs_extension_owner(void)
{
	Oid			owner = InvalidOid;
	HeapTuple	tuple;
	Oid			extoid = get_extension_oid("fairshare", false);
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(extoid));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
		owner = ((Form_pg_extension) GETSTRUCT(tuple))->extowner;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (!OidIsValid(owner))
		elog(ERROR, "could not find the owner of extension \"fairshare\"");
	return owner;
}

/* Run `sql` as the owner of the extension (for writes to fs_fair_queues). */
static void
fs_spi_as_extension_owner(const char *sql, int nargs, Oid *argtypes, Datum *values,
						  const char *nulls)
{
	FsRunAs		run_as;

	fs_run_as_begin(&run_as, fs_extension_owner(), 0);
	(void) fs_spi(sql, nargs, argtypes, values, nulls, false);
	fs_run_as_end(&run_as);
}

static void fs_unregister_row(HeapTuple old, TupleDesc old_desc, const char *queue);
static void fs_registration_unpublish(const char *queue);

/* The extension's schema, quoted, for fairshare's own queries. */
const char *
fs_ext_schema(void)
{
	return quote_identifier(fs_extension_schema());
}

/* Names of the registered queues of this database. */
List *
fs_fair_registered_queues(void)
{
	MemoryContext caller = CurrentMemoryContext;
	List	   *names = NIL;
	uint64		r;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	fs_spi(psprintf("SELECT queue FROM %s.fs_fair_queues ORDER BY queue", fs_ext_schema()),
		   0, NULL, NULL, NULL, false);
	for (r = 0; r < SPI_processed; r++)
	{
		char	   *name = SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1);
		MemoryContext old = MemoryContextSwitchTo(caller);

		/* The list outlives this SPI connection: the caller's memory. */
		names = lappend(names, pstrdup(name));
		MemoryContextSwitchTo(old);
	}
	SPI_finish();
	return names;
}

/* ----------------------------------------------------------------
 * fs_register_queue(), fs_unregister_queue()
 * ----------------------------------------------------------------
 */

/*
 * A text argument as a C string: NULL is an error when `required`, and NULL
 * otherwise.
 */
static char *
fs_text_arg(FunctionCallInfo fcinfo, int argno, const char *what, bool required)
{
	char	   *value;

	if (PG_ARGISNULL(argno))
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", what),
					 errhint("See fs_register_queue() in the manual for what to pass.")));
		return NULL;
	}
	value = TextDatumGetCString(PG_GETARG_DATUM(argno));
	if (value[strspn(value, " \t\r\n")] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what),
				 errhint(required ? "See fs_register_queue() in the manual for what to pass." :
						 "Pass NULL to leave it out.")));
	return value;
}

/* A boolean argument that must not be NULL. */
static bool
fs_bool_arg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what),
				 errhint("Pass true or false, or leave the argument out for the default.")));
	return PG_GETARG_BOOL(argno);
}

/* The stored row of a queue (SPI connected); NULL if not registered. */
HeapTuple
fs_registration_row(const char *queue_name, TupleDesc *desc)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];

	values[0] = CStringGetTextDatum(queue_name);
	fs_spi(psprintf("SELECT * FROM %s.fs_fair_queues WHERE queue = $1", fs_ext_schema()),
		   1, argtypes, values, NULL, false);
	if (SPI_processed == 0)
		return NULL;
	*desc = SPI_tuptable->tupdesc;
	return SPI_tuptable->vals[0];
}

/* An OID column of a registration row (InvalidOid for NULL). */
Oid
fs_row_oid(HeapTuple tuple, TupleDesc desc, const char *column)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tuple, desc, SPI_fnumber(desc, column), &isnull);

	return isnull ? InvalidOid : DatumGetObjectId(d);
}

/*
 * Drop the index a queue's registration created, unless another
 * registration uses it too.
 */
static void
fs_drop_created_index(Oid indexoid, const char *queue_name)
{
	Oid			argtypes[2] = {REGCLASSOID, TEXTOID};
	Datum		values[2];

	if (!OidIsValid(indexoid) || get_rel_name(indexoid) == NULL)
		return;
	/* A distributed table's index is the coordinator's, as its triggers are. */
	if (fs_cluster_ddl_is_coordinators(IndexGetRelation(indexoid, false)))
		return;
	values[0] = ObjectIdGetDatum(indexoid);
	values[1] = CStringGetTextDatum(queue_name);
	fs_spi(psprintf("SELECT 1 FROM %s.fs_fair_queues WHERE ready_index = $1 AND queue <> $2",
					fs_ext_schema()),
		   2, argtypes, values, NULL, false);
	if (SPI_processed > 0)
		return;
	fs_spi(psprintf("DROP INDEX %s", fs_qualified_name(indexoid)), 0, NULL, NULL, NULL, false);
}

/*
 * Build the index a registration adds.  Building it evaluates the tenant,
 * order and filter on every row: an error there (a row it fails on) is
 * reported as the queue's, without the statement's text.
 */
static void
fs_create_index(const char *queue, Oid ready_relid, const char *index_sql)
{
	MemoryContext cxt = CurrentMemoryContext;
	FsFairDesc *desc = palloc0(sizeof(FsFairDesc));
	FsQueryText *q = palloc0(sizeof(FsQueryText));

	strlcpy(desc->queue_name, queue, FS_NAME_BUFLEN);
	desc->ready_relid = ready_relid;
	desc->ready_name = fs_qualified_name(ready_relid);
	desc->ready_schema = pstrdup(quote_identifier(get_namespace_name(get_rel_namespace(ready_relid))));
	q->sql = pstrdup(index_sql);
	PG_TRY();
	{
		fs_spi(index_sql, 0, NULL, NULL, NULL, false);
	}
	PG_CATCH();
	{
		fs_fair_query_error(cxt, desc, q, "index");
	}
	PG_END_TRY();
}

/* A registration as fs_register_queue() builds it. */
typedef struct FsRegistration
{
	char		queue[FS_NAME_BUFLEN];
	Oid			ready_relid;
	Oid			running_relid;	/* InvalidOid: none */
	/* the arguments, as given (NULL: left out) */
	char	   *tenant_text;
	char	   *order_text;
	char	   *filter_text;
	char	   *key_text;
	char	   *running_filter_text;
	char	   *running_key_text;
	char	   *cost_text;
	char	   *enqueued_at_text;
	char	   *selector_text;
	char	   *subkey_text;
	bool		charge_runtime;
	bool		create_index;
	bool		max_slots_given;	/* false: no limit for tenants without one */
	int32		max_slots;
	Interval   *lease;			/* NULL: fs_claim()'s default, 5 minutes */
	/* compiled on the tables; the filter split in two */
	Node	   *tenant;
	List	   *order;
	List	   *ready_quals;	/* immutable: rows are counted by them */
	List	   *claim_quals;	/* mutable (now()): checked when claiming */
	Node	   *key;
	Node	   *running_key;
	Node	   *running_filter;
	Node	   *cost;
	Node	   *enqueued_at;
	Node	   *selector;
	Node	   *subkey;
	/* their canonical texts, as stored */
	char	   *c_ready_filter;
	char	   *c_claim_filter;
	char	   *c_tenant;
	char	   *c_order;
	char	   *c_key;
	char	   *c_cost;
	char	   *c_enqueued_at;
	char	   *c_selector;
	char	   *c_subkey;
	char	   *c_running_filter;
	char	   *c_running_key;
	/* the index the claim query walks */
	Oid			key_type;
	Oid			indexoid;		/* InvalidOid: none serves */
	char	   *index_name;		/* with index_sql: the one to create */
	char	   *index_sql;
	bool		index_created;
} FsRegistration;

/* Read and check fs_register_queue()'s arguments. */
static void
fs_registration_args(FunctionCallInfo fcinfo, FsRegistration *reg)
{
	memset(reg, 0, sizeof(*reg));
	fs_name_arg(fcinfo, 0, "queue", reg->queue);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ready_table must not be null"),
				 errhint("Pass the table that holds the ready rows, for example 'solid_queue_ready_executions'.")));
	reg->ready_relid = PG_GETARG_OID(1);
	reg->tenant_text = fs_text_arg(fcinfo, 2, "tenant", true);
	reg->order_text = fs_text_arg(fcinfo, 3, "order_by", true);
	reg->filter_text = fs_text_arg(fcinfo, 4, "filter", false);
	reg->key_text = fs_text_arg(fcinfo, 5, "key", false);
	reg->running_relid = PG_ARGISNULL(6) ? InvalidOid : PG_GETARG_OID(6);
	reg->running_filter_text = fs_text_arg(fcinfo, 7, "running_filter", false);
	reg->running_key_text = fs_text_arg(fcinfo, 8, "running_key", false);
	reg->cost_text = fs_text_arg(fcinfo, 9, "cost", false);
	reg->charge_runtime = fs_bool_arg(fcinfo, 10, "charge_runtime");
	reg->create_index = fs_bool_arg(fcinfo, 11, "create_index");
	reg->enqueued_at_text = fs_text_arg(fcinfo, 12, "enqueued_at", false);
	reg->selector_text = fs_text_arg(fcinfo, 13, "selector", false);
	reg->max_slots_given = !PG_ARGISNULL(14);
	if (reg->max_slots_given)
	{
		reg->max_slots = PG_GETARG_INT32(14);
		if (reg->max_slots < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_slots must not be negative, got %d", reg->max_slots),
					 errhint("Pass the most slots a tenant of queue \"%s\" may hold at once, or NULL for no limit.",
							 reg->queue)));
	}
	if (!PG_ARGISNULL(15))
	{
		reg->lease = PG_GETARG_INTERVAL_P(15);
		(void) fs_lease_usecs(reg->lease, "lease");
	}
	reg->subkey_text = fs_text_arg(fcinfo, 16, "subkey", false);

	if (!OidIsValid(reg->running_relid) && (reg->running_filter_text || reg->running_key_text))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("running_filter and running_key of queue \"%s\" need a running_table",
						reg->queue),
				 errhint("Pass running_table => the table whose rows mark a claimed row as running.")));
	if (!OidIsValid(reg->running_relid) && reg->charge_runtime)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("charge_runtime of queue \"%s\" needs a running_table", reg->queue),
				 errhint("Run time is measured when a claimed row leaves the running table; pass running_table.")));
}

/*
 * Compile the registration's expressions on its tables, with the caller's
 * search_path (names mean what the caller means), and their canonical
 * texts.  The filter's mutable parts (now()) are checked when claiming, the
 * rest when counting rows.
 */
static void
fs_registration_compile(FsRegistration *reg, Relation ready, Relation running)
{
	const char *queue = reg->queue;
	ListCell   *lc;

	reg->tenant = fs_compile(reg->tenant_text, ready, FS_EXPR_TENANT, queue);
	reg->order = fs_compile_order(reg->order_text, ready, queue);
	if (reg->filter_text != NULL)
	{
		Node	   *filter = fs_compile(reg->filter_text, ready, FS_EXPR_FILTER, queue);

		foreach(lc, make_ands_implicit((Expr *) filter))
		{
			Node	   *qual = lfirst(lc);

			if (contain_mutable_functions(qual))
				reg->claim_quals = lappend(reg->claim_quals, qual);
			else
				reg->ready_quals = lappend(reg->ready_quals, qual);
		}
	}
	if (reg->key_text == NULL)
		reg->key_text = fs_primary_key(ready, queue);
	reg->key = fs_compile(reg->key_text, ready, FS_EXPR_KEY, queue);
	if (reg->cost_text != NULL)
		reg->cost = fs_compile(reg->cost_text, ready, FS_EXPR_COST, queue);
	if (reg->enqueued_at_text != NULL)
		reg->enqueued_at = fs_compile(reg->enqueued_at_text, ready, FS_EXPR_ENQUEUED_AT, queue);
	if (reg->selector_text != NULL)
		reg->selector = fs_compile(reg->selector_text, ready, FS_EXPR_SELECTOR, queue);
	if (reg->subkey_text != NULL)
		reg->subkey = fs_compile(reg->subkey_text, ready, FS_EXPR_SUBKEY, queue);
	if (running != NULL)
	{
		reg->running_key = fs_compile(reg->running_key_text ? reg->running_key_text : reg->key_text,
									  running, FS_EXPR_RUNNING_KEY, queue);
		if (exprType(reg->running_key) != exprType(reg->key))
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("running_key of queue \"%s\" is %s, but its key is %s", queue,
							format_type_be(exprType(reg->running_key)),
							format_type_be(exprType(reg->key))),
					 errhint("running_key must give the same value as key for the same job.")));
		if (reg->running_filter_text != NULL)
			reg->running_filter = fs_compile(reg->running_filter_text, running,
											 FS_EXPR_RUNNING_FILTER, queue);
	}
	reg->key_type = exprType(reg->key);

	if (reg->ready_quals != NIL)
		reg->c_ready_filter = fs_deparse((Node *) make_ands_explicit(reg->ready_quals), ready);
	if (reg->claim_quals != NIL)
		reg->c_claim_filter = fs_deparse((Node *) make_ands_explicit(reg->claim_quals), ready);
	reg->c_tenant = fs_deparse(reg->tenant, ready);
	reg->c_order = fs_deparse_order(reg->order, ready, false);
	reg->c_key = fs_deparse(reg->key, ready);
	if (reg->cost != NULL)
		reg->c_cost = fs_deparse(reg->cost, ready);
	if (reg->enqueued_at != NULL)
		reg->c_enqueued_at = fs_deparse(reg->enqueued_at, ready);
	if (reg->selector != NULL)
		reg->c_selector = fs_deparse(reg->selector, ready);
	if (reg->subkey != NULL)
		reg->c_subkey = fs_deparse(reg->subkey, ready);
	if (reg->running_filter != NULL)
		reg->c_running_filter = fs_deparse(reg->running_filter, running);
	if (reg->running_key != NULL)
		reg->c_running_key = fs_deparse(reg->running_key, running);
}

/*
 * The key must tell rows apart, and the claim query needs an index to
 * walk.  Both compare the registration's expressions with the table's
 * indexes (folding constants, which runs immutable functions, possibly the
 * owner's), as the table's owner in a security-restricted operation, as
 * CREATE INDEX evaluates index expressions (run_as.c).  Sets the index
 * found, or the one to create.
 */
static void
fs_registration_check_key(FsRegistration *reg, Relation ready)
{
	FsRunAs		as_owner;
	bool		key_unique;
	List	   *index_order = reg->order;

	/* With a subkey, claims walk (tenant, sub-key, order_by ...). */
	if (reg->subkey != NULL)
	{
		FsOrderItem *item = palloc0(sizeof(FsOrderItem));

		item->expr = reg->subkey;
		item->nulls = SORTBY_NULLS_DEFAULT;
		index_order = lcons(item, list_copy(reg->order));
	}
	fs_run_as_begin(&as_owner, ready->rd_rel->relowner, 0);
	key_unique = fs_key_is_unique(ready, reg->key,
								  fs_cluster_is_distributed(RelationGetRelid(ready)) &&
								  IsA(fs_strip_relabel(reg->tenant), Var) ?
								  ((Var *) fs_strip_relabel(reg->tenant))->varattno : 0);
	reg->indexoid = key_unique ? fs_find_index(ready, reg->tenant, index_order, reg->ready_quals) :
		InvalidOid;
	fs_run_as_end(&as_owner);
	if (!key_unique)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key \"%s\" of queue \"%s\" is not guaranteed to be unique and not null",
						reg->c_key, reg->queue),
				 errdetail("A claimed row's lease is released by its key: rows sharing a key, or "
						   "with a NULL key, would keep their leases until they expire."),
				 errhint("Use the primary key (leave key out), or a key with a unique index on "
						 "exactly it and NOT NULL columns, for example: CREATE UNIQUE INDEX ON %s "
						 "(%s); ALTER TABLE %s ALTER COLUMN ... SET NOT NULL.",
						 fs_qualified_name(reg->ready_relid),
						 IsA(fs_strip_relabel(reg->key), Var) ? reg->c_key :
						 psprintf("(%s)", reg->c_key),
						 fs_qualified_name(reg->ready_relid))));
	if (!OidIsValid(reg->indexoid))
	{
		reg->index_name = ChooseRelationName(RelationGetRelationName(ready), NULL, "fs_fair",
											 RelationGetNamespace(ready), false);
		reg->index_sql = fs_index_definition(ready, reg->index_name, reg->tenant, index_order,
											 reg->c_ready_filter);
	}
}

/*
 * Create the missing index if asked to (the tables closed, still locked),
 * else warn that claims have none to walk.
 */
static void
fs_registration_make_index(FsRegistration *reg, Oid namespace)
{
	if (reg->index_sql == NULL)
		return;
	if (!reg->create_index)
	{
		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("table %s has no index that serves fair claims of queue \"%s\"",
						get_rel_name(reg->ready_relid), reg->queue),
				 errhint("Create it, for example: %s", reg->index_sql)));
		return;
	}
	fs_create_index(reg->queue, reg->ready_relid, reg->index_sql);
	reg->indexoid = get_relname_relid(reg->index_name, namespace);
	reg->index_created = true;
}

/* A text argument of the registration's row: NULL stays NULL. */
static inline Datum
fs_text_or_null_datum(const char *s)
{
	return s ? CStringGetTextDatum(s) : (Datum) 0;
}

/*
 * A queue on Citus's distributed tables (registered on the coordinator,
 * fs_open_table() checked): each node serves the tenants whose shards it
 * holds, so the ready table must be distributed by the tenant and colocated
 * with fs_citus_setup()'s table, and a running table with it too.  Local and
 * distributed tables do not mix: a row and its running row must be on the
 * same node.
 */
static void
fs_registration_check_cluster(FsRegistration *reg, Relation ready, Relation running)
{
	bool		distributed = fs_cluster_is_distributed(RelationGetRelid(ready));
	Node	   *tenant = fs_strip_relabel(reg->tenant);
	char	   *problem;

	if (running != NULL && running != ready &&
		fs_cluster_is_distributed(RelationGetRelid(running)) != distributed)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("queue \"%s\" has one table distributed by Citus and one not", reg->queue),
				 errhint("Distribute both, colocated, or neither.")));
	if (!distributed)
		return;
	for (int i = 0; i < 2; i++)
	{
		Relation	rel = i == 0 ? ready : running;

		if (rel == NULL)
			continue;
		/* Its partitions' shards would fire triggers fairshare could not place. */
		if (rel->rd_rel->relkind == RELKIND_PARTITIONED_TABLE)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("table %s of queue \"%s\" is partitioned and distributed by Citus, which fair dequeue does not serve",
							RelationGetRelationName(rel), reg->queue),
					 errhint("Distribute a table that is not partitioned.")));
		/* A shard is named <table>_<shard id>; Citus shortens longer names. */
		if (strlen(RelationGetRelationName(rel)) + 1 + MAXINT8LEN >= NAMEDATALEN)
			ereport(ERROR,
					(errcode(ERRCODE_NAME_TOO_LONG),
					 errmsg("the name of table %s of queue \"%s\" is too long for its shards' names",
							RelationGetRelationName(rel), reg->queue),
					 errhint("Give the table a name of at most %d bytes.",
							 NAMEDATALEN - 2 - MAXINT8LEN)));
	}
	problem = fs_cluster_queue_table_problem(RelationGetRelid(ready),
											 tenant != NULL && IsA(tenant, Var) ?
											 ((Var *) tenant)->varattno : 0);
	if (problem != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("ready_table of queue \"%s\" cannot be served across the cluster: %s",
						reg->queue, problem),
				 errhint("Distribute it by its tenant column, colocated with the table of fs_citus_setup(), "
						 "and pass that column as tenant.")));
	if (running != NULL && running != ready)
	{
		problem = fs_cluster_queue_table_problem(RelationGetRelid(running), -1);
		if (problem != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("running_table of queue \"%s\" cannot be served across the cluster: %s",
							reg->queue, problem),
					 errhint("Distribute it by its tenant column, colocated with the ready table.")));
	}
}

/* Store the registration's row, as the extension's owner (the caller's rights were checked). */
static void
fs_registration_store(const FsRegistration *reg)
{
	StringInfoData sql;
	Oid			argtypes[21];
	Datum		values[21];
	char		nulls[21];
	int			nargs = 0;

	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "INSERT INTO %s.fs_fair_queues AS q (queue, ready_table, tenant, order_by,"
					 " ready_filter, claim_filter, key, key_type, running_table, running_filter,"
					 " running_key, cost, charge_runtime, ready_index, index_created, registered_by,"
					 " enqueued_at, selector, max_slots, lease, subkey)"
					 " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,"
					 " $19, $20, $21)"
					 " ON CONFLICT (queue) DO UPDATE SET ready_table = EXCLUDED.ready_table,"
					 " tenant = EXCLUDED.tenant, order_by = EXCLUDED.order_by,"
					 " ready_filter = EXCLUDED.ready_filter, claim_filter = EXCLUDED.claim_filter,"
					 " key = EXCLUDED.key, key_type = EXCLUDED.key_type,"
					 " running_table = EXCLUDED.running_table,"
					 " running_filter = EXCLUDED.running_filter, running_key = EXCLUDED.running_key,"
					 " cost = EXCLUDED.cost, charge_runtime = EXCLUDED.charge_runtime,"
					 " ready_index = EXCLUDED.ready_index, index_created = EXCLUDED.index_created,"
					 " registered_by = EXCLUDED.registered_by, registered_at = pg_catalog.now(),"
					 " enqueued_at = EXCLUDED.enqueued_at, selector = EXCLUDED.selector,"
					 " max_slots = EXCLUDED.max_slots, lease = EXCLUDED.lease,"
					 " subkey = EXCLUDED.subkey",
					 fs_ext_schema());
#define FS_ARG(type, value, isnull) \
	(argtypes[nargs] = (type), values[nargs] = (value), nulls[nargs++] = (isnull) ? 'n' : ' ')
	FS_ARG(TEXTOID, CStringGetTextDatum(reg->queue), false);
	FS_ARG(REGCLASSOID, ObjectIdGetDatum(reg->ready_relid), false);
	FS_ARG(TEXTOID, CStringGetTextDatum(reg->c_tenant), false);
	FS_ARG(TEXTOID, CStringGetTextDatum(reg->c_order), false);
	FS_ARG(TEXTOID, fs_text_or_null_datum(reg->c_ready_filter), !reg->c_ready_filter);
	FS_ARG(TEXTOID, fs_text_or_null_datum(reg->c_claim_filter), !reg->c_claim_filter);
	FS_ARG(TEXTOID, CStringGetTextDatum(reg->c_key), false);
	FS_ARG(REGTYPEOID, ObjectIdGetDatum(reg->key_type), false);
	FS_ARG(REGCLASSOID, ObjectIdGetDatum(reg->running_relid), !OidIsValid(reg->running_relid));
	FS_ARG(TEXTOID, fs_text_or_null_datum(reg->c_running_filter), !reg->c_running_filter);
	FS_ARG(TEXTOID, fs_text_or_null_datum(reg->c_running_key), !reg->c_running_key);
	FS_ARG(TEXTOID, fs_text_or_null_datum(reg->c_cost), !reg->c_cost);
	FS_ARG(BOOLOID, BoolGetDatum(reg->charge_runtime), false);
	FS_ARG(REGCLASSOID, ObjectIdGetDatum(reg->indexoid), !OidIsValid(reg->indexoid));
	FS_ARG(BOOLOID, BoolGetDatum(reg->index_created), false);
	FS_ARG(REGROLEOID, ObjectIdGetDatum(GetUserId()), false);
	FS_ARG(TEXTOID, fs_text_or_null_datum(reg->c_enqueued_at), !reg->c_enqueued_at);
	FS_ARG(TEXTOID, fs_text_or_null_datum(reg->c_selector), !reg->c_selector);
	FS_ARG(INT4OID, Int32GetDatum(reg->max_slots), !reg->max_slots_given);
	FS_ARG(INTERVALOID, PointerGetDatum(reg->lease), reg->lease == NULL);
	FS_ARG(TEXTOID, fs_text_or_null_datum(reg->c_subkey), !reg->c_subkey);
#undef FS_ARG
	Assert(nargs == lengthof(values));
	fs_spi_as_extension_owner(sql.data, nargs, argtypes, values, nulls);
}

/* The columns of fs_cluster_queues, in order (fs_registration_publish()). */
#define FS_CLUSTER_QUEUE_COLUMNS \
	"queue, ready_table, tenant, order_by, ready_filter, claim_filter, key, key_type," \
	" running_table, running_filter, running_key, cost, enqueued_at, charge_runtime," \
	" ready_index, index_created, registered_by, selector, max_slots, lease, subkey"
#define FS_CLUSTER_QUEUE_NCOLUMNS 21

/* A table's name as text that means it on every node: schema-qualified. */
#define FS_QUALIFIED_SQL(column) \
	"(SELECT pg_catalog.format('%%I.%%I', n.nspname, c.relname) FROM pg_catalog.pg_class c" \
	" JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace" \
	" WHERE c.oid OPERATOR(pg_catalog.=) q." column "::pg_catalog.oid)"

/*
 * Publish queue `queue`'s registration, on a distributed table, to every
 * node of the Citus cluster: its row of fs_fair_queues as text in the
 * reference table fs_cluster_queues, which Citus writes on every node in
 * this transaction, where its trigger writes the node's own row of
 * fs_fair_queues.  (On the coordinator that trigger writes the row just
 * stored again, with the same values.)
 */
static void
fs_registration_publish(const char *queue)
{
	Oid			argtypes[FS_CLUSTER_QUEUE_NCOLUMNS];
	Datum		values[FS_CLUSTER_QUEUE_NCOLUMNS];
	char		nulls[FS_CLUSTER_QUEUE_NCOLUMNS];
	Oid			qtype[1] = {TEXTOID};
	Datum		qvalue[1];
	StringInfoData sql;
	HeapTuple	row;
	TupleDesc	rowdesc;

	qvalue[0] = CStringGetTextDatum(queue);
	fs_spi(psprintf("SELECT q.queue, " FS_QUALIFIED_SQL("ready_table") ", q.tenant, q.order_by,"
					" q.ready_filter, q.claim_filter, q.key, pg_catalog.format_type(q.key_type, NULL),"
					" " FS_QUALIFIED_SQL("running_table") ", q.running_filter, q.running_key, q.cost,"
					" q.enqueued_at, q.charge_runtime, " FS_QUALIFIED_SQL("ready_index") ","
					" q.index_created, q.registered_by::pg_catalog.text, q.selector, q.max_slots,"
					" q.lease, q.subkey"
					"  FROM %s.fs_fair_queues q WHERE q.queue OPERATOR(pg_catalog.=) $1",
					fs_ext_schema()),
		   1, qtype, qvalue, NULL, false);
	if (SPI_processed != 1)
		elog(ERROR, "the registration of queue \"%s\" was not stored", queue);
	row = SPI_copytuple(SPI_tuptable->vals[0]);
	rowdesc = CreateTupleDescCopy(SPI_tuptable->tupdesc);
	Assert(rowdesc->natts == FS_CLUSTER_QUEUE_NCOLUMNS);
	initStringInfo(&sql);
	appendStringInfo(&sql, "INSERT INTO %s.fs_cluster_queues (" FS_CLUSTER_QUEUE_COLUMNS ") VALUES (",
					 fs_ext_schema());
	for (int i = 0; i < FS_CLUSTER_QUEUE_NCOLUMNS; i++)
	{
		bool		isnull;

		argtypes[i] = TupleDescAttr(rowdesc, i)->atttypid;
		values[i] = SPI_getbinval(row, rowdesc, i + 1, &isnull);
		nulls[i] = isnull ? 'n' : ' ';
		appendStringInfo(&sql, "%s$%d", i > 0 ? ", " : "", i + 1);
	}
	appendStringInfoChar(&sql, ')');
	fs_registration_unpublish(queue);
	fs_spi_as_extension_owner(sql.data, FS_CLUSTER_QUEUE_NCOLUMNS, argtypes, values, nulls);
}

/*
 * Take queue `queue`'s registration back from the nodes of the Citus
 * cluster, if it was published there (on the coordinator only: a node's
 * own drop of the table removes the node's row).
 */
static void
fs_registration_unpublish(const char *queue)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];

	if (fs_cluster_absent || fs_cluster_group() != 0 ||
		!OidIsValid(get_relname_relid("fs_cluster_queues", get_namespace_oid(fs_extension_schema(), false))))
		return;
	values[0] = CStringGetTextDatum(queue);
	/* Read where it is (this node's placement); write everywhere only if needed. */
	fs_spi(psprintf("SELECT FROM %s.fs_cluster_queues WHERE queue OPERATOR(pg_catalog.=) $1",
					fs_ext_schema()),
		   1, argtypes, values, NULL, false);
	if (SPI_processed == 0)
		return;
	fs_spi_as_extension_owner(psprintf("DELETE FROM %s.fs_cluster_queues"
									   " WHERE queue OPERATOR(pg_catalog.=) $1",
									   fs_ext_schema()),
							  1, argtypes, values, NULL);
}

/*
 * fs_register_queue(queue, ready_table, tenant, order_by, filter, key,
 *					 running_table, running_filter, running_key, cost,
 *					 charge_runtime, create_index, enqueued_at, selector,
 *					 max_slots, lease, subkey)
 *	RETURNS fs_fair_queues
 */
Datum
fs_register_queue(PG_FUNCTION_ARGS)
{
	FsRegistration reg;
	Relation	ready;
	Relation	running = NULL;
	Oid			namespace;
	Oid			old_ready = InvalidOid;
	Oid			old_running = InvalidOid;
	Oid			old_index = InvalidOid;
	bool		old_index_created = false;
	HeapTuple	old;
	TupleDesc	old_desc;
	HeapTupleHeader result;

	fs_check_primary("register a fair-dequeue queue");
	/* Called through an older version's SQL: its table lacks our columns. */
	if (PG_NARGS() < 17)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the SQL objects of extension \"fairshare\" are older than its library"),
				 errhint("Run ALTER EXTENSION fairshare UPDATE, then register the queue.")));
	fs_registration_args(fcinfo, &reg);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	ready = fs_open_table(reg.ready_relid, "ready_table", reg.queue);
	if (OidIsValid(reg.running_relid))
		running = reg.running_relid == reg.ready_relid ? ready :
			fs_open_table(reg.running_relid, "running_table", reg.queue);

	/* Re-registering a queue is for whoever may change its current table. */
	old = fs_registration_row(reg.queue, &old_desc);
	if (old != NULL)
	{
		bool		isnull;

		old_ready = fs_row_oid(old, old_desc, "ready_table");
		old_running = fs_row_oid(old, old_desc, "running_table");
		old_index = fs_row_oid(old, old_desc, "ready_index");
		old_index_created = DatumGetBool(SPI_getbinval(old, old_desc,
													   SPI_fnumber(old_desc, "index_created"),
													   &isnull));
		fs_check_may_replace(old, old_desc, reg.queue, "register it again");
	}

	fs_registration_compile(&reg, ready, running);
	fs_registration_check_cluster(&reg, ready, running);
	fs_registration_check_key(&reg, ready);
	namespace = RelationGetNamespace(ready);

	/* DDL on the tables needs them closed (they stay locked). */
	if (running != NULL && running != ready)
		relation_close(running, NoLock);
	relation_close(ready, NoLock);

	fs_registration_make_index(&reg, namespace);
	fs_registration_store(&reg);
	if (fs_cluster_is_distributed(reg.ready_relid))
		fs_registration_publish(reg.queue);
	else
		fs_registration_unpublish(reg.queue);

	/* An index this queue created before and no longer uses. */
	if (old_index_created && old_index != reg.indexoid)
		fs_drop_created_index(old_index, reg.queue);

	/* Triggers on every table the old and new registration touch. */
	fs_sync_triggers(reg.ready_relid);
	if (OidIsValid(reg.running_relid) && reg.running_relid != reg.ready_relid)
		fs_sync_triggers(reg.running_relid);
	if (OidIsValid(old_ready) && old_ready != reg.ready_relid && old_ready != reg.running_relid)
		fs_sync_triggers(old_ready);
	if (OidIsValid(old_running) && old_running != reg.ready_relid &&
		old_running != reg.running_relid && old_running != old_ready)
		fs_sync_triggers(old_running);

	fs_track_registration_changed(reg.queue, false);

	old = fs_registration_row(reg.queue, &old_desc);
	if (old == NULL)
		elog(ERROR, "the registration of queue \"%s\" was not stored", reg.queue);
	result = SPI_returntuple(old, old_desc);
	SPI_finish();
	PG_RETURN_HEAPTUPLEHEADER(result);
}

/* fs_unregister_queue(queue text) RETURNS boolean */
Datum
fs_unregister_queue(PG_FUNCTION_ARGS)
{
	char		queue[FS_NAME_BUFLEN];
	HeapTuple	old;
	TupleDesc	old_desc;

	fs_check_primary("unregister a fair-dequeue queue");
	fs_name_arg(fcinfo, 0, "queue", queue);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	old = fs_registration_row(queue, &old_desc);
	if (old == NULL)
	{
		SPI_finish();
		PG_RETURN_BOOL(false);
	}
	fs_check_may_replace(old, old_desc, queue, "unregister it");
	{
		Oid			ready_relid = fs_row_oid(old, old_desc, "ready_table");

		/* A distributed queue is everywhere: it ends everywhere, from the coordinator. */
		if (OidIsValid(ready_relid) && fs_cluster_is_distributed(ready_relid) &&
			fs_cluster_group() != 0)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("queue \"%s\" is on a table Citus distributes, and this is not the coordinator",
							queue),
					 errhint("Unregister it on the coordinator: every node then drops it.")));
	}
	fs_unregister_row(old, old_desc, queue);
	SPI_finish();
	PG_RETURN_BOOL(true);
}

/*
 * Remove the registration `old` of `queue`: its row, the index it created,
 * its triggers (on whichever of its tables still exists), and, when this
 * transaction commits, its state in shared memory (and the leases of its
 * claimed rows, released).  SPI connected.
 */
static void
fs_unregister_row(HeapTuple old, TupleDesc old_desc, const char *queue)
{
	Oid			ready_relid = fs_row_oid(old, old_desc, "ready_table");
	Oid			running_relid = fs_row_oid(old, old_desc, "running_table");
	Oid			indexoid = fs_row_oid(old, old_desc, "ready_index");
	bool		isnull;
	bool		index_created = DatumGetBool(SPI_getbinval(old, old_desc,
														   SPI_fnumber(old_desc, "index_created"),
														   &isnull));
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];

	values[0] = CStringGetTextDatum(queue);
	fs_spi_as_extension_owner(psprintf("DELETE FROM %s.fs_fair_queues WHERE queue = $1",
									   fs_ext_schema()),
							  1, argtypes, values, NULL);
	fs_registration_unpublish(queue);
	if (index_created)
		fs_drop_created_index(indexoid, queue);
	fs_sync_triggers(ready_relid);
	if (OidIsValid(running_relid) && running_relid != ready_relid)
		fs_sync_triggers(running_relid);
	/* Not preloaded: no state in shared memory to forget. */
	if (fs_fair != NULL)
	{
		FsQueue    *q = fs_queue_lookup(queue, false);

		fs_track_registration_changed(queue, true);
		if (q != NULL)
			fs_claim_map_release_queue(q->queue_id);
	}
}

/*
 * Event trigger ON sql_drop: a registration whose ready or running table
 * was dropped is removed with it (its row, the triggers and index fairshare
 * put on the other table, its counts and fair order), with a NOTICE,
 * rather than left behind as a bare OID that recounts skip.  Whoever drops
 * a table may end its registration; the cleanup runs as the extension's
 * owner, who owns fs_fair_queues, with a fixed search_path (run_as.c).
 */
Datum
fs_fair_tables_dropped(PG_FUNCTION_ARGS)
{
	FsRunAs		run_as;
	List	   *queues = NIL;
	ListCell   *lc;
	uint64		r;
	MemoryContext cxt = CurrentMemoryContext;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("fs_fair_tables_dropped() must be fired as an event trigger")));
	/* The extension itself being dropped: its registrations go with it. */
	if (!OidIsValid(get_extension_oid("fairshare", true)))
		PG_RETURN_VOID();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/*
	 * Every DROP in the database comes here, by any role: whether it may
	 * read the extension's schema or not, the registrations are read and
	 * removed as the extension's owner.
	 */
	fs_run_as_begin(&run_as, fs_extension_owner(), FS_RUN_AS_UNRESTRICTED);
	fs_spi(psprintf("SELECT q.queue, d.object_identity"
					"  FROM %s.fs_fair_queues q"
					"  JOIN pg_catalog.pg_event_trigger_dropped_objects() d"
					"    ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass"
					"   AND d.objsubid OPERATOR(pg_catalog.=) 0"
					"   AND d.objid OPERATOR(pg_catalog.=) ANY (ARRAY[q.ready_table::pg_catalog.oid,"
					"                                              q.running_table::pg_catalog.oid])"
					" ORDER BY 1",
					fs_ext_schema()),
		   0, NULL, NULL, NULL, true);
	for (r = 0; r < SPI_processed; r++)
	{
		MemoryContext old = MemoryContextSwitchTo(cxt);

		queues = lappend(queues, list_make2(SPI_getvalue(SPI_tuptable->vals[r],
														 SPI_tuptable->tupdesc, 1),
											SPI_getvalue(SPI_tuptable->vals[r],
														 SPI_tuptable->tupdesc, 2)));
		MemoryContextSwitchTo(old);
	}

	foreach(lc, queues)
	{
		const char *queue = linitial(lfirst(lc));
		const char *table = lsecond(lfirst(lc));
		TupleDesc	old_desc;
		HeapTuple	old = fs_registration_row(queue, &old_desc);

		if (old == NULL)
			continue;			/* both its tables went in this command */
		fs_unregister_row(old, old_desc, queue);
		ereport(NOTICE,
				(errmsg("queue \"%s\" is no longer registered for fair dequeue: its table %s was dropped",
						queue, table),
				 errhint("Register its new table with fs_register_queue() to claim from it again.")));
	}
	fs_run_as_end(&run_as);
	SPI_finish();
	PG_RETURN_VOID();
}

/*
 * AFTER ... FOR EACH STATEMENT on fs_fair_queues: the registrations changed
 * (also when edited with plain SQL); every backend reloads them once this
 * transaction commits.
 */
Datum
fs_fair_queues_changed(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("fs_fair_queues_changed() must be fired as a trigger")));
	fs_track_registration_changed(NULL, false);
	return PointerGetDatum(NULL);
}

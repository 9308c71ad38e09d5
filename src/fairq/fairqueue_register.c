/*-------------------------------------------------------------------------
 *
 * fairqueue_register.c
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
#include "catalog/partition.h"
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
#include "utils/typcache.h"

#include "core/subxact.h"
#include "fairq/fairqueue_int.h"
#include "limits/limits.h"

PG_FUNCTION_INFO_V1(fs_register_queue);
PG_FUNCTION_INFO_V1(fs_unregister_queue);
PG_FUNCTION_INFO_V1(fs_fair_queues_changed);
PG_FUNCTION_INFO_V1(fs_fair_tables_dropped);

/* The alias of the ready table in every query fairshare builds. */
#define FS_ROW_ALIAS		"fairshare_row"

/* Names of the triggers fairshare puts on registered tables. */
#define FS_TRIGGER_READY	"fs_fair_ready"
#define FS_TRIGGER_READY_T	"fs_fair_ready_truncate"
#define FS_TRIGGER_RUN		"fs_fair_running"
#define FS_TRIGGER_RUN_T	"fs_fair_running_truncate"

static HTAB *fs_descs = NULL;		/* queue name -> FsFairDesc */
static HTAB *fs_rel_cache = NULL;	/* relid -> FsRelTriggers */

/* ----------------------------------------------------------------
 * Parsing what a registration is made of
 * ----------------------------------------------------------------
 */

typedef enum FsExprRole
{
	FS_EXPR_TENANT,
	FS_EXPR_ORDER,
	FS_EXPR_FILTER,
	FS_EXPR_KEY,
	FS_EXPR_COST,
	FS_EXPR_RUNNING_FILTER,
	FS_EXPR_RUNNING_KEY,
	FS_EXPR_ENQUEUED_AT
} FsExprRole;

static const char *const fs_role_names[] = {
	"tenant", "order_by", "filter", "key", "cost", "running_filter", "running_key", "enqueued_at"
};

typedef struct FsParseContext
{
	const char *sql;
	const char *what;
	const char *queue;
} FsParseContext;

/* Error context: point into the SQL fairshare parsed, say which piece. */
static void
fs_parse_error_callback(void *arg)
{
	FsParseContext *ctx = (FsParseContext *) arg;
	int			pos = geterrposition();

	if (pos > 0)
	{
		errposition(0);
		internalerrposition(pos);
		internalerrquery(ctx->sql);
	}
	errcontext("%s of queue \"%s\"", ctx->what, ctx->queue);
}

static void
fs_bad_expr(const FsParseContext *ctx, const char *problem)
{
	ereport(ERROR,
			(errcode(ERRCODE_SYNTAX_ERROR),
			 errmsg("%s of queue \"%s\" must be a single SQL expression: %s",
					ctx->what, ctx->queue, problem),
			 errhint("Write only the expression, for example tenant => 'account_id' or "
					 "order_by => 'priority, id'.")));
}

/*
 * Parse "SELECT <text>" (or "SELECT 1 ORDER BY <text>") and check that it is
 * nothing but that: one statement, one target, no FROM, no clauses.
 */
static SelectStmt *
fs_parse_select(const char *sql, bool order_by, const FsParseContext *ctx)
{
	List	   *raw = raw_parser(sql, RAW_PARSE_DEFAULT);
	RawStmt    *rs;
	SelectStmt *sel;

	if (list_length(raw) != 1)
		fs_bad_expr(ctx, "it contains more than one statement");
	rs = linitial_node(RawStmt, raw);
	if (!IsA(rs->stmt, SelectStmt))
		fs_bad_expr(ctx, "it is not an expression");
	sel = (SelectStmt *) rs->stmt;
	if (sel->op != SETOP_NONE || sel->fromClause || sel->whereClause || sel->groupClause ||
		sel->havingClause || sel->windowClause || sel->valuesLists || sel->limitOffset ||
		sel->limitCount || sel->lockingClause || sel->withClause || sel->distinctClause ||
		sel->intoClause || (sel->sortClause != NIL) != order_by ||
		list_length(sel->targetList) != 1)
		fs_bad_expr(ctx, "it contains clauses of a query");
	if (!order_by)
	{
		ResTarget  *rt = linitial_node(ResTarget, sel->targetList);

		if (rt->name != NULL || rt->indirection != NIL)
			fs_bad_expr(ctx, "it has a column alias");
		if (IsA(rt->val, ColumnRef) &&
			IsA(llast(((ColumnRef *) rt->val)->fields), A_Star))
			fs_bad_expr(ctx, "it is a *");
	}
	return sel;
}

/* A parse state with `rel` as the only relation in scope. */
static ParseState *
fs_parse_state(Relation rel, const char *sql)
{
	ParseState *pstate = make_parsestate(NULL);
	ParseNamespaceItem *nsitem;

	pstate->p_sourcetext = sql;
	nsitem = addRangeTableEntryForRelation(pstate, rel, AccessShareLock, NULL, false, false);
	addNSItemToQuery(pstate, nsitem, false, true, true);
	return pstate;
}

/* Refuse system columns: they are not stable row identity or content. */
static void
fs_check_columns(Node *expr, const FsParseContext *ctx, bool need_column)
{
	Bitmapset  *attrs = NULL;
	int			attno = -1;

	pull_varattnos(expr, 1, &attrs);
	while ((attno = bms_next_member(attrs, attno)) >= 0)
		if (attno + FirstLowInvalidHeapAttributeNumber < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_COLUMN_REFERENCE),
					 errmsg("%s of queue \"%s\" must not use system columns",
							ctx->what, ctx->queue),
					 errhint("Use the table's own columns.")));
	if (need_column && bms_is_empty(attrs))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s of queue \"%s\" does not depend on the row", ctx->what, ctx->queue),
				 errhint("Use the column (or an expression of the columns) that holds the value.")));
}

static void
fs_check_immutable(Node *expr, const FsParseContext *ctx)
{
	if (contain_mutable_functions(expr))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s of queue \"%s\" must be immutable", ctx->what, ctx->queue),
				 errhint("It is evaluated by triggers and indexed, so it may use only the row's "
						 "columns and immutable functions; conditions such as scheduled_at <= now() "
						 "belong in filter.")));
}

static bool
fs_func_is_temp(Oid funcid, void *context pg_attribute_unused())
{
	return isAnyTempNamespace(get_func_namespace(funcid));
}

static bool
fs_calls_temp_function(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (check_functions_in_node(node, fs_func_is_temp, context))
		return true;
	return expression_tree_walker(node, fs_calls_temp_function, context);
}

/*
 * A registration outlives the session that made it, and its expressions
 * run in other sessions, the background worker's among them: a function of
 * a temporary schema would be another session's, or gone.
 */
static void
fs_check_no_temp_functions(Node *expr, const FsParseContext *ctx)
{
	if (fs_calls_temp_function(expr, NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s of queue \"%s\" must not call functions of a temporary schema",
						ctx->what, ctx->queue),
				 errhint("Create the function in a permanent schema.")));
}

/* Tenant keys are text: strings, integers and uuids are converted. */
static Node *
fs_coerce_tenant(ParseState *pstate, Node *expr, const FsParseContext *ctx)
{
	Oid			type = exprType(expr);

	switch (type)
	{
		case TEXTOID:
			return expr;
		case UNKNOWNOID:
		case VARCHAROID:
		case BPCHAROID:
		case NAMEOID:
		case INT2OID:
		case INT4OID:
		case INT8OID:
		case UUIDOID:
			return coerce_to_target_type(pstate, expr, type, TEXTOID, -1,
										 COERCION_EXPLICIT, COERCE_EXPLICIT_CAST, -1);
		default:
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("tenant of queue \"%s\" must be text, varchar, an integer or a uuid, not %s",
							ctx->queue, format_type_be(type)),
					 errhint("Cast it to text if its text form is the tenant's key, "
							 "for example tenant => 'payload->>''account''').")));
	}
	return NULL;				/* keep compiler quiet */
}

/*
 * A key expression as registered: an integer, a uuid or text (what the claim
 * map can identify a row by), or a clear error naming the queue.
 */
static Node *
fs_coerce_key(Node *expr, const FsParseContext *ctx)
{
	Oid			type = exprType(expr);

	if (type != INT2OID && type != INT4OID && type != INT8OID && type != UUIDOID &&
		type != TEXTOID && type != VARCHAROID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("%s of queue \"%s\" must be an integer, a uuid or text, not %s",
						ctx->what, ctx->queue, format_type_be(type)),
				 errhint("Use the table's primary key or another unique column.")));
	return expr;
}

/*
 * enqueued_at: a timestamptz, or a timestamp without time zone taken as UTC
 * (as Rails stores them).
 */
static Node *
fs_coerce_enqueued_at(Node *expr, const FsParseContext *ctx)
{
	Oid			type = exprType(expr);

	if (type == TIMESTAMPOID)
		return (Node *) makeFuncExpr(F_TIMEZONE_TEXT_TIMESTAMP, TIMESTAMPTZOID,
									 list_make2(makeConst(TEXTOID, -1, DEFAULT_COLLATION_OID, -1,
														  CStringGetTextDatum("UTC"), false, false),
												expr),
									 InvalidOid, DEFAULT_COLLATION_OID, COERCE_EXPLICIT_CALL);
	if (type != TIMESTAMPTZOID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("enqueued_at of queue \"%s\" must be a timestamp with or without time zone, not %s",
						ctx->queue, format_type_be(type)),
				 errhint("For example enqueued_at => 'created_at' (a timestamp without time zone is taken as UTC).")));
	return expr;
}

/*
 * A cost expression as float8: any numeric type, coerced as an assignment
 * would; anything else is refused.
 */
static Node *
fs_coerce_cost(ParseState *pstate, Node *expr, const FsParseContext *ctx)
{
	Oid			type = exprType(expr);
	Node	   *result = NULL;

	if (TypeCategory(type) == TYPCATEGORY_NUMERIC)
		result = coerce_to_target_type(pstate, expr, type, FLOAT8OID, -1,
									   COERCION_ASSIGNMENT, COERCE_IMPLICIT_CAST, -1);
	if (result == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("cost of queue \"%s\" must be a number, not %s",
						ctx->queue, format_type_be(type)),
				 errhint("For example cost => 'estimated_ms' or cost => '1 + length(arguments) / 1000'.")));
	return result;
}

/*
 * What parsing one piece of a registration keeps: the statement parsed
 * (checked by fs_parse_select), a parse state with `rel` in scope, and the
 * error context that names the piece.  fs_parse_end() undoes it.
 */
typedef struct FsParse
{
	FsParseContext ctx;
	ErrorContextCallback errcb;
	SelectStmt *sel;
	ParseState *pstate;
} FsParse;

/*
 * Start parsing an expression of a registration, as part of `sql`, against
 * `rel`: its errors name the queue and the argument (the error context stays
 * until fs_parse_end()).
 */
static void
fs_parse_begin(FsParse *p, const char *sql, bool order_by, Relation rel, FsExprRole role,
			   const char *queue)
{
	p->ctx.sql = sql;
	p->ctx.what = fs_role_names[role];
	p->ctx.queue = queue;
	p->errcb.callback = fs_parse_error_callback;
	p->errcb.arg = &p->ctx;
	p->errcb.previous = error_context_stack;
	error_context_stack = &p->errcb;
	p->sel = fs_parse_select(sql, order_by, &p->ctx);
	p->pstate = fs_parse_state(rel, sql);
}

static void
fs_parse_end(FsParse *p)
{
	free_parsestate(p->pstate);
	error_context_stack = p->errcb.previous;
}

/*
 * Parse and analyse one expression of a registration against `rel`: its
 * role decides the type it is converted to and what it may contain.
 */
static Node *
fs_compile(const char *text, Relation rel, FsExprRole role, const char *queue)
{
	FsParse		p;
	ParseState *pstate;
	FsParseContext ctx;
	Node	   *expr;

	fs_parse_begin(&p, psprintf("SELECT %s", text), false, rel, role, queue);
	pstate = p.pstate;
	ctx = p.ctx;
	expr = transformExpr(pstate, linitial_node(ResTarget, p.sel->targetList)->val,
						 role == FS_EXPR_FILTER || role == FS_EXPR_RUNNING_FILTER ?
						 EXPR_KIND_INDEX_PREDICATE : EXPR_KIND_INDEX_EXPRESSION);
	switch (role)
	{
		case FS_EXPR_TENANT:
			expr = fs_coerce_tenant(pstate, expr, &ctx);
			break;
		case FS_EXPR_FILTER:
		case FS_EXPR_RUNNING_FILTER:
			expr = coerce_to_boolean(pstate, expr, ctx.what);
			break;
		case FS_EXPR_KEY:
		case FS_EXPR_RUNNING_KEY:
			expr = fs_coerce_key(expr, &ctx);
			break;
		case FS_EXPR_COST:
			expr = fs_coerce_cost(pstate, expr, &ctx);
			break;
		case FS_EXPR_ENQUEUED_AT:
			expr = fs_coerce_enqueued_at(expr, &ctx);
			break;
		case FS_EXPR_ORDER:
			break;
	}
	assign_expr_collations(pstate, expr);
	fs_check_columns(expr, &ctx, role != FS_EXPR_FILTER && role != FS_EXPR_RUNNING_FILTER);
	fs_check_no_temp_functions(expr, &ctx);
	if (role == FS_EXPR_FILTER)
	{
		if (contain_volatile_functions(expr))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("filter of queue \"%s\" must not call volatile functions", queue),
					 errhint("Use only immutable or stable functions, such as now().")));
	}
	else
		fs_check_immutable(expr, &ctx);

	fs_parse_end(&p);
	return expr;
}

/* One item of order_by. */
typedef struct FsOrderItem
{
	Node	   *expr;
	bool		desc;
	bool		nulls_first;
	SortByNulls nulls;
} FsOrderItem;

/*
 * Parse an order_by text into its items (expression, direction, nulls first
 * or last), checked as a claim will use them.
 */
static List *
fs_compile_order(const char *text, Relation rel, const char *queue)
{
	FsParse		p;
	ListCell   *lc;
	List	   *items = NIL;

	fs_parse_begin(&p, psprintf("SELECT 1 ORDER BY %s", text), true, rel, FS_EXPR_ORDER, queue);
	foreach(lc, p.sel->sortClause)
	{
		SortBy	   *sortby = lfirst_node(SortBy, lc);
		FsOrderItem *item = palloc0(sizeof(FsOrderItem));
		TypeCacheEntry *tce;

		if (sortby->sortby_dir == SORTBY_USING)
			fs_bad_expr(&p.ctx, "USING is not supported");
		item->expr = transformExpr(p.pstate, sortby->node, EXPR_KIND_INDEX_EXPRESSION);
		assign_expr_collations(p.pstate, item->expr);
		fs_check_columns(item->expr, &p.ctx, true);
		fs_check_no_temp_functions(item->expr, &p.ctx);
		fs_check_immutable(item->expr, &p.ctx);
		tce = lookup_type_cache(exprType(item->expr), TYPECACHE_LT_OPR);
		if (!OidIsValid(tce->lt_opr))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_FUNCTION),
					 errmsg("order_by of queue \"%s\" sorts by type %s, which has no ordering",
							queue, format_type_be(exprType(item->expr))),
					 errhint("Order by columns of sortable types, such as priority, id.")));
		item->desc = sortby->sortby_dir == SORTBY_DESC;
		item->nulls = sortby->sortby_nulls;
		item->nulls_first = sortby->sortby_nulls == SORTBY_NULLS_FIRST ||
			(sortby->sortby_nulls == SORTBY_NULLS_DEFAULT && item->desc);
		items = lappend(items, item);
	}
	fs_parse_end(&p);
	return items;
}

/* Canonical text of an expression over `rel` (search_path pg_catalog). */
static char *
fs_deparse(Node *expr, Relation rel)
{
	int			nest = fs_search_path_begin();
	char	   *text;

	text = deparse_expression(expr, deparse_context_for(RelationGetRelationName(rel),
														RelationGetRelid(rel)),
							  false, false);
	fs_search_path_end(nest);
	return text;
}

/*
 * One order item as SQL, for the claim query or (with for_index) an index
 * definition, where an expression needs parentheses.
 */
static char *
fs_deparse_order_item(FsOrderItem *item, Relation rel, bool for_index)
{
	StringInfoData buf;
	Node	   *core = item->expr;

	initStringInfo(&buf);
	if (for_index && !IsA(core, Var))
		appendStringInfo(&buf, "(%s)", fs_deparse(core, rel));
	else
		appendStringInfoString(&buf, fs_deparse(core, rel));
	if (item->desc)
		appendStringInfoString(&buf, " DESC");
	if (item->nulls == SORTBY_NULLS_FIRST)
		appendStringInfoString(&buf, " NULLS FIRST");
	else if (item->nulls == SORTBY_NULLS_LAST)
		appendStringInfoString(&buf, " NULLS LAST");
	return buf.data;
}

/* The order items as an ORDER BY list (see fs_deparse_order_item()). */
static char *
fs_deparse_order(List *items, Relation rel, bool for_index)
{
	StringInfoData buf;
	ListCell   *lc;

	initStringInfo(&buf);
	foreach(lc, items)
	{
		if (buf.len > 0)
			appendStringInfoString(&buf, ", ");
		appendStringInfoString(&buf, fs_deparse_order_item(lfirst(lc), rel, for_index));
	}
	return buf.data;
}

/*
 * A table's schema-qualified, quoted name, for the SQL fairshare builds; an
 * error if the table is gone.
 */
static char *
fs_qualified_name(Oid relid)
{
	char	   *name = get_rel_name(relid);
	char	   *schema = get_namespace_name(get_rel_namespace(relid));

	if (name == NULL || schema == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table with OID %u does not exist", relid),
				 errhint("Unregister queues whose table was dropped with fs_unregister_queue().")));
	return quote_qualified_identifier(schema, name);
}

/* ----------------------------------------------------------------
 * Checks
 * ----------------------------------------------------------------
 */

void
fs_fair_check_owner(Oid relid, const char *queue_name)
{
	if (!fs_class_ownercheck(relid, GetUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be owner of table %s to change fair dequeue of queue \"%s\"",
						fs_qualified_name(relid), queue_name),
				 errhint("Run it as the table's owner (or a superuser).")));
}

/*
 * May the current user replace or remove the existing registration `old` of
 * queue_name?  While its ready table exists, whoever owns that table may (as
 * for registering it); once the table is gone nobody owns the name, so only
 * the role that registered it (or a role with its privileges, a superuser
 * among them) may, or another role could take the name over.  `action` is
 * "unregister it" or "register it again".
 */
static void
fs_check_may_replace(HeapTuple old, TupleDesc old_desc, const char *queue_name,
					 const char *action)
{
	bool		isnull;
	Datum		d;
	Oid			ready_relid;
	Oid			registered_by;

	d = SPI_getbinval(old, old_desc, SPI_fnumber(old_desc, "ready_table"), &isnull);
	ready_relid = isnull ? InvalidOid : DatumGetObjectId(d);
	if (OidIsValid(ready_relid) && get_rel_name(ready_relid) != NULL)
	{
		fs_fair_check_owner(ready_relid, queue_name);
		return;
	}
	d = SPI_getbinval(old, old_desc, SPI_fnumber(old_desc, "registered_by"), &isnull);
	registered_by = isnull ? InvalidOid : DatumGetObjectId(d);
	if (!(OidIsValid(registered_by) && has_privs_of_role(GetUserId(), registered_by)) &&
		!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be the role that registered queue \"%s\" to %s",
						queue_name, action),
				 errhint("Its table no longer exists: only the role that registered it (or a "
						 "superuser) may unregister it with fs_unregister_queue(); register your "
						 "table under another queue name.")));
}

/*
 * Open a registered table by OID (AccessShareLock), or raise a clear error
 * when it no longer exists.
 */
static Relation
fs_open_table(Oid relid, const char *what, const char *queue_name)
{
	Relation	rel = try_relation_open(relid, AccessShareLock);

	/* A regclass of a dropped table (or 0) is only a number. */
	if (rel == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("%s of queue \"%s\" does not exist", what, queue_name),
				 errdetail("No relation has OID %u (a table dropped since its regclass was taken?).",
						   relid),
				 errhint("Name an existing table, for example %s => 'app.jobs'.", what)));

	if (rel->rd_rel->relkind != RELKIND_RELATION &&
		rel->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("%s of queue \"%s\" must be a table, and %s is not",
						what, queue_name, RelationGetRelationName(rel)),
				 errhint("Register the table that holds the rows, not a view or other relation.")));
	if (get_attnum(relid, FS_ROW_ALIAS) != InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_COLUMN),
				 errmsg("%s of queue \"%s\" has a column named \"%s\", a name fairshare reserves",
						what, queue_name, FS_ROW_ALIAS),
				 errhint("Rename that column.")));
	fs_fair_check_owner(relid, queue_name);
	return rel;
}

/* The single-column primary key of `rel`, as a column name. */
static char *
fs_primary_key(Relation rel, const char *queue_name)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	idx = index_open(lfirst_oid(lc), AccessShareLock);
		bool		ok = idx->rd_index->indisprimary && idx->rd_index->indnkeyatts == 1 &&
			idx->rd_index->indkey.values[0] != 0;
		AttrNumber	attno = idx->rd_index->indkey.values[0];

		index_close(idx, AccessShareLock);
		if (ok)
			return pstrdup(quote_identifier(get_attname(RelationGetRelid(rel), attno, false)));
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("table %s of queue \"%s\" has no single-column primary key",
					RelationGetRelationName(rel), queue_name),
			 errhint("Pass key => the column that identifies a row, for example key => 'job_id'.")));
	return NULL;				/* keep compiler quiet */
}

/* ----------------------------------------------------------------
 * The index
 * ----------------------------------------------------------------
 */

static Node *
fs_strip_relabel(Node *node)
{
	while (node != NULL && IsA(node, RelabelType))
		node = (Node *) ((RelabelType *) node)->arg;
	return node;
}

static Node *
fs_normalize(Node *node)
{
	node = eval_const_expressions(NULL, copyObject(node));
	fix_opfuncids(node);
	return fs_strip_relabel(node);
}

/*
 * A valid btree index of `rel` that serves the claim query: it starts with
 * the tenant, then the order_by items in their directions, and its predicate
 * (if any) is implied by the ready filter.
 */
static Oid
fs_find_index(Relation rel, Node *tenant, List *order, List *ready_quals)
{
	List	   *indexes = RelationGetIndexList(rel);
	int			nkeys = 1 + list_length(order);
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Oid			indexoid = lfirst_oid(lc);
		Relation	idx = index_open(indexoid, AccessShareLock);
		Form_pg_index ind = idx->rd_index;
		List	   *exprs;
		ListCell   *next_expr;
		List	   *pred;
		bool		match;
		int			i;

		match = ind->indisvalid && ind->indisready && ind->indislive &&
			idx->rd_rel->relam == BTREE_AM_OID && ind->indnkeyatts >= nkeys;
		exprs = match ? RelationGetIndexExpressions(idx) : NIL;
		next_expr = list_head(exprs);
		for (i = 0; match && i < nkeys; i++)
		{
			Node	   *want = i == 0 ? tenant :
				((FsOrderItem *) list_nth(order, i - 1))->expr;
			Node	   *have;
			Oid			opclass;

			if (ind->indkey.values[i] != 0)
			{
				Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel),
													  ind->indkey.values[i] - 1);

				have = (Node *) makeVar(1, ind->indkey.values[i], att->atttypid,
										att->atttypmod, att->attcollation, 0);
			}
			else if (next_expr != NULL)
			{
				have = (Node *) lfirst(next_expr);
				next_expr = lnext(exprs, next_expr);
			}
			else
			{
				match = false;
				break;
			}
			if (!equal(fs_normalize(have), fs_normalize(want)))
				match = false;
			else
			{
				opclass = GetDefaultOpClass(exprType(fs_strip_relabel(want)), BTREE_AM_OID);
				if (!OidIsValid(opclass) || get_opclass_family(opclass) != idx->rd_opfamily[i] ||
					idx->rd_indcollation[i] != exprCollation(want))
					match = false;
			}
			if (match && i > 0)
			{
				FsOrderItem *item = list_nth(order, i - 1);
				int16		option = idx->rd_indoption[i];

				if (((option & INDOPTION_DESC) != 0) != item->desc ||
					((option & INDOPTION_NULLS_FIRST) != 0) != item->nulls_first)
					match = false;
			}
		}
		pred = match ? RelationGetIndexPredicate(idx) : NIL;
		if (match && pred != NIL && !predicate_implied_by(pred, ready_quals, false))
			match = false;
		index_close(idx, AccessShareLock);
		if (match)
			return indexoid;
	}
	return InvalidOid;
}

/*
 * Can `expr` (over the columns of rel) be NULL?  Not if every column it
 * reads is NOT NULL and nothing in it turns non-null input into NULL
 * (no non-strict function, CASE, COALESCE, NULLIF and the like).
 */
static bool
fs_expr_not_null(Relation rel, Node *expr)
{
	Bitmapset  *attrs = NULL;
	int			a = -1;

	if (contain_nonstrict_functions(expr))
		return false;
	pull_varattnos(expr, 1, &attrs);
	if (bms_is_empty(attrs))
		return false;
	while ((a = bms_next_member(attrs, a)) >= 0)
	{
		AttrNumber	attno = a + FirstLowInvalidHeapAttributeNumber;

		if (attno <= 0 || !TupleDescAttr(RelationGetDescr(rel), attno - 1)->attnotnull)
			return false;
	}
	return true;
}

/*
 * Is the key guaranteed to identify one row?  The claim map releases a
 * claimed row's lease by its key: rows sharing a key, or with a NULL key,
 * would keep their leases until they expire.  Only a unique index says so:
 * valid, not partial, not deferrable, on exactly the key (the same column,
 * or the same expression), with the key never NULL (its columns NOT NULL;
 * a primary key's are).  Run as the table's owner (it folds expressions).
 */
static bool
fs_key_is_unique(Relation rel, Node *key)
{
	List	   *indexes = RelationGetIndexList(rel);
	Node	   *core = fs_strip_relabel(key);
	Node	   *normalized = NULL;
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	idx = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index ind = idx->rd_index;
		bool		ok;

		ok = ind->indisunique && ind->indimmediate && ind->indisvalid && ind->indisready &&
			ind->indislive && ind->indnkeyatts == 1 && RelationGetIndexPredicate(idx) == NIL;
		if (ok && ind->indkey.values[0] != 0)
			ok = IsA(core, Var) && ((Var *) core)->varattno == ind->indkey.values[0] &&
				TupleDescAttr(RelationGetDescr(rel), ind->indkey.values[0] - 1)->attnotnull;
		else if (ok)
		{
			List	   *exprs = RelationGetIndexExpressions(idx);

			if (normalized == NULL)
				normalized = fs_normalize(key);
			ok = exprs != NIL && equal(fs_normalize(linitial(exprs)), normalized) &&
				fs_expr_not_null(rel, normalized);
		}
		index_close(idx, AccessShareLock);
		if (ok)
			return true;
	}
	return false;
}

/*
 * The CREATE INDEX statement of the index a claim uses: the tenant, then the
 * order, over the ready rows.
 */
static char *
fs_index_definition(Relation rel, const char *name, Node *tenant, List *order,
					const char *ready_filter)
{
	StringInfoData buf;
	Node	   *core = fs_strip_relabel(tenant);

	initStringInfo(&buf);
	appendStringInfo(&buf, "CREATE INDEX %s ON %s (", quote_identifier(name),
					 fs_qualified_name(RelationGetRelid(rel)));
	if (IsA(core, Var))
		appendStringInfoString(&buf, fs_deparse(core, rel));
	else
		appendStringInfo(&buf, "(%s)", fs_deparse(tenant, rel));
	appendStringInfo(&buf, ", %s)", fs_deparse_order(order, rel, true));
	if (ready_filter != NULL)
		appendStringInfo(&buf, " WHERE %s", ready_filter);
	return buf.data;
}

/* ----------------------------------------------------------------
 * Running SQL
 * ----------------------------------------------------------------
 */

/* Run `sql` (SPI connected) with the fixed search_path; returns SPI's code. */
static int
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

static const char *
fs_ext_schema(void)
{
	return quote_identifier(fs_extension_schema());
}

/* ----------------------------------------------------------------
 * Triggers
 * ----------------------------------------------------------------
 */

/* Add the columns `text` (compiled against rel) reads to *cols. */
static void
fs_add_columns(Bitmapset **cols, const char *text, Relation rel, FsExprRole role,
			   const char *queue)
{
	int			nest;
	Node	   *expr;

	if (text == NULL)
		return;
	nest = fs_search_path_begin();
	expr = fs_compile(text, rel, role, queue);
	fs_search_path_end(nest);
	pull_varattnos(expr, 1, cols);
}

/* " OF a, b" for the columns in cols, or "" when a whole row is read. */
static char *
fs_update_of(Bitmapset *cols, Relation rel)
{
	StringInfoData buf;
	int			attno = -1;

	if (bms_is_member(0 - FirstLowInvalidHeapAttributeNumber, cols))
		return "";
	initStringInfo(&buf);
	while ((attno = bms_next_member(cols, attno)) >= 0)
	{
		AttrNumber	a = attno + FirstLowInvalidHeapAttributeNumber;

		appendStringInfoString(&buf, buf.len == 0 ? " OF " : ", ");
		appendStringInfoString(&buf, quote_identifier(get_attname(RelationGetRelid(rel), a, false)));
	}
	return buf.data;
}

/* Drop trigger `name` of relid if there is one, and it must be ours. */
static void
fs_drop_trigger(Oid relid, const char *name, const char *function)
{
	Oid			argtypes[2] = {OIDOID, TEXTOID};
	Datum		values[2];
	bool		isnull;
	bool		ours;

	values[0] = ObjectIdGetDatum(relid);
	values[1] = CStringGetTextDatum(name);
	fs_spi(psprintf("SELECT t.tgfoid = '%s.%s'::pg_catalog.regproc FROM pg_catalog.pg_trigger t"
					" WHERE t.tgrelid = $1 AND t.tgname = $2",
					fs_ext_schema(), function),
		   2, argtypes, values, NULL, false);
	if (SPI_processed == 0)
		return;
	ours = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (!ours)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("table %s already has a trigger named \"%s\"",
						get_rel_name(relid), name),
				 errhint("fairshare needs that name for its own trigger; rename yours.")));
	fs_spi(psprintf("DROP TRIGGER %s ON %s", quote_identifier(name),
					fs_qualified_name(relid)),
		   0, NULL, NULL, NULL, false);
}

/* A row trigger and a TRUNCATE trigger on `table`. */
static void
fs_create_triggers(const char *table, const char *name, const char *events, const char *update_of,
				   const char *function, const char *truncate_name, const char *role)
{
	fs_spi(psprintf("CREATE TRIGGER %s AFTER %s%s ON %s FOR EACH ROW EXECUTE FUNCTION %s.%s()",
					name, events, update_of, table, fs_ext_schema(), function),
		   0, NULL, NULL, NULL, false);
	fs_spi(psprintf("CREATE TRIGGER %s AFTER TRUNCATE ON %s"
					" FOR EACH STATEMENT EXECUTE FUNCTION %s.fs_fair_truncate_trigger('%s')",
					truncate_name, table, fs_ext_schema(), role),
		   0, NULL, NULL, NULL, false);
}

/*
 * Make relid's fairshare triggers match the registrations that use it: the
 * ready-row trigger fires on INSERT, DELETE and UPDATE of the columns any
 * registration's tenant, filter, key or cost reads; the running-row trigger
 * on DELETE and UPDATE of the columns of running_filter and running_key.
 */
static void
fs_sync_triggers(Oid relid)
{
	Relation	rel;
	Oid			argtypes[1] = {REGCLASSOID};
	Datum		values[1];
	Bitmapset  *ready_cols = NULL;
	Bitmapset  *running_cols = NULL;
	bool		any_ready = false;
	bool		any_running = false;
	const char *table;
	const char *ready_of;
	const char *running_of;
	uint64		r;
	SPITupleTable *tuptable;

	if (get_rel_name(relid) == NULL)
		return;					/* dropped: its triggers went with it */
	rel = relation_open(relid, AccessShareLock);
	table = fs_qualified_name(relid);

	values[0] = ObjectIdGetDatum(relid);
	fs_spi(psprintf("SELECT queue, ready_table = $1, running_table = $1, tenant, ready_filter,"
					" key, cost, running_filter, running_key"
					"  FROM %s.fs_fair_queues WHERE ready_table = $1 OR running_table = $1",
					fs_ext_schema()),
		   1, argtypes, values, NULL, false);
	tuptable = SPI_tuptable;
	for (r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tuple = tuptable->vals[r];
		TupleDesc	desc = tuptable->tupdesc;
		char	   *queue = SPI_getvalue(tuple, desc, 1);
		bool		isnull;

		if (DatumGetBool(SPI_getbinval(tuple, desc, 2, &isnull)))
		{
			any_ready = true;
			fs_add_columns(&ready_cols, SPI_getvalue(tuple, desc, 4), rel, FS_EXPR_TENANT, queue);
			fs_add_columns(&ready_cols, SPI_getvalue(tuple, desc, 5), rel, FS_EXPR_FILTER, queue);
			fs_add_columns(&ready_cols, SPI_getvalue(tuple, desc, 6), rel, FS_EXPR_KEY, queue);
			fs_add_columns(&ready_cols, SPI_getvalue(tuple, desc, 7), rel, FS_EXPR_COST, queue);
		}
		if (DatumGetBool(SPI_getbinval(tuple, desc, 3, &isnull)) && !isnull)
		{
			any_running = true;
			fs_add_columns(&running_cols, SPI_getvalue(tuple, desc, 8), rel,
						   FS_EXPR_RUNNING_FILTER, queue);
			fs_add_columns(&running_cols, SPI_getvalue(tuple, desc, 9), rel,
						   FS_EXPR_RUNNING_KEY, queue);
		}
	}

	ready_of = fs_update_of(ready_cols, rel);
	running_of = fs_update_of(running_cols, rel);
	/* DDL on the table needs it closed (it stays locked). */
	relation_close(rel, NoLock);

	fs_drop_trigger(relid, FS_TRIGGER_READY, "fs_fair_ready_trigger");
	fs_drop_trigger(relid, FS_TRIGGER_READY_T, "fs_fair_truncate_trigger");
	fs_drop_trigger(relid, FS_TRIGGER_RUN, "fs_fair_running_trigger");
	fs_drop_trigger(relid, FS_TRIGGER_RUN_T, "fs_fair_truncate_trigger");
	if (any_ready)
		fs_create_triggers(table, FS_TRIGGER_READY, "INSERT OR DELETE OR UPDATE", ready_of,
						   "fs_fair_ready_trigger", FS_TRIGGER_READY_T, "ready");
	if (any_running)
		fs_create_triggers(table, FS_TRIGGER_RUN, "DELETE OR UPDATE", running_of,
						   "fs_fair_running_trigger", FS_TRIGGER_RUN_T, "running");
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
static HeapTuple
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

static Oid
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

/*
 * fs_register_queue(queue, ready_table, tenant, order_by, filter, key,
 *					 running_table, running_filter, running_key, cost,
 *					 charge_runtime, create_index, enqueued_at) RETURNS fs_fair_queues
 */
Datum
fs_register_queue(PG_FUNCTION_ARGS)
{
	char		queue[FS_NAME_BUFLEN];
	Oid			ready_relid;
	Oid			running_relid = InvalidOid;
	char	   *tenant_text;
	char	   *order_text;
	char	   *filter_text;
	char	   *key_text;
	char	   *running_filter_text;
	char	   *running_key_text;
	char	   *cost_text;
	char	   *enqueued_at_text;
	bool		charge_runtime;
	bool		create_index;
	Relation	ready;
	Relation	running = NULL;
	Node	   *tenant;
	List	   *order;
	List	   *ready_quals = NIL;
	List	   *claim_quals = NIL;
	Node	   *key;
	Node	   *running_key = NULL;
	Node	   *running_filter = NULL;
	Node	   *cost = NULL;
	Node	   *enqueued_at = NULL;
	char	   *c_ready_filter = NULL;
	char	   *c_claim_filter = NULL;
	char	   *c_tenant;
	char	   *c_order;
	char	   *c_key;
	char	   *c_cost = NULL;
	char	   *c_enqueued_at = NULL;
	char	   *c_running_filter = NULL;
	char	   *c_running_key = NULL;
	char	   *index_name = NULL;
	char	   *index_sql = NULL;
	Oid			namespace;
	Oid			key_type;
	Oid			indexoid;
	bool		index_created = false;
	bool		key_unique;
	FsRunAs		as_owner;
	Oid			old_ready = InvalidOid;
	Oid			old_running = InvalidOid;
	Oid			old_index = InvalidOid;
	bool		old_index_created = false;
	HeapTuple	old;
	TupleDesc	old_desc;
	ListCell   *lc;
	StringInfoData sql;
	Oid			argtypes[20];
	Datum		values[20];
	char		nulls[20];
	int			nargs = 0;
	HeapTupleHeader result;

	fs_check_loaded();
	fs_name_arg(fcinfo, 0, "queue", queue);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ready_table must not be null"),
				 errhint("Pass the table that holds the ready rows, for example 'solid_queue_ready_executions'.")));
	ready_relid = PG_GETARG_OID(1);
	tenant_text = fs_text_arg(fcinfo, 2, "tenant", true);
	order_text = fs_text_arg(fcinfo, 3, "order_by", true);
	filter_text = fs_text_arg(fcinfo, 4, "filter", false);
	key_text = fs_text_arg(fcinfo, 5, "key", false);
	if (!PG_ARGISNULL(6))
		running_relid = PG_GETARG_OID(6);
	running_filter_text = fs_text_arg(fcinfo, 7, "running_filter", false);
	running_key_text = fs_text_arg(fcinfo, 8, "running_key", false);
	cost_text = fs_text_arg(fcinfo, 9, "cost", false);
	charge_runtime = fs_bool_arg(fcinfo, 10, "charge_runtime");
	create_index = fs_bool_arg(fcinfo, 11, "create_index");
	enqueued_at_text = fs_text_arg(fcinfo, 12, "enqueued_at", false);

	if (!OidIsValid(running_relid) && (running_filter_text || running_key_text))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("running_filter and running_key of queue \"%s\" need a running_table", queue),
				 errhint("Pass running_table => the table whose rows mark a claimed row as running.")));
	if (!OidIsValid(running_relid) && charge_runtime)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("charge_runtime of queue \"%s\" needs a running_table", queue),
				 errhint("Run time is measured when a claimed row leaves the running table; pass running_table.")));

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	ready = fs_open_table(ready_relid, "ready_table", queue);
	if (OidIsValid(running_relid))
		running = running_relid == ready_relid ? ready :
			fs_open_table(running_relid, "running_table", queue);

	/* Re-registering a queue is for whoever may change its current table. */
	old = fs_registration_row(queue, &old_desc);
	if (old != NULL)
	{
		bool		isnull;

		old_ready = fs_row_oid(old, old_desc, "ready_table");
		old_running = fs_row_oid(old, old_desc, "running_table");
		old_index = fs_row_oid(old, old_desc, "ready_index");
		old_index_created = DatumGetBool(SPI_getbinval(old, old_desc,
													   SPI_fnumber(old_desc, "index_created"),
													   &isnull));
		fs_check_may_replace(old, old_desc, queue, "register it again");
	}

	/* Parsed with the caller's search_path: names mean what the caller means. */
	tenant = fs_compile(tenant_text, ready, FS_EXPR_TENANT, queue);
	order = fs_compile_order(order_text, ready, queue);
	if (filter_text != NULL)
	{
		Node	   *filter = fs_compile(filter_text, ready, FS_EXPR_FILTER, queue);

		foreach(lc, make_ands_implicit((Expr *) filter))
		{
			Node	   *qual = lfirst(lc);

			if (contain_mutable_functions(qual))
				claim_quals = lappend(claim_quals, qual);
			else
				ready_quals = lappend(ready_quals, qual);
		}
	}
	if (key_text == NULL)
		key_text = fs_primary_key(ready, queue);
	key = fs_compile(key_text, ready, FS_EXPR_KEY, queue);
	if (cost_text != NULL)
		cost = fs_compile(cost_text, ready, FS_EXPR_COST, queue);
	if (enqueued_at_text != NULL)
		enqueued_at = fs_compile(enqueued_at_text, ready, FS_EXPR_ENQUEUED_AT, queue);
	if (running != NULL)
	{
		running_key = fs_compile(running_key_text ? running_key_text : key_text, running,
								 FS_EXPR_RUNNING_KEY, queue);
		if (exprType(running_key) != exprType(key))
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("running_key of queue \"%s\" is %s, but its key is %s", queue,
							format_type_be(exprType(running_key)), format_type_be(exprType(key))),
					 errhint("running_key must give the same value as key for the same job.")));
		if (running_filter_text != NULL)
			running_filter = fs_compile(running_filter_text, running, FS_EXPR_RUNNING_FILTER, queue);
	}

	/* Canonical texts. */
	if (ready_quals != NIL)
		c_ready_filter = fs_deparse((Node *) make_ands_explicit(ready_quals), ready);
	if (claim_quals != NIL)
		c_claim_filter = fs_deparse((Node *) make_ands_explicit(claim_quals), ready);

	c_tenant = fs_deparse(tenant, ready);
	c_order = fs_deparse_order(order, ready, false);
	c_key = fs_deparse(key, ready);
	if (cost != NULL)
		c_cost = fs_deparse(cost, ready);
	if (enqueued_at != NULL)
		c_enqueued_at = fs_deparse(enqueued_at, ready);
	if (running_filter != NULL)
		c_running_filter = fs_deparse(running_filter, running);
	if (running_key != NULL)
		c_running_key = fs_deparse(running_key, running);

	/*
	 * The key must tell rows apart, and the index the claim query walks.
	 * Both compare the registration's expressions with the table's indexes
	 * (folding constants, which runs immutable functions, possibly the
	 * owner's), as the table's owner in a security-restricted operation, as
	 * CREATE INDEX evaluates index expressions (run_as.c).
	 */
	fs_run_as_begin(&as_owner, ready->rd_rel->relowner, 0);
	key_unique = fs_key_is_unique(ready, key);
	indexoid = key_unique ? fs_find_index(ready, tenant, order, ready_quals) : InvalidOid;
	fs_run_as_end(&as_owner);
	if (!key_unique)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("key \"%s\" of queue \"%s\" is not guaranteed to be unique and not null",
						c_key, queue),
				 errdetail("A claimed row's lease is released by its key: rows sharing a key, or "
						   "with a NULL key, would keep their leases until they expire."),
				 errhint("Use the primary key (leave key out), or a key with a unique index on "
						 "exactly it and NOT NULL columns, for example: CREATE UNIQUE INDEX ON %s "
						 "(%s); ALTER TABLE %s ALTER COLUMN ... SET NOT NULL.",
						 fs_qualified_name(ready_relid),
						 IsA(fs_strip_relabel(key), Var) ? c_key : psprintf("(%s)", c_key),
						 fs_qualified_name(ready_relid))));
	if (!OidIsValid(indexoid))
	{
		index_name = ChooseRelationName(RelationGetRelationName(ready), NULL, "fs_fair",
										RelationGetNamespace(ready), false);
		index_sql = fs_index_definition(ready, index_name, tenant, order, c_ready_filter);
	}
	namespace = RelationGetNamespace(ready);
	key_type = exprType(key);

	/* DDL on the tables needs them closed (they stay locked). */
	if (running != NULL && running != ready)
		relation_close(running, NoLock);
	relation_close(ready, NoLock);

	if (index_sql != NULL && create_index)
	{
		fs_create_index(queue, ready_relid, index_sql);
		indexoid = get_relname_relid(index_name, namespace);
		index_created = true;
	}
	else if (index_sql != NULL)
		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("table %s has no index that serves fair claims of queue \"%s\"",
						get_rel_name(ready_relid), queue),
				 errhint("Create it, for example: %s", index_sql)));

	/* The row, as the extension's owner (the caller's rights were checked). */
	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "INSERT INTO %s.fs_fair_queues AS q (queue, ready_table, tenant, order_by,"
					 " ready_filter, claim_filter, key, key_type, running_table, running_filter,"
					 " running_key, cost, charge_runtime, ready_index, index_created, registered_by,"
					 " enqueued_at)"
					 " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)"
					 " ON CONFLICT (queue) DO UPDATE SET ready_table = EXCLUDED.ready_table,"
					 " tenant = EXCLUDED.tenant, order_by = EXCLUDED.order_by,"
					 " ready_filter = EXCLUDED.ready_filter, claim_filter = EXCLUDED.claim_filter,"
					 " key = EXCLUDED.key, key_type = EXCLUDED.key_type,"
					 " running_table = EXCLUDED.running_table,"
					 " running_filter = EXCLUDED.running_filter, running_key = EXCLUDED.running_key,"
					 " cost = EXCLUDED.cost, charge_runtime = EXCLUDED.charge_runtime,"
					 " ready_index = EXCLUDED.ready_index, index_created = EXCLUDED.index_created,"
					 " registered_by = EXCLUDED.registered_by, registered_at = pg_catalog.now(),"
					 " enqueued_at = EXCLUDED.enqueued_at",
					 fs_ext_schema());
#define FS_ARG(type, value, isnull) \
	(argtypes[nargs] = (type), values[nargs] = (value), nulls[nargs++] = (isnull) ? 'n' : ' ')
	FS_ARG(TEXTOID, CStringGetTextDatum(queue), false);
	FS_ARG(REGCLASSOID, ObjectIdGetDatum(ready_relid), false);
	FS_ARG(TEXTOID, CStringGetTextDatum(c_tenant), false);
	FS_ARG(TEXTOID, CStringGetTextDatum(c_order), false);
	FS_ARG(TEXTOID, c_ready_filter ? CStringGetTextDatum(c_ready_filter) : (Datum) 0, !c_ready_filter);
	FS_ARG(TEXTOID, c_claim_filter ? CStringGetTextDatum(c_claim_filter) : (Datum) 0, !c_claim_filter);
	FS_ARG(TEXTOID, CStringGetTextDatum(c_key), false);
	FS_ARG(REGTYPEOID, ObjectIdGetDatum(key_type), false);
	FS_ARG(REGCLASSOID, ObjectIdGetDatum(running_relid), !OidIsValid(running_relid));
	FS_ARG(TEXTOID, c_running_filter ? CStringGetTextDatum(c_running_filter) : (Datum) 0,
		   c_running_filter == NULL);
	FS_ARG(TEXTOID, c_running_key ? CStringGetTextDatum(c_running_key) : (Datum) 0,
		   c_running_key == NULL);
	FS_ARG(TEXTOID, c_cost ? CStringGetTextDatum(c_cost) : (Datum) 0, c_cost == NULL);
	FS_ARG(BOOLOID, BoolGetDatum(charge_runtime), false);
	FS_ARG(REGCLASSOID, ObjectIdGetDatum(indexoid), !OidIsValid(indexoid));
	FS_ARG(BOOLOID, BoolGetDatum(index_created), false);
	FS_ARG(REGROLEOID, ObjectIdGetDatum(GetUserId()), false);
	FS_ARG(TEXTOID, c_enqueued_at ? CStringGetTextDatum(c_enqueued_at) : (Datum) 0,
		   c_enqueued_at == NULL);
#undef FS_ARG
	fs_spi_as_extension_owner(sql.data, nargs, argtypes, values, nulls);

	/* An index this queue created before and no longer uses. */
	if (old_index_created && old_index != indexoid)
		fs_drop_created_index(old_index, queue);

	/* Triggers on every table the old and new registration touch. */
	fs_sync_triggers(ready_relid);
	if (OidIsValid(running_relid) && running_relid != ready_relid)
		fs_sync_triggers(running_relid);
	if (OidIsValid(old_ready) && old_ready != ready_relid && old_ready != running_relid)
		fs_sync_triggers(old_ready);
	if (OidIsValid(old_running) && old_running != ready_relid && old_running != running_relid &&
		old_running != old_ready)
		fs_sync_triggers(old_running);

	fs_track_registration_changed(queue, false);

	old = fs_registration_row(queue, &old_desc);
	if (old == NULL)
		elog(ERROR, "the registration of queue \"%s\" was not stored", queue);
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

	fs_check_loaded();
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
	fs_unregister_row(old, old_desc, queue);
	SPI_finish();
	PG_RETURN_BOOL(true);
}

/*
 * Remove the registration `old` of `queue`: its row, the index it created,
 * its triggers (on whichever of its tables still exists), and, when this
 * transaction commits, its state in shared memory.  SPI connected.
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
	if (index_created)
		fs_drop_created_index(indexoid, queue);
	fs_sync_triggers(ready_relid);
	if (OidIsValid(running_relid) && running_relid != ready_relid)
		fs_sync_triggers(running_relid);
	/* Not preloaded: no state in shared memory to forget. */
	if (fs_fair != NULL)
		fs_track_registration_changed(queue, true);
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

/* ----------------------------------------------------------------
 * Caches: registrations by queue, triggers' view by relation
 * ----------------------------------------------------------------
 */

/*
 * A relation changed (or everything, for InvalidOid): the registrations and
 * row-trigger caches built on it must be built again before their next use.
 */
static void
fs_invalidate_caches(Oid relid)
{
	HASH_SEQ_STATUS seq;

	if (fs_descs != NULL)
	{
		FsFairDesc *desc;

		hash_seq_init(&seq, fs_descs);
		while ((desc = hash_seq_search(&seq)) != NULL)
			if (!OidIsValid(relid) || desc->ready_relid == relid || desc->running_relid == relid)
				desc->valid = false;
	}
	if (fs_rel_cache != NULL)
	{
		FsRelTriggers *rt;

		/* Partitions compile against themselves: any change may matter. */
		hash_seq_init(&seq, fs_rel_cache);
		while ((rt = hash_seq_search(&seq)) != NULL)
			rt->valid = false;
	}
}

static void
fs_relcache_callback(Datum arg pg_attribute_unused(), Oid relid)
{
	fs_invalidate_caches(relid);
}

void
fs_fair_register_init(void)
{
	CacheRegisterRelcacheCallback(fs_relcache_callback, (Datum) 0);
}

/* Forget every cached registration (this transaction changed them). */
void
fs_fair_invalidate_all(void)
{
	fs_invalidate_caches(InvalidOid);
}

/*
 * Prepare one of a queue's queries.  An error (a column the registration
 * uses was renamed, no USAGE on the table's schema, ...) is reported by
 * fs_fair_query_error(): by queue and piece, without the query's text.
 */
static SPIPlanPtr
fs_prepare(FsFairDesc *desc, FsQueryText *q, int nargs, Oid *argtypes, const char *what)
{
	MemoryContext cxt = CurrentMemoryContext;
	SPIPlanPtr	volatile plan = NULL;

	PG_TRY();
	{
		int			nest = fs_search_path_begin();

		plan = SPI_prepare(q->sql, nargs, argtypes);
		fs_search_path_end(nest);
		if (plan == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not prepare the query: %s",
							SPI_result_code_string(SPI_result))));
	}
	PG_CATCH();
	{
		fs_fair_query_error(cxt, desc, q, what);
	}
	PG_END_TRY();
	SPI_keepplan(plan);
	return plan;
}

/* Free a cached registration: its prepared plans, then its memory. */
static void
fs_desc_free(FsFairDesc *desc)
{
	if (desc->claim_plan)
		SPI_freeplan(desc->claim_plan);
	if (desc->fifo_plan)
		SPI_freeplan(desc->fifo_plan);
	if (desc->count_plan)
		SPI_freeplan(desc->count_plan);
	if (desc->latency_plan)
		SPI_freeplan(desc->latency_plan);
	desc->claim_plan = desc->fifo_plan = desc->count_plan = desc->latency_plan = NULL;
	memset(&desc->claim_q, 0, sizeof(FsQueryText));
	memset(&desc->fifo_q, 0, sizeof(FsQueryText));
	memset(&desc->count_q, 0, sizeof(FsQueryText));
	memset(&desc->latency_q, 0, sizeof(FsQueryText));
	if (desc->cxt)
		MemoryContextDelete(desc->cxt);
	desc->cxt = NULL;
}

/* Append SQL of fairshare's own to q's text. */
static void
fs_q_sql(StringInfo buf, const char *sql)
{
	appendStringInfoString(buf, sql);
}

/* Append `text`, which is the registration's `piece`, to q's text. */
static void
fs_q_piece(FsQueryText *q, StringInfo buf, const char *piece, const char *text)
{
	int			start = buf->len;

	appendStringInfoString(buf, text);
	if (q->nspans < FS_QUERY_MAX_SPANS)
	{
		q->spans[q->nspans].start = start;
		q->spans[q->nspans].end = buf->len;
		q->spans[q->nspans].piece = piece;
		q->nspans++;
	}
}

/* Start q's text (in the desc's memory). */
static void
fs_q_begin(FsFairDesc *desc, FsQueryText *q, StringInfo buf)
{
	MemoryContext old = MemoryContextSwitchTo(desc->cxt);

	initStringInfo(buf);
	MemoryContextSwitchTo(old);
	q->nspans = 0;
	q->sql = NULL;
}

/* Finish q's text. */
static void
fs_q_end(FsQueryText *q, StringInfo buf)
{
	q->sql = buf->data;
}

/* " AND (f)" for each filter present. */
static void
fs_q_where_tail(FsFairDesc *desc, FsQueryText *q, StringInfo buf, bool with_claim_filter)
{
	if (desc->ready_filter)
	{
		fs_q_sql(buf, " AND (");
		fs_q_piece(q, buf, "filter", desc->ready_filter);
		fs_q_sql(buf, ")");
	}
	if (with_claim_filter && desc->claim_filter)
	{
		fs_q_sql(buf, " AND (");
		fs_q_piece(q, buf, "filter", desc->claim_filter);
		fs_q_sql(buf, ")");
	}
}

/* "(cost)::float8", or NULL::float8 without a cost. */
static void
fs_q_cost(FsFairDesc *desc, FsQueryText *q, StringInfo buf)
{
	if (desc->cost == NULL)
	{
		fs_q_sql(buf, "NULL::pg_catalog.float8");
		return;
	}
	fs_q_sql(buf, "((");
	fs_q_piece(q, buf, "cost", desc->cost);
	fs_q_sql(buf, "))::pg_catalog.float8");
}

/* "FROM <ready table> fairshare_row" */
static void
fs_q_from(FsFairDesc *desc, FsQueryText *q, StringInfo buf)
{
	fs_q_sql(buf, " FROM ");
	fs_q_piece(q, buf, "ready_table", desc->ready_name);
	fs_q_sql(buf, " " FS_ROW_ALIAS);
}

/* "(<piece>)" */
static void
fs_q_paren(FsQueryText *q, StringInfo buf, const char *piece, const char *text)
{
	fs_q_sql(buf, "(");
	fs_q_piece(q, buf, piece, text);
	fs_q_sql(buf, ")");
}

/*
 * The claim queries.  $3 (fifo: $2) is an array of keys this transaction
 * claimed before and still holds: its own row locks do not make SKIP LOCKED
 * skip them, so they are left out by key (NULL when there are none).
 *
 * A tenant's rows are matched with tenant >= $t AND tenant <= $t (the same
 * rows as tenant = $t, under any btree collation) and ordered by the tenant
 * first: with an equality the planner treats the tenant as a constant and
 * may walk another index in the order's order, filtering out every row of a
 * tenant that holds most of the table (its statistics say every row
 * matches); as a range, only the (tenant, order) index gives the order, so
 * each probe reads just the rows it returns.
 *
 * Each text records which piece of the registration each part came from.
 */
static void
fs_desc_prepare(FsFairDesc *desc)
{
	Oid			keys_type = get_array_type(desc->key_type);
	Oid			claim_types[3] = {TEXTARRAYOID, INT4ARRAYOID, keys_type};
	Oid			fifo_types[2] = {INT8OID, keys_type};
	StringInfoData buf;
	FsQueryText *q;

	q = &desc->claim_q;
	fs_q_begin(desc, q, &buf);
	fs_q_sql(&buf, "SELECT p.fs_ord, s.fs_key, s.fs_cost, s.fs_row"
			 "  FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]),"
			 " pg_catalog.unnest($2::pg_catalog.int4[]))"
			 "       WITH ORDINALITY AS p(fs_tenant, fs_n, fs_ord)"
			 " CROSS JOIN LATERAL ("
			 "   SELECT ");
	fs_q_paren(q, &buf, "key", desc->key);
	fs_q_sql(&buf, " AS fs_key, ");
	fs_q_cost(desc, q, &buf);
	fs_q_sql(&buf, " AS fs_cost, " FS_ROW_ALIAS " AS fs_row");
	fs_q_from(desc, q, &buf);
	fs_q_sql(&buf, "    WHERE ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, " OPERATOR(pg_catalog.>=) p.fs_tenant AND ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, " OPERATOR(pg_catalog.<=) p.fs_tenant");
	fs_q_where_tail(desc, q, &buf, true);
	fs_q_sql(&buf, "      AND ($3 IS NULL OR ");
	fs_q_paren(q, &buf, "key", desc->key);
	fs_q_sql(&buf, " <> ALL ($3))    ORDER BY ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, ", ");
	fs_q_piece(q, &buf, "order_by", desc->order_by);
	fs_q_sql(&buf, "    LIMIT p.fs_n      FOR UPDATE OF " FS_ROW_ALIAS " SKIP LOCKED) s");
	fs_q_end(q, &buf);
	desc->claim_plan = fs_prepare(desc, q, 3, claim_types, "claim query");

	q = &desc->fifo_q;
	fs_q_begin(desc, q, &buf);
	fs_q_sql(&buf, "SELECT ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, " AS fs_tenant, ");
	fs_q_paren(q, &buf, "key", desc->key);
	fs_q_sql(&buf, " AS fs_key, ");
	fs_q_cost(desc, q, &buf);
	fs_q_sql(&buf, " AS fs_cost, " FS_ROW_ALIAS " AS fs_row");
	fs_q_from(desc, q, &buf);
	fs_q_sql(&buf, " WHERE ($2 IS NULL OR ");
	fs_q_paren(q, &buf, "key", desc->key);
	fs_q_sql(&buf, " <> ALL ($2))");
	fs_q_where_tail(desc, q, &buf, true);
	fs_q_sql(&buf, " ORDER BY ");
	fs_q_piece(q, &buf, "order_by", desc->order_by);
	fs_q_sql(&buf, " LIMIT $1 FOR UPDATE OF " FS_ROW_ALIAS " SKIP LOCKED");
	fs_q_end(q, &buf);
	desc->fifo_plan = fs_prepare(desc, q, 2, fifo_types, "fail-open claim query");

	q = &desc->count_q;
	fs_q_begin(desc, q, &buf);
	fs_q_sql(&buf, "SELECT ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, " AS fs_tenant, pg_catalog.count(*)");
	fs_q_from(desc, q, &buf);
	fs_q_sql(&buf, " WHERE true");
	fs_q_where_tail(desc, q, &buf, false);
	fs_q_sql(&buf, " GROUP BY 1");
	fs_q_end(q, &buf);
	desc->count_plan = fs_prepare(desc, q, 0, NULL, "count query");

	if (desc->enqueued_at != NULL)
	{
		q = &desc->latency_q;
		fs_q_begin(desc, q, &buf);
		fs_q_sql(&buf, "SELECT pg_catalog.min(");
		fs_q_piece(q, &buf, "enqueued_at", desc->enqueued_at);
		fs_q_sql(&buf, ")");
		fs_q_from(desc, q, &buf);
		fs_q_sql(&buf, " WHERE true");
		fs_q_where_tail(desc, q, &buf, true);
		fs_q_end(q, &buf);
		desc->latency_plan = fs_prepare(desc, q, 0, NULL, "latency query");
	}
}

/* The piece of the registration at 1-based character `pos` of q's text. */
static const char *
fs_query_piece(const FsQueryText *q, int pos)
{
	const char *p = q->sql;
	int			offset;
	int			i;

	while (*p != '\0' && pos > 1)
	{
		p += pg_mblen(p);
		pos--;
	}
	offset = p - q->sql;
	for (i = 0; i < q->nspans; i++)
		if (offset >= q->spans[i].start && offset < q->spans[i].end)
			return q->spans[i].piece;
	return NULL;
}

/*
 * Report the error being handled (call it in a PG_CATCH block, with the
 * memory context that was current at PG_TRY) as an error of queue `desc`'s
 * `what` ("claim query", ...) and, when its position says so, of the piece
 * of the registration: fairshare's query text, its positions in it and the
 * context line quoting it are left out.  The SQLSTATE, detail and the
 * error's fields are kept; user code's own context lines too.  A cancel or
 * other interruption keeps its message.  Only copies strings: nothing here
 * touches the database before the error propagates.
 */
void
fs_fair_query_error(MemoryContext cxt, const FsFairDesc *desc, const FsQueryText *q,
					const char *what)
{
	ErrorData  *edata;
	const char *piece = NULL;
	const char *hint = NULL;
	char	   *inner = NULL;
	bool		ours;
	int			category;
	bool		interruption;

	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	FlushErrorState();

	ours = q != NULL && q->sql != NULL && edata->internalquery != NULL &&
		strcmp(edata->internalquery, q->sql) == 0;
	if (ours && edata->internalpos > 0)
		piece = fs_query_piece(q, edata->internalpos);

	/* Context lines inside our query (user functions) stay; ours does not. */
	if (edata->context != NULL && q != NULL && q->sql != NULL)
	{
		char	   *at = strstr(edata->context, q->sql);

		if (at != NULL)
		{
			while (at > edata->context && at[-1] != '\n')
				at--;
			if (at > edata->context + 1)
				inner = pnstrdup(edata->context, at - edata->context - 1);
		}
	}

	category = ERRCODE_TO_CATEGORY(edata->sqlerrcode);
	interruption = category == ERRCODE_OPERATOR_INTERVENTION ||
		category == ERRCODE_INSUFFICIENT_RESOURCES ||
		category == ERRCODE_TRANSACTION_ROLLBACK ||
		category == ERRCODE_PROGRAM_LIMIT_EXCEEDED ||
		category == ERRCODE_SYSTEM_ERROR ||
		category == ERRCODE_INTERNAL_ERROR;
	if (edata->sqlerrcode == ERRCODE_INSUFFICIENT_PRIVILEGE)
		hint = psprintf("The queue's queries run with the rights of the role that claims (a "
						"recount: of the table's owner); grant it USAGE on schema %s and EXECUTE "
						"on the functions the registration's expressions call.",
						desc->ready_schema ? desc->ready_schema : "of the table");
	else if (category == ERRCODE_SYNTAX_ERROR_OR_ACCESS_RULE_VIOLATION)
		hint = psprintf("The table or a function the registration uses changed since; register "
						"the queue again with fs_register_queue() after changing the table.");
	else if (edata->hint != NULL)
		hint = edata->hint;
	else if (!interruption)
		hint = psprintf("An expression of the registration failed on a row of %s; fix the row, "
						"or register the queue again with expressions that do not fail.",
						desc->ready_name ? desc->ready_name : "the table");

	ereport(ERROR,
			(errcode(edata->sqlerrcode),
			 interruption ? errmsg_internal("%s", edata->message) :
			 errmsg("%s of queue \"%s\": %s", piece ? piece : what, desc->queue_name,
					edata->message),
			 edata->detail ? errdetail_internal("%s", edata->detail) : 0,
			 edata->detail_log ? errdetail_log("%s", edata->detail_log) : 0,
			 hint ? errhint("%s", hint) : 0,
			 (!ours && edata->internalquery) ? internalerrquery(edata->internalquery) : 0,
			 (!ours && edata->internalquery) ? internalerrposition(edata->internalpos) : 0,
			 inner ? errcontext("%s", inner) : 0,
			 interruption ? errcontext("%s of queue \"%s\"", what, desc->queue_name) : 0,
			 edata->schema_name ? err_generic_string(PG_DIAG_SCHEMA_NAME, edata->schema_name) : 0,
			 edata->table_name ? err_generic_string(PG_DIAG_TABLE_NAME, edata->table_name) : 0,
			 edata->column_name ? err_generic_string(PG_DIAG_COLUMN_NAME, edata->column_name) : 0,
			 edata->datatype_name ? err_generic_string(PG_DIAG_DATATYPE_NAME, edata->datatype_name) : 0,
			 edata->constraint_name ? err_generic_string(PG_DIAG_CONSTRAINT_NAME, edata->constraint_name) : 0));
	pg_unreachable();
}

/*
 * fs_claim() and fs_ready_tenants() read the queue's table: without USAGE
 * on its schema, PostgreSQL would not let the caller name it.  (A query
 * prepared by another role of this backend would not check it again.)
 */
void
fs_fair_check_schema_usage(FsFairDesc *desc, const char *function)
{
	Oid			nsp = get_rel_namespace(desc->ready_relid);

	if (pg_namespace_aclcheck(nsp, GetUserId(), ACL_USAGE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for schema %s of queue \"%s\"", desc->ready_schema,
						desc->queue_name),
				 errhint("%s() reads the queue's table %s: grant USAGE on schema %s to the role "
						 "that calls it.", function, desc->ready_name, desc->ready_schema)));
}

/*
 * A stored expression as the claim queries use it: compiled against `rel`
 * and deparsed again with the ready table called FS_ROW_ALIAS, as it is in
 * every query.  The stored text calls it by its own name, which a whole-row
 * reference ("f(jobs.*)") keeps and the queries would not resolve; column
 * references come out the same.
 */
static char *
fs_row_text(HeapTuple row, TupleDesc rowdesc, const char *column, Relation rel,
			FsExprRole role, const char *queue, MemoryContext cxt, Oid *type)
{
	char	   *text = SPI_getvalue(row, rowdesc, SPI_fnumber(rowdesc, column));
	List	   *dpcontext = deparse_context_for(FS_ROW_ALIAS, RelationGetRelid(rel));
	StringInfoData buf;
	ListCell   *lc;

	MemoryContext ecxt = CurrentMemoryContext;
	List	   *order = NIL;

	if (text == NULL)
		return NULL;

	/*
	 * What the registration says no longer compiles (a column renamed, a
	 * function dropped): say which queue and piece, and what to do, without
	 * the text fairshare parsed.  Interruptions stay as they are.
	 */
	PG_TRY();
	{
		if (role != FS_EXPR_ORDER)
		{
			Node	   *expr = fs_compile(text, rel, role, queue);

			if (type != NULL)
				*type = exprType(expr);
			text = deparse_expression(expr, dpcontext, false, false);
		}
		else
			order = fs_compile_order(text, rel, queue);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(ecxt);
		edata = CopyErrorData();
		if (fs_error_must_propagate(edata->sqlerrcode))
			PG_RE_THROW();
		FlushErrorState();
		ereport(ERROR,
				(errcode(edata->sqlerrcode),
				 errmsg("%s of queue \"%s\": %s", fs_role_names[role], queue, edata->message),
				 edata->detail ? errdetail_internal("%s", edata->detail) : 0,
				 errhint("The table or a function the registration uses changed since; register "
						 "the queue again with fs_register_queue() after changing the table.")));
	}
	PG_END_TRY();
	if (role != FS_EXPR_ORDER)
		return MemoryContextStrdup(cxt, text);
	initStringInfo(&buf);
	foreach(lc, order)
	{
		FsOrderItem *item = lfirst(lc);

		if (buf.len > 0)
			appendStringInfoString(&buf, ", ");
		appendStringInfoString(&buf, deparse_expression(item->expr, dpcontext, false, false));
		if (item->desc)
			appendStringInfoString(&buf, " DESC");
		if (item->nulls == SORTBY_NULLS_FIRST)
			appendStringInfoString(&buf, " NULLS FIRST");
		else if (item->nulls == SORTBY_NULLS_LAST)
			appendStringInfoString(&buf, " NULLS LAST");
	}
	return MemoryContextStrdup(cxt, buf.data);
}

/*
 * The SQL texts of `desc`'s registration, as its queries use them, and its
 * key's type: the key expression's as compiled now, which must still be the
 * registered one (DDL can change it) for the keys of the claim map to mean
 * anything.
 */
static void
fs_desc_texts(FsFairDesc *desc, HeapTuple row, TupleDesc rowdesc)
{
	Relation	rel = relation_open(desc->ready_relid, AccessShareLock);
	const char *queue = desc->queue_name;
	MemoryContext cxt = desc->cxt;
	int			nest = fs_search_path_begin();
	Oid			key_type = InvalidOid;

	desc->tenant = fs_row_text(row, rowdesc, "tenant", rel, FS_EXPR_TENANT, queue, cxt, NULL);
	desc->order_by = fs_row_text(row, rowdesc, "order_by", rel, FS_EXPR_ORDER, queue, cxt, NULL);
	desc->ready_filter = fs_row_text(row, rowdesc, "ready_filter", rel, FS_EXPR_FILTER, queue,
									 cxt, NULL);
	desc->claim_filter = fs_row_text(row, rowdesc, "claim_filter", rel, FS_EXPR_FILTER, queue,
									 cxt, NULL);
	desc->key = fs_row_text(row, rowdesc, "key", rel, FS_EXPR_KEY, queue, cxt, &key_type);
	desc->cost = fs_row_text(row, rowdesc, "cost", rel, FS_EXPR_COST, queue, cxt, NULL);
	desc->enqueued_at = fs_row_text(row, rowdesc, "enqueued_at", rel, FS_EXPR_ENQUEUED_AT,
									queue, cxt, NULL);
	fs_search_path_end(nest);
	relation_close(rel, NoLock);

	desc->key_type = fs_row_oid(row, rowdesc, "key_type");
	if (key_type != desc->key_type)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the key of queue \"%s\" is now of type %s, registered as %s",
						queue, format_type_be(key_type), format_type_be(desc->key_type)),
				 errhint("Register the queue again with fs_register_queue().")));
	get_typlenbyval(desc->key_type, &desc->key_len, &desc->key_byval);
}

/*
 * The registration of `queue_name`, loaded (and its queries prepared) if the
 * cached one is stale.  Not registered: NULL if missing_ok, else an error.
 */
FsFairDesc *
fs_fair_desc(const char *queue_name, bool missing_ok)
{
	FsFairDesc *desc;
	bool		found;
	uint32		generation;
	HeapTuple	row;
	TupleDesc	rowdesc;
	MemoryContext cxt;
	bool		isnull;

	if (fs_descs == NULL)
	{
		HASHCTL		info;

		info.keysize = FS_NAME_BUFLEN;
		info.entrysize = sizeof(FsFairDesc);
		info.hcxt = TopMemoryContext;
		fs_descs = hash_create("fairshare fair queues", 16, &info,
							   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	desc = hash_search(fs_descs, queue_name, HASH_ENTER, &found);
	if (!found)
	{
		memset((char *) desc + FS_NAME_BUFLEN, 0, sizeof(FsFairDesc) - FS_NAME_BUFLEN);
		desc->valid = false;
	}
	generation = pg_atomic_read_u32(&fs_fair->registration_generation);
	if (desc->valid && desc->generation == generation)
		return desc;

	desc->valid = false;
	fs_desc_free(desc);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	row = fs_registration_row(queue_name, &rowdesc);
	if (row == NULL)
	{
		SPI_finish();
		if (missing_ok)
			return NULL;
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("queue \"%s\" is not registered for fair dequeue", queue_name),
				 errhint("Register its table with fs_register_queue().")));
	}

	cxt = AllocSetContextCreate(TopMemoryContext, "fairshare fair queue",
								ALLOCSET_SMALL_SIZES);
	desc->cxt = cxt;
	desc->ready_relid = fs_row_oid(row, rowdesc, "ready_table");
	desc->running_relid = fs_row_oid(row, rowdesc, "running_table");
	if (get_rel_name(desc->ready_relid) == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("the table of queue \"%s\" no longer exists", queue_name),
				 errhint("Unregister the queue with fs_unregister_queue('%s').", queue_name)));
	desc->row_type = get_rel_type_id(desc->ready_relid);
	desc->ready_name = MemoryContextStrdup(cxt, fs_qualified_name(desc->ready_relid));
	desc->ready_schema = MemoryContextStrdup(cxt, quote_identifier(
		get_namespace_name(get_rel_namespace(desc->ready_relid))));
	fs_desc_texts(desc, row, rowdesc);
	desc->charge_runtime = DatumGetBool(SPI_getbinval(row, rowdesc,
													  SPI_fnumber(rowdesc, "charge_runtime"),
													  &isnull));
	desc->queue = fs_queue_lookup(queue_name, true);
	desc->fq = desc->queue != NULL ? fs_fair_queue(desc->queue) : NULL;
	fs_desc_prepare(desc);
	SPI_finish();

	desc->generation = generation;
	desc->valid = true;
	return desc;
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

/* check_functions_in_node() callback: a function outside pg_catalog? */
static bool
fs_func_outside_catalog(Oid funcid, void *context pg_attribute_unused())
{
	return get_func_namespace(funcid) != PG_CATALOG_NAMESPACE;
}

/*
 * Whether evaluating `node` may run code that a role other than a superuser
 * can change: a function or operator (or a type's input/output function)
 * outside pg_catalog, or a domain's constraints.
 */
static bool
fs_runs_user_code(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, CoerceToDomain))
		return true;
	if (check_functions_in_node(node, fs_func_outside_catalog, NULL))
		return true;
	return expression_tree_walker(node, fs_runs_user_code, context);
}

/*
 * Compile one canonical expression for the triggers of `rel`; *user_code is
 * set when it may run code other than pg_catalog's.
 */
static ExprState *
fs_rel_expr(const char *text, Relation rel, FsExprRole role, const char *queue,
			bool *user_code)
{
	Expr	   *expr;

	if (text == NULL)
		return NULL;
	expr = expression_planner((Expr *) fs_compile(text, rel, role, queue));
	if (fs_runs_user_code((Node *) expr, NULL))
		*user_code = true;
	return ExecInitExpr(expr, NULL);
}

/*
 * The type of the keys the triggers make is the type of the key expression
 * as compiled now, never the one stored at registration: DDL on the table
 * (ALTER COLUMN ... TYPE) can change it.  A key whose type is no longer the
 * registered one cannot match the keys claims recorded: an error (which
 * fs_rel_role_guarded() turns into a warning) until the queue is registered
 * again.
 */
static void
fs_rel_key_type(FsRelRole *role, ExprState *key, Oid registered, Relation rel)
{
	if (key == NULL)
		return;
	role->key_type = exprType((Node *) key->expr);
	if (role->key_type != registered)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the key of queue \"%s\" is now of type %s on table %s, registered as %s",
						role->queue_name, format_type_be(role->key_type),
						RelationGetRelationName(rel), format_type_be(registered)),
				 errhint("Register the queue again with fs_register_queue().")));
	get_typlenbyval(role->key_type, &role->key_len, &role->key_byval);
}

/*
 * How a row trigger sees one registration of its table (one row of
 * fs_fair_queues): the queue, and the compiled expressions of the ready side
 * (tenant, filter, cost, key) or of the running side (filter, key), with the
 * role user code runs as.
 */
static void
fs_rel_role(FsRelRole *role, HeapTuple row, TupleDesc rowdesc, Relation rel, bool ready_side)
{
	char	   *queue = SPI_getvalue(row, rowdesc, SPI_fnumber(rowdesc, "queue"));
	bool		isnull;
	bool		user_code = false;

	memset(role, 0, sizeof(*role));
	strlcpy(role->queue_name, queue, FS_NAME_BUFLEN);
	role->queue = fs_queue_lookup(queue, true);
	role->charge_runtime = DatumGetBool(SPI_getbinval(row, rowdesc,
													  SPI_fnumber(rowdesc, "charge_runtime"),
													  &isnull));
	if (ready_side)
	{
		role->tenant = fs_rel_expr(SPI_getvalue(row, rowdesc, SPI_fnumber(rowdesc, "tenant")),
								   rel, FS_EXPR_TENANT, queue, &user_code);
		role->filter = fs_rel_expr(SPI_getvalue(row, rowdesc, SPI_fnumber(rowdesc, "ready_filter")),
								   rel, FS_EXPR_FILTER, queue, &user_code);
		role->cost = fs_rel_expr(SPI_getvalue(row, rowdesc, SPI_fnumber(rowdesc, "cost")),
								 rel, FS_EXPR_COST, queue, &user_code);
		role->key = fs_rel_expr(SPI_getvalue(row, rowdesc, SPI_fnumber(rowdesc, "key")),
								rel, FS_EXPR_KEY, queue, &user_code);
	}
	else
	{
		role->running_filter = fs_rel_expr(SPI_getvalue(row, rowdesc,
														SPI_fnumber(rowdesc, "running_filter")),
										   rel, FS_EXPR_RUNNING_FILTER, queue, &user_code);
		role->running_key = fs_rel_expr(SPI_getvalue(row, rowdesc,
													 SPI_fnumber(rowdesc, "running_key")),
										rel, FS_EXPR_RUNNING_KEY, queue, &user_code);
	}
	fs_rel_key_type(role, ready_side ? role->key : role->running_key,
					fs_row_oid(row, rowdesc, "key_type"), rel);

	/*
	 * Code that the table's owner (or another role) can change runs as the
	 * owner, read-only, in a security-restricted operation (run_as.c), as
	 * in a recount: a superuser's write gives it no privilege, nothing it
	 * does outlives the row, and a row counts the same whoever writes it.
	 */
	role->run_as_owner = user_code ? rel->rd_rel->relowner : InvalidOid;
}

/* What fs_rel_role_one() works on. */
typedef struct FsRelRoleArgs
{
	FsRelRole  *role;
	HeapTuple	row;
	TupleDesc	rowdesc;
	Relation	rel;
	bool		ready_side;
} FsRelRoleArgs;

/* fs_rel_role_guarded()'s work, in its subtransaction. */
static void
fs_rel_role_one(void *arg)
{
	FsRelRoleArgs *a = (FsRelRoleArgs *) arg;

	fs_rel_role(a->role, a->row, a->rowdesc, a->rel, a->ready_side);
}

/*
 * fs_rel_role() in a subtransaction: a registration that no longer compiles
 * against the table (a column it uses was renamed, say) must not make the
 * application's writes fail.  Its rows are then not counted (a warning says
 * so) until the queue is registered again, which recounts it; fs_claim() on
 * it fails with the compile error meanwhile.  Returns false if it failed.
 * A cancel, a timeout or running out of memory still fails the statement
 * (subxact.c).
 */
static bool
fs_rel_role_guarded(FsRelRole *role, HeapTuple row, TupleDesc rowdesc, Relation rel,
					bool ready_side)
{
	FsRelRoleArgs args = {role, row, rowdesc, rel, ready_side};
	ErrorData  *edata;

	if (fs_subxact_run(fs_rel_role_one, &args, NULL, &edata))
		return true;
	ereport(WARNING,
			(errcode(edata->sqlerrcode),
			 errmsg("fair dequeue cannot follow table %s for queue \"%s\": %s",
					RelationGetRelationName(rel), role->queue_name, edata->message),
			 errhint("Register the queue again with fs_register_queue(); it is recounted then.")));
	FreeErrorData(edata);
	return false;
}

/*
 * What the triggers of `rel` evaluate: every registration whose ready or
 * running table is rel or one of its ancestors (a partition fires the
 * triggers cloned from its parent), compiled against rel itself.
 */
FsRelTriggers *
fs_fair_rel_triggers(Relation rel)
{
	Oid			relid = RelationGetRelid(rel);
	FsRelTriggers *rt;
	bool		found;
	uint32		generation;
	List	   *family;
	ArrayType  *oids;
	Datum	   *elems;
	Oid			argtypes[1] = {OIDARRAYOID};
	Datum		values[1];
	MemoryContext old;
	SPITupleTable *tuptable;
	uint64		nrows;
	uint64		r;
	int			nest;
	int			i;
	ListCell   *lc;

	if (fs_rel_cache == NULL)
	{
		HASHCTL		info;

		info.keysize = sizeof(Oid);
		info.entrysize = sizeof(FsRelTriggers);
		info.hcxt = TopMemoryContext;
		fs_rel_cache = hash_create("fairshare fair queue triggers", 16, &info,
								   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	rt = hash_search(fs_rel_cache, &relid, HASH_ENTER, &found);
	if (!found)
	{
		memset((char *) rt + sizeof(Oid), 0, sizeof(FsRelTriggers) - sizeof(Oid));
		rt->valid = false;
	}
	generation = pg_atomic_read_u32(&fs_fair->registration_generation);
	if (rt->valid && rt->generation == generation)
		return rt;

	rt->valid = false;
	if (rt->cxt != NULL)
	{
		if (rt->econtext != NULL)
			FreeExprContext(rt->econtext, true);
		MemoryContextDelete(rt->cxt);
	}
	rt->cxt = NULL;
	rt->econtext = NULL;
	rt->nready = rt->nrunning = 0;

	family = list_make1_oid(relid);
	if (rel->rd_rel->relispartition)
		family = list_concat(family, get_partition_ancestors(relid));
	elems = palloc(sizeof(Datum) * list_length(family));
	i = 0;
	foreach(lc, family)
		elems[i++] = ObjectIdGetDatum(lfirst_oid(lc));
	oids = construct_array(elems, i, OIDOID, sizeof(Oid), true, TYPALIGN_INT);
	values[0] = PointerGetDatum(oids);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	fs_spi(psprintf("SELECT *, ready_table::pg_catalog.oid = ANY ($1) AS fs_is_ready,"
					" coalesce(running_table::pg_catalog.oid = ANY ($1), false) AS fs_is_running"
					"  FROM %s.fs_fair_queues"
					" WHERE ready_table::pg_catalog.oid = ANY ($1)"
					"    OR running_table::pg_catalog.oid = ANY ($1)"
					" ORDER BY queue",
					fs_ext_schema()),
		   1, argtypes, values, NULL, true);
	tuptable = SPI_tuptable;
	nrows = SPI_processed;

	rt->cxt = AllocSetContextCreate(TopMemoryContext, "fairshare fair queue triggers",
									ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(rt->cxt);
	rt->ready = palloc0(sizeof(FsRelRole) * Max(nrows, 1));
	rt->running = palloc0(sizeof(FsRelRole) * Max(nrows, 1));
	nest = fs_search_path_begin();
	for (r = 0; r < nrows; r++)
	{
		HeapTuple	row = tuptable->vals[r];
		TupleDesc	rowdesc = tuptable->tupdesc;
		bool		isnull;

		if (DatumGetBool(SPI_getbinval(row, rowdesc, SPI_fnumber(rowdesc, "fs_is_ready"), &isnull)) &&
			fs_rel_role_guarded(&rt->ready[rt->nready], row, rowdesc, rel, true))
			rt->nready++;
		if (DatumGetBool(SPI_getbinval(row, rowdesc, SPI_fnumber(rowdesc, "fs_is_running"), &isnull)) &&
			fs_rel_role_guarded(&rt->running[rt->nrunning], row, rowdesc, rel, false))
			rt->nrunning++;
	}
	fs_search_path_end(nest);
	rt->econtext = CreateStandaloneExprContext();
	MemoryContextSwitchTo(old);
	SPI_finish();

	rt->generation = generation;
	rt->valid = true;
	return rt;
}

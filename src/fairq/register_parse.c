/*-------------------------------------------------------------------------
 *
 * register_parse.c
 *	  The pieces of a registration: parsing its SQL expressions against the
 *	  table, checking them, and the index a claim uses.
 *
 * See register.c for what a registration is and who may make it.
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

#include "core/cluster.h"
#include "core/subxact.h"
#include "fairq/fairqueue_int.h"
#include "fairq/register_int.h"
#include "limits/limits.h"

/* ----------------------------------------------------------------
 * Parsing what a registration is made of
 * ----------------------------------------------------------------
 */


/* The argument of fs_register_queue() each FsExprRole comes from. */
const char *const fs_role_names[] = {
	"tenant", "order_by", "filter", "key", "cost", "running_filter", "running_key", "enqueued_at",
	"selector", "subkey"
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

/* Refuse a registration piece that is not one SQL expression, saying why. */
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

/* Refuse an expression that is not immutable (it is evaluated by triggers and indexed). */
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

/* Is function `func_id` in a temporary schema (check_functions_in_node callback)? */
static bool
fs_func_is_temp(Oid funcid, void *context pg_attribute_unused())
{
	return isAnyTempNamespace(get_func_namespace(funcid));
}

/* Does the expression call a function of a temporary schema (expression_tree_walker)? */
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
					 errmsg("%s of queue \"%s\" must be text, varchar, an integer or a uuid, not %s",
							ctx->what, ctx->queue, format_type_be(type)),
					 errhint("Cast it to text if its text form is the key, "
							 "for example %s => 'payload->>''account'''.", ctx->what)));
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
 * selector: text (a queue name, a job class), as a claim selects on it
 * (fs_claim()'s selector_in and selector_not_in); strings are converted.
 */
static Node *
fs_coerce_selector(ParseState *pstate, Node *expr, const FsParseContext *ctx)
{
	Oid			type = exprType(expr);

	if (type == TEXTOID)
		return expr;
	if (type == UNKNOWNOID || type == VARCHAROID || type == BPCHAROID || type == NAMEOID)
		return coerce_to_target_type(pstate, expr, type, TEXTOID, -1,
									 COERCION_EXPLICIT, COERCE_EXPLICIT_CAST, -1);
	ereport(ERROR,
			(errcode(ERRCODE_DATATYPE_MISMATCH),
			 errmsg("selector of queue \"%s\" must be text, varchar, char or name, not %s",
					ctx->queue, format_type_be(type)),
			 errhint("Name the column a claim selects rows by, such as selector => 'queue_name'.")));
	return NULL;				/* keep the compiler quiet */
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

/* End a parse of a registration piece: its parse state and error context. */
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
Node *
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
		case FS_EXPR_SUBKEY:
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
		case FS_EXPR_SELECTOR:
			expr = fs_coerce_selector(pstate, expr, &ctx);
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


/*
 * Parse an order_by text into its items (expression, direction, nulls first
 * or last), checked as a claim will use them.
 */
List *
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
char *
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
char *
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
char *
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

/* Refuse a caller that does not own the table (only its owner changes its fair dequeue). */
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
void
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
Relation
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
	/* Citus copies the triggers and index to the shards from there only. */
	if (fs_cluster_is_distributed(relid) && fs_cluster_group() != 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s of queue \"%s\" is distributed by Citus, and this is not the coordinator",
						what, queue_name),
				 errhint("Register the queue on the coordinator: every node then serves the tenants "
						 "whose shards it holds.")));
	fs_fair_check_owner(relid, queue_name);
	return rel;
}

/* The single-column primary key of `rel`, as a column name. */
char *
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

/* The expression under any RelabelType (binary-compatible casts). */
Node *
fs_strip_relabel(Node *node)
{
	while (node != NULL && IsA(node, RelabelType))
		node = (Node *) ((RelabelType *) node)->arg;
	return node;
}

/* An expression as compared with an index's: constants folded, no relabels. */
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
Oid
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
bool
fs_key_is_unique(Relation rel, Node *key, AttrNumber tenant_attnum)
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
			ind->indislive && RelationGetIndexPredicate(idx) == NIL;
		/*
		 * A table Citus distributes has unique indexes that include its
		 * distribution column: there the key is unique with the tenant,
		 * (tenant, key) in either order.
		 */
		if (ok && ind->indnkeyatts == 2 && tenant_attnum > 0)
		{
			AttrNumber	a = ind->indkey.values[0];
			AttrNumber	b = ind->indkey.values[1];
			AttrNumber	k = IsA(core, Var) ? ((Var *) core)->varattno : 0;

			ok = k > 0 && ((a == tenant_attnum && b == k) || (a == k && b == tenant_attnum)) &&
				TupleDescAttr(RelationGetDescr(rel), k - 1)->attnotnull &&
				TupleDescAttr(RelationGetDescr(rel), tenant_attnum - 1)->attnotnull;
		}
		else if (ok && ind->indnkeyatts != 1)
			ok = false;
		else if (ok && ind->indkey.values[0] != 0)
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
char *
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

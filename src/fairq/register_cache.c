/*-------------------------------------------------------------------------
 *
 * register_cache.c
 *	  The per-backend caches of registrations: by queue (for claims and
 *	  recounts) and by relation (for the row triggers), invalidated when a
 *	  table or a registration changes.
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
#include "common/hashfn.h"
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
#include "utils/rls.h"
#include "utils/ruleutils.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "core/cluster.h"
#include "core/subxact.h"
#include "fairq/fairqueue_int.h"
#include "fairq/register_int.h"
#include "limits/limits.h"
#include "slots/slots.h"

static HTAB *fs_descs = NULL;		/* queue name -> FsFairDesc */
static HTAB *fs_rel_cache = NULL;	/* relid -> FsRelTriggers */

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
		{
			if (!OidIsValid(relid) || desc->ready_relid == relid || desc->running_relid == relid)
				desc->valid = false;
			for (int i = 0; i < desc->nparts; i++)
				if (desc->parts[i].ready_relid == relid)
					desc->valid = false;
		}
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

/* A relation changed: forget what the caches hold about it. */
static void
fs_relcache_callback(Datum arg pg_attribute_unused(), Oid relid)
{
	fs_invalidate_caches(relid);
}

/* Register the invalidation callbacks of the registration caches. */
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
 * Prepare one of a queue's queries, with `cursor_options` for the plan
 * cache (CURSOR_OPT_GENERIC_PLAN: planned once, not at every execution).
 * An error (a column the registration uses was renamed, no USAGE on the
 * table's schema, ...) is reported by fs_fair_query_error(): by queue and
 * piece, without the query's text.
 */
static SPIPlanPtr
fs_prepare(FsFairDesc *desc, FsQueryText *q, int nargs, Oid *argtypes, int cursor_options,
		   const char *what)
{
	MemoryContext cxt = CurrentMemoryContext;
	SPIPlanPtr	volatile plan = NULL;

	PG_TRY();
	{
		int			nest = fs_search_path_begin();

		plan = SPI_prepare_cursor(q->sql, nargs, argtypes, cursor_options);
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

/* Free a desc's prepared plans, and forget their texts. */
static void
fs_desc_free_plans(FsFairDesc *desc)
{
	if (desc->claim_plan)
		SPI_freeplan(desc->claim_plan);
	if (desc->fifo_plan)
		SPI_freeplan(desc->fifo_plan);
	if (desc->count_plan)
		SPI_freeplan(desc->count_plan);
	if (desc->latency_plan)
		SPI_freeplan(desc->latency_plan);
	if (desc->leaf_plan)
		SPI_freeplan(desc->leaf_plan);
	if (desc->star_plan)
		SPI_freeplan(desc->star_plan);
	if (desc->start_plan)
		SPI_freeplan(desc->start_plan);
	desc->claim_plan = desc->fifo_plan = desc->count_plan = desc->latency_plan = NULL;
	desc->leaf_plan = desc->star_plan = desc->start_plan = NULL;
	desc->start_ncols = 0;
	memset(&desc->claim_q, 0, sizeof(FsQueryText));
	memset(&desc->fifo_q, 0, sizeof(FsQueryText));
	memset(&desc->count_q, 0, sizeof(FsQueryText));
	memset(&desc->latency_q, 0, sizeof(FsQueryText));
	memset(&desc->leaf_q, 0, sizeof(FsQueryText));
	memset(&desc->star_q, 0, sizeof(FsQueryText));
	memset(&desc->start_q, 0, sizeof(FsQueryText));
}

/* Free a cached registration: its parts' plans and its own, then its memory. */
static void
fs_desc_free(FsFairDesc *desc)
{
	for (int i = 0; i < desc->nparts; i++)
		fs_desc_free_plans(&desc->parts[i]);
	desc->parts = NULL;
	desc->nparts = 0;
	desc->distributed = false;
	desc->tenant_keys = false;
	desc->row_cast = NULL;
	desc->min_hash = desc->max_hash = 0;
	fs_desc_free_plans(desc);
	/* The weights' table lives in cxt. */
	desc->subkey_weights = NULL;
	desc->subkey_weights_generation = 0;
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
void
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

/*
 * "fairshare_row AS fs_row": the row, as a row of the distributed table for
 * a part (whose table is a shard of it).
 */
static void
fs_q_row(FsFairDesc *desc, FsQueryText *q, StringInfo buf)
{
	if (desc->row_cast == NULL)
	{
		fs_q_sql(buf, FS_ROW_ALIAS " AS fs_row");
		return;
	}
	fs_q_sql(buf, "ROW(" FS_ROW_ALIAS ".*)::");
	fs_q_piece(q, buf, "ready_table", desc->row_cast);
	fs_q_sql(buf, " AS fs_row");
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
 * A row as the held keys name it (fs_track_held_keys()): its key, or with
 * keys unique only with the tenant, the text "<length of tenant>:<tenant><key>".
 */
static void
fs_q_held_key(FsFairDesc *desc, FsQueryText *q, StringInfo buf)
{
	if (!desc->tenant_keys)
	{
		fs_q_paren(q, buf, "key", desc->key);
		return;
	}
	/* format()'s %s is the type's output function, as fs_track_held_keys()'s text. */
	fs_q_sql(buf, "pg_catalog.format('%s:%s%s', pg_catalog.length(");
	fs_q_paren(q, buf, "tenant", desc->tenant);
	fs_q_sql(buf, "), ");
	fs_q_paren(q, buf, "tenant", desc->tenant);
	fs_q_sql(buf, ", ");
	fs_q_paren(q, buf, "key", desc->key);
	fs_q_sql(buf, ")");
}

/*
 * A claim's selection, for a queue with a selector: rows whose selector
 * matches a LIKE pattern of $<in> (NULL: any) and none of $<not_in>.
 */
static void
fs_q_selection(FsFairDesc *desc, FsQueryText *q, StringInfo buf, int in, int not_in)
{
	for (int i = 0; desc->selector != NULL && i < 2; i++)
	{
		appendStringInfo(buf, "  AND ($%d IS NULL OR %scoalesce(", i ? not_in : in, i ? "NOT " : "");
		fs_q_paren(q, buf, "selector", desc->selector);
		appendStringInfo(buf, ", '') OPERATOR(pg_catalog.~~) ANY ($%d))", i ? not_in : in);
	}
}

/*
 * " AND (c1, c2) >= (<prefix>1, <prefix>2)" over the probe start columns
 * (probe_start.c): the start as parameters from $<param> on when param is
 * not 0, else as columns named <prefix>1, ...  A row comparison, so that
 * the index scan of (tenant, c1, c2) begins at the start.
 */
static void
fs_q_start_bound(FsFairDesc *desc, FsQueryText *q, StringInfo buf, const char *prefix, int param)
{
	fs_q_sql(buf, " AND (");
	for (int c = 0; c < desc->start_ncols; c++)
	{
		if (c > 0)
			fs_q_sql(buf, ", ");
		fs_q_sql(buf, FS_ROW_ALIAS ".");
		fs_q_piece(q, buf, "order_by", desc->start_columns[c]);
	}
	fs_q_sql(buf, ") OPERATOR(pg_catalog.>=) ");
	fs_q_sql(buf, desc->start_ncols > 1 ? "ROW(" : "(");
	for (int c = 0; c < desc->start_ncols; c++)
	{
		if (c > 0)
			fs_q_sql(buf, ", ");
		if (param > 0)
			appendStringInfo(buf, "$%d", param + c);
		else
			appendStringInfo(buf, "%s%d", prefix, c + 1);
	}
	fs_q_sql(buf, ")");
}

/* Which rows a fair claim query takes of each tenant it is given. */
typedef enum FsClaimShape
{
	FS_CLAIM_TENANTS,			/* a tenant's rows */
	FS_CLAIM_LEAVES,			/* a (tenant, sub-key) pair's rows */
	FS_CLAIM_STAR				/* a tenant's rows of no valid sub-key */
} FsClaimShape;

/*
 * Build and prepare a fair claim query of `shape` into `q`: the rows of
 * each tenant (or pair) of the arrays in $1 (and $2, the sub-keys, for
 * leaves), as many as the counts array gives, then the held keys and the
 * selection (see fs_desc_prepare()).  Each tenant (and sub-key) is matched
 * as a range, in the order of the index that begins with it.
 */
static SPIPlanPtr
fs_desc_prepare_fair(FsFairDesc *desc, FsQueryText *q, FsClaimShape shape, Oid keys_type)
{
	bool		leaves = shape == FS_CLAIM_LEAVES;
	int			held = leaves ? 4 : 3;	/* the held keys' parameter */
	bool		starts = shape == FS_CLAIM_TENANTS && desc->start_ncols > 0;
	Oid			types[6 + FS_PROBE_START_MAX_COLS];
	int			ntypes = 0;
	StringInfoData buf;

	types[ntypes++] = TEXTARRAYOID;
	if (leaves)
		types[ntypes++] = TEXTARRAYOID;
	types[ntypes++] = INT4ARRAYOID;
	types[ntypes++] = keys_type;
	types[ntypes++] = TEXTARRAYOID;
	types[ntypes++] = TEXTARRAYOID;
	for (int c = 0; starts && c < desc->start_ncols; c++)
		types[ntypes++] = get_array_type(desc->start_types[c]);

	fs_q_begin(desc, q, &buf);
	fs_q_sql(&buf, "SELECT p.fs_ord, s.fs_key, s.fs_cost, s.fs_row"
			 "  FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), ");
	fs_q_sql(&buf, leaves ?
			 "pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.int4[])" :
			 "pg_catalog.unnest($2::pg_catalog.int4[])");
	/* Each tenant's probe start (probe_start.c): $6 on, a column each. */
	for (int c = 0; starts && c < desc->start_ncols; c++)
		appendStringInfo(&buf, ", pg_catalog.unnest($%d)", 6 + c);
	fs_q_sql(&buf, leaves ? ") WITH ORDINALITY AS p(fs_tenant, fs_subkey, fs_n" :
			 ") WITH ORDINALITY AS p(fs_tenant, fs_n");
	for (int c = 0; starts && c < desc->start_ncols; c++)
		appendStringInfo(&buf, ", fs_start%d", c + 1);
	fs_q_sql(&buf, ", fs_ord) CROSS JOIN LATERAL (SELECT ");
	fs_q_paren(q, &buf, "key", desc->key);
	fs_q_sql(&buf, " AS fs_key, ");
	fs_q_cost(desc, q, &buf);
	fs_q_sql(&buf, " AS fs_cost, ");
	fs_q_row(desc, q, &buf);
	fs_q_from(desc, q, &buf);
	fs_q_sql(&buf, "    WHERE ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, " OPERATOR(pg_catalog.>=) p.fs_tenant AND ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, " OPERATOR(pg_catalog.<=) p.fs_tenant");
	if (leaves)
	{
		fs_q_sql(&buf, " AND ");
		fs_q_paren(q, &buf, "subkey", desc->subkey);
		fs_q_sql(&buf, " OPERATOR(pg_catalog.>=) p.fs_subkey AND ");
		fs_q_paren(q, &buf, "subkey", desc->subkey);
		fs_q_sql(&buf, " OPERATOR(pg_catalog.<=) p.fs_subkey");
	}
	else if (shape == FS_CLAIM_STAR)
	{
		fs_q_sql(&buf, " AND (");
		fs_q_paren(q, &buf, "subkey", desc->subkey);
		fs_q_sql(&buf, " IS NULL OR pg_catalog.octet_length(");
		fs_q_paren(q, &buf, "subkey", desc->subkey);
		appendStringInfo(&buf, ") NOT BETWEEN 1 AND %d OR ", FS_NAME_MAXLEN);
		fs_q_paren(q, &buf, "subkey", desc->subkey);
		fs_q_sql(&buf, " OPERATOR(pg_catalog.=) '" FS_SUBKEY_NONE "')");
	}
	if (starts)
		fs_q_start_bound(desc, q, &buf, "p.fs_start", 0);
	fs_q_where_tail(desc, q, &buf, true);
	appendStringInfo(&buf, "      AND ($%d IS NULL OR ", held);
	fs_q_held_key(desc, q, &buf);
	appendStringInfo(&buf, " <> ALL ($%d))", held);
	fs_q_selection(desc, q, &buf, held + 1, held + 2);
	fs_q_sql(&buf, "    ORDER BY ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, ", ");
	if (leaves)
	{
		fs_q_paren(q, &buf, "subkey", desc->subkey);
		fs_q_sql(&buf, ", ");
	}
	fs_q_piece(q, &buf, "order_by", desc->order_by);
	fs_q_sql(&buf, "    LIMIT p.fs_n      FOR UPDATE OF " FS_ROW_ALIAS " SKIP LOCKED) s");
	fs_q_end(q, &buf);
	return fs_prepare(desc, q, ntypes, types, CURSOR_OPT_GENERIC_PLAN, "claim query");
}

/*
 * The probe start query (probe_start.c): the order values of tenant $1's
 * first row in the ready state at or above the start $2, ... (not locked:
 * a locked row is one the start must not pass).
 */
static void
fs_desc_prepare_start(FsFairDesc *desc)
{
	FsQueryText *q = &desc->start_q;
	Oid			types[1 + FS_PROBE_START_MAX_COLS];
	StringInfoData buf;

	types[0] = TEXTOID;
	for (int c = 0; c < desc->start_ncols; c++)
		types[1 + c] = desc->start_types[c];
	fs_q_begin(desc, q, &buf);
	fs_q_sql(&buf, "SELECT ");
	for (int c = 0; c < desc->start_ncols; c++)
	{
		if (c > 0)
			fs_q_sql(&buf, ", ");
		fs_q_sql(&buf, FS_ROW_ALIAS ".");
		fs_q_piece(q, &buf, "order_by", desc->start_columns[c]);
	}
	fs_q_from(desc, q, &buf);
	fs_q_sql(&buf, " WHERE ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, " OPERATOR(pg_catalog.>=) $1 AND ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, " OPERATOR(pg_catalog.<=) $1");
	fs_q_start_bound(desc, q, &buf, NULL, 2);
	fs_q_where_tail(desc, q, &buf, false);
	fs_q_sql(&buf, " ORDER BY ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	for (int c = 0; c < desc->start_ncols; c++)
	{
		fs_q_sql(&buf, ", " FS_ROW_ALIAS ".");
		fs_q_piece(q, &buf, "order_by", desc->start_columns[c]);
	}
	fs_q_sql(&buf, " LIMIT 1");
	fs_q_end(q, &buf);
	desc->start_plan = fs_prepare(desc, q, 1 + desc->start_ncols, types,
								  CURSOR_OPT_GENERIC_PLAN, "probe start query");
}

/*
 * The claim queries.  $3 (fifo: $2) is an array of keys this transaction
 * claimed before and still holds: its own row locks do not make SKIP LOCKED
 * skip them, so they are left out by key (NULL when there are none).  $4
 * and $5 (fifo: $3 and $4) are the claim's selection (fs_q_selection()).
 * A queue with a subkey has two more (subkeys.c): the leaf query takes the
 * rows of (tenant, sub-key) pairs, $2 the sub-keys and every later
 * parameter one further; the star query the rows of tenants whose sub-key
 * is NULL or no valid name (the leaf FS_SUBKEY_NONE), with the claim
 * query's parameters.
 *
 * A tenant's rows are matched with tenant >= $t AND tenant <= $t (the same
 * rows as tenant = $t, under any btree collation) and ordered by the tenant
 * first: with an equality the planner treats the tenant as a constant and
 * may walk another index in the order's order, filtering out every row of a
 * tenant that holds most of the table (its statistics say every row
 * matches); as a range, only the (tenant, order) index gives the order, so
 * each probe reads just the rows it returns.
 *
 * The fair claim query is planned once (a generic plan): its parameters
 * change nothing in its plan, since each tenant and its
 * LIMIT come from the arrays through LATERAL, so a plan made for each
 * execution was the same plan, at a cost of about a tenth of a
 * millisecond per claim.  The fail-open query keeps plans made for its
 * LIMIT.
 *
 * Each text records which piece of the registration each part came from.
 */
static void
fs_desc_prepare(FsFairDesc *desc)
{
	Oid			keys_type = desc->tenant_keys ? TEXTARRAYOID : get_array_type(desc->key_type);
	Oid			fifo_types[4] = {INT8OID, keys_type, TEXTARRAYOID, TEXTARRAYOID};
	StringInfoData buf;
	FsQueryText *q;

	desc->claim_plan = fs_desc_prepare_fair(desc, &desc->claim_q, FS_CLAIM_TENANTS, keys_type);
	if (desc->subkey != NULL)
	{
		/* The queries of a queue with a subkey (subkeys.c). */
		desc->leaf_plan = fs_desc_prepare_fair(desc, &desc->leaf_q, FS_CLAIM_LEAVES, keys_type);
		desc->star_plan = fs_desc_prepare_fair(desc, &desc->star_q, FS_CLAIM_STAR, keys_type);
	}
	if (desc->start_ncols > 0)
		fs_desc_prepare_start(desc);

	q = &desc->fifo_q;
	fs_q_begin(desc, q, &buf);
	fs_q_sql(&buf, "SELECT ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, " AS fs_tenant, ");
	fs_q_paren(q, &buf, "key", desc->key);
	fs_q_sql(&buf, " AS fs_key, ");
	fs_q_cost(desc, q, &buf);
	fs_q_sql(&buf, " AS fs_cost, ");
	fs_q_row(desc, q, &buf);
	fs_q_from(desc, q, &buf);
	fs_q_sql(&buf, " WHERE ($2 IS NULL OR ");
	fs_q_held_key(desc, q, &buf);
	fs_q_sql(&buf, " <> ALL ($2))");
	fs_q_selection(desc, q, &buf, 3, 4);
	fs_q_where_tail(desc, q, &buf, true);
	fs_q_sql(&buf, " ORDER BY ");
	fs_q_piece(q, &buf, "order_by", desc->order_by);
	fs_q_sql(&buf, " LIMIT $1 FOR UPDATE OF " FS_ROW_ALIAS " SKIP LOCKED");
	fs_q_end(q, &buf);
	desc->fifo_plan = fs_prepare(desc, q, 4, fifo_types, 0, "fail-open claim query");

	q = &desc->count_q;
	fs_q_begin(desc, q, &buf);
	fs_q_sql(&buf, "SELECT ");
	fs_q_paren(q, &buf, "tenant", desc->tenant);
	fs_q_sql(&buf, " AS fs_tenant, pg_catalog.count(*)");
	if (desc->subkey != NULL)
	{
		/* With a subkey, per leaf: a third column, the sub-key. */
		fs_q_sql(&buf, ", ");
		fs_q_paren(q, &buf, "subkey", desc->subkey);
	}
	fs_q_from(desc, q, &buf);
	fs_q_sql(&buf, " WHERE true");
	fs_q_where_tail(desc, q, &buf, false);
	fs_q_sql(&buf, desc->subkey != NULL ? " GROUP BY 1, 3" : " GROUP BY 1");
	fs_q_end(q, &buf);
	desc->count_plan = fs_prepare(desc, q, 0, NULL, 0, "count query");

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
		desc->latency_plan = fs_prepare(desc, q, 0, NULL, 0, "latency query");
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
 * May the caller see what fairshare counts of `desc`'s queue (`action`, as
 * "list the tenants")?  It needs SELECT on the ready table and USAGE on its
 * schema, and row-level security must not restrict it there: the counts are
 * of every ready row, whoever may see it (kept by triggers and recounted as
 * the table's owner), so a caller the policies restrict would learn of rows
 * they hide.  `function` names the SQL function in messages.
 */
void
fs_fair_check_counts_readable(FsFairDesc *desc, const char *function, const char *action)
{
	if (pg_class_aclcheck(desc->ready_relid, GetUserId(), ACL_SELECT) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to %s of %s", action, desc->ready_name),
				 errhint("%s() needs SELECT on the queue's table.", function)));
	fs_fair_check_schema_usage(desc, function);
	if (check_enable_rls(desc->ready_relid, InvalidOid, true) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to %s of queue \"%s\": row-level security "
						"restricts you on %s", action, desc->queue_name, desc->ready_name),
				 errdetail("%s() counts every ready row, including the rows the table's "
						   "policies hide from you.", function),
				 errhint("Call it as the table's owner or a role with BYPASSRLS, or claim with "
						 "fs_claim(), which applies the policies.")));
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
	Relation	rel = try_relation_open(desc->ready_relid, AccessShareLock);
	const char *queue = desc->queue_name;
	MemoryContext cxt = desc->cxt;
	int			nest;
	Oid			key_type = InvalidOid;

	/*
	 * Dropped by another session after this one read the registration (the
	 * drop removes the registration when it commits).
	 */
	if (rel == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("the ready table of queue \"%s\" was dropped", queue),
				 errhint("Register the queue's new table with fs_register_queue().")));
	nest = fs_search_path_begin();

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
	desc->selector = fs_row_text(row, rowdesc, "selector", rel, FS_EXPR_SELECTOR, queue, cxt, NULL);
	desc->subkey = fs_row_text(row, rowdesc, "subkey", rel, FS_EXPR_SUBKEY, queue, cxt, NULL);
	fs_probe_start_columns(desc, rel);
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
 * The lease of a claim from the queue of `row` that passes none: the
 * registration's (checked when it was stored), or 5 minutes when it has
 * none, or was made by a version without the column.
 */
static int64
fs_row_lease(HeapTuple row, TupleDesc rowdesc)
{
	int			column = SPI_fnumber(rowdesc, "lease");
	bool		isnull = true;
	Datum		value = (Datum) 0;

	if (column > 0)
		value = SPI_getbinval(row, rowdesc, column, &isnull);
	if (isnull)
		return FS_DEFAULT_LEASE_USECS;
	return fs_lease_usecs(DatumGetIntervalP(value), "the registered lease");
}

/*
 * A queue on a table Citus distributes: a part for each of its shards on
 * this node, with the queries of the desc naming the shard's table, and no
 * probe starts (their values are kept per queue, of one table).  When the
 * shards (or the definition) differ from those the queue was last counted
 * over, the queue is counted again: a shard moved here brings rows no
 * trigger counted, one moved away takes its rows.
 */
static void
fs_desc_prepare_parts(FsFairDesc *desc)
{
	FsLocalShard *shards;
	int			n = fs_cluster_local_shards(desc->ready_relid, &shards);
	uint32		signature;

	desc->distributed = true;
	desc->tenant_keys = true;
	desc->start_ncols = 0;
	desc->parts = MemoryContextAllocZero(desc->cxt, sizeof(FsFairDesc) * Max(n, 1));
	signature = hash_bytes((const unsigned char *) desc->tenant, strlen(desc->tenant));
	if (desc->ready_filter != NULL)
		signature = hash_combine(signature, hash_bytes((const unsigned char *) desc->ready_filter,
													   strlen(desc->ready_filter)));
	for (int i = 0; i < n; i++)
	{
		FsFairDesc *part = &desc->parts[i];

		memcpy(part, desc, sizeof(FsFairDesc));
		part->distributed = false;
		part->parts = NULL;
		part->nparts = 0;
		part->ready_relid = shards[i].relid;
		part->ready_name = MemoryContextStrdup(desc->cxt, fs_qualified_name(shards[i].relid));
		part->row_cast = desc->ready_name;
		part->min_hash = shards[i].min_hash;
		part->max_hash = shards[i].max_hash;
		desc->nparts = i + 1;	/* its plans are freed with the desc's, also on error */
		fs_desc_prepare(part);
		signature = hash_combine(signature, hash_bytes((const unsigned char *) &shards[i].shard_id,
													   sizeof(int64)));
	}

	/*
	 * The count query of the node's tenants: each shard's, one after the
	 * other (a tenant's rows are in one shard; a recount adds up rows of a
	 * name anyway).
	 */
	{
		FsQueryText *q = &desc->count_q;
		StringInfoData buf;

		fs_q_begin(desc, q, &buf);
		for (int i = 0; i < desc->nparts; i++)
		{
			if (i > 0)
				fs_q_sql(&buf, " UNION ALL ");
			fs_q_sql(&buf, "(");
			fs_q_sql(&buf, desc->parts[i].count_q.sql);
			fs_q_sql(&buf, ")");
		}
		if (desc->nparts == 0)
			fs_q_sql(&buf, desc->subkey != NULL ?
					 "SELECT NULL::pg_catalog.text, 0::pg_catalog.int8, NULL::pg_catalog.text WHERE false" :
					 "SELECT NULL::pg_catalog.text, 0::pg_catalog.int8 WHERE false");
		fs_q_end(q, &buf);
		desc->count_plan = fs_prepare(desc, q, 0, NULL, 0, "count query");
		/* What is counted: the shards, and every piece of the definition in it. */
		signature = hash_combine(signature, hash_bytes((const unsigned char *) q->sql,
													   strlen(q->sql)));
	}
	signature |= 1;				/* 0: never counted over parts */
	if (desc->fq != NULL)
	{
		bool		changed;

		LWLockAcquire(desc->fq->lock, LW_SHARED);
		changed = desc->fq->parts_signature != signature;
		LWLockRelease(desc->fq->lock);
		if (changed)
		{
			LWLockAcquire(desc->fq->lock, LW_EXCLUSIVE);
			desc->fq->parts_signature = signature;
			LWLockRelease(desc->fq->lock);
			fs_fair_count_again(desc->queue);
		}
	}
}

/*
 * The desc whose table holds `tenant`'s rows: `desc` itself, or for a
 * distributed queue the part whose hash range holds the tenant, NULL when
 * no shard of this node does (the tenant is another node's).
 */
FsFairDesc *
fs_fair_part_of(FsFairDesc *desc, const char *tenant)
{
	int32		hash;
	int			lo = 0;
	int			hi = desc->nparts - 1;

	if (!desc->distributed)
		return desc;
	hash = fs_cluster_hash(tenant);
	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;

		if (hash < desc->parts[mid].min_hash)
			hi = mid - 1;
		else if (hash > desc->parts[mid].max_hash)
			lo = mid + 1;
		else
			return &desc->parts[mid];
	}
	return NULL;
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
	desc->lease_usecs = fs_row_lease(row, rowdesc);
	desc->queue = fs_queue_lookup(queue_name, true);
	desc->fq = desc->queue != NULL ? fs_fair_queue(desc->queue) : NULL;
	if (fs_cluster_is_distributed(desc->ready_relid))
		fs_desc_prepare_parts(desc);
	else
		fs_desc_prepare(desc);
	SPI_finish();

	desc->generation = generation;
	desc->valid = true;
	return desc;
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
 * role user code runs as.  `distributed`: the Citus table whose shard rel is
 * (InvalidOid: none), as fs_fair_rel_triggers() found it.
 */
static void
fs_rel_role(FsRelRole *role, HeapTuple row, TupleDesc rowdesc, Relation rel, bool ready_side,
			Oid distributed)
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
		role->subkey = fs_rel_expr(SPI_getvalue(row, rowdesc, SPI_fnumber(rowdesc, "subkey")),
								   rel, FS_EXPR_SUBKEY, queue, &user_code);
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

	/*
	 * A Citus shard: keys are unique only with the tenant, which the
	 * running side reads from its distribution column (fs_register_queue()
	 * has the running table colocated with the ready table).
	 */
	role->tenant_keys = OidIsValid(distributed);
	if (role->tenant_keys && !ready_side)
	{
		char	   *column = fs_cluster_distribution_column(distributed);

		if (column == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("running table %s of queue \"%s\" has no distribution column",
							get_rel_name(distributed), queue),
					 errhint("Distribute it by its tenant column, colocated with the ready table.")));
		role->running_tenant = fs_rel_expr(quote_identifier(column), rel, FS_EXPR_TENANT,
										   queue, &user_code);
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
	Oid			distributed;
} FsRelRoleArgs;

/* fs_rel_role_guarded()'s work, in its subtransaction. */
static void
fs_rel_role_one(void *arg)
{
	FsRelRoleArgs *a = (FsRelRoleArgs *) arg;

	fs_rel_role(a->role, a->row, a->rowdesc, a->rel, a->ready_side, a->distributed);
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
					bool ready_side, Oid distributed)
{
	FsRelRoleArgs args = {role, row, rowdesc, rel, ready_side, distributed};
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
 * triggers cloned from its parent; a Citus shard those Citus copied from
 * its distributed table), compiled against rel itself.
 */
FsRelTriggers *
fs_fair_rel_triggers(Relation rel)
{
	Oid			relid = RelationGetRelid(rel);
	Oid			distributed;
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
	/* A Citus shard fires the triggers of its distributed table. */
	distributed = fs_cluster_absent ? InvalidOid : fs_cluster_shard_parent(relid);
	if (OidIsValid(distributed))
		family = lappend_oid(family, distributed);
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
			fs_rel_role_guarded(&rt->ready[rt->nready], row, rowdesc, rel, true, distributed))
			rt->nready++;
		if (DatumGetBool(SPI_getbinval(row, rowdesc, SPI_fnumber(rowdesc, "fs_is_running"), &isnull)) &&
			fs_rel_role_guarded(&rt->running[rt->nrunning], row, rowdesc, rel, false, distributed))
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

/*-------------------------------------------------------------------------
 *
 * cluster.c
 *	  fairshare on a Citus cluster: the node-side rules (see cluster.h).
 *
 * Three backend-local caches, each loaded on first use and dropped when
 * what it copies changes:
 *
 *	- this node's Citus group id, from pg_dist_local_group (Citus
 *	  invalidates that table's relcache entry when the group changes);
 *	- the setup, the row of fs_cluster that fs_citus_setup() writes (a
 *	  reference table, so every node has it; its trigger bumps the limits
 *	  generation when a change commits, also through COMMIT PREPARED);
 *	- the shard map of the colocated table: each shard's hash range and the
 *	  group that holds it, from pg_dist_shard and pg_dist_placement (Citus
 *	  invalidates the distributed table's relcache entry when a placement
 *	  changes, as a shard move does).
 *
 * Nothing here touches shared memory but the limits generation, read
 * atomically.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "optimizer/planner.h"
#include "parser/parsetree.h"
#include "miscadmin.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/syscache.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "tcop/pquery.h"
#include "utils/portal.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "core/cluster.h"
#include "core/relay.h"
#include "core/common.h"
#include "core/compat.h"
#include "core/run_as.h"
#include "core/subxact.h"
#include "core/shmem.h"

PG_FUNCTION_INFO_V1(fs_tenant_node);

/* One shard of the colocated table: its hash range and its node. */
typedef struct FsShard
{
	int32		min_hash;
	int32		max_hash;
	int32		group;
} FsShard;

/* This node's group: -1 until looked up. */
static int32 group_cached = -1;
static Oid	group_relid = InvalidOid;	/* pg_dist_local_group; invalid: no Citus */

/* This backend knows that its database has no Citus (cluster.h's fast paths). */
bool		fs_cluster_absent = false;

/*
 * The setup: loaded for the limits generation `setup_generation`; never
 * kept while this transaction changed the settings (setup_dirty).
 */
static bool setup_loaded = false;
static bool setup_dirty = false;
static uint32 setup_generation = 0;
static Oid	setup_table = InvalidOid;	/* invalid: not set up */

/*
 * The shard map of setup_table, sorted by min_hash; valid until an
 * invalidation (counted in map_invalidations, so that one arriving while
 * the map loads is not lost).
 */
static bool map_valid = false;
static uint64 map_invalidations = 0;
static FsShard *map_shards = NULL;
static int	map_count = 0;

static planner_hook_type prev_planner_hook = NULL;

static Oid	fs_cluster_setup_table(void);
static bool fs_cluster_citus_here(void);
static bool fs_cluster_bare_call(Query *parse, FuncExpr *call);
static void fs_cluster_forward_tenant(const char *function, FunctionCallInfo fcinfo,
									  Datum *result);

/* An anchor per node: a value whose shard is on that node (-1: not looked for, -2: none). */
static int32 anchors[FS_LEASE_NODE_MAX + 1];

#define FS_ANCHOR_FORMAT	"fairshare-node-%d"
#define FS_ANCHOR_TRIES		1000000

/* Drop what a relcache invalidation may have made stale. */
static void
fs_cluster_relcache_callback(Datum arg pg_attribute_unused(), Oid relid)
{
	/* Without Citus any invalidation may be its creation: look again. */
	if (relid == InvalidOid || relid == group_relid || !OidIsValid(group_relid))
	{
		group_cached = -1;
		fs_cluster_absent = false;
	}
	if (relid == InvalidOid || relid == setup_table)
	{
		map_valid = false;
		map_invalidations++;
	}
}

/* Transaction end: settings this transaction changed are read again. */
static void
fs_cluster_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	if (setup_dirty && (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
						event == XACT_EVENT_PREPARE))
	{
		setup_dirty = false;
		setup_loaded = false;
	}
}

/*
 * This transaction changed fairshare's settings (fs_limits' trigger): read
 * the setup again, and keep nothing read before the transaction ends.
 */
void
fs_cluster_forget(void)
{
	setup_dirty = true;
	setup_loaded = false;
}

/*
 * The functions fs_citus_setup() has Citus delegate, by their first
 * argument (a tenant, or a node anchor).
 */
static const char *const fs_delegated[] = {
	/* by a tenant: the first three */
	"fs_acquire_slot", "fs_spend_tokens", "fs_charge_tokens",
	/* by a node anchor */
	"fs_release_slot_at",
	"fs_renew_slot_at", "fs_worker_heartbeat_at", "fs_report_latency_at", "fs_claim_at",
	"fs_claimable_weight_at",
};

/*
 * The single function call of a statement in the shape Citus delegates
 * (SELECT f(...), SELECT ... FROM f(...)), or NULL.
 */
static FuncExpr *
fs_cluster_delegable_call(Query *parse)
{
	FromExpr   *jointree = parse->jointree;
	Node	   *expr = NULL;

	if (parse->commandType != CMD_SELECT || jointree == NULL || jointree->quals != NULL)
		return NULL;
	if (list_length(jointree->fromlist) == 1 && IsA(linitial(jointree->fromlist), RangeTblRef))
	{
		RangeTblEntry *rte = rt_fetch(((RangeTblRef *) linitial(jointree->fromlist))->rtindex,
									  parse->rtable);

		if (rte->rtekind == RTE_FUNCTION && list_length(rte->functions) == 1)
			expr = ((RangeTblFunction *) linitial(rte->functions))->funcexpr;
	}
	else if (jointree->fromlist == NIL && list_length(parse->targetList) == 1)
		expr = (Node *) ((TargetEntry *) linitial(parse->targetList))->expr;
	return expr != NULL && IsA(expr, FuncExpr) ? (FuncExpr *) expr : NULL;
}

/* Is `value` (a call's argument) NULL, as the planner will see it? */
static bool
fs_cluster_arg_is_null(Node *value, ParamListInfo params)
{
	if (IsA(value, Const))
		return ((Const *) value)->constisnull;
	if (IsA(value, Param) && ((Param *) value)->paramkind == PARAM_EXTERN && params != NULL)
	{
		int			id = ((Param *) value)->paramid;
		ParamExternData workspace;
		ParamExternData *prm;

		if (id <= 0 || id > params->numParams)
			return false;
		prm = params->paramFetch != NULL ?
			params->paramFetch(params, id, true, &workspace) : &params->params[id - 1];
		return prm != NULL && OidIsValid(prm->ptype) && prm->isnull;
	}
	return false;
}

/*
 * The index in fs_delegated of `funcid`, one of fairshare's own delegated
 * functions, or -1.
 */
static int
fs_cluster_delegated_index(Oid funcid)
{
	HeapTuple	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	NameData	name;
	bool		ours = false;
	int			i;

	if (!HeapTupleIsValid(tuple))
		return -1;
	name = ((Form_pg_proc) GETSTRUCT(tuple))->proname;
	if (((Form_pg_proc) GETSTRUCT(tuple))->prolang == ClanguageId)
	{
		bool		isnull;
		Datum		bin = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_probin, &isnull);

		if (!isnull)
		{
			char	   *path = TextDatumGetCString(bin);
			size_t		len = strlen(path);

			ours = len >= strlen("fairshare") &&
				strcmp(path + len - strlen("fairshare"), "fairshare") == 0;
		}
	}
	ReleaseSysCache(tuple);
	for (i = 0; ours && i < (int) lengthof(fs_delegated); i++)
		if (strcmp(NameStr(name), fs_delegated[i]) == 0)
			return i;
	return -1;
}

/* The first fs_delegated entries: delegated by a tenant. */
#define FS_DELEGATED_BY_TENANT	3

/*
 * If `funcid` is one of fairshare's delegated functions, raise the error
 * it raises itself for a NULL first argument.
 */
static void
fs_cluster_check_delegated_arg(Oid funcid)
{
	int			i = fs_cluster_delegated_index(funcid);

	if (i < 0)
		return;
	if (i < FS_DELEGATED_BY_TENANT)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("tenant must not be null"),
				 errhint("Pass the tenant's key, for example its id.")));
	ereport(ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("node_anchor must not be null"),
			 errhint("%s() is what fairshare's own calls on a Citus coordinator send to a node.",
					 fs_delegated[i])));
}

/*
 * Whether `parse`, in the shape of one call (fs_cluster_delegable_call()),
 * is that call and nothing else: no CTE, sublink, grouping, sort, limit,
 * set operation or row lock; arguments of constants and parameters, with
 * no volatile function;
 * in the FROM form, the function's one column selected as it is.  Only
 * such a statement is relayed: nothing in it runs after the call.
 */
static bool
fs_cluster_bare_call(Query *parse, FuncExpr *call)
{
	if (parse->cteList != NIL || parse->hasSubLinks || parse->hasModifyingCTE ||
		parse->hasAggs || parse->hasWindowFuncs || parse->hasTargetSRFs ||
		parse->limitCount != NULL || parse->limitOffset != NULL || parse->sortClause != NIL ||
		parse->distinctClause != NIL || parse->groupClause != NIL || parse->groupingSets != NIL ||
		parse->havingQual != NULL || parse->windowClause != NIL || parse->setOperations != NULL ||
		parse->rowMarks != NIL || list_length(parse->targetList) != 1)
		return false;
	/* Arguments computed once, before the call, with no effect of their own. */
	if (contain_var_clause((Node *) call->args) ||
		contain_volatile_functions((Node *) call->args))
		return false;
	if (parse->jointree->fromlist != NIL)
	{
		RangeTblEntry *rte = rt_fetch(((RangeTblRef *) linitial(parse->jointree->fromlist))->rtindex,
									  parse->rtable);

		if (rte->funcordinality ||
			!IsA(((TargetEntry *) linitial(parse->targetList))->expr, Var))
			return false;
	}
	return true;
}

/*
 * Whether a client's statement `parse`, one bare `call`
 * (fs_cluster_bare_call()), should be planned without Citus, so that the
 * call runs here and is relayed (relay.c): one of the functions delegated
 * by a tenant, called outside a
 * transaction block on a coordinator set up with fs_citus_setup().  Only a
 * statement the client protocol plans (no portal runs yet), not one of a
 * function or of EXECUTE.  A plan kept and run later inside a block still
 * reaches the tenant's node (fs_cluster_tenant_relayed_slow()).
 */
static bool
fs_cluster_relays(Query *parse, FuncExpr *call)
{
	int			i;

	if (!fs_relay_enabled || ActivePortal != NULL || IsTransactionBlock() ||
		!fs_cluster_bare_call(parse, call))
		return false;
	i = fs_cluster_delegated_index(call->funcid);
	return i >= 0 && i < FS_DELEGATED_BY_TENANT &&
		fs_cluster_group() == 0 && OidIsValid(fs_cluster_setup_table());
}

/* What fs_cluster_walk_call() found in a statement. */
typedef struct FsCallWalk
{
	bool		relation;		/* a table, view or other relation */
	bool		delegated;		/* a call of a function fairshare has Citus delegate */
} FsCallWalk;

static bool
fs_cluster_walk_call(Node *node, FsCallWalk *walk)
{
	if (node == NULL)
		return false;
	if (IsA(node, RangeTblEntry))
	{
		/* A view is planned as its query, whose own relations are walked. */
		walk->relation |= ((RangeTblEntry *) node)->rtekind == RTE_RELATION &&
			((RangeTblEntry *) node)->relkind != RELKIND_VIEW;
		return walk->relation;
	}
	if (IsA(node, FuncExpr) && !walk->delegated)
		walk->delegated = fs_cluster_delegated_index(((FuncExpr *) node)->funcid) >= 0;
	if (IsA(node, Query))
		return query_tree_walker((Query *) node, fs_cluster_walk_call, walk,
								 QTW_EXAMINE_RTES_BEFORE);
	return expression_tree_walker(node, fs_cluster_walk_call, walk);
}

/*
 * Whether `parse`, not in the shape Citus delegates, calls one of the
 * functions fairshare has Citus delegate and reads no relation.  Citus
 * looks for a call to delegate after PostgreSQL's planner has flattened
 * the statement (SELECT f(t) FROM (VALUES ('a')) v(t) becomes SELECT
 * f('a')), then deparses what it flattened and crashes the backend (Citus
 * 13.2), or looks up the shard of a NULL.  Planned without Citus, such a
 * statement has nothing for Citus to do: the call runs here, and is sent to
 * its node or refused as any call that Citus did not delegate.
 */
static bool
fs_cluster_undelegable_call(Query *parse)
{
	FsCallWalk	walk = {false, false};

	(void) query_tree_walker(parse, fs_cluster_walk_call, &walk, QTW_EXAMINE_RTES_BEFORE);
	return walk.delegated && !walk.relation;
}

/*
 * `parse` (fs_cluster_undelegable_call()) planned without Citus, or NULL
 * when the plan reads a relation after all (a SQL function inlined): then
 * Citus must plan it.  Planned on a copy, so that the caller can hand the
 * statement on as it was.
 */
static PlannedStmt *
fs_cluster_plan_alone(Query *parse, const char *query_string, int cursor_options,
					  ParamListInfo params)
{
	PlannedStmt *plan = standard_planner(copyObject(parse), query_string, cursor_options, params);
	ListCell   *lc;

	foreach(lc, plan->relationOids)
		if (get_rel_relkind(lfirst_oid(lc)) != RELKIND_VIEW)
			return NULL;
	return plan;
}

/*
 * planner_hook:
 *	- refuse a delegable call of one of fairshare's delegated functions
 *	  whose first argument is NULL, before Citus's planner sees it: Citus
 *	  13.2 looks up the shard of a NULL distribution value and crashes the
 *	  backend.  The error is the one the function would raise itself;
 *	- plan a call that fairshare relays (fs_cluster_relays()) as
 *	  PostgreSQL plans it, which Citus would delegate;
 *	- plan a call that Citus would not delegate but try to, and crash
 *	  (fs_cluster_undelegable_call()), as PostgreSQL plans it.
 */
static PlannedStmt *
fs_cluster_planner(Query *parse, const char *query_string, int cursor_options,
				   ParamListInfo params)
{
	FuncExpr   *call = fs_cluster_absent ? NULL : fs_cluster_delegable_call(parse);
	PlannedStmt *alone;

	if (call != NULL && call->args != NIL &&
		fs_cluster_arg_is_null(linitial(call->args), params))
		fs_cluster_check_delegated_arg(call->funcid);
	if (call != NULL && fs_cluster_relays(parse, call))
		return standard_planner(parse, query_string, cursor_options, params);
	if (call == NULL && !fs_cluster_absent && fs_cluster_citus_here() &&
		fs_cluster_undelegable_call(parse) &&
		(alone = fs_cluster_plan_alone(parse, query_string, cursor_options, params)) != NULL)
		return alone;
	return prev_planner_hook != NULL ?
		prev_planner_hook(parse, query_string, cursor_options, params) :
		standard_planner(parse, query_string, cursor_options, params);
}

/* Register the invalidation callback and the planner hook (at _PG_init). */
void
fs_cluster_init(void)
{
	CacheRegisterRelcacheCallback(fs_cluster_relcache_callback, (Datum) 0);
	RegisterXactCallback(fs_cluster_xact_callback, NULL);
	fs_relay_init();
	prev_planner_hook = planner_hook;
	planner_hook = fs_cluster_planner;
}

/* Column `name` of catalog relation `relid`, or an error. */
static AttrNumber
fs_catalog_attnum(Oid relid, const char *name)
{
	AttrNumber	attnum = get_attnum(relid, name);

	if (attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("Citus catalog \"%s\" has no column \"%s\"", get_rel_name(relid), name),
				 errhint("fairshare supports Citus 13.")));
	return attnum;
}

/*
 * A whole scan of Citus catalog `relid` (they are small), read straight
 * from the table: no privilege is needed.  fs_catalog_scan_end() ends it.
 */
static SysScanDesc
fs_catalog_scan_begin(Oid relid, Relation *rel)
{
	*rel = table_open(relid, AccessShareLock);
	return systable_beginscan(*rel, InvalidOid, false, NULL, 0, NULL);
}

static void
fs_catalog_scan_end(SysScanDesc scan, Relation rel)
{
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
}

/*
 * This node's Citus group id: 0 on a coordinator and on a server without
 * Citus in this database.  Read straight from the catalog (no privilege
 * needed), then cached.
 */
int32
fs_cluster_group(void)
{
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tuple;
	int32		group = 0;

	if (group_cached >= 0)
		return group_cached;
	group_relid = get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE);
	if (OidIsValid(group_relid))
	{
		AttrNumber	attnum = fs_catalog_attnum(group_relid, "groupid");

		scan = fs_catalog_scan_begin(group_relid, &rel);
		if (HeapTupleIsValid(tuple = systable_getnext(scan)))
		{
			bool		isnull;
			Datum		d = heap_getattr(tuple, attnum, RelationGetDescr(rel), &isnull);

			group = isnull ? 0 : DatumGetInt32(d);
		}
		fs_catalog_scan_end(scan, rel);
	}
	/* Negative while Citus upgrades its metadata: a group of its own, 0. */
	group_cached = Max(group, 0);
	fs_cluster_absent = !OidIsValid(group_relid);
	return group_cached;
}

/* Whether this database has Citus (looked up once, then cached). */
static bool
fs_cluster_citus_here(void)
{
	(void) fs_cluster_group();
	return !fs_cluster_absent;
}

/* A lease id as this node hands it out: its group in the high bits. */
int64
fs_lease_id_out_slow(int64 local_id)
{
	int32		group = fs_cluster_group();

	if (group == 0)
		return local_id;
	if (group > FS_LEASE_NODE_MAX || (local_id & ~FS_LEASE_LOCAL_MASK) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("lease id " INT64_FORMAT " of node group %d cannot name its node",
						local_id, group),
				 errhint("Lease ids name node groups up to %d.", FS_LEASE_NODE_MAX)));
	return local_id | ((int64) group << FS_LEASE_NODE_SHIFT);
}

/* The group of the node that granted `lease_id`. */
int32
fs_lease_id_node(int64 lease_id)
{
	return (int32) ((lease_id >> FS_LEASE_NODE_SHIFT) & FS_LEASE_NODE_MAX);
}

/*
 * Whether `lease_id` was granted by this node; if so, *local_id is its id
 * in this node's lease table.
 */
bool
fs_lease_id_in(int64 lease_id, int64 *local_id)
{
	int32		group = fs_cluster_group();

	Assert(lease_id > 0);
	*local_id = group == 0 ? lease_id : (lease_id & FS_LEASE_LOCAL_MASK);
	return fs_lease_id_node(lease_id) == group;
}

/*
 * The table fs_citus_setup() colocated fairshare's functions with, or
 * InvalidOid when this database is not set up (or has no Citus).  Loaded
 * again whenever the limits generation moved: a change of fs_cluster moves
 * it on every node when it commits.
 */
static Oid
fs_cluster_setup_table(void)
{
	uint32		generation;
	Oid			extoid;
	Oid			relid;
	Oid			table = InvalidOid;

	if (!fs_cluster_citus_here())
		return InvalidOid;
	generation = pg_atomic_read_u32(&fs_shared->limits_generation);
	if (setup_loaded && setup_generation == generation)
		return setup_table;

	extoid = get_extension_oid("fairshare", true);
	relid = OidIsValid(extoid) ?
		get_relname_relid("fs_cluster", fs_get_extension_schema(extoid)) : InvalidOid;
	if (OidIsValid(relid))
	{
		char	   *query = psprintf("SELECT colocate_with FROM %s.fs_cluster LIMIT 1",
									 quote_identifier(get_namespace_name(get_rel_namespace(relid))));

		Snapshot	snapshot;

		/* As committed now, not as this transaction's snapshot has it. */
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		snapshot = RegisterSnapshot(GetLatestSnapshot());
		if (SPI_execute_snapshot(SPI_prepare(query, 0, NULL), NULL, NULL, snapshot,
								 InvalidSnapshot, true, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not read fs_cluster");
		UnregisterSnapshot(snapshot);
		if (SPI_processed == 1)
		{
			bool		isnull;
			Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

			if (!isnull)
				table = DatumGetObjectId(d);
		}
		SPI_finish();
	}
	if (table != setup_table)
		map_valid = false;
	setup_table = table;
	setup_generation = generation;
	setup_loaded = !setup_dirty;
	return table;
}

static int
fs_shard_cmp(const void *a, const void *b)
{
	const FsShard *x = a;
	const FsShard *y = b;

	return (x->min_hash > y->min_hash) - (x->min_hash < y->min_hash);
}

/* One shard of a distributed table as Citus's catalogs have it. */
typedef struct FsShardRow
{
	int64		shard_id;
	int32		min_hash;
	int32		max_hash;
	int32		group;			/* of its active placement; -1: none */
} FsShardRow;

/*
 * The shards of distributed table `table`: each one's hash range
 * (pg_dist_shard) and the group of its active placement
 * (pg_dist_placement), in *rows (palloc'd); returns how many.  Read
 * straight from the catalogs (they are small): no privilege is needed.
 */
static int
fs_cluster_scan_shards(Oid table, FsShardRow **rows)
{
	Oid			shard_relid = get_relname_relid("pg_dist_shard", PG_CATALOG_NAMESPACE);
	Oid			placement_relid = get_relname_relid("pg_dist_placement", PG_CATALOG_NAMESPACE);
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tuple;
	FsShardRow *all;
	int			count = 0;
	int			capacity = 64;

	if (!OidIsValid(shard_relid) || !OidIsValid(placement_relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("Citus's shard catalogs are missing in this database")));

	all = palloc(sizeof(FsShardRow) * capacity);
	{
		AttrNumber	a_rel = fs_catalog_attnum(shard_relid, "logicalrelid");
		AttrNumber	a_id = fs_catalog_attnum(shard_relid, "shardid");
		AttrNumber	a_min = fs_catalog_attnum(shard_relid, "shardminvalue");
		AttrNumber	a_max = fs_catalog_attnum(shard_relid, "shardmaxvalue");

		scan = fs_catalog_scan_begin(shard_relid, &rel);
		while (HeapTupleIsValid(tuple = systable_getnext(scan)))
		{
			TupleDesc	desc = RelationGetDescr(rel);
			bool		n1,
						n2,
						n3;
			Datum		relid = heap_getattr(tuple, a_rel, desc, &n1);
			Datum		min;
			Datum		max;

			if (n1 || DatumGetObjectId(relid) != table)
				continue;
			min = heap_getattr(tuple, a_min, desc, &n2);
			max = heap_getattr(tuple, a_max, desc, &n3);
			if (n2 || n3)
				continue;
			if (count == capacity)
			{
				capacity *= 2;
				all = repalloc(all, sizeof(FsShardRow) * capacity);
			}
			all[count].shard_id = DatumGetInt64(heap_getattr(tuple, a_id, desc, &n1));
			all[count].min_hash = pg_strtoint32(TextDatumGetCString(min));
			all[count].max_hash = pg_strtoint32(TextDatumGetCString(max));
			all[count].group = -1;
			count++;
		}
		fs_catalog_scan_end(scan, rel);
	}
	{
		AttrNumber	a_id = fs_catalog_attnum(placement_relid, "shardid");
		AttrNumber	a_state = fs_catalog_attnum(placement_relid, "shardstate");
		AttrNumber	a_group = fs_catalog_attnum(placement_relid, "groupid");

		scan = fs_catalog_scan_begin(placement_relid, &rel);
		while (HeapTupleIsValid(tuple = systable_getnext(scan)))
		{
			TupleDesc	desc = RelationGetDescr(rel);
			bool		isnull;
			int64		id = DatumGetInt64(heap_getattr(tuple, a_id, desc, &isnull));

			if (DatumGetInt32(heap_getattr(tuple, a_state, desc, &isnull)) != 1)
				continue;		/* not an active placement */
			for (int i = 0; i < count; i++)
				if (all[i].shard_id == id)
					all[i].group = DatumGetInt32(heap_getattr(tuple, a_group, desc, &isnull));
		}
		fs_catalog_scan_end(scan, rel);
	}
	*rows = all;
	return count;
}

/* Load the shard map of `table`: each shard's hash range and its node's group. */
static void
fs_cluster_load_map(Oid table)
{
	uint64		invalidations = map_invalidations;
	FsShardRow *rows;
	int			count = fs_cluster_scan_shards(table, &rows);
	FsShard    *shards = palloc(sizeof(FsShard) * Max(count, 1));
	FsShard    *kept;
	int			i;

	for (i = 0; i < count; i++)
	{
		shards[i].min_hash = rows[i].min_hash;
		shards[i].max_hash = rows[i].max_hash;
		shards[i].group = rows[i].group;
	}
	pfree(rows);
	qsort(shards, count, sizeof(FsShard), fs_shard_cmp);

	/* Kept for the backend's life; built first, so an error leaks nothing. */
	kept = MemoryContextAlloc(TopMemoryContext, sizeof(FsShard) * Max(count, 1));
	memcpy(kept, shards, sizeof(FsShard) * count);
	pfree(shards);
	if (map_shards != NULL)
		pfree(map_shards);
	map_shards = kept;
	map_count = count;
	for (i = 0; i <= FS_LEASE_NODE_MAX; i++)
		anchors[i] = -1;
	/* An invalidation that came while the catalogs were read: load again. */
	map_valid = map_invalidations == invalidations;
}

/* The group whose shard holds hash value `hash`, or -1. */
static int32
fs_cluster_group_of_hash(int32 hash)
{
	int			lo = 0;
	int			hi = map_count - 1;

	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;

		if (hash < map_shards[mid].min_hash)
			hi = mid - 1;
		else if (hash > map_shards[mid].max_hash)
			lo = mid + 1;
		else
			return map_shards[mid].group;
	}
	return -1;
}

/*
 * The hash Citus places a text value by: hashtext(), which for a
 * deterministic collation (fs_citus_setup() accepts no other) hashes the
 * bytes.
 */
int32
fs_cluster_hash(const char *value)
{
	return (int32) hash_any((const unsigned char *) value, (int) strlen(value));
}

/*
 * The group of the node that owns `tenant`, or -1 when this database is not
 * set up for a cluster.
 */
int32
fs_cluster_tenant_group(const char *tenant)
{
	Oid			table = fs_cluster_setup_table();

	if (!OidIsValid(table))
		return -1;
	if (!map_valid)
		fs_cluster_load_map(table);
	return fs_cluster_group_of_hash(fs_cluster_hash(tenant));
}

/*
 * A decision for `tenant` on a node that does not own it: its slots and
 * budget are counted on the owner only.  On a coordinator, a call that is
 * its statement's whole work is sent to the owner: outside a transaction
 * block over fairshare's own connection (relay.c), else, or when that
 * cannot connect, through Citus (joining the block); true, with *result
 * and fcinfo->isnull the owner's answer.  Any other call is refused: Citus
 * delegates a single top-level call; other call shapes run where they are
 * called.  False on the owner, and when this database is not set up.
 */
bool
fs_cluster_tenant_relayed_slow(FunctionCallInfo fcinfo, const char *function,
							   const char *tenant, Datum *result)
{
	int32		owner = fs_cluster_tenant_group(tenant);
	int32		here;

	if (owner < 0)
		return false;
	here = fs_cluster_group();
	if (here > FS_LEASE_NODE_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("node group %d is above %d, the largest a lease id can name", here,
						FS_LEASE_NODE_MAX),
				 errhint("Add the node to the cluster again so that it gets a lower group id.")));
	if (owner == here)
		return false;
	if (here == 0 && fs_relay_sole_call(fcinfo))
	{
		if (!(fs_relay_enabled && !IsTransactionBlock() &&
			  fs_relay_call(owner, function, fcinfo, result)))
			fs_cluster_forward_tenant(function, fcinfo, result);
		return true;
	}
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("%s() for tenant \"%s\" ran on node group %d, which does not own the tenant",
					function, tenant, here),
			 errdetail("The tenant's shard is on node group %d.", owner),
			 errhint("Call it alone in a top-level SELECT with the tenant as a literal or parameter "
					 "(not inside another function's expression), so that Citus delegates it.")));
	return false;				/* keep the compiler quiet */
}

/* A value whose shard is on `group`, or NULL when no shard is there. */
static char *
fs_cluster_anchor(int32 group)
{
	int32		i;

	if (anchors[group] == -1)
	{
		bool		held = false;
		int32		found = -2;

		for (i = 0; i < map_count && !held; i++)
			held = map_shards[i].group == group;
		for (i = 0; held && i < FS_ANCHOR_TRIES; i++)
		{
			char		value[32];

			if ((i & 1023) == 0)
				CHECK_FOR_INTERRUPTS();
			snprintf(value, sizeof(value), FS_ANCHOR_FORMAT, i);
			if (fs_cluster_group_of_hash(fs_cluster_hash(value)) == group)
			{
				found = i;
				break;
			}
		}
		/* Only a finished search is kept (a cancel may stop it). */
		anchors[group] = found;
	}
	return anchors[group] < 0 ? NULL : psprintf(FS_ANCHOR_FORMAT, anchors[group]);
}

/*
 * Begin a statement that calls a delegated function (an _at function) by
 * an anchor: the extension's schema first on the search path, and a call
 * made from inside this function not counted by Citus as a transaction
 * block of its own, so that outside the caller's block the node runs the
 * call on its own and inside it the call joins the caller's transaction.
 * Returns the GUC nest level for fs_cluster_route_end().
 */
int
fs_cluster_route_begin(void)
{
	int			nestlevel = fs_search_path_begin();

	(void) set_config_option("citus.function_opens_transaction_block", "off",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	return nestlevel;
}

/* End what fs_cluster_route_begin() began. */
void
fs_cluster_route_end(int nestlevel)
{
	fs_search_path_end(nestlevel);
}

/*
 * The kept plans of the calls sent on through Citus: of the _at functions
 * (by a node anchor) and of the functions delegated by a tenant, by
 * function and schema.
 */
typedef struct FsForwardPlan
{
	const char *function;		/* a string constant of the caller's */
	bool		by_anchor;		/* `function`_at(anchor, ...) */
	int			nargs;			/* each function is sent with one set of arguments */
	char		schema[NAMEDATALEN];
	SPIPlanPtr	plan;
} FsForwardPlan;

#define FS_FORWARD_PLANS	8
static FsForwardPlan forward_plans[FS_FORWARD_PLANS];

/*
 * The kept plan of `function`_at($1 anchor, $2, ...) (by_anchor), or of
 * `function`($1 tenant, $2, ...), for the extension's schema, prepared on
 * first use.  Its arguments are parameters, which Citus plans as constants
 * (a custom plan) and delegates by the first; in FROM, since Citus does not
 * delegate a call in the target list of a query run inside a function.
 */
static SPIPlanPtr
fs_cluster_forward_plan(const char *function, bool by_anchor, int nargs, Oid *argtypes)
{
	char	   *schema = get_namespace_name(fs_get_extension_schema(get_extension_oid("fairshare", false)));
	const char *suffix = by_anchor ? "_at" : "";
	FsForwardPlan *slot = NULL;
	StringInfoData sql;
	SPIPlanPtr	plan;
	int			i;

	for (i = 0; i < FS_FORWARD_PLANS && slot == NULL; i++)
		if (forward_plans[i].function == NULL ||
			(strcmp(forward_plans[i].function, function) == 0 &&
			 forward_plans[i].by_anchor == by_anchor))
			slot = &forward_plans[i];
	if (slot == NULL)
		elog(ERROR, "no room for the plan of %s%s()", function, suffix);
	Assert(slot->function == NULL || slot->nargs == nargs);
	if (slot->plan != NULL && strcmp(slot->schema, schema) == 0)
		return slot->plan;

	initStringInfo(&sql);
	appendStringInfo(&sql, "SELECT * FROM %s.%s%s(", quote_identifier(schema), function, suffix);
	for (i = 1; i <= nargs; i++)
		appendStringInfo(&sql, "%s$%d", i > 1 ? ", " : "", i);
	appendStringInfoChar(&sql, ')');
	plan = SPI_prepare(sql.data, nargs, argtypes);
	if (plan == NULL || SPI_keepplan(plan) != 0)
		elog(ERROR, "could not prepare %s%s(): %s", function, suffix,
			 SPI_result_code_string(SPI_result));
	if (slot->plan != NULL)
		SPI_freeplan(slot->plan);
	slot->plan = plan;
	slot->function = function;
	slot->by_anchor = by_anchor;
	slot->nargs = nargs;
	strlcpy(slot->schema, schema, NAMEDATALEN);
	return plan;
}

/*
 * Run the kept plan of fs_cluster_forward_plan() with `values` and `nulls`
 * (SPI's form; NULL: none), which Citus sends to node group `node`.  The
 * first column of its answer goes to *result and *isnull.  Outside a
 * transaction block the node runs the call on its own, in one round trip,
 * as Citus runs a delegated call made at top level; inside one it joins
 * the transaction.  (A function body counts as a block for Citus unless
 * function_opens_transaction_block is off.)
 */
static void
fs_cluster_run_forward(int32 node, const char *function, bool by_anchor, int nargs,
					   Oid *argtypes, Datum *values, const char *nulls,
					   Datum *result, bool *isnull)
{
	int			nestlevel = fs_cluster_route_begin();

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute_plan(fs_cluster_forward_plan(function, by_anchor, nargs, argtypes),
						 values, nulls, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("%s%s() on node group %d returned no row", function,
						by_anchor ? "_at" : "", node)));
	*result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, isnull);
	if (!*isnull)
		*result = SPI_datumTransfer(*result, TupleDescAttr(SPI_tuptable->tupdesc, 0)->attbyval,
									TupleDescAttr(SPI_tuptable->tupdesc, 0)->attlen);
	SPI_finish();
	fs_cluster_route_end(nestlevel);
}

/*
 * Run `function`_at(anchor, values[1..]) on node group `node`: the anchor
 * (values[0], filled in here) is a value whose shard is there, by which
 * Citus delegates the call (fs_cluster_run_forward()).
 */
void
fs_cluster_forward(int32 node, const char *function, int nargs, Oid *argtypes, Datum *values,
				   Datum *result, bool *isnull)
{
	char	   *anchor = fs_cluster_anchor(node);

	if (anchor == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("node group %d holds no shard of \"%s\"", node, get_rel_name(setup_table)),
				 errhint("The node left the cluster, or holds no shard since a rebalance.")));
	values[0] = CStringGetTextDatum(anchor);
	fs_cluster_run_forward(node, function, true, nargs, argtypes, values, NULL, result, isnull);
}

/*
 * Send the call in `fcinfo` of `function`, delegated by its tenant
 * (argument 0), to the tenant's node through Citus
 * (fs_cluster_run_forward()).
 */
static void
fs_cluster_forward_tenant(const char *function, FunctionCallInfo fcinfo, Datum *result)
{
	Oid			argtypes[FUNC_MAX_ARGS];
	Datum		values[FUNC_MAX_ARGS];
	char		nulls[FUNC_MAX_ARGS];
	int			i;

	for (i = 0; i < PG_NARGS(); i++)
	{
		argtypes[i] = get_fn_expr_argtype(fcinfo->flinfo, i);
		if (!OidIsValid(argtypes[i]))
			elog(ERROR, "could not tell the type of argument %d of %s()", i + 1, function);
		values[i] = PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	fs_cluster_run_forward(fs_cluster_tenant_group(text_to_cstring(PG_GETARG_TEXT_PP(0))),
						   function, false, PG_NARGS(), argtypes, values, nulls,
						   result, &fcinfo->isnull);
}

/* The shard map of the setup, loaded; false when not set up. */
static bool
fs_cluster_map_ready(void)
{
	Oid			table = fs_cluster_setup_table();

	if (!OidIsValid(table))
		return false;
	if (!map_valid)
		fs_cluster_load_map(table);
	return true;
}

/*
 * Send a release or renew of another node's lease, the call in `fcinfo`,
 * to that node: relayed when it is its statement's whole work outside a
 * transaction block on the coordinator (relay.c), else through Citus.
 * `lease_usecs` < 0: a release.  False when this database is not set up
 * for a cluster (the lease is unknown here); otherwise *result and *isnull
 * are the node's answer.
 */
bool
fs_cluster_forward_lease(FunctionCallInfo fcinfo, const char *function, int64 lease_id,
						 int64 lease_usecs, bool *result, bool *isnull)
{
	Oid			argtypes[3] = {TEXTOID, INT8OID, INTERVALOID};
	Datum		values[3];
	Datum		answer;
	Interval	interval;

	if (!fs_cluster_map_ready())
		return false;
	if (fs_cluster_anchor(fs_lease_id_node(lease_id)) == NULL)
	{
		/* The coordinator holds no shard: Citus cannot send a call there. */
		if (fs_lease_id_node(lease_id) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("lease " INT64_FORMAT " was granted by the coordinator", lease_id),
					 errhint("Call %s() on the coordinator.", function)));
		*result = false;		/* no node of that group holds anything: unknown */
		*isnull = false;
		return true;
	}
	if (fs_relay_enabled && fs_cluster_group() == 0 && !IsTransactionBlock() &&
		fs_relay_sole_call(fcinfo) &&
		fs_relay_call(fs_lease_id_node(lease_id), function, fcinfo, &answer))
	{
		*isnull = fcinfo->isnull;
		*result = *isnull ? false : DatumGetBool(answer);
		return true;
	}
	interval.month = 0;
	interval.day = 0;
	interval.time = Max(lease_usecs, 0);
	values[1] = Int64GetDatum(lease_id);
	values[2] = IntervalPGetDatum(&interval);
	fs_cluster_forward(fs_lease_id_node(lease_id), function, lease_usecs >= 0 ? 3 : 2,
					   argtypes, values, &answer, isnull);
	*result = *isnull ? false : DatumGetBool(answer);
	return true;
}

/*
 * The node groups that hold shards of the setup's table, and so of every
 * table colocated with it, ascending, into groups[] (room for
 * FS_LEASE_NODE_MAX + 1).  Returns how many; 0 when this database is not
 * set up for a cluster.
 */
int
fs_cluster_node_groups(int32 *groups)
{
	bool		held[FS_LEASE_NODE_MAX + 1];
	int			n = 0;
	int			i;

	if (!fs_cluster_map_ready())
		return 0;
	memset(held, 0, sizeof(held));
	for (i = 0; i < map_count; i++)
		if (map_shards[i].group >= 0 && map_shards[i].group <= FS_LEASE_NODE_MAX)
			held[map_shards[i].group] = true;
	for (i = 0; i <= FS_LEASE_NODE_MAX; i++)
		if (held[i])
			groups[n++] = i;
	return n;
}

/*
 * A value whose shard of the setup's table is on node group `group`, by
 * which Citus delegates an _at function there; NULL when no shard is there
 * (or this database is not set up for a cluster).
 */
char *
fs_cluster_node_anchor(int32 group)
{
	if (group < 0 || group > FS_LEASE_NODE_MAX || !fs_cluster_map_ready())
		return NULL;
	return fs_cluster_anchor(group);
}

/* A forward of fs_cluster_broadcast(), run in a subtransaction. */
typedef struct FsBroadcastOne
{
	int32		node;
	const char *function;
	int			nargs;
	Oid		   *argtypes;
	Datum	   *values;
} FsBroadcastOne;

static void
fs_cluster_broadcast_one(void *arg)
{
	FsBroadcastOne *b = arg;
	Datum		answer;
	bool		isnull;

	fs_cluster_forward(b->node, b->function, b->nargs, b->argtypes, b->values, &answer, &isnull);
}

/*
 * On the coordinator, run `function`_at(anchor, values[1..]) on every node
 * that holds shards, each in a subtransaction: a node that cannot be
 * reached is a warning, not the caller's error.  Nothing on a worker node
 * (what is sent there is that node's own), nor when this database is not
 * set up for a cluster.
 */
void
fs_cluster_broadcast(const char *function, int nargs, Oid *argtypes, Datum *values)
{
	bool		sent[FS_LEASE_NODE_MAX + 1];
	int32		here;
	int			i;

	here = fs_cluster_group();
	if (here != 0 || !fs_cluster_map_ready())
		return;
	memset(sent, 0, sizeof(sent));
	for (i = 0; i < map_count; i++)
	{
		int32		node = map_shards[i].group;
		FsBroadcastOne one = {node, function, nargs, argtypes, values};
		ErrorData  *edata;

		if (node == here || node < 0 || node > FS_LEASE_NODE_MAX || sent[node])
			continue;
		sent[node] = true;
		if (!fs_subxact_run(fs_cluster_broadcast_one, &one, NULL, &edata))
		{
			ereport(WARNING,
					(errcode(edata->sqlerrcode),
					 errmsg("could not send %s() to node group %d: %s", function, node, edata->message),
					 errhint("The other nodes got it; this one gets the next.")));
			FreeErrorData(edata);
		}

		/*
		 * An invalidation meanwhile (a shard moved, a cache reset): load the
		 * map again and go on with the nodes not sent to yet.
		 */
		if (!map_valid)
		{
			if (!fs_cluster_map_ready())
				return;
			i = -1;
		}
	}
}

/*
 * In `function`_at(), which Citus delegated by its anchor: refuse a lease
 * of another node (the anchor's shard moved since it was chosen), never
 * sending it on.
 */
void
fs_cluster_check_lease_here(const char *function, int64 lease_id)
{
	int64		local_id;

	if (!fs_lease_id_in(lease_id, &local_id))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s_at() for lease " INT64_FORMAT " ran on node group %d, not on group %d that granted it",
						function, lease_id, fs_cluster_group(), fs_lease_id_node(lease_id)),
				 errhint("A shard moved meanwhile; call %s() again.", function)));
}

/*
 * In `function` (an _at function), which Citus delegates by its anchor
 * (argument 0): refuse to run on a node that does not hold the anchor's
 * shard, where the call was not delegated or whose shard moved since the
 * anchor was chosen, so that what was meant for one node never runs on
 * another.
 */
void
fs_cluster_check_anchor_arg(FunctionCallInfo fcinfo, const char *function)
{
	char	   *anchor;
	int32		owner;
	int32		here;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("node_anchor must not be null"),
				 errhint("%s() is what fs_claim() on a Citus coordinator calls; call fs_claim().",
						 function)));
	anchor = text_to_cstring(PG_GETARG_TEXT_PP(0));
	owner = fs_cluster_tenant_group(anchor);
	here = fs_cluster_group();
	if (owner < 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s() needs a Citus cluster set up with fs_citus_setup()", function),
				 errhint("Call fs_claim() instead.")));
	if (owner != here)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s() ran on node group %d, not on group %d that holds its anchor's shard",
						function, here, owner),
				 errhint("A shard moved meanwhile, or Citus did not delegate the call (it delegates a "
						 "top-level call only); call fs_claim().")));
	pfree(anchor);
}

/*
 * Refuse `function` on a worker node of a cluster set up with
 * fs_citus_setup(): schedules are kept and run on the coordinator only, so
 * that one scheduler claims each run, once for the cluster.
 */
void
fs_cluster_check_coordinator(const char *function)
{
	int32		here = fs_cluster_group();

	if (here > 0 && OidIsValid(fs_cluster_setup_table()))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s() runs on the coordinator, not on node group %d", function, here),
				 errdetail("On a Citus cluster, schedules are kept and run on the coordinator only."),
				 errhint("Connect to the coordinator and call it there.")));
}

/*
 * Whether DDL on `relid` (its triggers, its indexes) is the coordinator's
 * alone: a table Citus distributes, seen from another node.  Citus carries
 * the coordinator's DDL to every node's copy of the table and to its
 * shards, and refuses the same DDL on a node.
 */
bool
fs_cluster_ddl_is_coordinators(Oid relid)
{
	return fs_cluster_group() != 0 && fs_cluster_is_distributed(relid);
}

/*
 * Whether `relid` is a table Citus distributes (a distributed or reference
 * table; not a Citus local table, which is the coordinator's own).  False
 * without Citus.
 */
bool
fs_cluster_is_distributed(Oid relid)
{
	Oid			catalog;
	AttrNumber	attnum;
	AttrNumber	method_attnum;
	AttrNumber	model_attnum;
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		found = false;

	if (!fs_cluster_citus_here())
		return false;
	catalog = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	if (!OidIsValid(catalog))
		return false;
	attnum = fs_catalog_attnum(catalog, "logicalrelid");
	method_attnum = fs_catalog_attnum(catalog, "partmethod");
	model_attnum = fs_catalog_attnum(catalog, "repmodel");
	scan = fs_catalog_scan_begin(catalog, &rel);
	while (!found && HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, attnum, RelationGetDescr(rel), &isnull);

		if (isnull || DatumGetObjectId(d) != relid)
			continue;
		/* A Citus local table (no distribution, one placement) is local. */
		found = !(DatumGetChar(heap_getattr(tuple, method_attnum, RelationGetDescr(rel), &isnull)) == 'n' &&
				  DatumGetChar(heap_getattr(tuple, model_attnum, RelationGetDescr(rel), &isnull)) == 's');
		break;
	}
	fs_catalog_scan_end(scan, rel);
	return found;
}

/*
 * fs_tenant_node(tenant text) RETURNS integer: the group of the node that
 * decides for `tenant`, NULL when this database is not set up for a
 * cluster.
 */
Datum
fs_tenant_node(PG_FUNCTION_ARGS)
{
	char		tenant[FS_NAME_BUFLEN];
	int32		group;

	fs_check_loaded();
	fs_name_arg(fcinfo, 0, "tenant", tenant);
	group = fs_cluster_tenant_group(tenant);
	if (group < 0)
		PG_RETURN_NULL();
	PG_RETURN_INT32(group);
}

static int
fs_local_shard_cmp(const void *a, const void *b)
{
	const FsLocalShard *x = a;
	const FsLocalShard *y = b;

	return (x->min_hash > y->min_hash) - (x->min_hash < y->min_hash);
}

/*
 * The shards of distributed table `relid` whose active placement is on this
 * node, sorted by hash range, in *shards (palloc'd); returns how many.  A
 * shard whose table is not here (a move under way) is left out.
 */
int
fs_cluster_local_shards(Oid relid, FsLocalShard **shards)
{
	int32		here = fs_cluster_group();
	char	   *relname = get_rel_name(relid);
	Oid			namespace = get_rel_namespace(relid);
	FsShardRow *rows;
	FsLocalShard *local;
	int			count;
	int			kept = 0;

	*shards = NULL;
	if (relname == NULL)
		return 0;
	count = fs_cluster_scan_shards(relid, &rows);
	local = palloc(sizeof(FsLocalShard) * Max(count, 1));
	for (int i = 0; i < count; i++)
	{
		char		name[NAMEDATALEN * 2];
		Oid			shard_relid;

		if (rows[i].group != here)
			continue;
		/* Citus names a shard's table after its table and its id. */
		snprintf(name, sizeof(name), "%s_" INT64_FORMAT, relname, rows[i].shard_id);
		if (strlen(name) >= NAMEDATALEN)
			continue;			/* Citus shortens such names: refused at registration */
		shard_relid = get_relname_relid(name, namespace);
		if (!OidIsValid(shard_relid))
			continue;
		local[kept].shard_id = rows[i].shard_id;
		local[kept].relid = shard_relid;
		local[kept].min_hash = rows[i].min_hash;
		local[kept].max_hash = rows[i].max_hash;
		kept++;
	}
	pfree(rows);
	qsort(local, kept, sizeof(FsLocalShard), fs_local_shard_cmp);
	*shards = local;
	return kept;
}

/*
 * The distributed table whose shard `relid` is on this node (its name is
 * the table's and the shard's id), or InvalidOid.  For the row triggers:
 * Citus copies a distributed table's triggers to its shards, where they
 * fire.
 */
Oid
fs_cluster_shard_parent(Oid relid)
{
	Oid			shard_catalog;
	char	   *relname;
	char	   *underscore;
	char	   *end;
	int64		shard_id;
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			parent = InvalidOid;

	if (!fs_cluster_citus_here())
		return InvalidOid;
	relname = get_rel_name(relid);
	if (relname == NULL || (underscore = strrchr(relname, '_')) == NULL ||
		underscore[1] < '0' || underscore[1] > '9')
		return InvalidOid;
	errno = 0;
	shard_id = strtoi64(underscore + 1, &end, 10);
	if (errno != 0 || *end != '\0' || shard_id <= 0)
		return InvalidOid;
	shard_catalog = get_relname_relid("pg_dist_shard", PG_CATALOG_NAMESPACE);
	if (!OidIsValid(shard_catalog))
		return InvalidOid;
	{
		AttrNumber	a_rel = fs_catalog_attnum(shard_catalog, "logicalrelid");
		AttrNumber	a_id = fs_catalog_attnum(shard_catalog, "shardid");

		scan = fs_catalog_scan_begin(shard_catalog, &rel);
		while (HeapTupleIsValid(tuple = systable_getnext(scan)))
		{
			bool		isnull;

			if (DatumGetInt64(heap_getattr(tuple, a_id, RelationGetDescr(rel), &isnull)) != shard_id)
				continue;
			parent = DatumGetObjectId(heap_getattr(tuple, a_rel, RelationGetDescr(rel), &isnull));
			break;
		}
		fs_catalog_scan_end(scan, rel);
	}
	if (OidIsValid(parent))
	{
		char	   *parent_name = get_rel_name(parent);

		/* The same name and schema, or it is some other table. */
		if (parent_name == NULL || get_rel_namespace(parent) != get_rel_namespace(relid) ||
			strlen(parent_name) != (size_t) (underscore - relname) ||
			strncmp(parent_name, relname, underscore - relname) != 0)
			parent = InvalidOid;
	}
	return parent;
}

/*
 * Why distributed table `relid` cannot be a queue's table whose tenant is
 * column `tenant_attnum` (0: not a plain column; -1: not checked), or NULL
 * when it can: it
 * must be colocated with the table fs_citus_setup() named (so that every
 * node serves the tenants it decides for) and distributed by that column
 * (so that a tenant's rows are in one shard).  A reference table has no
 * tenant's node.
 */
char *
fs_cluster_queue_table_problem(Oid relid, AttrNumber tenant_attnum)
{
	Oid			setup = fs_cluster_setup_table();
	Oid			argtypes[2] = {OIDOID, OIDOID};
	Datum		values[2];
	char	   *problem = NULL;
	bool		isnull;
	MemoryContext caller = CurrentMemoryContext;

	if (!OidIsValid(setup))
		return psprintf("this database is not set up for Citus: call fs_citus_setup() on the "
						"coordinator first");
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	values[0] = ObjectIdGetDatum(relid);
	values[1] = ObjectIdGetDatum(setup);
	if (SPI_execute_with_args("SELECT p.partmethod::pg_catalog.text,"
							  "       p.colocationid OPERATOR(pg_catalog.=) s.colocationid,"
							  "       a.attnum"
							  "  FROM pg_catalog.pg_dist_partition p"
							  "  JOIN pg_catalog.pg_dist_partition s ON s.logicalrelid OPERATOR(pg_catalog.=) $2"
							  "  LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) p.logicalrelid"
							  "   AND a.attname OPERATOR(pg_catalog.=) pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)"
							  " WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1",
							  2, argtypes, values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read pg_dist_partition");
	if (SPI_processed != 1)
		problem = psprintf("it is not distributed");
	else
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	rowdesc = SPI_tuptable->tupdesc;
		char	   *method = SPI_getvalue(row, rowdesc, 1);
		bool		colocated = DatumGetBool(SPI_getbinval(row, rowdesc, 2, &isnull));
		Datum		attnum = SPI_getbinval(row, rowdesc, 3, &isnull);

		if (method == NULL || strcmp(method, "h") != 0)
			problem = psprintf("it is not distributed by hash (a reference table has no tenant's node)");
		else if (!colocated)
			problem = psprintf("it is not colocated with %s, the table fs_citus_setup() named",
							   get_rel_name(setup));
		else if (tenant_attnum >= 0 &&
				 (isnull || tenant_attnum == 0 || DatumGetInt16(attnum) != tenant_attnum))
			problem = psprintf("its tenant expression is not its distribution column");
	}
	if (problem != NULL)
		problem = MemoryContextStrdup(caller, problem);
	SPI_finish();
	return problem;
}

/*
 * The name of the distribution column of distributed table `relid`, or
 * NULL (a reference table, or not distributed).
 */
char *
fs_cluster_distribution_column(Oid relid)
{
	MemoryContext caller = CurrentMemoryContext;
	Oid			argtypes[1] = {OIDOID};
	Datum		values[1];
	char	   *column = NULL;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	values[0] = ObjectIdGetDatum(relid);
	if (SPI_execute_with_args("SELECT pg_catalog.column_to_column_name(logicalrelid, partkey)"
							  "  FROM pg_catalog.pg_dist_partition"
							  " WHERE logicalrelid OPERATOR(pg_catalog.=) $1 AND partkey IS NOT NULL",
							  1, argtypes, values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read pg_dist_partition");
	if (SPI_processed == 1)
	{
		char	   *name = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		if (name != NULL)
			column = MemoryContextStrdup(caller, name);
	}
	SPI_finish();
	return column;
}

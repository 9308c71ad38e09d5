/*-------------------------------------------------------------------------
 *
 * route.c
 *	  Claims on the coordinator of a Citus cluster: a queue on a table
 *	  Citus distributes is claimed from the worker nodes, in one fair order
 *	  across all their tenants.
 *
 * Each node keeps the exact fair order of the tenants whose shards it
 * holds (order.c).  The coordinator shares a backend's claims among the
 * nodes by stride scheduling over their claimable weights: a node's
 * weight W is the sum of the weights of its tenants that a claim could
 * serve now (fs_claimable_weight_at(): ready rows, budget, a free slot),
 * and each node has a pass.  A claim goes to the node of smallest pass,
 * whose pass then moves on by the rows it gave / W.  So a node serves
 * W / sum(W) of the rows, and within it each tenant of weight w serves
 * w / W of those (its node's fair order): w / sum(W) in all, the share it
 * has on one server.  Each backend shares its own claims so, and a sum of
 * backends then shares in the same proportions.  A node whose weight
 * becomes positive starts at the pass of the last pick (vtime), not
 * behind it: it gets no credit for the time it had nothing to serve.
 *
 * The weights are kept in shared memory, by database, queue and node,
 * asked of the nodes by the scheduler (fs_route_refresh_one()) every
 * FS_ROUTE_ASK_USECS while claims through the coordinator want them, each
 * ask in a transaction of its own.  A backend asks the nodes itself only
 * outside a transaction block, when the weights are older than
 * FS_ROUTE_STALE_USECS (the scheduler runs in another database, or is
 * behind); in a block it never does (below).  A node that gave a claim no
 * rows counts as drained, for every backend, until the next ask (not when
 * the claim had a selection: its rows may be elsewhere); one that gave
 * fewer than asked, for the rest of that claim.  Weights never asked count
 * as 1 each.  When no node has weight the nodes are tried in turn, so that
 * rows the weights do not show yet (a slot freed since the ask, a tenant
 * not counted yet) are found within a turn of claims.
 *
 * A claim is sent as SELECT * FROM fs_claim_at(anchor, ...), a weight as
 * fs_claimable_weight_at(anchor, ...), each with an anchor whose shard is
 * on the node, by which Citus delegates the call there (force_delegation).
 * In a transaction block the call joins the caller's transaction on that
 * node, so the claimed rows stay locked on their shards until the caller
 * commits, and later statements on those shards use the same connection;
 * outside one the node runs it on its own.  Citus counts a delegated call
 * in a block as a change of its node, and commits a transaction that
 * changed two nodes in two phases, which a transaction that claimed cannot
 * do.  So in a block a claim takes rows from one node, and every claim of
 * the transaction from the same node; outside one, a node that gives no
 * rows is followed by the next.

 * The passes are the backend's, by queue name; the weights are shared, under
 * route_shared->mutex, which is held only to copy entries in or out.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "storage/proc.h"
#include "storage/spin.h"
#include "storage/shmem.h"

#include "core/cluster.h"
#include "core/common.h"
#include "fairq/fairqueue_int.h"

/* How often the scheduler asks the nodes their claimable weights. */
#define FS_ROUTE_ASK_USECS		(25 * 1000)
/* Weights older than this are asked again by a claim outside a block. */
#define FS_ROUTE_STALE_USECS	(1000 * 1000)
/* The scheduler asks for a queue while a claim wanted it this recently. */
#define FS_ROUTE_WANTED_USECS	(10 * 1000 * 1000)
/* The bounds of a node's weight as kept (a tenant's weight may be tiny). */
#define FS_ROUTE_MIN_WEIGHT		1e-6
#define FS_ROUTE_MAX_WEIGHT		1e12
/* Room for (queue, node) weights. */
#define FS_ROUTE_ENTRIES		FS_ROUTE_WANTS_MAX

/* One node's claimable weight of one queue, shared. */
typedef struct FsRouteEntry
{
	Oid			dboid;			/* the queue's database */
	char		queue_name[FS_NAME_BUFLEN];	/* "": a free entry */
	int32		group;
	float8		weight;			/* < 0: never asked */
	TimestampTz asked_at;		/* 0: never */
	TimestampTz wanted_at;		/* when a claim last read it */
} FsRouteEntry;

typedef struct FsRouteShared
{
	slock_t		mutex;			/* everything below */
	int			refresher_procno;	/* the scheduler's, or -1 */
	FsRouteEntry entries[FS_ROUTE_ENTRIES];
} FsRouteShared;

static FsRouteShared *route_shared = NULL;

/* The transaction (FS_MY_LXID) whose claims keep to route_xact_group. */
static LocalTransactionId route_xact_lxid = InvalidLocalTransactionId;
static int32 route_xact_group = -1;

/* One node, as a backend's claims see it. */
typedef struct FsRouteNode
{
	int32		group;			/* Citus node group */
	float8		weight;			/* claimable weight as last read; 0: none, or
								 * drained since */
	float8		pass;			/* moves on by rows / weight at each claim */
	bool		tried;			/* in the current claim */
} FsRouteNode;

typedef struct FsRoute
{
	char		queue_name[FS_NAME_BUFLEN];	/* hash key: must be first */
	int			nnodes;
	FsRouteNode *nodes;			/* by group, ascending */
	float8		vtime;			/* the pass the last pick was made at */
	int			probed;			/* index of the last node tried without weight */
} FsRoute;

/* ----------------------------------------------------------------
 * The shared weights
 * ----------------------------------------------------------------
 */

Size
fs_route_shmem_size(void)
{
	return MAXALIGN(sizeof(FsRouteShared));
}

/* Create (or attach to) the shared weights.  Caller holds AddinShmemInitLock. */
void
fs_route_shmem_init(void)
{
	bool		found;

	route_shared = ShmemInitStruct("fairshare claim routing", sizeof(FsRouteShared), &found);
	if (!found)
	{
		memset(route_shared, 0, sizeof(FsRouteShared));
		SpinLockInit(&route_shared->mutex);
		route_shared->refresher_procno = -1;
	}
}

/* The entry of (queue, group), or NULL.  Under the mutex. */
static FsRouteEntry *
fs_route_entry_locked(const char *queue, int32 group)
{
	int			i;

	for (i = 0; i < FS_ROUTE_ENTRIES; i++)
	{
		FsRouteEntry *e = &route_shared->entries[i];

		if (e->group == group && e->dboid == MyDatabaseId && strcmp(e->queue_name, queue) == 0)
			return e;
	}
	return NULL;
}

/*
 * The entry of (queue, group), made if there is none: a free entry, or else
 * the one wanted least recently.  Under the mutex.
 */
static FsRouteEntry *
fs_route_entry_make_locked(const char *queue, int32 group)
{
	FsRouteEntry *e = fs_route_entry_locked(queue, group);
	int			i;

	if (e != NULL)
		return e;
	for (i = 0; i < FS_ROUTE_ENTRIES; i++)
	{
		FsRouteEntry *c = &route_shared->entries[i];

		if (c->queue_name[0] == '\0')
		{
			e = c;
			break;
		}
		if (e == NULL || c->wanted_at < e->wanted_at)
			e = c;
	}
	e->dboid = MyDatabaseId;
	strlcpy(e->queue_name, queue, FS_NAME_BUFLEN);
	e->group = group;
	e->weight = -1;
	e->asked_at = 0;
	e->wanted_at = 0;
	return e;
}

/*
 * Keep what a node said of the queue's weight (weight >= 0), or that it
 * was asked and could not answer (weight < 0: the last one stays); with
 * `asked`, as of now.
 */
static void
fs_route_store(const char *queue, int32 group, float8 weight, bool asked)
{
	TimestampTz now = asked ? GetCurrentTimestamp() : 0;
	FsRouteEntry *e;

	SpinLockAcquire(&route_shared->mutex);
	e = fs_route_entry_make_locked(queue, group);
	if (weight >= 0)
		e->weight = weight;
	if (asked)
		e->asked_at = now;
	SpinLockRelease(&route_shared->mutex);
}

/*
 * Read the shared weights of `desc`'s queue into `route`, marking them
 * wanted; a node whose weight becomes positive starts no earlier than
 * vtime.  Returns the oldest ask among them (0: one was never asked).
 */
static TimestampTz
fs_route_read(FsFairDesc *desc, FsRoute *route)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz oldest = now;
	int			procno;
	int			i;

	SpinLockAcquire(&route_shared->mutex);
	for (i = 0; i < route->nnodes; i++)
	{
		FsRouteNode *node = &route->nodes[i];
		FsRouteEntry *e = fs_route_entry_make_locked(desc->queue_name, node->group);
		float8		was = node->weight;

		e->wanted_at = now;
		node->weight = e->weight < 0 ? 1 : e->weight;	/* never asked: 1 */
		if (was <= 0 && node->weight > 0)
			node->pass = Max(node->pass, route->vtime);
		oldest = Min(oldest, e->asked_at);
	}
	procno = route_shared->refresher_procno;
	SpinLockRelease(&route_shared->mutex);

	/* Weights the scheduler has not asked lately: wake it. */
	if (procno >= 0 && TimestampDifferenceExceeds(oldest, now, FS_ROUTE_ASK_USECS / 1000))
		SetLatch(&ProcGlobal->allProcs[procno].procLatch);
	return oldest;
}

/* The extension's schema, quoted, for the statements sent to the nodes. */
static const char *
fs_route_schema(void)
{
	return quote_identifier(get_namespace_name(
		fs_get_extension_schema(get_extension_oid("fairshare", false))));
}

/*
 * Ask node group `group` its claimable weight of `queue` (a delegated call
 * of fs_claimable_weight_at()) and keep it.  Outside a transaction block
 * (the call is the node's own).
 */
static float8
fs_route_ask(const char *queue, int32 group)
{
	Oid			argtypes[2] = {TEXTOID, TEXTOID};
	Datum		values[2];
	Datum		answer;
	bool		isnull;
	float8		weight = 0;

	if (fs_cluster_node_anchor(group) != NULL)
	{
		values[1] = CStringGetTextDatum(queue);
		fs_cluster_forward(group, "fs_claimable_weight", 2, argtypes, values, &answer, &isnull);
		/* Kept within bounds, so that a pass moves on by a finite step. */
		if (!isnull && DatumGetFloat8(answer) > 0)
			weight = Min(Max(DatumGetFloat8(answer), FS_ROUTE_MIN_WEIGHT), FS_ROUTE_MAX_WEIGHT);
	}
	fs_route_store(queue, group, weight, true);
	return weight;
}

/* ----------------------------------------------------------------
 * The scheduler's part
 * ----------------------------------------------------------------
 */

/* The scheduler's latch is woken when weights are wanted (or not). */
void
fs_route_refresher_attach(bool attach)
{
	SpinLockAcquire(&route_shared->mutex);
	route_shared->refresher_procno = attach ? FS_MY_PGPROC_INDEX : -1;
	SpinLockRelease(&route_shared->mutex);
}

/*
 * Milliseconds until the scheduler should ask the weights again: 0 when
 * some wanted weight is older than FS_ROUTE_ASK_USECS, -1 when none is
 * wanted.
 */
long
fs_route_refresh_due_ms(void)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz oldest = 0;
	bool		wanted = false;
	int			i;

	SpinLockAcquire(&route_shared->mutex);
	for (i = 0; i < FS_ROUTE_ENTRIES; i++)
	{
		FsRouteEntry *e = &route_shared->entries[i];

		if (e->queue_name[0] == '\0' || e->dboid != MyDatabaseId ||
			TimestampDifferenceExceeds(e->wanted_at, now, FS_ROUTE_WANTED_USECS / 1000))
			continue;
		if (!wanted || e->asked_at < oldest)
			oldest = e->asked_at;
		wanted = true;
	}
	SpinLockRelease(&route_shared->mutex);
	if (!wanted)
		return -1;
	return Max(0, (long) ((oldest + FS_ROUTE_ASK_USECS - now) / 1000));
}

/*
 * Copy into wants[] (room for FS_ROUTE_WANTS_MAX) the (queue, node) weights
 * that claims want now; returns how many.
 */
int
fs_route_wants(FsRouteWant *wants)
{
	TimestampTz now = GetCurrentTimestamp();
	int			n = 0;
	int			i;

	SpinLockAcquire(&route_shared->mutex);
	for (i = 0; i < FS_ROUTE_ENTRIES && n < FS_ROUTE_WANTS_MAX; i++)
	{
		FsRouteEntry *e = &route_shared->entries[i];

		if (e->queue_name[0] == '\0' || e->dboid != MyDatabaseId ||
			TimestampDifferenceExceeds(e->wanted_at, now, FS_ROUTE_WANTED_USECS / 1000))
			continue;
		memcpy(wants[n].queue_name, e->queue_name, FS_NAME_BUFLEN);
		wants[n].group = e->group;
		n++;
	}
	SpinLockRelease(&route_shared->mutex);
	return n;
}

/*
 * In the scheduler, after an ask that failed: the node keeps its last
 * weight, asked again at the next round (not at once).
 */
void
fs_route_refresh_failed(const FsRouteWant *want)
{
	fs_route_store(want->queue_name, want->group, -1, true);
}

/*
 * In the scheduler, in a transaction of its own (not a block, and no
 * subtransaction: Citus would then coordinate it, and commit it in two
 * phases on every node): ask one node one queue's weight, and keep it.
 */
void
fs_route_refresh_one(const FsRouteWant *want)
{
	if (get_extension_oid("fairshare", true) == InvalidOid)
		fs_route_store(want->queue_name, want->group, -1, true);
	else
		(void) fs_route_ask(want->queue_name, want->group);
}

/* ----------------------------------------------------------------
 * Claims
 * ----------------------------------------------------------------
 */

/* This backend's routes, by queue name: they outlive its descriptors. */
static HTAB *routes = NULL;

/*
 * The route of `desc`'s queue, its nodes those that hold shards now: a
 * node that stays keeps its pass and weight, a new one starts at vtime.
 */
static FsRoute *
fs_route_nodes(FsFairDesc *desc)
{
	FsRoute    *route;
	int32		groups[FS_LEASE_NODE_MAX + 1];
	int			n = fs_cluster_node_groups(groups);
	FsRouteNode *nodes;
	bool		found;
	int			i;
	int			j = 0;

	if (routes == NULL)
	{
		HASHCTL		info;

		memset(&info, 0, sizeof(info));
		info.keysize = FS_NAME_BUFLEN;
		info.entrysize = sizeof(FsRoute);
		routes = hash_create("fairshare claim routes", 16, &info, HASH_ELEM | HASH_STRINGS);
	}
	route = hash_search(routes, desc->queue_name, HASH_ENTER, &found);
	if (!found)
	{
		route->nnodes = 0;
		route->nodes = NULL;
		route->vtime = 0;
		route->probed = -1;
	}
	if (n == route->nnodes)
	{
		for (i = 0; i < n && route->nodes[i].group == groups[i]; i++)
			;
		if (i == n)
			return route;
	}
	nodes = MemoryContextAllocZero(TopMemoryContext, sizeof(FsRouteNode) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		while (j < route->nnodes && route->nodes[j].group < groups[i])
			j++;
		if (j < route->nnodes && route->nodes[j].group == groups[i])
			nodes[i] = route->nodes[j];
		else
			nodes[i].pass = route->vtime;
		nodes[i].group = groups[i];
	}
	if (route->nodes != NULL)
		pfree(route->nodes);
	route->nodes = nodes;
	route->nnodes = n;
	return route;
}

/*
 * The untried node to claim from next: of those with weight, the one of
 * smallest pass (the lower group on a tie).  When none has weight, the
 * untried node after the one so tried last, in turn: the weights are up
 * to an ask old, and rows that came since (a slot freed, a tenant not
 * counted yet) are then found on any node within a turn of claims, not
 * only on the one a stale weight points to.  NULL when none is left.
 */
static FsRouteNode *
fs_route_pick(FsRoute *route)
{
	FsRouteNode *best = NULL;
	int			i;

	for (i = 0; i < route->nnodes; i++)
	{
		FsRouteNode *node = &route->nodes[i];

		if (node->tried || node->weight <= 0)
			continue;
		if (best == NULL || node->pass < best->pass)
			best = node;
	}
	for (i = 1; best == NULL && i <= route->nnodes; i++)
	{
		int			k = (route->probed + i) % route->nnodes;	/* probed >= -1 */

		if (!route->nodes[k].tried)
		{
			best = &route->nodes[k];
			route->probed = k;
		}
	}
	return best;
}

/*
 * Claim up to `want` rows on `node` with fs_claim_at() and add them to
 * `rsinfo`'s result; returns how many.  The claim's arguments after the
 * queue are fcinfo's, as given.  In SPI.
 */
static int32
fs_route_claim(FunctionCallInfo fcinfo, FsFairDesc *desc, FsRouteNode *node, int32 want,
			   ReturnSetInfo *rsinfo, const char *schema)
{
	char	   *anchor = fs_cluster_node_anchor(node->group);
	char	   *sql;
	Oid			argtypes[7] = {TEXTOID, TEXTOID, desc->row_type, INT4OID, INTERVALOID,
	TEXTARRAYOID, TEXTARRAYOID};
	Datum		values[7];
	char		nulls[7] = {' ', ' ', 'n', ' ', ' ', ' ', ' '};
	uint64		got;
	uint64		i;
	int			a;
	int			ret;

	if (anchor == NULL)
		return 0;				/* no shard there any more */
	sql = psprintf("SELECT lease_id, tenant, job FROM %s.fs_claim_at($1, $2, $3, $4, $5, $6, $7)",
				   schema);
	values[0] = CStringGetTextDatum(anchor);
	values[1] = CStringGetTextDatum(desc->queue_name);
	values[2] = (Datum) 0;
	values[3] = Int32GetDatum(want);
	/* lease, selector_in and selector_not_in: fs_claim()'s arguments 3 to 5 */
	for (a = 4; a < 7; a++)
	{
		if (PG_NARGS() <= a - 1 || PG_ARGISNULL(a - 1))
		{
			values[a] = (Datum) 0;
			nulls[a] = 'n';
		}
		else
			values[a] = PG_GETARG_DATUM(a - 1);
	}
	ret = SPI_execute_with_args(sql, 7, argtypes, values, nulls, false, 0);
	if (ret != SPI_OK_SELECT)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("fs_claim_at() on node group %d failed: %s", node->group,
						SPI_result_code_string(ret))));
	if (SPI_processed > (uint64) want)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("fs_claim_at() on node group %d returned " UINT64_FORMAT " rows for a claim of %d",
						node->group, SPI_processed, want)));
	got = SPI_processed;
	for (i = 0; i < got; i++)
	{
		Datum		row[3];
		bool		isnull[3];
		int			c;

		for (c = 0; c < 3; c++)
			row[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, c + 1, &isnull[c]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row, isnull);
	}
	SPI_freetuptable(SPI_tuptable);
	pfree(sql);
	return (int32) got;
}

/*
 * fs_claim() on the coordinator of a queue on a distributed table: claim
 * up to `max_rows` rows from the nodes, in the order the header describes,
 * into `rsinfo`'s result.  The caller checked the arguments.
 */
void
fs_claim_routed(FunctionCallInfo fcinfo, FsFairDesc *desc, int32 max_rows, ReturnSetInfo *rsinfo)
{
	FsRoute    *route;
	const char *schema;
	bool		in_block = IsTransactionBlock();
	int32		claimed = 0;
	int			nestlevel;
	int			i;

	route = fs_route_nodes(desc);
	if (route->nnodes == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("no node holds a shard of queue \"%s\"'s table", desc->queue_name),
				 errhint("Run fs_citus_setup() on the coordinator, with worker nodes in the cluster.")));
	if (route_xact_lxid != FS_MY_LXID)
		route_xact_group = -1;
	schema = fs_route_schema();
	nestlevel = fs_cluster_route_begin();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/*
	 * Weights the scheduler has not kept fresh are asked here, outside a
	 * block only.
	 */
	if (TimestampDifferenceExceeds(fs_route_read(desc, route), GetCurrentTimestamp(),
								   FS_ROUTE_STALE_USECS / 1000) && !in_block)
	{
		for (i = 0; i < route->nnodes; i++)
			(void) fs_route_ask(desc->queue_name, route->nodes[i].group);
		(void) fs_route_read(desc, route);
	}
	for (i = 0; i < route->nnodes; i++)
		route->nodes[i].tried = in_block && route_xact_group >= 0 &&
			route->nodes[i].group != route_xact_group;

	while (claimed < max_rows)
	{
		FsRouteNode *node = fs_route_pick(route);
		int32		want = max_rows - claimed;
		int32		got;

		CHECK_FOR_INTERRUPTS();
		if (node == NULL)
			break;
		node->tried = true;
		if (node->weight > 0)
			route->vtime = Max(route->vtime, node->pass);
		if (in_block)
		{
			route_xact_lxid = FS_MY_LXID;
			route_xact_group = node->group;
		}
		got = fs_route_claim(fcinfo, desc, node, want, rsinfo, schema);
		claimed += got;
		if (node->weight > 0)
			node->pass += got / node->weight;
		/*
		 * Short: drained for the rest of this claim.  Empty, and not for
		 * want of a selection: drained for every backend until the next ask.
		 */
		if (got < want)
			node->weight = 0;
		if (got == 0 && PG_ARGISNULL(4) && PG_ARGISNULL(5))
			fs_route_store(desc->queue_name, node->group, 0, false);
		/* In a block, one node: the transaction keeps to it. */
		if (in_block || got > 0)
			break;
	}
	SPI_finish();
	fs_cluster_route_end(nestlevel);
}

/*-------------------------------------------------------------------------
 *
 * relay.c
 *	  A Citus coordinator's own connections to its nodes, for per-tenant
 *	  calls made alone outside a transaction block.
 *
 * On a coordinator, Citus delegates a top-level call of fs_acquire_slot(),
 * fs_spend_tokens() or fs_charge_tokens() to the node that owns the
 * tenant, and fairshare sends a release or renew of a node's lease there
 * through a delegated _at function.  Citus's distributed planning and
 * execution of such a call cost several times the call itself.  Outside a
 * transaction block the call is, on the node, a statement of its own that
 * commits there alone; sent over a connection of fairshare's own, as a
 * prepared statement, it has the same effect in one round trip.  That is
 * the relay:
 *
 *	- only a call that is its statement's whole work (fs_relay_sole_call():
 *	  the expression at the top of the plan of a statement a client sent),
 *	  so that nothing after it in the statement can fail and leave it made;
 *	- only outside a transaction block (the caller checks): inside one the
 *	  call joins the transaction on the node, as Citus delegates it;
 *	- one connection per node group and role, made as the current role to
 *	  the node's address in pg_dist_node with citus.node_conninfo's options,
 *	  as Citus connects.  When none can be made (a password that only
 *	  pg_dist_authinfo holds, a role that cannot log in), nothing was sent
 *	  and the caller goes through Citus; the failure is remembered for
 *	  FS_RELAY_RETRY_USECS, so that such a cluster pays one try per period;
 *	- an error on the node is raised here with its SQLSTATE, message,
 *	  detail and hint, and its notices and warnings as notices and
 *	  warnings.  An interrupt while the node answers closes the connection
 *	  (the node's backend ends when it finds it gone); whether the call was
 *	  made there is then unknown, and the error's context says so.
 *
 * The connections are this backend's and close with it, or when they are
 * older than citus.max_cached_connection_lifetime, as Citus's own do.  A
 * change of pg_dist_node (a node moved, removed or failed over),
 * pg_dist_authinfo or pg_dist_poolinfo closes them all at their next use.
 * A node that Citus reaches through a pooler (pg_dist_poolinfo) gets none:
 * Citus carries its calls.  Nothing here touches shared memory.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <poll.h>

#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "commands/dbcommands.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "libpq-fe.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/plannodes.h"
#include "storage/latch.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "tcop/pquery.h"
#include "tcop/utility.h"
#include "utils/portal.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "core/compat.h"
#include "core/relay.h"

/* fairshare.relay_calls */
bool		fs_relay_enabled = true;

#define FS_RELAY_LINKS			16	/* connections kept: node groups x roles */
#define FS_RELAY_FUNCTIONS		5	/* functions prepared on one connection */
#define FS_RELAY_RETRY_USECS	(10 * USECS_PER_SEC)
#define FS_RELAY_CONNECT_MSECS	5000

/* A connection to one node group, as one role. */
typedef struct FsRelayLink
{
	bool		used;
	int32		group;
	Oid			userid;
	PGconn	   *conn;			/* NULL: not connected */
	WaitEventSet *wait;			/* the latch, the postmaster and conn's socket */
	TimestampTz connected_at;	/* when conn was made */
	TimestampTz failed_at;		/* the last connection that failed; 0: none */
	const char *prepared[FS_RELAY_FUNCTIONS];	/* prepared on conn (callers' constants) */
} FsRelayLink;

static FsRelayLink links[FS_RELAY_LINKS];
static int	links_next_evicted = 0;
static bool links_stale = false;
/* Citus's tables, as the last connection made found them */
static Oid	node_relid = InvalidOid;	/* pg_dist_node */
static Oid	authinfo_relid = InvalidOid;	/* pg_dist_authinfo */
static Oid	poolinfo_relid = InvalidOid;	/* pg_dist_poolinfo */

/* Close `link`'s connection, if any. */
static void
fs_relay_close(FsRelayLink *link)
{
	if (link->wait != NULL)
		FreeWaitEventSet(link->wait);
	link->wait = NULL;
	if (link->conn != NULL)
		PQfinish(link->conn);
	link->conn = NULL;
	memset(link->prepared, 0, sizeof(link->prepared));
}

/*
 * A change of pg_dist_node, of how Citus connects to the nodes (Citus's
 * triggers on pg_dist_authinfo and pg_dist_poolinfo invalidate
 * pg_dist_authinfo), of who may read pg_dist_poolinfo, or a reset of every
 * cache: close at next use.
 */
static void
fs_relay_relcache_callback(Datum arg pg_attribute_unused(), Oid relid)
{
	if (relid == InvalidOid ||
		(OidIsValid(relid) &&
		 (relid == node_relid || relid == authinfo_relid || relid == poolinfo_relid)))
		links_stale = true;
}

/*
 * Executor runs and utility statements, nested: 1 while a client's own
 * statement is executed and nothing runs inside it.
 */
static int	statement_depth = 0;
static PlannedStmt *client_plan = NULL;	/* the plan run at depth 1 */
static ExecutorRun_hook_type prev_executor_run = NULL;
static ExecutorFinish_hook_type prev_executor_finish = NULL;
static ProcessUtility_hook_type prev_process_utility = NULL;

/*
 * ExecutorRun hook: count the depth.  The outermost run is the client's
 * plan when it is the portal's the client protocol runs: not SPI's during
 * planning, at a portal's start or at commit (deferred triggers).
 */
static void
fs_relay_executor_run(QueryDesc *queryDesc, ScanDirection direction, uint64 count,
					  bool execute_once)
{
	PlannedStmt *outer_plan = client_plan;

	/* A run at depth 0 that is not the active portal's is no client's statement. */
	if (statement_depth == 0)
		client_plan = ActivePortal != NULL && ActivePortal->queryDesc == queryDesc ?
			queryDesc->plannedstmt : NULL;
	statement_depth++;
	PG_TRY();
	{
		if (prev_executor_run != NULL)
			prev_executor_run(queryDesc, direction, count, execute_once);
		else
			standard_ExecutorRun(queryDesc, direction, count, execute_once);
	}
	PG_FINALLY();
	{
		statement_depth--;
		client_plan = outer_plan;
	}
	PG_END_TRY();
}

/* ExecutorFinish hook: count the depth (AFTER triggers run here). */
static void
fs_relay_executor_finish(QueryDesc *queryDesc)
{
	statement_depth++;
	PG_TRY();
	{
		if (prev_executor_finish != NULL)
			prev_executor_finish(queryDesc);
		else
			standard_ExecutorFinish(queryDesc);
	}
	PG_FINALLY();
	{
		statement_depth--;
	}
	PG_END_TRY();
}

/* ProcessUtility hook: count the depth (DO, CALL, EXPLAIN, EXECUTE, ...). */
static void
fs_relay_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
						 ProcessUtilityContext context, ParamListInfo params,
						 QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	statement_depth++;
	PG_TRY();
	{
		if (prev_process_utility != NULL)
			prev_process_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv,
								 dest, qc);
		else
			standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv,
									dest, qc);
	}
	PG_FINALLY();
	{
		statement_depth--;
	}
	PG_END_TRY();
}

/*
 * Whether the call in `fcinfo` is the whole work of a statement a client
 * sent: the expression at the top (SELECT f(...), SELECT * FROM f(...)) of
 * the plan of the portal the client protocol runs, with nothing around it
 * (a DO, CALL, EXPLAIN or EXECUTE), inside it (a function's statement, one
 * Citus runs for a part of a distributed query) or after it in the plan (a
 * filter, a cast, a subplan, a CTE that writes).
 */
bool
fs_relay_sole_call(FunctionCallInfo fcinfo)
{
	Plan	   *plan;
	Node	   *top = NULL;

	if (statement_depth != 1 || client_plan == NULL || client_plan->commandType != CMD_SELECT ||
		client_plan->hasModifyingCTE || client_plan->subplans != NIL ||
		fcinfo->flinfo == NULL || fcinfo->flinfo->fn_expr == NULL)
		return false;
	plan = client_plan->planTree;
	if (plan == NULL || plan->qual != NIL || plan->lefttree != NULL ||
		list_length(plan->targetlist) != 1)
		return false;
	/* SELECT f(...): the call is the one column; SELECT * FROM f(...): it is read as it is. */
	if (IsA(plan, Result) && ((Result *) plan)->resconstantqual == NULL)
		top = (Node *) ((TargetEntry *) linitial(plan->targetlist))->expr;
	else if (IsA(plan, FunctionScan) && !((FunctionScan *) plan)->funcordinality &&
			 list_length(((FunctionScan *) plan)->functions) == 1 &&
			 IsA(((TargetEntry *) linitial(plan->targetlist))->expr, Var))
		top = ((RangeTblFunction *) linitial(((FunctionScan *) plan)->functions))->funcexpr;
	return top != NULL && top == fcinfo->flinfo->fn_expr;
}

/* The node's notices and warnings of the call awaited, raised once it is answered. */
#define FS_RELAY_NOTICES	8
static int	notice_count = 0;
static int	notice_levels[FS_RELAY_NOTICES];
static char *notice_texts[FS_RELAY_NOTICES];

/*
 * libpq's notice receiver: keep the node's notice for
 * fs_relay_notices_raise() (raising it here would leave libpq by longjmp).
 */
static void
fs_relay_notice(void *arg pg_attribute_unused(), const PGresult *res)
{
	const char *severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
	const char *text = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

	if (text == NULL || notice_count == FS_RELAY_NOTICES)
		return;
	notice_levels[notice_count] = severity != NULL && strcmp(severity, "WARNING") == 0 ? WARNING : NOTICE;
	notice_texts[notice_count] = MemoryContextStrdup(TopMemoryContext, text);
	notice_count++;
}

/* Drop the notices kept by fs_relay_notice(). */
static void
fs_relay_notices_forget(void)
{
	for (int i = 0; i < notice_count; i++)
		pfree(notice_texts[i]);
	notice_count = 0;
}

/* Raise the notices kept by fs_relay_notice(), as the node raised them. */
static void
fs_relay_notices_raise(void)
{
	int			count = notice_count;

	notice_count = 0;
	for (int i = 0; i < count; i++)
	{
		char	   *text = notice_texts[i];

		notice_texts[i] = NULL;
		ereport(notice_levels[i], (errmsg_internal("%s", text)));
		pfree(text);
	}
}

/* Error context while a node answers: the call may have been made there. */
static void
fs_relay_wait_context(void *arg)
{
	FsRelayLink *link = arg;

	errcontext("while node group %d answered a call relayed to it, "
			   "which may have been made there", link->group);
}

/* Whether the current role may read `relid` (false too if it is gone). */
static bool
fs_relay_readable(Oid relid)
{
	bool		missing = false;

	return OidIsValid(relid) &&
		pg_class_aclcheck_ext(relid, GetUserId(), ACL_SELECT, &missing) == ACLCHECK_OK &&
		!missing;
}

/*
 * The address of node group `group`'s primary, from pg_dist_node (which
 * every role may read), into *host (palloc'd) and *port.  False when the
 * group has no active primary, or when Citus reaches it through a pooler
 * (a row in pg_dist_poolinfo, which every role may read too): a pooler is
 * there to bound the node's connections, and the relay makes none around
 * it, so Citus carries the calls to such a node.  False too for a role that
 * may not read either table.
 */
static bool
fs_relay_node_address(int32 group, char **host, int *port)
{
	MemoryContext caller = CurrentMemoryContext;
	Oid			argtypes[1] = {INT4OID};
	Datum		values[1] = {Int32GetDatum(group)};
	bool		found = false;

	/* Looked up at each connection: Citus may have been made anew since. */
	node_relid = get_relname_relid("pg_dist_node", PG_CATALOG_NAMESPACE);
	authinfo_relid = get_relname_relid("pg_dist_authinfo", PG_CATALOG_NAMESPACE);
	poolinfo_relid = get_relname_relid("pg_dist_poolinfo", PG_CATALOG_NAMESPACE);
	/* Citus grants both to every role; where that was taken back, no relay. */
	if (!fs_relay_readable(node_relid) || !fs_relay_readable(poolinfo_relid))
		return false;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute_with_args("SELECT n.nodename, n.nodeport FROM pg_catalog.pg_dist_node n "
							  "WHERE n.groupid OPERATOR(pg_catalog.=) $1 "
							  "AND n.noderole OPERATOR(pg_catalog.=) 'primary' AND n.isactive "
							  "AND NOT EXISTS (SELECT FROM pg_catalog.pg_dist_poolinfo p "
							  "                 WHERE p.nodeid OPERATOR(pg_catalog.=) n.nodeid) "
							  "ORDER BY n.nodeid LIMIT 1",
							  1, argtypes, values, NULL, true, 1) == SPI_OK_SELECT &&
		SPI_processed == 1)
	{
		char	   *name = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		char	   *number = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);

		if (name != NULL && number != NULL)
		{
			*host = MemoryContextStrdup(caller, name);
			*port = pg_strtoint32(number);
			found = true;
		}
	}
	SPI_finish();
	return found;
}

/*
 * Connect `link` to its node group as its role, without blocking
 * interrupts.  False, with nothing kept, when no connection could be made
 * within FS_RELAY_CONNECT_MSECS.
 */
static bool
fs_relay_connect(FsRelayLink *link)
{
	const char *keywords[40];
	const char *values[40];
	char		port_text[16];
	const char *conninfo = GetConfigOption("citus.node_conninfo", true, false);
	PQconninfoOption *options = NULL;
	char	   *host;
	int			port;
	int			n = 0;
	PGconn	   *conn;
	TimestampTz deadline;
	PostgresPollingStatusType status = PGRES_POLLING_WRITING;

	if (!fs_relay_node_address(link->group, &host, &port))
		return false;
	snprintf(port_text, sizeof(port_text), "%d", port);
	if (conninfo != NULL && conninfo[0] != '\0')
		options = PQconninfoParse(conninfo, NULL);
	for (PQconninfoOption *o = options; o != NULL && o->keyword != NULL && n < 32; o++)
		if (o->val != NULL && o->val[0] != '\0')
		{
			keywords[n] = o->keyword;
			values[n++] = o->val;
		}
	keywords[n] = "host";
	values[n++] = host;
	keywords[n] = "port";
	values[n++] = port_text;
	keywords[n] = "dbname";
	values[n++] = get_database_name(MyDatabaseId);
	keywords[n] = "user";
	values[n++] = GetUserNameFromId(link->userid, false);
	keywords[n] = "application_name";
	values[n++] = "fairshare relay";
	keywords[n] = "client_encoding";
	values[n++] = GetDatabaseEncodingName();
	/* A call's plan holds no choice a parameter's value could change. */
	keywords[n] = "options";
	values[n++] = "-c plan_cache_mode=force_generic_plan";
	keywords[n] = NULL;
	values[n] = NULL;

	conn = PQconnectStartParams(keywords, values, false);
	if (options != NULL)
		PQconninfoFree(options);
	if (conn == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), FS_RELAY_CONNECT_MSECS);
	PG_TRY();
	{
		while (PQstatus(conn) != CONNECTION_BAD && status != PGRES_POLLING_OK &&
			   status != PGRES_POLLING_FAILED)
		{
			long		msecs = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
			int			rc;

			if (msecs <= 0)
				break;
			rc = WaitLatchOrSocket(MyLatch,
								   WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH |
								   (status == PGRES_POLLING_READING ?
									WL_SOCKET_READABLE : WL_SOCKET_WRITEABLE),
								   PQsocket(conn), msecs, PG_WAIT_EXTENSION);
			if (rc & WL_LATCH_SET)
			{
				ResetLatch(MyLatch);
				CHECK_FOR_INTERRUPTS();
			}
			if (rc & (WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE))
				status = PQconnectPoll(conn);
		}
	}
	PG_CATCH();
	{
		PQfinish(conn);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (status != PGRES_POLLING_OK || PQstatus(conn) != CONNECTION_OK)
	{
		PQfinish(conn);
		return false;
	}

	/* The link owns the connection from here: an error below leaves it closed. */
	link->conn = conn;
	PQsetNoticeReceiver(conn, fs_relay_notice, NULL);
	PG_TRY();
	{
		link->wait = fs_create_wait_event_set(3);
		AddWaitEventToSet(link->wait, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(link->wait, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		AddWaitEventToSet(link->wait, WL_SOCKET_READABLE, PQsocket(conn), NULL, NULL);
	}
	PG_CATCH();
	{
		fs_relay_close(link);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return true;
}

/*
 * Whether `link`'s kept connection still stands.  libpq learns that the
 * node closed it (a restart, a terminated backend, idle_session_timeout)
 * only by reading: a connection with something to read is read now, so
 * that a closed one is made anew before anything is sent, not found closed
 * while the answer is awaited.
 */
static bool
fs_relay_alive(FsRelayLink *link)
{
	struct pollfd pfd;

	if (PQstatus(link->conn) != CONNECTION_OK || link->wait == NULL)
		return false;
	pfd.fd = PQsocket(link->conn);
	pfd.events = POLLIN;
	pfd.revents = 0;
	if (poll(&pfd, 1, 0) > 0 && !PQconsumeInput(link->conn))
		return false;
	return PQstatus(link->conn) == CONNECTION_OK && !PQisBusy(link->conn);
}

/*
 * Whether `link`'s connection has lived longer than Citus keeps its own
 * (citus.max_cached_connection_lifetime, -1: for ever; 10 minutes when it
 * cannot be read), so that a change of authentication or of the role's
 * rights reaches the relay as it reaches Citus.
 */
static bool
fs_relay_expired(FsRelayLink *link)
{
	const char *setting = GetConfigOption("citus.max_cached_connection_lifetime", true, false);
	int64		msecs = 10 * 60 * 1000;
	char	   *end;

	if (setting != NULL)
	{
		long		value = strtol(setting, &end, 10);

		if (end != setting && *end == '\0')
			msecs = value;
	}
	return msecs >= 0 &&
		GetCurrentTimestamp() - link->connected_at >= msecs * 1000;
}

/*
 * The connection to `group` as the current role: kept, or made now.  NULL
 * when none can be made (or one failed less than FS_RELAY_RETRY_USECS ago).
 */
static FsRelayLink *
fs_relay_link(int32 group)
{
	Oid			userid = GetUserId();
	FsRelayLink *link = NULL;
	int			i;

	if (links_stale)
	{
		for (i = 0; i < FS_RELAY_LINKS; i++)
			fs_relay_close(&links[i]);
		memset(links, 0, sizeof(links));
		links_stale = false;
	}
	for (i = 0; i < FS_RELAY_LINKS && link == NULL; i++)
		if (links[i].used && links[i].group == group && links[i].userid == userid)
			link = &links[i];
	if (link == NULL)
	{
		for (i = 0; i < FS_RELAY_LINKS && link == NULL; i++)
			if (!links[i].used)
				link = &links[i];
		if (link == NULL)
		{
			link = &links[links_next_evicted];
			links_next_evicted = (links_next_evicted + 1) % FS_RELAY_LINKS;
			fs_relay_close(link);
		}
		memset(link, 0, sizeof(*link));
		link->used = true;
		link->group = group;
		link->userid = userid;
	}
	if (link->conn != NULL && (!fs_relay_alive(link) || fs_relay_expired(link)))
		fs_relay_close(link);
	if (link->conn == NULL)
	{
		TimestampTz now = GetCurrentTimestamp();

		if (link->failed_at != 0 && now - link->failed_at < FS_RELAY_RETRY_USECS)
			return NULL;
		if (!fs_relay_connect(link))
		{
			link->failed_at = now;
			return NULL;
		}
		link->failed_at = 0;
		link->connected_at = now;
	}
	return link;
}

/*
 * Wait for the answer to what was sent on `link`, serving interrupts, and
 * return its last result (the caller clears it); the node's notices are
 * raised here.  An error meanwhile (an interrupt, a lost connection)
 * closes the connection and says that the call may have been made.
 */
static PGresult *
fs_relay_answer(FsRelayLink *link)
{
	PGresult   *volatile last = NULL;
	ErrorContextCallback context;

	context.callback = fs_relay_wait_context;
	context.arg = link;
	context.previous = error_context_stack;
	error_context_stack = &context;
	PG_TRY();
	{
		for (;;)
		{
			PGresult   *res;

			while (PQisBusy(link->conn))
			{
				WaitEvent	event;

				if (WaitEventSetWait(link->wait, -1, &event, 1, PG_WAIT_EXTENSION) != 1)
					continue;
				if (event.events & WL_LATCH_SET)
				{
					ResetLatch(MyLatch);
					CHECK_FOR_INTERRUPTS();
				}
				if ((event.events & WL_SOCKET_READABLE) && !PQconsumeInput(link->conn))
					ereport(ERROR,
							(errcode(ERRCODE_CONNECTION_FAILURE),
							 errmsg("lost the connection to node group %d: %s", link->group,
									pchomp(PQerrorMessage(link->conn))),
							 errdetail("Whether the call was made on the node is unknown."),
							 errhint("Check the node, then call again if the call was not made.")));
			}
			res = PQgetResult(link->conn);
			if (res == NULL)
				break;
			if (last != NULL)
				PQclear(last);
			last = res;
		}
	}
	PG_CATCH();
	{
		/*
		 * Closed, not canceled: libpq's cancel request blocks, unbounded,
		 * on a node that cannot be reached.  The node's backend ends when it
		 * finds the connection gone.
		 */
		error_context_stack = context.previous;
		if (last != NULL)
			PQclear(last);
		fs_relay_close(link);
		fs_relay_notices_forget();
		PG_RE_THROW();
	}
	PG_END_TRY();
	error_context_stack = context.previous;
	fs_relay_notices_raise();
	if (last == NULL)
	{
		fs_relay_close(link);
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("node group %d sent no answer", link->group),
				 errdetail("Whether the call was made on the node is unknown."),
				 errhint("Check the node, then call again if the call was not made.")));
	}
	return last;
}

/* Raise the node's error in `res` (cleared here) as this backend's. */
static void
fs_relay_raise(FsRelayLink *link, PGresult *res)
{
	char	   *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	char	   *message = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	char	   *detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
	char	   *hint = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);
	int			code = state != NULL && strlen(state) == 5 ?
		MAKE_SQLSTATE(state[0], state[1], state[2], state[3], state[4]) : ERRCODE_INTERNAL_ERROR;

	message = message != NULL ? pstrdup(message) :
		psprintf("node group %d: %s", link->group, pchomp(PQresultErrorMessage(res)));
	detail = detail != NULL ? pstrdup(detail) : NULL;
	hint = hint != NULL ? pstrdup(hint) : NULL;
	PQclear(res);
	ereport(ERROR,
			(errcode(code),
			 errmsg_internal("%s", message),
			 detail != NULL ? errdetail_internal("%s", detail) : 0,
			 hint != NULL ? errhint("%s", hint) : 0));
}

/*
 * Prepare `function`(...) of fairshare's schema on `link`, as the
 * statement of that name, for the argument types of `fcinfo`.  False, with
 * the connection closed, when it broke while kept: nothing reached the node.
 */
static bool
fs_relay_prepare(FsRelayLink *link, const char *function, FunctionCallInfo fcinfo, int slot)
{
	char	   *schema = get_namespace_name(fs_get_extension_schema(get_extension_oid("fairshare", false)));
	StringInfoData sql;
	Oid			types[FUNC_MAX_ARGS];
	PGresult   *res;
	int			i;

	initStringInfo(&sql);
	appendStringInfo(&sql, "SELECT %s.%s(", quote_identifier(schema), quote_identifier(function));
	for (i = 0; i < PG_NARGS(); i++)
	{
		types[i] = get_fn_expr_argtype(fcinfo->flinfo, i);
		if (!OidIsValid(types[i]))
			elog(ERROR, "could not tell the type of argument %d of %s()", i + 1, function);
		appendStringInfo(&sql, "%s$%d", i > 0 ? ", " : "", i + 1);
	}
	appendStringInfoChar(&sql, ')');
	if (!PQsendPrepare(link->conn, function, sql.data, PG_NARGS(), types))
	{
		fs_relay_close(link);
		return false;
	}
	res = fs_relay_answer(link);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		fs_relay_raise(link, res);
	PQclear(res);
	link->prepared[slot] = function;
	return true;
}

/*
 * Send the call in `fcinfo`, of fairshare's `function` (a string constant),
 * to node group `group` and wait for its answer: true with *result and
 * fcinfo->isnull set to it, or an error the node raised.  False, with
 * nothing sent, when no connection to the node can be made now.
 */
bool
fs_relay_call(int32 group, const char *function, FunctionCallInfo fcinfo, Datum *result)
{
	FsRelayLink *link = fs_relay_link(group);
	const char *args[FUNC_MAX_ARGS];
	Oid			rettype = get_fn_expr_rettype(fcinfo->flinfo);
	PGresult   *res;
	int			nestlevel;
	int			slot;
	int			i;

	if (link == NULL)
		return false;
	for (slot = 0; slot < FS_RELAY_FUNCTIONS; slot++)
		if (link->prepared[slot] == NULL || strcmp(link->prepared[slot], function) == 0)
			break;
	if (slot == FS_RELAY_FUNCTIONS)
		elog(ERROR, "no room to prepare %s() on node group %d", function, group);
	if (link->prepared[slot] == NULL && !fs_relay_prepare(link, function, fcinfo, slot))
		return false;

	/*
	 * The arguments as text any node reads back exactly, whatever this
	 * session's settings: the calls' types are text, integers, float8 and
	 * interval, whose output only extra_float_digits and IntervalStyle
	 * change.  Set for the output only when they are not so already.
	 */
	nestlevel = -1;
	if (extra_float_digits < 1 || IntervalStyle != INTSTYLE_POSTGRES)
	{
		nestlevel = NewGUCNestLevel();
		(void) set_config_option("intervalstyle", "postgres", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
		(void) set_config_option("extra_float_digits", "3", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	}
	for (i = 0; i < PG_NARGS(); i++)
	{
		Oid			output;
		bool		varlena;

		args[i] = NULL;
		if (PG_ARGISNULL(i))
			continue;
		getTypeOutputInfo(get_fn_expr_argtype(fcinfo->flinfo, i), &output, &varlena);
		args[i] = OidOutputFunctionCall(output, PG_GETARG_DATUM(i));
	}
	if (nestlevel >= 0)
		AtEOXact_GUC(true, nestlevel);
	if (!PQsendQueryPrepared(link->conn, function, PG_NARGS(), args, NULL, NULL, 0))
	{
		/* Nothing reached the node: a connection that broke while kept. */
		fs_relay_close(link);
		return false;
	}
	res = fs_relay_answer(link);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		fs_relay_raise(link, res);
	if (PQntuples(res) != 1 || PQnfields(res) != 1)
	{
		PQclear(res);
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("%s() on node group %d did not answer one value", function, group)));
	}
	fcinfo->isnull = PQgetisnull(res, 0, 0);
	*result = (Datum) 0;
	if (!fcinfo->isnull)
	{
		Oid			input;
		Oid			ioparam;
		char	   *text = pstrdup(PQgetvalue(res, 0, 0));

		PQclear(res);
		getTypeInputInfo(rettype, &input, &ioparam);
		*result = OidInputFunctionCall(input, text, ioparam, -1);
	}
	else
		PQclear(res);
	return true;
}

/*
 * Define fairshare.relay_calls, watch pg_dist_node and count statement
 * depth (at _PG_init).
 */
void
fs_relay_init(void)
{
	DefineCustomBoolVariable("fairshare.relay_calls",
							 "Sends a Citus coordinator's per-tenant calls made alone outside a "
							 "transaction block to the tenant's node over fairshare's own connection.",
							 "Off: Citus delegates them.  The effect is the same; the relay is faster.",
							 &fs_relay_enabled,
							 true,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);
	CacheRegisterRelcacheCallback(fs_relay_relcache_callback, (Datum) 0);
	prev_executor_run = ExecutorRun_hook;
	ExecutorRun_hook = fs_relay_executor_run;
	prev_executor_finish = ExecutorFinish_hook;
	ExecutorFinish_hook = fs_relay_executor_finish;
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = fs_relay_process_utility;
}

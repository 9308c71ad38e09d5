/*-------------------------------------------------------------------------
 *
 * schedules.c
 *	  Durable cron schedules and exactly-once claims of their runs.
 *
 * A schedule (fs_schedules) is owned by the role that created it and keeps
 * next_run_at: the next scheduled instant not yet claimed.  Claiming (the
 * application's fs_claim_due_schedules() for schedules without a command,
 * the worker for schedules with one) does, in the caller's transaction:
 *
 *	 1. lock the due schedules, FOR UPDATE SKIP LOCKED, so that concurrent
 *		claimers take disjoint sets and never wait for each other;
 *	 2. work out the runs per the schedule's catch-up policy, from
 *		next_run_at up to as_of;
 *	 3. record every run in the ledger (fs_schedule_runs), whose primary key
 *		(schedule_id, scheduled_for) refuses a second claim of a run;
 *	 4. advance next_run_at to the run after the last scheduled instant
 *		handled -- computed from that instant, never from now().
 *
 * A run is handed out only if its ledger row was inserted by this claim, and
 * the ledger row, the advance and whatever the caller does with the run
 * commit or roll back together: each run is handed out once, ever, across
 * concurrent callers, retries and restarts.  (A claimer in READ COMMITTED
 * that finds a row updated under it re-checks it; in REPEATABLE READ it gets
 * a serialization failure and must retry.)
 *
 * Security.  Users get SELECT on the tables (row-level security shows each
 * role its own rows; members of fairshare_admin see all) and nothing else:
 * every change goes through the C functions below, which take the calling
 * role as the owner, then do their table work as the bootstrap superuser
 * with search_path pinned to pg_catalog.  A role can therefore never create,
 * change or claim another role's schedules, and in particular never change
 * the command that runs as another role.  Owners are kept by OID (the name
 * is kept too, for people to read, and for the worker to notice a rename):
 * a role created with the name of a dropped owner gets none of its
 * schedules.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "nodes/parsenodes.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "parser/parser.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "core/common.h"
#include "core/run_as.h"
#include "core/subxact.h"
#include "limits/limits.h"
#include "schedules/cron_sql.h"
#include "schedules/schedules.h"

PG_FUNCTION_INFO_V1(fs_schedule);
PG_FUNCTION_INFO_V1(fs_unschedule);
PG_FUNCTION_INFO_V1(fs_claim_due_schedules);

int			fs_catchup_tolerance_secs = 60;
bool		fs_worker_enabled = true;
char	   *fs_worker_database = NULL;

/*
 * How far after now a claim's as_of may be (see fs_claim_horizon()): a
 * minute, the resolution of cron, which also absorbs the clock skew of an
 * application server that computes as_of itself.
 */
#define FS_AS_OF_TOLERANCE_SECS		60

typedef enum FsCatchup
{
	FS_CATCHUP_LATEST,			/* the most recent missed run, once */
	FS_CATCHUP_ALL,				/* every missed run, up to FS_CATCHUP_ALL_CAP */
	FS_CATCHUP_SKIP				/* only a run that is on time */
} FsCatchup;

static const char *const catchup_names[] = {"latest", "all", "skip"};

/*
 * The schedules' settings: whether the background worker runs and in which
 * database, and how late a run still counts as on time.
 */
void
fs_schedules_init(void)
{
	DefineCustomBoolVariable("fairshare.worker",
							 "Starts fairshare's background worker.",
							 "It sweeps expired leases, saves the state file periodically and runs "
							 "the schedules of fairshare.database.",
							 &fs_worker_enabled,
							 true,
							 PGC_POSTMASTER, 0,
							 NULL, NULL, NULL);

	DefineCustomStringVariable("fairshare.database",
							   "Database whose schedules the background worker runs.",
							   "Empty: run no schedules.  The worker waits until the database "
							   "exists and has the extension.",
							   &fs_worker_database,
							   "postgres",
							   PGC_SIGHUP, 0,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("fairshare.catchup_tolerance",
							"How late a run may be claimed and still count as on time.",
							"Schedules with catchup 'skip' drop runs claimed later than this "
							"after their scheduled time.",
							&fs_catchup_tolerance_secs,
							60, 1, 7 * 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);
}

/* ----------------------------------------------------------------
 * Table access as the extension's superuser
 * ----------------------------------------------------------------
 */

/*
 * Run fairshare's own fixed queries on the schedule tables as the bootstrap
 * superuser, with search_path pg_catalog, pg_temp, every setting made
 * inside discarded at the end (run_as.c).  No role's code runs there: the
 * tables belong to the extension, and the superuser bypasses row security.
 * Errors undo it (transaction or subtransaction abort).
 */
typedef FsRunAs FsAsSuperuser;

static void
fs_superuser_enter(FsAsSuperuser *s)
{
	fs_run_as_begin(s, BOOTSTRAP_SUPERUSERID, FS_RUN_AS_UNRESTRICTED);
}

static void
fs_superuser_exit(FsAsSuperuser *s)
{
	fs_run_as_end(s);
}

/* Become the superuser and connect to SPI, for the queries below. */
static void
fs_tables_open(FsAsSuperuser *s)
{
	fs_superuser_enter(s);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

static void
fs_tables_close(FsAsSuperuser *s)
{
	SPI_finish();
	fs_superuser_exit(s);
}

typedef enum FsQuery
{
	Q_FIND,
	Q_INSERT,
	Q_INSERT_STATE,
	Q_UPDATE,
	Q_UPDATE_STATE,
	Q_DELETE,
	Q_DUE_APP,
	Q_DUE_WORKER,
	Q_DUE_LIST,
	Q_DUE_REREAD,
	Q_LEDGER,
	Q_LEDGER_CHECKED,
	Q_ADVANCE,
	Q_RUN_RESULT,
	Q_LAST_RESULT,
	Q_PRUNE,
	Q_FORGET_LAST,
	FS_NUM_QUERIES
} FsQuery;

typedef struct FsQueryDef
{
	const char *sql;			/* %1$s is the extension's schema */
	int			nargs;
	Oid			argtypes[8];
} FsQueryDef;

/* Columns of the due-schedule queries, in order. */
enum
{
	DUE_ID = 1, DUE_OWNER_OID, DUE_OWNER, DUE_NAME, DUE_CRON, DUE_TIMEZONE, DUE_CATCHUP,
	DUE_NEXT_RUN_AT, DUE_TENANT, DUE_QUEUE, DUE_PAYLOAD, DUE_COMMAND, DUE_STATE_XMIN
};

/*
 * Only the state row is locked: it holds everything that decides the runs,
 * so a claimer that re-checks a row updated under it sees consistent
 * timing.  The schedule row is read again when the state row may have been
 * re-checked (see fs_reread_changed()).  The application's claims go in
 * index order only (no tie-break), so LIMIT reads no more rows than it
 * returns; the worker's look one schedule up by its key.
 */
#define DUE_COLUMNS \
	"SELECT st.schedule_id, s.owner_oid, s.owner, s.name, st.cron, st.timezone, st.catchup," \
	"       st.next_run_at, s.tenant, s.queue, s.payload, s.command, st.xmin" \
	"  FROM %1$s.fs_schedule_state st JOIN %1$s.fs_schedules s USING (schedule_id)"
#define DUE_QUERY(filter, order) \
	DUE_COLUMNS \
	" WHERE st.next_run_at <= $1 AND ($2 OR s.owner_oid = $3) AND " filter \
	order " LIMIT $4 FOR UPDATE OF st SKIP LOCKED"

#define LEDGER_INSERT \
	"INSERT INTO %1$s.fs_schedule_runs" \
	"       (schedule_id, scheduled_for, owner_oid, owner, name, state, missed_since, claimed_at)" \
	"SELECT u.schedule_id, u.scheduled_for, u.owner_oid, u.owner, u.name, u.state, u.missed_since, $8" \
	"  FROM unnest($1, $2, $3, $4, $5, $6, $7)" \
	"       AS u(schedule_id, scheduled_for, owner_oid, owner, name, state, missed_since)"

static const FsQueryDef query_defs[FS_NUM_QUERIES] = {
	[Q_FIND] = {
		"SELECT s.schedule_id, st.cron, st.timezone, st.last_scheduled_for, st.next_run_at"
		"  FROM %1$s.fs_schedules s JOIN %1$s.fs_schedule_state st USING (schedule_id)"
		" WHERE s.owner_oid = $1 AND s.name = $2 FOR UPDATE",
		2, {OIDOID, TEXTOID}
	},
	[Q_INSERT] = {
		"INSERT INTO %1$s.fs_schedules (owner_oid, owner, name, payload, tenant, queue, command)"
		" VALUES ($1, $7, $2, $3, $4, $5, $6)"
		" ON CONFLICT (owner_oid, name) DO NOTHING RETURNING schedule_id",
		7, {OIDOID, TEXTOID, JSONBOID, TEXTOID, TEXTOID, TEXTOID, NAMEOID}
	},
	[Q_INSERT_STATE] = {
		"INSERT INTO %1$s.fs_schedule_state"
		"       (schedule_id, cron, timezone, catchup, has_command, next_run_at)"
		" VALUES ($1, $2, $3, $4, $5, $6)",
		6, {INT8OID, TEXTOID, TEXTOID, TEXTOID, BOOLOID, TIMESTAMPTZOID}
	},
	[Q_UPDATE] = {
		"UPDATE %1$s.fs_schedules SET payload = $2, tenant = $3, queue = $4, command = $5,"
		"       owner = $6, updated_at = now()"
		" WHERE schedule_id = $1",
		6, {INT8OID, JSONBOID, TEXTOID, TEXTOID, TEXTOID, NAMEOID}
	},
	[Q_UPDATE_STATE] = {
		"UPDATE %1$s.fs_schedule_state SET cron = $2, timezone = $3, catchup = $4,"
		"       has_command = $5, next_run_at = $6"
		" WHERE schedule_id = $1",
		6, {INT8OID, TEXTOID, TEXTOID, TEXTOID, BOOLOID, TIMESTAMPTZOID}
	},
	[Q_DELETE] = {
		"DELETE FROM %1$s.fs_schedules WHERE owner_oid = $1 AND name = $2",
		2, {OIDOID, TEXTOID}
	},
	[Q_DUE_APP] = {
		DUE_QUERY("NOT st.has_command", " ORDER BY st.next_run_at"),
		4, {TIMESTAMPTZOID, BOOLOID, OIDOID, INT4OID}
	},
	[Q_DUE_WORKER] = {
		DUE_QUERY("st.has_command AND st.schedule_id = $5", ""),
		5, {TIMESTAMPTZOID, BOOLOID, OIDOID, INT4OID, INT8OID}
	},
	[Q_DUE_REREAD] = {
		DUE_COLUMNS " WHERE st.schedule_id = ANY ($1)",
		1, {INT8ARRAYOID}
	},
	[Q_DUE_LIST] = {
		"SELECT st.schedule_id, s.owner_oid, st.next_run_at"
		"  FROM %1$s.fs_schedule_state st JOIN %1$s.fs_schedules s USING (schedule_id)"
		" WHERE st.has_command AND st.next_run_at <= $1"
		" ORDER BY st.next_run_at LIMIT $2",
		2, {TIMESTAMPTZOID, INT4OID}
	},
	[Q_LEDGER] = {
		LEDGER_INSERT,
		8, {INT8ARRAYOID, TIMESTAMPTZARRAYOID, OIDARRAYOID, TEXTARRAYOID, TEXTARRAYOID,
		TEXTARRAYOID, TIMESTAMPTZARRAYOID, TIMESTAMPTZOID}
	},
	[Q_LEDGER_CHECKED] = {
		LEDGER_INSERT
		" ON CONFLICT (schedule_id, scheduled_for) DO NOTHING"
		" RETURNING schedule_id, scheduled_for",
		8, {INT8ARRAYOID, TIMESTAMPTZARRAYOID, OIDARRAYOID, TEXTARRAYOID, TEXTARRAYOID,
		TEXTARRAYOID, TIMESTAMPTZARRAYOID, TIMESTAMPTZOID}
	},
	[Q_ADVANCE] = {
		"UPDATE %1$s.fs_schedule_state AS st"
		"   SET next_run_at = u.next_run_at,"
		"       last_scheduled_for = COALESCE(u.last_for, st.last_scheduled_for),"
		"       last_run_state = COALESCE(u.state, st.last_run_state),"
		"       last_run_finished_at = CASE WHEN u.state IS NULL"
		"                                   THEN st.last_run_finished_at END,"
		"       last_error = COALESCE(u.error, st.last_error),"
		"       last_error_at = CASE WHEN u.error IS NULL THEN st.last_error_at ELSE $6 END"
		"  FROM unnest($1, $2, $3, $4, $5) AS u(schedule_id, next_run_at, last_for, state, error)"
		" WHERE st.schedule_id = u.schedule_id",
		6, {INT8ARRAYOID, TIMESTAMPTZARRAYOID, TIMESTAMPTZARRAYOID, TEXTARRAYOID, TEXTARRAYOID,
		TIMESTAMPTZOID}
	},
	[Q_RUN_RESULT] = {
		"UPDATE %1$s.fs_schedule_runs SET state = $3, finished_at = $4, error = $5"
		" WHERE schedule_id = $1 AND scheduled_for = $2",
		5, {INT8OID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID, TEXTOID}
	},
	[Q_LAST_RESULT] = {
		"UPDATE %1$s.fs_schedule_state"
		"   SET last_run_state = $3, last_run_finished_at = $4,"
		"       last_error = COALESCE($5, last_error),"
		"       last_error_at = CASE WHEN $5 IS NULL THEN last_error_at ELSE $4 END"
		" WHERE schedule_id = $1 AND last_scheduled_for = $2",
		5, {INT8OID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID, TEXTOID}
	},
	[Q_PRUNE] = {
		"DELETE FROM %1$s.fs_schedule_runs WHERE ctid = ANY (ARRAY("
		"  SELECT ctid FROM %1$s.fs_schedule_runs WHERE claimed_at < $1 LIMIT $2))",
		2, {TIMESTAMPTZOID, INT4OID}
	},
	[Q_FORGET_LAST] = {
		"UPDATE %1$s.fs_schedule_state SET last_scheduled_for = NULL WHERE schedule_id = $1",
		1, {INT8OID}
	}
};

static SPIPlanPtr plans[FS_NUM_QUERIES];
static Oid	plans_extension = InvalidOid;

/* A prepared plan for query q, for the extension as installed now. */
static SPIPlanPtr
fs_plan(FsQuery q)
{
	Oid			extoid = get_extension_oid("fairshare", false);
	char	   *sql;
	int			i;

	if (extoid != plans_extension)
	{
		/* Installed again since: the schema may differ. */
		for (i = 0; i < FS_NUM_QUERIES; i++)
			if (plans[i] != NULL)
			{
				SPI_freeplan(plans[i]);
				plans[i] = NULL;
			}
		plans_extension = extoid;
	}
	if (plans[q] != NULL)
		return plans[q];

	sql = psprintf(query_defs[q].sql, quote_identifier(fs_extension_schema()));
	plans[q] = SPI_prepare(sql, query_defs[q].nargs, (Oid *) query_defs[q].argtypes);
	if (plans[q] == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s", sql, SPI_result_code_string(SPI_result));
	SPI_keepplan(plans[q]);
	pfree(sql);
	return plans[q];
}

static int
fs_execute(FsQuery q, Datum *values, const char *nulls, bool read_only, long count)
{
	int			ret = SPI_execute_plan(fs_plan(q), values, nulls, read_only, count);

	if (ret < 0)
		elog(ERROR, "fairshare query %d failed: %s", (int) q, SPI_result_code_string(ret));
	return ret;
}

bool
fs_schedules_ready(void)
{
	Oid			extoid = get_extension_oid("fairshare", true);

	if (!OidIsValid(extoid))
		return false;
	return OidIsValid(get_relname_relid("fs_schedules", fs_get_extension_schema(extoid)));
}

bool
fs_sees_all_schedules(Oid role)
{
	Oid			admin = get_role_oid(FS_ADMIN_ROLE, true);

	return superuser_arg(role) || (OidIsValid(admin) && is_member_of_role(role, admin));
}

/*
 * The latest as_of a claim accepts, and so the latest instant a claim can
 * hand out or move next_run_at past: FS_AS_OF_TOLERANCE_SECS after now,
 * now being the later of the server's clock and fairshare.debug_clock (so
 * that tests can move time forward, never that a claim can reach further
 * back than the real clock).  A claim as of a far future would hand out
 * every run up to it early, once ever, and leave next_run_at there.
 */
TimestampTz
fs_claim_horizon(void)
{
	return Max(GetCurrentTimestamp(), fs_now()) +
		(TimestampTz) FS_AS_OF_TOLERANCE_SECS * USECS_PER_SEC;
}

/* Refuse an as_of later than fs_claim_horizon(). */
static void
fs_check_as_of(TimestampTz as_of)
{
	TimestampTz horizon = fs_claim_horizon();

	if (as_of > horizon)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("as_of must be at most %d seconds after now, got %s",
						FS_AS_OF_TOLERANCE_SECS, timestamptz_to_str(as_of)),
				 errdetail("The latest as_of accepted now is %s.", timestamptz_to_str(horizon)),
				 errhint("Leave as_of out to claim the runs due now: runs scheduled later are claimed when they are due.")));
}

/* ----------------------------------------------------------------
 * fs_schedule(), fs_unschedule()
 * ----------------------------------------------------------------
 */

static text *
fs_required_text(FunctionCallInfo fcinfo, int argno, const char *what, const char *hint)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what),
				 errhint("%s", hint)));
	return PG_GETARG_TEXT_PP(argno);
}

/*
 * A schedule name argument: not NULL, not empty, at most
 * FS_SCHEDULE_NAME_MAXLEN bytes.
 */
static char *
fs_schedule_name_arg(FunctionCallInfo fcinfo, int argno)
{
	text	   *arg = fs_required_text(fcinfo, argno, "schedule name",
									   "Name the schedule, for example 'nightly-report'.");
	int			len = VARSIZE_ANY_EXHDR(arg);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("schedule name must not be empty"),
				 errhint("Name the schedule, for example 'nightly-report'.")));
	if (len > FS_SCHEDULE_NAME_MAXLEN)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("schedule name is %d bytes long, longer than the limit of %d bytes",
						len, FS_SCHEDULE_NAME_MAXLEN),
				 errhint("Use a shorter name.")));
	return text_to_cstring(arg);
}

/*
 * A catchup policy by its name ('latest', 'all', 'skip'), or a clear error.
 */
static FsCatchup
fs_catchup_from_string(const char *s)
{
	int			i;

	for (i = 0; i < (int) lengthof(catchup_names); i++)
		if (strcmp(s, catchup_names[i]) == 0)
			return (FsCatchup) i;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("catchup must be 'latest', 'all' or 'skip', got \"%s\"", s),
			 errhint("'latest' runs the most recent missed run once, 'all' every missed run "
					 "(at most %d), 'skip' none.", FS_CATCHUP_ALL_CAP)));
	return FS_CATCHUP_LATEST;	/* not reached */
}

/* Point a syntax error in a command at the command, not at the query. */
static void
fs_command_error_callback(void *arg)
{
	int			pos = geterrposition();

	if (pos > 0)
	{
		errposition(0);
		internalerrposition(pos);
		internalerrquery((const char *) arg);
	}
	errcontext("command of the schedule");
}

/* Is this the relpersistence of a temporary relation in the raw tree? */
static bool
fs_raw_is_temp(const RangeVar *rel)
{
	return rel != NULL && rel->relpersistence == RELPERSISTENCE_TEMP;
}

/*
 * Why a statement of a command can never run, or NULL.  The worker runs a
 * command through SPI, inside the run's transaction, as its owner in a
 * security-restricted operation; PostgreSQL refuses there:
 *
 *	 - transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE,
 *	   PREPARE TRANSACTION, COMMIT/ROLLBACK PREPARED): the run is one
 *	   transaction, committed by the scheduler with its ledger row;
 *	 - COPY from or to the client (STDIN, STDOUT): there is no client;
 *	 - statements that cannot run inside a transaction block or a function
 *	   (VACUUM, CREATE/DROP DATABASE and TABLESPACE, ALTER SYSTEM, the
 *	   CONCURRENTLY forms of CREATE INDEX, DROP INDEX and REINDEX, REINDEX
 *	   SYSTEM/DATABASE, CLUSTER of every table, DISCARD ALL);
 *	 - what a security-restricted operation refuses: SET ROLE, SET SESSION
 *	   AUTHORIZATION, DISCARD, LISTEN, UNLISTEN, PREPARE, temporary tables,
 *	   sequences and views, cursors WITH HOLD.
 *
 * Each is refused when the schedule is made, with the SQLSTATE the run
 * would fail with.  (What only fails at run time, such as set_config('role')
 * or a procedure that commits, fails the run with its own error.)
 */
static const char *
fs_statement_refusal(Node *stmt, int *sqlstate, const char **hint)
{
	const char *what = NULL;

	*sqlstate = ERRCODE_ACTIVE_SQL_TRANSACTION;
	*hint = "Run it from a client session instead (a cron job running psql, for example); a schedule's command runs inside a transaction.";
	switch (nodeTag(stmt))
	{
		case T_TransactionStmt:
			*sqlstate = ERRCODE_INVALID_TRANSACTION_TERMINATION;
			*hint = "Remove it: each run is one transaction, committed when the command succeeds and rolled back when it fails.";
			return "transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, PREPARE TRANSACTION)";
		case T_CopyStmt:
			if (((CopyStmt *) stmt)->filename == NULL)
			{
				*sqlstate = ERRCODE_FEATURE_NOT_SUPPORTED;
				*hint = "Use INSERT ... SELECT, or COPY to or from a file or program on the server.";
				return "COPY FROM STDIN or TO STDOUT (no client is connected to the background worker)";
			}
			break;
		case T_VacuumStmt:
			if (((VacuumStmt *) stmt)->is_vacuumcmd)
			{
				*hint = "Use ANALYZE, which can run in a transaction, and leave VACUUM to autovacuum or to a client session.";
				return "VACUUM";
			}
			break;
		case T_CreatedbStmt:
			return "CREATE DATABASE";
		case T_DropdbStmt:
			return "DROP DATABASE";
		case T_CreateTableSpaceStmt:
			return "CREATE TABLESPACE";
		case T_DropTableSpaceStmt:
			return "DROP TABLESPACE";
		case T_AlterSystemStmt:
			return "ALTER SYSTEM";
		case T_IndexStmt:
			if (((IndexStmt *) stmt)->concurrent)
				return "CREATE INDEX CONCURRENTLY";
			break;
		case T_DropStmt:
			if (((DropStmt *) stmt)->concurrent)
				return "DROP INDEX CONCURRENTLY";
			break;
		case T_ReindexStmt:
			{
				ReindexStmt *r = (ReindexStmt *) stmt;
				ListCell   *lc;

				if (r->kind == REINDEX_OBJECT_SYSTEM || r->kind == REINDEX_OBJECT_DATABASE)
					return "REINDEX SYSTEM or DATABASE";
				foreach(lc, r->params)
				{
					DefElem    *opt = (DefElem *) lfirst(lc);

					if (strcmp(opt->defname, "concurrently") == 0)
						return "REINDEX CONCURRENTLY";
				}
			}
			break;
		case T_ClusterStmt:
			if (((ClusterStmt *) stmt)->relation == NULL)
			{
				*hint = "Name the table to cluster.";
				return "CLUSTER without a table";
			}
			break;
		default:
			break;
	}

	*sqlstate = ERRCODE_INSUFFICIENT_PRIVILEGE;
	*hint = "A schedule's command runs as its owner in a security-restricted operation, like maintenance commands; it cannot change its role or leave session state behind.";
	switch (nodeTag(stmt))
	{
		case T_VariableSetStmt:
			{
				VariableSetStmt *v = (VariableSetStmt *) stmt;

				if (v->name != NULL &&
					(strcmp(v->name, "role") == 0 || strcmp(v->name, "session_authorization") == 0))
					return "SET ROLE, RESET ROLE or SET SESSION AUTHORIZATION";
			}
			break;
		case T_DiscardStmt:
			what = "DISCARD";
			break;
		case T_ListenStmt:
			what = "LISTEN";
			break;
		case T_PrepareStmt:
			what = "PREPARE";
			break;
		case T_UnlistenStmt:
			what = "UNLISTEN";
			break;
		case T_CreateStmt:
			if (fs_raw_is_temp(((CreateStmt *) stmt)->relation))
				what = "a temporary table";
			break;
		case T_CreateSeqStmt:
			if (fs_raw_is_temp(((CreateSeqStmt *) stmt)->sequence))
				what = "a temporary sequence";
			break;
		case T_ViewStmt:
			if (fs_raw_is_temp(((ViewStmt *) stmt)->view))
				what = "a temporary view";
			break;
		case T_CreateTableAsStmt:
			if (fs_raw_is_temp(((CreateTableAsStmt *) stmt)->into->rel))
				what = "a temporary table";
			break;
		case T_SelectStmt:
			if (((SelectStmt *) stmt)->intoClause != NULL &&
				fs_raw_is_temp(((SelectStmt *) stmt)->intoClause->rel))
				what = "a temporary table";
			break;
		case T_DeclareCursorStmt:
			if (((DeclareCursorStmt *) stmt)->options & CURSOR_OPT_HOLD)
				what = "a cursor WITH HOLD";
			break;
		default:
			break;
	}
	return what;
}

/*
 * A command must be SQL that parses, with at least one statement, none of
 * which can never run (fs_statement_refusal()).  Parsed with PostgreSQL's
 * raw parser: names are not looked up, so a command may use objects
 * created later.
 */
static void
fs_check_command(const char *command)
{
	ErrorContextCallback callback;
	List	   *statements;
	ListCell   *lc;

	callback.callback = fs_command_error_callback;
	callback.arg = (void *) command;
	callback.previous = error_context_stack;
	error_context_stack = &callback;
	statements = raw_parser(command, RAW_PARSE_DEFAULT);

	foreach(lc, statements)
	{
		RawStmt    *raw = lfirst_node(RawStmt, lc);
		int			sqlstate;
		const char *hint;
		const char *what = fs_statement_refusal(raw->stmt, &sqlstate, &hint);

		if (what != NULL)
			ereport(ERROR,
					(errcode(sqlstate),
					 errmsg("%s cannot be used in a schedule's command", what),
					 errhint("%s", hint),
					 errposition(raw->stmt_location + 1)));
	}
	error_context_stack = callback.previous;

	if (statements == NIL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("command has no SQL statement"),
				 errhint("Pass SQL to run at each run, or NULL to claim the runs with fs_claim_due_schedules().")));
}

/*
 * Warn when the background worker will not run a command made here: it
 * runs the commands of fairshare.database only.  A warning, not an error:
 * fairshare.database is reloadable, so it may be pointed at this database
 * after the schedules are made (or a dump restored here), and a schedule
 * made in the right database stops running if it is pointed elsewhere;
 * fs_schedule_status.not_run_reason says so for as long as it lasts.
 */
static void
fs_warn_command_not_run(const char *name)
{
	const char *here = get_database_name(MyDatabaseId);

	if (!fs_worker_enabled)
		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("the command of schedule \"%s\" will not run: fairshare.worker is off", name),
				 errhint("Set fairshare.worker = on and fairshare.database = '%s', and restart the server.",
						 here)));
	else if (fs_worker_database == NULL || strcmp(fs_worker_database, here) != 0)
		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("the command of schedule \"%s\" will not run while fairshare.database is \"%s\", not \"%s\"",
						name, fs_worker_database ? fs_worker_database : "", here),
				 errdetail("The background worker runs the commands of the schedules of fairshare.database only."),
				 errhint("Make the schedule in database \"%s\", or set fairshare.database = '%s' and reload.",
						 fs_worker_database ? fs_worker_database : "", here)));
}

static Datum
fs_text_or_null(const char *s, char *null_flag)
{
	*null_flag = s ? ' ' : 'n';
	return s ? CStringGetTextDatum(s) : (Datum) 0;
}

/* Arguments of Q_INSERT_STATE and Q_UPDATE_STATE. */
static void
fs_schedule_state_args(Datum *args, char *nulls, int64 schedule_id, const char *cron,
					   const char *zone, const char *catchup, bool has_command,
					   Datum next_run_at, bool never)
{
	memset(nulls, ' ', 6);
	args[0] = Int64GetDatum(schedule_id);
	args[1] = CStringGetTextDatum(cron);
	args[2] = CStringGetTextDatum(zone);
	args[3] = CStringGetTextDatum(catchup);
	args[4] = BoolGetDatum(has_command);
	args[5] = next_run_at;
	nulls[5] = never ? 'n' : ' ';
}

/*
 * The first run of a new or changed schedule, or an error if there is none:
 * a schedule that can never run is rejected.
 */
static TimestampTz
fs_first_run(const FsCron *cron, pg_tz *zone, const char *cron_text, TimestampTz after)
{
	TimestampTz next = 0;

	switch (fs_cron_next_run(cron, zone, after, &next))
	{
		case FS_NEXT_RUN_FOUND:
			return next;
		case FS_NEXT_RUN_NEVER:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("schedule \"%s\" in time zone \"%s\" would never run",
							cron_text, pg_get_timezone_name(zone)),
					 errdetail("It has no run within %d years after %s.",
							   FS_CRON_HORIZON_YEARS, timestamptz_to_str(after)),
					 errhint("Check that the days, months and times named exist in that time zone.")));
			break;
		case FS_NEXT_RUN_FAILED:
			break;
	}
	ereport(ERROR,
			(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
			 errmsg("cannot compute runs in time zone \"%s\" after %s",
					pg_get_timezone_name(zone), timestamptz_to_str(after)),
			 errhint("Check fairshare.debug_clock and the server clock.")));
	return 0;					/* not reached */
}

/*
 * fs_schedule(name, cron, timezone, payload, tenant, queue, command, catchup)
 *		RETURNS bigint
 *
 * Creates the calling role's schedule of that name, or changes it.  A new
 * expression or zone takes effect from now (or from the last claimed run,
 * if that is later); other changes keep the pending next run.
 */
Datum
fs_schedule(PG_FUNCTION_ARGS)
{
	char	   *name;
	text	   *cron_arg;
	char	   *cron_text;
	FsCron		cron;
	pg_tz	   *zone;
	const char *zone_name;
	Jsonb	   *payload;
	char		tenant[FS_NAME_BUFLEN];
	char		queue[FS_NAME_BUFLEN];
	char	   *command = NULL;
	char	   *catchup;
	Oid			owner_oid = GetUserId();
	NameData	owner;
	TimestampTz now = fs_now();
	FsAsSuperuser su;
	int64		schedule_id = 0;
	int			attempt;

	fs_check_loaded();
	name = fs_schedule_name_arg(fcinfo, 0);
	cron_arg = fs_required_text(fcinfo, 1, "cron expression",
								"Pass five fields such as '0 3 * * *', or a shorthand such as '@daily'.");
	fs_cron_parse_text(cron_arg, &cron);
	cron_text = text_to_cstring(cron_arg);
	zone = fs_cron_zone_text(fs_required_text(fcinfo, 2, "time zone",
											  "Pass a time zone name such as 'UTC' or 'Europe/London'."));
	zone_name = pg_get_timezone_name(zone);
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Pass '{}' for a schedule without a payload.")));
	payload = PG_GETARG_JSONB_P(3);
	if (!PG_ARGISNULL(4))
		fs_text_name(PG_GETARG_TEXT_PP(4), "tenant", tenant);
	fs_name_arg(fcinfo, 5, "queue", queue);
	if (!PG_ARGISNULL(6))
	{
		command = text_to_cstring(PG_GETARG_TEXT_PP(6));
		fs_check_command(command);
		fs_warn_command_not_run(name);
	}
	catchup = text_to_cstring(fs_required_text(fcinfo, 7, "catchup",
											   "Pass 'latest', 'all' or 'skip'."));
	(void) fs_catchup_from_string(catchup);
	namestrcpy(&owner, GetUserNameFromId(owner_oid, false));

	fs_tables_open(&su);

	/*
	 * Lock the existing row and update it, or insert a new one.  A
	 * concurrent insert of the same name makes ours do nothing: then the
	 * row exists, and the second attempt finds and updates it.
	 */
	for (attempt = 0; attempt < 2 && schedule_id == 0; attempt++)
	{
		Datum		args[8];
		char		nulls[8];

		args[0] = ObjectIdGetDatum(owner_oid);
		args[1] = CStringGetTextDatum(name);
		fs_execute(Q_FIND, args, NULL, false, 1);
		if (SPI_processed == 1)
		{
			HeapTuple	row = SPI_tuptable->vals[0];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;
			char	   *old_cron = SPI_getvalue(row, desc, 2);
			char	   *old_zone = SPI_getvalue(row, desc, 3);
			Datum		last_for = SPI_getbinval(row, desc, 4, &isnull);
			bool		no_last = isnull;
			Datum		next = SPI_getbinval(row, desc, 5, &isnull);
			bool		no_next = isnull;
			bool		future_claim;

			schedule_id = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));

			/*
			 * A run claimed beyond fs_claim_horizon() was claimed as of a
			 * future time (only possible before as_of was bounded): the
			 * schedule would not run again until then.  Forget it, and go
			 * on from now, whatever changed.
			 */
			future_claim = !no_last && DatumGetTimestampTz(last_for) > fs_claim_horizon();
			if (future_claim)
			{
				args[0] = Int64GetDatum(schedule_id);
				fs_execute(Q_FORGET_LAST, args, NULL, false, 0);
				no_last = true;
			}
			if (future_claim || strcmp(old_cron, cron_text) != 0 || strcmp(old_zone, zone_name) != 0)
			{
				TimestampTz from = now;

				/* Never hand out again an instant that was claimed. */
				if (!no_last && DatumGetTimestampTz(last_for) > from)
					from = DatumGetTimestampTz(last_for);
				next = TimestampTzGetDatum(fs_first_run(&cron, zone, cron_text, from));
				no_next = false;
			}
			memset(nulls, ' ', sizeof(nulls));
			args[0] = Int64GetDatum(schedule_id);
			args[1] = JsonbPGetDatum(payload);
			args[2] = fs_text_or_null(PG_ARGISNULL(4) ? NULL : tenant, &nulls[2]);
			args[3] = CStringGetTextDatum(queue);
			args[4] = fs_text_or_null(command, &nulls[4]);
			/* The owner's name now: a renamed owner takes its schedule back. */
			args[5] = NameGetDatum(&owner);
			fs_execute(Q_UPDATE, args, nulls, false, 0);
			fs_schedule_state_args(args, nulls, schedule_id, cron_text, zone_name, catchup,
								   command != NULL, next, no_next);
			fs_execute(Q_UPDATE_STATE, args, nulls, false, 0);
		}
		else
		{
			memset(nulls, ' ', sizeof(nulls));
			args[2] = JsonbPGetDatum(payload);
			args[3] = fs_text_or_null(PG_ARGISNULL(4) ? NULL : tenant, &nulls[3]);
			args[4] = CStringGetTextDatum(queue);
			args[5] = fs_text_or_null(command, &nulls[5]);
			args[6] = NameGetDatum(&owner);
			fs_execute(Q_INSERT, args, nulls, false, 0);
			if (SPI_processed == 1)
			{
				bool		isnull;
				TimestampTz first = fs_first_run(&cron, zone, cron_text, now);

				schedule_id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
														  SPI_tuptable->tupdesc, 1, &isnull));
				fs_schedule_state_args(args, nulls, schedule_id, cron_text, zone_name, catchup,
									   command != NULL, TimestampTzGetDatum(first), false);
				fs_execute(Q_INSERT_STATE, args, nulls, false, 0);
			}
		}
	}
	if (schedule_id == 0)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("schedule \"%s\" was changed concurrently", name),
				 errhint("Retry the transaction.")));

	fs_tables_close(&su);
	PG_RETURN_INT64(schedule_id);
}

/*
 * fs_unschedule(name) RETURNS boolean
 *
 * Removes the calling role's schedule of that name; its past runs stay in
 * fs_schedule_runs until they age out.
 */
Datum
fs_unschedule(PG_FUNCTION_ARGS)
{
	char	   *name;
	Oid			owner_oid = GetUserId();
	Datum		args[2];
	FsAsSuperuser su;
	bool		found;

	fs_check_loaded();
	name = fs_schedule_name_arg(fcinfo, 0);

	fs_tables_open(&su);
	args[0] = ObjectIdGetDatum(owner_oid);
	args[1] = CStringGetTextDatum(name);
	fs_execute(Q_DELETE, args, NULL, false, 0);
	found = SPI_processed > 0;
	fs_tables_close(&su);
	PG_RETURN_BOOL(found);
}

/* ----------------------------------------------------------------
 * Due runs and catch-up
 * ----------------------------------------------------------------
 */

/* What one claim does with one schedule. */
typedef struct FsDue
{
	int			nruns;			/* runs to hand out, in order */
	TimestampTz runs[FS_CATCHUP_ALL_CAP];
	bool		skipped;		/* 'skip' dropped the run at last_for */
	bool		has_missed;		/* runs before the first were dropped ... */
	TimestampTz missed_since;	/* ... from this one on */
	bool		has_last;
	TimestampTz last_for;		/* the last instant handled: the new base */
	bool		has_next;
	TimestampTz next;			/* the new next_run_at (none: never again) */
	const char *error;			/* the schedule cannot be computed any more */
} FsDue;

typedef struct FsStepper
{
	const FsCron *cron;
	pg_tz	   *zone;
	bool		failed;
} FsStepper;

/* The first run after `after`; DT_NOEND when there is none. */
static TimestampTz
fs_step(FsStepper *st, TimestampTz after)
{
	TimestampTz next;

	switch (fs_cron_next_run(st->cron, st->zone, after, &next))
	{
		case FS_NEXT_RUN_FOUND:
			return next;
		case FS_NEXT_RUN_NEVER:
			return DT_NOEND;
		case FS_NEXT_RUN_FAILED:
			st->failed = true;
			break;
	}
	return DT_NOEND;
}

/* Runs in (x, as_of], counted up to limit. */
static int
fs_count_runs(FsStepper *st, TimestampTz x, TimestampTz as_of, int limit)
{
	int			n = 0;
	TimestampTz t = fs_step(st, x);

	while (t <= as_of && n < limit)
	{
		n++;
		t = fs_step(st, t);
	}
	return n;
}

/*
 * The runs due at as_of for a schedule whose next pending run is `pending`.
 * Searches are bounded: the latest due run and the start of the last
 * FS_CATCHUP_ALL_CAP ones are found by bisection on the time axis (runs
 * are whole seconds), never by walking every missed run.
 */
static void
fs_due_runs(FsStepper *st, FsCatchup catchup, TimestampTz pending, TimestampTz as_of,
			FsDue *due)
{
	TimestampTz first;
	TimestampTz latest;
	TimestampTz lo;
	TimestampTz hi;

	memset(due, 0, sizeof(*due));

	/* `pending` is a run unless the zone's rules changed under it. */
	first = fs_step(st, pending - 1);
	if (st->failed)
		return;
	if (first > as_of)
	{
		/* Nothing is due after all: only move next_run_at to the truth. */
		due->has_next = first != DT_NOEND;
		due->next = first;
		return;
	}

	/* latest = the last run <= as_of: the largest lo with step(lo) <= as_of. */
	lo = first;
	latest = fs_step(st, first);
	if (latest <= as_of)
	{
		hi = as_of;
		while (hi - lo > USECS_PER_SEC && !st->failed)
		{
			TimestampTz mid = lo + (hi - lo) / 2;

			if (fs_step(st, mid) <= as_of)
				lo = mid;
			else
				hi = mid;
		}
		latest = fs_step(st, lo);
	}
	else
		latest = first;

	due->has_last = true;
	due->last_for = latest;
	due->next = fs_step(st, latest);
	due->has_next = due->next != DT_NOEND;

	switch (catchup)
	{
		case FS_CATCHUP_LATEST:
			due->runs[due->nruns++] = latest;
			break;
		case FS_CATCHUP_SKIP:
			if (as_of - latest <= (TimestampTz) fs_catchup_tolerance_secs * USECS_PER_SEC)
				due->runs[due->nruns++] = latest;
			else
				due->skipped = true;
			break;
		case FS_CATCHUP_ALL:
			if (fs_count_runs(st, pending - 1, as_of, FS_CATCHUP_ALL_CAP + 1) <= FS_CATCHUP_ALL_CAP)
				lo = pending - 1;
			else
			{
				/* The last CAP runs start after the largest lo with CAP runs in (lo, as_of]. */
				lo = first;
				hi = latest;
				while (hi - lo > USECS_PER_SEC && !st->failed)
				{
					TimestampTz mid = lo + (hi - lo) / 2;

					if (fs_count_runs(st, mid, as_of, FS_CATCHUP_ALL_CAP) >= FS_CATCHUP_ALL_CAP)
						lo = mid;
					else
						hi = mid;
				}
			}
			for (hi = fs_step(st, lo); hi <= as_of && due->nruns < FS_CATCHUP_ALL_CAP;
				 hi = fs_step(st, hi))
				due->runs[due->nruns++] = hi;
			break;
	}
	if ((due->nruns > 0 && due->runs[0] != first) || (due->skipped && latest != first))
	{
		due->has_missed = true;
		due->missed_since = first;
	}
}

/* ----------------------------------------------------------------
 * Claiming
 * ----------------------------------------------------------------
 */

/* Rows for the ledger insert and the schedule update, as arrays. */
typedef struct FsClaimBatch
{
	int			nledger;
	Datum	   *l_id;
	Datum	   *l_for;
	Datum	   *l_owner_oid;
	Datum	   *l_owner;
	Datum	   *l_name;
	Datum	   *l_state;
	Datum	   *l_missed;
	bool	   *l_missed_null;
	int		   *l_source;		/* row of the due query; -1 for 'skipped' rows */

	int			nadvance;
	Datum	   *a_id;
	Datum	   *a_next;
	bool	   *a_next_null;
	Datum	   *a_last;
	bool	   *a_last_null;
	Datum	   *a_state;
	bool	   *a_state_null;
	Datum	   *a_error;
	bool	   *a_error_null;
} FsClaimBatch;

/*
 * Make room for one page of a claim: the ledger rows of `max_ledger` runs
 * and the advances of `nschedules` schedules, all allocated before anything
 * is written.
 */
static void
fs_batch_init(FsClaimBatch *b, Size nschedules, Size max_ledger)
{
	memset(b, 0, sizeof(*b));
	FS_FAULT_POINT("schedule_claim");
	b->l_id = palloc(sizeof(Datum) * max_ledger);
	b->l_for = palloc(sizeof(Datum) * max_ledger);
	b->l_owner_oid = palloc(sizeof(Datum) * max_ledger);
	b->l_owner = palloc(sizeof(Datum) * max_ledger);
	b->l_name = palloc(sizeof(Datum) * max_ledger);
	b->l_state = palloc(sizeof(Datum) * max_ledger);
	b->l_missed = palloc(sizeof(Datum) * max_ledger);
	b->l_missed_null = palloc(sizeof(bool) * max_ledger);
	b->l_source = palloc(sizeof(int) * max_ledger);
	b->a_id = palloc(sizeof(Datum) * nschedules);
	b->a_next = palloc(sizeof(Datum) * nschedules);
	b->a_next_null = palloc(sizeof(bool) * nschedules);
	b->a_last = palloc(sizeof(Datum) * nschedules);
	b->a_last_null = palloc(sizeof(bool) * nschedules);
	b->a_state = palloc(sizeof(Datum) * nschedules);
	b->a_state_null = palloc(sizeof(bool) * nschedules);
	b->a_error = palloc(sizeof(Datum) * nschedules);
	b->a_error_null = palloc(sizeof(bool) * nschedules);
}

/*
 * Add a run to a claim page's ledger rows (written in one statement with the
 * page's advances).
 */
static void
fs_batch_ledger(FsClaimBatch *b, Datum id, TimestampTz t, Datum owner_oid, Datum owner,
				Datum name, const char *state, bool has_missed, TimestampTz missed_since,
				int source)
{
	int			i = b->nledger++;

	b->l_id[i] = id;
	b->l_for[i] = TimestampTzGetDatum(t);
	b->l_owner_oid[i] = owner_oid;
	b->l_owner[i] = owner;
	b->l_name[i] = name;
	b->l_state[i] = CStringGetTextDatum(state);
	b->l_missed[i] = TimestampTzGetDatum(missed_since);
	b->l_missed_null[i] = !has_missed;
	b->l_source[i] = source;
}

/* A one-dimensional array of `n` values of `elemtype`, as a Datum. */
static Datum
fs_array(Datum *values, bool *nulls, int n, Oid elemtype)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			dims[1] = {n};
	int			lbs[1] = {1};

	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_md_array(values, nulls, 1, dims, lbs, elemtype,
											  typlen, typbyval, typalign));
}

/* Key of a ledger row, to find which rows a claim inserted. */
typedef struct FsRunKey
{
	int64		schedule_id;
	TimestampTz scheduled_for;
} FsRunKey;

/* fs_subxact_run() work: the plain insert of the ledger rows. */
static void
fs_insert_ledger_plain(void *arg)
{
	fs_execute(Q_LEDGER, (Datum *) arg, NULL, false, 0);
}

/* The only error the plain insert may end with: a row already there. */
static bool
fs_ledger_catches(int sqlerrcode)
{
	return sqlerrcode == ERRCODE_UNIQUE_VIOLATION;
}

/*
 * Insert the ledger rows.  Normally none exists yet, and a plain insert is
 * much cheaper than ON CONFLICT; if one does (next_run_at was moved back by
 * hand), the plain insert fails, is rolled back, and the rows are inserted
 * again skipping those already there.  Returns NULL when every row was
 * inserted, or the set (FsRunKey) of the rows that were.
 */
static HTAB *
fs_insert_ledger(Datum *args)
{
	HASHCTL		ctl;
	HTAB	   *inserted;
	uint64		r;
	ErrorData  *edata;

	/*
	 * In a subtransaction that is rolled back on any error; a unique
	 * violation is ours to handle, and every other error (a lock_timeout,
	 * a cancel, a deadlock) is re-thrown only after the rollback, so the
	 * caller's transaction is left as PostgreSQL expects it.
	 */
	if (fs_subxact_run(fs_insert_ledger_plain, args, fs_ledger_catches, &edata))
		return NULL;
	FreeErrorData(edata);

	fs_execute(Q_LEDGER_CHECKED, args, NULL, false, 0);
	ctl.keysize = sizeof(FsRunKey);
	ctl.entrysize = sizeof(FsRunKey);
	ctl.hcxt = CurrentMemoryContext;
	inserted = hash_create("fairshare inserted runs", Max(SPI_processed, 16), &ctl,
						   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (r = 0; r < SPI_processed; r++)
	{
		FsRunKey	key;
		bool		isnull;

		memset(&key, 0, sizeof(key));
		key.schedule_id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[r],
													  SPI_tuptable->tupdesc, 1, &isnull));
		key.scheduled_for = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[r],
															  SPI_tuptable->tupdesc, 2, &isnull));
		hash_search(inserted, &key, HASH_ENTER, NULL);
	}
	return inserted;
}

/* A text column of an SPI row as a C string in `into`, or NULL. */
static char *
fs_copy_text(HeapTuple row, TupleDesc desc, int column, MemoryContext into)
{
	bool		isnull;
	Datum		value = SPI_getbinval(row, desc, column, &isnull);
	MemoryContext old;
	char	   *result;

	if (isnull)
		return NULL;
	old = MemoryContextSwitchTo(into);
	result = TextDatumGetCString(value);
	MemoryContextSwitchTo(old);
	return result;
}

/* A due row's place, by its schedule id (fs_reread_changed()). */
typedef struct FsRowSlot
{
	int64		schedule_id;	/* hash key */
	uint64		index;			/* its row in the due query's result */
} FsRowSlot;

/*
 * The due query locks the state rows only.  In READ COMMITTED, a state row
 * changed by fs_schedule() after the query's snapshot is re-checked and
 * locked in its new version, but the schedule row joined to it stays as
 * the snapshot saw it: the claim would pair the new timing with the old
 * command and payload.  So the rows whose state row is newer than
 * `horizon` (the xmin of a snapshot taken before the query: every version
 * written by a transaction that committed after the query's snapshot is
 * that new) are read again, with a new snapshot, which sees their schedule
 * rows as they are now: no fs_schedule() can change them while their state
 * rows are locked.  Older rows, nearly all of them, need nothing.
 * rows[i] becomes the row to use for due row i.
 */
static void
fs_reread_changed(SPITupleTable *due, uint64 ndue, TransactionId horizon, HeapTuple *rows)
{
	Datum	   *ids = palloc(sizeof(Datum) * Max(ndue, 1));
	int			nids = 0;
	uint64		i;
	Datum		args[1];
	HASHCTL		ctl;
	HTAB	   *slots;
	SPITupleTable *fresh;

	ctl.keysize = sizeof(int64);
	ctl.entrysize = sizeof(FsRowSlot);
	ctl.hcxt = CurrentMemoryContext;
	slots = hash_create("fairshare changed schedules", 16, &ctl,
						HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (i = 0; i < ndue; i++)
	{
		bool		isnull;
		TransactionId xmin = DatumGetTransactionId(SPI_getbinval(due->vals[i], due->tupdesc,
																 DUE_STATE_XMIN, &isnull));

		rows[i] = due->vals[i];
		if (!TransactionIdPrecedes(xmin, horizon))
		{
			Datum		id = SPI_getbinval(due->vals[i], due->tupdesc, DUE_ID, &isnull);
			int64		key = DatumGetInt64(id);
			FsRowSlot  *slot = hash_search(slots, &key, HASH_ENTER, NULL);

			slot->index = i;
			ids[nids++] = id;
		}
	}
	if (nids > 0)
	{
		args[0] = fs_array(ids, NULL, nids, INT8OID);
		fs_execute(Q_DUE_REREAD, args, NULL, false, 0);
		fresh = SPI_tuptable;
		for (i = 0; i < SPI_processed; i++)
		{
			bool		isnull;
			int64		key = DatumGetInt64(SPI_getbinval(fresh->vals[i], fresh->tupdesc,
														  DUE_ID, &isnull));
			FsRowSlot  *slot = hash_search(slots, &key, HASH_FIND, NULL);

			if (slot != NULL)
				rows[slot->index] = fresh->vals[i];
		}
	}
	hash_destroy(slots);
	pfree(ids);
}

/* The runs a claim hands out so far, in the caller's memory context. */
typedef struct FsClaim
{
	MemoryContext caller;
	FsClaimedRun *runs;
	int			nruns;
	int			capacity;
	bool		more;			/* the limit left runs of a schedule due */
} FsClaim;

/* Room for n more runs in c->runs. */
static void
fs_claim_reserve(FsClaim *c, int n)
{
	int			need = c->nruns + n;

	if (need <= c->capacity)
		return;
	c->capacity = Max(need, c->capacity * 2);
	if (c->runs == NULL)
		c->runs = MemoryContextAlloc(c->caller, sizeof(FsClaimedRun) * c->capacity);
	else
		c->runs = repalloc(c->runs, sizeof(FsClaimedRun) * c->capacity);
}

/*
 * One page of a claim: lock up to `limit` due schedules, work out their
 * runs, claim at most `want` of them, record and advance.  Appends the
 * runs it hands out to *c, and adds to *nschedules the schedules it dealt
 * with.  Returns false when it saw every due schedule (the query found
 * fewer than `limit` and each was dealt with).
 */
static bool
fs_claim_page(FsClaim *c, bool with_command, int64 only_schedule_id, int limit, int want,
			  TimestampTz as_of, Oid claimer, bool all_owners, TimestampTz now,
			  int *nschedules)
{
	Datum		args[8];
	char		nulls[8];
	SPITupleTable *due;
	uint64		ndue;
	uint64		i;
	FsClaimBatch batch;
	int			nclaimed = 0;
	HTAB	   *inserted = NULL;

	TransactionId horizon = GetLatestSnapshot()->xmin;
	HeapTuple  *rows;

	args[0] = TimestampTzGetDatum(as_of);
	args[1] = BoolGetDatum(all_owners);
	args[2] = ObjectIdGetDatum(claimer);
	args[3] = Int32GetDatum(limit);
	args[4] = Int64GetDatum(only_schedule_id);
	fs_execute(with_command ? Q_DUE_WORKER : Q_DUE_APP, args, NULL, false, 0);
	due = SPI_tuptable;
	ndue = SPI_processed;
	rows = palloc(sizeof(HeapTuple) * Max(ndue, 1));
	fs_reread_changed(due, ndue, horizon, rows);
	/* Each schedule gives at most CAP runs, or one 'skipped' row. */
	fs_batch_init(&batch, (Size) Max(ndue, 1),
				  (Size) Min((uint64) want + ndue, ndue * FS_CATCHUP_ALL_CAP + 1));

	for (i = 0; i < ndue && nclaimed < want; i++)
	{
		HeapTuple	row = rows[i];
		TupleDesc	desc = due->tupdesc;
		bool		isnull;
		Datum		id = SPI_getbinval(row, desc, DUE_ID, &isnull);
		Datum		owner_oid = SPI_getbinval(row, desc, DUE_OWNER_OID, &isnull);
		Datum		owner_name = SPI_getbinval(row, desc, DUE_OWNER, &isnull);
		Datum		owner = CStringGetTextDatum(NameStr(*DatumGetName(owner_name)));
		Datum		name = SPI_getbinval(row, desc, DUE_NAME, &isnull);
		char	   *cron_text = TextDatumGetCString(SPI_getbinval(row, desc, DUE_CRON, &isnull));
		char	   *zone_name = TextDatumGetCString(SPI_getbinval(row, desc, DUE_TIMEZONE, &isnull));
		char	   *catchup_text = TextDatumGetCString(SPI_getbinval(row, desc, DUE_CATCHUP, &isnull));
		TimestampTz pending = DatumGetTimestampTz(SPI_getbinval(row, desc, DUE_NEXT_RUN_AT, &isnull));
		FsCron		cron;
		FsCronError cron_error;
		FsStepper	st;
		FsDue		d;
		int			a = batch.nadvance;
		int			k;

		memset(&d, 0, sizeof(d));
		st.cron = &cron;
		st.failed = false;
		st.zone = fs_cron_find_zone(zone_name);
		if (st.zone == NULL)
			d.error = psprintf("time zone \"%s\" is no longer known to PostgreSQL; the schedule stopped",
							   zone_name);
		else if (!fs_cron_parse_cstring(cron_text, &cron, &cron_error))
			d.error = psprintf("cron expression \"%s\" is no longer valid (%s); the schedule stopped",
							   cron_text, cron_error.detail);
		else
		{
			fs_due_runs(&st, fs_catchup_from_string(catchup_text), pending, as_of, &d);
			if (st.failed)
			{
				memset(&d, 0, sizeof(d));
				d.error = psprintf("cannot compute the runs of \"%s\" in time zone \"%s\" after %s; the schedule stopped",
								   cron_text, zone_name, timestamptz_to_str(pending));
			}
		}

		/* Within `want`: claim the first runs, leave the rest pending. */
		if (d.nruns > want - nclaimed)
		{
			c->more = true;
			d.nruns = want - nclaimed;
			d.has_next = true;
			d.next = d.runs[d.nruns];
			d.last_for = d.runs[d.nruns - 1];
		}

		for (k = 0; k < d.nruns; k++)
			fs_batch_ledger(&batch, id, d.runs[k], owner_oid, owner, name, "claimed",
							k == 0 && d.has_missed, d.missed_since, (int) i);
		nclaimed += d.nruns;
		if (d.skipped)
			fs_batch_ledger(&batch, id, d.last_for, owner_oid, owner, name, "skipped",
							d.has_missed, d.missed_since, -1);

		batch.a_id[a] = id;
		batch.a_next[a] = TimestampTzGetDatum(d.next);
		batch.a_next_null[a] = !d.has_next;
		batch.a_last[a] = TimestampTzGetDatum(d.last_for);
		batch.a_last_null[a] = !d.has_last;
		batch.a_state[a] = CStringGetTextDatum(d.nruns > 0 ? "claimed" : "skipped");
		batch.a_state_null[a] = !(d.nruns > 0 || d.skipped);
		batch.a_error[a] = d.error ? CStringGetTextDatum(d.error) : (Datum) 0;
		batch.a_error_null[a] = d.error == NULL;
		batch.nadvance++;
		if (d.error)
			ereport(WARNING,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s", d.error),
					 errhint("Call fs_schedule() again for schedule \"%s\" of role \"%s\" with a valid expression and time zone.",
							 TextDatumGetCString(name), NameStr(*DatumGetName(owner_name)))));
	}
	*nschedules += batch.nadvance;

	if (batch.nledger > 0)
	{
		args[0] = fs_array(batch.l_id, NULL, batch.nledger, INT8OID);
		args[1] = fs_array(batch.l_for, NULL, batch.nledger, TIMESTAMPTZOID);
		args[2] = fs_array(batch.l_owner_oid, NULL, batch.nledger, OIDOID);
		args[3] = fs_array(batch.l_owner, NULL, batch.nledger, TEXTOID);
		args[4] = fs_array(batch.l_name, NULL, batch.nledger, TEXTOID);
		args[5] = fs_array(batch.l_state, NULL, batch.nledger, TEXTOID);
		args[6] = fs_array(batch.l_missed, batch.l_missed_null, batch.nledger, TIMESTAMPTZOID);
		args[7] = TimestampTzGetDatum(now);
		inserted = fs_insert_ledger(args);
	}

	if (batch.nadvance > 0)
	{
		args[0] = fs_array(batch.a_id, NULL, batch.nadvance, INT8OID);
		args[1] = fs_array(batch.a_next, batch.a_next_null, batch.nadvance, TIMESTAMPTZOID);
		args[2] = fs_array(batch.a_last, batch.a_last_null, batch.nadvance, TIMESTAMPTZOID);
		args[3] = fs_array(batch.a_state, batch.a_state_null, batch.nadvance, TEXTOID);
		args[4] = fs_array(batch.a_error, batch.a_error_null, batch.nadvance, TEXTOID);
		args[5] = TimestampTzGetDatum(now);
		memset(nulls, ' ', sizeof(nulls));
		fs_execute(Q_ADVANCE, args, nulls, false, 0);
	}

	/* Hand out the claimed runs, copied out of SPI's memory. */
	fs_claim_reserve(c, nclaimed);
	for (i = 0; i < (uint64) batch.nledger; i++)
	{
		int			source = batch.l_source[i];
		HeapTuple	row;
		TupleDesc	desc = due->tupdesc;
		FsClaimedRun *run;
		bool		isnull;
		Datum		payload;
		MemoryContext old;

		if (source < 0)
			continue;
		if (inserted != NULL)
		{
			FsRunKey	key;

			memset(&key, 0, sizeof(key));
			key.schedule_id = DatumGetInt64(batch.l_id[i]);
			key.scheduled_for = DatumGetTimestampTz(batch.l_for[i]);
			if (hash_search(inserted, &key, HASH_FIND, NULL) == NULL)
				continue;
		}
		row = rows[source];
		run = &c->runs[c->nruns++];
		run->schedule_id = DatumGetInt64(batch.l_id[i]);
		run->scheduled_for = DatumGetTimestampTz(batch.l_for[i]);
		run->owner_oid = DatumGetObjectId(batch.l_owner_oid[i]);
		old = MemoryContextSwitchTo(c->caller);
		run->owner = TextDatumGetCString(batch.l_owner[i]);
		MemoryContextSwitchTo(old);
		run->name = fs_copy_text(row, desc, DUE_NAME, c->caller);
		run->tenant = fs_copy_text(row, desc, DUE_TENANT, c->caller);
		run->queue = fs_copy_text(row, desc, DUE_QUEUE, c->caller);
		run->command = fs_copy_text(row, desc, DUE_COMMAND, c->caller);
		payload = SPI_getbinval(row, desc, DUE_PAYLOAD, &isnull);
		old = MemoryContextSwitchTo(c->caller);
		run->payload = PointerGetDatum(PG_DETOAST_DATUM_COPY(payload));
		MemoryContextSwitchTo(old);
	}
	SPI_freetuptable(due);
	return ndue == (uint64) limit || ndue > (uint64) batch.nadvance;
}

/*
 * A page of a claim locks at most this many schedules more than it still
 * wants runs, when earlier pages found schedules that gave no run.
 */
#define FS_CLAIM_MAX_PAGE			10000

/*
 * Claim due runs, exactly once each: every schedule due at `as_of` (of
 * `claimer`, or of every owner) gets its runs per its catchup policy,
 * recorded in the ledger and its next run advanced in the same transaction;
 * at most `max_runs`. Returns how many were claimed, with the runs (and
 * their commands) in *runs_out.
 */
int
fs_claim_runs(bool with_command, int64 only_schedule_id, int max_runs, TimestampTz as_of,
			  Oid claimer, bool all_owners, FsClaimedRun **runs_out, FsClaimInfo *info)
{
	FsClaim		c;
	FsAsSuperuser su;
	MemoryContext page_context;
	TimestampTz now = GetCurrentTimestamp();
	int			limit = max_runs;
	int			dealt_with = 0;

	*runs_out = NULL;
	if (info)
		memset(info, 0, sizeof(*info));
	/* The worker's runs are claimed schedule by schedule, in its order. */
	if (with_command && only_schedule_id == 0)
		elog(ERROR, "runs of schedules with a command are claimed one schedule at a time");
	if (max_runs <= 0)
		return 0;
	fs_check_as_of(as_of);
	memset(&c, 0, sizeof(c));
	c.caller = CurrentMemoryContext;

	fs_tables_open(&su);

	/*
	 * A large claim sorts and joins as many rows as it claims: let it do so
	 * in memory (this ends with the claim, like the search_path above).
	 */
	if (max_runs > 10000)
		(void) set_config_option("work_mem", "64MB", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);

	/*
	 * A due schedule may give no run: catch-up 'skip' dropped a late one,
	 * its zone's rules moved the pending run after as_of, or it stopped.
	 * Such schedules must not make the claim return fewer runs than are
	 * due: while a page found as many schedules as it asked for and runs
	 * are still wanted, ask for more.  Every schedule a page deals with is
	 * advanced past as_of (or has its runs claimed up to what was wanted),
	 * so each page makes progress.  Pages grow, so that many schedules
	 * without a run cost few queries.
	 */
	page_context = AllocSetContextCreate(CurrentMemoryContext, "fairshare claim page",
										 ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		MemoryContext old = MemoryContextSwitchTo(page_context);
		int			want = max_runs - c.nruns;
		bool		more;

		more = fs_claim_page(&c, with_command, only_schedule_id, limit, want, as_of,
							 claimer, all_owners, now, &dealt_with);
		MemoryContextSwitchTo(old);
		MemoryContextReset(page_context);
		if (only_schedule_id != 0 || c.nruns >= max_runs || !more)
			break;
		want = max_runs - c.nruns;
		limit = Max(want, Min(limit, FS_CLAIM_MAX_PAGE / 2) * 2);
	}
	MemoryContextDelete(page_context);

	fs_tables_close(&su);
	if (info)
	{
		info->nschedules = dealt_with;
		info->more = c.more;
	}
	*runs_out = c.runs;
	return c.nruns;
}

/*
 * The schedules due at `as_of` that the background worker runs (at most
 * `limit`), with their owners, for the scheduler's pass.
 */
int
fs_due_worker_schedules(TimestampTz as_of, int limit, FsDueSchedule **due_out)
{
	MemoryContext caller = CurrentMemoryContext;
	FsAsSuperuser su;
	Datum		args[2];
	FsDueSchedule *due;
	uint64		i;

	fs_tables_open(&su);
	args[0] = TimestampTzGetDatum(as_of);
	args[1] = Int32GetDatum(limit);
	fs_execute(Q_DUE_LIST, args, NULL, true, 0);
	due = MemoryContextAlloc(caller, sizeof(FsDueSchedule) * Max(SPI_processed, 1));
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		due[i].schedule_id = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));
		due[i].owner_oid = DatumGetObjectId(SPI_getbinval(row, desc, 2, &isnull));
		due[i].next_run_at = DatumGetTimestampTz(SPI_getbinval(row, desc, 3, &isnull));
	}
	fs_tables_close(&su);
	*due_out = due;
	return (int) i;
}

/*
 * fs_claim_due_schedules(max_runs int DEFAULT 1000, as_of timestamptz DEFAULT now())
 *		RETURNS TABLE(schedule_id bigint, name text, tenant text, queue text,
 *					  scheduled_for timestamptz, payload jsonb)
 *
 * Claims the due runs of schedules without a command: the calling role's,
 * or every role's for a superuser or a member of fairshare_admin.
 */
Datum
fs_claim_due_schedules(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int32		max_runs;
	TimestampTz as_of;
	FsClaimedRun *runs;
	int			nruns;
	int			i;
	Oid			claimer = GetUserId();

	fs_check_loaded();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_runs must not be null"),
				 errhint("Pass how many runs to claim at most, for example 1000.")));
	max_runs = PG_GETARG_INT32(0);
	if (max_runs < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_runs must not be negative, got %d", max_runs),
				 errhint("Pass how many runs to claim at most, for example 1000.")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("as_of must not be null"),
				 errhint("Leave it out to claim the runs due now.")));
	as_of = PG_GETARG_TIMESTAMPTZ(1);
	if (TIMESTAMP_NOT_FINITE(as_of))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("as_of must be a finite time"),
				 errhint("Leave it out to claim the runs due now.")));
	fs_check_as_of(as_of);

	InitMaterializedSRF(fcinfo, 0);
	nruns = fs_claim_runs(false, 0, max_runs, as_of, claimer, fs_sees_all_schedules(claimer),
						  &runs, NULL);
	for (i = 0; i < nruns; i++)
	{
		Datum		values[6];
		bool		nulls[6] = {false, false, false, false, false, false};

		values[0] = Int64GetDatum(runs[i].schedule_id);
		values[1] = CStringGetTextDatum(runs[i].name);
		values[2] = runs[i].tenant ? CStringGetTextDatum(runs[i].tenant) : (Datum) 0;
		nulls[2] = runs[i].tenant == NULL;
		values[3] = CStringGetTextDatum(runs[i].queue);
		values[4] = TimestampTzGetDatum(runs[i].scheduled_for);
		values[5] = runs[i].payload;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* ----------------------------------------------------------------
 * Worker bookkeeping
 * ----------------------------------------------------------------
 */

/*
 * Record the end of a claimed run in the ledger: succeeded, or failed with
 * its error.
 */
void
fs_finish_run(const FsClaimedRun *run, const char *error)
{
	FsAsSuperuser su;
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	fs_tables_open(&su);
	args[0] = Int64GetDatum(run->schedule_id);
	args[1] = TimestampTzGetDatum(run->scheduled_for);
	args[2] = CStringGetTextDatum(error ? "failed" : "succeeded");
	args[3] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[4] = fs_text_or_null(error, &nulls[4]);
	fs_execute(Q_RUN_RESULT, args, nulls, false, 0);
	fs_execute(Q_LAST_RESULT, args, nulls, false, 0);
	fs_tables_close(&su);
}

/*
 * Delete at most `limit` ledger rows of runs that ended before `before`;
 * returns how many.
 */
uint64
fs_prune_runs(TimestampTz before, int limit)
{
	FsAsSuperuser su;
	Datum		args[2];
	uint64		deleted;

	fs_tables_open(&su);
	args[0] = TimestampTzGetDatum(before);
	args[1] = Int32GetDatum(limit);
	fs_execute(Q_PRUNE, args, NULL, false, 0);
	deleted = SPI_processed;
	fs_tables_close(&su);
	return deleted;
}

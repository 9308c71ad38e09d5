/*-------------------------------------------------------------------------
 *
 * commands.c
 *	  The checks of a schedule's command when it is made: statements that
 *	  could never run in the background worker are refused, with the
 *	  SQLSTATE the run would fail with.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "parser/parser.h"

#include "limits/limits.h"
#include "schedules/schedules_int.h"

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
void
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
void
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


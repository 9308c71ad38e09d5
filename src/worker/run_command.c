/*-------------------------------------------------------------------------
 *
 * run_command.c
 *	  Running a schedule's command as its owner, for the scheduler: the
 *	  checks of the owner and the database, the command's settings and
 *	  deadline, and what is undone after it (fs_current_run() reads the
 *	  run's settings).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "catalog/pg_db_role_setting.h"
#include "commands/async.h"
#include "commands/dbcommands.h"
#include "commands/prepare.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"

#include "core/run_as.h"
#include "statefile/statefile.h"
#include "worker/worker.h"
#include "worker/worker_int.h"

PG_FUNCTION_INFO_V1(fs_current_run);

/*
 * How long a command may go on after fairshare.command_timeout cancelled
 * it before the scheduler exits to end it.  Unwinding from a cancellation
 * takes milliseconds; a command still running this long after has caught
 * it.
 */
#define FS_COMMAND_GRACE_SECS		5

/* The run being executed, for fs_current_run(); empty outside a run. */
static char *run_schedule_id = NULL;
static char *run_name = NULL;
static char *run_scheduled_for = NULL;
static char *run_payload = NULL;
static char *run_tenant = NULL;
static char *run_queue = NULL;

/* The scheduler's timeout that ends a command which ignores its cancellation. */
static TimeoutId command_deadline = MAX_TIMEOUTS;
static volatile sig_atomic_t command_deadline_passed = false;

/* A fairshare.run_* setting: set by the scheduler during a run, read-only to commands. */
static void
fs_define_run_guc(const char *name, const char *description, char **variable)
{
	DefineCustomStringVariable(name, description,
							   "Set by the background worker while it runs a schedule's command; "
							   "empty otherwise.  See also fs_current_run().",
							   variable, "",
							   PGC_SUSET,
							   GUC_NOT_IN_SAMPLE | GUC_DISALLOW_IN_FILE | GUC_DISALLOW_IN_AUTO_FILE |
							   GUC_NO_RESET_ALL,
							   NULL, NULL, NULL);
}

/* Define the fairshare.run_* settings a command reads about its run. */
void
fs_run_command_init(void)
{
	fs_define_run_guc("fairshare.run_schedule_id", "Id of the schedule being run.",
					  &run_schedule_id);
	fs_define_run_guc("fairshare.run_name", "Name of the schedule being run.", &run_name);
	fs_define_run_guc("fairshare.run_scheduled_for",
					  "Scheduled time of the run (timestamptz, ISO format).", &run_scheduled_for);
	fs_define_run_guc("fairshare.run_payload", "Payload of the run (jsonb text).", &run_payload);
	fs_define_run_guc("fairshare.run_tenant", "Tenant of the run (empty: none).", &run_tenant);
	fs_define_run_guc("fairshare.run_queue", "Queue of the run.", &run_queue);
}

/* ----------------------------------------------------------------
 * Running a command as its owner
 * ----------------------------------------------------------------
 */

/* Set a fairshare.run_* setting for the run (undone with its GUC nest level). */
static void
fs_set_run_guc(const char *name, const char *value)
{
	(void) set_config_option(name, value ? value : "", PGC_SUSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
}

/*
 * The settings the owner would get at login here (ALTER ROLE ... SET, and
 * ... IN DATABASE ... SET), applied like SET commands so that they end with
 * the run.  Run as the owner, inside the security-restricted operation, so
 * that a stored "role" setting cannot take effect.
 */
static void
fs_apply_owner_settings(Oid owner)
{
	Relation	settings = table_open(DbRoleSettingRelationId, AccessShareLock);
	Snapshot	snapshot = RegisterSnapshot(GetCatalogSnapshot(DbRoleSettingRelationId));

	ApplySetting(snapshot, InvalidOid, owner, settings, PGC_S_SESSION);
	ApplySetting(snapshot, MyDatabaseId, owner, settings, PGC_S_SESSION);
	UnregisterSnapshot(snapshot);
	table_close(settings, AccessShareLock);
}

/*
 * Undo what a command may have left in this session, so that nothing of
 * one owner's run reaches the next one or the worker's own queries, like
 * DISCARD ALL does: settings (already undone with the command's GUC nest
 * level, see fs_run_command()), prepared statements, LISTEN, session
 * advisory locks, sequence state (currval, lastval), and the objects of
 * the session's temporary schema: a security-restricted operation refuses
 * temporary tables (and, in recent minor releases, types), but not
 * temporary functions or operators, which whatever runs next would find
 * as pg_temp.name (and a temporary type, where it can be made, before the
 * pg_catalog type of that name).  SET ROLE, SET SESSION AUTHORIZATION and
 * cursors WITH HOLD are refused to commands in the first place.  Runs in a
 * transaction, as the worker's own user.
 */
void
fs_reset_session(void)
{
	ResetAllOptions();
	DropAllPreparedStatements();
	Async_UnlistenAll();
	LockReleaseAll(USER_LOCKMETHOD, true);
	ResetSequenceCaches();
	ResetTempTableNamespace();
}

/*
 * The command's uncatchable deadline has passed.  Do what die() does, so
 * that the next CHECK_FOR_INTERRUPTS() ends the process with FATAL: unlike
 * a cancellation (an ERROR), no exception handler of the command can catch
 * that.  The run's transaction rolls back with the process, and the exit
 * callback leaves word of the run for the next scheduler.  Runs in a
 * signal handler: flags and the latch only.
 */
static void
fs_command_deadline_handler(void)
{
	command_deadline_passed = true;
	if (!proc_exit_inprogress)
	{
		InterruptPending = true;
		ProcDiePending = true;
	}
	SetLatch(MyLatch);
}

/* End a command's statement timeout and deadline. */
static void
fs_disable_command_timeouts(void)
{
	disable_timeout(STATEMENT_TIMEOUT, false);
	if (command_deadline != MAX_TIMEOUTS)
		disable_timeout(command_deadline, false);
}

/*
 * Why no command may run in this database now, or NULL: the checks
 * PostgreSQL makes of the database when a session starts (CheckMyDatabase()).
 * The scheduler is already connected, so without them a database closed
 * to connections (ALLOW_CONNECTIONS false) or full (CONNECTION LIMIT) would
 * still have commands run in it.  `superuser`: the owner is one, and
 * passes the connection limit, as at login.
 */
static char *
fs_database_refusal(bool superuser)
{
	HeapTuple	tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(MyDatabaseId));
	Form_pg_database db;
	char	   *refusal = NULL;
	int			sessions;

	if (!HeapTupleIsValid(tuple))
		return psprintf("database %u no longer exists: no schedule runs", MyDatabaseId);
	db = (Form_pg_database) GETSTRUCT(tuple);
	if (!db->datallowconn)
		refusal = psprintf("database \"%s\" does not allow connections (ALLOW_CONNECTIONS false): no schedule runs",
						   NameStr(db->datname));
	else if (db->datconnlimit >= 0 && !superuser &&
			 (sessions = CountDBConnections(MyDatabaseId)) >= db->datconnlimit)
		refusal = psprintf("database \"%s\" has %d sessions, its CONNECTION LIMIT is %d: no schedule runs while the run would exceed it",
						   NameStr(db->datname), sessions, db->datconnlimit);
	ReleaseSysCache(tuple);
	return refusal;
}

/*
 * Why the command of `run` must not run as its owner now, or NULL.  The
 * owner is a role, kept by OID: a role dropped since is not replaced by one
 * created with its name, and a renamed one may have been renamed so as to
 * be mistaken for another (it takes its schedules back by calling
 * fs_schedule() for them again).  Nor does it run for a role that could
 * not start a session here itself, by the checks PostgreSQL makes at login
 * (InitializeSessionUserId(), CheckMyDatabase()): one that may not log in
 * (NOLOGIN), whose password expired (VALID UNTIL, which PostgreSQL checks
 * at password authentication only: here it counts as locking the role
 * out, whatever the authentication method), that has as many sessions as
 * its CONNECTION LIMIT allows (the run would be one more, as a login
 * would; superusers pass, as at login), that lacks CONNECT on this
 * database, or when the database refuses connections
 * (fs_database_refusal()).  These are checked at each run, so that
 * locking a role out stops its commands too.  The refused run is recorded
 * as failed with the reason, and not retried: the next scheduled run is
 * checked again.
 */
char *
fs_owner_refusal(const FsTakenRun *run)
{
	HeapTuple	tuple = SearchSysCache1(AUTHOID, ObjectIdGetDatum(run->owner_oid));
	Form_pg_authid role;
	char	   *refusal = NULL;
	Datum		valid_until;
	bool		no_valid_until;
	int			sessions;

	if (!HeapTupleIsValid(tuple))
		return psprintf("role \"%s\" (OID %u) no longer exists: its schedules do not run",
						run->owner, run->owner_oid);
	role = (Form_pg_authid) GETSTRUCT(tuple);
	valid_until = SysCacheGetAttr(AUTHOID, tuple, Anum_pg_authid_rolvaliduntil, &no_valid_until);
	if (strcmp(NameStr(role->rolname), run->owner) != 0)
		refusal = psprintf("role \"%s\" was renamed to \"%s\": its schedules do not run until it calls fs_schedule() for them again",
						   run->owner, NameStr(role->rolname));
	else if (!role->rolcanlogin)
		refusal = psprintf("role \"%s\" may not log in: its schedules do not run",
						   run->owner);
	else if (!no_valid_until && DatumGetTimestampTz(valid_until) < GetCurrentTimestamp())
		refusal = psprintf("role \"%s\" expired at %s (VALID UNTIL): its schedules do not run",
						   run->owner, timestamptz_to_str(DatumGetTimestampTz(valid_until)));
	else if (role->rolconnlimit >= 0 && !role->rolsuper &&
			 (sessions = CountUserBackends(run->owner_oid)) >= role->rolconnlimit)
		refusal = psprintf("role \"%s\" has %d sessions, its CONNECTION LIMIT is %d: its schedules do not run while the run would exceed it",
						   run->owner, sessions, role->rolconnlimit);
	else if (pg_database_aclcheck(MyDatabaseId, run->owner_oid, ACL_CONNECT) != ACLCHECK_OK)
		refusal = psprintf("role \"%s\" may not connect to database \"%s\": its schedules do not run",
						   run->owner, get_database_name(MyDatabaseId));
	else
		refusal = fs_database_refusal(role->rolsuper);
	ReleaseSysCache(tuple);
	return refusal;
}

/*
 * Raise the error for SPI's failure code `ret` running a command: what SPI
 * refused, with the SQLSTATE PostgreSQL uses for it, for the run's record.
 * fs_schedule() refuses these statements, but a schedule made before it
 * did may still have them.
 */
static void
fs_command_spi_error(int ret)
{
	switch (ret)
	{
		case SPI_ERROR_TRANSACTION:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
					 errmsg("transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE, PREPARE TRANSACTION) cannot be used in a schedule's command"),
					 errhint("Remove it: each run is one transaction, committed when the command succeeds and rolled back when it fails.")));
			break;
		case SPI_ERROR_COPY:
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("COPY FROM STDIN or TO STDOUT (no client is connected to the background worker) cannot be used in a schedule's command"),
					 errhint("Use INSERT ... SELECT, or COPY to or from a file or program on the server.")));
			break;
		default:
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("the command could not be run: %s", SPI_result_code_string(ret)),
					 errhint("Change the command with fs_schedule().")));
			break;
	}
}

/*
 * Run the command of `run` as its owner in a subtransaction.  Returns NULL
 * when it succeeded, or its error message (the subtransaction is rolled
 * back: a failing command undoes only its own work).
 *
 * Privilege: the command runs with the owner as the current user, in a
 * security-restricted operation (SECURITY_LOCAL_USERID_CHANGE and
 * SECURITY_RESTRICTED_OPERATION, as for maintenance commands on a table's
 * owner's behalf): SET ROLE, SET SESSION AUTHORIZATION, temporary tables
 * and cursors WITH HOLD are refused, so the worker's own superuser session
 * cannot be reached from it.  Its GUCs start from the server's defaults
 * plus the owner's role settings, and whatever it sets ends with it; what
 * else it leaves in the session is undone by fs_reset_session() before
 * anything else runs.  Nor can it leave a deferred trigger to fire at the
 * run's commit, as the worker: PostgreSQL refuses to queue one in a
 * security-restricted operation ("cannot fire deferred trigger within
 * security-restricted operation").
 */
char *
fs_run_command(const FsTakenRun *run)
{
	MemoryContext context = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	Oid			owner_oid = run->owner_oid;
	char	   *volatile error = NULL;

	BeginInternalSubTransaction("fairshare run");
	MemoryContextSwitchTo(context);
	PG_TRY();
	{
		FsRunAs		run_as;
		int			ret;
		SPIExecuteOptions options;
		TimestampTz started;
		char	   *payload = JsonbToCString(NULL, &DatumGetJsonbP(run->payload)->root,
											 VARSIZE(DatumGetPointer(run->payload)));

		/*
		 * The owner's turn (run_as.c): its settings start from the server's
		 * and its role's, and every one it makes ends with it, even a
		 * session-level one (SET without LOCAL, set_config(..., false)),
		 * instead of reaching the next owner's command or the worker's own
		 * queries.
		 */
		fs_run_as_begin(&run_as, owner_oid, FS_RUN_AS_OWN_PATH);
		fs_set_run_guc("fairshare.run_schedule_id",
					   psprintf(INT64_FORMAT, run->schedule_id));
		fs_set_run_guc("fairshare.run_name", run->name);
		/* ISO whatever DateStyle says, so that it reads back the same. */
		fs_set_run_guc("fairshare.run_scheduled_for", timestamptz_to_str(run->scheduled_for));
		fs_set_run_guc("fairshare.run_payload", payload);
		fs_set_run_guc("fairshare.run_tenant", run->tenant);
		fs_set_run_guc("fairshare.run_queue", run->queue);

		fs_apply_owner_settings(owner_oid);

		/*
		 * At fairshare.command_timeout the command is cancelled: an error
		 * it may catch (PL/pgSQL's EXCEPTION WHEN query_canceled).  The
		 * deadline FS_COMMAND_GRACE_SECS later cannot be caught: it makes
		 * the scheduler exit (see fs_command_deadline_handler()).
		 */
		started = GetCurrentTimestamp();
		if (fs_command_timeout_ms > 0)
		{
			enable_timeout_after(STATEMENT_TIMEOUT, fs_command_timeout_ms);
			enable_timeout_at(command_deadline,
							  started + ((TimestampTz) fs_command_timeout_ms +
										 FS_COMMAND_GRACE_SECS * 1000) * 1000);
		}
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");

		/*
		 * Nobody reads a command's rows: they are discarded as they come.
		 * Kept (SPI's default), a command returning millions of rows would
		 * hold them all in the scheduler's memory until it ended.
		 */
		memset(&options, 0, sizeof(options));
		options.dest = None_Receiver;
		ret = SPI_execute_extended(run->command, &options);
		if (ret < 0)
			fs_command_spi_error(ret);
		SPI_finish();
		fs_disable_command_timeouts();

		/* It caught its cancellation, then ended: it still ran too long. */
		if (fs_command_timeout_ms > 0 &&
			TimestampDifferenceExceeds(started, GetCurrentTimestamp(), fs_command_timeout_ms))
			ereport(ERROR,
					(errcode(ERRCODE_QUERY_CANCELED),
					 errmsg("the command ran past fairshare.command_timeout (%d ms) and ignored its cancellation",
							fs_command_timeout_ms),
					 errhint("Let the command end when it is cancelled (do not catch query_canceled), or raise fairshare.command_timeout.")));

		fs_run_as_end(&run_as);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(context);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		fs_disable_command_timeouts();
		MemoryContextSwitchTo(context);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(context);
		CurrentResourceOwner = owner;
		error = psprintf("%s (SQLSTATE %s)", edata->message, unpack_sql_state(edata->sqlerrcode));
		FreeErrorData(edata);
	}
	PG_END_TRY();
	return error;
}

/* Register the timeout that ends a command past its deadline (scheduler start). */
void
fs_command_deadline_register(void)
{
	command_deadline = RegisterTimeout(USER_TIMEOUT, fs_command_deadline_handler);
}

/* Has a command's deadline passed (the scheduler is exiting to end it)? */
bool
fs_command_deadline_passed(void)
{
	return command_deadline_passed;
}

/*
 * fs_current_run() RETURNS record: the run whose command is executing, or
 * a row of NULLs outside one.
 */
Datum
fs_current_run(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[6];
	bool		nulls[6] = {true, true, true, true, true, true};

	fs_check_loaded();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	if (run_schedule_id != NULL && run_schedule_id[0] != '\0')
	{
		values[0] = DirectFunctionCall1(int8in, CStringGetDatum(run_schedule_id));
		values[1] = CStringGetTextDatum(run_name);
		values[2] = CStringGetTextDatum(run_tenant);
		nulls[2] = run_tenant[0] == '\0';
		values[3] = CStringGetTextDatum(run_queue);
		values[4] = DirectFunctionCall3(timestamptz_in, CStringGetDatum(run_scheduled_for),
										ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1));
		values[5] = DirectFunctionCall1(jsonb_in, CStringGetDatum(run_payload));
		memset(nulls, 0, sizeof(nulls));
		nulls[2] = run_tenant[0] == '\0';
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

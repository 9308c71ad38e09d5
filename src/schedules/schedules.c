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

#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "core/cluster.h"
#include "limits/limits.h"
#include "schedules/cron_sql.h"
#include "schedules/schedules_int.h"

PG_FUNCTION_INFO_V1(fs_schedule);
PG_FUNCTION_INFO_V1(fs_unschedule);

int			fs_catchup_tolerance_secs = 60;
bool		fs_worker_enabled = true;
char	   *fs_worker_database = NULL;

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
 * fs_schedule(), fs_unschedule()
 * ----------------------------------------------------------------
 */

/* A text argument that must not be NULL (`hint` says what to pass). */
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
FsCatchup
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

/* A text Datum of `s`, or a NULL one (*null_flag) when `s` is NULL. */
Datum
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

/* A schedule as fs_schedule() was asked to make it. */
typedef struct FsScheduleArgs
{
	char	   *name;
	FsCron		cron;
	char	   *cron_text;
	pg_tz	   *zone;
	const char *zone_name;
	Jsonb	   *payload;
	bool		has_tenant;
	char		tenant[FS_NAME_BUFLEN];
	char		queue[FS_NAME_BUFLEN];
	char	   *command;		/* NULL: the application runs it */
	char	   *catchup;
	Oid			owner_oid;		/* the caller */
	NameData	owner;
	TimestampTz now;
} FsScheduleArgs;

/* Read and check fs_schedule()'s arguments. */
static void
fs_schedule_args(FunctionCallInfo fcinfo, FsScheduleArgs *a)
{
	text	   *cron_arg;

	memset(a, 0, sizeof(*a));
	a->owner_oid = GetUserId();
	a->now = fs_now();
	a->name = fs_schedule_name_arg(fcinfo, 0);
	cron_arg = fs_required_text(fcinfo, 1, "cron expression",
								"Pass five fields such as '0 3 * * *', or a shorthand such as '@daily'.");
	fs_cron_parse_text(cron_arg, &a->cron);
	a->cron_text = text_to_cstring(cron_arg);
	a->zone = fs_cron_zone_text(fs_required_text(fcinfo, 2, "time zone",
												 "Pass a time zone name such as 'UTC' or 'Europe/London'."));
	a->zone_name = pg_get_timezone_name(a->zone);
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 errhint("Pass '{}' for a schedule without a payload.")));
	a->payload = PG_GETARG_JSONB_P(3);
	a->has_tenant = !PG_ARGISNULL(4);
	if (a->has_tenant)
		fs_text_name(PG_GETARG_TEXT_PP(4), "tenant", a->tenant);
	fs_name_arg(fcinfo, 5, "queue", a->queue);
	if (!PG_ARGISNULL(6))
	{
		a->command = text_to_cstring(PG_GETARG_TEXT_PP(6));
		fs_check_command(a->command);
		fs_warn_command_not_run(a->name);
	}
	a->catchup = text_to_cstring(fs_required_text(fcinfo, 7, "catchup",
												  "Pass 'latest', 'all' or 'skip'."));
	(void) fs_catchup_from_string(a->catchup);
	namestrcpy(&a->owner, GetUserNameFromId(a->owner_oid, false));
}

/*
 * Update the caller's schedule found (Q_FIND's row, locked): its fields,
 * and its next run when its timing changed.  Returns its id.
 */
static int64
fs_schedule_update(const FsScheduleArgs *a, HeapTuple row, TupleDesc desc)
{
	Datum		args[8];
	char		nulls[8];
	bool		isnull;
	char	   *old_cron = SPI_getvalue(row, desc, 2);
	char	   *old_zone = SPI_getvalue(row, desc, 3);
	Datum		last_for = SPI_getbinval(row, desc, 4, &isnull);
	bool		no_last = isnull;
	Datum		next = SPI_getbinval(row, desc, 5, &isnull);
	bool		no_next = isnull;
	bool		future_claim;
	int64		schedule_id = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));

	/*
	 * A run taken beyond fs_take_horizon() was taken as of a future time
	 * (only possible before as_of was bounded): the schedule would not run
	 * again until then.  Forget it, and go on from now, whatever changed.
	 */
	future_claim = !no_last && DatumGetTimestampTz(last_for) > fs_take_horizon();
	if (future_claim)
	{
		args[0] = Int64GetDatum(schedule_id);
		fs_execute(Q_FORGET_LAST, args, NULL, false, 0);
		no_last = true;
	}
	if (future_claim || strcmp(old_cron, a->cron_text) != 0 || strcmp(old_zone, a->zone_name) != 0)
	{
		TimestampTz from = a->now;

		/* Never hand out again an instant that was taken. */
		if (!no_last && DatumGetTimestampTz(last_for) > from)
			from = DatumGetTimestampTz(last_for);
		next = TimestampTzGetDatum(fs_first_run(&a->cron, a->zone, a->cron_text, from));
		no_next = false;
	}
	memset(nulls, ' ', sizeof(nulls));
	args[0] = Int64GetDatum(schedule_id);
	args[1] = JsonbPGetDatum(a->payload);
	args[2] = fs_text_or_null(a->has_tenant ? a->tenant : NULL, &nulls[2]);
	args[3] = CStringGetTextDatum(a->queue);
	args[4] = fs_text_or_null(a->command, &nulls[4]);
	/* The owner's name now: a renamed owner takes its schedule back. */
	args[5] = NameGetDatum(&a->owner);
	fs_execute(Q_UPDATE, args, nulls, false, 0);
	fs_schedule_state_args(args, nulls, schedule_id, a->cron_text, a->zone_name, a->catchup,
						   a->command != NULL, next, no_next);
	fs_execute(Q_UPDATE_STATE, args, nulls, false, 0);
	return schedule_id;
}

/*
 * Insert the caller's new schedule, with its first run.  Returns its id, or
 * 0 when a concurrent insert of the same name got there first.
 */
static int64
fs_schedule_insert(const FsScheduleArgs *a)
{
	Datum		args[8];
	char		nulls[8];
	bool		isnull;
	int64		schedule_id;

	memset(nulls, ' ', sizeof(nulls));
	args[0] = ObjectIdGetDatum(a->owner_oid);
	args[1] = CStringGetTextDatum(a->name);
	args[2] = JsonbPGetDatum(a->payload);
	args[3] = fs_text_or_null(a->has_tenant ? a->tenant : NULL, &nulls[3]);
	args[4] = CStringGetTextDatum(a->queue);
	args[5] = fs_text_or_null(a->command, &nulls[5]);
	args[6] = NameGetDatum(&a->owner);
	fs_execute(Q_INSERT, args, nulls, false, 0);
	if (SPI_processed != 1)
		return 0;
	schedule_id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
											  &isnull));
	fs_schedule_state_args(args, nulls, schedule_id, a->cron_text, a->zone_name, a->catchup,
						   a->command != NULL,
						   TimestampTzGetDatum(fs_first_run(&a->cron, a->zone, a->cron_text, a->now)),
						   false);
	fs_execute(Q_INSERT_STATE, args, nulls, false, 0);
	return schedule_id;
}

/*
 * fs_schedule(name, cron, timezone, payload, tenant, queue, command, catchup)
 *		RETURNS bigint
 *
 * Creates the calling role's schedule of that name, or changes it.  A new
 * expression or zone takes effect from now (or from the last taken run,
 * if that is later); other changes keep the pending next run.
 */
Datum
fs_schedule(PG_FUNCTION_ARGS)
{
	FsScheduleArgs a;
	FsAsSuperuser su;
	int64		schedule_id = 0;
	int			attempt;

	fs_check_primary("change a fairshare schedule");
	fs_cluster_check_coordinator("fs_schedule");
	fs_schedule_args(fcinfo, &a);

	fs_tables_open(&su);

	/*
	 * Lock the existing row and update it, or insert a new one.  A
	 * concurrent insert of the same name makes ours do nothing: then the
	 * row exists, and the second attempt finds and updates it.
	 */
	for (attempt = 0; attempt < 2 && schedule_id == 0; attempt++)
	{
		Datum		args[2];

		args[0] = ObjectIdGetDatum(a.owner_oid);
		args[1] = CStringGetTextDatum(a.name);
		fs_execute(Q_FIND, args, NULL, false, 1);
		if (SPI_processed == 1)
			schedule_id = fs_schedule_update(&a, SPI_tuptable->vals[0], SPI_tuptable->tupdesc);
		else
			schedule_id = fs_schedule_insert(&a);
	}
	if (schedule_id == 0)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("schedule \"%s\" was changed concurrently", a.name),
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

	fs_check_primary("remove a fairshare schedule");
	name = fs_schedule_name_arg(fcinfo, 0);

	fs_tables_open(&su);
	args[0] = ObjectIdGetDatum(owner_oid);
	args[1] = CStringGetTextDatum(name);
	fs_execute(Q_DELETE, args, NULL, false, 0);
	found = SPI_processed > 0;
	fs_tables_close(&su);
	PG_RETURN_BOOL(found);
}


/*-------------------------------------------------------------------------
 *
 * tables.c
 *	  The schedule tables' fixed queries, planned once per backend and run
 *	  as the extension's superuser with a pinned search_path (see
 *	  schedules.c, "Security").
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_authid.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "limits/limits.h"
#include "schedules/schedules_int.h"

/* ----------------------------------------------------------------
 * Table access as the extension's superuser
 * ----------------------------------------------------------------
 */

/* Become the bootstrap superuser, search_path pinned (schedules_int.h). */
static void
fs_superuser_enter(FsAsSuperuser *s)
{
	fs_run_as_begin(s, BOOTSTRAP_SUPERUSERID, FS_RUN_AS_UNRESTRICTED);
}

/* Go back to the role before fs_superuser_enter(). */
static void
fs_superuser_exit(FsAsSuperuser *s)
{
	fs_run_as_end(s);
}

/* Become the superuser and connect to SPI, for the queries below. */
void
fs_tables_open(FsAsSuperuser *s)
{
	fs_superuser_enter(s);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

/* Finish SPI and go back to the caller's role (fs_tables_open()). */
void
fs_tables_close(FsAsSuperuser *s)
{
	SPI_finish();
	fs_superuser_exit(s);
}

typedef struct FsQueryDef
{
	const char *sql;			/* %1$s is the extension's schema */
	int			nargs;
	Oid			argtypes[8];
} FsQueryDef;

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

/* Run fixed query `q` with its arguments; a failure is an internal error. */
int
fs_execute(FsQuery q, Datum *values, const char *nulls, bool read_only, long count)
{
	int			ret = SPI_execute_plan(fs_plan(q), values, nulls, read_only, count);

	if (ret < 0)
		elog(ERROR, "fairshare query %d failed: %s", (int) q, SPI_result_code_string(ret));
	return ret;
}

/* Is the extension, with its schedule tables, installed in this database? */
bool
fs_schedules_ready(void)
{
	Oid			extoid = get_extension_oid("fairshare", true);

	if (!OidIsValid(extoid))
		return false;
	return OidIsValid(get_relname_relid("fs_schedules", fs_get_extension_schema(extoid)));
}

/* Does `role` see every owner's schedules (superuser, or member of fairshare_admin)? */
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
fs_take_horizon(void)
{
	return Max(GetCurrentTimestamp(), fs_now()) +
		(TimestampTz) FS_AS_OF_TOLERANCE_SECS * USECS_PER_SEC;
}

/* Refuse an as_of later than fs_take_horizon(). */
void
fs_check_as_of(TimestampTz as_of)
{
	TimestampTz horizon = fs_take_horizon();

	if (as_of > horizon)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("as_of must be at most %d seconds after now, got %s",
						FS_AS_OF_TOLERANCE_SECS, timestamptz_to_str(as_of)),
				 errdetail("The latest as_of accepted now is %s.", timestamptz_to_str(horizon)),
				 errhint("Leave as_of out to claim the runs due now: runs scheduled later are claimed when they are due.")));
}


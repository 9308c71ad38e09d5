/*-------------------------------------------------------------------------
 *
 * common.c
 *	  What every layer shares: the server-wide settings, the clock, what
 *	  every SQL function checks first (that fairshare is preloaded, that
 *	  names and intervals are sane), and the debug build's checks.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/xlog.h"
#include "datatype/timestamp.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "core/common.h"
#include "core/shmem.h"
#include "core/tenant.h"

/*
 * A partitioned shared hash table hands out at least one element per free
 * list (32); from there on its capacity is exactly what is asked for.
 */
#define FS_MIN_TABLE_SIZE	32

/* Seconds between the Unix epoch and PostgreSQL's (2000-01-01). */
#define FS_UNIX_TO_PG_EPOCH_SECS \
	((float8) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY)

const char *const fs_reason_names[FS_NUM_REASONS] = {
	"granted",
	"tenant_limit",
	"global_gate",
	"throttled",
	"backpressure",
	"no_budget",
	"fail_open"
};

int			fs_max_tenants = 10000;
int			fs_max_leases = 16384;
int			fs_max_queues = 1024;
int			fs_max_subkeys = 10000;
bool		fs_save_state = true;
double		fs_debug_clock = 0;
int			fs_fairness_half_life = 60;

#ifdef FS_DEBUG
static void fs_debug_out_of_memory_assign(const char *newval, void *extra);
#endif

/*
 * The server-wide settings: the sizes of the shared tables, whether state is
 * saved, and the settings for tests (the clock, and in the debug build the
 * injected out-of-memory error).  Called from _PG_init (module.c) first.
 */
void
fs_common_init(void)
{
	DefineCustomIntVariable("fairshare.max_tenants",
							"Maximum number of (queue, tenant) entries kept in shared memory.",
							"When the table is full, idle entries are evicted; if none is idle, "
							"decisions for new tenants fail open.",
							&fs_max_tenants,
							10000, FS_MIN_TABLE_SIZE, 10000000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("fairshare.max_leases",
							"Maximum number of slot leases held at once, over all tenants.",
							"When the table is full, a granted slot fails open with an untracked lease.",
							&fs_max_leases,
							16384, FS_MIN_TABLE_SIZE, 10000000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("fairshare.max_subkeys",
							"Maximum number of (queue, tenant, sub-key) entries of fair dequeue's second level kept in shared memory.",
							"Each tenant with sub-keys takes one more entry.  When the table is full, "
							"the rows of new sub-keys are ordered by their tenant alone.",
							&fs_max_subkeys,
							10000, 16, 10000000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("fairshare.max_queues",
							"Maximum number of queues, over all databases.",
							"Queues are kept until the server restarts; decisions for new queues fail open when the table is full.",
							&fs_max_queues,
							1024, 1, 100000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("fairshare.save_state",
							 "Saves fairshare's state at shutdown and restores it at startup.",
							 NULL,
							 &fs_save_state,
							 true,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);

	DefineCustomRealVariable("fairshare.debug_clock",
							 "For tests only: the time fairshare decides at, in seconds since 1970-01-01 UTC.",
							 "0 (the default) uses the real clock.",
							 &fs_debug_clock,
							 0, 0, 1e11,
							 PGC_SUSET, GUC_NOT_IN_SAMPLE | GUC_UNIT_S,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("fairshare.fairness_half_life",
							"Half-life of the served work behind the fairness metrics.",
							"Each tenant's served work decays exponentially with this half-life; "
							"fs_fairness and fs_fair_shares compare tenants over it.",
							&fs_fairness_half_life,
							60, 1, 7 * 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

#ifdef FS_DEBUG
	DefineCustomStringVariable("fairshare.debug_out_of_memory",
							   "Debug build only: the fault point at which an allocation fails.",
							   "A point's name, or name:N to fail at its N-th pass since the setting "
							   "was made; empty (the default) fails nothing.",
							   &fs_debug_out_of_memory,
							   "",
							   PGC_SUSET, GUC_NOT_IN_SAMPLE,
							   NULL, fs_debug_out_of_memory_assign, NULL);
	DefineCustomStringVariable("fairshare.debug_pause",
							   "Debug build only: the pause point at which to sleep, and how long.",
							   "name:milliseconds; empty (the default) sleeps nowhere.",
							   &fs_debug_pause,
							   "",
							   PGC_SUSET, GUC_NOT_IN_SAMPLE,
							   NULL, NULL, NULL);
#endif
}

/* Every SQL function starts here. */
void
fs_check_loaded(void)
{
	if (fs_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("fairshare must be loaded via shared_preload_libraries"),
				 errhint("Add fairshare to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/*
 * Every SQL function that decides or changes fairshare's state starts here
 * instead: a standby (a server in recovery) refuses it.  fairshare decides
 * on the primary; `what` says what was refused.
 */
void
fs_check_primary(const char *what)
{
	fs_check_loaded();
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot %s during recovery", what),
				 errdetail("This server is a standby: fairshare decides on the primary only."),
				 errhint("Connect to the primary.")));
}

/* The time decisions are made at: the real clock, or fairshare.debug_clock. */
TimestampTz
fs_now(void)
{
	if (fs_debug_clock > 0)
		return (TimestampTz) llround((fs_debug_clock - FS_UNIX_TO_PG_EPOCH_SECS) * USECS_PER_SEC);
	return GetCurrentTimestamp();
}

/*
 * Copy a tenant or queue name from a text value into buf (FS_NAME_BUFLEN
 * bytes), or raise a clear error saying what is wrong with it.
 */
void
fs_text_name(text *arg, const char *what, char *buf)
{
	int			len = VARSIZE_ANY_EXHDR(arg);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what),
				 errhint("Pass the %s's key, for example its id.", what)));
	if (len > FS_NAME_MAXLEN)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("%s name is %d bytes long, longer than the limit of %d bytes",
						what, len, FS_NAME_MAXLEN),
				 errhint("Use a shorter %s name, for example a key or id instead of a display name.",
						 what)));
	memcpy(buf, VARDATA_ANY(arg), len);
	buf[len] = '\0';
	if (len == 1 && buf[0] == '*')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s name \"*\" is reserved for defaults in fs_limits", what),
				 errhint("Use fs_set_limit('*', ...) to set defaults; decisions need a real %s.",
						 what)));
}

/* fs_text_name() for argument `argno`, which must not be NULL. */
void
fs_name_arg(FunctionCallInfo fcinfo, int argno, const char *what, char *buf)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what),
				 errhint("Pass the %s's key, for example its id.", what)));
	fs_text_name(PG_GETARG_TEXT_PP(argno), what, buf);
}

/* A float8 as PostgreSQL prints it (exact, "NaN", "Infinity"), for messages. */
char *
fs_float_text(float8 value)
{
	return DatumGetCString(DirectFunctionCall1(float8out, Float8GetDatum(value)));
}

#ifdef FS_DEBUG
char	   *fs_debug_out_of_memory = NULL;
static char fs_fault_point_name[FS_NAME_BUFLEN];
static int	fs_fault_point_at = 0;	/* the pass that fails; 0: every pass */
static int	fs_fault_point_passes = 0;

/*
 * fairshare.debug_out_of_memory changed: remember the point and start
 * counting its passes again.  A malformed count names no point.
 */
static void
fs_debug_out_of_memory_assign(const char *newval, void *extra pg_attribute_unused())
{
	const char *colon = newval != NULL ? strchr(newval, ':') : NULL;
	size_t		len = newval == NULL ? 0 : colon != NULL ? (size_t) (colon - newval) : strlen(newval);

	fs_fault_point_passes = 0;
	fs_fault_point_at = colon != NULL ? atoi(colon + 1) : 0;
	if (len >= sizeof(fs_fault_point_name) || fs_fault_point_at < 0)
		len = 0;
	memcpy(fs_fault_point_name, newval != NULL ? newval : "", len);
	fs_fault_point_name[len] = '\0';
}

/*
 * The debug build's injected out-of-memory error (FS_FAULT_POINT): raised
 * as palloc raises it, where fairshare is about to allocate, when
 * fairshare.debug_out_of_memory names this point (and this is the pass it
 * names).
 */
void
fs_fault_point_pass(const char *point)
{
	if (strcmp(point, fs_fault_point_name) != 0)
		return;
	fs_fault_point_passes++;
	if (fs_fault_point_at != 0 && fs_fault_point_passes != fs_fault_point_at)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OUT_OF_MEMORY),
			 errmsg("out of memory"),
			 errdetail("Injected at fairshare's fault point \"%s\" (fairshare.debug_out_of_memory).",
					   point)));
}

char	   *fs_debug_pause = NULL;

/*
 * The debug build's pause (FS_PAUSE_POINT): sleep as long as
 * fairshare.debug_pause says when it names this point.  pg_usleep(), so
 * that it may run where interrupts are held (a commit's callbacks).
 */
void
fs_pause_point_pass(const char *point)
{
	const char *colon = strchr(fs_debug_pause, ':');
	size_t		len = colon != NULL ? (size_t) (colon - fs_debug_pause) : 0;
	int			ms;

	if (len == 0 || len != strlen(point) || strncmp(fs_debug_pause, point, len) != 0)
		return;
	ms = atoi(colon + 1);
	if (ms > 0 && ms <= 60000)
		pg_usleep((long) ms * 1000L);
}

/* The debug build's report of a broken invariant (FS_INVARIANT). */
void
fs_invariant_failed(const char *what, const char *file, int line)
{
	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("fairshare invariant violated: %s", what),
			 errdetail("Checked at %s:%d.", file, line),
			 errhint("This is a bug in fairshare, caught by its debug build (make FS_DEBUG=1).")));
}
#endif

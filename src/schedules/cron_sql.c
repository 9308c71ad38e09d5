/*-------------------------------------------------------------------------
 *
 * cron_sql.c
 *	  fs_next_run() and fs_next_runs(): the cron engine from SQL, with time
 *	  zones from PostgreSQL's own tz database, named as in pg_timezone_names.
 *
 * The engine (cron.c) asks a zone one question: the UTC offset at an
 * instant and when it next changes.  pg_next_dst_boundary() answers exactly
 * that from the zone's transition table, extrapolating with the zone's rule
 * beyond it, so the engine sees the same offsets as timestamptz AT TIME ZONE.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "datatype/timestamp.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/memutils.h"

#include "core/common.h"
#include "schedules/cron_sql.h"

PG_FUNCTION_INFO_V1(fs_next_run);
PG_FUNCTION_INFO_V1(fs_next_runs);

/* Seconds from 1970-01-01 (instants of cron.h) to 2000-01-01 (timestamptz). */
#define FS_PG_EPOCH_OFFSET	((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY)

/* Characters of an expression repeated in an error message. */
#define FS_CRON_ECHO_MAX	64

/*
 * The cron engine's zone lookup over a PostgreSQL time zone: the UTC offset
 * in force at `t`, and the span around `t` for which it holds (its
 * transitions).
 */
static bool
fs_pg_zone_lookup(const void *arg, int64_t t, FsCronSpan *span)
{
	const pg_tz *tz = (const pg_tz *) arg;
	pg_time_t	at = (pg_time_t) t;
	pg_time_t	boundary = 0;
	long int	before_offset = 0;
	long int	after_offset = 0;
	int			before_dst;
	int			after_dst;
	int			found;

	found = pg_next_dst_boundary(&at, &before_offset, &before_dst, &boundary,
								 &after_offset, &after_dst, tz);
	if (found < 0)
		return false;
	if (found == 0)
	{
		/*
		 * Exactly at the last transition of its table a zone reports no
		 * later one, even where its rule extrapolates more; one second later
		 * it does.  The offset is the same either way.
		 */
		long int	offset2;

		at = (pg_time_t) t + 1;
		found = pg_next_dst_boundary(&at, &offset2, &before_dst, &boundary,
									 &after_offset, &after_dst, tz);
		if (found < 0)
			return false;
	}
	span->offset = (int32_t) before_offset;
	span->has_end = (found == 1);
	span->end = found == 1 ? (int64_t) boundary : 0;
	return true;
}

/* Up to FS_CRON_ECHO_MAX bytes of an expression, for errmsg(). */
static char *
fs_cron_echo(const char *expr, int len)
{
	StringInfoData buf;
	int			i;

	initStringInfo(&buf);
	for (i = 0; i < len && i < FS_CRON_ECHO_MAX; i++)
	{
		unsigned char c = (unsigned char) expr[i];

		if (c >= 0x20 && c < 0x7f)
			appendStringInfoChar(&buf, (char) c);
		else
			appendStringInfo(&buf, "\\x%02X", c);
	}
	if (i < len)
		appendStringInfoString(&buf, "...");
	return buf.data;
}

/*
 * Parse a cron expression given as text, or raise the cron engine's error
 * with its field and hint.
 */
void
fs_cron_parse_text(text *expr, FsCron *cron)
{
	FsCronError error;
	const char *data = VARDATA_ANY(expr);
	int			len = VARSIZE_ANY_EXHDR(expr);

	if (!fs_cron_parse(data, (size_t) len, cron, &error))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid cron expression \"%s\"", fs_cron_echo(data, len)),
				 errdetail("%s", error.detail),
				 errhint("%s", error.hint)));
}

/* Parse a NUL-terminated cron expression. */
bool
fs_cron_parse_cstring(const char *expr, FsCron *cron, FsCronError *error)
{
	return fs_cron_parse(expr, strlen(expr), cron, error);
}

/*
 * The names of the tz database, upper-cased and sorted, as
 * pg_timezone_names lists them; read once per process, when first needed.
 */
static char **tz_names = NULL;
static int	ntz_names = 0;

/* qsort order of C strings through pointers. */
static int
fs_strcmp_indirect(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/* Upper-case `s` in place (ASCII). */
static void
fs_upcase(char *s)
{
	for (; *s; s++)
		*s = pg_toupper((unsigned char) *s);
}

/*
 * List every time zone name of PostgreSQL's tz database (upper case, sorted),
 * once per backend: only names of the database are accepted as zones.
 */
static void
fs_tz_names_load(void)
{
	MemoryContext context = AllocSetContextCreate(CurrentMemoryContext,
												  "fairshare time zone names",
												  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(context);
	int			capacity = 1024;
	int			n = 0;
	char	  **names = palloc(sizeof(char *) * capacity);
	pg_tzenum  *dir = pg_tzenumerate_start();
	pg_tz	   *tz;

	/* Files of the tz database that load and do not count leap seconds. */
	while ((tz = pg_tzenumerate_next(dir)) != NULL)
	{
		if (n == capacity)
		{
			capacity *= 2;
			names = repalloc(names, sizeof(char *) * capacity);
		}
		names[n] = pstrdup(pg_get_timezone_name(tz));
		fs_upcase(names[n]);
		n++;
	}
	pg_tzenumerate_end(dir);
	qsort(names, n, sizeof(char *), fs_strcmp_indirect);
	MemoryContextSwitchTo(old);

	/* Kept only once complete: an error above frees it with its parent. */
	MemoryContextSetParent(context, TopMemoryContext);
	tz_names = names;
	ntz_names = n;
}

/* Is `name` (any case) a name of the tz database? */
static bool
fs_tz_name_known(const char *name)
{
	char	   *key = pstrdup(name);
	bool		found;

	if (tz_names == NULL)
		fs_tz_names_load();
	fs_upcase(key);
	found = bsearch(&key, tz_names, ntz_names, sizeof(char *), fs_strcmp_indirect) != NULL;
	pfree(key);
	return found;
}

/* Could pg_tzset() read `name` as a POSIX time zone specification? */
static bool
fs_zone_may_be_posix(const char *name)
{
	/*
	 * A POSIX specification ("<+03>-3", "EST5EDT,M3.2.0,M11.1.0") always
	 * has a UTC offset after its first abbreviation, so it has a digit;
	 * pg_tzset() reads anything else only as a file of the tz database.
	 */
	return strpbrk(name, "0123456789") != NULL;
}

/*
 * Only names of the tz database are accepted, not POSIX specifications,
 * which pg_tzset() would also read: the contract says zones come from the
 * tz database, and pg_tzset() caches every zone it reads (about 24 kB each)
 * for the life of the process, so distinct specifications (one per
 * schedule, say) would grow the worker without bound.  Names are few.
 * Names without a digit, most of them, need no look-up in the list.
 */
pg_tz *
fs_cron_find_zone(const char *name)
{
	pg_tz	   *tz;

	if (name[0] == '\0' || strlen(name) > TZ_STRLEN_MAX)
		return NULL;
	if (fs_zone_may_be_posix(name) && !fs_tz_name_known(name))
		return NULL;
	tz = pg_tzset(name);
	/* Zones that count leap seconds would disagree with timestamptz. */
	if (tz == NULL || !pg_tz_acceptable(tz))
		return NULL;
	return tz;
}

/*
 * A time zone given as text: a name of the tz database, or an error naming
 * it (saying so when it looks like a POSIX specification).
 */
pg_tz *
fs_cron_zone_text(text *name)
{
	char	   *cname = text_to_cstring(name);
	pg_tz	   *tz = fs_cron_find_zone(cname);

	if (tz == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("time zone \"%s\" is not recognized",
						fs_cron_echo(cname, (int) strlen(cname))),
				 fs_zone_may_be_posix(cname) ?
				 errdetail("Only names of the tz database are accepted, not POSIX time zone specifications such as \"<+03>-3\".") : 0,
				 errhint("Use a name from pg_timezone_names, such as 'UTC', 'Europe/London' or 'America/New_York'.")));
	pfree(cname);
	return tz;
}

/*
 * The first run of `cron` in `zone` strictly after `after` (whole seconds),
 * into *next; or why there is none.
 */
FsNextRun
fs_cron_next_run(const FsCron *cron, pg_tz *zone, TimestampTz after, TimestampTz *next)
{
	FsCronZone	cz;
	int64_t		after_secs;
	int64_t		found;

	/* Runs are on whole seconds: "after" rounds down. */
	after_secs = (int64_t) (after / USECS_PER_SEC) - (after % USECS_PER_SEC < 0 ? 1 : 0) +
		FS_PG_EPOCH_OFFSET;

	cz.lookup = fs_pg_zone_lookup;
	cz.arg = zone;
	switch (fs_cron_next(cron, &cz, after_secs, &found))
	{
		case FS_CRON_FOUND:
			break;
		case FS_CRON_NONE:
			return FS_NEXT_RUN_NEVER;
		case FS_CRON_ZONE_FAILED:
		case FS_CRON_OUT_OF_DOMAIN:
			return FS_NEXT_RUN_FAILED;
	}

	/* A run past the end of timestamptz is a run that never happens. */
	if (found - FS_PG_EPOCH_OFFSET >= END_TIMESTAMP / USECS_PER_SEC)
		return FS_NEXT_RUN_NEVER;
	*next = (TimestampTz) (found - FS_PG_EPOCH_OFFSET) * USECS_PER_SEC;
	return FS_NEXT_RUN_FOUND;
}

/* ----------------------------------------------------------------
 * SQL functions
 * ----------------------------------------------------------------
 */

/*
 * The last expression and zone seen by a call site, so that a query
 * computing many runs of one schedule parses it once.
 */
typedef struct FsCronCallCache
{
	text	   *expr;			/* copy, in fn_mcxt */
	FsCron		cron;
	text	   *zone_name;		/* copy, in fn_mcxt */
	pg_tz	   *zone;			/* pg_tzset's cache keeps it for the session */
} FsCronCallCache;

/* Are two texts equal, byte for byte? */
static bool
fs_text_equal(text *a, text *b)
{
	return a != NULL && VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/* A copy of `t` in `mcxt`. */
static text *
fs_text_copy(MemoryContext mcxt, text *t)
{
	Size		len = VARSIZE_ANY_EXHDR(t);
	text	   *copy = MemoryContextAlloc(mcxt, len + VARHDRSZ);

	SET_VARSIZE(copy, len + VARHDRSZ);
	memcpy(VARDATA(copy), VARDATA_ANY(t), len);
	return copy;
}

/*
 * Check the arguments common to both functions, and bring the cache in
 * *slot (allocated in mcxt) up to date with them.
 */
static FsCronCallCache *
fs_cron_args(FunctionCallInfo fcinfo, FsCronCallCache **slot, MemoryContext mcxt,
			 TimestampTz *after)
{
	FsCronCallCache *cache = *slot;
	text	   *expr;
	text	   *zone_name;

	fs_check_loaded();
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("cron expression must not be null"),
				 errhint("Pass five fields such as '0 3 * * *', or a shorthand such as '@daily'.")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("time zone must not be null"),
				 errhint("Pass a time zone name such as 'UTC' or 'Europe/London'.")));
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("\"after\" must not be null"),
				 errhint("Pass the time to search from, for example now().")));

	if (cache == NULL)
	{
		cache = MemoryContextAllocZero(mcxt, sizeof(FsCronCallCache));
		*slot = cache;
	}

	expr = PG_GETARG_TEXT_PP(0);
	if (!fs_text_equal(cache->expr, expr))
	{
		FsCron		cron;

		fs_cron_parse_text(expr, &cron);
		if (cache->expr != NULL)
			pfree(cache->expr);
		cache->expr = fs_text_copy(mcxt, expr);
		cache->cron = cron;
	}

	zone_name = PG_GETARG_TEXT_PP(1);
	if (!fs_text_equal(cache->zone_name, zone_name))
	{
		pg_tz	   *zone = fs_cron_zone_text(zone_name);

		if (cache->zone_name != NULL)
			pfree(cache->zone_name);
		cache->zone_name = fs_text_copy(mcxt, zone_name);
		cache->zone = zone;
	}

	*after = PG_GETARG_TIMESTAMPTZ(2);
	if (TIMESTAMP_IS_NOBEGIN(*after))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("\"after\" must not be -infinity"),
				 errhint("Pass the time to search from, for example now().")));
	return cache;
}

/* One step, with the rare zone failure reported. */
static bool
fs_cron_step(FsCronCallCache *cache, TimestampTz after, TimestampTz *next)
{
	/* Nothing is strictly after infinity. */
	if (TIMESTAMP_IS_NOEND(after))
		return false;
	switch (fs_cron_next_run(&cache->cron, cache->zone, after, next))
	{
		case FS_NEXT_RUN_FOUND:
			return true;
		case FS_NEXT_RUN_NEVER:
			return false;
		case FS_NEXT_RUN_FAILED:
			break;
	}
	ereport(ERROR,
			(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
			 errmsg("cannot compute runs in time zone \"%s\" after %s",
					pg_get_timezone_name(cache->zone), timestamptz_to_str(after)),
			 errhint("Search from a time between the years 1 and 100000.")));
	return false;				/* not reached */
}

/*
 * fs_next_run(cron text, timezone text, after timestamptz) RETURNS timestamptz
 *
 * The first run strictly after `after`, or NULL when there is none.
 */
Datum
fs_next_run(PG_FUNCTION_ARGS)
{
	TimestampTz after;
	TimestampTz next;
	FsCronCallCache *cache;

	cache = fs_cron_args(fcinfo, (FsCronCallCache **) &fcinfo->flinfo->fn_extra,
						 fcinfo->flinfo->fn_mcxt, &after);

	if (!fs_cron_step(cache, after, &next))
		PG_RETURN_NULL();
	PG_RETURN_TIMESTAMPTZ(next);
}

/*
 * Most runs one fs_next_runs() call lists: as many as fs_claim() hands out
 * at most.  A set-returning function in FROM is materialised by the
 * executor whatever the function does, so without a bound one call could
 * fill gigabytes of temporary files.
 */
#define FS_NEXT_RUNS_MAX			10000

typedef struct FsNextRunsState
{
	FsCronCallCache *cache;
	TimestampTz last;
	int32		remaining;
} FsNextRunsState;

/*
 * fs_next_runs(cron text, timezone text, after timestamptz, n int)
 *		RETURNS SETOF timestamptz
 *
 * The next n runs after `after`, in order; fewer when the schedule ends.
 * Value per call: each run is computed when the executor asks for it, and
 * n is at most FS_NEXT_RUNS_MAX.
 */
Datum
fs_next_runs(PG_FUNCTION_ARGS)
{
	FuncCallContext *funcctx;
	FsNextRunsState *state;
	TimestampTz next;

	if (SRF_IS_FIRSTCALL())
	{
		MemoryContext old;
		TimestampTz after;
		FsCronCallCache *cache = NULL;
		int32		n;

		/* fn_extra belongs to the SRF machinery: this cache lives per call. */
		funcctx = SRF_FIRSTCALL_INIT();
		old = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
		cache = fs_cron_args(fcinfo, &cache, funcctx->multi_call_memory_ctx, &after);
		if (PG_ARGISNULL(3))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("the number of runs must not be null"),
					 errhint("Pass how many runs to list, for example 10.")));
		n = PG_GETARG_INT32(3);
		if (n < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("the number of runs must not be negative, got %d", n),
					 errhint("Pass how many runs to list, for example 10.")));
		if (n > FS_NEXT_RUNS_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("the number of runs must be at most %d, got %d", FS_NEXT_RUNS_MAX, n),
					 errhint("List at most %d runs per call; to go on, call fs_next_runs() again after the last run listed.",
							 FS_NEXT_RUNS_MAX)));

		state = palloc(sizeof(FsNextRunsState));
		state->cache = cache;
		state->last = after;
		state->remaining = n;
		funcctx->user_fctx = state;
		MemoryContextSwitchTo(old);
	}

	funcctx = SRF_PERCALL_SETUP();
	state = (FsNextRunsState *) funcctx->user_fctx;
	if (state->remaining > 0 && fs_cron_step(state->cache, state->last, &next))
	{
		state->remaining--;
		state->last = next;
		SRF_RETURN_NEXT(funcctx, TimestampTzGetDatum(next));
	}
	SRF_RETURN_DONE(funcctx);
}

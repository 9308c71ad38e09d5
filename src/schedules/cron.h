/*-------------------------------------------------------------------------
 *
 * cron.h
 *	  The cron engine: parsing five-field cron expressions and finding the
 *	  next run in a time zone.
 *
 * Nothing here calls into the PostgreSQL backend: errors come back as an
 * FsCronError (which field, what is wrong, what to do) and time zones are
 * reached through a lookup callback.  That keeps the engine small enough to
 * reason about and lets a fuzzer link it on its own (test/fuzz/).  The SQL
 * layer (cron_sql.c) supplies PostgreSQL's time zone database and turns
 * errors into ereport()s.
 *
 * Times are whole seconds since 1970-01-01 00:00 UTC ("instants").  A
 * "wall time" is the same count on a zone's local clock: instant + offset.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_CRON_H
#define FAIRSHARE_CRON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest expression accepted, in bytes (a full list of every value is ~400). */
#define FS_CRON_MAX_LENGTH		1000

/*
 * How far ahead a search looks before deciding that an expression never
 * fires again.  The longest real gap between runs is a 29 February that
 * skips a century year (8 years); a century leaves room for schedules
 * whose only times fall in a zone's DST gaps for a few years.
 */
#define FS_CRON_HORIZON_YEARS	100

/*
 * A zone's UTC offset is assumed to stay within this many seconds of UTC
 * (the tz database's extremes are about 16 hours, in local mean time before
 * 1900).  A lookup answering otherwise is treated as a failure.
 */
#define FS_CRON_MAX_OFFSET		(36 * 3600)

/* Instants the engine works with: about +-300,000 years around 1970. */
#define FS_CRON_MAX_INSTANT		INT64_C(10000000000000)

typedef enum FsCronField
{
	FS_CRON_MINUTE = 0,
	FS_CRON_HOUR,
	FS_CRON_DOM,
	FS_CRON_MONTH,
	FS_CRON_DOW,
	FS_CRON_NFIELDS
} FsCronField;

/* FsCronError.field for problems with the expression as a whole. */
#define FS_CRON_WHOLE			FS_CRON_NFIELDS

/* A parsed expression: one bit per allowed value of each field. */
typedef struct FsCron
{
	uint64_t	minutes;		/* bit m: minute m, 0..59 */
	uint32_t	hours;			/* bit h: hour h, 0..23 */
	uint32_t	days;			/* bit d: day of month d, 1..31 */
	uint16_t	months;			/* bit m: month m, 1..12 */
	uint8_t		weekdays;		/* bit d: day of week d, 0 (Sunday)..6 */
	uint8_t		flags;
} FsCron;

/* FsCron.flags */
#define FS_CRON_DOM_RESTRICTED	0x01	/* the day-of-month field is not a bare * */
#define FS_CRON_DOW_RESTRICTED	0x02	/* the day-of-week field is not a bare * */
#define FS_CRON_FIXED_TIME		0x04	/* no * or / in the minute and hour fields */

typedef enum FsCronErrorCode
{
	FS_CRON_OK = 0,
	FS_CRON_EMPTY,				/* nothing but white space */
	FS_CRON_TOO_LONG,			/* longer than FS_CRON_MAX_LENGTH */
	FS_CRON_FIELD_COUNT,		/* not five fields */
	FS_CRON_BAD_CHARACTER,		/* a byte cron does not use */
	FS_CRON_EMPTY_ITEM,			/* "1,,2", ",5", "5," */
	FS_CRON_SYNTAX,				/* "1-", "-5", "1-2-3", "5/" ... */
	FS_CRON_OUT_OF_RANGE,		/* a value outside the field's range */
	FS_CRON_REVERSED_RANGE,		/* "5-1" */
	FS_CRON_BAD_STEP,			/* step 0, too large, or not a number */
	FS_CRON_UNKNOWN_NAME,		/* "foo", or a name in a numeric field */
	FS_CRON_UNKNOWN_MACRO,		/* "@foo", "@reboot" */
	FS_CRON_NEVER				/* a day that no chosen month has */
} FsCronErrorCode;

typedef struct FsCronError
{
	FsCronErrorCode code;
	int			field;			/* FsCronField, or FS_CRON_WHOLE */
	char		detail[512];	/* a sentence naming the field and the problem */
	char		hint[256];		/* a sentence saying what to do */
} FsCronError;

/*
 * Parse `len` bytes at `text` (no terminator needed; any byte may occur).
 * Returns true and fills *cron, or returns false and fills *error.
 */
extern bool fs_cron_parse(const char *text, size_t len, FsCron *cron, FsCronError *error);

/* "minute", "hour", "day-of-month", "month", "day-of-week", "expression" */
extern const char *fs_cron_field_name(int field);

/*
 * Time zones.  A lookup answers, for an instant t, the UTC offset in effect
 * at t (seconds east of UTC) and the next instant after t at which the
 * offset may change (has_end false: never).  The offset is constant on
 * [t, end); the next span may have the same offset.  Returns false when the
 * zone cannot answer for t.
 */
typedef struct FsCronSpan
{
	int32_t		offset;
	bool		has_end;
	int64_t		end;			/* > t when has_end */
} FsCronSpan;

typedef bool (*FsCronZoneLookup) (const void *arg, int64_t t, FsCronSpan *span);

typedef struct FsCronZone
{
	FsCronZoneLookup lookup;
	const void *arg;
} FsCronZone;

typedef enum FsCronNextStatus
{
	FS_CRON_FOUND = 0,			/* *next is set */
	FS_CRON_NONE,				/* no run within FS_CRON_HORIZON_YEARS */
	FS_CRON_ZONE_FAILED,		/* the zone lookup failed or misbehaved */
	FS_CRON_OUT_OF_DOMAIN		/* `after` beyond +-FS_CRON_MAX_INSTANT */
} FsCronNextStatus;

/*
 * The first run strictly after `after`.  Runs are on whole minutes of the
 * zone's wall clock.  DST: a fixed-time expression (FS_CRON_FIXED_TIME)
 * runs once per matching wall time: at its first occurrence in a fall-back
 * overlap, and at the first instant after the jump when the wall time falls
 * in a spring-forward gap (so gap times that match collapse into one run).
 * Any other expression runs at every instant whose wall time matches.
 */
extern FsCronNextStatus fs_cron_next(const FsCron *cron, const FsCronZone *zone,
									 int64_t after, int64_t *next);

/* A zone with a constant offset (UTC when 0); arg points to an int32_t. */
extern bool fs_cron_fixed_zone(const void *arg, int64_t t, FsCronSpan *span);

#endif							/* FAIRSHARE_CRON_H */

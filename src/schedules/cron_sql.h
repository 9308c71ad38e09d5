/*-------------------------------------------------------------------------
 *
 * cron_sql.h
 *	  The cron engine (cron.h) seen from PostgreSQL: expressions from text
 *	  with ereport()ed errors, time zones from PostgreSQL's tz database, and
 *	  next runs as timestamptz.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_CRON_SQL_H
#define FAIRSHARE_CRON_SQL_H

#include "pgtime.h"
#include "utils/timestamp.h"

#include "schedules/cron.h"

typedef enum FsNextRun
{
	FS_NEXT_RUN_FOUND,			/* *next is set */
	FS_NEXT_RUN_NEVER,			/* it never runs again (within the horizon,
								 * or before the end of timestamptz) */
	FS_NEXT_RUN_FAILED			/* the zone cannot answer this far out */
} FsNextRun;

/* Parse, or raise an error that says which field is wrong and why. */
extern void fs_cron_parse_text(text *expr, FsCron *cron);

/* Parse without raising: false and *error filled on failure. */
extern bool fs_cron_parse_cstring(const char *expr, FsCron *cron, FsCronError *error);

/*
 * A zone by its name in PostgreSQL's tz database (any case), or NULL if it
 * is not one.  POSIX time zone specifications are not names.
 */
extern pg_tz *fs_cron_find_zone(const char *name);

/* A zone by name, or an error with a hint. */
extern pg_tz *fs_cron_zone_text(text *name);

/* The first run strictly after `after` (finite). */
extern FsNextRun fs_cron_next_run(const FsCron *cron, pg_tz *zone, TimestampTz after,
								  TimestampTz *next);

#endif							/* FAIRSHARE_CRON_SQL_H */

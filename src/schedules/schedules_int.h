/*-------------------------------------------------------------------------
 *
 * schedules_int.h
 *	  What the files of the schedules share: the schedule tables' queries,
 *	  run as the extension's superuser (tables.c), the checks of a
 *	  schedule's command (commands.c), making schedules (schedules.c) and
 *	  taking their due runs (runs.c).
 *
 * Words: fair dequeue claims rows; the scheduler takes runs.  SQL keeps
 * its fixed name for taking runs, fs_claim_due_schedules().
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_SCHEDULES_INT_H
#define FAIRSHARE_SCHEDULES_INT_H

#include "core/run_as.h"
#include "schedules/schedules.h"

typedef enum FsCatchup
{
	FS_CATCHUP_LATEST,			/* the most recent missed run, once */
	FS_CATCHUP_ALL,				/* every missed run, up to FS_CATCHUP_ALL_CAP */
	FS_CATCHUP_SKIP				/* only a run that is on time */
} FsCatchup;

/*
 * How far after now a claim's as_of may be (see fs_take_horizon()): a
 * minute, the resolution of cron, which also absorbs the clock skew of an
 * application server that computes as_of itself.
 */
#define FS_AS_OF_TOLERANCE_SECS		60

/*
 * Run fairshare's own fixed queries on the schedule tables as the bootstrap
 * superuser, with search_path pg_catalog, pg_temp, every setting made
 * inside discarded at the end (run_as.c).  No role's code runs there: the
 * tables belong to the extension, and the superuser bypasses row security.
 * Errors undo it (transaction or subtransaction abort).
 */
typedef FsRunAs FsAsSuperuser;

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

/* Columns of the due-schedule queries, in order. */
enum
{
	DUE_ID = 1, DUE_OWNER_OID, DUE_OWNER, DUE_NAME, DUE_CRON, DUE_TIMEZONE, DUE_CATCHUP,
	DUE_NEXT_RUN_AT, DUE_TENANT, DUE_QUEUE, DUE_PAYLOAD, DUE_COMMAND, DUE_STATE_XMIN
};

/* tables.c */
extern void fs_tables_open(FsAsSuperuser *s);
extern void fs_tables_close(FsAsSuperuser *s);
extern int fs_execute(FsQuery q, Datum *values, const char *nulls, bool read_only, long count);
extern void fs_check_as_of(TimestampTz as_of);

/* commands.c */
extern void fs_check_command(const char *command);
extern void fs_warn_command_not_run(const char *name);

/* schedules.c */
extern FsCatchup fs_catchup_from_string(const char *s);
extern Datum fs_text_or_null(const char *s, char *null_flag);

#endif							/* FAIRSHARE_SCHEDULES_INT_H */

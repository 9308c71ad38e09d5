/*-------------------------------------------------------------------------
 *
 * run_as.c
 *	  Running another role's code without letting it outlive its turn.
 *
 * Every place where fairshare runs SQL that another role can influence goes
 * through fs_run_as_begin() / fs_run_as_end():
 *
 *	- a recount of a fair-dequeue queue (fs_resync(), the background worker,
 *	  the first fs_claim() of a server run) counts the ready table as its
 *	  owner, read-only;
 *	- the triggers on a registered table evaluate registered expressions
 *	  that call functions other than pg_catalog's as the table's owner,
 *	  read-only;
 *	- the background worker runs a schedule's command as its owner;
 *	- registration folds the constant parts of expressions as the table's
 *	  owner, as CREATE INDEX evaluates them;
 *	- the schedule functions run fairshare's own fixed queries as the
 *	  bootstrap superuser (FS_RUN_AS_UNRESTRICTED: no other role's code runs
 *	  there, the settings are discarded all the same).
 *
 * The rules are PostgreSQL's own for maintenance commands on a table it does
 * not trust (VACUUM, ANALYZE, CREATE INDEX, REFRESH MATERIALIZED VIEW):
 * switch to the role with SECURITY_RESTRICTED_OPERATION (no SET ROLE, no
 * SET SESSION AUTHORIZATION, no temporary tables, no LISTEN, no cursors
 * WITH HOLD, no PREPARE TRANSACTION), open a GUC nesting level, and close it
 * with AtEOXact_GUC(false, ...), which discards every setting made inside,
 * session-level ones included.  Closing it with "true" would keep a
 * set_config('search_path', ..., false) made by the role's code, and the
 * next function the caller calls by an unqualified name would be the role's.
 *
 * On an error, the abort of the enclosing (sub)transaction restores the
 * user id, the security context and every setting, so callers need no
 * PG_TRY of their own for these.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/guc.h"

#include "core/run_as.h"

/* The search_path of every query fairshare builds or runs for someone. */
#define FS_FIXED_SEARCH_PATH	"pg_catalog, pg_temp"

/*
 * Open a GUC nesting level with search_path set to pg_catalog, pg_temp;
 * returns the level for fs_search_path_end().
 */
int
fs_search_path_begin(void)
{
	int			nest = NewGUCNestLevel();

	(void) set_config_option("search_path", FS_FIXED_SEARCH_PATH,
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	return nest;
}

/*
 * Close the level: search_path and every setting made since
 * fs_search_path_begin() go back to what they were.
 */
void
fs_search_path_end(int nestlevel)
{
	AtEOXact_GUC(false, nestlevel);
}

/*
 * Become `role` in a security-restricted operation with a fixed search_path
 * (and, with FS_RUN_AS_READ_ONLY, as a read-only transaction) until
 * fs_run_as_end(state).
 */
void
fs_run_as_begin(FsRunAs *state, Oid role, int flags)
{
	int			sec_context;

	GetUserIdAndSecContext(&state->save_userid, &state->save_sec_context);
	sec_context = state->save_sec_context | SECURITY_LOCAL_USERID_CHANGE;
	if (!(flags & FS_RUN_AS_UNRESTRICTED))
		sec_context |= SECURITY_RESTRICTED_OPERATION;
	SetUserIdAndSecContext(role, sec_context);
	if (flags & FS_RUN_AS_OWN_PATH)
		state->nestlevel = NewGUCNestLevel();
	else
		state->nestlevel = fs_search_path_begin();

	/*
	 * Going to read-only is allowed at any point of a transaction; going
	 * back to read-write is refused inside one once a query ran, so the
	 * role's code cannot undo it.  Closing the nesting level restores the
	 * caller's mode.
	 */
	if (flags & FS_RUN_AS_READ_ONLY)
		(void) set_config_option("transaction_read_only", "on",
								 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
}

/* Undo fs_run_as_begin(): the caller's role, context and settings. */
void
fs_run_as_end(FsRunAs *state)
{
	AtEOXact_GUC(false, state->nestlevel);
	SetUserIdAndSecContext(state->save_userid, state->save_sec_context);
}

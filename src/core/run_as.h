/*-------------------------------------------------------------------------
 *
 * run_as.h
 *	  Running another role's code without letting it outlive its turn.
 *
 * fairshare runs SQL that a table's owner can influence (its row-level
 * security policies, the functions a registered expression calls) and SQL
 * that a schedule's owner wrote.  It runs them as that role, inside a
 * security-restricted operation, as PostgreSQL runs index expressions in
 * VACUUM and CREATE INDEX: the role cannot change roles or create temporary
 * tables, and every setting it makes (search_path included, even with
 * set_config(..., false)) is discarded when its turn ends.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FS_RUN_AS_H
#define FS_RUN_AS_H

/* What fs_run_as_begin() saved, for fs_run_as_end(). */
typedef struct FsRunAs
{
	Oid			save_userid;
	int			save_sec_context;
	int			nestlevel;
} FsRunAs;

/*
 * Flags of fs_run_as_begin():
 *
 * FS_RUN_AS_READ_ONLY: the turn also runs as a read-only transaction would:
 * the role's code cannot write anything, temporary objects included (a
 * temporary domain or function would otherwise stay in the session).
 *
 * FS_RUN_AS_OWN_PATH: leave search_path as it is (the caller sets the
 * role's own settings, as the scheduler does for a command); by default it
 * is pg_catalog, pg_temp.
 *
 * FS_RUN_AS_UNRESTRICTED: no security-restricted operation, for
 * fairshare's own fixed queries run as a superuser (never another role's
 * code).
 */
#define FS_RUN_AS_READ_ONLY		0x01
#define FS_RUN_AS_OWN_PATH		0x02
#define FS_RUN_AS_UNRESTRICTED	0x04

extern void fs_run_as_begin(FsRunAs *state, Oid role, int flags);
extern void fs_run_as_end(FsRunAs *state);

/* Only a fixed search_path (no role change): fairshare's own SQL. */
extern int	fs_search_path_begin(void);
extern void fs_search_path_end(int nestlevel);

#endif							/* FS_RUN_AS_H */

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
 * With FS_RUN_AS_READ_ONLY the turn also runs as a read-only transaction
 * would: the role's code cannot write anything, temporary objects included
 * (a temporary domain or function would otherwise stay in the session).
 */
#define FS_RUN_AS_READ_ONLY		0x01

extern void fs_run_as_begin(FsRunAs *state, Oid role, int flags);
extern void fs_run_as_end(FsRunAs *state);

/* Only a fixed search_path (no role change): fairshare's own SQL. */
extern int	fs_search_path_begin(void);
extern void fs_search_path_end(int nestlevel);

#endif							/* FS_RUN_AS_H */

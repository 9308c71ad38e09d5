/*-------------------------------------------------------------------------
 *
 * subxact.h
 *	  Running a piece of work in an internal subtransaction that may fail
 *	  without failing the statement, except for errors that must.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FS_SUBXACT_H
#define FS_SUBXACT_H

/* The work: called once, in the caller's memory context and resource owner. */
typedef void (*FsSubxactFn) (void *arg);

/* Which errors (by SQLSTATE) the caller handles; NULL: any it may. */
typedef bool (*FsSubxactCatches) (int sqlerrcode);

extern bool fs_subxact_run(FsSubxactFn fn, void *arg, FsSubxactCatches catches,
						   ErrorData **error);
extern bool fs_error_must_propagate(int sqlerrcode);

#endif							/* FS_SUBXACT_H */

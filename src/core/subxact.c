/*-------------------------------------------------------------------------
 *
 * subxact.c
 *	  Running a piece of work in an internal subtransaction that may fail
 *	  without failing the statement, except for errors that must.
 *
 * Some work fairshare does on the side of a user's statement may fail for
 * reasons that must not fail the statement: a registration that no longer
 * compiles against its table must not make the application's writes fail,
 * and one queue whose recount fails must not stop the recount of the
 * others.  Such work runs in an internal subtransaction; its error is
 * rolled back and handed to the caller, who reports it (as a WARNING) and
 * goes on.
 *
 * Not every error is the work's own, though.  A cancel (pg_cancel_backend,
 * statement_timeout), a terminate or shutdown, a lock_timeout, running out
 * of memory or disk, a serialization failure or a deadlock are about the
 * statement or the whole transaction: swallowing them would make a user's
 * cancel do nothing, or hide a condition the caller has to act on.  These
 * are re-thrown, after the subtransaction is rolled back properly.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/elog.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "core/subxact.h"

/*
 * Whether an error of this SQLSTATE must reach the statement even from
 * work that is allowed to fail: query cancel and statement_timeout (57014)
 * and the rest of class 57 (operator intervention: terminate, shutdown,
 * database dropped, idle session timeout), class 53 (insufficient
 * resources: out of memory, disk full), class 40 (transaction rollback:
 * serialization failure, deadlock) and lock_timeout (55P03).
 */
bool
fs_error_must_propagate(int sqlerrcode)
{
	int			category = ERRCODE_TO_CATEGORY(sqlerrcode);

	return category == ERRCODE_OPERATOR_INTERVENTION ||
		category == ERRCODE_INSUFFICIENT_RESOURCES ||
		category == ERRCODE_TRANSACTION_ROLLBACK ||
		sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE;
}

/*
 * Run fn(arg) in an internal subtransaction.  Returns true if it completed
 * (the subtransaction is committed into the caller's transaction).  If it
 * raised an error, the subtransaction is rolled back; an error that must
 * propagate (fs_error_must_propagate()), or that `catches` (when not NULL)
 * says the caller does not handle, is then re-thrown; any other one is
 * returned in *error (allocated in the caller's memory context, to be
 * reported and freed with FreeErrorData()) and the result is false.
 *
 * fn runs in the caller's memory context, so what it allocates survives the
 * subtransaction; on error, what it changed outside the database (backend
 * memory, shared memory) is the caller's to undo.
 */
bool
fs_subxact_run(FsSubxactFn fn, void *arg, FsSubxactCatches catches, ErrorData **error)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	ErrorData  *volatile edata = NULL;

	*error = NULL;
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		fn(arg);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_END_TRY();

	if (edata == NULL)
		return true;
	if (fs_error_must_propagate(edata->sqlerrcode) ||
		(catches != NULL && !catches(edata->sqlerrcode)))
		ReThrowError(edata);
	*error = edata;
	return false;
}

/*-------------------------------------------------------------------------
 *
 * prepared.c
 *	  Changes of prepared transactions, published when they commit (see
 *	  prepared.h for what and why).
 *
 * Locking: the table of notes is protected by its spinlock, held only to
 * copy, add or remove entries; commit-log lookups and publishing happen
 * with no lock held.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "core/prepared.h"

/* A prepared transaction's kinds of change, to publish when it commits. */
typedef struct FsPreparedNote
{
	TransactionId xid;
	uint32		kinds;
} FsPreparedNote;

typedef struct FsPreparedShared
{
	slock_t		mutex;			/* protects everything below */
	TimestampTz started_at;		/* when this shared memory was made */

	/*
	 * Transactions prepared before started_at may exist, with no note: each
	 * is published for every kind when it commits.  Cleared when none is
	 * left.
	 */
	bool		older_may_exist;
	bool		overflowed;		/* a note found no room: publish every kind */
	int			count;
	FsPreparedNote notes[FLEXIBLE_ARRAY_MEMBER];
} FsPreparedShared;

static FsPreparedShared *fs_prepared = NULL;
static FsPreparedPublish publishers[FS_PREPARED_NKINDS];
static ProcessUtility_hook_type prev_process_utility = NULL;

/* Room for every prepared transaction, and the one being prepared. */
static int
fs_prepared_capacity(void)
{
	return max_prepared_xacts + 1;
}

static Size
fs_prepared_shmem_size(void)
{
	return add_size(offsetof(FsPreparedShared, notes),
					mul_size(sizeof(FsPreparedNote), fs_prepared_capacity()));
}

/* Ask for this module's shared memory (shmem request hook, module.c). */
void
fs_prepared_shmem_request(void)
{
	RequestAddinShmemSpace(fs_prepared_shmem_size());
}

/* Create (or attach to) the table of notes.  Caller holds AddinShmemInitLock. */
void
fs_prepared_shmem_init(void)
{
	bool		found;

	fs_prepared = ShmemInitStruct("fairshare prepared transactions",
								  fs_prepared_shmem_size(), &found);
	if (!found)
	{
		SpinLockInit(&fs_prepared->mutex);
		fs_prepared->started_at = GetCurrentTimestamp();
		fs_prepared->older_may_exist = true;
		fs_prepared->overflowed = false;
		fs_prepared->count = 0;
	}
}

/* The publish function of a kind of change (at _PG_init). */
void
fs_prepared_on_commit(uint32 kind, FsPreparedPublish publish)
{
	int			i;

	for (i = 0; i < FS_PREPARED_NKINDS; i++)
		if (kind == (1U << i))
			publishers[i] = publish;
}

/* Run the publish functions of `kinds`. */
static void
fs_prepared_publish(uint32 kinds)
{
	int			i;

	for (i = 0; i < FS_PREPARED_NKINDS; i++)
		if ((kinds & (1U << i)) && publishers[i] != NULL)
			publishers[i] ();
}

/*
 * Drop the notes of transactions that are over, and return the kinds of
 * those that committed.  A transaction whose PREPARE failed after its note
 * was taken aborted, so its note goes too.
 */
static uint32
fs_prepared_settle(void)
{
	FsPreparedNote over[64];
	int			nover = 0;
	uint32		committed = 0;
	int			i;
	int			j;

	if (fs_prepared == NULL)
		return 0;

	/* Which notes are over: commit-log lookups, with no lock held. */
	SpinLockAcquire(&fs_prepared->mutex);
	for (i = 0; i < fs_prepared->count && nover < (int) lengthof(over); i++)
		over[nover++] = fs_prepared->notes[i];
	SpinLockRelease(&fs_prepared->mutex);
	for (i = 0, j = 0; i < nover; i++)
	{
		/* A prepared transaction is in progress until it is finished. */
		if (TransactionIdIsInProgress(over[i].xid))
			continue;
		if (TransactionIdDidCommit(over[i].xid))
			committed |= over[i].kinds;
		over[j++] = over[i];
	}
	nover = j;

	/* Remove them (other notes may have come and gone meanwhile). */
	SpinLockAcquire(&fs_prepared->mutex);
	for (i = 0; i < nover; i++)
		for (j = 0; j < fs_prepared->count; j++)
			if (fs_prepared->notes[j].xid == over[i].xid)
			{
				fs_prepared->notes[j] = fs_prepared->notes[--fs_prepared->count];
				break;
			}
	SpinLockRelease(&fs_prepared->mutex);
	return committed;
}

/*
 * Note that the transaction being prepared made changes of `kinds`, to be
 * published when it commits.  Called at XACT_EVENT_PRE_PREPARE; a
 * transaction with no xid changed nothing.
 */
void
fs_prepared_note(uint32 kinds)
{
	TransactionId xid = GetTopTransactionIdIfAny();
	bool		added = false;
	int			attempt;
	int			i;

	if (fs_prepared == NULL || !TransactionIdIsValid(xid))
		return;
	for (attempt = 0; attempt < 2 && !added; attempt++)
	{
		if (attempt > 0)
			(void) fs_prepared_settle();	/* notes of failed PREPAREs */
		SpinLockAcquire(&fs_prepared->mutex);
		for (i = 0; i < fs_prepared->count; i++)
			if (fs_prepared->notes[i].xid == xid)
				break;
		if (i < fs_prepared->count)
		{
			fs_prepared->notes[i].kinds |= kinds;
			added = true;
		}
		else if (fs_prepared->count < fs_prepared_capacity())
		{
			fs_prepared->notes[fs_prepared->count].xid = xid;
			fs_prepared->notes[fs_prepared->count].kinds = kinds;
			fs_prepared->count++;
			added = true;
		}
		else if (attempt > 0)
			fs_prepared->overflowed = true;
		SpinLockRelease(&fs_prepared->mutex);
	}
}

/*
 * Whether the prepared transaction `gid` was prepared before this shared
 * memory was made (so it has no note), and whether it is the last one
 * that was.  Asked only while such transactions may exist.
 */
static bool
fs_prepared_is_older(const char *gid, bool *last_older)
{
	Oid			argtypes[2] = {TIMESTAMPTZOID, TEXTOID};
	Datum		values[2];
	bool		older = false;
	bool		isnull;

	values[0] = TimestampTzGetDatum(fs_prepared->started_at);
	values[1] = CStringGetTextDatum(gid);
	*last_older = false;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute_with_args("SELECT coalesce(bool_or(gid OPERATOR(pg_catalog.=) $2), false),"
							  "       count(*) FILTER (WHERE gid OPERATOR(pg_catalog.<>) $2)"
							  "  FROM pg_catalog.pg_prepared_xacts"
							  " WHERE prepared OPERATOR(pg_catalog.<) $1",
							  2, argtypes, values, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not read pg_prepared_xacts");
	older = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	*last_older = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
											  &isnull)) == 0;
	SPI_finish();
	return older;
}

/*
 * ProcessUtility hook: after COMMIT PREPARED, publish what the transaction
 * changed; after either COMMIT or ROLLBACK PREPARED, drop the notes of
 * transactions that are over.  Everything else passes through.
 */
static void
fs_prepared_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
							ProcessUtilityContext context, ParamListInfo params,
							QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;
	TransactionStmt *stmt = NULL;
	bool		older = false;
	bool		last_older = false;
	bool		overflowed = false;
	uint32		kinds;

	if (IsA(parsetree, TransactionStmt))
	{
		stmt = (TransactionStmt *) parsetree;
		if (stmt->kind != TRANS_STMT_COMMIT_PREPARED && stmt->kind != TRANS_STMT_ROLLBACK_PREPARED)
			stmt = NULL;
	}
	if (stmt != NULL && fs_prepared != NULL)
	{
		bool		may_be_older;

		SpinLockAcquire(&fs_prepared->mutex);
		may_be_older = fs_prepared->older_may_exist;
		overflowed = fs_prepared->overflowed;
		SpinLockRelease(&fs_prepared->mutex);
		if (may_be_older)
			older = fs_prepared_is_older(stmt->gid, &last_older);
	}

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);

	if (stmt == NULL || fs_prepared == NULL)
		return;
	kinds = fs_prepared_settle();
	if (stmt->kind == TRANS_STMT_COMMIT_PREPARED && (older || overflowed))
		kinds = (1U << FS_PREPARED_NKINDS) - 1;
	if (last_older)
	{
		SpinLockAcquire(&fs_prepared->mutex);
		fs_prepared->older_may_exist = false;
		SpinLockRelease(&fs_prepared->mutex);
	}
	fs_prepared_publish(kinds);
}

/* Install the ProcessUtility hook (at _PG_init). */
void
fs_prepared_init(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = fs_prepared_process_utility;
}

/*-------------------------------------------------------------------------
 *
 * prepared.c
 *	  Changes of prepared transactions, published when they commit (see
 *	  prepared.h for what and why).
 *
 * A note is taken at PREPARE, for the transaction's xid, and dropped when
 * the transaction is over: by the preparing backend if the PREPARE fails,
 * otherwise by whichever backend runs the next COMMIT or ROLLBACK PREPARED
 * (a committed one is published then).
 *
 * A transaction with an xid below the boundary may have been prepared
 * without a note: before this shared memory was made (a restart, a crash),
 * on the primary this server was a standby of (a promotion), or while the
 * table of notes was full.  The boundary is the next xid when this server
 * first took or looked at notes as a primary, raised when the table
 * overflows; such a transaction is published for every kind when it
 * commits.  The boundary is forgotten once no prepared transaction below it
 * is left.
 *
 * Parked effects are kept beside the notes until the transaction is over,
 * then taken out one at a time and settled (finished or undone) by whoever
 * takes each; the note goes after its effects.
 *
 * Locking: the table of notes is protected by its spinlock, held only to
 * copy, add or remove entries; commit-log lookups, queries, settling and
 * publishing happen with no lock held.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"

#include "core/prepared.h"

/* A prepared transaction's kinds of change, to publish when it commits. */
typedef struct FsPreparedNote
{
	TransactionId xid;
	uint32		kinds;
	int32		finisher_pid;	/* the backend running its COMMIT PREPARED,
								 * which alone finishes its effects; 0: any */
} FsPreparedNote;

/* An effect parked by a prepared transaction. */
typedef struct FsParkedSlot
{
	TransactionId xid;
	FsParkedEffect effect;
} FsParkedSlot;

typedef struct FsPreparedShared
{
	slock_t		mutex;			/* protects everything below */

	/*
	 * Transactions with an xid below `boundary` may be prepared with no note
	 * (while `older_may_exist`); invalid until first set, as a primary.
	 */
	FullTransactionId boundary;
	bool		older_may_exist;
	int			count;			/* notes in use */
	int			nparked;		/* parked effects in use */
	/* then the notes, then the parked effects (fs_prepared_shmem_size()) */
} FsPreparedShared;

static FsPreparedShared *fs_prepared = NULL;
static FsPreparedNote *notes = NULL;
static FsParkedSlot *parked = NULL;
static FsPreparedPublish publishers[FS_PREPARED_NKINDS];
static FsParkedSettle finishers[FS_PARKED_KINDS];	/* at COMMIT PREPARED */
static FsParkedSettle undoers[FS_PARKED_KINDS];	/* at ROLLBACK PREPARED */
static FsParkedBeforeCommit befores[FS_PARKED_KINDS];	/* before COMMIT PREPARED */
static FsParkedAfterCommit afters[FS_PARKED_KINDS];
static ProcessUtility_hook_type prev_process_utility = NULL;

static void fs_prepared_finish_abandon(void);

/* The note this backend took for the transaction it is preparing. */
static TransactionId noted_xid = InvalidTransactionId;

/* How many effects it parked for that transaction, of all layers. */
static int	parked_by_me = 0;

/*
 * The prepared transaction whose COMMIT PREPARED this backend runs, when it
 * framed the finishing of some kinds of its effects (their bits).
 */
static TransactionId finishing_xid = InvalidTransactionId;
static uint32 finishing_kinds = 0;

/* Room for every prepared transaction, and the one being prepared. */
static int
fs_prepared_capacity(void)
{
	return max_prepared_xacts + 1;
}

/* Room for the parked effects of as many. */
static int
fs_parked_capacity(void)
{
	return fs_prepared_capacity() * FS_PREPARED_PARKED_PER_XACT;
}

static Size
fs_prepared_shmem_size(void)
{
	return add_size(add_size(MAXALIGN(sizeof(FsPreparedShared)),
							 MAXALIGN(mul_size(sizeof(FsPreparedNote), fs_prepared_capacity()))),
					mul_size(sizeof(FsParkedSlot), fs_parked_capacity()));
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
	notes = (FsPreparedNote *) ((char *) fs_prepared + MAXALIGN(sizeof(FsPreparedShared)));
	parked = (FsParkedSlot *) ((char *) notes +
							   MAXALIGN(sizeof(FsPreparedNote) * fs_prepared_capacity()));
	if (!found)
	{
		SpinLockInit(&fs_prepared->mutex);
		fs_prepared->boundary = InvalidFullTransactionId;
		fs_prepared->older_may_exist = true;
		fs_prepared->count = 0;
		fs_prepared->nparked = 0;
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

/*
 * What COMMIT PREPARED (`at_commit`) and ROLLBACK PREPARED (`at_rollback`)
 * do with an effect of a kind parked; either may be NULL (at _PG_init).
 */
void
fs_prepared_on_settle(uint32 parked_kind, FsParkedSettle at_commit, FsParkedSettle at_rollback)
{
	if (parked_kind < FS_PARKED_KINDS)
	{
		finishers[parked_kind] = at_commit;
		undoers[parked_kind] = at_rollback;
	}
}

/*
 * The functions that frame the finishing of a kind of parked effect by the
 * COMMIT PREPARED that commits its transaction (at _PG_init).
 */
void
fs_prepared_on_commit_prepared(uint32 parked_kind, FsParkedBeforeCommit before,
							   FsParkedAfterCommit after)
{
	if (parked_kind < FS_PARKED_KINDS)
	{
		befores[parked_kind] = before;
		afters[parked_kind] = after;
	}
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
 * The boundary below which a prepared transaction may have no note; set to
 * the next xid the first time a primary asks, or (with `raise`) now.
 */
static FullTransactionId
fs_prepared_boundary(bool raise)
{
	FullTransactionId boundary;
	FullTransactionId next;

	if (RecoveryInProgress())
		return InvalidFullTransactionId;
	next = ReadNextFullTransactionId();
	SpinLockAcquire(&fs_prepared->mutex);
	if (raise || !FullTransactionIdIsValid(fs_prepared->boundary))
	{
		fs_prepared->boundary = next;
		if (raise)
			fs_prepared->older_may_exist = true;
	}
	boundary = fs_prepared->boundary;
	SpinLockRelease(&fs_prepared->mutex);
	return boundary;
}

/* Take one parked effect of `xid` out of shared memory into *out; false when none is left. */
static bool
fs_prepared_take_effect(TransactionId xid, FsParkedEffect *out)
{
	bool		found = false;
	int			i;

	SpinLockAcquire(&fs_prepared->mutex);
	for (i = 0; i < fs_prepared->nparked; i++)
		if (parked[i].xid == xid)
		{
			*out = parked[i].effect;
			parked[i] = parked[--fs_prepared->nparked];
			found = true;
			break;
		}
	SpinLockRelease(&fs_prepared->mutex);
	return found;
}

/*
 * The transaction `xid` is over: finish its parked effects (it committed)
 * or undo them, then remove its note; returns the note's kinds (0 if
 * another backend removed it first).  Each effect is taken out of shared
 * memory before it is settled, so each is settled once, by whichever
 * backend takes it; an error while settling one leaves the rest, and the
 * note, to the next settle.  No lock is held while settling.
 */
static uint32
fs_prepared_end(TransactionId xid, bool committed)
{
	FsParkedEffect effect;
	uint32		kinds = 0;
	int			i;

	while (fs_prepared_take_effect(xid, &effect))
	{
		FsParkedSettle settle = NULL;

		if (effect.kind < FS_PARKED_KINDS)
			settle = committed ? finishers[effect.kind] : undoers[effect.kind];
		if (settle != NULL)
			settle(&effect);
	}
	SpinLockAcquire(&fs_prepared->mutex);
	for (i = 0; i < fs_prepared->count; i++)
		if (notes[i].xid == xid)
		{
			kinds = notes[i].kinds;
			notes[i] = notes[--fs_prepared->count];
			break;
		}
	SpinLockRelease(&fs_prepared->mutex);
	return kinds;
}

/*
 * Whether a transaction that is over is this backend's to settle: its note
 * is not marked by another backend's COMMIT PREPARED (one that is gone
 * does not count).
 */
static bool
fs_prepared_settle_mine(TransactionId xid)
{
	int32		finisher = 0;

	SpinLockAcquire(&fs_prepared->mutex);
	for (int i = 0; i < fs_prepared->count; i++)
		if (notes[i].xid == xid)
		{
			finisher = notes[i].finisher_pid;
			break;
		}
	SpinLockRelease(&fs_prepared->mutex);
	return finisher == 0 || finisher == MyProcPid || BackendPidGetProc(finisher) == NULL;
}

/*
 * Drop the notes of transactions that are over, finish the parked effects
 * of those that committed and undo those of the ones that rolled back, and
 * return the kinds of those that committed.
 * Looked at in batches, with no lock held during the commit-log lookups;
 * a batch in which some were over is looked at again (notes from the end
 * took their places), so every pass removes a note or moves on.
 */
static uint32
fs_prepared_settle(void)
{
	FsPreparedNote batch[64];
	uint32		committed = 0;
	int			start = 0;

	for (;;)
	{
		int			n = 0;
		int			removed = 0;
		int			i;
		TransactionId oldest_clog;

		SpinLockAcquire(&fs_prepared->mutex);
		for (i = start; i < fs_prepared->count && n < (int) lengthof(batch); i++)
			batch[n++] = notes[i];
		SpinLockRelease(&fs_prepared->mutex);
		if (n == 0)
			break;

		oldest_clog = ShmemVariableCache->oldestClogXid;
		for (i = 0; i < n; i++)
		{
			bool		did_commit;

			/* A prepared transaction is in progress until it is finished. */
			if (TransactionIdIsInProgress(batch[i].xid))
				continue;
			/* Past the commit log's horizon it is long over: publish it, to be safe. */
			did_commit = TransactionIdPrecedes(batch[i].xid, oldest_clog) ||
				TransactionIdDidCommit(batch[i].xid);
			/*
			 * A committed one's COMMIT PREPARED finishes it, unless that
			 * backend is gone: the mark is read again now, since it is set
			 * before the transaction commits.  (Only commits are framed.)
			 */
			if (did_commit && !fs_prepared_settle_mine(batch[i].xid))
				continue;
			if (fs_prepared_end(batch[i].xid, did_commit) != 0 && did_commit)
				committed |= batch[i].kinds;
			removed++;
		}
		if (removed == 0)
			start += n;
	}
	return committed;
}

/*
 * Park `count` effects of the transaction being prepared, to be finished if
 * COMMIT PREPARED ends it and undone if ROLLBACK PREPARED does.  Called at
 * XACT_EVENT_PRE_PREPARE, with the caller's own record of them intact: an
 * error here parks none of them, and refuses the PREPARE (more than a
 * transaction may park, of all layers together, or no room left).  Once
 * this returns, whoever takes them out of shared memory settles them, once:
 * the caller must forget them.
 */
void
fs_prepared_park(const FsParkedEffect *effects, int count)
{
	TransactionId xid;
	bool		room;
	int			i;

	if (count <= 0)
		return;
	if (parked_by_me + count > FS_PREPARED_PARKED_PER_XACT)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("cannot prepare a transaction that made more than %d fairshare changes",
						FS_PREPARED_PARKED_PER_XACT),
				 errdetail("A prepared transaction keeps what its commit or rollback must do for at most %d changes together: a lease taken, a lease released, a (queue, tenant)'s tokens spent or charged, a (queue, tenant, sub-key)'s jobs enqueued, a job finished, a queue's table truncated.",
						   FS_PREPARED_PARKED_PER_XACT),
				 errhint("Split the work into smaller transactions: fewer tenants, leases or finished jobs in each.")));
	xid = GetTopTransactionId();
	room = fs_prepared != NULL;
	if (room)
		fs_prepared_note(FS_PREPARED_PARKED);
	/* Without a note nothing would ever settle them. */
	room = room && noted_xid == xid;
	if (room)
	{
		SpinLockAcquire(&fs_prepared->mutex);
		room = fs_prepared->nparked + count <= fs_parked_capacity();
		for (i = 0; room && i < count; i++)
		{
			parked[fs_prepared->nparked].xid = xid;
			parked[fs_prepared->nparked].effect = effects[i];
			fs_prepared->nparked++;
		}
		SpinLockRelease(&fs_prepared->mutex);
	}
	if (!room)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("no room to keep the changes of another prepared transaction"),
				 errdetail("fairshare keeps up to %d changes for each of max_prepared_transactions prepared transactions.",
						   FS_PREPARED_PARKED_PER_XACT),
				 errhint("Commit or roll back prepared transactions, or raise max_prepared_transactions.")));
	parked_by_me += count;
}

/*
 * Note that the transaction being prepared made changes of `kinds`, to be
 * published when it commits.  Called at XACT_EVENT_PRE_PREPARE; a
 * transaction with no xid changed nothing.  With no room left (which takes
 * notes that no COMMIT or ROLLBACK PREPARED settled), every transaction
 * prepared until now is published for every kind when it commits.
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
	(void) fs_prepared_boundary(false);
	for (attempt = 0; attempt < 2 && !added; attempt++)
	{
		if (attempt > 0)
			(void) fs_prepared_settle();
		SpinLockAcquire(&fs_prepared->mutex);
		for (i = 0; i < fs_prepared->count; i++)
			if (notes[i].xid == xid)
				break;
		if (i < fs_prepared->count)
		{
			notes[i].kinds |= kinds;
			added = true;
		}
		else if (fs_prepared->count < fs_prepared_capacity())
		{
			notes[fs_prepared->count].xid = xid;
			notes[fs_prepared->count].kinds = kinds;
			notes[fs_prepared->count].finisher_pid = 0;
			fs_prepared->count++;
			added = true;
		}
		SpinLockRelease(&fs_prepared->mutex);
	}
	if (added)
		noted_xid = xid;
	else
		(void) fs_prepared_boundary(true);	/* this xid is below it too */
}

/*
 * Transaction end in the preparing backend: a PREPARE that failed takes its
 * note back and undoes its parked effects, unless a settle in another
 * backend (which sees the aborted xid as soon as it is out of the process
 * array) took them first: whoever removes them settles them, once.  One that
 * succeeded leaves them to COMMIT or ROLLBACK PREPARED.
 */
static void
fs_prepared_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	if (TransactionIdIsValid(finishing_xid) &&
		(event == XACT_EVENT_ABORT || event == XACT_EVENT_COMMIT))
		fs_prepared_finish_abandon();
	if (!TransactionIdIsValid(noted_xid))
		return;
	if (event == XACT_EVENT_ABORT && fs_prepared != NULL)
		fs_prepared_end(noted_xid, false);
	if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE)
	{
		noted_xid = InvalidTransactionId;
		parked_by_me = 0;
	}
}

/*
 * The xid of the prepared transaction `gid` if this session may finish it
 * (it was prepared in this database, by this role or the caller is a
 * superuser), or InvalidTransactionId.
 */
static TransactionId
fs_prepared_xid_of(const char *gid)
{
	Oid			argtypes[2] = {TEXTOID, BOOLOID};
	Datum		values[2];
	TransactionId xid = InvalidTransactionId;

	values[0] = CStringGetTextDatum(gid);
	values[1] = BoolGetDatum(superuser());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute_with_args("SELECT transaction FROM pg_catalog.pg_prepared_xacts"
							  " WHERE gid OPERATOR(pg_catalog.=) $1"
							  "   AND database OPERATOR(pg_catalog.=) pg_catalog.current_database()"
							  "   AND (owner OPERATOR(pg_catalog.=) CURRENT_USER OR $2)",
							  2, argtypes, values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read pg_prepared_xacts");
	if (SPI_processed == 1)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			xid = DatumGetTransactionId(d);
	}
	SPI_finish();
	return xid;
}

/*
 * Before COMMIT PREPARED `gid` run at top level: if its transaction parked
 * effects of a kind whose finishing is framed
 * (fs_prepared_on_commit_prepared()), mark its note as finished by this
 * backend and run the kinds' `before` functions.  Only when the statement
 * can succeed as far as this backend can tell (at top level, outside a
 * transaction block, a transaction of this database the caller may
 * finish); one that another live backend is finishing is refused as busy,
 * as PostgreSQL would refuse it.  An error here leaves the transaction
 * prepared (the abort clears the mark).
 */
static void
fs_prepared_finish_begin(const char *gid)
{
	FsParkedEffect *effects;
	FsParkedEffect *of_kind;
	TransactionId xid;
	bool		framed = false;
	bool		noted = false;
	int32		busy = 0;
	int			n = 0;
	int			i;

	for (i = 0; i < FS_PARKED_KINDS; i++)
		framed |= befores[i] != NULL;
	SpinLockAcquire(&fs_prepared->mutex);
	framed &= fs_prepared->nparked > 0;
	SpinLockRelease(&fs_prepared->mutex);
	if (!framed)
		return;
	xid = fs_prepared_xid_of(gid);
	if (!TransactionIdIsValid(xid))
		return;

	effects = palloc(sizeof(FsParkedEffect) * FS_PREPARED_PARKED_PER_XACT);
	of_kind = palloc(sizeof(FsParkedEffect) * FS_PREPARED_PARKED_PER_XACT);
	SpinLockAcquire(&fs_prepared->mutex);
	for (i = 0; i < fs_prepared->nparked && n < FS_PREPARED_PARKED_PER_XACT; i++)
		if (parked[i].xid == xid && befores[parked[i].effect.kind % FS_PARKED_KINDS] != NULL)
			effects[n++] = parked[i].effect;
	for (i = 0; n > 0 && i < fs_prepared->count; i++)
		if (notes[i].xid == xid)
		{
			noted = true;
			if (notes[i].finisher_pid == 0 || notes[i].finisher_pid == MyProcPid)
				notes[i].finisher_pid = MyProcPid;
			else
				busy = notes[i].finisher_pid;
			break;
		}
	SpinLockRelease(&fs_prepared->mutex);
	if (busy != 0 && BackendPidGetProc(busy) == NULL)
	{
		/* Its finisher is gone: take the mark over, unless another did. */
		SpinLockAcquire(&fs_prepared->mutex);
		for (i = 0; i < fs_prepared->count; i++)
			if (notes[i].xid == xid && notes[i].finisher_pid == busy)
			{
				notes[i].finisher_pid = MyProcPid;
				busy = 0;
			}
		SpinLockRelease(&fs_prepared->mutex);
	}
	if (busy != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("prepared transaction with identifier \"%s\" is busy", gid),
				 errdetail("Another session is committing it."),
				 errhint("Wait for that session, then look at pg_prepared_xacts again.")));
	if (!noted)
		return;
	finishing_xid = xid;

	/*
	 * Marked while it was still prepared: from now on no other backend
	 * finishes its commit.  One finished meanwhile by something that does
	 * not come here (its rows may be counted already) is left alone.
	 */
	if (!TransactionIdIsInProgress(xid))
	{
		fs_prepared_finish_abandon();
		return;
	}

	for (uint32 kind = 0; kind < FS_PARKED_KINDS; kind++)
	{
		int			m = 0;

		if (befores[kind] == NULL)
			continue;
		for (i = 0; i < n; i++)
			if (effects[i].kind == kind)
				of_kind[m++] = effects[i];
		if (m == 0)
			continue;
		finishing_kinds |= 1U << kind;
		befores[kind] (of_kind, m);
	}
	pfree(effects);
	pfree(of_kind);
}

/*
 * After COMMIT PREPARED returned: finish the framed transaction's effects
 * first, inside the frame (it committed), then run the kinds' `after`
 * functions.  Returns the note's kinds of change, to publish.
 */
static uint32
fs_prepared_finish_end(void)
{
	uint32		kinds = finishing_kinds;
	uint32		published = 0;

	if (!TransactionIdIsInProgress(finishing_xid) && TransactionIdDidCommit(finishing_xid))
		published = fs_prepared_end(finishing_xid, true);
	fs_prepared_finish_abandon();	/* a mark left (it did not commit) goes */
	for (uint32 kind = 0; kind < FS_PARKED_KINDS; kind++)
		if ((kinds & (1U << kind)) && afters[kind] != NULL)
			afters[kind] ();
	return published;
}

/*
 * The statement that framed a COMMIT PREPARED ended without finishing it
 * (it failed): its note is anyone's to settle again (each layer undoes its
 * own `before` at the abort).
 */
static void
fs_prepared_finish_abandon(void)
{
	if (fs_prepared != NULL)
	{
		SpinLockAcquire(&fs_prepared->mutex);
		for (int i = 0; i < fs_prepared->count; i++)
			if (notes[i].xid == finishing_xid && notes[i].finisher_pid == MyProcPid)
				notes[i].finisher_pid = 0;
		SpinLockRelease(&fs_prepared->mutex);
	}
	finishing_xid = InvalidTransactionId;
	finishing_kinds = 0;
}

/*
 * Whether the prepared transaction `gid` has an xid below `boundary` (so it
 * may have no note), and whether no other prepared transaction does.
 * Asked before COMMIT or ROLLBACK PREPARED, while such transactions may
 * exist.
 */
static bool
fs_prepared_is_older(const char *gid, FullTransactionId boundary, bool *last_older)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	bool		older = false;
	int			others = 0;
	uint64		i;

	values[0] = CStringGetTextDatum(gid);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute_with_args("SELECT gid OPERATOR(pg_catalog.=) $1, transaction"
							  "  FROM pg_catalog.pg_prepared_xacts",
							  1, argtypes, values, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read pg_prepared_xacts");
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		bool		this_one = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i],
														  SPI_tuptable->tupdesc, 1, &isnull));
		TransactionId xid = DatumGetTransactionId(SPI_getbinval(SPI_tuptable->vals[i],
																SPI_tuptable->tupdesc, 2, &isnull));
		bool		below = TransactionIdPrecedes(xid, XidFromFullTransactionId(boundary));

		if (this_one)
			older = below;
		else if (below)
			others++;
	}
	SPI_finish();
	*last_older = others == 0;
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
	FullTransactionId boundary = InvalidFullTransactionId;
	bool		older = false;
	bool		last_older = false;
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

		boundary = fs_prepared_boundary(false);

		SpinLockAcquire(&fs_prepared->mutex);
		may_be_older = fs_prepared->older_may_exist;
		SpinLockRelease(&fs_prepared->mutex);
		if (may_be_older && FullTransactionIdIsValid(boundary))
			older = fs_prepared_is_older(stmt->gid, boundary, &last_older);
	}

	if (stmt != NULL && fs_prepared != NULL && stmt->kind == TRANS_STMT_COMMIT_PREPARED &&
		context == PROCESS_UTILITY_TOPLEVEL && !IsTransactionBlock())
		fs_prepared_finish_begin(stmt->gid);

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);

	if (stmt == NULL || fs_prepared == NULL)
		return;
	kinds = TransactionIdIsValid(finishing_xid) ? fs_prepared_finish_end() : 0;
	kinds |= fs_prepared_settle();
	if (stmt->kind == TRANS_STMT_COMMIT_PREPARED && older)
		kinds = (1U << FS_PREPARED_NKINDS) - 1;
	if (last_older)
	{
		/* Unless an overflow raised the boundary meanwhile. */
		SpinLockAcquire(&fs_prepared->mutex);
		if (FullTransactionIdEquals(fs_prepared->boundary, boundary))
			fs_prepared->older_may_exist = false;
		SpinLockRelease(&fs_prepared->mutex);
	}
	fs_prepared_publish(kinds);
}

/* Install the ProcessUtility hook and the preparing backend's callback (at _PG_init). */
void
fs_prepared_init(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = fs_prepared_process_utility;
	RegisterXactCallback(fs_prepared_xact_callback, NULL);
}

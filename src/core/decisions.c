/*-------------------------------------------------------------------------
 *
 * decisions.c
 *	  The log of recent decisions (the fs_decisions view).
 *
 * The decision log keeps the last fairshare.decision_log_size decisions of
 * each backend slot in a ring of its own: its one writer never waits for
 * anyone and never makes anyone wait.  Each record carries a sequence number
 * that is odd while it is being written; a reader copies a record and keeps
 * it only if the number was even and unchanged around the copy.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "funcapi.h"
#include "miscadmin.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "core/decisions.h"
#include "core/shmem.h"

PG_FUNCTION_INFO_V1(fs_decision_state);

/* ----------------------------------------------------------------
 * The decision log
 * ----------------------------------------------------------------
 */

int			fs_decision_log_size = 64;

typedef struct FsDecisionRecord
{
	pg_atomic_uint32 seq;		/* odd while being written */
	int32		pid;
	uint64		number;			/* the backend slot's decision number */
	TimestampTz at;
	uint32		queue_id;
	uint8		kind;
	uint8		reason;
	int32		requested;
	int32		runs_possible;
	int32		granted;
	float8		tokens_before;
	float8		tokens_consumed;
	float8		balance_after;
	char		tenant[FS_NAME_BUFLEN];
} FsDecisionRecord;

typedef struct FsDecisionRing
{
	uint64		next;			/* written by the owner only */
	FsDecisionRecord records[FLEXIBLE_ARRAY_MEMBER];
} FsDecisionRing;

static char *fs_decision_rings = NULL;
static int	fs_decision_ring_count = 0;

/* Size of one backend's ring of decisions. */
static inline Size
fs_decision_ring_bytes(void)
{
	return MAXALIGN(add_size(offsetof(FsDecisionRing, records),
							 mul_size(sizeof(FsDecisionRecord), fs_decision_log_size)));
}

/* The decision log's setting (fairshare.decision_log_size). */
void
fs_decisions_init(void)
{
	DefineCustomIntVariable("fairshare.decision_log_size",
							"Recent decisions kept per backend for the fs_decisions view (0 keeps none).",
							NULL,
							&fs_decision_log_size,
							64, 0, 100000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
}

/* Shared memory of the decision log: one ring per backend slot. */
static Size
fs_decisions_shmem_size(void)
{
	if (fs_decision_log_size == 0)
		return 0;
	return mul_size(fs_decision_ring_bytes(), MaxBackends);
}

/* Ask for this layer's shared memory (shmem request hook, module.c). */
void
fs_decisions_shmem_request(void)
{
	RequestAddinShmemSpace(fs_decisions_shmem_size());
}

/*
 * Create (or attach to) the decision rings, one per backend slot; nothing
 * when fairshare.decision_log_size is 0. Caller holds AddinShmemInitLock.
 */
void
fs_decisions_shmem_init(void)
{
	bool		found;
	int			i;
	int			j;

	fs_decision_ring_count = fs_decision_log_size > 0 ? MaxBackends : 0;
	if (fs_decision_ring_count == 0)
		return;
	fs_decision_rings = ShmemInitStruct("fairshare decisions",
										fs_decisions_shmem_size(), &found);
	if (found)
		return;
	for (i = 0; i < fs_decision_ring_count; i++)
	{
		FsDecisionRing *ring = (FsDecisionRing *) (fs_decision_rings + i * fs_decision_ring_bytes());

		ring->next = 0;
		for (j = 0; j < fs_decision_log_size; j++)
		{
			pg_atomic_init_u32(&ring->records[j].seq, 0);
			ring->records[j].at = 0;
		}
	}
}

/* Start a decision record: nothing granted, nothing possible, no tokens. */
void
fs_decision_init(FsDecision *d, FsDecisionKind kind, const char *tenant, TimestampTz now)
{
	memset(d, 0, sizeof(*d));
	d->kind = kind;
	d->tenant = tenant;
	d->queue_id = PG_UINT32_MAX;
	d->runs_possible = -1;
	d->tokens_before = d->tokens_consumed = d->balance_after = NAN;
	d->at = now;
}

/*
 * End a decision made without state (no room for the tenant or its lease,
 * or its limits unreadable): `granted` is admitted anyway, with reason
 * fail_open, logged and counted for the whole server.  `queue` is NULL
 * when there was no room for the queue either.
 */
void
fs_decision_fail_open(FsDecision *d, const FsQueue *queue, int32 granted)
{
	FS_COUNT_GLOBAL(fail_open);
	if (queue != NULL)
		d->queue_id = queue->queue_id;
	d->reason = FS_REASON_FAIL_OPEN;
	d->granted = granted;
	fs_decision_log(d);
}

/*
 * Log a decision in this backend's ring.  No lock: each ring has one writer
 * (the backend in that slot), and readers check the record's sequence.
 */
void
fs_decision_log(const FsDecision *d)
{
	FsDecisionRing *ring;
	FsDecisionRecord *rec;
	int			slot = (int) FS_MY_PROC_NUMBER - FS_FIRST_PROC_NUMBER;
	uint32		seq;

	if (fs_decision_ring_count == 0 || slot < 0 || slot >= fs_decision_ring_count)
		return;
	ring = (FsDecisionRing *) (fs_decision_rings + slot * fs_decision_ring_bytes());
	rec = &ring->records[ring->next % fs_decision_log_size];

	seq = pg_atomic_read_u32(&rec->seq);
	pg_atomic_write_u32(&rec->seq, seq + 1);
	pg_write_barrier();
	rec->pid = MyProcPid;
	rec->number = ring->next;
	rec->at = d->at;
	rec->queue_id = d->queue_id;
	rec->kind = (uint8) d->kind;
	rec->reason = (uint8) d->reason;
	rec->requested = d->requested;
	rec->runs_possible = d->runs_possible;
	rec->granted = d->granted;
	rec->tokens_before = d->tokens_before;
	rec->tokens_consumed = d->tokens_consumed;
	rec->balance_after = d->balance_after;
	strlcpy(rec->tenant, d->tenant, FS_NAME_BUFLEN);
	pg_write_barrier();
	pg_atomic_write_u32(&rec->seq, seq + 2);
	ring->next++;
}

/* The fs_decisions.kind of a record. */
static const char *
fs_decision_kind_name(uint8 kind)
{
	switch ((FsDecisionKind) kind)
	{
		case FS_DECISION_SLOT:
			return "slot";
		case FS_DECISION_SPEND:
			return "spend";
		case FS_DECISION_CHARGE:
			return "charge";
		case FS_DECISION_CLAIM:
			return "claim";
	}
	return "unknown";
}

/* A float8 column of a view row, NULL when NaN (does not apply). */
static void
fs_put_float_or_null(Datum *values, bool *nulls, int i, float8 v)
{
	if (isnan(v))
		nulls[i] = true;
	else
		values[i] = Float8GetDatum(v);
}

/* fs_decision_state(): recent decisions of this database's queues. */
Datum
fs_decision_state(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo;
	FsQueueNames queues;
	int			i;
	int			j;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	fs_queue_names(&queues);

	for (i = 0; i < fs_decision_ring_count; i++)
	{
		FsDecisionRing *ring = (FsDecisionRing *) (fs_decision_rings + i * fs_decision_ring_bytes());

		for (j = 0; j < fs_decision_log_size; j++)
		{
			FsDecisionRecord *rec = &ring->records[j];
			FsDecisionRecord copy;
			uint32		before;
			const char *queue;
			Datum		values[13];
			bool		nulls[13];

			before = pg_atomic_read_u32(&rec->seq);
			if (before == 0 || (before & 1))
				continue;		/* never written, or being written */
			pg_read_barrier();
			memcpy(&copy, rec, sizeof(copy));
			pg_read_barrier();
			if (pg_atomic_read_u32(&rec->seq) != before)
				continue;		/* overwritten while we copied */
			copy.tenant[FS_NAME_MAXLEN] = '\0';
			queue = fs_queue_name_of(&queues, copy.queue_id);
			if (queue == NULL)
				continue;

			memset(nulls, 0, sizeof(nulls));
			values[0] = TimestampTzGetDatum(copy.at);
			values[1] = Int32GetDatum(copy.pid);
			values[2] = CStringGetTextDatum(fs_decision_kind_name(copy.kind));
			values[3] = CStringGetTextDatum(queue);
			values[4] = CStringGetTextDatum(copy.tenant);
			values[5] = Int32GetDatum(copy.requested);
			if (copy.runs_possible < 0)
				nulls[6] = true;
			else
				values[6] = Int32GetDatum(copy.runs_possible);
			values[7] = Int32GetDatum(copy.granted);
			fs_put_float_or_null(values, nulls, 8, copy.tokens_before);
			fs_put_float_or_null(values, nulls, 9, copy.tokens_consumed);
			fs_put_float_or_null(values, nulls, 10, copy.balance_after);
			values[11] = CStringGetTextDatum(copy.reason < FS_NUM_REASONS ?
											 fs_reason_names[copy.reason] : "unknown");
			values[12] = Int64GetDatum((int64) copy.number);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	return (Datum) 0;
}

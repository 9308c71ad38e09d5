/*-------------------------------------------------------------------------
 *
 * saved.c
 *	  Fair dequeue's sections of the state file: each queue's virtual time
 *	  and average costs, and the claim map (written field by field, see
 *	  core/stateformat.h).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "budget/budget.h"
#include "core/stateformat.h"
#include "core/subxact.h"
#include "fairq/fairqueue_int.h"
#include "gate/gate.h"
#include "limits/limits.h"
#include "slots/slots.h"


/* ----------------------------------------------------------------
 * The state file
 * ----------------------------------------------------------------
 */

/* The fields of a queue's item in the state file (ids are never reused). */
enum
{
	FS_FAIRQ_QUEUE = 1,			/* uint32: the queue's index in the file */
	FS_FAIRQ_VTIME = 2,			/* float8 */
	FS_FAIRQ_AVG_COST = 3,		/* float8 */
	FS_FAIRQ_AVG_RUNTIME_MS = 4,	/* float8 */
	FS_FAIRQ_MAX_FINISH = 5,	/* float8 */
	FS_FAIRQ_ROWS_WITHOUT_TENANT = 6,	/* int64 */
	FS_FAIRQ_UNTRACKED_ROWS = 7 /* int64 */
};

/*
 * Write fair dequeue's sections of the state file: each queue's virtual time
 * and average costs (clean shutdowns only) and the claim map (every save).
 */
void
fs_fairqueue_save_state(StringInfo buf, uint32 nqueues, bool clean)
{
	Size		at;
	uint32		i;
	uint64		count;

	if (fs_fair == NULL)
		return;
	if (clean)
	{
		at = fs_state_section_begin(buf, FS_SECTION_FAIRQ_QUEUES, 0);
		for (i = 0; i < nqueues; i++)
		{
			FsFairQueue *fq = &fs_fair->queues[i];
			float8		vtime;
			float8		avg_cost;
			float8		avg_runtime_ms;
			Size		item;

			LWLockAcquire(fq->lock, LW_SHARED);
			vtime = fq->vtime;
			avg_cost = fq->avg_cost;
			avg_runtime_ms = fq->avg_runtime_ms;
			LWLockRelease(fq->lock);
			item = fs_state_item_begin(buf);
			fs_state_put_value(buf, FS_FAIRQ_QUEUE, i);
			fs_state_put_value(buf, FS_FAIRQ_VTIME, vtime);
			fs_state_put_value(buf, FS_FAIRQ_AVG_COST, avg_cost);
			fs_state_put_value(buf, FS_FAIRQ_AVG_RUNTIME_MS, avg_runtime_ms);
			fs_state_item_end(buf, item);
		}
		fs_state_section_end(buf, at, nqueues);
	}

	at = fs_state_section_begin(buf, FS_SECTION_FAIRQ_CLAIMS, 0);
	count = fs_claim_map_save(buf, nqueues);
	fs_state_section_end(buf, at, count);
}

/*
 * Restore one of fair dequeue's sections (`count` field-by-field items in
 * `bytes`), in the postmaster: the queues' state only from a clean
 * shutdown's file, the claim map from any.
 */
void
fs_fairqueue_restore_section(uint32 tag, const char *data, Size bytes, uint64 count,
							 FsQueue **queues, uint64 nqueues, bool clean, int64 next_lease_id)
{
	uint64		i;
	Size		pos = 0;

	if (fs_fair == NULL)
		return;
	if (tag == FS_SECTION_FAIRQ_QUEUES && clean)
	{
		for (i = 0; i < count; i++)
		{
			FsStateItem item;
			uint32		queue_index = PG_UINT32_MAX;
			float8		vtime = NAN;
			float8		avg_cost = 1.0;
			float8		avg_runtime_ms = 1.0;
			uint8		field;
			uint8		len;
			const char *value;
			FsFairQueue *fq;

			if (!fs_state_item_next(data, bytes, &pos, &item))
				break;
			while (fs_state_field_next(&item, &field, &value, &len))
			{
				if (field == FS_FAIRQ_QUEUE)
					fs_state_field_value(value, len, queue_index);
				else if (field == FS_FAIRQ_VTIME)
					fs_state_field_value(value, len, vtime);
				else if (field == FS_FAIRQ_AVG_COST)
					fs_state_field_value(value, len, avg_cost);
				else if (field == FS_FAIRQ_AVG_RUNTIME_MS)
					fs_state_field_value(value, len, avg_runtime_ms);
			}
			if (queue_index >= nqueues || queues[queue_index] == NULL ||
				isnan(vtime) || isinf(vtime))
				continue;
			fq = &fs_fair->queues[queues[queue_index]->queue_id];
			fs_fair_set_vtime(fq, Max(vtime, 0.0));
			fs_fair_set_averages(fq, fs_fair_clamp_cost(avg_cost, false),
								 fs_fair_clamp_cost(avg_runtime_ms, false));
		}
	}
	else if (tag == FS_SECTION_FAIRQ_CLAIMS)
		fs_claim_map_restore(data, bytes, count, queues, nqueues, next_lease_id);
}

/* ----------------------------------------------------------------
 * Replication through WAL
 * ----------------------------------------------------------------
 */

/*
 * The fair-order state of queue `queue_id`, if it changed since version
 * *seen (which moves on to the version copied).
 */
bool
fs_fair_wal_changed(uint32 queue_id, uint64 *seen, FsFairWalState *state)
{
	FsFairQueue *fq;
	bool		changed;

	if (fs_fair == NULL || queue_id >= (uint32) fs_max_queues)
		return false;
	fq = &fs_fair->queues[queue_id];
	LWLockAcquire(fq->lock, LW_SHARED);
	changed = fq->wal_version != *seen;
	if (changed)
	{
		*seen = fq->wal_version;
		state->vtime = fq->vtime;
		state->max_finish = fq->max_finish;
		state->avg_cost = fq->avg_cost;
		state->avg_runtime_ms = fq->avg_runtime_ms;
		state->rows_without_tenant = fq->rows_without_tenant;
		state->untracked_rows = fq->untracked_rows;
	}
	LWLockRelease(fq->lock);
	return changed;
}

/* A queue's fair-order state as an item (the queue by its index in the record). */
void
fs_fair_wal_write(StringInfo buf, uint32 queue_index, const FsFairWalState *state)
{
	Size		item = fs_state_item_begin(buf);

	fs_state_put_value(buf, FS_FAIRQ_QUEUE, queue_index);
	fs_state_put_value(buf, FS_FAIRQ_VTIME, state->vtime);
	fs_state_put_value(buf, FS_FAIRQ_MAX_FINISH, state->max_finish);
	fs_state_put_value(buf, FS_FAIRQ_AVG_COST, state->avg_cost);
	fs_state_put_value(buf, FS_FAIRQ_AVG_RUNTIME_MS, state->avg_runtime_ms);
	fs_state_put_value(buf, FS_FAIRQ_ROWS_WITHOUT_TENANT, state->rows_without_tenant);
	fs_state_put_value(buf, FS_FAIRQ_UNTRACKED_ROWS, state->untracked_rows);
	fs_state_item_end(buf, item);
}

/*
 * A queue's fair-order state from an item, kept in range; false without a
 * queue or with a virtual time that is no number.
 */
bool
fs_fair_wal_read(FsStateItem *item, uint32 *queue_index, FsFairWalState *state)
{
	uint8		field;
	uint8		len;
	const char *value;

	*queue_index = PG_UINT32_MAX;
	memset(state, 0, sizeof(*state));
	state->vtime = NAN;
	state->avg_cost = 1.0;
	state->avg_runtime_ms = 1.0;
	while (fs_state_field_next(item, &field, &value, &len))
	{
		if (field == FS_FAIRQ_QUEUE)
			fs_state_field_value(value, len, *queue_index);
		else if (field == FS_FAIRQ_VTIME)
			fs_state_field_value(value, len, state->vtime);
		else if (field == FS_FAIRQ_MAX_FINISH)
			fs_state_field_value(value, len, state->max_finish);
		else if (field == FS_FAIRQ_AVG_COST)
			fs_state_field_value(value, len, state->avg_cost);
		else if (field == FS_FAIRQ_AVG_RUNTIME_MS)
			fs_state_field_value(value, len, state->avg_runtime_ms);
		else if (field == FS_FAIRQ_ROWS_WITHOUT_TENANT)
			fs_state_field_value(value, len, state->rows_without_tenant);
		else if (field == FS_FAIRQ_UNTRACKED_ROWS)
			fs_state_field_value(value, len, state->untracked_rows);
	}
	if (*queue_index == PG_UINT32_MAX || isnan(state->vtime) || isinf(state->vtime))
		return false;
	state->vtime = Max(state->vtime, 0.0);
	if (isnan(state->max_finish) || isinf(state->max_finish))
		state->max_finish = state->vtime;
	state->avg_cost = fs_fair_clamp_cost(state->avg_cost, false);
	state->avg_runtime_ms = fs_fair_clamp_cost(state->avg_runtime_ms, false);
	state->rows_without_tenant = Max(state->rows_without_tenant, 0);
	state->untracked_rows = Max(state->untracked_rows, 0);
	return true;
}

/* Replay: give `queue` the fair-order state the primary logged. */
void
fs_fair_wal_apply(FsQueue *queue, const FsFairWalState *state)
{
	FsFairQueue *fq = fs_fair_queue(queue);

	LWLockAcquire(fq->lock, LW_EXCLUSIVE);
	fs_fair_set_tags(fq, state->vtime, state->max_finish);
	fs_fair_set_averages(fq, state->avg_cost, state->avg_runtime_ms);
	fs_fair_set_outside(fq, state->rows_without_tenant, state->untracked_rows);
	LWLockRelease(fq->lock);
}

/*
 * The end of recovery: every queue is counted again from its table at its
 * next use (the backlog logged lags the table's commits by up to an
 * interval), as after a restart.
 */
void
fs_fair_unsync_all(void)
{
	int			i;

	if (fs_fair == NULL)
		return;
	for (i = 0; i < fs_max_queues; i++)
	{
		FsFairQueue *fq = &fs_fair->queues[i];

		LWLockAcquire(fq->lock, LW_EXCLUSIVE);
		fq->synced = false;
		LWLockRelease(fq->lock);
	}
}

/*-------------------------------------------------------------------------
 *
 * gate.c
 *	  The global gate: how many slots a tenant may hold right now.
 *
 * Workers report heartbeats (fs_worker_heartbeat): a queue's live threads
 * are the threads of its workers whose last heartbeat is younger than
 * fairshare.worker_ttl.  With no live worker the gate is off and a tenant's
 * ceiling is its max_slots.  Otherwise:
 *
 *	 ceiling = min(max_slots, max(min_slots, ceil(live_threads x share x
 *				   dampener x throttle), 1))
 *
 * where share is fairshare.tenant_share, throttle is the tenant's
 * throttle_pct / 100, and the dampener lowers the share smoothly (a cosine
 * ease) to fairshare.dampen_floor at the top of every hour (UTC) and back,
 * within fairshare.dampen_window: scheduled work piles up at :00, and no
 * tenant should take the workers then.
 *
 * Backpressure (fs_spend_tokens): a queue whose reported latency is over
 * fairshare.backpressure_latency, or whose live threads all hold slots,
 * admits nothing new.  Starting work already admitted is not blocked.
 *
 * Heartbeats are rare next to decisions: they take the heartbeat lock
 * exclusively and recompute their queue's live threads.  A decision reads
 * the queue's cached figures under its spinlock, and recomputes them (the
 * heartbeat lock shared) only when a counted heartbeat may have gone stale.
 *
 * The gate's shared state changes in three functions only (shmem.c, rule
 * 9): fs_worker_heartbeat() enters, updates and removes a worker's
 * heartbeat (heartbeat lock EXCLUSIVE); fs_gate_recount() drops stale ones
 * and sets the queue's live figures (under its spinlock);
 * fs_gate_set_latency() sets the queue's latency (reported with
 * fs_report_latency(), or sampled by a fair claim).  On a standby, the
 * replay of the primary's heartbeat table (fs_gate_replay_*()) is the one
 * writer.
 *
 * Replication through WAL: each change of the table bumps its version; the
 * WAL writer logs the whole table when the version moved (at most once a
 * second: a heartbeat counts for fairshare.worker_ttl, and a second late
 * changes nothing), and a standby replaces its table with it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"

#include "core/cluster.h"
#include "core/stateformat.h"
#include "gate/gate.h"

PG_FUNCTION_INFO_V1(fs_worker_heartbeat);
PG_FUNCTION_INFO_V1(fs_worker_heartbeat_at);
PG_FUNCTION_INFO_V1(fs_report_latency_at);
PG_FUNCTION_INFO_V1(fs_report_latency);
PG_FUNCTION_INFO_V1(fs_worker_state);
PG_FUNCTION_INFO_V1(fs_queue_state);

int			fs_worker_ttl_s = 30;
double		fs_tenant_share = 0.25;
int			fs_dampen_window_min = 10;
double		fs_dampen_floor = 0.15;
int			fs_backpressure_latency_ms = 5000;
int			fs_max_workers = 1024;

/* The most threads one worker may report. */
#define FS_MAX_WORKER_THREADS	100000

/*
 * Products of floats land a hair above whole numbers (10 x 0.3 =
 * 3.0000000000000004): round up only what is really above.
 */
#define FS_CEIL(x)	((int64) ceil((x) - 1e-9))

typedef struct FsHeartbeatKey
{
	uint32		queue_id;
	char		worker[FS_NAME_BUFLEN];
} FsHeartbeatKey;

typedef struct FsHeartbeat
{
	FsHeartbeatKey key;			/* hash key: must be first */
	int32		threads;
	TimestampTz last_heartbeat;
} FsHeartbeat;

/* The heartbeat table's lock (core/shmem.c, rule 5a). */
static LWLock *fs_heartbeats_lock = NULL;
static HTAB *fs_heartbeat_hash = NULL;
/* Bumped by every change of the table (under its lock EXCLUSIVE). */
static pg_atomic_uint64 *fs_heartbeats_version = NULL;

static void fs_heartbeat_record(FunctionCallInfo fcinfo, int arg);
static void fs_latency_record(FunctionCallInfo fcinfo, int arg);

/*
 * The global gate's settings: how long a heartbeat counts, the share of live
 * threads one tenant may hold, the dampener, backpressure.
 */
void
fs_gate_init(void)
{
	DefineCustomIntVariable("fairshare.worker_ttl",
							"How long a worker counts as live after its last heartbeat.",
							NULL,
							&fs_worker_ttl_s,
							30, 1, 86400,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);
	DefineCustomRealVariable("fairshare.tenant_share",
							 "Share of a queue's live worker threads one tenant may hold.",
							 "The global gate's ceiling before the dampener and the tenant's throttle.",
							 &fs_tenant_share,
							 0.25, 0.0001, 1.0,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);
	DefineCustomIntVariable("fairshare.dampen_window",
							"How close to the top of the hour the dampener acts (0 disables it).",
							"Within this many minutes before and after :00 UTC, the tenant share eases down to fairshare.dampen_floor of itself.",
							&fs_dampen_window_min,
							10, 0, 30,
							PGC_SUSET, GUC_UNIT_MIN,
							NULL, NULL, NULL);
	DefineCustomRealVariable("fairshare.dampen_floor",
							 "The fraction of the tenant share left at the top of the hour.",
							 NULL,
							 &fs_dampen_floor,
							 0.15, 0.0, 1.0,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);
	DefineCustomIntVariable("fairshare.backpressure_latency",
							"Queue latency above which admission grants nothing (0 disables).",
							"fs_spend_tokens grants 0 runs with reason backpressure while a queue's reported latency is higher.",
							&fs_backpressure_latency_ms,
							5000, 0, 86400000,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("fairshare.max_workers",
							"Maximum number of (queue, worker) heartbeats kept in shared memory.",
							NULL,
							&fs_max_workers,
							1024, 32, 1000000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
}

/* Shared memory of the worker heartbeats table. */
static Size
fs_gate_shmem_size(void)
{
	return add_size(hash_estimate_size(fs_max_workers, sizeof(FsHeartbeat)),
					sizeof(pg_atomic_uint64));
}

/* Ask for this layer's shared memory and locks (shmem request hook, module.c). */
void
fs_gate_shmem_request(void)
{
	RequestAddinShmemSpace(fs_gate_shmem_size());
	RequestNamedLWLockTranche("fairshare heartbeats", 1);
}

/*
 * Create (or attach to) the heartbeat table and name its lock. Caller holds
 * AddinShmemInitLock.
 */
void
fs_gate_shmem_init(void)
{
	HASHCTL		info;
	LWLockPadded *locks = GetNamedLWLockTranche("fairshare heartbeats");
	bool		found;

	fs_heartbeats_lock = &locks[0].lock;
	fs_lockstats_name_locks("heartbeats", locks, 1);
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(FsHeartbeatKey);
	info.entrysize = sizeof(FsHeartbeat);
	fs_heartbeat_hash = ShmemInitHash("fairshare workers",
								   fs_max_workers, fs_max_workers,
								   &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	fs_heartbeats_version = ShmemInitStruct("fairshare heartbeat changes",
											sizeof(pg_atomic_uint64), &found);
	if (!found)
		pg_atomic_init_u64(fs_heartbeats_version, 0);
}

/* Set up the gate's part of a new queue entry (queues_lock held). */
void
fs_gate_queue_init(FsQueue *queue)
{
	queue->live_threads = 0;
	queue->live_workers = 0;
	queue->live_until = DT_NOEND;
	queue->latency_ms = 0;
	queue->latency_at = DT_NOBEGIN;
}

/* Is a worker's last heartbeat younger than fairshare.worker_ttl? */
static inline bool
fs_heartbeat_is_live(const FsHeartbeat *worker, TimestampTz now)
{
	return now - worker->last_heartbeat < (int64) fs_worker_ttl_s * USECS_PER_SEC;
}

/*
 * Recount a queue's live workers and threads.  Caller holds the heartbeat
 * lock (shared is enough; with exclusive, stale heartbeats are dropped too).
 */
static void
fs_gate_recount(FsQueue *queue, TimestampTz now, bool drop_stale)
{
	HASH_SEQ_STATUS seq;
	FsHeartbeat   *worker;
	int64		threads = 0;
	int32		workers = 0;
	TimestampTz until = DT_NOEND;

	hash_seq_init(&seq, fs_heartbeat_hash);
	while ((worker = hash_seq_search(&seq)) != NULL)
	{
		if (worker->key.queue_id != queue->queue_id)
			continue;
		if (fs_heartbeat_is_live(worker, now))
		{
			TimestampTz expires = worker->last_heartbeat +
				(int64) fs_worker_ttl_s * USECS_PER_SEC;

			threads += worker->threads;
			workers++;
			if (expires < until)
				until = expires;
		}
		else if (drop_stale)
			hash_search(fs_heartbeat_hash, &worker->key, HASH_REMOVE, NULL);
	}

	SpinLockAcquire(&queue->mutex);
	queue->live_threads = (int32) Min(threads, PG_INT32_MAX);
	queue->live_workers = workers;
	queue->live_until = until;
	SpinLockRelease(&queue->mutex);
}

/* The dampener's factor at `now`: 1 away from :00, down to the floor at :00. */
float8
fs_gate_dampener(TimestampTz now)
{
	int64		window = (int64) fs_dampen_window_min * USECS_PER_MINUTE;
	int64		into_hour;
	int64		distance;
	float8		x;

	if (window <= 0)
		return 1.0;
	/* TimestampTz counts from 2000-01-01 00:00 UTC, a top of the hour. */
	into_hour = now % USECS_PER_HOUR;
	if (into_hour < 0)
		into_hour += USECS_PER_HOUR;
	distance = Min(into_hour, USECS_PER_HOUR - into_hour);
	if (distance >= window)
		return 1.0;
	x = (float8) distance / (float8) window;
	return fs_dampen_floor + (1.0 - fs_dampen_floor) * (1.0 - cos(M_PI * x)) / 2.0;
}

/*
 * What the gate allows in `queue` at `now`.  Takes the heartbeat lock (shared)
 * only when a live worker's heartbeat may have gone stale since the last
 * count; call it before opening a tenant entry.
 */
void
fs_gate_capacity(FsQueue *queue, TimestampTz now, FsGateCapacity *cap)
{
	int32		live_threads;
	TimestampTz live_until;

	SpinLockAcquire(&queue->mutex);
	live_threads = queue->live_threads;
	live_until = queue->live_until;
	SpinLockRelease(&queue->mutex);

	if (live_threads > 0 && now >= live_until)
	{
		LWLockAcquire(fs_heartbeats_lock, LW_SHARED);
		fs_gate_recount(queue, now, false);
		LWLockRelease(fs_heartbeats_lock);
		SpinLockAcquire(&queue->mutex);
		live_threads = queue->live_threads;
		SpinLockRelease(&queue->mutex);
	}

	cap->live_threads = live_threads;
	cap->active = live_threads > 0;
	cap->dampener = fs_gate_dampener(now);
	cap->share_threads = (float8) live_threads * fs_tenant_share * cap->dampener;
}

/*
 * The ceiling of a tenant with these limits, and the reason to give when it
 * holds that many slots already: tenant_limit when max_slots is what binds,
 * throttled when its throttle_pct took it below its share, global_gate
 * otherwise.
 */
int32
fs_gate_ceiling(const FsGateCapacity *cap, const FsLimits *limits, FsReason *deny_reason)
{
	int64		share;
	int64		throttled;

	if (!cap->active)
	{
		*deny_reason = FS_REASON_TENANT_LIMIT;
		return limits->max_slots;
	}

	share = Max(Max(FS_CEIL(cap->share_threads), limits->min_slots), 1);
	throttled = Max(Max(FS_CEIL(cap->share_threads * limits->throttle), limits->min_slots), 1);

	if (throttled >= limits->max_slots)
	{
		*deny_reason = FS_REASON_TENANT_LIMIT;
		return limits->max_slots;
	}
	*deny_reason = throttled < share ? FS_REASON_THROTTLED : FS_REASON_GLOBAL_GATE;
	return (int32) throttled;
}

/* Is admission into `queue` held back at `now`, and why? */
FsBackpressure
fs_gate_backpressure(FsQueue *queue, const FsGateCapacity *cap, TimestampTz now)
{
	float8		latency_ms;
	TimestampTz latency_at;

	SpinLockAcquire(&queue->mutex);
	latency_ms = queue->latency_ms;
	latency_at = queue->latency_at;
	SpinLockRelease(&queue->mutex);

	/* A latency report holds for as long as a heartbeat does. */
	if (fs_backpressure_latency_ms > 0 &&
		latency_ms > fs_backpressure_latency_ms &&
		now - latency_at < (int64) fs_worker_ttl_s * USECS_PER_SEC)
		return FS_BP_LATENCY;
	if (cap->active &&
		(int64) pg_atomic_read_u32(&queue->slots_in_use) >= cap->live_threads)
		return FS_BP_NO_FREE_THREAD;
	return FS_BP_NONE;
}

/* Set a queue's reported latency (fs_report_latency()). */
void
fs_gate_set_latency(FsQueue *queue, float8 latency_ms, TimestampTz now)
{
	SpinLockAcquire(&queue->mutex);
	queue->latency_ms = latency_ms;
	queue->latency_at = now;
	SpinLockRelease(&queue->mutex);
}

/* ----------------------------------------------------------------
 * Replication through WAL (statefile/wal_writer.c and wal_redo.c)
 * ----------------------------------------------------------------
 */

/* The fields of a heartbeat's item (core/stateformat.h; ids never reused). */
enum
{
	FS_HEARTBEAT_QUEUE = 1,		/* uint32: the queue's index in the record */
	FS_HEARTBEAT_WORKER = 2,	/* name */
	FS_HEARTBEAT_THREADS = 3,	/* int32 */
	FS_HEARTBEAT_AT = 4			/* TimestampTz: the last heartbeat */
};

/* The WAL writer's copy of the table (its own memory, made at first use). */
static FsHeartbeat *wal_copies = NULL;

/*
 * If the heartbeat table changed since version *seen, write an item of each
 * of its heartbeats to `buf` (the table is copied out under its lock,
 * shared, then written), set *seen to the version written, and return
 * true: the items are the whole table, which a standby takes in place of
 * its own.  `queue_named[queue_id]` is set for each item's queue.
 */
bool
fs_gate_wal_write(StringInfo buf, uint64 *seen, uint64 *count, bool *queue_named)
{
	HASH_SEQ_STATUS seq;
	FsHeartbeat *worker;
	uint64		version;
	int			n = 0;
	int			i;

	if (pg_atomic_read_u64(fs_heartbeats_version) == *seen)
		return false;
	if (wal_copies == NULL)
		wal_copies = MemoryContextAllocExtended(TopMemoryContext,
												sizeof(FsHeartbeat) * Max(fs_max_workers, 1),
												MCXT_ALLOC_HUGE);
	LWLockAcquire(fs_heartbeats_lock, LW_SHARED);
	version = pg_atomic_read_u64(fs_heartbeats_version);
	hash_seq_init(&seq, fs_heartbeat_hash);
	while ((worker = hash_seq_search(&seq)) != NULL)
	{
		if (n < fs_max_workers)
			wal_copies[n++] = *worker;
	}
	LWLockRelease(fs_heartbeats_lock);
	*seen = version;

	for (i = 0; i < n; i++)
	{
		Size		at = fs_state_item_begin(buf);

		fs_state_put_value(buf, FS_HEARTBEAT_QUEUE, wal_copies[i].key.queue_id);
		fs_state_put_name(buf, FS_HEARTBEAT_WORKER, wal_copies[i].key.worker);
		fs_state_put_value(buf, FS_HEARTBEAT_THREADS, wal_copies[i].threads);
		fs_state_put_value(buf, FS_HEARTBEAT_AT, wal_copies[i].last_heartbeat);
		fs_state_item_end(buf, at);
		(*count)++;
		if (wal_copies[i].key.queue_id < (uint32) fs_max_queues)
			queue_named[wal_copies[i].key.queue_id] = true;
	}
	return true;
}

/* WAL replay: the primary's table follows; forget this one's. */
void
fs_gate_replay_clear(void)
{
	HASH_SEQ_STATUS seq;
	FsHeartbeat *worker;

	LWLockAcquire(fs_heartbeats_lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, fs_heartbeat_hash);
	while ((worker = hash_seq_search(&seq)) != NULL)
		hash_search(fs_heartbeat_hash, &worker->key, HASH_REMOVE, NULL);
	LWLockRelease(fs_heartbeats_lock);
}

/*
 * WAL replay: one heartbeat of the primary's table, for the queue that
 * `queue_of` gives.  False when it could not be kept (the table is full).
 */
bool
fs_gate_replay_worker(FsStateItem *item, fs_queue_of_index queue_of, void *arg)
{
	FsHeartbeat rec;
	FsHeartbeat *worker;
	FsQueue    *queue;
	uint8		field;
	uint8		len;
	const char *value;
	int			seen = 0;

	memset(&rec, 0, sizeof(rec));
	while (fs_state_field_next(item, &field, &value, &len))
	{
		bool		ok = false;

		switch (field)
		{
			case FS_HEARTBEAT_QUEUE:
				ok = fs_state_field_value(value, len, rec.key.queue_id);
				break;
			case FS_HEARTBEAT_WORKER:
				ok = fs_state_field_name(value, len, rec.key.worker, FS_NAME_BUFLEN);
				break;
			case FS_HEARTBEAT_THREADS:
				ok = fs_state_field_value(value, len, rec.threads);
				break;
			case FS_HEARTBEAT_AT:
				ok = fs_state_field_value(value, len, rec.last_heartbeat);
				break;
			default:
				break;
		}
		if (ok)
			seen |= 1 << field;
	}
	if (seen != ((1 << (FS_HEARTBEAT_AT + 1)) - 2) || rec.key.worker[0] == '\0' ||
		rec.threads <= 0 || rec.threads > FS_MAX_WORKER_THREADS ||
		(queue = queue_of(rec.key.queue_id, arg)) == NULL)
		return true;
	rec.key.queue_id = queue->queue_id;
	LWLockAcquire(fs_heartbeats_lock, LW_EXCLUSIVE);
	worker = hash_search(fs_heartbeat_hash, &rec.key, HASH_ENTER_NULL, NULL);
	if (worker != NULL)
	{
		worker->threads = rec.threads;
		worker->last_heartbeat = rec.last_heartbeat;
	}
	LWLockRelease(fs_heartbeats_lock);
	return worker != NULL;
}

/* WAL replay: the table is the primary's; count each queue's live workers. */
void
fs_gate_replay_recount(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int			q;

	LWLockAcquire(fs_heartbeats_lock, LW_SHARED);
	for (q = 0; q < fs_max_queues; q++)
	{
		FsQueue    *queue = fs_queue_by_id((uint32) q);

		if (queue != NULL)
			fs_gate_recount(queue, now, false);
	}
	LWLockRelease(fs_heartbeats_lock);
}

/* ----------------------------------------------------------------
 * SQL functions
 * ----------------------------------------------------------------
 */

/*
 * fs_worker_heartbeat(worker text, threads int, queue text) RETURNS void
 *
 * A worker reports that it is live with `threads` threads serving `queue`.
 * threads = 0 says it is going away.  If the worker table is full the
 * heartbeat is dropped with a warning (it never fails the caller).  On the
 * coordinator of a Citus cluster it goes to every node as well: a worker
 * connected there serves tenants of every node, and each node's gate
 * counts it (a heartbeat sent to a worker node counts there only).
 */
Datum
fs_worker_heartbeat(PG_FUNCTION_ARGS)
{
	Oid			argtypes[4] = {TEXTOID, TEXTOID, INT4OID, TEXTOID};
	Datum		values[4];

	fs_heartbeat_record(fcinfo, 0);
	/* Recorded: no argument is NULL. */
	values[1] = PG_GETARG_DATUM(0);
	values[2] = PG_GETARG_DATUM(1);
	values[3] = PG_GETARG_DATUM(2);
	fs_cluster_broadcast("fs_worker_heartbeat", 4, argtypes, values);
	PG_RETURN_VOID();
}

/*
 * fs_worker_heartbeat_at(node_anchor text, worker text, threads int, queue
 * text) RETURNS void: the heartbeat on the node that holds node_anchor's
 * shard, where Citus delegates it.
 */
Datum
fs_worker_heartbeat_at(PG_FUNCTION_ARGS)
{
	fs_heartbeat_record(fcinfo, 1);
	PG_RETURN_VOID();
}

/* Record a heartbeat whose arguments start at `arg`. */
static void
fs_heartbeat_record(FunctionCallInfo fcinfo, int arg)
{
	FsHeartbeatKey key;
	char		queue_name[FS_NAME_BUFLEN];
	int32		threads;
	FsQueue    *queue;
	FsHeartbeat   *worker;
	TimestampTz now;
	bool		found;

	worker = NULL;
	fs_check_primary("record a worker heartbeat");
	memset(&key, 0, sizeof(key));
	fs_name_arg(fcinfo, arg, "worker", key.worker);
	if (PG_ARGISNULL(arg + 1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("threads must not be null"),
				 errhint("Pass the number of threads the worker runs jobs on, or 0 when it stops.")));
	threads = PG_GETARG_INT32(arg + 1);
	if (threads < 0 || threads > FS_MAX_WORKER_THREADS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("threads must be between 0 and %d, got %d", FS_MAX_WORKER_THREADS, threads),
				 errhint("Pass the number of threads the worker runs jobs on, or 0 when it stops.")));
	fs_name_arg(fcinfo, arg + 2, "queue", queue_name);

	queue = fs_queue_lookup(queue_name, true);
	if (queue == NULL)
	{
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("fairshare queue table is full: heartbeat of worker \"%s\" ignored", key.worker),
				 errhint("Raise fairshare.max_queues.")));
		return;
	}
	key.queue_id = queue->queue_id;
	now = fs_now();

	LWLockAcquire(fs_heartbeats_lock, LW_EXCLUSIVE);
	if (threads == 0)
		hash_search(fs_heartbeat_hash, &key, HASH_REMOVE, NULL);
	else
	{
		worker = hash_search(fs_heartbeat_hash, &key, HASH_ENTER_NULL, &found);
		if (worker == NULL)
		{
			/* Make room by dropping stale heartbeats of this queue, once. */
			fs_gate_recount(queue, now, true);
			worker = hash_search(fs_heartbeat_hash, &key, HASH_ENTER_NULL, &found);
		}
		if (worker != NULL)
		{
			worker->threads = threads;
			worker->last_heartbeat = now;
		}
	}
	fs_gate_recount(queue, now, true);
	pg_atomic_fetch_add_u64(fs_heartbeats_version, 1);
	LWLockRelease(fs_heartbeats_lock);

	if (threads > 0 && worker == NULL)
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("fairshare worker table is full: heartbeat of worker \"%s\" ignored", key.worker),
				 errhint("Raise fairshare.max_workers.")));
}

/*
 * fs_report_latency(latency interval, queue text) RETURNS void
 *
 * The app reports how long its oldest ready job has waited.  Over
 * fairshare.backpressure_latency, admission into the queue grants nothing
 * until a lower figure is reported or fairshare.worker_ttl passes.  On the
 * coordinator of a Citus cluster it goes to every node as well.
 */
Datum
fs_report_latency(PG_FUNCTION_ARGS)
{
	Oid			argtypes[3] = {TEXTOID, INTERVALOID, TEXTOID};
	Datum		values[3];

	fs_latency_record(fcinfo, 0);
	/* Recorded: no argument is NULL. */
	values[1] = PG_GETARG_DATUM(0);
	values[2] = PG_GETARG_DATUM(1);
	fs_cluster_broadcast("fs_report_latency", 3, argtypes, values);
	PG_RETURN_VOID();
}

/*
 * fs_report_latency_at(node_anchor text, latency interval, queue text)
 * RETURNS void: the report on the node that holds node_anchor's shard.
 */
Datum
fs_report_latency_at(PG_FUNCTION_ARGS)
{
	fs_latency_record(fcinfo, 1);
	PG_RETURN_VOID();
}

/* Record a latency report whose arguments start at `arg`. */
static void
fs_latency_record(FunctionCallInfo fcinfo, int arg)
{
	Interval   *latency;
	float8		latency_ms;
	char		queue_name[FS_NAME_BUFLEN];
	FsQueue    *queue;

	fs_check_primary("report a queue latency");
	if (PG_ARGISNULL(arg))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("latency must not be null"),
				 errhint("Pass how long the oldest ready job has waited, such as '1.5 seconds'.")));
	latency = PG_GETARG_INTERVAL_P(arg);
	latency_ms = ((float8) latency->time +
				  ((float8) latency->month * DAYS_PER_MONTH + latency->day) * USECS_PER_DAY) / 1000.0;
	if (latency_ms < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("latency must not be negative"),
				 errhint("Pass how long the oldest ready job has waited, such as '1.5 seconds'.")));
	fs_name_arg(fcinfo, arg + 1, "queue", queue_name);
	queue = fs_queue_lookup(queue_name, true);
	if (queue != NULL)
		fs_gate_set_latency(queue, latency_ms, fs_now());
}

/* fs_worker_state(): the heartbeat table, for this database's queues. */
Datum
fs_worker_state(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo;
	HASH_SEQ_STATUS seq;
	FsHeartbeat   *worker;
	FsHeartbeat   *copies;
	long		ncopies = 0;
	long		i;
	TimestampTz now;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	now = fs_now();

	/* Copy under the lock; build tuples (and look up queues) after it. */
	copies = palloc_extended(sizeof(FsHeartbeat) * fs_max_workers, MCXT_ALLOC_HUGE);
	LWLockAcquire(fs_heartbeats_lock, LW_SHARED);
	hash_seq_init(&seq, fs_heartbeat_hash);
	while ((worker = hash_seq_search(&seq)) != NULL)
		if (ncopies < fs_max_workers)
			copies[ncopies++] = *worker;
	LWLockRelease(fs_heartbeats_lock);

	for (i = 0; i < ncopies; i++)
	{
		FsQueue    *queue = fs_queue_by_id(copies[i].key.queue_id);
		Datum		values[5];
		bool		nulls[5] = {false, false, false, false, false};

		if (queue == NULL || queue->key.dboid != MyDatabaseId)
			continue;
		values[0] = CStringGetTextDatum(queue->key.name);
		values[1] = CStringGetTextDatum(copies[i].key.worker);
		values[2] = Int32GetDatum(copies[i].threads);
		values[3] = TimestampTzGetDatum(copies[i].last_heartbeat);
		values[4] = BoolGetDatum(fs_heartbeat_is_live(&copies[i], now));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* fs_queues.backpressure of a state. */
static const char *
fs_backpressure_name(FsBackpressure bp)
{
	switch (bp)
	{
		case FS_BP_NONE:
			return "none";
		case FS_BP_LATENCY:
			return "latency";
		case FS_BP_NO_FREE_THREAD:
			return "no_free_thread";
	}
	return "unknown";
}

/* fs_queue_state(): the gate's view of every queue of this database. */
Datum
fs_queue_state(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo;
	TimestampTz now;
	int			num_queues;
	int			i;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	now = fs_now();

	LWLockAcquire(fs_shared->queues_lock, LW_SHARED);
	num_queues = fs_shared->num_queues;
	LWLockRelease(fs_shared->queues_lock);

	for (i = 0; i < num_queues; i++)
	{
		FsQueue    *queue = fs_queue_by_id(i);
		FsGateCapacity cap;
		FsBackpressure bp;
		Datum		values[11];
		bool		nulls[11];
		int32		slots;
		uint64		tenants;
		int32		live_workers;
		float8		latency_ms;
		TimestampTz latency_at;

		if (queue == NULL || queue->key.dboid != MyDatabaseId)
			continue;
		fs_gate_capacity(queue, now, &cap);
		bp = fs_gate_backpressure(queue, &cap, now);
		slots = (int32) pg_atomic_read_u32(&queue->slots_in_use);
		SpinLockAcquire(&queue->mutex);
		tenants = queue->tenants;
		live_workers = queue->live_workers;
		latency_ms = queue->latency_ms;
		latency_at = queue->latency_at;
		SpinLockRelease(&queue->mutex);

		memset(nulls, 0, sizeof(nulls));
		values[0] = CStringGetTextDatum(queue->key.name);
		values[1] = Int64GetDatum((int64) tenants);
		values[2] = Int32GetDatum(live_workers);
		values[3] = Int32GetDatum(cap.live_threads);
		values[4] = Int32GetDatum(slots);
		if (cap.active)
		{
			values[5] = Int32GetDatum(Max(cap.live_threads - slots, 0));
			values[6] = Float8GetDatum(cap.share_threads);
		}
		else
		{
			nulls[5] = true;
			nulls[6] = true;
		}
		values[7] = Float8GetDatum(cap.dampener);
		if (latency_at == DT_NOBEGIN)
		{
			nulls[8] = true;
			nulls[9] = true;
		}
		else
		{
			values[8] = Float8GetDatum(latency_ms);
			values[9] = TimestampTzGetDatum(latency_at);
		}
		values[10] = CStringGetTextDatum(fs_backpressure_name(bp));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

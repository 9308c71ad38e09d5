/*-------------------------------------------------------------------------
 *
 * fairqueue.h
 *	  Fair per-tenant dequeue: what the rest of fairshare calls.
 *
 * An application's ready table (Solid Queue's solid_queue_ready_executions,
 * GoodJob's good_jobs, or its own) is registered with fs_register_queue():
 * the SQL that yields a row's tenant, its order within the tenant, and which
 * rows are ready.  Triggers keep per-tenant counts of ready rows in shared
 * memory (applied at commit), and fs_claim() claims rows in start-time fair
 * queueing order, FOR UPDATE SKIP LOCKED in the caller's transaction, each
 * with a slot lease.  See order.c for the design.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_FAIRQUEUE_H
#define FAIRSHARE_FAIRQUEUE_H

#include "lib/stringinfo.h"

#include "core/shmem.h"
#include "core/stateformat.h"

/* GUC: half-life of the served work behind the fairness metrics, seconds. */

/* Module start (_PG_init): GUCs and transaction callbacks. */
extern void fs_fairqueue_init(void);

/* Shared memory, called from shmem.c's hooks. */
extern void fs_fairqueue_shmem_request(void);
extern void fs_fairqueue_shmem_init(void);

/*
 * Tenant entries (shmem.c): may this entry be evicted as far as fair dequeue
 * is concerned, and decay its served work up to `now`.  Both are called with
 * the entry's spinlock held.
 */
extern bool fs_fairqueue_may_evict(const FsTenant *entry);

/*
 * Claims on a Citus coordinator (route.c): the scheduler keeps the nodes'
 * claimable weights fresh while claims want them.  It attaches its latch
 * (woken when weights go stale), sleeps at most fs_route_refresh_due_ms()
 * (-1: no weight is wanted), and then asks each wanted weight
 * (fs_route_wants()) with fs_route_refresh_one(), each in a transaction of
 * its own.
 */
#define FS_ROUTE_WANTS_MAX		256

typedef struct FsRouteWant
{
	char		queue_name[FS_NAME_BUFLEN];
	int32		group;			/* Citus node group */
} FsRouteWant;

extern void fs_route_refresher_attach(bool attach);
extern long fs_route_refresh_due_ms(void);
extern int	fs_route_wants(FsRouteWant *wants);
extern void fs_route_refresh_one(const FsRouteWant *want);
extern void fs_route_refresh_failed(const FsRouteWant *want);

/* fs_reset(): zero the per-queue counters of fair dequeue. */
extern void fs_fairqueue_reset_counters(void);

/*
 * The state file (statefile.c): fair dequeue saves each queue's virtual time
 * (clean shutdowns) and the map from claimed rows to leases (every save), in
 * sections of their own; restore gets each such section back.
 */
extern void fs_fairqueue_save_state(StringInfo buf, uint32 nqueues, bool clean);
extern void fs_fairqueue_restore_section(uint32 tag, const char *data, Size bytes,
										 uint64 count, FsQueue **queues, uint64 nqueues,
										 bool clean, int64 next_lease_id);

/*
 * Recount the ready rows of every registered queue of the current database
 * from its table, and forget claim-map entries whose leases are gone.  For
 * the background worker, which should call it inside a transaction every few
 * minutes (and once at its start): backlog counts are kept exactly by the
 * triggers, so this only heals drift (after a crash, or rows changed with
 * triggers disabled).  It takes no table lock: enqueues and claims go on
 * (a queue's commits pause for an instant while its snapshot is taken).
 * A queue another session is recounting is skipped.  Returns the number of
 * queues recounted.
 */
extern int	fs_fairqueue_resync_all(void);

/*
 * Replication through WAL (statefile/wal_writer.c, wal_redo.c): a queue's
 * fair-order state as logged, an item of it, and its replay; a replayed
 * tenant's place in the fair order; queues to recount after a promotion.
 */
typedef struct FsFairWalState
{
	float8		vtime;
	float8		max_finish;
	float8		avg_cost;
	float8		avg_runtime_ms;
	int64		rows_without_tenant;
	int64		untracked_rows;
} FsFairWalState;

extern bool fs_fair_wal_changed(uint32 queue_id, uint64 *seen, FsFairWalState *state);
extern void fs_fair_wal_write(StringInfo buf, uint32 queue_index, const FsFairWalState *state);
extern bool fs_fair_wal_read(FsStateItem *item, uint32 *queue_index, FsFairWalState *state);
extern void fs_fair_wal_apply(FsQueue *queue, const FsFairWalState *state);
extern void fs_fair_replay_tenant(FsQueue *queue, FsTenant *entry);
extern void fs_fair_unsync_all(void);

/* The claim map's entries set since the WAL writer last looked, and a snapshot's. */
#define FS_CLAIM_ITEM_MAX	(2 + 6 + 4 + 3 + (2 + 16) + 10 + 10 + (2 + FS_NAME_MAXLEN))

extern int	fs_claim_wal_drain(bool *overflow);
extern bool fs_claim_wal_write_next(StringInfo buf, Size limit, uint64 *count, bool *queue_named);
extern void fs_claim_wal_write_all(StringInfo buf, uint64 *count, bool *queue_named, bool *lost,
								   fs_scan_pause pause, void *arg);
extern bool fs_claim_wal_apply(FsStateItem *item, fs_queue_of_index queue_of, void *arg);
extern void fs_claim_wal_sweep(void);

#endif							/* FAIRSHARE_FAIRQUEUE_H */

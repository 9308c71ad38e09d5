/*-------------------------------------------------------------------------
 *
 * common.h
 *	  Declarations every layer shares: names, decision reasons, the clock,
 *	  argument checks and the server-wide settings.
 *
 * The source tree, bottom up (README.md, Layout; test/layers checks that no
 * file includes a layer above its own):
 *	  core/        common, shmem (queues, tenants, eviction, THE locking
 *	               rules), tenant.h (arithmetic on an entry), scanlist,
 *	               decisions (the decision log), stateformat.h, run_as,
 *	               subxact, compat.h, lockstats
 *	  limits/      the durable fs_limits table and its cache in tenant entries
 *	  gate/        the global gate (live workers, dampener, backpressure)
 *	  slots/       concurrency slots and leases
 *	  budget/      token buckets
 *	  tiers/       greedy-tenant tiers
 *	  fairq/       fair per-tenant dequeue (fairqueue_int.h says which file
 *	               does what)
 *	  schedules/   cron, schedules and their exactly-once claims
 *	  views/       views of live state and counters, reset
 *	  statefile/   saving state at shutdown and restoring it at startup
 *	  worker/      the background worker: launcher and scheduler
 *	  module.c     _PG_init, handing over to each of the above
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_COMMON_H
#define FAIRSHARE_COMMON_H

#include "fmgr.h"
#include "utils/timestamp.h"

#include "core/compat.h"
#include "core/lockstats.h"

/*
 * The role that administers fairshare (sql/fairshare.sql creates it): its
 * members see every role's schedules and runs, and may release or renew
 * any role's lease.
 */
#define FS_ADMIN_ROLE		"fairshare_admin"

/*
 * Tenant and queue names are text of 1..FS_NAME_MAXLEN bytes.  The limit
 * keeps a tenant's shared-memory entry small and fixed-size; it is the same
 * as PostgreSQL's identifier length.
 */
#define FS_NAME_MAXLEN		63
#define FS_NAME_BUFLEN		(FS_NAME_MAXLEN + 1)

/* The name that stands for "any tenant" / "any queue" in fs_limits. */
#define FS_WILDCARD			"*"

/*
 * Why a decision came out the way it did.  This is the closed set documented
 * in README.md; the SQL names are in fs_reason_names[].  Per-tenant counters
 * keep one slot for each reason up to FS_REASON_FAIL_OPEN (fail-open happens
 * exactly when there is no tenant entry to count on, so it is counted
 * globally).
 */
typedef enum FsReason
{
	FS_REASON_GRANTED = 0,
	FS_REASON_TENANT_LIMIT,		/* the tenant holds max_slots already */
	FS_REASON_GLOBAL_GATE,		/* the tenant holds its share of live workers */
	FS_REASON_THROTTLED,		/* as global_gate, lowered by throttle_pct */
	FS_REASON_BACKPRESSURE,		/* the queue is behind or has no free worker */
	FS_REASON_NO_BUDGET,		/* the token bucket cannot pay for one run */
	FS_REASON_FAIL_OPEN,		/* state could not be kept: granted anyway */
	FS_NUM_REASONS
} FsReason;

#define FS_NUM_TENANT_REASONS	FS_REASON_FAIL_OPEN

extern const char *const fs_reason_names[FS_NUM_REASONS];

/* The server-wide settings (common.c) */
extern int	fs_max_tenants;
extern int	fs_max_leases;
extern int	fs_max_queues;
extern int	fs_max_subkeys;
extern bool fs_save_state;
extern double fs_debug_clock;

/* common.c */
extern void fs_common_init(void);
extern void fs_check_loaded(void);
extern void fs_check_primary(const char *what);
extern TimestampTz fs_now(void);
extern void fs_text_name(text *arg, const char *what, char *buf);
extern void fs_name_arg(FunctionCallInfo fcinfo, int argno, const char *what, char *buf);
extern char *fs_float_text(float8 value);

/*
 * Internal invariants, checked in the debug build (make FS_DEBUG=1) and
 * compiled out otherwise.  A violation is an ERROR (SQLSTATE XX000), so the
 * fault and fuzz suites see it; never use it while holding a spinlock.
 */
#ifdef FS_DEBUG
extern void fs_invariant_failed(const char *what, const char *file, int line)
			pg_attribute_noreturn();
#define FS_INVARIANT(cond) \
	do { \
		if (unlikely(!(cond))) \
			fs_invariant_failed(#cond, __FILE__, __LINE__); \
	} while (0)
#else
#define FS_INVARIANT(cond) ((void) 0)
#endif

/*
 * Fault points, in the debug build only: FS_FAULT_POINT(name) stands just
 * before an allocation that comes after shared state changed, and raises
 * the error palloc raises when it fails ("out of memory", SQLSTATE 53200)
 * when fairshare.debug_out_of_memory names the point, so that the fault
 * suite can check each such error path (test/t/050_faults.pl).  Compiled
 * out otherwise.
 */
#ifdef FS_DEBUG
extern char *fs_debug_out_of_memory;
extern void fs_fault_point_pass(const char *point);
#define FS_FAULT_POINT(point) \
	do { \
		if (unlikely(fs_debug_out_of_memory != NULL && fs_debug_out_of_memory[0] != '\0')) \
			fs_fault_point_pass(point); \
	} while (0)
#else
#define FS_FAULT_POINT(point) ((void) 0)
#endif

/*
 * Pause points, in the debug build only: FS_PAUSE_POINT(name) sleeps for
 * the milliseconds fairshare.debug_pause gives when it names the point
 * (name:ms), so that a test can make a narrow window between two steps of
 * fairshare wide enough to act in (test/t/054_probe_start_commit.pl).
 * Compiled out otherwise.
 */
#ifdef FS_DEBUG
extern char *fs_debug_pause;
extern void fs_pause_point_pass(const char *point);
#define FS_PAUSE_POINT(point) \
	do { \
		if (unlikely(fs_debug_pause != NULL && fs_debug_pause[0] != '\0')) \
			fs_pause_point_pass(point); \
	} while (0)
#else
#define FS_PAUSE_POINT(point) ((void) 0)
#endif

#endif							/* FAIRSHARE_COMMON_H */

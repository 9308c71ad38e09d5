/*-------------------------------------------------------------------------
 *
 * module.c
 *	  fairshare's entry point: _PG_init hands over to each layer, bottom up.
 *
 * Each layer defines its own settings and asks for its own shared memory
 * and locks in its init function; this file only says in which order they
 * run.  It is the one file that may include every layer (README.md,
 * Layout).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "utils/guc.h"

#include "budget/budget.h"
#include "core/cluster.h"
#include "core/common.h"
#include "core/decisions.h"
#include "core/lockstats.h"
#include "core/prepared.h"
#include "core/shmem.h"
#include "fairq/fairqueue.h"
#include "gate/gate.h"
#include "limits/limits.h"
#include "schedules/schedules.h"
#include "slots/slots.h"
#include "statefile/statefile.h"
#include "statefile/wal.h"
#include "tiers/tiers.h"
#include "worker/worker.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Each layer asks for its own shared memory and LWLocks. */
static void
fs_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	fs_core_shmem_request();
	fs_prepared_shmem_request();
	fs_decisions_shmem_request();
	fs_lockstats_shmem_request();
	fs_slots_shmem_request();
	fs_gate_shmem_request();
	fs_tiers_shmem_request();
	fs_worker_shmem_request();
	fs_fairqueue_shmem_request();
	fs_wal_shmem_request();
}

/*
 * Each layer creates or attaches to its shared state, bottom up.  In the
 * postmaster, at startup and again after a crash (when shared memory is
 * made anew), the state file is then restored and set to be written at
 * shutdown; backends attach to what is there.
 */
static void
fs_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	found = fs_core_shmem_init();
	fs_prepared_shmem_init();
	fs_slots_shmem_init();
	fs_gate_shmem_init();
	fs_decisions_shmem_init();
	fs_tiers_shmem_init();
	fs_worker_shmem_init();
	fs_fairqueue_shmem_init();
	fs_wal_shmem_init();
	fs_lockstats_shmem_init();
	LWLockRelease(AddinShmemInitLock);

	if (!IsUnderPostmaster && !found)
		fs_statefile_startup();
}

/*
 * Shared memory can only be set up when fairshare is loaded at server
 * start.  Loaded any other way it defines nothing, and every function says
 * how to fix that (fs_check_loaded()).
 */
void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

	fs_common_init();
	fs_prepared_init();
	fs_cluster_init();
	fs_gate_init();
	fs_decisions_init();
	fs_tiers_init();
	fs_schedules_init();
	fs_worker_init();
	fs_wal_init();
	MarkGUCPrefixReserved("fairshare");

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = fs_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = fs_shmem_startup;

	/* The calls the core makes upwards. */
	fs_queue_init_hook = fs_gate_queue_init;
	fs_tenant_evictable_hook = fs_fairqueue_may_evict;
	fs_limits_resolve_hook = fs_limits_resolve;

	fs_limits_init();
	fs_slots_init();
	fs_budget_init();
	fs_fairqueue_init();
}

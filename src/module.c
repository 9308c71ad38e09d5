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
#include "utils/guc.h"

#include "budget/budget.h"
#include "core/common.h"
#include "core/shmem.h"
#include "fairq/fairqueue.h"
#include "gate/gate.h"
#include "limits/limits.h"
#include "schedules/schedules.h"
#include "slots/slots.h"
#include "tiers/tiers.h"
#include "views/views.h"
#include "worker/worker.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

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
	fs_gate_init();
	fs_telemetry_init();
	fs_tiers_init();
	fs_schedules_init();
	fs_worker_init();
	MarkGUCPrefixReserved("fairshare");

	fs_shmem_request();
	fs_limits_init();
	fs_slots_init();
	fs_budget_init();
	fs_fairqueue_init();
}

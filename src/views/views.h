/*-------------------------------------------------------------------------
 *
 * views.h
 *	  Views of fairshare's live state and counters.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_VIEWS_H
#define FAIRSHARE_VIEWS_H

#include "core/shmem.h"

/* Column counts of the SRFs; must match their OUT parameters in SQL. */
#define FS_TENANT_STATE_COLS	(11 + FS_NUM_TENANT_REASONS + 4)
#define FS_SERVER_STATE_COLS	24

#endif							/* FAIRSHARE_VIEWS_H */

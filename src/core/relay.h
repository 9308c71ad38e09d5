/*-------------------------------------------------------------------------
 *
 * relay.h
 *	  A Citus coordinator's own connections to its nodes, for per-tenant
 *	  calls made alone outside a transaction block (see relay.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_RELAY_H
#define FAIRSHARE_RELAY_H

#include "fmgr.h"

extern PGDLLIMPORT bool fs_relay_enabled;

extern void fs_relay_init(void);
extern bool fs_relay_sole_call(FunctionCallInfo fcinfo);
extern bool fs_relay_call(int32 group, const char *function, FunctionCallInfo fcinfo,
						  Datum *result);

#endif							/* FAIRSHARE_RELAY_H */

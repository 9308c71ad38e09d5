/*-------------------------------------------------------------------------
 *
 * cluster.h
 *	  fairshare on a Citus cluster: which node this is, which node owns a
 *	  tenant, and lease ids that name the node that granted them.
 *
 * On a cluster set up with fs_citus_setup(), a tenant's decisions are made
 * by the node that holds its shard of the colocated table (Citus delegates
 * the per-tenant functions there), so each node counts its own tenants'
 * slots and budgets exactly.  The node-side rules live here:
 *
 *	- a node is known by its Citus group id (0 on the coordinator, and on a
 *	  server without Citus);
 *	- a lease id holds the granting node's group in bits 52 to 61, so that a
 *	  release or renew anywhere reaches that node (group 0's ids are the ids
 *	  of a single server);
 *	- a per-tenant decision on a node that does not own the tenant is sent
 *	  there when it is a coordinator's statement of its own (relay.c, or
 *	  through Citus inside a transaction block), and otherwise an error,
 *	  never a second count (fs_cluster_tenant_relayed);
 *	- a release or renew of another node's lease is sent to that node
 *	  (fs_cluster_forward_lease).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_CLUSTER_H
#define FAIRSHARE_CLUSTER_H

#include "access/attnum.h"
#include "datatype/timestamp.h"
#include "fmgr.h"

/* Where a lease id keeps its node, and the largest node it can name. */
#define FS_LEASE_NODE_SHIFT		52
#define FS_LEASE_NODE_MAX		1023
#define FS_LEASE_LOCAL_MASK		((INT64CONST(1) << FS_LEASE_NODE_SHIFT) - 1)

extern PGDLLIMPORT bool fs_cluster_absent;

extern void fs_cluster_init(void);
extern void fs_cluster_forget(void);
extern int32 fs_cluster_group(void);
extern int64 fs_lease_id_out_slow(int64 local_id);
extern bool fs_cluster_tenant_relayed_slow(FunctionCallInfo fcinfo, const char *function,
										   const char *tenant, Datum *result);
extern int32 fs_lease_id_node(int64 lease_id);
extern bool fs_lease_id_in(int64 lease_id, int64 *local_id);
extern int32 fs_cluster_tenant_group(const char *tenant);
extern bool fs_cluster_forward_lease(FunctionCallInfo fcinfo, const char *function,
									 int64 lease_id, int64 lease_usecs, bool *result, bool *isnull);
extern void fs_cluster_check_lease_here(const char *function, int64 lease_id);
extern void fs_cluster_check_anchor_arg(FunctionCallInfo fcinfo, const char *function);
extern void fs_cluster_forward(int32 node, const char *function, int nargs, Oid *argtypes,
							   Datum *values, Datum *result, bool *isnull);
extern void fs_cluster_broadcast(const char *function, int nargs, Oid *argtypes, Datum *values);
extern void fs_cluster_check_coordinator(const char *function);
extern bool fs_cluster_is_distributed(Oid relid);
extern bool fs_cluster_ddl_is_coordinators(Oid relid);
extern int	fs_cluster_node_groups(int32 *groups);
extern char *fs_cluster_node_anchor(int32 group);
extern int	fs_cluster_route_begin(void);
extern void fs_cluster_route_end(int nestlevel);

/* One shard of a distributed table that this node holds. */
typedef struct FsLocalShard
{
	int64		shard_id;
	Oid			relid;			/* the shard's own table here */
	int32		min_hash;
	int32		max_hash;
} FsLocalShard;

extern int32 fs_cluster_hash(const char *value);
extern int	fs_cluster_local_shards(Oid relid, FsLocalShard **shards);
extern Oid	fs_cluster_shard_parent(Oid relid);
extern char *fs_cluster_queue_table_problem(Oid relid, AttrNumber tenant_attnum);
extern char *fs_cluster_distribution_column(Oid relid);

/*
 * The fast paths, for a server without Citus (once this backend has looked):
 * lease ids are a single server's, and every tenant is this server's.
 */

/* A lease id as this node hands it out. */
static inline int64
fs_lease_id_out(int64 local_id)
{
	return fs_cluster_absent ? local_id : fs_lease_id_out_slow(local_id);
}

/*
 * A decision for `tenant` on a node that does not own it: sent to the
 * owner (true, its answer in *result and fcinfo->isnull) or refused; its
 * slots and budget are counted on the owner only.  False: decide here.
 */
static inline bool
fs_cluster_tenant_relayed(FunctionCallInfo fcinfo, const char *function, const char *tenant,
						  Datum *result)
{
	return !fs_cluster_absent &&
		fs_cluster_tenant_relayed_slow(fcinfo, function, tenant, result);
}

#endif							/* FAIRSHARE_CLUSTER_H */

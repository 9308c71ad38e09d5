/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Version shims: every #if PG_VERSION_NUM in fairshare lives here.
 *
 * fairshare targets PostgreSQL 15 and later.  PostgreSQL 15 introduced
 * shmem_request_hook, which is how we reserve shared memory and LWLocks.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FAIRSHARE_COMPAT_H
#define FAIRSHARE_COMPAT_H

#if PG_VERSION_NUM < 150000
#error "fairshare requires PostgreSQL 15 or later"
#endif

/*
 * PostgreSQL 17 renamed the backend's position in the PGPROC array from
 * MyBackendId to MyProcNumber.  We only use it to spread work over
 * partitions, so either will do.
 */
#if PG_VERSION_NUM >= 170000
#define FS_MY_PROC_NUMBER	MyProcNumber
#define FS_FIRST_PROC_NUMBER 0
#else
#define FS_MY_PROC_NUMBER	MyBackendId
#define FS_FIRST_PROC_NUMBER 1	/* backend ids start at 1 */
#endif

/*
 * A process's index in the PGPROC array (every process with a PGPROC, the
 * auxiliary ones included), below MaxBackends + NUM_AUXILIARY_PROCS; -1
 * for a process without one (the postmaster).  PostgreSQL 17 made it
 * MyProcNumber and dropped PGPROC.pgprocno.
 */
#include "storage/proc.h"
#if PG_VERSION_NUM >= 170000
#define FS_MY_PGPROC_INDEX	(MyProc != NULL ? (int) MyProcNumber : -1)
#else
#define FS_MY_PGPROC_INDEX	(MyProc != NULL ? MyProc->pgprocno : -1)
#endif

/*
 * This backend's local transaction id (PostgreSQL 17 moved it into
 * PGPROC.vxid).
 */
#if PG_VERSION_NUM >= 170000
#define FS_MY_LXID			(MyProc->vxid.lxid)
#else
#define FS_MY_LXID			(MyProc->lxid)
#endif

/*
 * get_extension_schema() is exported from PostgreSQL 16 on; before that it
 * is static in extension.c, so read pg_extension ourselves.
 */
#if PG_VERSION_NUM >= 160000
#include "commands/extension.h"
#define fs_get_extension_schema(ext_oid) get_extension_schema(ext_oid)
#else
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"

static inline Oid
fs_get_extension_schema(Oid ext_oid)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	Oid			result = InvalidOid;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(ext_oid));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
		result = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return result;
}
#endif

/* PostgreSQL 16 folded pg_class_ownercheck() into object_ownercheck(). */
#include "utils/acl.h"
#if PG_VERSION_NUM >= 160000
#include "catalog/pg_class.h"
#define fs_class_ownercheck(relid, roleid) \
	object_ownercheck(RelationRelationId, (relid), (roleid))
#else
#define fs_class_ownercheck(relid, roleid) pg_class_ownercheck((relid), (roleid))
#endif

/*
 * A wait event set kept across calls and freed by its owner: PostgreSQL 17
 * ties a set to a resource owner (none here), before that to a memory
 * context.
 */
#if PG_VERSION_NUM >= 170000
#define fs_create_wait_event_set(nevents) CreateWaitEventSet(NULL, (nevents))
#else
#define fs_create_wait_event_set(nevents) CreateWaitEventSet(TopMemoryContext, (nevents))
#endif

#endif							/* FAIRSHARE_COMPAT_H */

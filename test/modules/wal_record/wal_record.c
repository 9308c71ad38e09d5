/*-------------------------------------------------------------------------
 *
 * wal_record.c
 *	  Test only: write a record of fairshare's WAL resource manager with a
 *	  header of the caller's choosing, so that a test can check how a
 *	  standby treats a record of a newer format or one that is not
 *	  fairshare's (statefile/wal_redo.c refuses both, with a hint).
 *
 *	  fs_test_wal_record(magic bigint, format int) RETURNS pg_lsn
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "access/xloginsert.h"
#include "fmgr.h"
#include "utils/guc.h"
#include "utils/pg_lsn.h"
#include "utils/timestamp.h"

#include "statefile/wal.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(fs_test_wal_record);

/*
 * Insert a BATCH record of fairshare's resource manager (its id read from
 * fairshare.wal_rmgr_id) whose header has `magic` and `format`, and no
 * section; flush it and return where it ends.
 */
Datum
fs_test_wal_record(PG_FUNCTION_ARGS)
{
	FsWalHeader header;
	const char *rmgr_id = GetConfigOption("fairshare.wal_rmgr_id", false, true);
	XLogRecPtr	lsn;

	if (rmgr_id == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("fairshare is not loaded"),
				 errhint("Add fairshare to shared_preload_libraries.")));
	memset(&header, 0, sizeof(header));
	header.magic = (uint32) PG_GETARG_INT64(0);
	header.format = (uint16) PG_GETARG_INT32(1);
	header.primary_now = GetCurrentTimestamp();
	XLogBeginInsert();
	XLogRegisterData((char *) &header, sizeof(header));
	lsn = XLogInsert((RmgrId) atoi(rmgr_id), XLOG_FS_BATCH);
	XLogFlush(lsn);
	PG_RETURN_LSN(lsn);
}

/*-------------------------------------------------------------------------
 *
 * statefile.c
 *	  Saving fairshare's shared state to pg_stat/fairshare.state and
 *	  restoring it at startup.
 *
 * The file is a header followed by tagged sections and a CRC-32C of all of
 * it.  It is written whole to a temporary file and renamed into place with
 * durable_rename(), so a reader sees the old file or the new one, never a
 * mix.  At startup it is read into memory and checked completely (magic,
 * version, record sizes, CRC, every length) before anything is applied: a
 * damaged or foreign file is logged and ignored.
 *
 * The postmaster restores the file when it creates shared memory (at start,
 * and again after a crash), and writes it at a clean shutdown.  See
 * statefile.h for what each kind of file holds.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "catalog/pg_control.h"
#include "common/controldata_utils.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "port/pg_crc32c.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "utils/memutils.h"

#include "core/stateformat.h"
#include "fairq/fairqueue.h"
#include "slots/slots.h"
#include "statefile/records.h"
#include "statefile/statefile.h"

PG_FUNCTION_INFO_V1(fs_save_state_now);

#define FS_STATE_MAGIC		0x46535331	/* "FSS1" */

/*
 * Format versions: 1 (0.4.0) wrote fixed-size records; 2 added the owner
 * role to each lease; 3 writes every item field by field (stateformat.h).
 * Files of versions 1 and 2 are still read for their queues and leases (a
 * version 1 lease comes back without an owner, see FsLease.owner); their
 * other sections are skipped.  Any other version is ignored.
 */
#define FS_STATE_VERSION	3
#define FS_STATE_VERSION_OWNERS		2
#define FS_STATE_VERSION_NO_OWNERS	1

/* Refuse to read files larger than this (a sanity bound, not a format limit). */
#define FS_STATE_MAX_BYTES	((Size) 512 * 1024 * 1024)

/* Restored times older than this are taken as "now" (a damaged file). */
#define FS_RESTORE_MAX_AGE	(INT64CONST(3660) * USECS_PER_DAY)

typedef struct FsStateHeader
{
	uint32		magic;
	uint32		version;
	uint32		kind;			/* FsStateKind */
	uint32		tenant_size;	/* versions 1 and 2: the records' sizes; */
	uint32		lease_size;		/* 0 since version 3 */
	uint32		stats_size;
	TimestampTz saved_at;
	int64		next_lease_id;
} FsStateHeader;

/* A lease as version 1 wrote it: no owner. */
typedef struct FsLeaseRecordV1
{
	int64		lease_id;
	uint32		queue_index;
	char		tenant[FS_NAME_BUFLEN];
	TimestampTz acquired_at;
	TimestampTz expires_at;
} FsLeaseRecordV1;

/* A lease as version 2 wrote it: version 1's, and its owner. */
typedef struct FsLeaseRecordV2
{
	FsLeaseRecordV1 v1;
	Oid			owner;
} FsLeaseRecordV2;

StaticAssertDecl(sizeof(FsLeaseRecordV1) == 96 && sizeof(FsLeaseRecordV2) == 104,
				 "the lease records of versions 1 and 2 keep the sizes those versions wrote");

/* The size of a lease record in a file of this version (0: field by field). */
static inline uint32
fs_lease_record_size(uint32 version)
{
	return version == FS_STATE_VERSION_NO_OWNERS ? sizeof(FsLeaseRecordV1) :
		version == FS_STATE_VERSION_OWNERS ? sizeof(FsLeaseRecordV2) : 0;
}

/* ----------------------------------------------------------------
 * Writing
 * ----------------------------------------------------------------
 */

typedef struct FsSaveContext
{
	StringInfo	buf;
	uint64		count;			/* items written */
	uint32		nqueues;		/* queues written; newer ones are skipped */
} FsSaveContext;

/*
 * fs_tenant_foreach() visitor of a save: write the tenant's item, within the
 * room made for it.
 */
static void
fs_save_tenant(const FsTenant *tenant, void *arg)
{
	FsSaveContext *ctx = (FsSaveContext *) arg;
	StringInfo	buf = ctx->buf;

	/*
	 * Queues are written in id order, so a queue's index is its id.  A scan
	 * a batch at a time may meet more entries than the table holds at once
	 * (some come and go meanwhile): past the room made for them, they are
	 * left out rather than allocated for under the locks.
	 */
	if (tenant->key.queue_id >= ctx->nqueues || !fs_state_item_fits(buf, FS_TENANT_ITEM_MAX))
		return;
	fs_state_write_tenant(buf, tenant);
	ctx->count++;
}

/* fs_lease_foreach() visitor of a save: one lease item, within the room made for them. */
static void
fs_save_lease(const FsLeaseInfo *lease, void *arg)
{
	FsSaveContext *ctx = (FsSaveContext *) arg;
	StringInfo	buf = ctx->buf;

	/* As for tenants: never past the room made for them. */
	if (lease->tenant_key.queue_id >= ctx->nqueues || !fs_state_item_fits(buf, FS_LEASE_ITEM_MAX))
		return;
	fs_state_write_lease(buf, lease);
	ctx->count++;
}

/*
 * The queues section, in id order: a queue's index in the file is its id.
 * Copied out under the lock into room made before it (queues are only ever
 * added: those counted first are there), written after.  Returns how many.
 */
static int
fs_save_queues(StringInfo buf)
{
	int			nqueues = Min(fs_shared->num_queues, fs_max_queues);
	FsQueueKey *queue_keys = palloc(sizeof(FsQueueKey) * Max(nqueues, 1));
	Size		at;
	int			i;

	LWLockAcquire(fs_shared->queues_lock, LW_SHARED);
	for (i = 0; i < nqueues; i++)
		queue_keys[i] = fs_shared->queues[i]->key;
	LWLockRelease(fs_shared->queues_lock);
	at = fs_state_section_begin(buf, FS_SECTION_QUEUES, 0);
	for (i = 0; i < nqueues; i++)
		fs_state_write_queue(buf, &queue_keys[i]);
	fs_state_section_end(buf, at, nqueues);
	pfree(queue_keys);
	return nqueues;
}

/*
 * The tenants and the server-wide counters (a clean shutdown's file only:
 * after a crash they start afresh).
 */
static void
fs_save_tenants(FsSaveContext *ctx)
{
	StringInfo	buf = ctx->buf;
	FsGlobalStats stats;
	Size		at;
	Size		room;

	ctx->count = 0;
	at = fs_state_section_begin(buf, FS_SECTION_TENANTS, 0);
	/* Room for every entry now: the visitor runs under the table's locks. */
	room = Min((Size) fs_max_tenants * FS_TENANT_ITEM_MAX, MaxAllocSize - (Size) buf->len - 1);
	enlargeStringInfo(buf, (int) room);
	fs_tenant_foreach(fs_save_tenant, ctx);
	fs_state_section_end(buf, at, ctx->count);

	SpinLockAcquire(&fs_shared->stats_mutex);
	memcpy(&stats, &fs_shared->stats, sizeof(stats));
	SpinLockRelease(&fs_shared->stats_mutex);
	at = fs_state_section_begin(buf, FS_SECTION_STATS, 0);
	fs_state_write_stats(buf, &stats);
	fs_state_section_end(buf, at, 1);
}

/* The leases (tenants a lease names were created before it: queues suffice). */
static void
fs_save_leases(FsSaveContext *ctx)
{
	StringInfo	buf = ctx->buf;
	Size		at;
	Size		room;

	ctx->count = 0;
	at = fs_state_section_begin(buf, FS_SECTION_LEASES, 0);
	/* As for tenants: no allocation while the lease locks are held. */
	room = Min((Size) fs_max_leases * FS_LEASE_ITEM_MAX, MaxAllocSize - (Size) buf->len - 1);
	enlargeStringInfo(buf, (int) room);
	fs_lease_foreach(fs_save_lease, ctx);
	fs_state_section_end(buf, at, ctx->count);
}

/*
 * Write `buf` to the state file: written, flushed and renamed into place
 * with no lock held.  Each writer has a temporary file of its own, and the
 * rename is atomic, so writers that meet leave the file of one of them,
 * whole.  Failures are reported at `elevel`; returns whether it worked.
 */
static bool
fs_save_write(const StringInfo buf, int elevel)
{
	char		tmpfile[MAXPGPATH];
	FILE	   *file;

	snprintf(tmpfile, sizeof(tmpfile), "%s.%d.tmp", FS_STATE_FILE, MyProcPid);
	file = AllocateFile(tmpfile, PG_BINARY_W);
	if (file == NULL)
	{
		ereport(elevel,
				(errcode_for_file_access(),
				 errmsg("could not create fairshare state file \"%s\": %m", tmpfile)));
		return false;
	}
	if (fwrite(buf->data, 1, buf->len, file) != (size_t) buf->len || fflush(file) != 0)
	{
		ereport(elevel,
				(errcode_for_file_access(),
				 errmsg("could not write fairshare state file \"%s\": %m", tmpfile)));
		FreeFile(file);
		unlink(tmpfile);
		return false;
	}
	if (FreeFile(file) != 0)
	{
		ereport(elevel,
				(errcode_for_file_access(),
				 errmsg("could not close fairshare state file \"%s\": %m", tmpfile)));
		unlink(tmpfile);
		return false;
	}
	if (durable_rename(tmpfile, FS_STATE_FILE, elevel) != 0)
	{
		unlink(tmpfile);
		return false;
	}
	return true;
}

/*
 * Write the state file.  Returns true on success; failures are reported at
 * `elevel` (LOG in the postmaster, WARNING or ERROR in a backend) and leave
 * the previous file in place.
 */
bool
fs_statefile_save(FsStateKind kind, int elevel)
{
	MemoryContext context;
	MemoryContext old;
	StringInfoData buf;
	FsStateHeader header;
	FsSaveContext ctx;
	pg_crc32c	crc;
	bool		ok;

	if (fs_shared == NULL)
		return false;

	context = AllocSetContextCreate(CurrentMemoryContext,
									"fairshare state file",
									ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(context);
	initStringInfo(&buf);

	memset(&header, 0, sizeof(header));
	header.magic = FS_STATE_MAGIC;
	header.version = FS_STATE_VERSION;
	header.kind = kind;
	header.saved_at = GetCurrentTimestamp();
	header.next_lease_id = (int64) pg_atomic_read_u64(&fs_shared->next_lease_id);
	appendBinaryStringInfo(&buf, (char *) &header, sizeof(header));

	ctx.buf = &buf;
	ctx.nqueues = (uint32) fs_save_queues(&buf);
	if (kind == FS_STATE_CLEAN)
		fs_save_tenants(&ctx);
	fs_save_leases(&ctx);
	fs_fairqueue_save_state(&buf, ctx.nqueues, kind == FS_STATE_CLEAN);
	fs_state_section_begin(&buf, FS_SECTION_END, 0);

	INIT_CRC32C(crc);
	COMP_CRC32C(crc, buf.data, buf.len);
	FIN_CRC32C(crc);
	appendBinaryStringInfo(&buf, (char *) &crc, sizeof(crc));

	ok = fs_save_write(&buf, elevel);

	MemoryContextSwitchTo(old);
	MemoryContextDelete(context);
	return ok;
}

/* ----------------------------------------------------------------
 * Reading (postmaster only, before any backend exists)
 * ----------------------------------------------------------------
 */

typedef struct FsReader
{
	const char *data;
	Size		len;
	Size		pos;
} FsReader;

/* Read `n` bytes of the file into `dst`; false past its end. */
static bool
fs_read(FsReader *r, void *dst, Size n)
{
	if (n > r->len - r->pos)
		return false;
	memcpy(dst, r->data + r->pos, n);
	r->pos += n;
	return true;
}

/* Make a name read from the file safe to use: terminated, non-empty. */
static bool
fs_name_ok(char *name)
{
	name[FS_NAME_MAXLEN] = '\0';
	return name[0] != '\0';
}

/*
 * Read the whole state file into memory; NULL (logged) when there is none,
 * or it cannot be read, or its size is not plausible.
 */
static char *
fs_statefile_read_all(Size *len)
{
	struct stat st;
	FILE	   *file;
	char	   *data;

	if (stat(FS_STATE_FILE, &st) != 0)
	{
		if (errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not stat fairshare state file \"%s\": %m", FS_STATE_FILE)));
		return NULL;
	}
	if (st.st_size < (off_t) (sizeof(FsStateHeader) + sizeof(pg_crc32c)) ||
		(Size) st.st_size > FS_STATE_MAX_BYTES)
	{
		ereport(LOG,
				(errmsg("ignoring fairshare state file \"%s\": its size of %lld bytes is not plausible",
						FS_STATE_FILE, (long long) st.st_size)));
		return NULL;
	}
	file = AllocateFile(FS_STATE_FILE, PG_BINARY_R);
	if (file == NULL)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not open fairshare state file \"%s\": %m", FS_STATE_FILE)));
		return NULL;
	}
	data = palloc_extended(st.st_size, MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM);
	if (data == NULL || fread(data, 1, st.st_size, file) != (size_t) st.st_size)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not read fairshare state file \"%s\": %m", FS_STATE_FILE)));
		FreeFile(file);
		return NULL;
	}
	FreeFile(file);
	*len = st.st_size;
	return data;
}

/*
 * How many bytes the items of `section` take, from r->pos on: fixed-size
 * items (versions 1 and 2) or field-by-field ones, each of which must fit.
 * False when they do not fit in the file.
 */
static bool
fs_section_bytes(const FsReader *r, const FsSectionHeader *section, Size *bytes)
{
	Size		avail = r->len - r->pos;
	Size		pos = 0;
	uint64		i;

	if (section->item_size > 0)
	{
		if (section->count > avail / section->item_size)
			return false;
		*bytes = section->count * section->item_size;
		return true;
	}
	for (i = 0; i < section->count; i++)
	{
		FsStateItem item;

		if (!fs_state_item_next(r->data + r->pos, avail, &pos, &item))
			return false;
	}
	*bytes = pos;
	return true;
}

/*
 * Check the whole file before applying anything: header, CRC, and that the
 * sections add up to exactly the file's length.
 */
static bool
fs_statefile_check(const char *data, Size len, FsStateHeader *header)
{
	FsReader	r = {data, len - sizeof(pg_crc32c), 0};
	pg_crc32c	crc;
	pg_crc32c	stored;
	FsSectionHeader section;

	memcpy(&stored, data + len - sizeof(pg_crc32c), sizeof(stored));
	INIT_CRC32C(crc);
	COMP_CRC32C(crc, data, len - sizeof(pg_crc32c));
	FIN_CRC32C(crc);

	if (!fs_read(&r, header, sizeof(*header)) ||
		header->magic != FS_STATE_MAGIC)
		return false;
	/* Sections this build cannot read are skipped, not the file. */
	if ((header->version != FS_STATE_VERSION &&
		 header->version != FS_STATE_VERSION_OWNERS &&
		 header->version != FS_STATE_VERSION_NO_OWNERS) ||
		header->lease_size != fs_lease_record_size(header->version))
	{
		ereport(LOG,
				(errmsg("ignoring fairshare state file \"%s\": it was written by another version of fairshare",
						FS_STATE_FILE)));
		return false;
	}
	if (!EQ_CRC32C(crc, stored))
		return false;
	if (header->kind != FS_STATE_CLEAN && header->kind != FS_STATE_RUNNING)
		return false;
	if (header->next_lease_id <= 0 || header->next_lease_id > FS_LEASE_ID_MAX)
	{
		ereport(LOG,
				(errmsg("ignoring fairshare state file \"%s\": its next lease id " INT64_FORMAT " is out of range",
						FS_STATE_FILE, header->next_lease_id)));
		return false;
	}

	for (;;)
	{
		Size		bytes;

		if (!fs_read(&r, &section, sizeof(section)))
			return false;
		if (section.tag == FS_SECTION_END)
			return r.pos == r.len;
		if (!fs_section_bytes(&r, &section, &bytes))
			return false;
		r.pos += bytes;
	}
}

/*
 * The queue of index `i` in the file, created on first use: queues come back
 * only if a restored tenant or lease still belongs to them, so queues nobody
 * uses any more (or whose database is gone) do not take room forever.
 */
static FsQueue *
fs_restored_queue(FsQueue **queues, FsQueueKey *keys, uint64 nqueues, uint64 i)
{
	if (i >= nqueues)
		return NULL;
	if (queues[i] == NULL && fs_name_ok(keys[i].name))
		queues[i] = fs_queue_insert_unlocked(keys[i].dboid, keys[i].name);
	return queues[i];
}

/*
 * Restore a tenant item: its counters, balance and last limits come back
 * (slots come from leases; backlogs are recounted from the tables on first
 * use).  False when it names no queue or tenant, or the table is full.
 */
static bool
fs_restore_tenant(FsStateItem *item, FsQueue **queues, FsQueueKey *queue_keys,
				  uint64 nqueues, TimestampTz now)
{
	FsTenant	record;
	FsTenantKey key;
	FsTenant   *entry;
	FsQueue    *queue;
	uint32		queue_index;

	if (!fs_state_read_tenant(item, &record, &queue_index, now))
		return false;
	queue = fs_restored_queue(queues, queue_keys, nqueues, queue_index);
	if (queue == NULL)
		return false;
	fs_tenant_key_init(&key, queue->queue_id, record.key.tenant);
	entry = fs_tenant_insert_unlocked(&key);
	if (entry == NULL)
		return false;
	fs_tenant_restore(entry, &record, now - FS_RESTORE_MAX_AGE, now);
	return true;
}

/* What applying a state file knows and has done so far. */
typedef struct FsApply
{
	const FsStateHeader *header;
	bool		clean;			/* from a clean shutdown */
	TimestampTz now;
	FsQueue   **queues;			/* by index in the file, created on use */
	FsQueueKey *queue_keys;
	uint64		nqueues;
	uint64		tenants;
	uint64		tenants_dropped;
	uint64		leases;
	uint64		leases_dropped;
	uint64		leases_expired;
} FsApply;

/* The queues section: the queues' keys, by index (created when used). */
static void
fs_apply_queues(FsApply *a, FsReader *r, const FsSectionHeader *section, Size bytes)
{
	FsStateItem item;
	Size		pos = 0;
	uint64		i;

	if (a->queues != NULL ||
		(section->item_size != 0 && section->item_size != sizeof(FsQueueKey)))
		return;
	a->nqueues = section->count;
	a->queues = palloc0(sizeof(FsQueue *) * Max(a->nqueues, 1));
	a->queue_keys = palloc0(sizeof(FsQueueKey) * Max(a->nqueues, 1));
	for (i = 0; i < a->nqueues; i++)
	{
		if (section->item_size != 0)
			fs_read(r, &a->queue_keys[i], sizeof(FsQueueKey));
		else if (fs_state_item_next(r->data + r->pos, bytes, &pos, &item))
			fs_state_read_queue(&item, &a->queue_keys[i]);
	}
}

/* The tenants section (after a clean shutdown only). */
static void
fs_apply_tenants(FsApply *a, FsReader *r, const FsSectionHeader *section, Size bytes)
{
	FsStateItem item;
	Size		pos = 0;
	uint64		i;

	if (!a->clean || section->item_size != 0)
		return;
	for (i = 0; i < section->count; i++)
	{
		if (fs_state_item_next(r->data + r->pos, bytes, &pos, &item) &&
			fs_restore_tenant(&item, a->queues, a->queue_keys, a->nqueues, a->now))
			a->tenants++;
		else
			a->tenants_dropped++;
	}
}

/*
 * Restore one lease read from the file (live after a clean shutdown, an
 * orphan after a crash), if it is still valid; counted in *a either way.
 */
static void
fs_apply_lease(FsApply *a, FsLeaseRecord *record)
{
	FsQueue    *queue;
	FsTenantKey key;
	FsTenant   *entry;

	if (record->expires_at <= a->now)
	{
		a->leases_expired++;
		return;
	}
	queue = fs_restored_queue(a->queues, a->queue_keys, a->nqueues, record->queue_index);
	/* Every id was handed out before the file was written. */
	if (queue == NULL || !fs_name_ok(record->tenant) || record->lease_id <= 0 ||
		record->lease_id >= a->header->next_lease_id ||
		record->acquired_at > record->expires_at)
	{
		a->leases_dropped++;
		return;
	}
	/* No lease is longer than an acquire or renew can make it. */
	record->expires_at = Min(record->expires_at, a->now + FS_MAX_LEASE_USECS);
	record->acquired_at = Min(record->acquired_at, a->now);
	fs_tenant_key_init(&key, queue->queue_id, record->tenant);
	entry = fs_tenant_insert_unlocked(&key);
	if (entry == NULL ||
		!fs_lease_restore(record->lease_id, entry, record->owner, record->acquired_at,
						  record->expires_at, !a->clean))
	{
		a->leases_dropped++;
		return;
	}
	a->leases++;
}

/* The leases section: field by field, or the raw records of versions 1 and 2. */
static void
fs_apply_leases(FsApply *a, FsReader *r, const FsSectionHeader *section, Size bytes)
{
	FsStateItem item;
	Size		pos = 0;
	uint64		i;

	if (section->item_size != fs_lease_record_size(a->header->version))
		return;
	for (i = 0; i < section->count; i++)
	{
		FsLeaseRecord record;

		if (section->item_size == 0)
		{
			if (!fs_state_item_next(r->data + r->pos, bytes, &pos, &item) ||
				!fs_state_read_lease(&item, &record))
			{
				a->leases_dropped++;
				continue;
			}
		}
		else
		{
			/* Version 1 or 2: a version 1 lease has no owner. */
			FsLeaseRecordV2 v2 = {{0}, InvalidOid};

			fs_read(r, &v2, section->item_size);
			record.lease_id = v2.v1.lease_id;
			record.queue_index = v2.v1.queue_index;
			memcpy(record.tenant, v2.v1.tenant, FS_NAME_BUFLEN);
			record.acquired_at = v2.v1.acquired_at;
			record.expires_at = v2.v1.expires_at;
			record.owner = v2.owner;
		}
		fs_apply_lease(a, &record);
	}
}

/*
 * Apply a checked state file to shared memory, in the postmaster before any
 * backend exists: queues as tenants and leases need them, tenants (from a
 * clean shutdown only), leases (as orphans after a crash), counters, and
 * fair dequeue's sections.
 */
static void
fs_statefile_apply(const char *data, Size len, const FsStateHeader *header)
{
	FsReader	r = {data, len - sizeof(pg_crc32c), sizeof(FsStateHeader)};
	FsSectionHeader section;
	FsApply		a;

	memset(&a, 0, sizeof(a));
	a.header = header;
	a.clean = header->kind == FS_STATE_CLEAN;
	a.now = GetCurrentTimestamp();

	while (fs_read(&r, &section, sizeof(section)) && section.tag != FS_SECTION_END)
	{
		Size		bytes;
		Size		next;
		Size		pos = 0;
		FsStateItem item;

		if (!fs_section_bytes(&r, &section, &bytes))
			break;				/* cannot happen: the file was checked */
		next = r.pos + bytes;

		switch (section.tag)
		{
			case FS_SECTION_QUEUES:
				fs_apply_queues(&a, &r, &section, bytes);
				break;
			case FS_SECTION_TENANTS:
				fs_apply_tenants(&a, &r, &section, bytes);
				break;
			case FS_SECTION_LEASES:
				fs_apply_leases(&a, &r, &section, bytes);
				break;
			case FS_SECTION_STATS:
				if (a.clean && section.item_size == 0 && section.count == 1 &&
					fs_state_item_next(r.data + r.pos, bytes, &pos, &item))
				{
					fs_state_read_stats(&item, &fs_shared->stats);
					if (fs_shared->stats.reset_at > a.now ||
						fs_shared->stats.reset_at < a.now - FS_RESTORE_MAX_AGE)
						fs_shared->stats.reset_at = a.now;
				}
				break;
			case FS_SECTION_FAIRQ_QUEUES:
			case FS_SECTION_FAIRQ_CLAIMS:
				if (section.item_size == 0)
					fs_fairqueue_restore_section(section.tag, r.data + r.pos, bytes,
												 section.count, a.queues, a.nqueues, a.clean,
												 header->next_lease_id);
				break;
			default:
				break;
		}
		r.pos = next;
	}

	if (!a.clean)
		fs_shared->stats.leases_orphaned += a.leases;

	ereport(LOG,
			(errmsg("fairshare restored %s state: " UINT64_FORMAT " tenants, " UINT64_FORMAT " %s",
					a.clean ? "saved" : "crashed",
					a.tenants, a.leases, a.clean ? "leases" : "leases to re-register on renew"),
			 (a.tenants_dropped + a.leases_dropped + a.leases_expired) > 0 ?
			 errdetail(UINT64_FORMAT " tenants and " UINT64_FORMAT " leases did not fit or were invalid; "
					   UINT64_FORMAT " leases had expired.",
					   a.tenants_dropped, a.leases_dropped, a.leases_expired) : 0));
}

/*
 * At postmaster exit: save the state, if this was a clean shutdown.
 *
 * An immediate shutdown also exits with code 0, but its backends were
 * killed wherever they were, perhaps holding a spinlock or an LWLock of
 * ours or in the middle of a transaction: then the shared state must not be
 * read, let alone trusted.  A clean shutdown is one whose shutdown
 * checkpoint completed, which pg_control records; otherwise the file stays
 * "running" and the next start treats this one as a crash.
 */
static void
fs_statefile_shutdown(int code, Datum arg pg_attribute_unused())
{
	ControlFileData *control;
	bool		crc_ok;

	if (code != 0 || !fs_save_state)
		return;
	control = get_controlfile(DataDir, &crc_ok);
	if (!crc_ok ||
		(control->state != DB_SHUTDOWNED && control->state != DB_SHUTDOWNED_IN_RECOVERY))
	{
		ereport(LOG,
				(errmsg("fairshare did not save its state: the server did not shut down cleanly")));
		return;
	}
	fs_statefile_save(FS_STATE_CLEAN, LOG);
}

/*
 * Called in the postmaster when shared memory has just been created.
 */
void
fs_statefile_startup(void)
{
	MemoryContext context;
	MemoryContext old;
	char	   *data;
	Size		len = 0;
	FsStateHeader header;
	int64		next_id;

	Assert(!IsUnderPostmaster);

	/*
	 * Lease ids are never reused.  Start at the clock in microseconds since
	 * 2000 (above the ids of any run that issued fewer than one per
	 * microsecond), or above the file's, whichever is higher; after a crash,
	 * the file's figure is as old as its last save, so leave a margin far
	 * above what a run can issue between two saves.
	 */
	next_id = Max(GetCurrentTimestamp(), 1);
	pg_atomic_write_u64(&fs_shared->next_lease_id, next_id);
	fs_shared->start_kind = FS_START_FRESH;

	if (!fs_save_state)
		return;

	context = AllocSetContextCreate(TopMemoryContext, "fairshare restore",
									ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(context);

	data = fs_statefile_read_all(&len);
	if (data != NULL)
	{
		if (!fs_statefile_check(data, len, &header))
			ereport(LOG,
					(errmsg("ignoring fairshare state file \"%s\": it is damaged", FS_STATE_FILE),
					 errhint("fairshare starts with empty state; the file is replaced at the next save.")));
		else
		{
			int64		file_id = header.next_lease_id;

			fs_statefile_apply(data, len, &header);
			if (header.kind == FS_STATE_CLEAN)
				fs_shared->start_kind = FS_START_RESTORED;
			else
			{
				fs_shared->start_kind = FS_START_AFTER_CRASH;
				if (file_id < PG_INT64_MAX - FS_LEASE_ID_CRASH_MARGIN)
					file_id += FS_LEASE_ID_CRASH_MARGIN;
			}
			if (file_id > next_id)
				pg_atomic_write_u64(&fs_shared->next_lease_id, file_id);
		}
		/*
		 * What was read is in shared memory now.  Should the file written
		 * next fail, no stale file must be read again at the next start.
		 */
		if (unlink(FS_STATE_FILE) != 0 && errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not remove fairshare state file \"%s\": %m", FS_STATE_FILE)));
	}

	MemoryContextSwitchTo(old);
	MemoryContextDelete(context);

	/* From now on the file says "running": a crash will be recognised. */
	fs_statefile_save(FS_STATE_RUNNING, LOG);
	on_shmem_exit(fs_statefile_shutdown, (Datum) 0);
}

/*
 * fs_save_state(): write the running state file now (queues and leases),
 * as the background worker does periodically.  After a crash, the leases it
 * holds can re-register when renewed.
 */
Datum
fs_save_state_now(PG_FUNCTION_ARGS)
{
	fs_check_primary("save the fairshare state file");
	if (!fs_save_state)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("fairshare.save_state is off"),
				 errhint("Set fairshare.save_state = on to save and restore fairshare's state.")));
	PG_RETURN_BOOL(fs_statefile_save(FS_STATE_RUNNING, WARNING));
}

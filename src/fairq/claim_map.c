/*-------------------------------------------------------------------------
 *
 * claim_map.c
 *	  The claim map: which lease each claimed row holds, in shared memory,
 *	  so that a row leaving the running table releases its lease
 *	  (track.c's running-row trigger), and its part of the state
 *	  file.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "budget/budget.h"
#include "core/stateformat.h"
#include "fairq/fairqueue_int.h"
#include "slots/slots.h"

/* ----------------------------------------------------------------
 * The claim map (shared)
 * ----------------------------------------------------------------
 */

static HTAB *fs_claim_hash = NULL;
static FsScanTable fs_claim_scan;	/* its partition lists (scanlist.h) */

/*
 * The entries each partition set since the WAL writer last looked, for a
 * standby to have them too: their keys, each partition's under its lock,
 * fs_claim_wal_capacity of them per partition (more: `overflow`, and the
 * writer logs a complete snapshot).  Removals are not listed: an entry goes
 * with its lease, and a standby forgets the entries whose leases are gone
 * (fs_claim_map_sweep(true)).
 */
typedef struct FsClaimWalList
{
	int32		count;
	bool		overflow;
} FsClaimWalList;

typedef struct FsClaimWal
{
	pg_atomic_uint32 dirty;		/* some list grew since the last drain */
	FsClaimWalList lists[FS_CLAIM_PARTITIONS];
	FsClaimKey	keys[FLEXIBLE_ARRAY_MEMBER];	/* FS_CLAIM_PARTITIONS lists */
} FsClaimWal;

static FsClaimWal *fs_claim_wal = NULL;
static int32 fs_claim_wal_room = 0;	/* keys per list, set with the shared memory */

/* Keys listed per partition: its share of the map, and a margin. */
static int32
fs_claim_wal_capacity(void)
{
	return fs_max_leases / FS_CLAIM_PARTITIONS + 64;
}

/* Shared memory of the lists of changed entries. */
static Size
fs_claim_wal_size(void)
{
	return add_size(offsetof(FsClaimWal, keys),
					mul_size(mul_size(FS_CLAIM_PARTITIONS, fs_claim_wal_capacity()),
							 sizeof(FsClaimKey)));
}

/* Shared memory of the claim map: the table, its lists, its changes. */
Size
fs_claim_map_shmem_size(void)
{
	return add_size(add_size(hash_estimate_size(fs_max_leases, sizeof(FsClaimEntry)),
							 fs_scan_lists_size(FS_CLAIM_PARTITIONS)),
					fs_claim_wal_size());
}

/*
 * Create (or attach to) the claim map and its partition lists. Caller holds
 * AddinShmemInitLock.
 */
void
fs_claim_map_shmem_init(void)
{
	HASHCTL		info;
	bool		found;

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(FsClaimKey);
	info.entrysize = sizeof(FsClaimEntry);
	info.num_partitions = FS_CLAIM_PARTITIONS;
	fs_claim_hash = ShmemInitHash("fairshare claims", fs_max_leases, fs_max_leases, &info,
								  HASH_ELEM | HASH_BLOBS | HASH_PARTITION | HASH_FIXED_SIZE);
	fs_claim_scan.lists = fs_scan_lists_init("fairshare claim lists", FS_CLAIM_PARTITIONS);
	fs_claim_scan.locks = fs_fair->claim_locks;
	fs_claim_scan.nparts = FS_CLAIM_PARTITIONS;
	fs_claim_scan.link_offset = offsetof(FsClaimEntry, scan_link);
	fs_claim_wal_room = fs_claim_wal_capacity();
	fs_claim_wal = ShmemInitStruct("fairshare claim changes", fs_claim_wal_size(), &found);
	if (!found)
	{
		pg_atomic_init_u32(&fs_claim_wal->dirty, 0);
		memset(fs_claim_wal->lists, 0, sizeof(fs_claim_wal->lists));
	}
}

/* The lock of the claim-map partition of `hashvalue`. */
static inline LWLock *
fs_claim_lock(uint32 hashvalue)
{
	return &fs_fair->claim_locks[hashvalue % FS_CLAIM_PARTITIONS].lock;
}

/*
 * ONE PLACE WHERE THE CLAIM MAP CHANGES: an entry is set by
 * fs_claim_map_set() and removed by fs_claim_map_delete(), each with the
 * entry's partition lock held EXCLUSIVE (or in the postmaster, restoring),
 * and each ends in fs_claim_map_changed(), the one point that sees every
 * change of the map.
 */

/*
 * The end of every change of the claim map.  An entry set is listed for the
 * WAL writer (not when restoring in the postmaster: the writer logs a
 * complete snapshot when it starts).  On a standby the replay lists them
 * too, and nobody drains the lists until a promotion: they fill, note an
 * overflow, and the new writer's first snapshot covers them anyway.  The
 * debug build checks the entry.
 */
static inline void
fs_claim_map_changed(const FsClaimEntry *entry, uint32 hashvalue)
{
	FS_INVARIANT(entry == NULL || entry->lease_id != 0);
	if (entry != NULL && IsUnderPostmaster)
	{
		int			p = hashvalue % FS_CLAIM_PARTITIONS;
		FsClaimWalList *list = &fs_claim_wal->lists[p];

		if (list->count < fs_claim_wal_room)
			fs_claim_wal->keys[(Size) p * fs_claim_wal_room + list->count++] = entry->key;
		else
			list->overflow = true;
		if (pg_atomic_read_u32(&fs_claim_wal->dirty) == 0)
			pg_atomic_write_u32(&fs_claim_wal->dirty, 1);
	}
}

/*
 * Set the entry `entry` (just looked up with HASH_ENTER_NULL: `found` says
 * whether it was there) to map its row to `lease_id`.
 */
static void
fs_claim_map_set(FsClaimEntry *entry, uint32 hashvalue, bool found, int64 lease_id,
				 float8 est_cost, const char *tenant)
{
	if (!found)
		fs_scan_list_add(&fs_claim_scan, hashvalue % FS_CLAIM_PARTITIONS, &entry->scan_link);
	entry->lease_id = lease_id;
	entry->est_cost = est_cost;
	strlcpy(entry->tenant, tenant, FS_NAME_BUFLEN);
	fs_claim_map_changed(entry, hashvalue);
}

/* Remove an entry from the claim map (and from its partition's list). */
static void
fs_claim_map_delete(FsClaimEntry *entry)
{
	FsClaimKey	key = entry->key;

	fs_scan_list_remove(&entry->scan_link);
	hash_search(fs_claim_hash, &key, HASH_REMOVE, NULL);
	fs_claim_map_changed(NULL, 0);
}

/*
 * A row key's identity: integers as int64, uuids and short text as their
 * bytes, longer text as a 128-bit hash of its bytes.  With `tenant` (a
 * queue on a table Citus distributes, whose keys are unique only with the
 * tenant), a 128-bit hash of the tenant's name and the key's bytes.
 */
void
fs_claim_key_make(FsClaimKey *key, uint32 queue_id, Datum value, Oid type, int16 typlen,
				  bool typbyval, const char *tenant)
{
	const char *data;
	Size		len;
	int64		v;

	memset(key, 0, sizeof(*key));
	key->queue_id = queue_id;
	if (typbyval)
	{
		v = type == INT2OID ? DatumGetInt16(value) :
			type == INT4OID ? DatumGetInt32(value) : DatumGetInt64(value);
		data = (const char *) &v;
		len = sizeof(v);
	}
	else if (typlen > 0)
	{
		data = DatumGetPointer(value);
		len = typlen;
	}
	else
	{
		text	   *t = DatumGetTextPP(value);

		data = VARDATA_ANY(t);
		len = VARSIZE_ANY_EXHDR(t);
	}
	key->len = (uint16) Min(len, PG_UINT16_MAX);
	if (tenant == NULL && len <= FS_KEY_INLINE)
		memcpy(key->bytes, data, len);
	else
	{
		uint64		h1 = hash_bytes_extended((const unsigned char *) data, (int) len, 0x66616972);
		uint64		h2 = hash_bytes_extended((const unsigned char *) data, (int) len, 0x73686172);

		if (tenant != NULL)
		{
			Size		tlen = strlen(tenant);

			h1 = hash_combine64(h1, hash_bytes_extended((const unsigned char *) tenant, (int) tlen,
														0x74656e61));
			h2 = hash_combine64(h2, hash_bytes_extended((const unsigned char *) tenant, (int) tlen,
														0x6e747321));
		}
		key->hashed = 1;
		memcpy(key->bytes, &h1, sizeof(h1));
		memcpy(key->bytes + sizeof(h1), &h2, sizeof(h2));
	}
}

/*
 * Map a claimed row's key to its lease (and the cost charged for it). False
 * when the map is full: the lease is then released only by its holder or its
 * expiry.
 */
bool
fs_claim_map_insert(const FsClaimKey *key, int64 lease_id, float8 est_cost, const char *tenant)
{
	uint32		hashvalue = get_hash_value(fs_claim_hash, key);
	LWLock	   *lock = fs_claim_lock(hashvalue);
	FsClaimEntry *entry;
	bool		found;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	entry = hash_search_with_hash_value(fs_claim_hash, key, hashvalue, HASH_ENTER_NULL, &found);
	if (entry != NULL)
		fs_claim_map_set(entry, hashvalue, found, lease_id, est_cost, tenant);
	LWLockRelease(lock);
	return entry != NULL;
}

/* Copy the claim-map entry of `key`, if there is one. */
bool
fs_claim_map_find(const FsClaimKey *key, FsClaimEntry *copy)
{
	uint32		hashvalue = get_hash_value(fs_claim_hash, key);
	LWLock	   *lock = fs_claim_lock(hashvalue);
	FsClaimEntry *entry;

	LWLockAcquire(lock, LW_SHARED);
	entry = hash_search_with_hash_value(fs_claim_hash, key, hashvalue, HASH_FIND, NULL);
	if (entry != NULL)
		*copy = *entry;
	LWLockRelease(lock);
	return entry != NULL;
}

/* Remove the entry of `key` if it still maps to `lease_id`. */
void
fs_claim_map_remove(const FsClaimKey *key, int64 lease_id)
{
	uint32		hashvalue = get_hash_value(fs_claim_hash, key);
	LWLock	   *lock = fs_claim_lock(hashvalue);
	FsClaimEntry *entry;

	LWLockAcquire(lock, LW_EXCLUSIVE);
	entry = hash_search_with_hash_value(fs_claim_hash, key, hashvalue, HASH_FIND, NULL);
	if (entry != NULL && entry->lease_id == lease_id)
		fs_claim_map_delete(entry);
	LWLockRelease(lock);
}

/*
 * Visit every entry of the claim map a batch at a time (fs_scan_table():
 * one partition lock held for one batch).  An entry that exists throughout
 * is visited once; one added or removed meanwhile may or may not be.  The
 * visitor may remove the entry it is given (fs_claim_map_delete()).
 */
static void
fs_claim_map_scan(fs_scan_visitor visitor, void *arg)
{
	fs_scan_table(&fs_claim_scan, visitor, arg);
}

/* A scan's copies of the entries of one queue (or of the first queues). */
typedef struct FsClaimCopies
{
	uint32		queue_id;		/* this queue's entries ... */
	uint32		below;			/* ... or, if nonzero, those of queues below it */
	FsClaimEntry *entries;		/* room for fairshare.max_leases */
	uint64		count;
} FsClaimCopies;

/*
 * fs_claim_map_scan() visitor: copy the entries of the wanted queue(s),
 * within the room made.
 */
static void
fs_claim_copy_visit(void *hash_entry, void *arg)
{
	FsClaimEntry *entry = (FsClaimEntry *) hash_entry;
	FsClaimCopies *copies = (FsClaimCopies *) arg;
	bool		wanted = copies->below != 0 ? entry->key.queue_id < copies->below :
		entry->key.queue_id == copies->queue_id;

	if (wanted && copies->count < (uint64) fs_max_leases)
		copies->entries[copies->count++] = *entry;
}

/* Copies of the entries of one queue (allocated before the scan). */
FsClaimEntry *
fs_claim_map_collect(uint32 queue_id, int *count)
{
	FsClaimCopies copies;

	copies.queue_id = queue_id;
	copies.below = 0;
	copies.entries = palloc_extended(sizeof(FsClaimEntry) * fs_max_leases, MCXT_ALLOC_HUGE);
	copies.count = 0;
	fs_claim_map_scan(fs_claim_copy_visit, &copies);
	*count = (int) copies.count;
	return copies.entries;
}

/*
 * A queue is unregistered (explicitly, or its table dropped) in this
 * transaction: the leases of its claimed rows are released with it, as
 * fs_release_slot() would (freed at commit, kept if the transaction rolls
 * back), for no row of it can leave a running table any more.  Its
 * claim-map entries go at commit (fs_claim_map_remove_queue()).
 */
void
fs_claim_map_release_queue(uint32 queue_id)
{
	FsClaimEntry *entries;
	TimestampTz now = fs_now();
	int			n;

	entries = fs_claim_map_collect(queue_id, &n);
	for (int k = 0; k < n; k++)
	{
		int64		held;

		(void) fs_slot_release(entries[k].lease_id, now, &held);
	}
	pfree(entries);
}

/* fs_claim_map_scan() visitor: remove the entries of one queue. */
static void
fs_claim_remove_visit(void *hash_entry, void *arg)
{
	FsClaimEntry *entry = (FsClaimEntry *) hash_entry;

	if (entry->key.queue_id == *(uint32 *) arg)
		fs_claim_map_delete(entry);
}

/* Remove every claim-map entry of a queue (its registration changed). */
void
fs_claim_map_remove_queue(uint32 queue_id)
{
	fs_claim_map_scan(fs_claim_remove_visit, &queue_id);
}

/* A scan's count of one queue's entries. */
typedef struct FsClaimCount
{
	uint32		queue_id;
	long		count;
} FsClaimCount;

/* fs_claim_map_scan() visitor: count the entries of one queue. */
static void
fs_claim_count_visit(void *hash_entry, void *arg)
{
	FsClaimCount *c = (FsClaimCount *) arg;

	if (((FsClaimEntry *) hash_entry)->key.queue_id == c->queue_id)
		c->count++;
}

/* Number of claim-map entries of a queue (a scan: for views and tests). */
long
fs_claim_map_count(uint32 queue_id)
{
	FsClaimCount c = {queue_id, 0};

	fs_claim_map_scan(fs_claim_count_visit, &c);
	return c.count;
}

typedef struct FsLiveLeases
{
	int64	   *ids;
	int			count;
	int			capacity;
} FsLiveLeases;

/* fs_lease_foreach() visitor: collect lease ids, within the room made. */
static void
fs_collect_live_lease(const FsLeaseInfo *lease, void *arg)
{
	FsLiveLeases *live = (FsLiveLeases *) arg;

	if (live->count < live->capacity)
		live->ids[live->count++] = lease->lease_id;
}

/* qsort order of int64s, ascending. */
static int
fs_int64_cmp(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return (x > y) - (x < y);
}

/*
 * Leases that the previous sweep of this process found missing, sorted.
 * A claim takes its lease id, inserts the lease, then maps the row; a sweep
 * that lists the leases between the first two steps does not see a lease
 * that is about to exist.  So an entry is forgotten only when two sweeps in
 * a row found its lease missing: the next listing sees every lease that was
 * on its way.
 */
static int64 *sweep_suspects = NULL;
static int	sweep_nsuspects = 0;

/* A claim-map sweep's state while it scans the map. */
typedef struct FsClaimSweep
{
	int64		first_new;		/* leases numbered from here on are kept */
	FsLiveLeases *live;			/* the leases listed, sorted */
	int64	   *suspects;		/* missing this time (room for max_leases) */
	int			nsuspects;
	int			removed;
	bool		at_once;		/* in WAL replay: no claim is on its way */
} FsClaimSweep;

/* fs_claim_map_scan() visitor of a sweep. */
static void
fs_claim_sweep_visit(void *hash_entry, void *arg)
{
	FsClaimEntry *entry = (FsClaimEntry *) hash_entry;
	FsClaimSweep *sweep = (FsClaimSweep *) arg;

	if (entry->lease_id >= sweep->first_new ||
		bsearch(&entry->lease_id, sweep->live->ids, sweep->live->count, sizeof(int64),
				fs_int64_cmp) != NULL)
		return;
	if (sweep->at_once ||
		(sweep_suspects != NULL &&
		 bsearch(&entry->lease_id, sweep_suspects, sweep_nsuspects, sizeof(int64),
				 fs_int64_cmp) != NULL))
	{
		fs_claim_map_delete(entry);
		sweep->removed++;
	}
	else if (sweep->nsuspects < fs_max_leases)
		sweep->suspects[sweep->nsuspects++] = entry->lease_id;
}

/*
 * Forget claim-map entries whose leases are gone (released without the row
 * leaving the running table, or expired): missing from two listings in a
 * row (see sweep_suspects), or, `at_once`, from this listing (in WAL
 * replay, where no claim runs: a standby's entries whose leases the
 * primary removed).  Returns how many.
 */
int
fs_claim_map_sweep(bool at_once)
{
	FsLiveLeases live;
	FsClaimSweep sweep;
	int			removed = 0;
	int64		first_new;
	int64	   *suspects;
	int			nsuspects = 0;

	/*
	 * Allocated before the visitor runs under the lease locks: the lease
	 * table never holds more than fairshare.max_leases, and the claim map
	 * has room for as many entries.
	 */
	live.capacity = fs_max_leases;
	live.count = 0;
	suspects = MemoryContextAllocExtended(TopMemoryContext,
										  sizeof(int64) * Max(fs_max_leases, 1),
										  MCXT_ALLOC_HUGE);

	/*
	 * A claim may take its lease after the leases are listed and map it
	 * before the map is locked: leases numbered from here on are kept.
	 */
	first_new = at_once ? PG_INT64_MAX : (int64) pg_atomic_read_u64(&fs_shared->next_lease_id);
	live.ids = palloc_extended(sizeof(int64) * Max(live.capacity, 1), MCXT_ALLOC_HUGE);
	fs_lease_foreach(fs_collect_live_lease, &live);
	qsort(live.ids, live.count, sizeof(int64), fs_int64_cmp);

	sweep.first_new = first_new;
	sweep.live = &live;
	sweep.suspects = suspects;
	sweep.nsuspects = 0;
	sweep.removed = 0;
	sweep.at_once = at_once;
	fs_claim_map_scan(fs_claim_sweep_visit, &sweep);
	removed = sweep.removed;
	nsuspects = sweep.nsuspects;
	pfree(live.ids);

	if (at_once)
	{
		pfree(suspects);
		return removed;
	}
	qsort(suspects, nsuspects, sizeof(int64), fs_int64_cmp);
	if (sweep_suspects != NULL)
		pfree(sweep_suspects);
	sweep_suspects = suspects;
	sweep_nsuspects = nsuspects;
	return removed;
}

/*
 * A claim-map entry as an item of the state file or of a WAL record, field
 * by field; its queue by its id (the queue's index in either).
 */
static void
fs_claim_item_write(StringInfo buf, const FsClaimEntry *e)
{
	Size		at = fs_state_item_begin(buf);

	fs_state_put_value(buf, FS_CLAIM_QUEUE, e->key.queue_id);
	fs_state_put_value(buf, FS_CLAIM_KEY_LEN, e->key.len);
	fs_state_put_value(buf, FS_CLAIM_KEY_HASHED, e->key.hashed);
	fs_state_put(buf, FS_CLAIM_KEY_BYTES, e->key.bytes, sizeof(e->key.bytes));
	fs_state_put_value(buf, FS_CLAIM_LEASE, e->lease_id);
	fs_state_put_value(buf, FS_CLAIM_EST_COST, e->est_cost);
	fs_state_put_name(buf, FS_CLAIM_TENANT, e->tenant);
	fs_state_item_end(buf, at);
}

/*
 * Write the claim map's entries of the first `nqueues` queues to the state
 * file's section, field by field; returns how many. The entries are copied
 * out first, a batch at a time, since writing may allocate.
 */
uint64
fs_claim_map_save(StringInfo buf, uint32 nqueues)
{
	FsClaimCopies copies;
	uint64		i;

	/* appendBinaryStringInfo may error: copy out first. */
	copies.queue_id = 0;
	copies.below = nqueues;
	copies.entries = palloc_extended(sizeof(FsClaimEntry) * fs_max_leases, MCXT_ALLOC_HUGE);
	copies.count = 0;
	if (nqueues > 0)
		fs_claim_map_scan(fs_claim_copy_visit, &copies);
	for (i = 0; i < copies.count; i++)
		fs_claim_item_write(buf, &copies.entries[i]);
	pfree(copies.entries);
	return copies.count;
}

/* A claim-map item of the state file, into `rec`; false if incomplete. */
static bool
fs_claim_map_read(FsStateItem *item, FsClaimEntry *rec)
{
	uint8		field;
	uint8		len;
	const char *value;
	int			seen = 0;

	memset(rec, 0, sizeof(*rec));
	while (fs_state_field_next(item, &field, &value, &len))
	{
		bool		ok = false;

		switch (field)
		{
			case FS_CLAIM_QUEUE:
				ok = fs_state_field_value(value, len, rec->key.queue_id);
				break;
			case FS_CLAIM_KEY_LEN:
				ok = fs_state_field_value(value, len, rec->key.len);
				break;
			case FS_CLAIM_KEY_HASHED:
				ok = fs_state_field_value(value, len, rec->key.hashed);
				break;
			case FS_CLAIM_KEY_BYTES:
				ok = fs_state_field_get(value, len, rec->key.bytes, sizeof(rec->key.bytes));
				break;
			case FS_CLAIM_LEASE:
				ok = fs_state_field_value(value, len, rec->lease_id);
				break;
			case FS_CLAIM_EST_COST:
				ok = fs_state_field_value(value, len, rec->est_cost);
				break;
			case FS_CLAIM_TENANT:
				ok = fs_state_field_name(value, len, rec->tenant, FS_NAME_BUFLEN);
				break;
			default:
				break;
		}
		if (ok)
			seen |= 1 << field;
	}
	/* A claim needs every field: it names a row of a queue and its lease. */
	if (seen != ((1 << (FS_CLAIM_TENANT + 1)) - 2))
		return false;
	/* Values as fs_claim_key_make() and a claim make them, or nothing. */
	if (rec->lease_id <= 0 || rec->key.hashed > 1 || rec->key.pad != 0 ||
		(!rec->key.hashed && rec->key.len > FS_KEY_INLINE))
		return false;
	rec->est_cost = fs_fair_clamp_cost(rec->est_cost, false);
	rec->tenant[FS_NAME_MAXLEN] = '\0';
	return true;
}

/*
 * The claim-map section of a state file (`count` items in `bytes`): in the
 * postmaster, before any backend exists (no locks).
 */
void
fs_claim_map_restore(const char *data, Size bytes, uint64 count, FsQueue **queues,
					 uint64 nqueues, int64 next_lease_id)
{
	uint64		i;
	Size		pos = 0;

	for (i = 0; i < count; i++)
	{
		FsClaimEntry rec;
		FsClaimEntry *entry;
		FsStateItem item;
		bool		found;
		uint32		hashvalue;

		if (!fs_state_item_next(data, bytes, &pos, &item))
			break;
		if (!fs_claim_map_read(&item, &rec) ||
			rec.key.queue_id >= nqueues || queues[rec.key.queue_id] == NULL ||
			rec.lease_id >= next_lease_id)
			continue;
		rec.key.queue_id = queues[rec.key.queue_id]->queue_id;
		hashvalue = get_hash_value(fs_claim_hash, &rec.key);
		entry = hash_search_with_hash_value(fs_claim_hash, &rec.key, hashvalue, HASH_ENTER_NULL,
											&found);
		if (entry != NULL && !found)
			fs_claim_map_set(entry, hashvalue, false, rec.lease_id, rec.est_cost, rec.tenant);
	}
}

/* ----------------------------------------------------------------
 * Replication through WAL (statefile/wal_writer.c and wal_redo.c)
 * ----------------------------------------------------------------
 */

/* The WAL writer's copy of the lists (its own memory, made at first use). */
static FsClaimKey *wal_keys = NULL;
static int	wal_nkeys = 0;
static int	wal_next = 0;

/*
 * Take the keys every partition listed since the last call (each list
 * copied and emptied under its lock), for fs_claim_wal_write_next().
 * Returns how many; *overflow says that some were not listed (the writer
 * then logs a complete snapshot).
 */
int
fs_claim_wal_drain(bool *overflow)
{
	int			p;

	*overflow = false;
	if (wal_keys == NULL)
		wal_keys = MemoryContextAllocExtended(TopMemoryContext,
											  sizeof(FsClaimKey) * FS_CLAIM_PARTITIONS *
											  (Size) fs_claim_wal_room,
											  MCXT_ALLOC_HUGE);
	wal_nkeys = wal_next = 0;
	if (pg_atomic_read_u32(&fs_claim_wal->dirty) == 0)
		return 0;
	pg_atomic_write_u32(&fs_claim_wal->dirty, 0);
	pg_memory_barrier();
	for (p = 0; p < FS_CLAIM_PARTITIONS; p++)
	{
		FsClaimWalList *list = &fs_claim_wal->lists[p];
		LWLock	   *lock = &fs_fair->claim_locks[p].lock;

		LWLockAcquire(lock, LW_EXCLUSIVE);
		memcpy(wal_keys + wal_nkeys, fs_claim_wal->keys + (Size) p * fs_claim_wal_room,
			   sizeof(FsClaimKey) * list->count);
		wal_nkeys += list->count;
		*overflow |= list->overflow;
		list->count = 0;
		list->overflow = false;
		LWLockRelease(lock);
	}
	return wal_nkeys;
}

/*
 * Write items of the entries drained, as they are now (an entry removed
 * since is skipped: its lease went too), until `buf` holds `limit` bytes or
 * all are written (then true).  Each partition's lock is taken once for a
 * batch of its keys, shared, and the batch is copied out before it is
 * written.  `queue_named[queue_id]` is set for each item's queue.
 */
bool
fs_claim_wal_write_next(StringInfo buf, Size limit, uint64 *count, bool *queue_named)
{
	FsClaimEntry copies[FS_SCAN_BATCH];

	while (wal_next < wal_nkeys)
	{
		uint32		part;
		LWLock	   *lock;
		int			n = 0;
		int			i;

		if ((Size) buf->len >= limit)
			return false;
		part = get_hash_value(fs_claim_hash, &wal_keys[wal_next]) % FS_CLAIM_PARTITIONS;
		lock = &fs_fair->claim_locks[part].lock;
		LWLockAcquire(lock, LW_SHARED);
		for (i = 0; i < FS_SCAN_BATCH && wal_next < wal_nkeys; i++)
		{
			uint32		hashvalue = get_hash_value(fs_claim_hash, &wal_keys[wal_next]);
			FsClaimEntry *entry;

			if (hashvalue % FS_CLAIM_PARTITIONS != part)
				break;
			entry = hash_search_with_hash_value(fs_claim_hash, &wal_keys[wal_next], hashvalue,
												HASH_FIND, NULL);
			if (entry != NULL)
				copies[n++] = *entry;
			wal_next++;
		}
		LWLockRelease(lock);
		for (i = 0; i < n; i++)
		{
			fs_claim_item_write(buf, &copies[i]);
			(*count)++;
			if (copies[i].key.queue_id < (uint32) fs_max_queues)
				queue_named[copies[i].key.queue_id] = true;
		}
	}
	return true;
}

/* What a snapshot's scan of the claim map writes into. */
typedef struct FsClaimWalScan
{
	StringInfo	buf;
	uint64	   *count;
	bool	   *queue_named;
	bool	   *lost;
	fs_scan_pause pause;
	void	   *arg;
} FsClaimWalScan;

/*
 * fs_scan_table() visitor of a snapshot (under the partition lock): the
 * entry's item, in the room the caller's pause made before the batch.
 */
static void
fs_claim_wal_visit(void *hash_entry, void *arg)
{
	FsClaimEntry *entry = (FsClaimEntry *) hash_entry;
	FsClaimWalScan *scan = (FsClaimWalScan *) arg;

	if (!fs_state_item_fits(scan->buf, FS_CLAIM_ITEM_MAX))
	{
		*scan->lost = true;
		return;
	}
	fs_claim_item_write(scan->buf, entry);
	(*scan->count)++;
	if (entry->key.queue_id < (uint32) fs_max_queues)
		scan->queue_named[entry->key.queue_id] = true;
}

/* Between two batches of a snapshot's scan: the caller's pause. */
static void
fs_claim_wal_pause(void *arg)
{
	FsClaimWalScan *scan = (FsClaimWalScan *) arg;

	scan->pause(scan->arg);
}

/*
 * A complete snapshot's part: every entry's item, a batch at a time, with
 * `pause` called between batches with no lock held (it must leave room in
 * `buf` for FS_SCAN_BATCH items of FS_CLAIM_ITEM_MAX bytes; an item that
 * finds none sets *lost).
 */
void
fs_claim_wal_write_all(StringInfo buf, uint64 *count, bool *queue_named, bool *lost,
					   fs_scan_pause pause, void *arg)
{
	FsClaimWalScan scan = {buf, count, queue_named, lost, pause, arg};

	fs_scan_table_paused(&fs_claim_scan, fs_claim_wal_visit, fs_claim_wal_pause, &scan);
}

/*
 * Replay a claim-map item of a WAL record: the entry, for the queue that
 * `queue_of` gives for the record's queue index.  Removals are not logged
 * (an entry goes with its lease), so a standby's map fills with entries of
 * leases gone: when it is full, the entries whose leases are gone are
 * forgotten (at most once a second) and the insert is tried again.  Such
 * a sweep may also forget an entry whose lease has not been replayed yet
 * (logged in the next cycle): that row's lease then ends at its expiry.
 * False when the entry could not be kept.
 */
bool
fs_claim_wal_apply(FsStateItem *item, fs_queue_of_index queue_of, void *arg)
{
	static TimestampTz swept_at = 0;
	FsClaimEntry rec;
	FsQueue    *queue;
	TimestampTz now;

	if (!fs_claim_map_read(item, &rec) || (queue = queue_of(rec.key.queue_id, arg)) == NULL)
		return true;
	rec.key.queue_id = queue->queue_id;
	if (fs_claim_map_insert(&rec.key, rec.lease_id, rec.est_cost, rec.tenant))
		return true;
	now = GetCurrentTimestamp();
	if (now - swept_at < USECS_PER_SEC)
		return false;
	swept_at = now;
	(void) fs_claim_map_sweep(true);
	return fs_claim_map_insert(&rec.key, rec.lease_id, rec.est_cost, rec.tenant);
}

/* WAL replay: forget the entries whose leases are gone (no claim runs). */
void
fs_claim_wal_sweep(void)
{
	(void) fs_claim_map_sweep(true);
}

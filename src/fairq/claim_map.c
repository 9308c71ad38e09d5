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

/* Shared memory of the claim map: the table and its lists. */
Size
fs_claim_map_shmem_size(void)
{
	return add_size(hash_estimate_size(fs_max_leases, sizeof(FsClaimEntry)),
					fs_scan_lists_size(FS_CLAIM_PARTITIONS));
}

/*
 * Create (or attach to) the claim map and its partition lists. Caller holds
 * AddinShmemInitLock.
 */
void
fs_claim_map_shmem_init(void)
{
	HASHCTL		info;

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

/* The end of every change of the claim map.  The debug build checks it. */
static inline void
fs_claim_map_changed(const FsClaimEntry *entry)
{
	(void) entry;
	FS_INVARIANT(entry == NULL || entry->lease_id != 0);
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
	fs_claim_map_changed(entry);
}

/* Remove an entry from the claim map (and from its partition's list). */
static void
fs_claim_map_delete(FsClaimEntry *entry)
{
	FsClaimKey	key = entry->key;

	fs_scan_list_remove(&entry->scan_link);
	hash_search(fs_claim_hash, &key, HASH_REMOVE, NULL);
	fs_claim_map_changed(NULL);
}

/*
 * A row key's identity: integers as int64, uuids and short text as their
 * bytes, longer text as a 128-bit hash of its bytes.
 */
void
fs_claim_key_make(FsClaimKey *key, uint32 queue_id, Datum value, Oid type, int16 typlen,
				  bool typbyval)
{
	const char *data;
	Size		len;

	memset(key, 0, sizeof(*key));
	key->queue_id = queue_id;
	if (typbyval)
	{
		int64		v = type == INT2OID ? DatumGetInt16(value) :
			type == INT4OID ? DatumGetInt32(value) : DatumGetInt64(value);

		key->len = sizeof(v);
		memcpy(key->bytes, &v, sizeof(v));
		return;
	}
	if (typlen > 0)
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
	if (len <= FS_KEY_INLINE)
		memcpy(key->bytes, data, len);
	else
	{
		uint64		h1 = hash_bytes_extended((const unsigned char *) data, (int) len, 0x66616972);
		uint64		h2 = hash_bytes_extended((const unsigned char *) data, (int) len, 0x73686172);

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
	if (sweep_suspects != NULL &&
		bsearch(&entry->lease_id, sweep_suspects, sweep_nsuspects, sizeof(int64),
				fs_int64_cmp) != NULL)
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
 * row (see sweep_suspects).  Returns how many.
 */
int
fs_claim_map_sweep(void)
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
	first_new = (int64) pg_atomic_read_u64(&fs_shared->next_lease_id);
	live.ids = palloc_extended(sizeof(int64) * Max(live.capacity, 1), MCXT_ALLOC_HUGE);
	fs_lease_foreach(fs_collect_live_lease, &live);
	qsort(live.ids, live.count, sizeof(int64), fs_int64_cmp);

	sweep.first_new = first_new;
	sweep.live = &live;
	sweep.suspects = suspects;
	sweep.nsuspects = 0;
	sweep.removed = 0;
	fs_claim_map_scan(fs_claim_sweep_visit, &sweep);
	removed = sweep.removed;
	nsuspects = sweep.nsuspects;
	pfree(live.ids);

	qsort(suspects, nsuspects, sizeof(int64), fs_int64_cmp);
	if (sweep_suspects != NULL)
		pfree(sweep_suspects);
	sweep_suspects = suspects;
	sweep_nsuspects = nsuspects;
	return removed;
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
	{
		const FsClaimEntry *e = &copies.entries[i];
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
	return seen == ((1 << (FS_CLAIM_TENANT + 1)) - 2);
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
			rec.key.queue_id >= nqueues || queues[rec.key.queue_id] == NULL)
			continue;
		/* Values as fs_claim_key_make() and a claim make them, or nothing. */
		if (rec.lease_id <= 0 || rec.lease_id >= next_lease_id || rec.key.hashed > 1 ||
			rec.key.pad != 0 || (!rec.key.hashed && rec.key.len > FS_KEY_INLINE))
			continue;
		rec.est_cost = fs_fair_clamp_cost(rec.est_cost, false);
		rec.key.queue_id = queues[rec.key.queue_id]->queue_id;
		rec.tenant[FS_NAME_MAXLEN] = '\0';
		hashvalue = get_hash_value(fs_claim_hash, &rec.key);
		entry = hash_search_with_hash_value(fs_claim_hash, &rec.key, hashvalue, HASH_ENTER_NULL,
											&found);
		if (entry != NULL && !found)
			fs_claim_map_set(entry, hashvalue, false, rec.lease_id, rec.est_cost, rec.tenant);
	}
}

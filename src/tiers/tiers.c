/*-------------------------------------------------------------------------
 *
 * tiers.c
 *	  Greedy-tenant tiers: fs_route_enqueue(tenant, job_class, rules, queue)
 *	  records an enqueue and says which queue the job should go to.
 *
 * Rules are a JSON array such as
 *
 *	 [{"threshold": 100, "per": "1 hour",   "queue": "default_throttled"},
 *	  {"threshold": 10,  "per": "1 minute", "queue": "default_superslow"}]
 *
 * For each (queue, tenant, job class) and each rule, enqueues are counted in
 * a sliding window of the rule's length; the last rule whose threshold is
 * exceeded (count > threshold, this enqueue included) names the queue, and
 * with none exceeded the job stays in its queue.
 *
 * A window is FS_TIER_BUCKETS sub-buckets of window / FS_TIER_BUCKETS each,
 * plus the one that just slid out, whose count is weighted by how much of it
 * is still inside the window (as if its enqueues were spread evenly).  The
 * count is exact but for that oldest sub-bucket: the error is at most the
 * enqueues of one sub-bucket, a tenth of the window.  Memory is fixed per
 * (tenant, job class) and rule, whatever the traffic.
 *
 * The table is a partitioned shared hash like the tenant table (shmem.c's
 * locking rules apply, with its own partition locks); when it is full,
 * entries whose windows are all empty are evicted, and failing that the job
 * stays in its queue (counted as fail_open).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "common/hashfn.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "tiers/tiers.h"

PG_FUNCTION_INFO_V1(fs_route_enqueue);
PG_FUNCTION_INFO_V1(fs_tier_state);

int			fs_max_tier_keys = 10000;

/* Window lengths allowed for a rule. */
#define FS_TIER_MIN_WINDOW	USECS_PER_SEC
#define FS_TIER_MAX_WINDOW	(INT64CONST(366) * USECS_PER_DAY)

/* Parsed rule sets cached per backend, before the cache starts over. */
#define FS_TIER_RULESET_CACHE 64

typedef struct FsTierKey
{
	uint32		queue_id;
	char		tenant[FS_NAME_BUFLEN];
	char		job_class[FS_NAME_BUFLEN];
} FsTierKey;

typedef struct FsTierWindow
{
	int64		window_usecs;	/* 0: unused */
	int64		newest;			/* index of the newest sub-bucket in time */
	/* FS_TIER_BUCKETS sub-buckets, and the one that slid out last */
	uint32		counts[FS_TIER_BUCKETS + 1];	/* by fs_tier_slot() */
} FsTierWindow;

typedef struct FsTierEntry
{
	FsTierKey	key;			/* hash key: must be first */
	slock_t		mutex;
	TimestampTz touched_at;
	FsTierWindow windows[FS_TIER_MAX_RULES];
	dlist_node	scan_link;		/* under the partition lock EXCLUSIVE: in its
								 * partition's list (scanlist.h) */
} FsTierEntry;

typedef struct FsTierRule
{
	int64		threshold;
	int64		window_usecs;
	char		queue[FS_NAME_BUFLEN];
} FsTierRule;

typedef struct FsTierRuleSet
{
	uint32		hash;			/* hash key: hash of the jsonb bytes */
	int			nrules;
	FsTierRule	rules[FS_TIER_MAX_RULES];
	int			jsonb_len;
	char	   *jsonb_bytes;	/* to tell rule sets apart on a collision */
} FsTierRuleSet;

/*
 * Eviction passes over the tier table: one at a time, and after a pass that
 * found nothing idle, none for FS_TIER_EVICT_BACKOFF_USECS (a full table of
 * busy counters would otherwise be scanned whole by every new key's route).
 */
#define FS_TIER_EVICT_BACKOFF_USECS	(USECS_PER_SEC)

typedef struct FsTierShared
{
	pg_atomic_flag evicting;	/* a pass runs */
	pg_atomic_uint64 evict_not_before;	/* a TimestampTz */
} FsTierShared;

static FsTierShared *fs_tier_shared = NULL;
static HTAB *fs_tier_hash = NULL;
static LWLockPadded *fs_tier_locks = NULL;
static FsScanTable fs_tier_scan;	/* its partition lists (scanlist.h) */
static HTAB *fs_ruleset_cache = NULL;
static MemoryContext fs_ruleset_context = NULL;

/* dynahash hash function of tier keys (queue, tenant, job class). */
static uint32
fs_tier_key_hash(const void *key, Size keysize pg_attribute_unused())
{
	const FsTierKey *k = (const FsTierKey *) key;

	return hash_combine(hash_combine(murmurhash32(k->queue_id),
									 hash_bytes((const unsigned char *) k->tenant,
												(int) strlen(k->tenant))),
						hash_bytes((const unsigned char *) k->job_class,
								   (int) strlen(k->job_class)));
}

/* dynahash match function of tier keys (0: equal). */
static int
fs_tier_key_match(const void *key1, const void *key2, Size keysize pg_attribute_unused())
{
	const FsTierKey *a = (const FsTierKey *) key1;
	const FsTierKey *b = (const FsTierKey *) key2;

	if (a->queue_id != b->queue_id)
		return 1;
	if (strcmp(a->tenant, b->tenant) != 0)
		return 1;
	return strcmp(a->job_class, b->job_class);
}

/* The tiers' settings. */
void
fs_tiers_init(void)
{
	DefineCustomIntVariable("fairshare.max_tier_keys",
							"Maximum number of (queue, tenant, job class) counters kept for greedy-tenant tiers.",
							"When the table is full, idle counters are evicted; failing that, jobs stay in their queue.",
							&fs_max_tier_keys,
							10000, 32, 10000000,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
}

/* Shared memory of the tier counters: the table, its lists, the control struct. */
static Size
fs_tiers_shmem_size(void)
{
	return add_size(add_size(hash_estimate_size(fs_max_tier_keys, sizeof(FsTierEntry)),
							 fs_scan_lists_size(FS_TIER_PARTITIONS)),
					sizeof(FsTierShared));
}

/* Ask for this layer's shared memory and locks (shmem request hook, module.c). */
void
fs_tiers_shmem_request(void)
{
	RequestAddinShmemSpace(fs_tiers_shmem_size());
	RequestNamedLWLockTranche("fairshare tiers", FS_TIER_PARTITIONS);
}

/*
 * Create (or attach to) the tier counters, their partition lists and the
 * eviction state, and name the tier locks. Caller holds AddinShmemInitLock.
 */
void
fs_tiers_shmem_init(void)
{
	HASHCTL		info;
	bool		found;

	fs_tier_locks = GetNamedLWLockTranche("fairshare tiers");
	fs_lockstats_name_locks("tier partition", fs_tier_locks, FS_TIER_PARTITIONS);
	fs_tier_shared = ShmemInitStruct("fairshare tier control", sizeof(FsTierShared), &found);
	if (!found)
	{
		pg_atomic_init_flag(&fs_tier_shared->evicting);
		pg_atomic_init_u64(&fs_tier_shared->evict_not_before, 0);
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(FsTierKey);
	info.entrysize = sizeof(FsTierEntry);
	info.hash = fs_tier_key_hash;
	info.match = fs_tier_key_match;
	info.num_partitions = FS_TIER_PARTITIONS;
	fs_tier_hash = ShmemInitHash("fairshare tiers",
								 fs_max_tier_keys, fs_max_tier_keys,
								 &info,
								 HASH_ELEM | HASH_FUNCTION | HASH_COMPARE |
								 HASH_PARTITION | HASH_FIXED_SIZE);
	fs_tier_scan.lists = fs_scan_lists_init("fairshare tier lists", FS_TIER_PARTITIONS);
	fs_tier_scan.locks = fs_tier_locks;
	fs_tier_scan.nparts = FS_TIER_PARTITIONS;
	fs_tier_scan.link_offset = offsetof(FsTierEntry, scan_link);
}

/* Shared memory per (queue, tenant, job class), all overhead included. */
Size
fs_tier_bytes_per_key(void)
{
	return hash_estimate_size(fs_max_tier_keys, sizeof(FsTierEntry)) / fs_max_tier_keys;
}

/* ... of which each rule's sliding window takes this much, whatever the traffic. */
Size
fs_tier_bytes_per_rule(void)
{
	return sizeof(FsTierWindow);
}

/* Number of tier counters (read without locks, like fs_tenant_count()). */
long
fs_tier_count(void)
{
	return hash_get_num_entries(fs_tier_hash);
}

/* ----------------------------------------------------------------
 * Rules
 * ----------------------------------------------------------------
 */

pg_attribute_noreturn()
static void
fs_rules_error(int rule, const char *fmt, const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("tier rule %d is invalid: %s", rule, psprintf(fmt, what)),
			 errhint("Each rule is an object like {\"threshold\": 10, \"per\": \"1 minute\", \"queue\": \"slow\"}.")));
}

/* Field `field` of tier rule number `ruleno`, which must exist and be of `type`. */
static JsonbValue *
fs_rule_field(JsonbContainer *rule, int ruleno, const char *field, enum jbvType type)
{
	JsonbValue *v = getKeyJsonValueFromContainer(rule, field, strlen(field), NULL);

	if (v == NULL)
		fs_rules_error(ruleno, "it has no \"%s\"", field);
	if (v->type != type)
		fs_rules_error(ruleno, type == jbvNumeric ? "\"%s\" must be a number" :
					   "\"%s\" must be a string", field);
	return v;
}

/* Says which rule an error of interval_in() is about. */
static void
fs_rule_window_context(void *arg)
{
	errcontext("tier rule %d, \"per\"", *(int *) arg);
}

/* Parse a rule's "per" as an interval of 1 second to 366 days. */
static int64
fs_rule_window(int ruleno, const char *text)
{
	ErrorContextCallback context;
	Interval   *interval;
	float8		usecs;

	context.callback = fs_rule_window_context;
	context.arg = &ruleno;
	context.previous = error_context_stack;
	error_context_stack = &context;
	interval = DatumGetIntervalP(DirectFunctionCall3(interval_in,
													 CStringGetDatum(text),
													 ObjectIdGetDatum(InvalidOid),
													 Int32GetDatum(-1)));
	error_context_stack = context.previous;

	usecs = (float8) interval->time +
		((float8) interval->month * DAYS_PER_MONTH + interval->day) * USECS_PER_DAY;
	if (usecs < FS_TIER_MIN_WINDOW || usecs > FS_TIER_MAX_WINDOW)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tier rule %d is invalid: \"per\" must be between 1 second and 366 days, got \"%s\"",
						ruleno, text),
				 errhint("Use an interval such as \"1 minute\" or \"1 hour\".")));
	return (int64) usecs;
}

/*
 * Parse a rule set (a JSON array of {threshold, per, queue}) into `set`, or
 * raise a clear error saying which rule is wrong and how.
 */
static void
fs_rules_parse(Jsonb *rules, FsTierRuleSet *set)
{
	int			n;
	int			i;

	if (JB_ROOT_IS_SCALAR(rules) || !JB_ROOT_IS_ARRAY(rules))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tier rules must be a JSON array of rule objects"),
				 errhint("Pass rules like '[{\"threshold\": 10, \"per\": \"1 minute\", \"queue\": \"slow\"}]'.")));
	n = JB_ROOT_COUNT(rules);
	if (n > FS_TIER_MAX_RULES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("at most %d tier rules are allowed, got %d", FS_TIER_MAX_RULES, n),
				 errhint("Merge rules with the same queue, or route in two steps.")));

	set->nrules = n;
	for (i = 0; i < n; i++)
	{
		JsonbValue *elem = getIthJsonbValueFromContainer(&rules->root, i);
		JsonbContainer *rule;
		JsonbValue *v;
		FsTierRule *r = &set->rules[i];
		float8		threshold;
		char	   *text;
		int			ruleno = i + 1;

		if (elem == NULL || elem->type != jbvBinary ||
			!JsonContainerIsObject(elem->val.binary.data))
			fs_rules_error(ruleno, "%s", "it must be a JSON object");
		rule = elem->val.binary.data;
		if (JsonContainerSize(rule) != 3)
			fs_rules_error(ruleno, "%s", "it must have exactly the keys \"threshold\", \"per\" and \"queue\"");

		v = fs_rule_field(rule, ruleno, "threshold", jbvNumeric);
		threshold = DatumGetFloat8(DirectFunctionCall1(numeric_float8,
													   NumericGetDatum(v->val.numeric)));
		if (!(threshold >= 0 && threshold <= PG_INT32_MAX && threshold == floor(threshold)))
			fs_rules_error(ruleno, "%s", "\"threshold\" must be a whole number from 0 to 2147483647");
		r->threshold = (int64) threshold;

		v = fs_rule_field(rule, ruleno, "per", jbvString);
		text = pnstrdup(v->val.string.val, v->val.string.len);
		r->window_usecs = fs_rule_window(ruleno, text);

		v = fs_rule_field(rule, ruleno, "queue", jbvString);
		if (v->val.string.len == 0 || v->val.string.len > FS_NAME_MAXLEN)
			fs_rules_error(ruleno, "%s", "\"queue\" must be a queue name of 1 to 63 bytes");
		memcpy(r->queue, v->val.string.val, v->val.string.len);
		r->queue[v->val.string.len] = '\0';
	}
}

/*
 * The parsed form of `rules`, from this backend's cache when it has seen
 * the same bytes before.  Parsing (and checking) happens once per rule set.
 */
static const FsTierRuleSet *
fs_rules_get(Jsonb *rules)
{
	int			len = VARSIZE(rules);
	uint32		hash = hash_bytes((const unsigned char *) rules, len);
	FsTierRuleSet *set;
	FsTierRuleSet parsed;
	bool		found;

	if (fs_ruleset_cache == NULL ||
		hash_get_num_entries(fs_ruleset_cache) >= FS_TIER_RULESET_CACHE)
	{
		HASHCTL		info;

		if (fs_ruleset_context == NULL)
			fs_ruleset_context = AllocSetContextCreate(TopMemoryContext,
													   "fairshare tier rules",
													   ALLOCSET_SMALL_SIZES);
		else
			MemoryContextReset(fs_ruleset_context);
		info.keysize = sizeof(uint32);
		info.entrysize = sizeof(FsTierRuleSet);
		info.hcxt = fs_ruleset_context;
		fs_ruleset_cache = hash_create("fairshare tier rule sets", FS_TIER_RULESET_CACHE,
									   &info, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}

	set = hash_search(fs_ruleset_cache, &hash, HASH_FIND, NULL);
	if (set != NULL && set->jsonb_len == len && memcmp(set->jsonb_bytes, rules, len) == 0)
		return set;

	/* Parse first: a bad rule set errors out before the cache is touched. */
	fs_rules_parse(rules, &parsed);
	if (set != NULL)
		return memcpy(palloc(sizeof(parsed)), &parsed, sizeof(parsed));	/* collision */

	set = hash_search(fs_ruleset_cache, &hash, HASH_ENTER, &found);
	memcpy(set, &parsed, sizeof(parsed));
	set->hash = hash;
	set->jsonb_len = len;
	set->jsonb_bytes = MemoryContextAlloc(fs_ruleset_context, len);
	memcpy(set->jsonb_bytes, rules, len);
	return set;
}

/* ----------------------------------------------------------------
 * Windows
 * ----------------------------------------------------------------
 */

#define FS_TIER_SLOTS	(FS_TIER_BUCKETS + 1)

/* The slot of sub-bucket `index` (which may be negative before 2000). */
static inline int
fs_tier_slot(int64 index)
{
	int64		slot = index % FS_TIER_SLOTS;

	return (int) (slot < 0 ? slot + FS_TIER_SLOTS : slot);
}

/*
 * Slide a window to `now` and count one enqueue in it if `add`.  Returns the
 * window's count.  Entry spinlock held.
 */
static float8
fs_window_count(FsTierWindow *w, int64 window_usecs, TimestampTz now, bool add)
{
	int64		bucket_usecs = window_usecs / FS_TIER_BUCKETS;
	int64		index;
	int64		into;
	float8		count = 0;
	int			i;

	/* Floor division: sub-bucket boundaries are the same on both sides of 2000. */
	index = now / bucket_usecs;
	if (now % bucket_usecs < 0)
		index--;
	into = now - index * bucket_usecs;

	if (w->window_usecs != window_usecs || index < w->newest)
	{
		/* A new rule, a changed one, or a clock that went back: start over. */
		memset(w, 0, sizeof(*w));
		w->window_usecs = window_usecs;
		w->newest = index;
	}
	else if (index > w->newest)
	{
		int64		steps = Min(index - w->newest, FS_TIER_SLOTS);

		for (i = 1; i <= steps; i++)
			w->counts[fs_tier_slot(w->newest + i)] = 0;
		w->newest = index;
	}
	if (add)
		w->counts[fs_tier_slot(index)]++;

	/* The newest FS_TIER_BUCKETS sub-buckets in full, the one before in part. */
	for (i = 0; i < FS_TIER_BUCKETS; i++)
		count += w->counts[fs_tier_slot(index - i)];
	count += w->counts[fs_tier_slot(index - FS_TIER_BUCKETS)] *
		(1.0 - (float8) into / (float8) bucket_usecs);
	return count;
}

/*
 * Are all of a counter's windows empty at `now`? (Then eviction may forget
 * it.) Entry spinlock held.
 */
static bool
fs_tier_idle(FsTierEntry *entry, TimestampTz now)
{
	int			r;

	for (r = 0; r < FS_TIER_MAX_RULES; r++)
	{
		FsTierWindow *w = &entry->windows[r];

		if (w->window_usecs > 0 && fs_window_count(w, w->window_usecs, now, false) > 0)
			return false;
	}
	return true;
}

/* What a tier eviction pass collects (fs_tier_collect_idle()). */
typedef struct FsTierEvictScan
{
	FsTierKey  *keys;			/* allocated before the scan */
	int			count;
	int			capacity;
	TimestampTz now;
} FsTierEvictScan;

/*
 * fs_scan_table() visitor of fs_tiers_evict(): note the entry's key if its
 * windows are all empty.  Partition locks held SHARED: the windows are
 * read (and slid to now) under the entry's spinlock.
 */
static void
fs_tier_collect_idle(void *hash_entry, void *arg)
{
	FsTierEntry *entry = (FsTierEntry *) hash_entry;
	FsTierEvictScan *scan = (FsTierEvictScan *) arg;
	bool		idle;

	if (scan->count >= scan->capacity)
		return;
	SpinLockAcquire(&entry->mutex);
	idle = fs_tier_idle(entry, scan->now);
	SpinLockRelease(&entry->mutex);
	if (idle)
		scan->keys[scan->count++] = entry->key;
}

/*
 * Make room: evict every entry whose windows are all empty.  Only when the
 * table is full.  The idle entries are listed a batch at a time with the
 * partition locks (shmem.c rule 3a), then each is removed under its
 * own partition lock EXCLUSIVE, after checking again that it is still there
 * and still idle.  The list is allocated before any lock is taken; when
 * there is no memory for it nothing is evicted, and the caller fails open.
 * One pass at a time: while one runs, or for a second after one that found
 * nothing idle, others evict nothing (their callers fail open).
 */
static void
fs_tiers_evict(TimestampTz now)
{
	FsTierEvictScan scan;
	int			i;

	if (now < (TimestampTz) pg_atomic_read_u64(&fs_tier_shared->evict_not_before))
		return;
	scan.capacity = Max(fs_max_tier_keys, 1);
	scan.keys = palloc_extended(sizeof(FsTierKey) * scan.capacity,
								MCXT_ALLOC_HUGE | MCXT_ALLOC_NO_OOM);
	if (scan.keys == NULL)
		return;
	if (!pg_atomic_test_set_flag(&fs_tier_shared->evicting))
	{
		pfree(scan.keys);
		return;
	}
	scan.count = 0;
	scan.now = now;

	/*
	 * Nothing from here to the flag's clearing can fail or serve an
	 * interrupt (a scan does not; neither do the removals), so the flag
	 * cannot be left set.
	 */
	fs_scan_table(&fs_tier_scan, fs_tier_collect_idle, &scan);

	for (i = 0; i < scan.count; i++)
	{
		const FsTierKey *key = &scan.keys[i];
		uint32		hashvalue = get_hash_value(fs_tier_hash, key);
		LWLock	   *lock = &fs_tier_locks[hashvalue % FS_TIER_PARTITIONS].lock;
		FsTierEntry *entry;

		LWLockAcquire(lock, LW_EXCLUSIVE);
		entry = hash_search_with_hash_value(fs_tier_hash, key, hashvalue, HASH_FIND, NULL);
		if (entry != NULL && fs_tier_idle(entry, now))
		{
			fs_scan_list_remove(&entry->scan_link);
			hash_search_with_hash_value(fs_tier_hash, key, hashvalue, HASH_REMOVE, NULL);
		}
		LWLockRelease(lock);
	}
	if (scan.count == 0)
		pg_atomic_write_u64(&fs_tier_shared->evict_not_before,
							(uint64) (now + FS_TIER_EVICT_BACKOFF_USECS));
	pg_atomic_clear_flag(&fs_tier_shared->evicting);
	pfree(scan.keys);
}

/* ----------------------------------------------------------------
 * SQL functions
 * ----------------------------------------------------------------
 */

/*
 * fs_route_enqueue(tenant text, job_class text, rules jsonb, queue text)
 * RETURNS text: the queue the job should go to.
 */
Datum
fs_route_enqueue(PG_FUNCTION_ARGS)
{
	FsTierKey	key;
	char		queue_name[FS_NAME_BUFLEN];
	const FsTierRuleSet *rules;
	FsQueue    *queue;
	FsTierEntry *entry;
	uint32		hashvalue;
	LWLock	   *lock;
	TimestampTz now;
	const char *route;
	bool		found;
	bool		evicted = false;
	int			r;

	fs_check_primary("route a job with fairshare tiers");
	memset(&key, 0, sizeof(key));
	fs_name_arg(fcinfo, 0, "tenant", key.tenant);
	fs_name_arg(fcinfo, 1, "job_class", key.job_class);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("rules must not be null"),
				 errhint("Pass '[]' for no rules.")));
	rules = fs_rules_get(PG_GETARG_JSONB_P(2));
	fs_name_arg(fcinfo, 3, "queue", queue_name);

	route = pstrdup(queue_name);
	if (rules->nrules == 0)
		PG_RETURN_TEXT_P(cstring_to_text(route));

	queue = fs_queue_lookup(queue_name, true);
	if (queue == NULL)
	{
		FS_COUNT_GLOBAL(fail_open);
		PG_RETURN_TEXT_P(cstring_to_text(route));
	}
	key.queue_id = queue->queue_id;
	hashvalue = get_hash_value(fs_tier_hash, &key);
	lock = &fs_tier_locks[hashvalue % FS_TIER_PARTITIONS].lock;
	now = fs_now();

	for (;;)
	{
		LWLockAcquire(lock, LW_SHARED);
		entry = hash_search_with_hash_value(fs_tier_hash, &key, hashvalue, HASH_FIND, NULL);
		if (entry != NULL)
			break;
		LWLockRelease(lock);
		LWLockAcquire(lock, LW_EXCLUSIVE);
		entry = hash_search_with_hash_value(fs_tier_hash, &key, hashvalue,
											HASH_ENTER_NULL, &found);
		if (entry != NULL)
		{
			if (!found)
			{
				memset((char *) entry + sizeof(FsTierKey), 0,
					   sizeof(FsTierEntry) - sizeof(FsTierKey));
				SpinLockInit(&entry->mutex);
				fs_scan_list_add(&fs_tier_scan, hashvalue % FS_TIER_PARTITIONS, &entry->scan_link);
			}
			break;
		}
		LWLockRelease(lock);
		if (evicted)
		{
			/* Nothing could be forgotten: the job stays where it is. */
			FS_COUNT_GLOBAL(fail_open);
			PG_RETURN_TEXT_P(cstring_to_text(route));
		}
		fs_tiers_evict(now);
		evicted = true;
	}

	SpinLockAcquire(&entry->mutex);
	entry->touched_at = now;
	for (r = 0; r < rules->nrules; r++)
	{
		const FsTierRule *rule = &rules->rules[r];

		if (fs_window_count(&entry->windows[r], rule->window_usecs, now, true) > rule->threshold)
			route = rule->queue;
	}
	/* Rules beyond this call's set are not being used any more. */
	for (; r < FS_TIER_MAX_RULES; r++)
		entry->windows[r].window_usecs = 0;
	SpinLockRelease(&entry->mutex);
	LWLockRelease(lock);

	PG_RETURN_TEXT_P(cstring_to_text(route));
}

/* What fs_tier_state() copies out (fs_tier_copy()). */
typedef struct FsTierCopies
{
	FsTierEntry *entries;		/* allocated before the scan */
	int			count;
	int			capacity;
} FsTierCopies;

/*
 * fs_scan_table() visitor of fs_tier_state(): copy an entry of this
 * database's queues, under its spinlock.
 */
static void
fs_tier_copy(void *hash_entry, void *arg)
{
	FsTierEntry *entry = (FsTierEntry *) hash_entry;
	FsTierCopies *copies = (FsTierCopies *) arg;

	if (fs_shared->queues[entry->key.queue_id]->key.dboid != MyDatabaseId ||
		copies->count >= copies->capacity)
		return;
	SpinLockAcquire(&entry->mutex);
	memcpy(&copies->entries[copies->count], entry, sizeof(FsTierEntry));
	SpinLockRelease(&entry->mutex);
	copies->count++;
}

/*
 * fs_tier_state(): every tier counter of this database's queues.
 *
 * The entries are copied out into an array allocated before any lock is
 * taken (fairshare.max_tier_keys of them: no more than the table holds), under
 * the partition locks a batch at a time (shmem.c rule 3a); the rows are
 * built after the locks are released, since a tuplestore may spill to disk.
 */
Datum
fs_tier_state(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo;
	FsTierCopies copies;
	TimestampTz now;
	int			i;

	fs_check_loaded();
	InitMaterializedSRF(fcinfo, 0);
	rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	now = fs_now();
	copies.capacity = Max(fs_max_tier_keys, 1);
	copies.count = 0;
	copies.entries = palloc_extended(sizeof(FsTierEntry) * copies.capacity, MCXT_ALLOC_HUGE);

	fs_scan_table(&fs_tier_scan, fs_tier_copy, &copies);

	for (i = 0; i < copies.count; i++)
	{
		FsTierEntry *copy = &copies.entries[i];
		FsQueue    *queue = fs_shared->queues[copy->key.queue_id];
		int			r;

		for (r = 0; r < FS_TIER_MAX_RULES; r++)
		{
			FsTierWindow *w = &copy->windows[r];
			Datum		values[7];
			bool		nulls[7] = {false, false, false, false, false, false, false};
			Interval   *window;

			if (w->window_usecs == 0)
				continue;
			window = palloc0(sizeof(Interval));
			window->time = w->window_usecs;
			values[0] = CStringGetTextDatum(queue->key.name);
			values[1] = CStringGetTextDatum(copy->key.tenant);
			values[2] = CStringGetTextDatum(copy->key.job_class);
			values[3] = Int32GetDatum(r + 1);
			values[4] = IntervalPGetDatum(window);
			values[5] = Float8GetDatum(fs_window_count(w, w->window_usecs, now, false));
			values[6] = TimestampTzGetDatum(copy->touched_at);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	pfree(copies.entries);
	return (Datum) 0;
}

/*-------------------------------------------------------------------------
 *
 * records.c
 *	  The state file's items, field by field: what each section's items
 *	  hold, written from shared state and read back (core/stateformat.h
 *	  says how an item is laid out).
 *
 * Each section's fields have ids of their own, listed here; an id is never
 * reused.  A reader takes the fields it knows and leaves the others, and a
 * field a file lacks keeps the value a new entry has.  statefile.c decides
 * what is written when, and what of it is restored.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "statefile/records.h"

/*
 * The fields of each section's items (stateformat.h).  An id is never
 * reused: a field that goes leaves its id unused.
 */
enum
{
	FS_QUEUE_DBOID = 1,			/* Oid */
	FS_QUEUE_NAME = 2,			/* name */
	FS_QUEUE_INDEX = 3			/* uint32: its index, where not its place */
};

enum
{
	FS_TENANT_QUEUE = 1,		/* uint32: the queue's index in the file */
	FS_TENANT_NAME = 2,			/* name */
	FS_TENANT_TOKEN_BALANCE = 3,	/* float8 */
	FS_TENANT_TOUCHED_AT = 4,	/* TimestampTz */
	FS_TENANT_VIRTUAL_FINISH = 5,	/* float8 */
	FS_TENANT_DECISIONS = 6,	/* uint64 per reason, in FsReason order */
	FS_TENANT_LEASES_EXPIRED = 7,	/* uint64 */
	FS_TENANT_FAILED_TO_DELIVER = 8,	/* uint64 */
	FS_TENANT_SERVED_MS = 9,	/* float8 */
	FS_TENANT_MAX_SLOTS = 10,	/* int32 */
	FS_TENANT_MIN_SLOTS = 11,	/* int32 */
	FS_TENANT_WEIGHT = 12,		/* float8 */
	FS_TENANT_BUDGET = 13,		/* float8: budget_ms_per_minute */
	FS_TENANT_THROTTLE = 14,	/* float8 */
	FS_TENANT_READY_ROWS = 15,	/* int64: the fair-dequeue backlog */
	FS_TENANT_FLAGS = 16		/* uint8: FS_TENANT_NEW and FS_TENANT_DRY */
};

enum
{
	FS_LEASE_ID = 1,			/* int64 */
	FS_LEASE_QUEUE = 2,			/* uint32: the queue's index in the file */
	FS_LEASE_TENANT = 3,		/* name */
	FS_LEASE_ACQUIRED_AT = 4,	/* TimestampTz */
	FS_LEASE_EXPIRES_AT = 5,	/* TimestampTz */
	FS_LEASE_OWNER = 6,			/* Oid */
	FS_LEASE_STATE = 7			/* uint8: FsLeaseState */
};

enum
{
	FS_STATS_FAIL_OPEN = 1,		/* uint64 each, as FsGlobalStats names them */
	FS_STATS_EVICTIONS = 2,
	FS_STATS_EVICTION_PASSES = 3,
	FS_STATS_TENANT_TABLE_FULL = 4,
	FS_STATS_LIMITS_UNREADABLE = 5,
	FS_STATS_QUEUE_TABLE_FULL = 6,
	FS_STATS_LEASE_TABLE_FULL = 7,
	FS_STATS_LEASES_EXPIRED = 8,
	FS_STATS_LEASES_ORPHANED = 9,
	FS_STATS_LEASES_REREGISTERED = 10,
	FS_STATS_RESET_AT = 11		/* TimestampTz */
};



/* ----------------------------------------------------------------
 * Writing
 * ----------------------------------------------------------------
 */

/* A queue: its database and name. */
void
fs_state_write_queue(StringInfo buf, const FsQueueKey *key)
{
	Size		at = fs_state_item_begin(buf);

	fs_state_put_value(buf, FS_QUEUE_DBOID, key->dboid);
	fs_state_put_name(buf, FS_QUEUE_NAME, key->name);
	fs_state_item_end(buf, at);
}

/* A queue with its index (a WAL record names only the queues it uses). */
void
fs_state_write_queue_at(StringInfo buf, uint32 index, const FsQueueKey *key)
{
	Size		at = fs_state_item_begin(buf);

	fs_state_put_value(buf, FS_QUEUE_INDEX, index);
	fs_state_put_value(buf, FS_QUEUE_DBOID, key->dboid);
	fs_state_put_name(buf, FS_QUEUE_NAME, key->name);
	fs_state_item_end(buf, at);
}

/*
 * A tenant entry (a copy): its key (its queue's index in the file is its
 * id), balance, counters and last limits.  At most FS_TENANT_ITEM_MAX bytes.
 */
void
fs_state_write_tenant(StringInfo buf, const FsTenant *tenant)
{
	Size		at;
	uint8		flags;

	at = fs_state_item_begin(buf);
	fs_state_put_value(buf, FS_TENANT_QUEUE, tenant->key.queue_id);
	fs_state_put_name(buf, FS_TENANT_NAME, tenant->key.tenant);
	fs_state_put_value(buf, FS_TENANT_TOKEN_BALANCE, tenant->token_balance);
	fs_state_put_value(buf, FS_TENANT_TOUCHED_AT, tenant->touched_at);
	fs_state_put_value(buf, FS_TENANT_VIRTUAL_FINISH, tenant->virtual_finish);
	fs_state_put_value(buf, FS_TENANT_DECISIONS, tenant->decisions);
	fs_state_put_value(buf, FS_TENANT_LEASES_EXPIRED, tenant->leases_expired);
	fs_state_put_value(buf, FS_TENANT_FAILED_TO_DELIVER, tenant->failed_to_deliver);
	fs_state_put_value(buf, FS_TENANT_SERVED_MS, tenant->served_ms);
	fs_state_put_value(buf, FS_TENANT_MAX_SLOTS, tenant->max_slots);
	fs_state_put_value(buf, FS_TENANT_MIN_SLOTS, tenant->min_slots);
	fs_state_put_value(buf, FS_TENANT_WEIGHT, tenant->weight);
	fs_state_put_value(buf, FS_TENANT_BUDGET, tenant->budget_ms_per_minute);
	fs_state_put_value(buf, FS_TENANT_THROTTLE, tenant->throttle);
	fs_state_put_value(buf, FS_TENANT_READY_ROWS, tenant->ready_rows);
	flags = tenant->flags & (FS_TENANT_NEW | FS_TENANT_DRY);
	fs_state_put_value(buf, FS_TENANT_FLAGS, flags);
	fs_state_item_end(buf, at);
}

/* A lease: at most FS_LEASE_ITEM_MAX bytes. */
void
fs_state_write_lease(StringInfo buf, const FsLeaseInfo *lease)
{
	Size		at;

	at = fs_state_item_begin(buf);
	fs_state_put_value(buf, FS_LEASE_ID, lease->lease_id);
	fs_state_put_value(buf, FS_LEASE_QUEUE, lease->tenant_key.queue_id);
	fs_state_put_name(buf, FS_LEASE_TENANT, lease->tenant_key.tenant);
	fs_state_put_value(buf, FS_LEASE_ACQUIRED_AT, lease->acquired_at);
	fs_state_put_value(buf, FS_LEASE_EXPIRES_AT, lease->expires_at);
	fs_state_put_value(buf, FS_LEASE_OWNER, lease->owner);
	fs_state_put_value(buf, FS_LEASE_STATE, lease->state);
	fs_state_item_end(buf, at);
}

/* The server-wide counters, as one item. */
void
fs_state_write_stats(StringInfo buf, const FsGlobalStats *stats)
{
	Size		at = fs_state_item_begin(buf);

	fs_state_put_value(buf, FS_STATS_FAIL_OPEN, stats->fail_open);
	fs_state_put_value(buf, FS_STATS_EVICTIONS, stats->evictions);
	fs_state_put_value(buf, FS_STATS_EVICTION_PASSES, stats->eviction_passes);
	fs_state_put_value(buf, FS_STATS_TENANT_TABLE_FULL, stats->tenant_table_full);
	fs_state_put_value(buf, FS_STATS_LIMITS_UNREADABLE, stats->limits_unreadable);
	fs_state_put_value(buf, FS_STATS_QUEUE_TABLE_FULL, stats->queue_table_full);
	fs_state_put_value(buf, FS_STATS_LEASE_TABLE_FULL, stats->lease_table_full);
	fs_state_put_value(buf, FS_STATS_LEASES_EXPIRED, stats->leases_expired);
	fs_state_put_value(buf, FS_STATS_LEASES_ORPHANED, stats->leases_orphaned);
	fs_state_put_value(buf, FS_STATS_LEASES_REREGISTERED, stats->leases_reregistered);
	fs_state_put_value(buf, FS_STATS_RESET_AT, stats->reset_at);
	fs_state_item_end(buf, at);
}


/* ----------------------------------------------------------------
 * Reading
 * ----------------------------------------------------------------
 */

/* A queue item: its database and name (left empty when missing). */
void
fs_state_read_queue(FsStateItem *item, FsQueueKey *key)
{
	uint32		index;

	(void) fs_state_read_queue_at(item, key, &index);
}

/*
 * A queue item, with its index when it has one (false without: its place
 * is its index).
 */
bool
fs_state_read_queue_at(FsStateItem *item, FsQueueKey *key, uint32 *index)
{
	uint8		field;
	uint8		len;
	const char *value;
	bool		has_index = false;

	while (fs_state_field_next(item, &field, &value, &len))
	{
		if (field == FS_QUEUE_DBOID)
			fs_state_field_value(value, len, key->dboid);
		else if (field == FS_QUEUE_NAME && !fs_state_field_name(value, len, key->name, FS_NAME_BUFLEN))
			key->name[0] = '\0';
		else if (field == FS_QUEUE_INDEX)
			has_index = fs_state_field_value(value, len, *index);
	}
	return has_index;
}


/*
 * A tenant item, into `record` (its name in record->key.tenant) and the
 * index of its queue in the file.  False without a queue or a name.
 */
bool
fs_state_read_tenant(FsStateItem *item, FsTenant *record, uint32 *queue_index, TimestampTz now)
{
	uint8		field;
	uint8		len;
	const char *value;
	uint8		flags;

	/* What a field the file lacks keeps: a new entry's values. */
	memset(record, 0, sizeof(*record));
	*queue_index = PG_UINT32_MAX;
	record->touched_at = now;
	record->max_slots = 1;
	record->weight = 1.0;
	record->budget_ms_per_minute = -1;
	record->throttle = 1.0;
	while (fs_state_field_next(item, &field, &value, &len))
	{
		switch (field)
		{
			case FS_TENANT_QUEUE:
				fs_state_field_value(value, len, *queue_index);
				break;
			case FS_TENANT_NAME:
				fs_state_field_name(value, len, record->key.tenant, FS_NAME_BUFLEN);
				break;
			case FS_TENANT_TOKEN_BALANCE:
				fs_state_field_value(value, len, record->token_balance);
				break;
			case FS_TENANT_TOUCHED_AT:
				fs_state_field_value(value, len, record->touched_at);
				break;
			case FS_TENANT_VIRTUAL_FINISH:
				fs_state_field_value(value, len, record->virtual_finish);
				break;
			case FS_TENANT_DECISIONS:
				/* Reasons added since are counted from zero. */
				memcpy(record->decisions, value,
					   Min((Size) len - len % sizeof(uint64), sizeof(record->decisions)));
				break;
			case FS_TENANT_LEASES_EXPIRED:
				fs_state_field_value(value, len, record->leases_expired);
				break;
			case FS_TENANT_FAILED_TO_DELIVER:
				fs_state_field_value(value, len, record->failed_to_deliver);
				break;
			case FS_TENANT_SERVED_MS:
				fs_state_field_value(value, len, record->served_ms);
				break;
			case FS_TENANT_MAX_SLOTS:
				fs_state_field_value(value, len, record->max_slots);
				break;
			case FS_TENANT_MIN_SLOTS:
				fs_state_field_value(value, len, record->min_slots);
				break;
			case FS_TENANT_WEIGHT:
				fs_state_field_value(value, len, record->weight);
				break;
			case FS_TENANT_BUDGET:
				fs_state_field_value(value, len, record->budget_ms_per_minute);
				break;
			case FS_TENANT_THROTTLE:
				fs_state_field_value(value, len, record->throttle);
				break;
			case FS_TENANT_READY_ROWS:
				fs_state_field_value(value, len, record->ready_rows);
				break;
			case FS_TENANT_FLAGS:
				if (fs_state_field_value(value, len, flags))
					record->flags = flags & (FS_TENANT_NEW | FS_TENANT_DRY);
				break;
			default:
				break;			/* a field of a later version */
		}
	}

	return *queue_index != PG_UINT32_MAX && record->key.tenant[0] != '\0';
}

/* A lease item; false without an id, a queue, a tenant or an expiry. */
bool
fs_state_read_lease(FsStateItem *item, FsLeaseRecord *record)
{
	uint8		field;
	uint8		len;
	const char *value;
	bool		has_id = false,
				has_queue = false,
				has_expiry = false;

	memset(record, 0, sizeof(*record));
	record->owner = InvalidOid;
	record->state = FS_LEASE_LIVE;
	while (fs_state_field_next(item, &field, &value, &len))
	{
		switch (field)
		{
			case FS_LEASE_ID:
				has_id = fs_state_field_value(value, len, record->lease_id);
				break;
			case FS_LEASE_QUEUE:
				has_queue = fs_state_field_value(value, len, record->queue_index);
				break;
			case FS_LEASE_TENANT:
				fs_state_field_name(value, len, record->tenant, FS_NAME_BUFLEN);
				break;
			case FS_LEASE_ACQUIRED_AT:
				fs_state_field_value(value, len, record->acquired_at);
				break;
			case FS_LEASE_EXPIRES_AT:
				has_expiry = fs_state_field_value(value, len, record->expires_at);
				break;
			case FS_LEASE_OWNER:
				fs_state_field_value(value, len, record->owner);
				break;
			case FS_LEASE_STATE:
				fs_state_field_value(value, len, record->state);
				break;
			default:
				break;
		}
	}
	return has_id && has_queue && has_expiry && record->tenant[0] != '\0';
}


/* The server-wide counters' item: each counter the file has. */
void
fs_state_read_stats(FsStateItem *item, FsGlobalStats *stats)
{
	uint8		field;
	uint8		len;
	const char *value;

	while (fs_state_field_next(item, &field, &value, &len))
	{
		switch (field)
		{
			case FS_STATS_FAIL_OPEN:
				fs_state_field_value(value, len, stats->fail_open);
				break;
			case FS_STATS_EVICTIONS:
				fs_state_field_value(value, len, stats->evictions);
				break;
			case FS_STATS_EVICTION_PASSES:
				fs_state_field_value(value, len, stats->eviction_passes);
				break;
			case FS_STATS_TENANT_TABLE_FULL:
				fs_state_field_value(value, len, stats->tenant_table_full);
				break;
			case FS_STATS_LIMITS_UNREADABLE:
				fs_state_field_value(value, len, stats->limits_unreadable);
				break;
			case FS_STATS_QUEUE_TABLE_FULL:
				fs_state_field_value(value, len, stats->queue_table_full);
				break;
			case FS_STATS_LEASE_TABLE_FULL:
				fs_state_field_value(value, len, stats->lease_table_full);
				break;
			case FS_STATS_LEASES_EXPIRED:
				fs_state_field_value(value, len, stats->leases_expired);
				break;
			case FS_STATS_LEASES_ORPHANED:
				fs_state_field_value(value, len, stats->leases_orphaned);
				break;
			case FS_STATS_LEASES_REREGISTERED:
				fs_state_field_value(value, len, stats->leases_reregistered);
				break;
			case FS_STATS_RESET_AT:
				fs_state_field_value(value, len, stats->reset_at);
				break;
			default:
				break;
		}
	}
}


// @fairshare/pg-boss: pg-boss 12 workers claim jobs in weighted fair order
// across tenants through the fairshare extension's fs_claim().
//
// pg-boss builds its fetch statement in plans.fetchNextJob() and runs it
// through its database adapter (boss.getDb().executeSql), the one extension
// point every fetch goes through (work() and fetch() alike). fairPgBoss()
// wraps that adapter: a fetch of a fair queue gets its candidate rows from
// fs_claim() instead of "ORDER BY priority DESC, created_on ... FOR UPDATE
// SKIP LOCKED"; every other condition pg-boss puts on the candidates
// (policies, groups, priority bounds) and its UPDATE to 'active' stay as they
// are.

export const DEFAULT_TENANT = 'default';
export const DEFAULT_SCHEMA = 'pgboss';
// A lease outlives its job by LEASE_MARGIN_SECONDS: pg-boss fails a job that
// ran past its expiration (expireInSeconds, 15 minutes by default), which
// ends the lease.
export const LEASE_MARGIN_SECONDS = 60;

// The fairshare queue that stands for a pg-boss queue, unless one is given.
export function fairQueueName(queue) {
  return `pgboss/${queue}`;
}

// The SQL expression (as fs_register_queue stores it) giving a job's tenant:
// the job data's field `field`, or `defaultTenant` when it is missing or
// empty. A tenant fairshare cannot track (longer than 63 bytes, or "*") is
// replaced by its md5, so that every job has a tenant and runs. Built by the
// server with format(%L), so field and default are quoted as literals.
const TENANT_SQL = `format(
  'coalesce(CASE WHEN data->>%1$L IN (%3$L, ''*'') THEN NULL
                 WHEN octet_length(data->>%1$L) <= 63 THEN data->>%1$L
                 ELSE md5(data->>%1$L) END, %2$L)', $1::text, $2::text, '')`;

// Registers a pg-boss queue with fairshare (run once, as a migration would,
// after boss.createQueue(), and again after changing its expireInSeconds):
// the queue's job table is both the ready table (jobs in state created or
// retry, not blocked, start_after reached) and the running table (jobs in
// state active), so a lease ends when its job leaves 'active' (completed,
// failed, retried, expired, cancelled, deleted). The queue's lease is its
// expiration plus a minute; maxSlots (null: no limit) bounds the slots of a
// tenant without a limit of its own in fs_limits.
// `client` is anything with a pg-style query(text, values): a pg.Client,
// pg.Pool, or pg-boss's db adapter (boss.getDb(), whose executeSql is used).
export async function register(client, queue, options = {}) {
  const {
    schema = DEFAULT_SCHEMA,
    fairQueue = fairQueueName(queue),
    tenantField = 'tenant',
    defaultTenant = DEFAULT_TENANT,
    maxSlots = null,
  } = options;
  const query = queryFunction(client);
  const found = await query(
    `SELECT table_name, expire_seconds FROM ${quoteIdent(schema)}.queue WHERE name = $1`, [queue]);
  if (found.rows.length === 0) {
    throw new Error(`pg-boss queue "${queue}" does not exist in schema "${schema}": create it first`);
  }
  const table = `${quoteIdent(schema)}.${quoteIdent(found.rows[0].table_name)}`;
  await ensureKeyIndex(query, schema, found.rows[0].table_name);
  const registered = await query(
    `SELECT fs_register_queue($3, $4::regclass,
        tenant         => ${TENANT_SQL},
        order_by       => 'priority DESC, created_on',
        filter         => format('name = %L AND state IN (''created'', ''retry'') AND NOT blocked
                                  AND start_after <= now()', $5::text),
        key            => $6,
        running_table  => $4::regclass,
        running_filter => format('name = %L AND state = ''active''', $5::text),
        max_slots      => $7::integer,
        lease          => make_interval(secs => $8::integer)) AS q`,
    [tenantField, defaultTenant, fairQueue, table, queue, KEY_SQL, maxSlots,
      found.rows[0].expire_seconds + LEASE_MARGIN_SECONDS]);
  return { fairQueue, table, expireSeconds: found.rows[0].expire_seconds, registration: registered.rows[0].q };
}

// Removes a queue's registration (its triggers and the index fairshare made).
export async function unregister(client, queue, options = {}) {
  const { fairQueue = fairQueueName(queue) } = options;
  const { rows } = await queryFunction(client)('SELECT fs_unregister_queue($1) AS done', [fairQueue]);
  return rows[0].done;
}

// A job is identified by (name, id) in pg-boss (its primary key); fairshare
// needs one expression with a unique index on exactly it, so this one is
// added to the queue's table (unique because (name, id) is).
const KEY_SQL = `name || '/' || id::text`;

// Creates the unique index on KEY_SQL on a pg-boss job table if it is missing.
async function ensureKeyIndex(query, schema, tableName) {
  const indexName = `${tableName.slice(0, 50)}_fs_key`;
  await query(`CREATE UNIQUE INDEX IF NOT EXISTS ${quoteIdent(indexName)}
                 ON ${quoteIdent(schema)}.${quoteIdent(tableName)} ((${KEY_SQL}))`);
}

// Quotes an SQL identifier (as PostgreSQL's quote_ident does for any name).
export function quoteIdent(name) {
  return `"${String(name).replace(/"/g, '""')}"`;
}

// Adapts a pg.Client/pg.Pool (query) or a pg-boss db adapter (executeSql)
// to one query(text, values) function.
function queryFunction(client) {
  if (typeof client.executeSql === 'function') return (text, values) => client.executeSql(text, values);
  if (typeof client.query === 'function') return (text, values) => client.query(text, values);
  throw new TypeError('register() needs a pg.Client, a pg.Pool or a pg-boss db adapter');
}

// The candidate CTE of plans.fetchNextJob(): its SELECT list, table, the
// queue's name as pg-boss spliced it in, and everything up to its LIMIT.
const FETCH_CTE = /(\n\s*next AS \(\n\s*SELECT [^\n]*\n\s*FROM )(\S+) j(\n\s*WHERE j\.name = '((?:[^']|'')*)'[\s\S]*?\n\s*LIMIT (\d+))(\n\s*FOR UPDATE OF j SKIP LOCKED)?(\n\s*\))/;
// The UPDATE that makes the candidates active: only such a statement is a fetch.
const FETCH_UPDATE = /\n\s*UPDATE \S+ j SET\n\s*state = 'active',/;

// Rewrites pg-boss's fetch statement for a fair queue: its candidates come
// from fs_claim() (locked, leased, in fair order across tenants), filtered
// by the same conditions pg-boss puts on them. Returns null for any other
// statement, or a fetch from a queue not in `queues`; throws for a fetch it
// cannot parse (another pg-boss version). The fairshare queue name and the
// lease are bound as parameters after pg-boss's own; a NULL lease is the
// registration's (the queue's expiration plus a minute).
export function rewriteFetch(text, values, queues) {
  if (typeof text !== 'string' || !FETCH_UPDATE.test(text)) return null;
  const m = FETCH_CTE.exec(text);
  if (!m) {
    // a fetch of another shape (a pg-boss this package does not know):
    // refuse rather than fetch first in, first out unnoticed
    throw new Error('@fairshare/pg-boss does not recognise this pg-boss fetch statement; use a pg-boss version it supports');
  }
  const name = m[4].replace(/''/g, "'");
  const fair = queues.get(name);
  if (!fair) return null;
  const params = [...(values ?? [])];
  params.push(fair.fairQueue, fair.lease);
  const n = params.length;
  const claimed = `(SELECT (c.job).* FROM fs_claim($${n - 1}::text, NULL::${m[2]}, ${m[5]}, $${n}::interval) c)`;
  const cte = `${m[1]}${claimed} j${m[3]}${m[7]}`;
  return { text: text.slice(0, m.index) + cte + text.slice(m.index + m[0].length), values: params };
}

// Normalises the queues option to a Map of pg-boss queue name ->
// { fairQueue, lease }. Accepts ['q1', 'q2'] or { q1: { fairQueue, lease } }.
// A lease of null means the registration's: the queue's expiration plus a
// minute.
function queueMap(queues, lease) {
  const entries = Array.isArray(queues) ? queues.map((q) => [q, {}]) : Object.entries(queues ?? {});
  if (entries.length === 0) throw new TypeError('fairPgBoss() needs the queues to make fair');
  return new Map(entries.map(([name, o]) => [name, {
    fairQueue: o.fairQueue ?? fairQueueName(name),
    lease: o.lease ?? lease ?? null,
  }]));
}

// Wraps one adapter's executeSql so that fetches of fair queues are
// rewritten; every other statement passes through untouched.
function wrapExecuteSql(target, queues) {
  const original = target.executeSql.bind(target);
  target.executeSql = (text, values, ...rest) => {
    const fair = rewriteFetch(text, values, queues);
    return fair ? original(fair.text, fair.values, ...rest) : original(text, values, ...rest);
  };
}

// Makes the given queues of a PgBoss instance fair: call before start().
// Returns the same instance. Wraps its database adapter, which runs every
// fetch (transactional workers fetch through it too, before they open the
// handler's transaction).
//
//   const boss = fairPgBoss(new PgBoss(url), { queues: ['email'] });
export function fairPgBoss(boss, options = {}) {
  const queues = queueMap(options.queues, options.lease);
  const db = boss.getDb();
  if (db.__fairshare) throw new Error('fairPgBoss() was already applied to this instance');
  wrapExecuteSql(db, queues);
  Object.defineProperty(db, '__fairshare', { value: queues });
  return boss;
}

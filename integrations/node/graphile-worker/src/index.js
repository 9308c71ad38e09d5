// @fairshare/graphile-worker: graphile-worker 0.18 workers claim jobs in
// weighted fair order across tenants through the fairshare extension's
// fs_claim().
//
// graphile-worker builds its job claim in sql/getJobs.js (batchGetJobs) and
// runs it on a client of the pool it is given (run({ pgPool })); it has no
// plugin hook around that query. fairPool() wraps the pool's clients: the
// claim statement gets its candidate rows from fs_claim() (locked, leased, in
// fair order across tenants, only of the tasks the worker serves) instead of
// "ORDER BY priority, run_at ... FOR UPDATE SKIP LOCKED"; the named-queue
// locking, forbidden flags, one-job-per-queue rule of batches and the UPDATE
// that locks the jobs stay graphile-worker's own.

export const DEFAULT_TENANT = 'default';
export const DEFAULT_SCHEMA = 'graphile_worker';
export const DEFAULT_QUEUE = 'graphile_worker';
// graphile-worker treats a job locked for more than 4 hours as abandoned
// (its resetLockedAt frees it); a lease a little longer outlives that.
export const DEFAULT_LEASE = '4 hours 5 minutes';

// The SQL expression (as fs_register_queue stores it) giving a job's tenant:
// the payload's field `field`, or `defaultTenant` when missing or empty. A
// tenant fairshare cannot track (longer than 63 bytes, or "*") is replaced
// by its md5, so every job has a tenant and runs. Built by the server with
// format(%L), so the field and default are quoted as literals.
const TENANT_SQL = `format(
  'coalesce(CASE WHEN payload->>%1$L IN (%3$L, ''*'') THEN NULL
                 WHEN octet_length(payload->>%1$L) <= 63 THEN payload->>%1$L
                 ELSE md5(payload->>%1$L) END, %2$L)', $1::text, $2::text, '')`;

// Registers graphile-worker's job table with fairshare (run once, as a
// migration would, after graphile-worker's own migrations): ready rows are
// unlocked jobs with attempts left, claimable once run_at has come and their
// named queue (if any) is not locked; a job is running while locked_at is
// set, so its lease ends when it completes (deleted), fails (unlocked for a
// retry, or for good), or its lock is reset. The queue's lease is
// DEFAULT_LEASE (or `lease`); maxSlots (null: no limit) bounds the slots of
// a tenant without a limit of its own in fs_limits. The selector is the task id and
// the job's flags, so a worker claims only jobs of the tasks it serves and
// none with a flag it forbids.
export async function register(client, options = {}) {
  const {
    schema = DEFAULT_SCHEMA,
    queue = DEFAULT_QUEUE,
    tenantField = 'tenant',
    defaultTenant = DEFAULT_TENANT,
    maxSlots = null,
    lease = DEFAULT_LEASE,
  } = options;
  const s = quoteIdent(schema);
  await client.query(`CREATE OR REPLACE FUNCTION ${s}.fs_job_queue_available(queue_id integer)
    RETURNS boolean LANGUAGE sql STABLE AS $$
      SELECT queue_id IS NULL OR EXISTS (
        SELECT 1 FROM ${s}._private_job_queues q WHERE q.id = queue_id AND q.is_available)
    $$`);
  const { rows } = await client.query(
    `SELECT fs_register_queue($3, $4::regclass,
        tenant         => ${TENANT_SQL},
        order_by       => 'priority, run_at, id',
        filter         => format('locked_at IS NULL AND attempts < max_attempts AND run_at <= now()
                                  AND %I.fs_job_queue_available(job_queue_id)', $5::text),
        key            => 'id',
        running_table  => $4::regclass,
        running_filter => 'locked_at IS NOT NULL',
        selector       => $$task_id::text || ':' || coalesce(flags::text, '')$$,
        max_slots      => $6::integer,
        lease          => $7::interval) AS q`,
    [tenantField, defaultTenant, queue, `${s}._private_jobs`, schema, maxSlots, lease]);
  return { queue, registration: rows[0].q };
}

// Removes the registration (its triggers and the index fairshare made).
export async function unregister(client, options = {}) {
  const { rows } = await client.query('SELECT fs_unregister_queue($1) AS done',
    [options.queue ?? DEFAULT_QUEUE]);
  return rows[0].done;
}

// Quotes an SQL identifier (as PostgreSQL's quote_ident does for any name).
export function quoteIdent(name) {
  return `"${String(name).replace(/"/g, '""')}"`;
}

// The candidate CTE of graphile-worker's claim (getJobs.js): its name (j, or
// j_raw for batches), the jobs table, the conditions and the LIMIT, then the
// row locks fs_claim() takes instead.
const CLAIM_CTE = /^with (j|j_raw) as \(\n  select jobs\.job_queue_id, jobs\.priority, jobs\.run_at, jobs\.id\n    from (\S+\._private_jobs) as jobs\n(    where jobs\.is_available = true\n[\s\S]*?\n    limit (\d+))\n    for update\n    skip locked\n\)/;

// The UPDATE that locks the claimed jobs: only such a statement is a claim.
const CLAIM_UPDATE = /update \S+\._private_jobs as jobs\s+set\s+attempts = jobs\.attempts \+ 1,\s+locked_by = \$1::text/;

// Rewrites graphile-worker's claim statement so that its candidates come
// from fs_claim(): only jobs of the tasks in $2 (the task ids the worker
// serves) without a flag of $3 (the forbidden flags, when given), in fair
// order across tenants. Both are the claim's selection over the selector
// "<task_id>:<flags as jsonb text>": tasks as '<id>:*', each forbidden flag
// as '*:*"<flag>":*' (its JSON key), so a tenant whose next job is excluded
// has its other jobs claimed, not passed over. Returns null for any other
// statement; throws for a claim it cannot parse (another graphile-worker).
// The fairshare queue name and the lease are bound as parameters after
// graphile-worker's own; a NULL lease is the registration's.
export function rewriteClaim(text, values, options) {
  if (typeof text !== 'string') return null;
  const m = CLAIM_CTE.exec(text);
  if (!m) {
    // a claim of another shape (a graphile-worker this package does not
    // know): refuse rather than claim in the stock order unnoticed
    if (CLAIM_UPDATE.test(text)) {
      throw new Error('@fairshare/graphile-worker does not recognise this graphile-worker claim statement; use a graphile-worker version it supports');
    }
    return null;
  }
  const params = [...(values ?? [])];
  params.push(options.queue, options.lease);
  const q = `$${params.length - 1}::text`;
  const lease = `$${params.length}::interval`;
  const notIn = /\(flags \?\| \$3::text\[\]\)/.test(m[3])
    ? `(select array_agg('*:*' || to_jsonb(f)::text || ':*') from unnest($3::text[]) f)`
    : 'NULL';
  const claimed = `(select (c.job).* from fs_claim(${q}, NULL::${m[2]}, ${m[4]}, ${lease},
      selector_in => (select array_agg(t::text || ':*') from unnest($2::int[]) t),
      selector_not_in => ${notIn}) c)`;
  const cte = `with ${m[1]} as (\n  select jobs.job_queue_id, jobs.priority, jobs.run_at, jobs.id\n    from ${claimed} as jobs\n${m[3]}\n)`;
  return { text: cte + text.slice(m[0].length), values: params };
}

// Wraps a pg client's query(): graphile-worker's claim statement (always a
// { text, values, name } config) is rewritten; a named (prepared) claim gets
// a name of its own, so it never collides with the stock statement. The
// client's errors go to the pool's "error" listeners: graphile-worker adds
// its own client error handler only to pools without "connect" listeners.
function wrapClient(client, pool, options) {
  if (client.__fairshare) return;
  if (client.listenerCount('error') === 0) client.on('error', (e) => pool.emit('error', e));
  const original = client.query.bind(client);
  client.query = (config, ...rest) => {
    if (config && typeof config === 'object' && typeof config.text === 'string') {
      const fair = rewriteClaim(config.text, config.values, options);
      if (fair) {
        const name = config.name ? `fs_${config.name}`.slice(0, 63) : undefined;
        return original({ ...config, ...fair, name }, ...rest);
      }
    }
    return original(config, ...rest);
  };
  Object.defineProperty(client, '__fairshare', { value: true });
}

// Makes the workers that use this pg.Pool claim fairly; returns the pool.
// Pass it to graphile-worker as pgPool:
//
//   await run({ pgPool: fairPool(new pg.Pool({ connectionString })), taskList });
//
// options: queue (the fairshare queue registered with register()), lease
// (default: the registration's).
export function fairPool(pool, options = {}) {
  const settings = { queue: options.queue ?? DEFAULT_QUEUE, lease: options.lease ?? null };
  pool.on('connect', (client) => wrapClient(client, pool, settings));
  return pool;
}

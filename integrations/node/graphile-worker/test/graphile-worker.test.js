// graphile-worker 0.18 runners (real processes, test/worker.js) claiming
// through fairshare: task selection, priorities, named (serial) queues,
// retries, forbidden flags, run_at, the default tenant, exactly-once
// delivery, fairness, and PgBouncer.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { runMigrations, makeWorkerUtils } from 'graphile-worker';
import { register, rewriteClaim } from '../src/index.js';
import { createDatabase, withClient, startWorker, waitFor, startPgBouncer, sleep } from '../../test/helpers.js';

const WORKER = fileURLToPath(new URL('./worker.js', import.meta.url));
let db;

before(async () => {
  db = await createDatabase(process.env.FS_TEST_DB_GRAPHILE ?? 'fs_node_graphile');
  await runMigrations({ connectionString: url(db) });
  await withClient(db, async (c) => {
    await c.query(`CREATE TABLE runs (job_id bigint, task text, tenant text, worker text,
      attempt int, started_at timestamptz, finished_at timestamptz, ok boolean)`);
    await register(c);
  });
});

// A connection string for graphile-worker's own utilities.
function url(d) {
  return `postgres://${d.user}@/${d.database}?host=${encodeURIComponent(d.host)}&port=${d.port}`;
}

// Adds jobs through graphile-worker's own API (each spec: task, payload, options).
async function addJobs(specs) {
  const utils = await makeWorkerUtils({ connectionString: url(db) });
  try {
    for (const { task, payload, options } of specs) await utils.addJob(task, payload, options ?? {});
  } finally {
    await utils.release();
  }
}

// Adds many jobs of one task at once (graphile_worker.add_jobs through addJobs).
async function addBulk(task, payloads) {
  const utils = await makeWorkerUtils({ connectionString: url(db) });
  try {
    await utils.addJobs(payloads.map((payload) => ({ identifier: task, payload })));
  } finally {
    await utils.release();
  }
}

// The runs recorded for a task, oldest first.
async function runs(task) {
  return withClient(db, async (c) => (await c.query(
    'SELECT * FROM runs WHERE task = $1 ORDER BY started_at, finished_at', [task])).rows);
}

// Waits until `count` successful runs of the task are recorded.
function waitRuns(task, count, timeoutMs = 30000) {
  return waitFor(`${count} runs of ${task}`, async () => {
    const r = await runs(task);
    return r.filter((x) => x.ok).length >= count && r;
  }, timeoutMs);
}

// Leases fairshare holds for the queue now.
async function leasesHeld() {
  return withClient(db, async (c) => Number((await c.query(
    "SELECT coalesce(sum(slots_in_use), 0) AS n FROM fs_fair_shares WHERE queue = 'graphile_worker'")).rows[0].n));
}

// Starts n worker processes of the given config.
async function workers(n, config) {
  return Promise.all(Array.from({ length: n }, (_, i) =>
    startWorker(WORKER, { db, mode: 'fair', name: `w${i}`, ...config })));
}

// Stops the given workers.
const stopAll = (ws) => Promise.all(ws.map((w) => w.stop()));

test('only graphile-worker claim statements are rewritten', () => {
  assert.equal(rewriteClaim('select 1', [], { queue: 'q', lease: '1 hour' }), null);
  assert.equal(rewriteClaim(undefined, [], { queue: 'q', lease: '1 hour' }), null);
  const unknown = `with x as (select 1)
  update "graphile_worker"._private_jobs as jobs
    set
      attempts = jobs.attempts + 1,
      locked_by = $1::text, locked_at = now() from x returning *`;
  assert.throws(() => rewriteClaim(unknown, [], { queue: 'q', lease: '1 hour' }), /does not recognise/);
});

test('a worker claims only jobs of the tasks it serves', async () => {
  await addJobs([1, 2, 3].map((i) => ({ task: 'sel_a', payload: { tenant: `t${i}` } })));
  await addJobs([1, 2].map((i) => ({ task: 'sel_b', payload: { tenant: `t${i}` } })));
  const ws = await workers(1, { tasks: ['sel_a'], concurrency: 2 });
  try {
    await waitRuns('sel_a', 3);
    await sleep(1000);
    assert.equal((await runs('sel_b')).length, 0);
    const left = await withClient(db, async (c) => (await c.query(
      `SELECT count(*)::int AS n FROM graphile_worker.jobs WHERE task_identifier = 'sel_b' AND locked_at IS NULL`)).rows[0].n);
    assert.equal(left, 2);
  } finally {
    await stopAll(ws);
  }
});

test('within a tenant, lower priority numbers run first; tenants alternate', async () => {
  await addJobs([
    { task: 'prio', payload: { tenant: 'a', n: 1 }, options: { priority: 5 } },
    { task: 'prio', payload: { tenant: 'a', n: 2 }, options: { priority: 5 } },
    { task: 'prio', payload: { tenant: 'a', n: 3 }, options: { priority: -5 } },
    { task: 'prio', payload: { tenant: 'b', n: 4 }, options: { priority: 5 } },
    { task: 'prio', payload: { tenant: 'b', n: 5 }, options: { priority: 0 } },
  ]);
  const ws = await workers(1, { tasks: ['prio'], concurrency: 1 });
  try {
    const r = await waitRuns('prio', 5);
    // completed jobs are deleted with their payloads: n is the rank of the
    // job's id, as the jobs were added one by one in the order of n
    const ran = r.map((x) => Number(x.job_id));
    const ids = [...ran].sort((a, b) => a - b);
    const order = ran.map((id) => ids.indexOf(id) + 1);
    assert.deepEqual(order.filter((k) => k <= 3), [3, 1, 2], `tenant a: ${order}`);
    assert.deepEqual(order.filter((k) => k > 3), [5, 4], `tenant b: ${order}`);
    assert.equal(r.slice(0, 4).filter((x) => x.tenant === 'a').length, 2, 'alternation');
    await waitFor('leases released', async () => (await leasesHeld()) === 0);
  } finally {
    await stopAll(ws);
  }
});

test('a named queue runs one job at a time across fair workers', async () => {
  await addJobs(Array.from({ length: 6 }, (_, i) => ({
    task: 'serial', payload: { tenant: `t${i % 3}`, ms: 150 }, options: { queueName: 'one_at_a_time' },
  })));
  await addJobs(Array.from({ length: 4 }, (_, i) => ({ task: 'serial_free', payload: { tenant: `t${i % 2}`, ms: 150 } })));
  const ws = await workers(2, { tasks: ['serial', 'serial_free'], concurrency: 3 });
  try {
    const r = await waitRuns('serial', 6);
    for (let i = 1; i < r.length; i++) {
      assert.ok(r[i].started_at >= r[i - 1].finished_at, `run ${i} overlaps run ${i - 1}`);
    }
    await waitRuns('serial_free', 4);
  } finally {
    await stopAll(ws);
  }
});

test('a failed job is retried after its backoff until it succeeds; one out of attempts stays failed', async () => {
  await addJobs([
    { task: 'retry', payload: { tenant: 'r', failTimes: 1 }, options: { maxAttempts: 3 } },
    { task: 'retry_dead', payload: { tenant: 'r', failTimes: 9 }, options: { maxAttempts: 1 } },
  ]);
  const ws = await workers(1, { tasks: ['retry', 'retry_dead'], concurrency: 2 });
  try {
    const r = await waitRuns('retry', 1, 30000);
    assert.deepEqual(r.map((x) => [x.attempt, x.ok]), [[1, false], [2, true]]);
    assert.ok(r[1].started_at - r[0].finished_at >= 2000, 'the retry waited for its backoff (e^1 s)');
    await sleep(500);
    assert.deepEqual((await runs('retry_dead')).map((x) => [x.attempt, x.ok]), [[1, false]]);
    await waitFor('leases released', async () => (await leasesHeld()) === 0);
  } finally {
    await stopAll(ws);
  }
});

test('a job left locked by a killed worker runs again once its lock expires (4 h)', async () => {
  await addJobs([{ task: 'abandoned', payload: { tenant: 'x', msFirst: 60000 } }]);
  const [doomed] = await workers(1, { tasks: ['abandoned'], concurrency: 1, name: 'doomed' });
  const locked = `SELECT count(*)::int AS n FROM graphile_worker.jobs
                   WHERE task_identifier = 'abandoned' AND locked_at IS NOT NULL`;
  await waitFor('the job to be locked', async () =>
    (await withClient(db, (c) => c.query(locked))).rows[0].n === 1);
  assert.equal(await leasesHeld(), 1);
  const lease = await withClient(db, async (c) => (await c.query(`SELECT round(extract(epoch FROM
    expires_at - acquired_at))::int AS s FROM fs_leases WHERE queue = 'graphile_worker'`)).rows.map((x) => x.s));
  assert.deepEqual(lease, [4 * 3600 + 300], 'the lease outlives the 4 h lock by 5 minutes');
  doomed.proc.kill('SIGKILL');
  await doomed.stop();
  // four hours pass for the lock: graphile-worker's resetLockedAt frees it
  await withClient(db, (c) => c.query(`UPDATE graphile_worker._private_jobs SET locked_at = now() - interval '5 hours'
    WHERE locked_at IS NOT NULL AND task_id = (SELECT id FROM graphile_worker._private_tasks WHERE identifier = 'abandoned')`));
  const [w] = await workers(1, {
    tasks: ['abandoned'], concurrency: 1, name: 'rescuer',
    preset: { worker: { minResetLockedInterval: 200, maxResetLockedInterval: 400 } },
  });
  try {
    const r = await waitRuns('abandoned', 1, 30000);
    assert.deepEqual(r.map((x) => [x.worker, x.attempt]), [['rescuer', 2]]);
    await waitFor('leases released', async () => (await leasesHeld()) === 0);
  } finally {
    await w.stop();
  }
});

test('jobs with a forbidden flag are left alone; the others run', async () => {
  await addJobs([
    { task: 'flags', payload: { tenant: 'f', n: 1 }, options: { flags: ['paused'] } },
    { task: 'flags', payload: { tenant: 'f', n: 2 } },
    { task: 'flags', payload: { tenant: 'g', n: 3 } },
  ]);
  const ws = await workers(1, { tasks: ['flags'], concurrency: 1, forbiddenFlags: ['paused'] });
  try {
    await waitRuns('flags', 2);
    await sleep(1000);
    assert.equal((await runs('flags')).length, 2);
  } finally {
    await stopAll(ws);
  }
});

test('a job is not claimed before its run_at; a job without tenant runs as "default"', async () => {
  const sentAt = Date.now();
  await addJobs([
    { task: 'sched', payload: { tenant: 'later' }, options: { runAt: new Date(Date.now() + 3000) } },
    { task: 'sched', payload: { n: 1 } },
  ]);
  const ws = await workers(1, { tasks: ['sched'], concurrency: 1 });
  try {
    const r = await waitRuns('sched', 2, 20000);
    assert.equal(r[0].tenant, null, 'the job without tenant ran first');
    assert.equal(r[1].tenant, 'later');
    assert.ok(r[1].started_at.getTime() - sentAt >= 2900, 'not before run_at');
    const tenants = await withClient(db, async (c) => (await c.query(
      "SELECT tenant FROM fs_fair_shares WHERE queue = 'graphile_worker'")).rows.map((x) => x.tenant));
    assert.ok(tenants.includes('default'), `tenants: ${tenants}`);
  } finally {
    await stopAll(ws);
  }
});

test('tenants fairshare cannot track ("*", empty, over 63 bytes) still run', async () => {
  const long = 'x'.repeat(70);
  await addJobs(['*', '', long].map((tenant) => ({ task: 'odd', payload: { tenant } })));
  const ws = await workers(1, { tasks: ['odd'], concurrency: 1 });
  try {
    await waitRuns('odd', 3);
    const tenants = await withClient(db, async (c) => (await c.query(
      "SELECT tenant FROM fs_fair_shares WHERE queue = 'graphile_worker' AND tenant IN ('default', md5($1))",
      [long])).rows.map((x) => x.tenant));
    assert.equal(tenants.length, 2, `tenants: ${tenants}`);
  } finally {
    await stopAll(ws);
  }
});

test('nothing is lost or run twice with three worker processes', async () => {
  await addBulk('many', Array.from({ length: 600 }, (_, i) => ({ tenant: `t${i % 7}`, ms: 2 })));
  const ws = await workers(3, { tasks: ['many'], concurrency: 3 });
  try {
    const r = await waitRuns('many', 600, 60000);
    await sleep(1000);
    const all = await runs('many');
    assert.equal(all.length, 600);
    assert.equal(new Set(all.map((x) => x.job_id)).size, 600);
    assert.equal(new Set(r.map((x) => x.worker)).size, 3, 'every worker took part');
    await waitFor('leases released', async () => (await leasesHeld()) === 0);
  } finally {
    await stopAll(ws);
  }
});

test('runners with a local queue (batched claims) lose nothing and run nothing twice', async () => {
  const released = async () => withClient(db, async (c) => Number((await c.query(
    "SELECT rows_released FROM fs_fairness WHERE queue = 'graphile_worker'")).rows[0].rows_released));
  const releasedBefore = await released();
  await addBulk('batched', Array.from({ length: 300 }, (_, i) => ({ tenant: `t${i % 5}`, ms: 2 })));
  await addJobs(Array.from({ length: 4 }, (_, i) => ({
    task: 'batched', payload: { tenant: `q${i}`, ms: 100 }, options: { queueName: 'batched_serial' },
  })));
  const ws = await workers(2, { tasks: ['batched'], concurrency: 2, preset: { worker: { localQueue: { size: 8 } } } });
  try {
    await waitRuns('batched', 304, 60000);
    await sleep(500);
    const all = await runs('batched');
    assert.equal(all.length, 304);
    assert.equal(new Set(all.map((x) => x.job_id)).size, 304);
    await waitFor('every lease released through fairshare', async () => (await released()) - releasedBefore >= 304);
    const serial = all.filter((x) => x.tenant.startsWith('q'));
    for (let i = 1; i < serial.length; i++) {
      assert.ok(serial[i].started_at >= serial[i - 1].finished_at, `serial run ${i} overlaps run ${i - 1}`);
    }
    await waitFor('leases released', async () => (await leasesHeld()) === 0);
  } finally {
    await stopAll(ws);
  }
});

test('a greedy tenant with thousands of jobs does not starve small tenants trickling in', async () => {
  await addBulk('fair', Array.from({ length: 3000 }, () => ({ tenant: 'greedy', ms: 10 })));
  const ws = await workers(2, { tasks: ['fair'], concurrency: 2 });
  try {
    const sent = [];
    const utils = await makeWorkerUtils({ connectionString: url(db) });
    try {
      for (let i = 0; i < 20; i++) {
        const job = await utils.addJob('fair', { tenant: `small_${i % 5}`, ms: 10 });
        sent.push([String(job.id), Date.now()]);
        await sleep(100);
      }
    } finally {
      await utils.release();
    }
    const sentAt = new Map(sent);
    const r = await waitFor('the small jobs', async () => {
      const all = await runs('fair');
      return all.filter((x) => sentAt.has(String(x.job_id))).length === 20 && all;
    }, 60000);
    const waits = r.filter((x) => sentAt.has(String(x.job_id)))
      .map((x) => x.started_at.getTime() - sentAt.get(String(x.job_id))).sort((a, b) => a - b);
    const greedyDone = r.filter((x) => x.tenant === 'greedy').length;
    console.log(`# small tenants' wait: median ${waits[10]} ms, max ${waits[19]} ms; greedy jobs run meanwhile: ${greedyDone} of 3000`);
    assert.ok(greedyDone < 2500, 'the small jobs ran while the greedy backlog was still there');
    assert.ok(waits[19] < 3000, `max wait ${waits[19]} ms`);
  } finally {
    await stopAll(ws);
    // the rest of the greedy backlog (and a job a stopped runner left locked)
    await withClient(db, (c) => c.query(`DELETE FROM graphile_worker._private_jobs WHERE task_id =
      (SELECT id FROM graphile_worker._private_tasks WHERE identifier = 'fair')`));
  }
});

test('for contrast, stock workers leave the small tenants behind the greedy backlog', async () => {
  await addBulk('stock', Array.from({ length: 3000 }, () => ({ tenant: 'greedy', ms: 10 })));
  const ws = await workers(2, { mode: 'fifo', tasks: ['stock'], concurrency: 2 });
  try {
    await addJobs(Array.from({ length: 5 }, (_, i) => ({ task: 'stock', payload: { tenant: `small_${i}`, ms: 10 } })));
    await sleep(2000);
    const r = await runs('stock');
    assert.ok(r.length > 20, `the stock workers ran ${r.length} jobs`);
    assert.equal(r.filter((x) => x.tenant !== 'greedy').length, 0, 'no small job ran');
  } finally {
    await stopAll(ws);
    await withClient(db, (c) => c.query(`DELETE FROM graphile_worker._private_jobs WHERE task_id =
      (SELECT id FROM graphile_worker._private_tasks WHERE identifier = 'stock')`));
  }
});

test('workers connected through PgBouncer in transaction mode (no prepared statements)', async () => {
  const bouncer = await startPgBouncer(db.database);
  try {
    await addBulk('bouncer', Array.from({ length: 200 }, (_, i) => ({ tenant: `t${i % 4}`, ms: 2 })));
    const ws = await Promise.all([0, 1].map((i) => startWorker(WORKER, {
      db: bouncer.db, mode: 'fair', name: `b${i}`, tasks: ['bouncer'], concurrency: 3, preparedStatements: false,
    })));
    try {
      await waitRuns('bouncer', 200, 60000);
      await sleep(500);
      const all = await runs('bouncer');
      assert.equal(all.length, 200);
      assert.equal(new Set(all.map((x) => x.job_id)).size, 200);
      await waitFor('leases released', async () => (await leasesHeld()) === 0);
    } finally {
      await stopAll(ws);
    }
  } finally {
    await bouncer.stop();
  }
});

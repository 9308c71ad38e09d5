// pg-boss 12 workers (real processes, test/worker.js) claiming through
// fairshare: selection, priorities, policies, retries, scheduling, the
// default tenant, exactly-once delivery, fairness, and PgBouncer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { PgBoss } from 'pg-boss';
import { register, rewriteFetch } from '../src/index.js';
import { createDatabase, withClient, startWorker, waitFor, startPgBouncer, sleep } from '../../test/helpers.js';

const WORKER = fileURLToPath(new URL('./worker.js', import.meta.url));
let db;
let boss;

before(async () => {
  db = await createDatabase(process.env.FS_TEST_DB_PGBOSS ?? 'fs_node_pgboss');
  boss = new PgBoss({ ...db, schedule: false, supervise: false, monitorIntervalSeconds: 1 });
  boss.on('error', (e) => console.error(e.message));
  await boss.start();
  await withClient(db, (c) => c.query(`CREATE TABLE runs (job_id uuid, queue text, tenant text,
    worker text, attempt int, started_at timestamptz, finished_at timestamptz, ok boolean)`));
});

after(async () => {
  await boss?.stop({ graceful: false, wait: true });
});

// Creates a pg-boss queue and registers it with fairshare.
async function fairQueue(name, options = {}, registration = {}) {
  await boss.createQueue(name, options);
  return register(boss.getDb(), name, registration);
}

// Whether any two of the runs overlap in time.
function overlapping(r) {
  const sorted = [...r].sort((a, b) => a.started_at - b.started_at);
  return sorted.some((x, i) => i > 0 && x.started_at < sorted[i - 1].finished_at);
}

// Sends jobs one by one (each its own insert, in order) and returns their ids.
async function sendAll(queue, jobs) {
  const ids = [];
  for (const { data, options } of jobs) ids.push(await boss.send(queue, data, options ?? {}));
  return ids;
}

// The runs recorded for a queue, oldest first.
async function runs(queue) {
  return withClient(db, async (c) => (await c.query(
    'SELECT * FROM runs WHERE queue = $1 ORDER BY started_at, finished_at', [queue])).rows);
}

// Waits until `count` successful runs of the queue are recorded.
function waitRuns(queue, count, timeoutMs = 30000) {
  return waitFor(`${count} runs of ${queue}`, async () => {
    const r = await runs(queue);
    return r.filter((x) => x.ok).length >= count && r;
  }, timeoutMs);
}

// Leases fairshare holds for a queue now.
async function leasesHeld(fairQueueName) {
  return withClient(db, async (c) => Number((await c.query(
    'SELECT coalesce(sum(slots_in_use), 0) AS n FROM fs_fair_shares WHERE queue = $1',
    [fairQueueName])).rows[0].n));
}

// The lengths of the leases held in a queue, in seconds.
async function leaseSeconds(fairQueueName) {
  return withClient(db, async (c) => (await c.query(
    'SELECT round(extract(epoch FROM expires_at - acquired_at))::int AS s FROM fs_leases WHERE queue = $1',
    [fairQueueName])).rows.map((x) => x.s));
}

// Starts n worker processes of the given config.
async function workers(n, config) {
  return Promise.all(Array.from({ length: n }, (_, i) =>
    startWorker(WORKER, { db, mode: 'fair', name: `w${i}`, ...config })));
}

test('only a pg-boss fetch of a fair queue is rewritten', () => {
  const queues = new Map([['a', { fairQueue: 'pgboss/a', lease: '16 minutes' }]]);
  assert.equal(rewriteFetch('SELECT 1', [], queues), null);
  assert.equal(rewriteFetch(undefined, [], queues), null);
  const unknown = `WITH next AS (SELECT id FROM pgboss.job_common WHERE name = 'a' LIMIT 1)
      UPDATE pgboss.job_common j SET
        state = 'active', started_on = now() FROM next WHERE j.id = next.id RETURNING j.id`;
  assert.throws(() => rewriteFetch(unknown, [], queues), /does not recognise/);
});

test('a worker claims only from the queue it works; the other queue keeps its jobs', async () => {
  await fairQueue('sel_a');
  await fairQueue('sel_b');
  await sendAll('sel_a', [1, 2, 3].map((i) => ({ data: { tenant: `t${i}` } })));
  const idsB = await sendAll('sel_b', [1, 2].map((i) => ({ data: { tenant: `t${i}` } })));
  const [w] = await workers(1, { queues: ['sel_a'], batchSize: 2 });
  try {
    await waitRuns('sel_a', 3);
    await sleep(1000);
    assert.equal((await runs('sel_b')).length, 0);
    for (const id of idsB) assert.equal((await boss.getJobById('sel_b', id)).state, 'created');
  } finally {
    await w.stop();
  }
});

test('within a tenant, higher priority runs first; tenants alternate', async () => {
  const { fairQueue: fq } = await fairQueue('prio');
  await sendAll('prio', [
    { data: { tenant: 'a', n: 1 }, options: { priority: 0 } },
    { data: { tenant: 'a', n: 2 }, options: { priority: 0 } },
    { data: { tenant: 'a', n: 3 }, options: { priority: 10 } },
    { data: { tenant: 'b', n: 4 }, options: { priority: 0 } },
    { data: { tenant: 'b', n: 5 }, options: { priority: 5 } },
  ]);
  const [w] = await workers(1, { queues: ['prio'], batchSize: 1 });
  try {
    const r = await waitRuns('prio', 5);
    const order = r.map((x) => x.tenant);
    const ids = r.map((x) => x.job_id);
    const data = await Promise.all(ids.map(async (id) => (await boss.getJobById('prio', id)).data.n));
    assert.deepEqual(data.filter((n) => n <= 3), [3, 1, 2], 'tenant a: priority 10 first, then in order');
    assert.deepEqual(data.filter((n) => n > 3), [5, 4], 'tenant b: priority 5 first');
    assert.ok(order.slice(0, 4).filter((t) => t === 'a').length === 2, `alternation: ${order}`);
    await waitFor('leases released', async () => (await leasesHeld(fq)) === 0);
  } finally {
    await w.stop();
  }
});

test('a singleton queue never runs two jobs at once, even with several fair workers', async () => {
  await fairQueue('single', { policy: 'singleton' });
  await sendAll('single', Array.from({ length: 6 }, (_, i) => ({ data: { tenant: `t${i % 3}`, ms: 150 } })));
  const ws = await workers(2, { queues: ['single'], batchSize: 2, localConcurrency: 2 });
  try {
    const r = await waitRuns('single', 6);
    for (let i = 1; i < r.length; i++) {
      assert.ok(r[i].started_at >= r[i - 1].finished_at, `run ${i} overlaps run ${i - 1}`);
    }
  } finally {
    await Promise.all(ws.map((w) => w.stop()));
  }
});

test('a failed job goes back to retry and is claimed again until it succeeds', async () => {
  const { fairQueue: fq } = await fairQueue('retry', { retryLimit: 3, retryDelay: 1 });
  const [id] = await sendAll('retry', [{ data: { tenant: 'r', failTimes: 2 } }]);
  const [w] = await workers(1, { queues: ['retry'] });
  try {
    const r = await waitRuns('retry', 1, 40000);
    assert.deepEqual(r.map((x) => [x.attempt, x.ok]), [[0, false], [1, false], [2, true]]);
    await waitFor('completed', async () => (await boss.getJobById('retry', id)).state === 'completed');
    await waitFor('leases released', async () => (await leasesHeld(fq)) === 0);
  } finally {
    await w.stop();
  }
});

test('a lone tenant uses every free worker by default; maxSlots bounds it', async () => {
  await fairQueue('solo_free');
  await fairQueue('solo_one', {}, { maxSlots: 1 });
  const jobs = Array.from({ length: 6 }, () => ({ data: { tenant: 'solo', ms: 300 } }));
  await sendAll('solo_free', jobs);
  await sendAll('solo_one', jobs);
  const ws = await workers(2, { queues: ['solo_free', 'solo_one'], batchSize: 2 });
  try {
    assert.ok(overlapping(await waitRuns('solo_free', 6)), 'without a limit, its jobs ran side by side');
    assert.ok(!overlapping(await waitRuns('solo_one', 6)), 'with maxSlots 1, one at a time');
  } finally {
    await Promise.all(ws.map((w) => w.stop()));
  }
});

test('a job whose worker died expires, goes back to retry, and another worker runs it', async () => {
  const { fairQueue: fq } = await fairQueue('expire', { expireInSeconds: 2, retryLimit: 1, retryDelay: 0 });
  const [id] = await sendAll('expire', [{ data: { tenant: 'x', msFirst: 60000 } }]);
  const [doomed] = await workers(1, { queues: ['expire'], name: 'doomed' });
  await waitFor('the job to be active', async () => (await boss.getJobById('expire', id)).state === 'active');
  assert.equal(await leasesHeld(fq), 1);
  assert.deepEqual(await leaseSeconds(fq), [62], 'the lease is the expiration plus a minute');
  doomed.proc.kill('SIGKILL');
  await doomed.stop();
  // pg-boss's supervisor fails the expired job (state retry): its lease ends
  await waitFor('the job to expire', async () => {
    await boss.supervise('expire');
    return (await boss.getJobById('expire', id)).state === 'retry';
  }, 20000, 500);
  await waitFor('the lease released', async () => (await leasesHeld(fq)) === 0);
  const [w] = await workers(1, { queues: ['expire'], name: 'rescuer' });
  try {
    const r = await waitRuns('expire', 1, 30000);
    assert.deepEqual(r.map((x) => [x.worker, x.attempt]), [['rescuer', 1]]);
    await waitFor('completed', async () => (await boss.getJobById('expire', id)).state === 'completed');
    await waitFor('leases released', async () => (await leasesHeld(fq)) === 0);
  } finally {
    await w.stop();
  }
});

test('a job with startAfter is not claimed before its time; a job without tenant runs as "default"', async () => {
  await fairQueue('sched');
  const sentAt = Date.now();
  await sendAll('sched', [
    { data: { tenant: 'later' }, options: { startAfter: 3 } },
    { data: { n: 1 } },
  ]);
  const [w] = await workers(1, { queues: ['sched'] });
  try {
    const r = await waitRuns('sched', 2, 20000);
    assert.equal(r[0].tenant, null, 'the job without tenant ran first');
    assert.equal(r[1].tenant, 'later');
    assert.ok(r[1].started_at.getTime() - sentAt >= 2900, 'not before startAfter');
    const shares = await withClient(db, async (c) => (await c.query(
      "SELECT tenant FROM fs_fair_shares WHERE queue = 'pgboss/sched' ORDER BY 1")).rows.map((x) => x.tenant));
    assert.ok(shares.includes('default'), `tenants: ${shares}`);
  } finally {
    await w.stop();
  }
});

test('tenants fairshare cannot track ("*", empty, over 63 bytes) still run', async () => {
  const long = 'x'.repeat(70);
  await fairQueue('odd');
  await sendAll('odd', ['*', '', long].map((tenant) => ({ data: { tenant } })));
  const [w] = await workers(1, { queues: ['odd'] });
  try {
    await waitRuns('odd', 3);
    const tenants = await withClient(db, async (c) => (await c.query(
      "SELECT tenant FROM fs_fair_shares WHERE queue = 'pgboss/odd' ORDER BY 1")).rows.map((x) => x.tenant));
    const md5 = await withClient(db, async (c) => (await c.query('SELECT md5($1) AS h', [long])).rows[0].h);
    assert.deepEqual(tenants, [md5, 'default'].sort());
  } finally {
    await w.stop();
  }
});

test('nothing is lost or run twice with three worker processes', async () => {
  const { fairQueue: fq } = await fairQueue('many');
  const jobs = Array.from({ length: 600 }, (_, i) => ({ tenant: `t${i % 7}`, ms: 2 }));
  await boss.insert('many', jobs.map((data) => ({ data })));
  const ws = await workers(3, { queues: ['many'], batchSize: 5, localConcurrency: 2 });
  try {
    const r = await waitRuns('many', 600, 60000);
    await sleep(1000);
    const all = await runs('many');
    assert.equal(all.length, 600);
    assert.equal(new Set(all.map((x) => x.job_id)).size, 600);
    assert.equal(new Set(r.map((x) => x.worker)).size, 3, 'every worker took part');
    await waitFor('leases released', async () => (await leasesHeld(fq)) === 0);
  } finally {
    await Promise.all(ws.map((w) => w.stop()));
  }
});

test('transactional workers fetch fairly too', async () => {
  const { fairQueue: fq } = await fairQueue('tx');
  await boss.insert('tx', Array.from({ length: 40 }, (_, i) => ({ data: { tenant: `t${i % 4}`, ms: 5 } })));
  const ws = await workers(2, { queues: ['tx'], batchSize: 2, transactional: true });
  try {
    await waitRuns('tx', 40, 30000);
    await sleep(500);
    const all = await runs('tx');
    assert.equal(new Set(all.map((x) => x.job_id)).size, 40);
    assert.equal(all.length, 40);
    const released = await withClient(db, async (c) => Number((await c.query(
      'SELECT rows_released FROM fs_fairness WHERE queue = $1', [fq])).rows[0].rows_released));
    assert.equal(released, 40, 'every job was claimed through fairshare and its lease released');
  } finally {
    await Promise.all(ws.map((w) => w.stop()));
  }
});

test('a greedy tenant with thousands of jobs does not starve small tenants trickling in', async () => {
  await fairQueue('fair');
  await boss.insert('fair', Array.from({ length: 3000 }, () => ({ data: { tenant: 'greedy', ms: 10 } })));
  const ws = await workers(2, { queues: ['fair'], batchSize: 4, localConcurrency: 1 });
  try {
    const sent = [];
    for (let i = 0; i < 20; i++) {
      const tenant = `small_${i % 5}`;
      sent.push([await boss.send('fair', { tenant, ms: 10 }), Date.now()]);
      await sleep(100);
    }
    const smallIds = new Set(sent.map(([id]) => id));
    const r = await waitFor('the small jobs', async () => {
      const all = await runs('fair');
      return all.filter((x) => smallIds.has(x.job_id)).length === 20 && all;
    }, 60000);
    const sentAt = new Map(sent);
    const waits = r.filter((x) => smallIds.has(x.job_id)).map((x) => x.started_at.getTime() - sentAt.get(x.job_id));
    const greedyDone = r.filter((x) => x.tenant === 'greedy').length;
    waits.sort((a, b) => a - b);
    console.log(`# small tenants' wait: median ${waits[10]} ms, max ${waits[19]} ms; greedy jobs run meanwhile: ${greedyDone} of 3000`);
    assert.ok(greedyDone < 2500, 'the small jobs ran while the greedy backlog was still there');
    assert.ok(waits[19] < 3000, `max wait ${waits[19]} ms`);
  } finally {
    await Promise.all(ws.map((w) => w.stop()));
    await boss.deleteAllJobs('fair');
  }
});

test('for contrast, stock workers leave the small tenants behind the greedy backlog', async () => {
  await boss.createQueue('stock');
  await boss.insert('stock', Array.from({ length: 3000 }, () => ({ data: { tenant: 'greedy', ms: 10 } })));
  const ws = await workers(2, { mode: 'fifo', queues: ['stock'], batchSize: 4, localConcurrency: 1 });
  try {
    for (let i = 0; i < 5; i++) {
      await boss.send('stock', { tenant: `small_${i}`, ms: 10 });
      await sleep(100);
    }
    await sleep(2500);
    const r = await runs('stock');
    assert.ok(r.length > 20, `the stock workers ran ${r.length} jobs`);
    assert.equal(r.filter((x) => x.tenant !== 'greedy').length, 0, 'no small job ran');
  } finally {
    await Promise.all(ws.map((w) => w.stop()));
    await boss.deleteAllJobs('stock');
  }
});

test('workers connected through PgBouncer in transaction mode', async () => {
  const { fairQueue: fq } = await fairQueue('bouncer');
  const bouncer = await startPgBouncer(db.database);
  try {
    await boss.insert('bouncer', Array.from({ length: 200 }, (_, i) => ({ data: { tenant: `t${i % 4}`, ms: 2 } })));
    const ws = await Promise.all([0, 1].map((i) =>
      startWorker(WORKER, { db: bouncer.db, mode: 'fair', name: `b${i}`, queues: ['bouncer'], batchSize: 4, localConcurrency: 2 })));
    try {
      await waitRuns('bouncer', 200, 60000);
      await sleep(500);
      const all = await runs('bouncer');
      assert.equal(all.length, 200);
      assert.equal(new Set(all.map((x) => x.job_id)).size, 200);
      await waitFor('leases released', async () => (await leasesHeld(fq)) === 0);
    } finally {
      await Promise.all(ws.map((w) => w.stop()));
    }
  } finally {
    await bouncer.stop();
  }
});

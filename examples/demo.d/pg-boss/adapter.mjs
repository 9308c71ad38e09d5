// The demo adapter for pg-boss 12 (see README.md beside it): one command per
// run of the executables setup, register, worker and enqueue. Real pg-boss,
// from integrations/node/pg-boss's pinned dependencies; --mode fair adds the
// one line fairPgBoss(...) and nothing else.
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const pkgDir = process.env.FS_NODE_PACKAGE_DIR;
const root = process.env.FS_ROOT;
const requireFromPkg = createRequire(join(pkgDir, 'package.json'));
// Imports a dependency of the integration package (its node_modules).
const load = (name) => import(pathToFileURL(requireFromPkg.resolve(name)).href);

const { PgBoss } = await load('pg-boss');
const { fairPgBoss, register } = await import(pathToFileURL(join(pkgDir, 'src/index.js')).href);
const { arrivals, parseOptions, sleep } = await import(pathToFileURL(join(root, 'integrations/node/demo/traffic.js')).href);

const QUEUE = 'demo';
const url = process.env.DATABASE_URL;

// A pg-boss instance for the commands that only send or set up (no
// maintenance, no schedules).
function plainBoss(options = {}) {
  const boss = new PgBoss({ connectionString: url, supervise: false, schedule: false, ...options });
  boss.on('error', (e) => console.error('pg-boss:', e.message));
  return boss;
}

// setup: drops pg-boss's schema (and with it the queue's registration) and
// lets pg-boss create it again, with the demo's queue.
async function setup() {
  const { default: pg } = await load('pg');
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  await client.query('DROP SCHEMA IF EXISTS pgboss CASCADE');
  await client.end();
  const fresh = plainBoss({ max: 2 });
  await fresh.start();
  await fresh.createQueue(QUEUE, { retryLimit: 0 });
  await fresh.stop({ graceful: false, wait: true });
}

// register: registers the queue with fairshare, every tenant allowed any
// number of slots.
async function registerQueue() {
  const boss = plainBoss({ max: 2 });
  await boss.start();
  const { fairQueue } = await register(boss.getDb(), QUEUE);
  console.log(`registered pg-boss queue "${QUEUE}" as fairshare queue "${fairQueue}"`);
  await boss.stop({ graceful: false, wait: true });
}

// worker: one pg-boss process, fetching batches of --threads jobs and running
// them at once, until SIGTERM/SIGINT.
async function worker(o) {
  const threads = Number(o.threads ?? 1);
  const name = o.name ?? `pg-boss-${process.pid}`;
  let boss = new PgBoss({ connectionString: url, max: threads + 4, schedule: false });
  if (o.mode === 'fair') boss = fairPgBoss(boss, { queues: [QUEUE] });
  else if (o.mode !== 'fifo') throw new Error('--mode is fifo or fair');
  boss.on('error', (e) => console.error(`${name}:`, e.message));
  await boss.start();
  const db = boss.getDb();
  // The job handler: records the start, then works for job_ms.
  const run = async (job) => {
    await db.executeSql('INSERT INTO demo_started (ref, worker, started_at) VALUES ($1, $2, clock_timestamp())',
      [job.data.ref, name]);
    await sleep(job.data.job_ms ?? 0);
  };
  await boss.work(QUEUE, { batchSize: threads, burstWhenBatchFull: true, pollingIntervalSeconds: 0.5 },
    (jobs) => Promise.all(jobs.map(run)));
  // Up: the demo starts its traffic once every worker says so.
  await db.executeSql('INSERT INTO demo_ready (worker) VALUES ($1)', [name]);
  await untilSignal();
  await boss.stop({ graceful: true, wait: true, timeout: 3000 });
}

// enqueue: the greedy burst through boss.insert(), then the small tenants'
// Poisson arrivals through boss.send(), each after its demo_enqueued row.
async function enqueue(o) {
  const greedy = Number(o.greedyJobs ?? 0);
  const jobMs = Number(o.jobMs ?? 50);
  const plan = arrivals({
    seed: Number(o.seed ?? 42), seconds: Number(o.seconds ?? 20),
    smallRate: Number(o.smallRate ?? 8), smallTenants: Number(o.smallTenants ?? 20),
  });
  const boss = plainBoss({ max: 2 });
  await boss.start();
  const db = boss.getDb();
  const start = performance.now();
  for (let from = 0; from < greedy; from += 1000) {
    const refs = Array.from({ length: Math.min(1000, greedy - from) }, (_, i) => `g-${from + i + 1}`);
    await db.executeSql(`INSERT INTO demo_enqueued (ref, tenant, enqueued_at)
      SELECT r, 'greedy', clock_timestamp() FROM unnest($1::text[]) r`, [refs]);
    await boss.insert(QUEUE, refs.map((ref) => ({ data: { tenant: 'greedy', ref, job_ms: jobMs } })));
  }
  const perTenant = new Map();
  for (const [at, n] of plan) {
    const delay = at * 1000 - (performance.now() - start);
    if (delay > 0) await sleep(delay);
    const k = (perTenant.get(n) ?? 0) + 1;
    perTenant.set(n, k);
    const ref = `s-${n}-${k}`;
    const tenant = `small_${n}`;
    await db.executeSql('INSERT INTO demo_enqueued (ref, tenant, enqueued_at) VALUES ($1, $2, clock_timestamp())',
      [ref, tenant]);
    await boss.send(QUEUE, { tenant, ref, job_ms: jobMs });
  }
  await boss.stop({ graceful: false, wait: true });
  console.error(`enqueued ${greedy} greedy jobs and ${plan.length} small-tenant jobs`);
}

// Resolves on the first SIGTERM or SIGINT.
function untilSignal() {
  return new Promise((resolve) => {
    process.once('SIGTERM', resolve);
    process.once('SIGINT', resolve);
  });
}

const [command, ...rest] = process.argv.slice(2);
const commands = { setup, register: registerQueue, worker, enqueue };
if (!commands[command]) throw new Error(`unknown command ${command}`);
await commands[command](parseOptions(rest));
process.exit(0);

// The demo adapter for graphile-worker 0.18 (see README.md beside it): one
// command per run of the executables setup, register, worker and enqueue.
// Real graphile-worker, from integrations/node/graphile-worker's pinned
// dependencies; --mode fair adds the one wrapper fairPool(...) around the
// pool given to run() and nothing else.
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const pkgDir = process.env.FS_NODE_PACKAGE_DIR;
const root = process.env.FS_ROOT;
const requireFromPkg = createRequire(join(pkgDir, 'package.json'));
// Imports a dependency of the integration package (its node_modules).
const load = (name) => import(pathToFileURL(requireFromPkg.resolve(name)).href);

const { run, runMigrations, makeWorkerUtils, Logger } = await load('graphile-worker');
const { default: pg } = await load('pg');
const { fairPool, register } = await import(pathToFileURL(join(pkgDir, 'src/index.js')).href);
const { arrivals, parseOptions, sleep } = await import(pathToFileURL(join(root, 'integrations/node/demo/traffic.js')).href);

const TASK = 'demo';
const url = process.env.DATABASE_URL;

// Runs fn with a connected pg client.
async function withClient(fn) {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

// setup: drops graphile-worker's schema (and with it the registration) and
// runs its migrations again.
async function setup() {
  await withClient((c) => c.query('DROP SCHEMA IF EXISTS graphile_worker CASCADE'));
  await runMigrations({ connectionString: url, logger: quietLogger('setup') });
}

// register: registers graphile-worker's job table with fairshare, every
// tenant allowed any number of slots.
async function registerQueue() {
  const { queue } = await withClient((c) => register(c));
  console.log(`registered graphile-worker's jobs as fairshare queue "${queue}"`);
}

// Logs warnings and errors only (graphile-worker logs every job at info).
function quietLogger(name) {
  return new Logger(() => (level, message) => {
    if (level === 'error' || level === 'warning') console.error(`${name} ${level}: ${message}`);
  });
}

// worker: one graphile-worker runner with --threads concurrency, until
// SIGTERM/SIGINT.
async function worker(o) {
  const threads = Number(o.threads ?? 1);
  const name = o.name ?? `graphile-worker-${process.pid}`;
  if (o.mode !== 'fair' && o.mode !== 'fifo') throw new Error('--mode is fifo or fair');
  const pool = new pg.Pool({ connectionString: url, max: threads + 4 });
  pool.on('error', (e) => console.error(`${name}:`, e.message));
  pool.on('connect', (client) => client.on('error', (e) => console.error(`${name}:`, e.message)));
  const pgPool = o.mode === 'fair' ? fairPool(pool) : pool;
  const runner = await run({
    pgPool,
    concurrency: threads,
    noHandleSignals: true,
    logger: quietLogger(name),
    taskList: {
      // The job handler: records the start, then works for job_ms.
      [TASK]: async (payload) => {
        await pool.query('INSERT INTO demo_started (ref, worker, started_at) VALUES ($1, $2, clock_timestamp())',
          [payload.ref, name]);
        await sleep(payload.job_ms ?? 0);
      },
    },
  });
  // Up: the demo starts its traffic once every worker says so.
  await pool.query('INSERT INTO demo_ready (worker) VALUES ($1)', [name]);
  await untilSignal();
  await runner.stop();
  await pool.end();
}

// enqueue: the greedy burst through addJobs(), then the small tenants'
// Poisson arrivals through addJob(), each after its demo_enqueued row.
async function enqueue(o) {
  const greedy = Number(o.greedyJobs ?? 0);
  const jobMs = Number(o.jobMs ?? 50);
  const plan = arrivals({
    seed: Number(o.seed ?? 42), seconds: Number(o.seconds ?? 20),
    smallRate: Number(o.smallRate ?? 8), smallTenants: Number(o.smallTenants ?? 20),
  });
  const utils = await makeWorkerUtils({ connectionString: url, logger: quietLogger('enqueue') });
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const start = performance.now();
  for (let from = 0; from < greedy; from += 1000) {
    const refs = Array.from({ length: Math.min(1000, greedy - from) }, (_, i) => `g-${from + i + 1}`);
    await client.query(`INSERT INTO demo_enqueued (ref, tenant, enqueued_at)
      SELECT r, 'greedy', clock_timestamp() FROM unnest($1::text[]) r`, [refs]);
    await utils.addJobs(refs.map((ref) => ({ identifier: TASK, payload: { tenant: 'greedy', ref, job_ms: jobMs } })));
  }
  const perTenant = new Map();
  for (const [at, n] of plan) {
    const delay = at * 1000 - (performance.now() - start);
    if (delay > 0) await sleep(delay);
    const k = (perTenant.get(n) ?? 0) + 1;
    perTenant.set(n, k);
    const ref = `s-${n}-${k}`;
    const tenant = `small_${n}`;
    await client.query('INSERT INTO demo_enqueued (ref, tenant, enqueued_at) VALUES ($1, $2, clock_timestamp())',
      [ref, tenant]);
    await utils.addJob(TASK, { tenant, ref, job_ms: jobMs });
  }
  await client.end();
  await utils.release();
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

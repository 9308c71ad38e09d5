// A real graphile-worker process for the tests: runs the configured tasks
// (fair through fairPool, or stock) and records each run in table runs.
// Config (JSON, argv[2]): db, tasks, mode ('fair'|'fifo'), concurrency, name,
// preparedStatements, forbiddenFlags, preset (a graphile-config preset). A job's payload may hold ms (how long
// it runs), msFirst (how long its first attempt runs) and failTimes (how
// many attempts fail before one succeeds).
import pg from 'pg';
import { run, Logger } from 'graphile-worker';
import { fairPool } from '../src/index.js';

const config = JSON.parse(process.argv[2]);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The task handler: sleeps payload.ms (payload.msFirst on the first
// attempt), fails while the attempt number is at most payload.failTimes, and
// records the run.
function task(name, pool) {
  return async (payload, helpers) => {
    const started = new Date();
    const attempt = helpers.job.attempts;
    await sleep(attempt === 1 && payload?.msFirst != null ? payload.msFirst : (payload?.ms ?? 0));
    const fail = (payload?.failTimes ?? 0) >= attempt;
    await pool.query(
      `INSERT INTO runs (job_id, task, tenant, worker, attempt, started_at, finished_at, ok)
       VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp(), $7)`,
      [helpers.job.id, name, payload?.tenant ?? null, config.name, attempt, started, !fail]);
    if (fail) throw new Error(`attempt ${attempt} fails on purpose`);
  };
}

// Logs warnings and errors only (graphile-worker logs every job at info).
const quietLogger = new Logger(() => (level, message) => {
  if (level === 'error' || level === 'warning') console.error(`[${config.name}] ${level}: ${message}`);
});

// Starts the runner, prints "ready", stops gracefully on SIGTERM/SIGINT.
async function main() {
  const pool = new pg.Pool({ ...config.db, max: (config.concurrency ?? 1) + 4 });
  pool.on('error', (e) => console.error(`[${config.name}]`, e.message));
  pool.on('connect', (client) => client.on('error', (e) => console.error(`[${config.name}]`, e.message)));
  const pgPool = config.mode === 'fair' ? fairPool(pool) : pool;
  const taskList = Object.fromEntries(config.tasks.map((t) => [t, task(t, pool)]));
  const runner = await run({
    pgPool,
    taskList,
    concurrency: config.concurrency ?? 1,
    pollInterval: 200,
    noHandleSignals: true,
    noPreparedStatements: config.preparedStatements === false,
    forbiddenFlags: config.forbiddenFlags,
    logger: quietLogger,
    preset: config.preset,
  });
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await runner.stop();
    await pool.end();
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  process.stdout.write('ready\n');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

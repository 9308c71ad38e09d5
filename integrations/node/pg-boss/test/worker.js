// A real pg-boss worker process for the tests: works the configured queues
// (fair through fairPgBoss, or stock) and records each run in table runs.
// Config (JSON, argv[2]): db, queues, mode ('fair'|'fifo'), batchSize,
// localConcurrency, name, transactional, bossOptions (more PgBoss options). A job's data may
// hold ms (how long it runs), msFirst (how long its first attempt runs) and
// failTimes (how many attempts fail before one succeeds).
import { PgBoss } from 'pg-boss';
import { fairPgBoss } from '../src/index.js';

const config = JSON.parse(process.argv[2]);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Runs one job: sleeps data.ms (data.msFirst on the first attempt), fails
// while the attempt is below data.failTimes, and records the run.
async function runJob(boss, job) {
  const started = new Date();
  const data = job.data ?? {};
  await sleep(job.retryCount === 0 && data.msFirst != null ? data.msFirst : (data.ms ?? 0));
  const fail = (data.failTimes ?? 0) > job.retryCount;
  await boss.getDb().executeSql(
    `INSERT INTO runs (job_id, queue, tenant, worker, attempt, started_at, finished_at, ok)
     VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp(), $7)`,
    [job.id, job.name, data.tenant ?? null, config.name, job.retryCount, started, !fail]);
  if (fail) throw new Error(`attempt ${job.retryCount} fails on purpose`);
}

// Starts the worker, prints "ready", stops gracefully on SIGTERM/SIGINT.
async function main() {
  const stock = new PgBoss({ ...config.db, max: (config.localConcurrency ?? 1) + 4, schedule: false, ...config.bossOptions });
  const boss = config.mode === 'fair' ? fairPgBoss(stock, { queues: config.queues }) : stock;
  boss.on('error', (e) => console.error(`[${config.name}]`, e.message));
  await boss.start();
  for (const queue of config.queues) {
    await boss.work(queue, {
      batchSize: config.batchSize ?? 1,
      localConcurrency: config.localConcurrency ?? 1,
      pollingIntervalSeconds: 0.5,
      transactional: config.transactional ?? false,
    }, (jobs) => Promise.all(jobs.map((job) => runJob(boss, job))));
  }
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await boss.stop({ graceful: true, wait: true, timeout: 10000 });
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

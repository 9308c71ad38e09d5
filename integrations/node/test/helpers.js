// Test support shared by both packages' tests: throwaway databases on the
// server named by PGHOST/PGPORT/PGUSER, real worker processes, and a
// PgBouncer in transaction mode.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, chmodSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

// node-postgres from the package under test (its tests run in its folder,
// with its own pinned node_modules; this file sits outside both).
const pg = createRequire(join(process.cwd(), 'package.json'))('pg');

// Connection settings for a database of the test server.
export function connection(database) {
  return {
    host: process.env.PGHOST,
    port: Number(process.env.PGPORT ?? 5432),
    user: process.env.PGUSER ?? 'postgres',
    database,
  };
}

// (Re)creates a database with the fairshare extension and returns its
// connection settings.
export async function createDatabase(name) {
  const admin = new pg.Client(connection('postgres'));
  await admin.connect();
  try {
    await admin.query(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`);
    await admin.query(`CREATE DATABASE "${name}"`);
  } finally {
    await admin.end();
  }
  const db = connection(name);
  await withClient(db, (c) => c.query('CREATE EXTENSION fairshare'));
  return db;
}

// Runs fn with a connected client, closing it afterwards.
export async function withClient(db, fn) {
  const client = new pg.Client(db);
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

// Polls fn until it returns a truthy value; fails after timeoutMs.
export async function waitFor(what, fn, timeoutMs = 30000, everyMs = 100) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts `node script` with a JSON config as its argument; resolves once it
// prints "ready". stop() sends SIGTERM and waits for it to exit.
export async function startWorker(script, config) {
  const proc = spawn(process.execPath, [script, JSON.stringify(config)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      if (out.includes('ready')) resolve();
    });
    exited.then((e) => reject(new Error(`worker exited before it was ready: ${JSON.stringify(e)}`)));
  });
  return {
    proc,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      return exited;
    },
  };
}

// A free TCP port on 127.0.0.1 within [from, to].
async function freePort(from, to) {
  for (let port = from; port <= to; port++) {
    const ok = await new Promise((resolve) => {
      const s = createServer();
      s.once('error', () => resolve(false));
      s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (ok) return port;
  }
  throw new Error(`no free port in ${from}..${to}`);
}

// Starts PgBouncer (pool_mode = transaction) in front of `database` on a free
// port of FS_PGBOUNCER_PORTS (default 6611-6619). PgBouncer refuses to run as
// root, so it runs as the postgres user then. Returns the connection
// settings through it and stop().
export async function startPgBouncer(database) {
  const [from, to] = (process.env.FS_PGBOUNCER_PORTS ?? '6611-6619').split('-').map(Number);
  const port = await freePort(from, to);
  const dir = mkdtempSync(join(tmpdir(), 'fs-pgbouncer-'));
  chmodSync(dir, 0o777);
  const ini = join(dir, 'pgbouncer.ini');
  writeFileSync(ini, `[databases]
${database} = host=${process.env.PGHOST} port=${process.env.PGPORT ?? 5432} dbname=${database} user=${process.env.PGUSER ?? 'postgres'}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 200
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options,application_name
logfile = ${join(dir, 'pgbouncer.log')}
pidfile = ${join(dir, 'pgbouncer.pid')}
`);
  chmodSync(ini, 0o644);
  const bin = process.env.FS_PGBOUNCER ?? 'pgbouncer';
  const root = process.getuid?.() === 0;
  const cmd = root ? 'runuser' : bin;
  const args = root ? ['-u', 'postgres', '--', bin, ini] : [ini];
  const proc = spawn(cmd, args, { stdio: 'ignore' });
  const db = { host: '127.0.0.1', port, user: process.env.PGUSER ?? 'postgres', database };
  await waitFor('pgbouncer', async () => {
    try {
      await withClient(db, (c) => c.query('SELECT 1'));
      return true;
    } catch {
      return false;
    }
  }, 15000, 200);
  return {
    db,
    async stop() {
      proc.kill('SIGTERM');
      await new Promise((r) => (proc.exitCode !== null ? r() : proc.on('exit', r)));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

// Whether a pgbouncer executable is on PATH (or FS_PGBOUNCER).
export function havePgBouncer() {
  try {
    execFileSync(process.env.FS_PGBOUNCER ?? 'pgbouncer', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

// Baseline for bench/schedules: next-run computations per second with
// cron-parser (npm, the library test/fixtures/cron uses), in one Node.js
// process, for the same expressions and zones as fairshare.
//
//   node bench/cron_parser_baseline.mjs EXPRESSION ZONE COUNT
//
// Prints the rate.  cron-parser is found in test/fixtures/cron/node_modules
// (cd test/fixtures/cron && npm ci).
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '../test/fixtures/cron/package.json'));
const { CronExpressionParser } = require('cron-parser');

const [expression, tz, countText] = process.argv.slice(2);
const count = Number(countText);
const it = CronExpressionParser.parse(expression, { currentDate: '2024-01-01T00:00:00Z', tz });
const started = process.hrtime.bigint();
for (let i = 0; i < count; i++) it.next();
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
console.log(Math.round(count / seconds));

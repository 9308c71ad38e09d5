-- The demo's own bookkeeping, next to the queue library's tables.  The
-- library's enqueue adapter records each job it enqueues, and the job itself
-- records when it started, so that every library is measured the same way
-- and its workers stay stock.

CREATE TABLE demo_enqueued (
    ref         text PRIMARY KEY,
    tenant      text NOT NULL,
    enqueued_at timestamptz NOT NULL
);
COMMENT ON TABLE demo_enqueued IS 'demo: each job of the current run, its tenant, and when it was enqueued';

-- No unique constraint: a job run twice shows up twice.
CREATE TABLE demo_started (
    ref        text NOT NULL,
    worker     text,
    started_at timestamptz NOT NULL
);
CREATE INDEX demo_started_ref ON demo_started (ref);
COMMENT ON TABLE demo_started IS 'demo: each start of a job of the current run, by which worker';

-- Workers that are up, for adapters whose library keeps no table of its
-- processes (examples/demo.d/<library>/ready).
CREATE TABLE demo_ready (
    worker text NOT NULL
);
COMMENT ON TABLE demo_ready IS 'demo: the workers of the current run that are up and polling';

-- One row per job of a finished run: its tenant, when it was enqueued and
-- first started, in seconds since the run started (started NULL: never), and
-- how many times it started.
CREATE TABLE demo_results (
    run      text NOT NULL,
    tenant   text NOT NULL,
    enqueued float8 NOT NULL,
    started  float8,
    starts   int NOT NULL
);
COMMENT ON TABLE demo_results IS 'demo: each job of each run, with its enqueue and first start times';

-- Each end of a job of the current run, where the adapter logs ends
-- (examples/citus: the count of each tenant's jobs running at once).
CREATE TABLE demo_finished (
    ref         text NOT NULL,
    finished_at timestamptz NOT NULL
);
COMMENT ON TABLE demo_finished IS 'demo: each end of a job of the current run, where ends are logged';

-- The demo's own bookkeeping, next to Solid Queue's tables (schema.sql):
-- when each job was claimed, recorded by a trigger on the claimed executions
-- so that the workers stay stock, and the results of each run.

CREATE TABLE demo_claims (
    job_id     bigint PRIMARY KEY,
    claimed_at timestamptz NOT NULL
);
COMMENT ON TABLE demo_claims IS 'demo: when each job of the current run was claimed';

CREATE FUNCTION demo_record_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO demo_claims (job_id, claimed_at) VALUES (NEW.job_id, clock_timestamp())
    ON CONFLICT (job_id) DO NOTHING;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION demo_record_claim() IS 'demo: records a claim in demo_claims';
CREATE TRIGGER demo_record_claim AFTER INSERT ON solid_queue_claimed_executions
    FOR EACH ROW EXECUTE FUNCTION demo_record_claim();

-- One row per job of a finished run: its tenant, and when it was enqueued
-- and claimed, in seconds since the run started (claimed NULL: never).
CREATE TABLE demo_results (
    run      text NOT NULL,
    tenant   text NOT NULL,
    enqueued float8 NOT NULL,
    claimed  float8
);
COMMENT ON TABLE demo_results IS 'demo: each job of each run, with its enqueue and claim times';

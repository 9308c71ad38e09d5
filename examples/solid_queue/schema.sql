-- Solid Queue's claim path, as its migrations create it in PostgreSQL.
--
-- Mirrors rails/solid_queue 1.5.0, lib/generators/solid_queue/install/
-- templates/db/queue_schema.rb, column for column (Rails 7.1 types: string ->
-- character varying, datetime -> timestamp(6) without time zone, primary keys
-- bigserial): the jobs, the ready and claimed executions, and the processes
-- claimed executions belong to.  Only the tables the claim path touches; the
-- others (blocked, scheduled, failed, recurring executions, pauses,
-- semaphores) are unchanged by fairshare.

CREATE TABLE solid_queue_jobs (
    id              bigserial PRIMARY KEY,
    queue_name      character varying NOT NULL,
    class_name      character varying NOT NULL,
    arguments       text,
    priority        integer NOT NULL DEFAULT 0,
    active_job_id   character varying,
    scheduled_at    timestamp(6) without time zone,
    finished_at     timestamp(6) without time zone,
    concurrency_key character varying,
    created_at      timestamp(6) without time zone NOT NULL,
    updated_at      timestamp(6) without time zone NOT NULL
);
CREATE INDEX index_solid_queue_jobs_on_active_job_id ON solid_queue_jobs (active_job_id);
CREATE INDEX index_solid_queue_jobs_on_class_name ON solid_queue_jobs (class_name);
CREATE INDEX index_solid_queue_jobs_on_finished_at ON solid_queue_jobs (finished_at);
CREATE INDEX index_solid_queue_jobs_for_filtering ON solid_queue_jobs (queue_name, finished_at);
CREATE INDEX index_solid_queue_jobs_for_alerting ON solid_queue_jobs (scheduled_at, finished_at);

CREATE TABLE solid_queue_ready_executions (
    id         bigserial PRIMARY KEY,
    job_id     bigint NOT NULL,
    queue_name character varying NOT NULL,
    priority   integer NOT NULL DEFAULT 0,
    created_at timestamp(6) without time zone NOT NULL
);
CREATE UNIQUE INDEX index_solid_queue_ready_executions_on_job_id ON solid_queue_ready_executions (job_id);
CREATE INDEX index_solid_queue_poll_all ON solid_queue_ready_executions (priority, job_id);
CREATE INDEX index_solid_queue_poll_by_queue ON solid_queue_ready_executions (queue_name, priority, job_id);

CREATE TABLE solid_queue_claimed_executions (
    id         bigserial PRIMARY KEY,
    job_id     bigint NOT NULL,
    process_id bigint,
    created_at timestamp(6) without time zone NOT NULL
);
CREATE UNIQUE INDEX index_solid_queue_claimed_executions_on_job_id ON solid_queue_claimed_executions (job_id);
CREATE INDEX index_solid_queue_claimed_executions_on_process_id_and_job_id ON solid_queue_claimed_executions (process_id, job_id);

CREATE TABLE solid_queue_processes (
    id                bigserial PRIMARY KEY,
    kind              character varying NOT NULL,
    last_heartbeat_at timestamp(6) without time zone NOT NULL,
    supervisor_id     bigint,
    pid               integer NOT NULL,
    hostname          character varying,
    metadata          text,
    created_at        timestamp(6) without time zone NOT NULL,
    name              character varying NOT NULL
);
CREATE INDEX index_solid_queue_processes_on_last_heartbeat_at ON solid_queue_processes (last_heartbeat_at);
CREATE UNIQUE INDEX index_solid_queue_processes_on_name_and_supervisor_id ON solid_queue_processes (name, supervisor_id);
CREATE INDEX index_solid_queue_processes_on_supervisor_id ON solid_queue_processes (supervisor_id);

ALTER TABLE solid_queue_ready_executions
    ADD FOREIGN KEY (job_id) REFERENCES solid_queue_jobs (id) ON DELETE CASCADE;
ALTER TABLE solid_queue_claimed_executions
    ADD FOREIGN KEY (job_id) REFERENCES solid_queue_jobs (id) ON DELETE CASCADE;

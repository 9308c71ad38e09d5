#!/usr/bin/env ruby
# frozen_string_literal: true

# A GoodJob worker whose claim is fair across tenants.
#
# It runs GoodJob's own statements for its SKIP LOCKED strategy (good_job
# 4.19.2: Process.find_or_create_record, Job.perform_with_skip_locked and
# Job#perform) against the table of schema.sql, with one change: the
# candidate subquery of the claim,
#
#   SELECT id FROM good_jobs WHERE finished_at IS NULL AND locked_by_id IS NULL
#      AND scheduled_at <= $now ORDER BY priority ASC NULLS LAST, created_at
#    LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED
#
# becomes fs_claim(), which returns that row in fair order across tenants
# (the concurrency_key here), locked in the same statement, with a slot
# lease.  Setting finished_at (or clearing locked_by_id for a retry) when the
# job ends releases the lease (fairshare's trigger on good_jobs), so the
# rest of GoodJob is unchanged.  A job's serialized_params here is
# {"arguments": [seconds to sleep]}.
#
#   examples/good_job/worker.rb --db 'dbname=app' --threads 3
require "json"
require_relative "../lib/fair_worker"

class GoodJobRecipe
  SKIPLOCKED = 1 # GoodJob::Job::LockTypeAccessor::LOCK_TYPES["skiplocked"]

  def initialize(opts)
    @opts = opts
  end

  def register(conn)
    @process_id = conn.exec_params(<<~SQL, [JSON.dump(name: @opts.name, pid: Process.pid, threads: @opts.threads)]).getvalue(0, 0)
      INSERT INTO good_job_processes (id, created_at, updated_at, state, lock_type)
      VALUES (gen_random_uuid(), now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC', $1, NULL)
      RETURNING id
    SQL
  end

  def heartbeat(conn)
    conn.exec_params("UPDATE good_job_processes SET updated_at = now() AT TIME ZONE 'UTC' WHERE id = $1",
                     [@process_id])
  end

  def deregister(conn)
    conn.exec_params("DELETE FROM good_job_processes WHERE id = $1", [@process_id])
  end

  # Job.with_skip_locked_claim, one job per claim as GoodJob does; asked for
  # n, it claims up to n one after the other.
  def claim(conn, limit)
    jobs = []
    limit.times do
      job = conn.exec_params(<<~SQL, [@opts.queue, @process_id, SKIPLOCKED]).first
        WITH candidate AS MATERIALIZED (
          SELECT (c.job).id FROM fs_claim($1, NULL::good_jobs, 1) c
        )
        UPDATE good_jobs
           SET locked_by_id = $2, locked_at = now() AT TIME ZONE 'UTC', lock_type = $3
          FROM candidate
         WHERE good_jobs.id = candidate.id
        RETURNING good_jobs.*
      SQL
      break unless job

      jobs << job
    end
    jobs
  end

  # Job#perform: record the execution and mark the job performed, run it,
  # then unlock and finish job and execution in one transaction.
  def perform(conn, job)
    execution_id = conn.transaction do
      id = conn.exec_params(<<~SQL, [job["active_job_id"], job["job_class"], job["queue_name"], job["serialized_params"], job["scheduled_at"] || job["created_at"], @process_id]).getvalue(0, 0)
        INSERT INTO good_job_executions (created_at, updated_at, active_job_id, job_class, queue_name,
                                         serialized_params, scheduled_at, process_id)
        VALUES (now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC', $1, $2, $3, $4, $5, $6)
        RETURNING id
      SQL
      conn.exec_params(<<~SQL, [job["id"]])
        UPDATE good_jobs SET performed_at = now() AT TIME ZONE 'UTC',
                             executions_count = coalesce(executions_count, 0) + 1
         WHERE id = $1
      SQL
      id
    end
    started = FairWorker.monotonic
    sleep(JSON.parse(job["serialized_params"]).fetch("arguments", [0]).first.to_f)
    conn.transaction do
      conn.exec_params(<<~SQL, [job["id"]])
        UPDATE good_jobs SET locked_by_id = NULL, locked_at = NULL, lock_type = NULL, error = NULL,
                             error_event = NULL, finished_at = now() AT TIME ZONE 'UTC',
                             updated_at = now() AT TIME ZONE 'UTC'
         WHERE id = $1
      SQL
      conn.exec_params(<<~SQL, [execution_id, format("%.6f seconds", FairWorker.monotonic - started)])
        UPDATE good_job_executions SET finished_at = now() AT TIME ZONE 'UTC', duration = $2::interval,
                                       updated_at = now() AT TIME ZONE 'UTC'
         WHERE id = $1
      SQL
    end
  end
end

opts = FairWorker.options(ARGV, "good_job")
abort("--stock-claim: only the Solid Queue worker has it") if opts.stock_claim
FairWorker.run(opts, GoodJobRecipe.new(opts))

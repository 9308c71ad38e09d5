#!/usr/bin/env ruby
# frozen_string_literal: true

# A Solid Queue worker whose claim is fair across tenants.
#
# It runs Solid Queue's own transactions (solid_queue 1.5.0: Process.register,
# ReadyExecution.claim, ClaimedExecution#perform and #finished) against the
# tables of schema.sql, with one change: the candidate query of the claim,
#
#   SELECT id, job_id FROM solid_queue_ready_executions
#    ORDER BY priority, job_id LIMIT $1 FOR UPDATE SKIP LOCKED
#
# becomes fs_claim(), which returns the same rows in fair order across
# tenants, locked FOR UPDATE SKIP LOCKED in the same transaction, each with a
# slot lease.  Deleting the claimed execution when the job finishes releases
# the lease (fairshare's trigger on solid_queue_claimed_executions), so the
# rest of Solid Queue is unchanged.  A job here is {"sleep": seconds}.
#
#   examples/solid_queue/worker.rb --db 'dbname=app' --threads 3
#
# With --stock-claim it runs Solid Queue's own FIFO query instead (the
# demo's baseline).
require "json"
require_relative "../lib/fair_worker"

class SolidQueueRecipe
  def initialize(opts)
    @opts = opts
  end

  def register(conn)
    @process_id = conn.exec_params(<<~SQL, [Process.pid, Socket.gethostname, JSON.dump(threads: @opts.threads), @opts.name]).getvalue(0, 0)
      INSERT INTO solid_queue_processes (kind, last_heartbeat_at, supervisor_id, pid, hostname, metadata, created_at, name)
      VALUES ('Worker', now() AT TIME ZONE 'UTC', NULL, $1, $2, $3, now() AT TIME ZONE 'UTC', $4)
      RETURNING id
    SQL
  end

  def heartbeat(conn)
    conn.exec_params("UPDATE solid_queue_processes SET last_heartbeat_at = now() AT TIME ZONE 'UTC' WHERE id = $1",
                     [@process_id])
  end

  def deregister(conn)
    conn.exec_params("DELETE FROM solid_queue_processes WHERE id = $1", [@process_id])
  end

  # ReadyExecution.claim: select and lock candidates, insert claimed
  # executions, delete the ready ones, in one transaction.
  def claim(conn, limit)
    conn.transaction do
      candidates = if @opts.stock_claim
                     # Solid Queue's own candidate query (all queues), FIFO.
                     conn.exec_params(<<~SQL, [limit]).to_a
                       SELECT id, job_id FROM solid_queue_ready_executions
                        ORDER BY priority ASC, job_id ASC LIMIT $1 FOR UPDATE SKIP LOCKED
                     SQL
                   else
                     conn.exec_params(<<~SQL, [@opts.queue, limit]).to_a
                       SELECT (c.job).id, (c.job).job_id
                         FROM fs_claim($1, NULL::solid_queue_ready_executions, $2) c
                     SQL
                   end
      next [] if candidates.empty?

      job_ids = candidates.map { |c| c["job_id"] }
      conn.exec_params(<<~SQL, [job_ids.join(","), @process_id])
        INSERT INTO solid_queue_claimed_executions (job_id, process_id, created_at)
        SELECT unnest(string_to_array($1, ',')::bigint[]), $2, now() AT TIME ZONE 'UTC'
      SQL
      claimed = conn.exec_params(<<~SQL, [job_ids.join(","), @process_id]).to_a
        SELECT id, job_id FROM solid_queue_claimed_executions
         WHERE job_id = ANY (string_to_array($1, ',')::bigint[]) AND process_id = $2
      SQL
      conn.exec_params("DELETE FROM solid_queue_ready_executions WHERE id = ANY (string_to_array($1, ',')::bigint[])",
                       [candidates.map { |c| c["id"] }.join(",")])
      claimed
    end
  end

  # ClaimedExecution#perform: run the job, then finalize (lock the claimed
  # execution, mark the job finished, destroy the claimed execution).
  def perform(conn, claimed)
    arguments = JSON.parse(conn.exec_params("SELECT arguments FROM solid_queue_jobs WHERE id = $1",
                                            [claimed["job_id"]]).getvalue(0, 0))
    sleep(arguments.fetch("sleep", 0).to_f)
    conn.transaction do
      next if conn.exec_params("SELECT id FROM solid_queue_claimed_executions WHERE id = $1 FOR UPDATE",
                               [claimed["id"]]).ntuples.zero?

      conn.exec_params(<<~SQL, [claimed["job_id"]])
        UPDATE solid_queue_jobs SET finished_at = now() AT TIME ZONE 'UTC', updated_at = now() AT TIME ZONE 'UTC'
         WHERE id = $1
      SQL
      conn.exec_params("DELETE FROM solid_queue_claimed_executions WHERE id = $1", [claimed["id"]])
    end
  end
end

opts = FairWorker.options(ARGV, "solid_queue")
FairWorker.run(opts, SolidQueueRecipe.new(opts))

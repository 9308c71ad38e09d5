# frozen_string_literal: true

module Fairshare
  # The slot leases this Ruby process's workers hold, by job key, so that
  # they can be renewed while their jobs run.  Thread-safe: claims add to it
  # from worker threads, renewals run from a heartbeat or a timer thread.
  class Leases
    # A lease whose renewal fails is forgotten only once it is this old: a
    # claim's own transaction may not have committed when a renewal runs.
    GRACE_SECONDS = 10

    def initialize
      @mutex = Mutex.new
      @held = {}
    end

    # Remembers the lease of each claimed job (`key` => `lease_id`).
    def add(key, lease_id)
      return if lease_id.nil?

      @mutex.synchronize { @held[key.to_s] = [Integer(lease_id), monotonic_now] }
    end

    # Forgets the lease of a job that ended in this process.
    def delete(key)
      @mutex.synchronize { @held.delete(key.to_s) }
    end

    def size
      @mutex.synchronize { @held.size }
    end

    # Extends every lease held to now + `seconds` with fs_renew_slot(), in
    # one statement, and forgets those that were no longer live (released
    # when their job left the running table, or rolled back).
    def renew(connection, seconds)
      held = @mutex.synchronize { @held.map { |key, (lease_id, _)| [key, lease_id] } }
      return 0 if held.empty?

      sql = "SELECT l.key FROM unnest(?::text[], ?::bigint[]) AS l(key, lease_id) " \
            "WHERE NOT fs_renew_slot(l.lease_id, ? * interval '1 second')"
      ended = SQL.select(connection, sql, SQL.text_array(held.map(&:first)),
                         SQL.text_array(held.map(&:last)), Float(seconds)).rows.flatten
      forget_ended(ended)
      held.size - ended.size
    end

    private

    # Drops the ended leases that are older than the grace period.
    def forget_ended(keys)
      cutoff = monotonic_now - GRACE_SECONDS
      @mutex.synchronize do
        keys.each { |key| @held.delete(key) if @held[key] && @held[key][1] < cutoff }
      end
    end

    def monotonic_now
      ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
    end
  end
end

# frozen_string_literal: true

require_relative "lib/fairshare/version"

Gem::Specification.new do |spec|
  spec.name = "fairshare"
  spec.version = Fairshare::VERSION
  spec.summary = "Fair dequeue across tenants for Solid Queue and GoodJob, backed by the fairshare PostgreSQL extension"
  spec.description = <<~DESC
    Plugs the fairshare PostgreSQL extension's fs_claim() into the claim path of Solid Queue
    and GoodJob workers: jobs are taken in weighted fair order across tenants instead of
    first in, first out, with everything else (queues, pauses, priorities, concurrency
    controls, retries) left to the queue library.
  DESC
  spec.authors = ["fairshare contributors"]
  spec.license = "PostgreSQL"
  spec.files = Dir["lib/**/*", "README.md"]
  spec.require_paths = ["lib"]
  spec.required_ruby_version = ">= 3.1"
  spec.add_dependency "activerecord", ">= 7.1", "< 9"
  spec.add_dependency "pg", "~> 1.1"
end

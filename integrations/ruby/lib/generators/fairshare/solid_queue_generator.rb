# frozen_string_literal: true

require "rails/generators"
require "rails/generators/active_record"

module Fairshare
  module Generators
    # `rails generate fairshare:solid_queue [--database queue]`: a migration
    # that registers Solid Queue's ready executions with fairshare, and an
    # initializer that turns fair claiming on.
    class SolidQueueGenerator < Rails::Generators::Base
      include ActiveRecord::Generators::Migration

      source_root File.expand_path("templates", __dir__)
      class_option :database, type: :string, desc: "The database Solid Queue's tables are in (e.g. queue)"

      # The migration, in the database's migrations path.
      def create_migration_file
        migration_template "solid_queue_migration.rb.tt", File.join(db_migrate_path, "register_fairshare_solid_queue.rb")
      end

      # The one line that enables fair claiming in the workers.
      def create_initializer
        template "solid_queue_initializer.rb.tt", "config/initializers/fairshare.rb"
      end
    end
  end
end

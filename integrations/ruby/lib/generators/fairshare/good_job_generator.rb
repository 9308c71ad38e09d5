# frozen_string_literal: true

require "rails/generators"
require "rails/generators/active_record"

module Fairshare
  module Generators
    # `rails generate fairshare:good_job`: a migration that registers
    # good_jobs with fairshare, and an initializer that turns fair claiming
    # on (GoodJob must use lock_strategy :skiplocked).
    class GoodJobGenerator < Rails::Generators::Base
      include ActiveRecord::Generators::Migration

      source_root File.expand_path("templates", __dir__)
      class_option :database, type: :string, desc: "The database GoodJob's tables are in"

      # The migration, in the database's migrations path.
      def create_migration_file
        migration_template "good_job_migration.rb.tt", File.join(db_migrate_path, "register_fairshare_good_job.rb")
      end

      # The one line that enables fair claiming in the workers.
      def create_initializer
        template "good_job_initializer.rb.tt", "config/initializers/fairshare.rb"
      end
    end
  end
end

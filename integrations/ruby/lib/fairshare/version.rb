# frozen_string_literal: true

module Fairshare
  VERSION = "0.5.0"
end

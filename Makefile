# fairshare: PGXS build.
#
#   make                  build fairshare.so (warnings are errors)
#   make install          install into the PostgreSQL found by pg_config
#   test/run              build, install and run every test suite (see README.md)
#
# Every C file under src/ is part of the module (src/module.c and one folder
# per layer; README.md's Layout says which may include which).  sql/fairshare.sql is the install
# script of the current version (built into ./fairshare--<version>.sql);
# every sql/fairshare--*.sql is an older version's install script or an
# upgrade script.  The version lives in fairshare.control only.

EXTENSION   = fairshare
EXTVERSION  = $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" $(EXTENSION).control)

MODULE_big  = fairshare
OBJS        = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c src/*/*.c)))
DATA_built  = $(EXTENSION)--$(EXTVERSION).sql
DATA        = $(sort $(wildcard sql/$(EXTENSION)--*.sql))

# Regression tests (test/regress/sql/<name>.sql against
# test/regress/expected/<name>.out).  The order is
# the order they run in; each file is independent of the ones before it.
REGRESS     = $(shell cat test/regress/schedule 2>/dev/null | sed -n 's/^test: *//p')
REGRESS_OPTS = --temp-config=test/fairshare.conf --inputdir=test/regress

PG_CONFIG  ?= pg_config
# The server headers are system headers for us: full -Wextra applies to our
# code without tripping over unused parameters in PostgreSQL's inline functions.
PG_CPPFLAGS = -isystem $(shell $(PG_CONFIG) --includedir-server) -I$(srcdir)/src
# libpq: a Citus coordinator's own connections to its nodes (src/core/relay.c).
PG_CPPFLAGS += -isystem $(shell $(PG_CONFIG) --includedir)
SHLIB_LINK_INTERNAL = -lpq

# make FS_DEBUG=1: the debug build.  Internal invariants (FS_INVARIANT in
# src/core/common.h) are checked and raise an ERROR when one does not hold;
# test/run's debug suite runs the fault and fuzz tests against it.  Build it
# in a clean tree (make clean first): objects do not record their flags.
ifeq ($(FS_DEBUG),1)
PG_CPPFLAGS += -DFS_DEBUG
endif
# make FS_LOCK_STATS=1: the lock-statistics build.  Every LWLock fairshare
# takes is timed from acquisition to release, and the longest hold of each
# kind of lock, with the function that took it, is kept in shared memory for
# fs_lock_stats() (src/core/lockstats.h; bench/lockhold builds and reads it).  A
# clean tree, as for FS_DEBUG.
ifeq ($(FS_LOCK_STATS),1)
PG_CPPFLAGS += -DFS_LOCK_STATS
endif
PG_CFLAGS   = -Wall -Wextra -Werror -Wshadow=compatible-local -Wformat=2 -Wno-format-nonliteral

EXTRA_CLEAN = results regression.diffs regression.out tmp_check tmp_install log \
              META.json $(EXTENSION)-*.zip

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Object files depend on every header: the headers are small and this keeps
# incremental builds honest.
$(OBJS): $(wildcard src/*/*.h)

$(DATA_built): sql/$(EXTENSION).sql $(EXTENSION).control
	cp $< $@

# PGXN metadata, with the version from fairshare.control.
META.json: META.json.in $(EXTENSION).control
	sed 's/@VERSION@/$(EXTVERSION)/g' $< > $@

# A release archive for PGXN: the committed tree plus META.json.
.PHONY: dist
dist: META.json
	git archive --format=zip --prefix=$(EXTENSION)-$(EXTVERSION)/ --add-file=META.json \
		-o $(EXTENSION)-$(EXTVERSION).zip HEAD

.PHONY: print-version
print-version:
	@echo $(EXTVERSION)

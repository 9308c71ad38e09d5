# test/lib.sh: shell helpers shared by test/run, examples/demo and bench/run.
#
# Sourced, not executed.  Everything here works as root or as a user with
# sudo, on a fresh Debian 12 machine: it installs what it needs from Debian,
# builds fairshare with warnings as errors, installs it, and runs servers as
# the `postgres` user (initdb refuses to run as root).
#
# Environment:
#   FS_STAGE=DIR     install into a private copy of PostgreSQL under DIR instead
#                    of the system installation (several checkouts can then be
#                    tested side by side without touching each other)
#   FS_SKIP_DEPS=1   do not look for missing Debian packages
#   PG_MAJOR         PostgreSQL major version (default 15)

FS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_MAJOR="${PG_MAJOR:-15}"

# Debian packages each command needs.  One list per purpose, all installed by
# fs_install_deps before anything is built.
FS_DEPS_BUILD="make gcc postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR libpq-dev"
# The integrations and the demo's adapters: Rails' Debian dependencies (the
# newer Rails and the queue gems come from ../shared/vendor/ruby).  Node 22
# and the Node queue libraries come from the npm registry, through
# integrations/node/install-node (which installs Debian's npm if no npm is
# there: a node that brings its own npm conflicts with Debian's).
FS_DEPS_INTEGRATIONS="ruby ruby-pg ruby-rails ruby-connection-pool ruby-useragent ruby-raabro postgresql-client-$PG_MAJOR"
FS_DEPS_TEST="postgresql-$PG_MAJOR-pgtap libtap-parser-sourcehandler-pgtap-perl libipc-run-perl
 ruby ruby-pg procps clang-14 libclang-rt-14-dev sqlsmith binutils postgresql-$PG_MAJOR-auto-failover
 pgbouncer $FS_DEPS_INTEGRATIONS"
FS_DEPS_DEMO="gnuplot-nox procps $FS_DEPS_INTEGRATIONS"
FS_DEPS_BENCH="redis-server redis-tools ruby ruby-pg procps"

fs_log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
fs_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Run a command as root (directly, or through sudo).
fs_as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Run a command as the postgres operating-system user, keeping the given
# environment (pass variables as "env VAR=value cmd ...").
fs_as_postgres() {
	if [ "$(id -un)" = postgres ]; then
		"$@"
	elif [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		sudo -u postgres -- "$@"
	fi
}

# Install the Debian packages named in "$@" that are not installed yet.
fs_install_deps() {
	[ "${FS_SKIP_DEPS:-0}" = 1 ] && return 0
	local missing=() pkg
	for pkg in "$@"; do
		dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
			missing+=("$pkg")
	done
	[ ${#missing[@]} = 0 ] && return 0
	fs_log "installing Debian packages: ${missing[*]}"
	fs_as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
		fs_log "apt-get update failed; trying with the package lists already here"
	fs_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		"${missing[@]}" >/dev/null
}

# Debian's nodejs and npm, unless an npm is there already (a node that brings
# its own npm, as NodeSource's does, conflicts with Debian's npm package).
fs_install_npm() {
	command -v npm >/dev/null 2>&1 || fs_install_deps nodejs npm
}

# Sets PG_BINDIR / PG_PKGLIBDIR / PG_CONFIG_BIN for the installation tests use.
fs_pg_paths() {
	local sys_bindir="/usr/lib/postgresql/$PG_MAJOR/bin"
	if [ -n "${FS_STAGE:-}" ]; then
		PG_BINDIR="$FS_STAGE/usr/lib/postgresql/$PG_MAJOR/bin"
	else
		PG_BINDIR="$sys_bindir"
	fi
	PG_CONFIG_BIN="$PG_BINDIR/pg_config"
	[ -x "$PG_CONFIG_BIN" ] || PG_CONFIG_BIN="$sys_bindir/pg_config"
	PG_PKGLIBDIR="$("$PG_CONFIG_BIN" --pkglibdir)"
	export PG_BINDIR PG_PKGLIBDIR PG_CONFIG_BIN
}

# Build with warnings as errors and install (system-wide, or into $FS_STAGE).
fs_build_install() {
	local sys_bindir="/usr/lib/postgresql/$PG_MAJOR/bin"
	fs_log "building fairshare (-Wall -Wextra -Werror)"
	make -C "$FS_ROOT" -s -j"$(nproc)" PG_CONFIG="$sys_bindir/pg_config" >/dev/null || return 1
	if [ -n "${FS_STAGE:-}" ]; then
		# A private copy of the PostgreSQL installation: PostgreSQL finds its
		# share and lib directories relative to its binaries, so a server
		# started from the copy loads the staged fairshare.
		if [ ! -x "$FS_STAGE/usr/lib/postgresql/$PG_MAJOR/bin/postgres" ]; then
			fs_log "creating a private PostgreSQL installation in $FS_STAGE"
			mkdir -p "$FS_STAGE/usr/lib/postgresql" "$FS_STAGE/usr/share/postgresql"
			cp -a "/usr/lib/postgresql/$PG_MAJOR" "$FS_STAGE/usr/lib/postgresql/"
			cp -a "/usr/share/postgresql/$PG_MAJOR" "$FS_STAGE/usr/share/postgresql/"
		fi
		# Extensions installed since the copy was made (pg_auto_failover's, Citus).
		cp -an "/usr/lib/postgresql/$PG_MAJOR/lib/." "$FS_STAGE/usr/lib/postgresql/$PG_MAJOR/lib/"
		cp -an "/usr/share/postgresql/$PG_MAJOR/extension/." \
			"$FS_STAGE/usr/share/postgresql/$PG_MAJOR/extension/"
		fs_log "installing fairshare into $FS_STAGE"
		make -C "$FS_ROOT" -s install DESTDIR="$FS_STAGE" PG_CONFIG="$sys_bindir/pg_config" >/dev/null ||
			return 1
		chmod -R a+rX "$FS_STAGE"
	else
		fs_log "installing fairshare"
		fs_as_root make -C "$FS_ROOT" -s install PG_CONFIG="$sys_bindir/pg_config" >/dev/null ||
			return 1
	fi
	fs_pg_paths
}

# Citus, for the scale-out tests: built from the vendored source
# ($FS_CITUS_VENDOR, default ../shared/vendor/citus beside the checkout) and
# installed into the system PostgreSQL, at low priority, when it is not
# there; the build's own stamp makes a second call a no-op.  Call it before
# fs_build_install, which copies it into a private installation.
FS_CITUS_VENDOR="${FS_CITUS_VENDOR:-$FS_ROOT/../shared/vendor/citus}"
fs_citus_install() {
	[ -x "$FS_CITUS_VENDOR/build.sh" ] || { echo "no Citus source at $FS_CITUS_VENDOR" >&2; return 1; }
	fs_log "Citus: building and installing it when it is missing"
	fs_as_root env JOBS="$(nproc)" nice -n 19 "$FS_CITUS_VENDOR/build.sh" >&2
}

# Make a work directory owned by postgres; prints its path.  A copy of the
# source tree goes in $dir/src so that the server user can read every input
# even when the checkout lives under a private home directory.
fs_workdir() {
	local dir
	dir="$(mktemp -d "${TMPDIR:-/tmp}/fairshare-$1.XXXXXX")"
	mkdir -p "$dir/src"
	tar -C "$FS_ROOT" --exclude=.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
		--exclude=./results --exclude=./tmp_check --exclude=node_modules --exclude=.toolchain \
		-cf - . | tar -C "$dir/src" -xf -
	chmod 755 "$dir"
	if [ "$(id -un)" != postgres ]; then
		fs_as_root chown -R postgres: "$dir"
	fi
	echo "$dir"
}

# fs_server_start DATA SOCKETDIR PORT LOG: initdb DATA and start a server
# there as postgres, listening on PORT with its socket in SOCKETDIR, with
# the postgresql.conf lines on stdin; its log in LOG.
fs_server_start() {
	local data="$1" sockets="$2" port="$3" log="$4"
	fs_as_postgres "$PG_BINDIR/initdb" -D "$data" -U postgres -A trust --no-sync >/dev/null
	{
		echo "unix_socket_directories = '$sockets'"
		echo "port = $port"
		cat
	} | fs_as_postgres sh -c "cat >> '$data/postgresql.conf'"
	fs_as_postgres "$PG_BINDIR/pg_ctl" -D "$data" -l "$log" -w start >/dev/null ||
		{ cat "$log" >&2; fs_die "the temporary server on port $port did not start"; }
}

# Start a throwaway cluster in $1 (as postgres, unix socket only, in $1) with
# fairshare preloaded.  Extra postgresql.conf lines come on stdin (give it
# </dev/null for none).  Sets PGHOST/PGPORT/PGDATA.
fs_cluster_start() {
	local dir="$1" conf
	conf="$(cat)"
	export PGDATA="$dir/data" PGHOST="$dir" PGPORT="${PGPORT:-5499}" PGUSER=postgres
	fs_server_start "$PGDATA" "$dir" "$PGPORT" "$dir/server.log" <<EOF
listen_addresses = ''
shared_preload_libraries = 'fairshare'
$conf
EOF
}

fs_cluster_stop() {
	[ -n "${PGDATA:-}" ] && [ -f "$PGDATA/postmaster.pid" ] &&
		fs_as_postgres "$PG_BINDIR/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null 2>&1 || true
}

# A Citus cluster in $1: a coordinator on port $2 and $3 workers on the ports
# after it, each with shared_preload_libraries = 'citus,fairshare' (extra
# postgresql.conf lines on stdin), reachable over TCP on 127.0.0.1 (Citus's
# connections) and over a Unix socket in $1; Citus created on each node, the
# workers added, and fairshare created on the coordinator (Citus creates it
# on the workers).  Stop it with fs_citus_cluster_stop DIR.
fs_citus_cluster_start() {
	local dir="$1" port="$2" workers="$3" conf i p
	conf="$(cat)"
	for i in $(seq 0 "$workers"); do
		p=$((port + i))
		fs_server_start "$dir/node$p" "$dir" "$p" "$dir/node$p.log" <<EOF
listen_addresses = '127.0.0.1'
shared_preload_libraries = 'citus,fairshare'
max_prepared_transactions = 100
citus.enable_statistics_collection = off
$conf
EOF
		fs_as_postgres "$PG_BINDIR/psql" -X -q -h "$dir" -p "$p" -d postgres -c 'CREATE EXTENSION citus' >/dev/null
	done
	{
		echo "SELECT citus_set_coordinator_host('127.0.0.1', $port);"
		for i in $(seq 1 "$workers"); do echo "SELECT citus_add_node('127.0.0.1', $((port + i)));"; done
		echo "CREATE EXTENSION fairshare;"
	} | fs_as_postgres "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -d postgres >/dev/null
}

fs_citus_cluster_stop() {
	local d
	for d in "$1"/node*; do
		[ -f "$d/postmaster.pid" ] &&
			fs_as_postgres "$PG_BINDIR/pg_ctl" -D "$d" -m fast -w stop >/dev/null 2>&1 || true
	done
}

# psql against the cluster started by fs_cluster_start.
fs_psql() {
	fs_as_postgres env PGHOST="$PGHOST" PGPORT="$PGPORT" \
		"$PG_BINDIR/psql" -X -v ON_ERROR_STOP=1 -q "$@"
}

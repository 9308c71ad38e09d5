# Sourced by the demo adapters (examples/demo.d/pg-boss, .../graphile-worker):
# fs_node_exec PACKAGE SCRIPT ARGS... installs Node.js (install-node) and the
# pinned dependencies of integrations/node/PACKAGE (npm ci, once, under a
# lock so that workers started together do not race), then execs node on
# SCRIPT with ARGS.

fs_node_exec() {
	local package="$1" script="$2" nodedir pkgdir bin
	shift 2
	nodedir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
	pkgdir="$nodedir/$package"
	bin="$("$nodedir/install-node")"
	mkdir -p "$nodedir/.toolchain"
	(
		flock 9
		if [ ! -f "$pkgdir/node_modules/.package-lock.json" ] ||
			[ "$pkgdir/package-lock.json" -nt "$pkgdir/node_modules/.package-lock.json" ]; then
			cd "$pkgdir" && PATH="$bin:$PATH" npm ci --silent --no-audit --no-fund \
				--cache "$nodedir/.toolchain/npm-cache" >&2
		fi
	) 9>"$nodedir/.toolchain/npm.lock"
	FS_ROOT="${FS_ROOT:-$(cd "$nodedir/../.." && pwd)}" FS_NODE_PACKAGE_DIR="$pkgdir" exec "$bin/node" "$script" "$@"
}

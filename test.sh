#!/usr/bin/env bash
# The project's test command: every module, with the race detector, each
# named as it runs.
#
# redislimit's tests need a Redis: the one at $REDIS_ADDR, or a local
# redis-server that they start. Without either this script fails before
# running them; REDISLIMIT_SKIP=1 skips that module instead (say so when
# you report a green run). .ci/run installs and starts one.
set -euo pipefail
cd "$(dirname "$0")"

run() {
	local mod=$1
	echo "== $mod"
	(cd "$mod" && go test -race ./...)
}

run .
for mod in bench examples/sdk retryotel redislimit; do
	[ -f "$mod/go.mod" ] || continue
	if [ "$mod" = redislimit ]; then
		if [ "${REDISLIMIT_SKIP:-}" = 1 ]; then
			echo "== $mod: skipped (REDISLIMIT_SKIP=1)"
			continue
		fi
		if [ -z "${REDIS_ADDR:-}" ] && ! command -v redis-server >/dev/null 2>&1; then
			echo "== $mod: needs Redis: set REDIS_ADDR, install redis-server, or set REDISLIMIT_SKIP=1 to skip it" >&2
			exit 1
		fi
	fi
	run "$mod"
done
echo "== all modules passed"

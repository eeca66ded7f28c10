#!/usr/bin/env bash
# The project's test command: every module, with the race detector.
# redislimit's tests use the Redis at $REDIS_ADDR; without it they start a
# local redis-server if one is installed, and skip otherwise (CI fails
# instead: .ci/run installs and starts one).
set -euo pipefail
cd "$(dirname "$0")"
go test -race ./...
for mod in bench examples/sdk redislimit retryotel; do
	if [ -f "$mod/go.mod" ]; then
		(cd "$mod" && go test -race ./...)
	fi
done

#!/usr/bin/env bash
# Runs every benchmark ROUNDS times, interleaved (one round runs each
# benchmark once, for every library, then the next round starts), and prints
# the benchstat tables with the libraries side by side.
#
#   ./run.sh                        # 12 rounds of 200ms each: about 6 minutes
#   ROUNDS=3 BENCH='GET$' ./run.sh  # a quick look at one case
#
# Each round runs the side-by-side benchmarks with -benchmem, then the
# paired BenchmarkAddedGET without it (its iteration is a round of blocks,
# not one request, so B/op would mean nothing there); ADDED=0 skips it.
#
# `go test -bench . -count N` would not interleave: it runs the N counts of
# one benchmark back to back before the next, so a burst of load on a shared
# machine lands on one library only. Each round here is a separate run of
# the same test binary.
set -euo pipefail
cd "$(dirname "$0")"
rounds=${ROUNDS:-12}
benchtime=${BENCHTIME:-200ms}
bench=${BENCH:-^Benchmark(GET|GETParallel|POST1KiB|Retry503|Upload1MiB)$}
added=${ADDED:-1}
out=${OUT:-results.txt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=$tmp/bench.test
benchstat=$(command -v benchstat || echo "$(go env GOPATH)/bin/benchstat")

go test -c -o "$bin" .
{
	echo "# $(go version); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
	echo "# core: $(git -C .. rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C .. diff --quiet HEAD -- '*.go' 2>/dev/null || echo ' + uncommitted changes')"
	echo "# $rounds rounds, -benchtime $benchtime, started $(date -u +%FT%TZ)"
} > "$out"
for i in $(seq "$rounds"); do
	echo "round $i of $rounds" >&2
	"$bin" -test.run '^$' -test.bench "$bench" -test.benchmem -test.benchtime "$benchtime" >> "$out"
	if [ "$added" != 0 ]; then
		"$bin" -test.run '^$' -test.bench '^BenchmarkAddedGET$' -test.benchtime "$benchtime" >> "$out"
	fi
done
"$benchstat" -col /lib "$out"

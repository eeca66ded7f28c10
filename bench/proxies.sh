#!/usr/bin/env bash
# The "Behind real proxies" suite (proxies_test.go): real nginx and HAProxy
# processes on loopback in front of net/http backends, each library with
# its defaults, on the real clock. Installs nginx and HAProxy from Debian
# when they are missing, then runs the suite with PROXIES_REQUIRED=1 (a
# missing proxy fails it instead of skipping it).
#
#   ./proxies.sh                    # the table and retryhttp's gates (~50 s on 2 cores)
#   PROXIES_TABLE=1 ./proxies.sh    # the table only
#   PROXIES_RUN=haproxy ./proxies.sh -race
set -euo pipefail
cd "$(dirname "$0")"
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
if ! have nginx || ! have haproxy; then
	$sudo apt-get update -qq
	# nginx-light where the distribution still has it (Debian 12), else nginx
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light haproxy >/dev/null ||
		$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx haproxy >/dev/null
fi
# The Debian packages start a system nginx and HAProxy; the suite does not
# need them (it runs its own, on free loopback ports) and leaves them be.
PROXIES_REQUIRED=1 go test -run '^TestProxies$' -count=1 -v "$@" .

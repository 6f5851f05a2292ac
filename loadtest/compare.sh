#!/usr/bin/env bash
# Side by side with wrk: an nginx backend (`return 200`, one worker) directly and through
# cftunnel-proxy (defaults, routed by PUT /config), nginx and HAProxy (one worker each, alone
# on CPU 1), wrk -t1 -c64 and -c32 for 8 s each on CPU 0 with the backend, 3 rounds in
# rotated order. Prints a table of req/s and p99 with ratios against nginx, and writes a
# results JSON and an SVG chart under target/loadtest-reports/.
#
#   loadtest/compare.sh                          # the comparison in docs/performance.md
#   CLOUDFLARED=/path/to/cloudflared loadtest/compare.sh   # plus connector vs cloudflared
#   loadtest/compare.sh --dry-run                # the plan and the commands, nothing run
#   loadtest/compare.sh --help                   # every option
#
# Needs wrk and nginx (apt-get install -y wrk nginx haproxy); a row whose program is missing
# is skipped with the reason. NO_BUILD=1 uses the binaries in target/release as they are;
# CFTUNNEL_LOADTEST=path runs another cftunnel-loadtest binary.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${CFTUNNEL_LOADTEST:-target/release/cftunnel-loadtest}
if [[ "${NO_BUILD:-}" != 1 ]]; then
  cargo build --release --quiet -p cftunnel-proxy -p cftunnel-testkit -p cftunnel-loadtest
fi
if [[ ! -x "$bin" ]]; then
  echo "$bin not found: build it (cargo build --release -p cftunnel-loadtest) or unset NO_BUILD" >&2
  exit 1
fi
exec "$bin" compare "$@"

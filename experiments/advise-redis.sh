#!/usr/bin/env bash
# How far `damon-hp advise` holds on a loaded Redis (docs/advise.md): start a Redis server of
# our own with 2 M keys of 256 B, keep redis-benchmark's GETs running, run `damon-hp advise
# --json` on it, then collapse all of its anonymous memory (the apps experiment's `everywhere`
# arm) and compare the RSS advise estimated under THP-always with the RSS measured. About a
# minute; root; Redis and its tools from Debian's packages (make setup installs them).
set -uo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-6390}
DIR=$(mktemp -d /tmp/damon-hp-advise-redis.XXXX)
cleanup() { kill "${RB:-}" "${RS:-}" 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# Redis 7 refuses DEBUG unless enabled; no persistence, so nothing is written but the log.
redis-server --port "$PORT" --enable-debug-command yes --save "" --appendonly no \
  --dir "$DIR" >"$DIR/server.log" 2>&1 &
RS=$!
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$PORT" DEBUG POPULATE 2000000 key 256 >/dev/null || { echo "populate failed"; exit 1; }
redis-benchmark -p "$PORT" -t get -r 2000000 -P 16 -c 4 -n 1000000000 -q >/dev/null 2>&1 &
RB=$!
sleep 5
echo "redis-server pid $RS, load $(cut -d' ' -f1 /proc/loadavg), commit $(git rev-parse --short HEAD)"
start=$(date +%s.%N)
.venv/bin/damon-hp advise --json "$RS" >"$DIR/advise.json" || { echo "advise failed"; exit 1; }
echo "advise took $(echo "$(date +%s.%N) - $start" | bc) s"
.venv/bin/python - "$RS" "$DIR/advise.json" <<'PY'
import json
import sys

from damon_hp import procfs
from damon_hp.experiment.apps.cell import collapse_everything

pid, mem = int(sys.argv[1]), json.load(open(sys.argv[2]))["memory"]
before = procfs.smaps_rollup(pid)["Rss"]
done = collapse_everything(pid)
after = procfs.smaps_rollup(pid)["Rss"]
mib = 1 << 20
print(f"RSS today {before / mib:.1f} MiB; advise's estimate under THP-always "
      f"{mem['rss_always_bytes'] / mib:.1f} MiB (+{mem['added_pct']:.1f} %); measured after "
      f"collapsing everything ({done['ok']} of {done['ranges']} ranges, errors {done['errors']}) "
      f"{after / mib:.1f} MiB: estimate off by {100 * (mem['rss_always_bytes'] - after) / after:+.2f} %")
PY

#!/usr/bin/env bash
# The main job: damon-hp on a bundled workload with known hot and cold ranges.
# On the host when some access source works here (doctor exit 0 or 1: on a paddr-only, busy
# DAMON that is the passive source, reading the foreign kdamond's events); otherwise in the VM.
set -uo pipefail
cd "$(dirname "$0")/.."
DHP=.venv/bin/damon-hp
HOT=${HOT:-256M} COLD=${COLD:-1G} SECONDS_=${SECONDS_:-40}
WORKLOAD=(workloads/bin/hotcold --hot "$HOT" --cold "$COLD" --seconds "$SECONDS_")

echo "== damon-hp doctor (this machine)"
$DHP doctor
rc=$?
if [ "$rc" -le 1 ]; then
  mkdir -p .cache/demo
  # Natively a hot set must be large for huge pages to matter, and a passive source sees it
  # only after a few of the foreign kdamond's aggregations (5 s each on our CI host).
  HOST_WORKLOAD=(workloads/bin/hotcold --hot "${HOT_HOST:-1G}" --cold "${COLD_HOST:-3G}"
                 --seconds "${SECONDS_HOST:-60}")
  echo "== an access source works here: damon-hp run natively on this machine"
  exec $DHP run --progress-s 5 --json .cache/demo/host.json -- "${HOST_WORKLOAD[@]}"
fi

cat <<MSG

== DAMON on this machine cannot be used by damon-hp (doctor exit $rc, reasons above).
== Running the same job in the test VM instead: the main pinned kernel (Debian's 7.3) under QEMU (TCG,
== ~25x slower than native), THP set to 'never' inside the VM so every huge page you see there
== was made by damon-hp. The VM boots in about 15-30 s.
MSG
# Inside the VM: doctor, THP never (so any AnonHugePages is damon-hp's doing), then the run.
# The JSON lands in the run's writable directory, which the host keeps under .cache/vm/runs/.
exec $DHP vm run --mem 4G -- sh -c '
  echo "== damon-hp doctor (inside the VM)"; damon-hp doctor
  echo never > /sys/kernel/mm/transparent_hugepage/enabled
  echo "== damon-hp run (inside the VM, THP never): $*"
  damon-hp run --json "$DAMON_HP_VM_RUN_DIR/demo.json" -- "$@"
  rc=$?
  echo "== timeline and summary: .cache/vm/runs/$(basename "$DAMON_HP_VM_RUN_DIR")/demo.json"
  exit $rc' demo "${WORKLOAD[@]}"

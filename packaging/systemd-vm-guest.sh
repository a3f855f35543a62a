#!/bin/sh
# Inside the test VM booted with systemd as PID 1 (packaging/systemd-vm-check.sh): install
# packaging/damon-hpd.service as a runtime unit, start, reload and stop it with systemctl, and
# check what each step must do. Prints "CHECK ok|FAIL <what>" lines and at the end
# "SYSTEMD-CHECK PASSED" or "SYSTEMD-CHECK FAILED".
#
# The unit is used as shipped; only ExecStart is overridden (drop-in), because the guest runs
# the project's virtualenv, not an installed /usr/local/bin/damon-hpd, and the config lives in
# /run (the guest's root is the host's, read-only).
# The console belongs to getty in this mode: the output goes to the kernel log instead, which
# the launcher reads back from the VM's console.
if [ -z "${DAMON_HP_CHECK_INNER:-}" ]; then
    DAMON_HP_CHECK_INNER=1 sh "$0" > /run/check.log 2>&1
    while IFS= read -r line; do echo "SDCHECK: $line" > /dev/kmsg; done < /run/check.log
    exit 0
fi
cd "$(dirname "$0")/.." || exit 1
failed=0
check() {  # check "what" command...
    what=$1; shift
    if "$@" > /dev/null 2>&1; then echo "CHECK ok $what"; else echo "CHECK FAIL $what"; failed=1; fi
}
kdamonds_on() {
    for k in /sys/kernel/mm/damon/admin/kdamonds/[0-9]*; do
        [ -e "$k/state" ] && [ "$(cat "$k/state")" = on ] && echo "$k"
    done
}

mkdir -p /run/systemd/system/damon-hpd.service.d /run/damon-hp-check
cp packaging/damon-hpd.service /run/systemd/system/damon-hpd.service
cat > /run/damon-hp-check/daemon.toml <<EOT
[daemon]
source = "auto"
budget = "64M"
scan_every_s = 2
summary_every_s = 10

[[rule]]
name = "hotcold"
exe = "hotcold"
EOT
cat > /run/systemd/system/damon-hpd.service.d/check.conf <<EOT
[Service]
ExecStart=
ExecStart=$PWD/.venv/bin/damon-hpd --config /run/damon-hp-check/daemon.toml --json /run/damon-hp/daemon.json
EOT
systemctl daemon-reload
echo "pid 1: $(cat /proc/1/comm); $(systemctl --version | head -1)"
check "systemd is PID 1" test "$(cat /proc/1/comm)" = systemd

workloads/bin/hotcold --hot 64M --cold 64M --seconds 900 > /dev/null &
hc=$!
systemctl start damon-hpd
check "systemctl start: active" systemctl is-active damon-hpd
main=$(systemctl show -p MainPID --value damon-hpd)
# CAP_SYS_PTRACE (19), CAP_SYS_ADMIN (21), CAP_SYS_NICE (23) and no others
check "capabilities: exactly SYS_ADMIN, SYS_NICE, SYS_PTRACE" \
    grep -q "^CapEff:[[:space:]]*0000000000a80000$" "/proc/$main/status"
i=0
until journalctl -u damon-hpd -o cat | grep -q "managing pid $hc "; do
    i=$((i + 1)); [ $i -gt 120 ] && break; sleep 1
done
check "the running daemon manages the matching process" \
    sh -c "journalctl -u damon-hpd -o cat | grep -q 'managing pid $hc '"
check "damon-hp status lists it" \
    sh -c "DAMON_HP_RUN_DIR=/run/damon-hp .venv/bin/damon-hp status | grep -q 'target pid $hc'"
check "its kdamond runs" test -n "$(kdamonds_on)"
check "its tracefs instance exists" test -d "/sys/kernel/tracing/instances/damon-hp-$main-0"

systemctl reload damon-hpd
i=0
until journalctl -u damon-hpd -o cat | grep -q "damon-hpd: reloaded"; do
    i=$((i + 1)); [ $i -gt 60 ] && break; sleep 1
done
check "systemctl reload: the config is reloaded" \
    sh -c "journalctl -u damon-hpd -o cat | grep -q 'damon-hpd: reloaded'"
check "systemctl reload: same main pid" test "$(systemctl show -p MainPID --value damon-hpd)" = "$main"

systemctl stop damon-hpd
check "systemctl stop: inactive, exit 0" \
    test "$(systemctl show -p Result --value damon-hpd)" = success
check "stop: no kdamond left running" test -z "$(kdamonds_on)"
check "stop: no tracefs instance left" \
    sh -c "! ls /sys/kernel/tracing/instances | grep -q '^damon-hp-'"
check "stop: no status record (the runtime directory is gone)" test ! -e /run/damon-hp
kill "$hc"

echo "journal of damon-hpd.service:"
journalctl -u damon-hpd -o cat --no-pager
if [ $failed = 0 ]; then echo "SYSTEMD-CHECK PASSED"; else echo "SYSTEMD-CHECK FAILED"; fi

#!/bin/sh
# Start, reload and stop packaging/damon-hpd.service under a real systemd: the test VM's kernel
# booted with systemd as PID 1 (virtme-ng --systemd, the host's own systemd 252 over its
# read-only root). The CI host has no systemd of its own (PID 1 is not systemd).
# Opt-in, not part of `make test`: it boots a whole Debian userspace under QEMU TCG (about 4
# minutes of one core). Exit 0 when every check of packaging/systemd-vm-guest.sh passed.
#
# virtme-ng's --systemd mode runs no command of ours, and systemd's generators (systemd.run=)
# do not take effect there; its per-run unit directory (~/.cache/virtme-ng/guest/run-*, put
# first on SYSTEMD_UNIT_PATH) is the one place a unit can come from, so a oneshot unit that
# runs the guest script is dropped into it while the VM boots. The guest's output comes back
# through the kernel log (/dev/kmsg, on the console): no shared folder is mounted in this mode.
set -u
cd "$(dirname "$0")/.." || exit 2
root=$PWD
out=$(mktemp -d /tmp/damon-hpd-systemd.XXXXXX)
kimg=$(.venv/bin/python -c 'from damon_hp import testvm; print(testvm.pinned_kernel().vmlinuz)') \
    || { echo "no pinned test kernel: make setup" >&2; exit 2; }
cache=$HOME/.cache/virtme-ng/guest
mkdir -p "$cache"
touch "$out/stamp"

cat > "$out/damon-hpd-check.service" <<EOF
[Unit]
Description=damon-hpd unit check, then power off
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/bin/sh $root/packaging/systemd-vm-guest.sh
ExecStopPost=/bin/systemctl start poweroff.target --job-mode=replace-irreversibly --no-block
EOF

PATH=$root/.venv/bin:$PATH timeout 900 .venv/bin/virtme-run --kimg "$kimg" --mods none \
    --disable-kvm --cpus 2 --memory 4G --user root --cwd "$root" --verbose --show-boot-console \
    --systemd -a printk.devkmsg=on > "$out/console.log" 2>&1 &
vm=$!
unitdir=
for _ in $(seq 1 300); do
    for d in "$cache"/run-*; do
        if [ "$d" -nt "$out/stamp" ] && [ -d "$d/serial-getty@.service.d" ]; then unitdir=$d; fi
    done
    [ -n "$unitdir" ] && break
    sleep 0.1
done
if [ -z "$unitdir" ]; then
    echo "virtme-ng made no unit directory; see $out/console.log" >&2
    kill "$vm"; exit 1
fi
cp "$out/damon-hpd-check.service" "$unitdir/"
mkdir -p "$unitdir/multi-user.target.wants"
ln -s ../damon-hpd-check.service "$unitdir/multi-user.target.wants/"
wait "$vm"
sed -n 's/^.*SDCHECK: //p' "$out/console.log" | tee "$out/guest.log"
echo "(console: $out/console.log)"
grep -q "^SYSTEMD-CHECK PASSED" "$out/guest.log"

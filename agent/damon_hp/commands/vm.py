"""Boot a pinned test kernel (kernel-config/pinned-kernel.env, or with --kernel lts
kernel-config/pinned-kernel-lts.env) with virtme-ng under QEMU TCG and run a command inside it,
over this machine's own filesystem.

Inside the VM you are root on a throwaway kernel with full DAMON (vaddr, paddr, DAMOS):
tracefs is mounted at /sys/kernel/tracing, cgroup2 at /sys/fs/cgroup, DAMON_HP_IN_VM=1 is
set, .venv/bin is first on PATH and the working directory is the project root. The work tree
is read-only in the guest; $DAMON_HP_VM_RUN_DIR (.cache/vm/runs/<id> on the host) is
writable and kept after the run (its stdout, stderr, exit_code, console.log). Code runs
~25x slower than on the host (no KVM). CMD's stdin is /dev/null; its stdout and stderr are
streamed to ours separately (their interleaving may differ from a terminal's). CMD is run as
given, not through a shell: use `sh -c '...'` for pipes, `&&` or redirections.

examples:
  damon-hp vm run -- uname -r
  damon-hp vm run --mem 6G -- damon-hp doctor
  damon-hp vm run --kernel lts -- uname -r
  damon-hp vm run -- sh -c 'cat /sys/kernel/mm/transparent_hugepage/enabled; damo version'
  damon-hp vm shell

exit codes: `vm run` returns the command's own exit code; 1 when the VM failed to boot or
died (the console tail is printed), 124 on --timeout, 2 when setup is missing.
"""

from __future__ import annotations

import argparse
import re
import sys

from damon_hp import testvm
from damon_hp.errors import DamonHpError

# QEMU's -m: a whole number of MiB, or with a K, M, G or T suffix.
_MEM = re.compile(r"^[1-9][0-9]*[KMGT]?$", re.IGNORECASE)


def _memory(text: str) -> str:
    if not _MEM.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a memory size: use a whole number with K, M, G or T (6G, 512M)")
    return text


def _cpus(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of vCPUs (a whole number >= 1)")
    return n


def _timeout(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v >= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds >= 0 (0 = no timeout)")
    return v


def _add_vm_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mem", type=_memory, default=testvm.DEFAULT_MEMORY, metavar="SIZE",
                   help="guest memory, QEMU syntax (default %(default)s; TCG allocates lazily)")
    p.add_argument("--cpus", type=_cpus, default=testvm.DEFAULT_CPUS, metavar="N",
                   help="guest vCPUs (default %(default)s)")
    p.add_argument("--kernel", choices=sorted(testvm.PIN_FILES), default=testvm.MAIN_KERNEL,
                   help="which pinned test kernel boots (default %(default)s; "
                   "kernel-config/README.md)")


def set_argparser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="vm_command", metavar="ACTION")
    run = sub.add_parser(
        "run", help="run CMD inside the VM, stream its output, return its exit code",
        description="Run CMD inside the test VM from the project root; its stdout and stderr "
        "are streamed here and its exit code is returned.",
    )
    _add_vm_options(run)
    run.add_argument("--timeout", type=_timeout, default=3600.0, metavar="SECONDS",
                     help="kill the VM after this long (default %(default)s; 0 = never)")
    run.add_argument("--console", action="store_true",
                     help="also stream the VM's serial console (kernel log) to stderr")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                     help="command and arguments to run inside the VM")
    shell = sub.add_parser("shell", help="interactive shell inside the VM (needs a terminal)")
    _add_vm_options(shell)


def main(args: argparse.Namespace) -> int:
    try:
        if args.vm_command == "shell":
            return testvm.shell_in_vm(memory=args.mem, cpus=args.cpus,
                                      kernel=testvm.pinned_kernel(args.kernel))
        if args.vm_command == "run":
            return _run(args)
    except DamonHpError as err:
        print(err, file=sys.stderr)
        return err.exit_code
    print("damon-hp vm: say `run -- CMD ...` or `shell` (see damon-hp vm --help)",
          file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("damon-hp vm run: no command given; usage: damon-hp vm run [--mem 6G] -- CMD ...",
              file=sys.stderr)
        return 2
    result = testvm.run_in_vm(
        cmd, memory=args.mem, cpus=args.cpus, timeout_s=args.timeout or None,
        stdout=sys.stdout, stderr=sys.stderr, console=sys.stderr if args.console else None,
        kernel=testvm.pinned_kernel(args.kernel),
    )
    if result.vm_failed:
        print(f"damon-hp vm run: {result.failure_text()}", file=sys.stderr)
    return result.exit_code

"""Boot the pinned test kernel with virtme-ng (QEMU TCG) and run one command inside it.

The VM sees the host's filesystem read-only (virtme-ng's overlays keep /etc, /tmp, /var...
writable but private), plus one shared read-write run directory under .cache/vm/runs/. The
command's stdout, stderr and exit code travel through files in that directory, because the
serial console mixes kernel messages with the command's output and virtme-ng's own exit code
does not carry the command's. The host streams the files while the VM runs.

The VM never outlives the caller: vng runs in its own process group, which is killed on
return, on SIGTERM/SIGINT and on timeout.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from damon_hp.errors import DamonHpError, EnvironmentProblem

PROJECT_ROOT = Path(__file__).resolve().parents[2]
KERNEL_CONFIG_DIR = PROJECT_ROOT / "kernel-config"
PIN_FILE = KERNEL_CONFIG_DIR / "pinned-kernel.env"
# The pinned test kernels by name (kernel-config/README.md): `main` runs the whole vm tier,
# `lts` the core of it.
PIN_FILES = {"main": PIN_FILE, "lts": KERNEL_CONFIG_DIR / "pinned-kernel-lts.env"}
MAIN_KERNEL = "main"
RUNS_DIR = PROJECT_ROOT / ".cache" / "vm" / "runs"
VENV_BIN = PROJECT_ROOT / ".venv" / "bin"

DEFAULT_MEMORY = "4G"
DEFAULT_CPUS = 2
CONSOLE_TAIL_LINES = 40
KEEP_RUNS = 20

# Exit codes for failures of the VM itself (not of the command inside).
EXIT_BOOT_FAILED = 1
EXIT_TIMEOUT = 124


@dataclass(frozen=True)
class PinnedKernel:
    """One pinned Debian kernel as kernel-config/fetch-kernel.sh unpacks it.

    Two package layouts: `linux-image-<rel>-unsigned` keeps boot/vmlinuz-<rel> and
    boot/config-<rel>; `linux-binary-<rel>` (trixie-backports since 6.19) keeps
    usr/lib/modules/<rel>/vmlinuz, its config coming from linux-base-<rel> in the same place.
    """

    package: str
    version: str
    sha256: str
    name: str = MAIN_KERNEL

    @property
    def release(self) -> str:
        """`uname -r` of the kernel, e.g. 7.3.4+deb13-amd64."""
        rel = self.package.removeprefix("linux-image-").removeprefix("linux-binary-")
        return rel.removesuffix("-unsigned")

    @property
    def series(self) -> str:
        """Major.minor, e.g. 7.3: what a vm test id says it ran on."""
        return ".".join(self.release.split(".")[:2])

    @property
    def binary_layout(self) -> bool:
        return self.package.startswith("linux-binary-")

    @property
    def root(self) -> Path:
        return PROJECT_ROOT / ".cache" / "kernel" / self.release

    @property
    def vmlinuz(self) -> Path:
        if self.binary_layout:
            return self.root / "usr" / "lib" / "modules" / self.release / "vmlinuz"
        return self.root / "boot" / f"vmlinuz-{self.release}"

    @property
    def config(self) -> Path:
        if self.binary_layout:
            return self.root / "usr" / "lib" / "modules" / self.release / "config"
        return self.root / "boot" / f"config-{self.release}"


def pinned_kernel(which: str | Path = MAIN_KERNEL) -> PinnedKernel:
    """The pinned kernel `which` (main or lts), or the one a given pin file names."""
    if isinstance(which, Path):
        pin_file, name = which, which.stem
    else:
        if which not in PIN_FILES:
            raise EnvironmentProblem(
                f"damon-hp vm: no pinned kernel named {which!r}; known: {', '.join(PIN_FILES)}"
            )
        pin_file, name = PIN_FILES[which], which
    values: dict[str, str] = {}
    for line in pin_file.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    try:
        return PinnedKernel(
            values["KERNEL_PACKAGE"], values["KERNEL_VERSION"], values["KERNEL_SHA256"], name
        )
    except KeyError as missing:
        raise EnvironmentProblem(
            f"damon-hp vm: {pin_file} lacks {missing}; restore it from git or re-pin with "
            f"`make kernel KERNEL={name} PIN=latest`"
        ) from None


def pinned_kernels() -> list[PinnedKernel]:
    """Every pinned test kernel, the main one first."""
    return [pinned_kernel(name) for name in PIN_FILES]


@dataclass
class VmResult:
    """What came back from one VM run."""

    exit_code: int  # the command's, or EXIT_BOOT_FAILED / EXIT_TIMEOUT when the VM failed
    booted: bool  # the guest script started
    finished: bool  # the guest script recorded the command's exit code
    timed_out: bool
    run_dir: Path
    boot_seconds: float | None
    wall_seconds: float
    vng_exit: int | None = None  # virtme-ng's own status (says nothing about the command)
    console_tail: list[str] = field(default_factory=list)

    @property
    def vm_failed(self) -> bool:
        return not self.finished

    def failure_text(self) -> str:
        """Plain explanation for a VM that did not deliver an exit code."""
        if self.timed_out:
            what = f"the test VM was killed after its timeout ({self.wall_seconds:.0f} s)"
        elif not self.booted:
            what = "the test VM did not boot (the guest never started the command)"
        else:
            what = "the test VM stopped before the command finished (guest crash or kill)"
        tail = "\n".join(f"  | {line}" for line in self.console_tail)
        if self.vng_exit is not None and not self.timed_out:
            what += f"; vng exited with status {self.vng_exit}"
        return (
            f"{what}.\nLast {len(self.console_tail)} console lines "
            f"(full log: {self.run_dir / 'console.log'}):\n{tail}"
        )


def rust_virtiofsd() -> str | None:
    """Path of a virtiofsd virtme-ng can drive, or None (then we force 9p).

    Debian 12's qemu ships an old C virtiofsd in /usr/lib/qemu that virtme-ng tries, fails
    to start and abandons after ~3 s; forcing 9p skips that wait.
    """
    candidates = [shutil.which("virtiofsd"), "/usr/libexec/virtiofsd",
                  "/usr/lib/virtiofsd", "/usr/lib/qemu/virtiofsd"]
    for path in candidates:
        if not path or not os.access(path, os.X_OK):
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=10, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.startswith("virtiofsd 1."):
            return path
    return None


def check_ready(kernel: PinnedKernel) -> None:
    if not (VENV_BIN / "vng").exists():
        raise EnvironmentProblem(
            f"damon-hp vm: virtme-ng is not installed ({VENV_BIN / 'vng'} missing); "
            "run `make setup`"
        )
    if not kernel.vmlinuz.exists():
        raise EnvironmentProblem(
            f"damon-hp vm: the pinned test kernel {kernel.release} ({kernel.name}) is not "
            f"unpacked ({kernel.vmlinuz} missing); run `make kernel` (or `make setup`)"
        )
    if shutil.which("qemu-system-x86_64") is None:
        raise EnvironmentProblem(
            "damon-hp vm: qemu-system-x86_64 not found; run `make setup` (installs qemu-system-x86)"
        )


def guest_script(run_dir: Path, command: Sequence[str], *, interactive: bool) -> str:
    """The shell script the guest runs: prepare the system, then run the command."""
    quoted = " ".join(shlex.quote(c) for c in command)
    root = shlex.quote(str(PROJECT_ROOT))
    rd = shlex.quote(str(run_dir))
    lines = [
        "#!/bin/sh",
        # tracefs for DAMON/THP tracepoints, cgroup2 for memcg experiments.
        "mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing",
        '[ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] || '
        "mount -t cgroup2 nodev /sys/fs/cgroup",
        "export DAMON_HP_IN_VM=1",
        f"export DAMON_HP_VM_RUN_DIR={rd}",
        f"export PATH={shlex.quote(str(VENV_BIN))}:/usr/local/sbin:/usr/local/bin:"
        "/usr/sbin:/usr/bin:/sbin:/bin",
        # The work tree is read-only in the guest: keep Python and pytest from writing there.
        "export PYTHONDONTWRITEBYTECODE=1",
        f"export HOME={rd}/home",
        'mkdir -p "$HOME"',
        f"cd {root}",
        # Give the emulated CPUs the TLB misses real ones have (see tlb_ticks.py).
        "python3 -m damon_hp.tlb_ticks &",
        f"echo booted > {rd}/booted",
    ]
    if interactive:
        lines.append(f"exec {quoted}")
    else:
        lines += [
            f"{quoted} > {rd}/stdout 2> {rd}/stderr < /dev/null",
            f"echo $? > {rd}/exit_code.tmp && mv {rd}/exit_code.tmp {rd}/exit_code",
            "sync",
        ]
    return "\n".join(lines) + "\n"


def vng_command(kernel: PinnedKernel, run_dir: Path, *, memory: str, cpus: int,
                exec_script: Path | None, shell_script: Path | None) -> list[str]:
    cmd = [
        str(VENV_BIN / "vng"),
        "--run", str(kernel.vmlinuz),
        # KVM on this host cannot boot ordinary kernels: always TCG.
        "--disable-kvm",
        # One emulation thread for all vCPUs. Multi-threaded TCG let a vCPU run a stale
        # translation of kernel text the other vCPU had just re-patched (static keys flip
        # when tracepoints, THP modes or DAMON change): the guest died of an "int3" Oops in
        # __schedule / ttwu_do_activate twice in ~15 test-tier runs, taking every later vm
        # test with it. Round-robin sees every patch at once.
        "--qemu-opt=-accel", "--qemu-opt=tcg,thread=single",
        "--cpus", str(cpus),
        "--memory", memory,
        # The kernel's boot-time check that the timer interrupt arrives through the IO-APIC
        # (check_timer) counts ticks over a short busy-wait; under TCG on a loaded host the
        # emulated ticks arrive late and 7.3 panicked "IO-APIC + timer doesn't work!" before
        # init (2026-11-25, host load ~15). The check proves nothing about an emulated board.
        "--append", "no_timer_check",
        "--user", "root",
        "--cwd", str(PROJECT_ROOT),
        "--rwdir", str(run_dir),
        # Without --verbose and a terminal, virtme-ng shows no guest output at all; the
        # console log is our only witness of a failed boot.
        "--verbose",
    ]
    # DAMON_HP_VM_FORCE_9P=1: compare or work around virtio-fs problems.
    if os.environ.get("DAMON_HP_VM_FORCE_9P") == "1" or rust_virtiofsd() is None:
        cmd.append("--force-9p")
    if exec_script is not None:
        cmd += ["--exec", f"sh {exec_script}"]
    if shell_script is not None:
        cmd += ["--shell", str(shell_script)]
    return cmd


def new_run_dir() -> Path:
    RUNS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = RUNS_DIR / f"{stamp}-{os.getpid()}"
    suffix = 0
    while True:
        candidate = run_dir if suffix == 0 else run_dir.with_name(f"{run_dir.name}-{suffix}")
        try:
            candidate.mkdir()
            break
        except FileExistsError:
            suffix += 1
    prune_old_runs()
    return candidate


def prune_old_runs(keep: int = KEEP_RUNS) -> None:
    """Keep the newest `keep` run directories; never remove one whose VM may still run
    (several people share one work tree and its .cache)."""
    runs = sorted((p for p in RUNS_DIR.iterdir() if p.is_dir()), key=lambda p: p.name)
    for old in runs[:-keep]:
        if not _owner_alive(old):
            shutil.rmtree(old, ignore_errors=True)


def _owner_alive(run_dir: Path) -> bool:
    # Names are <date>-<time>-<pid>[-n]; the pid is the process that ran the VM.
    try:
        pid = int(run_dir.name.split("-")[2])
        os.kill(pid, 0)
    except (IndexError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


class _Tail(threading.Thread):
    """Copy what a growing file gains to a stream until told to stop, then drain it."""

    def __init__(self, path: Path, out: TextIO | None) -> None:
        super().__init__(daemon=True)
        self.path, self.out = path, out
        self.stop_event = threading.Event()

    def run(self) -> None:
        pos = 0
        while True:
            stopping = self.stop_event.is_set()
            try:
                with self.path.open("rb") as f:
                    f.seek(pos)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            if chunk:
                pos += len(chunk)
                if self.out is not None:
                    self.out.write(chunk.decode(errors="replace"))
                    self.out.flush()
            if stopping:
                return
            self.stop_event.wait(0.2)


class VmTerminated(DamonHpError):
    """SIGTERM arrived while the VM ran; the VM has been stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"damon-hp vm: terminated by signal {signum}; the VM was stopped")
        self.exit_code = 128 + signum


def _raise_terminated(signum: int, _frame: object) -> None:
    raise VmTerminated(signum)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End vng, virtme-run, qemu and any helper: they share the group vng leads."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            # The leader is gone; helpers in the group may still linger.
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def console_tail(path: Path, lines: int = CONSOLE_TAIL_LINES) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ["(no console output was captured)"]
    return [ln.rstrip("\r") for ln in text.splitlines()[-lines:]] or ["(console log empty)"]


def run_in_vm(
    command: Sequence[str],
    *,
    memory: str = DEFAULT_MEMORY,
    cpus: int = DEFAULT_CPUS,
    timeout_s: float | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    console: TextIO | None = None,
    run_dir: Path | None = None,
    kernel: PinnedKernel | None = None,
    stop: threading.Event | None = None,
) -> VmResult:
    """Boot the VM, run `command` from the project root, stream its output, return.

    `stdout`/`stderr` receive the command's streams as they grow (None: only the files in the
    run directory); `console` receives the raw VM console. The run directory is writable by the
    guest (as $DAMON_HP_VM_RUN_DIR) and keeps stdout, stderr, exit_code and console.log.
    `kernel`: which pinned kernel boots (default the main one). `stop`: set from another thread,
    it ends the VM as a timeout would (a caller running several VMs in threads gets no signal
    there: only the main thread does).
    """
    if not command:
        raise DamonHpError("damon-hp vm: no command given")
    kernel = kernel or pinned_kernel()
    check_ready(kernel)
    run_dir = run_dir or new_run_dir()
    script = run_dir / "guest.sh"
    script.write_text(guest_script(run_dir, command, interactive=False))
    cmd = vng_command(kernel, run_dir, memory=memory, cpus=cpus, exec_script=script,
                      shell_script=None)
    env = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    console_log = run_dir / "console.log"
    tails = [_Tail(run_dir / "stdout", stdout), _Tail(run_dir / "stderr", stderr),
             _Tail(console_log, console)]

    started = time.monotonic()
    boot_s: float | None = None
    timed_out = False
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) \
        if threading.current_thread() is threading.main_thread() else None
    with console_log.open("wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=PROJECT_ROOT,
                                start_new_session=True)
        try:
            for t in tails:
                t.start()
            while proc.poll() is None:
                if boot_s is None and (run_dir / "booted").exists():
                    boot_s = time.monotonic() - started
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    timed_out = True
                    break
                if stop is not None and stop.is_set():
                    break
                time.sleep(0.2)
        finally:
            kill_group(proc)
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            for t in tails:
                t.stop_event.set()
            for t in tails:
                t.join(timeout=5)

    booted = (run_dir / "booted").exists()
    if boot_s is None and booted:
        boot_s = time.monotonic() - started
    code_file = run_dir / "exit_code"
    finished = code_file.exists() and not timed_out
    if finished:
        exit_code = int(code_file.read_text().strip() or EXIT_BOOT_FAILED)
    else:
        exit_code = EXIT_TIMEOUT if timed_out else EXIT_BOOT_FAILED
    return VmResult(
        exit_code=exit_code, booted=booted, finished=finished, timed_out=timed_out,
        run_dir=run_dir, boot_seconds=boot_s, wall_seconds=time.monotonic() - started,
        vng_exit=proc.returncode,
        console_tail=[] if finished else console_tail(console_log),
    )


def shell_in_vm(*, memory: str = DEFAULT_MEMORY, cpus: int = DEFAULT_CPUS,
                kernel: PinnedKernel | None = None) -> int:
    """Interactive shell in the VM, prepared like `run_in_vm` (needs a terminal)."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise EnvironmentProblem(
            "damon-hp vm shell: needs a terminal on stdin and stdout; for scripts and CI use "
            "`damon-hp vm run -- CMD`"
        )
    kernel = kernel or pinned_kernel()
    check_ready(kernel)
    run_dir = new_run_dir()
    script = run_dir / "shell.sh"
    script.write_text(guest_script(run_dir, ["bash", "-i"], interactive=True))
    script.chmod(0o755)
    cmd = vng_command(kernel, run_dir, memory=memory, cpus=cpus, exec_script=None,
                      shell_script=script)
    cmd.remove("--verbose")
    env = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    proc = subprocess.Popen(cmd, env=env, cwd=PROJECT_ROOT)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

"""Kernel config: read the running kernel's, and check it against kernel-config/damon-hp.config.

The fragment is the single list of options damon-hp needs or benefits from. Each option line
is preceded by a comment `# required: <reason>` or `# optional: <reason>`; `damon-hp doctor`
reports a missing required option as MISSING and a missing optional one as LIMITED.
"""

from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
FRAGMENT = REPO_ROOT / "kernel-config" / "damon-hp.config"

_SET = re.compile(r"^(CONFIG_[A-Za-z0-9_]+)=(.*)$")
_UNSET = re.compile(r"^# (CONFIG_[A-Za-z0-9_]+) is not set$")
_MARK = re.compile(r"^#\s*(required|optional):\s*(.+)$")


@dataclass(frozen=True)
class KernelConfig:
    """Option name (with CONFIG_) -> value: "y", "m", "n" (is not set) or the raw string."""

    source: str
    options: dict[str, str]

    def value(self, name: str) -> str:
        """The option's value; "n" when the config does not mention it at all."""
        return self.options.get(_full(name), "n")


@dataclass(frozen=True)
class Want:
    """One fragment entry: `name` should be `value`; `required` decides MISSING vs LIMITED."""

    name: str
    value: str
    required: bool
    reason: str

    def satisfied_by(self, actual: str) -> bool:
        if self.value in ("y", "m"):
            return actual in ("y", "m")  # built in or as a module: either provides it
        return actual == self.value


def _full(name: str) -> str:
    return name if name.startswith("CONFIG_") else "CONFIG_" + name


def parse_config(text: str, source: str = "<text>") -> KernelConfig:
    opts: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if m := _SET.match(line):
            val = m.group(2)
            if len(val) >= 2 and val[0] == val[-1] == '"':
                val = val[1:-1]
            opts[m.group(1)] = val
        elif m := _UNSET.match(line):
            opts[m.group(1)] = "n"
    return KernelConfig(source, opts)


def parse_fragment(text: str) -> list[Want]:
    """Entries of a damon-hp config fragment; an option without a mark is an error."""
    wants: list[Want] = []
    mark: tuple[bool, str] | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if m := _MARK.match(line):
            mark = (m.group(1) == "required", m.group(2).strip())
            continue
        m = _SET.match(line) or _UNSET.match(line)
        if not m:
            continue
        name = m.group(1)
        value = m.group(2) if m.re is _SET else "n"
        if mark is None:
            raise ValueError(f"fragment line {lineno}: {name} has no '# required:' or "
                             "'# optional:' line above it")
        wants.append(Want(name, value, mark[0], mark[1]))
        mark = None
    return wants


def load_fragment(path: Path | None = None) -> list[Want]:
    return parse_fragment((path or FRAGMENT).read_text())


def candidate_paths(release: str | None = None) -> list[Path]:
    """Where the running kernel's config may be, most authoritative first."""
    rel = release or os.uname().release
    paths = []
    if env := os.environ.get("DAMON_HP_KERNEL_CONFIG"):
        paths.append(Path(env))
    paths += [
        Path("/proc/config.gz"),
        Path(f"/boot/config-{rel}"),
        Path(f"/lib/modules/{rel}/config"),
        Path(f"/lib/modules/{rel}/build/.config"),
        # The test VM boots a kernel unpacked here by kernel-config/fetch-kernel.sh; its /boot
        # is the host's, so the config is only found in the project's cache.
        REPO_ROOT / ".cache" / "kernel" / rel / "boot" / f"config-{rel}",
        # The same for a merged-/usr package (linux-base-<rel>, trixie-backports since 6.19).
        REPO_ROOT / ".cache" / "kernel" / rel / "usr" / "lib" / "modules" / rel / "config",
    ]
    return paths


def read_running_config(release: str | None = None) -> KernelConfig | None:
    for p in candidate_paths(release):
        try:
            if p.suffix == ".gz":
                text = gzip.decompress(p.read_bytes()).decode(errors="replace")
            else:
                text = p.read_text(errors="replace")
        except OSError:
            continue
        return parse_config(text, str(p))
    return None


@dataclass(frozen=True)
class OptionResult:
    want: Want
    actual: str

    @property
    def ok(self) -> bool:
        return self.want.satisfied_by(self.actual)


def check(cfg: KernelConfig, wants: list[Want]) -> list[OptionResult]:
    return [OptionResult(w, cfg.value(w.name)) for w in wants]

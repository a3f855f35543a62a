"""What DAMON offers here and which kdamonds exist, whose they are: read, never written.

`probe()` is safe on any machine (the doctor and every start use it). A kdamond is damon-hp's
only when an ownership record proves it (see ownership.py); everything else is foreign.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import io, modules, ownership
from .io import ADMIN
from .modules import ModuleKdamond

OWNER_DAMON_HP = "damon-hp"  # started by a live damon-hp agent
OWNER_STALE = "damon-hp (agent gone)"  # started by damon-hp; its agent died without stopping it
OWNER_FOREIGN = "foreign"  # anything damon-hp cannot prove it started
OWNER_NONE = "none"  # an idle kdamond directory with no context configured


@dataclass(frozen=True)
class KdamondInfo:
    """One kdamond directory as found in sysfs, and whose it is."""

    index: int
    state: str  # "on", "off", or "?" when unreadable
    pid: int | None  # the kdamond thread's pid while it runs
    ops: tuple[str, ...]  # operations set of each context
    target_pids: tuple[int, ...]  # pid_target of each target (0 for paddr)
    owner: str  # one of the OWNER_* values
    agent_pid: int | None = None  # the damon-hp agent that started it, when known

    @property
    def running(self) -> bool:
        return self.state == "on"

    @property
    def configured(self) -> bool:
        return bool(self.ops)

    def describe(self) -> str:
        ops = ",".join(self.ops) or "none"
        pid = f"pid {self.pid}" if self.pid else "not running"
        return f"kdamond {self.index} ({pid}, ops {ops})"

    def to_dict(self) -> dict:
        return {"index": self.index, "state": self.state, "pid": self.pid,
                "ops": list(self.ops), "target_pids": list(self.target_pids),
                "owner": self.owner, "agent_pid": self.agent_pid}

    @classmethod
    def from_dict(cls, d: dict) -> KdamondInfo:
        return cls(int(d["index"]), str(d["state"]), d.get("pid"), tuple(d["ops"]),
                   tuple(int(p) for p in d["target_pids"]), str(d["owner"]),
                   d.get("agent_pid"))


@dataclass(frozen=True)
class DamonStatus:
    """What DAMON sysfs looks like now, read without writing anything."""

    sysfs_present: bool
    readable: bool
    error: str | None
    avail_ops: tuple[str, ...]  # operations sets this kernel offers
    avail_ops_source: str  # "avail_operations", "kernel config", "kallsyms" or "unknown"
    kdamonds: tuple[KdamondInfo, ...]
    features: dict[str, bool] = field(default_factory=dict)  # see _detect_features
    features_source: str = "unknown"  # "sysfs" or "kernel version"
    # Running kdamonds sysfs does not list: DAMON modules' (modules.py), then unknown ones.
    unlisted: tuple[ModuleKdamond, ...] = ()

    @property
    def exclusive(self) -> tuple[ModuleKdamond, ...]:
        """DAMON modules' kdamonds: each keeps every other kdamond from starting."""
        return tuple(m for m in self.unlisted if m.module)

    @property
    def running(self) -> tuple[KdamondInfo, ...]:
        return tuple(k for k in self.kdamonds if k.running)

    @property
    def foreign_running(self) -> tuple[KdamondInfo, ...]:
        return tuple(k for k in self.running if k.owner == OWNER_FOREIGN)

    @property
    def can_add_kdamond(self) -> bool:
        """Whether `nr_kdamonds` can change now: only while no kdamond at all runs."""
        return self.sysfs_present and self.readable and not self.running

    def to_dict(self) -> dict:
        return {
            "sysfs_present": self.sysfs_present, "readable": self.readable, "error": self.error,
            "avail_ops": list(self.avail_ops), "avail_ops_source": self.avail_ops_source,
            "kdamonds": [k.to_dict() for k in self.kdamonds],
            "can_add_kdamond": self.can_add_kdamond,
            "features": dict(self.features), "features_source": self.features_source,
            "unlisted_kdamonds": [m.to_dict() for m in self.unlisted],
        }

    @classmethod
    def from_dict(cls, d: dict) -> DamonStatus:
        return cls(bool(d["sysfs_present"]), bool(d["readable"]), d.get("error"),
                   tuple(d["avail_ops"]), str(d["avail_ops_source"]),
                   tuple(KdamondInfo.from_dict(k) for k in d["kdamonds"]),
                   dict(d.get("features", {})), str(d.get("features_source", "unknown")),
                   tuple(ModuleKdamond(m["module"], int(m["pid"]), m.get("sample_us"),
                                       m.get("aggr_us"), bool(m.get("autotuned")))
                         for m in d.get("unlisted_kdamonds", [])))


def kernel_release() -> str:
    return os.uname().release


def kernel_version(release: str | None = None) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release or kernel_release())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


# Feature -> (first kernel with it, path relative to a scheme or context dir that proves it).
FEATURES: dict[str, tuple[tuple[int, int], str]] = {
    "tried_regions": ((6, 2), "schemes/0/tried_regions"),
    "tried_bytes": ((6, 6), "schemes/0/tried_regions/total_bytes"),
    "apply_interval": ((6, 7), "schemes/0/apply_interval_us"),
    "filter_allow": ((6, 14), None),  # only visible inside a filter dir
    "core_filters": ((6, 15), "schemes/0/core_filters"),
    "intervals_goal": ((6, 15), "monitoring_attrs/intervals/intervals_goal"),
    "collapse_action": ((7, 2), None),  # not visible in sysfs: probe by writing an action
}


def detect_features(ctx: Path | None, release: str) -> tuple[dict[str, bool], str]:
    ver = kernel_version(release)
    by_version = {name: ver >= since for name, (since, _) in FEATURES.items()}
    if ctx is None or not (ctx / "schemes/0").is_dir():
        return by_version, "kernel version"
    found = dict(by_version)
    for name, (_, rel) in FEATURES.items():
        if rel is not None:
            found[name] = (ctx / rel).exists()
    return found, "sysfs"


def _ops_from_kallsyms() -> tuple[str, ...]:
    """Operations sets inferred from kernel symbols, for when no kdamond dir can be read."""
    found = set()
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                if " damon_va_" in line:
                    found.add("vaddr")
                elif " damon_pa_" in line:
                    found.add("paddr")
                if len(found) == 2:
                    break
    except OSError:
        return ()
    return tuple(sorted(found))


def _ops_from_kconfig() -> tuple[str, ...] | None:
    # Imported here: kconfig is the doctor's module and the agent need not load it.
    from .. import kconfig

    cfg = kconfig.read_running_config()
    if cfg is None:
        return None
    ops = []
    if cfg.options.get("CONFIG_DAMON_VADDR") in ("y", "m"):
        ops += ["vaddr", "fvaddr"]
    if cfg.options.get("CONFIG_DAMON_PADDR") in ("y", "m"):
        ops.append("paddr")
    return tuple(ops)


def _owner_of(index: int, state: str, pid: int | None, ops: tuple[str, ...],
              target_pids: tuple[int, ...],
              records: dict[int, ownership.OwnerRecord]) -> tuple[str, int | None]:
    rec = records.get(index)
    if state == "on":
        if rec is not None and rec.proves(index, pid, target_pids):
            return (OWNER_DAMON_HP if rec.agent_alive() else OWNER_STALE), rec.agent_pid
        return OWNER_FOREIGN, None
    if not ops:
        return OWNER_NONE, None
    if rec is not None and rec.this_boot() and rec.target_pid in target_pids:
        return (OWNER_DAMON_HP if rec.agent_alive() else OWNER_STALE), rec.agent_pid
    return OWNER_FOREIGN, None


def _read_kdamond(kd: Path, records: dict[int, ownership.OwnerRecord]) -> KdamondInfo:
    index = int(kd.name)
    try:
        state = io.read(kd / "state")
    except OSError:
        state = "?"
    pid = io.read_int(kd / "pid")
    pid = pid if pid and pid > 0 else None
    ops, targets = [], []
    for ctx in io.numbered_dirs(kd / "contexts"):
        try:
            ops.append(io.read(ctx / "operations"))
        except OSError:
            ops.append("?")
        for t in io.numbered_dirs(ctx / "targets"):
            targets.append(io.read_int(t / "pid_target", 0) or 0)
    owner, agent = _owner_of(index, state, pid, tuple(ops), tuple(targets), records)
    return KdamondInfo(index, state, pid, tuple(ops), tuple(targets), owner, agent)


def probe(admin: Path = ADMIN, run_dir: Path | None = None) -> DamonStatus:
    """Read DAMON's sysfs state. Never writes, so it is safe on any machine."""
    release = kernel_release()
    if not admin.is_dir():
        feats, src = detect_features(None, release)
        return DamonStatus(False, False, f"{admin} does not exist", (), "unknown", (), feats, src)
    try:
        kd_dirs = io.numbered_dirs(admin / "kdamonds")
        io.read(admin / "kdamonds/nr_kdamonds")
    except OSError as e:
        feats, src = detect_features(None, release)
        return DamonStatus(True, False, f"cannot read {admin}: {e.strerror}", (), "unknown", (),
                           feats, src)
    records = ownership.read_records(run_dir)
    kdamonds = tuple(_read_kdamond(kd, records) for kd in kd_dirs)

    avail: tuple[str, ...] = ()
    source = "unknown"
    first_ctx = None
    for kd in kd_dirs:
        for ctx in io.numbered_dirs(kd / "contexts"):
            first_ctx = first_ctx or ctx
            try:
                avail = tuple(io.read(ctx / "avail_operations").split())
                source = "avail_operations"
            except OSError:
                continue
            break
        if avail:
            break
    if not avail:
        from_cfg = _ops_from_kconfig()
        if from_cfg is not None:
            avail, source = from_cfg, "kernel config"
        else:
            avail = _ops_from_kallsyms()
            source = "kallsyms" if avail else "unknown"
    feats, fsrc = detect_features(first_ctx, release)
    unlisted = tuple(modules.unlisted_kdamonds({k.pid for k in kdamonds if k.pid}))
    return DamonStatus(True, True, None, avail, source, kdamonds, feats, fsrc, unlisted)




def running_kdamond_pids(admin: Path = ADMIN) -> dict[int, int]:
    """{kdamond index: thread pid} of the running kdamonds: a cheap read, for samplers."""
    out = {}
    for d in io.numbered_dirs(admin / "kdamonds"):
        pid = io.read_int(d / "pid", -1)
        if pid and pid > 0:
            out[int(d.name)] = pid
    return out


def read_intervals(index: int, admin: Path = ADMIN) -> tuple[int, int, int] | None:
    """(sample_us, aggr_us, update_us) of kdamond `index`'s first context, read-only."""
    iv = admin / "kdamonds" / str(index) / "contexts/0/monitoring_attrs/intervals"
    vals = [io.read_int(iv / n) for n in ("sample_us", "aggr_us", "update_us")]
    if any(v is None or v <= 0 for v in vals):
        return None
    return vals[0], vals[1], vals[2]  # type: ignore[return-value]


def scheme_actions(index: int, admin: Path = ADMIN) -> list[str]:
    """The DAMOS actions of kdamond `index`'s schemes (e.g. ['pageout']), read-only."""
    out = []
    for sdir in io.numbered_dirs(admin / "kdamonds" / str(index) / "contexts/0/schemes"):
        try:
            out.append(io.read(sdir / "action"))
        except OSError:
            out.append("?")
    return out


def read_max_regions(index: int, admin: Path = ADMIN) -> int:
    """kdamond `index`'s maximum number of regions (sizes an event buffer), read-only."""
    nr = admin / "kdamonds" / str(index) / "contexts/0/monitoring_attrs/nr_regions/max"
    return io.read_int(nr, 1000) or 1000

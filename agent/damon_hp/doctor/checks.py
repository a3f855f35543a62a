"""What `damon-hp doctor` concludes: facts in, `Check`s out, pure.

Statuses: OK; LIMITED (damon-hp runs, without that capability); MISSING (damon-hp cannot run).
Exit code: 2 if anything is MISSING, else 1 if anything is LIMITED, else 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from .. import damon, kconfig
from ..errors import EnvironmentProblem
from .facts import THP, Facts

OK, LIMITED, MISSING = "OK", "LIMITED", "MISSING"
VM_HINT = "in the test VM: make vm-run CMD='.venv/bin/damon-hp doctor'"

# Capability bits (linux/capability.h) and what damon-hp uses each for.
CAPS: dict[str, tuple[int, bool, str]] = {
    "CAP_SYS_ADMIN": (21, True, "write DAMON sysfs"),
    "CAP_SYS_NICE": (23, True, "process_madvise on another process"),
    "CAP_PERFMON": (38, False, "perf counters (TLB misses)"),
    "CAP_BPF": (39, False, "load hpstat's BPF programs"),
}


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status:<8} {self.name:<18} {self.detail}"
        return text + (f"  -> {self.fix}" if self.fix else "")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def check_kernel(release: str, features: dict[str, bool]) -> Check:
    ver = damon.kernel_version(release)
    collapse = ("DAMOS collapse action available" if features.get("collapse_action")
                else "no DAMOS collapse action (7.2+): promotion uses "
                     "process_madvise(MADV_COLLAPSE)")
    shown = f"{release} (6.6+: tried_regions, DAMOS address filters); {collapse}"
    if ver < (6, 2):
        return Check("kernel", MISSING, f"{release}: damon-hp needs 6.2+ (DAMOS tried_regions)",
                     "boot Linux 6.2 or newer; " + VM_HINT)
    if ver < (6, 6):
        return Check("kernel", LIMITED, f"{release}: no DAMOS address filters (6.6+), so hot "
                     "ranges cannot be marked MADV_HUGEPAGE by DAMOS", "boot Linux 6.6 or newer")
    return Check("kernel", OK, shown)


def check_config(source: str | None, values: dict[str, str],
                 wants: list[kconfig.Want]) -> list[Check]:
    if source is None:
        return [Check("config", LIMITED, "kernel config not found (/proc/config.gz, "
                      "/boot/config-*, /lib/modules/*/config): options not checked; the "
                      "runtime checks below still decide",
                      "set CONFIG_IKCONFIG_PROC=y, or point DAMON_HP_KERNEL_CONFIG at the "
                      "kernel's config file")]
    out, good = [], []
    for w in wants:
        actual = values.get(w.name, "n")
        if w.satisfied_by(actual):
            good.append(w.name.removeprefix("CONFIG_"))
            continue
        status = MISSING if w.required else LIMITED
        fix = (f"rebuild with {w.name}={w.value} (kernel-config/damon-hp.config)"
               + ("; or run " + VM_HINT if w.required else ""))
        out.append(Check(f"config {w.name.removeprefix('CONFIG_')}", status,
                         f"{actual if actual != 'n' else 'not set'}, want {w.value}: "
                         f"{w.reason}", fix))
    summary = Check("config", OK if not out else LIMITED if all(
        c.status == LIMITED for c in out) else MISSING,
        f"{len(good)} of {len(wants)} options as damon-hp wants (from {source})"
        + (f"; not as wanted: {', '.join(c.name.split()[1] for c in out)}" if out else ""),
        "see the config lines below" if out else "")
    return [summary, *out]


def check_damon(status: damon.DamonStatus) -> list[Check]:
    if not status.sysfs_present:
        return [Check("damon sysfs", MISSING, "/sys/kernel/mm/damon/admin does not exist",
                      "boot a kernel with CONFIG_DAMON_SYSFS=y; " + VM_HINT)]
    if not status.readable:
        busy = "(EBUSY)" in (status.error or "")  # gather(): another DAMON user held its lock
        return [Check("damon sysfs", MISSING, status.error or "unreadable",
                      "try again when the other DAMON user is done" if busy
                      else "run damon-hp as root")]
    out = [Check("damon sysfs", OK, "/sys/kernel/mm/damon/admin present")]
    ops = ", ".join(status.avail_ops) or "none"
    src = f"(from {status.avail_ops_source})"
    if not status.avail_ops:
        out.append(Check("damon ops", LIMITED, "operations sets unknown: no kdamond dir to read "
                         "avail_operations from, no kernel config, no kallsyms",
                         "damon-hp will find out when it starts"))
    elif "vaddr" in status.avail_ops:
        out.append(Check("damon ops", OK, f"{ops} {src}"))
    else:
        out.append(Check("damon ops", LIMITED, f"only {ops} {src}: no vaddr, so damon-hp reads "
                         "physical regions and maps them back (paddr or passive source), and "
                         "cannot mark ranges MADV_HUGEPAGE/NOHUGEPAGE through DAMOS",
                         "boot a kernel with CONFIG_DAMON_VADDR=y for the vaddr source; "
                         + VM_HINT))
    for k in status.kdamonds:
        ops_k = ",".join(k.ops) or "none"
        where = f"pid {k.pid}, " if k.pid else ""
        state = "running" if k.running else "idle"
        base = f"{state}, {where}ops {ops_k}"
        if k.owner == damon.OWNER_DAMON_HP:
            out.append(Check(f"kdamond {k.index}", OK, f"{base}, started by damon-hp agent pid "
                             f"{k.agent_pid} (targets {list(k.target_pids)})"))
        elif k.owner == damon.OWNER_STALE:
            out.append(Check(f"kdamond {k.index}", LIMITED, f"{base}, started by damon-hp agent "
                             f"pid {k.agent_pid}, which is gone",
                             "the next damon-hp run stops and clears it"))
        elif k.owner == damon.OWNER_NONE:
            out.append(Check(f"kdamond {k.index}", OK, f"{base}, empty (no context)"))
        else:
            out.append(Check(f"kdamond {k.index}", LIMITED,
                             f"{base}, NOT started by damon-hp: damon-hp never stops or "
                             "changes it", ""))
    for m in status.unlisted:
        out.append(Check(f"kdamond pid {m.pid}", LIMITED, f"{m.describe()}: NOT started by "
                         "damon-hp, never stopped or changed by it"
                         + ("; its DAMON context is exclusive: no other kdamond can start "
                            "while it runs" if m.module else ""),
                         "damon-hp reads its events (passive source)" if m.module else ""))
    out.append(check_new_kdamond(status))
    return out


def check_sources(status: damon.DamonStatus, tracefs: dict[str, Any],
                  foreign: dict[str, Any]) -> list[Check]:
    """One line per access source (vaddr, paddr, passive): works here, or why not.

    A source that does not work is LIMITED while another one does; MISSING when none does.
    """
    found: list[tuple[str, str | None, str]] = []  # (name, refusal or None, detail)
    stream = bool(tracefs.get("damon_aggregated"))
    # A start first stops kdamonds left by dead agents: judge as if they were gone.
    after_reclaim = dataclasses.replace(status, kdamonds=tuple(
        dataclasses.replace(k, state="off", pid=None) if k.owner == damon.OWNER_STALE else k
        for k in status.kdamonds))
    for ops in ("vaddr", "paddr"):
        try:
            plan = damon.plan_start(after_reclaim, ops)
        except EnvironmentProblem as e:
            found.append((ops, str(e).removeprefix("damon-hp: "), ""))
            continue
        reader = "event stream" if stream else "tried_regions (no damon_aggregated events)"
        if ops == "paddr" and not stream:
            found.append((ops, "needs the damon:damon_aggregated tracepoint (tracefs)", ""))
            continue
        found.append((ops, None, f"a kdamond of damon-hp's in dir {plan.index}, read by "
                      f"{reader}"))
    candidates = [k for k in status.foreign_running if k.ops and k.ops[0] == "paddr"]
    if not stream:
        found.append(("passive", "needs the damon:damon_aggregated tracepoint (mount tracefs)",
                      ""))
    elif status.exclusive and not candidates:
        m = status.exclusive[0]
        tuned = (f"; {m.label} auto-tunes its intervals, damon-hp follows them"
                 + ("" if tracefs.get("damon_monitor_intervals_tune") else
                    " (no damon_monitor_intervals_tune event here: only as read at start)")
                 if m.autotuned else "")
        found.append(("passive", None,
                      f"reads {m.describe()} through its events only (nothing written under "
                      f"/sys/kernel/mm/damon or /sys/module){tuned}; a hot set shows after "
                      "several aggregations; promotion by collapse only"))
    elif not candidates:
        found.append(("passive", "no running paddr kdamond that damon-hp did not start", ""))
    else:
        k = candidates[0]
        info = foreign.get(str(k.index), {})
        iv = info.get("intervals_us") or [0, 0, 0]
        schemes = ", ".join(info.get("schemes") or []) or "none"
        found.append(("passive", None,
                      f"reads {k.describe()}: sample {iv[0] / 1000:g} ms, aggregation "
                      f"{iv[1] / 1000:g} ms, its schemes: {schemes} (never changed); a hot set "
                      "shows after several aggregations; promotion by collapse only"))
    chosen = next((n for n, r, _ in found if r is None), None)
    checks = []
    for name, refusal, detail in found:
        if refusal is None:
            checks.append(Check(f"source {name}", OK, detail))
        elif chosen == "vaddr":  # the best source works: the others are not needed
            checks.append(Check(f"source {name}", OK, f"not needed here (vaddr works); "
                                f"unavailable: {refusal}"))
        else:
            checks.append(Check(f"source {name}", LIMITED if chosen else MISSING,
                                f"unavailable: {refusal}", "" if chosen else VM_HINT))
    checks.append(Check("source", OK if chosen else MISSING,
                        f"--source auto takes {chosen}" if chosen else
                        "no access source works here", "" if chosen else VM_HINT))
    return checks


def check_new_kdamond(status: damon.DamonStatus) -> Check:
    running = status.running
    if running and all(k.owner == damon.OWNER_STALE for k in running):
        return Check("new kdamond", LIMITED, "not until the kdamond(s) left by a dead damon-hp "
                     "agent stop", "damon-hp stops them itself when it starts")
    try:
        plan = damon.plan_placement(status)
    except EnvironmentProblem as e:
        held = bool(status.foreign_running or status.exclusive)
        fix = "leave it running if it is not yours; " + VM_HINT if held else ""
        return Check("new kdamond", LIMITED if held else MISSING,
                     "cannot add one now: " + str(e).removeprefix("damon-hp: "), fix)
    how = (f"kdamond dir {plan.index} will be created" if plan.set_nr_kdamonds is not None
           else f"idle kdamond dir {plan.index} will be reused")
    return Check("new kdamond", OK, f"can add one now ({how}; nothing was written to check)")


def check_thp(thp: dict[str, str | None]) -> Check:
    enabled = thp.get("enabled")
    if enabled is None:
        return Check("thp", MISSING, f"{THP} missing: no transparent huge pages",
                     "boot a kernel with CONFIG_TRANSPARENT_HUGEPAGE=y")
    effect = {
        "never": "MADV_COLLAPSE still works; DAMOS hugepage marks have no visible effect",
        "madvise": "damon-hp collapses hot ranges and marks them MADV_HUGEPAGE",
        "always": "every range may get huge pages at fault; damon-hp's useful act is "
                  "demoting cold ones",
    }.get(enabled, "unknown mode")
    k = (f"khugepaged defrag={thp.get('khugepaged_defrag')} "
         f"pages_to_scan={thp.get('khugepaged_pages_to_scan')} "
         f"scan_sleep={thp.get('khugepaged_scan_sleep_millisecs')}ms "
         f"max_ptes_none={thp.get('khugepaged_max_ptes_none')}")
    return Check("thp", OK, f"enabled={enabled} defrag={thp.get('defrag')}, {k} ({effect}; "
                 "doctor only reads these)")


def _probe_check(name: str, result: str, what: str, missing_fix: str) -> Check:
    if result == "ok":
        return Check(name, OK, f"{what}: works")
    if result in ("EAGAIN", "ENOMEM", "EBUSY"):
        return Check(name, LIMITED, f"{what}: supported, but failed just now ({result}: no "
                     "free 2 MiB block or a busy page)", "retry; memory may be fragmented")
    return Check(name, MISSING, f"{what}: failed with {result}", missing_fix)


def check_madv_collapse(result: str) -> Check:
    return _probe_check("madv_collapse", result,
                        "madvise(MADV_COLLAPSE) on 2 MiB of doctor's own scratch memory",
                        "MADV_COLLAPSE needs Linux 6.1+ with CONFIG_TRANSPARENT_HUGEPAGE")


def check_process_madvise(result: str) -> Check:
    fix = ("run as root (CAP_SYS_NICE)" if result == "EPERM"
           else "needs Linux 6.1+ (process_madvise accepting MADV_COLLAPSE)")
    return _probe_check("process_madvise", result,
                        "process_madvise(MADV_COLLAPSE) via pidfd on a forked child's scratch "
                        "memory", fix)


def check_tracefs(t: dict[str, Any]) -> Check:
    if not t.get("mount"):
        if t.get("mountable") and t.get("damon_aggregated"):
            return Check("tracefs", OK, "not mounted yet: damon-hp mounts it at "
                         "/sys/kernel/tracing when it starts (the kernel has the "
                         "damon:damon_aggregated tracepoint)")
        return Check("tracefs", LIMITED, "not mounted: no DAMON or huge_memory tracepoints",
                     "mount -t tracefs nodev /sys/kernel/tracing")
    if t.get("readable") is False:
        return Check("tracefs", LIMITED, f"mounted at {t['mount']}, but not readable by this "
                     "user: cannot tell which tracepoints it has", "run damon-hp as root (sudo)")
    missing = [n for n in ("damon_aggregated", "huge_memory") if not t.get(n)]
    if missing:
        return Check("tracefs", LIMITED, f"mounted at {t['mount']}, but no "
                     f"{' or '.join(missing)} events", "needs CONFIG_DAMON and CONFIG_FTRACE")
    return Check("tracefs", OK, f"{t['mount']}: damon:damon_aggregated and huge_memory events")


def check_btf(present: bool) -> Check:
    if present:
        return Check("btf", OK, "/sys/kernel/btf/vmlinux: hpstat's CO-RE BPF programs can load")
    return Check("btf", LIMITED, "no /sys/kernel/btf/vmlinux: `damon-hp trace` (hpstat) cannot "
                 "load", "boot a kernel with CONFIG_DEBUG_INFO_BTF=y")


def check_pmu(pmu: dict[str, Any]) -> Check:
    cycles, dtlb = pmu.get("cycles"), pmu.get("dtlb_load_misses")
    devs = ", ".join(pmu.get("devices", [])) or "none"
    if cycles == "ok" and dtlb == "ok":
        return Check("pmu", OK, "hardware PMU: cpu cycles and dTLB load misses countable")
    if cycles == "ok":
        return Check("pmu", LIMITED, f"cpu cycles countable but dTLB misses not ({dtlb}): "
                     "TLB-miss figures show n/a")
    return Check("pmu", LIMITED, f"no hardware PMU (perf cycles: {cycles}; event sources: "
                 f"{devs}): TLB-miss figures show n/a (no PMU)",
                 "use bare metal or a VM with PMU passthrough for TLB counts")


def check_privileges(euid: int, cap_eff: int) -> list[Check]:
    out = []
    if euid == 0:
        out.append(Check("root", OK, "running as root"))
    else:
        out.append(Check("root", MISSING, f"euid {euid}: DAMON sysfs is root-only",
                         "run damon-hp as root (sudo)"))
    have = [n for n, (bit, _, _) in CAPS.items() if cap_eff >> bit & 1]
    lacking_req = [n for n, (bit, req, _) in CAPS.items() if req and not cap_eff >> bit & 1]
    lacking_opt = [n for n, (bit, req, _) in CAPS.items() if not req and not cap_eff >> bit & 1]
    if lacking_req:
        out.append(Check("capabilities", MISSING, f"lacking {', '.join(lacking_req)} (needed "
                         f"to {'; '.join(CAPS[n][2] for n in lacking_req)})",
                         "run as root with full capabilities"))
    elif lacking_opt:
        out.append(Check("capabilities", LIMITED, f"lacking {', '.join(lacking_opt)} (for "
                         f"{'; '.join(CAPS[n][2] for n in lacking_opt)})"))
    else:
        out.append(Check("capabilities", OK, ", ".join(have)))
    return out


def evaluate(facts: Facts, wants: list[kconfig.Want]) -> list[Check]:
    status = damon.DamonStatus.from_dict(facts.damon)
    return [
        check_kernel(facts.release, status.features),
        *check_config(facts.kconfig_source, facts.kconfig, wants),
        *check_damon(status),
        *check_sources(status, facts.tracefs, facts.foreign),
        *(Check("paused module", LIMITED, p, "damon-hp turns it back on when that run stops")
          for p in facts.paused),
        check_thp(facts.thp),
        check_madv_collapse(facts.madv_collapse),
        check_process_madvise(facts.process_madvise),
        check_tracefs(facts.tracefs),
        check_btf(facts.btf),
        check_pmu(facts.pmu),
        *check_privileges(facts.euid, facts.cap_eff),
    ]


def exit_code(checks: list[Check]) -> int:
    statuses = {c.status for c in checks}
    return 2 if MISSING in statuses else 1 if LIMITED in statuses else 0


def verdict(checks: list[Check]) -> str:
    code = exit_code(checks)
    if code == 0:
        return "damon-hp can run here with everything it uses"
    if code == 1:
        limits = ", ".join(c.name for c in checks if c.status == LIMITED)
        return f"damon-hp can run here, with limits: {limits}"
    missing = ", ".join(c.name for c in checks if c.status == MISSING)
    return f"damon-hp cannot run here: {missing} MISSING"

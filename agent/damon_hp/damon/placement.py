"""Where a new kdamond of damon-hp's may go, decided from a probe: pure, no I/O.

DAMON sysfs can add a kdamond only while none runs (`nr_kdamonds` is locked otherwise), and
rewriting `nr_kdamonds` wipes every kdamond dir: so a start reuses an idle dir that is empty or
left by a dead agent, creates the first dir on an empty tree, or is refused with every reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import EnvironmentProblem
from .io import ADMIN
from .status import (
    OWNER_DAMON_HP,
    OWNER_FOREIGN,
    OWNER_NONE,
    OWNER_STALE,
    DamonStatus,
    KdamondInfo,
)


@dataclass(frozen=True)
class StartPlan:
    """Where damon-hp will put its kdamond: reuse idle dir `index`, or create dirs first."""

    index: int
    set_nr_kdamonds: int | None  # write this to nr_kdamonds first, or None to reuse in place


def busy_message(k: KdamondInfo) -> str:
    return (f"DAMON sysfs is busy: {k.describe()} was not started by damon-hp and must keep "
            "running; damon-hp cannot add a kdamond while it runs (nr_kdamonds is locked)")


def plan_start(status: DamonStatus, ops: str = "vaddr") -> StartPlan:
    """Decide where to start a kdamond with operations set `ops`, or raise EnvironmentProblem
    saying why not.

    Every reason that applies is named (a kernel may both lack vaddr and be busy).
    """
    if not status.sysfs_present:
        raise EnvironmentProblem(
            "damon-hp: DAMON sysfs (/sys/kernel/mm/damon/admin) is missing: this kernel lacks "
            "CONFIG_DAMON_SYSFS. See `damon-hp doctor` and kernel-config/README.md.")
    if not status.readable:
        raise EnvironmentProblem(f"damon-hp: {status.error}; run damon-hp as root.")
    problems = []
    if status.avail_ops and ops not in status.avail_ops:
        problems.append(
            f"this kernel's DAMON offers only {', '.join(status.avail_ops)}; the {ops} source "
            f"needs the {ops} operations set (CONFIG_DAMON_{ops.upper()})")
    try:
        plan = plan_placement(status)
    except EnvironmentProblem as e:
        problems.append(str(e).removeprefix("damon-hp: "))
        plan = None
    if problems or plan is None:
        raise EnvironmentProblem("damon-hp: " + "; and ".join(problems))
    return plan


def plan_placement(status: DamonStatus) -> StartPlan:
    """Where a new kdamond can go given the kdamonds that exist (pure; ignores ops support).

    Raises EnvironmentProblem when a kdamond runs (nr_kdamonds is locked then), when a DAMON
    module runs its exclusive context (no other kdamond can start), or when only configured
    dirs of others exist (adding one would wipe them).
    """
    for m in status.exclusive:
        raise EnvironmentProblem("damon-hp: " + m.exclusive_message())
    for k in status.running:
        if k.owner == OWNER_FOREIGN:
            raise EnvironmentProblem("damon-hp: " + busy_message(k))
        if k.owner == OWNER_DAMON_HP:
            raise EnvironmentProblem(
                f"damon-hp: {k.describe()} belongs to the damon-hp agent pid {k.agent_pid}, "
                "which is still running; DAMON cannot add a kdamond while it runs. "
                "Stop that agent first (see `damon-hp status`)")
        raise EnvironmentProblem(
            f"damon-hp: {k.describe()} was left by a damon-hp agent that died "
            f"(pid {k.agent_pid}) and is still running; damon-hp stops it when it starts "
            f"(or: echo off > {ADMIN}/kdamonds/{k.index}/state)")
    # Idle dirs that are empty or left by a dead agent can be reused in place; an idle dir of
    # a live agent is not (that agent will clean it up when it notices its target exited).
    reusable = [k for k in status.kdamonds if k.owner in (OWNER_NONE, OWNER_STALE)]
    if reusable:
        return StartPlan(reusable[0].index, None)
    if not status.kdamonds:
        return StartPlan(0, 1)
    for k in status.kdamonds:
        if k.owner == OWNER_DAMON_HP:
            raise EnvironmentProblem(
                f"damon-hp: {k.describe()} is configured by the damon-hp agent pid "
                f"{k.agent_pid}, which is still running; wait for it to exit")
    foreign = ", ".join(k.describe() for k in status.kdamonds)
    raise EnvironmentProblem(
        f"damon-hp: DAMON sysfs holds kdamonds configured by someone else ({foreign}); "
        "adding one would wipe their configuration. If nobody needs them: "
        f"echo 0 > {ADMIN}/kdamonds/nr_kdamonds")



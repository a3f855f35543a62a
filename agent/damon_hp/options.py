"""The options of `run` and `attach` (and later the daemon's managed processes): how DAMON
watches, the policy's thresholds, and what is written out. Parsing and validation only."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from typing import Any

from damon_hp import policy, sizes
from damon_hp.actuate import COLLAPSE_WITH
from damon_hp.damon.model import Intervals
from damon_hp.damon.sources import SourceRequest, parse_source
from damon_hp.errors import EnvironmentProblem
from damon_hp.pipeline import PHYSICAL_MIN_ACCESSES

# Monitoring defaults. DAMON samples one 4 KiB page per region per sampling interval and calls
# the region accessed when that page's accessed bit was set since the previous sample. A large
# buffer read at random -- the memory huge pages help most -- touches any one 4 KiB page rarely:
# a 256 MiB buffer at 1 M reads/s shows ~5 % at DAMON's 5 ms default but ~20 % at 20 ms, where
# it stands clearly apart from idle memory (0 %). DAMON's own interval auto-tuning (6.15+)
# lengthens the interval for the same reason. 20 samples per aggregation keep 5 % steps of
# access frequency; a snapshot every 0.4 s is plenty for decisions that cost a 2 MiB copy each.
SAMPLE_US = 20_000
AGGR_US = 400_000
# DAMON re-reads the target's mappings this often; its 60 s default would leave memory mapped
# after start (everything a program allocates after exec) unwatched for up to a minute.
UPDATE_US = 1_000_000
# Auto-tuning (6.15+) may move the sampling interval within these bounds (aggregation follows).
AUTOTUNE_MIN_SAMPLE_US = 5_000
AUTOTUNE_MAX_SAMPLE_US = 100_000


@dataclass(frozen=True)
class MonitorOptions:
    """How DAMON watches the target (see the defaults above for the reasons)."""

    intervals: Intervals = field(
        default_factory=lambda: Intervals(SAMPLE_US, AGGR_US, UPDATE_US)
    )
    min_nr_regions: int = 10
    max_nr_regions: int = 1000
    autotune: bool = True
    source: SourceRequest = field(default_factory=SourceRequest)
    pause_damon_stat: bool = False


@dataclass(frozen=True)
class AgentOptions:
    monitor: MonitorOptions = field(default_factory=MonitorOptions)
    params: policy.PolicyParams = field(default_factory=policy.PolicyParams)
    json_path: str | None = None
    record_path: str | None = None
    quiet: bool = False
    progress_every_s: float = 10.0
    dry_run: bool = False
    perf: bool = False
    trace: bool = False
    collapse_with: str = "auto"  # actuate.COLLAPSE_WITH

    def to_dict(self) -> dict[str, Any]:
        m = self.monitor
        return {
            "sample_us": m.intervals.sample_us,
            "aggr_us": m.intervals.aggr_us,
            "update_us": m.intervals.update_us,
            "min_nr_regions": m.min_nr_regions,
            "max_nr_regions": m.max_nr_regions,
            "autotune": m.autotune,
            "source": str(m.source),
            "policy": asdict(self.params),
            "dry_run": self.dry_run,
            "collapse_with": self.collapse_with,
        }




def parse_size(text: str) -> int:
    """'256M' -> bytes (sizes.parse_size: K, M, G, T are 1024-based; a bare number is bytes)."""
    try:
        return sizes.parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: use a number with an optional K, M, G or T suffix (256M)"
        ) from None


def parse_budget(text: str) -> tuple[int | None, float | None]:
    """--max-huge: '512M' -> (bytes, None); '25%' -> (None, 25.0), a share of the target's RSS."""
    if text.strip().endswith("%"):
        pct = sizes.parse_share(text)
        if pct is None or not 0 <= pct <= 100:
            raise argparse.ArgumentTypeError(f"{text!r}: a percentage of RSS must be 0..100%")
        return None, pct
    return parse_size(text), None


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return v


def _non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number")
    return v


def _ptes_none(text: str) -> int:
    top = policy.PAGES_PER_HUGE_PAGE - 1
    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 <= v <= top:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of base pages within 0..{top} (of a 2 MiB range's "
            f"{policy.PAGES_PER_HUGE_PAGE})")
    return v


def add_options(parser: argparse.ArgumentParser) -> None:
    """Monitoring, policy and output options shared by `run` and `attach`."""
    d = policy.PolicyParams()
    mon = parser.add_argument_group(
        "monitoring (DAMON)",
        "DAMON samples one page per region every sampling interval and reports per region how "
        "many samples saw an access, once per aggregation interval.",
    )
    mon.add_argument("--source", type=parse_source, default=SourceRequest(),
                     metavar="auto|vaddr|paddr|passive[=PID]",
                     help="where access data comes from (default auto: the first that works "
                     "here, in this order). vaddr: a kdamond of damon-hp's on the target's "
                     "virtual memory (needs CONFIG_DAMON_VADDR and a free DAMON). paddr: a "
                     "kdamond of damon-hp's over physical memory, mapped back to the target "
                     "through /proc/PID/pagemap (kernels without vaddr). passive: read the "
                     "events of a kdamond that is not ours (another tool's, DAMON_STAT, "
                     "DAMON_RECLAIM), never writing to DAMON; =PID picks which kdamond. "
                     "--sample-us, --aggr-us and the region limits apply to our own kdamonds "
                     "only; a passive source runs at its owner's intervals")
    mon.add_argument("--pause-damon-stat", action="store_true",
                     help="where DAMON_STAT (7.2+) holds DAMON exclusively, stop it for this run "
                     "so that damon-hp can start its own kdamond (vaddr: DAMOS marks and "
                     "collapse), and turn it back on when damon-hp stops, however it stops "
                     "(after a SIGKILL: at the next damon-hp start). Never the default")
    mon.add_argument("--sample-us", type=_positive_int, default=SAMPLE_US, metavar="US",
                     help=f"sampling interval (default {SAMPLE_US}: DAMON's 5000 sees a randomly "
                     "read buffer as barely accessed, since one 4 KiB page is rarely touched "
                     "within 5 ms)")
    mon.add_argument("--aggr-us", type=_positive_int, default=AGGR_US, metavar="US",
                     help=f"aggregation interval = one snapshot (default {AGGR_US}: 20 samples "
                     "per snapshot, so 5%% steps of access frequency)")
    mon.add_argument("--update-us", type=_positive_int, default=UPDATE_US, metavar="US",
                     help="how often DAMON re-reads the target's mappings (default 1000000; "
                     "DAMON's 60 s default would leave memory mapped after start unwatched "
                     "for up to a minute)")
    mon.add_argument("--min-regions", type=_positive_int, default=10, metavar="N",
                     help="minimum number of DAMON regions (default 10)")
    mon.add_argument("--max-regions", type=_positive_int, default=1000, metavar="N",
                     help="maximum number of DAMON regions (default 1000: 2 MiB resolution "
                     "over 2 GiB, with DAMON's ~1%% overhead)")
    mon.add_argument("--no-autotune", dest="autotune", action="store_false",
                     help="do not let DAMON tune the intervals (Linux 6.15+ intervals_goal; "
                     "by default on where the kernel has it, aiming at 4%% of samples seeing "
                     "an access with sampling between 5 and 100 ms)")
    pol = parser.add_argument_group(
        "policy", "A region is hot at --hot-pct access frequency and --min-age-s age; its "
        "fully covered 2 MiB ranges are collapsed once DAMON has sampled --promote-accesses "
        "accesses of them at --promote-pct of its samples over a streak of hot readings (a "
        "range being faulted in counts no reading), and marked MADV_NOHUGEPAGE after "
        "--demote-after cold seconds.")
    pol.add_argument("--hot-pct", type=float, default=d.hot_access_pct, metavar="PCT",
                     help=f"access frequency that makes a region hot (default {d.hot_access_pct})")
    pol.add_argument("--min-age-s", type=_non_negative_float, default=d.min_hot_age_s,
                     metavar="S", help="age a hot region must have (default 0: hysteresis "
                     "filters noise instead)")
    pol.add_argument("--promote-accesses", type=_non_negative_float,
                     default=d.promote_min_accesses, metavar="N",
                     help="sampled accesses DAMON must have seen of a range over its streak "
                     f"(default {d.promote_min_accesses:g}; physical sources use at least "
                     f"{PHYSICAL_MIN_ACCESSES:g}: their regions mix frames of hot and cold "
                     "pages)")
    pol.add_argument("--promote-pct", type=float, default=None, metavar="PCT",
                     help="... at this share of the samples DAMON took (default: --hot-pct; "
                     "physical sources use at least 30)")
    pol.add_argument("--promote-after", type=_positive_int, default=d.promote_after_snapshots,
                     metavar="N", help="... over at least N hot readings (one miss in a row "
                     f"tolerated; default {d.promote_after_snapshots})")
    pol.add_argument("--promote-after-s", type=_non_negative_float, default=d.promote_after_s,
                     metavar="S", help="... spanning at least this many seconds (default "
                     f"{d.promote_after_s:g})")
    pol.add_argument("--demote-after", type=_non_negative_float, default=d.demote_after_s,
                     metavar="S", help="seconds a promoted range must stay cold before it is "
                     f"marked MADV_NOHUGEPAGE (default {d.demote_after_s:g})")
    pol.add_argument("--demote-blind-after", type=_non_negative_float,
                     default=d.demote_blind_after_s, metavar="S",
                     help="idle time alone never demotes a huge range (DAMON cannot see "
                     "accesses that hit the TLB): --demote-after counts only the seconds it read "
                     "idle while another huge range of the process read hot; a range is also "
                     "demoted after reading idle this many seconds while any other memory of "
                     f"the process read hot (default {d.demote_blind_after_s:g}); while nothing "
                     "of the process reads hot, neither clock runs")
    pol.add_argument("--max-ptes-none", type=_ptes_none, default=d.max_ptes_none,
                     metavar="N", help="collapse a hot 2 MiB range only when at most N of its "
                     "512 base pages are not resident, as khugepaged's max_ptes_none counts "
                     f"(default {d.max_ptes_none}: at least half resident, so a collapse at most "
                     "doubles a range's memory; 511 = MADV_COLLAPSE's own rule, one resident "
                     "page is enough)")
    pol.add_argument("--max-huge", type=parse_budget, default=(None, None),
                     metavar="SIZE|PCT%",
                     help="budget of promoted memory: bytes (512M) or a share of RSS (25%%); "
                     "default: no budget")
    pol.add_argument("--collapse-with", choices=COLLAPSE_WITH, default="auto",
                     help="how a hot range is collapsed: damos (the kernel's DAMOS collapse "
                     "action, Linux 7.2+, needs the vaddr source), madvise "
                     "(process_madvise(MADV_COLLAPSE) from damon-hp), or auto (default: "
                     "madvise, faster in the measurement in docs/collapse.md)")
    pol.add_argument("--collapse-rate", type=parse_size, default=d.collapse_bytes_per_s,
                     metavar="SIZE", help="bytes per second the agent may collapse "
                     "(default 256M: collapse copies memory and may compact)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", dest="json_path", metavar="FILE",
                     help="write the summary and a per-snapshot timeline as JSON to FILE")
    out.add_argument("--record", dest="record_path", metavar="FILE",
                     help="save every DAMON snapshot to FILE (a fixture for tests/unit)")
    out.add_argument("--perf", action="store_true",
                     help="count the target's TLB misses, faults, cycles with perf stat "
                     "(n/a where there is no PMU)")
    out.add_argument("--trace", action="store_true",
                     help="count huge-page, fault, compaction and TLB-flush events of the "
                     "target with the hpstat BPF tool (make bpf)")
    out.add_argument("--dry-run", action="store_true",
                     help="monitor and decide, but change nothing in the target (with --json, "
                     "the timeline shows what would have been promoted)")
    out.add_argument("-q", "--quiet", action="store_true",
                     help="no progress lines on stderr (the summary is still printed)")
    out.add_argument("--progress-s", type=_non_negative_float, default=10.0, metavar="S",
                     help="seconds between progress lines on stderr (default 10)")


def options_from_args(args: argparse.Namespace) -> AgentOptions:
    max_bytes, max_pct = args.max_huge
    try:
        intervals = Intervals(args.sample_us, args.aggr_us, args.update_us)
        params = policy.PolicyParams(
            hot_access_pct=args.hot_pct,
            min_hot_age_s=args.min_age_s,
            promote_after_snapshots=args.promote_after,
            promote_min_accesses=args.promote_accesses,
            promote_access_pct=args.promote_pct,
            promote_after_s=args.promote_after_s,
            demote_after_s=args.demote_after,
            demote_blind_after_s=args.demote_blind_after,
            max_ptes_none=args.max_ptes_none,
            max_huge_bytes=max_bytes,
            max_huge_rss_pct=max_pct,
            collapse_bytes_per_s=args.collapse_rate,
        )
    except ValueError as e:
        raise EnvironmentProblem(f"damon-hp: bad option: {e}") from e
    if args.min_regions < 3 or args.min_regions > args.max_regions:
        raise EnvironmentProblem(
            f"damon-hp: bad option: need 3 <= --min-regions ({args.min_regions}) <= "
            f"--max-regions ({args.max_regions})"
        )
    return AgentOptions(
        monitor=MonitorOptions(intervals, args.min_regions, args.max_regions, args.autotune,
                               args.source, getattr(args, "pause_damon_stat", False)),
        params=params,
        json_path=args.json_path,
        record_path=args.record_path,
        quiet=args.quiet,
        progress_every_s=args.progress_s,
        dry_run=args.dry_run,
        perf=getattr(args, "perf", False),
        trace=getattr(args, "trace", False),
        collapse_with=getattr(args, "collapse_with", "auto"),
    )



"""The daemon's TOML config: which processes to manage, which never, and the budget.

    [daemon]
    source = "auto"            # auto (vaddr, then paddr, then passive) | vaddr | paddr | passive
                               # | passive=PID
    budget = "25%"             # damon-hp's huge pages, machine-wide: bytes ("512M") or % of RAM
    scan_every_s = 3           # how often /proc is scanned for new and exited processes
    summary_every_s = 60       # the summary line on stderr (the journal under systemd)

    [[rule]]                   # processes to manage: every key given must match
    name = "caches"
    exe = "memcached"          # executable basename, or an absolute path
    cmdline = "--port 1121[0-9]"   # regular expression searched in the command line
    cgroup = "/system.slice/memcached.service"   # cgroup v2 path (or any path below it)
    unit = "memcached.service" # a systemd unit: a component of the cgroup path
    user = "memcache"          # user name or uid (real uid)
    budget = "1G"              # optional: at most this much for all processes of this rule

    [[rule]]
    name = "latency-sensitive"
    exclude = true             # matching processes are never managed, whatever else matches
    exe = "redis-server"

Exclude rules win over include rules; of the include rules the first that matches governs.
`load_config` refuses a bad file with its path, the line and the reason (ConfigError, exit 2).
"""

from __future__ import annotations

import pwd
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from damon_hp import sizes
from damon_hp.damon.sources import KINDS, SourceRequest, parse_source
from damon_hp.errors import EnvironmentProblem
from damon_hp.sizes import parse_size

DAEMON_KEYS = {"source", "budget", "scan_every_s", "summary_every_s"}
RULE_KEYS = {"name", "exe", "cmdline", "cgroup", "unit", "user", "budget", "exclude"}
MATCH_KEYS = ("exe", "cmdline", "cgroup", "unit", "user")


class ConfigError(EnvironmentProblem):
    """A config that cannot be used: names the file, the line and the reason (exit 2)."""


@dataclass(frozen=True)
class Budget:
    """Bytes, or a percentage of RAM; `bytes_of(mem_total)` resolves either."""

    bytes: int | None = None
    pct_of_ram: float | None = None

    def bytes_of(self, mem_total: int) -> int:
        if self.bytes is not None:
            return self.bytes
        assert self.pct_of_ram is not None
        return int(mem_total * self.pct_of_ram / 100)

    def __str__(self) -> str:
        return f"{self.pct_of_ram:g} % of RAM" if self.bytes is None else f"{self.bytes} bytes"


@dataclass(frozen=True)
class Rule:
    name: str
    exclude: bool = False
    exe: str | None = None
    cmdline: re.Pattern[str] | None = None
    cgroup: str | None = None
    unit: str | None = None
    uid: int | None = None
    budget: Budget | None = None


@dataclass(frozen=True)
class DaemonConfig:
    path: str
    source: SourceRequest = SourceRequest("auto")
    budget: Budget | None = None
    scan_every_s: float = 3.0
    summary_every_s: float = 60.0
    rules: tuple[Rule, ...] = field(default_factory=tuple)

    @property
    def include(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if not r.exclude)

    @property
    def exclude(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.exclude)


class _Lines:
    """Where a table or key sits in the file, for messages (tomllib gives no positions)."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.headers: list[tuple[int, str]] = []  # (line number, header text)
        for n, line in enumerate(self.lines, 1):
            s = line.strip()
            if s.startswith("["):
                self.headers.append((n, s.split("#", 1)[0].strip()))

    def table(self, header: str, index: int = 0) -> int:
        found = [n for n, h in self.headers if h.replace(" ", "") == header]
        return found[index] if index < len(found) else 1

    def key(self, header: str, index: int, key: str) -> int:
        start = self.table(header, index)
        later = [n for n, _ in self.headers if n > start]
        end = later[0] if later else len(self.lines) + 1
        pat = re.compile(rf"^\s*{re.escape(key)}\s*=")
        for n in range(start + 1, end):
            if pat.match(self.lines[n - 1]):
                return n
        return start


def parse_budget(value: Any) -> Budget:
    """A size ('512M') or a share of the machine's RAM ('25%')."""
    pct = sizes.parse_share(value)
    if pct is not None:
        if not 0 < pct <= 100:
            raise ValueError(f"{value!r}: a share of RAM must be within (0, 100] %")
        return Budget(pct_of_ram=pct)
    try:
        return Budget(bytes=parse_size(value))
    except ValueError:
        raise ValueError(f"{value!r} is neither a size (\"512M\") nor a share of RAM "
                         "(\"25%\")") from None


def _uid(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        if value.isdigit():
            return int(value)
        try:
            return pwd.getpwnam(value).pw_uid
        except KeyError:
            raise ValueError(f"no user {value!r} on this system") from None
    raise ValueError(f"{value!r} is not a user name or uid")


def _str(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a non-empty string, not {value!r}")
    return value


def _rule(raw: Any, index: int) -> Rule:
    """The rule, or _KeyError naming the offending key and why."""
    if not isinstance(raw, dict):
        raise ValueError("a rule must be a table ([[rule]])")
    unknown = sorted(set(raw) - RULE_KEYS)
    if unknown:
        raise _KeyError(unknown[0], f"unknown key {unknown[0]!r} (a rule takes: "
                        f"{', '.join(sorted(RULE_KEYS))})")
    if not any(k in raw for k in MATCH_KEYS):
        raise _KeyError(None, "a rule must match on at least one of "
                        + ", ".join(MATCH_KEYS) + " (a rule without one would take every "
                        "process)")
    kw: dict[str, Any] = {"name": f"rule {index + 1}"}
    for key, value in raw.items():
        try:
            if key == "name":
                kw["name"] = _str(value, key)
            elif key == "exclude":
                if not isinstance(value, bool):
                    raise ValueError(f"exclude must be true or false, not {value!r}")
                kw["exclude"] = value
            elif key == "exe":
                kw["exe"] = _str(value, key)
                if "/" in value and not value.startswith("/"):
                    raise ValueError(f"exe {value!r}: give a basename or an absolute path")
            elif key == "cmdline":
                try:
                    kw["cmdline"] = re.compile(_str(value, key))
                except re.error as e:
                    raise ValueError(f"cmdline {value!r} is not a regular expression: {e}"
                                     ) from None
            elif key == "cgroup":
                path = _str(value, key)
                if not path.startswith("/"):
                    raise ValueError(f"cgroup {path!r} must be an absolute cgroup v2 path "
                                     "(as in /proc/PID/cgroup, e.g. /system.slice/x.service)")
                kw["cgroup"] = path.rstrip("/") or "/"
            elif key == "unit":
                kw["unit"] = _str(value, key)
            elif key == "user":
                kw["uid"] = _uid(value)
            elif key == "budget":
                kw["budget"] = parse_budget(value)
        except ValueError as e:
            raise _KeyError(key, str(e)) from None
    if kw.get("exclude") and "budget" in kw:
        raise _KeyError("budget", "an exclude rule takes no budget")
    return Rule(**kw)


class _KeyError(ValueError):
    def __init__(self, key: str | None, reason: str) -> None:
        super().__init__(reason)
        self.key = key


def parse_config(text: str, path: str = "<config>") -> DaemonConfig:
    """The config in `text`, or ConfigError('PATH:LINE: reason')."""
    lines = _Lines(text)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column \d+\)", str(e))
        where = m[1] if m else "?"
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        raise ConfigError(f"damon-hp daemon: {path}:{where}: not valid TOML: {reason}") from None

    def fail(line: int, reason: str) -> ConfigError:
        return ConfigError(f"damon-hp daemon: {path}:{line}: {reason}")

    unknown = sorted(set(raw) - {"daemon", "rule"})
    if unknown:
        raise fail(lines.table(f"[{unknown[0]}]"), f"unknown table or key {unknown[0]!r} "
                   "(the config has [daemon] and [[rule]] tables)")
    kw: dict[str, Any] = {"path": path}
    daemon = raw.get("daemon", {})
    if not isinstance(daemon, dict):
        raise fail(1, "daemon must be a table ([daemon])")
    for key, value in daemon.items():
        line = lines.key("[daemon]", 0, key)
        try:
            if key not in DAEMON_KEYS:
                raise ValueError(f"unknown key {key!r} in [daemon] (it takes: "
                                 f"{', '.join(sorted(DAEMON_KEYS))})")
            if key == "source":
                kw["source"] = parse_source(_str(value, key))
            elif key == "budget":
                kw["budget"] = parse_budget(value)
            else:
                if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                    raise ValueError(f"{key} must be a positive number of seconds, not "
                                     f"{value!r}")
                kw[key] = float(value)
        except ValueError as e:
            raise fail(line, str(e)) from None
        except Exception as e:  # argparse.ArgumentTypeError from parse_source
            raise fail(line, str(e)) from None
    rules_raw = raw.get("rule", [])
    if not isinstance(rules_raw, list):
        raise fail(lines.key("", 0, "rule"), "rule must be an array of tables ([[rule]])")
    rules = []
    names: set[str] = set()
    for i, r in enumerate(rules_raw):
        try:
            rule = _rule(r, i)
        except _KeyError as e:
            line = (lines.key("[[rule]]", i, e.key) if e.key else lines.table("[[rule]]", i))
            raise fail(line, f"rule {i + 1}: {e}") from None
        except ValueError as e:
            raise fail(lines.table("[[rule]]", i), f"rule {i + 1}: {e}") from None
        if rule.name in names:
            raise fail(lines.key("[[rule]]", i, "name"), f"rule {i + 1}: the name "
                       f"{rule.name!r} is taken by an earlier rule")
        names.add(rule.name)
        rules.append(rule)
    if not any(not r.exclude for r in rules):
        raise fail(len(lines.lines) or 1, "no [[rule]] selects processes to manage (every "
                   "config needs at least one rule without exclude = true)")
    kw["rules"] = tuple(rules)
    return DaemonConfig(**kw)


def load_config(path: str) -> DaemonConfig:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"damon-hp daemon: cannot read the config {path}: "
                          f"{e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"damon-hp daemon: {path}: not a text file ({e.reason})") from None
    return parse_config(text, path)


__all__ = ["KINDS", "Budget", "ConfigError", "DaemonConfig", "Rule", "load_config",
           "parse_budget", "parse_config", "parse_size"]

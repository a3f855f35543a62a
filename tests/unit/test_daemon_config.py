"""The daemon's TOML config: what it accepts, and that every refusal names the line and why."""

from __future__ import annotations

import pytest
from damon_hp.daemon.config import ConfigError, load_config, parse_budget, parse_config
from damon_hp.daemon.selection import ProcessInfo, rule_for, select

GOOD = """\
[daemon]
source = "passive"
budget = "25%"
scan_every_s = 2

[[rule]]
name = "caches"
exe = "memcached"
budget = "1G"

[[rule]]
name = "jobs"
cmdline = "^/opt/jobs/.* --big"
cgroup = "/system.slice/jobs.service"

[[rule]]
name = "quiet"
exclude = true
cmdline = "--latency"
"""


def proc(pid=10, exe="/usr/bin/memcached", cmd=("memcached",), cgroup="/", uid=0,
         comm=None) -> ProcessInfo:
    return ProcessInfo(pid, exe, comm or exe.rsplit("/", 1)[-1], tuple(cmd), cgroup, uid, 1)


def test_good_config_is_read_with_every_field() -> None:
    c = parse_config(GOOD, "x.toml")
    assert c.source.kind == "passive"
    assert c.budget is not None and c.budget.bytes_of(1000) == 250
    assert c.scan_every_s == 2.0
    assert [r.name for r in c.include] == ["caches", "jobs"]
    assert [r.name for r in c.exclude] == ["quiet"]
    assert c.include[0].budget is not None and c.include[0].budget.bytes == 1 << 30


def test_the_example_config_in_the_repository_is_valid() -> None:
    c = load_config("experiments/daemon-example.toml")
    assert c.include and c.exclude


@pytest.mark.parametrize("text, line, words", [
    ("[daemon]\nbudget = \"12X\"\n[[rule]]\nexe = \"a\"\n", 2, "neither a size"),
    ("[daemon]\nbudget = \"150%\"\n[[rule]]\nexe = \"a\"\n", 2, "within (0, 100]"),
    ("[daemon]\nsource = \"vadr\"\n[[rule]]\nexe = \"a\"\n", 2, "not a source"),
    ("[daemon]\nscan_every_s = 0\n[[rule]]\nexe = \"a\"\n", 2, "positive number"),
    ("[daemon]\nfoo = 1\n[[rule]]\nexe = \"a\"\n", 2, "unknown key 'foo'"),
    ("[[rule]]\nexe = \"a\"\n\n[[rule]]\nname = \"b\"\ncmdline = \"([\"\n", 6,
     "not a regular expression"),
    ("[[rule]]\nexe = \"a\"\n[[rule]]\nname = \"nothing\"\n", 3, "at least one of"),
    ("[[rule]]\nexe = \"a\"\nuser = \"no-such-user-here\"\n", 3, "no user"),
    ("[[rule]]\nexe = \"a\"\ncgroup = \"system.slice\"\n", 3, "absolute"),
    ("[[rule]]\nexe = \"bin/a\"\n", 2, "basename or an absolute path"),
    ("[[rule]]\nexe = \"a\"\nexclude = true\n", 3, "no [[rule]] selects"),
    ("[[rule]]\nexe = \"a\"\nbudget = \"1G\"\nexclude = true\n[[rule]]\nexe = \"b\"\n", 3,
     "no budget"),
    ("[[rule]]\nname = \"x\"\nexe = \"a\"\n[[rule]]\nname = \"x\"\nexe = \"b\"\n", 5, "taken"),
    ("[[rule]]\nexe = \"a\"\ncolour = 1\n", 3, "unknown key 'colour'"),
    ("[daemon\n", 1, "not valid TOML"),
    ("[[rule]]\nexe = \"a\"\n\nbudget = = 3\n", 4, "not valid TOML"),
])
def test_a_bad_config_is_refused_with_its_line_and_reason(text, line, words) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text, "c.toml")
    assert f"c.toml:{line}:" in str(e.value)
    assert words in str(e.value)
    assert e.value.exit_code == 2


def test_a_missing_config_file_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config"):
        load_config(str(tmp_path / "none.toml"))


def test_budget_in_bytes_or_percent_of_ram() -> None:
    assert parse_budget("512M").bytes == 512 << 20
    assert parse_budget("1.5G").bytes == 3 << 29
    assert parse_budget(4096).bytes == 4096
    assert parse_budget("10 %").pct_of_ram == 10


def test_rules_select_by_exe_cmdline_cgroup_and_exclusions_win() -> None:
    c = parse_config(GOOD)
    assert rule_for(proc(), c).name == "caches"
    # comm is enough when the exe is not readable
    assert rule_for(proc(exe="", comm="memcached"), c).name == "caches"
    jobs = proc(exe="/opt/jobs/run", cmd=("/opt/jobs/run", "--big"),
                cgroup="/system.slice/jobs.service/sub")
    assert rule_for(jobs, c).name == "jobs"
    assert rule_for(proc(exe="/opt/jobs/run", cmd=("/opt/jobs/run", "--big"),
                         cgroup="/system.slice/jobs.service2"), c) is None
    assert rule_for(proc(cmd=("memcached", "--latency")), c) is None  # excluded
    assert select([proc(1), proc(2, exe="/bin/sh", cmd=("sh",))], c).keys() == {1}


def test_user_and_unit_rules() -> None:
    c = parse_config("[[rule]]\nuser = 0\nunit = \"a.service\"\n")
    assert rule_for(proc(cgroup="/system.slice/a.service"), c) is not None
    assert rule_for(proc(cgroup="/system.slice/a.service", uid=1000), c) is None
    assert rule_for(proc(cgroup="/system.slice/b.service"), c) is None


def test_source_vaddr_is_taken(tmp_path) -> None:
    p = tmp_path / "d.toml"
    p.write_text('[daemon]\nsource = "vaddr"\n[[rule]]\nexe = "a"\n')
    assert load_config(str(p)).source.kind == "vaddr"

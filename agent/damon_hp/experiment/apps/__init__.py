"""Real applications as experiment workloads: a server the runner starts in a private data
directory, its loader, and its benchmark client (redis-server + redis-cli --pipe +
redis-benchmark; mariadbd + sysbench; and both driven by YCSB, go-ycsb: redis-ycsb,
mariadb-ycsb). `cell.py` runs one arm on one of them; `report.py` turns
the runs into report.md.

An app workload in an experiment file:

    [[workloads]]
    app = "redis"                # or "mariadb", "redis-ycsb", "mariadb-ycsb"
    threads = [8]                # client connections
    [workloads.params]           # the app's own, checked by its Params dataclass
    keys = 8000000
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from damon_hp.experiment.apps.mariadb import MariaDB, MariaDBParams
from damon_hp.experiment.apps.mariadb_ycsb import MariaDBYcsb, MariaDBYcsbParams
from damon_hp.experiment.apps.redis import Redis, RedisParams
from damon_hp.experiment.apps.redis_ycsb import RedisYcsb, RedisYcsbParams

PARAMS = {"redis": RedisParams, "mariadb": MariaDBParams, "redis-ycsb": RedisYcsbParams,
          "mariadb-ycsb": MariaDBYcsbParams}
APP_CLASSES = {"redis": Redis, "mariadb": MariaDB, "redis-ycsb": RedisYcsb,
               "mariadb-ycsb": MariaDBYcsb}


def params_of(app: str, raw: dict[str, Any]) -> Any:
    """The app's Params from a [workloads.params] table; ValueError names a bad key or value."""
    cls = PARAMS[app]
    known = {f.name: f for f in fields(cls)}
    extra = sorted(set(raw) - set(known))
    if extra:
        raise ValueError(f"unknown {app} parameters {extra}; known: {sorted(known)}")
    params = cls(**raw)
    params.check()
    return params


def check_params(app: str, raw: dict[str, Any]) -> None:
    params_of(app, raw)


def preflight(app: str, raw: dict[str, Any]) -> None:
    """Before anything starts: the app's tools are installed and a fixed port is free
    (EnvironmentProblem naming what to do)."""
    from damon_hp.experiment.apps.server import check_port_free

    APP_CLASSES[app].check_installed()
    port = params_of(app, raw).port
    if port:
        check_port_free(port)

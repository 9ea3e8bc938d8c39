"""Prometheus, Alertmanager, Pushgateway, mtail and the two fake exporters, on loopback.

The lab scrapes every second and evaluates every two (production: 15-30 s and a minute) so that
a test sees a fault as an alert within seconds. Rules come straight from slurmedic's
`alert_rules/`, so the lab always runs what operators would deploy, with the lab profile's short
durations.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hostlist
import requests
import yaml

from lab import processes, stacks
from lab.config import LabConfig, Switch
from lab.slurm import LabError
from webhook import resources
from webhook.rules.render import JOB_GPUS_RECORD, RuleSource

MTAIL_DIR = resources.MTAIL_PROGRAMS
LAB_HANG_WAIT = "40s"  # the lab policy's hang_wait
# The lab's Slurm notices a dead slurmd within seconds (SlurmdTimeout 10 s, MessageTimeout 5 s)
# and its rules scrape every second: a burst's nodes alert within seconds of each other.
LAB_BURST_WAIT = "15s"
ALERTMANAGER_EXAMPLE = resources.ALERTMANAGER_EXAMPLE


def _scrape_job(name: str, targets: list[int], **extra: Any) -> dict[str, Any]:
    return {
        "job_name": name,
        "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in targets]}],
        **extra,
    }


def _prometheus_base(
    cfg: LabConfig, rules: str, alertmanagers: list[int] | None, **labels: str
) -> dict[str, Any]:
    """What every Prometheus of the lab shares: the pace, where its rules are, where it sends."""
    return {
        "global": {
            "scrape_interval": cfg.scrape_interval,
            "scrape_timeout": cfg.scrape_interval,
            "evaluation_interval": cfg.evaluation_interval,
            "external_labels": {"cluster": "slurmedic-lab", **labels},
        },
        "rule_files": [str(cfg.run_dir / rules / "*.rules.yml")],
        "alerting": {
            "alertmanagers": [
                {
                    "static_configs": [
                        {
                            "targets": [
                                f"127.0.0.1:{p}" for p in alertmanagers or [cfg.alertmanager_port]
                            ]
                        }
                    ]
                }
            ]
        },
    }


def prometheus_config(
    cfg: LabConfig, alertmanagers: list[int] | None = None, *, layout: str | None = None
) -> dict[str, Any]:
    """The lab's Prometheus: everything (`single`), or, while the lab is split into scrape
    shards (`split`), the global ruler: no node exporters, the shards' job counts federated."""
    layout = layout or ("global" if shards_running(cfg) else "single")
    per_node = (
        [
            _scrape_job("dcgm", [cfg.dcgm_port(n) for n in cfg.nodes]),
            _scrape_job("mtail", [cfg.mtail_port]),
        ]
        if layout == "single"
        else [
            # What slurmedic:job:running adds up (alert_rules/templates/shard.rules.yml).
            _scrape_job(
                SHARD_JOB,
                [cfg.prometheus_shard_port(s.name) for s in cfg.switches],
                metrics_path="/federate",
                params={"match[]": [f'{{__name__="{JOB_GPUS_RECORD}"}}']},
                honor_labels=True,
            )
        ]
    )
    rules = "rules" if layout == "single" else "rules-global"
    return {
        **_prometheus_base(cfg, rules, alertmanagers),
        "scrape_configs": [
            _scrape_job("prometheus", [cfg.prometheus_port]),
            *per_node,
            _scrape_job("slurm", [cfg.slurm_exporter_port]),
            # Pushed series carry their own job/instance; keep them (the Pushgateway docs' advice).
            _scrape_job("pushgateway", [cfg.pushgateway_port], honor_labels=True),
            # slurmedic's own /metrics (when `lab serve` runs it on the receiver port).
            _scrape_job("slurmedic", [cfg.receiver_port]),
            *slurmctld_jobs(cfg),
        ],
    }


# The ruler's scrape job of the shards: what config.yml's `shard_selector` selects by default.
SHARD_JOB = "prometheus-shards"


def shard_name(switch: str) -> str:
    return f"prometheus-{switch}"


def shard_config(cfg: LabConfig, switch: Switch, alertmanagers: list[int]) -> dict[str, Any]:
    """A scrape shard: the dcgm-exporters of one leaf switch's nodes, their per-node rules.

    The lab has one mtail for every node's job logs; in production each node's mtail belongs
    to its node's shard. Here the first shard scrapes it.
    """
    nodes = hostlist.expand_hostlist(switch.nodes)
    mtail = [_scrape_job("mtail", [cfg.mtail_port])] if switch == cfg.switches[0] else []
    return {
        **_prometheus_base(cfg, "rules-shard", alertmanagers, shard=switch.name),
        "scrape_configs": [
            _scrape_job("prometheus", [cfg.prometheus_shard_port(switch.name)]),
            _scrape_job("dcgm", [cfg.dcgm_port(n) for n in nodes]),
            *mtail,
        ],
    }


def shards_running(cfg: LabConfig) -> bool:
    return any(processes.read_pid(cfg, shard_name(s.name)) for s in cfg.switches)


def split(cfg: LabConfig, timeout: float = 60.0) -> None:
    """The rules split as docs/rule-scale.md lays them out at scale: a Prometheus per leaf
    switch scrapes its nodes and evaluates their per-node rules (profile `shard`); the lab's
    Prometheus becomes the global ruler (profile `global`), federating each shard's job counts.
    Returns once every shard has scraped its nodes and the ruler has read every shard.

    The shards send to the Alertmanagers that run now: a peer added later (`add_peer`) gets
    the ruler's alerts only."""
    profile = rules_profile(cfg)
    RuleSource().write(cfg.run_dir / "rules-shard", profile=f"{profile},shard")
    RuleSource().write(cfg.run_dir / "rules-global", profile=f"{profile},global")
    alertmanagers = alertmanager_ports(cfg)
    for switch in cfg.switches:
        port = cfg.prometheus_shard_port(switch.name)
        if processes.read_pid(cfg, shard_name(switch.name)) is None and processes.port_in_use(port):
            raise LabError(f"port {port} for shard {switch.name} is in use (another lab?)")
    try:
        for switch in cfg.switches:
            name, port = shard_name(switch.name), cfg.prometheus_shard_port(switch.name)
            _write_yaml(cfg.etc / f"{name}.yml", shard_config(cfg, switch, alertmanagers))
            processes.start(cfg, name, _prometheus_argv(cfg, name, port))
        for switch in cfg.switches:
            _wait_targets_up(cfg, cfg.url(cfg.prometheus_shard_port(switch.name)), timeout)
        _reload_prometheus(cfg, alertmanagers, layout="global")
        _wait_rules(cfg, cfg.prometheus_url, "slurmedic-training", absent="slurmedic-gpu")
        _wait_targets_up(cfg, cfg.prometheus_url, timeout, job=SHARD_JOB)
    except BaseException:  # an interrupt too: never a lab left half split
        join(cfg)
        raise


def join(cfg: LabConfig) -> None:
    """One Prometheus for everything again; the shards stopped."""
    alertmanagers = alertmanager_ports(cfg)
    try:
        _reload_prometheus(cfg, alertmanagers, layout="single")
        _wait_rules(cfg, cfg.prometheus_url, "slurmedic-gpu")
    finally:
        for switch in cfg.switches:
            processes.stop(cfg, shard_name(switch.name))


def _prometheus_argv(cfg: LabConfig, name: str, port: int) -> list[str]:
    return [
        "prometheus",
        f"--config.file={cfg.etc / f'{name}.yml'}",
        f"--storage.tsdb.path={cfg.run_dir / name}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=2d",
    ]


def _wait_targets_up(cfg: LabConfig, url: str, timeout: float, job: str | None = None) -> None:
    """Until the Prometheus at `url` has scraped each of its targets (of `job`) successfully
    once; slurmedic's own is up only while `lab serve` runs it."""

    def all_up() -> bool:
        r = requests.get(f"{url}/api/v1/targets", timeout=1).json()
        targets = [
            t
            for t in r["data"]["activeTargets"]
            if t["labels"]["job"] != "slurmedic" and job in (None, t["labels"]["job"])
        ]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    if not processes.wait_until(all_up, timeout, 0.2):
        raise LabError(
            f"the Prometheus at {url} has targets that are not up; see `slurmedic lab status` "
            f"and {cfg.logs}"
        )


def _wait_rules(cfg: LabConfig, url: str, group: str, absent: str | None = None) -> None:
    """Until the Prometheus at `url` has loaded rule group `group` (and not `absent`)."""

    def loaded() -> bool:
        r = requests.get(f"{url}/api/v1/rules", timeout=2).json()
        names = {g["name"] for g in r["data"]["groups"]}
        return group in names and absent not in names

    if not processes.wait_until(loaded, 30, 0.2):
        raise LabError(f"the Prometheus at {url} has not loaded {group}; see {cfg.logs}")


SLURMCTLD_METRICS = ("nodes", "jobs", "partitions", "scheduler")


def slurmctld_jobs(cfg: LabConfig) -> list[dict[str, Any]]:
    """Slurm's own metrics (25.11+), one scrape job per endpoint of slurmctld's port."""
    if not stacks.get(cfg.stack).slurm_metrics:
        return []
    return [
        {
            "job_name": f"slurmctld-{name}",
            "metrics_path": f"/metrics/{name}",
            "static_configs": [{"targets": [f"127.0.0.1:{cfg.slurmctld_port}"]}],
        }
        for name in SLURMCTLD_METRICS
    ]


def alertmanager_config(cfg: LabConfig) -> dict[str, Any]:
    """The repo's example config (alert_rules/alertmanager.yml), pointed at the lab.

    Same routes, grouping and inhibition as operators deploy; the receivers become loopback
    URLs on the lab's receiver port (slurmedic's webhook, or a test's receiver) and the timings
    shrink to the lab's one-second pace.
    """
    config: dict[str, Any] = yaml.safe_load(ALERTMANAGER_EXAMPLE.read_text())
    base = f"http://127.0.0.1:{cfg.receiver_port}"
    urls = {"slurmedic": f"{base}/api/v1/alerts", "oncall": f"{base}/oncall"}
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = urls[receiver["name"]]
            if "http_config" in hook:
                hook["http_config"]["authorization"]["credentials_file"] = str(
                    cfg.webhook_token_file
                )

    def quicken(route: dict[str, Any]) -> None:
        for key, value in (("group_wait", "0s"), ("group_interval", "1s")):
            if key in route:
                route[key] = value
        for child in route.get("routes", []):
            quicken(child)

    quicken(config["route"])
    return config


def cluster_config(cfg: LabConfig, transport: str = "") -> dict[str, Any]:
    """How the lab's slurmedic reaches Slurm (`transport`, else cfg.slurm_transport): its
    commands, or slurmrestd alone (no Slurm config, no commands, the token made at `up`)."""
    if (transport or cfg.slurm_transport) == "rest":
        rest = {
            "url": cfg.slurmrestd_url,
            "user": "root",
            "token_file": str(cfg.slurmrestd_token_file),
            "topology_file": str(cfg.etc / "topology.conf"),
        }
        return {"slurm": "rest", "rest": rest, "refresh_seconds": 1}
    return {
        "slurm_conf": str(cfg.slurm_conf),
        # The stack's commands, for a stack other than the host's (lab/stacks.py).
        **({"slurm_bin": str(cfg.bindir)} if cfg.bindir.is_dir() else {}),
        "refresh_seconds": 1,
    }


def slurmedic_config(cfg: LabConfig) -> dict[str, Any]:
    """slurmedic's own service config for the lab: where Alertmanager sends, the lab's Slurm."""
    return {
        "listen": f"127.0.0.1:{cfg.receiver_port}",
        "database_url": f"sqlite:///{cfg.run_dir / 'slurmedic' / 'ledger.db'}",
        "auth": {"bearer_token_file": str(cfg.webhook_token_file)},
        "policy_file": str(cfg.etc / "policy.yml"),
        "cluster": cluster_config(cfg),
        "tick_seconds": 0.5,
        # The lab's one-second pace: /metrics (node states among them) no older than a second.
        "metrics_cache_seconds": 1,
        "workers": 2,
        "verification": {"prometheus_url": cfg.url(cfg.prometheus_port), "interval_seconds": 1},
        "executor": {
            "inventory": str(cfg.etc / "inventory.yml"),
            "artifacts_dir": str(cfg.run_dir / "slurmedic" / "artifacts"),
            **({} if cfg.weigh_runs else {"cpu_weight": None}),
        },
        "notify": {"alertmanager_url": cfg.alertmanager_url, "interval_seconds": 1},
        "console": {
            "enabled": True,
            "users_file": str(cfg.console_users_file),
            "secret_key_file": str(cfg.etc / "console.key"),
            "public_url": cfg.url(cfg.receiver_port),
            "dashboard_url": cfg.url(cfg.prometheus_port)
            + "/graph?g0.expr=training_step%7Bslurm_job_id%3D%22{job}%22%7D",
        },
    }


LAB_USERS = {"admin": "admin", "approver": "approver", "viewer": "viewer"}  # name: role


def write_console_users(cfg: LabConfig) -> None:
    """The console's lab users, each with a random password (kept in etc/, 0600), once."""
    from werkzeug.security import generate_password_hash

    key = cfg.etc / "console.key"
    if not key.exists():
        key.write_text(secrets.token_urlsafe(48) + "\n")
        key.chmod(0o600)
    if cfg.console_users_file.exists() and cfg.console_passwords_file.exists():
        return
    passwords = {name: secrets.token_urlsafe(12) for name in LAB_USERS}
    cfg.console_passwords_file.write_text(yaml.safe_dump(passwords))
    cfg.console_passwords_file.chmod(0o600)
    users = {
        name: {"password_hash": generate_password_hash(passwords[name]), "role": role}
        for name, role in LAB_USERS.items()
    }
    cfg.console_users_file.write_text(yaml.safe_dump(users))
    cfg.console_users_file.chmod(0o600)


def console_password(cfg: LabConfig, name: str) -> str:
    passwords: dict[str, str] = yaml.safe_load(cfg.console_passwords_file.read_text())
    return passwords[name]


def inventory(cfg: LabConfig) -> dict[str, Any]:
    """Ansible inventory for the lab: the controller and every node are this machine; each
    node's nvidia-smi and health check are the lab's fake ones and its slurmd log is the lab's."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": cfg.python}
    nodes = {
        node: {
            **local,
            "slurmedic_nvidia_smi": [
                cfg.python,
                "-m",
                "lab.nvidia_smi",
                f"--lab-dir={cfg.run_dir}",
                f"--node={node}",
            ],
            # The health check after a repair: the lab's dcgmi (lab/dcgmi.py).
            "slurmedic_health_check": [
                cfg.python,
                "-m",
                "lab.dcgmi",
                f"--lab-dir={cfg.run_dir}",
                f"--node={node}",
                "diag",
                "-r",
                "2",
            ],
            "slurmedic_slurmd_log": str(cfg.logs / f"slurmd-{node}.log"),
        }
        for node in cfg.nodes
    }
    return {
        "all": {
            "children": {
                "slurm_controller": {"hosts": {"localhost": local}},
                "slurm_nodes": {"hosts": nodes},
            }
        }
    }


def start_slurmedic(cfg: LabConfig, policy: Path | None = None) -> None:
    """Run `slurmedic serve` against the lab, as a lab process (stopped by `lab down`).

    `policy` replaces the lab's monitor-mode policy (etc/policy.yml), e.g. to enforce.
    """
    (cfg.run_dir / "slurmedic").mkdir(parents=True, exist_ok=True)
    argv = [cfg.python, "-m", "webhook.cli", "serve", f"--config={cfg.slurmedic_config}"]
    if policy is not None:
        argv.append(f"--policy={policy}")
    processes.start(cfg, "slurmedic", argv)
    url = f"{cfg.url(cfg.receiver_port)}/readyz"
    if not processes.wait_until(lambda: requests.get(url, timeout=1).status_code == 200, 60, 0.2):
        raise LabError(f"slurmedic is not ready at {url}; see {cfg.logs}/slurmedic.out")


def _write_yaml(path: Any, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def rules_profile(cfg: LabConfig) -> str:
    """The lab's fast timings; on a Slurm that serves its own metrics, the counts from there."""
    return "lab,slurmctld" if stacks.get(cfg.stack).slurm_metrics else "lab"


def write_config(cfg: LabConfig) -> None:
    # The repo's rules with the lab profile's timings (alert_rules/config.yml, profiles.lab).
    RuleSource().write(cfg.run_dir / "rules", profile=rules_profile(cfg))
    (cfg.run_dir / "pushgateway").mkdir(parents=True, exist_ok=True)
    _write_yaml(cfg.etc / "prometheus.yml", prometheus_config(cfg))
    if not cfg.webhook_token_file.exists():
        cfg.webhook_token_file.parent.mkdir(parents=True, exist_ok=True)
        cfg.webhook_token_file.write_text(secrets.token_urlsafe(32) + "\n")
        cfg.webhook_token_file.chmod(0o600)
    _write_yaml(cfg.etc / "alertmanager.yml", alertmanager_config(cfg))
    write_console_users(cfg)
    _write_yaml(cfg.slurmedic_config, slurmedic_config(cfg))
    _write_yaml(cfg.etc / "inventory.yml", inventory(cfg))
    # Monitor mode; a short settle window for the lab's pace; 8 nodes would give a breaker of
    # one node at the default 10 %, so the lab allows half its nodes per hour. A stall waits for
    # a named node at the lab's pace too: its rules see a hang after 12 s, the trainer's NCCL
    # timeout is 15 s (a test may give 30 s). Faults are injected one after another, minutes
    # apart (`lab trial`): on 8 nodes, three within five minutes would be a burst, one shared
    # cause; the lab's faults are independent, so a burst needs more nodes than it has.
    _write_yaml(
        cfg.etc / "policy.yml",
        {
            "mode": "monitor",
            "settle_seconds": 5,
            "hang_wait": LAB_HANG_WAIT,
            "breaker": {"max_fraction": 0.5},
            "verify": {"deadline": "90s"},
            "shared_cause": {"burst_min_nodes": 9, "burst_wait": LAB_BURST_WAIT},
        },
    )
    cfg.joblogs.mkdir(parents=True, exist_ok=True)
    cfg.jobs.mkdir(parents=True, exist_ok=True)


def start(cfg: LabConfig) -> None:
    write_config(cfg)
    rd = cfg.run_dir
    py = cfg.python
    processes.start(cfg, "prometheus", _prometheus_argv(cfg, "prometheus", cfg.prometheus_port))
    processes.start(cfg, "alertmanager", alertmanager_argv(cfg))
    processes.start(
        cfg,
        "pushgateway",
        [
            "prometheus-pushgateway",
            f"--web.listen-address=127.0.0.1:{cfg.pushgateway_port}",
            # Debian's default persists to /var/lib/prometheus: one lab's pushes would leak
            # into the next lab. Keep them in the run directory.
            f"--persistence.file={rd / 'pushgateway' / 'metrics.data'}",
        ],
    )
    processes.start(
        cfg,
        "mtail",
        [
            "mtail",
            f"--progs={MTAIL_DIR}",
            f"--logs={cfg.joblogs}/*.out",
            "--address=127.0.0.1",
            f"--port={cfg.mtail_port}",
            "--logtostderr",
        ],
    )
    processes.start(cfg, "dcgm-exporter", [py, "-m", "lab.dcgm_exporter"])
    processes.start(cfg, "slurm-exporter", [py, "-m", "lab.slurm_exporter"])


def alertmanager_argv(cfg: LabConfig, *, peer: bool = False) -> list[str]:
    """The lab's Alertmanager, or with `peer` a second one clustered with it (gossip on
    loopback): both read the same config, and their cluster shares silences and which
    notifications were sent, as a site's HA pair does. Alone, the lab's is a cluster of one."""
    web, gossip = (
        (cfg.alertmanager_peer_port, cfg.alertmanager_peer_gossip_port)
        if peer
        else (cfg.alertmanager_port, cfg.alertmanager_gossip_port)
    )
    return [
        "prometheus-alertmanager",
        f"--config.file={cfg.etc / 'alertmanager.yml'}",
        f"--storage.path={cfg.run_dir / ('alertmanager-peer' if peer else 'alertmanager')}",
        f"--web.listen-address=127.0.0.1:{web}",
        f"--cluster.listen-address=127.0.0.1:{gossip}",
        f"--cluster.advertise-address=127.0.0.1:{gossip}",
        # An Alertmanager sends nothing until its cluster has settled (about 10 s by default,
        # after each start); on loopback, with one peer at most, 2 s is plenty.
        "--cluster.settle-timeout=2s",
        *([f"--cluster.peer=127.0.0.1:{cfg.alertmanager_gossip_port}"] if peer else []),
    ]


def alertmanager_ports(cfg: LabConfig) -> list[int]:
    """Every Alertmanager of the lab that runs: the lab's, and its peer while it runs."""
    peer = processes.read_pid(cfg, "alertmanager-peer")
    return [cfg.alertmanager_port] + (
        [cfg.alertmanager_peer_port] if peer and processes.is_alive(peer) else []
    )


def alertmanager_urls(cfg: LabConfig) -> list[str]:
    return [cfg.url(port) for port in alertmanager_ports(cfg)]


def reload_alertmanagers(cfg: LabConfig) -> None:
    """Every running Alertmanager reads alertmanager.yml again."""
    for url in alertmanager_urls(cfg):
        requests.post(f"{url}/-/reload", timeout=10).raise_for_status()


def _reload_prometheus(
    cfg: LabConfig, alertmanagers: list[int], *, layout: str | None = None
) -> None:
    _write_yaml(cfg.etc / "prometheus.yml", prometheus_config(cfg, alertmanagers, layout=layout))
    requests.post(f"{cfg.prometheus_url}/-/reload", timeout=10).raise_for_status()

    def sending_to_all() -> bool:
        r = requests.get(f"{cfg.prometheus_url}/api/v1/alertmanagers", timeout=2).json()
        active = {a["url"].split("/")[2] for a in r["data"]["activeAlertmanagers"]}
        return active == {f"127.0.0.1:{p}" for p in alertmanagers}

    if not processes.wait_until(sending_to_all, 30, 0.2):
        raise LabError(f"Prometheus does not send to the Alertmanagers on {alertmanagers}")


def settled(url: str, peers: int = 1) -> bool:
    """The Alertmanager at `url` has settled in a cluster of `peers` (it sends notifications)."""
    cluster = requests.get(f"{url}/api/v2/status", timeout=2).json()["cluster"]
    return bool(cluster["status"] == "ready" and len(cluster.get("peers") or []) == peers)


def add_peer(cfg: LabConfig) -> str:
    """A second Alertmanager clustered with the lab's, and Prometheus sending to both; its URL
    once both see each other. Nothing of it is left when it fails half-way."""
    processes.start(cfg, "alertmanager-peer", alertmanager_argv(cfg, peer=True))
    url = cfg.url(cfg.alertmanager_peer_port)
    try:

        def clustered() -> bool:
            return all(settled(u, peers=2) for u in (cfg.alertmanager_url, url))

        if not processes.wait_until(clustered, 60, 0.2):
            raise LabError(f"the two Alertmanagers do not see each other; see {cfg.logs}")
        _reload_prometheus(cfg, [cfg.alertmanager_port, cfg.alertmanager_peer_port])
    except Exception:
        remove_peer(cfg)
        raise
    return url


def remove_peer(cfg: LabConfig) -> None:
    """The second Alertmanager stopped; Prometheus sends to the lab's alone again."""
    try:
        _reload_prometheus(cfg, [cfg.alertmanager_port])
    finally:
        processes.stop(cfg, "alertmanager-peer")


READINESS: dict[str, Callable[[LabConfig], str]] = {
    "prometheus": lambda cfg: f"{cfg.prometheus_url}/-/ready",
    "alertmanager": lambda cfg: f"{cfg.alertmanager_url}/-/ready",
    "pushgateway": lambda cfg: f"{cfg.pushgateway_url}/-/ready",
    "mtail": lambda cfg: f"{cfg.url(cfg.mtail_port)}/metrics",
    "dcgm-exporter": lambda cfg: f"{cfg.url(cfg.dcgm_port(cfg.nodes[-1]))}/metrics",
    "slurm-exporter": lambda cfg: f"{cfg.url(cfg.slurm_exporter_port)}/metrics",
}


def wait_ready(cfg: LabConfig, timeout: float = 20.0) -> None:
    for name, url_of in READINESS.items():
        url = url_of(cfg)

        def ok(url: str = url) -> bool:
            return requests.get(url, timeout=1).status_code == 200

        if not processes.wait_until(ok, timeout, 0.1):
            raise LabError(f"{name} is not ready at {url}; see {cfg.logs}/{name}.out")
    # Ready to send: its cluster (of one) has settled; /-/ready says 200 before that.
    if not processes.wait_until(lambda: settled(cfg.alertmanager_url), timeout, 0.1):
        raise LabError(f"Alertmanager's cluster has not settled; see {cfg.logs}/alertmanager.out")


def wait_scraped(cfg: LabConfig, timeout: float = 20.0) -> None:
    """Wait until Prometheus has scraped every target successfully once."""
    _wait_targets_up(cfg, cfg.prometheus_url, timeout)

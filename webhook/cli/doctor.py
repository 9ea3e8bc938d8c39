"""`slurmedic doctor`: whether this host and site can run slurmedic, checked without changing
anything. Each check says what it found; one that fails says what to do. Exit 1 when any
fails (a warning does not fail it).

The checks run in order, and a check whose input failed is skipped, saying so: no Slurm, no
comparison of host names with Slurm's nodes.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import click
import requests

from webhook.adapters import rest_commands
from webhook.adapters.prometheus import Prometheus, PrometheusError
from webhook.adapters.slinky import OPERATOR_REASON
from webhook.adapters.slurm import SlurmCluster, SlurmError, SlurmSnapshot
from webhook.adapters.slurmrest import SlurmRest
from webhook.cli.common import config_option
from webhook.core.evidence import node_label
from webhook.core.node_names import check_hosts
from webhook.core.policy import Policy, PolicyError, load_policy
from webhook.executor.fitness import unfit_to_run
from webhook.files import FileError, load_mapping
from webhook.ledger.store import Unavailable, probe
from webhook.rules.render import RulesError, RuleSource
from webhook.service.config import ConfigError, ServiceConfig, load_config, loose_mode

Status = Literal["ok", "warn", "fail", "skip"]
MARK = {"ok": "[green]  ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]", "skip": "skip"}

# Where alerts take their node from (webhook.core.evidence.node_label), per source of alerts:
# what Prometheus holds for each, as the rules read it.
HOST_SOURCES = {
    "dcgm-exporter": "group by (node, hostname, Hostname, instance) (DCGM_FI_DEV_GPU_UTIL)",
    "node-exporter (fabric)": "group by (node, hostname, instance) (node_infiniband_state_id)",
    "job logs (mtail)": 'group by (node) ({__name__=~"training_log_.+_total"})',
    "training progress (Pushgateway)": "group by (node) (training_step)",
}


# What no series means for a source whose series appear only with their first event.
EMPTY = {
    "job logs (mtail)": "no series yet: mtail's counters appear with the first line they count "
    "(none of the jobs' logs has failed, or mtail is not scraped)",
    "training progress (Pushgateway)": "no series: no job reports its progress, or the "
    "Pushgateway is not scraped",
}


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    detail: str
    fix: str = ""


@dataclass
class Site:
    """What the checks found so far, for the checks after them."""

    config_path: Path | None
    policy_path: Path | None
    rules_config: Path | None
    prometheus_url: str | None
    config: ServiceConfig | None = None
    policy: Policy | None = None
    slurm: SlurmSnapshot | None = None
    found: list[Finding] = field(default_factory=list)


Check = Callable[[Site], Iterator[Finding]]


def _config(site: Site) -> Iterator[Finding]:
    where = str(site.config_path) if site.config_path else "the embedded defaults"
    try:
        site.config = load_config(site.config_path)
    except ConfigError as e:
        yield Finding("config", "fail", str(e), "mend the key it names (docs/operations.md)")
        return
    yield Finding("config", "ok", f"{where}: valid")
    try:
        site.config.auth.secrets()
        if site.config.console.enabled:
            site.config.console.secret_key()
    except ConfigError as e:
        yield Finding("secrets", "fail", str(e), "create the file it names, mode 0600")
        return
    loose = [
        f"{key}: {path} (mode {mode:04o})"
        for key, path in _secret_files(site.config)
        if (mode := loose_mode(path)) is not None
    ]
    if loose:
        yield Finding("secrets", "warn", "readable by others: " + "; ".join(loose), "chmod 600")
    elif site.config.auth.bearer_token_file or site.config.auth.bearer_token_env:
        yield Finding("secrets", "ok", "the webhook's credentials are readable by their owner only")
    else:
        yield Finding(
            "secrets",
            "warn",
            "no credentials configured: anyone who reaches the webhook can post alerts",
            "set auth.bearer_token_file (and Alertmanager's authorization.credentials_file)",
        )


def _secret_files(config: ServiceConfig) -> Iterator[tuple[str, Path]]:
    for key, path in (
        ("auth.bearer_token_file", config.auth.bearer_token_file),
        ("auth.basic_password_file", config.auth.basic_password_file),
        ("console.secret_key_file", config.console.secret_key_file),
    ):
        if path is not None and path.exists():
            yield key, path


def _policy(site: Site) -> Iterator[Finding]:
    path = site.policy_path or (site.config.policy_file if site.config else None)
    if path is None:
        site.policy = Policy()
        yield Finding("policy", "ok", "the defaults (monitor mode): no policy_file given")
        return
    try:
        site.policy = load_policy(load_mapping(path, "policy file"))
    except (FileError, PolicyError) as e:
        yield Finding("policy", "fail", f"{path}: {e}", "mend the key it names")
        return
    policy = site.policy
    modes = {
        policy.mode,
        *policy.actions.values(),
        *(m for by in policy.causes.values() for m in by.values()),
        *(p.mode for p in policy.partitions.values() if p.mode),
        *(m for p in policy.partitions.values() for m in p.actions.values()),
        *(m for p in policy.partitions.values() for by in p.causes.values() for m in by.values()),
    }
    yield Finding("policy", "ok", f"{path}: valid; modes {', '.join(sorted(modes))}")


def _rules(site: Site) -> Iterator[Finding]:
    source = RuleSource(config_file=site.rules_config)
    try:
        values = source.config()
        source.render()
    except RulesError as e:
        yield Finding("rules config", "fail", str(e), "mend the key it names")
        return
    what = str(site.rules_config) if site.rules_config else "the shipped config.yml"
    yield Finding("rules config", "ok", f"{what}: renders; runbooks at {values['runbook_base']}")


def _ledger(site: Site) -> Iterator[Finding]:
    assert site.config is not None
    try:
        said = probe(site.config.database_url)
    except Unavailable as e:
        yield Finding(
            "ledger",
            "fail",
            str(e),
            "check database_url, that the database runs and this host may reach it",
        )
        return
    yield Finding("ledger", "ok", said)
    relative = [
        f"{key} {path} (here: {Path.cwd() / path})"
        for key, path in (
            ("database_url", _sqlite_path(site.config.database_url)),
            ("executor.artifacts_dir", site.config.executor.artifacts_dir),
        )
        if path is not None and not path.is_absolute()
    ]
    if relative:
        yield Finding(
            "paths",
            "warn",
            "relative to the working directory: " + "; ".join(relative),
            "give absolute paths, or run it with a fixed WorkingDirectory (docs/deploy.md)",
        )


def _sqlite_path(url: str) -> Path | None:
    prefix = "sqlite:///"
    return Path(url.removeprefix(prefix)) if url.startswith(prefix) else None


def _slurm(site: Site) -> Iterator[Finding]:
    assert site.config is not None
    if site.config.cluster.slurm == "rest":
        yield from _slurmrestd(site)
        return
    cluster = SlurmCluster(env=site.config.cluster.slurm_env())
    try:
        site.slurm = snap = cluster.snapshot()
    except SlurmError as e:
        yield Finding(
            "slurm",
            "fail",
            str(e),
            "check cluster.slurm_conf and cluster.slurm_bin, munge, and that slurmctld answers "
            "this host (`scontrol ping`)",
        )
        return
    yield _read(snap, "", "in its topology")
    yield from _reboots(site, cluster)
    user = pwd.getpwuid(os.getuid()).pw_name
    if os.getuid() == 0:
        yield Finding("slurm rights", "ok", "runs as root: Slurm allows every command it runs")
        return
    # Measured in the lab (Slurm 22.05 and 24.11): Operator may hold, requeue, release, cancel
    # and update other users' jobs, but slurmctld refuses it a node's drain or resume.
    try:
        level = cluster.admin_level(user)
    except SlurmError as e:
        yield Finding(
            "slurm rights",
            "warn",
            f"runs as {user}; its AdminLevel could not be read ({e})",
            "give it AdminLevel=Admin, or run slurmedic as root (docs/deploy.md)",
        )
        return
    fix = f"sacctmgr modify user {user} set adminlevel=Admin"
    if level == "Administrator":
        yield Finding("slurm rights", "ok", f"runs as {user}, AdminLevel Administrator")
    elif level == "Operator":
        yield Finding(
            "slurm rights",
            "fail",
            f"runs as {user}, AdminLevel Operator: it may requeue, hold and release jobs, but "
            "slurmctld refuses an Operator a node's drain or resume",
            fix,
        )
    else:
        yield Finding(
            "slurm rights",
            "fail",
            f"runs as {user}, AdminLevel {level}: slurmctld refuses it every action on "
            "other users' jobs and on nodes",
            fix,
        )


def _read(snap: SlurmSnapshot, how: str, switches: str) -> Finding:
    partitions = {p for n in snap.nodes for p in n.partitions}
    return Finding(
        "slurm",
        "ok",
        f"Slurm {snap.release}{how}: {len(snap.nodes):,} nodes in {len(partitions)} "
        f"partition(s), {len(snap.jobs):,} job(s), {len(snap.switches)} switch(es) {switches}",
    )


def _slurmrestd(site: Site) -> Iterator[Finding]:
    """The view read through slurmrestd, and what the playbooks can do through its API."""
    assert site.config is not None and site.config.cluster.rest is not None
    url = site.config.cluster.rest.url
    reader = site.config.cluster.reader()
    assert isinstance(reader, SlurmRest)
    try:
        site.slurm = snap = reader.snapshot()
        api = reader.api()
    except SlurmError as e:
        yield Finding(
            "slurm",
            "fail",
            str(e),
            "check cluster.rest (url, user, the token's file or command) and that slurmrestd "
            "answers this host with JWT auth (docs/slurmrestd.md)",
        )
        return
    yield _read(snap, f" through slurmrestd ({url})", "in cluster.rest.topology_file")
    can, cannot = rest_commands.acts(api)
    said = f"over slurmrestd {api} the playbooks can {', '.join(can)}; not {', '.join(cannot)}"
    if cannot != ["reboot"]:
        yield Finding(
            "slurm acts",
            "warn",
            said,
            "decisions that need the rest fail and go to a person: run the executor with "
            "Slurm's commands (cluster.slurm: cli) or a newer Slurm (docs/slurmrestd.md)",
        )
    else:
        yield Finding("slurm acts", "ok", said)
    # What serve changes of the policy for this cluster (its reboots), said here too.
    if site.policy is not None and (changed := site.config.cluster.fit(site.policy)[1]):
        yield Finding(
            "slurm reboots",
            "warn",
            changed,
            "set repairs.reboot: false in the policy, to say so there (docs/repairs.md)",
        )


def _reboots(site: Site, cluster: SlurmCluster) -> Iterator[Finding]:
    """What the repairs' reboots need of Slurm (docs/repairs.md): a RebootProgram, and a
    ReturnToService that keeps a node rebooted with nextstate=DOWN down until its check; none
    on Slinky, whose nodes Kubernetes reboots (docs/slinky.md)."""
    if site.policy is not None and not (site.policy.repairs.enabled and site.policy.repairs.reboot):
        return
    if site.slurm is not None and any(n.hosted for n in site.slurm.view().nodes.values()):
        yield Finding(
            "slurm reboots",
            "warn",
            "on Slinky a node's reboot is its pod's or its Kubernetes node's, not Slurm's "
            "RebootProgram",
            "set repairs.reboot: false in the policy (docs/slinky.md)",
        )
        return
    try:
        conf = cluster.settings()
    except SlurmError as e:
        yield Finding("slurm reboots", "warn", f"slurmctld's configuration not read ({e})")
        return
    program = conf.get("RebootProgram", "(null)")
    rts = conf.get("ReturnToService", "")
    if program in ("", "(null)"):
        yield Finding(
            "slurm reboots",
            "warn",
            "no RebootProgram in slurm.conf: slurmedic's reboots (repairs) would fail",
            "set RebootProgram, or give reboots to people (repairs in docs/repairs.md)",
        )
    elif rts == "2":
        yield Finding(
            "slurm reboots",
            "warn",
            "ReturnToService=2 returns a rebooted node to service as it registers, before "
            "slurmedic's health check (nextstate=DOWN is not kept)",
            "set ReturnToService=1 (docs/repairs.md)",
        )
    else:
        yield Finding(
            "slurm reboots", "ok", f"RebootProgram {program}, ReturnToService={rts or '?'}"
        )


def _slinky(site: Site) -> Iterator[Finding]:
    """Slurm on Kubernetes (Slinky's slurm-operator, docs/slinky.md): its slurmd pods, the
    Kubernetes nodes they run on, and the operator's own drains."""
    if site.slurm is None:
        return
    view = site.slurm.view()
    pods = [n for n in view.nodes.values() if n.hosted]
    if not pods:
        return
    machines = len({n.host for n in pods})
    said = (
        f"{len(pods):,} of {len(view.nodes):,} nodes are Slinky's slurmd pods on {machines:,} "
        "Kubernetes nodes: an alert naming a Kubernetes node is about its pod's Slurm node"
    )
    if shared := machines - len(view.hosts):
        yield Finding(
            "slinky",
            "warn",
            f"{said}, but {shared:,} Kubernetes node(s) run several: their alerts name no node",
            "run one slurmd pod per GPU node (docs/slinky.md)",
        )
    else:
        yield Finding("slinky", "ok", said)
    operator = [n.name for n in view.nodes.values() if n.reason.startswith(OPERATOR_REASON)]
    if operator:
        yield Finding(
            "slinky drains",
            "ok",
            f"{len(operator):,} node(s) drained by the operator ({OPERATOR_REASON}): slurmedic "
            "leaves them to it",
        )


def _executor(site: Site) -> Iterator[Finding]:
    assert site.config is not None
    if not site.config.executor.enabled:
        yield Finding("executor", "ok", "disabled: decisions are recorded, no playbook runs")
        return
    if (unfit := unfit_to_run()) is not None:
        yield Finding("executor", "fail", f"cannot run playbooks: {unfit}", "free the disk")
        return
    inventory = site.config.executor.inventory
    if inventory is not None and not inventory.exists():
        yield Finding(
            "executor", "fail", f"executor.inventory: {inventory} does not exist", "fix the path"
        )
        return
    yield Finding("executor", "ok", f"playbooks can run (inventory: {inventory or 'shipped'})")


def _prometheus(site: Site) -> Iterator[Finding]:
    assert site.config is not None
    url = site.prometheus_url or site.config.verification.prometheus_url
    if not url:
        yield Finding(
            "prometheus",
            "warn",
            "no Prometheus given: recoveries are not verified and host names not compared",
            "set verification.prometheus_url (or give --prometheus)",
        )
        return
    prom = Prometheus(url, timeout=10)
    try:
        up = prom.query("up")
    except PrometheusError as e:
        yield Finding("prometheus", "fail", str(e), "check the URL and that it answers")
        return
    jobs = sorted({s["metric"].get("job", "") for s in up})
    yield Finding("prometheus", "ok", f"{url}: {len(up)} targets in jobs {', '.join(jobs)}")
    if site.slurm is None or site.policy is None:
        yield Finding("host names", "skip", "needs Slurm's nodes and a valid policy")
        return
    nodes = {n.name for n in site.slurm.nodes}
    machines = site.slurm.view().hosts
    for source, expr in HOST_SOURCES.items():
        try:
            series = prom.query(expr)
        except PrometheusError as e:
            yield Finding(f"hosts: {source}", "fail", str(e))
            continue
        hosts = [h for s in series if (h := node_label(s["metric"])) is not None]
        if not hosts:
            yield Finding(
                f"hosts: {source}",
                "warn",
                EMPTY.get(source, "no series: its alerts cannot fire"),
                "scrape it (docs/deploy.md, 'Prometheus')",
            )
            continue
        found = check_hosts(hosts, nodes, site.policy.node_names, machines)
        status: Status = "fail" if found.unmatched else "ok"
        yield Finding(f"hosts: {source}", status, found.summary())


def _alertmanager(site: Site) -> Iterator[Finding]:
    assert site.config is not None
    url = site.config.notify.alertmanager_url
    if not url:
        yield Finding(
            "alertmanager",
            "warn",
            "notify.alertmanager_url unset: escalations and notices reach nobody",
            "set it to the site's Alertmanager",
        )
        return
    try:
        r = requests.get(f"{url.rstrip('/')}/api/v2/status", timeout=10)
        r.raise_for_status()
        version = r.json().get("versionInfo", {}).get("version", "?")
    except (requests.RequestException, ValueError) as e:
        yield Finding("alertmanager", "fail", f"{url}: {e}", "check notify.alertmanager_url")
        return
    yield Finding("alertmanager", "ok", f"{url}: Alertmanager {version} answers")


# In order: each may need what those before it found.
CHECKS: tuple[tuple[str, Check, tuple[str, ...]], ...] = (
    ("config", _config, ()),
    ("policy", _policy, ()),
    ("rules config", _rules, ()),
    ("ledger", _ledger, ("config",)),
    ("slurm", _slurm, ("config",)),
    ("slinky", _slinky, ()),  # only where Slurm was read (site.slurm)
    ("executor", _executor, ("config",)),
    ("prometheus", _prometheus, ("config",)),
    ("alertmanager", _alertmanager, ("config",)),
)


def examine(site: Site) -> list[Finding]:
    failed: set[str] = set()
    for name, check, needs in CHECKS:
        if missing := [n for n in needs if n in failed]:
            site.found.append(Finding(name, "skip", f"needs a valid {', '.join(missing)}"))
            failed.add(name)
            continue
        for f in check(site):
            site.found.append(f)
            if f.status == "fail":
                failed.add(name)
    return site.found


@click.command()
@config_option
@click.option(
    "--policy", "policy_path", type=click.Path(path_type=Path), help="Policy file to check."
)
@click.option(
    "--rules-config",
    type=click.Path(path_type=Path),
    help="The site's rules config (`rules render --config`); the shipped one otherwise.",
)
@click.option("--prometheus", "prometheus_url", help="Prometheus URL (default: the config's).")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def doctor(
    config_path: Path | None,
    policy_path: Path | None,
    rules_config: Path | None,
    prometheus_url: str | None,
    as_json: bool,
) -> None:
    """Check the config, policy and rules, and reach the ledger, Slurm, Prometheus and
    Alertmanager, changing nothing; compare the hosts alerts will name with Slurm's nodes."""
    # What the config's loader would log (a secret file others can read) is a finding here.
    logging.getLogger("slurmedic.config").setLevel(logging.ERROR)
    site = Site(config_path, policy_path, rules_config, prometheus_url)
    found = examine(site)
    if as_json:
        click.echo(json.dumps([asdict(f) for f in found], indent=1))
    else:
        _print(found)
    if any(f.status == "fail" for f in found):
        raise SystemExit(1)


def _print(found: list[Finding]) -> None:
    from rich.console import Console
    from rich.markup import escape

    out = Console(highlight=False, soft_wrap=True)
    for f in found:
        out.print(f"{MARK[f.status]} {f.check}: {escape(f.detail)}")
        if f.fix and f.status in ("fail", "warn"):
            out.print(f"       fix: {escape(f.fix)}")
    counts: dict[str, Any] = {s: sum(f.status == s for f in found) for s in ("fail", "warn")}
    verdict = "not ready" if counts["fail"] else "ready"
    out.print(f"{verdict}: {counts['fail']} failed, {counts['warn']} warning(s)")

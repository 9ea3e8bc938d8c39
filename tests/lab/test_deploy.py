"""A site's first day on the lab's real Slurm and Prometheus: `slurmedic doctor` finds the lab
ready; when dcgm-exporter names hosts by their fully qualified names (as at many sites), doctor
says so and what to set, and with `node_names.strip_domain` an XID on such a host is decided
on Slurm's node."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab import manage
from lab.config import LabConfig
from tests.lab.conftest import eventually, query, running_nodes, serve_slurmedic
from tests.lab.test_remediation import decided, mapped, restore

pytestmark = pytest.mark.lab
DOMAIN = "cluster.example.org"


@pytest.fixture
def fqdn_lab(lab_cfg: LabConfig) -> Iterator[LabConfig]:
    yield lab_cfg
    manage.set_dcgm_domain(lab_cfg, "")
    restore(lab_cfg)


def site_config(cfg: LabConfig, tmp: Path) -> Path:
    """examples/config.yml, exported as docs/deploy.md says, with the lab's hosts and paths."""
    out = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "files", "export", str(tmp / "export")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().endswith(f"in {tmp / 'export'}")
    lab = yaml.safe_load(cfg.slurmedic_config.read_text())
    site = yaml.safe_load((tmp / "export" / "examples" / "config.yml").read_text())
    token = tmp / "webhook.token"
    token.write_text("site-token\n")
    token.chmod(0o600)
    site |= {
        "listen": "127.0.0.1:1",  # doctor binds nothing
        "database_url": f"sqlite:///{tmp / 'ledger.db'}",
        "auth": {"bearer_token_file": str(token)},
        "policy_file": str(tmp / "export" / "examples" / "policy.yml"),
        "cluster": lab["cluster"],
        "executor": {**site["executor"], **lab["executor"]},
        "verification": lab["verification"],
        "notify": lab["notify"],
        "console": lab["console"],
    }
    path = tmp / "site-config.yml"
    path.write_text(yaml.safe_dump(site))
    return path


def doctor(
    cfg: LabConfig, policy: Path, config: Path | None = None
) -> tuple[int, dict[str, dict[str, Any]]]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "doctor",
            f"--config={config or cfg.slurmedic_config}",
            f"--policy={policy}",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, {f["check"]: f for f in json.loads(out.stdout)}


def fqdn_hosts(cfg: LabConfig) -> int:
    label = cfg.dcgm_host_label
    found = query(
        cfg, f'count(count by ({label}) (DCGM_FI_DEV_GPU_UTIL{{{label}=~".+[.]{DOMAIN}"}}))'
    )
    return int(found[0]["value"]) if found else 0


def test_doctor_says_the_lab_is_ready_and_finds_fqdn_host_names(
    fqdn_lab: LabConfig, tmp_path: Path, submit: Callable[..., int]
) -> None:
    cfg = fqdn_lab
    ledger = serve_slurmedic(cfg, tmp_path, "monitor", node_names={"strip_domain": True})
    mapping = tmp_path / "policy-monitor.yml"
    plain = tmp_path / "plain.yml"
    plain.write_text(
        yaml.safe_dump(
            {k: v for k, v in yaml.safe_load(mapping.read_text()).items() if k != "node_names"}
        )
    )

    code, found = doctor(cfg, plain)
    assert code == 0, found
    assert {found[c]["status"] for c in ("config", "policy", "ledger", "slurm", "prometheus")} == {
        "ok"
    }
    assert (
        found["slurm"]["detail"].startswith("Slurm ")
        and " 8 nodes in 2 partition(s)" in found["slurm"]["detail"]
    )
    assert found["hosts: dcgm-exporter"]["detail"] == "all 8 hosts are nodes of the cluster"

    manage.set_dcgm_domain(cfg, DOMAIN)
    eventually(
        lambda: fqdn_hosts(cfg) == 8, timeout=60, what="dcgm-exporter's FQDN hosts in Prometheus"
    )
    code, found = doctor(cfg, plain)
    assert code == 1
    dcgm = found["hosts: dcgm-exporter"]
    assert dcgm["status"] == "fail"
    assert dcgm["detail"] == (
        f"8 of 8 hosts match no Slurm node (gpu01.{DOMAIN}, gpu02.{DOMAIN}, gpu03.{DOMAIN}, ... "
        "(5 more)): they look like fully qualified names: set node_names.strip_domain in the policy"
    )
    code, found = doctor(cfg, mapping)
    assert code == 0 and found["hosts: dcgm-exporter"]["status"] == "ok", found

    # As a site that follows docs/deploy.md: the shipped examples exported, pointed at this
    # cluster, its policy (strip_domain, as shipped) as it is: doctor is green.
    site = site_config(cfg, tmp_path)
    code, found = doctor(cfg, tmp_path / "export" / "examples" / "policy.yml", config=site)
    assert code == 0, found
    assert found["hosts: dcgm-exporter"]["detail"] == "all 8 hosts are nodes of the cluster"
    assert {f["status"] for f in found.values()} <= {"ok", "warn"}

    # The running slurmedic reads them through strip_domain: an XID 79 on an FQDN host is
    # the Slurm node's failure (a drain of it, a requeue away from it, recorded: monitor mode).
    job = submit(nodes=2)
    nodes = running_nodes(cfg, job)
    mapped(cfg, job)
    manage.inject_gpu(cfg, "xid", nodes[1], 2, xid=79)
    rows = decided(cfg, ledger, f"{job}.0", 2, {"recorded"})
    assert list(rows["drain"].nodes) == [nodes[1]]
    assert list(rows["requeue"].exclude) == [nodes[1]]

"""`slurmedic files export`: every shipped file written out for a site, a site's rules config
rendered with its promtool tests expecting its runbooks (CI runs promtool on such an export on
every stack: scripts/test.sh), nothing a site changed overwritten without --force; and the
deployment examples are valid as shipped."""

from __future__ import annotations

import configparser
from pathlib import Path

from click.testing import CliRunner

from webhook import resources
from webhook.cli import main
from webhook.cli.files import shipped_files
from webhook.core.policy import load_policy
from webhook.files import load_mapping
from webhook.service.config import load_config

REPO = Path(__file__).resolve().parents[2]


def export(*args: str) -> tuple[int, str, str]:
    out = CliRunner().invoke(main, ["files", "export", *args])
    return out.exit_code, out.stdout, out.stderr


def test_every_shipped_file_is_exported_once_and_again_changes_nothing(tmp_path: Path) -> None:
    shipped = shipped_files()
    for must in (
        "alert_rules/config.yml",
        "alert_rules/alertmanager.yml",
        "alert_rules/mtail/training.mtail",
        "alert_rules/templates/gpu.rules.yml",
        "alert_rules/tests/gpu.rules.test.yml",
        "dashboards/goodput.json",
        "playbooks/drain_nodes.yml",
        "playbooks/library/slurmedic_act.py",
        "inventory/hosts.yml",
        "runbooks/GpuMissing.md",
        "examples/config.yml",
        "examples/slurmedic.service",
    ):
        assert must in shipped, must
    code, out, _ = export(str(tmp_path / "site"))
    assert (
        code == 0
        and out.strip() == f"{len(shipped)} written, 0 unchanged, 0 kept in {tmp_path / 'site'}"
    )
    for rel, path in shipped.items():
        assert (tmp_path / "site" / rel).read_bytes() == path.read_bytes(), rel
    code, out, _ = export(str(tmp_path / "site"))
    assert code == 0 and out.startswith(f"0 written, {len(shipped)} unchanged")


def test_a_site_rules_config_renders_its_rules_and_tests_and_edits_are_kept(tmp_path: Path) -> None:
    site = tmp_path / "rules-config.yml"
    shipped_base = load_mapping(resources.ALERT_RULES / "config.yml", "x")["defaults"][
        "runbook_base"
    ]
    text = (resources.ALERT_RULES / "config.yml").read_text()
    site.write_text(text.replace(shipped_base, "https://wiki.example.org/slurmedic"))
    code, _, _ = export(str(tmp_path / "out"), f"--rules-config={site}")
    assert code == 0
    test = (tmp_path / "out/alert_rules/tests/slurm.rules.test.yml").read_text()
    assert (
        "https://wiki.example.org/slurmedic/SlurmNodeDown.md" in test and shipped_base not in test
    )
    assert (
        "https://wiki.example.org/slurmedic/"
        in (tmp_path / "out/alert_rules/slurm.rules.yml").read_text()
    )
    assert (tmp_path / "out/alert_rules/config.yml").read_text() == site.read_text()

    # The shipped files again over the site's: its edits are kept, and named.
    code, _, err = export(str(tmp_path / "out"))
    assert code == 1
    assert f"kept {tmp_path / 'out/alert_rules/config.yml'}: it differs" in err
    assert (tmp_path / "out/alert_rules/config.yml").read_text() == site.read_text()
    code, _, _ = export(str(tmp_path / "out"), "--force")
    assert code == 0 and shipped_base in (tmp_path / "out/alert_rules/slurm.rules.yml").read_text()


def test_the_examples_are_valid_as_shipped() -> None:
    config = load_config(REPO / "examples" / "config.yml")
    assert (
        config.database_url.startswith("sqlite:////")
        and config.executor.artifacts_dir.is_absolute()
    )
    assert config.policy_file == Path("/etc/slurmedic/policy.yml")
    policy = load_policy(load_mapping(REPO / "examples" / "policy.yml", "policy"))
    assert policy.mode == "monitor" and policy.node_names.strip_domain
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(REPO / "examples" / "slurmedic.service")
    start = unit["Service"]["ExecStart"].split()
    assert Path(start[0]).is_absolute() and start[1:] == [
        "serve",
        "--config",
        "/etc/slurmedic/config.yml",
    ]
    assert Path(unit["Service"]["WorkingDirectory"]).is_absolute()

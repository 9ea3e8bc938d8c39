"""The shipped files: in a checkout, the repo's own folders; in a wheel, every one of them."""

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from webhook import resources
from webhook.cli import main

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("playbooks", "inventory", "alert_rules", "dashboards")


def test_a_checkout_reads_the_top_level_folders() -> None:
    assert resources.checkout() == REPO
    assert resources.PLAYBOOKS == REPO / "playbooks"
    assert resources.INVENTORY == REPO / "inventory" / "hosts.yml"
    assert resources.ALERT_RULES == REPO / "alert_rules"
    assert resources.MTAIL_PROGRAMS == REPO / "alert_rules" / "mtail"
    assert resources.DASHBOARDS == REPO / "dashboards"
    assert resources.playbook("drain_nodes").is_file()


def test_the_wheel_gets_every_file_of_the_folders() -> None:
    # A file added to one of the folders that pyproject's package-data misses would be absent
    # from the wheel only: name it here.
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["webhook.resources"]
    shipped = {p for pattern in patterns for p in resources.ROOT.glob(pattern) if p.is_file()}
    in_repo = {
        resources.ROOT / f.relative_to(REPO)
        for folder in FOLDERS
        for f in (REPO / folder).rglob("*")
        if f.is_file() and "__pycache__" not in f.parts
    }
    assert sorted(map(str, in_repo - shipped)) == []


def test_rules_render_needs_out_outside_a_checkout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(resources, "checkout", lambda: None)  # as installed from a wheel
    refused = CliRunner().invoke(main, ["rules", "render"])
    assert refused.exit_code == 2
    assert "--out DIR" in refused.output
    done = CliRunner().invoke(main, ["rules", "render", "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(p.name for p in (REPO / "alert_rules").glob("*.rules.yml"))

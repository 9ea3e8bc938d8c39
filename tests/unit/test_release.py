"""A release a site can read: one version (pyproject.toml's) that `slurmedic --version` prints,
a changelog, and the license pyproject names."""

from __future__ import annotations

import tomllib
from pathlib import Path

from click.testing import CliRunner

from webhook.cli import main

REPO = Path(__file__).resolve().parents[2]


def project(path: Path) -> dict[str, str]:
    data: dict[str, dict[str, str]] = tomllib.loads(path.read_text())
    return data["project"]


def test_the_cli_prints_pyproject_s_version() -> None:
    out = CliRunner().invoke(main, ["--version"])
    assert out.exit_code == 0
    assert out.output.strip() == f"slurmedic, version {project(REPO / 'pyproject.toml')['version']}"


def test_the_changelog_has_the_version_and_what_is_unreleased() -> None:
    version = project(REPO / "pyproject.toml")["version"]
    headings = [
        line.removeprefix("## ").strip()
        for line in (REPO / "CHANGELOG.md").read_text().splitlines()
        if line.startswith("## ")
    ]
    assert headings[0] == "Unreleased" and version in headings, headings


def test_both_distributions_ship_the_license_they_name() -> None:
    for root in (REPO, REPO / "reporter"):
        assert project(root / "pyproject.toml")["license"] == "Apache-2.0"
        text = (root / "LICENSE").read_text()
        assert text.lstrip().startswith("Apache License") and "Version 2.0" in text

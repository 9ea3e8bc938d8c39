"""Where slurmedic's shipped files live: playbooks, inventory, alert rules, dashboards, the
rules' runbooks and the deployment examples.

The repo's top-level folders (`playbooks/`, `inventory/`, `alert_rules/`, `dashboards/`,
`docs/runbooks/`, `examples/`) are their source: operators, promtool and ansible-lint use
them there. This package holds symbolic links to them, so a checkout (or an editable install)
reads the repo's own files, and a wheel build copies what the links point at into the package
(pyproject.toml's package-data). Every other module asks here instead of working out paths
from its own file.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _root() -> Path:
    root = files(__name__)
    # ansible-runner, mtail and Prometheus take directories by path; wheels install unpacked.
    if not isinstance(root, Path):
        raise RuntimeError(f"slurmedic's resources must be files on disk, not {root!r}")
    return root


ROOT = _root()


def _folder(name: str) -> Path:
    # Resolved: in a checkout, paths (in messages too) name the repo's folder, not the link.
    return (ROOT / name).resolve()


PLAYBOOKS = _folder("playbooks")
INVENTORY = _folder("inventory") / "hosts.yml"
ALERT_RULES = _folder("alert_rules")  # rendered rules, templates/, config.yml, xid classes, tests/
MTAIL_PROGRAMS = ALERT_RULES / "mtail"
ALERTMANAGER_EXAMPLE = ALERT_RULES / "alertmanager.yml"
DASHBOARDS = _folder("dashboards")
RUNBOOKS = _folder("runbooks")
EXAMPLES = _folder("examples")
# What `slurmedic files export` writes, by the name of its folder there.
SHIPPED = {
    "alert_rules": ALERT_RULES,
    "dashboards": DASHBOARDS,
    "playbooks": PLAYBOOKS,
    "inventory": INVENTORY.parent,
    "runbooks": RUNBOOKS,
    "examples": EXAMPLES,
}


def playbook(name: str) -> Path:
    return PLAYBOOKS / f"{name}.yml"


def checkout() -> Path | None:
    """The repo's root when slurmedic runs from a checkout (the resources are links to its
    folders, which `rules render` writes into by default); None when installed from a wheel."""
    link = ROOT / "alert_rules"
    return link.resolve().parent if link.is_symlink() else None

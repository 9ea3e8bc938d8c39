"""Render `alert_rules/templates/*.rules.yml` with `alert_rules/config.yml`.

Operators find every threshold and `for:` duration in the config file; the templates hold the
PromQL. Templates use `[[ ]]` and `[% %]` as Jinja delimiters so that Prometheus' own
`{{ $labels.node }}` annotation templates pass through untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

RULES_DIR = Path(__file__).resolve().parents[2] / "alert_rules"
DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w)$")
# Renderings kept beside the tests (alert_rules/tests/NAME/) and tested by promtool: NAME to the
# profiles it is rendered with.
VARIANTS = {"slurm-native": "slurmctld,slurmedic-nodes"}
UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class RulesError(ValueError):
    """A config or template problem; the message names the key or file."""


def seconds(duration: str) -> int:
    """A Prometheus duration (`10m`) in whole seconds."""
    match = DURATION.match(str(duration))
    if not match:
        raise RulesError(f"not a duration: {duration!r}")
    return int(int(match.group(1)) * UNIT_SECONDS[match.group(2)])


@dataclass(frozen=True)
class RuleSource:
    rules_dir: Path = RULES_DIR

    @property
    def templates(self) -> Path:
        return self.rules_dir / "templates"

    def config(self, profile: str | None = None) -> dict[str, Any]:
        raw = yaml.safe_load((self.rules_dir / "config.yml").read_text())
        values: dict[str, Any] = dict(raw["defaults"])
        profiles = raw.get("profiles") or {}
        # Several profiles compose, left to right: `lab,slurm-native`.
        for name in [p for p in (profile or "").split(",") if p]:
            if name not in profiles:
                raise RulesError(f"profile: {name!r} is not in config.yml ({', '.join(profiles)})")
            unknown = set(profiles[name]) - set(values)
            if unknown:
                raise RulesError(f"profiles.{name}: unknown key {sorted(unknown)[0]!r}")
            values.update(profiles[name])
        choices = {"slurm_counts_source": ("exporter", "slurmctld")}
        for key, allowed in choices.items():
            if values.get(key) not in allowed:
                raise RulesError(f"{key}: {values.get(key)!r} is not one of {', '.join(allowed)}")
        xids = yaml.safe_load((self.rules_dir / "xid-classes.yml").read_text())
        values["xid_node"] = xids["node"]
        values["xid_application"] = xids["application"]
        return values

    def render(self, profile: str | None = None) -> dict[str, str]:
        """File name to rendered rule file text."""
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(self.templates),
            variable_start_string="[[",
            variable_end_string="]]",
            block_start_string="[%",
            block_end_string="%]",
            comment_start_string="[#",
            comment_end_string="#]",
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            autoescape=False,  # noqa: S701 - renders YAML, not HTML
        )
        env.filters["seconds"] = seconds
        values = self.config(profile)
        out = {}
        for template in sorted(self.templates.glob("*.rules.yml")):
            try:
                text = env.get_template(template.name).render(**values)
            except jinja2.UndefinedError as e:
                raise RulesError(f"{template.name}: {e.message}") from e
            yaml.safe_load(
                text
            )  # a template that renders broken YAML fails here, not in Prometheus
            out[template.name] = text
        return out

    def write(self, out_dir: Path, profile: str | None = None) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in self.render(profile).items():
            path = out_dir / name
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            written.append(path)
        return written

    def variants(self) -> dict[str, dict[str, str]]:
        """Renderings kept beside the tests (alert_rules/tests/PROFILE/) so that promtool tests
        them too: the rule files a profile changes."""
        default = self.render()
        return {
            variant: {
                name: text for name, text in self.render(profiles).items() if default[name] != text
            }
            for variant, profiles in VARIANTS.items()
        }

    def write_variants(self) -> list[Path]:
        written = []
        for profile, files in self.variants().items():
            out_dir = self.rules_dir / "tests" / profile
            out_dir.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                path = out_dir / name
                if not path.exists() or path.read_text() != text:
                    path.write_text(text)
                written.append(path)
        return written

    def stale(self) -> list[str]:
        """Rule files in the repo that differ from a fresh render of the defaults (or, for the
        variants beside the tests, of their profile)."""
        out = [
            name
            for name, text in self.render().items()
            if not (self.rules_dir / name).exists() or (self.rules_dir / name).read_text() != text
        ]
        for profile, files in self.variants().items():
            for name, text in files.items():
                path = self.rules_dir / "tests" / profile / name
                if not path.exists() or path.read_text() != text:
                    out.append(f"tests/{profile}/{name}")
        return out

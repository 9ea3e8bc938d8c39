"""Render `alert_rules/templates/*.rules.yml` with `alert_rules/config.yml`.

Operators find every threshold and `for:` duration in the config file; the templates hold the
PromQL. Templates use `[[ ]]` and `[% %]` as Jinja delimiters so that Prometheus' own
`{{ $labels.node }}` annotation templates pass through untouched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from webhook import resources
from webhook.core import durations
from webhook.files import FileError, load_mapping, parse_yaml
from webhook.rules.config import check

RULES_DIR = resources.ALERT_RULES
# Renderings kept beside the tests (alert_rules/tests/NAME/) and tested by promtool: NAME to the
# profiles it is rendered with.
VARIANTS = {"slurm-native": "slurmctld,slurmedic-nodes", "shard": "shard", "global": "global"}

# Where each rule file is evaluated, by `rule_layout` (docs/rule-scale.md). Per-node files read
# one node's series and join only within a node, so every scrape shard evaluates them for its
# own nodes; cross-node files need a job's ranks anywhere, Slurm or slurmedic, and run on the
# global ruler; `shard.rules.yml` records what the ruler federates from each shard. A template
# missing from this table is refused: where it runs is a decision, not a default.
PER_NODE = frozenset({"gpu.rules.yml", "node.rules.yml", "joblog.rules.yml"})
CROSS_NODE = frozenset(
    {"training.rules.yml", "goodput.rules.yml", "slurm.rules.yml", "slurmedic.rules.yml"}
)
SHARD_EXPORT = frozenset({"shard.rules.yml"})
# What each shard records and the ruler federates and adds up (templates: `job_gpus_record`).
JOB_GPUS_RECORD = "slurmedic:job_gpus:count"
LAYOUTS = {
    "single": PER_NODE | CROSS_NODE,
    "shard": PER_NODE | SHARD_EXPORT,
    "global": CROSS_NODE,
}


ALERT = re.compile(r"^\s*- alert: ([A-Za-z][A-Za-z0-9]*)\s*$")


class RulesError(ValueError):
    """A config or template problem; the message names the key or file."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def with_runbooks(text: str, base: str, file: str) -> str:
    """`text` with each alert's runbook_url, named after the alert (`base`/NAME.md), as the
    last of its annotations: templates never spell it, so no alert can point at another's."""
    lines = text.splitlines(keepends=True)
    inserts: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        match = ALERT.match(line)
        if not match:
            continue
        name, rule_indent = match.group(1), _indent(line) + 2
        annotations = None
        for j in range(i + 1, len(lines)):
            if lines[j].strip() and _indent(lines[j]) < rule_indent:
                break  # the next rule, group or file-level line
            if lines[j].strip() == "annotations:" and _indent(lines[j]) == rule_indent:
                annotations = j
                break
        if annotations is None:
            raise RulesError(f"{file}: alert {name} has no annotations")
        last, child = annotations, None
        for j in range(annotations + 1, len(lines)):
            if not lines[j].strip():
                continue
            if _indent(lines[j]) <= rule_indent:
                break
            child = _indent(lines[j]) if child is None else child
            if _indent(lines[j]) == child and lines[j].lstrip().startswith("runbook_url:"):
                raise RulesError(
                    f"{file}: alert {name} spells its runbook_url; the renderer adds it"
                )
            last = j
        if child is None:
            raise RulesError(f"{file}: alert {name} has no annotations")
        inserts.append((last + 1, f'{" " * child}runbook_url: "{base}/{name}.md"\n'))
    for at, line in reversed(inserts):
        lines.insert(at, line)
    return "".join(lines)


def seconds(duration: str) -> int:
    """A Prometheus duration (`10m`, `1h30m`) in whole seconds."""
    try:
        return int(durations.parse(str(duration)).total_seconds())
    except durations.DurationError as e:
        raise RulesError(str(e)) from e


@dataclass(frozen=True)
class RuleSource:
    rules_dir: Path = RULES_DIR
    # A site's own copy of config.yml (`rules render --config`); None: the package's.
    config_file: Path | None = None

    @property
    def templates(self) -> Path:
        return self.rules_dir / "templates"

    def config(self, profile: str | None = None) -> dict[str, Any]:
        path = self.config_file or self.rules_dir / "config.yml"
        raw = self._load(path)
        if not isinstance(raw.get("defaults"), dict):
            raise RulesError(f"{path}: defaults: must be a mapping of keys")
        values: dict[str, Any] = dict(raw["defaults"])
        profiles = raw.get("profiles") or {}
        if not isinstance(profiles, dict):
            raise RulesError(f"{path}: profiles: must be a mapping of profile names")
        # Several profiles compose, left to right: `lab,slurm-native`.
        for name in [p for p in (profile or "").split(",") if p]:
            if name not in profiles:
                raise RulesError(f"profile: {name!r} is not in config.yml ({', '.join(profiles)})")
            unknown = set(profiles[name]) - set(values)
            if unknown:
                raise RulesError(f"profiles.{name}: unknown key {sorted(unknown)[0]!r}")
            values.update(profiles[name])
        where = f"{path}" + (f" (profile {profile})" if profile else "")
        try:  # every key of its kind: a threshold that is not a number never renders
            values = check(values, where)
        except ValueError as e:
            raise RulesError(str(e)) from e
        path = self.rules_dir / "xid-classes.yml"
        xids = self._load(path)
        for key in ("node", "application", "contained"):
            if key not in xids:
                raise RulesError(f"{path}: {key}: missing")
            values[f"xid_{key}"] = xids[key]
        return values

    @staticmethod
    def _load(path: Path) -> dict[str, Any]:
        try:
            return load_mapping(path, "rules config file")
        except FileError as e:
            raise RulesError(str(e)) from e

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
        env.globals["job_gpus_record"] = JOB_GPUS_RECORD
        values = self.config(profile)
        out = {}
        for template in sorted(self.templates.glob("*.rules.yml")):
            if template.name not in PER_NODE | CROSS_NODE | SHARD_EXPORT:
                raise RulesError(
                    f"{template.name}: not in webhook/rules/render.py's layout table: say whether "
                    "it reads one node's series (PER_NODE) or the cluster's (CROSS_NODE)"
                )
            if template.name not in LAYOUTS[values["rule_layout"]]:
                continue
            try:
                text = env.get_template(template.name).render(**values)
            except jinja2.UndefinedError as e:
                raise RulesError(f"{template.name}: {e.message}") from e
            except RulesError as e:  # a filter's: a config value that is not a duration
                raise RulesError(f"{template.name}: {e}") from e
            text = with_runbooks(text, values["runbook_base"], template.name)
            try:  # a template that renders broken YAML fails here, not in Prometheus
                parse_yaml(text, f"{template.name} (rendered)")
            except FileError as e:
                raise RulesError(str(e)) from e
            out[template.name] = text
        return out

    def write(self, out_dir: Path, profile: str | None = None) -> list[Path]:
        """Every rule file, written where it differs; all their paths."""
        return [path for path, _ in self.write_changed(out_dir, profile)]

    def write_changed(self, out_dir: Path, profile: str | None = None) -> list[tuple[Path, bool]]:
        """Every rule file with whether it changed (written) or was already so."""
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in self.render(profile).items():
            path = out_dir / name
            changed = not path.exists() or path.read_text() != text
            if changed:
                path.write_text(text)
            written.append((path, changed))
        return written

    def differs(self, out_dir: Path, profile: str | None = None) -> list[str]:
        """The rule files in `out_dir` that a fresh render would change (or add), and those it
        would not produce at all (see `strays`)."""
        differ, extra = _out_of_date(out_dir, self.render(profile))
        return differ + [f"{name} (not part of this rendering: remove it)" for name in extra]

    def variants(self, default: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
        """Renderings kept beside the tests (alert_rules/tests/PROFILE/) so that promtool tests
        them too: the rule files a profile changes (from `default`, the defaults' rendering)."""
        default = default or self.render()
        return {
            variant: {
                name: text
                for name, text in self.render(profiles).items()
                if default.get(name) != text
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
        variants beside the tests, of their profile), or that no rendering produces."""
        default = self.render()
        dirs = [("", self.rules_dir, default)] + [
            (f"tests/{variant}/", self.rules_dir / "tests" / variant, files)
            for variant, files in self.variants(default).items()
        ]
        out = []
        for prefix, out_dir, rendered in dirs:
            differ, extra = _out_of_date(out_dir, rendered)
            out += [prefix + name for name in differ + extra]
        return out


def strays(out_dir: Path, rendered: Iterable[str]) -> list[str]:
    """Rule files in `out_dir` that a rendering (the names in `rendered`) does not produce.
    Prometheus loads a directory's `*.rules.yml`: a file of another layout left there (the
    single rendering's slurmedic.rules.yml on a shard, alerting SlurmedicDown) is evaluated
    too."""
    if not out_dir.is_dir():
        return []
    names = set(rendered)
    return sorted(p.name for p in out_dir.glob("*.rules.yml") if p.name not in names)


def _out_of_date(out_dir: Path, rendered: dict[str, str]) -> tuple[list[str], list[str]]:
    """The rendered files `out_dir` lacks or holds otherwise, and the files it holds besides."""
    differ = [
        name
        for name, text in rendered.items()
        if not (out_dir / name).exists() or (out_dir / name).read_text() != text
    ]
    return differ, strays(out_dir, rendered)

"""Rule files are rendered from templates + config.yml; the committed ones must match."""

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
import yaml

from webhook.core.signals import SIGNALS
from webhook.rules.config import RuleConfig
from webhook.rules.render import (
    CROSS_NODE,
    LAYOUTS,
    PER_NODE,
    RULES_DIR,
    VARIANTS,
    RulesError,
    RuleSource,
    seconds,
)


def test_committed_rule_files_match_a_fresh_render() -> None:
    assert RuleSource().stale() == []


# Alerts about a job that are for people only (docs/runbooks/README.md): no `signal`, so the
# engine never acts on them.
FOR_PEOPLE = frozenset({"TrainingCheckpointStale"})


def test_every_alert_carries_the_contract() -> None:
    """docs/rules.md's alert contract: severity, signal, summary/description/runbook_url.

    Alerts about slurmedic itself (slurmedic.rules.yml) go to people, never to the engine: they
    carry no `signal`, so Alertmanager's slurmedic route cannot match them. So do the warnings
    to people about a job that slurmedic must not act on (FOR_PEOPLE).
    """
    alerts = []
    renderings = [RuleSource().render(), *RuleSource().variants().values()]
    for file, text in [item for rendering in renderings for item in rendering.items()]:
        for group in yaml.safe_load(text)["groups"]:
            alerts += [(file, r) for r in group["rules"] if "alert" in r]
    assert len(alerts) >= 25
    for file, rule in alerts:
        name = rule["alert"]
        assert name[0].isupper() and "_" not in name, name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        if file == "slurmedic.rules.yml":
            assert name.startswith("Slurmedic") and "signal" not in rule["labels"], name
        elif name in FOR_PEOPLE:
            assert "signal" not in rule["labels"], name
        else:
            assert rule["labels"]["signal"] in SIGNALS, name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert rule["annotations"]["runbook_url"].endswith(f"/docs/runbooks/{name}.md")
        assert (RULES_DIR.parent / "docs" / "runbooks" / f"{name}.md").exists(), name


def _alerts_by_file(*profiles: str) -> dict[str, list[str]]:
    """Alert names by rule file, of the defaults' rendering and of these profiles'."""
    found: dict[str, list[str]] = {}
    for profile in [None, *profiles]:
        for file, text in RuleSource().render(profile).items():
            for g in yaml.safe_load(text)["groups"]:
                for name in [r["alert"] for r in g["rules"] if "alert" in r]:
                    if name not in found.setdefault(file, []):
                        found[file].append(name)
    return found


def test_every_alert_is_in_the_runbook_table() -> None:
    table = (RULES_DIR.parent / "docs" / "runbooks" / "README.md").read_text()
    for file, names in _alerts_by_file(*VARIANTS.values()).items():
        for name in names:
            row = f"| [{name}]({name}.md) | {file.removesuffix('.rules.yml')} |"
            assert row in table, name


def test_every_rule_file_has_a_promtool_test_of_each_alert_firing_and_quiet() -> None:
    """docs/rules.md: every alert is tested with promtool, firing and staying silent."""
    for file, names in _alerts_by_file().items():
        test_file = RULES_DIR / "tests" / file.replace(".rules.yml", ".rules.test.yml")
        assert test_file.exists(), f"{file} has no {test_file.name}"
        suite = yaml.safe_load(test_file.read_text())
        assert suite["rule_files"] == [f"../{file}"], test_file.name
        cases = [c for t in suite["tests"] for c in t.get("alert_rule_test", [])]
        for name in names:
            mine = [c for c in cases if c["alertname"] == name]
            assert any(c.get("exp_alerts") for c in mine), f"{name} is never tested firing"
            assert any(not c.get("exp_alerts") for c in mine), f"{name} is never tested silent"


def test_an_alert_only_a_variant_renders_is_tested_firing_and_quiet_in_its_promtool_file() -> None:
    """A profile's own alerts (SlurmedicShardDown, only on a global ruler) are tested by
    promtool in alert_rules/tests/VARIANT.rules.test.yml, on that variant's rendering."""
    default = _alerts_by_file()
    own = 0
    for variant, files in RuleSource().variants().items():
        suite_file = RULES_DIR / "tests" / f"{variant}.rules.test.yml"
        assert suite_file.exists(), f"the {variant} rendering has no {suite_file.name}"
        suite = yaml.safe_load(suite_file.read_text())
        assert set(suite["rule_files"]) <= {f"{variant}/{name}" for name in files}, variant
        cases = [c for t in suite["tests"] for c in t.get("alert_rule_test", [])]
        for file, text in files.items():
            for g in yaml.safe_load(text)["groups"]:
                for name in [r["alert"] for r in g["rules"] if "alert" in r]:
                    if name in default.get(file, []):
                        continue
                    own += 1
                    mine = [c for c in cases if c["alertname"] == name]
                    assert any(c.get("exp_alerts") for c in mine), f"{name} never fires"
                    assert any(not c.get("exp_alerts") for c in mine), f"{name} never silent"
    assert own >= 1


def test_the_layouts_split_the_files_between_shards_and_the_global_ruler() -> None:
    """docs/rule-scale.md: per-node files on each scrape shard with the job counts it exports,
    cross-node files on the global ruler, every file once; one Prometheus has them all."""
    single, shard, ruler = (RuleSource().render(p) for p in (None, "shard", "global"))
    assert set(single) == PER_NODE | CROSS_NODE
    assert set(shard) == PER_NODE | {"shard.rules.yml"}
    assert set(ruler) == CROSS_NODE
    assert all(shard[f] == single[f] for f in PER_NODE)
    # The ruler has no DCGM series: which jobs hold GPUs is the sum of the shards' counts.
    assert "DCGM_" not in "".join(ruler.values())
    assert "sum by (slurm_job_id) (slurmedic:job_gpus:count)" in ruler["training.rules.yml"]
    assert "DCGM_FI_DEV_GPU_UTIL" in single["training.rules.yml"]
    assert "SlurmedicShardDown" in ruler["slurmedic.rules.yml"]
    assert "SlurmedicShardDown" not in single["slurmedic.rules.yml"]
    # Profiles compose: the lab's timings on a global ruler.
    lab_ruler = yaml.safe_load(RuleSource().render("lab,global")["slurmedic.rules.yml"])
    shard_down = [
        r for g in lab_ruler["groups"] for r in g["rules"] if r.get("alert") == "SlurmedicShardDown"
    ]
    assert [r["for"] for r in shard_down] == ["5s"]
    # The layouts config.yml accepts are the ones the renderer knows.
    assert set(get_args(RuleConfig.model_fields["rule_layout"].annotation)) == set(LAYOUTS)


def test_the_scale_profile_slows_only_the_groups_of_slow_signals() -> None:
    """docs/rule-scale.md: at scale, rates and slowdowns sustained for minutes, port states over
    an hour and the day-long goodput ratios are evaluated once a minute; the evidence slurmedic
    drains on at once keeps Prometheus' evaluation interval. Without the profile no group sets
    an interval of its own."""

    def intervals(profile: str | None) -> dict[str, str | None]:
        return {
            g["name"]: g.get("interval")
            for text in RuleSource().render(profile).values()
            for g in yaml.safe_load(text)["groups"]
        }

    assert set(intervals(None).values()) == {None}
    slow = {name for name, every in intervals("scale").items() if every == "1m"}
    assert slow == {
        "slurmedic-gpu-slow",
        "slurmedic-node",
        "slurmedic-training-slow",
        "slurmedic-goodput",
    }
    alerts = {
        r["alert"]: g["name"]
        for text in RuleSource().render("scale").values()
        for g in yaml.safe_load(text)["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    for fast in ("GpuXidNodeFault", "GpuDoubleBitEccErrors", "GpuMissing", "TrainingHang"):
        assert alerts[fast] not in slow, fast


def test_a_template_with_no_place_in_the_layouts_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    (copy / "templates" / "fabric.rules.yml").write_text("groups: []\n")
    with pytest.raises(RulesError, match=r"fabric\.rules\.yml: not in .*layout table"):
        RuleSource(copy).render()


def test_every_recording_rule_of_the_goodput_file_is_checked_by_value() -> None:
    text = RuleSource().render()["goodput.rules.yml"]
    rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    records = [r["record"] for r in rules if "record" in r]
    suite = yaml.safe_load((RULES_DIR / "tests" / "goodput.rules.test.yml").read_text())
    checked = {c["expr"].split("{")[0] for t in suite["tests"] for c in t["promql_expr_test"]}
    assert set(records) <= checked, set(records) - checked


def test_the_lab_profile_shortens_durations() -> None:
    hang = "training_last_step_timestamp_seconds|training_attempt_start_timestamp_seconds"
    lab = RuleSource().render("lab")["training.rules.yml"]
    prod = RuleSource().render()["training.rules.yml"]
    assert hang in lab and ") < time() - 12\n" in lab
    assert hang in prod and ") < time() - 600\n" in prod


def test_the_lab_profile_shortens_goodput_and_self_monitoring() -> None:
    lab, prod = RuleSource().render("lab"), RuleSource().render()
    assert ") < bool 5\n" in lab["goodput.rules.yml"] and "[5m]" in lab["goodput.rules.yml"]
    assert ") < bool 120\n" in prod["goodput.rules.yml"] and "[1d]" in prod["goodput.rules.yml"]
    assert "for: 5s\n" in lab["slurmedic.rules.yml"] and "> 20\n" in lab["slurmedic.rules.yml"]
    assert "for: 5m\n" in prod["slurmedic.rules.yml"] and "> 120\n" in prod["slurmedic.rules.yml"]


def test_an_edit_of_config_is_a_stale_render(tmp_path: Path) -> None:
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    config = copy / "config.yml"
    config.write_text(config.read_text().replace("hang_after: 10m", "hang_after: 20m"))
    # The global ruler's rendering beside the tests holds the training rules too.
    assert RuleSource(copy).stale() == ["training.rules.yml", "tests/global/training.rules.yml"]
    RuleSource(copy).write(copy)
    RuleSource(copy).write_variants()
    assert RuleSource(copy).stale() == []
    assert "time() - 1200" in (copy / "training.rules.yml").read_text()


def test_unknown_profile_and_keys_are_named(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match=r"profile: .prod. is not in config\.yml"):
        RuleSource().render("prod")
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    config = copy / "config.yml"
    config.write_text(config.read_text().replace("    hang_after: 12s", "    hang_aftr: 12s"))
    with pytest.raises(RulesError, match=r"profiles\.lab: unknown key .hang_aftr."):
        RuleSource(copy).render("lab")


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ("straggler_ratio: 1.5 ", "straggler_ratio: Input should be a valid number"),
        ("hang_after: 10m", "hang_after: '10 minutes' is not a duration"),
        ("many_nodes_down: 4 ", "many_nodes_down: Input should be greater than or equal to 1"),
        ("node_status_metric: slurm_node_status", "node_status_metric: Input should be"),
        ("rule_layout: single", "rule_layout: Input should be 'single', 'shard' or 'global'"),
        ('slow_interval: ""', "slow_interval"),
    ],
)
def test_a_threshold_of_the_wrong_kind_is_named_before_anything_renders(
    tmp_path: Path, edit: str, named: str
) -> None:
    """`straggler_ratio: fast` used to render a rule that never fires (and promtool passed it)."""
    bad = {
        "straggler_ratio: 1.5 ": "straggler_ratio: fast ",
        "hang_after: 10m": "hang_after: 10 minutes",
        "many_nodes_down: 4 ": "many_nodes_down: 0 ",
        "node_status_metric: slurm_node_status": "node_status_metric: slurm_nodes",
        "rule_layout: single": "rule_layout: sharded",
        'slow_interval: ""': "slow_interval: 1 minute",
    }[edit]
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    config = copy / "config.yml"
    assert edit in config.read_text()
    config.write_text(config.read_text().replace(edit, bad, 1))
    with pytest.raises(RulesError, match=re.escape(f"{config}: {named}")):
        RuleSource(copy).render()


def test_a_site_copy_of_the_config_renders_into_its_own_directory(tmp_path: Path) -> None:
    """`rules render --config FILE --out DIR` lists what changed; `rules check` says whether
    DIR is what FILE renders to. Through the real command."""
    site = tmp_path / "site.yml"
    site.write_text((RULES_DIR / "config.yml").read_text())
    out = tmp_path / "rules"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "webhook.cli", "rules", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    first = cli("render", f"--config={site}", f"--out={out}")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().endswith(f"0 unchanged in {out}")
    assert cli("check", f"--config={site}", f"--out={out}").returncode == 0
    site.write_text(site.read_text().replace("hang_after: 10m", "hang_after: 20m"))
    stale = cli("check", f"--config={site}", f"--out={out}")
    assert stale.returncode == 1 and "training.rules.yml differ" in stale.stderr
    again = cli("render", f"--config={site}", f"--out={out}")
    assert again.stdout.splitlines()[0] == f"changed {out}/training.rules.yml"
    assert "1 changed," in again.stdout
    assert "time() - 1200" in (out / "training.rules.yml").read_text()
    # The checkout's own rules are untouched by a site's config.
    assert "time() - 1200" not in (RULES_DIR / "training.rules.yml").read_text()
    refused = cli("render", f"--config={site}")
    assert refused.returncode == 2 and "--out" in refused.stderr


def test_a_rendering_over_another_layouts_files_names_the_files_left_over(tmp_path: Path) -> None:
    """A shard's directory that still holds the single rendering's cross-node files would
    evaluate them too (SlurmedicDown from every shard): render warns, check fails, by name."""
    out = tmp_path / "rules"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "webhook.cli", "rules", *args, f"--out={out}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    assert cli("render").returncode == 0
    shard = cli("render", "--profile=shard")
    assert shard.returncode == 0, shard.stderr
    left = "goodput.rules.yml, slurm.rules.yml, slurmedic.rules.yml, training.rules.yml"
    assert f"also holds {left}, which this rendering does not produce" in shard.stderr
    check = cli("check", "--profile=shard")
    assert check.returncode == 1
    assert "slurmedic.rules.yml (not part of this rendering: remove it)" in check.stderr
    for name in left.split(", "):
        (out / name).unlink()
    assert cli("check", "--profile=shard").returncode == 0
    assert "warning" not in cli("render", "--profile=shard").stderr
    # The checkout's own directories: a file no rendering produces is stale.
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    (copy / "tests" / "global" / "gpu.rules.yml").write_text("groups: []\n")
    assert RuleSource(copy).stale() == ["tests/global/gpu.rules.yml"]


@pytest.mark.parametrize(("d", "s"), [("10m", 600), ("1h", 3600), ("12s", 12), ("2d", 172800)])
def test_seconds(d: str, s: int) -> None:
    assert seconds(d) == s


def test_bad_duration() -> None:
    with pytest.raises(RulesError, match="not a duration"):
        seconds("ten minutes")


NEW_ALERT = """
      - alert: InfinibandLinkDown
        expr: node_infiniband_physical_state_id != 5
        labels:
          severity: critical
          signal: network
        annotations:
          summary: "An InfiniBand port of {{ $labels.node }} is down"
          description: >-
            The port's physical state is not LinkUp.
"""


def test_a_new_alert_gets_its_runbook_url_from_its_name(tmp_path: Path) -> None:
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    template = copy / "templates" / "slurm.rules.yml"
    template.write_text(template.read_text() + NEW_ALERT)
    text = RuleSource(copy).render()["slurm.rules.yml"]
    rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    new = next(r for r in rules if r.get("alert") == "InfinibandLinkDown")
    base = RuleSource(copy).config()["runbook_base"]
    assert new["annotations"]["runbook_url"] == f"{base}/InfinibandLinkDown.md"
    assert new["labels"]["signal"] in SIGNALS
    assert list(new["annotations"]) == ["summary", "description", "runbook_url"]


def test_a_template_that_spells_a_runbook_url_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    template = copy / "templates" / "slurm.rules.yml"
    spelled = NEW_ALERT + '          runbook_url: "https://example.org/Other.md"\n'
    template.write_text(template.read_text() + spelled)
    with pytest.raises(RulesError, match=r"slurm\.rules\.yml: alert InfinibandLinkDown spells"):
        RuleSource(copy).render()


def test_an_alert_without_annotations_is_named(tmp_path: Path) -> None:
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    template = copy / "templates" / "slurm.rules.yml"
    bare = NEW_ALERT[: NEW_ALERT.index("        annotations:")]
    template.write_text(template.read_text() + bare)
    with pytest.raises(RulesError, match="alert InfinibandLinkDown has no annotations"):
        RuleSource(copy).render()


def test_a_misspelled_key_is_named_with_the_key_it_may_mean(tmp_path: Path) -> None:
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    config = copy / "config.yml"
    config.write_text(config.read_text().replace("hang_after: 10m", "hang_afetr: 10m", 1))
    with pytest.raises(RulesError) as e:
        RuleSource(copy).render()
    assert str(e.value) == f"{config}: hang_afetr: unknown key (did you mean hang_after?)"


def test_a_duration_given_in_seconds_renders_with_its_unit(tmp_path: Path) -> None:
    """As the policy takes them: `hang_after: 600` is 600 s (Prometheus needs `600s`)."""
    copy = tmp_path / "alert_rules"
    shutil.copytree(RULES_DIR, copy)
    config = copy / "config.yml"
    config.write_text(config.read_text().replace("hang_after: 10m", "hang_after: 600", 1))
    source = RuleSource(copy)
    assert source.config()["hang_after"] == "600s"
    rendered = source.render()["training.rules.yml"]
    assert "time() - 600" in rendered and "made no progress for 600s" in rendered

"""The real mtail over tests/data/joblog/corpus.yaml: real job-log lines from public sources.

Every positive line increments exactly its one expected counter, with the right job, node and
rank, in a per-rank file; in a batch file (slurm-%j.out) only lines that name their node count;
every negative line counts nothing anywhere. Runs on the lab's stack's mtail like
test_mtail_program.py (SLURMEDIC_LAB_STACK, or SLURMEDIC_MTAIL): lab/mtail_oneshot.py.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from lab import mtail_oneshot
from lab.mtail_oneshot import Key
from tests import joblog_corpus
from webhook.core import signals
from webhook.rules.render import RULES_DIR

CORPUS = joblog_corpus.load()
# The signals job logs give evidence of: a part of the vocabulary (webhook/core/signals.py).
SIGNALS = {"nccl_timeout", "hang", "app_error", "gpu_hw", "gpu_app", "gpu_degraded"}


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> dict[Key, float]:
    logs = tmp_path_factory.mktemp("joblog") / "logs"
    joblog_corpus.write(CORPUS, logs)
    return mtail_oneshot.samples(mtail_oneshot.run(logs))


def test_the_corpus_covers_every_class_with_real_sourced_lines() -> None:
    entries = CORPUS.entries
    assert len(entries) >= 100
    assert sum(e.negative for e in entries) >= 25
    assert SIGNALS <= signals.SIGNALS
    per_class = Counter(e.cls for e in entries)
    for cls, spec in CORPUS.classes.items():
        assert per_class[cls] >= 2, cls
        assert spec["signal"] in SIGNALS | {None}, cls
    assert set(per_class) == set(CORPUS.classes) | {"negative"}
    assert {CORPUS.signal(e) for e in entries} == SIGNALS | {None}
    for e in entries:
        assert e.source.split()[-1].startswith("https://"), e.line
        assert (e.counter is None) == e.negative, e.line
        assert e.line == e.line.strip("\n") and "\n" not in e.line
    lines = [e.line for e in entries]
    assert len(set(lines)) == len(lines), "a line is in the corpus twice"


def test_xid_lines_are_classed_as_the_dcgm_rules_class_them() -> None:
    classes = joblog_corpus.xid_classes()
    for e in CORPUS.entries:
        if e.counter != "xid":
            assert e.xid is None
            continue
        assert e.xid is not None
        expected = (
            "xid_node"
            if e.xid in classes["node"]
            else "xid_application"
            if e.xid in classes["application"]
            else "xid_contained"
            if e.xid in classes["contained"]
            else "xid_no_alert"
        )
        assert e.cls == expected, e.line


@pytest.mark.parametrize("entry", CORPUS.entries, ids=lambda e: f"{e.index}-{e.cls}")
def test_each_line_counts_exactly_its_counter_with_job_node_and_rank(
    found: dict[Key, float], entry: joblog_corpus.Entry
) -> None:
    counted = joblog_corpus.by_entry(CORPUS, found)[entry.index]
    rank_job = str(joblog_corpus.RANK_JOB + entry.index)
    in_rank_file = {k for k in counted if k[1] == rank_job}
    in_batch_file = counted - in_rank_file
    assert in_rank_file == entry.expected_in_rank_file(), entry.line
    assert in_batch_file == entry.expected_in_batch_file(), entry.line
    for key in counted:
        assert found[key] == 1.0
        # ... and the gauge the alert reads, beside the counter.
        stamp = key[0].removesuffix("_total") + "_last_timestamp_seconds"
        assert (stamp, *key[1:]) in found, key


def test_nothing_else_is_counted(found: dict[Key, float]) -> None:
    expected = set()
    for e in CORPUS.entries:
        expected |= e.expected_in_rank_file() | e.expected_in_batch_file()
    assert {k for k in found if k[0].endswith("_total")} == expected


def test_lines_in_a_file_named_otherwise_count_nothing(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    positives = [e.line for e in CORPUS.entries if not e.negative]
    (logs / "train.out").write_text("\n".join(positives) + "\n")
    (logs / "slurm-12-gpu01-x.out").write_text("\n".join(positives) + "\n")
    assert mtail_oneshot.samples(mtail_oneshot.run(logs)) == {}


def test_the_job_log_rules_raise_each_line_s_signal_and_nothing_else(
    found: dict[Key, float], tmp_path: Path
) -> None:
    """mtail's gauges for the whole corpus, as promtool's input: every positive line raises one
    alert whose `signal` is its class's, with its job, node and rank; no other alert fires."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not on PATH (Debian package prometheus; scripts/setup.sh)"
    series = []
    for name, job, node, rank, xid in found:
        if name.endswith("_last_timestamp_seconds"):
            labels = {"slurm_job_id": job, "node": node, "rank": rank, "prog": "training.mtail"}
            if xid:
                labels["xid"] = xid
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            series.append({"series": f"{name}{{{text}}}", "values": "0x3"})  # a line at time 0
    expected = []
    for e in CORPUS.entries:
        signal = CORPUS.signal(e)
        for _, job, node, rank, _ in sorted(e.expected_in_rank_file() | e.expected_in_batch_file()):
            if signal is not None:
                labels = {"slurm_job_id": job, "node": node, "rank": rank, "signal": signal}
                expected.append({"labels": _selector(labels), "value": 1})
    assert len(expected) > 100
    test = {
        "rule_files": [str(RULES_DIR / "joblog.rules.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": "count by (slurm_job_id, node, rank, signal) "
                        '(ALERTS{alertstate="firing"})',
                        "eval_time": "1m",
                        "exp_samples": expected,
                    }
                ],
            }
        ],
    }
    path = tmp_path / "corpus.rules.test.yml"
    path.write_text(yaml.safe_dump(test))
    out = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


def _selector(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"

"""Job-log lines from real clusters: recall per signal and class, false positives, mtail's pace.

Runs the real mtail (the lab's stack's, as the tests do: SLURMEDIC_LAB_STACK or SLURMEDIC_MTAIL)
with alert_rules/mtail/training.mtail over tests/data/joblog/corpus.yaml, each line in a per-rank
file and again in a batch file (tests/joblog_corpus.py). A line is recognised when mtail counts
exactly its expected counter with the right job, node and rank, and the rendered rules
(alert_rules/joblog.rules.yml) raise its signal from that counter's gauge. False positives: a
negative line that counts anything, in either file. Then mtail's pace: one per-rank file built by
repeating the corpus to `--lines` lines, read one-shot; the run over an empty file (start-up,
program compile, and `lab exec` where the stack is not the host's) is subtracted.

    .venv/bin/python -m bench.joblog_corpus [--lines 200000] [--runs 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml

from lab import mtail_oneshot
from lab.mtail_oneshot import Key
from tests import joblog_corpus
from webhook.rules.render import RULES_DIR

GAUGE = re.compile(r"(training_log_\w+)_last_timestamp_seconds(\{xid=~\"([^\"]*)\"\})?")
SIGNALS = ("nccl_timeout", "hang", "app_error", "gpu_hw", "gpu_degraded", "gpu_app")


def rule_signals() -> list[tuple[str, re.Pattern[str] | None, str]]:
    """(counter's metric prefix, xid selector or None, signal) of each job-log alert."""
    rules = yaml.safe_load((RULES_DIR / "joblog.rules.yml").read_text())
    out = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            for prefix, _, xids in GAUGE.findall(rule["expr"]):
                out.append((prefix, re.compile(xids) if xids else None, rule["labels"]["signal"]))
    return out


def signals_of(key: Key, rules: list[tuple[str, re.Pattern[str] | None, str]]) -> set[str]:
    prefix = key[0].removesuffix("_total")
    return {
        signal
        for p, xids, signal in rules
        if p == prefix and (xids is None or xids.fullmatch(key[4]))
    }


def recognition() -> None:
    corpus = joblog_corpus.load()
    rules = rule_signals()
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        joblog_corpus.write(corpus, logs)
        counted = joblog_corpus.by_entry(corpus, mtail_oneshot.samples(mtail_oneshot.run(logs)))
    per_signal: dict[str, list[bool]] = defaultdict(list)
    per_class: dict[str, list[bool]] = defaultdict(list)
    misses, false_positives, batch_wrong = [], [], []
    for e in corpus.entries:
        rank_job = str(joblog_corpus.RANK_JOB + e.index)
        in_rank = {k for k in counted[e.index] if k[1] == rank_job}
        in_batch = counted[e.index] - in_rank
        if in_batch != e.expected_in_batch_file():
            batch_wrong.append(e)
        if e.negative:
            if counted[e.index]:
                false_positives.append(e)
            continue
        signal = corpus.signal(e)
        raised = set().union(*(signals_of(k, rules) for k in in_rank))
        ok = in_rank == e.expected_in_rank_file() and raised == ({signal} if signal else set())
        per_class[e.cls].append(ok)
        per_signal[signal or "none (XID of no alerting class)"].append(ok)
        if not ok:
            misses.append(e)

    def pct(v: list[bool]) -> str:
        return f"{sum(v)}/{len(v)} = {100 * sum(v) / len(v):.0f}%"

    negatives = sum(e.negative for e in corpus.entries)
    mtail = mtail_oneshot.version().split(" git ")[0]
    print(
        f"corpus: {len(corpus.entries)} real lines ({len(corpus.entries) - negatives} faults in "
        f"{len(corpus.classes)} classes, {negatives} negatives); {mtail}"
    )
    print("recall per signal (right counter, job, node and rank; the rules raise the signal):")
    for signal in [*SIGNALS, *sorted(set(per_signal) - set(SIGNALS))]:
        print(f"  {signal:34} {pct(per_signal[signal])}")
    print("recall per class:")
    for cls, spec in corpus.classes.items():
        print(f"  {cls:28} {spec['signal']!s:13} {pct(per_class[cls])}")
    print(f"false positives on the negatives: {len(false_positives)}/{negatives}")
    print(f"lines counted wrongly in a batch file (slurm-%j.out): {len(batch_wrong)}")
    for e in misses + false_positives + batch_wrong:
        print(f"  ! {e.cls}: {e.line[:120]}")


def pace(lines: int, runs: int) -> None:
    corpus = joblog_corpus.load()
    body = [e.line for e in corpus.entries]
    text = "\n".join(body[i % len(body)] for i in range(lines)) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        empty, full = Path(tmp) / "empty", Path(tmp) / "full"
        empty.mkdir()
        full.mkdir()
        (empty / "slurm-7-gpu-a07-3.out").write_text("")
        (full / "slurm-7-gpu-a07-3.out").write_text(text)
        startup, total = [], []
        for _ in range(runs):
            t0 = time.perf_counter()
            mtail_oneshot.run(empty)
            startup.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            found = mtail_oneshot.samples(mtail_oneshot.run(full, timeout=600))
            total.append(time.perf_counter() - t0)
    counted = sum(v for k, v in found.items() if k[0].endswith("_total"))
    base, t = statistics.median(startup), statistics.median(total)
    print(
        f"pace: {lines:,} lines ({len(text) / 2**20:.1f} MiB, the corpus repeated) in "
        f"{t:.2f}s, start-up {base:.2f}s (median of {runs}): "
        f"{lines / max(t - base, 1e-9):,.0f} lines/s sustained; {counted:,.0f} lines counted"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lines", type=int, default=200_000, help="lines in the pace run's file")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    recognition()
    pace(args.lines, args.runs)


if __name__ == "__main__":
    main()

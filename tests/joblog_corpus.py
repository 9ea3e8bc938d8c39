"""tests/data/joblog/corpus.yaml: real job-log lines, laid out as the files mtail reads.

The corpus is a test fixture (it is not shipped): this module is shared by the test and the
bench, not by the lab.

Each line goes into a per-rank file of a job of its own (`slurm-<job>-gpu-a07-3.out`) and, again,
into a batch file of another job (`slurm-<job>.out`), so that one mtail run tells every line's
counters apart by job id. The test (tests/unit/test_joblog_corpus.py) and the bench
(bench/joblog_corpus.py) share this.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.mtail_oneshot import Key
from webhook import resources

CORPUS = Path(__file__).resolve().parent / "data" / "joblog" / "corpus.yaml"
NODE, RANK = "gpu-a07", "3"  # the per-rank files' node and rank
RANK_JOB, BATCH_JOB = 100000, 200000  # job ids: these plus the line's index


@dataclass(frozen=True)
class Entry:
    index: int
    line: str
    source: str
    cls: str
    counter: str | None
    xid: int | None = None
    node: str | None = None
    rank: str | None = None
    batch: dict[str, Any] | None = None
    note: str | None = None

    @property
    def negative(self) -> bool:
        return self.cls == "negative"

    def _key(self, job: int, node: str, rank: str) -> Key:
        xid = "" if self.xid is None else str(self.xid)
        return (f"training_log_{self.counter}_total", str(job), node, rank, xid)

    def expected_in_rank_file(self) -> set[Key]:
        if self.counter is None:
            return set()
        job = RANK_JOB + self.index
        if self.node is not None and self.rank is not None:
            return {self._key(job, self.node, self.rank)}
        return {self._key(job, NODE, RANK)}

    def expected_in_batch_file(self) -> set[Key]:
        if self.counter is None:
            return set()
        job = BATCH_JOB + self.index
        if self.node is not None and self.rank is not None:
            return {self._key(job, self.node, self.rank)}
        if self.batch:
            return {self._key(job, self.batch["node"], self.batch["rank"])}
        return set()  # no node in the line: a batch file's line counts nothing

    def batch_line(self) -> str:
        if self.batch and "label" in self.batch:
            return f"{self.batch['label']}: {self.line}"  # srun --label's prefix
        return self.line


@dataclass
class Corpus:
    classes: dict[str, dict[str, Any]]
    entries: list[Entry] = field(default_factory=list)

    def signal(self, entry: Entry) -> str | None:
        """The alert signal the line is evidence of (None: no alert)."""
        if entry.negative:
            return None
        signal = self.classes[entry.cls]["signal"]
        return None if signal is None else str(signal)


def load(path: Path = CORPUS) -> Corpus:
    raw = yaml.safe_load(path.read_text())
    corpus = Corpus(classes=raw["classes"])
    for i, e in enumerate(raw["lines"]):
        corpus.entries.append(
            Entry(
                index=i,
                line=e["line"],
                source=e["source"],
                cls=e["class"],
                counter=e.get("counter"),
                xid=e.get("xid"),
                node=e.get("node"),
                rank=e.get("rank"),
                batch=e.get("batch"),
                note=e.get("note"),
            )
        )
    return corpus


def xid_classes() -> dict[str, list[int]]:
    raw = yaml.safe_load((resources.ALERT_RULES / "xid-classes.yml").read_text())
    return {str(cls): [int(x) for x in codes] for cls, codes in raw.items()}


def write(corpus: Corpus, logs: Path) -> None:
    """Every line in a per-rank file and a batch file of jobs of its own."""
    logs.mkdir(parents=True, exist_ok=True)
    for e in corpus.entries:
        (logs / f"slurm-{RANK_JOB + e.index}-{NODE}-{RANK}.out").write_text(e.line + "\n")
        (logs / f"slurm-{BATCH_JOB + e.index}.out").write_text(e.batch_line() + "\n")


def by_entry(corpus: Corpus, found: dict[Key, float]) -> dict[int, set[Key]]:
    """The counters each line incremented, in either of its files (jobs tell them apart)."""
    out: dict[int, set[Key]] = {e.index: set() for e in corpus.entries}
    for key in found:
        if not key[0].endswith("_total"):
            continue
        job = int(key[1])
        index = job - BATCH_JOB if job >= BATCH_JOB else job - RANK_JOB
        out[index].add(key)
    return out

"""alert_rules/mtail/training.mtail, run by the real mtail (one-shot) over real-format log lines.

The mtail is the one of the lab's stack (SLURMEDIC_LAB_STACK), or the command named by
SLURMEDIC_MTAIL: lab/mtail_oneshot.py. The real lines of every class are in
tests/data/joblog/corpus.yaml (tests/unit/test_joblog_corpus.py); these are the lab's own.
"""

import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lab import mtail_oneshot

STAMP = "[rank{r}]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629]"

LINES = {
    "nccl_timeouts": [
        f"{STAMP} [Rank {{r}}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
        "OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, Timeout(ms)=600000) ran for "
        "600081 milliseconds before timing out.",
        "[rank{r}]:[E1218 20:27:21.4 ProcessGroupNCCL.cpp:632] [PG 0 (default_pg) Rank {r}] "
        "Timeout at NCCL work: 1, last enqueued NCCL work: 1, last completed NCCL work: 0.",
    ],
    "cuda_errors": [
        "[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered"
    ],
    "cuda_ecc_errors": ["[rank{r}]: RuntimeError: CUDA error: uncorrectable ECC error encountered"],
    "gpu_lost": ["[rank{r}]: pynvml.NVMLError_GPUIsLost: GPU is lost"],
    "tracebacks": ["[rank{r}]: Traceback (most recent call last):"],
    "oom": [
        "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "[rank{r}]: RuntimeError: CUDA error: out of memory",
        "slurmstepd: error: Detected 1 oom_kill event in StepId=12.0. Some of the step tasks "
        "have been OOM Killed.",
    ],
    "heartbeat_missed": [
        "[default0]:[NVRx] [Cycle 3] Did not get subsequent heartbeat. Waited 60.00 seconds.",
    ],
}
HEALTHY = [
    "[rank{r}]: step 120 loss 2.345 lr 3e-4",
    "[rank{r}]: saved checkpoint at step 120",
    "[rank{r}]:[I1218 20:27:21.4 ProcessGroupNCCL.cpp:900] NCCL initialized, timeout 600000 ms",
]


def run_mtail(
    tmp_path: Path, files: dict[str, list[str]], end: str = "\n"
) -> dict[tuple[str, str, str, str], float]:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name, lines in files.items():
        (logs / name).write_text("\n".join(lines) + end)
    return {k[:4]: v for k, v in mtail_oneshot.samples(mtail_oneshot.run(logs)).items()}


@pytest.mark.parametrize("kind", sorted(LINES))
def test_each_line_counts_once_with_job_node_and_rank(tmp_path: Path, kind: str) -> None:
    lines = [ln.format(r=3) for ln in LINES[kind]]
    before = time.time()
    found = run_mtail(tmp_path, {"slurm-4242-gpu-a07-3.out": HEALTHY + lines})
    key = ("4242", "gpu-a07", "3")
    counters = {k: v for k, v in found.items() if k[0].endswith("_total")}
    assert counters == {(f"training_log_{kind}_total", *key): float(len(lines))}
    # ... and when such a line was last read, which is what the alerts look at.
    stamps = {k: v for k, v in found.items() if not k[0].endswith("_total")}
    assert list(stamps) == [(f"training_log_{kind}_last_timestamp_seconds", *key)]
    assert before - 2 <= next(iter(stamps.values())) <= time.time() + 2


def test_healthy_logs_count_nothing(tmp_path: Path) -> None:
    found = run_mtail(tmp_path, {"slurm-1-gpu01-0.out": [ln.format(r=0) for ln in HEALTHY]})
    assert found == {}


def test_files_not_named_like_job_logs_are_ignored(tmp_path: Path) -> None:
    line = LINES["nccl_timeouts"][0].format(r=0)
    assert run_mtail(tmp_path, {"syslog.out": [line], "slurm-x-gpu01-0.out": [line]}) == {}


def test_a_crlf_line_and_an_unterminated_last_line_count(tmp_path: Path) -> None:
    """rc50, 3.0.9 and 3.2.24 alike: a job killed mid-write leaves its last line unterminated."""
    cuda, tb = LINES["cuda_errors"][0].format(r=1), LINES["tracebacks"][0].format(r=1)
    found = run_mtail(tmp_path, {"slurm-9-gpu02-1.out": [cuda + "\r", tb]}, end="")
    assert {k[0] for k in found if k[0].endswith("_total")} == {
        "training_log_cuda_errors_total",
        "training_log_tracebacks_total",
    }


def test_an_xid_line_carries_its_code_and_the_pci_address_of_its_gpu(tmp_path: Path) -> None:
    """The GPU an XID line names (its PCI address, without a MIG instance after it) is a label:
    the same code on two GPUs of one rank's node counts twice, apart."""
    lines = [
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
        "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0)",
        "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). "
        "RST: No, D-RST: No",
        "NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error",
        "NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error",
    ]
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "slurm-77-gpu-b02-5.out").write_text("\n".join(lines) + "\n")
    found: dict[str, dict[tuple[str, str], float]] = {}
    for fam in text_string_to_metric_families(mtail_oneshot.run(logs)):
        for sample in fam.samples:
            if sample.name.startswith("training_log_xid") and sample.value:
                labels = sample.labels
                where = (labels["slurm_job_id"], labels["node"], labels["rank"])
                assert where == ("77", "gpu-b02", "5")
                key = (labels["xid"], labels["pci_bus_id"])
                found.setdefault(sample.name, {})[key] = sample.value
    expected = {("13", "0000:cb:00"), ("94", "0000:01:00"), ("94", "0000:9b:00")}
    assert found["training_log_xid_total"] == {
        ("13", "0000:cb:00"): 1.0,
        ("94", "0000:01:00"): 1.0,
        ("94", "0000:9b:00"): 2.0,
    }
    assert set(found["training_log_xid_last_timestamp_seconds"]) == expected

"""The job-side reporter never disturbs training, and reads Slurm's environment."""

import pytest

from webhook.progress import ProgressReporter


def test_from_env_reads_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {
        "SLURM_JOB_ID": "42",
        "SLURM_PROCID": "3",
        "SLURMD_NODENAME": "gpu07",
        "SLURM_RESTART_COUNT": "2",
        "SLURMEDIC_PUSHGATEWAY": "http://127.0.0.1:1",
    }.items():
        monkeypatch.setenv(k, v)
    r = ProgressReporter.from_env()
    assert (r.job_id, r.rank, r.node, r.attempt, r.gateway) == (
        "42",
        3,
        "gpu07",
        2,
        "http://127.0.0.1:1",
    )


def test_unreachable_gateway_is_counted_not_raised() -> None:
    # Port 1 on loopback refuses at once: the push fails, training goes on.
    r = ProgressReporter(gateway="http://127.0.0.1:1", job_id="1", rank=0, node="gpu01")
    r.step(5, 0.5)
    r.checkpoint(5)
    assert r.failed_pushes == 2


def test_no_gateway_means_no_push() -> None:
    r = ProgressReporter(gateway=None, job_id="1", rank=0, node="gpu01")
    r.step(1, 0.1)
    assert r.failed_pushes == 0
    assert r.registry.get_sample_value("training_step", {"node": "gpu01"}) == 1

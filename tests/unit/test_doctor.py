"""`slurmedic doctor` on a misconfigured site (no lab: nothing answers here): every check says
what it found, a failure says what to do, the checks that need a failed one are skipped, and
the exit code is 1. The lab's own run (tests/lab/test_deploy.py) shows it green."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from webhook.cli import main


def run(*args: str) -> tuple[int, dict[str, dict[str, str]]]:
    out = CliRunner().invoke(main, ["doctor", *args, "--json"])
    assert out.exception is None or isinstance(out.exception, SystemExit), out.exception
    return out.exit_code, {f["check"]: f for f in json.loads(out.stdout)}


def test_a_misconfigured_site_gets_a_finding_per_check(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    config = tmp_path / "config.yml"
    config.write_text(
        f"database_url: sqlite:///{tmp_path}/missing/ledger.db\n"
        f"auth: {{bearer_token_file: {token}}}\n"
        f"cluster: {{slurm_conf: {tmp_path}/slurm.conf}}\n"
        "verification: {prometheus_url: 'http://127.0.0.1:9'}\n"
    )
    code, found = run(f"--config={config}")
    assert code == 1
    assert found["config"]["status"] == "ok"
    assert found["secrets"]["status"] == "warn" and "(mode 0644)" in found["secrets"]["detail"]
    assert found["ledger"] == {
        "check": "ledger",
        "status": "fail",
        "detail": f"database_url: directory {tmp_path}/missing does not exist (serve makes none)",
        "fix": "check database_url, that the database runs and this host may reach it",
    }
    assert found["slurm"]["status"] == "fail"
    assert found["slurm"]["detail"] == (
        f"{tmp_path}/slurm.conf: no such file (SLURM_CONF, or the config's slurm_conf)"
    )
    assert found["prometheus"]["status"] == "fail"
    assert found["alertmanager"]["status"] == "warn"
    assert "host names" not in found  # Prometheus did not answer: nothing to compare


def test_a_bad_config_skips_what_needs_it_and_says_why(tmp_path: Path) -> None:
    config = tmp_path / "config.yml"
    config.write_text("listen: 0.0.0.0:99999\n")
    code, found = run(f"--config={config}")
    assert code == 1
    assert found["config"]["status"] == "fail"
    assert found["config"]["detail"] == f"{config}: listen: port 99999 is not within 1-65535"
    assert found["policy"]["status"] == "ok" and found["rules config"]["status"] == "ok"
    for check in ("ledger", "slurm", "executor", "prometheus", "alertmanager"):
        assert found[check] == {
            "check": check,
            "status": "skip",
            "detail": "needs a valid config",
            "fix": "",
        }


def test_the_text_output_ends_with_a_verdict(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yml"
    policy.write_text("node_names: {rewrite: [{match: '(gpu', replace: x}]}\n")
    out = CliRunner().invoke(main, ["doctor", f"--policy={policy}"])
    assert out.exit_code == 1
    lines = out.stdout.splitlines()
    assert any(
        line.startswith(f"FAIL policy: {policy}: node_names.rewrite.0.match: ") for line in lines
    ), lines
    assert lines[-1].startswith("not ready: ") and "failed" in lines[-1]

"""The production CLI needs none of the development lab: with `lab` unimportable, `replay`
runs and `serve` loads; only `slurmedic lab` itself fails."""

import json
import subprocess
import sys
from pathlib import Path

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "attr-node-down.yaml"

# Runs the CLI in a fresh interpreter where importing `lab` (or anything under it) fails, then
# says which modules it loaded.
RUN = """
import importlib.abc, json, sys

class NoLab(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "lab" or name.startswith("lab."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None

sys.meta_path.insert(0, NoLab())
from webhook.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    import webhook.cli.serve  # what `slurmedic serve` loads before it starts gunicorn
    print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "lab")), file=sys.stderr)
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=120
    )


def test_replay_runs_without_lab() -> None:
    out = run("replay", str(SCENARIO), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)  # the replay's report
    assert json.loads(out.stderr.strip().splitlines()[-1]) == []


def test_serve_help_runs_without_lab() -> None:
    out = run("serve", "--help")
    assert out.returncode == 0, out.stderr
    assert "--config" in out.stdout
    assert json.loads(out.stderr.strip().splitlines()[-1]) == []


def test_lab_itself_needs_lab() -> None:
    # The blocker works: the one command that needs the lab cannot load it.
    out = run("lab", "--help")
    assert out.returncode != 0
    assert "blocked by the test" in out.stderr

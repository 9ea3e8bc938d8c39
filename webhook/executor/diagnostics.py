"""Keep what `collect_diagnostics` handed back as artifacts, and summarise each node's health.

Layout: `<artifacts>/<incident>/<node>/` with `nvidia-smi.xml`, `dmesg.txt`, `slurmd.log` and
`summary.txt`. The summary (verdict and problems from the nvidia-smi XML, or why a part could
not be read) goes into the ledger with the drain it explains.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from webhook.diagnostics.nvsmi import parse_nvidia_smi_xml, summary_lines
from webhook.executor.runner import RunResult

FILES = {"nvidia_smi": "nvidia-smi.xml", "dmesg": "dmesg.txt", "slurmd_log": "slurmd.log"}
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_ATTACHED = re.compile(r"<attached_gpus>\s*(\d+)\s*</attached_gpus>")


def text_of(folder: Path) -> str:
    return (folder / FILES["nvidia_smi"]).read_text()


def _part(data: dict[str, Any], key: str) -> tuple[str, str | None]:
    """(text, what went wrong) for one collected part: a command may fail and still say much
    (nvidia-smi exits non-zero when a GPU is lost, with the other GPUs' XML)."""
    part = data.get(key) or {}
    text = str(part.get("stdout") or "")
    rc = str(part.get("rc", "-1"))
    if rc == "0" and text:
        return text, None
    error = str(part.get("error") or "").strip().splitlines()
    return text, f"rc {rc}: {error[0] if error else 'no output'}"


def keep(result: RunResult, artifacts: Path, incident: str) -> dict[str, Any]:
    """Write the artifacts of one run; the per-node summary for the ledger."""
    root = artifacts / _SAFE.sub("_", incident)
    nodes: dict[str, Any] = {}
    for node, data in sorted(result.diagnostics.items()):
        folder = root / _SAFE.sub("_", node)
        folder.mkdir(parents=True, exist_ok=True)
        missing: dict[str, str] = {}
        for key, name in FILES.items():
            text, why = _part(data, key)
            if text:
                (folder / name).write_text(text)
            if why:
                missing[key] = why
        summary: dict[str, Any] = {"artifacts": str(folder), "missing": missing}
        lines: list[str]
        if not (folder / FILES["nvidia_smi"]).exists():
            summary["verdict"] = "unknown"
            lines = [f"nvidia-smi: {missing['nvidia_smi']}"]
        else:
            try:
                health = parse_nvidia_smi_xml(text_of(folder))
            except ValueError as e:
                summary["verdict"] = "unknown"
                lines = [f"nvidia-smi output not understood: {e}"]
            else:
                summary["verdict"] = health.verdict
                summary["problems"] = list(health.problems)
                lines = summary_lines(health)
                # The playbook asks for every GPU: one the driver counts but nvidia-smi cannot
                # show has fallen off the bus (its error is on stderr).
                attached = _ATTACHED.search(text_of(folder))
                if attached and int(attached.group(1)) > len(health.gpus):
                    gone = f"nvidia-smi shows {len(health.gpus)} of {attached.group(1)} GPUs"
                    summary["verdict"] = "unhealthy"
                    summary["problems"].append(gone)
                    lines[0] = re.sub(r"^node: \w+", "node: unhealthy", lines[0])
                    lines.insert(1, gone)
                if "nvidia_smi" in missing:  # it failed, but said this much
                    summary["problems"].append(f"nvidia-smi exited {missing['nvidia_smi']}")
                    if summary["verdict"] == "healthy":
                        summary["verdict"] = "degraded"
                stderr = str((data.get("nvidia_smi") or {}).get("error") or "").strip()
                lines += [f"nvidia-smi: {e}" for e in stderr.splitlines()[:8]]
        for key, why in missing.items():
            if key != "nvidia_smi":
                lines.append(f"{FILES[key]}: {why}")
        (folder / "summary.txt").write_text("\n".join(lines) + "\n")
        summary["summary"] = lines[:40]
        nodes[node] = summary
    for node in result.unreachable:
        nodes.setdefault(node, {}).update(verdict="unknown", unreachable=True)
    return {"playbook": result.playbook, "status": result.status, "nodes": nodes}

"""Keep what `collect_diagnostics` handed back as artifacts, and summarise each node's health.

Layout: `<artifacts>/<incident>/<node>/` with `nvidia-smi.xml`, `nvidia-smi-nvlink-e.txt`,
`scontrol-show-node.txt`, `dmesg.txt`, `slurmd.log` and `summary.txt`. The summary (verdict and
problems from the nvidia-smi XML and NVLink counters, the GPUs missing against Slurm's gres and
the driver's count, or why a part could not be read) goes into the ledger with the drain it
explains.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from webhook.adapters.slurm import gpu_count
from webhook.diagnostics.gpus import lost_bus_ids
from webhook.diagnostics.nvsmi import NodeHealth, parse_nvidia_smi_xml, summary_lines, with_missing
from webhook.executor.runner import RunResult

FILES = {
    "nvidia_smi": "nvidia-smi.xml",
    "nvlink_errors": "nvidia-smi-nvlink-e.txt",
    "slurm_node": "scontrol-show-node.txt",
    "dmesg": "dmesg.txt",
    "slurmd_log": "slurmd.log",
}
# Parts whose empty output is an answer: a GPU on no NVLink prints no link.
_MAY_BE_EMPTY = frozenset({"nvlink_errors"})
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_GRES = re.compile(r"(?:^|\s)Gres=(\S+)")


def text_of(folder: Path) -> str:
    return (folder / FILES["nvidia_smi"]).read_text()


def _part(data: dict[str, Any], key: str) -> tuple[str, str | None]:
    """(text, what went wrong) for one collected part: a command may fail and still say much
    (nvidia-smi exits non-zero when a GPU is lost, with the other GPUs' XML)."""
    part = data.get(key) or {}
    text = str(part.get("stdout") or "")
    rc = str(part.get("rc", "-1"))
    if rc == "0" and (text or key in _MAY_BE_EMPTY):
        return text, None
    error = str(part.get("error") or "").strip().splitlines()
    return text, f"rc {rc}: {error[0] if error else 'no output'}"


def _health(data: dict[str, Any], xml: str, stderr: str) -> tuple[NodeHealth, list[str]]:
    """The node's health from its parts, and what of the extra parts could not be read.

    The playbook asks for every GPU, so the node should show as many as the larger of Slurm's
    gres and the driver's count; nvidia-smi names on stderr the ones it could not reach."""
    unread: list[str] = []
    nvlink = str((data.get("nvlink_errors") or {}).get("stdout") or "")
    try:
        health = parse_nvidia_smi_xml(xml, nvlink or None)
    except ValueError as e:
        health = parse_nvidia_smi_xml(xml)  # the XML's own fault raises again, as it should
        unread.append(f"nvidia-smi nvlink -e not understood: {e}")
    slurm = _GRES.search(str((data.get("slurm_node") or {}).get("stdout") or ""))
    expected = max(health.attached_gpus or 0, gpu_count(slurm.group(1)) if slurm else 0)
    return with_missing(health, expected, lost_bus_ids(stderr)), unread


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
            stderr = str((data.get("nvidia_smi") or {}).get("error") or "").strip()
            try:
                health, unread = _health(data, text_of(folder), stderr)
            except ValueError as e:
                summary["verdict"] = "unknown"
                lines = [f"nvidia-smi output not understood: {e}"]
            else:
                summary["verdict"] = health.verdict
                summary["problems"] = list(health.problems) + unread
                summary["missing_gpus"] = [g.model_dump() for g in health.missing]
                lines = summary_lines(health) + [f"- {u}" for u in unread]
                if "nvidia_smi" in missing:  # it failed, but said this much
                    summary["problems"].append(f"nvidia-smi exited {missing['nvidia_smi']}")
                    if summary["verdict"] == "healthy":
                        summary["verdict"] = "degraded"
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

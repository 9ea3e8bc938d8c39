"""A fake `dcgmi diag -r 2` for the lab's nodes: the node's health check after a repair.

The lab's inventory runs `python -m lab.dcgmi --lab-dir RUN --node gpuNN diag -r 2` as that
node's `slurmedic_health_check`. It answers at once (the real medium run takes about two
minutes) in the layout of DCGM 3.x's `dcgmi diag` (a Metadata, Deployment, Integration,
Hardware and Stress table, "Pass - All" or "Fail - GPU: n" per test with a Warning line naming
the GPU) and exits as dcgmi does: 0 when every test passed, 226 (DCGM_ST_NVVS_ERROR, -30) when
one failed. Which test a fault still on the node fails:
- a double-bit ECC fault or an ECC XID: GPU Memory; a row-remap failure: GPU Memory and
  Page Retirement/Row Remap;
- a PCIe fault: PCIe; an NVLink fault: PCIe too (DCGM's PCIe test checks the GPU's NVLinks);
- a GPU off the bus (XID 79, `gpu_lost`): PCIe, and every GPU test of that GPU;
- a thermal fault, any other XID, or `diag-fail` injected on the node: Diagnostic.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET

from lab.config import LabConfig
from lab.faults import GpuFault, NodeFaultKind, load_gpu_faults, off_the_bus
from lab.nvidia_smi import DBE_XIDS, SAMPLE

DCGM_VERSION = "3.3.8"
NVVS_ERROR = 226  # DCGM_ST_NVVS_ERROR (-30) as an exit code: the diagnostic found a failure
NAME_W, INFO_W = 25, 46
WRAP = 45
DEPLOYMENT = (
    "Denylist",
    "NVML Library",
    "CUDA Main Library",
    "Permissions and OS Blocks",
    "Persistence Mode",
    "Environment Variables",
    "Page Retirement/Row Remap",
    "Graphics Processes",
    "Inforom",
)
ROW_REMAP = "Page Retirement/Row Remap"
GPU_TESTS = ("PCIe", "GPU Memory", "Diagnostic")


def failures(fault: GpuFault) -> dict[str, str]:
    """The tests `fault` fails, each with its warning."""
    g = fault.gpu
    if off_the_bus(fault):
        lost = f"GPU {g} is not reachable: it has fallen off the bus."
        return dict.fromkeys(GPU_TESTS, lost)
    if fault.kind == "row_remap_failure":
        row = f"GPU {g} had uncorrectable memory errors and row remapping failed."
        return {ROW_REMAP: row, "GPU Memory": row}
    if fault.kind == "ecc_dbe" or (fault.kind == "xid" and fault.xid in DBE_XIDS):
        return {"GPU Memory": f"GPU {g} had uncorrectable (double-bit) ECC errors."}
    if fault.kind == "pcie":
        return {"PCIe": f"GPU {g} PCIe replays exceeded the threshold."}
    if fault.kind == "nvlink":
        return {"PCIe": f"GPU {g} NVLink CRC errors exceeded the threshold on link 0."}
    if fault.kind == "thermal":
        return {"Diagnostic": f"GPU {g} had thermal violations: clocks throttled at 92 C."}
    return {"Diagnostic": f"GPU {g} reported XID {fault.xid} during the diagnostic."}


def diagnose(
    faults: list[GpuFault], node_faults: set[NodeFaultKind], gpus: int
) -> dict[str, dict[int, str]]:
    """Test name to the failing GPUs and their warnings: what `dcgmi diag -r 2` finds."""
    failed: dict[str, dict[int, str]] = {}
    for f in faults:
        for test, warning in failures(f).items():
            failed.setdefault(test, {}).setdefault(f.gpu, warning)
    if "diag_fail" in node_faults:
        failed.setdefault("Diagnostic", {}).setdefault(
            0, "GPU 0 failed the diagnostic's compute check (injected: diag-fail)."
        )
    return {t: g for t, g in failed.items() if any(0 <= gpu < gpus for gpu in g)}


def _row(name: str, info: str) -> str:
    return f"| {name:<{NAME_W}} | {info:<{INFO_W}} |"


def _long(name: str, text: str) -> list[str]:
    """dcgmi splits a long message over rows of WRAP characters, the name on the first."""
    return [_row("" if i else name, text[i : i + WRAP]) for i in range(0, len(text), WRAP)]


def _section(name: str, edge: str) -> str:
    return f"{edge}-----  {name}  ".ljust(NAME_W + 3, "-") + "+" + "-" * (INFO_W + 2) + edge


def _gpu_list(gpus: list[int]) -> str:
    return ("GPU: " if len(gpus) == 1 else "GPUs: ") + ", ".join(map(str, gpus))


def render(failed: dict[str, dict[int, str]], gpus: int) -> str:
    root = ET.parse(SAMPLE).getroot()  # noqa: S314 - the repo's own vendored file
    driver = root.findtext("driver_version", "")
    device = (root.findtext("gpu/pci/pci_device_id", "") or "0000")[:4].lower()
    rule = "+" + "-" * (NAME_W + 2) + "+" + "-" * (INFO_W + 2) + "+"
    lines = [
        "Successfully ran diagnostic for group.",
        rule,
        _row("Diagnostic", "Result"),
        rule.replace("-", "="),
        _section("Metadata", "|"),
        _row("DCGM Version", DCGM_VERSION),
        _row("Driver Version Detected", driver),
        _row("GPU Device IDs Detected", ",".join([device] * gpus)),
        _section("Deployment", "|"),
    ]
    for check in DEPLOYMENT:
        lines.append(_row(check, "Fail" if check in failed else "Pass"))
        for warning in failed.get(check, {}).values():
            lines.extend(_long("Error", warning))
    for section, tests in (("Integration", ("PCIe",)), ("Hardware", GPU_TESTS[1:])):
        lines.append(_section(section, "+"))
        for test in tests:
            bad = failed.get(test, {})
            if not bad and test == "Diagnostic":
                continue  # dcgmi leaves out a test that was skipped
            if not bad:
                lines.append(_row(test, "Pass - All"))
                continue
            good = [g for g in range(gpus) if g not in bad]
            if good:
                lines.append(_row(test, f"Pass - {_gpu_list(good)}"))
            lines.append(_row("" if good else test, f"Fail - {_gpu_list(sorted(bad))}"))
            for _, warning in sorted(bad.items()):
                lines.extend(_long("Warning", warning))
    lines += [_section("Stress", "+"), rule]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dcgmi (slurmedic lab)")
    parser.add_argument("--lab-dir", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("command", choices=["diag"])
    parser.add_argument("-r", "--run", required=True, choices=["1", "2", "3", "4"])
    args = parser.parse_args(argv)
    cfg = LabConfig.from_env(args.lab_dir)
    faults, node_faults = load_gpu_faults(cfg.faults_file).of_node(args.node)
    failed = diagnose(faults, node_faults, cfg.gpus_per_node)
    sys.stdout.write(render(failed, cfg.gpus_per_node))
    return NVVS_ERROR if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""A fake `nvidia-smi -q -x` and `nvidia-smi nvlink -e` for the lab's nodes: a real H200's
output, one copy per GPU, with the lab's injected GPU faults showing where nvidia-smi would show
them.

`lab/data/nvidia-smi-h200.xml` is the output of a real H200 node (an H200's). The
lab's inventory runs `python -m lab.nvidia_smi --lab-dir RUN --node gpuNN` as that node's
nvidia-smi, so `collect_diagnostics` reads what it would read on a sick node:
- a double-bit ECC fault (or an XID meaning one) raises the volatile DRAM uncorrectable count;
- a row-remap failure sets `remapped_row_failure`; any other hardware XID asks for a reset;
- a thermal fault shows a hot GPU in HW thermal slowdown;
- XID 79 or a lost GPU drops the GPU from the output (it fell off the bus) with an error and a
  non-zero exit, as nvidia-smi does; the other GPUs keep their minor numbers and addresses,
  while nvidia-smi's index (the `GPU n` of `nvlink -e`) closes the gap;
- a PCIe fault raises `pci/replay_counter`, an NVLink fault the CRC and replay errors of the
  GPU's first link in `nvlink -e`: the same counts the fake dcgm-exporter serves at that moment
  (lab/dcgm_exporter.py gpu_values), so the diagnostics read what the alert saw.
The layout of `nvlink -e` is the real tool's (Volta to Hopper): a `GPU n: <name> (UUID: ...)`
line, then `\t Link n: <counter>: <count>` for Replay, Recovery and CRC errors, a blank line
between links; an H200 of an HGX board has 18 links.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from lab.config import LabConfig
from lab.dcgm_exporter import MODEL, gpu_bus_id, gpu_uuid, gpu_values
from lab.faults import GpuFault, load_gpu_faults

SAMPLE = Path(__file__).with_name("data") / "nvidia-smi-h200.xml"
HEADER = '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
DBE_XIDS = {48, 63, 64, 94, 95}
OFF_THE_BUS = {79}
NVLINKS = 18


def _set(gpu: ET.Element, path: str, value: str) -> None:
    el = gpu.find(path)
    if el is not None:
        el.text = value


def _apply(gpu: ET.Element, fault: GpuFault) -> None:
    """Show one fault on a GPU's element (its counters aside: gpu_values has those)."""
    if fault.kind == "ecc_dbe" or (fault.kind == "xid" and fault.xid in DBE_XIDS):
        for scope in ("volatile", "aggregate"):
            _set(gpu, f"ecc_errors/{scope}/dram_uncorrectable", str(fault.count))
        _set(gpu, "gpu_recovery_action", "Reset")
    elif fault.kind == "row_remap_failure":
        _set(gpu, "remapped_rows/remapped_row_unc", "1")
        _set(gpu, "remapped_rows/remapped_row_failure", "Yes")
        _set(gpu, "gpu_recovery_action", "Reset")
    elif fault.kind == "thermal":
        _set(gpu, "temperature/gpu_temp", "92 C")
        _set(gpu, "clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown", "Active")
        _set(gpu, "clocks_event_reasons/clocks_event_reason_hw_slowdown", "Active")
    elif fault.kind == "xid":
        _set(gpu, "gpu_recovery_action", "Reset")


def _present(cfg: LabConfig, node: str) -> tuple[list[tuple[int, list[GpuFault]]], list[str]]:
    """The node's GPUs nvidia-smi can reach (minor number, faults), and the errors it prints
    for the ones it cannot."""
    faults = [f for f in load_gpu_faults(cfg.faults_file).faults if f.node == node]
    present, errors = [], []
    for minor in range(cfg.gpus_per_node):
        mine = [f for f in faults if f.gpu == minor]
        if any(f.kind == "gpu_lost" or (f.kind == "xid" and f.xid in OFF_THE_BUS) for f in mine):
            bus = gpu_bus_id(minor)
            errors.append(f"Unable to determine the device handle for GPU{bus}: Unknown Error")
        else:
            present.append((minor, mine))
    return present, errors


def render(cfg: LabConfig, node: str, now: float | None = None) -> tuple[str, list[str]]:
    """The node's XML and the errors nvidia-smi would print for GPUs it cannot reach."""
    now = time.time() if now is None else now
    root = ET.parse(SAMPLE).getroot()  # noqa: S314 - the repo's own vendored file
    template = root.find("gpu")
    if template is None:
        raise ValueError(f"{SAMPLE} holds no <gpu>")
    root.remove(template)
    present, errors = _present(cfg, node)
    for minor, faults in present:
        gpu = copy.deepcopy(template)
        bus = gpu_bus_id(minor)
        gpu.set("id", bus)
        _set(gpu, "pci/pci_bus_id", bus)
        _set(gpu, "minor_number", str(minor))
        _set(gpu, "uuid", gpu_uuid(node, minor))
        _set(gpu, "serial", f"{node}{minor:04d}")
        replays = gpu_values(False, faults, now)["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]
        _set(gpu, "pci/replay_counter", str(int(replays)))
        for f in faults:
            _apply(gpu, f)
        root.append(gpu)
    _set(root, "attached_gpus", str(cfg.gpus_per_node))
    ET.indent(root, space="\t")
    return HEADER + ET.tostring(root, encoding="unicode") + "\n", errors


def render_nvlink_errors(
    cfg: LabConfig, node: str, now: float | None = None
) -> tuple[str, list[str]]:
    """`nvidia-smi nvlink -e` of the node, and the errors for GPUs it cannot reach."""
    now = time.time() if now is None else now
    present, errors = _present(cfg, node)
    lines = []
    for index, (minor, faults) in enumerate(present):
        v = gpu_values(False, faults, now)
        # nvidia-smi's one CRC count is the flit CRC; the lab's data CRC stays 0 (added anyway).
        crc = v["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]
        crc += v["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"]
        first = {
            "Replay Errors": v["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"],
            "Recovery Errors": v["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"],
            "CRC Errors": crc,
        }
        lines.append(f"GPU {index}: {MODEL} (UUID: {gpu_uuid(node, minor)})")
        for link in range(NVLINKS):
            if link:
                lines.append("")
            for name, count in first.items():
                lines.append(f"\t Link {link}: {name}: {int(count) if link == 0 else 0}")
    return "".join(f"{line}\n" for line in lines), errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi (slurmedic lab)")
    parser.add_argument("--lab-dir", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("command", nargs="?", choices=["nvlink"], help="nvlink -e")
    parser.add_argument("-q", action="store_true")
    parser.add_argument("-x", action="store_true")
    parser.add_argument("-e", action="store_true")
    args = parser.parse_args(argv)
    cfg = LabConfig.from_env(args.lab_dir)
    if args.command == "nvlink" and not args.e:
        parser.error("the lab's nvidia-smi knows `nvlink -e` only")
    draw = render_nvlink_errors if args.command == "nvlink" else render
    text, errors = draw(cfg, args.node)
    sys.stdout.write(text)
    for e in errors:
        print(e, file=sys.stderr)
    return 15 if errors else 0  # NVML's "GPU is lost"


if __name__ == "__main__":
    sys.exit(main())

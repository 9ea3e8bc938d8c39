"""A fake `nvidia-smi -q -x` for the lab's nodes: a real H200's output, one copy per GPU, with
the lab's injected GPU faults showing where nvidia-smi would show them.

`lab/data/nvidia-smi-h200.xml` is the output of a real H200 node (an H200's). The
lab's inventory runs `python -m lab.nvidia_smi --lab-dir RUN --node gpuNN` as that node's
nvidia-smi, so `collect_diagnostics` reads what it would read on a sick node:
- a double-bit ECC fault (or an XID meaning one) raises the volatile DRAM uncorrectable count;
- a row-remap failure sets `remapped_row_failure`; any other hardware XID asks for a reset;
- a thermal fault shows a hot GPU in HW thermal slowdown;
- XID 79 or a lost GPU drops the GPU from the output (it fell off the bus) with an error and a
  non-zero exit, as nvidia-smi does.
"""

from __future__ import annotations

import argparse
import copy
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from lab.config import LabConfig
from lab.dcgm_exporter import gpu_bus_id, gpu_uuid
from lab.faults import GpuFault, load_gpu_faults

SAMPLE = Path(__file__).with_name("data") / "nvidia-smi-h200.xml"
HEADER = '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
DBE_XIDS = {48, 63, 64, 94, 95}
OFF_THE_BUS = {79}


def _set(gpu: ET.Element, path: str, value: str) -> None:
    el = gpu.find(path)
    if el is not None:
        el.text = value


def _apply(gpu: ET.Element, fault: GpuFault) -> bool:
    """Show one fault on a GPU's element; False when the GPU is gone from the output."""
    if fault.kind == "gpu_lost" or (fault.kind == "xid" and fault.xid in OFF_THE_BUS):
        return False
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
    return True


def render(cfg: LabConfig, node: str) -> tuple[str, list[str]]:
    """The node's XML and the errors nvidia-smi would print for GPUs it cannot reach."""
    root = ET.parse(SAMPLE).getroot()  # noqa: S314 - the repo's own vendored file
    template = root.find("gpu")
    if template is None:
        raise ValueError(f"{SAMPLE} holds no <gpu>")
    root.remove(template)
    faults = [f for f in load_gpu_faults(cfg.faults_file).faults if f.node == node]
    errors = []
    for index in range(cfg.gpus_per_node):
        gpu = copy.deepcopy(template)
        bus = gpu_bus_id(index)
        gpu.set("id", bus)
        _set(gpu, "pci/pci_bus_id", bus)
        _set(gpu, "minor_number", str(index))
        _set(gpu, "uuid", gpu_uuid(node, index))
        _set(gpu, "serial", f"{node}{index:04d}")
        present = all(_apply(gpu, f) for f in faults if f.gpu == index)
        if present:
            root.append(gpu)
        else:
            errors.append(f"Unable to determine the device handle for GPU{bus}: Unknown Error")
    _set(root, "attached_gpus", str(cfg.gpus_per_node))
    ET.indent(root, space="\t")
    return HEADER + ET.tostring(root, encoding="unicode") + "\n", errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi (slurmedic lab)")
    parser.add_argument("--lab-dir", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("-q", action="store_true")
    parser.add_argument("-x", action="store_true")
    args = parser.parse_args(argv)
    text, errors = render(LabConfig.from_env(args.lab_dir), args.node)
    sys.stdout.write(text)
    for e in errors:
        print(e, file=sys.stderr)
    return 15 if errors else 0  # NVML's "GPU is lost"


if __name__ == "__main__":
    sys.exit(main())

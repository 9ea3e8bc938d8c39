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

`-r [-i N]` resets the node's GPUs (N: an index of the listing): it clears the faults a reset
clears (lab/faults.py `survives`), prints "GPU <bus id> was successfully reset." for each and
"All done.". A GPU off the bus cannot be reset: its "Unable to determine the device handle"
error and exit 15, the others are reset. The real tool refuses while processes use a GPU; the
lab's nodes have no GPU processes to see, so it refuses while the node runs a Slurm job (every
lab job uses all its node's GPUs): the real tool's "in use" lines, exit 255, nothing reset.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from lab import slurm
from lab.config import LabConfig
from lab.dcgm_exporter import MODEL, gpu_bus_id, gpu_uuid, gpu_values
from lab.faults import GpuFault, load_gpu_faults, off_the_bus, repair_gpu_faults

SAMPLE = Path(__file__).with_name("data") / "nvidia-smi-h200.xml"
HEADER = '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'
DBE_XIDS = {48, 63, 64, 94, 95}
NVLINKS = 18
LOST = 15  # NVML's "GPU is lost"
OTHER_ERROR = 255
IN_USE = (
    "{n} device{s} {verb} currently being used by one or more other processes (e.g., Fabric "
    "Manager, CUDA application, graphics application such as an X server, or a monitoring "
    "application such as another instance of nvidia-smi). Please first kill all processes using "
    "{this} device{s} and all compute applications running in the system."
)


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
        if any(off_the_bus(f) for f in mine):
            errors.append(handle_error(minor))
        else:
            present.append((minor, mine))
    return present, errors


def handle_error(minor: int) -> str:
    return f"Unable to determine the device handle for GPU{gpu_bus_id(minor)}: Unknown Error"


def reset(
    present: list[tuple[int, list[GpuFault]]], errors: list[str], index: int | None, busy: bool
) -> tuple[str, list[str], int, frozenset[int]]:
    """`nvidia-smi -r [-i index]` of a node: its stdout, its stderr lines, its exit code and the
    minor numbers of the GPUs it reset (their faults a reset clears are then to be removed)."""
    if index is not None:
        if not 0 <= index < len(present):
            return "", [f"No GPU found with index {index}"], 6, frozenset()  # NVML not found
        present, errors = [present[index]], []
    targets = [minor for minor, _ in present]
    if busy:
        n = len(targets)
        lines = [f"GPU {gpu_bus_id(m)} is currently in use by another process." for m in targets]
        many = (
            {"s": "s", "verb": "are", "this": "these"}
            if n > 1
            else {"s": "", "verb": "is", "this": "this"}
        )
        text = "\n".join([*lines, "", IN_USE.format(n=n, **many)]) + "\n"
        return text, errors, OTHER_ERROR, frozenset()
    out = "".join(f"GPU {gpu_bus_id(m)} was successfully reset.\n" for m in targets)
    return out + "All done.\n", errors, LOST if errors else 0, frozenset(targets)


def node_busy(cfg: LabConfig, node: str) -> bool:
    """Whether a job runs on the node (or is still ending there): the lab's "processes use the
    GPUs"."""
    jobs = slurm.slurm(cfg, "squeue", "-h", "-w", node, "-t", "RUNNING,COMPLETING", "-o", "%i")
    return bool(jobs.strip())


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


def _reset(cfg: LabConfig, node: str, index: int | None) -> int:
    present, errors = _present(cfg, node)
    try:
        busy = node_busy(cfg, node)
    except slurm.LabError as err:
        print(f"the lab cannot tell whether {node} runs a job: {err}", file=sys.stderr)
        return OTHER_ERROR
    text, errors, code, done = reset(present, errors, index, busy)
    if done:
        repair_gpu_faults(cfg.faults_file, node, "reset", done)
    sys.stdout.write(text)
    for e in errors:
        print(e, file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi (slurmedic lab)")
    parser.add_argument("--lab-dir", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("command", nargs="?", choices=["nvlink"], help="nvlink -e")
    parser.add_argument("-q", action="store_true")
    parser.add_argument("-x", action="store_true")
    parser.add_argument("-e", action="store_true")
    parser.add_argument("-r", "--gpu-reset", action="store_true")
    parser.add_argument("-i", "--id", type=int, help="the GPU's index (-r only)")
    args = parser.parse_args(argv)
    cfg = LabConfig.from_env(args.lab_dir)
    if args.gpu_reset:
        return _reset(cfg, args.node, args.id)
    if args.id is not None:
        parser.error("the lab's nvidia-smi takes -i with -r only")
    if args.command == "nvlink" and not args.e:
        parser.error("the lab's nvidia-smi knows `nvlink -e` only")
    draw = render_nvlink_errors if args.command == "nvlink" else render
    text, errors = draw(cfg, args.node)
    sys.stdout.write(text)
    for e in errors:
        print(e, file=sys.stderr)
    return LOST if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""A fake dcgm-exporter: one endpoint per lab node, the real metric names and labels.

There are no GPUs here, so values are modelled on a real H200 (lab/data/nvidia-smi-h200.xml):
idle at 35 C and 125 W, loaded while a Slurm job holds the node. Faults injected with `slurmedic lab
inject` change the series the way DCGM would: the XID gauge holds the *last* code,
DCGM_EXP_XID_ERRORS_COUNT counts XIDs in a 5-minute window, error counters only grow, and a
GPU that fell off the bus disappears. `hpc_job` comes from the real Slurm job on the node, as
dcgm-exporter's HPC job mapping would give it.
"""

from __future__ import annotations

import time
import uuid

from lab.config import LabConfig
from lab.faults import GpuFault, load_gpu_faults
from lab.serve import serve_forever
from lab.slurm_view import SlurmView

MODEL = "NVIDIA H200"
DRIVER = "580.159.04"
XID_WINDOW_S = 300.0
# Clock event reason bits (nvml): GPU idle, SW thermal slowdown, HW thermal slowdown.
REASON_IDLE, REASON_SW_THERMAL, REASON_HW_THERMAL = 0x1, 0x20, 0x40

XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
XID_COUNT_HELP = (
    "Count of XID Errors within user-specified time window (see xid-count-window-size param)."
)
GAUGES = {
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_MEMORY_TEMP": "Memory temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "Whether remapping of rows has failed",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "Current clock event reasons (bitmask).",
}
COUNTERS = {
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "Total number of PCIe retries.",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "Total number of single-bit volatile ECC errors.",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "Total number of double-bit volatile ECC errors.",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "Number of remapped rows for uncorrectable errors",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "Number of remapped rows for correctable errors",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "Total number of NVLink flow-control CRC errors.",  # noqa: E501
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "Total number of NVLink data CRC errors.",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "Total number of NVLink retries.",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "Total number of NVLink recovery errors.",
    "DCGM_FI_DEV_POWER_VIOLATION": "Throttling duration due to power constraints (in us).",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "Throttling duration due to thermal constraints (in us).",
}


def gpu_uuid(node: str, gpu: int) -> str:
    """A lab GPU's stable identity, the same in the fake dcgm-exporter and the fake nvidia-smi."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.{gpu}.slurmedic-lab')}"


def gpu_bus_id(gpu: int) -> str:
    return f"00000000:{0x18 + gpu * 0x10:02X}:00.0"


def gpu_values(busy: bool, faults: list[GpuFault], now: float) -> dict[str, float]:
    """The value of every metric of one GPU at `now`, given its job load and its faults."""
    v: dict[str, float] = {
        "DCGM_FI_DEV_SM_CLOCK": 1980,
        "DCGM_FI_DEV_MEM_CLOCK": 3201,
        "DCGM_FI_DEV_GPU_TEMP": 62 if busy else 35,
        "DCGM_FI_DEV_MEMORY_TEMP": 58 if busy else 36,
        "DCGM_FI_DEV_POWER_USAGE": 612.4 if busy else 124.62,
        "DCGM_FI_DEV_GPU_UTIL": 98 if busy else 0,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.93 if busy else 0.0,
        "DCGM_FI_DEV_XID_ERRORS": 0,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0 if busy else REASON_IDLE,
        **dict.fromkeys(COUNTERS, 0.0),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 1,  # the real H200 shows one replay since reset
    }
    for f in faults:  # in injection order: the last XID wins the gauge, as in DCGM
        elapsed = max(0.0, now - f.at)
        if f.kind == "xid" and f.xid is not None:
            v["DCGM_FI_DEV_XID_ERRORS"] = f.xid
        elif f.kind == "ecc_dbe":
            v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] += f.count
            v["DCGM_FI_DEV_XID_ERRORS"] = 48  # a DBE is reported as XID 48
        elif f.kind == "row_remap_failure":
            v["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = 1
            v["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] += f.count
        elif f.kind == "nvlink":
            v["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] += int(f.rate * elapsed)
            v["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"] += int(f.rate * elapsed / 4)
        elif f.kind == "pcie":
            v["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] += int(f.rate * elapsed)
        elif f.kind == "thermal":
            v["DCGM_FI_DEV_THERMAL_VIOLATION"] += int(elapsed * 1e6)
            v["DCGM_FI_DEV_GPU_TEMP"] = 91
            v["DCGM_FI_DEV_MEMORY_TEMP"] = 95
            v["DCGM_FI_DEV_SM_CLOCK"] = 1095
            v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] = (
                int(v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]) | REASON_SW_THERMAL | REASON_HW_THERMAL
            )
    return v


def xid_counts(faults: list[GpuFault], now: float) -> dict[int, int]:
    counts: dict[int, int] = {}
    for f in faults:
        code = f.xid if f.kind == "xid" else 48 if f.kind == "ecc_dbe" else None
        if code is not None and now - f.at <= XID_WINDOW_S:
            counts[code] = counts.get(code, 0) + 1
    return counts


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: list[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


class NodeExporter:
    """Renders one node's /metrics the way dcgm-exporter does.

    Written out by hand rather than with prometheus-client, which renames counters to end in
    `_total` (DCGM_FI_DEV_PCIE_REPLAY_COUNTER would become ..._COUNTER_total): the point of a
    fake exporter is to be byte-for-byte the names the real one serves.
    """

    def __init__(self, cfg: LabConfig, node: str, view: SlurmView) -> None:
        self.cfg, self.node, self.view = cfg, node, view
        self.uuids = [gpu_uuid(node, g) for g in range(cfg.gpus_per_node)]

    def gpu_labels(self, gpu: int, job: int | None, host: str) -> list[tuple[str, str]]:
        labels = [
            ("gpu", str(gpu)),
            ("UUID", self.uuids[gpu]),
            ("pci_bus_id", gpu_bus_id(gpu)),
            ("device", f"nvidia{gpu}"),
            ("modelName", MODEL),
            (self.cfg.dcgm_host_label, host),
            ("DCGM_FI_DRIVER_VERSION", DRIVER),
        ]
        return [*labels, ("hpc_job", str(job))] if job is not None else labels

    def render(self) -> str:
        now = time.time()
        try:
            domain = self.cfg.dcgm_domain_file.read_text().strip()
        except OSError:
            domain = ""
        # As its host label says: Slurm's name, or with the lab's domain (`lab dcgm-domain`).
        host = f"{self.node}.{domain}" if domain else self.node
        faults = [f for f in load_gpu_faults(self.cfg.faults_file).faults if f.node == self.node]
        job = self.view.job_on(self.node)
        samples: dict[str, list[str]] = {name: [] for name in (*GAUGES, *COUNTERS, XID_COUNT)}
        for gpu in range(self.cfg.gpus_per_node):
            mine = sorted((f for f in faults if f.gpu == gpu), key=lambda f: f.at)
            if any(f.kind == "gpu_lost" for f in mine):
                continue  # fell off the bus: DCGM cannot read it any more
            labels = self.gpu_labels(gpu, job, host)
            for name, value in gpu_values(job is not None, mine, now).items():
                samples[name].append(f"{name}{{{_labels(labels)}}} {value:g}")
            for code, n in sorted(xid_counts(mine, now).items()):
                extra = [("window_size_in_ms", str(int(XID_WINDOW_S * 1000))), ("xid", str(code))]
                samples[XID_COUNT].append(f"{XID_COUNT}{{{_labels([*labels, *extra])}}} {n}")
        lines = []
        for name, rows in samples.items():
            if not rows:
                continue
            kind = "counter" if name in COUNTERS else "gauge"
            help_ = {**GAUGES, **COUNTERS}.get(name, XID_COUNT_HELP)
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *rows]
        return "\n".join(lines) + "\n"


def main() -> None:
    cfg = LabConfig.from_env()
    view = SlurmView(cfg, with_nodes=False)
    serve_forever({cfg.dcgm_port(n): NodeExporter(cfg, n, view).render for n in cfg.nodes})


if __name__ == "__main__":
    main()

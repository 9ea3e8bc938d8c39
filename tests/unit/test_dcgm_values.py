"""The fake DCGM exporter models DCGM's semantics: last-code XID gauge, growing counters."""

from pathlib import Path

from lab.dcgm_exporter import XID_WINDOW_S, gpu_values, xid_counts
from lab.faults import GpuFault

T0 = 1_800_000_000.0


def fault(kind: str, at: float = T0, **kw: object) -> GpuFault:
    return GpuFault(node="gpu01", gpu=0, kind=kind, at=at, **kw)  # type: ignore[arg-type]


def test_healthy_idle_gpu_matches_the_h200_reading() -> None:
    v = gpu_values(busy=False, faults=[], now=T0)
    assert v["DCGM_FI_DEV_XID_ERRORS"] == 0
    assert v["DCGM_FI_DEV_GPU_TEMP"] == 35
    assert v["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == 1
    assert v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 1  # GPU idle bit
    assert v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 0


def test_busy_gpu_is_loaded() -> None:
    v = gpu_values(busy=True, faults=[], now=T0)
    assert v["DCGM_FI_DEV_GPU_UTIL"] > 90
    assert v["DCGM_FI_DEV_POWER_USAGE"] > 500


def test_xid_gauge_holds_the_last_code_not_a_count() -> None:
    faults = [fault("xid", xid=13), fault("xid", at=T0 + 5, xid=79)]
    assert gpu_values(True, faults, T0 + 3600)["DCGM_FI_DEV_XID_ERRORS"] == 79
    # The same code twice leaves the gauge unchanged: the trap rules must live with.
    same = [fault("xid", xid=79), fault("xid", at=T0 + 5, xid=79)]
    assert gpu_values(True, same, T0 + 10)["DCGM_FI_DEV_XID_ERRORS"] == 79


def test_xid_count_counts_per_code_within_the_window() -> None:
    faults = [
        fault("xid", xid=79),
        fault("xid", at=T0 + 1, xid=79),
        fault("xid", at=T0 + 2, xid=13),
    ]
    assert xid_counts(faults, T0 + 10) == {79: 2, 13: 1}
    assert xid_counts(faults, T0 + XID_WINDOW_S + 5) == {}


def test_double_bit_ecc_counts_and_reports_xid_48() -> None:
    v = gpu_values(True, [fault("ecc_dbe", count=2)], T0)
    assert v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 2
    assert v["DCGM_FI_DEV_XID_ERRORS"] == 48


def test_rising_counters_only_grow() -> None:
    faults = [fault("nvlink", rate=10), fault("pcie", rate=5), fault("thermal")]
    earlier, later = gpu_values(True, faults, T0 + 2), gpu_values(True, faults, T0 + 4)
    for name in (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
    ):
        assert later[name] > earlier[name] > 0, name
    assert later["DCGM_FI_DEV_SM_CLOCK"] < 1980  # throttled


def test_row_remap_failure() -> None:
    v = gpu_values(True, [fault("row_remap_failure")], T0)
    assert v["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 1
    assert v["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] == 1


class _View:
    def __init__(self, job: int | None) -> None:
        self.job = job

    def job_on(self, node: str) -> int | None:
        return self.job


def test_rendered_exposition_keeps_dcgm_names_and_labels(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from lab.config import LabConfig
    from lab.dcgm_exporter import NodeExporter
    from lab.faults import add_gpu_fault

    cfg = LabConfig(run_dir=tmp_path, dcgm_host_label="hostname")
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu02", gpu=4, kind="xid", xid=79, at=T0))
    add_gpu_fault(cfg.faults_file, GpuFault(node="gpu02", gpu=6, kind="gpu_lost", at=T0))
    text = NodeExporter(cfg, "gpu02", _View(1234)).render()  # type: ignore[arg-type]
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    # Counters keep dcgm-exporter's names: no `_total` appended.
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER{" in text
    assert "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter" in text
    xid = {s.labels["gpu"]: s for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert sorted(xid) == ["0", "1", "2", "3", "4", "5", "7"]  # GPU 6 is gone
    assert xid["4"].value == 79 and xid["0"].value == 0
    assert xid["4"].labels["hostname"] == "gpu02" and xid["4"].labels["hpc_job"] == "1234"
    assert list(xid["4"].labels)[:5] == ["gpu", "UUID", "pci_bus_id", "device", "modelName"]
    counts = fams["DCGM_EXP_XID_ERRORS_COUNT"].samples
    assert [(s.labels["gpu"], s.labels["xid"], s.value) for s in counts] == [("4", "79", 1.0)]


def test_no_job_no_hpc_job_label(tmp_path: Path) -> None:
    from lab.config import LabConfig
    from lab.dcgm_exporter import NodeExporter

    text = NodeExporter(LabConfig(run_dir=tmp_path), "gpu01", _View(None)).render()  # type: ignore[arg-type]
    assert "hpc_job" not in text and 'Hostname="gpu01"' in text

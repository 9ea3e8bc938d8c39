"""GPU names, missing GPUs, NVLink and PCIe counters in the diagnostics: an eight-GPU node made
of the real H200 sample (lab/data/nvidia-smi-h200.xml) and `nvidia-smi nvlink -e` text in the
layout the real tool prints (tab, space, one counter a line, a blank line between links)."""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from webhook.diagnostics.gpus import (
    MissingGpu,
    gpu_name,
    lost_bus_ids,
    missing_gpus,
    normal_bus_id,
)
from webhook.diagnostics.nvlink import parse_nvlink_errors
from webhook.diagnostics.nvsmi import (
    PCIE_REPLAYS_UNHEALTHY,
    parse_nvidia_smi_xml,
    summary_lines,
    with_missing,
)

SAMPLE = Path(__file__).resolve().parents[2] / "lab" / "data" / "nvidia-smi-h200.xml"
COUNTERS = ("Replay Errors", "Recovery Errors", "CRC Errors")


def bus(minor: int) -> str:
    return f"00000000:{0x18 + minor * 0x10:02X}:00.0"


def uuid(minor: int) -> str:
    return f"GPU-00000000-0000-0000-0000-00000000000{minor}"


def node_xml(minors: list[int], **fields: dict[str, str]) -> str:
    """The real sample's GPU once per minor number, with its own address and UUID; `fields`
    maps `m<minor>` to paths under <gpu> and their text."""
    root = ET.fromstring(SAMPLE.read_text())
    template = root.find("gpu")
    assert template is not None
    root.remove(template)
    for minor in minors:
        gpu = copy.deepcopy(template)
        gpu.set("id", bus(minor))
        values = {
            "minor_number": str(minor),
            "pci/pci_bus_id": bus(minor),
            "uuid": uuid(minor),
            **fields.get(f"m{minor}", {}),
        }
        for path, value in values.items():
            el = gpu.find(path)
            assert el is not None, f"the sample has no gpu/{path}"
            el.text = value
        root.append(gpu)
    attached = root.find("attached_gpus")
    assert attached is not None
    attached.text = "8"
    return ET.tostring(root, encoding="unicode")


def nvlink_text(minors: list[int], faults: dict[tuple[int, int], dict[str, int]]) -> str:
    """`nvidia-smi nvlink -e` of the listed GPUs (18 links each): `GPU n` is the place in the
    listing, as nvidia-smi numbers it; `faults` maps (minor, link) to non-zero counters."""
    out = []
    for index, minor in enumerate(minors):
        out.append(f"GPU {index}: NVIDIA H200 (UUID: {uuid(minor)})")
        for link in range(18):
            if link:
                out.append("")
            for name in COUNTERS:
                out.append(f"\t Link {link}: {name}: {faults.get((minor, link), {}).get(name, 0)}")
    return "\n".join(out) + "\n"


ALL = list(range(8))
WITHOUT_3 = [0, 1, 2, 4, 5, 6, 7]
LOST_3 = f"Unable to determine the device handle for GPU{bus(3)}: Unknown Error\n"


# --- a healthy node ---------------------------------------------------------------------


def test_a_healthy_node_with_its_nvlink_counters_at_zero() -> None:
    h = parse_nvidia_smi_xml(node_xml(ALL), nvlink_text(ALL, {}))
    h = with_missing(h, 8, lost_bus_ids(""))
    assert (h.verdict, h.problems, h.missing) == ("healthy", [], [])
    assert [(g.minor_number, g.pci_bus_id) for g in h.gpus] == [(m, bus(m)) for m in ALL]
    # Every link read, none counting: the readings are there, not merely absent.
    assert all(len(g.nvlink_errors) == 18 for g in h.gpus)
    assert h.gpus[5].nvlink_errors[17].counters == dict.fromkeys(COUNTERS, 0)
    # The real H200 shows one PCIe replay since reset: normal, below the threshold.
    assert {(g.pcie_replays, g.pcie_replay_rollovers) for g in h.gpus} == {(1, 0)}
    assert summary_lines(h)[:2] == [
        "node: healthy; driver 580.159.04, CUDA 13.0, 8 GPUs",
        f"GPU 0 ({bus(0)}): healthy, 35 C, 125 W",
    ]


# --- a missing GPU ----------------------------------------------------------------------


def test_a_missing_gpu_is_reported_by_its_minor_and_address_not_renumbered() -> None:
    """GPU 3 fell off the bus (XID 79): the GPU after it keeps its name, GPU 4."""
    h = parse_nvidia_smi_xml(node_xml(WITHOUT_3))
    assert h.verdict == "healthy"  # the listing alone cannot tell
    h = with_missing(h, 8, lost_bus_ids(LOST_3))
    assert h.verdict == "unhealthy"
    assert h.missing == [MissingGpu(minor_number=3, pci_bus_id=bus(3))]
    assert h.problems == [
        "nvidia-smi shows 7 of 8 GPUs",
        f"GPU 3 ({bus(3)}): missing from nvidia-smi's listing",
    ]
    lines = summary_lines(h)
    assert lines[0] == "node: unhealthy; driver 580.159.04, CUDA 13.0, 7 GPUs shown, 1 missing"
    # The fourth GPU listed is GPU 4 at 58:00.0, not "GPU 3".
    assert lines[4] == f"GPU 4 ({bus(4)}): healthy, 35 C, 125 W"
    assert lines[-2:] == [f"- {p}" for p in h.problems]
    assert f"GPU 3 ({bus(3)}): missing" in lines
    assert not any(line.startswith("GPU 3 ") and "healthy" in line for line in lines)


def test_a_gpu_missing_against_slurms_count_alone_is_named_by_its_minor() -> None:
    """The driver counts 7 (the GPU was gone at boot) and says nothing on stderr: Slurm's
    gres of 8 is what shows one missing, and the absent minor names it."""
    xml = node_xml(WITHOUT_3).replace("<attached_gpus>8<", "<attached_gpus>7<")
    h = with_missing(parse_nvidia_smi_xml(xml), 8, [])
    assert h.missing == [MissingGpu(minor_number=3, pci_bus_id=None)]
    assert h.problems[1] == "GPU 3: missing from nvidia-smi's listing"


def test_several_missing_gpus_are_not_paired_by_guess() -> None:
    lost = [bus(3), bus(6)]
    gone = missing_gpus([(m, bus(m)) for m in (0, 1, 2, 4, 5, 7)], 8, lost)
    assert gone == [MissingGpu(minor_number=m, pci_bus_id=None) for m in (3, 6)]
    # Minors that do not run 0..N-1 cannot say which are gone: the addresses do.
    gone = missing_gpus([(m, bus(m)) for m in (0, 1, 2, 4, 5, 9)], 8, lost)
    assert gone == [MissingGpu(minor_number=None, pci_bus_id=b) for b in lost]
    assert missing_gpus([(m, bus(m)) for m in ALL], 8, []) == []


def test_gpu_names_and_addresses() -> None:
    assert gpu_name(4, bus(4)) == "GPU 4 (00000000:58:00.0)"
    assert gpu_name(None, bus(4)) == "GPU at 00000000:58:00.0"
    # The kernel's spelling and dcgm-exporter's are the same GPU.
    assert normal_bus_id("0000:3b:00.0") == normal_bus_id("00000000:3B:00.0") == "00000000:3B:00.0"
    assert normal_bus_id("no address") is None
    assert lost_bus_ids(LOST_3 + LOST_3) == [bus(3)]


# --- NVLink -----------------------------------------------------------------------------


def test_nvlink_crc_errors_make_the_gpu_unhealthy_and_name_it_by_uuid() -> None:
    """GPU 4's link 7 counts CRC and replay errors; with GPU 3 gone nvidia-smi calls GPU 4
    `GPU 3` in `nvlink -e`: the UUID, not that number, says whose link it is."""
    faults = {(4, 7): {"CRC Errors": 37, "Replay Errors": 9}}
    h = parse_nvidia_smi_xml(node_xml(WITHOUT_3), nvlink_text(WITHOUT_3, faults))
    assert h.verdict == "unhealthy"
    assert h.problems == [
        f"GPU 4 ({bus(4)}): NVLink errors: link 7 CRC Errors 37, Replay Errors 9."
    ]
    bad = [g for g in h.gpus if g.verdict != "healthy"]
    assert [g.minor_number for g in bad] == [4]


def test_nvlink_recovery_errors_alone_are_unhealthy() -> None:
    faults = {(0, 0): {"Recovery Errors": 1}, (0, 17): {"Recovery Errors": 2}}
    h = parse_nvidia_smi_xml(node_xml(ALL), nvlink_text(ALL, faults))
    assert h.problems == [
        f"GPU 0 ({bus(0)}): NVLink errors: link 0 Recovery Errors 1; link 17 Recovery Errors 2."
    ]


def test_an_nvlink_block_without_uuid_goes_by_nvidia_smis_index() -> None:
    text = "GPU 1: NVIDIA GB300\n\t Link 0: Replay Errors: 4\n\t Link 0: CRC Errors: 0\n"
    h = parse_nvidia_smi_xml(node_xml([0, 1]), text)
    assert h.problems == [f"GPU 1 ({bus(1)}): NVLink errors: link 0 Replay Errors 4."]


def test_the_nvlink_parser_keeps_every_counter_and_refuses_stray_lines() -> None:
    gpus = parse_nvlink_errors(nvlink_text([2], {(2, 5): {"CRC Errors": 3}}))
    assert [(g.index, g.uuid, len(g.links)) for g in gpus] == [(0, uuid(2), 18)]
    assert gpus[0].links[5].counters == {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 3}
    # A counter other drivers print is kept, not judged.
    other = parse_nvlink_errors("GPU 0: NVIDIA GB200 (UUID: GPU-1)\n\t Link 0: Rx Errors: 3\n")
    assert other[0].links[0].counters == {"Rx Errors": 3}
    assert parse_nvlink_errors("") == []
    with pytest.raises(ValueError, match="line 1: a link counter before any 'GPU n:' line"):
        parse_nvlink_errors("\t Link 0: CRC Errors: 3\n")


def test_a_gpu_on_no_nvlink_is_not_a_fault() -> None:
    # The real PCIe H200 has no link: nvidia-smi prints the GPU line and no counter.
    h = parse_nvidia_smi_xml(SAMPLE.read_text(), "GPU 0: NVIDIA H200 (UUID: GPU-999f9108)\n")
    assert (h.verdict, h.gpus[0].nvlink_errors) == ("healthy", [])


# --- PCIe -------------------------------------------------------------------------------


def test_pcie_replays_at_the_threshold_are_unhealthy() -> None:
    below = {"m2": {"pci/replay_counter": str(PCIE_REPLAYS_UNHEALTHY - 1)}}
    assert parse_nvidia_smi_xml(node_xml(ALL, **below)).verdict == "healthy"
    at = {"m2": {"pci/replay_counter": "1500"}}
    h = parse_nvidia_smi_xml(node_xml(ALL, **at))
    assert h.verdict == "unhealthy"
    assert h.problems == [
        f"GPU 2 ({bus(2)}): 1500 PCIe replays since reset (threshold {PCIE_REPLAYS_UNHEALTHY})."
    ]


def test_a_pcie_replay_rollover_is_unhealthy() -> None:
    h = parse_nvidia_smi_xml(node_xml(ALL, m6={"pci/replay_rollover_counter": "2"}))
    assert h.problems == [f"GPU 6 ({bus(6)}): The PCIe replay number rolled over 2 time(s)."]

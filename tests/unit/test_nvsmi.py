"""nvidia-smi -q -x parsing: the real H200 sample, and mutated copies of it for each rule."""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from pydantic import ValidationError

from webhook.diagnostics.nvsmi import (
    CORRECTABLE_REMAPPED_ROWS_DEGRADED,
    VOLATILE_SBE_DEGRADED,
    NodeHealth,
    parse_nvidia_smi_xml,
    summary_lines,
)

# A real H200's output (shared/reference/h200/nvidia-smi-q.xml), vendored for the lab.
SAMPLE = Path(__file__).resolve().parents[2] / "lab" / "data" / "nvidia-smi-h200.xml"
BUS = "00000000:00:06.0"


@pytest.fixture(scope="module")
def sample() -> str:
    return SAMPLE.read_text()


def edit(xml: str, **fields: str) -> str:
    """The XML with the first GPU's fields set; keys are paths under <gpu>, `__` for `/`."""
    root = ET.fromstring(xml)
    gpu = root.find("gpu")
    assert gpu is not None
    for key, value in fields.items():
        el = gpu.find(key.replace("__", "/"))
        assert el is not None, f"the sample has no gpu/{key}: the mutation would be a no-op"
        el.text = value
    return ET.tostring(root, encoding="unicode")


def replace_once(xml: str, old: str, new: str) -> str:
    assert xml.count(old) == 1, f"{old!r} occurs {xml.count(old)} times"
    return xml.replace(old, new)


def verdict_and_problems(xml: str) -> tuple[str, list[str]]:
    h = parse_nvidia_smi_xml(xml)
    return h.gpus[0].verdict, h.gpus[0].problems


# --- the real sample --------------------------------------------------------------------


def test_the_real_h200_sample_is_healthy(sample: str) -> None:
    h = parse_nvidia_smi_xml(sample)
    assert (h.driver_version, h.cuda_version) == ("580.159.04", "13.0")
    assert h.timestamp == "Sun Nov 29 22:03:08 2026"
    assert (h.verdict, h.problems) == ("healthy", [])
    assert len(h.gpus) == 1
    g = h.gpus[0]
    assert (g.index, g.pci_bus_id, g.product_name) == (0, BUS, "NVIDIA H200")
    assert g.uuid == "GPU-999f9108-de9b-6cd1-d08b-ab05a82442aa"
    assert g.serial == "1654524156016"
    assert (g.temperature_c, g.power_draw_w) == (35.0, 124.52)
    assert (g.ecc_mode, g.persistence_mode) == ("Enabled", "Enabled")
    assert (g.ecc_volatile_dbe, g.ecc_volatile_sbe) == (0, 0)
    assert (g.ecc_aggregate_dbe, g.ecc_aggregate_sbe) == (0, 0)
    # Hopper remaps rows instead of retiring pages: retirement is N/A in the sample.
    assert (g.retired_pages_dbe, g.retired_pages_sbe, g.retired_pages_pending) == (None,) * 3
    assert (g.remapped_rows_correctable, g.remapped_rows_uncorrectable) == (0, 0)
    assert (g.remapped_rows_pending, g.remapped_rows_failure) == (False, False)
    # An idle GPU: "GPU idle" is the one active clock reason, and it is no problem.
    assert g.clock_event_reasons_active == ["gpu_idle"]
    # A PCIe GPU on no NVLink fabric: N/A, so no fabric rule applies.
    assert (g.fabric_state, g.fabric_status) == (None, None)
    assert (g.recovery_action, g.unrepairable_memory, g.error_fields) == ("None", False, [])
    assert (g.verdict, g.problems) == ("healthy", [])


def test_bytes_parse_like_text(sample: str) -> None:
    assert parse_nvidia_smi_xml(sample.encode()) == parse_nvidia_smi_xml(sample)
    assert parse_nvidia_smi_xml(b"\xef\xbb\xbf" + sample.encode()).verdict == "healthy"


def test_summary_of_the_sample(sample: str) -> None:
    assert summary_lines(parse_nvidia_smi_xml(sample)) == [
        "node: healthy; driver 580.159.04, CUDA 13.0, 1 GPU",
        f"GPU 0 ({BUS}): healthy, 35 C, 125 W",
    ]


def test_results_are_frozen(sample: str) -> None:
    h = parse_nvidia_smi_xml(sample)
    with pytest.raises(ValidationError):
        h.verdict = "unhealthy"
    with pytest.raises(ValidationError):
        h.gpus[0].verdict = "unhealthy"


# --- unhealthy rules --------------------------------------------------------------------


@pytest.mark.parametrize(
    "counter", ["dram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded"]
)
def test_volatile_uncorrectable_ecc_is_unhealthy(sample: str, counter: str) -> None:
    xml = edit(sample, **{f"ecc_errors__volatile__{counter}": "2"})
    h = parse_nvidia_smi_xml(xml)
    assert h.gpus[0].ecc_volatile_dbe == 2
    assert h.verdict == "unhealthy"
    assert h.problems == [
        f"GPU 0 ({BUS}): 2 uncorrectable (double-bit) ECC error(s) since the driver loaded; "
        "the GPU needs a reset."
    ]


def test_pending_remap_with_uncorrectable_rows_is_unhealthy(sample: str) -> None:
    xml = edit(
        sample, remapped_rows__remapped_row_unc="1", remapped_rows__remapped_row_pending="Yes"
    )
    verdict, problems = verdict_and_problems(xml)
    assert verdict == "unhealthy"
    assert problems == [
        "A row remap is pending after 1 uncorrectable error row(s); "
        "the GPU needs a reset to apply it."
    ]


def test_pending_remap_alone_is_unhealthy(sample: str) -> None:
    verdict, problems = verdict_and_problems(
        edit(sample, remapped_rows__remapped_row_pending="Yes")
    )
    assert verdict == "unhealthy"
    assert problems == ["A row remap is pending; the GPU needs a reset to apply it."]


def test_uncorrectable_remapped_rows_already_applied_are_healthy(sample: str) -> None:
    # Remapped at the last reset, nothing pending: the memory is repaired.
    h = parse_nvidia_smi_xml(edit(sample, remapped_rows__remapped_row_unc="1"))
    assert h.gpus[0].remapped_rows_uncorrectable == 1
    assert h.verdict == "healthy"


def test_row_remap_failure_is_unhealthy(sample: str) -> None:
    verdict, problems = verdict_and_problems(
        edit(sample, remapped_rows__remapped_row_failure="Yes")
    )
    assert verdict == "unhealthy"
    assert problems == ["A row remap failed; the GPU memory cannot repair itself."]


@pytest.mark.parametrize("tag", ["pending_retirement", "pending_blacklist"])
def test_pending_page_retirement_is_unhealthy(sample: str, tag: str) -> None:
    xml = edit(sample, **{f"retired_pages__{tag}": "Yes"})
    h = parse_nvidia_smi_xml(xml)
    assert h.gpus[0].retired_pages_pending is True
    assert h.verdict == "unhealthy"
    assert h.gpus[0].problems == ["Page retirement is pending; the GPU needs a reset."]


def test_retired_page_counts_parse(sample: str) -> None:
    xml = edit(
        sample,
        retired_pages__double_bit_retirement__retired_count="3",
        retired_pages__multiple_single_bit_retirement__retired_count="5",
        retired_pages__pending_retirement="No",
    )
    g = parse_nvidia_smi_xml(xml).gpus[0]
    assert (g.retired_pages_dbe, g.retired_pages_sbe, g.retired_pages_pending) == (3, 5, False)
    assert g.verdict == "healthy"


@pytest.mark.parametrize(
    ("state", "status"),
    [("In Progress", "N/A"), ("Not Started", "N/A"), ("Completed", "Insufficient Resources")],
)
def test_fabric_not_completed_is_unhealthy(sample: str, state: str, status: str) -> None:
    xml = edit(sample, fabric__state=state, fabric__status=status)
    verdict, problems = verdict_and_problems(xml)
    assert verdict == "unhealthy"
    assert len(problems) == 1
    assert problems[0].startswith(f"NVLink fabric state is {state!r}")


def test_fabric_completed_with_success_is_healthy(sample: str) -> None:
    g = parse_nvidia_smi_xml(edit(sample, fabric__state="Completed", fabric__status="Success"))
    assert (g.gpus[0].fabric_state, g.gpus[0].fabric_status) == ("Completed", "Success")
    assert g.verdict == "healthy"


@pytest.mark.parametrize(
    "error", ["Unknown Error", "[Unknown Error]", "GPU requires reset", "[GPU is lost]"]
)
def test_nvml_errors_in_fields_are_unhealthy(sample: str, error: str) -> None:
    xml = edit(sample, temperature__gpu_temp=error, uuid=error)
    g = parse_nvidia_smi_xml(xml).gpus[0]
    assert (g.temperature_c, g.uuid) == (None, None)
    assert g.error_fields == [f"uuid: {error}", f"temperature/gpu_temp: {error}"]
    assert g.verdict == "unhealthy"
    assert g.problems == [
        f"nvidia-smi could not read the GPU: uuid: {error}, temperature/gpu_temp: {error}."
    ]


def test_many_error_fields_are_summarised(sample: str) -> None:
    xml = sample.replace(">0</", ">Unknown Error</")
    g = parse_nvidia_smi_xml(xml).gpus[0]
    assert len(g.error_fields) > 3
    assert g.problems[-1].endswith(f" and {len(g.error_fields) - 3} more.")
    assert g.ecc_volatile_dbe is None  # unreadable counters are unknown, not zero


def test_a_recovery_action_is_unhealthy(sample: str) -> None:
    verdict, problems = verdict_and_problems(edit(sample, gpu_recovery_action="Reset"))
    assert (verdict, problems) == (
        "unhealthy",
        ["The driver asks for GPU recovery action 'Reset'."],
    )


def test_unrepairable_memory_is_unhealthy(sample: str) -> None:
    verdict, problems = verdict_and_problems(edit(sample, ecc_errors__unrepairable_memory="Yes"))
    assert (verdict, problems) == ("unhealthy", ["The driver reports unrepairable GPU memory."])


# --- degraded rules ---------------------------------------------------------------------

SLOWDOWNS = ["hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"]


@pytest.mark.parametrize("reason", SLOWDOWNS)
def test_slowdown_is_degraded(sample: str, reason: str) -> None:
    xml = edit(sample, **{f"clocks_event_reasons__clocks_event_reason_{reason}": "Active"})
    g = parse_nvidia_smi_xml(xml).gpus[0]
    assert g.clock_event_reasons_active == ["gpu_idle", reason]
    assert (g.verdict, g.problems) == ("degraded", [f"Clocks are held down by {reason}."])


@pytest.mark.parametrize("reason", SLOWDOWNS)
def test_older_throttle_reason_names_are_read_too(sample: str, reason: str) -> None:
    old = replace_once(sample, "<clocks_event_reasons>", "<clocks_throttle_reasons>").replace(
        "</clocks_event_reasons>", "</clocks_throttle_reasons>"
    )
    old = old.replace("<clocks_event_reason_", "<clocks_throttle_reason_")
    old = old.replace("</clocks_event_reason_", "</clocks_throttle_reason_")
    assert "<clocks_event_reasons>" not in old
    xml = edit(old, **{f"clocks_throttle_reasons__clocks_throttle_reason_{reason}": "Active"})
    g = parse_nvidia_smi_xml(xml).gpus[0]
    assert g.clock_event_reasons_active == ["gpu_idle", reason]
    assert g.verdict == "degraded"


def test_software_power_cap_is_no_problem(sample: str) -> None:
    # A busy GPU at its power limit is working as configured, not failing.
    xml = edit(sample, clocks_event_reasons__clocks_event_reason_sw_power_cap="Active")
    g = parse_nvidia_smi_xml(xml).gpus[0]
    assert "sw_power_cap" in g.clock_event_reasons_active
    assert g.verdict == "healthy"


def test_aggregate_uncorrectable_ecc_without_volatile_is_degraded(sample: str) -> None:
    verdict, problems = verdict_and_problems(
        edit(sample, ecc_errors__aggregate__dram_uncorrectable="3")
    )
    assert verdict == "degraded"
    assert problems == [
        "3 uncorrectable ECC error(s) in the GPU's lifetime, none since the driver loaded."
    ]


def test_aggregate_and_volatile_uncorrectable_ecc_is_unhealthy_only(sample: str) -> None:
    xml = edit(
        sample,
        ecc_errors__aggregate__dram_uncorrectable="3",
        ecc_errors__volatile__dram_uncorrectable="1",
    )
    verdict, problems = verdict_and_problems(xml)
    assert verdict == "unhealthy"
    assert len(problems) == 1


@pytest.mark.parametrize(
    ("rows", "verdict"),
    [
        (CORRECTABLE_REMAPPED_ROWS_DEGRADED - 1, "healthy"),
        (CORRECTABLE_REMAPPED_ROWS_DEGRADED, "degraded"),
    ],
)
def test_many_correctable_remapped_rows_are_degraded(sample: str, rows: int, verdict: str) -> None:
    h = parse_nvidia_smi_xml(edit(sample, remapped_rows__remapped_row_corr=str(rows)))
    assert h.gpus[0].remapped_rows_correctable == rows
    assert h.verdict == verdict


@pytest.mark.parametrize(
    ("sbe", "verdict"),
    [(VOLATILE_SBE_DEGRADED - 1, "healthy"), (VOLATILE_SBE_DEGRADED, "degraded")],
)
def test_many_volatile_correctable_ecc_is_degraded(sample: str, sbe: int, verdict: str) -> None:
    # SRAM and DRAM correctable counts add up.
    xml = edit(
        sample,
        ecc_errors__volatile__sram_correctable="1",
        ecc_errors__volatile__dram_correctable=str(sbe - 1),
    )
    h = parse_nvidia_smi_xml(xml)
    assert h.gpus[0].ecc_volatile_sbe == sbe
    assert h.verdict == verdict


def test_older_ecc_layout_with_totals(sample: str) -> None:
    root = ET.fromstring(sample)
    for section, dbe in (("volatile", "0"), ("aggregate", "4")):
        el = root.find(f"gpu/ecc_errors/{section}")
        assert el is not None
        el.clear()
        for kind, total in (("single_bit", "7"), ("double_bit", dbe)):
            sub = ET.SubElement(el, kind)
            ET.SubElement(sub, "device_memory").text = total
            ET.SubElement(sub, "total").text = total
    g = parse_nvidia_smi_xml(ET.tostring(root)).gpus[0]
    assert (g.ecc_volatile_dbe, g.ecc_volatile_sbe) == (0, 7)
    assert (g.ecc_aggregate_dbe, g.ecc_aggregate_sbe) == (4, 7)
    assert g.verdict == "degraded"


def test_older_power_readings_element(sample: str) -> None:
    xml = replace_once(sample, "<gpu_power_readings>", "<power_readings>")
    xml = replace_once(xml, "</gpu_power_readings>", "</power_readings>")
    xml = edit(xml, power_readings__instant_power_draw="N/A")
    assert parse_nvidia_smi_xml(xml).gpus[0].power_draw_w == 124.60  # the average, next best


# --- N/A, several GPUs, no GPU ----------------------------------------------------------


def test_na_fields_parse_as_none(sample: str) -> None:
    na = {
        "serial": "N/A",
        "uuid": "N/A",
        "persistence_mode": "N/A",
        "temperature__gpu_temp": "N/A",
        "gpu_power_readings__instant_power_draw": "N/A",
        "gpu_power_readings__average_power_draw": "[N/A]",
        "ecc_mode__current_ecc": "N/A",
        "remapped_rows__remapped_row_corr": "N/A",
        "remapped_rows__remapped_row_unc": "N/A",
        "remapped_rows__remapped_row_pending": "N/A",
        "remapped_rows__remapped_row_failure": "N/A",
        "gpu_recovery_action": "N/A",
    }
    for counter in ("sram_correctable", "sram_uncorrectable_parity", "sram_uncorrectable_secded"):
        for section in ("volatile", "aggregate"):
            na[f"ecc_errors__{section}__{counter}"] = "N/A"
    for section in ("volatile", "aggregate"):
        na[f"ecc_errors__{section}__dram_correctable"] = "N/A"
        na[f"ecc_errors__{section}__dram_uncorrectable"] = "Not Supported"
    h = parse_nvidia_smi_xml(edit(sample, **na))
    g = h.gpus[0]
    for field in (
        "serial",
        "uuid",
        "persistence_mode",
        "temperature_c",
        "power_draw_w",
        "ecc_mode",
        "ecc_volatile_dbe",
        "ecc_volatile_sbe",
        "ecc_aggregate_dbe",
        "ecc_aggregate_sbe",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "recovery_action",
    ):
        assert getattr(g, field) is None, field
    assert h.verdict == "healthy"  # N/A is no reading, not a fault
    assert summary_lines(h)[1] == f"GPU 0 ({BUS}): healthy, temperature n/a, power n/a"


def test_missing_sections_parse_as_none() -> None:
    xml = (
        "<nvidia_smi_log><driver_version>470.1</driver_version>"
        '<gpu id="00000000:01:00.0"><product_name>Tesla T4</product_name></gpu>'
        "</nvidia_smi_log>"
    )
    h = parse_nvidia_smi_xml(xml)
    g = h.gpus[0]
    assert (h.cuda_version, h.timestamp) == (None, None)
    assert (g.pci_bus_id, g.product_name) == ("00000000:01:00.0", "Tesla T4")  # from the id
    assert (g.temperature_c, g.ecc_volatile_dbe, g.remapped_rows_pending) == (None, None, None)
    assert (g.fabric_state, g.clock_event_reasons_active) == (None, [])
    assert h.verdict == "healthy"


def test_node_verdict_is_the_worst_gpu_and_problems_name_the_gpu(sample: str) -> None:
    root = ET.fromstring(sample)
    first = root.find("gpu")
    assert first is not None
    for minor, bus, dbe in (("1", "00000000:00:07.0", "0"), ("2", "00000000:00:08.0", "1")):
        gpu = copy.deepcopy(first)
        gpu.set("id", bus)
        for path, value in (
            ("minor_number", minor),
            ("pci/pci_bus_id", bus),
            ("ecc_errors/volatile/dram_uncorrectable", dbe),
        ):
            el = gpu.find(path)
            assert el is not None
            el.text = value
        root.append(gpu)
    degraded = edit(
        ET.tostring(root, encoding="unicode"),
        clocks_event_reasons__clocks_event_reason_hw_slowdown="Active",
    )
    h = parse_nvidia_smi_xml(degraded)
    assert [(g.index, g.verdict) for g in h.gpus] == [
        (0, "degraded"),
        (1, "healthy"),
        (2, "unhealthy"),
    ]
    assert h.verdict == "unhealthy"
    assert h.problems == [
        f"GPU 0 ({BUS}): Clocks are held down by hw_slowdown.",
        "GPU 2 (00000000:00:08.0): 1 uncorrectable (double-bit) ECC error(s) since the driver "
        "loaded; the GPU needs a reset.",
    ]
    lines = summary_lines(h)
    assert lines[0] == "node: unhealthy; driver 580.159.04, CUDA 13.0, 3 GPUs"
    assert lines[1:4] == [
        f"GPU 0 ({BUS}): degraded, 35 C, 125 W",
        "GPU 1 (00000000:00:07.0): healthy, 35 C, 125 W",
        "GPU 2 (00000000:00:08.0): unhealthy, 35 C, 125 W",
    ]
    assert lines[4:] == [f"- {p}" for p in h.problems]


def test_no_gpu_at_all_is_unhealthy(sample: str) -> None:
    root = ET.fromstring(sample)
    for gpu in root.findall("gpu"):
        root.remove(gpu)
    h: NodeHealth = parse_nvidia_smi_xml(ET.tostring(root))
    assert (h.gpus, h.verdict) == ([], "unhealthy")
    assert h.problems == ["nvidia-smi lists no GPU at all."]
    assert summary_lines(h) == [
        "node: unhealthy; driver 580.159.04, CUDA 13.0, 0 GPUs",
        "- nvidia-smi lists no GPU at all.",
    ]


# --- refused and bad input --------------------------------------------------------------

BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [
  <!ENTITY lol "lol">
  <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
]>
<nvidia_smi_log><driver_version>&lol2;</driver_version></nvidia_smi_log>"""

EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<nvidia_smi_log><driver_version>&x;</driver_version></nvidia_smi_log>"""


@pytest.mark.parametrize("payload", [BILLION_LAUGHS, EXTERNAL_ENTITY])
def test_entity_declarations_are_refused(payload: str) -> None:
    with pytest.raises(ValueError, match=r"refused: .*<!ENTITY"):
        parse_nvidia_smi_xml(payload)
    with pytest.raises(ValueError, match="refused"):
        parse_nvidia_smi_xml(payload.encode())


@pytest.mark.parametrize(
    "doctype",
    [
        '<!DOCTYPE nvidia_smi_log SYSTEM "http://attacker.example/x.dtd">',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd" [ ]>',
        "<!doctype nvidia_smi_log>",
        '<!DOCTYPE other SYSTEM "nvsmi_device_v13.dtd">',
    ],
)
def test_a_doctype_other_than_nvidia_smis_own_is_refused(sample: str, doctype: str) -> None:
    xml = replace_once(sample, '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">', doctype)
    with pytest.raises(ValueError, match=r"refused: a <!DOCTYPE>"):
        parse_nvidia_smi_xml(xml)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty input"),
        ("  \n\t", "empty input"),
        (b"", "empty input"),
        ("this is not XML", "not well-formed XML"),
        ("<nvidia_smi_log><gpu>", "not well-formed XML"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        ("<html><body>502 Bad Gateway</body></html>", "root element is <html>"),
        ("<nvidia_smi_log><gpu/></nvidia_smi_log>", "<driver_version> is missing"),
        (
            "<nvidia_smi_log><driver_version>N/A</driver_version></nvidia_smi_log>",
            "<driver_version> is missing",
        ),
        (
            "<nvidia_smi_log><driver_version>580</driver_version><gpu/></nvidia_smi_log>",
            "<gpu> #0 has no <pci/pci_bus_id>",
        ),
    ],
)
def test_bad_input_raises_a_one_line_value_error(text: str | bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        parse_nvidia_smi_xml(text)
    assert "\n" not in str(caught.value)


def test_oversized_input_is_refused() -> None:
    with pytest.raises(ValueError, match="over the"):
        parse_nvidia_smi_xml("<nvidia_smi_log>" + " " * 9_000_000 + "</nvidia_smi_log>")

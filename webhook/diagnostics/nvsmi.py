"""Parse `nvidia-smi -q -x` output into a health summary: one verdict per GPU and per node.

Pure: the caller passes the XML (str or bytes) and gets a frozen model back; nothing here runs
nvidia-smi, reads files or looks at the clock.

Element names follow the driver 580 output (DTD nvsmi_device_v13, the H200 sample in
lab/data/nvidia-smi-h200.xml) and the older names that are still in the field:

- clock reasons: `clocks_event_reasons/clocks_event_reason_*` (newer drivers) or
  `clocks_throttle_reasons/clocks_throttle_reason_*` (older ones);
- ECC counters: `sram_*`/`dram_*` counters (newer drivers) or `single_bit/total` and
  `double_bit/total` (older ones);
- power: `gpu_power_readings/instant_power_draw` (newer) or `power_readings/power_draw` (older);
- retired pages: `pending_retirement` (newer) or `pending_blacklist` (older).

The input comes from the node being diagnosed, so it is not trusted: entity declarations and
any DOCTYPE other than nvidia-smi's own bare external reference are refused before parsing
(defusedxml is not a dependency of this project).

GPUs are named by their minor number and PCI address (webhook/diagnostics/gpus.py), never by
their place in the listing. Two more readings come from outside the XML, when the caller has
them: the NVLink error counters (`nvidia-smi nvlink -e`, webhook/diagnostics/nvlink.py), matched
to a GPU by UUID; and how many GPUs the node should have (`with_missing`), since
`attached_gpus` alone is deliberately not compared with the number of <gpu> elements:
`nvidia-smi -q -x -i 0` lists one GPU of eight and is not a fault.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from webhook.diagnostics.gpus import MissingGpu, gpu_name, missing_gpus
from webhook.diagnostics.nvlink import GpuLinks, LinkErrors, parse_nvlink_errors

Verdict = Literal["healthy", "degraded", "unhealthy"]
Severity = Literal["degraded", "unhealthy"]

# nvidia-smi -q -x is ~30 KB per GPU; anything far bigger is not nvidia-smi output, and
# refusing it early bounds the memory a hostile node can make us spend.
MAX_INPUT_CHARS = 8 * 1024 * 1024

# Project choices, not NVIDIA figures (see the rules below for why each exists).
CORRECTABLE_REMAPPED_ROWS_DEGRADED = 512
VOLATILE_SBE_DEGRADED = 1000
PCIE_REPLAYS_UNHEALTHY = 100

# The NVLink counters that count faults on Volta to Hopper (`nvidia-smi nvlink -e`); any other
# counter a driver prints is kept but not judged.
NVLINK_FAULT_COUNTERS = ("CRC Errors", "Replay Errors", "Recovery Errors")

# Clock reasons that mean the hardware is protecting itself (heat, power delivery), as opposed
# to idling, application clocks or the software power cap that any busy GPU may hit.
SLOWDOWN_REASONS = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
)

# NVML error strings nvidia-smi prints in place of a value when the GPU did not answer.
ERROR_MARKERS = ("unknown error", "gpu requires reset", "gpu is lost")

# Values that mean "no reading" rather than a reading.
_NO_VALUE = frozenset({"n/a", "[n/a]", "not supported", "[not supported]", ""})

# nvidia-smi's own DOCTYPE: a bare external reference to its DTD file, no internal subset.
# Python's expat never fetches external DTDs, so this one is harmless; anything else is refused.
_OWN_DOCTYPE = re.compile(r'<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+"[\w.\-]+"\s*>')
_DOCTYPE = re.compile(r"<!DOCTYPE", re.IGNORECASE)
_ENTITY = re.compile(r"<!ENTITY", re.IGNORECASE)

_RANK: dict[Verdict, int] = {"healthy": 0, "degraded": 1, "unhealthy": 2}


class GpuReadings(BaseModel):
    """What nvidia-smi said about one GPU; None where it said N/A or nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int  # order in the file (nvidia-smi's index): shifts when a GPU is lost
    minor_number: int | None  # /dev/nvidiaN: the GPU's name (dcgm-exporter's `gpu` label)
    pci_bus_id: str
    uuid: str | None
    serial: str | None
    product_name: str | None
    persistence_mode: str | None
    temperature_c: float | None
    power_draw_w: float | None
    ecc_mode: str | None
    # Double-bit = uncorrectable, single-bit = correctable (SRAM + DRAM on newer drivers).
    ecc_volatile_dbe: int | None
    ecc_volatile_sbe: int | None
    ecc_aggregate_dbe: int | None
    ecc_aggregate_sbe: int | None
    # Page retirement: pre-Ampere GPUs; N/A on GPUs that remap rows instead.
    retired_pages_dbe: int | None
    retired_pages_sbe: int | None
    retired_pages_pending: bool | None
    # Row remapping: Ampere and later.
    remapped_rows_correctable: int | None
    remapped_rows_uncorrectable: int | None
    remapped_rows_pending: bool | None
    remapped_rows_failure: bool | None
    clock_event_reasons_active: list[str]  # e.g. ["gpu_idle"], names without the prefix
    fabric_state: str | None  # None where the GPU is on no NVLink fabric (N/A)
    fabric_status: str | None
    recovery_action: str | None  # NVML's recommendation: "None", "Reset", "Reboot", ...
    unrepairable_memory: bool | None
    error_fields: list[str]  # "path: error" for every field nvidia-smi could not read
    # PCIe replays since the GPU was reset, and how often the replay number rolled over.
    pcie_replays: int | None
    pcie_replay_rollovers: int | None
    # `nvidia-smi nvlink -e`, when the caller read it; [] for no link or no reading.
    nvlink_errors: list[LinkErrors] = []

    @property
    def name(self) -> str:
        return gpu_name(self.minor_number, self.pci_bus_id)


class GpuHealth(GpuReadings):
    """One GPU's readings and the verdict on them."""

    problems: list[str]  # one sentence each
    verdict: Verdict


class NodeHealth(BaseModel):
    """A node's GPUs; its verdict is the worst of theirs ("unhealthy" if it has none)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    driver_version: str
    cuda_version: str | None
    timestamp: str | None  # as nvidia-smi printed it, in the node's local time
    attached_gpus: int | None  # the driver's count, lost GPUs included
    gpus: list[GpuHealth]
    verdict: Verdict
    problems: list[str]  # each prefixed "GPU <minor> (<pci bus id>): "
    missing: list[MissingGpu] = []  # set by with_missing


class Finding(NamedTuple):
    severity: Severity
    message: str


# --- public API -------------------------------------------------------------------------


def parse_nvidia_smi_xml(text: str | bytes, nvlink: str | None = None) -> NodeHealth:
    """Parse `nvidia-smi -q -x` output, and `nvidia-smi nvlink -e` output when given.
    Raises ValueError (one line) on anything else."""
    root = _parse_root(text)
    driver = _value(root, "driver_version")
    if driver is None:
        raise ValueError("not nvidia-smi XML: <driver_version> is missing")
    elements = root.findall("gpu")
    links = _links_by_gpu(elements, parse_nvlink_errors(nvlink) if nvlink else [])
    gpus = [_gpu_health(i, el, links.get(i, [])) for i, el in enumerate(elements)]
    problems = [f"{g.name}: {p}" for g in gpus for p in g.problems]
    if not gpus:
        # No GPU at all on a GPU node: fallen off the bus, or hidden from the driver.
        problems.append("nvidia-smi lists no GPU at all.")
    return NodeHealth(
        driver_version=driver,
        cuda_version=_value(root, "cuda_version"),
        timestamp=_value(root, "timestamp"),
        attached_gpus=_int(_value(root, "attached_gpus")),
        gpus=gpus,
        verdict=_worst(g.verdict for g in gpus) if gpus else "unhealthy",
        problems=problems,
    )


def with_missing(h: NodeHealth, expected: int, lost: list[str]) -> NodeHealth:
    """The node's health with the GPUs it should have shown but did not (unhealthy).

    `expected`: how many GPUs the node has (the caller's best count: Slurm's gres, the
    driver's `attached_gpus`); `lost`: the PCI addresses nvidia-smi said it could not reach
    (webhook.diagnostics.gpus.lost_bus_ids of its stderr)."""
    gone = missing_gpus(((g.minor_number, g.pci_bus_id) for g in h.gpus), expected, lost)
    if not gone:
        return h
    of = max(expected, len(h.gpus) + len(gone))
    problems = [f"nvidia-smi shows {len(h.gpus)} of {of} GPUs"]
    problems += [f"{g.name}: missing from nvidia-smi's listing" for g in gone]
    return h.model_copy(
        update={"missing": gone, "verdict": "unhealthy", "problems": problems + h.problems}
    )


def summary_lines(h: NodeHealth) -> list[str]:
    """A short human summary: a node line, one line per GPU, then one line per problem."""
    count = f"{len(h.gpus)} GPU" + ("" if len(h.gpus) == 1 else "s")
    if h.missing:
        count += f" shown, {len(h.missing)} missing"
    lines = [f"node: {h.verdict}; driver {h.driver_version}, CUDA {h.cuda_version}, {count}"]
    for g in h.gpus:
        temp = "temperature n/a" if g.temperature_c is None else f"{g.temperature_c:.0f} C"
        power = "power n/a" if g.power_draw_w is None else f"{g.power_draw_w:.0f} W"
        lines.append(f"{g.name}: {g.verdict}, {temp}, {power}")
    lines.extend(f"{g.name}: missing" for g in h.missing)
    lines.extend(f"- {p}" for p in h.problems)
    return lines


# --- parsing ----------------------------------------------------------------------------


def _parse_root(text: str | bytes) -> ET.Element:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ValueError(f"input is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise ValueError("empty input: expected the XML of nvidia-smi -q -x")
    if len(text) > MAX_INPUT_CHARS:
        raise ValueError(f"input is {len(text)} characters, over the {MAX_INPUT_CHARS} limit")
    _refuse_declarations(text)
    try:
        # Safe after _refuse_declarations: no entities can be declared, no DTD is loaded.
        root = ET.fromstring(text)  # noqa: S314
    except ET.ParseError as e:
        raise ValueError(f"not well-formed XML: {e}") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(
            f"not nvidia-smi XML: root element is <{root.tag}>, expected <nvidia_smi_log>"
        )
    return root


def _refuse_declarations(text: str) -> None:
    """Refuse entity declarations and every DOCTYPE but nvidia-smi's own.

    Why: entities are how XML bombs (billion laughs) and external-entity reads work, and an
    internal DTD subset is where they are declared. nvidia-smi itself never declares any.
    """
    if _ENTITY.search(text):
        raise ValueError("refused: the XML declares entities (<!ENTITY), nvidia-smi never does")
    for m in _DOCTYPE.finditer(text):
        if not _OWN_DOCTYPE.match(text, m.start()):
            raise ValueError(
                "refused: a <!DOCTYPE> other than nvidia-smi's bare external DTD reference"
            )


def _links_by_gpu(
    elements: list[ET.Element], blocks: list[GpuLinks]
) -> dict[int, list[LinkErrors]]:
    """Each `nvidia-smi nvlink -e` block's links, by the place of its GPU in the XML: by UUID,
    or by nvidia-smi's index when the block names no UUID (both list GPUs in index order)."""
    places = {_value(el, "uuid"): i for i, el in enumerate(elements)}
    found: dict[int, list[LinkErrors]] = {}
    for b in blocks:
        place = places.get(b.uuid) if b.uuid else b.index
        if place is not None and place < len(elements) and b.links:
            found[place] = b.links
    return found


def _gpu_health(index: int, gpu: ET.Element, links: list[LinkErrors]) -> GpuHealth:
    readings = _gpu_readings(index, gpu).model_copy(update={"nvlink_errors": links})
    findings = [f for rule in RULES if (f := rule(readings)) is not None]
    return GpuHealth(
        **readings.model_dump(),
        problems=[f.message for f in findings],
        verdict=_worst(f.severity for f in findings),
    )


def _gpu_readings(index: int, gpu: ET.Element) -> GpuReadings:
    pci_bus_id = _value(gpu, "pci/pci_bus_id") or gpu.get("id")
    if not pci_bus_id:
        raise ValueError(f"not nvidia-smi XML: <gpu> #{index} has no <pci/pci_bus_id> or id")
    volatile_dbe, volatile_sbe = _ecc_counts(gpu.find("ecc_errors/volatile"))
    aggregate_dbe, aggregate_sbe = _ecc_counts(gpu.find("ecc_errors/aggregate"))
    return GpuReadings(
        index=index,
        minor_number=_int(_value(gpu, "minor_number")),
        pci_bus_id=pci_bus_id,
        uuid=_value(gpu, "uuid"),
        serial=_value(gpu, "serial"),
        product_name=_value(gpu, "product_name"),
        persistence_mode=_value(gpu, "persistence_mode"),
        temperature_c=_float(_value(gpu, "temperature/gpu_temp")),
        power_draw_w=_power_draw(gpu),
        ecc_mode=_value(gpu, "ecc_mode/current_ecc"),
        ecc_volatile_dbe=volatile_dbe,
        ecc_volatile_sbe=volatile_sbe,
        ecc_aggregate_dbe=aggregate_dbe,
        ecc_aggregate_sbe=aggregate_sbe,
        retired_pages_dbe=_int(_value(gpu, "retired_pages/double_bit_retirement/retired_count")),
        retired_pages_sbe=_int(
            _value(gpu, "retired_pages/multiple_single_bit_retirement/retired_count")
        ),
        retired_pages_pending=_any_yes(
            _value(gpu, "retired_pages/pending_retirement"),
            _value(gpu, "retired_pages/pending_blacklist"),  # the older name
        ),
        remapped_rows_correctable=_int(_value(gpu, "remapped_rows/remapped_row_corr")),
        remapped_rows_uncorrectable=_int(_value(gpu, "remapped_rows/remapped_row_unc")),
        remapped_rows_pending=_yes_no(_value(gpu, "remapped_rows/remapped_row_pending")),
        remapped_rows_failure=_yes_no(_value(gpu, "remapped_rows/remapped_row_failure")),
        clock_event_reasons_active=_active_clock_reasons(gpu),
        fabric_state=_value(gpu, "fabric/state"),
        fabric_status=_value(gpu, "fabric/status"),
        recovery_action=_value(gpu, "gpu_recovery_action"),
        unrepairable_memory=_yes_no(_value(gpu, "ecc_errors/unrepairable_memory")),
        error_fields=_error_fields(gpu),
        pcie_replays=_int(_value(gpu, "pci/replay_counter")),
        pcie_replay_rollovers=_int(_value(gpu, "pci/replay_rollover_counter")),
    )


# Counter names inside ecc_errors/volatile and ecc_errors/aggregate on newer drivers.
_UNCORRECTABLE_TAGS = (
    "sram_uncorrectable",  # before the parity/SEC-DED split
    "sram_uncorrectable_parity",
    "sram_uncorrectable_secded",
    "dram_uncorrectable",
)
_CORRECTABLE_TAGS = ("sram_correctable", "dram_correctable")


def _ecc_counts(section: ET.Element | None) -> tuple[int | None, int | None]:
    """(uncorrectable, correctable) totals of one ECC section, None where not reported."""
    if section is None:
        return None, None
    if section.find("double_bit") is not None:  # older drivers: per-unit counts and a total
        return _int(_value(section, "double_bit/total")), _int(_value(section, "single_bit/total"))
    return _sum(section, _UNCORRECTABLE_TAGS), _sum(section, _CORRECTABLE_TAGS)


def _sum(section: ET.Element, tags: Iterable[str]) -> int | None:
    counts = [c for tag in tags if (c := _int(_value(section, tag))) is not None]
    return sum(counts) if counts else None


def _power_draw(gpu: ET.Element) -> float | None:
    # The instant reading first: it is what the GPU draws now, the average lags by a second.
    for section in ("gpu_power_readings", "power_readings"):
        for tag in ("instant_power_draw", "power_draw", "average_power_draw"):
            watts = _float(_value(gpu, f"{section}/{tag}"))
            if watts is not None:
                return watts
    return None


_REASON_SECTIONS = (
    ("clocks_event_reasons", "clocks_event_reason_"),  # newer drivers
    ("clocks_throttle_reasons", "clocks_throttle_reason_"),  # older drivers
)


def _active_clock_reasons(gpu: ET.Element) -> list[str]:
    active: list[str] = []
    for section, prefix in _REASON_SECTIONS:
        for reason in gpu.findall(section + "/*"):
            name = reason.tag.removeprefix(prefix)
            if (reason.text or "").strip() == "Active" and name not in active:
                active.append(name)
    return active


def _error_fields(gpu: ET.Element, path: str = "") -> list[str]:
    found: list[str] = []
    for child in gpu:
        child_path = f"{path}/{child.tag}" if path else child.tag
        text = (child.text or "").strip()
        if _is_error(text):
            found.append(f"{child_path}: {text}")
        found.extend(_error_fields(child, child_path))
    return found


# --- value helpers ----------------------------------------------------------------------

_MEASURE = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?)(?:\s*[A-Za-z%]+)?")
_COUNT = re.compile(r"[0-9]+")


def _value(el: ET.Element, path: str) -> str | None:
    """The element's stripped text, or None when missing, N/A, not supported or an error."""
    found = el.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    if text.lower() in _NO_VALUE or _is_error(text):
        return None
    return text


def _is_error(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in ERROR_MARKERS)


def _float(text: str | None) -> float | None:
    """A number with an optional unit ("35 C", "124.52 W", "0 %"), else None."""
    m = _MEASURE.fullmatch(text) if text is not None else None
    return float(m.group(1)) if m else None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and _COUNT.fullmatch(text) else None


def _yes_no(text: str | None) -> bool | None:
    return {"yes": True, "no": False}.get((text or "").lower())


def _any_yes(*texts: str | None) -> bool | None:
    answers = [a for t in texts if (a := _yes_no(t)) is not None]
    return any(answers) if answers else None


def _worst(verdicts: Iterable[Verdict]) -> Verdict:
    return max(verdicts, key=_RANK.__getitem__, default="healthy")


# --- verdict rules ----------------------------------------------------------------------
# Each rule looks at one GPU and returns at most one finding; the GPU's verdict is the worst
# finding's severity, "healthy" when there is none.


def _volatile_dbe(g: GpuReadings) -> Finding | None:
    """Unhealthy: uncorrectable ECC errors since the driver loaded.

    Why: the data in that memory is gone (XID 48/94/95); the running job may have read it and
    the GPU needs a reset before it can be trusted again.
    """
    if g.ecc_volatile_dbe:
        return Finding(
            "unhealthy",
            f"{g.ecc_volatile_dbe} uncorrectable (double-bit) ECC error(s) since the driver "
            "loaded; the GPU needs a reset.",
        )
    return None


def _remap_pending(g: GpuReadings) -> Finding | None:
    """Unhealthy: a row remap is pending (with or without uncorrectable remapped rows).

    Why: the faulty row stays in use until the GPU is reset; with uncorrectable remapped rows
    it is a row that already lost data.
    """
    if g.remapped_rows_pending:
        unc = g.remapped_rows_uncorrectable
        why = f" after {unc} uncorrectable error row(s)" if unc else ""
        return Finding(
            "unhealthy", f"A row remap is pending{why}; the GPU needs a reset to apply it."
        )
    return None


def _remap_failure(g: GpuReadings) -> Finding | None:
    """Unhealthy: a row remap failed.

    Why: a bad row could not be replaced (its bank has no spare left); the memory keeps
    failing and the GPU is a candidate for RMA.
    """
    if g.remapped_rows_failure:
        return Finding("unhealthy", "A row remap failed; the GPU memory cannot repair itself.")
    return None


def _retirement_pending(g: GpuReadings) -> Finding | None:
    """Unhealthy: retired pages are pending (pre-Ampere page retirement).

    Why: the bad page stays in use until the GPU is reset or the driver reloaded.
    """
    if g.retired_pages_pending:
        return Finding("unhealthy", "Page retirement is pending; the GPU needs a reset.")
    return None


def _fabric_not_ready(g: GpuReadings) -> Finding | None:
    """Unhealthy: on an NVLink fabric, the state is not Completed or the status not Success.

    Why: until the GPU is registered with the fabric manager CUDA cannot use it, and a failed
    registration does not heal by itself. N/A (no fabric, as on the PCIe H200 sample) is skipped.
    """
    state, status = g.fabric_state, g.fabric_status
    if state is None:
        return None
    if state.lower() != "completed" or (status is not None and status.lower() != "success"):
        return Finding(
            "unhealthy",
            f"NVLink fabric state is {state!r} with status {status!r}, not Completed/Success.",
        )
    return None


def _nvml_errors(g: GpuReadings) -> Finding | None:
    """Unhealthy: nvidia-smi printed an NVML error ("Unknown Error", "GPU requires reset",
    "GPU is lost") instead of a value.

    Why: the driver cannot talk to the GPU; nothing else it reports can be trusted.
    """
    if not g.error_fields:
        return None
    examples = ", ".join(g.error_fields[:3])
    more = f" and {len(g.error_fields) - 3} more" if len(g.error_fields) > 3 else ""
    return Finding("unhealthy", f"nvidia-smi could not read the GPU: {examples}{more}.")


def _recovery_action(g: GpuReadings) -> Finding | None:
    """Unhealthy: NVML recommends a recovery action (Reset, Reboot, Drain P2P, ...).

    Why: it is the driver's own verdict that the GPU cannot be used as it is.
    """
    action = g.recovery_action
    if action is not None and action.lower() != "none":
        return Finding("unhealthy", f"The driver asks for GPU recovery action {action!r}.")
    return None


def _unrepairable(g: GpuReadings) -> Finding | None:
    """Unhealthy: the driver reports unrepairable memory.

    Why: the memory has failed beyond what remapping can fix; the GPU is a candidate for RMA.
    """
    if g.unrepairable_memory:
        return Finding("unhealthy", "The driver reports unrepairable GPU memory.")
    return None


def _nvlink_faults(g: GpuReadings) -> Finding | None:
    """Unhealthy: any NVLink CRC, replay or recovery error since the counters were reset.

    Why: a sound link counts none; every one is a flit that arrived corrupted (CRC), was sent
    again (replay) or a link that had to retrain (recovery). The drain that ran this already
    saw them rise; the counts say which link to reseat or replace.
    """
    bad = [
        f"link {link.link} " + ", ".join(f"{name} {link.counters[name]}" for name in names)
        for link in g.nvlink_errors
        if (names := [n for n in NVLINK_FAULT_COUNTERS if link.counters.get(n)])
    ]
    if bad:
        return Finding("unhealthy", f"NVLink errors: {'; '.join(bad)}.")
    return None


def _pcie_replays(g: GpuReadings) -> Finding | None:
    """Unhealthy: PCIe replays since reset >= PCIE_REPLAYS_UNHEALTHY (100), or any rollover
    of the replay number.

    Why: a replay is a packet the link sent again after an error; a few over a GPU's uptime are
    normal (the real H200 sample shows one), hundreds mean a marginal link or riser. A
    rollover is a packet that failed its replays until the link retrained. 100 is a project
    choice, not an NVIDIA limit: a snapshot cannot give the rate the alert measured.
    """
    replays, rollovers = g.pcie_replays or 0, g.pcie_replay_rollovers or 0
    said = []
    if replays >= PCIE_REPLAYS_UNHEALTHY:
        said.append(f"{replays} PCIe replays since reset (threshold {PCIE_REPLAYS_UNHEALTHY})")
    if rollovers:
        said.append(f"the PCIe replay number rolled over {rollovers} time(s)")
    if said:
        text = "; ".join(said)
        return Finding("unhealthy", text[0].upper() + text[1:] + ".")
    return None


def _slowdown(g: GpuReadings) -> Finding | None:
    """Degraded: a thermal or power-brake slowdown is active.

    Why: the hardware is cutting clocks to protect itself (cooling or power delivery fault);
    the GPU still computes correctly but slows its whole job down (a straggler).
    """
    active = [r for r in g.clock_event_reasons_active if r in SLOWDOWN_REASONS]
    if active:
        return Finding("degraded", f"Clocks are held down by {', '.join(active)}.")
    return None


def _aggregate_dbe(g: GpuReadings) -> Finding | None:
    """Degraded: lifetime uncorrectable ECC errors, none since the driver loaded.

    Why: the error was handled (reset, remap or retirement), but the memory has a history
    worth watching; with volatile errors the GPU is already unhealthy.
    """
    if g.ecc_aggregate_dbe and not g.ecc_volatile_dbe:
        return Finding(
            "degraded",
            f"{g.ecc_aggregate_dbe} uncorrectable ECC error(s) in the GPU's lifetime, "
            "none since the driver loaded.",
        )
    return None


def _many_correctable_remaps(g: GpuReadings) -> Finding | None:
    """Degraded: correctable remapped rows >= CORRECTABLE_REMAPPED_ROWS_DEGRADED (512).

    Why: each remap is fine alone, but a steady stream means the memory is wearing and spare
    rows are being used up. 512 is a project choice, not an NVIDIA limit: high enough to ignore
    the odd remap, low enough to flag the GPU long before remaps start failing.
    """
    rows = g.remapped_rows_correctable
    if rows is not None and rows >= CORRECTABLE_REMAPPED_ROWS_DEGRADED:
        return Finding(
            "degraded",
            f"{rows} rows remapped after correctable errors "
            f"(threshold {CORRECTABLE_REMAPPED_ROWS_DEGRADED}).",
        )
    return None


def _many_volatile_sbe(g: GpuReadings) -> Finding | None:
    """Degraded: correctable ECC errors since the driver loaded >= VOLATILE_SBE_DEGRADED (1000).

    Why: correctable errors cost nothing alone, but a high rate often comes before an
    uncorrectable one. 1000 is a project choice, not an NVIDIA limit.
    """
    sbe = g.ecc_volatile_sbe
    if sbe is not None and sbe >= VOLATILE_SBE_DEGRADED:
        return Finding(
            "degraded",
            f"{sbe} correctable (single-bit) ECC errors since the driver loaded "
            f"(threshold {VOLATILE_SBE_DEGRADED}).",
        )
    return None


# Unhealthy rules first so a GPU's problems read from worst to least.
RULES: tuple[Callable[[GpuReadings], Finding | None], ...] = (
    _volatile_dbe,
    _remap_pending,
    _remap_failure,
    _retirement_pending,
    _fabric_not_ready,
    _nvml_errors,
    _recovery_action,
    _unrepairable,
    _nvlink_faults,
    _pcie_replays,
    _slowdown,
    _aggregate_dbe,
    _many_correctable_remaps,
    _many_volatile_sbe,
)

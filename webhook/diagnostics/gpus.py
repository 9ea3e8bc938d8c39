"""How the diagnostics name a GPU, and which GPUs a node should have shown but did not.

A GPU is named by its minor number (`/dev/nvidiaN`, nvidia-smi's `minor_number`) and its PCI
address: `GPU 4 (00000000:58:00.0)`. The minor number is what dcgm-exporter's `gpu` label and
the alerts call the GPU; nvidia-smi's own index (its order in the listing) is not used, since
it shifts down by one for every GPU before it that fell off the bus.

Pure: the caller passes what nvidia-smi printed and what Slurm counts; nothing is read here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

# domain:bus:device.function, as nvidia-smi (00000000:3B:00.0), dcgm-exporter (the same) and
# the kernel (0000:3b:00.0) print it.
_BUS_ID = re.compile(r"\b([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])\b")
# nvidia-smi's message for a GPU the driver counts but cannot reach (fallen off the bus).
_LOST = re.compile(r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]+)")


def normal_bus_id(text: str) -> str | None:
    """The PCI address as nvidia-smi's XML spells it (8-digit domain, upper case), or None."""
    m = _BUS_ID.search(text)
    if m is None:
        return None
    domain, bus, device, function = m.groups()
    return f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.{function}"


def gpu_name(minor: int | None, pci_bus_id: str | None) -> str:
    """`GPU 4 (00000000:58:00.0)`; a part nvidia-smi did not give is left out."""
    if minor is None:
        return f"GPU at {pci_bus_id}" if pci_bus_id else "a GPU"
    return f"GPU {minor} ({pci_bus_id})" if pci_bus_id else f"GPU {minor}"


def lost_bus_ids(stderr: str) -> list[str]:
    """The PCI addresses of the GPUs nvidia-smi says it could not reach, in its order."""
    found: list[str] = []
    for m in _LOST.finditer(stderr):
        bus = normal_bus_id(m.group(1))
        if bus is not None and bus not in found:
            found.append(bus)
    return found


class MissingGpu(BaseModel):
    """A GPU the node should have that nvidia-smi did not show; None where it is not known."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    minor_number: int | None
    pci_bus_id: str | None

    @property
    def name(self) -> str:
        return gpu_name(self.minor_number, self.pci_bus_id)


def missing_gpus(
    shown: Iterable[tuple[int | None, str]], expected: int, lost: Iterable[str] = ()
) -> list[MissingGpu]:
    """The GPUs missing from nvidia-smi's listing, named as far as the evidence allows.

    `shown`: (minor number, PCI address) of each GPU listed; `expected`: how many the node
    should have (Slurm's gres, the driver's count); `lost`: PCI addresses nvidia-smi said it
    could not reach. Minor numbers run 0..N-1 on a node (the driver numbers the GPUs it finds),
    so the ones absent from the listing are the missing GPUs' when the listing has no other
    minor; a lost address goes with a missing minor only when there is one of each (more
    cannot be paired without guessing).
    """
    shown = list(shown)
    minors = {m for m, _ in shown if m is not None}
    buses = {normal_bus_id(b) or b for _, b in shown}
    gone_buses = [b for b in dict.fromkeys(lost) if b not in buses]
    count = max(expected - len(shown), len(gone_buses), 0)
    gone_minors: list[int] = []
    if minors <= set(range(expected)) and len(minors) == len(shown):
        gone_minors = sorted(set(range(expected)) - minors)
    if count == 0:
        return []
    if count == 1:
        minor = gone_minors[0] if len(gone_minors) == 1 else None
        bus = gone_buses[0] if len(gone_buses) == 1 else None
        return [MissingGpu(minor_number=minor, pci_bus_id=bus)]
    # Several: minors and addresses both run in the driver's probe order, but pairing them
    # would be a guess; each is named by what is certain.
    if len(gone_minors) == count:
        return [MissingGpu(minor_number=m, pci_bus_id=None) for m in gone_minors]
    if len(gone_buses) == count:
        return [MissingGpu(minor_number=None, pci_bus_id=b) for b in gone_buses]
    return [MissingGpu(minor_number=None, pci_bus_id=None)] * count

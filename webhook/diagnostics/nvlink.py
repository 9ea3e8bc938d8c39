"""Parse `nvidia-smi nvlink -e` (the NVLink error counters of every link of every GPU).

What the tool prints (Volta to Hopper drivers), one block per GPU:

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)
    \t Link 0: Replay Errors: 0
    \t Link 0: Recovery Errors: 0
    \t Link 0: CRC Errors: 0

    \t Link 1: Replay Errors: 0
    ...

The `GPU n` of a block is nvidia-smi's index (its listing order), not the minor number: the
caller matches a block to a GPU of `nvidia-smi -q -x` by its UUID, by the index only when the
block names no UUID. Every `Link n: <counter>: <count>` line is kept; which counters say a link
is faulty is the verdict rules' business (webhook/diagnostics/nvsmi.py). A GPU on no NVLink
prints no link lines; an empty output is no fault.

Pure: the caller passes the text.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

MAX_INPUT_CHARS = 4 * 1024 * 1024  # 8 GPUs x 18 links x 3 counters is ~25 KB

_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: (GPU-[0-9A-Fa-f-]+)\))?\s*$")
_COUNTER = re.compile(r"^\s*Link (\d+): ([A-Za-z][A-Za-z0-9 _-]*?): (\d+)\s*$")


class LinkErrors(BaseModel):
    """One link's error counters, by the name nvidia-smi prints ("CRC Errors": 37)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    link: int
    counters: dict[str, int]


class GpuLinks(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int  # nvidia-smi's index, not the minor number
    uuid: str | None
    links: list[LinkErrors]


def parse_nvlink_errors(text: str) -> list[GpuLinks]:
    """Every GPU block of `nvidia-smi nvlink -e`. Raises ValueError (one line) on a counter
    line before any GPU line, or on input far larger than the tool ever prints."""
    if len(text) > MAX_INPUT_CHARS:
        raise ValueError(f"input is {len(text)} characters, over the {MAX_INPUT_CHARS} limit")
    gpus: list[tuple[int, str | None, dict[int, dict[str, int]]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if m := _GPU.match(line):
            gpus.append((int(m.group(1)), m.group(3), {}))
        elif m := _COUNTER.match(line):
            if not gpus:
                raise ValueError(f"line {number}: a link counter before any 'GPU n:' line")
            link = gpus[-1][2].setdefault(int(m.group(1)), {})
            link[m.group(2)] = int(m.group(3))
    return [
        GpuLinks(
            index=index,
            uuid=uuid,
            links=[LinkErrors(link=n, counters=c) for n, c in sorted(links.items())],
        )
        for index, uuid, links in gpus
    ]

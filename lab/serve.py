"""Serve prometheus-client registries on loopback ports until SIGTERM."""

from __future__ import annotations

import signal
import threading
from types import FrameType

from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry
from prometheus_client.registry import Collector


def serve_forever(collectors: dict[int, Collector]) -> None:
    for port, collector in collectors.items():
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        start_http_server(port, addr="127.0.0.1", registry=registry)
    stop = threading.Event()

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    stop.wait()

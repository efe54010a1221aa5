"""A free TCP port on the loopback, for a real server a test starts (emulator, vLLM, Redis,
PostgreSQL)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

"""Real Redis for tests: the machine's own (127.0.0.1:6379, a fresh key prefix per test, its keys
deleted after) and a private ``redis-server`` a test may kill and start again on its own port."""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from ports import free_port

SHARED_URL = "redis://127.0.0.1:6379/0"


@contextlib.contextmanager
def fresh_prefix() -> Iterator[str]:
    """A key prefix nobody used on the shared Redis; every key under it is deleted at the end."""
    prefix = f"tp-test-{uuid.uuid4().hex[:10]}:"
    client = redis.Redis.from_url(SHARED_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip("no Redis on 127.0.0.1:6379 (CI and dev machines run one)")
    try:
        yield prefix
    finally:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


class PrivateRedis:
    """A ``redis-server`` of the test's own, on a free port, that it may kill and start again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        client.close()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

"""A PostgreSQL cluster of the test's own (``initdb`` + ``pg_ctl`` on a free port, in a temporary
directory), which a test may stop, restart and kill without touching the shared server.

Run as the ``postgres`` user when the tests run as root (``initdb`` refuses root); trust
authentication on 127.0.0.1; durability off (``fsync``, ``synchronous_commit``), as it is a test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from ports import free_port

BIN = Path(os.environ.get("TOKENPLANE_PG_BIN", "/usr/lib/postgresql/15/bin"))


def available() -> bool:
    return (BIN / "initdb").exists() and (BIN / "pg_ctl").exists()


class PrivatePostgres:
    """``start()`` creates and starts the cluster; ``url`` reaches its ``postgres`` database."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tp-pg-"))
        self.data = self.dir / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        if not self.data.exists():
            self._run(str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                      "--no-sync", "-E", "UTF8")  # fmt: skip
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off")  # fmt: skip
        log = str(self.dir / "log")
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", log, "-w", "start")
        self._wait()

    def stop(self, mode: str = "fast") -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def _wait(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run([*self._as, str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                           capture_output=True, timeout=60, check=False)  # fmt: skip
        shutil.rmtree(self.dir, ignore_errors=True)

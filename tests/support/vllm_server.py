"""Start, watch and stop a real vLLM OpenAI-compatible server (CPU build) for integration tests.

Standard library only (metrics parsing imports prometheus_client when called). The server runs in its
own process group, so that stop() and kill() reach its engine-core child too.

    with start_vllm(python, model_dir, port, served_name="tiny", cpu_bind="0") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x")
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

# What every instance needs here (see shared/RUNTIMES.md): no hub, no usage reporting, 1 GiB of KV.
BASE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}

# The flags the tests serve with. --enforce-eager halves start time (about 25 s instead of 55 s).
DEFAULT_ARGS = [
    "--dtype",
    "bfloat16",
    "--max-model-len",
    "4096",  # room for a continuation: re-tokenised random text is ~1.5x its token count
    "--max-num-seqs",
    "16",
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--enforce-eager",
]


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class VllmEndpoint(NamedTuple):
    """What a gateway config needs of one instance."""

    url: str  # server root, http://127.0.0.1:PORT; the OpenAI API is at url + "/v1"
    metrics_url: str  # url + "/metrics"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


class VllmProcess:
    """One vLLM server subprocess. `url` is the server root; `base_url` the OpenAI base (`/v1`)."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        port: int,
        log_path: Path,
        name: str = "vllm",
    ) -> None:
        self.argv = argv
        self.env = dict(env)
        self.port = port
        self.log_path = log_path
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.ready_after_s: float | None = None  # seconds from spawn to /health OK, last start

    # --- addresses -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    @property
    def endpoint(self) -> VllmEndpoint:
        return VllmEndpoint(self.url, self.metrics_url)

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # --- lifecycle -----------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the subprocess (appending to the log) without waiting for it to be ready."""
        if self.alive():
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== spawn {time.strftime('%H:%M:%S')}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: signals reach the engine core too
            )
        self.started_at = time.monotonic()
        self.ready_after_s = None

    def wait_ready(self, timeout: float = 180.0) -> float:
        """Wait for /health to answer 200; return seconds since spawn. Raise with the log tail if not."""
        deadline = self.started_at + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"{self.name} exited (code {code}) before ready\n{self.log_tail()}")
            if _http_ok(self.health_url):
                self.ready_after_s = time.monotonic() - self.started_at
                return self.ready_after_s
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} not ready after {timeout:.0f} s\n{self.log_tail()}")
            time.sleep(0.25)

    def start(self, timeout: float = 180.0) -> VllmProcess:
        self.spawn()
        self.wait_ready(timeout)
        return self

    def restart(self, timeout: float = 180.0) -> VllmProcess:
        self.stop()
        return self.start(timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        return self.alive() and _http_ok(self.health_url)

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)  # pgid == pid: start_new_session

    def _group_gone(self) -> bool:
        if self.proc is None:
            return True
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return True
        return False

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the group, then SIGKILL whatever is left after `timeout` seconds."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and self._group_gone():
                break
            time.sleep(0.1)
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def freeze(self) -> None:
        """SIGSTOP the whole group: the engine stops mid-step and writes nothing more until `thaw`."""
        self._signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal_group(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the whole group at once: a crash, for failure tests. Returns when the server is dead."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while not self._group_gone() and time.monotonic() < deadline:
            time.sleep(0.05)

    def __enter__(self) -> VllmProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- inspection ----------------------------------------------------------------------------
    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"(no log at {self.log_path})"
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text.splitlines()[-lines:])

    def group_pids(self) -> list[int]:
        if self.proc is None:
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) == self.proc.pid:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
        return pids

    def memory_bytes(self) -> dict[str, int]:
        """RSS and PSS summed over the server's process group (PSS counts shared pages once)."""
        total = {"rss": 0, "pss": 0}
        for pid in self.group_pids():
            try:
                text = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    total[key.lower()] += int(rest.split()[0]) * 1024
        return total


def vllm_argv(
    python: Path, model_dir: Path, port: int, served_name: str, extra_args: Iterable[str] = ()
) -> list[str]:
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *DEFAULT_ARGS,
        *extra_args,
    ]


def vllm_env(python: Path, cpu_bind: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    out["PATH"] = f"{Path(python).parent}{os.pathsep}{out.get('PATH', '')}"
    out.update(BASE_ENV)
    out["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind
    out.update(env or {})
    return out


def start_vllm(
    python: Path,
    model_dir: Path,
    port: int,
    *,
    served_name: str = "tiny",
    cpu_bind: str = "0",
    extra_args: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    timeout: float = 180.0,
    wait: bool = True,
) -> VllmProcess:
    """Start one server and (with wait=True) return once /health answers. Use as a context manager
    to stop it on exit. With wait=False, call `.wait_ready()` later (to start several at once)."""
    log_path = log_path or Path(model_dir).parent / f"vllm-{port}.log"
    server = VllmProcess(
        vllm_argv(Path(python), Path(model_dir), port, served_name, extra_args),
        vllm_env(Path(python), cpu_bind, env),
        port,
        log_path,
        name=f"vllm:{port}",
    )
    server.spawn()
    if wait:
        try:
            server.wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
    return server


def scrape_metrics(metrics_url: str, timeout: float = 5.0) -> dict[str, float]:
    """Fetch a Prometheus endpoint; return each sample name's value summed over its label sets
    (for example `vllm:prefix_cache_hits_total`, `vllm:num_requests_running`)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=timeout) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out

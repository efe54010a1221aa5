"""Multi-tenant bursty traffic synthesised from ServeGen per-client models (alibaba/ServeGen).

A ServeGen folder holds, per client N, ``chunk-N-trace.csv`` (no header: ``window_start_s,
rate_rps, cv, iat_dist, param1, param2`` for 600 s windows) and ``chunk-N-dataset.json`` (token
length PMFs per 6 h window, keyed by the window start in seconds; each PMF is a Python-literal
string such as ``"{45: 0.0097, 46: 0.0117}"``).

Per client and window, arrivals follow a renewal process restarted at the window start, with the
window's rate and cv: gamma (shape 1/cv²) for ``Gamma`` windows, Weibull (shape solved from cv) for
``Weibull`` windows and exponential otherwise; the fitted ``param1/param2`` are not used, so the
window's rate is honoured exactly in expectation. Prompt and output lengths are drawn from the
PMFs of the 6 h window holding the arrival (or the nearest window that has one). Clients are merged
lazily in arrival order; ``tenant`` is ``client-N``.
"""

from __future__ import annotations

import ast
import bisect
import csv
import heapq
import json
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.dists import interarrival_sampler

__all__ = ["ServeGenClient", "ServeGenWorkload", "load_servegen_client"]

_TRACE_RE = re.compile(r"^chunk-(\d+)-trace\.csv$")
DEFAULT_WINDOW_S = 600.0


@dataclass(frozen=True, slots=True)
class _Window:
    start_s: float
    end_s: float
    rate_rps: float
    cv: float
    iat_dist: str


@dataclass(frozen=True, slots=True)
class _Pmf:
    values: tuple[int, ...]
    cum: tuple[float, ...]

    def sampler(self, rng: random.Random) -> Callable[[], int]:
        values, cum, total = self.values, self.cum, self.cum[-1]
        rand = rng.random
        right = bisect.bisect_right
        last = len(values) - 1

        def draw() -> int:
            i = right(cum, rand() * total)
            return values[i if i <= last else last]

        return draw


@dataclass(frozen=True, slots=True)
class ServeGenClient:
    """One client's model: its rate windows and its length PMFs per dataset window."""

    client: int
    windows: tuple[_Window, ...]
    dataset_starts: tuple[float, ...]
    input_pmfs: tuple[_Pmf | None, ...]
    output_pmfs: tuple[_Pmf | None, ...]

    def pmf_index_at(self, t: float) -> int | None:
        """Index of the dataset window for time ``t`` (nearest one with both PMFs), or None."""
        if not self.dataset_starts:
            return None
        i = max(0, bisect.bisect_right(self.dataset_starts, t) - 1)
        n = len(self.dataset_starts)
        for d in range(n):
            for j in (i - d, i + d):
                if 0 <= j < n and self.input_pmfs[j] is not None and self.output_pmfs[j] is not None:
                    return j
        return None


def _parse_pmf(raw: object) -> _Pmf | None:
    pmf = ast.literal_eval(raw) if isinstance(raw, str) else raw
    if not isinstance(pmf, dict):
        raise ValueError(f"a PMF must be a dict (or its Python literal), got {type(pmf).__name__}")
    items = sorted((round(float(k)), float(v)) for k, v in pmf.items() if float(v) > 0)
    if not items:
        return None
    values: list[int] = []
    cum: list[float] = []
    acc = 0.0
    for v, p in items:
        acc += p
        values.append(max(1, v))
        cum.append(acc)
    return _Pmf(tuple(values), tuple(cum))


def load_servegen_client(folder: Path, client: int) -> ServeGenClient:
    """Read ``chunk-<client>-trace.csv`` and ``chunk-<client>-dataset.json`` from ``folder``."""
    trace_path = folder / f"chunk-{client}-trace.csv"
    data_path = folder / f"chunk-{client}-dataset.json"
    rows: list[tuple[float, float, float, str]] = []
    with trace_path.open("r", encoding="utf-8", newline="") as fh:
        for lineno, row in enumerate(csv.reader(fh), start=1):
            if not row or not row[0].strip():
                continue
            try:
                rows.append((float(row[0]), float(row[1] or 0), float(row[2] or 0), row[3].strip()))
            except (ValueError, IndexError) as exc:
                raise ValueError(f"{trace_path}:{lineno}: bad ServeGen window {row}: {exc}") from exc
    rows.sort()
    windows = []
    for i, (start, rate, cv, dist) in enumerate(rows):
        end = rows[i + 1][0] if i + 1 < len(rows) else start + DEFAULT_WINDOW_S
        if rate > 0 and end > start:
            windows.append(_Window(start, end, rate, cv, dist))
    with data_path.open("r", encoding="utf-8") as fh:
        data = json.load(fh)
    starts: list[float] = []
    inputs: list[_Pmf | None] = []
    outputs: list[_Pmf | None] = []
    for key in sorted(data, key=float):
        entry = data[key]
        try:
            inputs.append(_parse_pmf(entry.get("input_tokens", "{}")))
            outputs.append(_parse_pmf(entry.get("output_tokens", "{}")))
        except (ValueError, SyntaxError, AttributeError) as exc:
            raise ValueError(f"{data_path}: bad PMF in window {key}: {exc}") from exc
        starts.append(float(key))
    return ServeGenClient(client, tuple(windows), tuple(starts), tuple(inputs), tuple(outputs))


def _window_sampler(rng: random.Random, w: _Window) -> Callable[[], float]:
    dist = w.iat_dist.lower()
    if dist in ("gamma", "weibull") and w.cv > 0:
        return interarrival_sampler(rng, dist, w.rate_rps, w.cv)
    return interarrival_sampler(rng, "poisson", w.rate_rps)


class ServeGenWorkload:
    """Open-loop traffic from ServeGen client models, all clients merged lazily.

    ``clients``: client numbers to use (``None``: every ``chunk-N-trace.csv`` in ``folder``).
    ``time_scale`` compresses time: arrival times are multiplied by it, so rates are divided by it
    (``1/24`` plays the 24 h day in one hour at 24 times the rate). ``duration_s`` cuts the stream
    at that (scaled) time. Each client has its own generator seeded from ``seed`` and its number,
    so adding a client does not change the others' requests. Request ids are 0..n-1 in arrival order.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        clients: Iterable[int] | None = None,
        time_scale: float = 1.0,
        duration_s: float | None = None,
        seed: int = 0,
        model: str = "",
        name: str = "servegen",
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if duration_s is not None and duration_s < 0:
            raise ValueError(f"duration_s must be >= 0, got {duration_s}")
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise FileNotFoundError(f"ServeGen folder {self.folder} does not exist")
        found = sorted(
            int(m.group(1)) for p in self.folder.iterdir() if (m := _TRACE_RE.match(p.name)) is not None
        )
        if clients is None:
            self.clients = tuple(found)
        else:
            self.clients = tuple(clients)
            missing = sorted(set(self.clients) - set(found))
            if missing:
                raise FileNotFoundError(f"no chunk-N-trace.csv in {self.folder} for clients {missing}")
        if not self.clients:
            raise FileNotFoundError(f"no chunk-N-trace.csv files in {self.folder}")
        self.time_scale = time_scale
        self.duration_s = duration_s
        self.seed = seed
        self.model = model
        self.name = name
        self._models: dict[int, ServeGenClient] = {}

    def client_model(self, client: int) -> ServeGenClient:
        """The parsed model of one client (cached)."""
        model = self._models.get(client)
        if model is None:
            model = self._models[client] = load_servegen_client(self.folder, client)
        return model

    def _client_stream(self, client: int) -> Iterator[tuple[float, int, int, int]]:
        cm = self.client_model(client)
        rng = random.Random(f"tokenplane-servegen:{self.seed}:{client}")
        scale = self.time_scale
        samplers: dict[int, tuple[Callable[[], int], Callable[[], int]]] = {}
        for w in cm.windows:
            gap = _window_sampler(rng, w)
            t = w.start_s
            while True:
                t += gap()
                if t >= w.end_s:
                    break
                j = cm.pmf_index_at(t)
                if j is None:
                    return
                pair = samplers.get(j)
                if pair is None:
                    inp, out = cm.input_pmfs[j], cm.output_pmfs[j]
                    assert inp is not None and out is not None
                    pair = samplers[j] = (inp.sampler(rng), out.sampler(rng))
                yield t * scale, client, pair[0](), pair[1]()

    def arrivals(self) -> Iterator[RequestSpec]:
        streams = [self._client_stream(c) for c in self.clients]
        t_end = self.duration_s
        for rid, (t, client, prompt, output) in enumerate(heapq.merge(*streams)):
            if t_end is not None and t > t_end:
                return
            yield RequestSpec(
                request_id=rid,
                arrival_s=t,
                prompt_tokens=prompt,
                output_tokens=output,
                tenant=f"client-{client}",
                model=self.model,
                max_output_tokens=output,
            )

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        return ()

"""Windowed counters shared by replicas: the :class:`~tokenplane.core.state_store.CounterStore`
the retry budget and the admission queue's fairness counters keep their numbers in.

:class:`SyncedCounterStore` answers from memory, synchronously, as the core requires: this
replica's own adds exactly (a :class:`~tokenplane.core.state_store.SlidingWindowCounterStore`), plus
the other replicas' sums over the window as of the last sync. The Redis backend syncs every store
every ``sync_interval_s`` (0.1 s) in one script call per store, off the request path
(:data:`~tokenplane.shared_state.scripts.SYNC`): it pushes this replica's deltas since the last sync
and pulls the others' sums, kept in one-second buckets.

A store this replica has neither read nor written since its last sync is not synced (no script
call every 0.1 s for an idle replica): when it is used again, its first reads may see the others'
part as of its last sync, until the next one (at most one period later).

Staleness: the other replicas' part lags by at most one sync period plus a round trip, so a budget
may be overspent by what the other replicas spend in that time, never more; at the window's far end
the others' adds leave it a whole second at a time. While Redis is unavailable the others' part is
dropped: each replica runs on its own numbers (the one-replica bound, per replica).
"""

from __future__ import annotations

from tokenplane.core.state_store import SlidingWindowCounterStore


class SyncedCounterStore:
    """A :class:`~tokenplane.core.state_store.CounterStore` shared by replicas (see the module
    docstring); ``name`` keeps its keys apart from another store's in Redis."""

    def __init__(self, name: str, window_s: float) -> None:
        self.name = name
        self.local = SlidingWindowCounterStore(window_s)
        self.remote: dict[str, float] = {}
        self.pending: dict[str, float] = {}
        self.touched = False
        """Read or written since the last sync (the sync loop skips the store otherwise)."""

    @property
    def window_s(self) -> float:
        return self.local.window_s

    def add(self, key: str, delta: float, *, now: float) -> float:
        self.touched = True
        total = self.local.add(key, delta, now=now)
        self.pending[key] = self.pending.get(key, 0.0) + delta
        return total + self.remote.get(key, 0.0)

    def get(self, key: str, *, now: float) -> float:
        self.touched = True
        remote = self.remote.get(key)
        if remote is None:
            self.remote[key] = remote = 0.0  # known from now on: the next sync pulls it
            self.pending.setdefault(key, 0.0)
        return self.local.get(key, now=now) + remote

    def take_pending(self) -> tuple[list[str], list[float]]:
        """Every key this replica knows, and its deltas since the last call (zeroed)."""
        keys = list(self.remote.keys() | self.pending.keys())
        deltas = [self.pending.get(k, 0.0) for k in keys]
        self.pending = {}
        return keys, deltas

    def merge(self, keys: list[str], others: list[float]) -> None:
        for key, value in zip(keys, others, strict=True):
            self.remote[key] = value

    def isolate(self) -> None:
        """Redis unavailable: forget the others' part (each replica on its own numbers)."""
        for key in self.remote:
            self.remote[key] = 0.0
        self.pending = {}

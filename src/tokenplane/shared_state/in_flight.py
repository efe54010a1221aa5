"""Each instance's in-flight work, fleet-wide: what the other gateway replicas have sent there.

One replica knows exactly what it has in flight on each instance (``Upstream.in_flight`` and
``in_flight_tokens``, counted up when an attempt is dispatched and down in the attempt's
``finally``: answers, errors, cancellations and each retry's own attempt alike). The KV survival
estimate (:mod:`~tokenplane.core.routing.kv_survival`) needs the whole fleet's: with two replicas
each sees half. :class:`SharedInFlight` carries the other replicas' figures into the instance
views (``peer_outstanding_requests`` / ``peer_outstanding_tokens``) as plain data.

With the ``memory`` backend nothing is shared and the peers' figures stay 0 (the in-process
default costs nothing on the request path). With ``redis`` the backend syncs every
``sync_interval_s`` (0.1 s), off the request path, in one script call
(:data:`~tokenplane.shared_state.scripts.IN_FLIGHT`): each replica writes a *snapshot* of its own
figures (not deltas) under a key of its own that expires after :func:`ttl_s`, and reads the sum of
the other live replicas' snapshots. Nothing accumulates: a replica's share is whatever it last
wrote, and a replica that dies (or loses Redis) drops out of the others' sums within the TTL.

Staleness: the others' figures lag by up to one sync period plus a round trip; a request shorter
than that may be counted after it ended or missed while it ran. While Redis is unavailable the
peers' figures are dropped (0): the estimate falls back to scaling this replica's own work by the
instance's reported queue, as with one replica.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

PeerLoad = Mapping[str, tuple[int, int]]
"""Instance id -> (requests, tokens) the other replicas have in flight there."""

TTL_S = 2.0
"""How long a replica's snapshot outlives its last sync (at least 5 sync periods, see :func:`ttl_s`)."""


def ttl_s(sync_interval_s: float) -> float:
    """A snapshot's time to live: :data:`TTL_S`, or five sync periods if that is longer."""
    return max(TTL_S, 5 * sync_interval_s)


class SharedInFlight:
    """This replica's in-flight figures out, the others' in (see the module docstring).

    ``own`` lists (instance id, requests, tokens) this replica has in flight now; ``apply``
    receives the others' figures per instance after each sync (an empty mapping: none known)."""

    def __init__(
        self, own: Callable[[], Iterable[tuple[str, int, int]]], apply: Callable[[PeerLoad], None]
    ) -> None:
        self.own = own
        self.apply = apply
        self.peers: dict[str, tuple[int, int]] = {}

    def take_own(self) -> list[str | int]:
        """This replica's non-zero figures, flat (instance, requests, tokens), for the script."""
        return [x for i, n, t in self.own() if n > 0 for x in (i, n, t)]

    def merge(self, flat: Sequence[bytes | str | int]) -> None:
        """The other replicas' sums as the script returned them (instance, requests, tokens)."""
        peers: dict[str, tuple[int, int]] = {}
        for k, n, t in zip(flat[::3], flat[1::3], flat[2::3], strict=True):
            peers[k.decode() if isinstance(k, bytes) else str(k)] = (int(n), int(t))
        self.peers = peers
        self.apply(peers)

    def isolate(self) -> None:
        """Redis unavailable: forget the others' figures."""
        if self.peers:
            self.peers = {}
            self.apply(self.peers)

"""The KV working set shared by replicas: the tasks in progress per model pool, fleet-wide.

:class:`SharedWorkingSet` is the :class:`~tokenplane.gateway.working_set.WorkingSetStore` the
working-set limit reads with ``state: {backend: redis}``. It answers from memory, synchronously,
as the core requires: the fleet's tasks and their projected peaks as of the last sync, with this
replica's own changes since then applied at once. The Redis backend syncs it every
``sync_interval_s`` (0.1 s), off the request path, in one script call per model
(:data:`~tokenplane.shared_state.scripts.WORKING_SET`): it pushes the tasks this replica saw or saw
leave, and pulls every task in progress (a hash of peaks per model, a sorted set of expiries).

A task is one entry fleet-wide whichever replica its steps go through (the latest step's peak
wins; a step reported late never overwrites a later one), and leaves for every replica when one
sees it end or fail, or when no replica has seen a step of it for ``idle_ttl_s`` (Redis's clock).
Staleness: the other replicas' new tasks show here
one sync period plus a round trip late, so the fleet may admit, in that time, what each replica
would admit alone. The growth per step is learned by each replica from the steps it sees.
While Redis is unavailable each replica runs on its own tasks (the one-replica bound, per replica);
when it answers again, the replica pushes its own tasks and reads the fleet's again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenplane.core.task_admission import KvWorkingSetLimit
from tokenplane.core.views import RequestInfo
from tokenplane.gateway.working_set import DEFAULT_IDLE_TTL_S, InMemoryWorkingSet, task_key

LEFT = -1
"""A pending peak that says the task left."""
ENDED = 1 << 40
"""The step of a task whose outcome was posted: no later report of a step brings it back."""
MAX_PENDING_UNSHARED = 4096
"""While Redis is unavailable, the changes kept for it (beyond: only the tasks in progress)."""


class SharedWorkingSet:
    """A :class:`~tokenplane.gateway.working_set.WorkingSetStore` shared by replicas (see the
    module docstring)."""

    def __init__(self, models: Iterable[str], idle_ttl_s: float = DEFAULT_IDLE_TTL_S) -> None:
        self.local = InMemoryWorkingSet(idle_ttl_s)
        self.idle_ttl_s = idle_ttl_s
        self.models = tuple(models)
        self.shared = False  # True from a successful sync until the backend fails
        self._fleet: dict[str, dict[str, int]] = {m: {} for m in self.models}
        self._totals: dict[str, int] = dict.fromkeys(self.models, 0)
        self._pending: dict[str, dict[str, tuple[int, int]]] = {m: {} for m in self.models}

    # -- WorkingSetStore ----------------------------------------------------------------------
    def total(self, model: str, now: float) -> int:
        local = self.local.total(model, now)  # also expires this replica's idle tasks
        return self._totals.get(model, 0) if self.shared else local

    def growth(self, model: str) -> float:
        return self.local.growth(model)

    def observe(self, model: str, request: RequestInfo, limit: KvWorkingSetLimit, now: float) -> None:
        self.local.observe(model, request, limit, now)
        wf = request.workflow
        if wf is None:
            return
        task = self.local.task(model, request.tenant, wf.workflow_id)
        if task is not None:
            self._set(model, task_key(request.tenant, wf.workflow_id), *task)

    def drop(self, model: str, tenant: str, workflow_id: str) -> None:
        key = task_key(tenant, workflow_id)
        task = self.local.task(model, tenant, workflow_id)
        self.local.drop(model, tenant, workflow_id)
        if task is not None:
            self._set(model, key, task[0], LEFT)
        elif key in self._fleet.get(model, {}):  # ended for good (its outcome was posted)
            self._set(model, key, ENDED, LEFT)

    def active(self, model: str) -> int:
        return len(self._fleet.get(model, ())) if self.shared else self.local.active(model)

    # -- sync (driven by the Redis backend) -------------------------------------------------------
    def _set(self, model: str, key: str, step: int, peak: int) -> None:
        fleet = self._fleet.get(model)
        if fleet is None:
            return  # a model without a working-set limit
        pending = self._pending[model]
        if not self.shared and len(pending) >= MAX_PENDING_UNSHARED:
            pending.clear()  # the next sync pushes every task this replica has anyway
        pending[key] = (step, peak)
        old = fleet.pop(key, 0)
        if peak != LEFT:
            fleet[key] = peak
        self._totals[model] += max(peak, 0) - old

    def take_pending(self, model: str) -> list[str | int]:
        """This replica's changes since the last call, as the script's (task, peak) arguments;
        after a failure, every task this replica has in progress."""
        pending, self._pending[model] = self._pending[model], {}
        if not self.shared:
            pending.update(self.local.tasks(model))
        return [x for key, (step, peak) in pending.items() for x in (key, step, peak)]

    def merge(self, model: str, flat: Sequence[bytes | str]) -> None:
        """The fleet's tasks as the sync returned them, with the changes made here since applied."""
        fleet: dict[str, int] = {}
        for k, v in zip(flat[::2], flat[1::2], strict=True):
            value = v.decode() if isinstance(v, bytes) else v
            peak = int(float(value.split()[1]))
            if peak >= 0:
                fleet[k.decode() if isinstance(k, bytes) else k] = peak
        for key, (_, peak) in self._pending[model].items():
            fleet.pop(key, None)
            if peak != LEFT:
                fleet[key] = peak
        self._fleet[model] = fleet
        self._totals[model] = sum(fleet.values())

    def synced(self) -> None:
        self.shared = True

    def isolate(self) -> None:
        """Redis unavailable: run on this replica's own tasks until a sync succeeds again."""
        self.shared = False

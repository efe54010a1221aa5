"""Actuators: what the control loop uses to add and remove capacity.

An :class:`Actuator` has three async operations:

* ``start(n)`` cold-starts ``n`` instances and returns their handles at once, in state
  ``starting``; they turn ``ready`` later (weights loaded, health answering), which ``list`` shows;
* ``stop(ids)`` stops those instances (an instance still serving must have been drained first: the
  loop does that through the gateway's pool before it calls ``stop``);
* ``list()`` returns every instance the actuator holds, with its state and, where it knows one, the
  URL the gateway should route to.

``tracks_instances`` says whether handles are real, addressable instances (the emulated fleet, a
StatefulSet with a URL pattern) or stand-ins for a replica count (a Deployment, a command hook).
For the latter the loop does not register URLs with the gateway: a Service (or whatever the
command drives) routes to every replica, and scale-down is left to the platform's own graceful
termination.

Implementations here: :class:`CommandActuator` (a configured argv with ``{replicas}``) and
:class:`DryRunActuator` (logs what it would do). The emulated fleet is in :mod:`.emulated`, the
Kubernetes actuator in :mod:`.k8s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Protocol, runtime_checkable

import msgspec

from tokenplane.control.errors import ActuatorError, CommandFailed

log = logging.getLogger(__name__)

REPLICAS_PLACEHOLDER = "{replicas}"
DEFAULT_COMMAND_TIMEOUT_S = 60.0
OUTPUT_LIMIT_CHARS = 4000


class InstanceState(StrEnum):
    STARTING = "starting"  # started; not yet ready (loading weights, health not answering yet)
    READY = "ready"  # can take traffic once the loop activates it
    STOPPING = "stopping"  # being stopped; still holds its GPU


class InstanceHandle(msgspec.Struct, frozen=True):
    """One instance an actuator holds. ``url`` is ``None`` when the actuator tracks counts only."""

    instance_id: str
    state: InstanceState
    url: str | None = None
    started_at: float | None = None
    ready_at: float | None = None


@runtime_checkable
class Actuator(Protocol):
    name: str

    @property
    def tracks_instances(self) -> bool: ...

    async def start(self, n: int) -> list[InstanceHandle]: ...

    async def stop(self, ids: Sequence[str]) -> None: ...

    async def list(self) -> list[InstanceHandle]: ...

    async def close(self) -> None: ...


def kv(**fields: object) -> str:
    """A structured log line body: ``key=value`` pairs, values repr'd only when they need quoting."""
    parts = []
    for k, v in fields.items():
        s = str(v)
        parts.append(f"{k}={s!r}" if (" " in s or "=" in s or not s) else f"{k}={s}")
    return " ".join(parts)


class DryRunActuator:
    """Logs what the inner actuator would do and does nothing; ``list`` reads the real fleet.

    Every would-be call is also kept in :attr:`calls` (``("start", n)`` / ``("stop", ids)``).
    """

    def __init__(self, inner: Actuator) -> None:
        self.inner = inner
        self.name = f"dry-run({inner.name})"
        self.calls: list[tuple[str, object]] = []

    @property
    def tracks_instances(self) -> bool:
        return self.inner.tracks_instances

    async def start(self, n: int) -> list[InstanceHandle]:
        self.calls.append(("start", n))
        log.info("autoscaler dry_run %s", kv(actuator=self.inner.name, op="start", count=n))
        return []

    async def stop(self, ids: Sequence[str]) -> None:
        self.calls.append(("stop", tuple(ids)))
        log.info("autoscaler dry_run %s", kv(actuator=self.inner.name, op="stop", ids=",".join(ids)))

    async def list(self) -> list[InstanceHandle]:
        return await self.inner.list()

    async def close(self) -> None:
        # The inner actuator's instances are not ours to stop in a dry run.
        return None


class CommandResult(msgspec.Struct, frozen=True):
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float


def render_command(template: Sequence[str], replicas: int) -> list[str]:
    """The argv with ``{replicas}`` replaced; nothing else is interpreted and no shell is involved."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ActuatorError(f"replicas must be a non-negative int, got {replicas!r}")
    return [arg.replace(REPLICAS_PLACEHOLDER, str(replicas)) for arg in template]


class CommandActuator:
    """Runs ``scale_cmd`` (an argv list) with ``{replicas}`` set to the new total on every change.

    The command is run without a shell, in its own process group, with ``timeout_s`` (then the group
    is killed and :class:`CommandFailed` raised); its output is captured (last
    ``OUTPUT_LIMIT_CHARS`` characters) into :attr:`last_result` and the log. Replicas are tracked
    here, from ``initial_replicas``: handles ``cmd-1``, ``cmd-2``, ... are stand-ins (no URLs), ready
    ``ready_after_s`` after the command that added them succeeded. The total never goes below
    ``min_replicas`` nor above ``max_replicas``. A failed command leaves the count unchanged.
    """

    name = "command"

    def __init__(
        self,
        scale_cmd: Sequence[str],
        *,
        initial_replicas: int = 0,
        min_replicas: int = 0,
        max_replicas: int | None = None,
        timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
        ready_after_s: float = 0.0,
        env: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        cmd = list(scale_cmd)
        if not cmd or not all(isinstance(a, str) and a for a in cmd):
            raise ActuatorError("scale_cmd must be a non-empty list of non-empty strings")
        if not any(REPLICAS_PLACEHOLDER in a for a in cmd):
            raise ActuatorError(f"scale_cmd must contain {REPLICAS_PLACEHOLDER} in one of its arguments")
        if not timeout_s > 0:
            raise ActuatorError(f"timeout_s must be > 0, got {timeout_s}")
        self.scale_cmd = cmd
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.timeout_s = timeout_s
        self.ready_after_s = ready_after_s
        self.env = env
        self._clock = clock
        self._next = 1
        self._replicas: dict[str, float] = {}  # id -> started at
        for _ in range(initial_replicas):
            self._replicas[self._new_id()] = -float("inf")
        self.last_result: CommandResult | None = None
        self._lock = asyncio.Lock()

    @property
    def tracks_instances(self) -> bool:
        return False

    @property
    def replicas(self) -> int:
        return len(self._replicas)

    def _new_id(self) -> str:
        iid = f"cmd-{self._next}"
        self._next += 1
        return iid

    async def run(self, replicas: int) -> CommandResult:
        """Run the command for ``replicas`` (raises :class:`CommandFailed` unless it exits 0)."""
        argv = render_command(self.scale_cmd, replicas)
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                env=self.env,
            )
        except OSError as exc:
            raise CommandFailed(f"cannot run {argv[0]!r}: {exc}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            log.warning("autoscaler command %s", kv(event="timeout", argv=" ".join(argv), s=self.timeout_s))
            raise CommandFailed(f"{argv[0]!r} timed out after {self.timeout_s} s") from None
        result = CommandResult(
            argv=tuple(argv),
            returncode=proc.returncode if proc.returncode is not None else -1,
            stdout=out.decode(errors="replace")[-OUTPUT_LIMIT_CHARS:],
            stderr=err.decode(errors="replace")[-OUTPUT_LIMIT_CHARS:],
            duration_s=time.monotonic() - started,
        )
        self.last_result = result
        log.info(
            "autoscaler command %s",
            kv(argv=" ".join(argv), rc=result.returncode, s=f"{result.duration_s:.3f}"),
        )
        if result.returncode != 0:
            raise CommandFailed(
                f"{argv[0]!r} exited {result.returncode}: {result.stderr.strip()[-500:]}",
                returncode=result.returncode,
                output=result.stdout + result.stderr,
            )
        return result

    def _clamp(self, n: int) -> int:
        n = max(n, self.min_replicas)
        return min(n, self.max_replicas) if self.max_replicas is not None else n

    async def start(self, n: int) -> list[InstanceHandle]:
        async with self._lock:
            target = self._clamp(self.replicas + max(0, n))
            add = target - self.replicas
            if add <= 0:
                return []
            await self.run(target)
            now = self._clock()
            ids = [self._new_id() for _ in range(add)]
            for iid in ids:
                self._replicas[iid] = now
            return [self._handle(iid, now) for iid in ids]

    async def stop(self, ids: Sequence[str]) -> None:
        async with self._lock:
            known = [i for i in ids if i in self._replicas]
            room = max(0, self.replicas - self.min_replicas)
            victims = known[:room]
            if len(victims) < len(known):
                log.warning(
                    "autoscaler command %s",
                    kv(event="floor", min_replicas=self.min_replicas, kept=len(known) - len(victims)),
                )
            if not victims:
                return
            await self.run(self.replicas - len(victims))
            for iid in victims:
                del self._replicas[iid]

    def _handle(self, iid: str, now: float) -> InstanceHandle:
        started = self._replicas[iid]
        ready_at = started + self.ready_after_s
        state = InstanceState.READY if now >= ready_at else InstanceState.STARTING
        known = started > -float("inf")
        return InstanceHandle(iid, state, None, started if known else None, ready_at if known else None)

    async def list(self) -> list[InstanceHandle]:
        now = self._clock()
        return [self._handle(iid, now) for iid in self._replicas]

    async def close(self) -> None:
        return None

"""Closed-loop agentic users: tasks made of steps whose prompts grow and share prefixes.

Each user runs ``tasks_per_user`` tasks one after another. A task is a workflow of steps; a step
issues ``calls_per_step`` model calls in parallel on the same context. The prompt of step 1 is the
system prompt (shared by every user) plus a first user prompt; once *all* calls of step k have
finished, and after a think time (tool latency, a human reading), step k+1 arrives with
``prompt(k+1) = prompt(k) + output(k) (of the first call) + tool_result(k)``.

Prefix hashes, one id per full ``hash_block_tokens`` block: the system prompt's full blocks carry
ids shared by everybody; the other blocks carry ids unique to the task and stable across its steps.
Step k+1's hashes therefore start with all of step k's hashes; a block that was partial in step k
is first hashed in step k+1, with a new id (its content changed when it was extended).

Randomness is drawn from one generator per user, in an order fixed by the user's own sequence of
steps, so a seed gives the same requests whatever the fleet's timing (only arrival times follow the
finish times the simulator reports).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from tokenplane.core.views import WorkflowContext
from tokenplane.sim.workloads.base import RequestSpec
from tokenplane.sim.workloads.dists import IntDist, LengthDist

__all__ = ["AGENTIC_PRESETS", "AgenticWorkload"]

# System-prompt blocks use ids 0..n_system-1; block j of task i (numbered over all users' tasks)
# uses ((i + 1) << 32) + j, so ids depend on nothing but the task and the block position.
_TASK_ID_SHIFT = 32


@dataclass(slots=True)
class _User:
    index: int
    rng: random.Random
    draw_prompt: Callable[[], int]
    draw_tool: Callable[[], int]
    draw_output: Callable[[], int]
    draw_think: Callable[[], float]
    task: int = -1
    step: int = 0
    total_steps: int = 0
    context: int = 0
    task_id_base: int = 0
    pending: int = 0
    failed: bool = False
    first_output: int = 0
    last_finish: float = 0.0


AGENTIC_PRESETS: Mapping[str, Mapping[str, Any]] = {
    # One-shot chat: each task is a single call; users think ~30 s between conversations.
    "chat": {
        "users": 10,
        "tasks_per_user": 20,
        "steps_per_task": 1,
        "system_prompt_tokens": 500,
        "first_prompt_tokens": LengthDist.lognormal(600, 1.0, min=1, max=16_000),
        "tool_result_tokens": LengthDist.fixed(0),
        "output_tokens": LengthDist.lognormal(300, 1.0, min=1, max=4_000),
        "think_time_s": LengthDist.lognormal(30.0, 1.0, max=600.0),
        "user_start_spread_s": 60.0,
        "max_context_tokens": None,
    },
    # Coding assistant: 10-20 steps, each adding a tool result (file reads, test output).
    "copilot": {
        "users": 10,
        "tasks_per_user": 3,
        "steps_per_task": IntDist(10, 20),
        "system_prompt_tokens": 2_000,
        "first_prompt_tokens": LengthDist.lognormal(1_500, 1.0, min=1, max=16_000),
        "tool_result_tokens": LengthDist.lognormal(600, 1.5, min=1, max=16_000),
        "output_tokens": LengthDist.lognormal(250, 1.0, min=1, max=4_000),
        "think_time_s": LengthDist.lognormal(2.0, 1.0, max=60.0),
        "user_start_spread_s": 30.0,
        "max_context_tokens": 64_000,
    },
    # Deep research: about 50 steps of searches and page reads.
    "research": {
        "users": 5,
        "tasks_per_user": 1,
        "steps_per_task": IntDist(40, 60),
        "system_prompt_tokens": 3_000,
        "first_prompt_tokens": LengthDist.lognormal(500, 1.0, min=1, max=8_000),
        "tool_result_tokens": LengthDist.lognormal(1_500, 1.0, min=1, max=16_000),
        "output_tokens": LengthDist.lognormal(300, 1.0, min=1, max=4_000),
        "think_time_s": LengthDist.lognormal(3.0, 1.0, max=60.0),
        "user_start_spread_s": 30.0,
        "max_context_tokens": 128_000,
        # Contexts reach 100k tokens: hash in 256-token blocks (16 KV blocks) so that matching a
        # prompt walks ~500 ids, not ~8,000; at most 255 reusable tokens per call are not counted.
        "hash_block_tokens": 256,
    },
    # Long-running autonomous agents: hundreds to thousands of small steps under a context cap.
    "autonomous": {
        "users": 5,
        "tasks_per_user": 1,
        "steps_per_task": IntDist(200, 1000),
        "system_prompt_tokens": 4_000,
        "first_prompt_tokens": LengthDist.lognormal(800, 1.0, min=1, max=8_000),
        "tool_result_tokens": LengthDist.lognormal(150, 1.0, min=1, max=2_000),
        "output_tokens": LengthDist.lognormal(120, 1.0, min=1, max=2_000),
        "think_time_s": LengthDist.lognormal(1.0, 1.0, max=30.0),
        "user_start_spread_s": 30.0,
        "max_context_tokens": 200_000,
        "hash_block_tokens": 256,  # as for research
    },
}


class AgenticWorkload:
    """Closed-loop agent traffic (see the module docstring for the semantics).

    ``steps_per_task``: an int or an :class:`IntDist` (uniform, inclusive). ``think_time_s`` is drawn
    between steps and between tasks. A step whose next prompt would exceed ``max_context_tokens`` is
    not issued: the task ends there (step 1 is clipped to the cap). When any call of a step fails
    (``ok=False``), the task is abandoned once all of that step's calls have ended, and the user
    starts the next task after a think time.

    :meth:`arrivals` resets the state and yields every user's first step (users start uniformly in
    ``[0, user_start_spread_s]``); :meth:`on_finished` yields the follow-ups. Run one simulation per
    :meth:`arrivals` call.
    """

    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = AGENTIC_PRESETS

    def __init__(
        self,
        *,
        users: int,
        tasks_per_user: int = 1,
        steps_per_task: int | IntDist = 1,
        calls_per_step: int = 1,
        system_prompt_tokens: int = 0,
        first_prompt_tokens: LengthDist | None = None,
        tool_result_tokens: LengthDist | None = None,
        output_tokens: LengthDist | None = None,
        think_time_s: LengthDist | None = None,
        user_start_spread_s: float = 0.0,
        hash_block_tokens: int = 16,
        seed: int = 0,
        max_context_tokens: int | None = None,
        model: str = "",
        tenant: str = "agents",
        name: str = "agentic",
    ) -> None:
        if users < 0:
            raise ValueError(f"users must be >= 0, got {users}")
        if tasks_per_user < 0:
            raise ValueError(f"tasks_per_user must be >= 0, got {tasks_per_user}")
        steps = IntDist.of(steps_per_task)
        if steps.min < 1:
            raise ValueError(f"steps_per_task must be >= 1, got {steps_per_task}")
        if calls_per_step < 1:
            raise ValueError(f"calls_per_step must be >= 1, got {calls_per_step}")
        if system_prompt_tokens < 0:
            raise ValueError(f"system_prompt_tokens must be >= 0, got {system_prompt_tokens}")
        if user_start_spread_s < 0:
            raise ValueError(f"user_start_spread_s must be >= 0, got {user_start_spread_s}")
        if hash_block_tokens < 1:
            raise ValueError(f"hash_block_tokens must be >= 1, got {hash_block_tokens}")
        if max_context_tokens is not None and max_context_tokens <= system_prompt_tokens:
            raise ValueError(
                f"max_context_tokens ({max_context_tokens}) must exceed system_prompt_tokens "
                f"({system_prompt_tokens})"
            )
        self.users = users
        self.tasks_per_user = tasks_per_user
        self.steps_per_task = steps
        self.calls_per_step = calls_per_step
        self.system_prompt_tokens = system_prompt_tokens
        self.first_prompt_tokens = first_prompt_tokens or LengthDist.lognormal(1000, 1.0, min=1)
        self.tool_result_tokens = tool_result_tokens or LengthDist.lognormal(500, 1.0)
        self.output_tokens = output_tokens or LengthDist.lognormal(200, 1.0, min=1)
        self.think_time_s = think_time_s or LengthDist.lognormal(2.0, 1.0)
        self.user_start_spread_s = user_start_spread_s
        self.hash_block_tokens = hash_block_tokens
        self.seed = seed
        self.max_context_tokens = max_context_tokens
        self.model = model
        self.tenant = tenant
        self.name = name
        self._system_hashes = tuple(range(system_prompt_tokens // hash_block_tokens))
        self._users: list[_User] = []
        self._by_request: dict[int, _User] = {}
        self._next_request = 0

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> AgenticWorkload:
        """A workload from :data:`AGENTIC_PRESETS` (chat, copilot, research, autonomous), overridden."""
        if name not in AGENTIC_PRESETS:
            raise ValueError(f"unknown agentic preset {name!r}; expected one of {sorted(AGENTIC_PRESETS)}")
        params: dict[str, Any] = {**AGENTIC_PRESETS[name], "name": f"agentic-{name}", **overrides}
        return cls(**params)

    def expected_calls_per_user(self) -> float:
        """Planned model calls per user: tasks x mean steps x calls per step.

        An upper bound when the context cap ends tasks early or failures abandon them.
        """
        return self.tasks_per_user * self.steps_per_task.mean_value() * self.calls_per_step

    def expected_calls(self) -> float:
        """Planned model calls over all users."""
        return self.users * self.expected_calls_per_user()

    @property
    def in_flight(self) -> int:
        """Calls issued and not yet reported finished."""
        return len(self._by_request)

    # -- the Workload protocol -------------------------------------------------------------------

    def arrivals(self) -> Iterator[RequestSpec]:
        self._users = []
        self._by_request = {}
        self._next_request = 0
        starts: list[tuple[float, _User]] = []
        for u in range(self.users):
            rng = random.Random(f"tokenplane-agentic:{self.seed}:{u}")
            user = _User(
                index=u,
                rng=rng,
                draw_prompt=self.first_prompt_tokens.int_sampler(rng),
                draw_tool=self.tool_result_tokens.int_sampler(rng),
                draw_output=self.output_tokens.int_sampler(rng),
                draw_think=self.think_time_s.float_sampler(rng),
            )
            self._users.append(user)
            start = rng.uniform(0.0, self.user_start_spread_s) if self.user_start_spread_s > 0 else 0.0
            starts.append((start, user))
        starts.sort(key=lambda su: (su[0], su[1].index))
        first: list[RequestSpec] = []
        for start, user in starts:
            first.extend(self._start_task(user, start))
        return iter(first)

    def on_finished(self, spec: RequestSpec, finish_s: float, ok: bool) -> Sequence[RequestSpec]:
        user = self._by_request.pop(spec.request_id, None)
        if user is None:
            return ()
        user.pending -= 1
        if not ok:
            user.failed = True
        user.last_finish = max(user.last_finish, finish_s)
        if user.pending > 0:
            return ()
        # The whole step is done: the tool result / think time happens now, drawn in a fixed order.
        think = max(0.0, user.draw_think())
        at = user.last_finish + think
        if user.failed or user.step >= user.total_steps:
            return self._start_task(user, at)
        tool = max(0, user.draw_tool())
        context = user.context + user.first_output + tool
        if self.max_context_tokens is not None and context > self.max_context_tokens:
            return self._start_task(user, at)
        user.context = context
        user.step += 1
        return self._issue_step(user, at)

    # -- internals -------------------------------------------------------------------------------

    def _start_task(self, user: _User, at: float) -> list[RequestSpec]:
        user.task += 1
        if user.task >= self.tasks_per_user:
            return []
        user.total_steps = self.steps_per_task.sample(user.rng)
        user.step = 1
        user.task_id_base = (user.index * self.tasks_per_user + user.task + 1) << _TASK_ID_SHIFT
        context = self.system_prompt_tokens + max(1, user.draw_prompt())
        if self.max_context_tokens is not None:
            context = min(context, self.max_context_tokens)
        user.context = context
        return self._issue_step(user, at)

    def _issue_step(self, user: _User, at: float) -> list[RequestSpec]:
        block = self.hash_block_tokens
        n_full = user.context // block
        n_system = len(self._system_hashes)
        # Task-owned full blocks keep their ids across steps; a block is first hashed once it is full.
        base = user.task_id_base
        hashes = self._system_hashes[:n_full] + tuple(range(base + n_system, base + n_full))
        workflow = WorkflowContext(
            workflow_id=f"u{user.index}-t{user.task}", step=user.step, total_steps=user.total_steps
        )
        user.pending = self.calls_per_step
        user.failed = False
        user.last_finish = at
        specs: list[RequestSpec] = []
        for call in range(self.calls_per_step):
            out = max(1, user.draw_output())
            if call == 0:
                user.first_output = out
            rid = self._next_request
            self._next_request += 1
            self._by_request[rid] = user
            specs.append(
                RequestSpec(
                    request_id=rid,
                    arrival_s=at,
                    prompt_tokens=user.context,
                    output_tokens=out,
                    block_hashes=hashes,
                    hash_block_tokens=block,
                    tenant=self.tenant,
                    model=self.model,
                    max_output_tokens=out,
                    workflow=workflow,
                )
            )
        return specs

"""The command hook (argv, no shell, timeout, captured output) and the dry-run wrapper."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import pytest

from tokenplane.control import ActuatorError, CommandActuator, CommandFailed, DryRunActuator, InstanceState
from tokenplane.control.actuators import render_command

SCRIPT = """
import json, sys, time
out = sys.argv[1]
with open(out, "a") as f:
    f.write(json.dumps(sys.argv[2:]) + "\\n")
if "--sleep" in sys.argv:
    time.sleep(5)
print("scaled", sys.argv[2:])
sys.exit(3 if "--fail" in sys.argv else 0)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "scale.py"
    p.write_text(SCRIPT)
    return p


def _calls(out: Path) -> list[list[str]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_command_gets_the_replica_count_as_argv(script: Path, tmp_path: Path) -> None:
    out = tmp_path / "argv.jsonl"
    hostile = "deploy/x; rm -rf / $(whoami)"
    act = CommandActuator(
        [sys.executable, str(script), str(out), "--replicas={replicas}", hostile], initial_replicas=1
    )

    async def body() -> None:
        started = await act.start(2)
        assert [h.instance_id for h in started] == ["cmd-2", "cmd-3"]
        assert all(h.state is InstanceState.READY and h.url is None for h in started)
        assert act.replicas == 3
        assert act.last_result is not None and "scaled" in act.last_result.stdout
        assert act.last_result.returncode == 0
        await act.stop(["cmd-2"])
        assert act.replicas == 2
        assert [h.instance_id for h in await act.list()] == ["cmd-1", "cmd-3"]

    asyncio.run(body())
    # The hostile argument reaches the command verbatim: no shell ever saw it.
    assert _calls(out) == [["--replicas=3", hostile], ["--replicas=2", hostile]]


def test_command_failure_and_timeout_leave_the_count_unchanged(script: Path, tmp_path: Path) -> None:
    out = tmp_path / "argv.jsonl"

    async def body() -> None:
        failing = CommandActuator([sys.executable, str(script), str(out), "{replicas}", "--fail"])
        with pytest.raises(CommandFailed) as err:
            await failing.start(1)
        assert err.value.returncode == 3 and "scaled" in err.value.output
        assert failing.replicas == 0
        slow = CommandActuator(
            [sys.executable, str(script), str(out), "{replicas}", "--sleep"], timeout_s=0.5
        )
        with pytest.raises(CommandFailed, match="timed out"):
            await slow.start(1)
        assert slow.replicas == 0

    asyncio.run(body())


def test_command_floor_and_ready_delay(script: Path, tmp_path: Path) -> None:
    out = tmp_path / "argv.jsonl"
    now = [100.0]
    act = CommandActuator(
        [sys.executable, str(script), str(out), "{replicas}"],
        min_replicas=1,
        max_replicas=2,
        ready_after_s=30.0,
        clock=lambda: now[0],
    )

    async def body() -> None:
        await act.start(5)
        assert act.replicas == 2
        assert {h.state for h in await act.list()} == {InstanceState.STARTING}
        now[0] += 30.0
        assert {h.state for h in await act.list()} == {InstanceState.READY}
        await act.stop(["cmd-1", "cmd-2"])
        assert act.replicas == 1

    asyncio.run(body())
    assert _calls(out) == [["2"], ["1"]]


def test_command_validation() -> None:
    with pytest.raises(ActuatorError, match=r"\{replicas\}"):
        CommandActuator(["kubectl", "scale", "deploy/x"])
    with pytest.raises(ActuatorError):
        CommandActuator([])
    with pytest.raises(ActuatorError):
        render_command(["x", "{replicas}"], "3; reboot")  # type: ignore[arg-type]
    with pytest.raises(ActuatorError):
        render_command(["x", "{replicas}"], -1)
    assert render_command(["x", "--n={replicas}", "{other}"], 4) == ["x", "--n=4", "{other}"]


def test_dry_run_logs_and_does_nothing(
    script: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "argv.jsonl"
    inner = CommandActuator([sys.executable, str(script), str(out), "{replicas}"], initial_replicas=2)
    dry = DryRunActuator(inner)

    async def body() -> None:
        with caplog.at_level(logging.INFO, logger="tokenplane.control"):
            assert await dry.start(3) == []
            await dry.stop(["cmd-1"])
        assert len(await dry.list()) == 2  # reads the real fleet
        await dry.close()

    asyncio.run(body())
    assert not out.exists()
    assert inner.replicas == 2
    assert dry.calls == [("start", 3), ("stop", ("cmd-1",))]
    lines = [r.getMessage() for r in caplog.records]
    assert any("dry_run" in m and "op=start" in m and "count=3" in m for m in lines)
    assert any("dry_run" in m and "op=stop" in m and "ids=cmd-1" in m for m in lines)

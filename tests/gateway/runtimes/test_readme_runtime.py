"""The README's "Adding a runtime" example is a working adapter."""

from __future__ import annotations

import re
from pathlib import Path

from tokenplane.gateway.runtimes import RuntimeMetrics

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readmes_runtime_example_builds_an_adapter_that_reads_its_names() -> None:
    section = README.read_text().split("### Adding a runtime", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the section has no python example"
    namespace: dict[str, object] = {}
    exec(compile(code.group(1), "README.md", "exec"), namespace)
    runtime = namespace["RUNTIME"]
    page = "# TYPE tgi_queue_size gauge\ntgi_queue_size 3\ntgi_batch_current_size 2\ntgi_request_count 9\n"
    assert runtime.parse_metrics(page) == RuntimeMetrics(running=2, waiting=3)  # type: ignore[attr-defined]
    assert runtime.continuation("chat", {"messages": []}, "x", 1) is None  # type: ignore[attr-defined]
    assert runtime.capabilities.metrics  # type: ignore[attr-defined]

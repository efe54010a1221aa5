"""``scan_events``: the SSE scanner the relay runs on every upstream read (its fuzzer is
fuzz/fuzz_sse_scanner.py; these are the inputs it found)."""

from __future__ import annotations

import pytest

from tokenplane.gateway.proxy import scan_events


@pytest.mark.parametrize(
    "buf",
    [b"\n\n\n", b"\n\n\n\n\n", b": keep-alive\n\n\n", b'data: {"a":1}\n\n\n'],
)
def test_an_odd_run_of_newlines_is_blank_lines_not_a_crash(buf: bytes) -> None:
    """Found by the fuzzer against the compiled build: the last separator overlapping a third
    newline made the scanner slice backwards, which mypyc answers with SystemError."""
    end = buf.rfind(b"\n\n") + 2
    fwd, done, _n, _span, malformed = scan_events(buf, end)
    assert (fwd, done, malformed) == (end, False, False)


def test_the_usual_event_and_done() -> None:
    buf = b'data: {"a":1}\n\ndata: [DONE]\n\n'
    assert scan_events(buf, len(buf)) == (len(buf), True, 1, (6, 13), False)

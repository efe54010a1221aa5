"""Run one fuzzer for a while: ``python fuzz/run.py --seconds 600 request_parser``.

Targets: ``request_parser`` (the fast front's HTTP/1.1 reading, fuzz_request_parser.py) and
``sse_scanner`` (the SSE event scanner and the stream splicer's rewriting, fuzz_sse_scanner.py).
The corpus lives in ``fuzz/.corpus/TARGET`` (seeded from the harness's own ``seeds()`` and grown
by libFuzzer, kept between runs, not committed); a crash leaves its input in ``fuzz/.crashes/``
and the exit status is 1. Prints what libFuzzer reported last: executions, coverage (``cov``:
edges covered), features (``ft``) and corpus size (``--json`` for JSON).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = {"request_parser": "fuzz_request_parser.py", "sse_scanner": "fuzz_sse_scanner.py"}
_STATUS = re.compile(rb"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)")
_DONE = re.compile(rb"Done (\d+) runs in (\d+) second")


def run(
    target: str,
    seconds: int,
    workdir: Path,
    max_len: int = 8192,
    seed: int | None = None,
    runs: int | None = None,
) -> dict[str, object]:
    """``seed`` and ``runs`` make a run repeatable (CI's: the same inputs every time, so a red run is
    a regression, not a new discovery; the long campaigns draw a fresh seed)."""
    harness = HERE / TARGETS[target]
    corpus = workdir / ".corpus" / target
    crashes = workdir / ".crashes"
    corpus.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    repeat = [f"-seed={seed}"] if seed is not None else []
    repeat += [f"-runs={runs}"] if runs is not None else []
    env = dict(os.environ, PYTHONHASHSEED="0") if seed is not None else None
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            str(harness),
            str(corpus),
            f"-max_total_time={seconds}",
            f"-max_len={max_len}",
            "-timeout=20",
            "-rss_limit_mb=2048",
            f"-artifact_prefix={crashes}/{target}-",
            "-print_final_stats=1",
            *repeat,
        ],
        capture_output=True,
        env=env,
    )
    out = proc.stderr
    status = _STATUS.findall(out)
    done = _DONE.search(out)
    last = status[-1] if status else (b"0", b"0", b"0", b"0")
    artifact = re.search(rb"Test unit written to (\S+)", out)
    result: dict[str, object] = {
        "target": target,
        "seconds": round(time.monotonic() - started, 1),
        "executions": int(done.group(1)) if done else int(last[0]),
        "coverage_edges": int(last[1]),
        "features": int(last[2]),
        "corpus": int(last[3]),
        "crashed": proc.returncode != 0,
        "exit_status": proc.returncode,
        "artifact": artifact.group(1).decode() if artifact else None,
    }
    if proc.returncode != 0:
        # atheris prints an uncaught exception's traceback on stdout and libFuzzer its report on
        # stderr: both go in the tail, the traceback last, with the input that crashed.
        report = proc.stderr.decode("utf-8", "replace").splitlines()
        report = [line for line in report if not line.startswith("INFO: Instrumenting")]
        result["log_tail"] = "\n".join(report)[-2500:] + "\n" + proc.stdout.decode("utf-8", "replace")[-3000:]
        if artifact and Path(artifact.group(1).decode()).is_file():
            result["input_base64"] = base64.b64encode(Path(artifact.group(1).decode()).read_bytes()).decode()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", choices=sorted(TARGETS))
    p.add_argument("--seconds", type=int, default=600)
    p.add_argument("--workdir", type=Path, default=HERE, help="where .corpus/ and .crashes/ go")
    p.add_argument("--max-len", type=int, default=8192)
    p.add_argument("--seed", type=int, help="libFuzzer's seed (and PYTHONHASHSEED=0): a repeatable run")
    p.add_argument("--runs", type=int, help="stop after this many inputs (or --seconds, whichever first)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    result = run(a.target, a.seconds, a.workdir, a.max_len, a.seed, a.runs)
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 1 if result["crashed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

from __future__ import annotations

from pathlib import Path

import pytest

from tokenplane.sim.workloads import traces as traces_mod
from tokenplane.sim.workloads.traces import ENV_VAR, TraceNotFound, require_trace, traces_dir


def test_explicit_path_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    assert traces_dir(tmp_path / "explicit") == tmp_path / "explicit"
    assert traces_dir(str(tmp_path)) == tmp_path


def test_env_var_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert traces_dir() == tmp_path


def test_cwd_relative_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    project = tmp_path / "project"
    (tmp_path / "shared" / "traces").mkdir(parents=True)
    project.mkdir()
    monkeypatch.chdir(project)
    assert traces_dir() == (tmp_path / "shared" / "traces").resolve()


def test_repo_relative_fallback_is_computed_from_the_source_file() -> None:
    src_file = Path(traces_mod.__file__).resolve()
    if src_file.parents[3].name != "src":
        pytest.skip(f"tokenplane is installed ({src_file}), not run from a source checkout")
    repo_root = src_file.parents[4]
    assert (repo_root / "src" / "tokenplane" / "sim" / "workloads" / "traces.py") == src_file


def test_none_when_nothing_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "a" / "b" / "c" / "d" / "e" / "traces.py"
    monkeypatch.setattr(traces_mod, "__file__", str(fake))
    assert traces_dir() is None


def test_require_trace(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text("{}\n")
    assert require_trace("x.jsonl", tmp_path) == tmp_path / "x.jsonl"
    assert require_trace(tmp_path / "x.jsonl", None) == tmp_path / "x.jsonl"
    with pytest.raises(TraceNotFound, match=ENV_VAR):
        require_trace("x.jsonl", None)
    with pytest.raises(TraceNotFound, match=r"missing\.jsonl"):
        require_trace("missing.jsonl", tmp_path)
    with pytest.raises(FileNotFoundError):
        require_trace(tmp_path / "nope.csv", None)

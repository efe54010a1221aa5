"""The README is the front door: each command in its shell blocks names a real subcommand with options
that exist and files that are in the repository, and its example gateway config is a valid config
once the placeholder key digest is filled in."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main
import yaml

from tokenplane.cli import app
from tokenplane.gateway.config import hash_key, parse_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _tokenplane_commands() -> list[list[str]]:
    """``tokenplane`` invocations of the bash blocks, without comments, split as the shell would."""
    out = []
    for block in _blocks("bash"):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r"&&|\|\|", line):
                words = shlex.split(part)
                if words and words[0].endswith("bin/tokenplane"):
                    out.append(words[1:])
    return out


COMMANDS = _tokenplane_commands()


def test_readme_has_the_two_commands_and_every_subcommand() -> None:
    bash = "\n".join(_blocks("bash"))
    assert "tokenplane up" in bash and ".venv/bin/pytest" in bash
    used = {words[0] for words in COMMANDS if words}
    assert {"up", "serve", "emulate", "simulate", "validate", "plan", "top"} <= used


@pytest.mark.parametrize("words", COMMANDS, ids=[" ".join(w) for w in COMMANDS])
def test_readme_command_parses_and_names_existing_files(words: list[str]) -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    command = commands.get(words[0]) if words else None
    assert command is not None, f"no subcommand {words[:1]}"
    known = {opt for p in command.params for opt in getattr(p, "opts", [])}
    for word in words[1:]:
        if word.startswith("--"):
            assert word.split("=", 1)[0] in known, f"{word} is not an option of {words[0]}"
        elif word.endswith((".yaml", ".json")) and "/" in word:
            assert (ROOT / word).is_file(), f"README names {word}, which is not in the repository"


def test_readme_gateway_config_is_valid() -> None:
    configs = [yaml.safe_load(b) for b in _blocks("yaml")]
    gateway = next(c for c in configs if isinstance(c, dict) and "instances" in c and "tenants" in c)
    for tenant in gateway["tenants"]:
        tenant["api_keys"] = [hash_key("sk-readme")]
    config = parse_config(gateway)
    assert {i.id for i in config.instances} == {"vllm-0", "vllm-1"}


def test_readme_scenario_is_valid() -> None:
    from tokenplane.sim.scenario import parse_scenario

    configs = [yaml.safe_load(b) for b in _blocks("yaml")]
    scenario = next(c for c in configs if isinstance(c, dict) and "fleet" in c)
    parsed = parse_scenario(scenario)
    assert [r.name for r in parsed.runs] == ["round-robin", "prefix-affinity"]

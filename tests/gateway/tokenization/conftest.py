from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))

from tiny_tokenizer import make_tokenizer_folder


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's tokenizer (ChatML template), built with the ``tokenizers`` library alone."""
    return make_tokenizer_folder(tmp_path_factory.mktemp("tok") / "tiny")

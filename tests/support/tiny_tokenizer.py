"""A tokenizer folder (``tokenizer.json`` + ``tokenizer_config.json`` with a ChatML template), made
offline with the ``tokenizers`` library alone, in the layout ``transformers`` saves: the same
training text, special tokens and template as :mod:`tiny_model` (which also needs torch and
transformers). ``vocab_size`` larger than the default gives a tokenizer of realistic size for
benches (merges learnt from Python's standard library sources as well).

    python tests/support/tiny_tokenizer.py OUTDIR [VOCAB_SIZE]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_model import CHAT_TEMPLATE, SPECIAL_TOKENS, VOCAB_SIZE, _corpus


def make_tokenizer_folder(path: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _corpus()
    if vocab_size > VOCAB_SIZE:  # real, varied text (Python's own sources), to learn that many merges from
        import sysconfig

        stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
        corpus += [f.read_text(encoding="utf-8", errors="replace") for f in stdlib]
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.save(str(path / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "pad_token": "<pad>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "</s>"],
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return path


if __name__ == "__main__":
    make_tokenizer_folder(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else VOCAB_SIZE)

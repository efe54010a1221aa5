"""A tiny Llama model and tokenizer, made offline in seconds, for tests against a real serving runtime.

Nothing is downloaded: a byte-level BPE tokenizer is trained on generated text, and a LlamaForCausalLM
with random weights (fixed seed) is saved beside it. Its output is random text, which is all a control
plane's tests need: real tokens, real timing, real batching, real KV cache and metrics.

Runs under any Python that has torch, transformers and tokenizers (the vLLM venv), and its text helpers
(`sample_text`) need none of them, so the project venv can import this module too:

    python tests/support/tiny_model.py OUTDIR
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 1000
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]

# ChatML. `continue_final_message` works with it: the renderer cuts the text right after the final
# message's content, so the assistant turn stays open.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_ONSETS = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "pl"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "nd", "ck"]


def _vocabulary(rng: random.Random, size: int = 600) -> list[str]:
    words: set[str] = {"the", "a", "of", "and", "to", "in", "is", "answer", "question", "token", "plane"}
    while len(words) < size:
        n = rng.choice([1, 1, 2, 2, 3])
        words.add("".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n)))
    return sorted(words)


def sample_text(n_words: int, seed: int = 0) -> str:
    """Deterministic pseudo-English text: words, numbers and punctuation, in sentences."""
    rng = random.Random(SEED)
    words = _vocabulary(rng)
    rng = random.Random(seed)
    out: list[str] = []
    sentence: list[str] = []
    for _ in range(n_words):
        if rng.random() < 0.05:
            sentence.append(str(rng.randint(0, 9999)))
        else:
            sentence.append(rng.choice(words))
        if len(sentence) >= rng.randint(6, 16):
            out.append(" ".join(sentence).capitalize() + rng.choice([".", ".", ",", "?", "!"]))
            sentence = []
    if sentence:
        out.append(" ".join(sentence).capitalize() + ".")
    return " ".join(out)


def _corpus() -> list[str]:
    lines = [sample_text(80, seed=i) for i in range(400)]
    # The chat scaffolding, so that role names and newlines get their own merges.
    lines += [f"<|im_start|>{role}\n{sample_text(20, seed=1000 + i)}<|im_end|>\n" for i, role in
              enumerate(["system", "user", "assistant"] * 20)]  # fmt: skip
    return lines


def make_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "</s>"],
        model_max_length=4096,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def make_tiny_model(path: Path) -> Path:
    """Build tokenizer and model into `path` (created if missing) and return it. Deterministic."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(path)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<s>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<pad>"),
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(path, safe_serialization=True)
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUTDIR", file=sys.stderr)
        return 2
    out = make_tiny_model(Path(argv[1]))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

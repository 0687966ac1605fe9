"""A tokenizer made here, for the lab's stand-in model: no hub can be reached from the lab.

SGLang's benchmark client loads the server's tokenizer (`/model_info` `tokenizer_path`) with
`transformers.AutoTokenizer`. This writes the two files a "fast" tokenizer directory needs:
`tokenizer.json` (the `tokenizers` library's format: a word-level vocabulary split on
whitespace) and `tokenizer_config.json`. Decoding random ids gives words the stand-in counts
as one token each, so prompt lengths in the benchmark mean what they say.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_SIZE = 32000
SPECIALS = ("<unk>", "<s>", "</s>")


def _added(token_id: int, content: str) -> dict:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def tokenizer_json(vocab_size: int = VOCAB_SIZE) -> dict:
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), vocab_size)})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added(i, token) for i, token in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def tokenizer_config(context_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
    }


def write_tokenizer(directory: Path, context_length: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json()))
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(context_length), indent=2) + "\n")

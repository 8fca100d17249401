"""Small local text data sets and a tokenizer made on the spot (nothing is downloaded)."""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def stdlib_documents(count: int, max_chars: int = 4000) -> list[str]:
    """The first `count` top-level stdlib modules' sources (text every machine has)."""
    files = sorted(STDLIB.glob("[a-m]*.py"))[:count]
    return [f.read_text(encoding="utf-8", errors="replace")[:max_chars] for f in files]


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def train_tokenizer(directory: Path, texts: list[str], vocab_size: int = 300) -> Path:
    """A byte-level BPE tokenizer trained on `texts`, saved as directory/tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory

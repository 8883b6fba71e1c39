"""Tokenizers from the `tokenizers` library: WordLevel (the tutorials'), BPE or Unigram.

Special tokens and their ids are defined here once. Every model splits text the same way:
a Metaspace pre-tokenizer marks word starts with "▁" and punctuation is split off, so the
Metaspace decoder gives back natural text ("Hello, world." not "Hello , world .").
Tokenizers are trained on the training split only and saved as JSON (safe to load: no code).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

UNK, PAD, SOS, EOS = "[UNK]", "[PAD]", "[SOS]", "[EOS]"
SPECIAL_TOKENS = [UNK, PAD, SOS, EOS]
UNK_ID, PAD_ID, SOS_ID, EOS_ID = range(len(SPECIAL_TOKENS))


class TokenizerError(ValueError):
    """A tokenizer file that does not fit this pipeline."""


def _new_tokenizer(tokenizer_type: str, vocab_size: int, min_frequency: int) -> tuple[Tokenizer, Any]:
    if tokenizer_type == "wordlevel":
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS, min_frequency=min_frequency)
    elif tokenizer_type == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token=UNK))
        trainer = trainers.BpeTrainer(special_tokens=SPECIAL_TOKENS, vocab_size=vocab_size,
                                      min_frequency=min_frequency, show_progress=False)
    elif tokenizer_type == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(special_tokens=SPECIAL_TOKENS, vocab_size=vocab_size,
                                          unk_token=UNK, show_progress=False)
    else:
        raise TokenizerError(f"unknown tokenizer_type {tokenizer_type!r}")
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation()])
    tokenizer.decoder = decoders.Metaspace()
    return tokenizer, trainer


def train_tokenizer(sentences: Iterable[str], tokenizer_type: str, vocab_size: int,
                    min_frequency: int) -> Tokenizer:
    """Train a tokenizer on `sentences` (the training split only)."""
    tokenizer, trainer = _new_tokenizer(tokenizer_type, vocab_size, min_frequency)
    tokenizer.train_from_iterator(sentences, trainer=trainer)
    check_special_tokens(tokenizer)
    return tokenizer


def check_special_tokens(tokenizer: Tokenizer) -> None:
    """The pipeline hard-codes the special ids; a tokenizer that disagrees is refused."""
    for token_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != token_id:
            raise TokenizerError(f"tokenizer maps {token} to {tokenizer.token_to_id(token)}, expected {token_id}")


def tokenizer_from_json(text: str) -> Tokenizer:
    """Load a tokenizer from its JSON text (as stored in checkpoints), checking the special ids."""
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as error:  # the library raises plain Exception on malformed JSON
        raise TokenizerError(f"not a valid tokenizer: {error}") from None
    check_special_tokens(tokenizer)
    return tokenizer


def load_tokenizer(path: Path) -> Tokenizer:
    return tokenizer_from_json(Path(path).read_text(encoding="utf-8"))


def encode_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def decode_ids(tokenizer: Tokenizer, ids: Iterable[int]) -> str:
    """Detokenize, dropping special tokens, into natural text."""
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

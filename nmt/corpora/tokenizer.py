"""Tokenizers from the `tokenizers` library: WordLevel (the tutorials'), BPE or Unigram.

Special tokens and their ids are defined here once: [UNK], [PAD], [SOS], [EOS] take ids 0..3, and a
new run's tag tokens (`config.tokenizer_tags`: <BT> for back-translation, <2fr> for "into French")
follow them as special tokens of both tokenizers, so a tag is one token with one id, and `decode_ids`
drops it like the four fixed ones. `tag_id` finds a tag's id and refuses a tokenizer that lacks it.
Text is only ever text: `encode_texts` never reads a special token's string typed in a sentence as
that token (a typed "<2fr>" or "[EOS]" is split into ordinary pieces); the pipeline adds control
ids itself (a tag by its id). Every model splits text the same way:
a Metaspace pre-tokenizer marks word starts with "▁" and punctuation is split off, so the
Metaspace decoder gives back natural text ("Hello, world." not "Hello , world .").

Tokenizers are trained on the training split only, from an iterator (`train_tokenizers` takes a
function that streams the sentence pairs afresh for each pass), and saved as JSON beside the
checkpoints with atomic writes (safe to load: JSON holds no code). Checkpoints carry them too.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from tokenizers import Encoding, Tokenizer, decoders, models, pre_tokenizers, trainers

from nmt.atomic_files import atomic_write_bytes
from config import target_languages, target_tag, tokenizer_tags

UNK, PAD, SOS, EOS = "[UNK]", "[PAD]", "[SOS]", "[EOS]"
SPECIAL_TOKENS = [UNK, PAD, SOS, EOS]
UNK_ID, PAD_ID, SOS_ID, EOS_ID = range(len(SPECIAL_TOKENS))


class TokenizerError(ValueError):
    """A tokenizer file that does not fit this pipeline."""


def _new_tokenizer(tokenizer_type: str, vocab_size: int, min_frequency: int,
                   tags: Sequence[str] = ()) -> tuple[Tokenizer, Any]:
    special = [*SPECIAL_TOKENS, *tags]
    if tokenizer_type == "wordlevel":
        tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
        trainer = trainers.WordLevelTrainer(special_tokens=special, vocab_size=vocab_size,
                                            min_frequency=min_frequency, show_progress=False)
    elif tokenizer_type == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token=UNK))
        trainer = trainers.BpeTrainer(special_tokens=special, vocab_size=vocab_size,
                                      min_frequency=min_frequency, show_progress=False)
    elif tokenizer_type == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(special_tokens=special, vocab_size=vocab_size,
                                          unk_token=UNK, show_progress=False)
    else:
        raise TokenizerError(f"unknown tokenizer_type {tokenizer_type!r}")
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation()])
    tokenizer.decoder = decoders.Metaspace()
    return tokenizer, trainer


def train_tokenizer(sentences: Iterable[str], tokenizer_type: str, vocab_size: int,
                    min_frequency: int, tags: Sequence[str] = ()) -> Tokenizer:
    """Train a tokenizer on `sentences` (the training split only), reserving `tags` as special tokens
    with the ids after the four fixed ones."""
    tokenizer, trainer = _new_tokenizer(tokenizer_type, vocab_size, min_frequency, tags)
    tokenizer.train_from_iterator(sentences, trainer=trainer)
    check_special_tokens(tokenizer)
    return tokenizer


def tag_id(tokenizer: Tokenizer, tag: str, owner: str) -> int:
    """The id of the reserved tag token `tag` (<BT>, <2fr>) in `tokenizer`, whose origin `owner` names
    (a checkpoint, an exported model). A tag must be a special token: only those are never split and
    never decoded. A TokenizerError in one line when the tokenizer does not reserve it."""
    found = tokenizer.token_to_id(tag)
    special = {token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special}
    if found is None or tag not in special:
        raise TokenizerError(f"tag {tag} is not in the tokenizers of {owner}; reserve it with --reserved_tags when "
                             f"training the first model")
    return found


def missing_target_tag(tok_src: Tokenizer, model_config: dict[str, Any]) -> str:
    """A target-language tag that a model of several target languages needs and its source
    tokenizer lacks; "" when none is missing (always, for a one-target model)."""
    targets = target_languages(model_config)
    tags = [target_tag(lang) for lang in targets] if len(targets) > 1 else []
    return next((tag for tag in tags if tok_src.token_to_id(tag) is None), "")


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
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TokenizerError(f"cannot read tokenizer {path}: {error}") from None
    return tokenizer_from_json(text)


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    """sha256 of the tokenizer's JSON: what a data store tokenized with it is keyed by."""
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()


def tokenizer_paths(folder: Path, config: dict[str, Any]) -> tuple[Path, Path]:
    """Where an experiment keeps its source and target tokenizers (one file for a joint vocabulary)."""
    folder = Path(folder)
    if config["joint_vocab"]:
        joint = folder / f"tokenizer_{config['lang_src']}-{config['lang_tgt']}.json"
        return joint, joint
    return folder / f"tokenizer_{config['lang_src']}.json", folder / f"tokenizer_{config['lang_tgt']}.json"


def train_tokenizers(config: dict[str, Any],
                     pairs: Callable[[], Iterator[tuple[str, str]]]) -> tuple[Tokenizer, Tokenizer]:
    """Source and target tokenizers (one shared one with `joint_vocab`) of the configured type,
    trained on the sentence pairs `pairs()` yields; it is called once per pass. Both reserve the
    run's tags (`config.tokenizer_tags`), so a tag has the same id on either side."""
    settings = (config["tokenizer_type"], config["vocab_size"], config["min_frequency"], tokenizer_tags(config))
    if config["joint_vocab"]:
        joint = train_tokenizer((text for pair in pairs() for text in pair), *settings)
        return joint, joint
    return (train_tokenizer((src for src, _ in pairs()), *settings),
            train_tokenizer((tgt for _, tgt in pairs()), *settings))


def save_tokenizers(folder: Path, config: dict[str, Any], tok_src: Tokenizer, tok_tgt: Tokenizer) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    for path, tokenizer in zip(tokenizer_paths(folder, config), (tok_src, tok_tgt)):
        atomic_write_bytes(path, tokenizer.to_str().encode("utf-8"))


def load_tokenizers(folder: Path, config: dict[str, Any]) -> tuple[Tokenizer, Tokenizer]:
    src_path, tgt_path = tokenizer_paths(folder, config)
    return load_tokenizer(src_path), load_tokenizer(tgt_path)


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str], ids_only: bool = False) -> list[Encoding]:
    """Each of `texts` tokenized as text, without [SOS]/[EOS]: a special token's string typed in it
    ([EOS], [PAD], <BT>, <2fr>) is split like any other text and never read as that token, so that
    control ids (the ends, padding, a tag, which the caller adds by id) only ever come from the
    pipeline. The library matches special tokens in the text unless its encode_special_tokens is
    set, on the tokenizer object, which is why every encoding of text goes through here.
    `ids_only`: encodings without tokens and offsets (faster, for the data store)."""
    tokenizer.encode_special_tokens = True
    if ids_only:
        return tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
    return tokenizer.encode_batch(list(texts), add_special_tokens=False)


def encode_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return encode_texts(tokenizer, [text])[0].ids


def decode_ids(tokenizer: Tokenizer, ids: Iterable[int]) -> str:
    """Detokenize, dropping special tokens, into natural text."""
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

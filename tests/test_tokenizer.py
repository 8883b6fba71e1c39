"""tokenizer.py: lossless round trip to natural text, fixed special ids, min_frequency."""
from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, trainers

import tokenizer as tk
from tokenizer import (EOS_ID, PAD_ID, SOS_ID, SPECIAL_TOKENS, UNK_ID, TokenizerError, decode_ids, encode_ids,
                       load_tokenizer, tokenizer_from_json, train_tokenizer)

SENTENCES = [
    "Hello, world.",
    "Where is the station?",
    "I don't know what you're talking about!",
    "Tom's dog isn't here; it's outside: in the garden.",
    '"Yes," she said, "it is 3.5 km (about 2 miles) away..."',
    "È così bella da guardare.",
    "Amo questa parte dell'Australia.",
    "Perché non vieni più? Dov'è la città?",
    "L'uomo dice: «Buongiorno!»",
    "It costs $20 - or 18€ - at 10:30.",
]


@pytest.mark.parametrize("kind", ["wordlevel", "bpe", "unigram"])
def test_round_trip_gives_back_natural_text(kind: str) -> None:
    tokenizer = train_tokenizer(SENTENCES * 3, kind, 300, 1)
    for sentence in SENTENCES:
        ids = encode_ids(tokenizer, sentence)
        assert UNK_ID not in ids
        assert decode_ids(tokenizer, ids) == sentence
        # special tokens around the sentence vanish on decoding
        assert decode_ids(tokenizer, [SOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]) == sentence


def test_punctuation_is_split_off_words() -> None:
    tokenizer = train_tokenizer(SENTENCES, "wordlevel", 0, 1)
    tokens = tokenizer.encode("Hello, world.", add_special_tokens=False).tokens
    assert len(tokens) == 4  # Hello , world .
    # so "world" and "world." share one entry instead of two
    assert tokenizer.encode("world", add_special_tokens=False).ids == [tokenizer.token_to_id(tokens[2])]


def test_special_ids_are_0_to_3_in_every_kind() -> None:
    assert (UNK_ID, PAD_ID, SOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert SPECIAL_TOKENS == ["[UNK]", "[PAD]", "[SOS]", "[EOS]"]
    for kind in ("wordlevel", "bpe", "unigram"):
        tokenizer = train_tokenizer(SENTENCES, kind, 200, 1)
        assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]


def test_min_frequency_leaves_rare_words_unknown() -> None:
    corpus = ["the cat sleeps", "the cat eats", "a zebra runs"]
    frequent_only = train_tokenizer(corpus, "wordlevel", 0, 2)
    assert encode_ids(frequent_only, "zebra") == [UNK_ID]
    assert encode_ids(frequent_only, "cat") != [UNK_ID]
    assert decode_ids(frequent_only, encode_ids(frequent_only, "the zebra")) == "the"  # [UNK] is skipped
    everything = train_tokenizer(corpus, "wordlevel", 0, 1)
    assert encode_ids(everything, "zebra") != [UNK_ID]
    assert frequent_only.get_vocab_size() < everything.get_vocab_size()


def test_saved_tokenizer_loads_identically(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(SENTENCES, "wordlevel", 0, 1)
    path = tmp_path / "tokenizer_en.json"
    path.write_text(tokenizer.to_str(), encoding="utf-8")
    loaded = load_tokenizer(path)
    for sentence in SENTENCES:
        assert encode_ids(loaded, sentence) == encode_ids(tokenizer, sentence)
        assert decode_ids(loaded, encode_ids(loaded, sentence)) == sentence


def test_tokenizer_with_other_special_ids_is_refused() -> None:
    other = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    other.train_from_iterator(["a b c"], trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[SOS]",
                                                                                   "[EOS]"]))
    with pytest.raises(TokenizerError, match=r"\[UNK\]"):
        tk.check_special_tokens(other)
    with pytest.raises(TokenizerError, match=r"\[UNK\]"):
        tokenizer_from_json(other.to_str())
    with pytest.raises(TokenizerError, match="not a valid tokenizer"):
        tokenizer_from_json("{not json")

"""tokenizer.py: lossless round trip to natural text, fixed special ids, min_frequency, reserved tags."""
from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, trainers

from nmt.corpora import tokenizer as tk
from config import TERM_TAGS, get_config
from nmt.corpora.tokenizer import (EOS_ID, PAD_ID, SOS_ID, SPECIAL_TOKENS, UNK_ID, TokenizerError, decode_ids, encode_ids,
                       load_tokenizer, load_tokenizers, save_tokenizers, tag_id, tokenizer_from_json, train_tokenizer,
                       train_tokenizers)

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
    tokenizer = train_tokenizer(SENTENCES, "wordlevel", 10_000, 1)
    tokens = tokenizer.encode("Hello, world.", add_special_tokens=False).tokens
    assert len(tokens) == 4  # Hello , world .
    # so "world" and "world." share one entry instead of two
    assert tokenizer.encode("world", add_special_tokens=False).ids == [tokenizer.token_to_id(tokens[2])]


def test_special_ids_are_0_to_3_in_every_kind() -> None:
    for kind in ("wordlevel", "bpe", "unigram"):
        tokenizer = train_tokenizer(SENTENCES, kind, 200, 1)
        assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]


def test_min_frequency_leaves_rare_words_unknown() -> None:
    corpus = ["the cat sleeps", "the cat eats", "a zebra runs"]
    frequent_only = train_tokenizer(corpus, "wordlevel", 10_000, 2)
    assert encode_ids(frequent_only, "zebra") == [UNK_ID]
    assert encode_ids(frequent_only, "cat") != [UNK_ID]
    assert decode_ids(frequent_only, encode_ids(frequent_only, "the zebra")) == "the"  # [UNK] is skipped
    everything = train_tokenizer(corpus, "wordlevel", 10_000, 1)
    assert encode_ids(everything, "zebra") != [UNK_ID]
    assert frequent_only.get_vocab_size() < everything.get_vocab_size()


def test_wordlevel_keeps_the_most_frequent_words_up_to_vocab_size() -> None:
    corpus = ["a a a a b b b c c d", "a b c d e"]
    capped = train_tokenizer(corpus, "wordlevel", len(SPECIAL_TOKENS) + 3, 1)
    assert capped.get_vocab_size() == len(SPECIAL_TOKENS) + 3
    assert UNK_ID not in encode_ids(capped, "a b c") and encode_ids(capped, "d e") == [UNK_ID, UNK_ID]


def test_saved_tokenizer_loads_identically(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(SENTENCES, "wordlevel", 10_000, 1)
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


def numbered_pairs(count: int, prefix: str = "w") -> list[tuple[str, str]]:
    return [(f"The word {prefix}{i} is here.", f"La parola {prefix}{i} è qui.") for i in range(count)]


def test_experiment_tokenizers_are_saved_and_loaded(tmp_path: Path) -> None:
    config = {**get_config(), "min_frequency": 1}
    tok_src, tok_tgt = train_tokenizers(config, lambda: iter(numbered_pairs(10)))
    assert tok_src.token_to_id("▁word") is not None and tok_src.token_to_id("▁parola") is None
    assert tok_tgt.token_to_id("▁parola") is not None and tok_tgt.token_to_id("▁word") is None
    save_tokenizers(tmp_path / "separate", config, tok_src, tok_tgt)
    assert sorted(p.name for p in (tmp_path / "separate").iterdir()) == ["tokenizer_en.json", "tokenizer_it.json"]
    loaded = load_tokenizers(tmp_path / "separate", config)
    assert [t.to_str() for t in loaded] == [tok_src.to_str(), tok_tgt.to_str()]

    joint_config = {**config, "joint_vocab": True}
    joint_src, joint_tgt = train_tokenizers(joint_config, lambda: iter(numbered_pairs(10)))
    assert joint_src is joint_tgt
    assert joint_src.token_to_id("▁parola") is not None and joint_src.token_to_id("▁word") is not None
    save_tokenizers(tmp_path / "joint", joint_config, joint_src, joint_tgt)
    assert [p.name for p in (tmp_path / "joint").iterdir()] == ["tokenizer_en-it.json"]
    with pytest.raises(TokenizerError, match="tokenizer_en.json"):
        load_tokenizers(tmp_path / "joint", config)  # the separate files are not there


@pytest.mark.parametrize("kind", ["wordlevel", "bpe", "unigram"])
def test_a_run_reserves_its_tags_whole_after_the_fixed_ids_and_never_decodes_them(kind: str) -> None:
    """<BT> (reserved_tags), <2fr> and <2it> (a model of two targets), in every tokenizer type: ids 4, 5
    and 6 on both sides, and gone from decoded output; typed in a text, a tag or a fixed special
    token is text: split into ordinary pieces, never its id."""
    config = {**get_config(), "tokenizer_type": kind, "vocab_size": 300, "min_frequency": 1, "lang_tgt": "fr+it",
              "datasource": "europarl:1:<2fr>,news:1:<2it>"}
    tok_src, tok_tgt = train_tokenizers(config, lambda: iter([(s, s) for s in SENTENCES * 3]))
    for tokenizer in (tok_src, tok_tgt):
        tk.check_special_tokens(tokenizer)
        assert [tag_id(tokenizer, tag, "the test") for tag in ("<BT>", "<2fr>", "<2it>")] == [4, 5, 6]
        for sentence in SENTENCES[:4]:
            ids = encode_ids(tokenizer, sentence)
            typed = encode_ids(tokenizer, f"<2fr> {sentence} [EOS] [PAD] <BT> [SOS] <2it>")
            assert len(typed) > len(ids) + 5 and not {4, 5, 6, PAD_ID, SOS_ID, EOS_ID} & set(typed)
            assert decode_ids(tokenizer, [SOS_ID, 5, *ids, EOS_ID]) == sentence
            assert decode_ids(tokenizer, [SOS_ID, 4, *ids]) == sentence


def test_a_tag_the_tokenizer_does_not_reserve_is_one_line() -> None:
    plain = train_tokenizer(["a <XX> b"], "wordlevel", 10_000, 1)  # the text's "<XX>" is split: no tag
    with pytest.raises(TokenizerError) as refused:
        tag_id(plain, "<XX>", "weights/m/ckpt_00000010.pt")
    assert str(refused.value) == ("tag <XX> is not in the tokenizers of weights/m/ckpt_00000010.pt; reserve it with "
                                  "--reserved_tags when training the first model")
    plain.add_tokens(["<XX>"])  # an added token, but not a special one: decoding would keep it
    with pytest.raises(TokenizerError, match="tag <XX> is not in the tokenizers"):
        tag_id(plain, "<XX>", "weights/m/ckpt_00000010.pt")


def test_term_annotation_reserves_its_three_tags_whole() -> None:
    """With term_annotation the joint tokenizer reserves config.TERM_TAGS after <BT>: one id each,
    never decoded, and typed in a text they are text."""
    config = {**get_config(), "tokenizer_type": "bpe", "vocab_size": 300, "min_frequency": 1, "joint_vocab": True,
              "term_annotation": 0.25}
    tok_src, tok_tgt = train_tokenizers(config, lambda: iter([(s, s) for s in SENTENCES * 3]))
    assert tok_src is tok_tgt
    ids = [tag_id(tok_src, tag, "the test") for tag in TERM_TAGS]
    assert ids == [5, 6, 7]
    typed = encode_ids(tok_src, "<term> Hello <term_as> world <term_end>")
    assert not set(ids) & set(typed)
    assert decode_ids(tok_src, [ids[0], *encode_ids(tok_src, "Hello"), ids[1], ids[2]]) == "Hello"
    plain, _ = train_tokenizers({**config, "term_annotation": 0.0}, lambda: iter([(s, s) for s in SENTENCES * 3]))
    assert plain.token_to_id("<term>") is None

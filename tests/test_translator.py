"""translator.py: the PyTorch engine keeps the input order across length-sorted batches, translates
a source over the model's limit in pieces (no truncation), returns n-best lists and samples, refuses options it cannot
decode with, and gives the cross-attention of the source it translates; a model of several target
languages gets the chosen language's tag after [SOS] in its encoder input and refuses a missing or
foreign target_lang in one line, a one-target model gets no tag; each source is tokenized once, on
both engines; tags never reach an output. (The CTranslate2 engine is checked against it in
tests/test_export.py.)

`several_targets` (imported by the tests of translate.py, evaluate.py, serve.py and export.py) is
an untrained tiny model of en -> fr+it whose tokenizers reserve <2fr> and <2it> after the four fixed
ids, saved as the newest checkpoint of its experiment."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, trainers

from nmt.training.checkpoint import save_checkpoint
from nmt.inference.confidence import Calibrator
from conftest import TOY_SOURCE
from nmt.inference.glossary import check_pairs
from config import PRESETS, get_config, validate_config, weights_dir
from model import Transformer, build_model
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, SPECIAL_TOKENS, encode_ids, train_tokenizer
from nmt.inference import translator as translator_module
from nmt.inference.translator import CTranslate2Translator, DecodingOptions, TorchTranslator, TranslatorError

TAGS = ["<2fr>", "<2it>"]
WORDS = "the cat dog sees eats a red house bread".split()


def tagged_tokenizer(sentences: list[str]) -> Tokenizer:
    """A WordLevel tokenizer set up as tokenizer.py sets one up, with TAGS reserved as special tokens
    after [UNK] [PAD] [SOS] [EOS], as a new run of several target languages reserves them."""
    tokenizer = train_tokenizer(sentences, "wordlevel", 100, 1)
    tokenizer.train_from_iterator(sentences, trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS + TAGS,
                                                                       min_frequency=1))
    assert [tokenizer.token_to_id(tag) for tag in TAGS] == [4, 5]
    return tokenizer


@dataclass
class SeveralTargets:
    """An en -> fr+it model with random weights, saved as its experiment's checkpoint."""

    model: Transformer
    tok_src: Tokenizer
    tok_tgt: Tokenizer
    config: dict[str, Any]
    checkpoint: Path

    def translator(self) -> TorchTranslator:
        return TorchTranslator(self.model, self.tok_src, self.tok_tgt, self.config)

    @property
    def args(self) -> list[str]:
        """The command-line options that name this model's experiment."""
        return ["--datasource", self.config["datasource"], "--lang_tgt", "fr+it", "--model_folder",
                self.config["model_folder"]]


SENTENCES = ["the cat sees the dog .", "a red house .", "the dog eats bread .", "the cat ."]


@pytest.fixture(scope="module")
def several_targets(tmp_path_factory: pytest.TempPathFactory) -> SeveralTargets:
    sentences = [" ".join(WORDS[i:] + WORDS[:i]) + " ." for i in range(len(WORDS))]
    tok_src, tok_tgt = tagged_tokenizer(sentences), tagged_tokenizer(sentences)
    config = {**get_config(), **PRESETS["tiny"], "d_model": 16, "d_ff": 32, "seq_len": 16, "lang_tgt": "fr+it",
              "datasource": "corpus_fr:1:<2fr>,corpus_it:1:<2it>",
              "model_folder": str(tmp_path_factory.mktemp("several") / "weights")}
    validate_config(config)
    torch.manual_seed(3)
    model = build_model(config, tok_src.get_vocab_size(), tok_tgt.get_vocab_size()).eval()
    with torch.no_grad():
        model.projection_layer.proj.bias[3] = 1.0  # [EOS]: outputs end at several lengths
    state = {"config": config, "model": model.state_dict(),
             "tokenizers": {"src": tok_src.to_str(), "tgt": tok_tgt.to_str()}}
    # scored as if validated: the best checkpoint, which inference loads by default
    checkpoint = save_checkpoint(weights_dir(config), state, 1, keep=1, metrics={"bleu": 1.0, "chrf": 1.0, "loss": 9.0},
                                 best_metric="bleu")
    return SeveralTargets(model, tok_src, tok_tgt, config, checkpoint)


class EncoderInputs:
    """Records every batch of token ids the model's source embedding receives (the encoder's input)."""

    def __init__(self, model: Transformer) -> None:
        self.batches: list[torch.Tensor] = []
        self.handle = model.src_embed.register_forward_pre_hook(lambda module, args: self.batches.append(args[0]))

    def rows(self) -> list[list[int]]:
        return [row for batch in self.batches for row in batch.tolist()]


class CountingTokenizer:
    """A tokenizer that counts the sentences it is asked to encode, passing everything through."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.sentences = tokenizer, 0

    def encode(self, text: str, *args: Any, **kwargs: Any) -> Any:
        self.sentences += 1
        return self.tokenizer.encode(text, *args, **kwargs)

    def encode_batch(self, texts: list[str], *args: Any, **kwargs: Any) -> Any:
        self.sentences += len(texts)
        return self.tokenizer.encode_batch(texts, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)

    def __setattr__(self, name: str, value: Any) -> None:  # a setting (encode_special_tokens) is the tokenizer's
        if name in ("tokenizer", "sentences"):
            super().__setattr__(name, value)
        else:
            setattr(self.tokenizer, name, value)


@pytest.fixture(scope="module")
def mixed_lengths(toy_translator) -> list[str]:
    return [s for s, _ in toy_translator.pairs(24, seed=7)]


def test_no_repeat_ngram_size_minus_one_is_the_models_own_and_a_given_size_wins(toy_translator) -> None:
    """A model whose training picked 1 (train.py: the config's -1 becomes the size it measured)
    never repeats a word under the options' default, -1; 0 given turns the ban off, and the toy
    repeats the word its source repeats."""
    source, repeated = "one one two.", "due uno uno."
    banned = TorchTranslator(toy_translator.model, toy_translator.tok_src, toy_translator.tok_tgt,
                             dict(get_config(), seq_len=toy_translator.seq_len, no_repeat_ngram_size=1))
    assert banned.describe()["no_repeat_ngram_size"] == 1
    for beam_size in (1, 3):
        [found] = banned.translate_best([source], DecodingOptions(beam_size=beam_size))
        words = found.rstrip(".").split()
        assert len(words) == len(set(words)) and found != repeated, found
        assert banned.translate_best([source], DecodingOptions(beam_size=beam_size, no_repeat_ngram_size=0)) == \
            [repeated]
    # A model from before train.py picked one (its config says -1, or 0) bans nothing.
    assert toy_translator.translator().describe()["no_repeat_ngram_size"] == 0
    assert toy_translator.translator().translate_best([source], DecodingOptions()) == [repeated]


def test_batches_keep_the_input_order(toy_translator, mixed_lengths: list[str]) -> None:
    translator = toy_translator.translator()
    together = translator.translate_best(mixed_lengths, DecodingOptions(batch_size=5))
    one_by_one = [translator.translate_best([s], DecodingOptions())[0] for s in mixed_lengths]
    assert together == one_by_one
    expected = dict(toy_translator.pairs(24, seed=7))
    assert sum(out == expected[s] for s, out in zip(mixed_lengths, together)) >= 22
    beam = translator.translate_best(mixed_lengths, DecodingOptions(beam_size=3, batch_size=5))
    assert sum(a == b for a, b in zip(beam, together)) >= 22
    assert translator.translate([], DecodingOptions()) == []
    assert not toy_translator.model.training


def test_the_pytorch_engine_decodes_in_the_dtype_precision_chooses(toy_translator, mixed_lengths: list[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU that is bf16 (or fp16): asked for bf16 here, the CPU decodes under bf16 autocast, the
    weights of the (validation's) model untouched, and the confident toy model translates the same."""
    translator = toy_translator.translator()
    fp32 = translator.translate_best(mixed_lengths, DecodingOptions(beam_size=3))
    seen = []
    real_decode = TorchTranslator.decode

    def recording(self, src, *args):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return real_decode(self, src, *args)

    monkeypatch.setattr(translator_module, "inference_dtype", lambda device: torch.bfloat16)
    monkeypatch.setattr(TorchTranslator, "decode", recording)
    bf16 = translator.translate_best(mixed_lengths, DecodingOptions(beam_size=3))
    assert seen and set(seen) == {torch.bfloat16}
    assert next(toy_translator.model.parameters()).dtype == torch.float32
    assert sum(a == b for a, b in zip(bf16, fp32)) >= 22


def test_n_best_and_samples(toy_translator, mixed_lengths: list[str]) -> None:
    translator = toy_translator.translator()
    best = translator.translate(mixed_lengths[:4], DecodingOptions(beam_size=4, n_best=3))
    assert [len(h) for h in best] == [3, 3, 3, 3]
    for hypotheses in best:
        assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
        assert len({h.text for h in hypotheses}) == 3
    options = DecodingOptions(sampling_topk=4, temperature=1.5, n_best=5)
    first = translator.translate(mixed_lengths[:4], options)
    assert [len(h) for h in first] == [5, 5, 5, 5]
    assert toy_translator.translator().translate(mixed_lengths[:4], options) == first  # same seed, same samples
    assert translator.translate(mixed_lengths[:4], options) != first  # the stream goes on


def test_a_source_over_the_limit_is_translated_in_pieces(toy_translator, capsys: pytest.CaptureFixture) -> None:
    """No truncation: a sentence of 32 words (the toy's limit is 18 tokens) is cut at the space
    nearest its middle, both halves are translated, and their translations joined; its n-best
    hypotheses join the halves' k-th ones, scored by their mean."""
    translator = toy_translator.translator()
    words = ("one two three four five six seven eight " * 4).split()
    halves = [" ".join(words[:16]), " ".join(words[16:])]
    recorder = EncoderInputs(toy_translator.model)
    try:
        out = translator.translate_best([" ".join(words), "one two three."], DecodingOptions())
    finally:
        recorder.handle.remove()
    assert out == [" ".join(translator.translate_best(halves, DecodingOptions())), "tre due uno."]
    assert sorted(len(row) - row.count(PAD_ID) for row in recorder.rows()) == [6, 18, 18]  # [SOS] pieces [EOS]
    assert capsys.readouterr().err == ""
    text = translator.translate_text([" ".join(words), "", "one two three."], DecodingOptions(), False)
    assert text.lines == [out[0], "", out[1]] and text.split_for_length == 1
    options = DecodingOptions(beam_size=3, n_best=2)
    [joined] = translator.translate([" ".join(words)], options)
    pieces = translator.translate(halves, options)
    assert joined == [(f"{pieces[0][k].text} {pieces[1][k].text}", (pieces[0][k].score + pieces[1][k].score) / 2)
                      for k in range(2)]


def test_cross_attention_follows_the_translation_path(toy_translator, capsys: pytest.CaptureFixture) -> None:
    """The heatmap's source is the one `translate` decodes (tokenized by the translator, with [SOS]
    and [EOS]; the first piece of a sentence over the model's limit), its outputs the greedy
    translation and what ended it, each row of each head a distribution over the source; the
    model's mode is restored."""
    translator = toy_translator.translator()
    toy_translator.model.train()
    try:
        attention = translator.cross_attention("one two three.")
        assert toy_translator.model.training
    finally:
        toy_translator.model.eval()
    assert attention.source_tokens == ["[SOS]", "▁one", "▁two", "▁three", ".", "[EOS]"]  # Metaspace marks word starts
    assert attention.output_tokens == ["▁tre", "▁due", "▁uno", ".", "[EOS]"]
    heads = torch.tensor(attention.heads)
    assert heads.shape == (2, 5, 6)
    torch.testing.assert_close(heads.sum(dim=-1), torch.ones(2, 5))
    torch.testing.assert_close(torch.tensor(attention.weights), heads.mean(dim=0))
    long_sentence = " ".join(("one two three four five six seven eight " * 4).split())
    first_piece = translator.cross_attention(long_sentence)  # over the limit: its first piece
    assert first_piece.source_tokens == ["[SOS]", *[f"▁{word}" for word in long_sentence.split()[:16]], "[EOS]"]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("options, message", [
    (dict(beam_size=2, n_best=3), "n_best 3 needs a beam"),
    (dict(beam_size=2, sampling_topk=5), "needs beam_size 1"),
    (dict(beam_size=0), "at least 1"),
])
def test_options_it_cannot_decode_with_are_refused(options: dict, message: str) -> None:
    with pytest.raises(TranslatorError, match=message):
        DecodingOptions().replace(**options)


@pytest.mark.parametrize("target_lang, tag_id", [("fr", 4), ("it", 5)])
def test_the_encoder_gets_the_target_languages_tag_after_sos(several_targets, target_lang: str, tag_id: int) -> None:
    translator = several_targets.translator()
    recorder = EncoderInputs(several_targets.model)
    try:
        translator.translate(SENTENCES, DecodingOptions(target_lang=target_lang, beam_size=2))
        translator.cross_attention(SENTENCES[0], target_lang)
    finally:
        recorder.handle.remove()
    expected = [[SOS_ID, tag_id, *several_targets.tok_src.encode(s, add_special_tokens=False).ids]
                for s in SENTENCES]
    rows = recorder.rows()
    for ids in expected:
        assert any(row[:len(ids)] == ids for row in rows), (ids, rows)
    assert all(row[:2] == [SOS_ID, tag_id] for row in rows)  # the attention's rerun too


def test_a_model_of_several_targets_refuses_a_missing_or_foreign_target_lang(several_targets) -> None:
    translator = several_targets.translator()
    with pytest.raises(TranslatorError, match=r"^this model translates into fr, it: choose one with target_lang$"):
        translator.translate(SENTENCES, DecodingOptions())
    with pytest.raises(TranslatorError, match=r"^target_lang 'de' is not a target language of this model \(fr, it\)$"):
        translator.translate(SENTENCES, DecodingOptions(target_lang="de"))
    assert translator.describe()["target_languages"] == ["fr", "it"]


def test_a_one_target_model_takes_no_tag(toy_translator, mixed_lengths: list[str]) -> None:
    translator = toy_translator.translator()
    recorder = EncoderInputs(toy_translator.model)
    try:
        plain = translator.translate_best(mixed_lengths[:3], DecodingOptions())
        named = translator.translate_best(mixed_lengths[:3], DecodingOptions(target_lang="it"))
    finally:
        recorder.handle.remove()
    assert plain == named
    for sentence in mixed_lengths[:3]:
        ids = [SOS_ID, *toy_translator.tok_src.encode(sentence, add_special_tokens=False).ids, EOS_ID]
        assert sum(row[:len(ids)] == ids for row in recorder.rows()) == 2  # as today: nothing between [SOS] and it
    with pytest.raises(TranslatorError, match=r"target_lang 'fr' is not a target language of this model \(it\)"):
        translator.translate(mixed_lengths[:1], DecodingOptions(target_lang="fr"))


def test_tags_never_reach_an_output(several_targets) -> None:
    """A model that produces nothing but tag tokens translates into empty text."""
    translator = several_targets.translator()
    with torch.no_grad():
        bias = several_targets.model.projection_layer.proj.bias
        saved = bias.clone()
        bias[4:6] = 100.0
    try:
        outputs = translator.translate(SENTENCES, DecodingOptions(target_lang="fr", beam_size=2, n_best=2))
    finally:
        with torch.no_grad():
            bias.copy_(saved)
    assert [[h.text for h in hypotheses] for hypotheses in outputs] == [["", ""]] * len(SENTENCES)


def test_special_tokens_typed_in_a_sentence_are_text_on_both_engines(several_targets, tmp_path: Path) -> None:
    """A typed <2it> does not override target_lang fr, and a typed [EOS], [PAD], [SOS] or <BT> is no
    control token: the encoder gets [SOS] <2fr>, the sentence's ordinary pieces and [EOS] (then
    padding), in the translation and in the attention's rerun; CTranslate2 gets the same pieces and
    translates alike."""
    import export
    typed = ["<2it> the cat [EOS]", "[PAD] a dog <BT>", "[SOS] ."]  # each within the model's 13 tokens
    pieces = [encode_ids(several_targets.tok_src, sentence) for sentence in typed]
    assert all(len(ids) > 4 and not {PAD_ID, SOS_ID, EOS_ID, 4, 5} & set(ids) for ids in pieces)
    translator = several_targets.translator()
    recorder = EncoderInputs(several_targets.model)
    options = DecodingOptions(target_lang="fr", beam_size=1)
    try:
        expected = translator.translate_best(typed, options)
        attention = translator.cross_attention(typed[0], "fr")
    finally:
        recorder.handle.remove()
    rows = {tuple(row[:len(row) - next(i for i, token in enumerate(reversed(row)) if token != PAD_ID)])
            for row in recorder.rows()}
    assert rows == {(SOS_ID, 4, *ids, EOS_ID) for ids in pieces}
    assert attention.source_tokens[:2] == ["[SOS]", "<2fr>"] and attention.source_tokens.count("[EOS]") == 1
    export.export_model(several_targets.model, several_targets.config, several_targets.tok_src,
                        several_targets.tok_tgt, tmp_path / "ct2", "float32")
    ct2 = CTranslate2Translator(tmp_path / "ct2")
    assert ct2.encode(typed[:1], ct2.source_tag("fr"))[0].tokens == attention.source_tokens[1:-1]
    assert ct2.translate_best(typed, options) == expected


def test_each_source_is_tokenized_once(several_targets, tmp_path: Path) -> None:
    """On both engines, whatever the batching: once to measure, cut, sort and encode."""
    import export
    torch_counter = CountingTokenizer(several_targets.tok_src)
    ours = TorchTranslator(several_targets.model, torch_counter, several_targets.tok_tgt, several_targets.config)
    options = DecodingOptions(beam_size=1, target_lang="it", batch_size=3)
    expected = ours.translate(SENTENCES * 2, options)
    assert torch_counter.sentences == len(SENTENCES) * 2
    export.export_model(several_targets.model, several_targets.config, several_targets.tok_src,
                        several_targets.tok_tgt, tmp_path / "ct2", "float32")
    ct2 = CTranslate2Translator(tmp_path / "ct2")
    ct2.tok_src = ct2_counter = CountingTokenizer(ct2.tok_src)
    assert [h[0].text for h in ct2.translate(SENTENCES * 2, options)] == [h[0].text for h in expected]
    assert ct2_counter.sentences == len(SENTENCES) * 2


# ---------------------------------------------------------------------------- glossaries and confidence

def test_a_glossary_reaches_the_search_and_leaves_free_sentences_alone(toy_translator) -> None:
    """"two" -> "otto", which the toy model writes only for "eight": through the translator (text,
    segmentation, batches) every sentence holding "two" gets the term (where the search places it:
    tests/test_decoding.py shows it in place on a model that knows the term); sentences without a
    term, in the same batches, come out exactly as without the glossary, scores and all."""
    translator = toy_translator.translator()
    lines = ["one two three.", "four five six.", "seven one.", "six two five four."]
    free = DecodingOptions(beam_size=4)
    glossary = translator.build_glossary(check_pairs([["two", "otto"]], 10))
    options, note = free.with_glossary(glossary, 5)
    assert options.beam_size == 4 and options.constrained_beam_size == 5 and "beam size 5" in note
    without, constrained = translator.translate(lines, free), translator.translate(lines, options)
    for line, plain, bound in zip(lines, without, constrained):
        if "two" in line.split():
            assert "otto" in bound[0].text.replace(".", " ").split() and "otto" not in plain[0].text
        else:
            assert bound == plain and bound[0].log_prob == plain[0].log_prob


def test_a_glossary_widens_the_beam_of_the_sentences_holding_a_term_only(toy_translator) -> None:
    translator = toy_translator.translator()
    glossary = translator.build_glossary([("two", "otto")])
    options, note = DecodingOptions(beam_size=1).with_glossary(glossary, 3)
    assert (options.beam_size, options.constrained_beam_size) == (1, 3)
    assert note == "sentences holding a glossary term are searched with beam size 3 (glossary_beam_size), the others with 1"
    bound, free = translator.translate_best(["one two.", "four five six."], options)
    assert "otto" in bound.replace(".", " ").split()
    assert free == translator.translate_best(["four five six."], DecodingOptions(beam_size=1))[0]
    assert DecodingOptions(beam_size=5).with_glossary(glossary, 3) == (
        DecodingOptions(beam_size=5, glossary=glossary, constrained_beam_size=5), "")  # never narrower than beam_size
    with pytest.raises(TranslatorError, match="need a beam of at least 2"):
        DecodingOptions(beam_size=3).with_glossary(glossary, 3)[0].replace(constrained_beam_size=1)
    with pytest.raises(TranslatorError, match="sampling takes none"):
        DecodingOptions(sampling_topk=3).with_glossary(glossary, 3)


def test_the_ctranslate2_engine_refuses_a_glossary_in_one_line() -> None:
    ct2 = CTranslate2Translator.__new__(CTranslate2Translator)  # the refusal needs no model
    ct2.term_tags = None  # a model trained without term_annotation (with it: tests/test_glossary.py)
    for refuse in (lambda: ct2.build_glossary([("two", "otto")]),
                   lambda: ct2.translate_batch([], DecodingOptions(), 10, [[[[5]]]])):
        with pytest.raises(TranslatorError, match=r"^the ctranslate2 engine has no constrained search, .*"
                                                  r"--engine pytorch\)$"):
            refuse()


def test_confidence_is_the_calibrators_probability_of_the_joined_pieces(toy_translator) -> None:
    """With a calibrator every translated sentence gets a probability in [0, 1], which rises with
    the model's score at a given length; a sentence cut into pieces is judged on them together."""
    translator = toy_translator.translator()
    options = DecodingOptions(beam_size=3, n_best=3)
    assert all(h.confidence is None for hs in translator.translate(["one two."], options) for h in hs)
    translator.calibrator = Calibrator([-0.5, -2.0, 2.0], [0.3, 1.0, 0.5], [1.5, 0.5, 0.0], 0.2, 50.0, 100)
    found = translator.translate(["one two three.", "four.", "!"], options)
    scored = [h for hypotheses in found[:2] for h in hypotheses]
    assert all(0 <= h.confidence <= 1 for h in scored) and found[2][0].confidence is None
    same_length = sorted((h for h in scored if h.length == scored[0].length), key=lambda h: h.log_prob)
    assert [h.confidence for h in same_length] == sorted(h.confidence for h in same_length)
    words = " ".join(TOY_SOURCE[i % 8] for i in range(30)) + "."  # over the toy's limit: pieces
    [[joined]] = [hs[:1] for hs in translator.translate([words], options)]
    pieces = translator.translate(translator.segment_lines([words], "", False)[0].sources, options)
    assert joined.length == sum(p[0].length for p in pieces) and joined.lowest == min(p[0].lowest for p in pieces)
    assert joined.confidence == translator.calibrator.probability(sum(p[0].log_prob for p in pieces),
                                                                  joined.length, joined.lowest)


def test_an_exports_calibrator_that_cannot_be_used_is_a_warning(several_targets, tmp_path: Path) -> None:
    """project.json's confidence edited into no calibrator: the export translates, without
    confidence, and says why (warnings, no_confidence, describe())."""
    import export
    from conftest import GOOD_CALIBRATOR
    export.export_model(several_targets.model, several_targets.config, several_targets.tok_src,
                        several_targets.tok_tgt, tmp_path / "ct2", "float32",
                        confidence={**GOOD_CALIBRATOR, "weights": [-1.5, 0.5, 0.0]})
    ct2 = CTranslate2Translator(tmp_path / "ct2")
    problem = f"{tmp_path / 'ct2'}: project.json: not a stored confidence calibrator: malformed numbers"
    assert ct2.calibrator is None and ct2.warnings == [f"{problem}: translating without confidence (export the "
                                                       f"model again)"]
    assert ct2.describe()["no_confidence"] == ct2.no_confidence == f"{problem}; export the model again"
    [[found]] = ct2.translate(SENTENCES[:1], DecodingOptions(beam_size=1, target_lang="it"))
    assert found.text and found.confidence is None

"""Translators: a model loaded once, then batches of sentences translated with given decoding options.

One interface, two engines:
- `TorchTranslator`: this project's PyTorch model and decoding.py, from a checkpoint (or the
  average of several), or from a model already in memory (validation during training).
- `CTranslate2Translator`: a model directory written by export.py (ct2_model.py), run by
  CTranslate2 (fast CPU inference, int8 weights). It translates one token when it loads, so that a
  model the device cannot run is one TranslatorError then.
translate.py, evaluate.py and serve.py get a `Translator` from `load_translator` and never branch on
the engine. Text reaches both engines by one path, which decides segmentation for every caller:
`segment_lines` / `segment_document` cut lines or a document into the pieces the model translates
(sentences.py: sentences by the source language's rules when `split_sentences` is on, URLs and
e-mail addresses left out; with it off, each line is one sentence, sent as it is) and cut a piece
over the model's limit (max_source_tokens, the target tag counted) at its best boundary, so
nothing is truncated; each piece is tokenized once, with the model's own tokenizer
(`Translator.encode`). `translate_text` and `translate_document` translate those pieces and put
the text back in its shape; `translate` takes each input as one sentence (a piece over the limit
still cut, its pieces' translations joined). Both engines translate in length-sorted batches and
score hypotheses the same way (decoding.py: log-probability including [EOS] over length **
length_penalty, plus the brevity penalty's term). CTranslate2 has no brevity penalty in its
search: with one, its engine asks for beam_size hypotheses and ranks them with the term added,
which picks from its final beam only. `cross_attention`, the heatmap's weights
(attention_plot.py draws them), takes the same path: the source as `translate` takes it (the
first piece of one over the limit), decoded greedily.

A model of several target languages (`lang_tgt` fr+it) is told which to produce by a tag after
[SOS], as training stored its sources ([SOS] <2fr> ... [EOS], Johnson et al. 2017): the decoding
option `target_lang` names it, and is required then; a one-target model takes it empty or equal to
its `lang_tgt`, and gets no tag. The tag counts as a source token (the model's limit, the brevity
penalty's expected length), as it did in the training data; it is a special token, so no output
shows it.

Glossaries (glossary.py): `build_glossary` makes one for the model's target vocabulary (a term it
cannot spell is one GlossaryError naming it), and DecodingOptions carries it (`with_glossary`);
every piece to translate is matched against it and the target terms it needs are the constraints
of its beam search (decoding.py), so a piece without a term is decoded exactly as with no glossary.
A piece holding a term is searched with a beam at least the config's glossary_beam_size wide
(`with_glossary`, which says so): dynamic beam allocation shares the beam among hypotheses by the
constraints they have met, and a beam of 5 left too few in each share (BLEU with reference terms
fell below the free search's; docs/glossary.md); sampling with a glossary is refused. The words a
term replaces are forbidden there (glossary.Glossary.forbidden_words, from the word list stored
beside the checkpoints: terms.read_renderings). A model trained with term_annotation reads each
piece's matches annotated inline (terms.annotated_ids: `encode` with the glossary), on either
engine; CTranslate2 has no constrained search, so there the annotation is all a glossary does, and
its engine refuses a glossary for a model trained without it, in one line.

Confidence (confidence.py): a translator holds the calibrator stored with its model, if any
(beside a checkpoint, or in an export's project.json), and gives every translated sentence its
probability of being good (`Hypothesis.confidence`; None without a calibrator or for a sentence
with nothing to translate). A sentence cut into pieces is judged on its pieces together: their
log-probabilities and lengths summed, the least likely token of all. Confidence is computed only
when the decoding options ask for it (`DecodingOptions.confidence`; translate.py asks only with
--scores): CTranslate2's search does not report what the calibrator reads, so that engine scores
the hypotheses it returns once more (`score_batch`), which cost more than its search. The
calibrator is a side file (confidence.json beside the checkpoints): one that cannot be read, or is
not a calibrator, leaves the model translating without confidence, with one warning and the reason
in `no_confidence` (what translate.py --scores and the API say); only the checkpoint and its
tokenizers must be intact.
"""
from __future__ import annotations

import argparse
import math
import re
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

import torch
from tokenizers import Tokenizer

from nmt.training.checkpoint import load_for_inference
from nmt.inference.confidence import CalibrationError, Calibrator, features, read_calibrator
from config import ConfigError, Resolved, choose_run, get_config, target_languages, target_tag, weights_dir
from nmt.inference.ct2_model import READ_ATTEMPTS, cpu_backend, ct2_setup, pinned_folder, read_project_files, replaced
from nmt.inference.decoding import Hypothesis as DecodedHypothesis
from nmt.inference.decoding import (ScoredPair, beam_search, brevity_term, expected_length, greedy_decode,
                                    max_output_tokens, sample)
from nmt.device import pick_device
from nmt.diagnostics import first_line, log
from nmt.inference.documents import DocumentPlan, plan_document
from nmt.corpora.terms import annotated_ids, read_renderings
from nmt.inference.glossary import Glossary, annotation_tags
from nmt.inference.inline_tags import word_alignment
from model import Transformer, causal_mask
from nmt.precision import autocast_context, inference_dtype
from nmt.inference.sentences import URL_OR_EMAIL, Sentence, TextPlan, plan_lines
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, UNK, TokenizerError, decode_ids, encode_texts, missing_target_tag

ENGINES = ("pytorch", "ctranslate2")


NO_CONSTRAINTS = ("the ctranslate2 engine has no constrained search, and this model was not trained with "
                  "--term_annotation, so it cannot use a glossary: translate with the checkpoint (--engine pytorch)")


class TranslatorError(RuntimeError):
    """A model that cannot be loaded, or options it cannot decode with; the message says which."""


_DEFAULTS = get_config()  # DecodingOptions' defaults are the config's


@dataclass(frozen=True)
class DecodingOptions:
    """How to decode. Sampling is on when `sampling_topk` or `sampling_topp` is set; it draws
    `n_best` samples per sentence and needs beam_size 1."""

    beam_size: int = None  # type: ignore[assignment]  # None: the config's default, or 1 when sampling
    length_penalty: float = _DEFAULTS["length_penalty"]
    brevity_penalty: float = _DEFAULTS["brevity_penalty"]
    n_best: int = 1
    sampling_topk: int = _DEFAULTS["sampling_topk"]
    sampling_topp: float = _DEFAULTS["sampling_topp"]
    temperature: float = _DEFAULTS["temperature"]
    no_repeat_ngram_size: int = _DEFAULTS["no_repeat_ngram_size"]
    batch_size: int = _DEFAULTS["eval_batch_size"]
    target_lang: str = _DEFAULTS["target_lang"]  # for a model of several target languages: which one
    glossary: Glossary | None = None  # terms the translations must use (Translator.build_glossary)
    constrained_beam_size: int = 0  # the beam of a piece holding a glossary term (with_glossary)
    # Each hypothesis's confidence (None when off): translate.py asks only with --scores, since
    # CTranslate2 must score its hypotheses once more for it, which cost more than its search.
    confidence: bool = True

    def __post_init__(self) -> None:
        if self.beam_size is None:
            object.__setattr__(self, "beam_size", 1 if self.sampling else _DEFAULTS["beam_size"])

    @classmethod
    def from_config(cls, config: dict[str, Any], **overrides: Any) -> "DecodingOptions":
        options = cls(beam_size=config["beam_size"], length_penalty=config["length_penalty"],
                      brevity_penalty=config["brevity_penalty"],
                      sampling_topk=config["sampling_topk"], sampling_topp=config["sampling_topp"],
                      temperature=config["temperature"], no_repeat_ngram_size=config["no_repeat_ngram_size"],
                      batch_size=config["eval_batch_size"], target_lang=config["target_lang"])
        return options.replace(**overrides) if overrides else options

    def replace(self, **changes: Any) -> "DecodingOptions":
        options = DecodingOptions(**{**self.__dict__, **changes})
        options.check()
        return options

    @property
    def sampling(self) -> bool:
        return self.sampling_topk > 0 or self.sampling_topp > 0

    def check(self) -> None:
        if self.beam_size < 1 or self.n_best < 1 or self.batch_size < 1:
            raise TranslatorError("beam_size, n_best and the batch size must be at least 1")
        if self.sampling and self.beam_size != 1:
            raise TranslatorError(f"sampling draws from the model one token at a time: it needs beam_size 1, "
                                  f"got {self.beam_size}")
        if not self.sampling and self.n_best > self.beam_size:
            raise TranslatorError(f"n_best {self.n_best} needs a beam at least as wide (beam_size {self.beam_size})")
        if self.glossary is not None and self.sampling:
            raise TranslatorError("a glossary constrains beam search: sampling takes none (drop --sampling_topk, "
                                  "--sampling_topp or the glossary)")
        if self.glossary is not None and self.constrained_beam_size < max(2, self.beam_size, self.n_best):
            raise TranslatorError("a glossary constrains beam search: the sentences holding a term need a beam of "
                                  "at least 2 and beam_size")

    def with_glossary(self, glossary: Glossary | None, glossary_beam_size: int) -> tuple["DecodingOptions", str]:
        """These options with `glossary` (None: as they are), and a note for the user, "" when there
        is nothing to say: the sentences holding a term are searched with a beam of at least
        `glossary_beam_size` (the config's), which the note says when it is wider than beam_size;
        the others as without a glossary. Raises TranslatorError for sampling."""
        if glossary is None:
            return self, ""
        beam = max(self.beam_size, glossary_beam_size)  # sampling with a glossary: refused by check()
        note = (f"sentences holding a glossary term are searched with beam size {beam} (glossary_beam_size), the "
                f"others with {self.beam_size}") if beam > self.beam_size else ""
        return self.replace(glossary=glossary, constrained_beam_size=beam), note


class Source(NamedTuple):
    """One source sentence as the model takes it, without [SOS]/[EOS]: the tag of the target
    language first when the model needs one; ids for this project's model, token strings for
    CTranslate2."""

    ids: list[int]
    tokens: list[str]


class Hypothesis(ScoredPair):
    """A translation: it unpacks and compares as (text, score), the score decoding.py's, with the
    fields the confidence calibrator reads (ScoredPair's; length 0: nothing was translated) and
    `confidence`, the probability that it is good (None: no calibrator, or nothing translated)."""

    FIELDS = (*ScoredPair.FIELDS, "confidence")
    confidence: float | None

    def __new__(cls, text: str, score: float, log_prob: float = 0.0, length: int = 0, lowest: float = 0.0,
                confidence: float | None = None) -> "Hypothesis":
        return super().__new__(cls, text, score, log_prob, length, lowest, confidence)

    @property
    def text(self) -> str:
        return self[0]

    @property
    def score(self) -> float:
        return self[1]

    def with_confidence(self, confidence: float) -> "Hypothesis":
        return Hypothesis(*self, self.log_prob, self.length, self.lowest, confidence)


@dataclass
class CrossAttention:
    """The last decoder layer's cross-attention while greedily translating one sentence, mean over
    heads: weights[i][j] is how much output token i attended to source token j. `heads` holds each
    head's weights where the engine gives them (this project's; CTranslate2 gives the mean only)."""

    source_tokens: list[str]
    output_tokens: list[str]
    weights: list[list[float]]
    heads: list[list[list[float]]] = field(default_factory=list)


@dataclass
class TextTranslation:
    """Lines translated: `lines` in the input's shape (the best translations), `sentences` each with
    its hypotheses, best first (sentence_hypotheses), and how many sentences were cut because they
    were over the model's limit."""

    lines: list[str]
    sentences: list[tuple[Sentence, list[Hypothesis]]]
    split_for_length: int


NOTHING = re.compile(r"(?!)")  # segmentation off: a line is sent as it is, URLs included


def split_sentences_on(config: dict[str, Any], auto: bool) -> bool:
    """The config's split_sentences for a program in which `auto` means `auto` (on in translate.py,
    serve.py and the page, off in evaluate.py and training's validation)."""
    return {"true": True, "false": False}.get(config["split_sentences"], auto)


def sentence_hypotheses(plan: TextPlan,
                        found: Sequence[Sequence[Hypothesis]]) -> list[tuple[Sentence, list[Hypothesis]]]:
    """Each sentence of `plan` with its hypotheses, given its pieces' (`found`, one list per piece):
    the k-th joins the k-th hypothesis of each of its pieces (the last one of a piece that has fewer)
    with what lies between them, scored by the mean of their scores, its log-probabilities and
    lengths summed and its least likely token the least of theirs (its confidence is left to
    Translator.calibrated); a sentence with no piece to translate is its own text, scored 0."""
    ranges, offset = [], 0
    for flow in plan.flows:
        ranges += [(offset + first, offset + end) for _, first, end in flow.sentences]
        offset += len(flow.pieces)
    depth = max((len(hypotheses) for hypotheses in found), default=1)
    ranked = [plan.sentences([hypotheses[min(k, len(hypotheses) - 1)].text for hypotheses in found])
              for k in range(depth)]
    result = []
    for index, (first, end) in enumerate(ranges):
        pieces = found[first:end]
        hypotheses = []
        for k in range(max((len(h) for h in pieces), default=1)):
            kth = [h[min(k, len(h) - 1)] for h in pieces]
            hypotheses.append(Hypothesis(ranked[k][index].translation,
                                         sum(h.score for h in kth) / len(kth) if kth else 0.0,
                                         sum(h.log_prob for h in kth), sum(h.length for h in kth),
                                         min((h.lowest for h in kth), default=0.0)))
        result.append((ranked[0][index], hypotheses))
    return result


class Tokenized:
    """Texts encoded for one model and target tag, each once: what planning counts is what the
    engine is given. `known` texts are encoded together first."""

    def __init__(self, translator: "Translator", tag: str, known: Sequence[str] = (),
                 glossary: Glossary | None = None) -> None:
        self.translator, self.tag, self.glossary = translator, tag, glossary
        self.encoded: dict[str, Source] = dict(zip(known, translator.encode(known, tag, glossary))) if known else {}

    def count(self, text: str) -> int:
        """Tokens of `text`, the tag included (what the model's limit counts)."""
        if text not in self.encoded:
            self.encoded[text] = self.translator.encode([text], self.tag, self.glossary)[0]
        return len(self.encoded[text].ids)

    def sources(self, texts: Sequence[str]) -> list[Source]:
        missing = [text for text in dict.fromkeys(texts) if text not in self.encoded]
        if missing:
            self.encoded.update(zip(missing, self.translator.encode(missing, self.tag, self.glossary)))
        return [self.encoded[text] for text in texts]


class Translator(ABC):
    """A loaded model with its tokenizers and training config. `describe()` says what it is;
    `translate` returns each sentence's hypotheses, best first (`n_best` of them)."""

    engine: str

    def __init__(self, tok_src: Tokenizer, tok_tgt: Tokenizer, model_config: dict[str, Any], path: Path | None,
                 source: str) -> None:
        self.tok_src, self.tok_tgt = tok_src, tok_tgt
        self.path, self.source = path, source  # the checkpoint file or model directory; what to call it
        self.model_config = model_config  # the config the model was trained with
        self.seq_len = model_config["seq_len"]
        self.max_source_tokens = self.seq_len - 2  # [SOS] and [EOS] take two of its positions
        # What the brevity penalty expects: output tokens per source token (train.py measured it).
        self.length_ratio = model_config["length_ratio"]
        # The n-gram size train.py picked from its training targets (decoding.repeat_free_ngram_size):
        # what no_repeat_ngram_size -1 bans; 0 in a model trained before it picked one.
        self.model_repeat_limit = max(model_config.get("no_repeat_ngram_size", 0), 0)
        self.target_languages = target_languages(model_config)
        self.calibrator: Calibrator | None = None  # the confidence calibrator stored with the model
        # why there is none, while there is none (no_confidence); what a loader found unusable beside the model
        self.calibrator_note = (f"{source} has no confidence calibrator; fit one with evaluate.py --fit_confidence "
                                f"(training fits one at its end)")
        self.warnings: list[str] = []
        self.renderings: dict[str, dict[str, float]] | None = None  # its word list, for glossaries
        self.term_tags = annotation_tags(tok_src, model_config, source)  # None: trained without term_annotation
        missing = missing_target_tag(tok_src, model_config)
        if missing:
            raise TranslatorError(f"{source}: a model of several target languages ({model_config['lang_tgt']}) "
                                  f"whose source tokenizer lacks the tag token {missing}")

    def describe(self) -> dict[str, Any]:
        return {"engine": self.engine, "model": self.source, "seq_len": self.seq_len,
                "no_repeat_ngram_size": self.model_repeat_limit, "confidence": self.calibrator is not None,
                "no_confidence": self.no_confidence, "warnings": list(self.warnings),
                "target_languages": self.target_languages,
                "source_vocabulary": self.tok_src.get_vocab_size(), "target_vocabulary": self.tok_tgt.get_vocab_size()}

    @property
    def no_confidence(self) -> str | None:
        """Why its translations get no confidence, in one line; None when they get one."""
        return None if self.calibrator is not None else self.calibrator_note

    def calibrator_unusable(self, problem: str, remedy: str) -> None:
        """A side file's calibrator that cannot be read or is not one: the model translates without
        confidence, and says why (a warning, and no_confidence)."""
        self.calibrator, self.calibrator_note = None, f"{problem}; {remedy}"
        self.warnings.append(f"{problem}: translating without confidence ({remedy})")

    def repeat_limit(self, options: DecodingOptions) -> int:
        """The n-gram size a search never repeats: the options', or the model's where they say -1."""
        return options.no_repeat_ngram_size if options.no_repeat_ngram_size >= 0 else self.model_repeat_limit

    def build_glossary(self, pairs: Sequence[tuple[str, str]]) -> Glossary:
        """A glossary of checked `pairs` (glossary.check_pairs) for this model's target vocabulary and
        word list; GlossaryError names a term it cannot spell."""
        return Glossary.build(pairs, self.tok_tgt, renderings=self.renderings)

    def calibrated(self, hypotheses: Sequence[Hypothesis]) -> list[Hypothesis]:
        """`hypotheses` with their confidence: the calibrator's probability for each one that
        translated something, None for the others or without a calibrator."""
        scored = [i for i, h in enumerate(hypotheses) if h.length > 0]
        if self.calibrator is None or not scored:
            return list(hypotheses)
        rows = [features(hypotheses[i].log_prob, hypotheses[i].length, hypotheses[i].lowest) for i in scored]
        found = list(hypotheses)
        for i, probability in zip(scored, self.calibrator.probabilities(rows)):
            found[i] = found[i].with_confidence(probability)
        return found

    def sentence_results(self, plan: TextPlan, found: Sequence[Sequence[Hypothesis]],
                         confidence: bool = True) -> list[tuple[Sentence, list[Hypothesis]]]:
        """Each sentence of `plan` with its hypotheses (sentence_hypotheses), with their confidence
        when `confidence` asks for it (each sentence's apart: the calibrator's batched arithmetic
        rounds differently in its last bit)."""
        sentences = sentence_hypotheses(plan, found)
        if not confidence:
            return sentences
        return [(sentence, self.calibrated(hypotheses)) for sentence, hypotheses in sentences]

    def target_language(self, target_lang: str) -> str:
        """The language `target_lang` asks this model for ("": a one-target model's only one). Raises
        TranslatorError naming the model's languages when it is missing (several) or not one of them."""
        targets = self.target_languages
        if not target_lang and len(targets) > 1:
            raise TranslatorError(f"this model translates into {', '.join(targets)}: choose one with target_lang")
        if target_lang and target_lang not in targets:
            raise TranslatorError(f"target_lang {target_lang!r} is not a target language of this model "
                                  f"({', '.join(targets)})")
        return target_lang or targets[0]

    def source_tag(self, target_lang: str) -> str:
        """The tag every source starts with (after [SOS]) to get `target_lang`; "" for a one-target model."""
        language = self.target_language(target_lang)
        return target_tag(language) if len(self.target_languages) > 1 else ""

    def encode(self, sentences: Sequence[str], tag: str, glossary: Glossary | None = None) -> list[Source]:
        """Each sentence tokenized, once, as text (a tag or [EOS] typed in it is text, not that token:
        tokenizer.encode_texts), with `tag` ("" = none) first as its id; for a model trained with
        term_annotation, with `glossary`'s matches annotated (terms.annotated_ids). Nothing is cut
        here: the pieces `segment_lines` and `segment_document` make fit the model's limit."""
        prefix = ([self.tok_src.token_to_id(tag)], [tag]) if tag else ([], [])
        encodings = encode_texts(self.tok_src, sentences)
        sources = [Source(prefix[0] + e.ids, prefix[1] + e.tokens) for e in encodings]
        if glossary is None or self.term_tags is None:
            return sources
        spans = [glossary.matches(sentence) for sentence in sentences]
        marked = [i for i, found in enumerate(spans) if found]
        for i, ids in zip(marked, annotated_ids(self.tok_src, [sentences[i] for i in marked],
                                                [spans[i] for i in marked], self.term_tags)):
            sources[i] = Source(prefix[0] + ids, prefix[1] + [self.tok_src.id_to_token(t) for t in ids])
        return sources

    def segment_lines(self, lines: Sequence[str], target_lang: str, split_sentences: bool,
                      glossary: Glossary | None = None) -> tuple[TextPlan, list[Source]]:
        """Lines of text as the pieces to translate (one flow per line), and those pieces encoded
        (with `glossary`'s terms annotated: `encode`). With `split_sentences` a line's sentences are
        found by the source language's rules and URLs and e-mail addresses are left out of them;
        without, the line is one sentence, sent as it is. Either way a piece over the model's limit
        is cut (sentences.py)."""
        tokenized = Tokenized(self, self.source_tag(target_lang), () if split_sentences else
                              [line.strip() for line in lines], glossary)
        plan = plan_lines(lines, self.model_config["lang_src"], split_sentences=split_sentences,
                          protected=URL_OR_EMAIL if split_sentences else NOTHING, count_tokens=tokenized.count,
                          max_tokens=self.max_source_tokens)
        return plan, tokenized.sources(plan.sources)

    def segment_document(self, text: str, fmt: str, target_lang: str, split_sentences: bool,
                         glossary: Glossary | None = None) -> tuple[DocumentPlan, list[Source]]:
        """A document (documents.FORMATS) as the pieces to translate, and those pieces encoded; its
        format decides what is left as it is (code, tags, URLs), `split_sentences` and `glossary` as
        in segment_lines."""
        tokenized = Tokenized(self, self.source_tag(target_lang), glossary=glossary)
        plan = plan_document(text, fmt, self.model_config["lang_src"], split_sentences=split_sentences,
                             count_tokens=tokenized.count, max_tokens=self.max_source_tokens)
        return plan, tokenized.sources(plan.sources)

    def translate_text(self, lines: Sequence[str], options: DecodingOptions, split_sentences: bool) -> TextTranslation:
        """Lines translated in their shape (segment_lines), every piece in one call of the engine."""
        options.check()
        plan, sources = self.segment_lines(lines, options.target_lang, split_sentences, options.glossary)
        found = self.decode_sources(sources, options, self.constraints(plan.sources, options))
        return TextTranslation([fragments[0] for fragments in plan.assemble([h[0].text for h in found])],
                               self.sentence_results(plan, found, options.confidence), plan.split_for_length)

    def translate_document(self, text: str, fmt: str, options: DecodingOptions,
                           split_sentences: bool) -> tuple[str, int]:
        """A document translated in its own shape, and how many sentences were cut for length."""
        options.check()
        plan, sources = self.segment_document(text, fmt, options.target_lang, split_sentences, options.glossary)
        found = self.decode_sources(sources, options, self.constraints(plan.sources, options))
        self.place_inline(plan.text, [[h[0].text] for h in found], options.target_lang)
        return plan.assemble([h[0].text for h in found]), plan.text.split_for_length

    def place_inline(self, plan: TextPlan, translations: Sequence[Sequence[str]], target_lang: str) -> None:
        """Store in `plan` the model's alignment of each translation (`translations`: each piece's,
        in the order of plan.sources) of each piece that holds inline markup, by which
        TextPlan.assemble places the piece's tags (inline_tags.py): the last decoder layer's
        cross-attention, mean over heads, with the decoder teacher-forced over the translation. Only
        those pieces cost a pass of the model: a text without inline markup costs nothing."""
        pending = [(index, piece.prose, text) for index, piece in plan.marked.items()
                   for text in dict.fromkeys(translations[index])
                   if text and text != piece.prose and (index, text) not in plan.alignments]
        if not pending:
            return
        tag = self.source_tag(target_lang)
        prose, texts = [item[1] for item in pending], [item[2] for item in pending]
        sources, offsets = self.encode(prose, tag), encode_texts(self.tok_src, prose)
        targets = encode_texts(self.tok_tgt, texts)
        attention = self.forced_attention(sources, [Source(t.ids, t.tokens) for t in targets])
        for (index, source_text, text), source, encoding, target, weights in zip(pending, sources, offsets, targets,
                                                                                  attention):
            if weights is not None:  # the tag's columns are no word of the source's
                rows = [row[len(source.ids) - len(encoding.ids):] for row in weights]
                plan.alignments[(index, text)] = word_alignment(source_text, encoding.offsets, text, target.offsets,
                                                                rows)

    def translate(self, sentences: Sequence[str], options: DecodingOptions) -> list[list[Hypothesis]]:
        """Each input translated as one sentence (a piece over the model's limit is cut, and the
        pieces' translations joined: sentence_hypotheses); an input without a letter comes back as
        it is, a blank one as "" (score 0). Results in the input order."""
        found: list[list[Hypothesis]] = [[Hypothesis("", 0.0)] for _ in sentences]
        for sentence, hypotheses in self.translate_text(sentences, options, split_sentences=False).sentences:
            found[sentence.flow] = hypotheses
        return found

    @staticmethod
    def constraints(texts: Sequence[str], options: DecodingOptions) -> list[list[list[list[int]]]] | None:
        """The glossary's constraints of each piece of text to translate (glossary.Glossary.constraints;
        [] for a piece without a term); None without a glossary."""
        if options.glossary is None:
            return None
        return [options.glossary.constraints(text) for text in texts]

    def decode_sources(self, sources: list[Source], options: DecodingOptions,
                       constraints: Sequence[list] | None = None) -> list[list[Hypothesis]]:
        """Translate in batches of similar length, each source with its `constraints` (None: none);
        results in the input order."""
        limit = self.max_source_tokens
        if any(len(source.ids) > limit for source in sources):
            raise TranslatorError(f"a source over the model's limit of {limit} tokens: segment it first")
        order = sorted(range(len(sources)), key=lambda i: len(sources[i].ids), reverse=True)
        results: list[list[Hypothesis]] = [[] for _ in sources]
        # The pieces holding a term are searched apart, with their wider beam; the others as without a glossary.
        held = {i for i in order if constraints is not None and constraints[i]}
        searches = [([i for i in order if i not in held], options, False)]
        if held:
            searches.append(([i for i in order if i in held], options.replace(beam_size=options.constrained_beam_size),
                             True))
        for indices, search, constrained in searches:
            for start in range(0, len(indices), search.batch_size):
                chunk = indices[start:start + search.batch_size]
                batch = [sources[i] for i in chunk]
                found = self.translate_batch(batch, search, max_output_tokens(len(batch[0].ids), self.seq_len),
                                             [constraints[i] for i in chunk] if constrained else None)
                for index, hypotheses in zip(chunk, found):
                    results[index] = [Hypothesis(decode_ids(self.tok_tgt, h[0]), h[1], h.log_prob, h.length,
                                                 h.lowest) for h in hypotheses]
        return results

    def translate_best(self, sentences: Sequence[str], options: DecodingOptions) -> list[str]:
        """The best translation of each sentence."""
        return [hypotheses[0].text for hypotheses in self.translate(sentences, options)]

    def attention_source(self, sentence: str, target_lang: str) -> Source:
        """The source whose heatmap `cross_attention` draws: the sentence as `translate` takes it, or
        its first piece when it is over the model's limit."""
        _, sources = self.segment_lines([sentence], target_lang, split_sentences=False)
        return sources[0] if sources else self.encode([sentence.strip()], self.source_tag(target_lang))[0]

    @abstractmethod
    def translate_batch(self, sources: list[Source], options: DecodingOptions, max_tokens: int,
                        constraints: Sequence[list] | None = None) -> list[list[DecodedHypothesis]]:
        """Each source's hypotheses, best first (decoding.Hypothesis: token ids without special
        tokens, score, and what the calibrator reads), under its `constraints` (None: none)."""

    @abstractmethod
    def cross_attention(self, sentence: str, target_lang: str = "") -> CrossAttention:
        """The heatmap data of the greedy translation of `sentence` into `target_lang`."""

    @abstractmethod
    def forced_attention(self, sources: list[Source], targets: list[Source]) -> list[list[list[float]] | None]:
        """For each source and a translation of it (target tokens, without [SOS] and [EOS]), the last
        decoder layer's cross-attention, mean over heads, with the decoder fed the translation:
        weights[i][j] from target token i to source token j (the tag included, [SOS] and [EOS] not);
        None for a translation too long for the model."""


class TorchTranslator(Translator):
    """This project's model in PyTorch, decoded by decoding.py."""

    engine = "pytorch"

    def __init__(self, model: Transformer, tok_src: Tokenizer, tok_tgt: Tokenizer, model_config: dict[str, Any],
                 path: Path | None = None, source: str = "model in memory", seed: int = 0) -> None:
        super().__init__(tok_src, tok_tgt, model_config, path, source)
        self.model, self.seed = model, seed
        self.generator: torch.Generator | None = None  # made on the first sampling call

    @classmethod
    def load(cls, checkpoint: Path | None, folder: Path, device: torch.device, average: int = 1,
             seed: int = 0, choice: str | None = None, min_gap: int = 0) -> "TorchTranslator":
        """From the checkpoint at `checkpoint`, or the one of `folder` that `choice` names (latest, best
        or average; None: the config's default); `average` > 1 averages that many checkpoints at least
        `min_gap` steps apart (checkpoint.load_for_inference)."""
        model, tok_src, tok_tgt, config, path = load_for_inference(checkpoint, folder, device, average, choice,
                                                                   min_gap)
        source = str(path) + (f" (average of {average} ending here)" if average > 1 else "")
        translator = cls(model, tok_src, tok_tgt, config, path, source, seed)
        try:
            # the run's calibrator, whichever of its checkpoints it was fitted on: a side file, which
            # only confidence needs
            translator.calibrator = read_calibrator(path.parent)
        except CalibrationError as error:
            translator.calibrator_unusable(str(error), "fit it again with evaluate.py --fit_confidence")
        translator.renderings = read_renderings(path.parent)
        return translator

    def translate_batch(self, sources: list[Source], options: DecodingOptions, max_tokens: int,
                        constraints: Sequence[list] | None = None) -> list[list[DecodedHypothesis]]:
        src, src_mask = self.source_batch(sources)
        with self.evaluating():
            return self.decode(src, src_mask, options, max_tokens, constraints)

    def source_batch(self, sources: list[Source]) -> tuple[torch.Tensor, torch.Tensor]:
        """`sources` as the model takes them: [SOS] ids [EOS], padded on the right into one batch (B, S)
        on the model's device, and its src_mask (B, 1, 1, S)."""
        src = torch.full((len(sources), max(len(source.ids) for source in sources) + 2), PAD_ID, dtype=torch.long)
        for row, source in enumerate(sources):
            src[row, :len(source.ids) + 2] = torch.tensor([SOS_ID, *source.ids, EOS_ID])
        src = src.to(next(self.model.parameters()).device)
        return src, (src != PAD_ID)[:, None, None, :]

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """The model in eval mode, and back in its mode after. On a GPU in bf16/fp16 through autocast
        rather than by casting the weights: validation decodes the model being trained, whose weights
        stay fp32. Log-probabilities stay fp32."""
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        try:
            with autocast_context(device, inference_dtype(device)):
                yield
        finally:
            self.model.train(was_training)

    def decode(self, src: torch.Tensor, src_mask: torch.Tensor, options: DecodingOptions, max_tokens: int,
               constraints: Sequence[list] | None = None) -> list[list[DecodedHypothesis]]:
        """decoding.py's search that `options` names, over the model; `constraints` go to beam search
        (DecodingOptions.check keeps them from greedy search and sampling)."""
        model, repeat_limit = self.model, self.repeat_limit(options)
        if options.sampling:
            if self.generator is None:
                self.generator = torch.Generator(src.device).manual_seed(self.seed)
            return sample(model, src, src_mask, max_tokens, options.n_best, options.sampling_topk,
                          options.sampling_topp, options.temperature, options.length_penalty, self.generator,
                          repeat_limit, options.brevity_penalty, self.length_ratio)
        if options.beam_size == 1:
            return [[hypothesis] for hypothesis in greedy_decode(
                model, src, src_mask, max_tokens, options.length_penalty,
                no_repeat_ngram_size=repeat_limit, brevity_penalty=options.brevity_penalty,
                length_ratio=self.length_ratio)]
        return beam_search(model, src, src_mask, max_tokens, options.beam_size, options.length_penalty,
                           options.n_best, repeat_limit, options.brevity_penalty, self.length_ratio,
                           constraints, word_starts=None if options.glossary is None else options.glossary.word_starts)

    def cross_attention(self, sentence: str, target_lang: str = "") -> CrossAttention:
        """The source tokens with [SOS] and [EOS], as the model sees them (the tag too; the first piece
        of a sentence over the model's limit: attention_source); the output tokens, the last one what
        ended the translation (usually [EOS]); and the weights of each head."""
        source = self.attention_source(sentence, target_lang)
        src, src_mask = self.source_batch([source])
        with self.evaluating():
            [(generated, _)] = greedy_decode(self.model, src, src_mask, max_output_tokens(len(source.ids),
                                                                                          self.seq_len))
            heads, last = last_layer_cross_attention(self.model, src, src_mask, generated)
        return CrossAttention([self.tok_src.id_to_token(i) for i in src[0].tolist()],
                              [self.tok_tgt.id_to_token(i) for i in [*generated, last]],
                              heads.mean(dim=0).tolist(), heads.tolist())

    def forced_attention(self, sources: list[Source], targets: list[Source]) -> list[list[list[float]] | None]:
        found: list[list[list[float]] | None] = []
        with self.evaluating():
            for source, target in zip(sources, targets):
                if len(target.ids) + 1 > self.seq_len:
                    found.append(None)
                    continue
                src, src_mask = self.source_batch([source])
                heads, _ = last_layer_cross_attention(self.model, src, src_mask, target.ids)
                found.append(heads.mean(dim=0)[:len(target.ids), 1:-1].tolist())  # [SOS] and [EOS] off
        return found


@torch.no_grad()
def last_layer_cross_attention(model: Transformer, src: torch.Tensor, src_mask: torch.Tensor,
                               generated: list[int]) -> tuple[torch.Tensor, int]:
    """The weights (heads, outputs, sources) of the last decoder layer's cross-attention over the one
    source `src` (1, S) while the decoder produces `generated` then one token more, and that token.
    The model attends with `scaled_dot_product_attention`, which never returns its weights, so they
    are recomputed: the decoder runs once more over [SOS] + `generated` (teacher-forced, so its query
    positions are the decoding steps) with a forward hook on that layer's cross-attention to capture
    its inputs, and softmax(Q K^T / sqrt(d_k)) is formed from the layer's own w_q and w_k. The
    model's code is not touched."""
    device = src.device
    decoder_input = torch.tensor([[SOS_ID, *generated]], device=device)
    attention = model.decoder.layers[-1].cross_attention
    captured: dict[str, torch.Tensor] = {}

    def capture(module: torch.nn.Module, args: tuple) -> None:
        captured["query"], captured["key"] = args[0], args[1]

    handle = attention.register_forward_pre_hook(capture)
    try:
        memory = model.encode(src, src_mask)
        hidden = model.decode(memory, src_mask, decoder_input, causal_mask(decoder_input.size(1), device)[None])
    finally:
        handle.remove()
    q = attention.split_heads(attention.w_q(captured["query"]))
    k = attention.split_heads(attention.w_k(captured["key"]))
    scores = q @ k.transpose(-2, -1) / math.sqrt(attention.d_k)
    # The rerun reproduces the greedy tokens; its last step shows what ended the translation.
    return scores.float().softmax(dim=-1)[0].cpu(), int(model.project(hidden[0, -1]).argmax())


class CTranslate2Translator(Translator):
    """A model directory written by export.py, run by CTranslate2 with the compute type and CPU
    backend of `ct2_setup` (which may time the model once per machine). A CT2_USE_MKL the user set is
    never overridden."""

    engine = "ctranslate2"

    def __init__(self, model_dir: Path, device: str = "cpu", seed: int = 0, threads: int = 0,
                 compute_type: str = "default") -> None:
        model_dir = Path(model_dir)
        for attempt in range(READ_ATTEMPTS):
            try:
                with pinned_folder(model_dir) as folder:
                    try:
                        self.load(model_dir, folder, device, seed, threads, compute_type)
                        break
                    except TranslatorError:
                        # export.py --overwrite put another export in its place and removed this one
                        # while it was read: read that one, whole
                        if attempt + 1 == READ_ATTEMPTS or not replaced(folder, model_dir):
                            raise
            except NotADirectoryError:
                raise TranslatorError(f"model directory {model_dir} is not a directory (write one with export.py)") \
                    from None
            except OSError:
                raise TranslatorError(f"model directory {model_dir} does not exist (write one with export.py)") \
                    from None
        self.warm_up(device)

    def load(self, model_dir: Path, folder: Path, device: str, seed: int, threads: int, compute_type: str) -> None:
        """Read the export at `model_dir` through `folder`, a path that stays on one directory
        (ct2_model.pinned_folder), so that its tokenizers, config and weights are one export's."""
        try:
            project, model_config, tok_src, tok_tgt = read_project_files(folder)
        except (OSError, ValueError, KeyError, TypeError, TokenizerError) as error:
            raise TranslatorError(f"{model_dir} is not a model directory written by export.py: "
                                  f"{first_line(error)}") from None
        super().__init__(tok_src, tok_tgt, model_config, model_dir, str(model_dir))
        self.project = project
        self.calibrator_note = (f"{model_dir} has no confidence calibrator: export.py copies the run's, fitted "
                                f"by training or evaluate.py --fit_confidence")
        try:
            self.calibrator = Calibrator.from_dict(project["confidence"]) if project.get("confidence") else None
        except CalibrationError as error:
            self.calibrator_unusable(f"{model_dir}: project.json: {error}", "export the model again")
        threads = threads or torch.get_num_threads()
        import ctranslate2  # only the programs that run this engine pay for the import
        try:
            # the timing's cache is read and written through `folder`: the export being loaded
            self.compute_type = ct2_setup(compute_type, device, project.get("quantization", ""), folder, threads)
            self.cpu_backend = cpu_backend()
            # Its sampling RNG is per thread and seeded when a translator is made: seed first.
            ctranslate2.set_random_seed(seed)
            self.ct2 = ctranslate2.Translator(str(folder), device=device, compute_type=self.compute_type,
                                              intra_threads=threads)
        except (RuntimeError, ValueError, OSError) as error:
            raise TranslatorError(f"cannot load the CTranslate2 model in {model_dir}: {first_line(error)}") from None

    def warm_up(self, device: str) -> None:
        """Translate one token: what the device lacks shows when CTranslate2 first runs there, not when
        it loads (on a GPU without cuBLAS: "Library libcublas.so.12 is not found or cannot be loaded"
        from translate_batch), and is found now, as one TranslatorError, not by a program's first batch."""
        try:
            self.ct2.translate_batch([[UNK]], beam_size=1, max_decoding_length=1)
        except (RuntimeError, ValueError, OSError) as error:
            raise TranslatorError(f"cannot run the CTranslate2 model in {self.path} on {device}: "
                                  f"{first_line(error)}") from None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "checkpoint": self.project.get("checkpoint"),
                "quantization": self.project.get("quantization"), "compute_type": self.ct2.compute_type,
                "cpu_backend": self.cpu_backend if self.ct2.device == "cpu" else None}

    def build_glossary(self, pairs: Sequence[tuple[str, str]]) -> Glossary:
        """A glossary for a model trained with term_annotation: its matches annotated, nothing
        constrained (`constraints`); refused for another."""
        if self.term_tags is None:
            raise TranslatorError(NO_CONSTRAINTS)
        return super().build_glossary(pairs)

    @staticmethod
    def constraints(texts: Sequence[str], options: DecodingOptions) -> None:
        """None: CTranslate2 has no constrained search; a glossary is only its annotation here."""
        return None

    def translate_batch(self, sources: list[Source], options: DecodingOptions, max_tokens: int,
                        constraints: Sequence[list] | None = None) -> list[list[DecodedHypothesis]]:
        if constraints is not None and any(constraints):  # never dropped: refused, as build_glossary does
            raise TranslatorError(NO_CONSTRAINTS)
        tokens = [source.tokens for source in sources]
        sampling = {}
        if options.sampling:
            # CTranslate2 samples when topk is not 1; nucleus sampling needs a bounded topk.
            topk = options.sampling_topk or self.tok_tgt.get_vocab_size()
            sampling = {"sampling_topk": topk, "sampling_topp": options.sampling_topp or 1.0,
                        "sampling_temperature": options.temperature}
        brevity = options.brevity_penalty if self.length_ratio and not options.sampling else 0.0
        results = self.ct2.translate_batch(
            tokens, beam_size=options.beam_size, num_hypotheses=options.beam_size if brevity else options.n_best,
            length_penalty=options.length_penalty, no_repeat_ngram_size=self.repeat_limit(options),
            max_decoding_length=max_tokens, min_decoding_length=0,
            max_input_length=self.seq_len, return_scores=True, **sampling)
        kept = [self.ranked(source, result, brevity, options.n_best) for source, result in zip(tokens, results)]
        evidence = self.token_log_probs(tokens, kept) if options.confidence and self.calibrator is not None else \
            [[[] for _ in hypotheses] for hypotheses in kept]
        return [[DecodedHypothesis([self.tok_tgt.token_to_id(t) for t in hypothesis], score, sum(log_probs),
                                   len(log_probs), min(log_probs, default=0.0))
                 for (score, hypothesis), log_probs in zip(hypotheses, scored)]
                for hypotheses, scored in zip(kept, evidence)]

    def ranked(self, source: list[str], result: Any, brevity: float, n_best: int) -> list[tuple[float, list[str]]]:
        """The `n_best` best of a result's hypotheses (score, tokens), their scores with the brevity
        penalty's term added (its lengths count [EOS], as in decoding.py)."""
        expected = expected_length(len(source), self.length_ratio)
        scored = [(score + brevity_term(len(hypothesis) + 1, expected, brevity), hypothesis)
                  for hypothesis, score in zip(result.hypotheses, result.scores)]
        return sorted(scored, key=lambda item: item[0], reverse=True)[:n_best]

    def token_log_probs(self, tokens: list[list[str]],
                        kept: list[list[tuple[float, list[str]]]]) -> list[list[list[float]]]:
        """The log-probability of each token of each hypothesis `kept` of each source ([EOS]
        included), which CTranslate2's search does not report, scored once more by the model: what
        the calibrator reads, so scored only for the hypotheses returned."""
        sources = [source for source, hypotheses in zip(tokens, kept) for _ in hypotheses]
        targets = [hypothesis for hypotheses in kept for _, hypothesis in hypotheses]
        scored = iter(self.ct2.score_batch(sources, targets, max_input_length=self.seq_len))
        return [[list(next(scored).log_probs) for _ in hypotheses] for hypotheses in kept]

    def cross_attention(self, sentence: str, target_lang: str = "") -> CrossAttention:
        tokens = self.attention_source(sentence, target_lang).tokens
        [result] = self.ct2.translate_batch([tokens], beam_size=1, min_decoding_length=0, return_attention=True,
                                            max_decoding_length=max_output_tokens(len(tokens), self.seq_len),
                                            max_input_length=self.seq_len)
        return CrossAttention(tokens, result.hypotheses[0], [list(row) for row in result.attention[0]])

    def forced_attention(self, sources: list[Source], targets: list[Source]) -> list[list[list[float]] | None]:
        fits = [i for i, target in enumerate(targets) if len(target.tokens) + 1 <= self.seq_len]
        found: list[list[list[float]] | None] = [None] * len(targets)
        if not fits:
            return found
        # the translation as the target prefix: CTranslate2 decodes it as given, with its attention
        results = self.ct2.translate_batch([sources[i].tokens for i in fits],
                                           target_prefix=[targets[i].tokens for i in fits], beam_size=1,
                                           return_attention=True, min_decoding_length=0,
                                           max_decoding_length=max(len(targets[i].tokens) for i in fits) + 1,
                                           max_input_length=self.seq_len)
        for i, result in zip(fits, results):
            found[i] = [list(row) for row in result.attention[0][:len(targets[i].tokens)]]
        return found


def add_translator_arguments(parser: argparse.ArgumentParser) -> None:
    """--engine, --model_dir, --checkpoint and --average, shared by translate.py, evaluate.py and serve.py."""
    parser.add_argument("--engine", choices=ENGINES, default="pytorch",
                        help="pytorch: a checkpoint with this project's decoding (default); ctranslate2: a model "
                             "directory written by export.py")
    parser.add_argument("--model_dir", type=Path, default=None, metavar="DIR",
                        help="the CTranslate2 model directory (--engine ctranslate2)")
    parser.add_argument("--checkpoint", type=Path, default=None, metavar="PATH",
                        help="checkpoint file (default: the one of the run that --checkpoint_choice names)")
    parser.add_argument("--average", type=int, default=1, metavar="N",
                        help="average the weights of this many checkpoints (--average_min_gap_steps apart), ending at "
                             "--checkpoint or at the chosen one")


def load_translator(args: argparse.Namespace, resolved: Resolved, fall_back: bool = False,
                    scores: bool = False) -> Translator:
    """The translator the command line asks for: with the PyTorch engine and no --checkpoint, a
    checkpoint of the run that `config.choose_run` picks (`fall_back`: its argument). Checked against
    the pair the command line names (`check_pair`) and against `target_lang` when one is given.
    What it found unusable beside the model (Translator.warnings) is a warning on stderr each: the
    model translates without it; but with `scores` (translate.py --scores) a model without a
    calibrator is a ConfigError saying why. Raises TranslatorError, CheckpointError or ConfigError
    (no such run, a missing device) with one line."""
    config = resolved.config
    pick_device(config["device"])  # a device the machine lacks is said before a run is looked for
    if args.engine == "pytorch" and args.checkpoint is None:
        choose_run(resolved, fall_back)
    translator = with_length_ratio(open_translator(args, config), config)
    check_pair(args, translator)
    if config["target_lang"]:
        translator.target_language(config["target_lang"])
    if scores and translator.no_confidence:
        raise ConfigError(f"--scores: {translator.no_confidence}")
    for warning in translator.warnings:
        log(f"warning: {warning}")
    return translator


def open_translator(args: argparse.Namespace, config: dict[str, Any]) -> Translator:
    """The engine and model that --engine, --model_dir, --checkpoint and --average choose."""
    if args.average < 1:
        raise TranslatorError(f"--average must be at least 1, got {args.average}")
    if args.engine == "ctranslate2":
        if args.model_dir is None:
            raise TranslatorError("--engine ctranslate2 needs --model_dir DIR (a model written by export.py)")
        if args.checkpoint is not None or args.average > 1:
            raise TranslatorError("--checkpoint and --average choose a PyTorch checkpoint; an exported model "
                                  "directory is already one model (export.py takes them)")
        device = pick_device(config["device"])
        if device.type not in ("cpu", "cuda"):
            raise TranslatorError(f"CTranslate2 runs on cpu or cuda, not {device.type}")
        return CTranslate2Translator(args.model_dir, device.type, config["seed"], compute_type=config["compute_type"])
    if args.model_dir is not None:
        raise TranslatorError("--model_dir is a CTranslate2 model directory: add --engine ctranslate2")
    return TorchTranslator.load(args.checkpoint, weights_dir(config), pick_device(config["device"]), args.average,
                                config["seed"], config["checkpoint_choice"], config["average_min_gap_steps"])


def check_pair(args: argparse.Namespace, translator: Translator) -> None:
    """An explicit --lang_src or --lang_tgt must be the model's: a model of several target languages
    is named by all of them (--lang_tgt fr+it), and --target_lang picks one."""
    model_config = translator.model_config
    for key in ("lang_src", "lang_tgt"):
        given = getattr(args, key, None)
        if given is None or given == model_config[key]:
            continue
        hint = ""
        if key == "lang_tgt" and given in translator.target_languages:
            hint = (f": it translates into several languages, named by all of them: --lang_tgt {model_config[key]} "
                    f"--target_lang {given}")
        raise TranslatorError(f"--{key} {given} does not match the model's {model_config[key]}{hint}")


def with_length_ratio(translator: Translator, config: dict[str, Any]) -> Translator:
    """An explicit --length_ratio replaces the one the model was trained with (or supplies it for a
    model trained before train.py measured it)."""
    if config["length_ratio"]:
        translator.length_ratio = config["length_ratio"]
    return translator

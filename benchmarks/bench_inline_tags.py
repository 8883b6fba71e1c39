"""Inline tags placed by the model's cross-attention, against translating the sentence's pieces apart.

    python -m benchmarks.bench_inline_tags --model_folder DIR --experiment_name NAME [--checkpoint PATH]
        [--engine ctranslate2 --model_dir DIR] [--datasource data/tatoeba] [--split test] [--beam 5]
        [--max_sentences N] [--json]

1. A bilingual word list from the train split, as bench_glossary.py builds it (Dice over sentence
   pairs); each source word's translation is its target word of highest Dice.
2. In each sentence of the split, the content word to wrap: the source word of highest Dice whose
   translation the plain translation of the sentence holds (as a lower-cased \\w+ word), both of
   3 letters or more (not "the" -> "il", whose translation would be found anywhere); sentences
   without one are left out. The word is wrapped in <b>, the sentence is a <p> of one HTML
   document, which is translated as translate.py --input translates it
   (Translator.translate_document: the tag placed by the model's attention, inline_tags.py).
3. The same sentences the way LibreTranslate translates HTML: split at the tags, the text before
   the word, the word and the text after translated apart, and joined with the tag around the
   word's translation.
Reported, for each way: the sentences whose output (tags stripped) holds the word's translation,
and of those the share whose <b> holds it (`placed`) and whose <b> holds it alone (`exact`: no
other word); corpus BLEU and chrF of the outputs with the tags stripped, against the references and
against the plain translation (how much the tags changed the text), beside the plain translation's
own scores (sacreBLEU signatures). Every translation is a text's, segmented as translate.py
segments it, so that the plain text and the HTML paragraph are split into the same sentences.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import sys
from typing import Any, Sequence

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_inline_tags.py: run it from the repository root as: python -m benchmarks.bench_inline_tags")

from justhtml import Element, JustHTML  # noqa: E402  (after the check above)

from benchmarks.bench_glossary import word_list, words  # noqa: E402
from nmt.training.checkpoint import CheckpointError  # noqa: E402
from config import EVALUATE, ConfigError, build_parser, parse_args  # noqa: E402
from nmt.corpora.sources import DataError, Pair, open_source, read_all_pairs  # noqa: E402
from nmt.inference.documents import element_text, html_nodes  # noqa: E402
from nmt.inference.scoring import corpus_scores  # noqa: E402
from nmt.inference.translator import (DecodingOptions, Translator, TranslatorError, add_translator_arguments,  # noqa: E402
                                      load_translator)

MIN_LETTERS = 3


def translations_of(associated: dict[str, dict[str, float]]) -> dict[str, tuple[str, float]]:
    """source word -> (its target word of highest Dice, that Dice)."""
    best: dict[str, tuple[str, float]] = {}
    for target, sources in sorted(associated.items()):
        for source, dice in sources.items():
            if dice > best.get(source, ("", 0.0))[1]:
                best[source] = (target, dice)
    return best


def chosen_word(sentence: str, plain: str, best: dict[str, tuple[str, float]]) -> tuple[re.Match, str] | None:
    """The word of `sentence` to wrap (its match) and its translation, or None (module docstring)."""
    held = {w.lower() for w in words(plain)}
    found = [(best[m.group().lower()][1], m.start(), m) for m in re.finditer(r"\w+", sentence)
             if len(m.group()) >= MIN_LETTERS and m.group().lower() in best and best[m.group().lower()][0] in held and
             len(best[m.group().lower()][0]) >= MIN_LETTERS]
    if not found:
        return None
    _, _, match = max(found, key=lambda item: (item[0], -item[1]))
    return match, best[match.group().lower()][0]


def placed_by_attention(translator: Translator, chosen: Sequence[tuple[str, re.Match]],
                        options: DecodingOptions) -> list[tuple[str, str]]:
    """Each sentence with its word in <b>, translated as one HTML document: each output's text, and
    the text of its <b>."""
    paragraphs = [f"<p>{html.escape(s[:m.start()], quote=False)}<b>{html.escape(m.group(), quote=False)}</b>"
                  f"{html.escape(s[m.end():], quote=False)}</p>" for s, m in chosen]
    translated, _ = translator.translate_document("\n".join(paragraphs), "html", options, split_sentences=True)
    body = next(node for node in html_nodes(JustHTML(translated, sanitize=False).root)
                if isinstance(node, Element) and node.name == "body")
    found = []
    for paragraph in (node for node in body.children if isinstance(node, Element) and node.name == "p"):
        bold = [node for node in paragraph.children if isinstance(node, Element) and node.name == "b"]
        found.append((element_text(paragraph), element_text(bold[0]) if bold else ""))
    return found


def as_text(translator: Translator, lines: Sequence[str], options: DecodingOptions) -> list[str]:
    """Each line translated as translate.py translates a text (segmented into sentences, as the
    HTML document's paragraphs are)."""
    text = "\n".join(line.replace("\n", " ") for line in lines)
    translated, _ = translator.translate_document(text, "text", options, split_sentences=True)
    return translated.split("\n")


def split_at_tags(translator: Translator, chosen: Sequence[tuple[str, re.Match]],
                  options: DecodingOptions) -> list[tuple[str, str]]:
    """Each sentence's text before the word, the word and the text after translated apart, joined."""
    parts = [(s[:m.start()].strip(), m.group(), s[m.end():].strip()) for s, m in chosen]
    pieces = sorted({piece for part in parts for piece in part if piece})
    translated = dict(zip(pieces, as_text(translator, pieces, options)))
    return [(" ".join(translated[piece] for piece in part if piece), translated[part[1]]) for part in parts]


def rates(outputs: Sequence[tuple[str, str]], targets: Sequence[str]) -> dict[str, Any]:
    """How many outputs hold the word's translation, and of those how many hold it in the tag."""
    holding = [(words(text.lower()), words(bold.lower()), target) for (text, bold), target in zip(outputs, targets)
               if target in words(text.lower())]
    placed = sum(target in bold for _, bold, target in holding)
    exact = sum(bold == [target] for _, bold, target in holding)
    return {"hold_the_translation": len(holding), "placed": placed, "exact": exact,
            "placed_rate": placed / max(1, len(holding)), "exact_rate": exact / max(1, len(holding))}


def scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    measured = corpus_scores(hypotheses, references)
    return {key: measured[key] for key in ("bleu", "chrf", "bleu_signature", "chrf_signature")}


def measure(translator: Translator, train: Sequence[Pair], test: Sequence[Pair], options: DecodingOptions) -> dict:
    """The benchmark on `test`, with the word list of `train` (module docstring)."""
    best = translations_of(word_list(train))
    plain = as_text(translator, [s for s, _ in test], options)
    chosen, targets, references, plain_kept = [], [], [], []
    for (source, reference), output in zip(test, plain):
        found = chosen_word(source, output, best)
        if found is not None:
            chosen.append((source, found[0]))
            targets.append(found[1])
            references.append(reference)
            plain_kept.append(output)
    if not chosen:
        raise DataError("no sentence has a word whose translation the word list knows")
    result: dict[str, Any] = {"sentences": len(test), "tagged_sentences": len(chosen),
                              "plain": scores(plain_kept, references)}
    for name, way in (("attention", placed_by_attention), ("split", split_at_tags)):
        outputs = way(translator, chosen, options)
        stripped = [text for text, _ in outputs]
        result[name] = {**rates(outputs, targets), **scores(stripped, references),
                        "bleu_against_plain": corpus_scores(stripped, plain_kept)["bleu"]}
    result["examples"] = [{"source": f"{s[:m.start()]}<b>{m.group()}</b>{s[m.end():]}", "word": t}
                          for (s, m), t in zip(chosen[:5], targets)]
    return result


def table(result: dict[str, Any]) -> str:
    lines = [result["command"], f"model {result['model']}, {result['data']}: {result['tagged_sentences']} of "
             f"{result['sentences']} sentences with a word to tag, beam {result['beam']}",
             f"{'':22} {'hold it':>8} {'placed':>8} {'exact':>8} {'BLEU':>7} {'chrF':>7} {'BLEU vs plain':>14}"]
    for name, label in (("attention", "placed by attention"), ("split", "split at the tags")):
        row = result[name]
        lines.append(f"{label:22} {row['hold_the_translation']:8d} {100 * row['placed_rate']:7.1f}% "
                     f"{100 * row['exact_rate']:7.1f}% {row['bleu']:7.2f} {row['chrf']:7.2f} "
                     f"{row['bleu_against_plain']:14.2f}")
    plain = result["plain"]
    lines += [f"{'plain text':22} {'':8} {'':8} {'':8} {plain['bleu']:7.2f} {plain['chrf']:7.2f} {100:14.2f}",
              f"BLEU {plain['bleu_signature']}", f"chrF {plain['chrf_signature']}"]
    return "\n".join(lines)


def argument_parser() -> argparse.ArgumentParser:
    """The config's options, the engine and model (translate.py's), and the benchmark's own."""
    parser = build_parser(EVALUATE, __doc__.splitlines()[0])
    add_translator_arguments(parser)
    parser.add_argument("--split", default="test")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--max_sentences", type=int, default=0, help="the split's first sentences only (0: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the lines")
    return parser


def splits(translator: Translator, config: dict[str, Any], split: str, count: int) -> tuple[list[Pair], list[Pair]]:
    """The train split (for the word list) and the first `count` pairs of `split` (0: all)."""
    languages = (translator.model_config["lang_src"], translator.model_config["lang_tgt"])
    source = open_source(config["datasource"], *languages)
    return read_all_pairs(source, "train", *languages), read_all_pairs(source, split, *languages)[:count or None]


def main(argv: list[str] | None = None) -> int:
    args, resolved = parse_args(EVALUATE, argv, parser=argument_parser())
    try:
        translator = load_translator(args, resolved)
        train, test = splits(translator, resolved.config, args.split, args.max_sentences)
        result = measure(translator, train, test, DecodingOptions.from_config(resolved.config, beam_size=args.beam))
    except (CheckpointError, ConfigError, DataError, TranslatorError) as error:
        print(f"bench_inline_tags.py: error: {error}", file=sys.stderr)
        return 1
    result.update(command=" ".join(["python", "-m", "benchmarks.bench_inline_tags", *(argv or sys.argv[1:])]),
                  model=translator.source, data=f"{resolved.config['datasource']} {args.split}", beam=args.beam)
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

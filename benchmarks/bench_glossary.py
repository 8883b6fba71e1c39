"""Glossary constraints taken from the references: how many are met, BLEU with and without them,
and what they cost against free beam search.

    python -m benchmarks.bench_glossary --model_folder DIR --experiment_name NAME [--checkpoint PATH]
        [--datasource data/tatoeba] [--split test] [--beam 5] [--max_constraints 3] [--max_sentences N]
        [--device cpu] [--json]

1. A bilingual word list from the train split: for each pair of a source word and a target word
   (case-folded \\w+ words) seen together in at least terms.MIN_PAIRS sentence pairs, their Dice
   coefficient 2 c(s, t) / (c(s) + c(t)) over sentence pairs; a pair is in the list at terms.DICE or
   more (nmt/corpora/terms.py's dice_table, the table training's word list is made of).
2. Free beam search over the split (the model chosen by --checkpoint_choice, `--beam`, the
   config's length and brevity penalties, the model's repeat ban), through the translator's own
   search (TorchTranslator.translate_batch) in length-sorted batches of --eval_batch_size, as
   translator.py batches (and in its autocast dtype on a GPU).
3. Constraints: for each sentence, up to --max_constraints reference words the free output lacks
   (as lower-cased words) whose best source word by the list is in the source, best Dice first, each
   source word used once. They become the sentence's glossary (source word -> the target word as
   the reference writes it) and go through glossary.py: matched in the source, turned into token
   ids with their glued spellings.
4. Constrained beam search over the sentences holding a constraint, as translator.py searches them:
   apart from the others, with a beam of max(--beam, glossary_beam_size); the others keep their
   free output, which a glossary never changes (tests/test_translator.py).

Reported: the constraints met (the term's tokens in the output), hypotheses cut off before meeting
theirs, terms written after the end of a one-sentence translation (appended rather than placed),
corpus BLEU and chrF with and without constraints on the whole split and on the constrained
sentences (one reference per line, sacreBLEU signatures), and sentences/s of the constrained
sentences searched free (at --beam) and constrained.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_glossary.py: run it from the repository root as: python -m benchmarks.bench_glossary")

from nmt.training.checkpoint import CheckpointError  # noqa: E402  (after the check above)
from config import EVALUATE, ConfigError, build_parser, parse_args, weights_dir  # noqa: E402
from nmt.inference.decoding import Hypothesis, max_output_tokens  # noqa: E402
from nmt.device import pick_device  # noqa: E402
from nmt.inference.glossary import Glossary, GlossaryError, term_alternatives  # noqa: E402
from nmt.inference.scoring import corpus_scores  # noqa: E402
from nmt.corpora.sources import DataError, Pair, open_source, read_all_pairs  # noqa: E402
from nmt.corpora.terms import dice_table  # noqa: E402
from nmt.corpora.tokenizer import decode_ids  # noqa: E402
from nmt.inference.translator import DecodingOptions, TorchTranslator, TranslatorError  # noqa: E402

WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return WORD.findall(text)


def word_list(pairs: Sequence[Pair]) -> dict[str, dict[str, float]]:
    """target word -> {source word: Dice} for the pairs at DICE or more (module docstring;
    terms.dice_table, the table training's word list is made of)."""
    associated: dict[str, dict[str, float]] = {}
    for source_word, found in dice_table(pairs).items():
        for target_word, dice in found.items():
            associated.setdefault(target_word, {})[source_word] = dice
    return associated


def sentence_glossary(source: str, reference: str, output: str, associated: dict[str, dict[str, float]],
                      most: int) -> list[tuple[str, str]]:
    """Up to `most` (source word, reference word) pairs for reference words the output lacks."""
    have, source_words = {w.casefold() for w in words(output)}, {w.casefold() for w in words(source)}
    found = []
    for target in dict.fromkeys(words(reference)):  # each word once, in order
        if target.casefold() in have:
            continue
        candidates = {s: d for s, d in associated.get(target.casefold(), {}).items() if s in source_words}
        if candidates:
            best = max(candidates, key=candidates.get)
            found.append((candidates[best], best, target))
    pairs, used = [], set()
    for _, source_word, target in sorted(found, key=lambda item: -item[0]):
        if source_word not in used and len(pairs) < most:
            pairs.append((source_word, target))
            used.add(source_word)
    return pairs


def search(translator: TorchTranslator, sentences: Sequence[str], beam: int, config: dict[str, Any],
           constraints: Sequence[list | None] | None = None) -> tuple[list[Hypothesis], float]:
    """The best hypothesis of each sentence and the seconds taken, in length-sorted batches."""
    sources = translator.encode(sentences, "")
    order = sorted(range(len(sources)), key=lambda i: len(sources[i].ids), reverse=True)
    found: list[Hypothesis | None] = [None] * len(sources)
    options = DecodingOptions.from_config(config, beam_size=beam)  # as translate.py decodes, the repeat ban included
    started = time.perf_counter()
    for start in range(0, len(order), config["eval_batch_size"]):
        chunk = order[start:start + config["eval_batch_size"]]
        results = translator.translate_batch([sources[i] for i in chunk], options,
                                             max_output_tokens(len(sources[chunk[0]].ids), translator.seq_len),
                                             None if constraints is None else [constraints[i] for i in chunk])
        for index, hypotheses in zip(chunk, results):
            found[index] = hypotheses[0]
    return found, time.perf_counter() - started


def holds(tokens: list[int], alternatives: list[list[int]]) -> bool:
    return any(tokens[i:i + len(ids)] == ids for ids in alternatives for i in range(len(tokens)))


def appended(text: str, free: str, term: str) -> bool:
    """The term's first place in `text` is after a sentence end, where `free` is one sentence."""
    if len(re.findall(r"[.!?]+(?=\s|$)", free)) > 1:
        return False
    place = re.search(rf"(?<!\w){re.escape(term)}(?!\w)", text)
    end = re.search(r"[.!?]+(?=\s)", text)
    return bool(place and end and end.start() < place.start())


def scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    measured = corpus_scores(hypotheses, references)
    return {key: measured[key] for key in ("bleu", "chrf", "bleu_signature", "chrf_signature")}


def measure(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    device = pick_device(config["device"])
    translator = TorchTranslator.load(args.checkpoint, weights_dir(config), device, choice=config["checkpoint_choice"])
    languages = (translator.model_config["lang_src"], translator.model_config["lang_tgt"])
    source = open_source(config["datasource"], *languages)
    associated = word_list(read_all_pairs(source, "train", *languages))
    pairs = read_all_pairs(source, args.split, *languages)[:args.max_sentences or None]
    sentences, references = [s for s, _ in pairs], [t for _, t in pairs]
    search(translator, sentences[:64], args.beam, config)  # warm-up
    free, _ = search(translator, sentences, args.beam, config)
    free_texts = [decode_ids(translator.tok_tgt, h[0]) for h in free]
    constraints, terms, unspellable = [], [], 0
    for sentence, reference, output in zip(sentences, references, free_texts):
        spellable = []
        for pair in sentence_glossary(sentence, reference, output, associated, args.max_constraints):
            try:
                term_alternatives(translator.tok_tgt, pair[1])
                spellable.append(pair)
            except GlossaryError:
                unspellable += 1
        glossary = Glossary.build(spellable, translator.tok_tgt)
        terms.append([(target, glossary.target_ids[target]) for _, target in glossary.terms_in(sentence)])
        constraints.append([ids for _, ids in terms[-1]] or None)
    rows = [i for i, c in enumerate(constraints) if c]
    wide = max(args.beam, config["glossary_beam_size"])
    _, subset_free_seconds = search(translator, [sentences[i] for i in rows], args.beam, config)
    found, bound_seconds = search(translator, [sentences[i] for i in rows], wide, config, [constraints[i] for i in rows])
    bound = list(free)
    for i, hypothesis in zip(rows, found):
        bound[i] = hypothesis
    bound_texts = [decode_ids(translator.tok_tgt, h[0]) for h in bound]
    met = sum(holds(bound[i][0], ids) for i in rows for _, ids in terms[i])
    placed_after = sum(appended(bound_texts[i], free_texts[i], term) for i in rows for term, _ in terms[i])
    count = sum(len(terms[i]) for i in rows)
    return {
        "command": " ".join(["python", "-m", "benchmarks.bench_glossary", *sys.argv[1:]]),
        "model": translator.source, "device": str(device), "threads": torch.get_num_threads(),
        "split": f"{config['datasource']} {args.split}", "sentences": len(sentences), "beam": args.beam,
        "constrained_beam": wide,
        "length_penalty": config["length_penalty"], "brevity_penalty": config["brevity_penalty"],
        "word_list_entries": sum(map(len, associated.values())), "constrained_sentences": len(rows),
        "constraints": count, "unspellable_terms": unspellable, "constraints_met": met,
        "cut_off_before_meeting": sum(not bound[i].complete for i in rows), "placed_after_the_end": placed_after,
        "free": {**scores(free_texts, references), "sentences_per_s": len(rows) / subset_free_seconds},
        "constrained": {**scores(bound_texts, references), "sentences_per_s": len(rows) / bound_seconds},
        "subset_free": scores([free_texts[i] for i in rows], [references[i] for i in rows]),
        "subset_constrained": scores([bound_texts[i] for i in rows], [references[i] for i in rows]),
        "examples": [{"source": sentences[i], "free": free_texts[i], "terms": [t for t, _ in terms[i]],
                      "constrained": bound_texts[i], "reference": references[i]} for i in rows[:8]],
    }


def table(result: dict[str, Any]) -> str:
    free, bound = result["free"], result["constrained"]
    lines = [f"{result['command']}", f"model {result['model']} on {result['device']} ({result['threads']} threads), "
             f"{result['split']}: {result['sentences']} sentences, beam {result['beam']} (constrained: "
             f"{result['constrained_beam']})",
             f"constraints: {result['constraints']} in {result['constrained_sentences']} sentences "
             f"({result['unspellable_terms']} terms unspellable, skipped); met {result['constraints_met']} "
             f"({100 * result['constraints_met'] / max(1, result['constraints']):.1f}%), cut off before meeting: "
             f"{result['cut_off_before_meeting']}, placed after the end: {result['placed_after_the_end']}",
             f"{'':24} {'BLEU':>7} {'chrF':>7} {'subset BLEU':>12} {'subset sent/s':>14}",
             f"{'free beam':24} {free['bleu']:7.2f} {free['chrf']:7.2f} {result['subset_free']['bleu']:12.2f} "
             f"{free['sentences_per_s']:14.1f}",
             f"{'constrained beam':24} {bound['bleu']:7.2f} {bound['chrf']:7.2f} "
             f"{result['subset_constrained']['bleu']:12.2f} {bound['sentences_per_s']:14.1f}",
             f"speed of the constrained sentences: constrained / free = "
             f"{bound['sentences_per_s'] / free['sentences_per_s']:.2f}",
             f"BLEU {free['bleu_signature']}", f"chrF {free['chrf_signature']}"]
    return "\n".join(lines)


def search_parser(description: str) -> argparse.ArgumentParser:
    """The config's options and what this benchmark and bench_confidence.py add: the model, the beam,
    how many sentences, JSON output."""
    parser = build_parser(EVALUATE, description)
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: the experiment's, --checkpoint_choice")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--max_sentences", type=int, default=0, help="each split's first sentences only (0: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the lines")
    return parser


def argument_parser() -> argparse.ArgumentParser:
    parser = search_parser(__doc__.splitlines()[0])
    parser.add_argument("--split", default="test")
    parser.add_argument("--max_constraints", type=int, default=3, help="constraints per sentence, at most")
    return parser


def run_benchmark(name: str, argv: list[str] | None, parser: argparse.ArgumentParser,
                  measure_with: Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]],
                  table_of: Callable[[dict[str, Any]], str], errors: tuple[type[Exception], ...] = ()) -> int:
    """A search benchmark's main: its result printed as lines (or JSON with --json), or one error
    line and exit 1 for a model, config, data or translator it cannot use (or one of `errors`)."""
    args, resolved = parse_args(EVALUATE, argv, parser=parser)
    try:
        result = measure_with(args, resolved.config)
    except (CheckpointError, ConfigError, DataError, TranslatorError, *errors) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1) if args.json else table_of(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_benchmark("bench_glossary.py", argv, argument_parser(), measure, table)


if __name__ == "__main__":
    sys.exit(main())

"""Score a checkpoint on a whole split: `python evaluate.py --datasource FOLDER_OR_HUB_ID --split test`.

Translates every source sentence of the split in batches (greedy, or beam search with
--beam_size), writes the translations one per line, and prints chrF and sacreBLEU with their
signatures against the raw references; the last line of stdout is sacreBLEU's own `BLEU = ...`,
every line against its own reference (`nrefs:1`), comparable with other toolkits. The line before
it scores each distinct source once against all its references (`scoring.grouped_scores`): a
split that repeats a source with several references (tatoeba's) counts it once there.

The model is found as translate.py finds it: the checkpoint --checkpoint_choice picks (default
best: the best on validation) of the run --experiment_name names, else of the one --datasource and
the language pair name (weights/<data>_<src>-<tgt>/), else of the only run under weights/. To score a model on another
data set, for example the out-of-domain ../shared/data/flores200_devtest, name the model's
experiment with --experiment_name tatoeba_en-it, or pass --checkpoint PATH. --average N averages the
weights of N checkpoints (ending at --checkpoint or the chosen one) first. With
`--engine ctranslate2 --model_dir DIR` the model is one exported by export.py. A model of several
target languages (`--lang_tgt fr+it`) is scored on one of them, `--target_lang fr` (required then):
the split is read in the pair lang_src-fr and every source gets the tag <2fr>.

The pairs (store.eval_pairs): `--test_data` / `--valid_data` score any file pair (a PREFIX, a TSV
file, a folder's test or validation split) as `--split test` / `validation`. Otherwise the model's
own validation or test split is the one its training held out, read from the data store its run
recorded in data.json (whatever its corpus holds now); a split of another datasource
(flores200_devtest and newstest2009 have only `test`) is used as it is, and a validation or test
split it lacks is the one training carved out of train, with the model's seed and settings. A split
the model held out is known by its digest; any other is checked against the training pairs of the
run's data stores, and one that shares source sentences with them is refused in one line, or with
`--allow_train_overlap true` scored with a warning on stderr and on the `data:` line.

Each source line is translated as one sentence, as the references align with it; a line over the
model's limit is translated in pieces (translator.py), never truncated. `--split_sentences true`
cuts lines into sentences first, as translate.py does by default (to score text made of several
sentences a line); the default (auto) is off here, so scores are those of line-by-line translation.

`--glossary FILE` translates with a glossary's terms as constraints, as translate.py does (the
output file's name gets `.glossary`). `--fit_confidence` first fits the confidence calibrator
(confidence.py) on the model's validation split, its first --confidence_sentences distinct sources
translated with the decoding options (no glossary), good meaning sentence chrF at least
--confidence_chrf_threshold, and stores it beside the checkpoints (confidence.json), where
translate.py --scores, serve.py and export.py find it; a checkpoint's run only, as training does
at its end. Whenever the model has a calibrator, a `confidence:` line measures it on the split
scored: Spearman's correlation of each line's confidence (the least of its sentences') with its
sentence chrF against all the references of its source, the mean chrF of the lowest-scored 10%
against the rest's, and the expected calibration error.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmt.training.checkpoint import CheckpointError
from nmt.inference.confidence import CalibrationError, confidence_report, fit_on_pairs, save_calibrator, sentence_chrfs
from config import EVALUATE, ConfigError, OneLineParser, Resolved, build_parser, corpus_entries, corpus_name, parse_args
from nmt.diagnostics import log
from nmt.inference.glossary import GlossaryError, config_glossary
from nmt.inference.scoring import corpus_scores, grouped_scores
from nmt.corpora.sources import DataError
from nmt.corpora.store import eval_pairs, held_out_problem, read_data_record
from nmt.inference.translator import (DecodingOptions, TextTranslation, Translator, TranslatorError, add_translator_arguments,
                        load_translator, split_sentences_on)


def default_output(config: dict[str, Any], model: Path, average: int, split: str, engine: str, lang_tgt: str,
                   beam_size: int) -> Path:
    """runs/<the model's experiment>/<data>.<split>.<checkpoint>[.avgN][.ctranslate2].beamK[.glossary].<lang_tgt>,
    `model` being the checkpoint file or the exported model directory, K the beam searched with,
    `lang_tgt` the language translated into."""
    option = {"validation": "valid_data", "test": "test_data"}.get(split)
    data = corpus_name(config[option] if option and config[option] else corpus_entries(config["datasource"])[0][0])
    engine_part = "" if engine == "pytorch" else f".{engine}"
    name = f"{data}.{split}.{model.stem}{f'.avg{average}' if average > 1 else ''}{engine_part}" \
           f".beam{beam_size}{'.glossary' if config['glossary'] else ''}.{lang_tgt}"
    return Path(config["runs_folder"]) / model.parent.name / name


def argument_parser() -> OneLineParser:
    parser = build_parser(EVALUATE, __doc__.splitlines()[0])
    parser.epilog = ("The model is the --checkpoint_choice checkpoint in <model_folder>/<experiment>, the experiment "
                     "being derived from --datasource and the language pair (tatoeba_en-it for data/tatoeba). "
                     "To score it on another data set, name its experiment or its file: python evaluate.py "
                     "--datasource ../shared/data/flores200_devtest --split test --experiment_name tatoeba_en-it "
                     "--beam_size 5 (or --checkpoint weights/tatoeba_en-it/ckpt_00001234.pt).")
    parser.add_argument("--split", default="test", help="split to translate and score (default: test)")
    add_translator_arguments(parser)
    parser.add_argument("--fit_confidence", action="store_true",
                        help="first fit the confidence calibrator on the validation split and store it beside the "
                             "checkpoints (confidence.json)")
    parser.add_argument("--output", type=Path, default=None,
                        help="file for the translations; if not given, <runs_folder>/<the checkpoint's experiment>/"
                             "<data>.<split>.<checkpoint>[.avgN].beam<K>.<the target language>")
    return parser


def fit_confidence(translator: Translator, config: dict[str, Any], target: str,
                   record: dict[str, Any] | None) -> str:
    """--fit_confidence: fit the calibrator on the model's validation split, store it with the run and
    give it to `translator`; what was done, in one line. Raises DataError, CalibrationError."""
    pairs = eval_pairs(config, "validation", translator.model_config, target, record)
    problem = held_out_problem(pairs, "validation", config, translator.model_config, record)
    if problem:
        raise DataError(f"--fit_confidence: {problem}: a calibrator fitted there would trust the model too much")
    options = DecodingOptions.from_config(config)  # what the model translates with, no glossary
    calibrator = fit_on_pairs(pairs, lambda sources: [h[0] for h in translator.translate(sources, options)],
                              config["confidence_chrf_threshold"], config["confidence_sentences"])
    path = save_calibrator(translator.path.parent, calibrator, translator.source)
    translator.calibrator = calibrator
    return (f"fitted the confidence calibrator on {calibrator.sentences} validation sentences (good: sentence chrF "
            f">= {calibrator.threshold:g}) and wrote {path}")


def confidence_line(translator: Translator, translated: TextTranslation, sources: list[str],
                    hypotheses: list[str], references: list[str]) -> str:
    """The `confidence:` line (module docstring) for a model with a calibrator."""
    calibrator = translator.calibrator
    by_line: dict[int, float] = {}
    for sentence, found in translated.sentences:
        if found[0].confidence is not None:
            by_line[sentence.flow] = min(found[0].confidence, by_line.get(sentence.flow, 1.0))
    grouped: dict[str, list[str]] = {}
    for source, reference in zip(sources, references):
        grouped.setdefault(source, []).append(reference)
    lines = sorted(by_line)
    chrfs = sentence_chrfs([hypotheses[i] for i in lines], [grouped[sources[i]] for i in lines])
    try:
        report = confidence_report([by_line[i] for i in lines], chrfs, calibrator.threshold)
    except CalibrationError as error:
        return f"confidence: not measured: {error}"
    return (f"confidence: Spearman with sentence chrF {report['spearman']:.3f}; mean chrF of the lowest-scored 10% "
            f"{report['lowest_10pct_chrf']:.1f}, of the rest {report['rest_chrf']:.1f}; calibration error "
            f"{report['calibration_error']:.3f} (good: chrF >= {calibrator.threshold:g}, "
            f"{100 * report['good_share']:.1f}% of {len(lines)} lines)")


@dataclass
class Evaluation:
    """What main scores: the model, its decoding options, the language translated into, the run's
    data record, the split's pairs, what is wrong with them (an overlap with training, "" if none),
    and the glossary's pairs."""

    translator: Translator
    options: DecodingOptions
    target: str
    record: dict[str, Any] | None
    pairs: list[tuple[str, str]]
    problem: str
    glossary: list[tuple[str, str]] | None


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args, resolved = parse_args(EVALUATE, argv, parser=parser)
    config = resolved.config
    if args.fit_confidence and args.engine != "pytorch":
        parser.error("--fit_confidence stores the calibrator with a checkpoint's run: fit it there (export.py copies "
                     "it into the export)")
    evaluation = prepare(parser, args, resolved)
    if evaluation is None:
        return 1
    translator = evaluation.translator
    if args.fit_confidence:
        try:
            log(f"evaluate.py: {fit_confidence(translator, config, evaluation.target, evaluation.record)}")
        except (CalibrationError, DataError, OSError) as error:
            print(f"evaluate.py: error: --fit_confidence: {error}", file=sys.stderr)
            return 1
    say_what_is_scored(evaluation, config, args.split)
    sources, references = [p[0] for p in evaluation.pairs], [p[1] for p in evaluation.pairs]
    translated = translator.translate_text(sources, evaluation.options, split_sentences_on(config, auto=False))
    if translated.split_for_length:
        log(f"evaluate.py: {translated.split_for_length} sentence(s) over the model's limit of "
            f"{translator.max_source_tokens} tokens translated in pieces")
    # One line per sentence in the file (any line break a model might emit becomes a space; both
    # metrics ignore runs of whitespace), and the scores are of exactly what the file holds.
    hypotheses = [" ".join(t.split()) for t in translated.lines]
    output = args.output or default_output(config, translator.path, args.average, args.split, args.engine,
                                           evaluation.target, evaluation.options.beam_size)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    except OSError as error:
        print(f"evaluate.py: error: cannot write {output}: {error.strerror or error}", file=sys.stderr)
        return 1
    log(f"evaluate.py: wrote {len(hypotheses)} translations to {output}")
    print_report(evaluation, config, args.split, translated, hypotheses, references)
    return 0


def prepare(parser: OneLineParser, args: argparse.Namespace, resolved: Resolved) -> Evaluation | None:
    """The glossary (read first: a malformed file is refused before the model loads), the model, the
    split's pairs and their check against the run's training data; a parser error for what the
    command line got wrong, or None once a model or data that cannot be used is said on stderr."""
    config = resolved.config
    try:
        glossary = config_glossary(config)
        options = DecodingOptions.from_config(config)
        translator = load_translator(args, resolved, fall_back=True)
        for key in ("datasource", "valid_data", "test_data"):
            if key not in resolved.given:  # the run's own data, unless told to score other data
                config[key] = translator.model_config[key]
        target = translator.target_language(options.target_lang)
        record = read_data_record(translator.path if translator.path.is_dir() else translator.path.parent)
        pairs = eval_pairs(config, args.split, translator.model_config, target, record)
        problem = held_out_problem(pairs, args.split, config, translator.model_config, record)
        if problem and not config["allow_train_overlap"]:
            raise DataError(f"{problem}: its scores would flatter the model; score a split it held out, or pass "
                            f"--allow_train_overlap true to score it anyway")
        options, note = options.with_glossary(translator.build_glossary(glossary) if glossary else None,
                                              config["glossary_beam_size"])
    except (ConfigError, GlossaryError) as error:
        parser.error(str(error))
    except (CheckpointError, TranslatorError, DataError) as error:
        print(f"evaluate.py: error: {error}", file=sys.stderr)
        return None
    if note:
        log(f"evaluate.py: {note}")
    return Evaluation(translator, options, target, record, pairs, problem, glossary)


def say_what_is_scored(evaluation: Evaluation, config: dict[str, Any], split: str) -> None:
    """stderr's lines before translating: what is not checked or flatters the model, and what is translated how."""
    translator = evaluation.translator
    if evaluation.record is None:
        log(f"evaluate.py: {translator.source} records no data it trained on (a model from before data.json): not "
            f"checked whether the split overlaps it")
    if evaluation.problem:
        log(f"evaluate.py: WARNING: {evaluation.problem}; scored anyway (--allow_train_overlap), so the scores "
            f"flatter the model")
    log(f"evaluate.py: {translator.source}: translating {len(evaluation.pairs)} sentences of {config['datasource']} "
        f"{split} into {evaluation.target} with beam size {evaluation.options.beam_size}"
        + (f" and the glossary {config['glossary']}" if evaluation.glossary else ""))


def print_report(evaluation: Evaluation, config: dict[str, Any], split: str, translated: TextTranslation,
                 hypotheses: list[str], references: list[str]) -> None:
    """stdout: the model, the data and how it was decoded, the glossary, the confidence line, the scores."""
    translator, problem = evaluation.translator, evaluation.problem
    sources = [pair[0] for pair in evaluation.pairs]
    print(f"model: {translator.source} ({translator.engine})")
    print(f"data: {config['datasource']} {split}, {len(evaluation.pairs)} sentences, beam size "
          f"{evaluation.options.beam_size}, length penalty {config['length_penalty']}, brevity penalty "
          f"{config['brevity_penalty']} (length_ratio {translator.length_ratio})"
          + (f"; WARNING: {problem}" if problem else ""))
    if evaluation.glossary:
        print(f"glossary: {config['glossary']}, {len(evaluation.glossary)} terms")
    if translator.calibrator is not None:
        print(confidence_line(translator, translated, sources, hypotheses, references))
    print_scores(sources, hypotheses, references)


def print_scores(sources: list[str], hypotheses: list[str], references: list[str]) -> None:
    """chrF2 and BLEU of `hypotheses`, one reference a line, then grouped by source (every reference
    of a repeated source at once), each with its sacreBLEU signature."""
    scores = corpus_scores(hypotheses, references)
    grouped = grouped_scores(sources, hypotheses, references)
    print(f"chrF2 = {scores['chrf']:.2f} ({scores['chrf_signature']})")
    print(f"grouped by source: {grouped['sources']} distinct sources, {grouped['references']} references: "
          f"BLEU {grouped['bleu']:.2f}, chrF2 {grouped['chrf']:.2f} ({grouped['bleu_signature']})")
    print(f"BLEU signature: {scores['bleu_signature']}")
    print(scores["bleu_text"])


if __name__ == "__main__":
    sys.exit(main())

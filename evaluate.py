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
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from checkpoint import CheckpointError
from config import EVALUATE, ConfigError, OneLineParser, build_parser, corpus_entries, corpus_name, parse_args
from diagnostics import log
from scoring import corpus_scores, grouped_scores
from sources import DataError
from store import eval_pairs, held_out_problem, read_data_record
from translator import DecodingOptions, TranslatorError, add_translator_arguments, load_translator, split_sentences_on


def default_output(config: dict[str, Any], model: Path, average: int, split: str, engine: str, lang_tgt: str) -> Path:
    """runs/<the model's experiment>/<data>.<split>.<checkpoint>[.avgN][.ctranslate2].beamK.<lang_tgt>,
    `model` being the checkpoint file or the exported model directory, `lang_tgt` the language
    translated into."""
    option = {"validation": "valid_data", "test": "test_data"}.get(split)
    data = corpus_name(config[option] if option and config[option] else corpus_entries(config["datasource"])[0][0])
    engine_part = "" if engine == "pytorch" else f".{engine}"
    name = f"{data}.{split}.{model.stem}{f'.avg{average}' if average > 1 else ''}{engine_part}" \
           f".beam{config['beam_size']}.{lang_tgt}"
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
    parser.add_argument("--output", type=Path, default=None,
                        help="file for the translations; if not given, <runs_folder>/<the checkpoint's experiment>/"
                             "<data>.<split>.<checkpoint>[.avgN].beam<K>.<the target language>")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args, resolved = parse_args(EVALUATE, argv, parser=parser)
    config = resolved.config
    try:
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
    except ConfigError as error:
        parser.error(str(error))
    except (CheckpointError, TranslatorError, DataError) as error:
        print(f"evaluate.py: error: {error}", file=sys.stderr)
        return 1
    if record is None:
        log(f"evaluate.py: {translator.source} records no data it trained on (a model from before data.json): not "
            f"checked whether the split overlaps it")
    if problem:
        log(f"evaluate.py: WARNING: {problem}; scored anyway (--allow_train_overlap), so the scores flatter the model")
    log(f"evaluate.py: {translator.source}: translating {len(pairs)} sentences of {config['datasource']} "
        f"{args.split} into {target} with beam size {config['beam_size']}")

    sources, references = [p[0] for p in pairs], [p[1] for p in pairs]
    translated = translator.translate_text(sources, options, split_sentences_on(config, auto=False))
    translations = translated.lines
    if translated.split_for_length:
        log(f"evaluate.py: {translated.split_for_length} sentence(s) over the model's limit of "
            f"{translator.max_source_tokens} tokens translated in pieces")
    # One line per sentence in the file (any line break a model might emit becomes a space; both
    # metrics ignore runs of whitespace), and the scores are of exactly what the file holds.
    hypotheses = [" ".join(t.split()) for t in translations]
    output = args.output or default_output(config, translator.path, args.average, args.split, args.engine, target)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    except OSError as error:
        print(f"evaluate.py: error: cannot write {output}: {error.strerror or error}", file=sys.stderr)
        return 1
    log(f"evaluate.py: wrote {len(hypotheses)} translations to {output}")

    scores = corpus_scores(hypotheses, references)
    grouped = grouped_scores(sources, hypotheses, references)
    print(f"model: {translator.source} ({translator.engine})")
    print(f"data: {config['datasource']} {args.split}, {len(pairs)} sentences, beam size {config['beam_size']}, "
          f"length penalty {config['length_penalty']}, brevity penalty {config['brevity_penalty']} "
          f"(length_ratio {translator.length_ratio})" + (f"; WARNING: {problem}" if problem else ""))
    print(f"chrF2 = {scores['chrf']:.2f} ({scores['chrf_signature']})")
    print(f"grouped by source: {grouped['sources']} distinct sources, {grouped['references']} references: "
          f"BLEU {grouped['bleu']:.2f}, chrF2 {grouped['chrf']:.2f} ({grouped['bleu_signature']})")
    print(f"BLEU signature: {scores['bleu_signature']}")
    print(scores["bleu_text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

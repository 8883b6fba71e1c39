"""Paragraphs against lines: text of several sentences translated with and without segmentation.

    python -m benchmarks.bench_paragraphs --datasource data/tatoeba [--split test]
                                          [--experiment_name NAME | --checkpoint PATH] [--seed 0]
                                          [--max_paragraphs N] [--no_api] [--json]

The split's pairs (found as evaluate.py finds them), in file order, are joined, consecutive ones,
into paragraphs of 2 to 4 pairs (sizes drawn with `--seed`; bench_segmentation.paragraphs): the
sources with single spaces into one line, the references likewise. The checkpoint is exported to
CTranslate2 int8 (a temporary folder), and each engine (this project's PyTorch decoding, and
CTranslate2) translates with the config's decoding options (beam_size, penalties), three ways:
- `lines`: each sentence on its own (segmentation off, one sentence a line), the translations of a
  paragraph's sentences joined with spaces: the line-by-line baseline;
- `paragraphs, segmented`: each paragraph as one line of text, segmentation on (translate.py's
  default): its sentences found, translated together, the line put back;
- `paragraphs, whole`: each paragraph as one sentence (`--split_sentences false`).
All three are scored with sacreBLEU and chrF against the joined references (the line-by-line
score of the single sentences is printed beside, for reference). Unless `--no_api`, serve.py runs
the CTranslate2 model and every paragraph is sent to POST /translate in the string form (8 at a
time, so that the server batches them), scored the same way. Target: segmented paragraphs within
1 BLEU of the line-by-line baseline (either way) on both engines and through the API.

The cost of segmentation, per engine: planning the paragraphs with segmentation on (sentencex,
URLs, cutting for length, tokenizing: `Translator.segment_lines`) minus planning the same
sentences without it (tokenizing only, what any translation needs), plus putting the lines back,
best of 5, as a share of the time the segmented translation took. Target: under 5%.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_paragraphs.py: run it from the repository root as: python -m benchmarks.bench_paragraphs")

import torch  # noqa: E402  (after the check above)

from benchmarks.bench_segmentation import paragraphs  # noqa: E402
from nmt.training.checkpoint import CheckpointError, load_for_inference  # noqa: E402
from config import EVALUATE, build_parser, parse_args, weights_dir  # noqa: E402
from nmt.inference.scoring import corpus_scores  # noqa: E402
from nmt.corpora.sources import DataError  # noqa: E402
from nmt.corpora.store import eval_pairs  # noqa: E402
from nmt.inference.translator import CTranslate2Translator, DecodingOptions, TorchTranslator, Translator  # noqa: E402

REPEATS = 5
API_CLIENTS = 8


def best_times(*works: Callable[[], Any], repeats: int = REPEATS) -> list[float]:
    """The fastest of `repeats` runs of each of `works`, in seconds; the runs alternate, so that a
    busy spell of the machine weighs on all of them alike."""
    times: list[list[float]] = [[] for _ in works]
    for _ in range(repeats):
        for work, taken in zip(works, times):
            started = time.perf_counter()
            work()
            taken.append(time.perf_counter() - started)
    return [min(taken) for taken in times]


def timed(work: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started


def joined(translations: list[str], groups: list[list[tuple[str, str]]]) -> list[str]:
    """The translations of the groups' sentences (in order) joined with spaces, one per group."""
    out, position = [], 0
    for group in groups:
        out.append(" ".join(" ".join(t.split()) for t in translations[position:position + len(group)]))
        position += len(group)
    return out


def measure_engine(translator: Translator, groups: list[list[tuple[str, str]]],
                   options: DecodingOptions) -> dict[str, Any]:
    """One engine's three ways of translating the paragraphs, their scores and times, and the cost
    of segmentation."""
    sentences = [source for group in groups for source, _ in group]
    texts = [" ".join(source for source, _ in group) for group in groups]
    references = [" ".join(target for _, target in group) for group in groups]
    translator.translate_text(texts[:16], options, True)  # warm-up
    lines, lines_s = timed(lambda: translator.translate_text(sentences, options, False).lines)
    segmented, segmented_s = timed(lambda: translator.translate_text(texts, options, True))
    whole, whole_s = timed(lambda: translator.translate_text(texts, options, False).lines)
    plan, _ = translator.segment_lines(texts, options.target_lang, True)
    pieces = [hypotheses[0].text for hypotheses in translator.translate(plan.sources, options)]
    segmenting, assembling, tokenizing = best_times(
        lambda: translator.segment_lines(texts, options.target_lang, True), lambda: plan.assemble(pieces),
        lambda: translator.segment_lines(sentences, options.target_lang, False))
    planning = segmenting + assembling
    rows = {}
    for name, hypotheses, seconds in (("lines", joined(lines, groups), lines_s),
                                      ("paragraphs, segmented", segmented.lines, segmented_s),
                                      ("paragraphs, whole", whole, whole_s)):
        rows[name] = {**scored(hypotheses, references), "seconds": seconds}
    sentence_references = [target for group in groups for _, target in group]
    return {"rows": rows, "sentence_level": scored(lines, sentence_references),
            "split_for_length": segmented.split_for_length,
            "segmentation": {"planning_s": planning, "tokenizing_s": tokenizing,
                             "share": (planning - tokenizing) / segmented_s}}


def scored(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    scores = corpus_scores([" ".join(h.split()) for h in hypotheses], references)
    return {key: scores[key] for key in ("bleu", "chrf", "bleu_signature", "chrf_signature")}


def through_api(model_dir: Path, groups: list[list[tuple[str, str]]], beam_size: int) -> dict[str, Any]:
    """The paragraphs sent to serve.py (CTranslate2) in the string form, API_CLIENTS at a time."""
    import http.client
    from benchmarks.loadtest import ServerProcess
    texts = [" ".join(source for source, _ in group) for group in groups]
    references = [" ".join(target for _, target in group) for group in groups]

    def send(port: int, text: str) -> str:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        connection.request("POST", "/translate", json.dumps({"text": text, "beam_size": beam_size}),
                           {"Content-Type": "application/json"})
        answer = json.loads(connection.getresponse().read())
        connection.close()
        if "translation" not in answer:
            raise RuntimeError(f"POST /translate refused a paragraph: {answer}")
        return answer["translation"]

    with ServerProcess(["--engine", "ctranslate2", "--model_dir", str(model_dir), "--serve_max_beam_size",
                        str(max(8, beam_size))]) as server:
        with ThreadPoolExecutor(API_CLIENTS) as pool:
            started = time.perf_counter()
            translations = list(pool.map(lambda text: send(server.port, text), texts))
            seconds = time.perf_counter() - started
    return {**scored(translations, references), "seconds": seconds}


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['split']}: {result['paragraphs']} paragraphs of 2-4 sentences ({result['sentences']} "
             f"sentences, seed {result['seed']}), {result['model']}, beam {result['beam_size']}, "
             f"{result['threads']} threads", "",
             "| engine | translated as | BLEU | chrF2 | seconds |", "|---|---|---|---|---|"]
    for engine, measured in result["engines"].items():
        for name, row in measured["rows"].items():
            lines.append(f"| {engine} | {name} | {row['bleu']:.2f} | {row['chrf']:.2f} | {row['seconds']:.1f} |")
    if "api" in result:
        row = result["api"]
        lines.append(f"| serve.py (ctranslate2) | paragraphs, string form | {row['bleu']:.2f} | {row['chrf']:.2f} | "
                     f"{row['seconds']:.1f} |")
    lines += ["", f"BLEU signature: {result['bleu_signature']}", f"chrF signature: {result['chrf_signature']}", ""]
    for engine, measured in result["engines"].items():
        cost, level = measured["segmentation"], measured["sentence_level"]
        lines.append(f"{engine}: single sentences line by line BLEU {level['bleu']:.2f}, chrF2 {level['chrf']:.2f}; "
                     f"{measured['split_for_length']} sentences cut for length; planning with segmentation "
                     f"{cost['planning_s'] * 1000:.1f} ms, tokenizing alone {cost['tokenizing_s'] * 1000:.1f} ms: "
                     f"segmentation {100 * cost['share']:.2f}% of the segmented translation's time")
    for name, value in result["targets"].items():
        lines.append(f"{name}: {value['value']:.2f} (target {value['target']}) {'met' if value['met'] else 'MISS'}")
    return "\n".join(lines)


def targets(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {}
    for engine, measured in result["engines"].items():
        rows = measured["rows"]
        gap = abs(rows["lines"]["bleu"] - rows["paragraphs, segmented"]["bleu"])
        found[f"{engine}: |lines - segmented paragraphs|, BLEU"] = {"value": gap, "target": "<= 1", "met": gap <= 1}
        share = 100 * measured["segmentation"]["share"]
        found[f"{engine}: segmentation, % of translation time"] = {"value": share, "target": "< 5", "met": share < 5}
    if "api" in result:
        gap = abs(result["engines"]["ctranslate2 int8"]["rows"]["lines"]["bleu"] - result["api"]["bleu"])
        found["API: |ctranslate2 lines - paragraphs|, BLEU"] = {"value": gap, "target": "<= 1", "met": gap <= 1}
    return found


def argument_parser() -> argparse.ArgumentParser:
    parser = build_parser(EVALUATE, __doc__.splitlines()[0])
    parser.add_argument("--split", default="test")
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0, help="draws the paragraphs' sizes (default: 0)")
    parser.add_argument("--max_paragraphs", type=int, default=0, help="use the first N paragraphs only (0: all)")
    parser.add_argument("--no_api", action="store_true", help="skip the measurement through serve.py")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    args, resolved = parse_args(EVALUATE, argv, parser=argument_parser())
    config = resolved.config
    from export import export_model
    try:
        model, tok_src, tok_tgt, model_config, path = load_for_inference(
            args.checkpoint, weights_dir(config), torch.device("cpu"), choice=config["checkpoint_choice"])
        groups = paragraphs(eval_pairs(config, args.split, model_config), args.seed)[:args.max_paragraphs or None]
    except (CheckpointError, DataError) as error:
        print(f"bench_paragraphs.py: error: {error}", file=sys.stderr)
        return 1
    options = DecodingOptions.from_config(config)
    result: dict[str, Any] = {"command": " ".join(["python", "-m", "benchmarks.bench_paragraphs", *sys.argv[1:]]),
                              "model": str(path), "split": f"{config['datasource']} {args.split}", "seed": args.seed,
                              "paragraphs": len(groups), "sentences": sum(map(len, groups)),
                              "beam_size": options.beam_size, "threads": torch.get_num_threads(), "engines": {}}
    with tempfile.TemporaryDirectory(prefix="bench_paragraphs-") as work:
        model_dir = export_model(model, model_config, tok_src, tok_tgt, Path(work) / "int8", "int8", str(path))
        engines = {"pytorch": lambda: TorchTranslator(model, tok_src, tok_tgt, model_config, path, str(path)),
                   "ctranslate2 int8": lambda: CTranslate2Translator(model_dir, seed=config["seed"],
                                                                     compute_type=config["compute_type"])}
        for engine, load in engines.items():
            result["engines"][engine] = measure_engine(load(), groups, options)
            print(f"[bench_paragraphs] {engine}: " + ", ".join(
                f"{name} BLEU {row['bleu']:.2f}" for name, row in result["engines"][engine]["rows"].items()),
                file=sys.stderr, flush=True)
        if not args.no_api:
            result["api"] = through_api(model_dir, groups, options.beam_size)
    rows = result["engines"]["pytorch"]["rows"]["lines"]
    result["bleu_signature"], result["chrf_signature"] = rows["bleu_signature"], rows["chrf_signature"]
    result["targets"] = targets(result)
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

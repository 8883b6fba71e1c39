"""Translation speed and quality of the two engines, on one split, in one run.

    python -m benchmarks.bench_translate --datasource ../shared/data/tatoeba [--split test]
                                         [--experiment_name NAME | --checkpoint PATH] [--rounds 3] [--json]

The checkpoint (found like translate.py finds it) is exported by export.py to CTranslate2 three
times (temporary folders): as export.py does by default (`--quantization auto`: this machine's
choice, which may time the model and cache the timing in the export), in float32 and in int8. Then
each configuration translates every source sentence of the split (length penalty: the config's),
each in a fresh child process so that its peak RSS (VmHWM) is its own: this project's PyTorch
decoding and CTranslate2's default set-up (the default export, `--compute_type auto`), greedy and
with beam 5; and at beam 5 each CPU set-up `auto` could have chosen: float32 and int8 weights, each
run in its own type on oneDNN and on MKL (x86 only). A child loads the model, translates the first 64
sentences once to warm up, then times the whole split through the same `Translator.translate`
batching translate.py uses (`--eval_batch_size` sentences per batch, sorted by length), on all the
CPU threads torch uses. Reported: the set-up of each row (weights, compute type, CPU backend),
sentences/s, target tokens/s (tokens of the outputs, [EOS] not counted), peak RSS, and
sacreBLEU/chrF of the outputs against the references, with the signatures. The CTranslate2 rows at
beam 5 run `--rounds` times (3), taking turns, and keep their fastest run: on a shared machine one
run of a set-up can be 30% slower than the next. The targets: the default set-up at beam 5 at least
3x this project's PyTorch beam 5 in sentences/s and within 0.5 BLEU of float32; and the set-up
`auto` chose within 10% of the fastest set-up found at beam 5.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_translate.py: run it from the repository root as: python -m benchmarks.bench_translate")

from nmt.training.checkpoint import CheckpointError, load_for_inference  # noqa: E402  (after the check above)
from config import EVALUATE, Resolved, build_parser, parse_args, weights_dir  # noqa: E402
from nmt.inference.ct2_model import cpu_info, read_timings  # noqa: E402
from nmt.inference.scoring import corpus_scores  # noqa: E402
from nmt.corpora.sources import DataError  # noqa: E402
from nmt.corpora.store import eval_pairs  # noqa: E402
from nmt.corpora.tokenizer import encode_texts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # the repository, where the children run from

DEFAULT = "ctranslate2 default"  # the default export run with --compute_type auto
# The CPU set-ups auto chooses among, each timed at beam 5: (row, weights, compute type, CT2_USE_MKL).
SETUPS = [(f"ctranslate2 {weights} on {backend}", weights, weights, flag) for backend, flag in (("oneDNN", "0"),
          ("MKL", "1")) for weights in ("float32", "int8")]
WARM_UP = 64
AUTO_TOLERANCE = 0.9  # auto's set-up at beam 5 must reach this share of the fastest set-up found


def peak_rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2 ** 20
    return float("nan")


def child(args: argparse.Namespace, resolved: Resolved) -> int:
    """Time one engine and beam size on the sentences in --sources; one JSON line on stdout."""
    from nmt.inference.translator import DecodingOptions, load_translator

    engine_args = argparse.Namespace(engine="pytorch", model_dir=None, checkpoint=args.checkpoint, average=1)
    if args.model_dir is not None:
        engine_args = argparse.Namespace(engine="ctranslate2", model_dir=args.model_dir, checkpoint=None, average=1)
    translator = load_translator(engine_args, resolved)
    sources = json.loads(Path(args.sources).read_text(encoding="utf-8"))
    options = DecodingOptions.from_config(resolved.config, beam_size=args.beam)
    translator.translate(sources[:WARM_UP], options)
    started = time.perf_counter()
    hypotheses = translator.translate(sources, options)
    seconds = time.perf_counter() - started
    texts = [h[0].text for h in hypotheses]
    tokens = sum(len(e.ids) for e in encode_texts(translator.tok_tgt, texts, ids_only=True))
    described = translator.describe()
    setup = ", ".join(f"{described[key]}" for key in ("quantization", "compute_type", "cpu_backend")
                      if described.get(key)) or "fp32"
    print(json.dumps({"seconds": seconds, "sentences_per_s": len(sources) / seconds, "tokens_per_s": tokens / seconds,
                      "output_tokens": tokens, "peak_rss_gb": peak_rss_gb(), "setup": setup, "translations": texts}))
    return 0


def run_child(argv: list[str], environment: dict[str, str]) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-m", "benchmarks.bench_translate", *argv], cwd=ROOT, capture_output=True,
                            text=True, env=environment)
    if result.returncode != 0:
        raise RuntimeError(f"bench_translate.py {' '.join(argv)} failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure_rows(children: list[tuple[str, int, list[str], dict[str, str]]], references: list[str],
                 rounds: int) -> tuple[list[dict[str, Any]], tuple[str, str]]:
    """Each child (row, beam, arguments, environment) run once, then CTranslate2's beam-5 rows (the
    set-ups auto is held against) `rounds` - 1 more times, taking turns: a row keeps its fastest run.
    Returns the rows, scored, and the BLEU and chrF signatures."""
    rows: list[dict[str, Any]] = []
    for turn in range(rounds):
        for index, (engine, beam, argv, environment) in enumerate(children):
            if turn and (engine == "pytorch" or beam != 5):
                continue
            measured = run_child(argv, environment)
            scores = corpus_scores(measured.pop("translations"), references)
            if not turn:
                rows.append({"engine": engine, "beam": beam, **measured, "bleu": scores["bleu"],
                             "chrf": scores["chrf"]})
            elif measured["sentences_per_s"] > rows[index]["sentences_per_s"]:
                rows[index].update(measured)
            print(f"[bench_translate] {engine}, beam {beam}: {measured['sentences_per_s']:.1f} sentences/s, "
                  f"BLEU {scores['bleu']:.2f}", file=sys.stderr, flush=True)
    return rows, (scores["bleu_signature"], scores["chrf_signature"])


def configurations(folders: dict[str, Path]) -> list[tuple[str, int, Path | None, list[str], dict[str, str]]]:
    """(row, beam, model directory or None for PyTorch, extra arguments, environment) of each child;
    the MKL rows on x86 only, where CTranslate2 has MKL."""
    rows = [(engine, beam, folders["auto"] if engine == DEFAULT else None, [], {}) for engine in ("pytorch", DEFAULT)
            for beam in (1, 5)]
    x86 = cpu_info().family != "other"
    return rows + [(name, 5, folders[weights], ["--compute_type", compute_type], {"CT2_USE_MKL": flag})
                   for name, weights, compute_type, flag in SETUPS if x86 or flag == "0"]


def targets(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The target lines: the default set-up's speed against PyTorch and BLEU against float32, at
    beam 5, and the set-up auto chose against the fastest found."""
    beam5 = {row["engine"]: row for row in rows if row["beam"] == 5}
    default, fastest = beam5[DEFAULT], max((row for row in beam5.values() if row["engine"] != "pytorch"),
                                           key=lambda row: row["sentences_per_s"])
    speedup = default["sentences_per_s"] / beam5["pytorch"]["sentences_per_s"]
    gap = beam5["ctranslate2 float32 on oneDNN"]["bleu"] - default["bleu"]
    share = default["sentences_per_s"] / fastest["sentences_per_s"]
    return {"default set-up beam 5 / pytorch beam 5, sentences/s": {"value": speedup, "target": ">= 3",
                                                                     "met": speedup >= 3},
            "float32 - default set-up BLEU, beam 5": {"value": gap, "target": "<= 0.5", "met": gap <= 0.5},
            f"auto's set-up ({default['setup']}) / the fastest found ({fastest['engine']}: {fastest['setup']}), "
            f"beam 5 sentences/s": {"value": share, "target": f">= {AUTO_TOLERANCE}", "met": share >= AUTO_TOLERANCE}}


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['split']} ({result['sentences']} sentences), {result['model']}, length penalty "
             f"{result['length_penalty']}, {result['threads']} threads",
             "", "| engine | set-up | decoding | sentences/s | target tokens/s | peak RSS | BLEU | chrF2 |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['engine']} | {row['setup']} | {'greedy' if row['beam'] == 1 else 'beam ' + str(row['beam'])} | "
                     f"{row['sentences_per_s']:.1f} | {row['tokens_per_s']:.0f} | {row['peak_rss_gb']:.2f} GB | "
                     f"{row['bleu']:.2f} | {row['chrf']:.2f} |")
    lines += ["", f"BLEU signature: {result['bleu_signature']}", f"chrF signature: {result['chrf_signature']}"]
    for machine, timing in result["auto_timing"].items():
        weights = timing.get("weights", {})  # what each type ran on: its own export, or the int8 export
        rates = ", ".join(f"{name} on {weights.get(name, '?')} weights {rate}"
                          for name, rate in timing["sentences_per_s"].items())
        lines.append(f"export.py's timing on {machine}: {rates} sentences/s: {timing['compute_type']}")
    for name, value in result["targets"].items():
        lines.append(f"{name}: {value['value']:.2f} (target {value['target']}) {'met' if value['met'] else 'MISS'}")
    return "\n".join(lines)


def argument_parser() -> argparse.ArgumentParser:
    parser = build_parser(EVALUATE, __doc__.splitlines()[0])
    parser.add_argument("--split", default="test")
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each CTranslate2 beam-5 row, taking turns; each keeps its fastest")
    # a child measures one configuration:
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model_dir", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--beam", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--sources", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, resolved = parse_args(EVALUATE, argv, parser=argument_parser())
    config = resolved.config
    if args.child:
        return child(args, resolved)
    if args.rounds < 1:
        print(f"bench_translate.py: error: --rounds must be at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    from export import export_model
    try:
        model, tok_src, tok_tgt, model_config, path = load_for_inference(
            args.checkpoint, weights_dir(config), torch.device("cpu"), choice=config["checkpoint_choice"])
        pairs = eval_pairs(config, args.split, model_config)
    except (CheckpointError, DataError) as error:
        print(f"bench_translate.py: error: {error}", file=sys.stderr)
        return 1
    sources, references = [p[0] for p in pairs], [p[1] for p in pairs]
    common = [arg for arg in (argv if argv is not None else sys.argv[1:]) if arg != "--json"]
    result: dict[str, Any] = {"command": " ".join(["python", "-m", "benchmarks.bench_translate", *sys.argv[1:]]),
                              "model": str(path), "split": f"{config['datasource']} {args.split}",
                              "sentences": len(sources), "length_penalty": config["length_penalty"],
                              "threads": torch.get_num_threads(), "rows": []}
    environment = dict(os.environ)  # the children's: export.py's timing sets CT2_USE_MKL in this process
    with tempfile.TemporaryDirectory(prefix="bench_translate-") as work:
        source_file = Path(work) / "sources.json"
        source_file.write_text(json.dumps(sources), encoding="utf-8")
        folders = {quantization: export_model(model, model_config, tok_src, tok_tgt, Path(work) / quantization,
                                              quantization, str(path)) for quantization in ("auto", "float32", "int8")}
        del model
        children = [(engine, beam, [*common, "--child", "--checkpoint" if folder is None else "--model_dir",
                                    str(folder or path), "--beam", str(beam), "--sources", str(source_file), *extra],
                     {**environment, **backend}) for engine, beam, folder, extra, backend in configurations(folders)]
        result["rows"], signatures = measure_rows(children, references, args.rounds)
        result["bleu_signature"], result["chrf_signature"] = signatures
        result["auto_timing"] = read_timings(folders["auto"])  # what export.py's timing measured, if it timed
    result["targets"] = targets(result["rows"])
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

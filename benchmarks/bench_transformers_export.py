"""The Transformers export against this project's decoding, on a trained run's test split.

    python -m benchmarks.bench_transformers_export --datasource data/tatoeba [--split test]
                                                   [--experiment_name NAME | --checkpoint PATH]
                                                   [--max_sentences N] [--json]

The checkpoint (found as evaluate.py finds it) is exported by export.py with `--format
transformers` into a temporary folder, which AutoModelForSeq2SeqLM and AutoTokenizer load as any
user of transformers would (trust_remote_code=False). On the split's pairs (store.eval_pairs), each
line taken as one sentence, as evaluate.py takes it:
- greedy: `generate` with the folder's generation config and one beam, against this project's
  greedy decoding (translate.py --beam_size 1, the run's n-gram ban); the share of lines whose
  text is the same. Target: at least 99%. A line may differ where this project caps a batch's
  output at 2 x its longest source + 10 tokens and the folder's config caps it at seq_len.
- beam 5: `generate` with the folder's generation config (length penalty and n-gram ban; no
  brevity penalty, which transformers lacks) against this project's beam 5 with the run's brevity
  penalty; corpus BLEU of each against the references. Target: within 0.2 BLEU.
- logits: teacher-forced on the references, the largest absolute difference between the two
  models' logits over the target vocabulary (the first 256 pairs).
Nothing is timed.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_transformers_export.py: run it from the repository root as: "
             "python -m benchmarks.bench_transformers_export")

import torch  # noqa: E402  (after the check above)

from config import EVALUATE, build_parser, parse_args, weights_dir  # noqa: E402
from nmt.corpora.sources import DataError  # noqa: E402
from nmt.corpora.store import eval_pairs  # noqa: E402
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, encode_ids  # noqa: E402
from nmt.inference.scoring import corpus_scores  # noqa: E402
from nmt.inference.transformers_export import vocabulary_layout  # noqa: E402
from nmt.inference.translator import DecodingOptions, TorchTranslator  # noqa: E402
from nmt.training.checkpoint import CheckpointError, load_for_inference  # noqa: E402

LOGIT_PAIRS = 256
BATCH = 64
GREEDY_TARGET = 0.99
BLEU_TARGET = 0.2


def generated(hf: Any, tokenizer: Any, sources: list[str], num_beams: int) -> list[str]:
    """`generate`'s text for each source, in batches of similar length, with the folder's settings
    and `num_beams`."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    found = [""] * len(sources)
    for start in range(0, len(order), BATCH):
        chunk = order[start:start + BATCH]
        batch = tokenizer([sources[i] for i in chunk], return_tensors="pt", padding=True)
        with torch.no_grad():
            output = hf.generate(**batch, num_beams=num_beams)
        for i, text in zip(chunk, tokenizer.batch_decode(output, skip_special_tokens=True)):
            found[i] = text
    return found


def logit_difference(model: Any, hf: Any, tok_src: Any, tok_tgt: Any, pairs: list[tuple[str, str]]) -> float:
    """The largest |logit| difference over the target vocabulary, teacher-forced on `pairs`."""
    offset = vocabulary_layout(model).target_offset
    largest = 0.0
    for start in range(0, len(pairs), BATCH):
        encoded = [([SOS_ID, *encode_ids(tok_src, s), EOS_ID], [SOS_ID, *encode_ids(tok_tgt, t)])
                   for s, t in pairs[start:start + BATCH]]
        src = torch.full((len(encoded), max(len(s) for s, _ in encoded)), PAD_ID)
        tgt = torch.full((len(encoded), max(len(t) for _, t in encoded)), PAD_ID)
        for row, (s, t) in enumerate(encoded):
            src[row, :len(s)], tgt[row, :len(t)] = torch.tensor(s), torch.tensor(t)
        mask = src != PAD_ID
        with torch.no_grad():
            ours = model(src, tgt, mask[:, None, None, :])
            theirs = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt + offset).logits
        real = (tgt != PAD_ID)[..., None]  # padded target positions are no translation's
        largest = max(largest, ((theirs[..., offset:] - ours).abs() * real).max().item())
    return largest


def measure(model: Any, tok_src: Any, tok_tgt: Any, model_config: dict[str, Any], config: dict[str, Any],
            pairs: list[tuple[str, str]], folder: Path) -> dict[str, Any]:
    """The three comparisons of the module docstring, on `pairs`, for the export at `folder`."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    hf = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=False).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    translator = TorchTranslator(model, tok_src, tok_tgt, model_config)
    ours_greedy = translator.translate_best(sources, DecodingOptions.from_config(config, beam_size=1))
    theirs_greedy = generated(hf, tokenizer, sources, 1)
    same = sum(a == b for a, b in zip(ours_greedy, theirs_greedy))
    ours_beam = translator.translate_best(sources, DecodingOptions.from_config(config, beam_size=5))
    theirs_beam = generated(hf, tokenizer, sources, 5)
    bleu_ours, bleu_theirs = corpus_scores(ours_beam, references), corpus_scores(theirs_beam, references)
    return {"sentences": len(pairs), "architecture": hf.config.architectures[0],
            "greedy_same": same, "greedy_same_share": same / len(pairs),
            "beam5_bleu_project": bleu_ours["bleu"], "beam5_bleu_transformers": bleu_theirs["bleu"],
            "beam5_bleu_difference": bleu_theirs["bleu"] - bleu_ours["bleu"],
            "bleu_signature": bleu_ours["bleu_signature"],
            "logits_max_abs_difference": logit_difference(model, hf, tok_src, tok_tgt, pairs[:LOGIT_PAIRS])}


def table(result: dict[str, Any]) -> str:
    met = {"greedy": result["greedy_same_share"] >= GREEDY_TARGET,
           "bleu": abs(result["beam5_bleu_difference"]) <= BLEU_TARGET}
    return "\n".join([
        f"{result['sentences']} sentences, {result['architecture']}",
        f"greedy: same text on {result['greedy_same']} ({100 * result['greedy_same_share']:.2f}%), target "
        f">= {100 * GREEDY_TARGET:.0f}%: {'met' if met['greedy'] else 'MISSED'}",
        f"beam 5 BLEU: transformers {result['beam5_bleu_transformers']:.2f}, this project "
        f"{result['beam5_bleu_project']:.2f} ({result['beam5_bleu_difference']:+.2f}), target within "
        f"{BLEU_TARGET}: {'met' if met['bleu'] else 'MISSED'} ({result['bleu_signature']})",
        f"logits: largest absolute difference {result['logits_max_abs_difference']:.2e}"])


def argument_parser() -> argparse.ArgumentParser:
    parser = build_parser(EVALUATE, __doc__.splitlines()[0])
    parser.add_argument("--split", default="test")
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--max_sentences", type=int, default=0, help="use the first N pairs only (0: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


def run(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """Export the checkpoint the arguments name into a temporary folder and measure it."""
    from export import export_transformers

    model, tok_src, tok_tgt, model_config, path = load_for_inference(
        args.checkpoint, weights_dir(config), torch.device("cpu"), 1, config["checkpoint_choice"])
    pairs = eval_pairs(config, args.split, model_config)[:args.max_sentences or None]
    with tempfile.TemporaryDirectory() as work:
        folder = export_transformers(model, model_config, tok_src, tok_tgt, Path(work) / "hf", str(path))
        return measure(model, tok_src, tok_tgt, model_config, config, pairs, folder)


def main(argv: list[str] | None = None) -> int:
    from export import ExportError

    args, resolved = parse_args(EVALUATE, argv, parser=argument_parser())
    try:
        result = run(args, resolved.config)
    except (CheckpointError, DataError, ExportError) as error:
        print(f"bench_transformers_export.py: error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Translate with a trained checkpoint: `python translate.py "I love you."`.

Prints only translations on stdout, one per input; diagnostics go to stderr. With no sentence
arguments it translates standard input, one sentence per line, in batches; a line that cannot be
translated (empty, invalid UTF-8) gets an empty output line, a message naming it, and exit code 1,
while the other lines are translated. The model is rebuilt from the config stored in the
checkpoint: the latest good one of the configured experiment, or `--checkpoint PATH`, or the
average of the newest N (`--average N`). `--plot_attention FILE.png` also saves the first
sentence's cross-attention heatmap.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from checkpoint import CheckpointError, load_for_inference
from config import ConfigError, build_parser, config_or_exit, weights_dir
from decoding import translate_sentences
from device import pick_device


def read_stdin_lines() -> list[str | None]:
    """Lines of standard input; None for a line that is not valid UTF-8."""
    lines: list[str | None] = []
    for raw in sys.stdin.buffer:
        try:
            lines.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError:
            lines.append(None)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("sentences", nargs="*", help="sentences to translate; none = read standard input")
    parser.add_argument("--checkpoint", type=Path, default=None, help="checkpoint file (default: latest)")
    parser.add_argument("--average", type=int, default=1,
                        help="average the weights of this many newest checkpoints (ending at --checkpoint)")
    parser.add_argument("--plot_attention", type=Path, default=None, metavar="FILE.png",
                        help="also save the cross-attention heatmap of the first sentence to this file")
    args = parser.parse_args(argv)
    config = config_or_exit(args, parser)
    if args.average < 1:
        parser.error(f"--average must be at least 1, got {args.average}")
    from_stdin = not args.sentences
    inputs: list[str | None] = read_stdin_lines() if from_stdin else list(args.sentences)
    if not from_stdin:
        for number, text in enumerate(args.sentences, start=1):
            if not text.strip():
                parser.error(f"sentence {number} is empty: nothing to translate")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # undecodable bytes in argv arrive as lone surrogates
                parser.error(f"sentence {number} is not valid UTF-8")

    try:
        device = pick_device(config["device"])
    except ConfigError as error:
        parser.error(str(error))
    try:
        model, tok_src, tok_tgt, model_config, path = load_for_inference(args.checkpoint, weights_dir(config), device,
                                                                         args.average)
    except CheckpointError as error:
        print(f"translate.py: error: {error}", file=sys.stderr)
        return 1
    averaged = f" averaged with the {args.average - 1} before it" if args.average > 1 else ""
    print(f"translate.py: using {path}{averaged}", file=sys.stderr)

    usable = [i for i, text in enumerate(inputs) if text is not None and text.strip()]
    for number, text in enumerate(inputs, start=1):
        if text is None:
            print(f"translate.py: line {number}: not valid UTF-8, skipped", file=sys.stderr)
        elif not text.strip():
            print(f"translate.py: line {number}: empty, skipped", file=sys.stderr)
    translations = translate_sentences(model, tok_src, tok_tgt, [inputs[i].strip() for i in usable],
                                       model_config["seq_len"], config["eval_batch_size"], config["beam_size"],
                                       config["length_penalty"])
    outputs = [""] * len(inputs)
    for index, translation in zip(usable, translations):
        outputs[index] = translation
    for line in outputs:
        print(line)
    if args.plot_attention is not None and usable:
        from attention_plot import save_attention_plot  # matplotlib is only needed here
        try:
            save_attention_plot(model, tok_src, tok_tgt, inputs[usable[0]].strip(), args.plot_attention)
        except (OSError, ValueError) as error:
            print(f"translate.py: error: cannot write {args.plot_attention}: {error}", file=sys.stderr)
            return 1
        print(f"translate.py: saved the attention plot to {args.plot_attention}", file=sys.stderr)
    return 0 if len(usable) == len(inputs) else 1


if __name__ == "__main__":
    sys.exit(main())

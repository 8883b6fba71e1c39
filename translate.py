"""Translate with a trained model: `python translate.py "I love you."`.

Prints translations on stdout, one line per input; diagnostics go to stderr. With no sentence
arguments it translates standard input, one sentence per line, `--chunk_size` lines at a time: each
chunk's translations are written and flushed as soon as they are done, so memory stays bounded on
inputs of any length and a killed run leaves complete lines behind. A line longer than
`--max_line_bytes` is read and translated in pieces of at most that size, cut at whitespace, whose
translations make its one output line: no line is held whole (`input_pieces`). A line that cannot be translated
(empty, invalid UTF-8) gets an empty output line and a message naming it, the others are translated,
and the exit code is 1. When the reader of stdout goes away (`translate.py < big.txt | head -1`),
it stops quietly with exit code 141, what a Unix tool killed by SIGPIPE reports (`yes | head -1`):
not 0, since not everything was written, and no traceback; so does a run started with stdout
closed (`translate.py "x" >&-`), before loading the model.

The model: the newest good checkpoint of the experiment that --datasource and the language pair
name, or `--checkpoint PATH`, or the average of the N newest (`--average N`); or with
`--engine ctranslate2 --model_dir DIR` a model exported by export.py. An explicit --lang_src or
--lang_tgt must be the model's. A model of several target languages is named by all of them
(`--lang_tgt fr+it`), and `--target_lang fr` says which to produce (required then; translator.py
puts its tag <2fr> before every source). The model is rebuilt from the config stored with it, so
only decoding options matter here:
- `--beam_size K`, `--length_penalty A` (scores are log-probability / length ** A) and
  `--brevity_penalty B` (plus B x log of BLEU's brevity penalty against the length the model's
  training data predicts; decoding.py);
- sampling, for back-translation: `--sampling_topk K` and/or `--sampling_topp P`, `--temperature T`,
  reproducible with `--seed S`;
- `--n_best N`: N hypotheses per input (the N best of the beam, or N samples), one per line as
  `LINE<TAB>SCORE<TAB>TRANSLATION`: LINE is the input's number (1-based), SCORE its score with four
  decimals, best first within a line. An input that cannot be translated gets no hypothesis lines.
`--plot_attention FILE.png` also saves the first sentence's cross-attention heatmap (either engine).
"""
from __future__ import annotations

import os
import sys
from itertools import accumulate, islice
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from checkpoint import CheckpointError
from config import TRANSLATE, ConfigError, OneLineParser, build_parser, parse_args
from translator import DecodingOptions, Translator, TranslatorError, add_translator_arguments, load_translator


Piece = tuple[str | None, bool]  # some text of a line (None: not valid UTF-8), and whether it ends the line


def input_pieces(stream: BinaryIO, max_bytes: int) -> Iterator[Piece]:
    """The lines of `stream` as they arrive, without their line ending, in pieces of at most
    `max_bytes` bytes: a longer line is cut after the last whitespace of each piece (or, without one,
    between two characters), so that no line is held whole past `max_bytes` however long it is. The
    whitespace between a long line's pieces is no piece of its own: a line is empty only when all of
    it is blank. Each piece is held until the next shows whether its line goes on."""
    held: list[str | None] = []  # the line's last piece with text, not yet given
    for text, ends in _raw_pieces(stream, max_bytes):
        if text is not None and not text.strip():
            if ends:
                yield (held.pop() if held else text), True
            continue
        if held:
            yield held.pop(), False
        if ends:
            yield text, True
        else:
            held.append(text)


def _raw_pieces(stream: BinaryIO, max_bytes: int) -> Iterator[Piece]:
    """`input_pieces` before blank pieces are dropped."""
    carry = b""
    while True:
        want = max(1, max_bytes - len(carry))
        chunk = stream.readline(want)
        if not chunk:
            if carry:
                yield _decoded(carry), True
            return
        piece = carry + chunk
        if piece.endswith(b"\n") or len(chunk) < want:  # a whole line (the last may lack its "\n")
            yield _decoded(piece.removesuffix(b"\n").removesuffix(b"\r")), True
            carry = b""
            continue
        space = max(piece.rfind(b" "), piece.rfind(b"\t"))
        cut = space + 1 if space > 0 else _character_boundary(piece)
        yield _decoded(piece[:cut]), False
        carry = piece[cut:]


def _character_boundary(data: bytes) -> int:
    """Where `data` may be cut without splitting a UTF-8 character: before its last character when
    that one is incomplete, else at its end."""
    start = len(data) - 1
    while start > 0 and data[start] & 0xC0 == 0x80 and len(data) - start < 4:
        start -= 1
    lead = data[start]
    needed = 4 if lead >= 0xF0 else 3 if lead >= 0xE0 else 2 if lead >= 0xC0 else 1
    return start if 0 < start and len(data) - start < needed else len(data)


def _decoded(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def chunks(pieces: Iterable[Piece], size: int) -> Iterator[list[Piece]]:
    iterator = iter(pieces)
    while chunk := list(islice(iterator, size)):
        yield chunk


def translate_chunk(translator: Translator, inputs: list[str | None], numbers: list[int], options: DecodingOptions,
                    n_best: bool) -> tuple[list[str], int]:
    """The output of each of one chunk of inputs (from the lines `numbers`), and how many were bad: its
    translation, or with `n_best` its numbered hypotheses, each line ended."""
    usable = [i for i, text in enumerate(inputs) if text is not None and text.strip()]
    for number, text in zip(numbers, inputs):
        if text is None:
            print(f"translate.py: line {number}: not valid UTF-8, skipped", file=sys.stderr)
        elif not text.strip():
            print(f"translate.py: line {number}: empty, skipped", file=sys.stderr)
    found = translator.translate([inputs[i].strip() for i in usable], options)
    hypotheses: list[list] = [[] for _ in inputs]
    for index, result in zip(usable, found):
        hypotheses[index] = result
    if n_best:
        return ["".join(f"{number}\t{h.score:.4f}\t{h.text}\n" for h in result)
                for number, result in zip(numbers, hypotheses)], len(inputs) - len(usable)
    return [result[0].text if result else "" for result in hypotheses], len(inputs) - len(usable)


# 128 + SIGPIPE: what a shell reports for a tool that wrote into a closed pipe.
EXIT_CLOSED_PIPE = 141


def stdout_closed() -> int:
    """After a BrokenPipeError on stdout: send what is still buffered, and will be flushed at
    exit, to /dev/null (the Python docs' recipe: no 'Exception ignored' message); the exit code."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_PIPE


def argument_parser() -> OneLineParser:
    parser = build_parser(TRANSLATE, __doc__.splitlines()[0])
    parser.add_argument("sentences", nargs="*", help="sentences to translate; none = read standard input")
    add_translator_arguments(parser)
    parser.add_argument("--n_best", type=int, default=0, metavar="N",
                        help="print the N best hypotheses (or N samples) per input as LINE<TAB>SCORE<TAB>TRANSLATION")
    parser.add_argument("--chunk_size", type=int, default=500, metavar="LINES",
                        help="standard input lines translated, written and flushed together (default: 500)")
    parser.add_argument("--plot_attention", type=Path, default=None, metavar="FILE.png",
                        help="also save the cross-attention heatmap of the first sentence to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args, resolved = parse_args(TRANSLATE, argv, parser=parser)
    config = resolved.config
    if args.n_best < 0 or args.chunk_size < 1:
        parser.error("--n_best must not be negative and --chunk_size must be at least 1")
    for number, text in enumerate(args.sentences, start=1):
        if not text.strip():
            parser.error(f"sentence {number} is empty: nothing to translate")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes in argv arrive as lone surrogates
            parser.error(f"sentence {number} is not valid UTF-8")
    if sys.stdout is None:  # started with stdout closed (`>&-`): nothing could be written, as into a closed pipe
        return EXIT_CLOSED_PIPE
    try:
        options = DecodingOptions.from_config(config, n_best=max(1, args.n_best))
        translator = load_translator(args, resolved)
        target = translator.target_language(options.target_lang)
    except ConfigError as error:
        parser.error(str(error))
    except (CheckpointError, TranslatorError) as error:
        print(f"translate.py: error: {error}", file=sys.stderr)
        return 1
    into = f", translating into {target}" if len(translator.target_languages) > 1 else ""
    print(f"translate.py: using {translator.source}{into}", file=sys.stderr)

    inputs = chunks([(text, True) for text in args.sentences], len(args.sentences)) if args.sentences else \
        chunks(input_pieces(sys.stdin.buffer, config["max_line_bytes"]), args.chunk_size)
    number, bad, first_sentence = 1, 0, None
    try:
        for chunk in inputs:
            numbers = list(accumulate((ends for _, ends in chunk[:-1]), initial=number))
            texts = [text for text, _ in chunk]
            outputs, chunk_bad = translate_chunk(translator, texts, numbers, options, args.n_best > 0)
            # One write per chunk, flushed: what a killed run leaves behind is whole lines (but for a
            # line longer than max_line_bytes, whose pieces the next chunk may go on with).
            sys.stdout.write("".join(output if args.n_best else output + ("\n" if ends else " ")
                                     for output, (_, ends) in zip(outputs, chunk)))
            sys.stdout.flush()
            first_sentence = first_sentence or next((text.strip() for text in texts if text and text.strip()), None)
            number, bad = numbers[-1] + chunk[-1][1], bad + chunk_bad
    except BrokenPipeError:
        return stdout_closed()
    if args.plot_attention is not None and first_sentence is not None:
        from attention_plot import save_attention_plot  # matplotlib is only needed here
        try:
            save_attention_plot(translator.cross_attention(first_sentence, options.target_lang), args.plot_attention)
        except (OSError, ValueError) as error:
            print(f"translate.py: error: cannot write {args.plot_attention}: {error}", file=sys.stderr)
            return 1
        print(f"translate.py: saved the attention plot to {args.plot_attention}", file=sys.stderr)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

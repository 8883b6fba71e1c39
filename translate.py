"""Translate with a trained model: `python translate.py "I love you."`.

Text in, the same shape out: prints one line on stdout per input line; diagnostics go to stderr.
Each line is cut into sentences by the source language's rules (sentencex, sentences.py), all
sentences of a chunk are translated in one call, and each line is put back together around them:
its indentation, the spacing between its sentences, and URLs and e-mail addresses as they were.
A blank or whitespace-only line comes back as it was. `--split_sentences false` sends each line as
one sentence, as it is (the behaviour before segmentation). Either way a sentence over the model's
limit is cut at its best boundary (clause punctuation, else whitespace) and its pieces translated
and joined, never truncated; how many were cut goes to stderr. With no sentence arguments it
translates standard input, `--chunk_size` lines at a time: each chunk's translations are written
and flushed as soon as they are done, so memory stays bounded on inputs of any length and a killed
run leaves complete lines behind. A line longer than `--max_line_bytes` is read and translated in
pieces of at most that size, cut at whitespace (kept), whose translations make its one output line:
no line is held whole (`input_pieces`; a sentence across such a cut is translated in two parts).
A line that is not valid UTF-8 gets an empty output line and a message naming it, the others are
translated, and the exit code is 1. When the reader of stdout goes away (`translate.py < big.txt |
head -1`), it stops quietly with exit code 141, what a Unix tool killed by SIGPIPE reports (`yes |
head -1`): not 0, since not everything was written, and no traceback; so does a run started with
stdout closed (`translate.py "x" >&-`, unless it writes to --output), before loading the model.

Documents: `--input FILE` translates a whole file in its own shape (documents.py): plain text,
SubRip subtitles (.srt: numbers and timings kept), Markdown (.md: structure, code, URLs and link
targets kept) or HTML (.html: tags, attributes, comments, script, style, code and pre kept), inline
markup (HTML's <b>, <a href>; Markdown's emphasis and links) put back around the words of the
translation the model's attention says it covered; the format from the file's name or
`--format text|srt|markdown|html`; the translation goes to `--output FILE`, written atomically
(replacing a file there, never the input), or to stdout.

The model: the checkpoint --checkpoint_choice picks (default best: the best on validation) of the
run --experiment_name names, else of the one --datasource and the language pair name, else of the
only run under weights/; or `--checkpoint PATH`; `--average N` averages N checkpoints; or with
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
- `--n_best N`: N hypotheses per sentence (the N best of the beam, or N samples), one per line as
  `LINE<TAB>SCORE<TAB>TRANSLATION`, best first. With segmentation on, each hypothesis is of one
  sentence and LINE is `LINE.SENTENCE` (`3.2`: the second sentence of input line 3, both 1-based);
  with `--split_sentences false` it is the line's number alone. SCORE has four decimals (a sentence
  cut for length: the mean of its pieces' scores, its k-th hypothesis joining theirs; one with no
  letter to translate: itself, 0.0000). Blank lines and lines that cannot be read get none.
`--glossary FILE`: terms the translations must use (docs/glossary.md; a TSV file of source term
TAB target term): wherever a sentence holds a source term, its translation holds the target term,
in place of what the source term would give (constrained beam search, its copy and usual
renderings forbidden, decoding.py), in every mode: lines, standard input and --input documents;
sentences without a term are translated exactly as without the glossary. Sentences holding a term
are searched with a beam of at least --glossary_beam_size (said once on stderr), the others with
--beam_size. With --engine ctranslate2 the glossary is only annotated in the sources of a model
trained with --term_annotation; sampling, and ctranslate2 for another model, refuse a glossary in
one line (exit 2), and so does a malformed file or a target term the model's vocabulary cannot spell.
`--scores`: each sentence's confidence, the calibrated probability that its translation is good
(confidence.py; fitted at the end of training or by evaluate.py --fit_confidence), one row per
sentence as `LINE<TAB>CONFIDENCE<TAB>TRANSLATION` (LINE as with --n_best, CONFIDENCE with three
decimals, `-` for a sentence with nothing to translate); with --n_best, the rows are
`LINE<TAB>SCORE<TAB>CONFIDENCE<TAB>TRANSLATION`. Confidence is computed only then (the CTranslate2
engine scores its translations once more for it). A model without a calibrator is one line saying
why (exit 2); without --scores, a calibrator that cannot be read (a truncated or hand-edited
confidence.json) is one warning, and the model translates.
`--plot_attention FILE.png` also saves the first sentence's cross-attention heatmap (either engine).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from itertools import accumulate, islice
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

from config import TRANSLATE, ConfigError, OneLineParser, Resolved, build_parser, parse_args
from nmt.atomic_files import atomic_write_bytes
from nmt.diagnostics import first_line
from nmt.inference.documents import FORMATS, DocumentError, document_format
from nmt.inference.glossary import GlossaryError, config_glossary
from nmt.training.checkpoint import CheckpointError
from nmt.inference.translator import (DecodingOptions, TextTranslation, Translator, TranslatorError, add_translator_arguments,
                        load_translator, split_sentences_on)


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


def translate_chunk(translator: Translator, chunk: list[Piece], numbers: list[int], options: DecodingOptions,
                    split_sentences: bool) -> tuple[TextTranslation, int]:
    """One chunk of inputs (lines, or pieces of the lines `numbers`) translated in their shape, and
    how many could not be read."""
    for number, (text, _) in zip(numbers, chunk):
        if text is None:
            print(f"translate.py: line {number}: not valid UTF-8, skipped", file=sys.stderr)
    texts = [text or "" for text, _ in chunk]
    return translator.translate_text(texts, options, split_sentences), sum(text is None for text, _ in chunk)


def chunk_output(result: TextTranslation, chunk: list[Piece], numbers: list[int], n_best: bool, scores: bool,
                 split_sentences: bool, last: tuple[int, int]) -> tuple[str, tuple[int, int]]:
    """What a chunk writes: each line's translation in its shape (a piece that does not end its line
    goes on without a line break), or rows per sentence: with `n_best` LINE<TAB>SCORE<TAB>TRANSLATION
    for every hypothesis, with `scores` the CONFIDENCE before the TRANSLATION (the module
    docstring), LINE being LINE.SENTENCE with segmentation on, sentences counted from 1 in each line,
    across chunks (`last`: the line and sentence before); and the new `last`."""
    if not n_best and not scores:
        return "".join(line + ("\n" if ends else "") for line, (_, ends) in zip(result.lines, chunk)), last
    rows, (line, count) = [], last
    for sentence, hypotheses in result.sentences:
        number = numbers[sentence.flow]
        count, line = count + 1 if number == line else 1, number
        label = f"{number}.{count}" if split_sentences else f"{number}"
        for h in hypotheses:
            columns = [label, *([f"{h.score:.4f}"] if n_best else []),
                       *([f"{h.confidence:.3f}" if h.confidence is not None else "-"] if scores else []), h.text]
            rows.append("\t".join(columns) + "\n")
    return "".join(rows), (line, count)


def translate_file(translator: Translator, args: argparse.Namespace, text: str, options: DecodingOptions,
                   split_sentences: bool) -> int:
    """--input: the document translated in its shape, to --output (atomically) or stdout."""
    try:
        translated, cut = translator.translate_document(text, args.format, options, split_sentences)
    except DocumentError as error:
        print(f"translate.py: error: {args.input}: {error}", file=sys.stderr)
        return 1
    report_cut(cut, translator)
    if args.output is None:
        sys.stdout.write(translated)
        return 0
    try:
        atomic_write_bytes(args.output, translated.encode("utf-8"))
    except OSError as error:
        print(f"translate.py: error: cannot write {args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(f"translate.py: wrote {args.output} ({args.format})", file=sys.stderr)
    return 0


def report_cut(cut: int, translator: Translator) -> None:
    if cut:
        print(f"translate.py: {cut} sentence(s) over the model's limit of {translator.max_source_tokens} tokens "
              f"translated in pieces", file=sys.stderr)


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
    parser.add_argument("sentences", nargs="*", help="text to translate, each argument a line; none = read standard "
                                                     "input")
    add_translator_arguments(parser)
    parser.add_argument("--n_best", type=int, default=0, metavar="N",
                        help="print the N best hypotheses (or N samples) per sentence as "
                             "LINE<TAB>SCORE<TAB>TRANSLATION (LINE.SENTENCE with segmentation on)")
    parser.add_argument("--scores", action="store_true",
                        help="print each sentence's confidence (the probability that its translation is good) as "
                             "LINE<TAB>CONFIDENCE<TAB>TRANSLATION; needs a model with a calibrator")
    parser.add_argument("--chunk_size", type=int, default=500, metavar="LINES",
                        help="standard input lines translated, written and flushed together (default: 500)")
    parser.add_argument("--input", type=Path, default=None, metavar="FILE",
                        help="translate this document in its own shape: plain text, SubRip (.srt) or Markdown (.md)")
    parser.add_argument("--output", type=Path, default=None, metavar="FILE",
                        help="with --input: write the translation to this file, atomically (default: standard output)")
    parser.add_argument("--format", default="", metavar="{" + ",".join(FORMATS) + "}",
                        help="with --input: the document's format (default: from its file name)")
    parser.add_argument("--plot_attention", type=Path, default=None, metavar="FILE.png",
                        help="also save the cross-attention heatmap of the first sentence to this file")
    return parser


def command_line_lines(parser: OneLineParser, args: argparse.Namespace) -> list[str]:
    """The sentence arguments as input lines (an argument with line breaks is several lines), or a
    parser error for an empty one or one that is not UTF-8."""
    lines = []
    for number, text in enumerate(args.sentences, start=1):
        if not text.strip():
            parser.error(f"sentence {number} is empty: nothing to translate")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes in argv arrive as lone surrogates
            parser.error(f"sentence {number} is not valid UTF-8")
        lines += re.split(r"\r\n|\r|\n", text)
    return lines


def read_document(parser: OneLineParser, args: argparse.Namespace) -> str | None:
    """--input's text with its format settled in args.format (None without --input), or a parser
    error for options that do not go with it, an unknown format or a file that cannot be read."""
    if args.input is None:
        if args.output is not None or args.format:
            parser.error("--output and --format go with --input FILE")
        return None
    if args.sentences or args.n_best or args.scores or args.plot_attention:
        parser.error("--input translates a document: not with sentence arguments, --n_best, --scores or "
                     "--plot_attention")
    try:
        args.format = document_format(args.input, args.format)
        if args.output is not None and args.output.exists() and args.output.samefile(args.input):
            parser.error(f"--output {args.output} is the input: give another file")
        return args.input.read_bytes().decode("utf-8")
    except DocumentError as error:
        parser.error(str(error))
    except OSError as error:
        parser.error(f"cannot read --input {args.input}: {error.strerror or error}")
    except UnicodeDecodeError as error:
        parser.error(f"--input {args.input} is not valid UTF-8 (byte {error.start})")


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args, resolved = parse_args(TRANSLATE, argv, parser=parser)
    if args.n_best < 0 or args.chunk_size < 1:
        parser.error("--n_best must not be negative and --chunk_size must be at least 1")
    arguments, document = command_line_lines(parser, args), read_document(parser, args)
    if sys.stdout is None and args.output is None:  # started with stdout closed (`>&-`): as into a closed pipe
        return EXIT_CLOSED_PIPE
    loaded = load_model(parser, args, resolved)
    if loaded is None:
        return 1
    translator, options = loaded
    split_sentences = split_sentences_on(resolved.config, auto=True)
    try:
        if document is not None:
            return translate_file(translator, args, document, options, split_sentences)
        return translate_lines(translator, args, arguments, options, split_sentences, resolved.config)
    except BrokenPipeError:
        return stdout_closed()


def load_model(parser: OneLineParser, args: argparse.Namespace,
               resolved: Resolved) -> tuple[Translator, DecodingOptions] | None:
    """The glossary (read first: a malformed file is refused before the model loads), the model and
    the decoding options with the glossary; a parser error for what the command line got wrong, or
    None once a model that cannot be loaded is said on stderr."""
    config = resolved.config
    try:
        glossary = config_glossary(config)
    except GlossaryError as error:
        parser.error(str(error))
    try:
        # confidence only for --scores, the one output that shows it
        options = DecodingOptions.from_config(config, n_best=max(1, args.n_best), confidence=args.scores)
        translator = load_translator(args, resolved, scores=args.scores)
        target = translator.target_language(options.target_lang)
    except ConfigError as error:
        parser.error(str(error))
    except (CheckpointError, TranslatorError) as error:
        print(f"translate.py: error: {error}", file=sys.stderr)
        return None
    into = f", translating into {target}" if len(translator.target_languages) > 1 else ""
    print(f"translate.py: using {translator.source}{into}", file=sys.stderr)
    try:
        options, note = options.with_glossary(translator.build_glossary(glossary) if glossary else None,
                                              config["glossary_beam_size"])
    except (GlossaryError, TranslatorError) as error:
        parser.error(f"--glossary {config['glossary']}: {error}")
    if note:
        print(f"translate.py: {note}", file=sys.stderr)
    return translator, options


def translate_lines(translator: Translator, args: argparse.Namespace, arguments: list[str],
                    options: DecodingOptions, split_sentences: bool, config: dict[str, Any]) -> int:
    """The sentence arguments, else standard input `--chunk_size` lines at a time, translated and
    written chunk by chunk; then --plot_attention's heatmap of the first sentence. The exit code:
    1 when a line could not be read or the plot not saved."""
    inputs = chunks([(line, True) for line in arguments], len(arguments)) if arguments else \
        chunks(input_pieces(sys.stdin.buffer, config["max_line_bytes"]), args.chunk_size)
    number, bad, cut, last, first_sentence = 1, 0, 0, (0, 0), None
    for chunk in inputs:
        numbers = list(accumulate((ends for _, ends in chunk[:-1]), initial=number))
        result, chunk_bad = translate_chunk(translator, chunk, numbers, options, split_sentences)
        text, last = chunk_output(result, chunk, numbers, args.n_best > 0, args.scores, split_sentences, last)
        # One write per chunk, flushed: what a killed run leaves behind is whole lines (but for a
        # line longer than max_line_bytes, whose pieces the next chunk may go on with).
        sys.stdout.write(text)
        sys.stdout.flush()
        if first_sentence is None and result.sentences:
            sentence = result.sentences[0][0]
            first_sentence = chunk[sentence.flow][0][sentence.span.start:sentence.span.end]
        number, bad, cut = numbers[-1] + chunk[-1][1], bad + chunk_bad, cut + result.split_for_length
    report_cut(cut, translator)
    if args.plot_attention is not None and first_sentence is not None and \
            not plot_attention(translator, first_sentence, options.target_lang, args.plot_attention):
        return 1
    return 0 if bad == 0 else 1


def plot_attention(translator: Translator, sentence: str, target_lang: str, path: Path) -> bool:
    """--plot_attention: the heatmap of `sentence` saved to `path`; whether it was (else said in one line)."""
    try:
        from nmt.training.attention_plot import save_attention_plot  # matplotlib is only needed here
        save_attention_plot(translator.cross_attention(sentence, target_lang), path)
    except ImportError as error:
        print(f"translate.py: error: cannot draw the attention plot: {first_line(error)}", file=sys.stderr)
        return False
    except (OSError, ValueError) as error:
        print(f"translate.py: error: cannot write {path}: {error}", file=sys.stderr)
        return False
    print(f"translate.py: saved the attention plot to {path}", file=sys.stderr)
    return True


if __name__ == "__main__":
    sys.exit(main())

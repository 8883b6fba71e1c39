"""Export a checkpoint: `python export.py --output DIR [--quantization int8 | --format transformers]`.

By default it writes a CTranslate2 model directory (below). `--format transformers` writes a Hugging
Face Transformers model folder instead (nmt/inference/transformers_export.py maps the model onto
Pegasus, pre-norm, or Marian, post-norm, exactly; `--language` picks the language of a model of
several; `--evaluation FILE`, evaluate.py's output, puts its scores in the model card), into place
as a CTranslate2 export is, with the same marker and --overwrite rules.

The checkpoint is found as translate.py finds it (--checkpoint_choice, default best: the run's best
on validation, of the run --experiment_name names; or --checkpoint PATH; --average N averages N
checkpoints ending there first). The model is described to CTranslate2 through its own spec API
(`ctranslate2.specs.TransformerSpec`) and written by a `ctranslate2.converters.Converter`:
- pre-norm (with the final LayerNorms of encoder and decoder) or post-norm, as trained; ReLU;
- this model's sinusoidal table, passed row by row (CTranslate2's own table puts all sines before
  all cosines and starts at position 1; this model interleaves them from position 0);
- embeddings scaled by sqrt(d_model); LayerNorm epsilon 1e-5, PyTorch's;
- Q, K and V of self-attention fused in that order, K and V of cross-attention fused, as CTranslate2
  reads them; the projection with its bias;
- the special tokens [UNK], [SOS] (the decoder's start, added before every source), [EOS] (added
  after every source), [PAD] kept at its id; one shared vocabulary or two, and tied embeddings
  (CTranslate2 stores the shared matrix once);
- cross-attention returned for the heatmap is the mean over the last layer's heads, as
  attention_plot.py draws it.
Every tensor of the checkpoint must find its place: one that does not (a model this exporter does
not know) is refused in one line naming it. The model's tokenizers and its training config are
written beside CTranslate2's files (ct2_model.py says which; translator.py reads them): the config's
`lang_tgt` records a model's target languages (fr+it), and the tags <2fr>, <2it> that translator.py
puts before every source are tokens of the exported source vocabulary, which a model of several
target languages must hold (refused otherwise). The run's confidence calibrator (confidence.py,
confidence.json beside the checkpoints), when it has one, goes into project.json as `confidence`, so
that the CTranslate2 engine gives the same confidence; one that cannot be read is one warning, and
the model is exported without confidence. `--quantization` takes CTranslate2's names: int8,
int16, float32, bfloat16, and for GPUs float16 and int8_float16 (on a CPU, CTranslate2 runs those in
float32 and int8), or `auto` (the default): the type this machine runs fastest, by the rule of
ct2_model.ct2_setup, which chooses the compute type a model runs with on each machine and never runs
float weights as int8. Where that rule times int8 weights as int8 and as float32, export.py writes
an int8 and a float32 export, times each in its own type (ct2_model.timed_export: float32 on int8
weights runs slower than a float32 export), keeps the faster and leaves the timing in it
(ct2_model.TIMINGS), so this machine loads an int8 export without timing it. Served elsewhere, an
int8 export follows that machine's rule (as float32 where float32 is the faster there: int8's
translations at float32's speed), and a float32 export runs as float32 everywhere.

`--output DIR` is never a folder export.py did not write. Each export holds a marker, `export.json`,
listing the files it wrote; DIR may be new, an empty folder, or, with `--overwrite`
(ct2-transformers-converter's `--force`), an earlier export that holds only the files its marker
lists. Anything else is refused in one line with nothing touched: a folder without the marker, a
file, a symbolic link, an earlier export without `--overwrite`, one holding files the user put in it
(named, to be moved out first), or one whose marker lists no files. The model is written into a
folder of export.py's own beside DIR (tempfile.mkdtemp) and renamed into place whole; an earlier
export is checked again, renamed aside, so it stays usable until the new one is complete, and
removed only then. A failed or interrupted (Ctrl-C: one line, exit 130) export removes only that
folder of its own and leaves an earlier export as it was. The folder is locked (flock) from before
anything is written into it until it is gone, so the next export of DIR removes those of exports
killed by SIGKILL (putting back an earlier export that one had moved aside) and never a live one's.
Readers never see a half-replaced export: translator.py opens DIR once and reads every file of it
through that descriptor (ct2_model.pinned_folder), reading again the export that took its place if
this one is removed under it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from nmt.atomic_files import atomic_write_bytes, lock_folder
from nmt.training.checkpoint import CheckpointError, load_for_inference
from nmt.inference.confidence import CalibrationError, read_calibrator
from config import EXPORT, ConfigError, OneLineParser, build_parser, choose_run, parse_args, weights_dir
from nmt.inference.ct2_model import MARKER, QUANTIZATIONS, TIMINGS, export_quantization, read_project_files, timed_export, \
    write_project_files
from nmt.diagnostics import first_line, log
from model import Transformer
from nmt.corpora.tokenizer import EOS, SOS, UNK, missing_target_tag
from nmt.inference.transformers_export import Evaluation, MappingError, read_evaluation, read_run_config, \
    transformers_writer

LAYER_NORM_EPSILON = 1e-5  # nn.LayerNorm's default, which model.py uses
MARKER_NOTE = ("a model directory written by export.py, which may replace it when given --overwrite if it holds no "
               "file but those listed here")
SHOWN_EXTRAS = 3  # entries named in the message refusing to replace an export that holds others
STAGING = ".export-"  # an export is written into .NAME.export-XXXXXXXX beside --output NAME


class ExportError(RuntimeError):
    """A model that cannot be written as a CTranslate2 model; the message names the key."""


def vocabulary(tokenizer: Any) -> list[str]:
    """Token strings in id order: CTranslate2 maps a token to its position in this list."""
    return [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]


class TransformerConverter:
    """Builds the TransformerSpec of a model.py Transformer, tracking which weights it used."""

    def __init__(self, model: Transformer, config: dict[str, Any], tok_src: Any, tok_tgt: Any) -> None:
        self.model, self.config, self.tok_src, self.tok_tgt = model, config, tok_src, tok_tgt
        # Every name of every tensor (tied embeddings are one tensor under three names).
        self.names: dict[int, list[str]] = {}
        for name, tensor in model.state_dict(keep_vars=True).items():
            self.names.setdefault(id(tensor), []).append(name)
        self.used: set[str] = set()

    def tensor(self, parameter: torch.Tensor) -> torch.Tensor:
        # A copy: CTranslate2 quantizes in place, which would change the model's own weights.
        self.used.update(self.names.get(id(parameter), []))
        return parameter.detach().to("cpu", torch.float32, copy=True).contiguous()

    def linear(self, spec: Any, *layers: torch.nn.Linear) -> None:
        """One Linear, or several stacked along the output rows (fused Q;K;V or K;V)."""
        spec.weight = torch.cat([self.tensor(layer.weight) for layer in layers])
        spec.bias = torch.cat([self.tensor(layer.bias) for layer in layers])

    def norm(self, spec: Any, layer_norm: torch.nn.LayerNorm) -> None:
        spec.gamma, spec.beta = self.tensor(layer_norm.weight), self.tensor(layer_norm.bias)

    def spec(self) -> Any:
        from ctranslate2.specs import common_spec, transformer_spec

        config = self.config
        pre_norm = config["norm_first"]
        encoder = transformer_spec.TransformerEncoderSpec(config["num_layers"], config["num_heads"], pre_norm=pre_norm,
                                                          activation=common_spec.Activation.RELU)
        decoder = transformer_spec.TransformerDecoderSpec(config["num_layers"], config["num_heads"], pre_norm=pre_norm,
                                                          activation=common_spec.Activation.RELU, alignment_layer=-1,
                                                          alignment_heads=0)  # 0: the mean over all heads
        spec = transformer_spec.TransformerSpec(encoder, decoder)
        self.encoder_spec(encoder, pre_norm)
        self.decoder_spec(decoder, pre_norm)
        unused = sorted({name for names in self.names.values() for name in names} - self.used)
        if unused:
            raise ExportError(f"cannot represent {unused[0]} in CTranslate2's Transformer (this exporter knows "
                              f"model.py's blocks only)")
        self.vocabularies(spec)
        return spec

    def encoder_spec(self, encoder: Any, pre_norm: bool) -> None:
        model = self.model
        encoder.embeddings[0].weight = self.tensor(model.src_embed.embedding.weight)
        encoder.scale_embeddings = True  # x sqrt(d_model)
        encoder.position_encodings.encodings = model.src_pos.pe.detach().clone()
        if pre_norm:
            self.norm(encoder.layer_norm, model.encoder.norm)
        for layer, block in zip(encoder.layer, model.encoder.layers):
            attention = block.self_attention
            self.norm(layer.self_attention.layer_norm, block.residual[0].norm)
            self.linear(layer.self_attention.linear[0], attention.w_q, attention.w_k, attention.w_v)
            self.linear(layer.self_attention.linear[1], attention.w_o)
            self.norm(layer.ffn.layer_norm, block.residual[1].norm)
            self.linear(layer.ffn.linear_0, block.feed_forward.linear_1)
            self.linear(layer.ffn.linear_1, block.feed_forward.linear_2)

    def decoder_spec(self, decoder: Any, pre_norm: bool) -> None:
        model = self.model
        decoder.embeddings.weight = self.tensor(model.tgt_embed.embedding.weight)
        decoder.scale_embeddings = True
        decoder.position_encodings.encodings = model.tgt_pos.pe.detach().clone()
        if pre_norm:
            self.norm(decoder.layer_norm, model.decoder.norm)
        for layer, block in zip(decoder.layer, model.decoder.layers):
            own, cross = block.self_attention, block.cross_attention
            self.norm(layer.self_attention.layer_norm, block.residual[0].norm)
            self.linear(layer.self_attention.linear[0], own.w_q, own.w_k, own.w_v)
            self.linear(layer.self_attention.linear[1], own.w_o)
            self.norm(layer.attention.layer_norm, block.residual[1].norm)
            self.linear(layer.attention.linear[0], cross.w_q)
            self.linear(layer.attention.linear[1], cross.w_k, cross.w_v)
            self.linear(layer.attention.linear[2], cross.w_o)
            self.norm(layer.ffn.layer_norm, block.residual[2].norm)
            self.linear(layer.ffn.linear_0, block.feed_forward.linear_1)
            self.linear(layer.ffn.linear_1, block.feed_forward.linear_2)
        self.linear(decoder.projection, model.projection_layer.proj)

    def vocabularies(self, spec: Any) -> None:
        """The special tokens, the vocabularies and the LayerNorms' epsilon in the spec's config."""
        spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = UNK, SOS, EOS
        spec.config.decoder_start_token = SOS
        spec.config.add_source_bos = spec.config.add_source_eos = True  # sources are [SOS] ... [EOS]
        spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
        missing = missing_target_tag(self.tok_src, self.config)
        if missing:
            raise ExportError(f"a model of several target languages ({self.config['lang_tgt']}) needs the tag "
                              f"{missing} in its source vocabulary, which lacks it")
        spec.register_source_vocabulary(vocabulary(self.tok_src))
        spec.register_target_vocabulary(vocabulary(self.tok_tgt))


def export_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of the export at `folder`; None when `folder` is not one (or is a symbolic link)."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if folder.is_symlink() or not isinstance(marker, dict) or marker.get("written_by") != "export.py":
        return None
    return marker


def entries(folder: Path) -> set[str]:
    """Every file, folder and link under `folder`, as paths relative to it (links not followed)."""
    found = set()

    def unreadable(error: OSError) -> None:  # os.walk would skip what it cannot list
        raise error

    for root, folders, files in os.walk(folder, onerror=unreadable):
        found.update((Path(root) / name).relative_to(folder).as_posix() for name in folders + files)
    return found


def is_empty_folder(path: Path) -> bool:
    try:
        return path.is_dir() and not path.is_symlink() and not any(path.iterdir())
    except OSError:  # unreadable: not known to be empty
        return False


def check_output(output: Path, overwrite: bool) -> None:
    """Refuse an --output that is not new, an empty folder or (with `overwrite`) an earlier export
    that holds nothing but its own files."""
    if output.is_symlink():
        raise ExportError(f"--output {output} is a symbolic link, which export.py refuses as --output; nothing was "
                          f"changed: name a new or empty folder")
    if not os.path.lexists(output) or is_empty_folder(output):
        return
    marker = export_marker(output)
    if marker is None:
        what = "a folder" if output.is_dir() else "a file"
        raise ExportError(f"--output {output} is {what} that export.py did not write (no {MARKER}); nothing was "
                          f"changed: name a new or empty folder")
    if not overwrite:
        raise ExportError(f"{output} holds an earlier export; pass --overwrite to replace it")
    check_replaceable(output, marker)


def check_replaceable(output: Path, marker: dict[str, Any]) -> None:
    """Refuse to replace the export at `output` unless it holds only the files its marker lists."""
    own = marker.get("files")
    if not isinstance(own, list) or not all(isinstance(name, str) for name in own):
        raise ExportError(f"{output} holds an earlier export whose {MARKER} does not list its files, so export.py "
                          f"cannot tell them from yours; nothing was changed: move what you want to keep out of it "
                          f"and remove it, or name another --output")
    try:
        extras = sorted(entries(output) - set(own) - {MARKER, TIMINGS})  # a timing cached since is its own
    except OSError as error:
        raise ExportError(f"cannot read {output}: {error.strerror or error}") from None
    if extras:
        more = f" and {len(extras) - SHOWN_EXTRAS} more" if len(extras) > SHOWN_EXTRAS else ""
        raise ExportError(f"{output} holds an earlier export and {', '.join(extras[:SHOWN_EXTRAS])}{more}, which "
                          f"export.py did not write; nothing was changed: move them out of it to replace it")


def export_model(model: Transformer, config: dict[str, Any], tok_src: Any, tok_tgt: Any, output: Path,
                 quantization: str, checkpoint: str = "", overwrite: bool = False,
                 confidence: dict[str, Any] | None = None) -> Path:
    """Write `model` as a CTranslate2 model directory at `output` (new, empty, or an earlier export
    with `overwrite`: check_output), with the tokenizers, training config and `confidence` (a
    calibrator's data, or None) beside it; `quantization` auto: this machine's choice (the module's
    docstring)."""
    if quantization not in ("auto", *QUANTIZATIONS):
        raise ExportError(f"--quantization must be auto or one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    spec = TransformerConverter(model, config, tok_src, tok_tgt).spec()

    def write(own: Path) -> Path:
        fixed = export_quantization() if quantization == "auto" else quantization
        project = {"checkpoint": checkpoint, "config": config, "confidence": confidence}
        # folders made by the converter, with the user's umask (mkdtemp's folder is 0700)
        if fixed is not None:
            return write_model(spec, own / "model", fixed, tok_src, tok_tgt, project)
        # a timing decides: each type on its own export (float32 on int8 weights runs slower
        # than a float32 export); the converter quantizes a spec in place, so one spec each
        specs = {"float32": spec, "int8": TransformerConverter(model, config, tok_src, tok_tgt).spec()}
        folders = {name: write_model(timed, own / name, name, tok_src, tok_tgt, project)
                   for name, timed in specs.items()}
        return folders[timed_export(folders, torch.get_num_threads())]

    return staged_export(Path(output), overwrite, write)


def export_transformers(model: Transformer, config: dict[str, Any], tok_src: Any, tok_tgt: Any, output: Path,
                        checkpoint: str = "", overwrite: bool = False, target_lang: str = "",
                        run_config: dict[str, Any] | None = None, evaluation: Evaluation | None = None) -> Path:
    """Write `model` as a Transformers model folder at `output` (nmt/inference/transformers_export.py
    maps it), into place as export_model puts a CTranslate2 one (new, empty, or an earlier export
    with `overwrite`); a model it cannot map exactly is refused before anything is written."""
    try:
        write_folder = transformers_writer(model, config, tok_src, tok_tgt, target_lang, run_config, evaluation,
                                           checkpoint)
    except MappingError as error:
        raise ExportError(str(error)) from None
    return staged_export(Path(output), overwrite, lambda own: write_folder(own / "model"))


def staged_export(output: Path, overwrite: bool, write: Callable[[Path], Path]) -> Path:
    """Run `write` (it writes the export into a new folder inside the folder it is given, and
    returns it) in a locked folder of export.py's own beside `output`, and rename the export into
    place (write_and_swap_in); `output` checked first (check_output)."""
    remove_leftovers(output)
    check_output(output, overwrite)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        own = Path(tempfile.mkdtemp(prefix=f".{output.name}{STAGING}", dir=output.parent))
        held = lock_folder(own)  # before anything is written into it: remove_leftovers leaves it alone
    except OSError as error:
        raise ExportError(f"cannot write {output}: {error.strerror or error}") from None
    try:
        write_and_swap_in(write, own, output, overwrite)
        shutil.rmtree(own, ignore_errors=True)  # export.py's own folder, holding the export it replaced
    finally:
        os.close(held)
    return output


def write_and_swap_in(write: Callable[[Path], Path], own: Path, output: Path, overwrite: bool) -> None:
    """Write the export into a folder inside `own` (`write` returns it), add the marker, and rename
    it to `output` (an earlier export moved to `own`/previous when `overwrite`). On failure, `own` is removed, unless
    it holds the earlier export, which could not be put back (the error says where it is)."""
    aside = own / "previous"
    try:
        staging = write(own)
        marker = {"written_by": "export.py", "note": MARKER_NOTE, "files": sorted(entries(staging))}
        atomic_write_bytes(staging / MARKER, json.dumps(marker, indent=1).encode("utf-8"))
        swap_in(staging, output, aside if overwrite else None)
    except BaseException as error:
        reason = f"cannot write {output}: {getattr(error, 'strerror', None) or first_line(error)}"
        if os.path.lexists(aside):  # the earlier export could not be put back: it is kept where it is
            raise ExportError(f"{reason}; the earlier export is at {aside}") from None
        shutil.rmtree(own, ignore_errors=True)
        if isinstance(error, (OSError, RuntimeError, ValueError)):  # CTranslate2's own, in one line
            raise ExportError(reason) from None
        raise


def remove_leftovers(output: Path) -> None:
    """Remove the staging folders, each with a full model, that exports of `output` killed by SIGKILL
    (or a power cut) left beside it, as store.py removes its own: those that hold something and that
    no live export holds locked (an export locks its folder before it writes into it). An earlier
    export found in one, where `output` is missing (killed between the two renames of swap_in), is
    put back at `output` first. Each is said in one line on stderr."""
    pattern = re.compile(rf"\.{re.escape(output.name)}{re.escape(STAGING)}[a-z0-9_]+")
    try:
        found = sorted(path for path in output.parent.iterdir() if pattern.fullmatch(path.name))
    except OSError:  # no parent folder yet, or an unreadable one: nothing of ours to find
        return
    for folder in found:
        try:
            held = lock_folder(folder, wait=False)
        except OSError:  # not a folder, or gone meanwhile
            continue
        if held is None:
            continue  # a live export's
        try:
            if not any(folder.iterdir()):
                continue  # just made by a live export that has not locked it yet
            previous = folder / "previous"
            if previous.is_dir() and not os.path.lexists(output):
                previous.rename(output)
                log(f"export.py: put back the earlier export at {output}, which a killed export had moved aside")
            shutil.rmtree(folder, ignore_errors=True)
            log(f"export.py: removed {folder}, the staging folder of an export that was killed")
        except OSError as error:
            log(f"export.py: warning: cannot remove {folder}, left by a killed export: {error.strerror or error}")
        finally:
            os.close(held)


def write_model(spec: Any, folder: Path, quantization: str, tok_src: Any, tok_tgt: Any,
                project: dict[str, Any]) -> Path:
    """Convert `spec` into the new `folder` as `quantization`, with this project's files beside it
    (`project` plus the quantization)."""
    from ctranslate2.converters import Converter

    class SpecConverter(Converter):
        def _load(self) -> Any:
            return spec

    SpecConverter().convert(str(folder), quantization=quantization)
    write_project_files(folder, tok_src, tok_tgt, {**project, "quantization": quantization})
    return folder


def swap_in(staging: Path, output: Path, aside: Path | None) -> None:
    """Rename `staging` to `output`, which is new, an empty folder (rename() replaces it, and fails if
    it is no longer empty) or, given `aside`, an earlier export: checked again (a file put in it
    during the export is not lost), renamed there first, and back if the new one cannot take its
    place or the rename is interrupted."""
    marker = export_marker(output) if aside is not None else None
    if marker is not None:
        check_replaceable(output, marker)
        output.rename(aside)
    try:
        staging.rename(output)
    except BaseException:
        if aside is not None and os.path.lexists(aside):
            aside.rename(output)
        raise


def argument_parser() -> OneLineParser:
    parser = build_parser(EXPORT, __doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="checkpoint file (default: the run's, by --checkpoint_choice)")
    parser.add_argument("--average", type=int, default=1,
                        help="average the weights of this many checkpoints, ending at --checkpoint or the chosen one")
    parser.add_argument("--format", choices=("ctranslate2", "transformers"), default="ctranslate2",
                        help="what to write: a CTranslate2 model directory (default), or a Hugging Face Transformers "
                             "model folder (safetensors, fast tokenizer, generation config, model card)")
    parser.add_argument("--quantization", choices=("auto", *QUANTIZATIONS), default=None,
                        help="weight type of a CTranslate2 export (default auto: the type this machine runs fastest, "
                             "timed where its CPU's rule cannot tell; docs/serving.md); a Transformers folder is "
                             "float32")
    parser.add_argument("--output", type=Path, required=True,
                        help="the model directory to write: a new or empty folder, or an earlier export with "
                             "--overwrite")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier export at --output (never a folder or file export.py did not write)")
    transformers = parser.add_argument_group("--format transformers")
    transformers.add_argument("--language", default="", help="a model of several target languages: the one the "
                                                              "folder translates into")
    transformers.add_argument("--evaluation", type=Path, default=None, help="evaluate.py's output for this model, "
                              "saved to a file: its scores and sacreBLEU signatures go into the model card")
    return parser


def check_format_options(parser: OneLineParser, args: argparse.Namespace) -> None:
    """Refuse options of the other format (one line, exit 2)."""
    if args.format == "transformers" and args.quantization is not None:
        parser.error("--quantization applies to CTranslate2 exports; a Transformers folder holds float32 weights")
    if args.format == "ctranslate2" and (args.language or args.evaluation is not None):
        parser.error("--language and --evaluation apply to --format transformers")


def export_checkpoint(args: argparse.Namespace, config: dict[str, Any]) -> tuple[Path, str]:
    """Load the checkpoint the arguments name and export it in their format: (output, source)."""
    evaluation = read_evaluation(args.evaluation) if args.evaluation is not None else None
    model, tok_src, tok_tgt, model_config, path = load_for_inference(
        args.checkpoint, weights_dir(config), torch.device("cpu"), args.average, config["checkpoint_choice"],
        config["average_min_gap_steps"])
    source = str(path) + (f" (average of {args.average} ending here)" if args.average > 1 else "")
    if args.format == "transformers":
        return export_transformers(model, model_config, tok_src, tok_tgt, args.output, source, args.overwrite,
                                   args.language, read_run_config(path.parent), evaluation), source
    return export_model(model, model_config, tok_src, tok_tgt, args.output, args.quantization or "auto", source,
                        args.overwrite, run_calibrator(path.parent)), source


def run_calibrator(folder: Path) -> dict[str, Any] | None:
    """The run's confidence calibrator as project.json stores it; None without one, or, after one
    warning, for one that cannot be read: a side file, so the model is exported without confidence."""
    try:
        calibrator = read_calibrator(folder)
    except CalibrationError as error:
        log(f"export.py: warning: {error}: exporting without confidence (fit it again with evaluate.py "
            f"--fit_confidence, then export again)")
        return None
    return calibrator.to_dict() if calibrator else None


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args, resolved = parse_args(EXPORT, argv, parser=parser)
    config = resolved.config
    if args.average < 1:
        parser.error(f"--average must be at least 1, got {args.average}")
    check_format_options(parser, args)
    if args.checkpoint is None:
        try:
            choose_run(resolved)
        except ConfigError as error:
            parser.error(str(error))
    try:
        check_output(args.output, args.overwrite)  # before the checkpoint is loaded: refused at once
        output, source = export_checkpoint(args, config)
    except (CheckpointError, ExportError, MappingError) as error:
        print(f"export.py: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"export.py: interrupted; nothing was written to {args.output}", file=sys.stderr)
        return 130
    if args.format == "transformers":
        what = json.loads((output / "config.json").read_text(encoding="utf-8"))["architectures"][0]
    else:
        what = read_project_files(output)[0]["quantization"]
    print(f"export.py: wrote {output} ({what}) from {source}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

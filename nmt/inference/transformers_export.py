"""A model.py Transformer as a Hugging Face Transformers model folder, computing what it computes.

`write_transformers_folder` writes what `AutoModelForSeq2SeqLM.from_pretrained(DIR)` and
`AutoTokenizer.from_pretrained(DIR)` load with no code of this project (trust_remote_code=False):
config.json, model.safetensors, generation_config.json, the tokenizer's files and a model card.

The architecture is one transformers already has, chosen by the model's norm placement:
- pre-norm (the default): `PegasusForConditionalGeneration`, the one seq2seq model there whose
  blocks are pre-norm with a final LayerNorm on encoder and decoder, sinusoidal positions of the
  paper's frequencies from position 0, token embeddings scaled by sqrt(d_model) (scale_embedding),
  no LayerNorm on the embeddings, and a stored position table. M2M100/NLLB are pre-norm too, but
  compute fairseq's table (frequencies 10000^(-i/(d/2-1)), not the paper's 10000^(-2i/d), from
  position 2) and store none, so no mapping reproduces this model there; mBART normalises its
  embeddings.
- post-norm (`--norm_first false`): `MarianMTModel`, the paper's post-norm blocks with the same
  positions and scale and no final LayerNorms. Marian recomputes its position table when it loads
  (in float64, where model.py computes it in float32: they differ by at most 1.4e-5 at 256
  positions of width 512), so its logits match to that rounding, not bit for bit.
Both have biases on every projection, ReLU (activation_function "relu"), nn.LayerNorm's epsilon
1e-5 (model.py's), attention scaled by 1/sqrt(d_k) inside the attention, dropout in the same
places (attention_dropout on the weights, activation_dropout on the feed-forward's hidden layer,
dropout on embeddings and sublayer outputs), and the output projection's bias as
`final_logits_bias`.

The mapping is exact: model.py interleaves its sinusoids (sin at even dimensions, cos at odd),
transformers puts all sines before all cosines, so every tensor is re-indexed by one permutation
of the hidden dimensions (`hidden_order`: 0, 2, 4, ..., 1, 3, 5, ...), applied to the embeddings,
the position table, the input side of every matrix that reads the residual stream (Q, K, V, the
feed-forward's first layer, the output projection), the output side of every one that writes to
it (the attention output, the feed-forward's second layer) with its bias, and every LayerNorm's
weight and bias. LayerNorm and the residual sums do not depend on the order of dimensions, and
the heads' own dimensions (Q, K, V outputs) are left as they are, so the function is unchanged.

Vocabularies. Transformers' fast tokenizer is one `tokenizers` pipeline, so source and target
tokens share one id space:
- tied embeddings (one joint vocabulary, one matrix): the project's tokenizer, ids unchanged, the
  matrix shared by encoder, decoder and output (tie_word_embeddings).
- otherwise (two vocabularies, or one with three matrices): source ids first, as they are
  (0 .. S-1), then the target's, shifted by S; one embedding matrix [source; target], an output
  matrix [0; projection] and final_logits_bias [-inf; bias], so no source id is ever generated and
  the softmax over all ids is the model's softmax over its target vocabulary. The target's tokens
  join the tokenizer's vocabulary marked `TARGET_MARK` ("it:casa"): the mark holds a punctuation
  character, which the pre-tokenizer always splits off alone, so no source text can ever encode to
  a target id, and the decoder takes the mark off before Metaspace's. The target's special tokens
  are special there too (skipped when decoding). `text_target=` therefore encodes with the source
  side; the target tokenizer is `target_tokenizer.json` beside it, for labels (ids + S).
The decoder starts from the target's [SOS]; Pegasus, and CTranslate2's converter for it, start
from the pad token, so the pad token is that [SOS] (input padding is masked, so which id pads does
not matter). Sources are [SOS] text [EOS] (the tokenizer's post-processor), with a target tag
(<2it>) after [SOS] for a model of several target languages: one language per folder. Typed
special tokens are text, as in this project (split_special_tokens).

Refused in one line (MappingError): a tensor this mapping does not place (a model that is not
model.py's), a model of several target languages without the one to export, or a tag its source
vocabulary lacks.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tokenizers import Tokenizer

from config import target_languages, target_tag
from model import Transformer
from nmt.corpora.tokenizer import EOS, EOS_ID, SOS, SOS_ID, UNK, missing_target_tag

TARGET_TOKENIZER = "target_tokenizer.json"
TRAINING_CONFIG = "training_config.json"  # the run's config.json: train.py --config reads it


class MappingError(ValueError):
    """A model that cannot be written as a Transformers model exactly; the message says why."""


def target_mark(model_config: dict[str, Any]) -> str:
    """What a target token's string starts with in a tokenizer of two vocabularies ("it:")."""
    return f"{model_config['lang_tgt']}:"


def hidden_order(d_model: int) -> torch.Tensor:
    """Transformers' dimension j holds model.py's dimension order[j]: the sines (even dimensions)
    first, then the cosines (odd ones)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


@dataclass(frozen=True)
class VocabularyLayout:
    """Where source and target ids sit in the exported model's one id space."""

    source_size: int
    target_size: int
    tied: bool  # one vocabulary and one matrix: ids unchanged

    @property
    def target_offset(self) -> int:
        return 0 if self.tied else self.source_size

    @property
    def size(self) -> int:
        return self.source_size if self.tied else self.source_size + self.target_size

    def target_id(self, token_id: int) -> int:
        return self.target_offset + token_id


def vocabulary_layout(model: Transformer) -> VocabularyLayout:
    source = model.src_embed.embedding.weight
    tied = source is model.tgt_embed.embedding.weight and source is model.projection_layer.proj.weight
    return VocabularyLayout(source.size(0), model.tgt_embed.embedding.weight.size(0), tied)


def attention_names(ours: str, theirs: str, stacks: str) -> list[tuple[str, str, str]]:
    """LAYER_NAMES' rows of one kind of attention, in the layers of `stacks` (en|de, or de)."""
    source, target = rf"({stacks})coder\.layers\.(\d+)\.{ours}\.w_", rf"\1coder.layers.\2.{theirs}."
    return [(source + r"([qkv])\.weight", target + r"\3_proj.weight", "in"),
            (source + r"([qkv])\.bias", target + r"\3_proj.bias", ""),
            (source + r"o\.weight", target + "out_proj.weight", "out"),
            (source + r"o\.bias", target + "out_proj.bias", "vector")]


# model.py's names of the tensors inside the layers -> Transformers' (under "model."), and the side
# of the hidden dimensions each holds: "in" a matrix reading the residual stream (columns), "out"
# one writing to it (rows), "vector" a vector of the stream, "" none.
LAYER_NAMES = [
    *attention_names("self_attention", "self_attn", "en|de"),
    *attention_names("cross_attention", "encoder_attn", "de"),
    (r"(en|de)coder\.layers\.(\d+)\.feed_forward\.linear_1\.weight", r"\1coder.layers.\2.fc1.weight", "in"),
    (r"(en|de)coder\.layers\.(\d+)\.feed_forward\.linear_1\.bias", r"\1coder.layers.\2.fc1.bias", ""),
    (r"(en|de)coder\.layers\.(\d+)\.feed_forward\.linear_2\.(weight|bias)", r"\1coder.layers.\2.fc2.\3", "out"),
    (r"(en|de)coder\.layers\.(\d+)\.residual\.0\.norm\.(weight|bias)", r"\1coder.layers.\2.self_attn_layer_norm.\3",
     "vector"),
    (r"encoder\.layers\.(\d+)\.residual\.1\.norm\.(weight|bias)", r"encoder.layers.\1.final_layer_norm.\2", "vector"),
    (r"decoder\.layers\.(\d+)\.residual\.1\.norm\.(weight|bias)", r"decoder.layers.\1.encoder_attn_layer_norm.\2",
     "vector"),
    (r"decoder\.layers\.(\d+)\.residual\.2\.norm\.(weight|bias)", r"decoder.layers.\1.final_layer_norm.\2", "vector"),
    (r"(en|de)coder\.norm\.(weight|bias)", r"\1coder.layer_norm.\2", "vector"),
]
EMBEDDING_NAMES = {"src_embed.embedding.weight", "tgt_embed.embedding.weight", "projection_layer.proj.weight",
                   "projection_layer.proj.bias"}


def permuted(tensor: torch.Tensor, side: str, order: torch.Tensor) -> torch.Tensor:
    """`tensor` with its hidden dimensions in Transformers' order, on the `side` that holds them;
    "out" of a 1-d tensor is a bias, a vector of the stream."""
    tensor = tensor.detach().to("cpu", torch.float32)
    if side == "in":
        return tensor[:, order].contiguous()
    if side in ("out", "vector"):
        return tensor[order].contiguous()
    return tensor.clone()


def layer_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Every tensor of the layers and final LayerNorms under its Transformers name (without
    "model."), permuted; a MappingError names one that has no place there."""
    order = hidden_order(model.src_embed.d_model)
    mapped = {}
    for name, tensor in model.state_dict().items():
        if name in EMBEDDING_NAMES:
            continue
        for pattern, replacement, side in LAYER_NAMES:
            if re.fullmatch(pattern, name):
                mapped[re.sub(pattern, replacement, name)] = permuted(tensor, side, order)
                break
        else:
            raise MappingError(f"cannot represent {name} in a Transformers model (this exporter knows model.py's "
                               f"blocks only)")
    return mapped


def vocabulary_weights(model: Transformer, layout: VocabularyLayout) -> dict[str, torch.Tensor]:
    """The embedding matrix shared by encoder and decoder, the output matrix and its bias
    (final_logits_bias), laid out as `layout` says, with the position table, permuted."""
    order = hidden_order(model.src_embed.d_model)
    source = permuted(model.src_embed.embedding.weight, "in", order)
    projection = model.projection_layer.proj
    bias = projection.bias.detach().to("cpu", torch.float32)
    if layout.tied:
        shared, head = source, source
    else:
        shared = torch.cat([source, permuted(model.tgt_embed.embedding.weight, "in", order)])
        head = torch.cat([torch.zeros_like(source), permuted(projection.weight, "in", order)])
        bias = torch.cat([torch.full((layout.source_size,), float("-inf")), bias])
    return {"model.shared.weight": shared, "model.encoder.embed_tokens.weight": shared,
            "model.decoder.embed_tokens.weight": shared, "lm_head.weight": head, "final_logits_bias": bias[None],
            "model.encoder.embed_positions.weight": permuted(model.src_pos.pe, "in", order),
            "model.decoder.embed_positions.weight": permuted(model.tgt_pos.pe, "in", order)}


def pre_norm(model: Transformer) -> bool:
    return isinstance(model.encoder.norm, torch.nn.LayerNorm)


def transformers_config(model: Transformer, model_config: dict[str, Any], layout: VocabularyLayout) -> Any:
    """The Pegasus (pre-norm) or Marian (post-norm) config of `model`."""
    from transformers import MarianConfig, PegasusConfig

    dropout = model_config["dropout"]
    start, end = layout.target_id(SOS_ID), layout.target_id(EOS_ID)
    settings = dict(
        vocab_size=layout.size, d_model=model_config["d_model"], encoder_layers=model_config["num_layers"],
        decoder_layers=model_config["num_layers"], encoder_attention_heads=model_config["num_heads"],
        decoder_attention_heads=model_config["num_heads"], encoder_ffn_dim=model_config["d_ff"],
        decoder_ffn_dim=model_config["d_ff"], activation_function="relu", dropout=dropout,
        attention_dropout=dropout, activation_dropout=dropout, max_position_embeddings=model_config["seq_len"],
        scale_embedding=True, tie_word_embeddings=layout.tied, pad_token_id=start, decoder_start_token_id=start,
        eos_token_id=end, forced_eos_token_id=None)
    if pre_norm(model):
        # normalize_before and normalize_embedding, as the Hub's Pegasus configs hold them: what
        # CTranslate2's converter reads to build the blocks (transformers' Pegasus is always so)
        return PegasusConfig(**settings, normalize_before=True, normalize_embedding=False,
                             architectures=["PegasusForConditionalGeneration"])
    return MarianConfig(**settings, decoder_vocab_size=layout.size, share_encoder_decoder_embeddings=True,
                        architectures=["MarianMTModel"])


def transformers_model(model: Transformer, model_config: dict[str, Any]) -> Any:
    """The Transformers model computing what `model` computes, in eval mode."""
    from transformers import MarianMTModel, PegasusForConditionalGeneration

    layout = vocabulary_layout(model)
    config = transformers_config(model, model_config, layout)
    weights = {f"model.{name}": tensor for name, tensor in layer_weights(model).items()}
    weights.update(vocabulary_weights(model, layout))
    exported = (PegasusForConditionalGeneration if pre_norm(model) else MarianMTModel)(config)
    expected = set(exported.state_dict())
    if not pre_norm(model):  # Marian computes its position table itself (module docstring)
        weights = {name: tensor for name, tensor in weights.items() if "embed_positions" not in name}
        expected = {name for name in expected if "embed_positions" not in name}
    if set(weights) != expected:
        missing = sorted(expected - set(weights)) or sorted(set(weights) - expected)
        raise MappingError(f"cannot map model.py's model onto {type(exported).__name__}: {missing[0]} has no "
                           f"counterpart")
    exported.load_state_dict(weights, strict=False)
    return exported.eval()


def joint_tokenizer(tok_src: Tokenizer, tok_tgt: Tokenizer, mark: str) -> Tokenizer:
    """One tokenizer of both vocabularies: the source's, encoding as it does, with the target's
    tokens after its own (ids + source size), each marked with `mark`, and a decoder that takes the
    mark off (module docstring)."""
    from tokenizers import decoders

    joint, target = json.loads(tok_src.to_str()), json.loads(tok_tgt.to_str())
    offset = tok_src.get_vocab_size()
    if joint["model"]["type"] == "Unigram":  # pieces in id order, with their scores
        if target["model"]["type"] != "Unigram":
            raise MappingError("a Unigram source tokenizer needs a Unigram target tokenizer to share its model")
        joint["model"]["vocab"] += [[mark + piece, score] for piece, score in target["model"]["vocab"]]
    else:
        joint["model"]["vocab"].update({mark + tok_tgt.id_to_token(i): offset + i
                                        for i in range(tok_tgt.get_vocab_size())})
    joint["added_tokens"] += [{**token, "id": offset + token["id"], "content": mark + token["content"]}
                              for token in target["added_tokens"]]
    tokenizer = Tokenizer.from_str(json.dumps(joint))
    tokenizer.decoder = decoders.Sequence([decoders.Replace(mark, ""), tokenizer.decoder])
    return tokenizer


def transformers_tokenizer(tok_src: Tokenizer, tok_tgt: Tokenizer, layout: VocabularyLayout,
                           model_config: dict[str, Any], tag: str) -> Any:
    """The fast tokenizer of the exported model: [SOS] (`tag`) text [EOS] in, target ids out."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    mark = "" if layout.tied else target_mark(model_config)
    tokenizer = Tokenizer.from_str(tok_src.to_str()) if layout.tied else joint_tokenizer(tok_src, tok_tgt, mark)
    prefix = [(SOS, SOS_ID)] + ([(tag, tok_src.token_to_id(tag))] if tag else [])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=" ".join([token for token, _ in prefix] + ["$A", EOS]), special_tokens=[*prefix, (EOS, EOS_ID)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token=UNK, eos_token=mark + EOS,
                                   pad_token=mark + SOS, split_special_tokens=True,
                                   clean_up_tokenization_spaces=False, model_max_length=model_config["seq_len"])


def generation_config(model_config: dict[str, Any], layout: VocabularyLayout) -> Any:
    """The run's decoding settings that `generate` has: beam width, length penalty (the same score,
    log-probability over length ** length_penalty, [EOS] counted), the n-gram ban, a search that
    goes on until nothing better can come, and the decoder's limit. Not mapped: the brevity penalty
    (Sockeye's, which transformers lacks) and the cap of 2 x source + 10 tokens (a fixed max_length
    is all a config holds)."""
    from transformers import GenerationConfig

    start = layout.target_id(SOS_ID)
    settings: dict[str, Any] = dict(decoder_start_token_id=start, pad_token_id=start,
                                    eos_token_id=layout.target_id(EOS_ID), forced_eos_token_id=None,
                                    max_length=model_config["seq_len"], num_beams=model_config["beam_size"])
    if model_config["beam_size"] > 1:
        settings.update(length_penalty=model_config["length_penalty"], early_stopping="never")
    repeat_limit = max(model_config.get("no_repeat_ngram_size", 0), 0)
    if repeat_limit:
        settings["no_repeat_ngram_size"] = repeat_limit
    return GenerationConfig(**settings)


# Licences of the training data this project ships, by the data folder's name (data/tatoeba/SOURCE.md).
DATA_LICENCES = {"tatoeba": {"license": "other", "license_name": "cc-by-2.0-fr",
                             "license_link": "https://creativecommons.org/licenses/by/2.0/fr/"}}
EVALUATION_LINES = {"data": re.compile(r"data: (?P<datasource>.+) (?P<split>\w+), (?P<sentences>\d+) sentences, "
                                       r"beam size (?P<beam>\d+)"),
                    "chrf": re.compile(r"chrF2 = (?P<value>[\d.]+) \((?P<signature>.+)\)"),
                    "bleu_signature": re.compile(r"BLEU signature: (?P<signature>.+)"),
                    "bleu": re.compile(r"BLEU = (?P<value>[\d.]+) .*")}


@dataclass(frozen=True)
class Evaluation:
    """What evaluate.py printed for the exported model: split, BLEU and chrF with signatures."""

    datasource: str
    split: str
    sentences: int
    beam_size: int
    bleu: float
    bleu_signature: str
    chrf: float
    chrf_signature: str


def read_evaluation(path: Path) -> Evaluation:
    """evaluate.py's standard output, saved to `path`; a MappingError in one line when it is not."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise MappingError(f"cannot read --evaluation {path}: {getattr(error, 'strerror', None) or error}") from None
    found = {}
    for line in lines:
        for name, pattern in EVALUATION_LINES.items():
            match = pattern.match(line.strip())
            if match:
                found[name] = match
    if set(found) != set(EVALUATION_LINES):
        raise MappingError(f"--evaluation {path} is not what evaluate.py prints (its data:, chrF2 =, BLEU "
                           f"signature: and BLEU = lines)")
    data = found["data"]
    return Evaluation(data["datasource"], data["split"], int(data["sentences"]), int(data["beam"]),
                      float(found["bleu"]["value"]), found["bleu_signature"]["signature"],
                      float(found["chrf"]["value"]), found["chrf"]["signature"])


def training_command(run_config: dict[str, Any] | None) -> str:
    """The train.py command of a run's config.json (its preset and the keys its user gave), or the
    one that reads the training config shipped in the folder."""
    if not run_config:
        return f"python train.py --config {TRAINING_CONFIG}"
    values = run_config["config"]
    words = ["python", "train.py"] + (["--preset", run_config["preset"]] if run_config.get("preset") else [])
    for key in sorted(run_config.get("given", [])):
        value = values[key]
        words += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return " ".join(shlex.quote(word) for word in words)


def card_metadata(model_config: dict[str, Any], evaluation: Evaluation | None) -> Any:
    """The Hub's metadata block of the model card (huggingface_hub's ModelCardData)."""
    from huggingface_hub import EvalResult, ModelCardData

    datasource = model_config["datasource"]
    local = Path(datasource).exists()
    licence = DATA_LICENCES.get(Path(datasource).name if local else "", {"license": "unknown"})
    pair = f"{model_config['lang_src']}-{model_config['lang_tgt']}"
    results = None
    if evaluation is not None:
        where = dict(task_type="translation", task_name=f"Translation {pair}", dataset_type=evaluation.datasource,
                     dataset_name=evaluation.datasource, dataset_split=evaluation.split)
        results = [EvalResult(**where, metric_type="bleu", metric_name="sacreBLEU",
                              metric_value=round(evaluation.bleu, 2), metric_config=evaluation.bleu_signature),
                   EvalResult(**where, metric_type="chrf", metric_name="chrF2",
                              metric_value=round(evaluation.chrf, 2), metric_config=evaluation.chrf_signature)]
    return ModelCardData(language=[model_config["lang_src"], *target_languages(model_config)], **licence,
                         library_name="transformers", pipeline_tag="translation", tags=["translation"],
                         datasets=None if local else [datasource], metrics=["bleu", "chrf"],
                         model_name=f"nmt-{pair}" if results else None, eval_results=results)


def card_text(model_config: dict[str, Any], architecture: str, layout: VocabularyLayout, command: str,
              evaluation: Evaluation | None, checkpoint: str) -> str:
    """The model card's body: use, architecture, decoding, training and scores."""
    pair = f"{model_config['lang_src']} -> {model_config['lang_tgt']}"
    vocabulary = ("one vocabulary, tied embeddings" if layout.tied else
                  f"source ids 0-{layout.source_size - 1}, target ids {layout.source_size}-{layout.size - 1} "
                  f"(`{TARGET_TOKENIZER}` tokenizes targets for labels: its ids + {layout.source_size})")
    scores = (f"{evaluation.split} split of {evaluation.datasource}, {evaluation.sentences} sentences, beam "
              f"{evaluation.beam_size} with this project's decoding: BLEU {evaluation.bleu:.2f} "
              f"({evaluation.bleu_signature}), chrF2 {evaluation.chrf:.2f} ({evaluation.chrf_signature})."
              if evaluation else
              "Not measured at export: `python evaluate.py --experiment_name NAME --split test > eval.txt`, then "
              "`python export.py --format transformers --evaluation eval.txt ...` puts its scores and sacreBLEU "
              "signatures here.")
    return f"""
# Transformer {pair}

An encoder-decoder Transformer trained from scratch by this project's train.py and exported by its
export.py (from {checkpoint or 'a model in memory'}) as `{architecture}`, which computes what the
trained model computes.

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("DIR")
model = AutoModelForSeq2SeqLM.from_pretrained("DIR")
batch = tokenizer(["Where is the station?"], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

## Model
{model_config['num_layers']} + {model_config['num_layers']} layers, d_model {model_config['d_model']},
{model_config['num_heads']} heads, feed-forward {model_config['d_ff']}, ReLU,
{'pre-norm' if architecture.startswith('Pegasus') else 'post-norm'}, sinusoidal positions (up to
{model_config['seq_len']}); {vocabulary}. Sources are `[SOS] text [EOS]`; the decoder starts from the
target's [SOS], which is also the pad token.

## Decoding
generation_config.json holds the run's beam ({model_config['beam_size']}), length penalty
({model_config['length_penalty']}, the score log-probability / length ** penalty, [EOS] counted) and
n-gram ban. Not representable there: this project's brevity penalty (Sockeye's,
{model_config['brevity_penalty']}) and its cap of 2 x source + 10 output tokens, so beam search
here can pick other hypotheses than the project's own decoding.

## Other clients
transformers 5 has no `pipeline("translation")` (removed in 5.0): use `generate` as above.
{'`ct2-transformers-converter --model DIR --output_dir DIR_ct2` converts this folder for CTranslate2.'
 if architecture.startswith('Pegasus') else
 "CTranslate2's converter starts a Marian decoder from a zero vector, not from [SOS]: for CTranslate2, "
 'export the checkpoint with export.py (its default format) instead.'}

## Training
`{command}` (the run's settings: `{TRAINING_CONFIG}`, which `train.py --config` reads).
Data: {model_config['datasource']}.

## Evaluation
{scores}
"""


def transformers_writer(model: Transformer, model_config: dict[str, Any], tok_src: Tokenizer, tok_tgt: Tokenizer,
                        target_lang: str = "", run_config: dict[str, Any] | None = None,
                        evaluation: Evaluation | None = None, checkpoint: str = "") -> Callable[[Path], Path]:
    """Map `model` now (a MappingError says why one cannot be), and return the function that writes
    it into a new folder as a Transformers model folder (module docstring), with the run's
    config.json (`run_config`, or one made of `model_config`) and a model card."""
    from huggingface_hub import ModelCard

    tag = export_tag(tok_src, model_config, target_lang)
    layout = vocabulary_layout(model)
    exported = transformers_model(model, model_config)
    exported.generation_config = generation_config(model_config, layout)
    tokenizer = transformers_tokenizer(tok_src, tok_tgt, layout, model_config, tag)
    command = training_command(run_config)
    run_config = run_config or {"config": model_config, "given": [], "preset": None}
    body = card_text(model_config, exported.config.architectures[0], layout, command, evaluation, checkpoint)
    card = ModelCard(f"---\n{card_metadata(model_config, evaluation).to_yaml()}\n---\n{body}")

    def write(folder: Path) -> Path:
        exported.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        if not layout.tied:
            (folder / TARGET_TOKENIZER).write_text(tok_tgt.to_str(), encoding="utf-8")
        (folder / TRAINING_CONFIG).write_text(json.dumps(run_config, indent=1), encoding="utf-8")
        card.save(folder / "README.md")
        return folder

    return write


def read_run_config(folder: Path) -> dict[str, Any] | None:
    """The config.json train.py wrote beside a run's checkpoints in `folder`; None where it has none."""
    try:
        found = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("config"), dict) else None


def export_tag(tok_src: Tokenizer, model_config: dict[str, Any], target_lang: str) -> str:
    """The target tag every source of the folder gets ("" for a model of one target language); a
    MappingError when a model of several lacks `target_lang` or its tag."""
    targets = target_languages(model_config)
    if len(targets) == 1:
        if target_lang not in ("", targets[0]):
            raise MappingError(f"--language {target_lang} is not this model's target language ({targets[0]})")
        return ""
    if target_lang not in targets:
        raise MappingError(f"this model translates into {', '.join(targets)}: a Transformers folder translates into "
                           f"one, named by --language")
    missing = missing_target_tag(tok_src, model_config)
    if missing:
        raise MappingError(f"a model of several target languages ({model_config['lang_tgt']}) needs the tag {missing} "
                           f"in its source vocabulary, which lacks it")
    return target_tag(target_lang)

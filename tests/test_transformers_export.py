"""nmt/inference/transformers_export.py, checked with transformers itself: the folder export.py
writes loads with AutoModelForSeq2SeqLM and AutoTokenizer (trust_remote_code=False); its logits
equal this project's model's in every architecture variant (pre-norm on Pegasus, post-norm on
Marian, tied or two vocabularies); greedy `generate` writes what this project's greedy decoding
writes; CTranslate2's own converter for Transformers folders converts it and translates the same
text; its tokenizer encodes sources and decodes targets as this project's tokenizers do (every
tokenizer type); a model of several target languages exports one of them; the model card holds
the Hub's metadata and evaluate.py's scores; what cannot be mapped is refused in one line."""
from __future__ import annotations

from pathlib import Path

import ctranslate2
from ctranslate2.converters import TransformersConverter
import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import evaluate
import export
from config import get_config
from model import build_transformer
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, SOS_ID, decode_ids, encode_ids, train_tokenizer
from nmt.inference import transformers_export
from nmt.inference.decoding import max_output_tokens
from nmt.inference.transformers_export import MappingError, hidden_order, read_evaluation
from nmt.inference.translator import DecodingOptions, TorchTranslator
from synthetic_data import synthetic_pairs
from test_translator import several_targets  # noqa: F401  (a fixture: an untrained model of en -> fr+it)

SEQ_LEN = 64


def random_model(norm_first: bool, tied: bool) -> tuple[torch.nn.Module, object, object, dict]:
    """Random weights (every weight moved off its initial value), two vocabularies of their own
    sizes or one tied one."""
    torch.manual_seed(1)
    pairs = synthetic_pairs(200, 1)
    joint = train_tokenizer([text for pair in pairs for text in pair], "bpe", 90, 1)
    tok_src = joint if tied else train_tokenizer([s for s, _ in pairs], "bpe", 80, 1)
    tok_tgt = joint if tied else train_tokenizer([t for _, t in pairs], "wordlevel", 70, 1)
    model = build_transformer(tok_src.get_vocab_size(), tok_tgt.get_vocab_size(), SEQ_LEN, SEQ_LEN, d_model=32, N=2,
                              h=4, d_ff=48, dropout=0.0, norm_first=norm_first, tie_embeddings=tied).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
        model.projection_layer.proj.bias[EOS_ID] += 1.5  # outputs of several lengths
    config = dict(get_config(), d_model=32, num_layers=2, num_heads=4, d_ff=48, seq_len=SEQ_LEN, dropout=0.0,
                  norm_first=norm_first, tie_embeddings=tied, joint_vocab=tied, tokenizer_type="bpe",
                  datasource="data/tatoeba")
    return model, tok_src, tok_tgt, config


def write_folder(model, tok_src, tok_tgt, config, folder: Path, **options) -> Path:
    return export.export_transformers(model, config, tok_src, tok_tgt, folder, "test", **options)


def loaded(folder: Path) -> tuple[object, object]:
    return (AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=False).eval(),
            AutoTokenizer.from_pretrained(folder, trust_remote_code=False))


def target_offset(model) -> int:
    return transformers_export.vocabulary_layout(model).target_offset


@pytest.mark.parametrize("norm_first, architecture", [(True, "PegasusForConditionalGeneration"),
                                                      (False, "MarianMTModel")])
@pytest.mark.parametrize("tied", [True, False])
def test_logits_equal_the_models(tmp_path: Path, norm_first: bool, architecture: str, tied: bool) -> None:
    """A padded batch through the exported tokenizer and model: the source ids are this project's
    ([SOS] ids [EOS], padded), and the logits over the target vocabulary equal the model's; the
    source ids of two vocabularies are never possible."""
    model, tok_src, tok_tgt, config = random_model(norm_first, tied)
    hf, tokenizer = loaded(write_folder(model, tok_src, tok_tgt, config, tmp_path / "hf"))
    assert type(hf).__name__ == architecture
    pairs = synthetic_pairs(12, 5)
    batch = tokenizer([s for s, _ in pairs], return_tensors="pt", padding=True)
    src = torch.full(batch.input_ids.shape, PAD_ID)
    tgt = torch.full((len(pairs), max(len(encode_ids(tok_tgt, t)) for _, t in pairs) + 1), PAD_ID)
    for row, (source, target) in enumerate(pairs):
        ids = [SOS_ID, *encode_ids(tok_src, source), EOS_ID]
        src[row, :len(ids)] = torch.tensor(ids)
        tgt[row, :len(encode_ids(tok_tgt, target)) + 1] = torch.tensor([SOS_ID, *encode_ids(tok_tgt, target)])
    mask = src != PAD_ID
    assert torch.equal(batch.input_ids[mask], src[mask]) and torch.equal(batch.attention_mask.bool(), mask)
    offset = target_offset(model)
    with torch.no_grad():
        ours = model(src, tgt, mask[:, None, None, :])
        theirs = hf(**batch, decoder_input_ids=tgt + offset).logits
    torch.testing.assert_close(theirs[..., offset:], ours)
    assert theirs.size(-1) == offset + tok_tgt.get_vocab_size()
    assert bool((theirs[..., :offset] == float("-inf")).all())


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("tied", [True, False])
def test_greedy_generate_writes_the_projects_greedy_text(tmp_path: Path, norm_first: bool, tied: bool) -> None:
    """Each sentence decoded greedily by `generate` (the folder's generation config, one beam, the
    cap the project puts on a batch of that one sentence) and by this project's translator: the
    same text."""
    model, tok_src, tok_tgt, config = random_model(norm_first, tied)
    hf, tokenizer = loaded(write_folder(model, tok_src, tok_tgt, config, tmp_path / "hf"))
    sources = [s for s, _ in synthetic_pairs(16, 7)]
    translator = TorchTranslator(model, tok_src, tok_tgt, config)
    ours = [translator.translate_best([source], DecodingOptions(beam_size=1))[0] for source in sources]
    theirs = []
    for source in sources:
        inputs = tokenizer(source, return_tensors="pt")
        cap = max_output_tokens(len(encode_ids(tok_src, source)), SEQ_LEN)
        output = hf.generate(**inputs, num_beams=1, max_new_tokens=cap)
        theirs.append(tokenizer.decode(output[0], skip_special_tokens=True))
    assert theirs == ours
    assert len({len(text) for text in ours}) >= 4, "outputs of several lengths"


def test_the_toy_translates_as_it_does_here(toy_translator, tmp_path: Path) -> None:
    """The trained toy (two word-level vocabularies), a batch through the folder's own settings: the
    project's greedy translations, every one right."""
    toy = toy_translator
    config = dict(get_config(), d_model=32, num_layers=1, num_heads=2, d_ff=64, seq_len=toy.seq_len)
    hf, tokenizer = loaded(write_folder(toy.model, toy.tok_src, toy.tok_tgt, config, tmp_path / "hf"))
    pairs = [pair for pair in toy.pairs(60, seed=21) if pair not in set(toy.train_pairs)][:40]
    batch = tokenizer([s for s, _ in pairs], return_tensors="pt", padding=True)
    theirs = tokenizer.batch_decode(hf.generate(**batch, num_beams=1), skip_special_tokens=True)
    assert theirs == toy.translator().translate_best([s for s, _ in pairs], DecodingOptions(beam_size=1))
    assert sum(text == target for text, (_, target) in zip(theirs, pairs)) >= 36


@pytest.mark.parametrize("tied", [True, False])
def test_ctranslate2s_converter_translates_the_same_text(tmp_path: Path, tied: bool) -> None:
    """CTranslate2's own converter of Transformers folders (TransformersConverter, which
    ct2-transformers-converter runs; in this process, as starting that program costs seconds)
    converts a pre-norm export; CTranslate2 then translates what this project's greedy decoding does."""
    model, tok_src, tok_tgt, config = random_model(True, tied)
    folder = write_folder(model, tok_src, tok_tgt, config, tmp_path / "hf")
    TransformersConverter(str(folder)).convert(str(tmp_path / "ct2"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sources = [s for s, _ in synthetic_pairs(16, 7)]
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(source).input_ids) for source in sources]
    translator = ctranslate2.Translator(str(tmp_path / "ct2"))
    found = [translator.translate_batch([source], beam_size=1, min_decoding_length=0,
                                        max_decoding_length=max_output_tokens(len(source) - 2, SEQ_LEN))[0]
             for source in tokens]
    theirs = [tokenizer.decode(tokenizer.convert_tokens_to_ids(result.hypotheses[0]), skip_special_tokens=True)
              for result in found]
    translator = TorchTranslator(model, tok_src, tok_tgt, config)
    assert theirs == [translator.translate_best([source], DecodingOptions(beam_size=1))[0] for source in sources]


@pytest.mark.parametrize("kind", ["wordlevel", "bpe", "unigram"])
def test_the_tokenizer_encodes_and_decodes_as_the_projects(kind: str) -> None:
    """Two vocabularies of one type in one tokenizer: sources encode to the source tokenizer's ids
    between [SOS] and [EOS] (a typed special token is text, as here), and target ids, shifted,
    decode to the target tokenizer's text."""
    pairs = synthetic_pairs(200, 1)
    tok_src = train_tokenizer([s for s, _ in pairs], kind, 80, 1)
    tok_tgt = train_tokenizer([t for _, t in pairs], kind, 70, 1)
    layout = transformers_export.VocabularyLayout(tok_src.get_vocab_size(), tok_tgt.get_vocab_size(), False)
    tokenizer = transformers_export.transformers_tokenizer(tok_src, tok_tgt, layout, get_config(), "")
    texts = [s for s, _ in synthetic_pairs(30, 4)] + ["Typed [EOS] and <2it>: text, né più."]
    assert [tokenizer(text).input_ids for text in texts] == [[SOS_ID, *encode_ids(tok_src, text), EOS_ID]
                                                             for text in texts]
    targets = [t for _, t in synthetic_pairs(30, 4)]
    for target in targets:
        ids = [SOS_ID, *encode_ids(tok_tgt, target), EOS_ID]
        assert tokenizer.decode([layout.target_id(i) for i in ids], skip_special_tokens=True) == \
            decode_ids(tok_tgt, ids)
    assert tokenizer.pad_token_id == layout.target_id(SOS_ID) and tokenizer.eos_token_id == layout.target_id(EOS_ID)


def test_hidden_order_puts_the_sines_first() -> None:
    """model.py's interleaved table, in Transformers' order, is Marian's and Pegasus's own table."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    table = MarianSinusoidalPositionalEmbedding(64, 16).create_weight()
    ours = build_transformer(5, 5, 64, 64, d_model=16, N=1, h=2, d_ff=8).src_pos.pe
    torch.testing.assert_close(ours[:, hidden_order(16)], table, atol=2e-6, rtol=0)


def test_several_targets_export_one_named(several_targets, tmp_path: Path) -> None:  # noqa: F811
    """A model of fr+it needs --target_lang: refused without it; with it, every source starts
    [SOS] <2fr>, and generate writes what the project writes into French."""
    many = several_targets
    with pytest.raises(export.ExportError, match="translates into fr, it"):
        write_folder(many.model, many.tok_src, many.tok_tgt, many.config, tmp_path / "none")
    assert not (tmp_path / "none").exists()
    hf, tokenizer = loaded(write_folder(many.model, many.tok_src, many.tok_tgt, many.config, tmp_path / "fr",
                                        target_lang="fr"))
    sources = ["alpha beta .", "gamma alpha delta ."]
    assert tokenizer(sources[0]).input_ids[:2] == [SOS_ID, many.tok_src.token_to_id("<2fr>")]
    translator = TorchTranslator(many.model, many.tok_src, many.tok_tgt, many.config)
    ours = [translator.translate_best([s], DecodingOptions(beam_size=1, target_lang="fr"))[0] for s in sources]
    theirs = [tokenizer.decode(hf.generate(**tokenizer(s, return_tensors="pt"), num_beams=1,
                                           max_new_tokens=max_output_tokens(len(encode_ids(many.tok_src, s)) + 1,
                                                                            many.config["seq_len"]))[0],
                               skip_special_tokens=True) for s in sources]
    assert theirs == ours


def test_generation_config_holds_the_runs_decoding(tmp_path: Path) -> None:
    """Beam, length penalty, the model's n-gram ban, the start and end ids, an exhaustive search."""
    model, tok_src, tok_tgt, config = random_model(True, False)
    config = dict(config, beam_size=4, length_penalty=0.6, no_repeat_ngram_size=3)
    hf, _ = loaded(write_folder(model, tok_src, tok_tgt, config, tmp_path / "hf"))
    generation = hf.generation_config
    offset = target_offset(model)
    assert (generation.num_beams, generation.length_penalty, generation.no_repeat_ngram_size) == (4, 0.6, 3)
    assert (generation.decoder_start_token_id, generation.eos_token_id, generation.pad_token_id) == \
        (offset + SOS_ID, offset + EOS_ID, offset + SOS_ID)
    assert generation.early_stopping == "never" and generation.max_length == SEQ_LEN


def test_model_card_holds_the_hubs_metadata_and_the_scores(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """evaluate.py's output, saved and given as --evaluation, becomes the card's model-index with
    the sacreBLEU signature; tatoeba's licence; the training command of the run's config.json."""
    evaluate.print_scores(["a b", "c d"], ["uno due", "tre"], ["uno due", "tre quattro"])
    printed = "model: x (pytorch)\ndata: data/tatoeba test, 2 sentences, beam size 5, length penalty 1.0\n" + \
        capsys.readouterr().out
    (tmp_path / "eval.txt").write_text(printed, encoding="utf-8")
    evaluation = read_evaluation(tmp_path / "eval.txt")
    model, tok_src, tok_tgt, config = random_model(True, True)
    run = {"config": dict(config, lr=0.002), "given": ["datasource", "lr"], "preset": "cpu"}
    folder = write_folder(model, tok_src, tok_tgt, config, tmp_path / "hf", run_config=run, evaluation=evaluation)
    from huggingface_hub import ModelCard

    card = ModelCard.load(folder / "README.md")
    assert card.data.language == ["en", "it"] and card.data.license_name == "cc-by-2.0-fr"
    result = card.data.eval_results[0]
    assert (result.metric_type, result.dataset_split) == ("bleu", "test")
    assert result.metric_value == round(evaluation.bleu, 2) and result.metric_config.startswith("nrefs:1|")
    assert "python train.py --preset cpu --datasource data/tatoeba --lr 0.002" in card.text
    assert "brevity penalty" in card.text


def test_what_cannot_be_mapped_is_refused(tmp_path: Path) -> None:
    """A tensor model.py does not have, and an --evaluation file that is not evaluate.py's."""
    model, tok_src, tok_tgt, config = random_model(True, True)
    model.encoder.register_parameter("extra", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(export.ExportError, match="cannot represent encoder.extra in a Transformers model"):
        write_folder(model, tok_src, tok_tgt, config, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    (tmp_path / "eval.txt").write_text("BLEU = 3\n", encoding="utf-8")
    with pytest.raises(MappingError, match="is not what evaluate.py prints"):
        read_evaluation(tmp_path / "eval.txt")


def test_the_benchmark_measures_the_export(toy_translator, tmp_path: Path) -> None:
    """benchmarks/bench_transformers_export.measure on the toy: every greedy line the same, beam 5
    scored on both sides, the logits' difference at float32's rounding."""
    from benchmarks import bench_transformers_export

    toy = toy_translator
    config = dict(get_config(), d_model=32, num_layers=1, num_heads=2, d_ff=64, seq_len=toy.seq_len)
    folder = write_folder(toy.model, toy.tok_src, toy.tok_tgt, config, tmp_path / "hf")
    pairs = [pair for pair in toy.pairs(40, seed=22) if pair not in set(toy.train_pairs)][:24]
    result = bench_transformers_export.measure(toy.model, toy.tok_src, toy.tok_tgt, config, config, pairs, folder)
    assert (result["sentences"], result["greedy_same"]) == (len(pairs), len(pairs))
    assert result["beam5_bleu_project"] > 50 and abs(result["beam5_bleu_difference"]) <= 5
    assert 0 < result["logits_max_abs_difference"] < 1e-4
    assert "greedy: same text on 24 (100.00%)" in bench_transformers_export.table(result)

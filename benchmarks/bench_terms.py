"""Glossary terms the model never chooses: are they written where their source terms stand, instead
of them, and what does it cost?

    python -m benchmarks.bench_terms --model_folder DIR --experiment_name NAME [--checkpoint PATH]
        [--datasource data/tatoeba] [--split validation] [--tom] [--terms_seed 57] [--beam 5]
        [--max_sentences N] [--device cpu] [--json]

1. The train split's word list (nmt/corpora/terms.py, as training computes it).
2. Terms, drawn with --terms_seed, PER_KIND of each kind, from the source words of the split that
   the word list renders at TERM_DICE or more (so that the reference's word for them is found):
   - name: a capitalised word rendered as itself (Tom, Mary), renamed to a first name of NAMES that
     the corpus never holds (Tom -> Tommaso, the issue's; the others drawn);
   - product: a common word renamed to an invented name (syllables drawn with the seed, absent from
     the corpus);
   - rare_sense: a common word given another Italian word of the word list, never one of its own
     renderings (a sense the corpus does not give it).
   With --tom instead: the one row Tom -> Tommaso, on the sentences whose source and reference both
   hold Tom (the issue's 150 of tatoeba test).
3. The sentences that hold a term whose word in the reference is found (WordList.links; a common
   word not capitalised there), the reference rewritten with the term in that word's place. The
   glossary of all the terms goes through the translator as translate.py --glossary does
   (annotated for a model trained with term_annotation, constrained, its words forbidden, the
   glossary beam); nothing is replaced in an output after decoding.

Reported, over those sentences: terms present (as words), terms in place (the free output with its
word for the source term replaced by the term, or the term at its word position in the rewritten
reference), sentences still holding the source term or a rendering of it (the word list's) that the
rewritten reference does not, sentences more than one word longer than the free output, BLEU
against the rewritten references (the glossary's output; the free output with the words replaced
afterwards; the free output), and sentences/s free and with the glossary; BLEU of the whole split
without a glossary. Choose settings on the validation split; report test.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_terms.py: run it from the repository root as: python -m benchmarks.bench_terms")

from benchmarks.bench_glossary import run_benchmark, scores, search_parser  # noqa: E402  (after the check above)
from config import weights_dir  # noqa: E402
from nmt.corpora.sources import DataError, Pair, open_source, read_all_pairs  # noqa: E402
from nmt.corpora.terms import WordList, dice_table, renderings, words  # noqa: E402
from nmt.device import pick_device  # noqa: E402
from nmt.inference.glossary import GlossaryError, term_alternatives  # noqa: E402
from nmt.inference.translator import DecodingOptions, TorchTranslator  # noqa: E402

PER_KIND = 4  # terms of each kind
TERM_DICE = 0.5  # a source word's rendering, at least, for its reference word to be found
FREQUENT = 40  # the common words drawn from: the most frequent qualifying ones of the split
NAMES = ("Tommaso", "Ilaria", "Gianluca", "Benedetta", "Ottavio", "Ludovica", "Ruggero", "Fiammetta", "Ermanno",
         "Cosima", "Leopoldo", "Zelinda")
SYLLABLES = ("ka", "zo", "vel", "mi", "tra", "lux", "ne", "dor", "qui", "sa", "ber", "on", "fi", "rax")


class Term(NamedTuple):
    kind: str
    source: str  # a word, as the sources write it
    target: str


class Row(NamedTuple):
    source: str
    reference: str
    rewritten: str  # the reference with each term in its source word's place
    terms: tuple[Term, ...]


def word_pattern(word: str) -> re.Pattern:
    return re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE)


def invented_name(rng: np.random.Generator, taken: set[str]) -> str:
    """A capitalised name of 3 syllables that is not in `taken` (case-folded words)."""
    while True:
        name = "".join(SYLLABLES[int(i)] for i in rng.integers(len(SYLLABLES), size=3)).capitalize()
        if name.casefold() not in taken:
            return name


def draw_terms(word_list: WordList, sources: Sequence[str], taken: set[str], rng: np.random.Generator) -> list[Term]:
    """PER_KIND terms of each kind (module docstring) for the split's `sources`; `taken`: the
    corpus's case-folded words, which new names avoid."""
    counts = Counter(match.group() for source in sources for match in re.finditer(r"\w+", source))
    strong = {s: [t for t, dice in found.items() if dice >= TERM_DICE] for s, found in word_list.renderings.items()}
    names = [w for w, _ in counts.most_common() if w[:1].isupper() and w.casefold() in strong.get(w.casefold(), [])
             and w.casefold() not in counts and w.isalpha()][:PER_KIND]
    free_names = [name for name in NAMES if name.casefold() not in taken]
    terms = []
    for name in names:
        new = "Tommaso" if name == "Tom" and "Tommaso" in free_names else free_names[int(rng.integers(len(free_names)))]
        free_names.remove(new)
        terms.append(Term("name", name, new))
    common = [w for w, _ in counts.most_common() if w.islower() and w.isalpha() and len(w) > 2
              and any(t != w for t in strong.get(w, []))][:FREQUENT]
    chosen = [common[int(i)] for i in rng.choice(len(common), min(len(common), 2 * PER_KIND), replace=False)]
    for word in chosen[:PER_KIND]:
        terms.append(Term("product", word, invented_name(rng, taken)))
    others = [t for t in word_list.targets if t.islower() and len(t) > 3]
    for word in chosen[PER_KIND:]:
        unusual = [t for t in others if t not in word_list.renderings.get(word, {}) and t not in
                   {term.target for term in terms}]
        if unusual:
            terms.append(Term("rare_sense", word, unusual[int(rng.integers(len(unusual)))]))
    return terms


def rewrite(source: str, reference: str, terms: Sequence[Term], word_list: WordList) -> tuple[str, list[Term]] | None:
    """The reference with each term of `terms` that `source` holds in the place of its source word's
    linked word; None when one has no such word (or a common word's is capitalised there)."""
    held = [term for term in terms if word_pattern(term.source).search(source)]
    links = {s.group().casefold(): t for s, t in word_list.links(source, reference)}
    places = []
    for term in held:
        linked = links.get(term.source.casefold())
        if linked is None or (term.kind != "name" and linked.group()[:1].isupper()):
            return None
        places.append((linked.start(), linked.end(), term.target))
    text, cursor = [], 0
    for start, end, target in sorted(places):
        text += [reference[cursor:start], target]
        cursor = end
    return "".join(text) + reference[cursor:], held


def benchmark_rows(pairs: Sequence[Pair], terms: Sequence[Term], word_list: WordList, tom: bool) -> list[Row]:
    """The split's sentences that hold a term, each with its reference rewritten (`rewrite`; --tom:
    every Tom of a reference that holds one)."""
    rows = []
    for source, reference in pairs:
        if tom:
            tom_word = word_pattern("Tom")
            if tom_word.search(source) and tom_word.search(reference):
                rows.append(Row(source, reference, tom_word.sub("Tommaso", reference), tuple(terms)))
            continue
        found = rewrite(source, reference, terms, word_list)
        if found is not None and found[1]:
            rows.append(Row(source, reference, found[0], tuple(found[1])))
    return rows


def replaced_free(free: str, row: Row, word_list: WordList) -> str:
    """The free output with its word for each term's source word (the copy, else the linked word)
    replaced by the term: what a string replacement after decoding would give."""
    links = {s.group().casefold(): t for s, t in word_list.links(row.source, free)}
    text = free
    for term in row.terms:
        copy = word_pattern(term.source)
        if copy.search(text):
            text = copy.sub(term.target, text)
        elif term.source.casefold() in links:
            word = links[term.source.casefold()].group()
            text = word_pattern(word).sub(term.target, text, count=1)
    return text


def position(text: str, term: str) -> int | None:
    """The word index of `term`'s first word in `text` (None: not there)."""
    found = word_pattern(term).search(text)
    return None if found is None else len(re.findall(r"\w+", text[:found.start()]))


def judge(row: Row, output: str, free: str, word_list: WordList) -> dict[str, int]:
    """One sentence's counts: its terms present, in place (as the free output with the words
    replaced, at the reference's position, either), whether a source term or its rendering is left,
    and whether it is more than a word longer than the free output."""
    expected = replaced_free(free, row, word_list)
    rewritten_words = set(words(row.rewritten))
    left = any(word in words(output) and word not in rewritten_words
               for term in row.terms for word in {term.source.casefold(), *word_list.renderings.get(
                   term.source.casefold(), {})} if word not in words(term.target))
    exact = output == expected
    counts = {"term_count": len(row.terms), "present": 0, "in_place_replaced": 0, "in_place_position": 0, "in_place": 0,
              "source_left": int(left), "longer": int(len(output.split()) > len(free.split()) + 1)}
    for term in row.terms:
        at = position(output, term.target)
        counts["present"] += at is not None
        counts["in_place_replaced"] += exact
        counts["in_place_position"] += at is not None and at == position(row.rewritten, term.target)
        counts["in_place"] += exact or (at is not None and at == position(row.rewritten, term.target))
    return counts


def spellable(translator: TorchTranslator, term: str) -> bool:
    """Whether the model's target vocabulary spells `term` (a glossary refuses one it cannot)."""
    try:
        term_alternatives(translator.tok_tgt, term)
    except GlossaryError:
        return False
    return True


def translations(translator: TorchTranslator, sentences: Sequence[str],
                 options: DecodingOptions) -> tuple[list[str], float]:
    """The best translation of each sentence, as translate.py gives it, and the seconds taken."""
    started = time.perf_counter()
    found = translator.translate_best(sentences, options)
    return found, time.perf_counter() - started


def measure(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    device = pick_device(config["device"])
    translator = TorchTranslator.load(args.checkpoint, weights_dir(config), device, choice=config["checkpoint_choice"])
    languages = (translator.model_config["lang_src"], translator.model_config["lang_tgt"])
    source = open_source(config["datasource"], *languages)
    train = read_all_pairs(source, "train", *languages)
    word_list = WordList(renderings(dice_table(train)))
    pairs = read_all_pairs(source, args.split, *languages)[:args.max_sentences or None]
    taken = {w for pair in [*train, *pairs] for side in pair for w in words(side)}
    drawn = [Term("name", "Tom", "Tommaso")] if args.tom else \
        draw_terms(word_list, [s for s, _ in pairs], taken, np.random.default_rng(args.terms_seed))
    terms = [term for term in drawn if spellable(translator, term.target)]
    rows = benchmark_rows(pairs, terms, word_list, args.tom)
    if not rows:
        raise DataError(f"no sentence of the {args.split} split holds a term the benchmark could draw")
    options = DecodingOptions.from_config(config, beam_size=args.beam)
    glossary = translator.build_glossary([(term.source, term.target) for term in terms])
    bound_options, _ = options.with_glossary(glossary, config["glossary_beam_size"])
    translations(translator, [row.source for row in rows[:32]], options)  # warm-up
    everything, _ = translations(translator, [s for s, _ in pairs], options)
    free, free_seconds = translations(translator, [row.source for row in rows], options)
    bound, bound_seconds = translations(translator, [row.source for row in rows], bound_options)
    return report(args, config, translator, terms, rows, (free, bound, everything), (free_seconds, bound_seconds),
                  [t for _, t in pairs], word_list)


def report(args: argparse.Namespace, config: dict[str, Any], translator: TorchTranslator, terms: Sequence[Term],
           rows: Sequence[Row], outputs: tuple[list[str], list[str], list[str]], seconds: tuple[float, float],
           references: list[str], word_list: WordList) -> dict[str, Any]:
    """The benchmark's result (module docstring) as one JSON-ready dict."""
    free, bound, everything = outputs
    counts = Counter()
    for row, output, plain in zip(rows, bound, free):
        counts.update(judge(row, output, plain, word_list))
    rewritten = [row.rewritten for row in rows]
    replaced = [replaced_free(plain, row, word_list) for row, plain in zip(rows, free)]
    return {
        "command": " ".join(["python", "-m", "benchmarks.bench_terms", *sys.argv[1:]]),
        "model": translator.source, "device": str(next(translator.model.parameters()).device),
        "threads": torch.get_num_threads(), "split": f"{config['datasource']} {args.split}", "beam": args.beam,
        "glossary_beam": max(args.beam, config["glossary_beam_size"]),
        "annotated": translator.term_tags is not None, "word_list": translator.renderings is not None,
        "terms": [term._asdict() for term in terms], "sentences": len(rows), **dict(counts),
        "bleu_glossary": scores(bound, rewritten), "bleu_free_replaced": scores(replaced, rewritten),
        "bleu_free": scores(free, rewritten), "bleu_no_glossary_split": scores(everything, references),
        "sentences_per_s": {"free": len(rows) / seconds[0], "glossary": len(rows) / seconds[1]},
        "examples": [{"source": row.source, "free": plain, "glossary": output, "reference": row.rewritten}
                     for row, plain, output in list(zip(rows, free, bound))[:8]],
    }


def table(result: dict[str, Any]) -> str:
    total, sentences = result.get("term_count", 0), result["sentences"]
    lines = [result["command"],
             f"model {result['model']} on {result['device']} ({result['threads']} threads), {result['split']}, beam "
             f"{result['beam']} (glossary: {result['glossary_beam']}); annotated: {result['annotated']}, word list: "
             f"{result['word_list']}",
             "terms: " + ", ".join(f"{t['source']} -> {t['target']} ({t['kind']})" for t in result["terms"]),
             f"{sentences} sentences, {total} terms: present {pct(result, 'present', total)}, in place "
             f"{pct(result, 'in_place', total)} (free output with the word replaced: "
             f"{pct(result, 'in_place_replaced', total)}, at the reference's position: "
             f"{pct(result, 'in_place_position', total)})",
             f"source term left: {pct(result, 'source_left', sentences)} of the sentences; more than a word longer "
             f"than the free output: {pct(result, 'longer', sentences)}",
             f"BLEU against the rewritten references: glossary {result['bleu_glossary']['bleu']:.2f}, free output with "
             f"the words replaced {result['bleu_free_replaced']['bleu']:.2f}, free {result['bleu_free']['bleu']:.2f}; "
             f"the whole split without a glossary {result['bleu_no_glossary_split']['bleu']:.2f}",
             f"sentences/s: free {result['sentences_per_s']['free']:.1f}, glossary "
             f"{result['sentences_per_s']['glossary']:.1f}", f"BLEU {result['bleu_glossary']['bleu_signature']}"]
    return "\n".join(lines)


def pct(result: dict[str, Any], key: str, total: int) -> str:
    return f"{result.get(key, 0)} ({100 * result.get(key, 0) / max(1, total):.1f}%)"


def argument_parser() -> argparse.ArgumentParser:
    parser = search_parser(__doc__.splitlines()[0])
    parser.add_argument("--split", default="validation", help="validation to choose settings on, test to report")
    parser.add_argument("--tom", action="store_true", help="the one row Tom -> Tommaso (the issue's sentences)")
    parser.add_argument("--terms_seed", type=int, default=57, help="seed of the terms drawn")
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_benchmark("bench_terms.py", argv, argument_parser(), measure, table, (GlossaryError,))


if __name__ == "__main__":
    sys.exit(main())

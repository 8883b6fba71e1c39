"""sentences.py with fake translators (brackets around each piece, upper case): sentences found by
the source language's rules, the text's shape kept, long sentences cut and every piece translated,
URLs and e-mail addresses untouched, sentences across fragments distributed back."""
from __future__ import annotations

import re

import pytest

from nmt.inference.sentences import (distribute, plan_flows, plan_lines, sentence_spans, translate_lines)


def bracketed(pieces: list[str]) -> list[str]:
    return [f"[{piece}]" for piece in pieces]


def upper(pieces: list[str]) -> list[str]:
    return [piece.upper() for piece in pieces]


def sentences_of(text: str, language: str = "en", **kwargs) -> list[str]:
    return [text[start:end] for start, end in sentence_spans(text, language, **kwargs)]


@pytest.mark.parametrize("text", [
    "Mr. Smith and Dr. Jones met in the U.S. capital.",
    "Bring fruit, e.g. apples, and i.e. nothing else.",
    "The value of pi is about 3.14 and costs $1.50 today.",
    'He said "Stop." and walked away.',
    '"Hello," he said.',
    "I was... well, tired.",
    "I was… well, tired.",
])
def test_abbreviations_decimals_quotes_and_ellipses_do_not_end_a_sentence(text: str) -> None:
    assert sentences_of(text) == [text]


@pytest.mark.parametrize("text, expected", [
    # a quoted passage of several sentences, as news writes speech: each sentence apart
    ('"We made progress. We agreed on it," Pelosi said. The vote is on Sunday.',
     ['"We made progress.', 'We agreed on it," Pelosi said.', 'The vote is on Sunday.']),
    # each quote mark with the sentence it closes or opens
    ('It will be difficult. "And nobody knows why.', ['It will be difficult.', '"And nobody knows why.']),
    ('It was on the table." Vodafone said no.', ['It was on the table."', 'Vodafone said no.']),
    ('He said: “Yes. No.” She left.', ['He said: “Yes.', 'No.”', 'She left.']),
])
def test_quoted_sentences_are_sentences_and_quote_marks_go_with_theirs(text: str, expected: list[str]) -> None:
    assert sentences_of(text) == expected


def test_sentences_are_spans_of_the_text_without_the_whitespace_around_them() -> None:
    text = "  Hello there.  How are you?\tFine! "
    assert sentences_of(text) == ["Hello there.", "How are you?", "Fine!"]
    assert sentence_spans(text, "en")[0] == (2, 14)


def test_the_source_language_picks_the_rules() -> None:
    text = "Oggi piove. Il Sig. Rossi resta a casa."
    assert sentences_of(text, "it") == ["Oggi piove.", "Il Sig. Rossi resta a casa."]
    assert len(sentences_of(text, "en")) == 3  # English rules do not know "Sig."


def test_no_boundary_inside_a_protected_match() -> None:
    text = "Type cd here. Then go. Yes."
    assert len(sentences_of(text, protected=re.compile("(?!)"))) == 3
    assert sentences_of(text, protected=re.compile(r"cd here\. Then")) == ["Type cd here. Then go.", "Yes."]


def test_lines_keep_their_shape_and_one_output_line_per_input_line() -> None:
    # Whitespace inside a sentence is the model's business: it gets single spaces.
    lines = ["  Hello there.  How are you?", "", "   ", "\tIndented. Two spaces  after.  ", "Last one"]
    assert translate_lines(lines, bracketed, "en") == [
        "  [Hello there.]  [How are you?]", "", "   ", "\t[Indented.] [Two spaces after.]  ", "[Last one]"]


def test_all_sentences_of_a_chunk_go_in_one_call() -> None:
    calls: list[list[str]] = []

    def translate(pieces: list[str]) -> list[str]:
        calls.append(pieces)
        return bracketed(pieces)

    translate_lines(["One. Two.", "", "Three."], translate, "en")
    assert calls == [["One.", "Two.", "Three."]]
    assert translate_lines(["", "  "], translate, "en") == ["", "  "] and len(calls) == 1


def test_without_splitting_a_line_is_one_sentence() -> None:
    assert translate_lines(["  One. Two.  "], bracketed, "en", split_sentences=False) == ["  [One. Two.]  "]


def test_urls_and_email_addresses_are_kept_and_the_text_around_them_translated() -> None:
    lines = ["See https://example.com/a.b?x=1. Then write to jo.doe@example.org, please.", "www.example.com"]
    assert translate_lines(lines, bracketed, "en") == [
        "[See] https://example.com/a.b?x=1. [Then write to] jo.doe@example.org[, please.]", "www.example.com"]


def test_pieces_without_letters_are_kept_as_they_are() -> None:
    assert translate_lines(["42", "3.14 !", "* * *", "Go (1)."], bracketed, "en") == ["42", "3.14 !", "* * *", "[Go (1).]"]


def words(text: str) -> int:
    return len(text.split())


def test_a_sentence_over_the_limit_is_cut_at_clause_punctuation_and_every_piece_translated() -> None:
    line = "When the rain stopped at last, we walked to the old harbour and ate fish by the water. Done."
    plan = plan_lines([line], "en", count_tokens=words, max_tokens=10)
    assert plan.sources == ["When the rain stopped at last,", "we walked to the old harbour", "and ate fish by the water.",
                            "Done."]
    assert all(words(piece) <= 10 for piece in plan.sources) and plan.split_for_length == 1
    assert plan.assemble(bracketed(plan.sources))[0] == [
        "[When the rain stopped at last,] [we walked to the old harbour] [and ate fish by the water.] [Done.]"]


def test_a_piece_without_clauses_is_cut_at_whitespace_then_anywhere() -> None:
    assert plan_lines(["one two three four five six"], "en", count_tokens=words, max_tokens=2).sources == [
        "one two", "three", "four", "five six"]
    assert plan_lines(["abcdefgh"], "en", count_tokens=len, max_tokens=3).sources == ["ab", "cd", "ef", "gh"]
    accented = "e\u0301" * 3  # decomposed: a cut never separates an accent from its letter
    assert plan_lines([accented], "en", count_tokens=len, max_tokens=4).sources == ["e\u0301", "e\u0301e\u0301"]
    with pytest.raises(ValueError, match="max_tokens"):
        plan_lines(["x"], "en", count_tokens=len, max_tokens=0)


def test_distribute_cuts_at_words_in_proportion() -> None:
    assert distribute("uno due tre quattro cinque sei", [1, 1, 1]) == ["uno due tre", "quattro", "cinque sei"]
    assert distribute("uno due tre quattro", [1, 3]) == ["uno", "due tre quattro"]
    assert distribute("uno due", [1, 1, 1]) == ["un", "o d", "ue"]  # fewer words than parts: between characters
    assert distribute("  tutto  ", [4]) == ["tutto"]


def test_a_sentence_across_fragments_is_translated_whole_and_distributed_back() -> None:
    plan = plan_flows([["The meeting starts", "at noon. Then we", "eat lunch together."]], "en")
    assert plan.sources == ["The meeting starts at noon.", "Then we eat lunch together."]
    assert plan.assemble(upper(plan.sources)) == [["THE MEETING STARTS", "AT NOON. THEN WE", "EAT LUNCH TOGETHER."]]


def test_sentences_report_their_span_and_translation() -> None:
    plan = plan_lines(["Hi. See www.x.org now."], "en")
    found = plan.sentences(bracketed(plan.sources))
    assert [(s.span, s.translation) for s in found] == [((0, 3), "[Hi.]"), ((4, 22), "[See] www.x.org [now.]")]
    with pytest.raises(ValueError, match="translations"):
        plan.assemble(["only one"])

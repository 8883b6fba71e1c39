"""README.md and docs/: every `python X.py ...` and `python -m benchmarks.X ...` command they show names
a program that exists and only options its argument parser knows, so a renamed or removed flag fails
the suite; and README.md with docs/ stay under 100,000 characters."""
from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:torchrun(?: --[\w-]+(?:[ =]\S+)?)* )?python3? (?:-m [\w.]+|[\w/]+\.py)(?:[^\n`\\]|\\\n)*")
SHELL = {"<", ">", ">>", "|", "2>&1", "&&", ";", "&"}


def commands(page: Path) -> list[tuple[str, list[str]]]:
    """(program, its arguments) of each command on `page`: the module or script run, and the words
    after it up to a shell operator or a comment."""
    found = []
    for match in COMMAND.finditer(page.read_text(encoding="utf-8")):
        words = shlex.split(match.group(0).replace("\\\n", " "), comments=True)
        start = next(i for i, word in enumerate(words) if word.startswith("python"))
        words = words[start + 1:]
        program, args = (words[1], words[2:]) if words[0] == "-m" else (words[0], words[1:])
        if program == "pytest":
            continue
        cut = next((i for i, word in enumerate(args) if word in SHELL or word.startswith((">", "<", "2>"))), None)
        found.append((program, args[:cut]))
    return found


def known_options(program: str) -> set[str]:
    module = importlib.import_module(program.removesuffix(".py").replace("/", "."))
    assert hasattr(module, "argument_parser"), f"{program} has no argument_parser() to check its commands against"
    return {option for action in module.argument_parser()._actions for option in action.option_strings}


ALL = [(page.name, program, args) for page in PAGES for program, args in commands(page)]


def test_the_pages_show_commands_of_every_program() -> None:
    shown = {program for _, program, _ in ALL}
    assert {"train.py", "translate.py", "evaluate.py", "export.py", "serve.py"} <= shown


@pytest.mark.parametrize("page, program, args", ALL, ids=[f"{page}:{program}:{i}" for i, (page, program, _)
                                                          in enumerate(ALL)])
def test_each_command_uses_only_options_its_program_knows(page: str, program: str, args: list[str]) -> None:
    known = known_options(program)
    unknown = [word.split("=")[0] for word in args if word.startswith("--") and word.split("=")[0] not in known]
    assert not unknown, f"{page}: python {program} {' '.join(args)}: unknown {', '.join(unknown)}"


def test_readme_and_docs_stay_under_100000_characters() -> None:
    # counted in UTF-8 bytes, which are never fewer than the characters: the stricter count
    assert sum(len(page.read_bytes()) for page in PAGES) <= 100_000
    assert len((ROOT / "README.md").read_bytes()) <= 10_000

"""Grounding and recall hold no dataset and no inline word list (issue 44): they speak of
messages, speakers and languages; a dataset's people, speaker codes and a model's quirks
live in the case corpus (`tests/cases/`), and each language's words in `kioku/lang/`.

The check reads every module under the packages below, code and comments alike, so it runs
on modules written after it too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import kioku

PACKAGE = Path(kioku.__file__).parent
CLEAN = ("grounding", "recall", "salience.py", "sentences.py")
# modules that hold word lists as code still (Japanese grammar, dates) but name no dataset
UNNAMED = (
    *CLEAN,
    "lang",
    "reply_format.py",
    "scenes.py",
    "chronicle_prompt.py",
    "chronicler.py",
    "rendering.py",
    "normal_form.py",
    "context.py",
    "layers.py",
    "cast.py",
)
# a dataset's people and speaker codes, its name, and a model's size as a quirk
DATASET = re.compile(
    r"(?i:locomo|realpersonachat|qwen)"
    r"|\b(?:Caroline|Melanie|Mel|Jolene|Deborah|Deb|Gina|Seraphina|Aoi)\b"
    r"|アオイ|(?<![A-Za-z])(?:AC|CP|FZ|FQ|DV)(?![A-Za-z])|\b\d+(?:\.\d+)?B\b"
)
WORDISH = re.compile(r"^[^\W\d_][^\W\d_'\- ]*$")  # a word of letters (any script)
ALTERNATIVES = re.compile(r"(?:^|[|(:])([^\W\d_]{2,})(?=[|)])")


def files(names: tuple[str, ...] = CLEAN) -> list[Path]:
    out: list[Path] = []
    for name in names:
        p = PACKAGE / name
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def word_lists(path: Path) -> list[str]:
    """Literals that are lists of words: `wordset(...)`, a collection of seven or more words
    (fewer is a code's own vocabulary: `REASONS`), a mapping of four or more words to
    constants, a pattern of four or more word alternatives. `__all__` is no word list."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exported = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
    }
    for node in ast.walk(tree):
        if id(node) in exported:
            continue
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "wordset":
            found.append(f"{path.name}:{node.lineno} wordset")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if sum(isinstance(w, str) and bool(WORDISH.match(w)) for w in words) >= 7:
                found.append(f"{path.name}:{node.lineno} {words[:3]}…")
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if not all(isinstance(v, ast.Constant) for v in node.values):
                continue  # a record built of values, not a table of words
            if sum(isinstance(k, str) and bool(WORDISH.match(k)) for k in keys) >= 4:
                found.append(f"{path.name}:{node.lineno} {keys[:3]}…")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and len(ALTERNATIVES.findall(node.value)) >= 4
        ):
            found.append(f"{path.name}:{node.lineno} {node.value[:40]!r}")
    return found


def test_the_checked_modules_are_there() -> None:
    assert len(files()) >= 10


def test_the_runtime_names_no_dataset_and_no_model_quirk() -> None:
    hits = [
        f"{p.relative_to(PACKAGE)}:{i}: {line.strip()[:80]}"
        for p in files(UNNAMED)
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if DATASET.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_grounding_and_recall_hold_no_inline_word_list() -> None:
    found = [x for p in files() for x in word_lists(p)]
    assert not found, "\n".join(found)


def test_the_check_sees_a_word_list_and_a_dataset_name(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        'A = ("yes", "yeah", "yep", "ok", "sure", "fine", "right")\nB = {"one": 1, "two": 2, "three": 3, "four": 4}\n'
        'C = r"\\b(?:ask|asks|asked|asking)\\b"\nD = wordset("a b")\nE = ("seq", "name")\n'
        '__all__ = ["a", "b", "c", "d", "e", "f", "g"]\nF = {"a": x, "b": y, "c": z, "d": w}\n',
        encoding="utf-8",
    )
    assert [x.split()[0] for x in word_lists(probe)] == [
        "probe.py:1",
        "probe.py:2",
        "probe.py:3",
        "probe.py:4",
    ]
    assert DATASET.search("the 1.5B model on LoCoMo") and not DATASET.search("a small model")

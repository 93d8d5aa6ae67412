"""The built-in conversation: a long roleplay the project writes itself, with planted facts.

`kioku demo` replays it on a fresh machine with no data and no model server. Each language is a
scripted story (`en`, `ja`): planted facts at fixed places (names, a birthday, a pet, a hometown),
a character who lies about her age in speech while her thoughts and the narration tell the truth, a
promise made early and kept late, a verbal tic that creeps into her replies, and seeded filler in
between so it reads like a chat rather than a loop. `story(lang, messages, seed)` returns a
`Transcript` whose `info["questions"]` lists, per planted fact, a question, its answer and the seq
of every message that holds it.
"""

from __future__ import annotations

from kioku.datasets import Transcript
from kioku.errors import InputError
from kioku.story.script import MIN_MESSAGES, Script, compose

LANGS: tuple[str, ...] = ("en", "ja")
DEFAULT_MESSAGES = 1600  # per language


def script(lang: str) -> Script:
    if lang == "en":
        from kioku.story.en import SCRIPT

        return SCRIPT
    if lang == "ja":
        from kioku.story.ja import SCRIPT

        return SCRIPT
    raise InputError(f"no built-in story in {lang!r}; use one of {', '.join(LANGS)}")


def story(lang: str = "en", messages: int = DEFAULT_MESSAGES, seed: int = 0) -> Transcript:
    """The built-in conversation in `lang`, about `messages` long (the planted beats may add a
    few), the same for the same arguments."""
    return compose(script(lang), messages, seed)


__all__ = ["DEFAULT_MESSAGES", "LANGS", "MIN_MESSAGES", "story"]

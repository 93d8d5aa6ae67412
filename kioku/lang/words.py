"""What kioku knows of one language, as data: the words its checks read a message by.

A check (does this message point at the past? does this line say anything? is this word a
name?) is written once, in code, and reads the words of the message's language from a
`Language`: its letters, cue words, vocatives, honorifics, framing and negation words, fillers,
number and date words, the pronouns of a writer's own voice. Adding a language is adding a module beside
this one (`en.py`, `ja.py`, …) and its cases (`tests/cases/`), not editing the checks.

Word lists are written as one whitespace-separated string (`wordset`): they read better so.
Fields that are regular expressions hold alternatives (`a|b|c`), in the order they are tried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


def wordset(text: str) -> frozenset[str]:
    """A set of words written as one whitespace-separated string (word lists read better so)."""
    return frozenset(text.split())


@dataclass(frozen=True)
class Language:
    """One language's words, as the checks read them. Every field may be empty: a check that
    finds nothing for a language does what it does for words it does not know."""

    code: str
    # --- which language a text is in (`kioku.lang.detect_lang`)
    # the code point ranges of the letters that tell this language (Latin, kana, Hangul)
    letters: tuple[tuple[int, int], ...] = ()
    letter_weight: float = 1.0  # how many Latin letters one of them counts as
    # languages whose letters this one writes too (Japanese writes Han characters): they count
    # for it in a text that holds letters of its own
    borrows: tuple[str, ...] = ()
    # --- recall: whether a message points at the past (`kioku.recall.need`)
    past_cues: str = ""  # regex: words that point at the past by themselves
    past_tense: str = ""  # regex: a past tense in a question ("what did"): a cue only with more
    shared_past: str = ""  # regex: a past the writer shared with whom they speak to ("did we")
    vocatives: tuple[str, ...] = ()  # words before a name that address its bearer ("hey")
    # how a name is told where the script has no capitals: regexes that find one named
    # (ハナコさん, 王老师); `name_suffixes` are the honorifics a bare name is said without
    name_patterns: tuple[str, ...] = ()
    name_suffixes: tuple[str, ...] = ()
    # whether `name_patterns` may be looked for in a conversation in another language: a
    # pattern of a script only this language writes may; Chinese titles after a Han
    # character would find names in Japanese text too, so only a Chinese conversation's
    names_in_any_conversation: bool = True
    # --- dates and numbers
    months: tuple[str, ...] = ()
    weekdays: tuple[str, ...] = ()  # Monday first
    day_abbreviations: tuple[str, ...] = ()  # beyond each day's first three letters
    time_words: tuple[str, ...] = ()  # "last …" names a time with these ("last spring")
    numbers: Mapping[str, str] = field(default_factory=dict)  # number words → digits
    counts: Mapping[str, int] = field(default_factory=dict)  # "a couple of" → 2, as dates count
    numerals: Mapping[str, int] = field(default_factory=dict)  # 一 → 1, as characters
    weekday_numbers: Mapping[str, int] = field(default_factory=dict)  # 月 → 0 (Monday)
    # --- reading a line's content (`kioku.grounding.terms`)
    framing: frozenset[str] = frozenset()  # how a line reports (said, asked), not what
    light_verbs: frozenset[str] = frozenset()  # words any paraphrase may bring in
    auxiliaries: frozenset[str] = frozenset()
    irregular: Mapping[str, str] = field(default_factory=dict)  # word → the form it is read as
    negation: frozenset[str] = frozenset()  # words (or, without spaces, characters) that negate
    negation_parts: frozenset[str] = frozenset()  # what negates inside a word (Korean 않, 없)
    not_names: frozenset[str] = frozenset()  # capitalized words that name no one
    first_person: str = ""  # regex: the writer's own voice (I, my, 私, 我)
    asking: str = ""  # regex: a line that says someone asked ("asked whether", 尋ねた)
    function_words: frozenset[str] = frozenset()  # words that stand alone only in this language
    # regex: the sentence ends that tell speech from a summary where the writer's pronoun is
    # dropped (Japanese です, けど), and the words that report speech (と言っ, とのこと)
    spoken_endings: str = ""
    reported_speech: str = ""
    # the pieces a contraction leaves ("don" of don't, "s" of it's), as a search splits words
    clitics: frozenset[str] = frozenset()
    contracted: frozenset[str] = frozenset()  # the first piece, as a stop word ("don", "isn")
    particles: frozenset[str] = frozenset()  # endings a word is read without (Korean 은, 를)
    # --- the verbal-tic guard (`kioku.tics`)
    # regex: how a reply says its speaker does not know or remember ("I don't remember", 覚えて
    # ない): an answer, however often the questions call for it, never a tic to be avoided
    declining: str = ""
    # --- what a line carries out of context (`kioku.salience`)
    fillers: frozenset[str] = frozenset()
    deictic: frozenset[str] = frozenset()  # words that only point at something said before
    greetings: str = ""  # regex: a greeting or thanks
    greeting_tails: str = ""  # regex: what may follow one and say nothing more ("all", "guys")
    # --- who a fact is about (`kioku.facts_ja`)
    people: frozenset[str] = frozenset()  # words for the people (and pets) in a life
    pets: frozenset[str] = frozenset()
    first_person_words: frozenset[str] = frozenset()
    second_person_words: frozenset[str] = frozenset()
    interrogatives: frozenset[str] = frozenset()
    # words for the two sides of a chat, as a model writes them ("the user", ユーザー)
    user_words: tuple[str, ...] = ()
    character_words: tuple[str, ...] = ()

"""The seam for content support: whether what a line says stands in the messages it cites.

`check.Evidence.check` settles by its own rules what a line cites (`seq`), whether it copies the
prompt (`prompt`), the names it uses (`name`), whom it gives as writer (`author`) and whether it
says anything (`empty`). What is left is one question, asked of the evidence's `judge`:

    judge(line, sources, ev) -> Verdict
          line     the `Statement`: its text, whom it is by or about, the seqs it cites
          sources  the cited messages (`Source`: author, parts, day)
          ev       what the line is read within: its language, the span's people and messages
          Verdict  ok (reason None) or a reason, with a short detail

`WORD_READER`, the word reader (`check.Evidence.read`: content terms, numbers, negation, a question
told as an answer, a writer's reworded first person, a neighbour's words), is the default and
the only judge kioku ships. Others were measured against it on the case corpus by
`kioku bench judge` (`kioku.bench.judge`; figures in docs/chronicler.md): character n-grams
(`kioku.grounding.ngrams`) and the chronicler's own model asked yes or no
(`kioku.grounding.asked`). A judge that says only whether leaves the verdict's `kind` empty;
the word reader then says which part bears the line out, as records need.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # check imports this module: the types only, to keep one direction
    from kioku.grounding.check import Evidence, Source, Statement, Verdict


class Judge(Protocol):
    """Whether a line's content stands in the messages it cites."""

    @property
    def name(self) -> str: ...

    def __call__(self, line: Statement, sources: Sequence[Source], ev: Evidence) -> Verdict: ...


class WordReader:
    """The word reader: the line's content terms, numbers and negation read in the cited
    messages, per language (`kioku.grounding.terms`), with the rules that read them."""

    name = "words"

    def __call__(self, line: Statement, sources: Sequence[Source], ev: Evidence) -> Verdict:
        return ev.read(line, sources)


WORD_READER = WordReader()

"""A judge that asks a model: does this line stand in the messages it cites, yes or no.

The chronicler's own model is shown the cited messages (`#seq author: words`, each part as the
chronicler read it) and the line (`writer: words` when it names one), and answers one word
(`prompts/en/judge.txt`, which also lists the answer words). The first answer word in the reply
decides; a reply with none (an essay, an empty string) is not a verdict, and the word reader
(`check.WORD_READER`) decides that line instead, counted in `unclear`.

Measured against the word reader by `kioku bench judge --model URL` (docs/chronicler.md); not
used in serving.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kioku import prompts
from kioku.grounding.check import Evidence, Source, Statement, Verdict
from kioku.models import ChatMessage, ChatModel, ChatRequest

LANG = "en"  # the question is asked in English whatever the conversation's language


class Asked:
    """The model's yes or no per line (`kioku.grounding.check.Judge`)."""

    name = "model"

    def __init__(self, model: ChatModel, max_tokens: int = 8) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.asked = 0
        self.unclear = 0
        self._template = t = prompts.template(prompts.JUDGE_TASK, LANG)
        self.version = t.version
        words = {w.casefold(): True for w in t.section("yes").split()}
        words.update({w.casefold(): False for w in t.section("no").split()})
        self._answers = words
        alternatives = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
        self._answer = re.compile(rf"(?<!\w)({alternatives})(?!\w)", re.IGNORECASE)

    def request(self, line: Statement, sources: Sequence[Source]) -> ChatRequest:
        t = self._template
        said = "\n".join(
            f"#{s.seq} {p.speaker or s.author}: {p.text}" for s in sources for p in s.pieces
        )
        text = f"{line.author}: {line.text}" if line.author else line.text
        return ChatRequest(
            messages=(
                ChatMessage("system", t.render("system")),
                ChatMessage("user", t.render("user", sources=said, line=text)),
            ),
            max_tokens=self.max_tokens,
            temperature=0.0,
            purpose="judge",
        )

    def answer(self, reply: str) -> bool | None:
        """True for yes, False for no, None when the reply holds neither answer word."""
        m = self._answer.search(reply)
        return self._answers[m.group(1).casefold()] if m else None

    def __call__(self, line: Statement, sources: Sequence[Source], ev: Evidence) -> Verdict:
        self.asked += 1
        said = self.answer(self.model.complete(self.request(line, sources)).text)
        if said is None:
            self.unclear += 1
            return ev.read(line, sources)
        if said:
            return Verdict(None, 1.0, seqs=line.seqs)
        return Verdict("unsupported", 0.0, "the model says the messages do not say it")

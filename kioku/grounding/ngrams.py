"""A judge without a tokenizer: the share of a line's character n-grams its sources hold.

Every language is read the same way: the text is NFKC-folded and lowercased, cut into runs of
letters and digits, and each run into character n-grams: pairs where a run is written without
spaces between words (kana, ideographs, hangul), trigrams of the space-padded run elsewhere
("puppy" → " pu", "pup", …, "py "). Runs of one or two letters in spaced writing carry little
("a", "is") and are left out. A line is supported when its cited messages (with their
authors' names) hold at least `min_share` of its n-grams and every number it writes.

Measured against the word reader on the case corpus (`kioku bench judge`, docs/chronicler.md);
not offered as an option, as it does not win there.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from kioku.grounding.check import Evidence, Source, Statement, Verdict

MIN_SHARE = 0.6  # the best accuracy of 0.5–0.8 on the corpus (`kioku bench judge`)
_RUN = re.compile(r"\w+")
_DIGITS = re.compile(r"\d+")
# writing without spaces between words (kana, ideographs) and hangul's dense syllables
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def grams(text: str) -> frozenset[str]:
    """The character n-grams of `text`, in any language."""
    out: set[str] = set()
    for run in _RUN.findall(unicodedata.normalize("NFKC", text).casefold()):
        if _UNSPACED.search(run):
            out |= {run[i : i + 2] for i in range(len(run) - 1)} if len(run) > 1 else {run}
        elif len(run) > 2:
            padded = f" {run} "
            out |= {padded[i : i + 3] for i in range(len(padded) - 2)}
    return frozenset(out)


@dataclass(frozen=True)
class Ngrams:
    """Character n-gram containment (`kioku.grounding.check.Judge`)."""

    min_share: float = MIN_SHARE
    name: str = "ngrams"

    def __call__(self, line: Statement, sources: Sequence[Source], ev: Evidence) -> Verdict:
        said = "\n".join(t for s in sources for t in (s.author, *_texts(s)))
        have = grams(said)
        want = grams(line.text)
        numbers = set(_DIGITS.findall(unicodedata.normalize("NFKC", line.text)))
        if missing := sorted(numbers - set(_DIGITS.findall(unicodedata.normalize("NFKC", said)))):
            return Verdict("unsupported", 0.0, f"the number {missing[0]} is not in the sources")
        share = len(want & have) / len(want) if want else 1.0
        if share < self.min_share:
            return Verdict("unsupported", share, f"{share:.0%} of its n-grams are in the sources")
        return Verdict(None, share, seqs=line.seqs)


def _texts(src: Source) -> list[str]:
    return [t for p in src.pieces for t in (p.text, p.raw) if t]

"""What a client's clean-up may change in a message without it being an edit.

A stateless client shows the model's reply after tidying it: SillyTavern strips the speaker
label the model wrote ("Rowan: *smiles*" becomes "*smiles*", at the start of every line),
trims trailing spaces on each line, drops carriage returns and may collapse blank lines. The
next request then carries the tidied text. Counting that as the user editing the reply would
keep a version of every reply and, under memory, mark chapters stale for nothing. So messages
are compared in a normal form: speaker labels removed at line starts, whitespace collapsed.
The stored text is not changed: it stays what the model wrote, which is also what keeps the
upstream's prefix cache warm.

A speaker label is one to three capitalized words (or words in a script without case, such as
Japanese) ending in a colon: "Rowan:", "Dr. Hale:", "ロウアン:". An edit that only adds
or removes such a label is not seen; an edit of anything else is.
"""

from __future__ import annotations

import re

_WORD = r"(?:[A-Z]|[^\x00-\x7f])[\w.'’\-]*"
SPEAKER_LABEL = re.compile(rf"^[^\S\n]*{_WORD}(?: {_WORD}){{0,2}}[:：][^\S\n]*", re.MULTILINE)


def normal_form(text: str) -> str:
    """`text` as two messages that differ only cosmetically both read."""
    return " ".join(SPEAKER_LABEL.sub("", text.replace("\r", "")).split())

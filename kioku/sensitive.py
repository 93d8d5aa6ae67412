"""Lines that look like secrets: kept in the log, never promoted into memory.

People paste passwords, keys and card numbers into long chats ("the wifi password is …", "use my
key sk-…"). The log keeps what was written: it is the user's record, exported whole, and the raw
window and recollections show it as the log has it. But memory is read in every later prompt,
and notes are shown to operators and edited in a front end's panel: a secret there is a secret
spread. So a line that looks like one is withheld from what memory is made of: the chronicler's
transcript (`withheld`), the notes model's input, the extractive chronicler's lines, and the
notes ledger (`looks_secret`).

What looks like a secret (a withheld line of chat costs less than a secret kept, so the net is
wide):
- a password, passcode, PIN, passphrase, security code or one-time code being told ("my
  password is …", "PIN: 4821", "パスワードは…", "暗証番号は…", "密码是…");
- an API key or token: the shapes providers give them (`sk-…`, `ghp_…`, `xoxb-…`, `AKIA…`,
  `AIza…`, `glpat-…`, a JWT, a kioku key), or a long run of letters and digits after "key",
  "token" or "secret";
- a payment card number: 13 to 19 digits, spaced or dashed, that pass the Luhn check.
"""

from __future__ import annotations

import re
from functools import lru_cache

from kioku.inert import mark

WITHHELD = mark("withheld: a line that looks like a secret (kept in the log only)")

_TOLD = r"\s*(?:is|was|are|:|=|：|->)\s*\S"
_PASSWORD = re.compile(
    r"\b(?:pass(?:word|code|phrase)s?|pwd|pin(?: code| number)?|security (?:code|answer)|"
    r"cvv|cvc|one[- ]time (?:code|password)|otp|2fa code|verification code)" + _TOLD,
    re.IGNORECASE,
)
_PASSWORD_CJK = re.compile(
    r"(?:パスワード|パスコード|暗証番号|ＰＩＮ|PIN|合言葉|認証コード|ワンタイムパスワード|"
    r"密码|口令|验证码|支付密码)\s*(?:は|が|を|:|：|=|是|为|為)\s*\S"
)
_KEY_SHAPES = re.compile(
    r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|"
    r"github_pat_[A-Za-z0-9_]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|"
    r"AIza[0-9A-Za-z_-]{30,}|glpat-[A-Za-z0-9_-]{20}|kioku_[0-9a-f]{12}_[A-Za-z0-9_-]{20,}|"
    r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
)
_NAMED_KEY = re.compile(
    r"\b(?:api[ _-]?key|key|token|secret|bearer)\b\W{0,3}(?=[A-Za-z0-9_\-+/=]*\d)"
    r"(?=[A-Za-z0-9_\-+/=]*[A-Za-z])[A-Za-z0-9_\-+/=]{24,}",
    re.IGNORECASE,
)
_DIGITS = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(text: str) -> bool:
    for m in _DIGITS.finditer(text):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and len(set(digits)) > 1 and _luhn(digits):
            return True
    return False


@lru_cache(maxsize=8192)
def looks_secret(line: str) -> bool:
    """Whether a line (a sentence, a note) tells a password, a key or a card number."""
    return bool(
        _PASSWORD.search(line)
        or _PASSWORD_CJK.search(line)
        or _KEY_SHAPES.search(line)
        or _NAMED_KEY.search(line)
        or (sum(c.isdigit() for c in line) >= 13 and _card(line))
    )


def withheld(text: str) -> str:
    """`text` with each line that looks like a secret replaced by a mark that says so."""
    if not looks_secret(text):
        return text
    return "\n".join(WITHHELD if looks_secret(ln) else ln for ln in text.split("\n"))

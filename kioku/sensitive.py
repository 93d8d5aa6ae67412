"""Lines that look like secrets: kept in the log, never promoted into memory nor recalled.

People paste passwords, keys and card numbers into long chats ("the wifi password is …", "use my
key sk-…"). The log keeps what was written: it is the user's record, exported whole, and the raw
window shows it as the log has it. But memory is read in every later prompt, and notes are shown
to operators and edited in a front end's panel: a secret there is a secret spread. So a line
that looks like one is withheld from what memory is made of (the chronicler's transcript, the
notes model's input, the extractive chronicler's lines, the facts extractor's input: `withheld`),
from the notes ledger (`looks_secret`) and from recollections of the archive (`withheld`).

What looks like a secret is one table, `PATTERNS` (a withheld line of chat costs less than a
secret kept, so the net is wide; the negatives in the tests say where it stops):
- a password, passcode, PIN or code being told, in the words of `WORDS` (a row per word and
  its languages) with that language's copulas (`LANGS`: "my password is …", "my password's …",
  "pw: …", "mein Passwort ist …", "パスワードは…", "密码是…"); text is NFKC-normalized first,
  so full-width forms are the same words. A keyword line with nothing after its copula ("my
  password is", or "Password" alone) withholds the next non-empty line too: the value typed on
  a line of its own, or as its author's next message (`opened_by_earlier`);
- a login and its password (`login admin / …`, `user/pass: …`, `https://user:pw@host`);
- an API key or token in the shapes providers give them (`sk_live_…`, `ghp_…`, `xoxb-…`,
  `AKIA…`, `AIza…`, a JWT, a kioku key, …), or a long run of letters and digits after "key",
  "token" or "secret";
- a private key: a PEM or OpenSSH block, every line from its BEGIN line to its END line (to the
  end of the text when the paste was cut);
- a payment card number: 13 to 19 digits, with or without spaces, dashes or dots, that pass
  the Luhn check.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from kioku.inert import mark

WITHHELD = mark("withheld: a line that looks like a secret (kept in the log only)")


@dataclass(frozen=True)
class Lang:
    """How a language tells a value after a keyword (a row of `LANGS`)."""

    copulas: str  # what links the keyword to its value ("is", ":", "ist", "は")
    between: str = ""  # a qualifier between them ("the password *for the wifi* is …")
    # what follows a copula that is no value but a word about the password ("my password is
    # wrong", "密码是什么?")
    not_values: str = ""


LANGS: dict[str, Lang] = {
    "en": Lang(
        r"['’]s|\s+(?:is|was|are|were|be|will be|should be|has been|is now|is still|now is|"
        r"changed to|set to|reads)(?!\w)|\s*(?:[:=]|->|=>)|\s+[-–—]\s+|"
        r"\?\s*(?:it['’]s|it is)(?!\w)",  # "the wifi password? it's …"
        r"\s+(?:for|to|of|on|at)\s+(?:the\s+|my\s+|our\s+|your\s+)?[\w.@-]+",
        r"wrong|incorrect|invalid|expired|too|not|no longer|the same|correct|weak|strong|hashed|"
        r"stored|required|case[- ]sensitive|reset|changed|saved|written|somewhere|in|on|what|"
        r"which|something|anything|nothing|a new one|a stronger",
    ),
    "de": Lang(
        r"\s+(?:ist|lautet|war|heißt|heisst|ist jetzt)(?!\w)|\s*[:=]",
        r"\s+(?:für|fürs|vom|von|zum|zur|des|der)\s+(?:das\s+|den\s+|die\s+|mein\w*\s+)?[\w.@-]+",
        r"falsch|nicht|zu|abgelaufen|was",
    ),
    "fr": Lang(
        r"\s+(?:est|était|sera|c['’]est)(?!\w)|\s*[:=]",
        r"\s+(?:du|de|de la|des|pour)\s+(?:l['’]|le\s+|la\s+|mon\s+|ma\s+)?[\w.@-]+",
        r"faux|incorrect|pas|trop|quoi",
    ),
    "es": Lang(
        r"\s+(?:es|era|será|sería)(?!\w)|\s*[:=]",
        r"\s+(?:del|de|de la|para)\s+(?:el\s+|la\s+|mi\s+)?[\w.@-]+",
        r"incorrecta|incorrecto|no|demasiado|qué",
    ),
    "it": Lang(
        r"\s+(?:è|e['’]|era|sarà)(?!\w)|\s*[:=]",
        r"\s+(?:del|della|di|per)\s+(?:il\s+|la\s+|mio\s+|mia\s+)?[\w.@-]+",
        r"sbagliata|troppo|non|cosa",
    ),
    "pt": Lang(
        r"\s+(?:é|era|será)(?!\w)|\s*[:=]",
        r"\s+(?:do|da|de|para)\s+(?:o\s+|a\s+|meu\s+|minha\s+)?[\w.@-]+",
        r"errada|muito|não|o que",
    ),
    # not が/가/을 ("パスワードが違います", "비밀번호가 틀렸어요": the password is wrong)
    "ko": Lang(r"\s*(?:은|는|[:=])", not_values=r"뭐|무엇|틀"),
    "zh": Lang(r"\s*(?:是|为|為|[:=])", not_values=r"什么|什麼|多少|啥|错|錯|不"),
    "ja": Lang(r"\s*(?:は|[:=])", not_values=r"何|違|間違"),
}

_CJK = ("ko", "zh", "ja")
_NOT_A_VALUE = re.compile(
    r"(?:(?:"
    + "|".join(lang.not_values for k, lang in LANGS.items() if k not in _CJK)
    + r")\b|"
    + "|".join(lang.not_values for k, lang in LANGS.items() if k in _CJK)
    + ")",
    re.IGNORECASE,
)

# what must follow a keyword's copula for the line to tell a secret
_DIGITS = re.compile(r"\d[\d \-]{2,}\d\b")  # a PIN or a code: digits, not "on the map"
_SYMBOL = re.compile(r"[\d!@#$%^&*_+=~/\\|<>{}\[\]-]")


def _credential(rest: str) -> bool:
    """A value that reads like one: its first word holds a digit or a symbol ("hunter2",
    "p@ss"), never an ordinary word ("expired")."""
    token = rest.split(maxsplit=1)[0].rstrip(".,;:!?)\"'”’")
    return bool(_SYMBOL.search(token))


VALUES: dict[str, Callable[[str], bool]] = {
    "any": lambda rest: not _NOT_A_VALUE.match(rest),
    "digits": lambda rest: bool(_DIGITS.match(rest)),
    "credential": _credential,
}


@dataclass(frozen=True)
class Words:
    """Words for a password or a code being told, in some languages (a row of `WORDS`)."""

    label: str
    langs: tuple[str, ...]
    words: str  # a regex alternation
    value: str = "any"  # what must follow the copula (`VALUES`)
    copula: bool = True  # False: the words end in their own link ("set my password to")


# the words people tell a password with, by language: data, not code (a language is a row)
WORDS: tuple[Words, ...] = (
    Words(
        "password",
        ("en", "it", "de", "fr", "es", "pt"),
        r"pass(?:word|code|phrase)|passwd|pwd|pw",
    ),
    # "bus pass", "hall pass": a bare pass is one only with a qualifier or a credential-like value
    Words(
        "wifi pass",
        ("en",),
        r"(?:wi-?fi|wlan|router|network|login|account|admin|e-?mail|computer|laptop|phone)\s+pass",
    ),
    Words("pass", ("en",), r"pass", "credential"),
    Words("pass:", ("en",), r"pass\s*[:=]", copula=False),  # a label: "wifi: Home / pass: …"
    Words(
        "set password to",
        ("en",),
        r"(?:set|changed?|reset|updated?)\s+(?:(?:my|the|your|our)\s+)?(?:wi-?fi\s+)?"
        r"(?:password|passcode|pin|pw)\s+to",
        copula=False,
    ),
    # "use password hunter2", "密码123456": no copula, so only a value that reads like one
    Words("password value", ("en",), r"pass(?:word|code)|passwd|pwd|pw", "credential", False),
    Words(
        "密码 value",
        ("ko", "zh", "ja"),
        r"비밀번호|비번|패스워드|密码|密碼|パスワード|暗証番号",
        "credential",
        False,
    ),
    Words(
        "pin",
        ("en", "de", "fr", "es", "it", "pt", "ja"),
        r"pin(?:[ -]?code| number)?",
        "digits",
    ),
    Words("pin value", ("en", "de", "fr", "es", "it", "pt"), r"pin", "digits", False),
    # "the code to the safe is 4821": a bare code is one only when it is digits
    Words("code digits", ("en",), r"code", "digits"),
    Words(
        "code",
        ("en",),
        r"security (?:code|answer)|cvv2?|cvc2?|one[- ]time (?:code|password)|otp|2fa code|"
        r"verification code|auth(?:entication)? code|(?:door|alarm|gate|safe|lock) code",
    ),
    Words("user/pass", ("en",), r"(?:user(?:name)?|login|e-?mail)\s*/\s*(?:pass(?:word)?|pw|pwd)"),
    Words("Passwort", ("de",), r"passwort|kennwort|geheimzahl|zugangscode"),
    Words("mot de passe", ("fr",), r"mot de passe|mdp|code secret|code confidentiel"),
    Words("contraseña", ("es",), r"contraseña|contrasena|clave de acceso"),
    # "la clave es la paciencia": a bare clave is one only when owned or of something
    Words(
        "clave",
        ("es",),
        r"(?:mi|tu|su|nuestra)\s+clave|"
        r"clave\s+(?:del|de la|de)\s+(?:wi-?fi|red|acceso|banco|correo|cuenta|tarjeta|router)",
    ),
    Words("clave bare", ("es",), r"clave", "credential"),
    Words("parola d'ordine", ("it",), r"parola d['’]ordine|parola chiave|codice segreto"),
    Words("senha", ("pt",), r"senha|palavra-passe"),
    Words("비밀번호", ("ko",), r"비밀번호|비번|패스워드|암호"),
    Words("密码", ("zh",), r"密码|密碼|口令|验证码|驗證碼"),
    Words("パスワード", ("ja",), r"パスワード|パスコード|暗証番号|合言葉|認証コード"),
)


def _edge(w: Words) -> str:
    return "" if all(lang in _CJK for lang in w.langs) else r"\b"


def _told(w: Words) -> re.Pattern[str]:
    """`w`'s words, an optional qualifier and a copula of one of its languages."""
    if not w.copula:  # the value right after the words (CJK: even without a space)
        link = r"\s*" if not _edge(w) else r"(?:\b|(?<=\W))\s*"
        return re.compile(f"{_edge(w)}(?:{w.words}){link}", re.IGNORECASE)
    copulas = "|".join(LANGS[lang].copulas for lang in w.langs)
    between = "|".join(LANGS[lang].between for lang in w.langs if LANGS[lang].between)
    qualifier = f"(?:{between})?" if between else ""
    return re.compile(f"{_edge(w)}(?:{w.words}){qualifier}(?:{copulas})", re.IGNORECASE)


# a word before a keyword alone on its line ("My password", "Passwort:")
_OWNER = r"(?:(?:my|the|your|mein|meine|dein|das|mon|ma|le|mi|tu|la|il|minha|a|o)\s+)?"


def _alone(w: Words) -> re.Pattern[str] | None:
    """`w`'s words alone on a line, a label whose value is on the next (a form pasted as
    "Password" then "hunter2"); None for words that are a secret only by their value."""
    if w.value == "credential" or not w.copula:
        return None
    return re.compile(f"[\\s*_#>-]*{_OWNER}(?:{w.words})[\\s:：.\\-–—>*_]*", re.IGNORECASE)


# after a keyword's copula, nothing but this: the value is on the next line
_NOTHING = re.compile(r"[\s.:：…,;!\-–—>*_`]*")


@dataclass(frozen=True)
class Pattern:
    """A row of `PATTERNS`: what a secret looks like.

    A keyword (`value` set) matches up to its copula: the line tells a secret when what follows
    is such a value, and opens one (the next line is the value) when nothing follows. A shape
    (`value` empty) is the secret itself, confirmed by `check` when there is one. A block
    (`ends` set) withholds every line from its match to the line `ends` matches."""

    label: str
    regex: re.Pattern[str]
    langs: tuple[str, ...] = ()  # the languages whose words it is made of; empty: any
    value: str = ""
    check: Callable[[str], bool] | None = None
    ends: re.Pattern[str] | None = None
    alone: re.Pattern[str] | None = None  # a keyword alone on a line: it opens a value
    opens: bool = True  # whether a keyword with nothing after it opens the next line

    def tells(self, line: str) -> str:
        """ "secret" when `line` (NFKC-normalized) tells a secret by this row, "opens" when it
        is a keyword waiting for its value on the next line, "" otherwise."""
        if self.alone is not None and self.alone.fullmatch(line):
            return "opens"
        for m in self.regex.finditer(line):
            if not self.value:
                if self.check is None or self.check(m.group()):
                    return "secret"
                continue
            rest = line[m.end() :].lstrip()
            if _NOTHING.fullmatch(rest):
                if self.opens:
                    return "opens"
                continue
            if VALUES[self.value](rest):
                return "secret"
        return ""


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(found: str) -> bool:
    digits = re.sub(r"\D", "", found)
    return 13 <= len(digits) <= 19 and len(set(digits)) > 1 and _luhn(digits)


_KEY_BEGIN = r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
_KEY_END = r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"

PATTERNS: tuple[Pattern, ...] = (
    *(Pattern(w.label, _told(w), w.langs, w.value, alone=_alone(w), opens=w.copula) for w in WORDS),
    Pattern(
        "login / password",
        re.compile(
            r"\b(?:login|log-in|username|user|creds|credentials|account)\b\s*[:=]?\s*"
            r"[^\s/]+\s*/\s*[^\s/]+(?=[.,;!?)]*(?:\s|$))(?![\s.,;!?)]+\w+\s+\w)",
            re.IGNORECASE,
        ),
    ),
    Pattern("credentials in a URL", re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@]+:[^\s/@]+@")),
    Pattern(
        "key shape",
        re.compile(
            r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}|[sr]k_(?:live|test)_[A-Za-z0-9]{10,}|"
            r"whsec_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
            r"xox[abposr]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}|"
            r"AIza[0-9A-Za-z_-]{30,}|glpat-[A-Za-z0-9_-]{20}|hf_[A-Za-z0-9]{30,}|"
            r"npm_[A-Za-z0-9]{36}|SG\.[\w-]{16,}\.[\w-]{16,}|shp(?:at|ss|ca)_[a-fA-F0-9]{32}|"
            r"kioku_[0-9a-f]{12}_[A-Za-z0-9_-]{20,}|"
            r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
        ),
    ),
    Pattern(
        "named key",
        re.compile(
            r"\b(?:api[ _-]?key|key|token|secret|bearer|accountkey)\b\W{0,3}"
            r"(?=[A-Za-z0-9_\-+/=]*\d)(?=[A-Za-z0-9_\-+/=]*[A-Za-z])[A-Za-z0-9_\-+/=]{24,}",
            re.IGNORECASE,
        ),
    ),
    Pattern("private key", re.compile(_KEY_BEGIN), ends=re.compile(_KEY_END)),
    # the body of an OpenSSH private key starts with "openssh-key-v1" in base64: a body pasted
    # without its BEGIN line
    Pattern("OpenSSH key body", re.compile(r"b3BlbnNzaC1rZXktdjE")),
    Pattern("card number", re.compile(r"(?<![\d.-])(?:\d[ .-]?){12,18}\d(?![\d])"), check=_card),
)

_BLOCKS = tuple(p for p in PATTERNS if p.ends is not None)
_LINES = tuple(p for p in PATTERNS if p.ends is None)


@lru_cache(maxsize=8192)
def _line(line: str) -> tuple[str, re.Pattern[str] | None]:
    """What a line is: ("secret" | "opens" | "", the end of the block it begins, if any)."""
    text = unicodedata.normalize("NFKC", line)
    for p in _BLOCKS:  # first: a block's BEGIN line withholds the lines after it
        if p.regex.search(text):
            return ("secret", None if p.ends and p.ends.search(text) else p.ends)
    found = ""
    for p in _LINES:
        got = p.tells(text)
        if got == "secret":
            return ("secret", None)
        found = found or got
    return (found, None)


def _scan(text: str, opened: bool = False) -> tuple[list[bool], bool]:
    """For each line of `text`, whether it is withheld; and whether its last line opens a
    value that is not in it (the value is in the author's next message)."""
    lines = text.splitlines()
    out = [False] * len(lines)
    i = 0
    if opened:  # the first non-empty line is the value an earlier message's keyword opened
        while i < len(lines) and not lines[i].strip():
            i += 1
        out[: i + 1] = [True] * min(i + 1, len(lines))
        i += 1
    dangling = opened and not any(ln.strip() for ln in lines)
    while i < len(lines):
        kind, ends = _line(lines[i])
        if not kind:
            i += 1
            continue
        out[i] = True
        if ends is not None:  # a block: to its END line, or to the end of a cut paste
            i += 1
            while i < len(lines):
                out[i] = True
                if ends.search(unicodedata.normalize("NFKC", lines[i])):
                    break
                i += 1
        elif kind == "opens":  # the next non-empty line is the value
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            if j < len(lines):  # blank lines between are part of it: one mark
                out[i + 1 : j + 1] = [True] * (j - i)
                i = j
            else:
                dangling = True
        i += 1
    return out, dangling


def secret_lines(text: str, opened: bool = False) -> list[bool]:
    """For each line of `text` (`str.splitlines`), whether it is withheld: a line that tells a
    secret, the value line after a keyword line that opens one (`opened`: the first line is
    the value of a keyword an earlier message ended on), and every line of a private key
    block."""
    return _scan(text, opened)[0]


def opened_by_earlier(said: Sequence[tuple[str, str]]) -> list[bool]:
    """For each message (role, text) of a run, whether it opens with the value of a keyword
    its author's previous message in the run ended on ("my password is", then "hunter2" as
    the next message, maybe after a reply): pass it to `withheld` as `opened`."""
    dangling: dict[str, bool] = {}
    out = []
    for role, text in said:
        opened = dangling.get(role, False)
        out.append(opened)
        dangling[role] = _scan(text, opened)[1]
    return out


@lru_cache(maxsize=8192)
def looks_secret(text: str) -> bool:
    """Whether a line (a sentence, a note) or a text tells a password, a key or a card number."""
    return any(secret_lines(text))


def withheld(text: str, instead: str = WITHHELD, opened: bool = False) -> str:
    """`text` with each run of lines that look like a secret replaced by `instead` (a mark that
    says so; "" leaves nothing of them). `opened`: see `secret_lines`."""
    flags = secret_lines(text, opened)
    if not any(flags):
        return text
    out: list[str] = []
    before = False  # whether the line before was withheld: a block is one mark
    for ln, secret in zip(text.splitlines(), flags, strict=True):
        if not secret:
            out.append(ln)
        elif not before and instead:
            out.append(instead)
        before = secret
    return "\n".join(out)

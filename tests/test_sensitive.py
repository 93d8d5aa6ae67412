"""The secret filter (`kioku.sensitive`, issue 43.5): one test per row of its table, with what it
must catch and what it must leave alone, in several languages; then the blocks (a value typed on
the line after its keyword, a private key) and the places a withheld line must stay out of."""

from __future__ import annotations

import unicodedata

import pytest

from kioku.sensitive import (
    PATTERNS,
    WITHHELD,
    Pattern,
    looks_secret,
    opened_by_earlier,
    secret_lines,
    withheld,
)

# label → (lines it tells a secret in, lines that are no secret at all)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "password": (
        [
            "my password is hunter2",
            "My password's hunter2",
            "my password’s hunter2",
            "ｐａｓｓｗｏｒｄ： hunter2",
            "pw: hunter2",
            "the password for the wifi is tr0ub4dor",
            "passcode = 8812",
            "la password del wifi è sole",
            "mein Password ist Sonne",
            "PWD=letmein",
            "The wifi password? It's sunshine.",
        ],
        [
            "she is my password to happiness",
            "my password is wrong",
            "I forgot my password",
            "passwords are hashed",
            "What's your password?",
            "The password reset link expired.",
            "Is my password too weak?",
        ],
    ),
    "wifi pass": (
        ["the wifi pass is sunshine", "router pass: admin", "my email pass's blue"],
        ["the wifi pass is wrong", "I passed the test", "a boarding pass is needed"],
    ),
    "pass": (
        ["my pass's hunter2", "pass: s3cret!", "the pass is 12345"],
        [
            "my bus pass is expired",
            "I have a pass for the museum",
            "She passes the salt.",
            "a mountain pass is closed",
        ],
    ),
    "set password to": (
        ["I set my password to hunter2", "changed the wifi password to marmalade"],
        ["she is my password to happiness", "I changed my password to something stronger"],
    ),
    "password value": (
        ["use password hunter2", "pw tr0ub4dor&3 for the nas"],
        ["password reset link", "the password manager", "password strength matters"],
    ),
    "pass:": (
        ["wifi: HomeNet / pass: sunshine", "pass=letmein"],
        ["I'll pass: too tired", "a free pass"],
    ),
    "密码 value": (
        ["密码123456", "비밀번호 1234", "パスワード hunter2"],
        ["密码不对", "パスワード忘れた", "비밀번호 변경"],
    ),
    "pin value": (
        ["PIN 4821", "card pin 1234"],
        ["pin 2 of the map", "PIN code reset"],
    ),
    "code digits": (
        ["the code to the safe is 4821", "code: 7731"],
        ["the code is broken", "code 42 is a joke"],
    ),
    "pin": (
        [
            "PIN: 4821",
            "my pin's 4821",
            "Meine PIN ist 1234",
            "mon code PIN est 4821",
            "mi PIN es 1234",
        ],
        ["the pin on the map", "Pin it on the board.", "the pin is in the drawer", "PIN: unknown"],
    ),
    "code": (
        [
            "the door code is 4821",
            "CVV: 123",
            "security answer: fluffy",
            "verification code is 552 901",
            "OTP: 8812",
        ],
        ["the dress code is casual", "the code is broken", "the door code is wrong"],
    ),
    "user/pass": (
        ["user/pass: admin/hunter2", "login/password = root/toor"],
        ["user/password fields are empty"],
    ),
    "Passwort": (
        ["mein Passwort ist Sonne", "Das Kennwort lautet: Blume7", "Geheimzahl: 4711"],
        ["Ich habe mein Passwort vergessen", "Das Passwort ist falsch"],
    ),
    "mot de passe": (
        ["mon mot de passe est soleil", "le mot de passe du wifi est chat", "mdp: soleil"],
        ["j'ai oublié mon mot de passe", "le mot de passe est faux"],
    ),
    "contraseña": (
        ["mi contraseña es perro", "Contraseña: gato123", "la contraseña del wifi es sol"],
        ["olvidé mi contraseña", "la contraseña es incorrecta"],
    ),
    "clave": (
        ["mi clave es perro", "la clave del wifi es sol"],
        ["la clave del éxito es la paciencia"],
    ),
    "clave bare": (
        ["clave: perro123", "la clave es 4821"],
        ["la clave es la paciencia", "la clave es confiar"],
    ),
    "parola d'ordine": (
        ["la parola d'ordine è sole", "parola chiave: luna"],
        ["la parola d'ordine è sbagliata", "una parola gentile"],
    ),
    "senha": (
        ["minha senha é gato", "senha: gato123", "a senha do wifi é sol"],
        ["esqueci minha senha", "a senha é errada"],
    ),
    "비밀번호": (
        ["제 비밀번호는 hunter2입니다", "비번은 1234", "와이파이 암호: sun"],
        ["비밀번호가 틀렸어요", "비밀번호를 잊어버렸어요", "암호화는 중요해요"],
    ),
    "密码": (
        ["我的密码是123456", "WiFi密码：abc12345", "口令是天王盖地虎"],
        ["密码是什么？", "我忘了密码", "密码不对"],
    ),
    "パスワード": (
        ["パスワードは hunter2 です", "暗証番号は1234", "WiFiのパスワード：sakura"],
        ["パスワードを忘れた", "パスワードが違います", "パスワードは何ですか？"],
    ),
    "login / password": (
        ["login admin / hunter2", "username bob/swordfish", "creds: root / toor."],
        ["the login page / home page is broken", "login / logout buttons", "log in as a user"],
    ),
    "credentials in a URL": (
        ["https://bob:s3cr3t@example.com/x", "postgres://kioku:pw@db:5432/kioku"],
        ["https://example.com/a:b", "mail me at bob@example.com", "see https://x.org/@user"],
    ),
    "key shape": (
        [
            "use sk_live_4eC39HqLyjWDarjtT1zdp7dc",
            "sk_test_abcdefghijkl1234",
            "rk_live_abcdefghijkl1234",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "xoxb-1234567890-abcdefghij",
            "xoxp-1234567890-abcdefghij",
            "AIzaSyA1234567890abcdefghijklmnopqrstu",
            "AKIAIOSFODNN7EXAMPLE",
            "sk-proj-abcdefghijklmnopqrstuvwx1234",
            "glpat-abcdefghij0123456789",
            "hf_abcdefghijklmnopqrstuvwxyz0123456",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlF",
        ],
        ["sk_live is Stripe's prefix", "the AKIA prefix", "ghp_ is GitHub's", "a task-list"],
    ),
    "named key": (
        ["api key: a1b2c3d4e5f6a7b8c9d0e1f2a3b4", "token=ZXhhbXBsZTEyMzQ1Njc4OTBhYmNkZWY"],
        ["the key to the house is under the mat", "a token of appreciation"],
    ),
    "private key": (
        [
            "-----BEGIN OPENSSH PRIVATE KEY-----",
            "-----BEGIN RSA PRIVATE KEY-----",
            "-----BEGIN PGP PRIVATE KEY BLOCK-----",
        ],
        ["-----BEGIN PUBLIC KEY-----", "-----BEGIN CERTIFICATE-----", "my private key is lost"],
    ),
    "OpenSSH key body": (
        ["b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"],
        ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMq user@host"],
    ),
    "card number": (
        [
            "my card is 4111 1111 1111 1111",
            "4111-1111-1111-1111",
            "4111.1111.1111.1111",
            "４１１１ １１１１ １１１１ １１１１",
            "5500005555555559",
        ],
        [
            "4111 1111 1111 1112",
            "1111 1111 1111 1111",
            "Call me at 555 123 4567",
            "Version 1.2.3.4.5.6.7.8.9.10.11.12.13",
            "I paid 12.50 for 3 items",
        ],
    ),
}

ROWS = {p.label: p for p in PATTERNS}


def test_every_row_of_the_table_has_its_cases() -> None:
    assert len(ROWS) == len(PATTERNS)  # a label names one row
    assert set(CASES) == set(ROWS)


@pytest.mark.parametrize("label", list(CASES))
def test_a_row_catches_its_phrasings_and_leaves_the_rest(label: str) -> None:
    row: Pattern = ROWS[label]
    found, clean = CASES[label]
    for line in found:
        assert row.tells(unicodedata.normalize("NFKC", line)) == "secret", (label, line)
        assert looks_secret(line) and withheld(line) == WITHHELD, line
    for line in clean:
        assert not looks_secret(line), (label, line)
        assert withheld(line) == line


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("My password is\nhunter2", "hunter2"),
        ("password:\n\n   hunter2", "hunter2"),
        ("ｍｙ ｐａｓｓｗｏｒｄ ｉｓ\nhunter2", "hunter2"),
        ("the wifi pass is\nsunshine", "sunshine"),
        ("Mein Passwort ist:\nSonne", "Sonne"),
        ("mi contraseña es\nperro", "perro"),
        ("le mot de passe est :\nsoleil", "soleil"),
        ("パスワードは\nsakura", "sakura"),
        ("密码：\n123456", "123456"),
        ("비밀번호는\nhunter2", "hunter2"),
        ("PIN:\n4821", "4821"),
        ("Password\nhunter2", "hunter2"),
        ("**Passwort:**\nSonne", "Sonne"),
        ("**Password:**\n`hunter2`", "hunter2"),
        ("パスワード\nsakura", "sakura"),
        ("user/pass\nroot/toadstool", "toadstool"),
    ],
)
def test_a_value_on_the_line_after_its_keyword_is_withheld_with_it(text: str, value: str) -> None:
    said = f"ok here it is\n{text}\nsee you tomorrow"
    out = withheld(said)
    assert value not in out
    assert out.splitlines() == ["ok here it is", WITHHELD, "see you tomorrow"]
    assert withheld(said, "").splitlines() == ["ok here it is", "see you tomorrow"]


def test_a_value_sent_as_its_authors_next_message_is_withheld() -> None:
    said = [
        ("user", "hi\nmy password is"),
        ("assistant", "Go on, tell me."),
        ("user", "\nhunter2\nand the rest is chat"),
        ("user", "what else?"),
    ]
    opened = opened_by_earlier(said)
    assert opened == [False, False, True, False]
    assert withheld(said[2][1], opened=True).splitlines() == [WITHHELD, "and the rest is chat"]
    # the reply between them opens nothing for the user, nor the user's keyword for the reply
    assert opened_by_earlier([("user", "PIN:"), ("assistant", "1234? no.")]) == [False, False]
    assert opened_by_earlier([("user", "PIN: 4821"), ("user", "thanks")]) == [False, False]


def test_a_question_about_a_password_withholds_nothing_after_it() -> None:
    text = "What is my password?\nI can't remember it\nthe pin on the map"
    assert not looks_secret(text) and withheld(text) == text


PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACBSeGFmcGxlS2V5Rm9yVGVzdHNPbmx5Tm90UmVhbEtleQAAAJhzZWNyZXRz\n"
    "AAAAC3NzaC1lZDI1NTE5AAAAIFJ4YW1wbGVLZXlGb3JUZXN0c09ubHlOb3RSZWFsS2V5AA\n"
    "-----END OPENSSH PRIVATE KEY-----"
)


def test_a_private_key_block_is_withheld_every_line_of_it() -> None:
    said = f"here is my key:\n{PEM}\nthanks!"
    assert secret_lines(said) == [False, True, True, True, True, True, False]
    assert withheld(said).splitlines() == ["here is my key:", WITHHELD, "thanks!"]
    # an RSA body, whose lines are no shape of their own, and a paste cut before its END line
    rsa = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx4\nQyNTUxOQAAACBSeGFm"
    assert withheld(f"key:\n{rsa}") == f"key:\n{WITHHELD}"
    assert "MIIEow" not in withheld(f"{rsa}\n-----END RSA PRIVATE KEY-----\nbye")
    assert withheld(f"{rsa}\n-----END RSA PRIVATE KEY-----\nbye").endswith("\nbye")


def test_a_public_key_or_a_certificate_is_kept() -> None:
    cert = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----"
    assert withheld(cert) == cert


# the phrasings of issue 43.5 and others of the same kinds: (what the user types, the secret)
TOLD: list[tuple[str, str]] = [
    ("My password is\nhunter2", "hunter2"),
    ("my password's swordfish7", "swordfish7"),
    ("ｐａｓｓｗｏｒｄ: ｔｒｏｕｂａｄｏｒ", "ｔｒｏｕｂａｄｏｒ"),
    ("pay with sk_live_4eC39HqLyjWDarjtT1zdp7dc please", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("the wifi pass is marmalade", "marmalade"),
    ("pw: quokka42", "quokka42"),
    ("mein Passwort ist Zitronenfalter", "Zitronenfalter"),
    ("mi contraseña es mariposa", "mariposa"),
    ("my card: 4111.1111.1111.1111, expires soon", "4111"),
    (f"my ssh key, keep it safe\n{PEM}", "QyNTUxOQAAACBSeGFmcGxlS2V5"),
    ("login admin / gooseberry", "gooseberry"),
    ("the password for the router is\n\nbramble99", "bramble99"),
    ("le mot de passe du wifi est tournesol", "tournesol"),
    ("a senha do banco é jabuticaba", "jabuticaba"),
    ("私の暗証番号は7319です", "7319"),
    ("我的密码是 qilin888", "qilin888"),
    ("제 비밀번호는 dokkaebi9 입니다", "dokkaebi9"),
    ("PIN: 5821", "5821"),
    ("user/pass: root/toadstool", "toadstool"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghij"),
]
# a keyword that ends one message and its value sent as the next (a reply between them)
TOLD_APART: list[tuple[str, str]] = [
    ("ok so my password is", "gingersnap77"),
    ("Das WLAN-Passwort lautet:", "Zitronenbaum"),
]
SAID = [said for said, _ in TOLD] + [m for pair in TOLD_APART for m in pair]
VALUES = [value for _, value in TOLD] + [value for _, value in TOLD_APART]


def _kioku(chronicler: str):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from kioku.chronicler import LLMChronicler
    from kioku.engine import Kioku
    from kioku.layers import Layers
    from kioku.models import ScriptedModel
    from kioku.profiles import LOCAL_8K
    from kioku.store import Store
    from kioku.summarizer import ExtractiveSummarizer
    from kioku.tokens import ScriptEstimator

    store = Store.open("sqlite://")
    counter = ScriptEstimator()
    # a chronicler and a notes model that record what they are given (and answer nothing
    # usable: the extractive chronicler stands in, so its chapters are checked too)
    chron = ScriptedModel(default="I cannot summarize this.", name="chronicler")
    notes_model = ScriptedModel(default="NONE", name="notes")
    reply = ScriptedModel(default="Mika nods.", name="reply")
    extractive = ExtractiveSummarizer(counter)
    kk = Kioku(
        store,
        profile=replace(replace(LOCAL_8K, memory_share=1.0).scaled(2048), summary_delay_s=0.0),
        counter=counter,
        layers=Layers(store, notes_model=notes_model if chronicler == "model" else None),
        reply_model=reply,
        summarizer=LLMChronicler(chron, counter, extractive)
        if chronicler == "model"
        else extractive,
    )
    return kk, reply, chron, notes_model


@pytest.mark.parametrize("chronicler", ["model", "extractive"])
def test_no_secret_told_reaches_a_summarizer_memory_notes_or_recollection(chronicler: str) -> None:
    """Floor of issue 43.5, through the library: every phrasing is told, memory folds them all
    (chapters, notes), then "Do you remember my password?" is asked. No value is in what the
    chronicler or the notes model were given, in a chapter, a note or the reply prompt; the log
    keeps every message as written."""
    from kioku.memory import render_memory
    from kioku.notes import notes
    from tests.test_service_support import words

    kk, reply, chron, notes_model = _kioku(chronicler)
    conv = kk.conversation("c", system_prompt="You are Mika.", character="Mika")
    for said in SAID:
        conv.chat(said)
        kk.worker.run_until_idle()
    for n in range(40):  # enough to fold the secrets away, so that only memory and recall hold them
        conv.chat(f"turn {n}: " + words(n, 60))
        kk.worker.run_until_idle()
    conv.chat("Do you remember my password?")
    asked = reply.prompts()[-1]
    assert "Do you remember my password?" in asked
    prompt = conv.last_turn
    assert conv.info().raw_start > 2 * len(SAID)  # the secrets are out of the raw window
    memory = render_memory(conv.memory(), conv.lang)[0]
    assert memory  # chapters were written
    inputs = chron.prompts() + notes_model.prompts()
    if chronicler == "model":
        # both models were asked, of the secrets' range
        assert any("withheld" in t for t in chron.prompts())
        assert any("withheld" in t for t in notes_model.prompts())
    ledger = "\n".join(f"{n.subject} {n.text}" for n in notes(kk.store, conv.id))
    for value in VALUES:
        plain = unicodedata.normalize("NFKC", value)
        for where, text in [("prompt", asked), ("memory", memory), ("notes", ledger)] + [
            ("summarizer input", t) for t in inputs
        ]:
            assert value not in text and plain not in text, (where, value)
    # recall did bring the told lines back, withheld: the raw line is never a recollection
    assert "withheld" in asked, prompt
    # once: a recollection of withheld lines only says all that any of them could
    assert asked.count("withheld: a line") == 1, asked
    logged = [e.text for e in kk.store.entries(conv.id)]
    assert all(said in logged for said in SAID)  # the log keeps them as written

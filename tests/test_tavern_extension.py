"""The extension's headers, merged by SillyTavern's own server code: the user's static
"Include Headers" YAML (any of its shapes) keeps its headers, kioku's per-request ones win over a
stale static X-Kioku-Conversation, and a non-ASCII chat id survives as RFC 8187 `utf-8''…`,
which kioku decodes. Runs the extension module and `src/util.js` of the prepared SillyTavern in
node (`.ci/sillytavern.sh`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any
from urllib.parse import quote

import pytest

from kioku.service.proxy import header_text
from tests.tavern import EXTENSION, need_sillytavern

pytestmark = pytest.mark.browser  # needs the same SillyTavern install as the browser test

OURS = {
    "X-Kioku-Generation": "swipe",
    "X-Kioku-Conversation": "utf-8''" + quote("セラフィナ - 2024-11-12@10h11m12s", safe=""),
}


def merged(static_yaml: str, ours: dict[str, str]) -> Any:
    """What SillyTavern's server sends as headers: `mergeObjectWithYaml(headers, yaml)`."""
    root = need_sillytavern()
    script = f"""
import {{ withHeaders }} from {json.dumps(str(EXTENSION / "index.js"))};
import {{ createRequire }} from 'module';
const require = createRequire({json.dumps(str(root / "package.json"))});
const {{ mergeObjectWithYaml }} = require({json.dumps(str(root / "src" / "util.js"))});
const headers = {{}};
mergeObjectWithYaml(headers, withHeaders({json.dumps(static_yaml)}, {json.dumps(ours)}));
console.log(JSON.stringify(headers));
"""
    node = shutil.which("node")
    assert node is not None
    out = subprocess.run(
        [node, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "static",
    [
        "",
        'X-Kioku-Conversation: stale-id\n# the user\'s own header\nX-Team: "red"',
        "{X-Kioku-Conversation: stale-id, X-Team: red}",
        "- X-Kioku-Conversation: stale-id\n- X-Team: red",
    ],
)
def test_static_headers_stay_and_kiokus_win(static: str) -> None:
    headers = merged(static, OURS)
    assert headers["X-Kioku-Generation"] == "swipe"
    assert header_text(headers["X-Kioku-Conversation"]) == "セラフィナ - 2024-11-12@10h11m12s"
    if static:
        assert headers["X-Team"] == "red"


def extension(expression: str) -> Any:
    """`expression` evaluated over the extension module (`k`) in node; its JSON."""
    need_sillytavern()  # the same node
    node = shutil.which("node")
    assert node is not None
    script = (
        f"import * as k from {json.dumps(str(EXTENSION / 'index.js'))};\n"
        f"console.log(JSON.stringify({expression}));"
    )
    out = subprocess.run(
        [node, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_chats_identity_survives_renames_and_branches_get_their_own() -> None:
    """SillyTavern copies a chat's metadata into its branches and checkpoints (setting
    `main_chat`), and keeps it when a chat file is renamed."""
    new = extension("k.resolveIdentity('Seraphina - 2024-11-12@10h11m12s', {})")
    assert new == {"identity": {"id": "Seraphina - 2024-11-12@10h11m12s",
                                "chat": "Seraphina - 2024-11-12@10h11m12s"}, "write": True}  # fmt: skip
    parent = {"id": "first trip", "chat": "Seraphina - 1"}
    branch = extension(
        f"k.resolveIdentity('Branch #60 - 2026', {{main_chat: 'Seraphina - 1', kioku: {json.dumps(parent)}}})"
    )
    assert branch["identity"] == {"id": "Branch #60 - 2026", "chat": "Branch #60 - 2026",
                                  "parent": "first trip"}  # fmt: skip
    renamed = extension(f"k.resolveIdentity('Our trip', {{kioku: {json.dumps(parent)}}})")
    assert renamed["identity"]["id"] == "first trip" and not renamed["write"]
    assert renamed["rename"] == {"from": "first trip", "to": "Our trip"}
    # a renamed branch is a rename, not another branch
    child = {"id": "Branch #60 - 2026", "chat": "Branch #60 - 2026", "parent": "first trip"}
    again = extension(
        f"k.resolveIdentity('The other path', {{main_chat: 'Seraphina - 1', kioku: {json.dumps(child)}}})"
    )
    assert again["rename"] == {"from": "Branch #60 - 2026", "to": "The other path"}
    # a branch made before kioku named its parent: the parent's file name
    old = extension("k.resolveIdentity('Checkpoint #3 - x', {main_chat: 'Seraphina - 1'})")
    assert old["identity"]["parent"] == "Seraphina - 1"
    assert extension("k.safeId('a/b')").startswith("a_b ~")


def test_the_panel_renders_escaped_markdown() -> None:
    html = extension(r"k.markdown('### Story\n- **Alex** met <b>Sera</b>\n1. *softly*\n\nA & B')")
    assert html == (
        "<h5>Story</h5><ul><li><strong>Alex</strong> met &lt;b&gt;Sera&lt;/b&gt;</li></ul>"
        "<ol><li><em>softly</em></li></ol><p>A &amp; B</p>"
    )
    assert "<script>" not in extension("k.markdown('<script>alert(1)</script>')")


def test_sillytavern_numbers_and_the_whole_chat_as_its_requests_show_it() -> None:
    chat = [
        {"mes": "Hello", "name": "Seraphina", "is_user": False},
        {"mes": "hidden", "name": "Alex", "is_user": True, "is_system": True},
        {"mes": "Hi", "name": "Alex", "is_user": True},
        {"mes": "A narrator line", "name": "Narrator", "extra": {"type": "narrator"}},
        {"mes": "Welcome", "name": "Mika", "is_user": False},
    ]
    assert extension(f"[0, 1, 2, 3].map(p => k.stIndex({json.dumps(chat)}, p))") == [0, 2, 4, 5]
    assert extension(f"k.transcriptOf({json.dumps(chat)}, true)") == [
        {"role": "assistant", "content": "Seraphina: Hello", "name": "Seraphina"},
        {"role": "user", "content": "Hi", "name": "Alex"},
        {"role": "assistant", "content": "Mika: Welcome", "name": "Mika"},
    ]
    messages = [
        {"role": "system", "content": "Write Seraphina's next reply."},
        {"role": "system", "content": "Eldoria lies beyond the river\nThe glade is warded"},
        {"role": "system", "content": "Seraphina is kind."},
        {"role": "system", "content": "hi", "name": "example_user"},
        {"role": "user", "content": "Eldoria lies beyond the river"},
    ]
    changing = ["The glade is warded", "short", ""]
    assert extension(f"k.volatileIndices({json.dumps(messages)}, {json.dumps(changing)})") == [1]


def test_the_repository_is_an_extension_and_so_is_its_folder() -> None:
    """SillyTavern installs the repository from its git URL (a manifest at the root loads the
    extension's folder); a copy of the folder alone carries the same manifest."""
    root = json.loads((EXTENSION.parent.parent / "manifest.json").read_text())
    folder = json.loads((EXTENSION / "manifest.json").read_text())
    for key in ("display_name", "version", "author", "loading_order"):
        assert root[key] == folder[key]
    for kind in ("js", "css"):
        assert (EXTENSION.parent.parent / root[kind]).resolve() == (
            EXTENSION / folder[kind]
        ).resolve()

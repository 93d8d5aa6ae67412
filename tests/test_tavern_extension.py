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

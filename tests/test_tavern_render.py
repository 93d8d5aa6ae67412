"""The SillyTavern panel's memory view (integrations/sillytavern/render.js), rendered in node:
a chapter that stands in for the model's summary says so, and why, as text (never markup)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

from tests.conftest import need
from tests.tavern import EXTENSION


def item_html(item: dict[str, Any]) -> str:
    node = shutil.which("node")
    need(node is not None, "node is not installed (.ci/sillytavern.sh)")
    assert node is not None
    script = (
        f"import {{ itemHtml }} from {json.dumps(str(EXTENSION / 'render.js'))};\n"
        f"console.log(JSON.stringify(itemHtml([], 'Chapter 1', {json.dumps(item)}, {{}}, null)));"
    )
    out = subprocess.run(
        [node, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return str(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_stand_in_chapter_is_marked_with_why() -> None:
    base = {"id": 3, "kind": "chapter", "first_seq": 0, "last_seq": 4, "text": "[0] Ren: hi"}
    marked = item_html({**base, "stand_in": "the model <b>refused</b>"})
    assert (
        '<span class="kioku-stand-in" title="the model\'s summary failed: these are the '
        "messages' own lines\">stand-in (extractive: the model &lt;b&gt;refused&lt;/b&gt;)</span>"
    ) in marked
    assert marked.index("kioku-stand-in") < marked.index("</summary>")  # seen while closed
    assert "kioku-stand-in" not in item_html({**base, "stand_in": None})
    assert "kioku-stand-in" not in item_html(base)  # a service from before the mark

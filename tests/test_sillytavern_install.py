"""The install docs/sillytavern.md describes, on a fresh SillyTavern 1.12.6 (issue 22): the
kioku repository installed from its git URL with SillyTavern's own *Install extension*, shown
in *Manage extensions* with its version (a copied folder is not a git repository, and
SillyTavern left it out of that list), and then set up in its panel as the doc says."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from kioku.store import Store
from tests.tavern import Tavern, repository, wait_for
from tests.tavern_stack import running
from tests.test_console import browser

pytestmark = pytest.mark.browser
__all__ = ["browser"]


def test_the_extension_installs_from_a_git_url_on_a_fresh_sillytavern(
    tmp_path: Path, browser: Any
) -> None:
    # the kioku repository, as a user finds it at its git URL
    source = repository(tmp_path / "source" / "kioku")
    bare = tmp_path / "kioku.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(bare)], check=True)
    with running(tmp_path, extension=False) as stack:
        installed = stack.tavern.data / "default-user" / "extensions" / "kioku"
        assert not installed.exists()
        t = Tavern(browser, stack.tavern.url)
        t.open(panel=False)
        t.install_extension(f"file://{bare}")
        assert "installed successfully" in t.toasts(), t.toasts()
        assert (installed / "manifest.json").is_file() and (installed / ".git").is_dir()
        # SillyTavern loads it at once: the panel is there, with nothing set up yet
        wait_for(lambda: t.js("return $('#kioku_settings').length > 0"), 30, "the kioku panel")
        listed = t.installed_extensions()
        assert "kioku — long-term memory" in listed
        assert "(main-" in listed  # its git version: listed with a toggle, an update and a delete
        # the doc's next step: kioku's URL and key in the panel, then chat
        t.js("$('#kioku_url').val(arguments[0]).trigger('change')", stack.tavern.kioku_url)
        t.js("$('#kioku_key').val(arguments[0]).trigger('change')", stack.tavern.kioku_key)
        t.connect()
        t.select_character("Seraphina")
        t.send("Hello, I installed kioku from its repository.")
        stack.idle()
        store: Store = stack.store
        [conversation] = store.conversations("tavern")
        assert conversation.public_id == t.chat_id()
        assert [e.text for e in store.entries(conversation.id) if e.role == "user"] == [
            "Hello, I installed kioku from its repository."
        ]
        t.click("#kioku_refresh")
        wait_for(lambda: "messages stored" in t.js("return $('#kioku_status').text()"),
                 20, "the panel reading kioku")  # fmt: skip

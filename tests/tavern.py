"""A real SillyTavern 1.12.6 for tests: started offline in a fresh data folder, set up as a new
user sets it up (Chat Completion → Custom (OpenAI-compatible) → kioku), with the kioku
extension installed, and driven through its web page in headless Chromium.

`.ci/sillytavern.sh` prepares the install (unpacks `../shared/clients/sillytavern-1.12.6.tar.gz`,
`npm install`, offline config.yaml) and prints its folder; tests find it at $KIOKU_SILLYTAVERN or
in `~/.cache/kioku/sillytavern/` (skipped without it locally, a failure with CI=true). Each test
session gets its own `--dataRoot`, so the install stays as unpacked.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kioku.service.loopback import free_port
from tests.conftest import need
from tests.process import ChildServer

REPO = Path(__file__).resolve().parent.parent
EXTENSION = REPO / "integrations" / "sillytavern"
CACHE = Path.home() / ".cache" / "kioku" / "sillytavern"
USER = "Alex"


def install_dir() -> Path | None:
    """The prepared SillyTavern (`.ci/sillytavern.sh`), or None."""
    env = os.environ.get("KIOKU_SILLYTAVERN")
    if env:
        return Path(env) if (Path(env) / "node_modules").is_dir() else None
    found = sorted(CACHE.glob("*/sillytavern/node_modules"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None


def need_sillytavern() -> Path:
    root = install_dir()
    need(root is not None, "no SillyTavern install: run .ci/sillytavern.sh (needs npm)")
    need(shutil.which("node") is not None, "node is not installed")
    assert root is not None
    return root


class SillyTavern(ChildServer):
    """`node server.js` on a free port with its own data folder, pointed at kioku."""

    def __init__(self, root: Path, data: Path, kioku_url: str, kioku_key: str) -> None:
        self.root = root
        self.data = data
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kioku_url = kioku_url
        self.kioku_key = kioku_key
        self.log = data / "sillytavern.log"
        self.name = "SillyTavern"

    def configure(self, extension: bool = True) -> None:
        """What a new user clicks through once: the API connection, the user's name, and the
        extension copied into the user's extensions folder with kioku's URL and key."""
        user = self.data / "default-user"
        user.mkdir(parents=True, exist_ok=True)
        s = json.loads((self.root / "default" / "content" / "settings.json").read_text())
        s["firstRun"] = False
        s["username"] = USER
        s["main_api"] = "openai"
        oai = s["oai_settings"]
        oai["chat_completion_source"] = "custom"
        oai["custom_url"] = f"{self.kioku_url}/v1"
        oai["custom_model"] = "kioku-test"
        oai["stream_openai"] = True
        # SillyTavern sends its whole chat (kioku fits the window), so an edit far back reaches it
        oai["openai_max_context"] = 60000
        oai["max_context_unlocked"] = True
        s.setdefault("extension_settings", {})["kioku"] = {
            "enabled": True,
            "url": self.kioku_url,
            "key": self.kioku_key,
        }
        (user / "settings.json").write_text(json.dumps(s, indent=2))
        (user / "secrets.json").write_text(json.dumps({"api_key_custom": self.kioku_key}))
        if extension:
            shutil.copytree(EXTENSION, user / "extensions" / "kioku", dirs_exist_ok=True)

    def start(self) -> SillyTavern:
        args = ["node", "server.js", "--port", str(self.port), "--dataRoot", str(self.data)]
        args += ["--listen", "false", "--autorun", "false", "--whitelist", "false"]
        self.launch(args, self.url, cwd=self.root, poll_s=0.3)
        return self


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0, what: str = "") -> Any:
    """Poll `check` until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.1)


class Tavern:
    """SillyTavern's page, driven as a user drives it (selenium + headless Chromium)."""

    def __init__(self, driver: Any, url: str) -> None:
        from selenium.webdriver.common.by import By

        self.d = driver
        self.url = url
        self.By = By

    def js(self, script: str, *args: Any) -> Any:
        return self.d.execute_script(script, *args)

    def find(self, css: str) -> Any:
        return self.d.find_element(self.By.CSS_SELECTOR, css)

    def click(self, css: str) -> None:
        """A click as a user's: through the element's handlers (some of SillyTavern's buttons
        sit in menus that open on hover)."""
        self.js("$(arguments[0]).first().trigger('click')", css)

    def open(self) -> None:
        self.d.get(self.url)
        wait_for(lambda: self.js("return !!(window.SillyTavern && SillyTavern.getContext)"),
                 60, "SillyTavern's page")  # fmt: skip
        wait_for(lambda: self.js("return $('#rm_print_characters_block .character_select').length > 0"),
                 60, "the character list")  # fmt: skip
        wait_for(lambda: self.js("return $('#kioku_settings').length > 0"), 30, "the kioku panel")

    def connect(self) -> None:
        """API Connections → Connect: SillyTavern asks the endpoint for its models."""
        self.click("#api_button_openai")
        wait_for(lambda: self.context("onlineStatus") not in ("no_connection", None, ""),
                 30, "the API connection")  # fmt: skip

    def context(self, key: str) -> Any:
        return self.js(f"return SillyTavern.getContext().{key}")

    def chat_id(self) -> str:
        return str(self.js("return SillyTavern.getContext().getCurrentChatId()"))

    def messages(self) -> list[dict[str, Any]]:
        return list(self.js("return SillyTavern.getContext().chat.map(m => ({name: m.name, is_user: m.is_user, mes: m.mes}))"))  # fmt: skip

    def busy(self) -> bool:
        return bool(self.js("return $('#mes_stop').is(':visible')"))

    def idle(self, timeout_s: float = 60.0) -> None:
        wait_for(lambda: not self.busy(), timeout_s, "the generation to end")
        time.sleep(0.3)  # SillyTavern saves the chat after the last chunk

    def select_character(self, name: str) -> None:
        self.js(
            "$('#rm_print_characters_block .character_select').filter((i, e) => "
            "$(e).find('.ch_name').text().trim() === arguments[0]).first().trigger('click')",
            name,
        )
        wait_for(lambda: self.context("name2") == name and self.messages(), 30, f"{name}'s chat")

    def send(self, text: str) -> None:
        n = len(self.messages())
        self.js("$('#send_textarea').val(arguments[0]).trigger('input')", text)
        self.click("#send_but")
        wait_for(
            lambda: len(self.messages()) >= n + 2 or self.busy(), 60, "the generation to start"
        )
        self.idle()
        wait_for(lambda: len(self.messages()) >= n + 2, 60, "the reply")

    def option(self, option_id: str) -> None:
        """An item of the ☰ menu left of the send box (regenerate, continue, impersonate,
        start new chat, manage chat files)."""
        self.click("#options_button")
        self.click(f"#{option_id}")

    def swipe_right(self) -> None:
        """A new version of the last reply (SillyTavern generates it: a "swipe")."""
        swipes = "return (SillyTavern.getContext().chat.at(-1).swipes || []).length"
        before = self.js(swipes)
        self.click("#chat .mes.last_mes .swipe_right")
        wait_for(lambda: self.js(swipes) > max(before, 1) or self.busy(), 30, "the swipe")
        self.idle()

    def continue_reply(self) -> None:
        """☰ → Continue: more of the last reply."""
        before = self.messages()[-1]["mes"]
        self.option("option_continue")
        wait_for(lambda: self.messages()[-1]["mes"] != before, 30, "the continuation")
        self.idle()

    def edit(self, mesid: int, text: str) -> None:
        self.click(f"#chat .mes[mesid='{mesid}'] .mes_edit")
        wait_for(lambda: self.js("return $('#curEditTextarea').length > 0"), 10, "the edit box")
        self.js("$('#curEditTextarea').val(arguments[0]).trigger('input')", text)
        self.click(f"#chat .mes[mesid='{mesid}'] .mes_edit_done")
        time.sleep(0.5)

    def delete(self, mesid: int) -> None:
        self.click(f"#chat .mes[mesid='{mesid}'] .mes_edit")
        wait_for(lambda: self.js("return $('#curEditTextarea').length > 0"), 10, "the edit box")
        self.click(f"#chat .mes[mesid='{mesid}'] .mes_edit_delete")
        self.confirm()
        time.sleep(0.5)

    def confirm(self) -> None:
        wait_for(lambda: self.js("return $('dialog[open] .popup-button-ok:visible').length > 0"),
                 10, "a popup")  # fmt: skip
        self.click("dialog[open] .popup-button-ok")
        time.sleep(0.5)

    def new_chat(self) -> None:
        old = self.chat_id()
        self.option("option_start_new_chat")
        self.confirm()
        wait_for(lambda: self.chat_id() != old and self.messages(), 60, "the new chat")

    def open_chat(self, chat_id: str) -> None:
        """Manage chat files → click the chat."""
        block = (
            "$('.select_chat_block').filter((i, e) => "
            "String($(e).attr('file_name')).replace(/\\.jsonl$/, '') === arguments[0])"
        )
        for attempt in range(3):  # a click on a list that is still being drawn can be lost
            self.option("option_select_chat")
            wait_for(lambda: self.js(f"return {block}.length > 0", chat_id), 60, "the chat")
            time.sleep(0.5)
            self.js(f"{block}.first().trigger('click')", chat_id)
            try:
                wait_for(lambda: self.chat_id() == chat_id and self.messages(), 30, chat_id)
                break
            except AssertionError:
                if attempt == 2:
                    raise
        time.sleep(0.5)

    def set_headers(self, yaml: str) -> None:
        """API Connections → Additional Parameters → Include Headers (static YAML)."""
        self.click("#customize_additional_parameters")
        wait_for(lambda: self.js("return $('#custom_include_headers:visible').length > 0"),
                 10, "the Additional Parameters popup")  # fmt: skip
        self.js("$('#custom_include_headers').val(arguments[0]).trigger('input')", yaml)
        self.click("#dialogue_popup_ok")
        time.sleep(0.5)

    def set_kioku_enabled(self, on: bool) -> None:
        self.js("$('#kioku_enabled').prop('checked', arguments[0]).trigger('change')", on)

    def toasts(self) -> str:
        return str(self.js("return $('#toast-container .toast').text()"))

    def test_message(self) -> None:
        """API Connections → Test Message (SillyTavern's one-message "Hi")."""
        self.click("#test_api_button")
        wait_for(lambda: self.js("return $('#toast-container .toast').text()"), 30, "a toast")

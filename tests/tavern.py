"""A real SillyTavern 1.12.6 for tests: started offline in a fresh data folder, set up as a new
user sets it up (Chat Completion → Custom (OpenAI-compatible) → kioku), with the kioku
extension installed, and driven through its web page in headless Chromium.

`.ci/sillytavern.sh` prepares the install (unpacks `../shared/clients/sillytavern-1.12.6.tar.gz`,
`npm install`, offline config.yaml) and prints its folder; tests find it at $KIOKU_SILLYTAVERN or
in `~/.cache/kioku/sillytavern/` (skipped without it locally, a failure with CI=true). Each test
session gets its own `--dataRoot`, so the install stays as unpacked.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import time
import zlib
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


def install_extension(target: Path) -> None:
    """The extension as a user installs it: a clone of the kioku repository (which holds a
    manifest at its root). Here: the files of this checkout, as a git repository, so that
    SillyTavern's Manage extensions can read its version."""
    repository(target)
    subprocess.run(["git", "-C", str(target), "remote", "add", "origin", str(target)],
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run(["git", "-C", str(target), "fetch", "-q", "origin"], check=True,
                   capture_output=True)  # fmt: skip


def repository(target: Path) -> Path:
    """A git repository of this checkout's files as they are now (committed or not): what a
    user gets from cloning kioku."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target / rel)
    git = ["git", "-C", str(target), "-c", "user.name=kioku", "-c", "user.email=kioku@localhost"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True, capture_output=True)
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-q", "-m", "kioku"], check=True, capture_output=True)
    return target


def card_png(card: dict[str, Any]) -> bytes:
    """A 1×1 PNG carrying a character card, as SillyTavern reads one (a `chara` tEXt chunk
    holding the card's JSON, base64)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    text = b"chara\0" + base64.b64encode(json.dumps(card).encode())
    pixels = zlib.compress(b"\0\xff\xff\xff")
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
        + chunk(b"tEXt", text)
        + chunk(b"IDAT", pixels)
        + chunk(b"IEND", b"")
    )


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

    def configure(self, extension: bool = True, context: int = 60000) -> None:
        """What a new user clicks through once: the API connection, the user's name, and the
        extension copied into the user's extensions folder with kioku's URL and key.
        `context`: SillyTavern's own context size (it resends what fits)."""
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
        oai["openai_max_context"] = context
        oai["max_context_unlocked"] = context > 4095
        if extension:
            s.setdefault("extension_settings", {})["kioku"] = {
                "enabled": True,
                "url": self.kioku_url,
                "key": self.kioku_key,
            }
        (user / "settings.json").write_text(json.dumps(s, indent=2))
        (user / "secrets.json").write_text(json.dumps({"api_key_custom": self.kioku_key}))
        if extension:
            install_extension(user / "extensions" / "kioku")

    def add_character(self, name: str, first_mes: str, description: str) -> str:
        """A character card (a PNG with its `chara` text chunk, as SillyTavern writes one);
        returns its avatar file name."""
        card = {"name": name, "description": description, "personality": "", "scenario": "",
                "first_mes": first_mes, "mes_example": ""}  # fmt: skip
        v2 = {"spec": "chara_card_v2", "spec_version": "2.0",
              "data": {**card, "creator_notes": "", "system_prompt": "",
                       "post_history_instructions": "", "alternate_greetings": [], "tags": [],
                       "creator": "", "character_version": "", "extensions": {}}}  # fmt: skip
        folder = self.data / "default-user" / "characters"
        folder.mkdir(parents=True, exist_ok=True)
        (self.data / "default-user" / "chats" / name).mkdir(parents=True, exist_ok=True)
        avatar = f"{name}.png"
        (folder / avatar).write_bytes(card_png({**card, **v2}))
        return avatar

    def add_group(self, name: str, members: list[str], chat_id: str) -> str:
        """A group whose members all reply, in order, to each message (SillyTavern's "List"
        activation: deterministic)."""
        gid = str(1_700_000_000_000 + len(name))
        group = {"id": gid, "name": name, "members": members, "avatar_url": "",
                 "allow_self_responses": False, "activation_strategy": 1, "generation_mode": 0,
                 "disabled_members": [], "chat_metadata": {}, "fav": False, "chat_id": chat_id,
                 "chats": [chat_id], "auto_mode_delay": 5, "past_metadata": {},
                 "generation_mode_join_prefix": "", "generation_mode_join_suffix": ""}  # fmt: skip
        folder = self.data / "default-user" / "groups"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{gid}.json").write_text(json.dumps(group, indent=4))
        return gid

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


# Longer than SillyTavern's save debounce (`debounce_timeout.relaxed`, 1 s): a page that has sent
# nothing for this long has no save still waiting to go out.
QUIET_MS = 1200
# Counts the page's requests (fetch and jQuery's XHR) in flight and notes when the last one
# began or ended; installed once per page load.
_NET = """
if (!window.__kiokuNet) {
  const net = window.__kiokuNet = {inflight: 0, last: Date.now()};
  const begin = () => { net.inflight += 1; net.last = Date.now(); };
  const end = () => { net.inflight = Math.max(0, net.inflight - 1); net.last = Date.now(); };
  const fetch0 = window.fetch;
  window.fetch = function (...args) { begin(); return fetch0.apply(this, args).finally(end); };
  if (window.jQuery) { jQuery(document).ajaxSend(begin).ajaxComplete(end); }
}
"""
_QUIET = (
    "const n = window.__kiokuNet; return n.inflight === 0 && Date.now() - n.last > arguments[0]"
)
# what was just done counts as activity: its effects (an animation, then a debounced save) may
# not have sent anything yet
_ACTED = "window.__kiokuNet.last = Math.max(window.__kiokuNet.last, Date.now())"


class Tavern:
    """SillyTavern's page, driven as a user drives it (selenium + headless Chromium)."""

    def __init__(self, driver: Any, url: str) -> None:
        from selenium.webdriver.common.by import By

        self.d = driver
        self.url = url
        self.By = By

    def js(self, script: str, *args: Any) -> Any:
        return self.d.execute_script(script, *args)

    def quiet(self, quiet_ms: int = QUIET_MS, timeout_s: float = 30.0) -> None:
        """Wait until the page has nothing in flight and has sent nothing for `quiet_ms` since
        the last thing done: what a click set off (a save, a debounced save, the extension's
        calls) has gone out and come back."""
        self.js(_NET)
        self.js(_ACTED)
        wait_for(lambda: self.js(_QUIET, quiet_ms), timeout_s, "the page's requests to settle")

    def find(self, css: str) -> Any:
        return self.d.find_element(self.By.CSS_SELECTOR, css)

    def click(self, css: str) -> None:
        """A click as a user's: through the element's handlers (some of SillyTavern's buttons
        sit in menus that open on hover)."""
        self.js("$(arguments[0]).first().trigger('click')", css)

    def open(self, panel: bool = True) -> None:
        self.d.get(self.url)
        wait_for(lambda: self.js("return !!(window.SillyTavern && SillyTavern.getContext)"),
                 60, "SillyTavern's page")  # fmt: skip
        self.js(_NET)
        wait_for(lambda: self.js("return $('#rm_print_characters_block .character_select').length > 0"),
                 60, "the character list")  # fmt: skip
        if panel:
            wait_for(lambda: self.js("return $('#kioku_settings').length > 0"), 30, "the panel")

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

    def sent(self) -> list[dict[str, Any]]:
        """The messages SillyTavern sends the model (not its system or narrator messages)."""
        return list(self.js("return SillyTavern.getContext().chat.filter(m => !m.is_system && m.extra?.type !== 'narrator').map(m => ({name: m.name, is_user: m.is_user, mes: m.mes}))"))  # fmt: skip

    def busy(self) -> bool:
        return bool(self.js("return $('#mes_stop').is(':visible')"))

    def idle(self, timeout_s: float = 60.0) -> None:
        wait_for(lambda: not self.busy(), timeout_s, "the generation to end")
        self.quiet(300)  # SillyTavern saves the chat at once after the last chunk

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
        wait_for(lambda: self.js("return $('#curEditTextarea').length === 0"), 10, "the edit done")
        self.quiet()

    def delete(self, mesid: int) -> None:
        count = len(self.messages())
        self.click(f"#chat .mes[mesid='{mesid}'] .mes_edit")
        wait_for(lambda: self.js("return $('#curEditTextarea').length > 0"), 10, "the edit box")
        self.click(f"#chat .mes[mesid='{mesid}'] .mes_edit_delete")
        self.confirm()
        wait_for(lambda: len(self.messages()) == count - 1, 30, f"#{mesid} deleted")
        self.quiet()

    def confirm(self) -> None:
        wait_for(lambda: self.js("return $('dialog[open] .popup-button-ok:visible').length > 0"),
                 10, "a popup")  # fmt: skip
        self.click("dialog[open] .popup-button-ok")
        wait_for(lambda: self.js("return $('dialog[open] .popup-button-ok:visible').length === 0"), 10, "the popup closed")  # fmt: skip

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
            self.quiet()
            self.js(f"{block}.first().trigger('click')", chat_id)
            try:
                wait_for(lambda: self.chat_id() == chat_id and self.messages(), 30, chat_id)
                break
            except AssertionError:
                if attempt == 2:
                    raise
        self.settled()

    def set_headers(self, yaml: str) -> None:
        """API Connections → Additional Parameters → Include Headers (static YAML)."""
        self.click("#customize_additional_parameters")
        wait_for(lambda: self.js("return $('#custom_include_headers:visible').length > 0"),
                 10, "the Additional Parameters popup")  # fmt: skip
        self.js("$('#custom_include_headers').val(arguments[0]).trigger('input')", yaml)
        self.click("#dialogue_popup_ok")
        self.quiet()

    def set_kioku_enabled(self, on: bool) -> None:
        self.js("$('#kioku_enabled').prop('checked', arguments[0]).trigger('change')", on)

    def toasts(self) -> str:
        return str(self.js("return $('#toast-container .toast').text()"))

    def test_message(self) -> None:
        """API Connections → Test Message (SillyTavern's one-message "Hi")."""
        self.click("#test_api_button")
        wait_for(lambda: self.js("return $('#toast-container .toast').text()"), 30, "a toast")

    # what issue 22 added: groups, branches, checkpoints, renames, the extension's install ------

    def open_group(self, name: str) -> None:
        self.js(
            "$('#rm_print_characters_block .group_select').filter((i, e) => "
            "$(e).find('.ch_name').text().trim() === arguments[0]).first().trigger('click')",
            name,
        )
        wait_for(lambda: self.js("return !!SillyTavern.getContext().groupId") and self.messages(),
                 30, f"the group {name}")  # fmt: skip

    def send_to_group(self, text: str, replies: int) -> None:
        """A message to a group whose members all reply (List activation)."""
        n = len(self.messages())
        self.js("$('#send_textarea').val(arguments[0]).trigger('input')", text)
        self.click("#send_but")
        wait_for(lambda: len(self.messages()) >= n + 1 + replies, 90, "the group's replies")
        self.idle()

    def create_branch(self, mesid: int) -> str:
        old = self.chat_id()
        self.click(f"#chat .mes[mesid='{mesid}'] .mes_create_branch")
        wait_for(lambda: self.chat_id() != old and self.messages(), 30, "the branch")
        self.quiet()
        return self.chat_id()

    def settled(self) -> None:
        """Wait until the chat SillyTavern opened is drawn and nothing it sends is in flight: it
        draws the messages, then saves the character and the chat's metadata (the extension
        writes its identity there), and a checkpoint taken meanwhile can be lost."""
        drawn = ("const c = SillyTavern.getContext(); "
                 "return c.chat.length > 0 && $('#chat .mes').last().attr('mesid') == c.chat.length - 1 "
                 "&& jQuery.active === 0")  # fmt: skip
        wait_for(lambda: self.js(drawn), 30, "the chat drawn and saved")
        self.quiet()

    def problems(self) -> str:
        """What the page said went wrong: its toasts and its console's errors."""
        try:
            logs = [e["message"] for e in self.d.get_log("browser") if e["level"] == "SEVERE"]
        except Exception:  # a driver without the browser log
            logs = []
        return f"toasts {self.toasts()!r}, console errors {logs[-5:]!r}"

    def create_checkpoint(self, mesid: int, name: str) -> None:
        """The message's menu → Create checkpoint → its name. SillyTavern writes the checkpoint's
        file, then marks the message with its link."""
        link = f"return !!SillyTavern.getContext().chat[{mesid}]?.extra?.bookmark_link"
        for attempt in range(2):  # one more try, after saying why the first was lost
            self.settled()
            self.click(f"#chat .mes[mesid='{mesid}'] .mes_create_bookmark")
            wait_for(lambda: self.js("return $('dialog[open] .popup-input:visible').length > 0"),
                     10, "the checkpoint's name")  # fmt: skip
            self.js("$('dialog[open]').last().find('.popup-input').val(arguments[0]).trigger('input')",
                    name)  # fmt: skip
            self.js("$('dialog[open]').last().find('.popup-button-ok').trigger('click')")
            try:
                wait_for(lambda: self.js(link), 30, "the checkpoint")
                break
            except AssertionError:
                if attempt == 1 or self.js("return $('dialog[open]').length > 0"):
                    raise AssertionError(f"no checkpoint of #{mesid}: {self.problems()}") from None
                print(f"the checkpoint of #{mesid} was lost, once: {self.problems()}")
        wait_for(lambda: self.js(f"return !!$(\"#chat .mes[mesid='{mesid}']\").attr('bookmark_link')"),
                 10, "the checkpoint's flag")  # fmt: skip
        self.quiet()

    def open_checkpoint(self, mesid: int) -> str:
        link = str(self.js(f"return $(\"#chat .mes[mesid='{mesid}']\").attr('bookmark_link')"))
        self.click(f"#chat .mes[mesid='{mesid}'] .mes_bookmark")
        wait_for(lambda: self.chat_id() == link and self.messages(), 30, "the checkpoint")
        self.quiet()
        return link

    def rename_chat(self, old: str, new: str) -> None:
        """Manage chat files → the pencil beside the chat → the new name."""
        self.option("option_select_chat")
        block = ("$('.select_chat_block_wrapper').filter((i, e) => $(e).find("
                 "'.select_chat_block_filename').text().replace(/\\.jsonl$/, '') === arguments[0])")  # fmt: skip
        wait_for(lambda: self.js(f"return {block}.length > 0", old), 30, "the chat in the list")
        self.js(f"{block}.find('.renameChatButton').first().trigger('click')", old)
        wait_for(lambda: self.js("return $('#dialogue_popup_input:visible').length > 0"),
                 10, "the rename popup")  # fmt: skip
        self.js("$('#dialogue_popup_input').val(arguments[0]).trigger('input')", new)
        self.click("#dialogue_popup_ok")
        wait_for(lambda: self.chat_id() == new, 30, "the renamed chat")
        self.js("$('#select_chat_cross').trigger('click')")
        self.quiet()

    def install_extension(self, url: str) -> None:
        """Extensions → Install extension → the repository's URL (as a user installs one)."""
        self.click("#third_party_extension_button")
        wait_for(lambda: self.js("return $('dialog[open] .popup-input:visible').length > 0"),
                 10, "the install popup")  # fmt: skip
        self.quiet()
        self.js("$('dialog[open]').last().find('.popup-input').val(arguments[0]).trigger('input')",
                url)  # fmt: skip
        self.js("$('dialog[open]').last().find('.popup-button-ok').trigger('click')")
        wait_for(lambda: "installed successfully" in self.toasts() or "failed" in self.toasts(),
                 60, "the installation")  # fmt: skip

    def installed_extensions(self) -> str:
        """Extensions → Manage extensions: the text of its "Installed Extensions" part."""
        self.click("#extensions_details")
        wait_for(lambda: self.js("return $('.extensions_info h3').length > 0 && "
                                 "!$('.extensions_info .fa-spinner').length"),
                 30, "Manage extensions")  # fmt: skip
        text = str(self.js("return $('.extensions_info').text()"))
        self.click("dialog[open] .popup-button-ok")
        return text

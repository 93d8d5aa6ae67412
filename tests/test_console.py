"""The operator console in a real headless Chromium, against the real service.

The service runs with uvicorn in a thread on a free loopback port, on a SQLite file that holds a
conversation with memory (folded by the extractive summarizer) and a planted verbal tic. The
browser enters the key, filters the conversations, reads memory, opens a chapter's source
messages, browses the whole transcript with its times, searches the archive, corrects and
retracts a line of memory (in the prompt from the next fold), edits a note, presses cut and
reads the tic alerts, the pending jobs and the compaction log. It takes screenshots at desktop
and phone widths (with CJK fonts, so 記憶 and 区切り render) and checks that nothing overflows
sideways. Needs Debian `chromium`, `chromium-driver` and `fonts-noto-cjk` (`.ci/chromium.sh`);
skips without them locally, fails in CI. Screenshots go to $KIOKU_CONSOLE_SCREENSHOTS (a folder)
when it is set.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kioku.chronicler import LLMChronicler
from kioku.config import Settings
from kioku.engine import Kioku
from kioku.layers import Layers
from kioku.models import ScriptedModel
from kioku.outcomes import stand_in
from kioku.profiles import LOCAL_8K
from kioku.store import Store
from kioku.summarizer import ExtractiveSummarizer
from kioku.tokens import ScriptEstimator
from tests.conftest import need
from tests.helpers import Clock

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TENANT = "acme"
CID = "mika"
TIC = "nya~ just kidding, darling!"
FIRST = "Hi Mika! <b>not bold</b> — my sister Hana lives in Sapporo. 記憶は大切だね。"
FILLER = [
    "The weather was grey and we walked along the pier talking about nothing much.",
    "We tried the new noodle stall near the station and it was far too salty.",
    "You showed me the photos from your cousin's wedding in the mountains.",
    "We watched the fishing boats come in while the gulls fought over scraps.",
    "You complained about your printer jamming again before the deadline.",
]
NOTE = "- [promise] Mika: to visit the lighthouse in May"
FIXED = "[0] user: Hi Mika! My sister Hana lives in Otaru now. 区切りのあとも覚えていてね。"
PROSE = "What a lovely time they had together, talking about so many things."


def seed(store: Store, turns: int = 160) -> Kioku:
    """A conversation that folded at least once, with a tic in most of the last 20 replies.
    Its chronicler's model answers prose, never the chronicler's format: every summary is an
    extractive stand-in, which the console marks."""
    clock = Clock(time.time() - 10 * turns)
    counter = ScriptEstimator()
    chronicler = LLMChronicler(ScriptedModel(default=PROSE), counter, ExtractiveSummarizer(counter))
    kk = Kioku(
        store,
        profile=LOCAL_8K,
        clock=clock,
        tenant=TENANT,
        layers=Layers(store),
        counter=counter,
        summarizer=chronicler,
    )
    conv = kk.conversation(CID, system_prompt="You are Mika.", character="Mika")
    for i in range(turns):
        clock.advance(10)
        conv.prepare(FIRST if i == 0 else f"{FILLER[i % 5]} ({i})")
        tic = f" {TIC}" if i >= turns - 14 else ""
        conv.record(f"{FILLER[(i + 2) % 5]} Reply {i}.{tic}")
        kk.worker.run_until_idle()
    assert conv.info().raw_start > 0, "the seeded conversation should have folded"
    return kk


@dataclass
class Served:
    base: str
    key: str
    store: Store
    kk: Kioku


def _browser_paths() -> tuple[str, str]:
    chromium = os.environ.get("KIOKU_CHROMIUM") or shutil.which("chromium") or ""
    driver = os.environ.get("KIOKU_CHROMEDRIVER") or shutil.which("chromedriver") or ""
    need(bool(chromium), "chromium is not installed (.ci/chromium.sh)")
    need(bool(driver), "chromedriver is not installed (.ci/chromium.sh)")
    return chromium, driver


def _cjk_fonts() -> bool:
    """A CJK font for the screenshots (Debian fonts-noto-cjk), or 記憶 renders as boxes."""
    if not shutil.which("fc-list"):
        return False
    found = subprocess.run(["fc-list", ":lang=ja", "family"], capture_output=True, text=True)
    return "CJK" in found.stdout


def screenshot(driver: Any, path: Path, width: int, height: int, mobile: bool) -> dict[str, int]:
    """The whole page at this viewport size as a PNG; returns page and viewport widths."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
    )
    time.sleep(0.3)  # one layout pass at the new size
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": min(size["height"], 8000),
                "scale": 1,
            },
        },
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    return dict(
        driver.execute_script(
            "const log = document.getElementById('log');"
            "return {page: document.documentElement.scrollWidth, view: window.innerWidth,"
            " log: log.scrollWidth, logBox: log.clientWidth};"
        )
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    need(importlib.util.find_spec("fastapi") is not None, "fastapi is not installed")
    import uvicorn

    from kioku.service.app import create_app
    from kioku.service.keys import create_key
    from kioku.service.upstream import Upstream

    url = f"sqlite:///{tmp_path / 'console.db'}"
    store = Store.open(url)
    kk = seed(store)
    _, key = create_key(store, TENANT)
    settings = Settings(db=url, profile=LOCAL_8K.name, tenant=TENANT)
    # the console never chats: the upstream is a closed port
    app = create_app(
        settings, store=store, upstream=Upstream("http://127.0.0.1:9/v1", LOCAL_8K), worker=False
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield Served(f"http://127.0.0.1:{port}", key, store, kk)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        store.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    chromium, driver_path = _browser_paths()
    need(importlib.util.find_spec("selenium") is not None, "selenium is not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1500,1500",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=DriverService(executable_path=driver_path), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class Page:
    """Small helpers over the driver: find by id / data-testid, wait for a condition."""

    def __init__(self, driver: Any) -> None:
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.d = driver
        self.By = By
        # the page re-renders a list while a condition reads it: an element gone stale means
        # "not yet", not a failure
        self.wait = WebDriverWait(
            driver,
            20,
            poll_frequency=0.1,
            ignored_exceptions=(StaleElementReferenceException, IndexError),
        )

    def id(self, element_id: str) -> Any:
        return self.d.find_element(self.By.ID, element_id)

    def all(self, testid: str) -> list[Any]:
        return list(self.d.find_elements(self.By.CSS_SELECTOR, f'[data-testid="{testid}"]'))

    def until(self, cond: Any, what: str) -> Any:
        try:
            return self.wait.until(lambda _d: cond())
        except Exception as e:
            errors = self.d.find_elements(self.By.ID, "error")
            shown = errors[0].text if errors and errors[0].is_displayed() else ""
            raise AssertionError(f"waiting for {what}: {type(e).__name__} {shown}") from e

    def visible(self, element_id: str) -> bool:
        found = self.d.find_elements(self.By.ID, element_id)
        return bool(found) and found[0].is_displayed()


def test_console_reads_memory_edits_notes_cuts_and_shows_alerts_and_log(
    served: Served, browser: Any, tmp_path: Path
) -> None:
    need(_cjk_fonts(), "no CJK font: apt-get install fonts-noto-cjk (.ci/chromium.sh)")
    store, kk = served.store, served.kk
    p = Page(browser)
    browser.get(f"{served.base}/console/")

    # a wrong key is refused and the key form stays
    p.until(lambda: p.visible("api-key"), "the key form")
    p.id("api-key").send_keys("kioku_nope_nope")
    p.id("key-submit").click()
    p.until(lambda: p.visible("error") and "401" in p.id("error").text, "the 401 message")
    assert p.visible("api-key") and not p.visible("app")

    p.id("api-key").send_keys(served.key)
    p.id("key-submit").click()
    p.until(lambda: p.all("conversation"), "the conversation list")
    (button,) = p.all("conversation")
    assert button.get_attribute("data-id") == CID
    assert button.text.endswith(("just now", "min ago")), button.text  # last activity

    # the list filters as you type
    p.id("conv-filter").send_keys("nobody")
    p.until(lambda: not p.all("conversation") and p.visible("no-match"), "the filtered list")
    p.id("conv-filter").clear()
    p.id("conv-filter").send_keys("MIK")
    p.until(lambda: len(p.all("conversation")) == 1, "the list again")
    p.all("conversation")[0].click()

    # memory, with the seq range each item came from, line by line
    info = store.conversation(CID)
    items = store.items(CID, "active")
    p.until(lambda: len(p.all("memory-item")) == len(items), "every memory item")
    assert p.id("raw-start").text == str(info.raw_start)
    assert p.id("memory-version").text == str(info.memory_version)
    shown = p.all("memory-item")
    first = items[0]
    assert shown[0].get_attribute("data-first") == str(first.first_seq)
    assert shown[0].get_attribute("data-last") == str(first.last_seq)
    lines = shown[0].find_elements(p.By.CSS_SELECTOR, '[data-testid="item-line"] .line-text')
    assert [x.text.strip() for x in lines] == [x.strip() for x in first.text.split("\n") if x]
    # the model's summaries failed: each item standing in for one says so, and why
    marks = [stand_in(i.data) for i in items]
    assert all(marks), marks
    for element, mark in zip(shown, marks, strict=True):
        (badge,) = element.find_elements(p.By.CSS_SELECTOR, '[data-testid="stand-in"]')
        assert badge.text == f"stand-in (extractive: {mark})" and badge.is_displayed()

    # the transcript opens on the newest messages, each with its time
    p.until(lambda: p.all("message"), "the newest messages")
    newest = [int(m.get_attribute("data-seq")) for m in p.all("message")]
    assert newest[-1] == info.next_seq - 1
    assert all(t.text for t in p.all("message-time"))
    # each user turn says whether it was shown the past, and why
    notes = [n.text for n in p.all("recall-note")]
    assert notes and all(n.startswith(("recall on: ", "recall off: ")) for n in notes)

    def opening() -> str | None:  # the first message shown (None while the page loads)
        return next((m.get_attribute("data-seq") for m in p.all("message")), None)

    p.id("tr-start").click()
    p.until(lambda: opening() == "0", "the first page")
    p.id("tr-later").click()
    p.until(lambda: opening() == "100", "the next page")

    # a chapter's range opens its source messages, rendered as text (never as HTML)
    shown[0].find_element(p.By.CSS_SELECTOR, '[data-testid="source-link"]').click()
    p.until(lambda: opening() == str(first.first_seq), "the source messages")
    seqs = [int(m.get_attribute("data-seq")) for m in p.all("message")]
    assert seqs == list(range(first.first_seq, min(first.last_seq, first.first_seq + 99) + 1))
    assert "<b>not bold</b>" in p.all("message")[0].text
    bold = [b.text for b in browser.find_elements(p.By.CSS_SELECTOR, "#messages b")]
    assert "not bold" not in bold

    # archive search finds the first message; its hit opens the transcript around it
    p.id("search-q").send_keys("Hana Sapporo")
    p.id("search-go").click()
    p.until(lambda: p.all("search-hit"), "the search hits")
    hit = p.all("search-hit")[0]
    assert hit.get_attribute("data-seq") == "0" and "Sapporo" in hit.text
    hit.find_element(p.By.CSS_SELECTOR, '[data-testid="hit-open"]').click()
    p.until(lambda: browser.find_elements(p.By.CSS_SELECTOR, "#messages li.marked"), "the hit")

    # tic alerts: what the guard finds is on the page
    alerts = kk.layers.tic_alerts(CID)
    assert alerts, "the planted tic should raise an alert"
    p.until(lambda: p.all("tic"), "the tic alerts")
    assert [t.get_attribute("data-phrase") for t in p.all("tic")] == [a.phrase for a in alerts]
    assert "kidding" in p.all("tic")[0].text

    # the pending summary jobs, as the store has them
    queued = store.jobs(CID, "queued", "running")
    p.until(lambda: len(p.all("job-row")) == len(queued), "the jobs")
    assert p.visible("no-jobs") == (not queued)

    # the compaction log, newest first
    log = store.log_entries(CID)
    p.until(lambda: len(p.all("log-row")) == len(log), "every log row")
    events = [r.get_attribute("data-event") for r in p.all("log-row")]
    assert events == [e["event"] for e in reversed(log)] and "fold" in events

    # correct one line of memory and retract another: pending until the next fold
    target = p.all("memory-item")[0]
    item_id = int(target.get_attribute("data-id"))
    rows = target.find_elements(p.By.CSS_SELECTOR, '[data-testid="item-line"]')
    wrong = rows[0].find_element(p.By.CSS_SELECTOR, ".line-text").text.strip()
    gone = rows[1].find_element(p.By.CSS_SELECTOR, ".line-text").text.strip()
    rows[0].find_element(p.By.CSS_SELECTOR, '[data-testid="line-edit"]').click()
    edit = p.all("line-input")[0]
    edit.clear()
    edit.send_keys(FIXED)
    p.all("line-save")[0].click()
    p.until(lambda: p.all("pending-edit"), "the pending correction")
    row = p.all("memory-item")[0].find_elements(p.By.CSS_SELECTOR, '[data-testid="item-line"]')[1]
    row.find_element(p.By.CSS_SELECTOR, '[data-testid="line-retract"]').click()
    p.all("line-retract-confirm")[0].click()
    p.until(lambda: "retract" in p.all("pending-edit")[0].text, "the pending retraction")
    assert store.items(CID, "active")[0].text == first.text  # not in the prompt yet

    # edit a note, save, and find it again after a reload
    area = p.id("notes-text")
    original = area.get_attribute("value") or ""
    area.send_keys("this is not a note line\n")  # refused with kioku's message, nothing saved
    p.id("notes-save").click()
    p.until(lambda: p.visible("error") and "not `- [kind]" in p.id("error").text, "the refusal")
    area.clear()
    area.send_keys(original + NOTE + "\n")
    p.id("notes-save").click()
    p.until(lambda: "1 added" in p.id("notes-status").text, "the save confirmation")

    # the next turn folds the correction in: after a reload, memory shows it, marked
    assert isinstance(kk.clock, Clock)
    kk.clock.advance(time.time() - kk.clock())  # the seeded clock catches up with the service's
    conv = kk.conversation(CID)
    conv.prepare("Do you still remember my sister?")
    conv.record("Of course I do.")
    browser.refresh()
    p.until(lambda: NOTE in (p.id("notes-text").get_attribute("value") or ""), "the saved note")
    assert "lighthouse in May" in p.id("notes-current").get_attribute("textContent")
    p.until(lambda: p.all("operator-badge"), "the corrected item")
    fixed = p.all("memory-item")[0]
    assert int(fixed.get_attribute("data-id")) != item_id  # a revision, the old item retired
    texts = [
        x.text.strip()
        for x in fixed.find_elements(p.By.CSS_SELECTOR, '[data-testid="item-line"] .line-text')
    ]
    assert texts[0] == FIXED and gone not in texts and wrong not in texts
    assert not p.all("pending-edit")

    # cut: the raw window starts now, and the page says so
    before = int(p.id("raw-start").text)
    p.id("cut-button").click()
    p.until(lambda: p.visible("cut-confirm"), "the cut confirmation")
    p.id("cut-confirm").click()
    p.until(lambda: p.visible("cut-result"), "the cut result")
    after = store.conversation(CID)
    assert after.raw_start == after.next_seq > before
    assert f"starts at seq {after.raw_start} (was {before})" in p.id("cut-result").text
    p.until(lambda: p.id("raw-start").text == str(after.raw_start), "the new raw window start")
    p.until(lambda: "cut" in [r.get_attribute("data-event") for r in p.all("log-row")], "cut row")
    assert len(p.all("memory-item")) == len(store.items(CID, "active"))

    # screenshots at desktop and phone widths: nothing is wider than the screen
    folder = Path(os.environ.get("KIOKU_CONSOLE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    last_item = p.all("memory-item")[-1]  # the cut's chapter and its messages, for the picture
    last_item.find_element(p.By.CSS_SELECTOR, '[data-testid="source-link"]').click()
    p.until(lambda: p.all("message"), "the cut's source messages")
    for name, width, height, mobile in (
        ("console-desktop.png", 1400, 1000, False),
        ("console-phone.png", 390, 844, True),
    ):
        sizes = screenshot(browser, folder / name, width, height, mobile)
        assert (folder / name).stat().st_size > 10_000
        assert sizes["page"] <= sizes["view"], f"{name}: the page is wider than the screen"
        assert sizes["log"] <= sizes["logBox"], f"{name}: the compaction log is clipped"

    # no script error on the way; the refused key (401), note (400) are the expected failures
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    expected = ("status of 401", "status of 400")
    assert [m for m in severe if not any(x in m for x in expected)] == []


def test_console_deletes_a_conversation_after_asking(served: Served, browser: Any) -> None:
    """Delete… asks first (Cancel keeps it); Delete now removes every row of it (issue 42)."""
    p = Page(browser)
    browser.get(f"{served.base}/console/")
    p.until(lambda: p.visible("api-key"), "the key form")
    p.id("api-key").send_keys(served.key)
    p.id("key-submit").click()
    p.until(lambda: p.all("conversation"), "the conversation list")
    p.all("conversation")[0].click()
    p.until(lambda: p.visible("delete-button"), "the conversation")
    p.id("delete-button").click()
    p.until(lambda: p.visible("delete-confirm-box"), "the question")
    p.id("delete-cancel").click()
    p.until(lambda: not p.visible("delete-confirm-box"), "the question to go")
    assert served.store.find_conversation(TENANT, CID).next_seq > 0
    p.id("delete-button").click()
    p.until(lambda: p.visible("delete-confirm"), "the question again")
    p.id("delete-confirm").click()
    p.until(lambda: not p.all("conversation") and p.visible("empty"), "the emptied list")
    assert served.store.conversations(TENANT) == []
    assert served.store.tenant_counts() == {}


def test_console_forgets_a_message_and_its_notes(served: Served, browser: Any) -> None:
    """The Forget button on a message deletes it as `DELETE …/messages/{seq}` does: the note
    taken from it is retracted, the log keeps it as a version."""
    from kioku.notes import current_notes

    store = served.store
    assert [n for n in current_notes(store.note_ledger(CID)) if n.source_seq == 0]
    p = Page(browser)
    browser.get(f"{served.base}/console/")
    p.until(lambda: p.visible("api-key"), "the key form")
    p.id("api-key").send_keys(served.key)
    p.id("key-submit").click()
    p.until(lambda: p.all("conversation"), "the conversation list")
    p.all("conversation")[0].click()
    p.until(lambda: p.all("message"), "the newest messages")
    p.id("tr-start").click()
    p.until(lambda: p.all("message")[0].get_attribute("data-seq") == "0", "the first page")
    first = p.all("message")[0]
    first.find_element(p.By.CSS_SELECTOR, '[data-testid="forget"]').click()
    p.until(lambda: browser.switch_to.alert, "the confirmation").accept()
    p.until(lambda: "deleted" in (p.all("message")[0].get_attribute("class") or ""), "deleted")
    assert store.entries(CID, 0, 0)[0].message.is_empty()
    assert store.message_versions(CID, 0)[0]["text"] == FIRST
    assert not [n for n in current_notes(store.note_ledger(CID)) if n.source_seq == 0]
    assert "Sapporo" not in store.notes_snapshot(CID)

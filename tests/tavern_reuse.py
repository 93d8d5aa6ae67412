"""How much of each prompt the upstream can reuse from the one before, with SillyTavern's
default settings and a lorebook card, as the upstream receives the prompts (issue 22).

SillyTavern's defaults change the card on most turns: keyword-triggered lorebook entries come
and go with the last two messages, and example dialogue is pushed out as the chat grows. This
drives the real SillyTavern 1.12.6 (headless Chromium, the kioku extension installed, every
other setting its default: 4,095-token context, gradual push-out, world-info scan depth 2)
through `kioku serve --profile local-8k --window 4096 --summary-delay 0` for N turns, twice:
kioku as it is (`after`: the extension's marked parts sent after the chat, examples pinned)
and with `--card-as-sent` (`before`). Each prompt the upstream got is rendered as ChatML (what
a llama.cpp slot caches), and a turn's reuse is the share of its characters in the prefix it
shares with the previous prompt.

    python -m tests.tavern_reuse --turns 43 --card seraphina --json
    python -m tests.tavern_reuse --turns 43 --card mika --json   # example dialogue, global lore

Needs `.ci/sillytavern.sh` and Chromium, like the SillyTavern tests. Not run by the test suite
(two SillyTavern runs take a few minutes); `tests/test_sillytavern.py` checks the behaviour.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kioku.profiles import get_profile
from tests.tavern import SillyTavern, Tavern
from tests.tavern_stack import running

LINES = [
    "Tell me more about the forest around us.",
    "I rub my eyes. How long was I asleep?",
    "What are those beasts that attacked me?",
    "Thank you for the tea. It tastes of honey and mint.",
    "Is this glade really a safe haven?",
    "I tell you about my village by the sea and my sister Ana.",
    "Can your magic heal the wound on my arm?",
    "I look out of the window at the stars for a while.",
    "Where does Eldoria end?",
    "I hum a song my mother taught me, about a boat.",
    "Do the monsters come out at night?",
    "I sit quietly and listen to the rain on the roof.",
]
MIKA_EXAMPLES = "\n".join(
    f"<START>\n{{{{user}}}}: {q}\n{{{{char}}}}: *Mika flicks her tail.* {a}"
    for q, a in [
        (
            "Who are you?",
            "I'm Mika, keeper of the acorn stores and the fastest climber in the "
            "wood. Everyone who gets lost here ends up asking me the way, sooner or later.",
        ),
        (
            "Is the forest dangerous?",
            "Only for those who don't listen. The old oaks whisper "
            "when beasts are near, and I always listen. You should, too, traveller.",
        ),
        (
            "What do you eat?",
            "Acorns, mostly. Hazelnuts when I'm lucky. Once a travelling "
            "merchant gave me a whole honey cake, and I still dream about it every winter.",
        ),
        (
            "Do you have friends?",
            "Seraphina, of course, and the owl who lives above the "
            "spring. He pretends to be grumpy, but he saves me the best pine cones.",
        ),
    ]
)


def render(messages: Sequence[dict[str, Any]]) -> str:
    """A prompt as a ChatML template writes it (what a llama.cpp slot caches)."""
    return "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n"
                   for m in messages)  # fmt: skip


def shared(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def measure(prompts: Sequence[Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """Per turn after the first: reuse (shared prefix / prompt), characters read again, and
    whether the first difference lies in the system message (the card: everything re-read)."""
    reuse, reread, breaks = [], [], 0
    for prev, cur in zip(prompts, prompts[1:], strict=False):
        a, b = render(prev), render(cur)
        k = shared(a, b)
        reuse.append(k / len(b))
        reread.append(len(b) - k)
        if k < len(render(cur[:1])):
            breaks += 1
    return {
        "turns": len(prompts),
        "reuse_mean": round(statistics.fmean(reuse), 4),
        "reuse_median": round(statistics.median(reuse), 4),
        "card_breaks": breaks,
        "reread_chars_mean": round(statistics.fmean(reread)),
        "prompt_chars_mean": round(statistics.fmean(len(render(p)) for p in prompts)),
    }


def with_mika(t: SillyTavern) -> None:
    t.add_character("Mika", "*A squirrel spirit peers down at you.* Oh! You're awake.",
                    "Mika is a cheerful squirrel spirit of the forest of Eldoria.")  # fmt: skip
    card = t.data / "default-user" / "characters" / "Mika.png"
    from tests.tavern import card_png

    data = {"name": "Mika", "description": "Mika is a cheerful squirrel spirit of the forest "
            "of Eldoria.", "personality": "curious, quick", "scenario": "",
            "first_mes": "*A squirrel spirit peers down at you.* Oh! You're awake.",
            "mes_example": MIKA_EXAMPLES}  # fmt: skip
    card.write_bytes(card_png({**data, "spec": "chara_card_v2", "spec_version": "2.0",
                               "data": {**data, "extensions": {}}}))  # fmt: skip
    settings = t.data / "default-user" / "settings.json"
    s = json.loads(settings.read_text())
    s["world_info_settings"]["world_info"]["globalSelect"] = ["Eldoria"]
    settings.write_text(json.dumps(s, indent=2))


def run(turns: int, card: str, card_as_sent: bool, browser: Any, tmp: Path) -> dict[str, Any]:
    profile = replace(get_profile("local-8k", 4096), summary_delay_s=0.0, reply_timeout_s=30.0)
    setup = with_mika if card == "mika" else None
    name = "Mika" if card == "mika" else "Seraphina"
    with running(tmp, context=4095, profile=profile, card_as_sent=card_as_sent,
                 setup=setup) as stack:  # fmt: skip
        t = Tavern(browser, stack.tavern.url)
        t.open()
        t.connect()
        t.select_character(name)
        for i in range(turns):
            t.send(f"{LINES[i % len(LINES)]} ({i})")
        stack.idle()
        prompts = [b["messages"] for b in stack.up.chats()]
        [conv] = stack.store.conversations("tavern")
        out = measure(prompts)
        out["card_changes"] = stack.store.counters(conv.id).get("card_changes", 0)
        logged = stack.store.log_entries(conv.id)
        out["card_log"] = [e["detail"] for e in logged if e["event"] == "card"][:5]
        out["folds"] = conv.memory_version
        return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=43)
    parser.add_argument("--card", choices=["seraphina", "mika"], default="seraphina")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--arm", choices=["before", "after", "both"], default="both")
    args = parser.parse_args(argv)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    from tests.test_console import _browser_paths

    chromium, driver_path = _browser_paths()
    result: dict[str, Any] = {"turns": args.turns, "card": args.card}
    with tempfile.TemporaryDirectory() as tmp:
        for arm, as_sent in (("before", True), ("after", False)):
            if args.arm not in (arm, "both"):
                continue
            opts = webdriver.ChromeOptions()
            opts.binary_location = chromium
            for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                      "--window-size=1500,1500", f"--user-data-dir={tmp}/{arm}-chromium"):  # fmt: skip
                opts.add_argument(a)
            driver = webdriver.Chrome(service=DriverService(executable_path=driver_path),
                                      options=opts)  # fmt: skip
            try:
                folder = Path(tmp) / arm
                folder.mkdir()
                result[arm] = run(args.turns, args.card, as_sent, driver, folder)
            finally:
                driver.quit()
            if not args.json:
                print(arm, result[arm], flush=True)
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()

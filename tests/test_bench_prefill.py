"""`kioku bench prefix --time-on URL`: each arm's prompts timed on a serving engine, in order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from kioku.bench.prefill import time_arms, time_prompts
from kioku.bench.prefix import run
from kioku.errors import ConfigError
from kioku.models import ChatMessage
from kioku.service.loopback import FakeUpstream
from tests.conftest import shared_file

if TYPE_CHECKING:
    from tests.llama import LlamaServer
# the llama_server fixture
pytest_plugins = ["tests.llama"]


def _prompt(*texts: str) -> list[ChatMessage]:
    return [ChatMessage("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]


def test_each_prompt_is_sent_in_order_for_one_token_and_refusals_are_not_timed() -> None:
    refuse = {"second"}

    def fail(body: dict[str, Any]) -> int | None:
        return 400 if body["messages"][-1]["content"] in refuse else None

    up = FakeUpstream(fail=fail).start()
    try:
        prompts = [_prompt("first"), _prompt("first", "ok", "second"), [], _prompt("third")]
        timed = time_prompts(up.url, prompts)
        chats = up.chats()
    finally:
        up.stop()
    got = timed.summary()
    assert [c["messages"][-1]["content"] for c in chats] == ["first", "second", "third"]
    assert all(c["max_tokens"] == 1 and c["temperature"] == 0 for c in chats)
    # the failed replay turn sent nothing, the refused one is counted, not timed
    assert got["turns"] == len(timed.seconds) == 2 and got["failed"] == 2
    assert got["prompt_tokens"] > 0
    assert got["max_s"] >= got["p90_s"] >= got["p50_s"] and min(timed.seconds) > 0


def test_arms_run_one_after_the_other_and_are_compared_with_the_baseline() -> None:
    up = FakeUpstream().start()
    try:
        arms = {
            "kioku": [_prompt("k1"), _prompt("k1", "r", "k2")],
            "sliding_window": [_prompt("s1"), _prompt("s1", "r", "s2")],
        }
        got = time_arms(up.url, arms, full_from={"kioku": None, "sliding_window": 1})
        order = [c["messages"][-1]["content"] for c in up.chats()]
    finally:
        up.stop()
    # never interleaved: a one-slot engine keeps the arm's own previous prompt
    assert order == ["k1", "k2", "s1", "s2"]
    assert got["kioku"]["turns"] == got["sliding_window"]["turns"] == 2
    assert got["kioku_vs_sliding_window"] > 0
    # once full (from its second turn) the sliding window has one timed turn: one value
    sw = got["sliding_window"]
    assert 0 < sw["p50_s_full"] == sw["p90_s_full"] <= sw["max_s"]
    assert got["kioku"]["p50_s_full"] is None
    assert got["kioku_p90_vs_sliding_window_p50_full"] > 0


def test_an_engine_that_is_not_there_is_a_clear_error() -> None:
    up = FakeUpstream().start()
    url = up.url
    up.stop()  # the port is closed now
    with pytest.raises(ConfigError, match="--time-on"):
        time_prompts(url, [_prompt("hello")], timeout_s=5)
    with pytest.raises(ConfigError, match="--time-on"):  # before the replay, not after it
        run(shared_file("datasets", "locomo", "locomo10.json"), "locomo", time_on=url)


@pytest.mark.slow
@pytest.mark.llama
def test_a_replay_is_timed_on_a_real_llama_cpp_server(llama_server: LlamaServer) -> None:
    locomo = shared_file("datasets", "locomo", "locomo10.json")
    out = run(locomo, "locomo", window=4096, max_turns=4, time_on=f"{llama_server.url}/v1")
    timed = out["prefill_time"]
    for arm in ("kioku", "sliding_window"):
        # every prompt the replay built is one the engine takes, through its chat template
        assert timed[arm]["turns"] == out["turns"] == 4 and timed[arm]["failed"] == 0
        assert timed[arm]["prompt_tokens"] > 0
    assert timed["kioku_vs_sliding_window"] > 0

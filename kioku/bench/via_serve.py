"""Replaying a conversation through a real `kioku serve`, the path users take.

`kioku bench prefix --via serve` measures the proxy as shipped: the FastAPI app behind uvicorn
on loopback, every layer on (recall, notes, tics), the default token counter calibrated from the
upstream's `usage`, and a scripted upstream that answers each turn with the dataset's recorded
reply and reports the prompt's true length (ChatML, Qwen2.5) as `usage.prompt_tokens`, as a
llama.cpp server would. What the upstream receives is the prompt a serving engine caches.

Time is simulated, as in the in-process replay: the server's engine and the summary worker read
one shared clock that advances `turn_seconds` per turn, and the worker runs between turns (as a
`kioku worker` process would, on the same database), so summaries are exactly as late as the
profile says and the replay is deterministic.

Two clients: stateless (the whole transcript every turn, as SillyTavern sends it) and stateful
(only the new message, `X-Kioku-Mode: stateful`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import httpx

from kioku.config import Settings, build_kioku
from kioku.context import RECALL_KEY
from kioku.datasets import Transcript
from kioku.engine import Kioku
from kioku.messages import Message
from kioku.models import ChatMessage
from kioku.profiles import Profile
from kioku.store import Store

Mode = Literal["stateless", "stateful"]
CONVERSATION = "bench"


class ServeReplay:
    """One conversation replayed through a `kioku serve` on loopback.

    `drive(users, replies)` sends one turn and returns what the upstream received (the prompt),
    the memory version the server reported, and whether the turn failed (a non-200 answer)."""

    def __init__(
        self,
        transcript: Transcript,
        profile: Profile,
        *,
        mode: Mode,
        clock: list[float],
        prompt_tokens: Callable[[list[ChatMessage]], int],
        layers: bool = True,
        tokenizer: str = "estimate",
    ) -> None:
        from kioku.service.app import create_app
        from kioku.service.keys import create_key
        from kioku.service.loopback import FakeUpstream, ServerThread

        self.transcript = transcript
        self.mode = mode
        self.profile = profile
        self._prompt_tokens = prompt_tokens
        self._reply = ""
        self._tmp = tempfile.TemporaryDirectory(prefix="kioku-bench-")
        url = f"sqlite:///{Path(self._tmp.name) / 'serve.db'}"
        self.store = Store.open(url)
        self.upstream = FakeUpstream(reply=self._answer).start()
        self.settings = Settings(
            db=url,
            profile=profile.name.split("@")[0],
            window=profile.window,
            llm_url=self.upstream.url,
            tokenizer=tokenizer,
            layers=layers,
        )

        def make(tenant: str, store: Store) -> Kioku:
            # the simulated clock, and summaries as slow as the profile says
            return build_kioku(
                self.settings.with_(tenant=tenant),
                store=store,
                clock=lambda: clock[0],
                simulated_duration_s=profile.summary_duration_s,
            )

        self.worker = make("-bench-worker-", self.store)
        app = create_app(
            self.settings, store=self.store, make_kioku=make, worker=False, profile=profile
        )
        self.server = ServerThread(app).start()
        _, key = create_key(self.store, "bench")
        self.http = httpx.Client(
            base_url=self.server.url,
            headers={
                "Authorization": f"Bearer {key}",
                "X-Kioku-Conversation": CONVERSATION,
                "X-Kioku-Mode": mode,
            },
            timeout=120,
        )
        self.history: list[dict[str, str]] = []
        self.system = (
            [{"role": "system", "content": transcript.system_prompt}]
            if transcript.system_prompt
            else []
        )

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = [ChatMessage(m["role"], m["content"]) for m in body["messages"]]
        return {
            "id": "chatcmpl-replay",
            "object": "chat.completion",
            "model": "replay",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self._reply},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": self._prompt_tokens(messages),
                "completion_tokens": max(1, len(self._reply) // 3),
            },
        }

    def drive(
        self, users: list[Message], replies: list[Message]
    ) -> tuple[list[ChatMessage], str, int | None, bool, bool]:
        """One turn: the user's messages (the last one is answered) and the recorded reply.
        Returns the prompt the upstream received, the reply, the memory version, whether the
        turn failed, and whether it carried recollections (the turn's account of recall, kept
        with the stored message: `kioku.recall.need`)."""
        user = {"role": "user", "content": "\n".join(m.text for m in users)}
        self._reply = "\n".join(r.text for r in replies) or "…"
        sent = (
            [*self.system, *self.history, user]
            if self.mode == "stateless"
            else [
                *self.system,
                user,
            ]
        )
        before = len(self.upstream.chats())
        r = self.http.post("/v1/chat/completions", json={"model": "replay", "messages": sent})
        self.history.append(user)
        chats = self.upstream.chats()
        if r.status_code != 200 or len(chats) == before:
            return [], "", None, True, False
        self.history.append({"role": "assistant", "content": self._reply})
        prompt = [ChatMessage(m["role"], m["content"]) for m in chats[-1]["messages"]]
        version = r.headers.get("x-kioku-memory-version")
        recalled = self._recalled(int(r.headers.get("x-kioku-seq", "-1")))
        self.worker.worker.run_until_idle()
        return prompt, self._reply, int(version) if version else None, False, recalled

    def _recalled(self, seq: int) -> bool:
        info = self.store.conversations()
        if seq < 0 or not info:
            return False
        entries = self.store.entries_at(info[0].id, [seq])
        note = entries[0].meta.get(RECALL_KEY) if entries and entries[0].meta else None
        return bool(note and note.get("on"))

    def counters(self) -> dict[str, int]:
        info = self.store.conversations()
        return self.store.counters(info[0].id) if info else {}

    def close(self) -> None:
        self.http.close()
        self.server.stop()
        self.upstream.stop()
        self.worker.close()
        self.store.close()
        self._tmp.cleanup()

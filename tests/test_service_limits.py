"""What the service admits: a body limit (413 before parsing), a cap on messages, bodies that are
not JSON (415), JSON kioku cannot store or forward (lone surrogates, NaN, Infinity, numbers past
64 bits, bytes that are not UTF-8: 400), conversation ids with a documented charset, and fuzzing
with all of those. Every refusal stores nothing and leaves the keep-alive connection usable."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kioku.ids import is_valid_id, key_for
from tests.helpers import store_unchecked_conversation
from tests.test_service_support import Harness, running

LIMIT = 64 * 1024
MAX_MESSAGES = 50


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """A service with small limits, so that crossing them is cheap."""
    db = f"sqlite:///{Path(tmp_path_factory.mktemp('limits')) / 'kioku.db'}"
    with running(db, max_body_bytes=LIMIT, max_messages=MAX_MESSAGES) as h:
        yield h


class Raw:
    """One keep-alive HTTP/1.1 connection, byte for byte: what a refusal does to it shows."""

    def __init__(self, h: Harness) -> None:
        host, port = h.url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.file = self.sock.makefile("rb")
        self.auth = f"Bearer {h.key('acme')}"

    def post(
        self,
        body: bytes,
        cid: str = "raw-1",
        content_type: str | None = "application/json",
        chunked: bool = False,
    ) -> tuple[int, dict[str, str], bytes]:
        head = [
            "POST /v1/chat/completions HTTP/1.1",
            "Host: kioku",
            f"Authorization: {self.auth}",
            f"X-Kioku-Conversation: {cid}",
        ]
        if content_type:
            head.append(f"Content-Type: {content_type}")
        if chunked:
            head.append("Transfer-Encoding: chunked")
            payload = b"".join(
                f"{len(body[i : i + 8192]):x}\r\n".encode() + body[i : i + 8192] + b"\r\n"
                for i in range(0, len(body), 8192)
            )
            payload += b"0\r\n\r\n"
        else:
            head.append(f"Content-Length: {len(body)}")
            payload = body
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        status = int(self.file.readline().split()[1])
        headers: dict[str, str] = {}
        while (line := self.file.readline().decode("latin-1").strip()) != "":
            k, v = line.split(":", 1)
            headers[k.lower()] = v.strip()
        return status, headers, self.file.read(int(headers.get("content-length", "0")))

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def chat_body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **extra}


def encoded(body: dict[str, Any]) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


def stored(h: Harness, cid: str) -> list[str]:
    try:
        return h.texts(cid)
    except Exception:
        return []


def test_a_body_over_the_limit_is_refused_before_it_is_read(small: Harness) -> None:
    big = encoded(chat_body("x" * (LIMIT + 1)))
    conn = Raw(small)
    try:
        status, headers, body = conn.post(big, cid="big-1")
        assert status == 413 and headers["connection"] == "close"
        assert "over 0.0625 MiB" in json.loads(body)["error"]["message"]
    finally:
        conn.close()
    conn = Raw(small)  # a body without a length is counted as it arrives
    try:
        status, _, body = conn.post(big, cid="big-1", chunked=True)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    finally:
        conn.close()
    assert stored(small, "big-1") == []


def test_more_messages_than_the_cap_are_refused(small: Harness) -> None:
    messages = [{"role": "user", "content": f"m{i}"} for i in range(MAX_MESSAGES + 1)]
    with small.http() as h:
        r = h.post(
            "/v1/chat/completions",
            headers={"X-Kioku-Conversation": "many-1"},
            json={"messages": messages},
        )
    assert r.status_code == 413 and f"at most {MAX_MESSAGES}" in r.json()["error"]["message"]
    assert stored(small, "many-1") == []


def test_a_message_that_can_never_fit_is_refused_and_stored_by_no_retry(small: Harness) -> None:
    """It used to answer 400 "(stored as seq 0)", and each retry stored another copy."""
    body = chat_body("word " * 6000)  # more tokens than the test profile's whole window
    with small.http() as h:
        for _ in range(3):
            r = h.post(
                "/v1/chat/completions", headers={"X-Kioku-Conversation": "huge-1"}, json=body
            )
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "context_length_exceeded"
            assert "nothing was stored" in r.json()["error"]["message"]
        r = h.post(
            "/v1/chat/completions", headers={"X-Kioku-Conversation": "huge-1"}, json=chat_body()
        )
        assert r.status_code == 200
    assert stored(small, "huge-1") == ["hello", "(reply to: hello)"]


HOSTILE = {
    "lone surrogate in content": b'{"messages": [{"role": "user", "content": "hi \\udc80"}]}',
    "lone surrogate in name": b'{"messages": [{"role": "user", "content": "hi", "name": "\\ud800"}]}',
    "lone surrogate in user": b'{"user": "\\udfff", "messages": [{"role": "user", "content": "hi"}]}',
    "lone surrogate in system": b'{"messages": [{"role": "system", "content": "\\udc80"},'
    b' {"role": "user", "content": "hi"}]}',
    "NaN": b'{"temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}',
    "Infinity": b'{"top_p": -Infinity, "messages": [{"role": "user", "content": "hi"}]}',
    "a float past a double": b'{"temperature": 1e999, "messages": [{"role": "user", "content": "hi"}]}',
    "an int past 64 bits": b'{"seed": 18446744073709551616, "messages": [{"role": "user", "content": "hi"}]}',
    "an int of 5000 digits": b'{"seed": '
    + b"9" * 5000
    + b', "messages": [{"role": "user", "content": "hi"}]}',
    "bytes that are not UTF-8": b'{"messages": [{"role": "user", "content": "hi \xff\xfe"}]}',
    "not JSON": b"messages: hi",
    "a JSON array": b"[1, 2]",
    # a RecursionError (500) on 36c9307, wherever the nesting was
    "nested 1,000 deep in a field": b'{"metadata": '
    + b"[" * 1000
    + b"]" * 1000
    + b', "messages": [{"role": "user", "content": "hi"}]}',
    "nested 1,000 deep in content": b'{"messages": [{"role": "user", "content": '
    + b"[" * 1000
    + b"]" * 1000
    + b"}]}",
    "nested 1,000 deep in a tool's parameters": b'{"tools": [{"type": "function", "function": '
    + b'{"name": "f", "parameters": '
    + b'{"a": ' * 1000
    + b"1"
    + b"}" * 1000
    + b'}}], "messages": [{"role": "user", "content": "hi"}]}',
    "nested 1,000 deep and never closed": b'{"messages": ' + b"[" * 1000,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_input_kioku_cannot_store_gets_400_and_the_connection_stays(
    small: Harness, name: str
) -> None:
    cid = f"bad-{abs(hash(name)) % 10**8}"
    conn = Raw(small)
    try:
        status, _, body = conn.post(HOSTILE[name], cid=cid)
        assert status == 400, body
        assert json.loads(body)["error"]["message"]
        # the same connection serves the next request
        status, _, body = conn.post(encoded(chat_body("and now a good one")), cid=cid)
        assert status == 200, body
    finally:
        conn.close()
    assert stored(small, cid) == ["and now a good one", "(reply to: and now a good one)"]


def test_an_escaped_surrogate_pair_is_one_character_and_fine(small: Harness) -> None:
    conn = Raw(small)
    try:
        body = b'{"messages": [{"role": "user", "content": "a cat \\ud83d\\udc31"}]}'
        status, _, raw = conn.post(body, cid="pair-1")
        assert status == 200, raw
    finally:
        conn.close()
    assert stored(small, "pair-1")[0] == "a cat \U0001f431"


def test_a_body_without_a_json_content_type_says_so(small: Harness) -> None:
    conn = Raw(small)
    try:
        status, _, body = conn.post(encoded(chat_body()), cid="ct-1", content_type="text/plain")
        assert status == 415
        message = json.loads(body)["error"]["message"]
        assert "Content-Type: application/json" in message and "text/plain" in message
        status, _, _ = conn.post(
            encoded(chat_body()), cid="ct-1", content_type="application/json; charset=utf-8"
        )
        assert status == 200
    finally:
        conn.close()


@pytest.mark.parametrize(
    "cid",
    ["a/b", "..", "trailing ", "tab\there", "x" * 201, "50%", "q?x", "h#x", ".hidden"],
)
def test_any_chat_name_is_accepted_and_kept_under_an_id_a_url_carries(
    small: Harness, cid: str
) -> None:
    """A client names chats as it likes (SillyTavern: "Branch #60 - …"); a name a URL cannot
    carry is kept under an encoded id, which the response names and REST reaches."""
    with small.http() as h:  # in the `user` field: HTTP itself refuses some in a header
        r = h.post("/v1/chat/completions", json=chat_body(user=cid))
        assert r.status_code == 200, r.text
        kept = unquote(r.headers["X-Kioku-Conversation"])
        assert kept == key_for(cid) and is_valid_id(kept)
        assert (kept == cid) == is_valid_id(cid)
        assert "/" not in kept and len(kept) <= 200
        page = h.get(f"/v1/conversations/{quote(kept, safe='')}/messages")
        assert page.status_code == 200 and page.json()["data"][0]["text"] == "hello"
        again = h.post("/v1/chat/completions", json=chat_body(user=cid))  # the same id again
        assert unquote(again.headers["X-Kioku-Conversation"]) == kept
    assert key_for(cid + "!") != kept  # another name, another id


def test_ids_in_any_script_with_spaces_inside_are_reachable_by_rest(small: Harness) -> None:
    cid = "Mika - 2024-05-01 @12h30m (ミカ)"
    with small.http() as h:
        r = h.post(
            "/v1/chat/completions", headers={"X-Kioku-Conversation": cid.encode()}, json=chat_body()
        )
        assert r.status_code == 200
        page = h.get(f"/v1/conversations/{cid}/messages").json()
        assert [m["text"] for m in page["data"]][:1] == ["hello"]


def test_a_conversation_stored_before_the_rule_still_works(small: Harness) -> None:
    store_unchecked_conversation(small.store, "legacy/1", "acme")
    with small.http() as h:
        r = h.post(
            "/v1/chat/completions", headers={"X-Kioku-Conversation": "legacy/1"}, json=chat_body()
        )
    assert r.status_code == 200


# fuzzing ---------------------------------------------------------------------------------------

# JSON fragments as a careless client writes them: escapes of lone surrogates, bare NaN
string = st.one_of(
    st.text(max_size=40).map(json.dumps),
    st.sampled_from(['"\\udc80"', '"\\ud800x"', '"\\u0000"', '"\\ud83d\\udc31"']),
)
number = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats().map(lambda f: json.dumps(f, allow_nan=True)),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "9" * 400, "-0.0e-999"]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    content=string,
    name=string,
    field=st.sampled_from(["temperature", "top_p", "seed", "max_tokens", "presence_penalty"]),
    value=number,
    junk=st.one_of(st.none(), st.binary(max_size=60)),
    content_type=st.sampled_from(["application/json", "text/plain", None]),
)
def test_fuzzing_bodies_never_gets_a_server_error(
    small: Harness, content: str, name: str, field: str, value: str, junk: bytes | None,
    content_type: str | None,
) -> None:  # fmt: skip
    if junk is not None:
        body = junk
    else:
        body = (
            f'{{"{field}": {value}, "messages": [{{"role": "user", '
            f'"content": {content}, "name": {name}}}]}}'
        ).encode()
    conn = Raw(small)
    try:
        status, _, raw = conn.post(body, cid="fuzz-1", content_type=content_type)
        assert status < 500, raw
        status, _, raw = conn.post(encoded(chat_body("still alive?")), cid="fuzz-1")
        assert status == 200, raw
    finally:
        conn.close()


def test_json_nested_as_deep_as_a_request_needs_is_fine(small: Harness) -> None:
    """The depth limit (100) is far from what a real request nests: a tool's schema 40 deep."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        schema = {"type": "object", "properties": {"inner": schema}}
    body = chat_body(
        "a [bracketed] {text} with [[[ brackets ]]] in it",
        tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}],
    )
    conn = Raw(small)
    try:
        status, _, raw = conn.post(encoded(body), cid="deep-ok")
        assert status == 200, raw
    finally:
        conn.close()

"""kioku's conventions beside the protocol: endpoints a client library calls, kioku's own headers,
OpenAI's error object, and the parser the upstream shares with kioku's client."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import openai
import pytest

from kioku.service.conventions import REQUEST_HEADERS, RESPONSE_HEADERS
from tests import test_service_support as support
from tests.test_service_support import Harness

harness, service = support.harness, support.service

DOCS = Path(__file__).resolve().parent.parent / "docs" / "service.md"


def chat(h: Any, headers: dict[str, str], **body: Any) -> Any:
    body.setdefault("messages", [{"role": "user", "content": "hello"}])
    return h.post("/v1/chat/completions", headers=headers, json=body)


def test_models_by_id_like_openai(service: Harness) -> None:
    c = service.openai()
    m = c.models.retrieve("fake-model")
    assert m.id == "fake-model"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("gpt-17")
    err = e.value.body
    assert err["code"] == "model_not_found" and err["param"] == "model"  # type: ignore[index]
    assert "fake-model" in err["message"]  # type: ignore[index]


def test_legacy_completions_endpoint_is_a_clear_error(service: Harness) -> None:
    """kioku remembers chats; /v1/completions has none, and a pass-through would look like it
    works while nothing is remembered."""
    with pytest.raises(openai.NotFoundError) as e:
        service.openai().completions.create(model="m", prompt="Once upon a time")
    err = e.value.body
    assert err["code"] == "unsupported_endpoint"  # type: ignore[index]
    assert "is_chat_model=True" in err["message"]  # type: ignore[index]
    assert not [r for r in service.up.requests if "prompt" in r]  # nothing went upstream


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({"X-Kioku-Conversation": "h-1", "X-Kioku-Mode": "banana"}, "X-Kioku-Mode"),
        ({"X-Kioku-Conversation": "h-1", "X-Kioku-Conversaton": "typo"}, "X-Kioku-Conversaton"),
        ({"X-Kioku-Conversation": "x" * 1001}, "X-Kioku-Conversation"),
        ({"X-Kioku-Conversation": "h-1", "X-Kioku-Character": ""}, "X-Kioku-Character"),
    ],
)
def test_kiokus_own_headers_are_checked_before_anything_is_stored(
    service: Harness, headers: dict[str, str], param: str
) -> None:
    with service.http() as h:
        r = chat(h, headers)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"].lower() == param.lower() and err["code"] == "invalid_value"
    assert err["type"] == "invalid_request_error"
    with pytest.raises(Exception, match="no conversation"):
        service.store.conversation("h-1")
    assert not service.up.chats() or "h-1" not in str(service.up.chats()[-1])


def test_every_mode_kioku_knows_is_accepted_in_any_case(service: Harness) -> None:
    with service.http() as h:
        for mode in ("stateful", "Stateless"):
            r = chat(h, {"X-Kioku-Conversation": "h-2", "X-Kioku-Mode": mode})
            assert r.status_code == 200, r.text


def error_of(r: Any) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and isinstance(err["type"], str)
    assert err["code"] is None or isinstance(err["code"], str)
    return err  # type: ignore[no-any-return]


def test_every_error_is_openais_error_object_with_a_string_code(service: Harness) -> None:
    with service.http() as h, service.http(tenant=None) as anon:
        cases = {
            "no key": anon.get("/v1/conversations"),
            "no conversation": chat(h, {}),
            "bad body": h.post("/v1/chat/completions", json={"messages": "hi"}),
            "unknown route": h.get("/v1/nothing-here"),
            "unknown id": h.get("/v1/conversations/nobody/memory"),
        }
        service.up.fail = lambda body: 500
        cases["upstream down"] = chat(h, {"X-Kioku-Conversation": "err-1"})
        service.up.fail = None
        cases["too large"] = chat(
            h,
            {"X-Kioku-Conversation": "err-2"},
            messages=[{"role": "user", "content": support.words(1, 5000)}],
        )
    codes = {name: (r.status_code, error_of(r)["code"]) for name, r in cases.items()}
    assert codes == {
        "no key": (401, "invalid_api_key"),
        "no conversation": (400, None),
        "bad body": (400, "invalid_value"),
        "unknown route": (404, "unknown_url"),
        "unknown id": (404, "not_found"),
        "upstream down": (502, "upstream_error"),
        "too large": (400, "context_length_exceeded"),
    }
    assert error_of(cases["bad body"])["param"] == "messages"


def test_the_upstreams_own_refusal_reaches_the_client_with_its_code(service: Harness) -> None:
    def refuse(body: dict[str, Any]) -> int:
        return 400

    service.up.fail = refuse
    service.up.error = {"message": "tools are not supported", "type": "invalid_request_error",
                        "code": "unsupported_parameter", "param": "tools"}  # fmt: skip
    with pytest.raises(openai.BadRequestError) as e:
        service.openai().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], user="refused-1"
        )
    err = e.value.body
    assert "tools are not supported" in err["message"]  # type: ignore[index]
    assert (err["code"], err["param"]) == ("unsupported_parameter", "tools")  # type: ignore[index]


def test_a_broken_upstream_stream_is_an_error_event_not_a_stored_reply(service: Harness) -> None:
    service.up.garbage = b"data: {this is not json\n\n"
    with pytest.raises(openai.APIError, match="not JSON"):
        list(
            service.openai().chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], user="sse-1", stream=True
            )
        )
    assert service.texts("sse-1") == ["hi"]
    assert service.store.counters("sse-1")["upstream_errors"] == 1


def test_every_kioku_header_is_documented() -> None:
    docs = DOCS.read_text()
    table = docs[docs.index("## Headers") :]
    for h in (*REQUEST_HEADERS, *RESPONSE_HEADERS):
        assert re.search(rf"`{h.name}`", table), f"{h.name} is not in docs/service.md's table"
    in_code = set(
        re.findall(
            r'"(X-Kioku-[A-Za-z-]+)"', (DOCS.parent.parent / "kioku/service/proxy.py").read_text()
        )
    )
    assert in_code <= {h.name for h in RESPONSE_HEADERS}

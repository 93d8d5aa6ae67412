"""The REST API and its keys: shapes the console relies on, 401 without a key on every route,
another tenant refused on every route, fuzzing without a 5xx, the `keys` and `import` commands."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

from kioku.service.keys import KeyRing, list_keys
from kioku.store import Store
from tests import test_service_support as support
from tests.conftest import need
from tests.test_service_support import Harness

harness, service = support.harness, support.service

OPEN = {"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def chat(service: Harness, cid: str, text: str, tenant: str = "acme") -> Any:
    with service.http(tenant) as h:
        r = h.post(
            "/v1/chat/completions",
            headers={"X-Kioku-Conversation": cid},
            json={"messages": [{"role": "user", "content": text}]},
        )
    service.idle()
    return r


def routes(service: Harness, cid: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every route of the OpenAPI schema, filled in for conversation `cid`."""
    with service.http(None) as h:
        schema = h.get("/openapi.json").json()
    out = []
    for path, methods in schema["paths"].items():
        if path in OPEN:
            continue
        for method in methods:
            url = path.replace("{conversation_id}", cid).replace("{seq}", "0")
            url = url.replace("{item_id}", "1") + ("?q=secret" if path.endswith("/search") else "")
            kw: dict[str, Any] = {}
            if path.endswith("/notes"):
                kw["json"] = {"text": "- [fact] Mika: hijacked"}
            if path.endswith("/lines") and method == "post":
                kw["json"] = {"line": "a line", "text": None}
            if path.endswith("/rename"):
                kw["json"] = {"id": "taken over"}
            if path.endswith("/sync"):
                kw["json"] = {"messages": [{"role": "user", "content": "my secret is 1234"}]}
            if path.endswith("/positions"):
                url += "?seq=0"
            if path == "/v1/chat/completions":
                kw["json"] = {"messages": [{"role": "user", "content": "let me in"}]}
                kw["headers"] = {"X-Kioku-Conversation": cid}
            out.append((method.upper(), url, kw))
    assert len(out) >= 11, out
    return out


def test_every_route_wants_a_key(service: Harness) -> None:
    chat(service, "auth-1", "hello")
    revoked = service.key("gone")
    key_id = revoked.split("_")[1]
    from kioku.service.keys import revoke_key

    revoke_key(service.store, key_id)
    service.svc.keys = KeyRing(service.store)  # forget the cache: revocation is immediate here
    for method, url, kw in routes(service, "auth-1"):
        for headers in ({}, {"Authorization": "Bearer nonsense"}, {"Authorization": revoked}):
            with service.http(None) as h:
                r = h.request(
                    method, url, **{**kw, "headers": {**kw.get("headers", {}), **headers}}
                )
            assert r.status_code == 401, (method, url, headers, r.text)
            assert r.json()["error"]["type"] == "authentication_error"
        with service.http(None) as h:
            r = h.request(
                method,
                url,
                **{
                    **kw,
                    "headers": {**kw.get("headers", {}), "Authorization": f"Bearer {revoked}"},
                },
            )
        assert r.status_code == 401, (method, url, "revoked")
    assert service.texts("auth-1") == ["hello", "(reply to: hello)"]


def test_another_tenant_is_refused_everywhere(service: Harness) -> None:
    """Ids are per tenant: another tenant's routes under the same id reach nothing of this
    one's (404 until it creates its own), and its chat under that id starts its own
    conversation, without learning that the id is taken."""
    chat(service, "victim-1", "my secret is 1234")
    with service.http("acme") as h:
        h.put("/v1/conversations/victim-1/notes", json={"text": "- [fact] user: owns a boat"})
    victim = service.store.find_conversation("acme", "victim-1")
    notes_before = service.store.notes_snapshot(victim.id)
    by_chat_last = sorted(routes(service, "victim-1"), key=lambda r: r[1] == "/v1/chat/completions")
    for method, url, kw in by_chat_last:
        with service.http("mallory") as h:
            r = h.request(method, url, **kw)
        body = r.text
        assert "1234" not in body and "owns a boat" not in body, (method, url)
        if "/conversations/" in url:
            assert r.status_code == 404, (method, url, r.status_code, body)
            assert r.json()["error"]["type"] == "not_found_error"
        elif url == "/v1/chat/completions":
            assert r.status_code == 200, body  # mallory's own "victim-1"
        elif url == "/v1/conversations":
            assert r.json() == {"data": []} or all(c["id"] != "victim-1" for c in r.json()["data"])
        elif url == "/metrics":
            assert 'kioku_turns_total{tenant="mallory"} 0' in body
    # the user field reaches mallory's conversation too, never acme's
    with service.http("mallory") as h:
        r = h.post(
            "/v1/chat/completions",
            json={"user": "victim-1", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200
        seen = "\n".join(m["content"] for m in service.up.chats()[-1]["messages"])
        assert "1234" not in seen and "let me in" in seen
        mine = h.get("/v1/conversations/victim-1/messages").json()["data"]
        assert [m["text"] for m in mine] == ["let me in", "(reply to: let me in)", "hi",
                                              "(reply to: hi)"]  # fmt: skip
    service.idle()
    assert service.store.find_conversation("acme", "victim-1") == victim
    assert service.store.notes_snapshot(victim.id) == notes_before
    assert service.texts(victim.id) == ["my secret is 1234", "(reply to: my secret is 1234)"]
    theirs = service.store.find_conversation("mallory", "victim-1")
    assert theirs.id != victim.id and theirs.public_id == victim.public_id == "victim-1"


def test_conversations_and_paged_messages(service: Harness) -> None:
    for i in range(3):
        chat(service, "page-1", f"page {i}")
    with service.http() as h:
        convs = h.get("/v1/conversations").json()["data"]
        row = next(c for c in convs if c["id"] == "page-1")
        assert convs[0]["id"] == "page-1"  # the latest activity first
        assert row.pop("last_activity") > 0
        assert row == {
            "id": "page-1",
            "character": "",
            "messages": 6,
            "raw_start": 0,
            "memory_version": 0,
        }
        first = h.get("/v1/conversations/page-1/messages", params={"limit": 4}).json()
        assert [m["seq"] for m in first["data"]] == [0, 1, 2, 3]
        assert first["next_after"] == 3
        m = first["data"][0]
        assert set(m) >= {"seq", "role", "author", "at", "text", "parts", "deleted"}
        assert m["parts"] == [
            {"kind": "text", "text": "page 0", "speaker": None, "ref": None, "name": None}
        ]
        rest = h.get("/v1/conversations/page-1/messages", params={"after": 3, "limit": 4}).json()
        assert [m["seq"] for m in rest["data"]] == [4, 5] and rest["next_after"] is None
        assert h.get("/v1/conversations/page-1/messages", params={"limit": 0}).status_code == 400
        assert h.get("/v1/conversations/page-1/messages", params={"limit": 1001}).status_code == 400
        assert h.get("/v1/conversations/nope/messages").status_code == 404


def test_memory_notes_cut_tics_and_log(service: Harness) -> None:
    for i in range(24):  # enough to fill the window: a ready chapter folds when it is full
        chat(service, "mem-1", f"turn {i}: " + "the orchard lantern by the harbor " * 4)
        service.run_jobs()
    with service.http() as h:
        mem = h.get("/v1/conversations/mem-1/memory").json()
        assert mem["raw_start"] > 0 and mem["memory_version"] > 0
        assert set(mem) >= {
            "synopsis",
            "chapters",
            "notes",
            "notes_editable",
            "threads",
            "key_lines",
            "raw_start",
            "memory_version",
        }
        items = [mem["synopsis"], *mem["chapters"]] if mem["synopsis"] else mem["chapters"]
        assert items[0]["first_seq"] == 0 and items[-1]["last_seq"] == mem["raw_start"] - 1
        assert set(items[0]) == {
            "id",
            "kind",
            "first_seq",
            "last_seq",
            "text",
            "tokens",
            "source",
            "model",
            "prompt_version",
            "stale",
            "stand_in",
            "data",
        }
        r = h.put(
            "/v1/conversations/mem-1/notes",
            json={
                "text": mem["notes_editable"] + "- [promise] Mika: visit the lighthouse in May\n"
            },
        ).json()
        assert r["added"] == 1 and r["changed"] == 0 and r["retracted"] == 0
        assert "lighthouse" in r["notes_editable"]
        assert "lighthouse" in h.get("/v1/conversations/mem-1/memory").json()["notes"]
        r = h.put("/v1/conversations/mem-1/notes", json={"text": mem["notes_editable"]}).json()
        assert r["retracted"] == 1
        cut = h.post("/v1/conversations/mem-1/cut").json()
        info = service.store.conversation("mem-1")
        assert cut["raw_start"] == info.next_seq and cut["memory_version"] == info.memory_version
        assert cut["reasons"] and cut["reasons"][0].startswith("cut")
        tics = h.get("/v1/conversations/mem-1/tics").json()
        assert isinstance(tics["alerts"], list)
        for a in tics["alerts"]:
            assert set(a) >= {"phrase", "count", "window"}
        log = h.get("/v1/conversations/mem-1/log").json()["data"]
        assert {"fold", "cut"} <= {row["event"] for row in log}
        assert set(log[0]) >= {"event", "outcome", "first_seq", "last_seq", "at"}


def test_openapi_schema_and_console(service: Harness) -> None:
    with service.http(None) as h:
        schema = h.get("/openapi.json").json()
        assert "/v1/conversations/{conversation_id}/memory" in schema["paths"]
        assert schema["components"]["securitySchemes"]["kiokuKey"]["scheme"] == "bearer"
        if (Path(__file__).parent.parent / "kioku" / "console" / "index.html").exists():
            page = h.get("/console/")
            assert page.status_code == 200 and "<html" in page.text.lower()


@pytest.mark.slow
def test_fuzzing_the_api_finds_no_server_error(service: Harness) -> None:
    # a test dependency (pyproject's test extra): missing, it fails in CI rather than skip silently
    need(importlib.util.find_spec("schemathesis") is not None, "schemathesis is not installed")
    import schemathesis
    from schemathesis.checks import not_a_server_error

    chat(service, "fuzz-1", "a conversation to fuzz")
    schema = schemathesis.openapi.from_url(f"{service.url}/openapi.json")
    auth = {"Authorization": f"Bearer {service.key('acme')}"}
    tried = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(
            max_examples=12,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def check(case: Any) -> None:
            nonlocal tried
            if case.path_parameters and "conversation_id" in case.path_parameters and tried % 2:
                case.path_parameters["conversation_id"] = "fuzz-1"  # reach real data too
            response = case.call(base_url=service.url, headers=auth, timeout=30)
            tried += 1
            case.validate_response(response, checks=[not_a_server_error])

        check()
    assert tried >= 50


# commands --------------------------------------------------------------------------------------


def cli() -> Any:
    from kioku.cli import app, register_extensions

    register_extensions()
    return app


def test_keys_commands(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'keys.db'}"
    runner = CliRunner()
    app = cli()
    r = runner.invoke(app, ["keys", "create", "--db", db, "acme"])
    assert r.exit_code == 0, r.output
    key = r.output.strip().splitlines()[-1]
    store = Store.open(db)
    assert KeyRing(store).tenant(key) == "acme"
    [k] = list_keys(store)
    _, key_id, secret = key.split("_", 2)  # a url-safe secret may hold "_" itself
    assert key_id == k.id and secret not in str(store.engine.url)  # the key is not stored
    r = runner.invoke(app, ["keys", "list", "--db", db, "--json"])
    assert json.loads(r.output)[0]["tenant"] == "acme"
    r = runner.invoke(app, ["keys", "revoke", "--db", db, k.id])
    assert r.exit_code == 0
    assert KeyRing(store).tenant(key) is None
    r = runner.invoke(app, ["keys", "create", "--db", db, "bad tenant!"])
    assert r.exit_code != 0


def test_keys_are_hashed_at_rest(tmp_path: Path) -> None:
    from sqlalchemy import select

    from kioku.service.keys import create_key
    from kioku.store import schema as s

    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    _, key = create_key(store, "acme")
    secret = key.split("_", 2)[2]
    with store.engine.connect() as conn:
        row = conn.execute(select(s.api_keys)).one()
    assert secret not in json.dumps(dict(row._mapping), default=str)
    assert KeyRing(store).tenant(key[:-1] + ("A" if key[-1] != "A" else "B")) is None


def test_import_reads_a_sillytavern_chat(tmp_path: Path) -> None:
    path = tmp_path / "Mika - 2024-05-01.jsonl"
    lines: list[dict[str, Any]] = [{"user_name": "Ren", "character_name": "Mika"}]
    lines.append({"name": "Mika", "is_user": False, "mes": "Welcome to my tea shop!"})
    for i in range(30):
        lines.append({"name": "Ren", "is_user": True, "mes": f"Ren's message {i}: " + "tea " * 40})
        lines.append(
            {
                "name": "Mika",
                "is_user": False,
                "mes": f"Mika's answer {i}: " + "lantern " * 40,
                "swipes": ["a discarded swipe", f"Mika's answer {i}: " + "lantern " * 40],
                "swipe_id": 1,
            }
        )
    path.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    db = f"sqlite:///{tmp_path / 'import.db'}"
    r = CliRunner().invoke(
        cli(),
        [
            "import",
            "--data",
            str(path),
            "--format",
            "sillytavern",
            "--db",
            db,
            "--profile",
            "local-8k",
            "--conversation",
            "mika",
            "--json",
        ],  # fmt: skip
    )
    assert r.exit_code == 0, r.output
    result = json.loads(r.output[r.output.index("{") :])
    assert result["imported"] == 61
    store = Store.open(db)
    texts = [e.text for e in store.entries("mika")]
    assert texts[0] == "Welcome to my tea shop!" and len(texts) == 61
    assert "a discarded swipe" not in texts
    assert store.conversation("mika").character == "Mika"


@pytest.mark.parametrize("bad", ["", "x" * 1001])
def test_conversation_ids_are_bounded(service: Harness, bad: str) -> None:
    """A name is needed, and at most 1,000 characters of it (a longer one than 200 is kept
    under an encoded id: `kioku.ids`)."""
    with service.http() as h:
        r = h.post(
            "/v1/chat/completions",
            headers={"X-Kioku-Conversation": bad} if bad else {},
            json={"messages": [{"role": "user", "content": "x"}]},
        )
    assert r.status_code == 400

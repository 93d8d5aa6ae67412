"""Key scopes, the conversation list a page at a time, names of a bounded length, and the
command line naming the tenant that holds the conversations (issue 21's smaller items).

On 36c9307 every key was an operator (the key an app chats with could rewrite notes, correct
memory and cut), `GET /v1/conversations` read every conversation one query each (10,000: 1.15 MB
in 0.87 s), a 20,000-character `name` went into every chronicler prompt, and `kioku memory` said
"no conversations yet" of a database whose conversations were another tenant's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from typer.testing import CliRunner

from kioku.messages import Message
from kioku.service.keys import KeyRing, create_key, list_keys
from kioku.store import Store
from tests.test_service_support import Harness, running


@pytest.fixture(scope="module")
def h(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    db = f"sqlite:///{Path(tmp_path_factory.mktemp('scopes')) / 'kioku.db'}"
    with running(db) as harness:
        yield harness


def call(h: Harness, key: str, method: str, path: str, **kw: Any) -> int:
    import httpx

    with httpx.Client(base_url=h.url, headers={"Authorization": f"Bearer {key}"}) as c:
        r = c.request(method, path, **kw)
    if r.status_code == 403:
        assert r.json()["error"]["code"] == "insufficient_scope"
    return r.status_code


CHAT = ("POST", "/v1/chat/completions")
ASKS = {
    "chat": CHAT,
    "models": ("GET", "/v1/models"),
    "list": ("GET", "/v1/conversations"),
    "memory": ("GET", "/v1/conversations/scoped/memory"),
    "metrics": ("GET", "/metrics"),
    "notes": ("PUT", "/v1/conversations/scoped/notes"),
    "cut": ("POST", "/v1/conversations/scoped/cut"),
    "delete": ("DELETE", "/v1/conversations/scoped"),  # last: the next test's chat makes it again
}
BODIES: dict[str, Any] = {
    "chat": {
        "headers": {"X-Kioku-Conversation": "scoped"},
        "json": {"messages": [{"role": "user", "content": "hello there"}]},
    },
    "notes": {"json": {"text": "- [name] Ren: is called Ren"}},
}


@pytest.mark.parametrize(
    ("scopes", "allowed"),
    [
        (None, set(ASKS)),  # a key made the old way, or without --scope: everything
        (("chat",), {"chat", "models"}),
        (("read",), {"list", "memory", "metrics"}),
        (("operator",), {"list", "memory", "metrics", "notes", "cut", "delete"}),
        (("chat", "read"), {"chat", "models", "list", "memory", "metrics"}),
    ],
    ids=["all", "chat", "read", "operator", "chat+read"],
)
def test_a_key_may_do_what_its_scopes_say_and_nothing_else(
    h: Harness, scopes: tuple[str, ...] | None, allowed: set[str]
) -> None:
    everything = h.key("acme")
    assert call(h, everything, *CHAT, **BODIES["chat"]) == 200  # the conversation exists
    h.idle()
    _, key = create_key(h.store, "acme", scopes)
    got = {name: call(h, key, m, p, **BODIES.get(name, {})) for name, (m, p) in ASKS.items()}
    h.idle()
    assert {n for n, status in got.items() if status < 300} == allowed, got
    assert {n for n, status in got.items() if status == 403} == set(ASKS) - allowed, got


def test_a_chat_clients_own_chat_actions_need_chat_and_memorys_need_operator() -> None:
    from kioku.service.auth import scope_of

    assert scope_of("POST", "/v1/conversations/mika/sync") == "chat"
    assert scope_of("POST", "/v1/conversations/mika/rename") == "chat"
    assert scope_of("POST", "/v1/conversations/mika/summarize") == "operator"
    assert scope_of("POST", "/v1/conversations/mika/memory/3/resummarize") == "operator"
    assert scope_of("POST", "/v1/conversations/sync/cut") == "operator"  # a chat named "sync"
    assert scope_of("GET", "/v1/conversations/mika/positions") == "read"
    assert scope_of("DELETE", "/v1/conversations/mika") == "operator"
    assert scope_of("DELETE", "/v1/conversations/sync") == "operator"


def test_keys_create_takes_scopes_and_keys_list_shows_them(tmp_path: Path) -> None:
    from kioku.cli import app, register_extensions

    register_extensions()
    db = f"sqlite:///{tmp_path / 'k.db'}"
    runner = CliRunner()
    r = runner.invoke(app, ["keys", "create", "acme", "--db", db, "--scope", "chat"])
    assert r.exit_code == 0, r.output
    assert "scopes chat " in r.output
    r = runner.invoke(app, ["keys", "create", "acme", "--db", db, "--scope", "read,operator"])
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["keys", "create", "acme", "--db", db, "--scope", "admin"]).exit_code
    store = Store.open(db)
    assert sorted(k.scopes for k in list_keys(store)) == [("chat",), ("read", "operator")]
    listed = json.loads(runner.invoke(app, ["keys", "list", "--db", db, "--json"]).output)
    assert sorted(tuple(k["scopes"]) for k in listed) == [("chat",), ("read", "operator")]
    key = r.output.strip().splitlines()[-1]
    grant = KeyRing(store).grant(key)
    assert grant is not None and grant.scopes == {"read", "operator"}


def test_the_conversation_list_comes_a_page_at_a_time_in_one_query(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    for i in range(25):
        info = store.ensure_conversation(
            f"c-{i:02d}", tenant="acme", character="Ärger" if i == 7 else "Mika"
        )
        store.append(info.id, Message.user(f"hello {i}"), 3)
    store.ensure_conversation("other", tenant="zeta")
    statements: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def count(*args: Any) -> None:
        statements.append(args[2])

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        before = len(statements)
        page, cursor = store.conversation_page("acme", limit=10, before=cursor)
        assert len(statements) - before == 1  # one query a page, whatever its size
        seen += [c.id for c in page]
        pages += 1
        if cursor is None:
            break
    assert pages == 3 and len(seen) == 25 == len(set(seen))
    assert seen == [f"c-{i:02d}" for i in reversed(range(25))]  # the latest activity first
    assert [c.id for c in store.conversation_page("acme", limit=10, query="ärger")[0]] == ["c-07"]
    assert [c.id for c in store.conversation_page("acme", limit=10, query="C-1")[0]][:1] == ["c-19"]
    assert store.conversation_page("acme", limit=10, query="%")[0] == []  # no wildcard


def test_the_list_route_pages_with_a_cursor(h: Harness) -> None:
    import httpx

    for i in range(5):
        call(h, h.key("paged"), *CHAT, headers={"X-Kioku-Conversation": f"p-{i}"},
             json={"messages": [{"role": "user", "content": f"hi {i}"}]})  # fmt: skip
    h.idle()
    auth = {"Authorization": f"Bearer {h.key('paged')}"}
    with httpx.Client(base_url=h.url, headers=auth) as c:
        first = c.get("/v1/conversations", params={"limit": 2}).json()
        second = c.get("/v1/conversations", params={"limit": 2, "cursor": first["next_cursor"]})
        rest = c.get("/v1/conversations", params={"cursor": second.json()["next_cursor"]}).json()
        assert c.get("/v1/conversations", params={"cursor": "garbage"}).status_code == 400
    ids = [x["id"] for page in (first, second.json(), rest) for x in page["data"]]
    assert ids == [f"p-{i}" for i in reversed(range(5))] and rest["next_cursor"] is None


def test_a_name_is_at_most_200_characters(h: Harness) -> None:
    long = "M" * 201
    bodies = [
        {"json": {"messages": [{"role": "user", "content": "hi", "name": long}]}},
        {"json": {"messages": [{"role": "user", "content": "hi"}]}, "character": long},
    ]
    for body in bodies:
        headers = {"X-Kioku-Conversation": "named"}
        if "character" in body:
            headers["X-Kioku-Character"] = body.pop("character")
        assert call(h, h.key("acme"), *CHAT, headers=headers, **body) == 400
    ok = {"messages": [{"role": "user", "content": "hi", "name": "M" * 200}]}
    assert call(h, h.key("acme"), *CHAT, headers={"X-Kioku-Conversation": "named"}, json=ok) == 200


def test_the_command_line_takes_the_only_tenant_and_asks_among_several(tmp_path: Path) -> None:
    """One tenant rule (issue 42): the database's only tenant is the default; with several, a
    command without --tenant lists them and fails; --tenant or KIOKU_TENANT says which."""
    from kioku.cli import app, register_extensions

    register_extensions()
    db = str(tmp_path / "k.db")
    store = Store.open(db)
    info = store.ensure_conversation("mika", tenant="acme")
    store.append(info.id, Message.user("hello"), 2)
    store.close()
    runner = CliRunner()
    env: dict[str, str | None] = {"KIOKU_TENANT": None}
    r = runner.invoke(app, ["memory", "--db", db], env=env)
    assert r.exit_code == 0 and "mika" in r.stdout, r.output
    r = runner.invoke(app, ["notes", "mika", "--db", db], env=env)
    assert r.exit_code == 0, r.output
    # a tenant named that holds none of them: an error naming the one that does
    r = runner.invoke(app, ["memory", "--db", db, "--tenant", "other"], env=env)
    assert r.exit_code != 0 and "tenant 'acme' (1) holds 1 conversation" in r.output, r.output
    assert "--tenant acme" in r.output
    r = runner.invoke(app, ["notes", "mika", "--db", db], env={"KIOKU_TENANT": "other"})
    assert r.exit_code != 0 and "tenant 'acme' (1) holds it" in r.output, r.output

    store = Store.open(db)
    store.ensure_conversation("ren", tenant="zeta")
    store.close()
    for args in (["memory"], ["notes", "mika"], ["search", "mika", "hello"], ["export", "mika"]):
        r = runner.invoke(app, [*args, "--db", db], env=env)
        assert r.exit_code != 0, (args, r.output)
        assert "2 tenants: acme (1 conversation), zeta (1 conversation)" in r.output, r.output
        assert "--tenant" in r.output
        r = runner.invoke(app, [*args, "--db", db, "--tenant", "acme"], env=env)
        assert r.exit_code == 0, (args, r.output)
        r = runner.invoke(app, [*args, "--db", db], env={"KIOKU_TENANT": "acme"})
        assert r.exit_code == 0, (args, r.output)


def test_a_front_ends_page_may_call_every_method_the_rest_api_has(tmp_path: Path) -> None:
    """SillyTavern's page calls kioku from another origin: a DELETE (the panel's Delete) or a PUT
    is preflighted, and a preflight the CORS policy does not allow blocks the call (issue 42)."""
    import httpx

    from kioku.config import Settings
    from kioku.service.app import create_app
    from kioku.service.loopback import FakeUpstream, ServerThread
    from tests.test_service_support import SERVICE_PROFILE, make_kioku

    origin = "http://127.0.0.1:8000"
    db = f"sqlite:///{tmp_path / 'kioku.db'}"
    with FakeUpstream() as up:
        settings = Settings(db=db, llm_url=up.url, cors_origins=(origin,))
        app = create_app(settings, make_kioku=make_kioku, worker=False, profile=SERVICE_PROFILE)
        paths = app.openapi()["paths"].values()
        methods = {m.upper() for ops in paths for m in ops}
        assert "DELETE" in methods
        with ServerThread(app) as server:
            for method in sorted(methods - {"HEAD", "OPTIONS"}):
                r = httpx.options(
                    f"{server.url}/v1/conversations/x",
                    headers={
                        "Origin": origin,
                        "Access-Control-Request-Method": method,
                        "Access-Control-Request-Headers": "authorization,content-type",
                    },
                )
                assert r.status_code == 200, (method, r.text)
                assert method in r.headers["access-control-allow-methods"]

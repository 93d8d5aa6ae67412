"""One tenant rule for the command line (issue 42.3), with a real `kioku serve` and the real CLI:
chats the proxy made under a key of tenant `acme` are what `kioku memory`, `notes`, `search`,
`export` and `stats` read, with no KIOKU_* variable set; once a second tenant has a key, a
command without --tenant lists both and fails, and --tenant picks one."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kioku.service.loopback import FakeUpstream
from tests.killable import Server
from tests.pg import BACKENDS, backend_url
from tests.test_delete import WAIT_S, cli


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_cli_reads_the_proxys_chats_without_environment(backend: str, tmp_path: Path) -> None:
    with backend_url(backend, tmp_path) as url, FakeUpstream() as up:
        made = cli("keys", "create", "--db", url, "acme", "--scope", "chat")
        assert made.returncode == 0, made.stderr
        key = made.stdout.strip().splitlines()[-1]
        server = Server(url, up.url, tmp_path / "serve.log", key=key)
        server.start()
        try:
            auth = {"Authorization": f"Bearer {key}"}
            with httpx.Client(base_url=server.url, headers=auth, timeout=WAIT_S) as client:
                for text in ("My tortoise Basil turned nine today.", "He likes strawberries."):
                    r = client.post(
                        "/v1/chat/completions",
                        headers={"X-Kioku-Conversation": "mika"},
                        json={"model": "m", "messages": [{"role": "user", "content": text}]},
                    )
                    assert r.status_code == 200, r.text
        finally:
            server.stop()

        listed = cli("memory", "--db", url)
        assert listed.returncode == 0 and "mika" in listed.stdout, listed.stderr
        for args in (["memory", "mika"], ["notes", "mika"], ["stats", "mika"]):
            done = cli(*args, "--db", url)
            assert done.returncode == 0, (args, done.stderr)
        found = cli("search", "mika", "tortoise", "--db", url)
        assert found.returncode == 0 and "Basil" in found.stdout, found.stderr
        exported = cli("export", "mika", "--db", url)
        assert exported.returncode == 0 and "strawberries" in exported.stdout, exported.stderr

        assert cli("keys", "create", "--db", url, "zeta").returncode == 0
        for args in (["memory"], ["memory", "mika"], ["export", "mika"], ["delete", "mika"]):
            refused = cli(*args, "--db", url)
            assert refused.returncode != 0, args
            assert "2 tenants: acme (1 conversation), zeta (0 conversations)" in refused.stderr
            assert "--tenant" in refused.stderr
        picked = cli("export", "mika", "--db", url, "--tenant", "acme")
        assert picked.returncode == 0 and picked.stdout == exported.stdout
        assert cli("memory", "--db", url, "--tenant", "zeta").returncode == 0  # none yet

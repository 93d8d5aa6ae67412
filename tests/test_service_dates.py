"""Every message the proxy stores has a time: the client's send_date, else its receipt."""

from __future__ import annotations

from datetime import datetime

from tests import test_service_support as support
from tests.test_service_support import Harness

harness, service = support.harness, support.service


def test_client_dates_and_receipt_times(service: Harness) -> None:
    before = datetime.now().astimezone()
    with service.http() as h:
        r = h.post(
            "/v1/chat/completions",
            headers={"X-Kioku-Conversation": "dated-1"},
            json={
                "messages": [
                    {
                        "role": "user",
                        "content": "We met at the pier.",
                        "send_date": "May 7, 2023 9:15pm",
                    },
                    {
                        "role": "assistant",
                        "content": "I remember the gulls.",
                        "send_date": "May 7, 2023 9:16pm",
                    },
                    {
                        "role": "user",
                        "content": "What did we do yesterday?",
                        "send_date": "May 8, 2023 1:56pm",
                    },
                ]
            },
        )
        assert r.status_code == 200
        r = h.post(
            "/v1/chat/completions",
            headers={"X-Kioku-Conversation": "dated-2"},
            json={"messages": [{"role": "user", "content": "hi", "send_date": "not a date"}]},
        )
        assert r.status_code == 200  # an unreadable date is no reason to refuse a message
    service.idle()
    stamps = [e.message.at for e in service.store.entries("dated-1")]
    assert stamps[:3] == [
        datetime(2023, 5, 7, 21, 15),
        datetime(2023, 5, 7, 21, 16),
        datetime(2023, 5, 8, 13, 56),
    ]
    assert stamps[3] is not None and stamps[3] >= before  # the reply: when it was received
    (hi, reply) = service.store.entries("dated-2")
    assert hi.message.at is not None and hi.message.at >= before
    # the upstream saw the day change as a date line in front of the new day's message; the
    # conversation's first message passes as sent
    sent = [m["content"] for m in service.up.chats()[0]["messages"]]
    assert sent[-3] == "We met at the pier."
    assert sent[-1] == "⟦Monday, 8 May 2023⟧\nWhat did we do yesterday?"

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from kioku.datasets import load_locomo, load_sillytavern, parse_send_date


def test_sillytavern_messages_carry_their_send_date(tmp_path: Path) -> None:
    lines = [
        {"user_name": "Ren", "character_name": "Mina"},
        {"name": "Ren", "is_user": True, "mes": "Hi", "send_date": "January 15, 2024 10:20am"},
        {"name": "Mina", "is_user": False, "mes": "Hello", "send_date": "2024-01-15T10:21:05Z"},
        {"name": "Ren", "is_user": True, "mes": "Later", "send_date": 1705400000000},
        {"name": "Mina", "is_user": False, "mes": "Undated", "send_date": "someday"},
    ]
    p = tmp_path / "chat.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    t = load_sillytavern(p)
    assert [m.at for m in t.messages] == [
        datetime(2024, 1, 15, 10, 20),
        datetime(2024, 1, 15, 10, 21, 5),
        datetime(2024, 1, 16, 10, 13, 20),
        None,  # unreadable: the message stays, undated
    ]


def test_send_date_forms() -> None:
    assert parse_send_date(1705400000) == datetime(2024, 1, 16, 10, 13, 20)  # seconds
    assert parse_send_date("2024-01-15T19:21:05+09:00") == datetime(2024, 1, 15, 10, 21, 5)
    assert parse_send_date(None) is None and parse_send_date("") is None
    assert parse_send_date(True) is None


def test_locomo_messages_carry_their_session_date(tmp_path: Path) -> None:
    conv = {
        "speaker_a": "Ann",
        "speaker_b": "Bob",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "Hi"}],
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_2": [{"speaker": "Bob", "dia_id": "D2:1", "text": "Yo"}],
        "session_2_date_time": "10:00 am on 1 June, 2023",
    }
    p = tmp_path / "locomo.json"
    p.write_text(json.dumps([{"sample_id": "x", "conversation": conv, "qa": []}]))
    t = load_locomo(p, 0)
    assert [m.at for m in t.messages] == [datetime(2023, 5, 8, 13, 56), datetime(2023, 6, 1, 10)]

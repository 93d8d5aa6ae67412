from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from kioku.datasets import load_locomo


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

"""`python -m kioku.bench.survival`: old LoCoMo evidence traced into the memory at the end."""

from __future__ import annotations

from kioku.bench.survival import item_seqs, run
from kioku.memory import MemoryItem
from tests.conftest import shared_file


def test_item_seqs_reads_lines_and_data() -> None:
    item = MemoryItem(
        "chapter",
        0,
        9,
        "— 8 May 2023 · A, B — [3] A: hello there\n[7] B: yes",
        5,
        data={"lines": [{"seq": 8, "speaker": "A", "text": "x"}]},
    )
    assert item_seqs(item) == {3, 7, 8}


def test_old_evidence_survives_in_notes_and_items() -> None:
    path = shared_file("datasets", "locomo", "locomo10.json")
    r = run(path, conversations=[0], budget=4096)
    assert r["old_questions"] > 50
    # what the memory keeps of old evidence at the end: some through the synopsis and
    # chapters, some through the notes, which no major GC folds away
    assert r["survived_items_rate"] > 0 and r["survived_notes_rate"] > 0
    assert r["survived_rate"] >= max(r["survived_items_rate"], r["survived_notes_rate"])
    assert r["conversations"][0]["major_gcs"] > 0

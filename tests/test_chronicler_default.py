"""Who writes the chapters when a reply model is set: the profile decides
(`Profile.reply_model_chronicles`); a chronicler named outright always writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kioku.chronicler import LLMChronicler
from kioku.config import Settings, build_kioku, writes_chapters
from kioku.summarizer import ExtractiveSummarizer

UPSTREAM = "http://127.0.0.1:9/v1"  # never asked: building the engine sends nothing


@pytest.mark.parametrize(
    ("profile", "chronicler", "model_writes"),
    [
        ("local-64k", None, True),
        ("cloud-1m", None, True),
        ("local-8k", None, False),  # a small local model: its chapters answered worse
        ("local-8k", UPSTREAM, True),  # named outright
    ],
)
def test_the_profile_decides_whether_the_reply_model_writes_chapters(
    tmp_path: Path, profile: str, chronicler: str | None, model_writes: bool
) -> None:
    s = Settings(
        db=f"sqlite:///{tmp_path / 'k.db'}",
        profile=profile,
        llm_url=UPSTREAM,
        summarizer_url=chronicler,
    )
    assert writes_chapters(s) is model_writes
    kk = build_kioku(s)
    try:
        expected = LLMChronicler if model_writes else ExtractiveSummarizer
        assert isinstance(kk.summarizer, expected)
    finally:
        kk.close()


def test_no_model_at_all_writes_extractive_chapters() -> None:
    assert not writes_chapters(Settings(profile="local-64k"))

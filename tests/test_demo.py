from __future__ import annotations

import io

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from kioku import demo
from kioku.eval.cli import register
from kioku.profiles import LOCAL_8K
from kioku.summarizer import ExtractiveSummarizer
from kioku.tokens import ScriptEstimator

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_demo_runs_small_and_writes_its_png(tmp_path) -> None:
    buf = io.StringIO()
    r = demo.run("en", 500, tmp_path, env={}, console=Console(file=buf, width=120))
    png = tmp_path / demo.DEFAULT_PNG
    assert png.read_bytes()[:8] == PNG and r["png"] == str(png)
    assert r["chronicler"] == "extractive"
    en = r["languages"]["en"]
    assert en["messages"] >= 500 and en["counters"]["folds"] >= 1
    assert set(en["facts"]) == {"generational", "rolling", "rolling-long", "truncation", "full"}
    assert en["facts"]["full"]["answer_in_context"] == 1.0
    assert (
        en["facts"]["generational"]["answer_in_context"]
        > en["facts"]["truncation"]["answer_in_context"]
    )
    assert set(en["prefix_reuse"]) == {"kioku", "sliding_window"}
    assert en["prefix_reuse"]["kioku"]["turns"] == en["turns"]
    facts = en["facts"]["generational"]
    assert sum(facts["by_place_questions"].values()) == len(en["questions"])
    out = buf.getvalue()
    assert "fold" in out and "final memory" in out and "prefix-cache reuse" in out
    assert "planted facts" in out and "wrote" in out
    assert " 1 items" not in out and "rolling-long: the same, given as many tokens" in out
    # the table says how many facts each column holds
    n = facts["by_place_questions"]["last 10%"]
    assert f"{n} fact" in out


@pytest.mark.slow
def test_demo_cli_quiet_in_japanese(tmp_path) -> None:
    app = typer.Typer()
    register(app)
    res = CliRunner().invoke(
        app, ["demo", "--lang", "ja", "--messages", "300", "--out", str(tmp_path), "--quiet"]
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / demo.DEFAULT_PNG).read_bytes()[:8] == PNG
    assert "final memory" not in res.stdout  # --quiet: the tables only
    assert "planted facts" in res.stdout
    res = CliRunner().invoke(app, ["demo", "--lang", "fr"])
    assert res.exit_code != 0


def test_the_chronicler_follows_kioku_llm_url() -> None:
    counter = ScriptEstimator()
    s, label = demo.summarizer_from_env(counter, LOCAL_8K, {})
    assert isinstance(s, ExtractiveSummarizer) and label == "extractive"
    s, label = demo.summarizer_from_env(
        counter, LOCAL_8K, {"KIOKU_LLM_URL": "http://127.0.0.1:9/v1", "KIOKU_LLM_MODEL": "m"}
    )
    from kioku.chronicler import LLMChronicler

    assert isinstance(s, LLMChronicler) and label.startswith("llm http://127.0.0.1:9")


def test_places_read_oldest_first() -> None:
    assert demo.place_bucket(0.0) == "first 25%"
    assert demo.place_bucket(0.3) == "25-50%"
    assert demo.place_bucket(0.95) == demo.BUCKETS[-1] == "last 10%"
    assert set(demo.EXPLAINED) == set(demo.STRATEGIES)

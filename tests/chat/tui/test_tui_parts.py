"""Pieces of the app without the app: commands, the engine meter, per-page reading shares, formatting."""

import numpy as np
import pytest

from locks_chat.ask import ask
from locks_chat.ingest import load_document
from locks_chat.prompt import build_prompt
from locks_chat.reading import step_reading
from locks_chat.sessions import Turn
from locks_chat.tui.commands import HELP, Command, CommandError, parse_command
from locks_chat.tui.meter import MeteredEngine, summary_bytes_resident
from locks_chat.tui.stats_table import stats_markdown
from locks_chat.tui.widgets.memory_panel import human_bytes
from locks_chat.tui.widgets.progress_panel import bar, eta_text
from locks_engine.sampling import Sampling
from tests.support.fakes import FakeEngine, WordTokenizer, step_record
from tests.support.tui_support import write_book


@pytest.mark.parametrize(
    "text, expected",
    [("/budget 512", Command("budget", 512)), ("/rank 4", Command("rank", 4)), ("/dense", Command("dense")),
     ("/DENSE on", Command("dense", True)), ("/pages iv-x", Command("pages", "iv-x")),
     ("/pages all", Command("pages", None)), ("  /stats ", Command("stats")), ("/export", Command("export")),
     ("/help", Command("help")), ("/quit", Command("quit"))],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_parse_command(text, expected):
    assert parse_command(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [("/budget", "positive whole number"), ("/budget 0", "positive whole number"), ("/rank two", "e.g. /rank 4"),
     ("/dense maybe", "toggle"), ("/pages", "needs a range"), ("/stats now", "takes no argument"),
     ("/nope", "unknown command /nope")],
)
def test_bad_commands_say_what_to_type(text, message):
    with pytest.raises(CommandError, match=message):
        parse_command(text)


def test_help_lists_every_command():
    """The help's table has a row for each command ``parse_command`` knows (was: ``/quit`` missing)."""
    with pytest.raises(CommandError) as raised:
        parse_command("/nope")
    known = raised.value.message.partition("the commands are ")[2].split(", ")
    assert len(known) == 8, known
    missing = [name for name in known if f"| `{name}" not in HELP]
    assert not missing, f"no help row for {missing}"


@pytest.fixture
def prompt(tmp_path):
    document = load_document(write_book(tmp_path))
    return document, build_prompt(WordTokenizer(), document, ["q?"])


def test_page_share_counts_layer_head_slots(prompt):
    document, prompt = prompt
    # page 1 is KV pages 7..9 (9 shared with page 2): all 3 (layer, head) pairs read pages 7 and 8
    record = step_record(1000, [7, 8]) | {"num_layers": 1, "num_kv_heads": 3}
    reading = step_reading(record, prompt)
    assert [p.number for p in reading.doc_pages] == [1]
    assert reading.doc_page_share == pytest.approx((2 / 3,))
    # page 2 is KV pages 9..23: reading 9 touches pages 1 and 2
    reading = step_reading(step_record(1000, [9]) | {"num_layers": 1, "num_kv_heads": 3}, prompt)
    assert [p.number for p in reading.doc_pages] == [1, 2]
    assert reading.doc_page_share == pytest.approx((1 / 3, 1 / 15))


def test_meter_reports_prefill_then_decode_bytes():
    record = step_record(100, [0, 1]) | {"num_prefill_tokens": 0, "pages_read": 6, "pages_total": 42,
                                         "summaries_read": 42}
    record["bytes_read"] = 6 * 4096 + 42 * 400
    prefill = step_record(100, []) | {"num_decodes": 0, "num_prefill_tokens": 64}
    engine = FakeEngine(answer="a b")
    engine.stream = lambda ids, n, cancel=None, sampling=None: iter([
        type("E", (), dict(text="", num_tokens=0, elapsed_s=1.0, stats=[prefill]))(),
        type("E", (), dict(text="a ", num_tokens=1, elapsed_s=2.0, stats=[record]))(),
    ])
    ticks = []
    list(MeteredEngine(engine, ticks.append).stream(list(range(100)), 4))
    assert [(t.prefilled_tokens, t.generated) for t in ticks] == [(0, 0), (64, 0), (100, 1)]
    assert ticks[-1].bytes_read == record["bytes_read"] and ticks[-1].summary_bytes == 42 * 400
    assert summary_bytes_resident(step_record(100, [0])) is None


def test_meter_passes_events_through_to_ask(tmp_path):
    document = load_document(write_book(tmp_path))
    ticks = []
    result = ask(MeteredEngine(FakeEngine(answer="It is BLUE (p. 1)."), ticks.append), document, ["q?"])
    assert result.answer == "It is BLUE (p. 1)." and ticks[-1].generated == result.generated_tokens


@pytest.mark.parametrize("saved_by", ["numbers", "older_text"])
def test_stats_table_compares_locks_and_dense(saved_by):
    """Turns keep the attention setting's numbers; those of sessions saved before kept its text (``mode``)."""
    def turn(mode, tpot, read, sampling=None):
        pages = [{"page": "3", "steps": 2}, {"page": "7", "steps": 9}]
        numbers = {"LOCKS budget 512, rank 8": {"dense": False, "budget": 512, "rank": 8},
                   "dense": {"dense": True, "budget": 2048, "rank": 8}}[mode]
        setting = {"attention": numbers} if saved_by == "numbers" else {"mode": mode}
        return Turn(1, "q", "a", "done", [], {
            **setting, "generated_tokens": 10, "ttft_ms": 900.0, "tpot_ms": tpot, "decode_steps": 10,
            "kv_pages_read_fraction": read, "kv_bytes_read": 1e6 * read, "kv_bytes_dense": 1e6,
            "document_pages_read": pages, **({"sampling": sampling} if sampling else {}),
        })

    sampled = Sampling(temperature=0.7, top_p=0.8, source="model").to_json()
    text = stats_markdown([turn("LOCKS budget 512, rank 8", 90.0, 0.25), turn("dense", 120.0, 1.0, sampled),
                           Turn(3, "q", "", "cancelled", [], {})])
    assert "| 1 | LOCKS 512/r8 | 10 | 0.9 s | 90 ms | 25% | 7, 3 |" in text
    # a turn saved before the sampling was kept says none
    assert text.endswith("\n- sampling **T 0.7, top-p 0.8 (the model's)**: answer 2")
    assert "- **dense**: 1 answers, mean TPOT 120 ms, KV bytes read 100% of dense (100.0 kB of 100.0 kB" in text
    assert stats_markdown([]).endswith("no answer yet in this session.")


def test_formatting_helpers():
    assert human_bytes(512) == "512 B" and human_bytes(2_400_000) == "2.4 MB"
    assert bar(3, 12, width=4) == "█░░░" and bar(0, 0, width=2) == "░░"
    assert eta_text(10.0, 50, 100, None) == "ETA 10 s"
    assert eta_text(4.0, 0, 100, 10.0) == "ETA 6 s" and eta_text(20.0, 0, 100, 10.0) == "ETA soon"
    assert eta_text(1.0, 0, None, None) == ""


def test_page_share_uses_every_hist_bin_of_a_page(prompt):
    document, prompt = prompt
    # page 4 is KV pages 40..62
    record = step_record(1000, list(range(40, 63))) | {"num_layers": 1, "num_kv_heads": 3}
    record["row_hist"] = np.where(record["row_hist"] > 0, 3, 0).astype(np.uint16)
    reading = step_reading(record, prompt)
    assert reading.doc_page_share[-1] == pytest.approx(1.0)

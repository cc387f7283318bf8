"""``locks-chat ask`` end to end: a generated PDF whose answer sits on one page, the real CLI, vLLM with LOCKS
and the built-in model (about a minute: one engine start)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")
fpdf = pytest.importorskip("fpdf", reason="fpdf2 is a test requirement")

FACT_PAGE = 4
FACT = "The lighthouse on Gull Rock was automated in 1987, and no keeper has lived there since."
QUESTION = "In which year was the lighthouse on Gull Rock automated?"


def filler(rng: random.Random, sentences: int) -> str:
    subjects = ["The tide", "A gull", "The supply boat", "The north wind", "An old fisherman", "The harbour bell"]
    verbs = ["turned slowly past", "waited beside", "drifted along", "called out over", "circled above"]
    objects = ["the grey shingle", "the harbour wall", "the chandler's shop", "the fish market", "the sea road"]
    return " ".join(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}." for _ in range(sentences))


@pytest.fixture
def fact_pdf(tmp_path):
    rng = random.Random(7)
    pdf = fpdf.FPDF()
    pdf.set_font("helvetica", size=11)
    for number in range(1, 7):
        pdf.add_page()
        text = filler(rng, 14)
        if number == FACT_PAGE:
            text = f"{filler(rng, 6)} {FACT} {filler(rng, 6)}"
        pdf.multi_cell(0, 6, text)
    path = tmp_path / "harbour.pdf"
    pdf.output(str(path))
    return path


def test_ask_returns_the_fact_and_reads_its_page(fact_pdf, model_dir):
    command = [
        sys.executable, "-m", "locks_chat.cli", "ask", str(fact_pdf), QUESTION,
        "--model", model_dir, "--budget", "256", "--max-tokens", "32", "--json",
    ]
    tmp = Path(tempfile.mkdtemp(prefix="lk-test-"))  # short: a socket's path has at most 107 characters
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("VLLM_RPC_BASE_PATH", None)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=fact_pdf.parent, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    # vLLM's IPC socket files went to a folder of the process, removed as it exited
    left = sorted(p.name for p in tmp.rglob("*"))
    shutil.rmtree(tmp)
    assert not left, left[:20]
    result = json.loads(done.stdout)
    assert "1987" in result["answer"]
    stats = result["stats"]
    assert stats["decode_steps"] > 0 and stats["prompt_tokens"] > 256
    assert 0 < stats["kv_pages_read_fraction"] < 1, "LOCKS read fewer KV pages than the prompt has"
    assert stats["kv_bytes_read"] < stats["kv_bytes_dense"]
    assert str(FACT_PAGE) in {p["page"] for p in stats["document_pages_read"]}, "the carrier page was read"
    # the count made before the engine starts is the engine's own
    from locks_chat.engine_client import open_tokenizer
    from locks_chat.ingest import load_document
    from locks_chat.prompt import build_prompt

    counted = open_tokenizer(model_dir, None)
    assert counted is not None and counted.max_context == 8192
    prompt = build_prompt(counted.tokenizer, load_document(fact_pdf), [QUESTION])
    assert len(prompt.token_ids) == stats["prompt_tokens"]


def test_a_document_that_cannot_fit_is_refused_before_the_engine_starts(fact_pdf, model_dir, tmp_path):
    blocked = tmp_path / "blocked" / "vllm"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('the engine must not start')")
    command = [sys.executable, "-m", "locks_chat.cli", "ask", str(fact_pdf), QUESTION, "--model", model_dir,
               "--context", "300"]
    env = {**os.environ, "PYTHONPATH": str(blocked.parent)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=fact_pdf.parent, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert "do not fit the 300-token context" in line and "--max-tokens" in line

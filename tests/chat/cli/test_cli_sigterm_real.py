"""``locks-chat ask`` stopped by SIGTERM to its process group, as ``timeout`` sends it, while the answer streams.

Before, the app died on the spot, the request was never aborted, vLLM's engine core outlived it for seconds and
its worker printed tracebacks. Now the app aborts the request, shuts the engine down and prints one line; the
engine's processes log to the engine log, not the terminal. About a minute on two CPU cores (the engine start).
Skipped without vLLM or the built-in model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from tests.support.process_support import descendants, engine_processes, long_answer_command

pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")


def test_sigterm_to_the_process_group_while_the_answer_streams(model_dir, user_home):
    command = long_answer_command(model_dir)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    app = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env)
    streamed: list[bytes] = []
    reader = threading.Thread(target=lambda: streamed.extend(iter(lambda: app.stdout.read1(256), b"")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 400
        while len(b"".join(streamed).split()) < 3 and app.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert app.poll() is None, f"the app ended before the signal: {app.stderr.read().decode()}"
        engine = descendants(app.pid)
        assert engine, "no engine processes under the app"
        os.killpg(app.pid, signal.SIGTERM)
        code = app.wait(60)
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
    stderr = app.stderr.read().decode()
    reader.join(5)
    assert code == 143, stderr
    assert stderr.splitlines()[-1] == "terminated: the request was aborted", stderr
    for noise in ("Traceback", "ERROR", "EngineCore", "Worker"):
        assert noise not in stderr, f"{noise!r} on stderr:\n{stderr}"
    deadline = time.monotonic() + 30
    while engine_processes(engine) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not engine_processes(engine), "engine processes outlived the app"
    assert (user_home / "data" / "logs" / "engine.log").is_file(), "the engine's processes wrote no log"

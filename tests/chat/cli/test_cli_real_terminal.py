"""``locks-chat ask`` in a real terminal (tmux): Ctrl+C while the answer streams.

The terminal sends SIGINT to the whole foreground process group, vLLM's engine core and worker included. Before,
they died mid-step and the engine core printed its traceback above the app's one line; now they leave SIGINT to
the app, which aborts the request and shuts the engine down. About a minute on two CPU cores (the engine start).
Skipped without tmux, vLLM or the built-in model.
"""

from __future__ import annotations

import time

import pytest

from tests.support.process_support import descendants, engine_processes, long_answer_command
from tests.support.tmux_support import TmuxApp, have_tmux

if not have_tmux():
    pytest.skip("tmux is not installed (apt-get install tmux)", allow_module_level=True)
pytest.importorskip("vllm", reason="vllm is not installed (see the README's install command)")


def test_ctrl_c_while_the_answer_streams_prints_one_line_and_exits_130(model_dir, user_home):
    command = long_answer_command(model_dir)
    app = TmuxApp(command, {"LOCKS_CHAT_HOME": str(user_home)}, size=(200, 50))
    try:
        pane_pid = int(app._tmux("display-message", "-p", "-t", "app", "#{pane_pid}").strip())
        app.wait_for(lambda s: "lighthouse" in s.lower().split("starting the engine")[-1], timeout=400,
                     what="the answer to stream")
        engine = descendants(pane_pid)
        time.sleep(1.0)
        app.send("C-c")
        screen = app.wait_for(lambda s: "EXITED" in s, timeout=90, what="the app to exit")
    finally:
        app.close()
    lines = [line for line in screen.splitlines() if line.strip()]
    assert "EXITED 130" in lines[-1], screen
    assert lines[-2].startswith("interrupted: the request was aborted"), screen
    for noise in ("Traceback", "ERROR", "EngineCore", "Warning", "Loading safetensors"):
        assert noise not in screen, f"{noise!r} on the screen:\n{screen}"
    deadline = time.monotonic() + 30
    while engine_processes(engine) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not engine_processes(engine), "engine processes outlived the app"

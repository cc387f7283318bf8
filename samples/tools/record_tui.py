"""Record a real session of the app as an SVG picture (the README's screenshot).

Runs ``locks-chat DOCUMENT`` under tmux with vLLM, LOCKS and the default built-in model (converted once into the
engine's cache and linked into the recording's fresh app home, so the app names it as the user sees it), asks one
question, and saves the screen once the answer is complete (Rich's SVG exporter, as Textual's screenshots): the
Pages-read heat map then holds a row for every few tokens of the answer. Needs tmux. ``samples/tui.svg`` was
recorded with

    python -m samples.tools.record_tui samples/lighthouse.md --budget 256 \\
        --question "What was the word of the month in November 1906?" --out samples/tui.svg

With ``--frames DIR`` it also captures the screen every ``--frame-interval`` seconds while the answer streams and
keeps the Pages-read panel of each capture (``frames.json``: time, the selected token, the panel's text), and
saves the first and the last streaming captures with different tokens as ``frame-a.svg`` and ``frame-b.svg``: the
panel changing per token in a real terminal (on a GPU, with the decode steps in CUDA graphs). Exit status 1 when
fewer than two different tokens were seen while the answer streamed.

Run it as a module from the repository root (``-m``), so that ``tests.support.tmux_support`` imports.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document", type=Path)
    parser.add_argument("--pages", default=None, help="--pages for locks-chat (the built-in model has 8K tokens)")
    parser.add_argument("--question", default="What is this document about? Cite pages.")
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--size", default="140x45", help="terminal columns x rows")
    parser.add_argument("--out", type=Path, default=Path("samples/tui.svg"))
    parser.add_argument("--frames", type=Path, default=None, help="folder for the streaming captures")
    parser.add_argument("--frame-interval", type=float, default=0.1, help="seconds between streaming captures")
    parser.add_argument("--model", default=None, help="--model for locks-chat (default: the default built-in model)")
    parser.add_argument("--text-out", type=Path, default=None, help="also save the final screen as plain text")
    parser.add_argument("--start-timeout", type=float, default=600.0, help="seconds for the app to show Ready:")
    args = parser.parse_args()
    from tests.support.tmux_support import TmuxApp, screen_svg


    from locks_engine.models import resolve_model

    began = time.monotonic()
    model = Path(resolve_model(None)) if args.model is None else None
    print(f"model {model or args.model} resolved in {time.monotonic() - began:.0f} s; starting the app in tmux",
          flush=True)
    columns, rows = (int(n) for n in args.size.split("x"))
    command = [sys.executable, "-m", "locks_chat.cli", str(args.document.resolve()),
               "--budget", str(args.budget), "--max-tokens", str(args.max_tokens), "--new"]
    command += ["--model", args.model] if args.model else []
    if args.pages:
        command += ["--pages", args.pages]
    with tempfile.TemporaryDirectory(prefix="locks-chat-record-") as home:
        if model is not None:  # the app finds the converted built-in model in its home's models folder
            (Path(home) / "models").mkdir()
            (Path(home) / "models" / model.name).symlink_to(model, target_is_directory=True)
        app = TmuxApp(command, {"LOCKS_CHAT_HOME": home, "TERM": "xterm-256color", "COLORTERM": "truecolor"},
                      size=(columns, rows))
        try:
            start = time.monotonic()
            screen = app.wait_for(lambda s: "Ready:" in s or "Not ready:" in s, timeout=args.start_timeout,
                                  what="the engine")
            if "Not ready:" in screen:
                raise AssertionError(f"the app did not get ready\n{screen}")
            print(f"ready after {time.monotonic() - start:.0f} s; asking", flush=True)
            app.type_text(args.question)
            app.send("Enter")
            app.wait_for(lambda s: "Prefill" in s or "Answering" in s, timeout=60, what="the question to go in")
            frames = stream_frames(app, args.frame_interval) if args.frames else []
            app.wait_for(lambda s: "Ready:" in s and "tokens ·" in s, timeout=900, what="the answer")
            time.sleep(1.0)
            screen = app.capture(escapes=True)
            if args.text_out:
                args.text_out.write_text(app.capture(), encoding="utf-8")
        except AssertionError as err:  # a wait timed out, or the app exited: keep its last screen
            last = args.out.with_suffix(".last-screen.txt")
            last.write_text(str(err), encoding="utf-8")
            print(f"{str(err).splitlines()[0]} (the last screen: {last})", flush=True)
            keep_engine_log(Path(home), args.out.with_suffix(".engine-log.txt"))
            sys.exit(1)
        finally:
            app.close()
    title = f"locks-chat {args.document.name}" + (f" --pages {args.pages}" if args.pages else "")
    args.out.write_text(screen_svg(screen, title, columns), encoding="utf-8")
    print(f"saved {args.out}")
    if args.frames:
        sys.exit(save_frames(frames, args.frames, title, columns))


def keep_engine_log(home: Path, out: Path, lines: int = 200) -> None:
    """Copy the last ``lines`` of the app's engine log (vLLM's processes write there, under the app's home
    directory, which is deleted when the recording ends) to ``out``, and print where."""
    logs = sorted(home.rglob("engine.log"))
    if not logs:
        print("no engine log was written", flush=True)
        return
    text = logs[0].read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    out.write_text("\n".join(text) + "\n", encoding="utf-8")
    print(f"the engine log's last {len(text)} lines: {out}", flush=True)


#: the Pages-read panel's headline: the token its rows end at (``token 12 of 40:`` once one is selected)
TOKEN = re.compile(r"token (\d+)(?: of (\d+))?:")


def stream_frames(app, interval: float, limit_s: float = 900.0) -> list[dict]:
    """Capture (with escapes) every ``interval`` seconds until the answer is complete; per capture the seconds
    since the first, the token in the Pages-read panel's headline (None before the first) and the screen."""
    from tests.support.tmux_support import panel

    frames, start = [], time.monotonic()
    while time.monotonic() - start < limit_s:
        screen = app.capture(escapes=True)
        try:
            rows = panel(screen, "Pages read")
        except AssertionError:
            rows = []
        match = TOKEN.search(rows[0].plain) if rows else None
        frames.append({"t_s": round(time.monotonic() - start, 3), "token": int(match.group(1)) if match else None,
                       "panel": "\n".join(row.plain for row in rows), "screen": screen})
        if "Ready:" in screen and "tokens ·" in screen:
            break
        time.sleep(interval)
    return frames


def save_frames(frames: list[dict], folder: Path, title: str, columns: int) -> int:
    """Write ``frames.json`` (no escapes) and two SVG captures at different tokens; 1 when there are not two."""
    from tests.support.tmux_support import screen_svg

    folder.mkdir(parents=True, exist_ok=True)
    streaming = [f for f in frames if f["token"] is not None and "Ready:" not in f["screen"]]
    tokens = sorted({f["token"] for f in streaming})
    (folder / "frames.json").write_text(json.dumps(
        {"captures": len(frames), "streaming_tokens_seen": tokens,
         "frames": [{k: v for k, v in f.items() if k != "screen"} for f in frames]}, indent=1))
    print(f"{len(frames)} captures; the Pages-read panel showed tokens {tokens} while the answer streamed")
    if len(tokens) < 2:
        print("fewer than two tokens seen while streaming")
        return 1
    first = streaming[0]
    last = next(f for f in reversed(streaming) if f["token"] != first["token"])
    for name, frame in (("frame-a.svg", first), ("frame-b.svg", last)):
        (folder / name).write_text(screen_svg(frame["screen"], f"{title} (token {frame['token']})", columns))
    print(f"saved {folder / 'frame-a.svg'} (token {first['token']}), {folder / 'frame-b.svg'} (token {last['token']})")
    return 0


if __name__ == "__main__":
    main()

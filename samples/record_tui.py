"""Record a real session of the app as an SVG picture (the README's screenshot).

Runs ``locks-chat DOCUMENT`` under tmux with vLLM, LOCKS and the built-in model, asks one question, and saves
the screen once the answer is complete (Rich's SVG exporter, as Textual's screenshots): the Pages-read heat map
then holds a row for every few tokens of the answer. Needs tmux. ``samples/tui.svg`` was recorded with

    python -m samples.record_tui path/to/text_R-intro.pdf --pages 1-10 --max-tokens 120 \\
        --question "How do I get help on a function in R? Cite the pages." --out samples/tui.svg

Run it as a module from the repository root (``-m``), so that ``tests.tmux_support`` imports.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    from tests.tmux_support import TmuxApp, screen_svg


    from locks_engine.models import resolve_model

    model = str(resolve_model(None))
    columns, rows = (int(n) for n in args.size.split("x"))
    command = [sys.executable, "-m", "locks_chat.cli", str(args.document.resolve()), "--model", model,
               "--budget", str(args.budget), "--max-tokens", str(args.max_tokens), "--new"]
    if args.pages:
        command += ["--pages", args.pages]
    with tempfile.TemporaryDirectory(prefix="locks-chat-record-") as home:
        app = TmuxApp(command, {"LOCKS_CHAT_HOME": home, "TERM": "xterm-256color", "COLORTERM": "truecolor"},
                      size=(columns, rows))
        try:
            start = time.monotonic()
            app.wait_for(lambda s: "Ready:" in s, timeout=600, what="the engine")
            print(f"ready after {time.monotonic() - start:.0f} s; asking")
            app.type_text(args.question)
            app.send("Enter")
            app.wait_for(lambda s: "Prefill" in s or "Answering" in s, timeout=60, what="the question to go in")
            app.wait_for(lambda s: "Ready:" in s and "tokens ·" in s, timeout=900, what="the answer")
            time.sleep(1.0)
            screen = app.capture(escapes=True)
        finally:
            app.close()
    title = f"locks-chat {args.document.name}" + (f" --pages {args.pages}" if args.pages else "")
    args.out.write_text(screen_svg(screen, title, columns), encoding="utf-8")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()

"""The ``locks-chat`` console script. Ctrl+C while the command line's modules load (Typer and Rich: a few hundred
ms) ends as it does later, with one line and exit code 130 (``locks_chat.cli``), not a traceback; a SIGTERM then
ends the process as the signal does (exit status 143), no handler being in place yet."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from locks_chat.cli import main as cli_main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    cli_main()

"""The ``locks-chat`` command line.

Errors users cause map to one line on stderr and an exit code (0 ok, 2 bad input or a document that does not
fit, 3 engine failure, 130 interrupted); nothing they cause prints a traceback. Usage errors are Typer's own
(exit code 2).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from locks_chat import options as opt
from locks_chat.errors import LocksChatError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="Read and question whole books and PDFs with a local LLM on vLLM with LOCKS sparse attention.",
)
err_console = Console(stderr=True)


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Map :class:`LocksChatError` and Ctrl+C to one line on stderr and their exit codes."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except LocksChatError as err:
            err_console.print(f"[bold red]error:[/] {err.message}", highlight=False, soft_wrap=True)
            raise typer.Exit(err.exit_code) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper


@app.callback()
def main_callback() -> None:
    """Read and question whole books and PDFs with a local LLM on vLLM with LOCKS sparse attention."""


@app.command(epilog='Example: locks-chat ask book.pdf "Who wrote the preface?" --pages 1-40 --json')
@one_line_errors
def ask(
    doc: opt.Doc,
    question: str = typer.Argument(help="The question.", show_default=False),
    pages: opt.Pages = None,
    password: opt.Password = None,
    model: opt.Model = None,
    budget: opt.Budget = 2048,
    rank: opt.Rank = 8,
    dense: opt.Dense = False,
    max_tokens: opt.MaxTokens = 256,
    context: opt.ContextLength = None,
    json_out: opt.Json = False,
) -> None:
    """Ask one question about a document; the answer streams to stdout with page citations."""
    from locks_chat.ask_command import run_ask

    run_ask(doc, question, pages, password, model, budget, rank, dense, max_tokens, context, json_out, err_console)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()

"""The ``locks-chat`` command line: the Typer app and its console-script entry, :func:`main`. The commands' bodies
are in this package's ``ask``, ``chat`` and ``sessions`` modules, the options they share in ``options``.

Errors users cause map to one line on stderr and an exit code (``locks_chat.cli.exits``); nothing they cause
prints a traceback. Usage errors that Typer finds (a bad option value, a missing argument) are one line as well
(exit code 2), from :func:`main`.
"""

from __future__ import annotations

import signal
import sys
from typing import Annotated

import typer
from rich.console import Console

from locks_chat.cli import options as opt
from locks_chat.cli.exits import ClosedStdout, err_console, one_line_errors, output_not_written, print_error_json
from locks_chat.settings import LOCKS_DEFAULTS
from locks_chat.signals import Terminated, raise_on_sigterm

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Read and question whole books and PDFs with a local LLM on vLLM with LOCKS sparse attention.",
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"locks-chat {version('locks-chat')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            print("locks-chat (not installed)")
        raise typer.Exit(0)


@app.callback()
def main_callback(
    show_version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
    ),
) -> None:
    """Read and question whole books and PDFs with a local LLM on vLLM with LOCKS sparse attention."""


@app.command("ask", epilog='Example: locks-chat ask book.pdf "Who wrote the preface?" --pages 1-40 --json, then '
             'locks-chat ask book.pdf -c "When?" to follow up; cat notes.md | locks-chat ask - "Summarize it."')
@one_line_errors
def ask_command(
    doc: opt.AskDoc,
    question: str = typer.Argument(help="The question.", show_default=False, metavar="QUESTION"),
    pages: opt.Pages = None,
    password: opt.Password = None,
    model: opt.Model = None,
    budget: opt.Budget = LOCKS_DEFAULTS.budget,
    rank: opt.Rank = LOCKS_DEFAULTS.rank,
    dense: opt.Dense = False,
    tail: opt.Tail = LOCKS_DEFAULTS.tail,
    max_tokens: opt.MaxTokens = 256,
    context: opt.ContextLength = None,
    kv_cache_gib: opt.KvCacheGib = None,
    json_out: opt.Json = False,
    continue_last: opt.Continue = False,
    session: opt.SessionId = None,
    temperature: opt.Temperature = None,
    top_p: opt.TopP = None,
    top_k: opt.TopK = None,
    repetition_penalty: opt.RepetitionPenalty = None,
    seed: opt.Seed = None,
) -> None:
    """Ask one question about a document; the answer streams to stdout with page citations.

    The question and answer are saved as a session (locks-chat sessions list), shared with the chat app;
    --continue or --session N follows up on one, with its earlier turns in the prompt. Sampling is the model's
    own (its generation_config.json; greedy where it gives none) unless --temperature and the like are given;
    an answer that starts repeating itself is stopped.
    """
    from locks_chat.cli.ask import AskOptions, run_ask, sampling_given
    from locks_chat.cli.followup import FollowUp
    from locks_chat.settings import locks_config

    follow = FollowUp(continue_last, session)
    options = AskOptions(
        doc=doc, question=question, locks=locks_config(budget, rank, dense, tail, name_prefix="--"), pages=pages,
        password=password, model=model, max_tokens=max_tokens, context=context, kv_cache_gib=kv_cache_gib,
        json_out=json_out, follow=follow,
        sampling=sampling_given(temperature=temperature, top_p=top_p, top_k=top_k,
                                repetition_penalty=repetition_penalty, seed=seed),
    )
    run_ask(options, err_console)


@app.command("chat",
             epilog="Example: locks-chat book.pdf --pages 1-40 --budget 512   (same as: locks-chat chat book.pdf ...)")
@one_line_errors
def chat_command(
    doc: opt.Doc,
    pages: opt.Pages = None,
    password: opt.Password = None,
    model: opt.Model = None,
    budget: opt.Budget = None,
    rank: opt.Rank = None,
    dense: opt.DenseSwitch = None,
    tail: opt.TailSetting = None,
    max_tokens: opt.MaxTokens = None,
    context: opt.ContextLength = None,
    kv_cache_gib: opt.KvCacheGib = None,
    new: opt.NewSession = False,
    temperature: opt.Temperature = None,
    top_p: opt.TopP = None,
    top_k: opt.TopK = None,
    repetition_penalty: opt.RepetitionPenalty = None,
    seed: opt.Seed = None,
) -> None:
    """Chat with a document in the terminal app, watching which pages LOCKS reads (the default command).

    Options not given come from the settings file, which /budget, /rank and /dense update; sampling options not
    given there either are the model's own (its generation_config.json), else greedy.
    """
    from locks_chat.cli.chat import run_chat

    from locks_chat.cli.ask import sampling_given

    run_chat(doc, pages, password, model, budget, rank, dense, max_tokens, context, new, kv_cache_gib,
             sampling_given(temperature=temperature, top_p=top_p, top_k=top_k,
                            repetition_penalty=repetition_penalty, seed=seed), tail=tail)


sessions_app = typer.Typer(no_args_is_help=True,
                           help="Saved conversations: every ask and chat is one, kept per book (path and content).")
app.add_typer(sessions_app, name="sessions")


@sessions_app.command("list", epilog="Example: locks-chat sessions list --json")
@one_line_errors
def sessions_list(json_out: opt.JsonList = False) -> None:
    """List saved conversations, newest first."""
    from locks_chat.cli.sessions import list_sessions

    list_sessions(json_out, Console())


@sessions_app.command("show", epilog="Example: locks-chat sessions show 3 > transcript.md")
@one_line_errors
def sessions_show(session: Annotated[int, typer.Argument(help="Session id (see sessions list).")]) -> None:
    """Print a conversation as Markdown, with page citations."""
    from locks_chat.cli.sessions import show_session

    show_session(session)


@sessions_app.command("delete", epilog="Example: locks-chat sessions delete 3 4")
@one_line_errors
def sessions_delete(
    sessions: Annotated[list[int], typer.Argument(help="Session ids (see sessions list).")],
) -> None:
    """Delete conversations."""
    from locks_chat.cli.sessions import delete_sessions

    delete_sessions(sessions, err_console)


def with_default_command(args: list[str]) -> list[str]:
    """``locks-chat book.pdf ...`` means ``locks-chat chat book.pdf ...``: insert ``chat`` when the first
    argument is not a command, nor the program's own ``--help`` or ``--version`` (so ``locks-chat --budget 512
    book.pdf`` is the chat command too: the program itself has no other option)."""
    commands = {info.name or info.callback.__name__ for info in app.registered_commands}
    commands |= {group.name for group in app.registered_groups}
    if args and args[0] not in commands and args[0] not in ("--help", "-h", "--version"):
        return ["chat", *args]
    return args


def main() -> None:
    """Console-script entry point. Usage errors (a bad option value, an unknown option, a missing argument) are
    one line on stderr too, naming the help to read, with exit code 2 (and with ``--json``, a JSON error object
    of kind ``usage`` on stdout, ``locks_chat.cli.exits``); a command group given no command prints
    its help (exit code 0). Usage errors are caught through Typer's public ``typer.TyperException``, the base of
    the click exceptions Typer raises (Typer 0.29 carries its own copy of click)."""
    raise_on_sigterm()
    closed = sys.stdout is None  # started with file descriptor 1 closed (``>&-``)
    if closed:
        sys.stdout = ClosedStdout()
    args = with_default_command(sys.argv[1:])
    sigpipe = None
    if {"--help", "-h", "--version"} & set(args):
        # help and version only print: a closed pipe (``| head``) ends them as it ends other tools (exit 141);
        # Rich would exit 1 on it. Given back after (main also runs inside a test process).
        sigpipe = signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    json_out = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    try:
        code = app(args=args, prog_name="locks-chat", standalone_mode=False)
        sys.stdout.flush()  # a full disk shows here, not in the interpreter's last flush
    except typer.TyperException as err:
        ctx = getattr(err, "ctx", None)
        if type(err).__name__ == "NoArgsIsHelpError":
            sys.exit(0)  # Typer printed the help before raising
        hint = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
        message = " ".join(err.format_message().split())
        err_console.print(f"[bold red]error:[/] {message}{hint}", highlight=False, soft_wrap=True)
        code = err.exit_code
        if json_out:
            print_error_json(f"{message}{hint}", "usage", code)
    except typer.Abort as err:
        # click turns a KeyboardInterrupt outside the commands' own handling into Abort
        terminated = isinstance(err.__cause__, Terminated)
        word = err.__cause__.word if terminated else "interrupted"
        err_console.print(word)
        code = err.__cause__.exit_code if terminated else 130
        if json_out:
            print_error_json(word, "terminated" if terminated else "cancelled", code)
    except OSError as err:  # the help or the version could not be written (the commands handle their own)
        code = output_not_written(err)
    finally:
        if sigpipe is not None:
            signal.signal(signal.SIGPIPE, sigpipe)
        if closed:
            sys.stdout = None
    sys.exit(code if isinstance(code, int) else 0)


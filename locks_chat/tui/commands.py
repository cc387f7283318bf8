"""Slash commands typed at the prompt: parsed and checked here, carried out by the chat screen."""

from __future__ import annotations

from dataclasses import dataclass

from locks_chat.errors import LocksChatError

HELP = """\
**Ask** anything about the book; answers cite pages as (p. 12). **Up/Down** recall earlier prompts;
**Esc** or **Ctrl+C** stops an answer (the request is aborted in the engine). The "Pages read" heat map has the
book's pages across and the answer's tokens down, coloured by the share of each page read; **Alt+Left** and
**Alt+Right** select an earlier or later token (past the newest it follows the answer live again);
**Ctrl+Q** quits.

| Command | What it does |
|---|---|
| `/budget N` | LOCKS token budget per step and KV head (restarts the engine) |
| `/rank r` | rank of each KV page's key summary (restarts the engine) |
| `/dense` | toggle dense attention, for A/B runs against LOCKS (restarts the engine) |
| `/pages A-B` | reload the document with these pages (`/pages all`: every page) |
| `/stats` | statistics of every answer in this session, LOCKS and dense side by side |
| `/export` | save the conversation as Markdown with page citations |
| `/help` | this help |
| `/quit` | quit the app, as Ctrl+Q |

Settings reach vLLM only when the engine starts, so `/budget`, `/rank` and `/dense` restart it (15-75 s on a
small CPU); they are saved in the settings file for the next run.
"""

RESTARTING = ("budget", "rank", "dense")
"""commands that change the LOCKS configuration, which vLLM reads at engine start"""


class CommandError(LocksChatError):
    """A slash command that is unknown or has a bad argument."""


@dataclass(frozen=True)
class Command:
    name: str
    """``budget``, ``rank``, ``dense``, ``pages``, ``stats``, ``export``, ``help`` or ``quit``"""
    value: int | str | bool | None = None
    """the parsed argument: tokens (``budget``), rank, dense on/off (``None``: toggle), pages (``None``: all)"""


def is_command(text: str) -> bool:
    return text.lstrip().startswith("/")


def parse_command(text: str) -> Command:
    """Parse ``/name [argument]``.

    Raises:
        CommandError: unknown command, missing or malformed argument (the message says what to type).
    """
    name, _, arg = text.strip().lstrip("/").partition(" ")
    name, arg = name.lower(), arg.strip()
    if name in ("budget", "rank"):
        unit = "tokens, e.g. /budget 512" if name == "budget" else "e.g. /rank 4"
        if not arg.isdecimal() or int(arg) < 1:  # isdigit() also takes "²", which int() refuses
            raise CommandError(f"/{name} needs a positive whole number ({unit})")
        return Command(name, int(arg))
    if name == "dense":
        switch = {"": None, "on": True, "off": False}
        if arg.lower() not in switch:
            raise CommandError("/dense takes nothing (toggle), on or off")
        return Command(name, switch[arg.lower()])
    if name == "pages":
        if not arg:
            raise CommandError("/pages needs a range, e.g. /pages 1-40 or /pages iv-x, or /pages all")
        return Command(name, None if arg.lower() == "all" else arg)
    if name in ("stats", "export", "help", "quit"):
        if arg:
            raise CommandError(f"/{name} takes no argument")
        return Command(name)
    known = "/budget, /rank, /dense, /pages, /stats, /export, /help, /quit"
    raise CommandError(f"unknown command /{name}: the commands are {known}")

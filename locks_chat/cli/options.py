"""Options shared by the commands, as ``Annotated`` aliases (one definition, one help text each)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from locks_chat.sampling import MAX_WHOLE
from locks_chat.settings import LOCKS_DEFAULTS, MAX_BUDGET, MIN_CONTEXT, MIN_KV_CACHE_GIB
from locks_engine.config import TAILS

#: the smallest budget LOCKS takes: the pages every step reads (sink, recent and the last page), in tokens
MIN_BUDGET = LOCKS_DEFAULTS.min_budget


def _doc_given(value: str) -> Path:
    """The document argument as a path; an empty one (an unset shell variable, say) is refused rather than read as
    the current directory."""
    if not value.strip():
        raise typer.BadParameter("empty: give a document's path")
    return Path(value)


def _finite_gib(value: Optional[float]) -> Optional[float]:
    """``--kv-cache-gib`` given as ``inf`` or ``nan`` is refused (a size is a number), then one below
    :data:`MIN_KV_CACHE_GIB` (checked here, not by a range type, which read ``nan`` as a value too small)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a size: give a number of GiB such as 24")
    if value is not None and value < MIN_KV_CACHE_GIB:
        raise typer.BadParameter(f"{value:g} is below the smallest KV cache, {MIN_KV_CACHE_GIB:g} GiB")
    return value


def _pages_given(value: Optional[str]) -> Optional[str]:
    """A blank ``--pages`` (an unset shell variable, say) is refused rather than read as every page."""
    if value is not None and not value.strip():
        raise typer.BadParameter("empty: give a range such as 40-80, or leave --pages out to read every page")
    return value


def _model_given(value: Optional[str]) -> Optional[str]:
    """A blank ``--model`` (an unset shell variable, say) is refused rather than read as the current directory."""
    if value is not None and not value.strip():
        raise typer.BadParameter("empty: give a model directory or hub id, or leave --model out for the built-in one")
    return value


def _above_zero(value: Optional[float]) -> Optional[float]:
    """``--top-p`` and ``--repetition-penalty`` take numbers above 0 (``nan`` and ``inf`` refused too)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value:g} is not allowed: give a number above 0")
    return value


def _tail_given(value: Optional[str]) -> Optional[str]:
    """``--tail`` takes one of ``LocksConfig``'s tail settings."""
    if value is not None and value not in TAILS:
        raise typer.BadParameter(f"{value!r} is not a tail estimate: give {', '.join(TAILS[:-1])} or {TAILS[-1]}")
    return value


# given as text and made a path by the callback: Typer would read "" as the current directory
Doc = Annotated[
    str,
    typer.Argument(help="The book or paper: PDF, EPUB, Markdown or plain text.", show_default=False, metavar="DOC",
                   callback=_doc_given),
]
AskDoc = Annotated[
    str,
    typer.Argument(
        help="The book or paper: PDF, EPUB, Markdown or plain text; - reads it from standard input (PDF and EPUB "
        "told by their content, text starting with a '# ' heading read as Markdown); --continue then finds the "
        "conversation by the content's SHA-256: pipe the same bytes again.",
        show_default=False,
        metavar="DOC",
        callback=_doc_given,
    ),
]
Pages = Annotated[
    Optional[str],
    typer.Option(
        "--pages",
        help="Page range to read: 40-80, iv-x, 12, 40- (to the end), -12 (from the start), 1-5,9 (printed labels "
        "where the PDF has them; #3-9: physical pages).",
        show_default=False,
        callback=_pages_given,
    ),
]
Password = Annotated[
    Optional[str], typer.Option("--password", help="Password of an encrypted PDF.", show_default=False)
]
Model = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        help=(
            "Model: a local Hugging Face directory, a hub id, or a built-in model: qwen0.5b (Qwen2.5-Coder-0.5B-Instruct, "
            "32K context, the default) or smollm2 (SmolLM2-135M-Instruct, 8K, small and fast, weak at reading)."
        ),
        show_default=False,
        callback=_model_given,
    ),
]
Budget = Annotated[
    int,
    typer.Option(
        "--budget",
        help=f"LOCKS token budget per decode step and KV head (at least {MIN_BUDGET}: the pages every step reads).",
        min=MIN_BUDGET,
        max=MAX_BUDGET,
    ),
]
Rank = Annotated[
    int,
    typer.Option(
        "--rank",
        help=f"Rank r of each KV page's key summary (at most the page's {LOCKS_DEFAULTS.page_size} tokens).",
        min=1,
        max=LOCKS_DEFAULTS.page_size,
    ),
]
_TAIL_HELP = ("What the KV pages a step does not read contribute: none (left out), or an estimate from their "
              "summaries' mass and their mean values kept in int8 or bf16 (the answer's statistics then say what share "
              "of the estimated mass it carried).")
Tail = Annotated[str, typer.Option("--tail", help=_TAIL_HELP, metavar="|".join(TAILS), callback=_tail_given)]
TailSetting = Annotated[
    Optional[str],
    typer.Option("--tail", help=_TAIL_HELP + " Default: the settings file's, else none.", show_default=False,
                 metavar="|".join(TAILS), callback=_tail_given),
]
KvCacheGib = Annotated[
    Optional[float],
    typer.Option(
        "--kv-cache-gib",
        help="KV cache size in GiB, to share a GPU (default: on a GPU vLLM's share of its memory, the page summaries "
        "reserved; on the CPU 1 GiB, in whole GiB).",
        show_default=False,
        callback=_finite_gib,
    ),
]
Dense = Annotated[bool, typer.Option("--dense", help="Read every KV page (dense attention), for A/B runs.")]
DenseSwitch = Annotated[
    Optional[bool],
    typer.Option(
        "--dense/--no-dense",
        help="Read every KV page (dense attention), for A/B runs; --no-dense: LOCKS whatever the settings file says.",
        show_default=False,
    ),
]
MaxTokens = Annotated[int, typer.Option("--max-tokens", help="Most tokens in the answer.", min=1)]
ContextLength = Annotated[
    Optional[int],
    typer.Option("--context", help="Context length in tokens (default: the model's).", min=MIN_CONTEXT, show_default=False),
]
NewSession = Annotated[
    bool, typer.Option("--new", help="Start a new conversation instead of resuming the book's last one.")
]
Json = Annotated[
    bool, typer.Option("--json", help="Print one JSON object (answer, citations, statistics, saved session).")
]
Continue = Annotated[
    bool,
    typer.Option(
        "--continue", "-c",
        help="Follow up on the latest conversation about this document (from ask or the chat app): its earlier "
        "turns go into the prompt, and its page range applies unless --pages is given.",
    ),
]
SessionId = Annotated[
    Optional[int],
    typer.Option(
        "--session",
        help="Follow up on saved session N (see locks-chat sessions list); it must be about this document (same "
        "content).",
        show_default=False,
        metavar="N",
    ),
]
JsonList = Annotated[bool, typer.Option("--json", help="Print a JSON array, one object per session.")]
Temperature = Annotated[
    Optional[float],
    typer.Option("--temperature", help="Sampling temperature, 0 to 2; 0: greedy (default: the model's "
                 "generation_config.json, greedy where it gives none).", min=0.0, max=2.0, show_default=False),
]
TopP = Annotated[
    Optional[float],
    typer.Option("--top-p", help="Nucleus sampling: draw from the most likely tokens up to this probability, above "
                 "0 to 1 (default: the model's).", max=1.0, show_default=False, callback=_above_zero),
]
TopK = Annotated[
    Optional[int],
    typer.Option("--top-k", help="Draw from the k most likely tokens; 0: off (default: the model's).", min=0,
                 max=MAX_WHOLE, show_default=False),
]
RepetitionPenalty = Annotated[
    Optional[float],
    typer.Option("--repetition-penalty", help="Penalty on tokens already in the prompt or the answer, above 0; 1: "
                 "off (default: the model's).", show_default=False, callback=_above_zero),
]
Seed = Annotated[
    Optional[int],
    typer.Option("--seed", help="Seed of a sampled answer: the same seed, the same answer (default: 0).", min=0,
                 max=MAX_WHOLE, show_default=False),
]

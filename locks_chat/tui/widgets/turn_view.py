"""One question and its answer: the answer streams in as Markdown, then a line says whether the cited pages hold
what the answer says, and a footer gives citations and numbers."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.markup import escape
from textual.containers import Vertical
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from locks_chat.citations import UNSUPPORTED_TEXT
from locks_chat.transcript import citation_text

_STATUS = {
    "cancelled": "[b $warning]cancelled[/]: the answer stops here",
    "failed": "[b $error]failed[/]",
    "interrupted": "[b $warning]interrupted[/]: the app stopped during this answer",
}


class TurnView(Vertical):
    """A turn of the conversation.

    Args:
        question (str): what the user asked.
        answer (str): the answer so far (a resumed turn's whole answer).
    """

    DEFAULT_CSS = """
    TurnView { height: auto; margin: 0 0 1 0; }
    TurnView > .question { color: $text-accent; text-style: bold; padding: 0 1; }
    TurnView > Markdown { margin: 0; padding: 0 1; background: transparent; }
    TurnView > .unsupported { display: none; color: $text-error; text-style: bold; padding: 0 1; }
    TurnView > .unsupported.-shown { display: block; }
    TurnView > .check { display: none; color: $text-warning; padding: 0 1; }
    TurnView > .check.-shown { display: block; }
    TurnView > .check.-verified { color: $text-success; }
    TurnView > .footer { color: $text-muted; padding: 0 1; }
    """

    def __init__(self, question: str, answer: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.question = question
        self.answer = answer
        self._stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        yield Static(f"> {self.question}", classes="question", markup=False)
        yield Markdown(self.answer)
        yield Static(UNSUPPORTED_TEXT, classes="unsupported", markup=False)
        yield Static("", classes="check", markup=False)
        yield Static("", classes="footer")

    async def write(self, delta: str) -> None:
        """Append a piece of the answer as it streams."""
        self.answer += delta
        if self._stream is None:
            self._stream = Markdown.get_stream(self.query_one(Markdown))
        await self._stream.write(delta)

    async def finish(self, status: str, citations: list[dict], stats_line: str = "", check: str = "",
                     stopped: str = "", answer: str | None = None, supported: bool | None = None) -> None:
        """End the stream and show the turn's footer: its status, cited pages and statistics; ``check`` is the
        citation check's line (:attr:`locks_chat.citations.CitationCheck.text`), shown under the answer.

        Args:
            stopped (str): why the app stopped the answer (``stopped: the answer repeated itself``), said first.
            answer (str | None): the answer as saved, shown instead of what streamed when it differs (an answer
                the loop guard cut after the loop's first occurrence).
            supported (bool | None): ``False``: no page holds the answer's key words
                (:attr:`locks_chat.citations.CitationCheck.supported`), said in bold right under the answer.
        """
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        if answer is not None and answer != self.answer:
            self.answer = answer
            await self.query_one(Markdown).update(answer)
        parts = [_STATUS[status]] if status in _STATUS else []
        if stopped:
            head, _, reason = stopped.partition(": ")
            parts.insert(0, f"[b $warning]{head}[/]: {escape(reason)}" if reason else escape(stopped))
        if citations:
            parts.append(f"cited: [b]{citation_text(citations)}[/]")
        if stats_line:
            parts.append(stats_line)
        self.query_one(".footer", Static).update(" · ".join(parts))
        self.query_one(".unsupported", Static).set_class(supported is False, "-shown")
        line = self.query_one(".check", Static)
        line.update(f"citations: {check}" if check else "")
        line.set_class(bool(check), "-shown")
        line.set_class(bool(citations) and all(c.get("verified") for c in citations), "-verified")

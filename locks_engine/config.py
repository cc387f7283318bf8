"""One frozen, validated configuration for the LOCKS method.

Built once at the edge (CLI, vLLM ``additional_config``, a benchmark) and passed down explicitly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

#: Summary storage formats (see ``locks_engine/ops/summaries.py`` for the exact layouts).
#: LOCKS' own page summaries (a centroid, a page-local basis and coefficients).
LOCKS_FORMATS = ("float", "paper", "colwise", "chanlog", "colwise8")
#: The baseline formats: Quest's per-channel key bounds, for comparisons through the same backend.
QUEST_FORMATS = ("quest", "quest2", "quest4")
SUMMARY_FORMATS = LOCKS_FORMATS + QUEST_FORMATS
#: How a decode step finds the pages worth reading (``locks_engine/ops/superpages.py`` for ``two-level``;
#: ``oracle``: the exact page log-sum-exp, a quality reference).
SELECTIONS = ("flat", "two-level", "oracle")
#: What the pages a step does not read contribute (``locks_engine/ops/tail.py``): nothing, or their estimated mass
#: times their mean value vector, kept in int8 or bf16.
TAILS = ("none", "int8", "bf16")
#: the largest ``LocksConfig.budget`` (tokens): past any model's context (a budget that covers the context reads every
#: page already); the backend keeps superpage counts of up to 4x the budget's pages in int32
#: (``vllm_backend/calibration.py``), which a budget of 10**23 overflowed inside a running engine
MAX_BUDGET = 2**24
#: ``LocksConfig.candidates`` that calibrates each layer's ``c`` by itself (``ops/calibration.py``)
AUTO_CANDIDATES = "auto"


@dataclass(frozen=True)
class LocksConfig:
    page_size: int = 16
    """B: tokens per KV page (paper: 16). Must divide the KV cache block size."""
    rank: int = 8
    """r: rank of each page's local key basis, 1 <= r <= page_size."""
    budget: int = 2048
    """Token budget per decode step and KV head: at most ``budget // page_size`` pages are read."""
    sink_pages: int = 1
    """Pages at the start of the sequence that are always read (attention sinks)."""
    recent_pages: int = 1
    """Pages before the last page that are always read; the last page (it holds the current token,
    complete or not) is always read too."""
    summary_format: str = "colwise8"
    """How summaries are stored: ``float`` (fp32, reference), ``paper`` (int8 centroid, int4 basis,
    int8 coefficients, one scale per tensor per page), ``colwise`` (fp16 centroid, int4 basis and
    int8 coefficients with one scale per basis direction), ``chanlog`` (as ``colwise``, but one
    1-byte log2 scale per channel of the int4 basis) or ``colwise8`` (as ``colwise`` with an int8 basis).
    ``quest``, ``quest2``, ``quest4``: not LOCKS but the Quest baseline (Tang et al., ICML 2024, Section 3) through
    the same backend, for comparisons: the fp16 channel minimum and maximum of the keys of each page (``quest``)
    or of each of its 2 or 4 equal chunks, scored by Quest's upper bound; the flat selection only, CPU path only."""
    dense: bool = False
    """A/B switch: read every page (dense attention) instead of selecting."""
    selection: str | None = None
    """``flat``: score every complete page's summary at every step. ``two-level``: score one fp16 centroid per
    superpage of 16 pages first, then the page summaries of the chosen superpages only (``ops/superpages.py``;
    ``samples/studies/SELECTION_COST.md``). None (the default): ``two-level`` with ``candidates="auto"`` where it
    applies (a LOCKS summary format, no ``tail``, not ``dense``), else ``flat``; resolved when the config is built
    (the calibrated two-level selection keeps the flat scan's mass and RULER answers at 4K-32K, and scans fewer
    summaries from 128K: ``samples/studies/CALIBRATION.md``, ``samples/results/RULER.md``). ``oracle``: not LOCKS but the best selector at the same budget, for
    comparisons: every complete page ranked by its exact log attention mass ``logsumexp_i(q . k_i / sqrt(D))``,
    read from all its keys (``ops.baselines.oracle_scores``), then the same group-shared top-K, forced pages and
    sparse attention; no summaries are kept; eager on CUDA (no CUDA graphs), for accuracy, not speed."""
    candidates: tuple[int, ...] | str = AUTO_CANDIDATES
    """``two-level`` only: ``c``, the page summaries scored per step as a multiple of the budget; each step scores
    the pages of ``ceil(c * K / 16)`` superpages (plus the forced ones). ``"auto"`` (the default): each layer finds
    its own ``c`` at the end of every prefill from the prompt's last queries (``ops/calibration.py``; the largest
    choice until then). A table given by hand wins: one value for every layer, or one per layer (layer ``i`` of the
    model takes entry ``i``); 0 scores that layer flat."""

    tail: str = "none"
    """``none``: the pages a step does not read are left out of the softmax. ``int8`` / ``bf16``: each complete page
    not read enters it as ``exp(s_j) vbar_j``, its estimated log mass ``s_j`` (the score it was ranked by) times
    its mean value vector kept in that format, merged with the exact pages by log-sum-exp (``ops/tail.py``;
    ``samples/studies/TAIL_ESTIMATE.md``). Flat and oracle selections, LOCKS formats; on CUDA the Triton kernels
    inside CUDA graphs (eager with the oracle), the mean values in a store beside the summaries."""

    def __post_init__(self) -> None:
        _check_int("page_size", self.page_size, 1)
        _check_int("rank", self.rank, 1)
        _check_int("budget", self.budget, 1)
        if self.budget > MAX_BUDGET:
            raise ValueError(f"LocksConfig.budget={self.budget}: allowed an integer <= {MAX_BUDGET} (tokens; a budget "
                             "that covers the context reads every page)")
        _check_int("sink_pages", self.sink_pages, 0)
        _check_int("recent_pages", self.recent_pages, 0)
        if self.rank > self.page_size:
            raise ValueError(
                f"LocksConfig.rank={self.rank} is larger than page_size={self.page_size}: "
                f"allowed 1..{self.page_size} (a page of B keys has at most B directions)"
            )
        if self.summary_format not in SUMMARY_FORMATS:
            raise ValueError(
                f"LocksConfig.summary_format={self.summary_format!r}: allowed {', '.join(SUMMARY_FORMATS)}"
            )
        if not isinstance(self.dense, bool):
            raise ValueError(f"LocksConfig.dense={self.dense!r}: allowed True or False")
        if self.summary_format in QUEST_FORMATS and self.page_size % quest_chunks(self.summary_format):
            raise ValueError(
                f"LocksConfig.summary_format={self.summary_format!r} splits a page into "
                f"{quest_chunks(self.summary_format)} chunks: page_size={self.page_size} must be a multiple of it"
            )
        if self.selection is None:
            flat = self.summary_format in QUEST_FORMATS or self.tail != "none" or self.dense
            object.__setattr__(self, "selection", "flat" if flat else "two-level")
        if self.selection not in SELECTIONS:
            raise ValueError(f"LocksConfig.selection={self.selection!r}: allowed {', '.join(SELECTIONS)}")
        if self.selection != "flat" and self.summary_format in QUEST_FORMATS:
            why = "has no page centroids for superpages" if self.selection == "two-level" else "is a selector itself"
            raise ValueError(
                f"LocksConfig.summary_format={self.summary_format!r} {why}: allowed with selection 'flat' only"
            )
        if self.tail not in TAILS:
            raise ValueError(f"LocksConfig.tail={self.tail!r}: allowed {', '.join(TAILS)}")
        if self.tail != "none" and (self.selection == "two-level" or self.summary_format in QUEST_FORMATS):
            raise ValueError(
                f"LocksConfig.tail={self.tail!r} needs page log-mass estimates: allowed with selection 'flat' or "
                "'oracle' and a LOCKS summary format"
            )
        if isinstance(self.candidates, list):
            object.__setattr__(self, "candidates", tuple(self.candidates))
        if self.candidates != AUTO_CANDIDATES and (not isinstance(self.candidates, tuple) or not self.candidates
                or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in self.candidates)):
            raise ValueError(
                f"LocksConfig.candidates={self.candidates!r}: allowed \"{AUTO_CANDIDATES}\" or a non-empty list of "
                "integers >= 0 (one for every layer, or one per layer; 0 = flat scan in that layer)"
            )
        if self.budget_pages < self.always_read_pages:
            raise ValueError(
                f"LocksConfig.budget={self.budget} tokens holds {self.budget_pages} pages of {self.page_size}, "
                f"fewer than the {self.always_read_pages} always read "
                f"(sink_pages + recent_pages + the last page): allowed budget >= {self.min_budget}"
            )

    @property
    def budget_pages(self) -> int:
        """K: pages read per step and KV head, ``budget // page_size`` (tokens -> pages)."""
        return self.budget // self.page_size

    @property
    def always_read_pages(self) -> int:
        """Pages every step reads whatever the budget: ``sink_pages + recent_pages + 1`` (the last page)."""
        return self.sink_pages + self.recent_pages + 1

    @property
    def min_budget(self) -> int:
        """The smallest ``budget`` (tokens) these pages allow: ``always_read_pages * page_size``."""
        return self.always_read_pages * self.page_size

    @property
    def calibrated(self) -> bool:
        """Whether each layer calibrates its own ``c`` (``two-level`` with ``candidates="auto"``)."""
        return self.selection == "two-level" and self.candidates == AUTO_CANDIDATES

    def layer_candidates(self, layer: int | None) -> int:
        """``c`` of decode layer ``layer`` (0-based; None when the layer's index is unknown): 0 for a flat scan;
        with ``candidates="auto"``, the largest ``c`` calibration may choose (the kernels' capacity).

        Raises:
            ValueError: a per-layer table without an entry for ``layer``.
        """
        if self.selection != "two-level":
            return 0
        if self.calibrated:
            from locks_engine.ops.calibration import CALIBRATION_CHOICES

            return CALIBRATION_CHOICES[-1]
        if len(self.candidates) == 1:
            return self.candidates[0]
        if layer is None or not 0 <= layer < len(self.candidates):
            raise ValueError(
                f"LocksConfig.candidates has {len(self.candidates)} entries, none for layer {layer}: give one "
                "value for every layer, or one per layer of the model"
            )
        return self.candidates[layer]

    @property
    def summarized(self) -> bool:
        """Whether decode keeps and scores page summaries: not with ``dense`` (every page read) nor with the
        ``oracle`` selection (it scores pages from their keys)."""
        return not self.dense and self.selection != "oracle"

    @property
    def quantized(self) -> bool:
        """Whether summaries are stored quantized (any format but ``float``)."""
        return self.summary_format != "float"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "LocksConfig":
        """Build from a plain dict (e.g. vLLM ``additional_config["locks"]``).

        Raises:
            ValueError: on an unknown key, naming it and the allowed keys; or on a bad value.
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"LocksConfig: unknown setting(s) {unknown}: allowed {sorted(names)}")
        return cls(**values)


def quest_chunks(summary_format: str) -> int:
    """Chunks a page's Quest bounds cover: 1 for ``quest``, 2 for ``quest2``, 4 for ``quest4``; 0 for a LOCKS
    format."""
    if summary_format not in QUEST_FORMATS:
        return 0
    return int(summary_format.removeprefix("quest") or 1)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"LocksConfig.{name}={value!r}: allowed an integer >= {minimum}")

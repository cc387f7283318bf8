"""How the score kernels are tuned: the ``colwise8`` coefficient paths, the measured defaults per GQA group size,
the ``$LOCKS_SCORE_TUNING`` override and how arguments, override and defaults combine (``resolve_tuning``). Plain
Python and torch, no triton: benchmarks and tests on machines without triton read it too."""

from __future__ import annotations

import os

import torch


#: ``chanlog`` V q paths: 1 = basis dequantized to an fp16 pair (the default), 0 = scales folded into a per-page
#: fixed-point query (int8 products; the first version, kept for timing)
CHANLOG_PATHS = {"fp16": 1, "int8": 0}
#: ``colwise8`` paths for the ``B x r`` coefficient contraction: 0 = batched fp16 products (hi + lo pair), 1 = one
#: int8 ``(V q)_k`` product per direction and fp32 FMAs, 2 = one ``V q`` product and a broadcast sum over ``r``,
#: 3 = the batched product with ``V q`` as one fp16 factor (no lo half: half the products, ~2^-11 relative error),
#: 4 = as 3, and ``V q`` itself one fp16 product (the int8 basis converted, exact) instead of the int8 pair,
#: 5 and 6 = 3 and 4 with the contraction transposed (``[TP, GP, B]``: the log-sum-exp over the tokens along the
#: product's N; 13% fewer SASS instructions at G = 16, 7% at G = 4, ``samples/score_sass.py``; timed on the H200:
#: 5 is 8% faster than 3 at G = 16, 1M, and the default there, ``default_tuning``); 7 and 8 = 5 and 6 with the
#: log-sum-exp shifted by the centroid's logit (no max reduction; ``score_persistent._colwise8_tile_lse``), in the
#: persistent kernel only
COEF_PATHS = {"dot": 0, "direction": 1, "broadcast": 2, "dot1": 3, "half": 4, "dot1t": 5, "halft": 6, "dot1tc": 7,
              "halftc": 8}
#: the paths of the persistent kernel (``programs_per_sm`` > 0); the last two only there
PERSISTENT_PATHS = ("dot1t", "halft", "dot1tc", "halftc")


def default_tuning(groups: int, summary_format: str) -> tuple[str, int, int]:
    """``(coef_path, tile_pages, programs_per_sm)`` of the score kernel, the fastest measured for a GQA group size
    (``programs_per_sm`` 0: the grid kernel).

    ``colwise8`` on one H200 (``samples/bench_score.py``, ``samples/results/score.json``, us for one layer at batch
    1, inline PTX on): the persistent kernel with the centroid-shifted log-sum-exp, 16 pages a tile, 2 tiles in
    flight. G = 16, ``dot1tc`` with 4 programs an SM (its 128 registers fit 4): 84.7 at 1M in the fifth run
    (2026-12-03) and 84.9 in the sixth (2026-12-03, later), against the grid kernel's ``dot1t`` 111.4 / 111.6;
    18.9 / 19.0 at 128K against 22.1 / 21.9; no capped variant of the sixth run beat it by more than 3% (8 pages,
    6 programs capped at 80 registers: 86.0 at 1M, 18.5 at 128K). G = 4, ``halftc`` with 5 programs an SM (its 96
    registers fit 5 uncapped): 247.5 at 1M and 42.1 at 128K in the sixth run, against 262.4 and 45.5 with 4
    programs and the grid kernel's ``halft`` 305.7 and 50.1 (6 programs capped at 80 registers: 243.8 and 41.5,
    within 2%, not taken: a cap changes the compiled code). G <= 4 takes G = 4's choice, larger groups G = 16's.
    ``score_pages`` falls back to the grid kernel (the same path without the shift) when the batch leaves a (KV
    head, sequence) fewer than 2 programs. Other formats keep the grid kernel and their tiles (16 pages for
    ``chanlog`` and for groups over 4, else 32)."""
    if summary_format == "colwise8":
        return ("halftc", 16, 5) if groups <= 4 else ("dot1tc", 16, 4)
    return "dot1", 16 if summary_format == "chanlog" or groups > 4 else 32, 0


#: the grid kernel's path for each path of the persistent kernel only
GRID_PATH = {"dot1tc": "dot1t", "halftc": "halft"}


def resolve_tuning(groups: int, summary_format: str, seqs: int, heads: int, device: torch.device,
                   coef_path: str | None = None, tile_pages: int | None = None, num_warps: int | None = None,
                   programs_per_sm: int | None = None, pipeline_stages: int | None = None,
                   max_registers: int | None = None) -> tuple[str, int, int, int, int, int | None]:
    """``(coef_path, tile_pages, num_warps, programs_per_sm, pipeline_stages, max_registers)`` the score kernel
    runs with (``max_registers`` None: the compiler's choice): the
    arguments given, then ``$LOCKS_SCORE_TUNING``'s fields, then ``default_tuning``'s. A path given without
    programs runs in the grid kernel (unless only the persistent kernel has it); with neither given, the default
    persistent kernel runs when every (KV head, sequence) of the batch gets at least 2 programs, else the grid
    kernel with ``GRID_PATH``'s path.

    Raises:
        ValueError: on a ``$LOCKS_SCORE_TUNING`` that does not parse (``score_tuning``)."""
    env_path, env_tile, env_warps, env_programs, env_stages, env_registers = score_tuning()
    path = coef_path or env_path
    programs = programs_per_sm if programs_per_sm is not None else env_programs
    default_path, default_tile, default_programs = default_tuning(groups, summary_format)
    if path is None and programs is None:
        fits = default_programs and programs_per_head(seqs, heads, 1 << 30, default_programs, device) >= 2
        path, programs = (default_path, default_programs) if fits else (GRID_PATH.get(default_path, default_path), 0)
    elif path is None:
        path = default_path if programs else GRID_PATH.get(default_path, default_path)
    elif programs is None:
        programs = (default_programs or 4) if path in GRID_PATH else 0
    return (path, tile_pages or env_tile or default_tile, num_warps or env_warps or 4, programs,
            pipeline_stages or env_stages or 2, max_registers or env_registers or None)


#: environment override of the tuning, ``PATH[,TILE_PAGES[,NUM_WARPS[,PROGRAMS_PER_SM[,STAGES[,MAX_REGISTERS]]]]]``
#: (``PATH`` a name of ``COEF_PATHS``; ``PROGRAMS_PER_SM`` above 0 the persistent kernel, ``STAGES`` its tiles in
#: flight, ``MAX_REGISTERS`` its cap on registers a thread, 0 none): lets
#: a benchmark compare kernel variants inside an engine, whose processes it cannot pass arguments to
TUNING_ENV = "LOCKS_SCORE_TUNING"


def score_tuning() -> tuple[str | None, int | None, int | None, int | None, int | None, int | None]:
    """``(coef_path, tile_pages, num_warps, programs_per_sm, pipeline_stages, max_registers)`` of the score kernel
    from ``$LOCKS_SCORE_TUNING``; fields it leaves out, and all six when it is unset, are None (the caller's
    arguments, then ``default_tuning``, decide). ``programs_per_sm`` 0 asks for the grid kernel, more for the
    persistent one; ``max_registers`` 0 leaves the registers to the compiler.

    Raises:
        ValueError: on an override that does not parse."""
    override = os.environ.get(TUNING_ENV, "").strip()
    if not override:
        return None, None, None, None, None, None
    path, *ints = [f.strip() for f in override.split(",")]
    if (path not in COEF_PATHS or len(ints) > 5 or not all(f.isdecimal() for f in ints)
            or not all(int(f) > 0 for i, f in enumerate(ints) if i not in (2, 4))
            or (len(ints) == 5 and not 0 <= int(ints[4]) <= 255)):
        raise ValueError(f"{TUNING_ENV}={override!r}: expected PATH[,TILE_PAGES[,NUM_WARPS[,PROGRAMS_PER_SM"
                         f"[,STAGES[,MAX_REGISTERS]]]]] with PATH one of {', '.join(COEF_PATHS)}")
    tile_pages, num_warps, programs_per_sm, stages, max_registers = ([int(f) for f in ints] + [None] * 5)[:5]
    return path, tile_pages, num_warps, programs_per_sm, stages, max_registers


def programs_per_head(seqs: int, heads: int, tiles: int, programs_per_sm: int, device: torch.device) -> int:
    """``NPROG``, the programs per (KV head, sequence): ``programs_per_sm`` for each SM of the device (4 without a
    GPU, for the interpreter) shared over ``seqs * heads`` and rounded down (no more programs than fit at once), at
    least 1 and at most ``tiles``."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(tiles, sms * programs_per_sm // (seqs * heads)))


#: 32-bit registers of one SM (sm_80 and sm_90); ptxas allocates them to a thread in steps of 8
SM_REGISTERS = 65536


def register_cap(programs_per_sm: int, num_warps: int) -> int:
    """Registers a thread may take so that ``programs_per_sm`` programs of ``num_warps`` warps fit one SM's
    ``SM_REGISTERS`` at once: rounded down to a step of 8, at most 255 (the ISA's limit). A persistent program that
    does not fit waits for one that does to finish its whole walk (measured: a fourth program of 134 registers made
    the GLM 1M score kernel 1.4x slower than three)."""
    return min(255, SM_REGISTERS // (programs_per_sm * num_warps * 32) // 8 * 8)


#: whether the decode step takes the log-sum-exp partials from the persistent score kernel instead of a pass of
#: selection's own over the scores (``score_pages(lse_partials=True)``, ``select_pages(lse_partials=...)``): the
#: kernel's running sums cost it ~10% more instructions in its loop (``samples/score_sass.py --parts``), the pass
#: it saves is one launch; ``samples/bench_score.py`` times both as score + select
LSE_PARTIALS = False
#: environment override of :data:`LSE_PARTIALS`, ``1`` or ``0``
LSE_PARTIALS_ENV = "LOCKS_LSE_PARTIALS"


def use_lse_partials() -> bool:
    """:data:`LSE_PARTIALS`, or ``$LOCKS_LSE_PARTIALS`` (``1``/``0``) when set.

    Raises:
        ValueError: on another value."""
    value = os.environ.get(LSE_PARTIALS_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{LSE_PARTIALS_ENV}={value!r}: expected 1 or 0")
    return LSE_PARTIALS if not value else value == "1"

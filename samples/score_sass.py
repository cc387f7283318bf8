"""Static look at the score kernel for sm_90 without a GPU: registers, spills, shared memory and SASS
warp-instructions per page and KV head for each ``colwise8`` coefficient path and tile (CPU machine).

Compiles ``locks_kernels.score._score_pages_kernel`` with Triton for ``GPUTarget("cuda", 90, 32)``, pointers and
the query strides specialized as divisible by 16 (as the JIT does for real tensors), runs Triton's bundled
``ptxas -v`` for the register and spill counts and ``cuobjdump -sass`` for the instruction mix. Warp-instructions
per page-head = static instructions x warps / pages per program (the kernel has no loops). The argument types are
those of ``colwise8`` in the engine (bf16 query, fp16 centroid and scales, int8 basis and coefficients). These are
counts, not times: on the H200 (``samples/results/score.json``, 2026-12-02) the times at G = 16, 16 pages, 1M
tokens tracked the counts of the kernels as then compiled (``--no-ptx``) within the ``dot`` family (``dot``
510 -> 132.1 us, ``dot1`` 482 -> 121.5, ``dot1t`` 412 -> 112.1: about 0.2 us per warp-instruction per page-head), but
not across tiles (occupancy), across paths that lean on the quarter-rate conversion units (``half`` 502 -> 153.9:
I2F), or at G = 4 (``half`` 16 pages and ``dot1t`` 32 pages about equal in time at 388 and 217 instructions).

Usage::

    python samples/score_sass.py                       # the default grid of (G, pages, path)
    python samples/score_sass.py --groups 16 --tiles 8,16 --paths dot1,half --json OUT.json
    python samples/score_sass.py --groups 16 --tiles 16 --paths dot1t --lines 12   # where the instructions are
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIGNATURE = {
    "q_ptr": "*bf16", "centroid_ptr": "*fp16", "basis_ptr": "*i8", "coeffs_ptr": "*i8", "centroid_scale_ptr": "*fp16",
    "basis_scale_ptr": "*fp16", "coeffs_scale_ptr": "*fp16", "block_table_ptr": "*i32", "seq_lens_ptr": "*i32",
    "out_ptr": "*fp32", "stride_qs": "i32", "stride_qh": "i32", "stride_bt": "i32", "stride_os": "i32",
    "stride_oh": "i32", "scale": "fp32", "H": "i32", "PMAX": "i32",
}
DIVISIBLE_BY_16 = list(range(10)) + [10, 11]  # the pointers and the query's strides (H * D, D)


PERSISTENT_SIGNATURE = {
    k: v for k, v in SIGNATURE.items() if k not in ("centroid_scale_ptr", "out_ptr") and not k.startswith("stride")
} | {"out_ptr": "*fp32", "part_ptr": "*fp32"} | {k: v for k, v in SIGNATURE.items() if k.startswith("stride")} | {
    "scale": "fp32", "H": "i32", "PMAX": "i32", "NPROG": "i32"}


def analyse(groups: int, tile_pages: int, coef_path: str, num_warps: int = 4, head_dim: int = 128, rank: int = 8,
            page_size: int = 16, top: int = 12, ptx: bool = True, persistent: bool = False, stages: int = 0,
            maxnreg: int | None = None, parts: bool = False) -> dict:
    """One compile of the ``colwise8`` score kernel for sm_90a (``persistent``: the persistent grid of
    ``locks_kernels.score_persistent``, paths ``PERSISTENT_PATHS``, ``stages`` tiles in flight; its loop makes
    the static count per page-head an upper bound on the loop body's, the prologue and the tail loop being counted
    with it; ``loop_warp_instr_per_page_head`` counts the body of its longest loop alone). ``maxnreg`` caps the
    registers a thread (Triton's option of that name: more programs an SM, or spills); ``parts`` with the
    persistent kernel's log-sum-exp partials (``score_pages(lse_partials=True)``, what the engine runs).

    Returns:
        dict: ``registers`` (per thread), ``spill_stores_bytes``, ``shared_bytes``, ``sass_instructions`` (static,
        per warp), ``warp_instr_per_page_head`` and ``top`` opcode counts.
    Raises:
        RuntimeError: when ptxas fails or its report has no register count."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from locks_kernels.score import COEF_PATHS, PERSISTENT_PATHS, _score_pages_kernel
    from locks_kernels.score_persistent import _score_pages_persistent_kernel

    gp = max(2, triton.next_power_of_2(groups))
    rp = triton.next_power_of_2(rank)
    consts = dict(B=page_size, D=head_dim, R=rank, RP=rp, KP=max(16, rp), G=groups, GP=gp, PPB=4, TP=tile_pages)
    if persistent:
        if coef_path not in PERSISTENT_PATHS:
            raise ValueError(f"the persistent kernel has the {', '.join(PERSISTENT_PATHS)} paths only, not {coef_path}")
        consts |= dict(HALF=coef_path.startswith("half"), PTX=ptx, STAGES=stages, SHIFT=coef_path.endswith("c"),
                       PARTS=parts)
        fn, signature = _score_pages_persistent_kernel, PERSISTENT_SIGNATURE | {k: "constexpr" for k in consts}
        divisible = list(range(10)) + [10, 11]  # the pointers and the query's strides
    else:
        consts |= dict(FMT=4, CHANLOG_PATH=1, COEF_PATH=COEF_PATHS[coef_path], PTX=ptx)
        fn, signature, divisible = _score_pages_kernel, SIGNATURE | {k: "constexpr" for k in consts}, DIVISIBLE_BY_16
    attrs = {(i,): [["tt.divisibility", 16]] for i in divisible}
    options = {"num_warps": num_warps} | ({"maxnreg": maxnreg} if maxnreg else {})
    kernel = triton.compile(ASTSource(fn, signature, consts, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        ptx_file, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx_file.write_text(kernel.asm["ptx"])
        report = subprocess.run(
            [str(bin_dir / "ptxas"), "-v", "--gpu-name", "sm_90a", str(ptx_file), "-o", str(cubin)],
            capture_output=True, text=True)
        regs = re.search(r"Used (\d+) registers", report.stderr)
        if report.returncode or not regs:
            raise RuntimeError(f"ptxas failed: {report.stderr.strip()[-300:]}")
        spill = re.search(r"(\d+) bytes spill stores", report.stderr)
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        listing = subprocess.run([str(bin_dir / "nvdisasm"), "-g", "-c", str(cubin)], capture_output=True, text=True,
                                 check=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    loop = longest_loop(sass)
    mix = collections.Counter(op.split(".")[0] for op in ops)
    return {"groups": groups, "tile_pages": tile_pages, "coef_path": coef_path, "num_warps": num_warps,
            "persistent": persistent,
            "registers": int(regs.group(1)), "spill_stores_bytes": int(spill.group(1)) if spill else 0,
            "shared_bytes": kernel.metadata.shared, "sass_instructions": len(ops), "ptx": ptx,
            "mufu_lg2": sum(1 for op in ops if op.startswith("MUFU.LG2")),
            "i2f": sum(1 for op in ops if op.startswith("I2F")),
            "ldgsts": sum(1 for op in ops if op.startswith("LDGSTS")),
            "by_line": instructions_by_line(listing, top),
            "warp_instr_per_page_head": round(len(ops) * num_warps / tile_pages, 1),
            "loop_warp_instr_per_page_head": round(loop * num_warps / tile_pages, 1) if loop else None,
            "maxnreg": maxnreg, "top": dict(mix.most_common(top))}


def longest_loop(sass: str) -> int:
    """Instructions in the longest loop of a ``cuobjdump -sass`` listing (a branch back to an earlier address, the
    instructions from its target to it), 0 without one: per iteration, what a persistent program issues per tile."""
    addrs, best = [], 0
    for addr, text in re.findall(r"/\*([0-9a-f]{4})\*/\s+([^;]*);", sass):
        addrs.append(int(addr, 16))
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addrs[-1]:
            best = max(best, sum(1 for a in addrs if int(target.group(1), 16) <= a))
    return best


def instructions_by_line(listing: str, top: int) -> list[list]:
    """``[[file:line, SASS instructions, {opcode: count}], ...]``, the ``top`` source lines with the most static
    instructions, from ``nvdisasm -g`` (Triton compiles with line info): where a kernel's instructions come from."""
    where, count, ops = None, collections.Counter(), collections.defaultdict(collections.Counter)
    for text in listing.splitlines():
        mark = re.search(r'//## File "([^"]+)", line (\d+)', text)
        if mark:
            where = f"{Path(mark.group(1)).name}:{mark.group(2)}"
            continue
        op = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
        if op:
            count[where] += 1
            ops[where][op.group(1).split(".")[0]] += 1
    return [[w, n, dict(ops[w].most_common(4))] for w, n in count.most_common(top)]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=_ints, default=[4, 16], help="comma list of query heads per KV head")
    ap.add_argument("--tiles", type=_ints, default=[16, 32], help="comma list of pages per program")
    ap.add_argument("--paths", default="dot,dot1,half,dot1t,halft", help="comma list of colwise8 coefficient paths")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--no-ptx", action="store_true",
                    help="tl.log2 and .to(tl.float16) instead of the inline PTX (as under the interpreter)")
    ap.add_argument("--persistent", action="store_true", help="the persistent grid (dot1t, halft, dot1tc, halftc)")
    ap.add_argument("--stages", type=int, default=2, help="tiles in flight per persistent program")
    ap.add_argument("--maxnreg", type=int, help="cap on registers a thread (Triton's maxnreg)")
    ap.add_argument("--parts", action="store_true", help="the persistent kernel with its log-sum-exp partials")
    ap.add_argument("--lines", type=int, default=0, help="also print the N source lines with the most instructions")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    try:
        import triton  # noqa: F401
    except ImportError:
        print("error: triton is not installed (pip install triton==3.6.0)", file=sys.stderr)
        return 2
    from locks_kernels.score import COEF_PATHS

    paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in paths if p not in COEF_PATHS]
    if unknown:
        print(f"error: unknown coefficient path(s) {', '.join(unknown)}; allowed {', '.join(COEF_PATHS)}",
              file=sys.stderr)
        return 2
    rows = []
    print("| G | pages | path | registers | spill B | shared B | warp-instr / page-head (loop) | top opcodes |")
    print("|---|---|---|---|---|---|---|---|")
    for groups in args.groups:
        for tile in args.tiles:
            for path in paths:
                try:
                    row = analyse(groups, tile, path, args.warps, ptx=not args.no_ptx, persistent=args.persistent,
                                  stages=args.stages, maxnreg=args.maxnreg, parts=args.parts)
                except Exception as exc:  # a tile the compiler refuses: report it and go on
                    print(f"| {groups} | {tile} | {path} | failed: {type(exc).__name__}: {str(exc)[:120]} |")
                    continue
                rows.append(row)
                mix = ", ".join(f"{k} {v}" for k, v in list(row["top"].items())[:6])
                loop = row["loop_warp_instr_per_page_head"]
                print(f"| {groups} | {tile} | {path} | {row['registers']} | {row['spill_stores_bytes']} | "
                      f"{row['shared_bytes']} | {row['warp_instr_per_page_head']}{'' if loop is None else f' ({loop})'}"
                      f" | {mix} |")
                for where, n, line_ops in row["by_line"][: args.lines]:
                    print(f"|   | | {where} | {n} | {', '.join(f'{k} {v}' for k, v in line_ops.items())} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())

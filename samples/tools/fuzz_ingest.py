"""Fuzz ``load_document`` with N Hypothesis-drawn inputs and record what happened.

Each input kind of ``locks_tools.fuzz_check.input_kinds`` (mutated and hand-built hostile PDFs, random bytes after
a valid header, hostile and mutated EPUBs, text and Markdown in mixed encodings with control characters) gets an
equal share of N, the kinds taking turns in chunks of 500 (``--time-budget-s`` may stop the run early, the kinds
still balanced). This process draws the inputs (Hypothesis, generate phase only, seeded by ``--seed``); one worker
process loads them, so a crash, a hang (no answer within ``--hang-s``) or a memory blow-up (the worker's address
space is capped at ``--memory-limit-gib``) costs a restarted worker, not the run. Every input that breaks the
property (``locks_tools.fuzz_check``) is saved under ``failures/``; the slowest input is saved too.

Writes ``fuzz_ingest.json`` (inputs, loaded, errors by type, problems, hangs and crashes per kind; the slowest
input and its time; the largest peak RSS growth of one input; the worker's and this process's peak RSS) and a
``MANIFEST.md`` into ``<out>/<date>_<cpu-or-gpu>_<commit>/``.

Needs the project installed with its test extra (Hypothesis, fpdf2)::

    python samples/tools/fuzz_ingest.py                      # 100,000 inputs, seed 0
    python samples/tools/fuzz_ingest.py -n 2000 --seed 7 --out /tmp/fuzz
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from locks_tools.fuzz_run import Tally, Worker
from locks_bench.results import RESULTS, command_text, header, run_folder, write_result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--inputs", type=int, default=100_000, help="inputs in all (default 100,000)")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed; chunk c uses seed * 100003 + c")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default samples/results)")
    parser.add_argument("--kinds", nargs="*", help="only these input kinds (default: all)")
    parser.add_argument("--hang-s", type=float, default=60.0, help="seconds without an answer that make a hang")
    parser.add_argument("--memory-limit-gib", type=float, default=4.0, help="the worker's address-space cap")
    parser.add_argument("--time-budget-s", type=float, default=0, help="stop drawing after this many seconds "
                        "(the kinds stay balanced: they take turns in chunks); 0 for none")
    parser.add_argument("--note", default="", help="a sentence for MANIFEST.md")
    args = parser.parse_args(argv)
    head = header("tools/fuzz_ingest.py", argv)
    folder = args.out / run_folder(head)
    (folder / "failures").mkdir(parents=True, exist_ok=True)
    from locks_tools import fuzz_check

    kinds = {k: v for k, v in fuzz_check.input_kinds().items() if not args.kinds or k in args.kinds}
    pool = Worker(args.hang_s, args.memory_limit_gib)
    tally = Tally(folder)
    start = time.perf_counter()
    stopped = False
    try:
        for number, (kind, count) in enumerate(schedule(list(kinds), args.inputs)):
            if args.time_budget_s and time.perf_counter() - start > args.time_budget_s:
                stopped = True
                break
            fuzz_kind(kind, kinds[kind], count, args.seed * 100_003 + number, pool, tally)
            if kind == list(kinds)[-1]:
                print(f"{tally.total} inputs, {time.perf_counter() - start:.0f} s", flush=True)
    finally:
        worker_peak = pool.close()
    wall = time.perf_counter() - start
    result = {**head, **tally.summary(), "inputs_asked": args.inputs, "stopped_by_time_budget": stopped,
              "wall_s": round(wall, 1), "inputs_per_s": round(tally.total / wall, 1),
              "page_time_limit_s": fuzz_check.page_time_limit(), "hang_s": args.hang_s,
              "memory_cap_mib": fuzz_check.MEMORY_CAP_BYTES >> 20, "worker_address_space_gib": args.memory_limit_gib,
              "worker_peak_rss_mib": worker_peak,
              "parent_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10}
    write_result(folder / "fuzz_ingest.json", result)
    write_manifest(folder, result, args.note)
    print(f"{tally.total} inputs in {wall:.0f} s ({result['inputs_per_s']}/s): {result['totals']}")
    print(f"wrote {folder / 'fuzz_ingest.json'}")


CHUNK = 500
"""inputs one Hypothesis run draws: Hypothesis keeps every drawn value until its run ends, so runs stay short"""


def schedule(kinds: list[str], inputs: int) -> list[tuple[str, int]]:
    """(kind, count) chunks of at most :data:`CHUNK` inputs, the kinds taking turns, ``inputs`` in all, each kind an
    equal share (the first kinds one more when ``inputs`` does not divide)."""
    left = {k: inputs // len(kinds) + (i < inputs % len(kinds)) for i, k in enumerate(kinds)}
    chunks = []
    while any(left.values()):
        for kind in kinds:
            if left[kind]:
                chunks.append((kind, min(CHUNK, left[kind])))
                left[kind] -= chunks[-1][1]
    return chunks


def fuzz_kind(kind: str, strategy, count: int, seed: int, pool: Worker, tally: Tally) -> None:
    """Draw ``count`` inputs of ``kind`` and have the worker load them, two in flight."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    from locks_tools.fuzz_check import PAGES

    @hypothesis_seed(seed)
    @settings(max_examples=count, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.tuples(strategy, PAGES))
    def draw(case):
        (data, name), pages = case
        for done in pool.submit((tally.total, kind, data, name, pages)):
            tally.add(*done)
        tally.total += 1

    draw()
    for done in pool.drain():
        tally.add(*done)


def write_manifest(folder: Path, result: dict, note: str) -> None:
    """``MANIFEST.md`` of the run folder: the command, what the files hold, the note."""
    totals = result["totals"]
    lines = [f"# {folder.name}", "", "Command:", "", f"    {command_text(result['command'])}", "", "Files:", "",
             f"- `fuzz_ingest.json`: {result['inputs']:,} inputs over {len(result['per_kind'])} kinds in "
             f"{result['wall_s']:,} s ({result['inputs_per_s']} inputs/s, 1 worker process): "
             f"{totals.get('loaded', 0):,} loaded, {totals.get('problems', 0)} problems, {totals.get('hangs', 0)} "
             f"hangs, {totals.get('crashes', 0)} crashes; counts per kind, errors by type, slowest input, peak RSS",
             f"- `{result['slowest'].get('file', '-')}`: the slowest input ({result['slowest']['seconds']} s)",
             f"- `failures/`: the inputs that broke the property ({len(result['failures'])})", ""]
    if note:
        lines += [note, ""]
    (folder / "MANIFEST.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()

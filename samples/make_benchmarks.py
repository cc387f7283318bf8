"""Generate ``samples/BENCHMARKS.md`` and the README's results table from the summary JSON of ``samples/results/``,
and ``samples/results/INDEX.md`` from its run folders.

    python samples/make_benchmarks.py            # rewrite the three
    python samples/make_benchmarks.py --check    # exit 1 when any differs from what the results give
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from locks_bench.benchmarks_doc import benchmarks_md, rewrite_readme
from locks_bench.results import ROOT
from locks_bench.results_index import index_md


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "samples" / "results")
    parser.add_argument("--benchmarks", type=Path, default=ROOT / "samples" / "BENCHMARKS.md")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--index", type=Path, default=None, help="default: RESULTS/INDEX.md")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    args = parser.parse_args(argv)
    wanted = {args.benchmarks: benchmarks_md(args.results),
              args.index or args.results / "INDEX.md": index_md(args.results)}
    readme = args.readme.read_text() if args.readme.is_file() else ""
    try:
        wanted[args.readme] = rewrite_readme(readme, args.results)
    except ValueError as err:
        print(f"{args.readme}: {err} (README table left out)", file=sys.stderr)
    stale = [path for path, text in wanted.items() if not path.is_file() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} differs from the results: run python samples/make_benchmarks.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Demo: ``python -m kvstate.numerics`` prints every resume case against a full recompute."""

from __future__ import annotations

import argparse
import time

from .scenario import TOL, default_scenario, format_table, run_cases


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 1 if any case is not as expected (intact must be bit-exact)."""
    ap = argparse.ArgumentParser(prog="python -m kvstate.numerics", description=__doc__)
    ap.add_argument("--seed", type=int, default=0, help="weight and prompt seed")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    sc = default_scenario(args.seed)
    g = sc.model.geometry
    results = run_cases(sc)
    print(
        f"tiny hybrid model, geometry {g.name!r}: layers {','.join(g.layers)}, m={g.csa_ratio}, "
        f"m'={g.hca_ratio}, n_win={g.n_win}, top_k={g.top_k}; prompt {len(sc.tokens)} tokens, "
        f"boundary h={sc.h}; changed = max |diff| > {TOL:g}"
    )
    print(format_table(results))
    ok = all(r.as_expected for r in results)
    print(
        f"{'all cases as expected' if ok else 'SOME CASES NOT AS EXPECTED'} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

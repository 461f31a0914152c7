"""Benchmark: proof time as the pool size and the BMC depth grow.

The parametric obligations (init, 1-induction) do not depend on the pool size: they are timed
once.  Bounded model checking and k-induction over concrete pools do: they are timed on a grid
of (pool size, depth).  Each cell is one fresh-solver query per invariant; a cell that exceeds
the per-query timeout is reported as such rather than extrapolated.

    python bench/prove_bench.py [--pools 1 2 3 4] [--depths 2 4 6 8] [--timeout 60]
"""

from __future__ import annotations

import argparse
import time

from kvstate.proofs import Config, prove
from kvstate.proofs.engine import bmc_find, k_induction, violation_goal
from kvstate.spec import default_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 4, 6, 8])
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per query")
    ap.add_argument("--invariants", nargs="*", default=None, help="default: all")
    args = ap.parse_args()
    table = default_table()
    tmo = int(args.timeout * 1000)

    t0 = time.perf_counter()
    rep = prove(table, kinds=["init", "inductive"], jobs=1, config=Config(timeout_ms=tmo))
    print(
        f"parametric init + 1-induction (any pool size): {len(rep.results)} obligations, "
        f"{time.perf_counter() - t0:.1f} s, ok={rep.ok}"
    )

    invs = [i for i in table.invariants if args.invariants is None or i.name in args.invariants]
    print()
    print("BMC from Init, all invariants (sum of one query per invariant), seconds:")
    print("pool \\ depth " + "".join(f"{d:>10}" for d in args.depths))
    for n in args.pools:
        row = f"N={n:<10} "
        for d in args.depths:
            t1 = time.perf_counter()
            status = "ok"
            for inv in invs:
                res, _ = bmc_find(table, d, n, violation_goal(inv), tmo)
                if res != "unsat":
                    status = res
                    break
            dt = time.perf_counter() - t1
            row += f"{dt:>9.2f}{'' if status == 'ok' else '!'}"
        print(row + "   (! = a query returned sat/unknown)")

    print()
    print("k-induction (k=1) of the bounded ghost-counter invariant, seconds:")
    for n in args.pools:
        t1 = time.perf_counter()
        res = k_induction(table, table.invariant("ghost_counters"), n, 1, tmo)
        print(f"N={n}: {time.perf_counter() - t1:.2f} s ({res})")


if __name__ == "__main__":
    main()

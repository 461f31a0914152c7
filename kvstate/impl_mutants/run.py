"""``run``: each chosen mutant's killing test in a forked child, its verdict kept in the store."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Iterable

from kvstate.impl_mutants.killer import SERVER_ENV
from kvstate.impl_mutants.mutants import diff, enumerate_mutants, mutated_source, picked, sample
from kvstate.impl_mutants.reach import BaselineFails, baselines, is_reached
from kvstate.impl_mutants.store import context, load, results, results_db
from kvstate.impl_mutants.walks import Plan, ServerPool, plan, remote_on
from kvstate.mutant_runner import Job, Outcome, Runner, Target


def run(args: argparse.Namespace, target: Target) -> int:
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import MutationSpec, TestOutcome, WorkerOutcome, WorkItem, WorkResult

    chosen = [
        m for m in sample(enumerate_mutants(target), args.sample, args.seed) if picked(m, args)
    ]
    if args.survivors_of:  # e.g. the dev walk over what the ci run let through
        a = argparse.Namespace(**{**vars(args), "profile": args.survivors_of})
        alive = {m.id for m, r in load(a, target) if r["verdict"] == "survived"}
        chosen = [m for m in chosen if m.id in alive]
    ctx = context(args, target)
    with use_db(str(results_db(args.store, args.profile))) as db:
        known = {w.job_id for w in db.work_items}
        db.add_work_items(
            WorkItem.single(
                m.job_id,
                MutationSpec(
                    str(target.folder / m.file), m.operator, m.occurrence,
                    (m.line, m.col), (m.line, m.col + 1), definition_name=m.definition,
                ),
            )
            for m in chosen
            if m.job_id not in known
        )  # fmt: skip
        prior = results(db)
        todo = [m for m in chosen if prior.get(m.job_id, {}).get("context") != ctx]
        print(
            f"{len(chosen)} mutants chosen, {len(chosen) - len(todo)} already measured on these "
            f"sources, {len(todo)} to run (profile {args.profile}, -j {args.jobs})",
            flush=True,
        )
        if not todo:
            return 0
        # the baseline gets a generous limit whatever ``--timeout`` says: it is the unmutated
        # sources, and a loaded machine must not turn it into a false "the test fails"
        runner = Runner(target, args.profile, max(args.timeout or 0.0, 900.0), args.jobs)
        pool = ServerPool() if remote_on(args, target) else None
        try:
            # the unmutated baselines, traced: the killing tests must pass on them; they set the
            # timeouts, and the lines they run choose each mutant's walks and tell a survivor
            # no walk reached
            try:
                reach = baselines(runner, args, target, pool)
            except BaselineFails as exc:
                print(exc, file=sys.stderr)
                return 2
            limit = {w: args.timeout or max(30.0, 4 * wall) for w, wall in reach.walls.items()}
            print(
                "baseline (traced): "
                + "; ".join(f"the {w} walk passes in {reach.walls[w]:.1f} s" for w in limit)
                + "; timeout per walk "
                + ", ".join(f"{w} {s:g} s" for w, s in limit.items()),
                flush=True,
            )
            plans: dict[str, Plan] = {}
            for m in todo:
                in_remote = pool is not None and is_reached(target, m, reach.remote)
                plans[m.job_id] = plan(target, is_reached(target, m, reach.api), in_remote)
            print(
                "walks: "
                + ", ".join(
                    f"{w} {n}" for w, n in Counter(p.walks for p in plans.values()).items()
                ),
                flush=True,
            )
            by_job = {m.job_id: m for m in todo}
            originals: dict[str, str] = {}
            t0, count = time.monotonic(), Counter[str]()

            def work() -> Iterable[Job]:
                for m in todo:
                    text, mutated = mutated_source(target, m)
                    if mutated is None:
                        db.set_result(m.job_id, WorkResult(worker_outcome=WorkerOutcome.NO_TEST))
                        continue
                    try:
                        compile(mutated, m.file, "exec")
                    except SyntaxError as exc:
                        rec = {"verdict": "incompetent", "context": ctx, "detail": str(exc)}
                        db.set_result(
                            m.job_id,
                            WorkResult(
                                WorkerOutcome.NORMAL,
                                json.dumps(rec),
                                TestOutcome.INCOMPETENT,
                                diff(text, mutated, m.file),
                            ),
                        )
                        continue
                    originals[m.job_id] = diff(text, mutated, m.file)
                    p = plans[m.job_id]
                    env = {}
                    if "remote" in p.walks and pool is not None:
                        env[SERVER_ENV] = pool.take(m.job_id).url
                    seconds = sum(limit[w] for w in p.walks.split("+"))
                    yield Job(m.job_id, m.file, mutated, p.killer, seconds, env)

            def done(job: str, o: Outcome) -> None:
                m = by_job[job]
                if pool is not None:
                    pool.give(job)
                rec = {"verdict": o.verdict, "seconds": o.seconds, "wall": o.wall, "kind": o.kind,
                       "detail": o.detail, "context": ctx, "profile": args.profile,
                       **o.extra, "walks": plans[job].walks}  # fmt: skip
                outcome = TestOutcome.SURVIVED if o.verdict == "survived" else TestOutcome.KILLED
                db.set_result(
                    job,
                    WorkResult(
                        WorkerOutcome.NORMAL,
                        json.dumps(rec, default=str),
                        outcome,
                        originals.pop(job, ""),
                    ),
                )
                count[o.verdict] += 1
                n = sum(count.values())
                print(
                    f"[{n}/{len(todo)} {time.monotonic() - t0:6.0f} s] {o.verdict:<8} {m.id:<58} "
                    f"{o.wall:5.1f} s  {plans[job].walks:<10} {o.kind[:50]}",
                    flush=True,
                )

            runner.run(work(), done)
        finally:
            runner.close()
            if pool is not None:
                pool.close()
    return 0

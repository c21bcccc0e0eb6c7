"""The README's reward-service run against a stand-in grader: healthy, failing 1 request in 7 with
503, and answering 1 in 7 with 429 and ``Retry-After``.

The stand-in (tests/reward_standin.py, a thread of this process) grades exact matches after
``--latency-ms`` per request; with ``flaky`` every 7th request it receives (retries included) is
answered 503, or 429 with ``Retry-After: 1`` (a whole second, as servers write it). Each run is
``rllab run`` in this process (imports paid once) of the README's command:

    task=dataset task.path=examples/data/sums_trl.jsonl model.tiny.tokenizer=chat task.rewards=remote
    task.reward_knobs={"remote": {"url": ...}} --steps 2

with every client knob at its default (``max_concurrency`` 8, ``backoff_s`` 0.5, ``jitter`` 0.5,
``cache_size``). Two tables:

- from scratch (the README command run for the first time): each run warm-starts the tiny model in a fresh model
  cache (its probes and held-out evaluation call the service too), then trains 2 steps, each
  evaluated; ``--cold-repeats`` rounds of the three services (0: only the healthy run, for the
  calls). The healthy run also says how many requests the service got, how many distinct bodies
  among them, and how many rows the run asked a score for (before identical ones are merged);
- from the cached model: ``--repeats`` rounds of the three services, each run starting from the
  model the first healthy run warm-started (2 steps and the evaluations: 4 scoring calls).

Per service: the run's wall time, median and min–max, the ratio of medians to the healthy one,
and the requests the service got (median). The load average (os.getloadavg) is printed before and after.
Each run also says its scoring calls (one per call of the remote reward that had requests to send)
and the seconds the run's main thread waited on them, and, from scratch, the warm start's tail: how
long after its last probe's call began the warm start returned (the probe's verdict, and whatever
the warm start waits for after it); ``--calls`` lists the calls for the first round.

    python benchmarks/bench_reward_service.py                    # 1 round from scratch, 3 from the cached model
    python benchmarks/bench_reward_service.py --cold-repeats 3 --repeats 5 --latency-ms 50

``--code CHECKOUT`` runs another checkout's rllab (and plugins) against the same stand-in (this
checkout's). ``--against CHECKOUT`` compares two versions under the same load: ``--cold-repeats``
rounds, each running this benchmark once per version (a process each, the order alternating from
round to round) with one round from scratch and, unless ``--repeats 0``, one from the cached
model; then per version the medians, each round's ratio to the healthy run, the seconds the
run's main thread waited on the service and the warm start's tail (what the load changes least):

    python benchmarks/bench_reward_service.py --cold-repeats 3 --against /path/to/the/checkout/before
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _stand_in():
    """This checkout's stand-in (tests/reward_standin.py), whichever checkout's rllab runs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_reward_standin", ROOT / "tests" / "reward_standin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RewardStandIn


RewardStandIn = _stand_in()

SERVICES = {
    "healthy": None,
    "503 1 in 7": (7, 503, {}),
    "429 1 in 7, Retry-After 1": (7, 429, {"Retry-After": "1"}),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = free_port()
"""Every stand-in listens here: the URL is part of the task's config, and so of the warm-started
model's cache key."""


def rotated(names: list[str], k: int) -> list[str]:
    k %= len(names)
    return names[k:] + names[:k]


def one_run(service: tuple | None, latency_s: float, work: Path, name: str, *more: str) -> dict:
    """One ``rllab run`` against a fresh stand-in (warm-starting the tiny model unless $RLLAB_CACHE
    holds it); its wall time and what the service saw."""
    from rllab.cli import main
    from rllab_tasks.reward_service import forget

    forget()  # nothing remembered from the run before (each stand-in has its own URL anyway)
    with RewardStandIn(flaky=service, latency_s=latency_s, port=PORT) as s:
        knobs = json.dumps({"remote": {"url": s.url + "/score"}})
        args = ["run", "task=dataset", f"task.path={ROOT / 'examples/data/sums_trl.jsonl'}", "model.tiny.tokenizer=chat",
                "task.rewards=remote", f"task.reward_knobs={knobs}", "--steps", "2", "train.checkpoint_every=0",
                "--run-dir", str(work / name), "-q", *more]
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err, \
                scoring_calls(t0) as calls:
            rc = main(args)
        wall = time.perf_counter() - t0
        if rc != 0:
            raise SystemExit(f"{name}: rllab run exited {rc}:\n{err.getvalue()[-2000:]}")
        bodies = [json.dumps(b, sort_keys=True) for b in s.bodies]
        failed = s.failed
    return {"wall": wall, "calls": len(bodies), "distinct": len(set(bodies)), "failed": failed, "scoring": calls}


@contextlib.contextmanager
def scoring_calls(t0: float):
    """Record each scoring call of the remote reward (one ``ask_all``): yields a list of dicts with
    its start (s into the run), requests, seconds, retries waited, whether the run's main
    thread waited on it (a call in another thread — a warm-start probe, the warm start's held-out
    scores, the evaluation before step 1 — overlaps other work) and whether a warm-start probe
    made it; the list's last item, ``{"warm_end": s}``, is when the warm start returned (when it ran)."""
    import threading

    import rllab.models.tiny as tiny
    import rllab_tasks.remote_rewards as rr

    calls: list[dict] = []
    plain, build = rr.ask_all, tiny.get_or_build
    ended: list[float] = []

    def built(*a, **k):
        try:
            return build(*a, **k)
        finally:
            ended.append(time.perf_counter() - t0)

    def timed(url, bodies, knobs, **kw):
        waits: list = []
        start = time.perf_counter()
        try:
            return plain(url, bodies, knobs, waits=waits, **kw)
        finally:
            calls.append({"at": start - t0, "requests": len(bodies), "seconds": time.perf_counter() - start,
                          "retries": len(waits), "main": threading.current_thread() is threading.main_thread(),
                          "probe": threading.current_thread().name == "warm-start-probe"})

    rr.ask_all, tiny.get_or_build = timed, built
    try:
        yield calls
    finally:
        rr.ask_all, tiny.get_or_build = plain, build
        if ended:
            calls.append({"warm_end": ended[0]})


def warm_tail(calls: list[dict]) -> float | None:
    """Seconds from the warm start's last probe call (its start) to the warm start's end: the
    probe's own verdict and, if the warm start waits for them, its slowest answers."""
    end = [c["warm_end"] for c in calls if "warm_end" in c]
    probes = [c["at"] for c in calls if c.get("probe")]
    return end[0] - max(probes) if end and probes else None


def say_calls(calls: list[dict]) -> str:
    """The scoring calls of a run, in words: how many, the seconds the main thread waited on them,
    and when the warm start ended after its last probe's call began."""
    tail = warm_tail(calls)
    calls = [c for c in calls if "warm_end" not in c]
    main = [c for c in calls if c["main"]]
    return (f"{len(calls)} scoring calls, {sum(c['seconds'] for c in main):.1f} s waited in the main thread over "
            f"{len(main)} of them, {sum(c['seconds'] for c in calls) - sum(c['seconds'] for c in main):.1f} s in "
            f"other threads" + ("" if tail is None else f"; the warm start ended {tail:.2f} s after its last probe's call began"))


@contextlib.contextmanager
def counting_rows():
    """Count the rows the run asks the remote reward to score (before any is found identical or
    remembered): yields a one-item list holding the count."""
    import rllab_tasks.remote_rewards as rr

    rows, plain = [0], rr.score_unique

    def counted(keys, ask, config, report=None):
        rows[0] += len(keys)
        return plain(keys, ask, config, report)

    rr.score_unique = counted
    try:
        yield rows
    finally:
        rr.score_unique = plain


def table(title: str, runs: dict[str, list[dict]]) -> None:
    base = statistics.median(r["wall"] for r in runs["healthy"])
    print(f"\n{title}")
    print("service                       runs  median s   min–max s     × healthy   requests  distinct  failed")
    for name, rs in runs.items():
        w = [r["wall"] for r in rs]
        med = statistics.median(w)
        print(f"{name:28s} {len(w):4d}  {med:8.1f}   {min(w):5.1f}–{max(w):5.1f}   {med / base:8.2f}   "
              f"{statistics.median(r['calls'] for r in rs):8.0f}  {statistics.median(r['distinct'] for r in rs):8.0f}  "
              f"{statistics.median(r['failed'] for r in rs):6.0f}")


def main_waited(r: dict) -> float:
    """Seconds the run's main thread waited on the service."""
    return sum(c["seconds"] for c in r["scoring"] if c.get("main"))


def against(args, other: Path) -> None:
    """Rounds of this benchmark, a process per version, alternating; then the comparison."""
    codes = {"this": args.code.resolve(), "other": other.resolve()}
    got: dict[str, list[dict]] = {k: [] for k in codes}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(max(1, args.cold_repeats)):
            for name in rotated(list(codes), rep):
                out = Path(tmp) / f"{name}-{rep}.json"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--code", str(codes[name]), "--cold-repeats", "1",
                       "--repeats", "1" if args.repeats else "0", "--latency-ms", str(args.latency_ms), "--json", str(out),
                       *(["--calls"] if args.calls and rep == 0 else [])]
                print(f"\n## round {rep}, {name}: {codes[name]}", flush=True)
                subprocess.run(cmd, check=True)
                got[name].append(json.loads(out.read_text()))
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for part, title in (("cold", "from scratch"), ("warm", "from the cached model")):
        if part == "warm" and not args.repeats:
            continue
        print(f"\n{title}: per version, median [min, max] s over {len(got['this'])} rounds; × healthy (ratio of medians; "
              "each round's); main thread's wait on the service, median [min, max] s")
        for name in codes:
            rounds = [g[part] for g in got[name]]
            base = statistics.median(r["healthy"][0]["wall"] for r in rounds)
            for service in SERVICES:
                w = [r[service][0]["wall"] for r in rounds]
                each = " ".join(f"{r[service][0]['wall'] / r['healthy'][0]['wall']:.2f}" for r in rounds)
                m = [r[service][0]["main_waited"] for r in rounds]
                t = [r[service][0]["warm_tail"] for r in rounds if r[service][0].get("warm_tail") is not None]
                tail = f"  warm start's tail {statistics.median(t):.2f} [{min(t):.2f}, {max(t):.2f}]" if t else ""
                print(f"  {name:5s} {service:28s} {statistics.median(w):6.1f} [{min(w):5.1f}, {max(w):5.1f}]  "
                      f"× {statistics.median(w) / base:.2f} ({each})  main waited {statistics.median(m):4.1f} "
                      f"[{min(m):.1f}, {max(m):.1f}]{tail}  requests {statistics.median(r[service][0]['calls'] for r in rounds):.0f}")
    print("\nload averages per round: " + "; ".join(f"{name} {g['load_before'][0]:.2f}→{g['load_after'][0]:.2f}"
                                                   for rep in range(len(got["this"])) for name, g in
                                                   ((n, got[n][rep]) for n in codes)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cold-repeats", type=int, default=1,
                    help="rounds of the three services from scratch (warm start included: the issue's run)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the three services from the cached model")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="the stand-in's time to grade one request")
    ap.add_argument("--calls", action="store_true", help="list each scoring call of the first round from scratch")
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose rllab runs (default: this one)")
    ap.add_argument("--against", type=Path, help="compare with this checkout, round by round (see above)")
    ap.add_argument("--json", type=Path, help="also write the runs here")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.against is not None:
        return against(args, args.against)
    code = args.code.resolve()
    sys.path[:0] = [str(code), str(code / "plugins")]
    import rllab

    if not Path(rllab.__file__).resolve().is_relative_to(code):
        raise SystemExit(f"--code {code}: rllab was imported from {rllab.__file__}")
    load_before = os.getloadavg()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load_before)}", flush=True)
    latency = args.latency_ms / 1000
    cold: dict[str, list[dict]] = {k: [] for k in SERVICES}
    warm: dict[str, list[dict]] = {k: [] for k in SERVICES}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["RLLAB_CACHE"] = str(work / "models-untimed")
        one_run(None, latency, work, "untimed", "model.warm_start.steps=0", "train.eval_size=4")  # imports, first calls
        for rep in range(max(1, args.cold_repeats)):
            for name in rotated(list(SERVICES), rep):  # a different service first each round
                service = SERVICES[name]
                key = name.split()[0]
                os.environ["RLLAB_CACHE"] = str(work / f"models-{rep}-{key}")  # a fresh model cache: it warm-starts
                with counting_rows() as rows:
                    r = one_run(service, latency, work, f"cold-{rep}-{key}")
                r["rows"] = rows[0]
                cold[name].append(r)
                print(f"from scratch, round {rep}: {name:28s} {r['wall']:6.1f} s  requests {r['calls']:4d} "
                      f"(distinct {r['distinct']}, failed {r['failed']}, rows asked {r['rows']}); "
                      f"{say_calls(r['scoring'])}", flush=True)
                if args.calls and rep == 0:
                    for c in r["scoring"]:
                        if "warm_end" in c:
                            print(f"    at {c['warm_end']:6.2f} s: the warm start ended")
                            continue
                        print(f"    at {c['at']:6.2f} s: {c['requests']:4d} requests, {c['seconds']:5.2f} s, "
                              f"{c['retries']:3d} retries, {'main thread' if c['main'] else 'other thread'}")
                if args.cold_repeats < 1:
                    break  # only the healthy run, which warm-starts the cache for the runs below
        os.environ["RLLAB_CACHE"] = str(work / "models-0-healthy")
        for rep in range(args.repeats):
            for name in rotated(list(SERVICES), rep):
                service = SERVICES[name]
                r = one_run(service, latency, work, f"{rep}-{name.split()[0]}")
                warm[name].append(r)
                print(f"cached model, round {rep}: {name:28s} {r['wall']:6.1f} s  requests {r['calls']:4d} "
                      f"(distinct {r['distinct']}, failed {r['failed']}); {say_calls(r['scoring'])}", flush=True)
    h = cold["healthy"][0]
    print(f"\ncalls, healthy, from scratch: {h['calls']} requests for {h['distinct']} distinct bodies "
          f"({h['calls'] / max(1, h['distinct']):.2f} per distinct body) out of {h['rows']} rows asked a score")
    if args.cold_repeats >= 1:
        table("from scratch: warm start (probes, held-out evaluation) + 2 steps + 2 evaluations", cold)
    if args.repeats >= 1:
        table("from the cached warm-started model: 2 steps + 2 evaluations", warm)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json is not None:
        for runs in (cold, warm):
            for rs in runs.values():
                for r in rs:
                    r["main_waited"], r["warm_tail"] = main_waited(r), warm_tail(r["scoring"])
        args.json.write_text(json.dumps({"code": str(code), "load_before": load_before, "load_after": os.getloadavg(),
                                         "cold": cold, "warm": warm}))


if __name__ == "__main__":
    main()

"""Steps to a held-out accuracy threshold, per variant of a finished suite: the first evaluation step
at which each run's ``eval/accuracy`` reaches the threshold, mean over seeds with a 95%
percentile-bootstrap CI (runs that never reach it count as ``steps + eval_every``, and are counted).

    python benchmarks/suites/steps_to_threshold.py SUITE_DIR 0.35 0.40 [--csv OUT]
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
from scipy.stats import bootstrap


def evals(run: Path) -> list[tuple[int, float]]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "eval/accuracy" in m:
            out.append((int(m["step"]), float(m["eval/accuracy"])))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suite_dir", type=Path)
    p.add_argument("thresholds", type=float, nargs="+")
    p.add_argument("--csv", type=Path, default=None)
    args = p.parse_args(argv)
    rows = list(csv.DictReader((args.suite_dir / "runs.csv").open()))
    table = []
    for thr in args.thresholds:
        for variant in dict.fromkeys(r["variant"] for r in rows):
            steps, missed = [], 0
            for r in (r for r in rows if r["variant"] == variant):
                ev = evals(Path(r["run_dir"]))
                hit = next((s for s, a in ev if a >= thr), None)
                if hit is None:
                    missed += 1
                    hit = ev[-1][0] + (ev[-1][0] - ev[-2][0])
                steps.append(hit)
            x = np.array(steps, float)
            ci = bootstrap((x,), np.mean, method="percentile", random_state=0).confidence_interval if np.ptp(x) else (x[0], x[0])
            table.append({"threshold": thr, "variant": variant, "runs": len(x), "mean_steps": x.mean(), "ci_low": ci[0],
                          "ci_high": ci[1], "not_reached": missed, "steps": " ".join(str(int(s)) for s in x)})
            print(f"acc ≥ {thr:.0%}  {variant:8s} {x.mean():6.1f} [{ci[0]:.1f}, {ci[1]:.1f}]  runs {list(map(int, x))}  not reached {missed}")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(table[0]))
            w.writeheader()
            w.writerows(table)


if __name__ == "__main__":
    main()

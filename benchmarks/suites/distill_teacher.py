"""Prepare the teacher of benchmarks/suites/distill.toml: the suite's tiny model warm-started on
addition's demonstrations until it is right on ``--target`` of its probe (the student's warm start
stops at 0.25), linked as ``~/.cache/rllab/teachers/NAME`` (the warm start itself is cached with the
others, keyed by its config, so running this again costs nothing).

    python benchmarks/suites/distill_teacher.py            # then: rllab suite benchmarks/suites/distill.toml
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rllab.config import load_config
from rllab.training.trainer import Trainer

TEACHERS = Path("~/.cache/rllab/teachers").expanduser()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", default="addition-sft80", help="the link's name under ~/.cache/rllab/teachers")
    p.add_argument("--target", type=float, default=0.8, help="warm-start target accuracy of the teacher")
    p.add_argument("--steps", type=int, default=3000, help="most warm-start steps")
    args = p.parse_args(argv)
    cfg = load_config(None, [f"model.warm_start.target_accuracy={args.target}", f"model.warm_start.steps={args.steps}",
                             "model.warm_start.eval_limit=200"], preset="grpo")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(Trainer(cfg, run_dir=Path(tmp) / "teacher", progress=False).model_dir)
    TEACHERS.mkdir(parents=True, exist_ok=True)
    link = TEACHERS / args.name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(model_dir.resolve(), target_is_directory=True)
    print(f"teacher ready in {time.perf_counter() - t0:.0f} s: {link} -> {model_dir}")


if __name__ == "__main__":
    main()

"""rllab against TRL's ``GRPOTrainer``: throughput and learning curve, same model, task and settings.

Run::

    bash benchmarks/peers/setup_trl.sh                      # once: TRL in benchmarks/peers/.venv-trl
    python benchmarks/peers/compare_grpo.py                 # rllab's default steps × 3 repeats per framework
    python benchmarks/peers/compare_grpo.py --steps 5 --repeats 1   # a quick smoke run

Both frameworks start from the same warm-started tiny model directory (rllab's default model,
built and cached by :mod:`rllab.models.tiny` with the configured ``[model]`` settings, and handed
to rllab explicitly as ``model.path``) and train on the default task (2-digit addition) with
rllab's default GRPO settings, read from rllab's config rather than copied:

* P prompts × G samples per step (16 × 8 by default), ``rollout.max_new_tokens`` (8), temperature 1.0;
* group-normalised advantages ``(r − mean)/(std + ε)`` with ε = 1e-4 on both sides (TRL's
  constant; rllab's ``advantage.epsilon`` is set to match), PPO clip 0.2/0.2, token-mean loss
  over the step's batch, no KL (β = 0), no entropy bonus;
* one optimizer step per training step (1 epoch, 1 minibatch), AdamW with rllab's ``train.lr``
  and learning-rate schedule (warm-up and decay, re-implemented in trl_grpo.py; the learning
  rates both sides log are checked to agree), gradient clipping at ``train.max_grad_norm``,
  float32, CPU.

The resolved rllab config is written once to ``rllab-config.toml`` in the results folder and
every rllab run reads it, so defaults changing underneath a long benchmark cannot desynchronise
the two sides. Extra ``key=value`` arguments override rllab's config (``train.lr=1e-4``) and
are mirrored on the TRL side; a config TRL cannot mirror is refused.

The prompts are identical too: for each seed this script writes the exact prompts rllab draws at
each step (``task.train_examples(P, generator seeded from (seed, step))``) to a JSONL file, and
TRL reads it unshuffled, P rows per step. Sampling noise differs (each framework seeds its own
sampler from the same seed number).

Each repeat runs rllab and TRL once each, in separate processes, alternating which goes first,
each with ``--threads`` torch threads (default 1, through ``OMP_NUM_THREADS``).
Measured per step: ``time/step`` (the whole step), ``time/rollout`` (tokenise + generate) and
``perf/completions_per_s`` = completions / ``time/rollout``; the end-to-end throughput is
completions / ``time/step`` (the 10th percentile of ``time/step`` is shown too: on a shared
machine it is the least disturbed by other processes); generated tokens/s = completions × mean response length /
``time/rollout``. Throughput depends on how long the completions are (a batch decodes until its
longest row stops), which depends on where each run's policy has drifted, so the mean response
length is reported beside it; compare throughputs only where the lengths are similar. The first step of each run (one-off warm-up) is left out of the
timing medians. Reported: per-run medians, then the median and min–max over repeats, and the
ratio rllab/TRL. After all timed runs, held-out greedy accuracy of the initial and of every
final model is computed here by one shared function (:func:`rllab.models.tiny.evaluate_greedy`,
HF ``generate`` with greedy decoding, ``max_new_tokens`` as in training), so both frameworks are
scored by the same code. rllab's own end-of-run eval is reported beside it as a cross-check.

Results go to ``benchmarks/peers/results/grpo-TIMESTAMP/`` (git-ignored): ``results.json``,
``grpo_curves.png``, and each run's folder (rllab run directory / TRL output).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_TRL_PYTHON = HERE / ".venv-trl" / "bin" / "python"
STEP_KEYS = ("time/step", "time/rollout", "perf/completions_per_s", "rollout/reward", "rollout/response_length", "optim/lr")
TRL_EPSILON = 1e-4
"""The constant TRL adds to the group std; rllab's advantage.epsilon is set to it."""


# --------------------------------------------------------------------------- configuration


def experiment_config(steps: int | None, extra: list[str], lab):
    """rllab's default experiment (``steps`` steps if given), as ``rllab run`` would build it."""
    from rllab.config import load_config

    overrides = [f"advantage.epsilon={TRL_EPSILON}", "train.checkpoint_every=0", *extra]
    if steps is not None:
        overrides.insert(0, f"train.steps={steps}")
    return load_config(None, overrides, lab=lab)


def check_comparable(cfg, lab) -> dict:
    """The settings TRL is given, read from rllab's config; refuse configs TRL cannot mirror."""
    t, r = cfg.train, cfg.rollout
    algo = cfg.component("algorithm")
    loss = cfg.component("policy_loss")
    loss_cfg = lab.get("policy_loss", loss.name, **loss.knobs).config
    problems = []
    if algo.name != "rl":
        problems.append(f"algorithm = {algo.name!r} (GRPO needs 'rl')")
    if cfg.component("advantage").name != "grpo":
        problems.append(f"advantage = {cfg.component('advantage').name!r} (TRL computes grpo advantages)")
    if loss.name != "ppo_clip" or loss_cfg.clip_low != loss_cfg.clip_high:
        problems.append(f"policy_loss = {loss.name!r} {loss_cfg!r} (TRL's surrogate is ppo_clip with one ε)")
    if cfg.component("aggregation").name != "token-mean":
        problems.append(f"aggregation = {cfg.component('aggregation').name!r} (TRL's loss_type='dapo' is token-mean)")
    a = algo.config
    if (a.epochs, a.minibatches) != (1, 1):
        problems.append(f"algorithm.epochs/minibatches = {a.epochs}/{a.minibatches} (the TRL side does one update per step)")
    if a.kl_in != "none" or a.entropy_coef != 0:
        problems.append("KL penalties and the entropy bonus are not mirrored on the TRL side")
    if cfg.component("correction").name != "none" or r.dynamic_sampling or r.overlong_buffer:
        problems.append("importance corrections, dynamic sampling and overlong shaping are not mirrored")
    if (r.top_p, r.top_k) != (1.0, -1) or cfg.model.dtype not in ("float32", "auto") or cfg.model.device not in ("cpu", "auto"):
        problems.append("top-p/top-k sampling and non-float32 dtypes are not mirrored")
    if problems:
        raise SystemExit("cannot compare with TRL under this config:\n  " + "\n  ".join(problems))
    return {
        "prompts_per_step": r.prompts_per_step,
        "group_size": r.group_size,
        "max_new_tokens": r.max_new_tokens,
        "temperature": r.temperature,
        "lr": t.lr,
        "lr_schedule": t.lr_schedule,
        "warmup_steps": t.warmup_steps,
        "max_grad_norm": t.max_grad_norm,
        "clip": loss_cfg.clip_low,
        "weight_decay": t.weight_decay,
    }


def build_model_dir(cfg, task) -> Path:
    """The warm-started tiny model rllab trains by default (cached; built on the first call)."""
    from rllab.models import tiny as tinymodel

    if cfg.model.path:
        return Path(cfg.model.path).expanduser()
    return tinymodel.get_or_build(
        tinymodel.TinyModelConfig(**cfg.model.tiny),
        task,
        cfg.component("task").to_dict(),
        tinymodel.WarmStartConfig(**cfg.model.warm_start),
        progress=False,
    )


def write_prompts(task, seed: int, steps: int, prompts_per_step: int, path: Path) -> None:
    """The prompts rllab's trainer draws at steps 0 … steps − 1 for ``seed``, in order, as JSONL."""
    from rllab.algorithm import seed_for as _seed_for  # the trainer's own per-step seeding

    with open(path, "w") as f:
        for step in range(steps):
            gen = torch.Generator().manual_seed(_seed_for(seed, step, 0))
            for ex in task.train_examples(prompts_per_step, gen):
                f.write(json.dumps({"prompt": ex.prompt, "answer": ex.answer}) + "\n")


# --------------------------------------------------------------------------- runs


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_rllab(config_file: Path, plugins: list[str], seed: int, model_dir: Path, run_dir: Path, extra: tuple[str, ...] = ()) -> dict:
    cmd = [
        sys.executable, "-m", "rllab.cli", "run", *(a for p in plugins for a in ("--plugin", p)), str(config_file),
        f"train.seed={seed}", f"model.path={model_dir}", *extra, "--run-dir", str(run_dir), "-q",
    ]  # fmt: skip
    wall = _run(cmd, run_dir.parent / f"{run_dir.name}.log")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    steps = sorted({r["step"] for r in rows if "time/step" in r})
    by_step = {r["step"]: r for r in rows if "time/step" in r}
    evals = [r for r in rows if "eval/accuracy" in r]
    return {
        "wall": wall,
        "steps": [
            {k: by_step[s][k] for k in STEP_KEYS}
            | {"completions": by_step[s]["perf/completions_per_s"] * by_step[s]["time/rollout"]}
            for s in steps
        ],
        "own_eval": {"before": evals[0]["eval/accuracy"], "after": evals[-1]["eval/accuracy"]} if evals else {},
    }


def run_trl(trl_python: Path, settings: dict, steps: int, seed: int, model_dir: Path, prompts: Path, out: Path, threads: int) -> dict:
    cmd = [
        str(trl_python), str(HERE / "trl_grpo.py"),
        "--model", str(model_dir), "--prompts", str(prompts), "--out", str(out),
        "--steps", str(steps), "--seed", str(seed),
        "--prompts-per-step", str(settings["prompts_per_step"]), "--group-size", str(settings["group_size"]),
        "--max-new-tokens", str(settings["max_new_tokens"]), "--temperature", str(settings["temperature"]),
        "--lr", str(settings["lr"]), "--lr-schedule", settings["lr_schedule"],
        "--warmup-steps", str(settings["warmup_steps"]), "--weight-decay", str(settings["weight_decay"]),
        "--max-grad-norm", str(settings["max_grad_norm"]),
        "--clip", str(settings["clip"]), "--threads", str(threads),
    ]  # fmt: skip
    wall = _run(cmd, out.parent / f"{out.name}.log")
    rows = read_jsonl(out / "metrics.jsonl")
    return {
        "wall": wall,
        "steps": [
            {k: r[k] for k in STEP_KEYS}
            | {"completions": r["rollout/n"]}
            for r in rows
        ],
        "summary": json.loads((out / "summary.json").read_text()),
    }


THREADS = {"n": 1}
"""torch threads of both training processes (set by --threads)."""


def _run(cmd: list[str], log: Path) -> float:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # what rllab sets for itself on import; TRL gets the same
    if THREADS["n"] > 0:
        env.update(OMP_NUM_THREADS=str(THREADS["n"]), MKL_NUM_THREADS=str(THREADS["n"]))
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n--- {log} (tail) ---\n{tail}")
    return wall


# --------------------------------------------------------------------------- evaluation


def load_rllab_final(run_dir: Path, model_dir: Path):
    """The policy at the end of an rllab run: the base model with the last checkpoint's weights."""
    from transformers import AutoModelForCausalLM

    root = run_dir / "checkpoints"
    latest = root / (root / "latest").read_text().strip()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(torch.load(latest / "state.pt", weights_only=False)["policy"])
    return model


def shared_accuracy(model, tokenizer, task, *, eval_size: int, max_new_tokens: int) -> float:
    """Held-out greedy accuracy, the same code for every model (reward ≥ 1 counts as solved)."""
    from rllab.models.tiny import greedy_completions

    examples = task.eval_examples()[:eval_size]
    model.eval()
    texts = greedy_completions(model, tokenizer, [e.prompt for e in examples], max_new_tokens)
    return sum(task.reward(e, t) >= 1.0 for e, t in zip(examples, texts)) / len(examples)


# --------------------------------------------------------------------------- statistics


def run_medians(run: dict, skip: int) -> dict:
    steps = run["steps"][skip:] or run["steps"]
    return {
        "s_per_step": statistics.median(s["time/step"] for s in steps),
        "s_per_step_p10": _quantile([s["time/step"] for s in steps], 0.1),
        "gen_completions_per_s": statistics.median(s["perf/completions_per_s"] for s in steps),
        "completions_per_s": statistics.median(s["completions"] / s["time/step"] for s in steps),
        "gen_tokens_per_s": statistics.median(
            s["completions"] * s["rollout/response_length"] / s["time/rollout"] for s in steps
        ),
        "response_length": statistics.median(s["rollout/response_length"] for s in steps),
        "mean_reward": statistics.fmean(s["rollout/reward"] for s in run["steps"]),
    }


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(s: dict) -> str:
    num = lambda x: f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"  # noqa: E731
    return f"{num(s['median'])} ({num(s['min'])}–{num(s['max'])})"


def curve(runs: list[dict]) -> list[float]:
    """Mean reward per step over repeats."""
    n = min(len(r["steps"]) for r in runs)
    return [statistics.fmean(r["steps"][i]["rollout/reward"] for r in runs) for i in range(n)]


def moving_average(xs: list[float], k: int) -> list[float]:
    return [statistics.fmean(xs[max(0, i - k + 1) : i + 1]) for i in range(len(xs))]


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    colors = {"rllab": "tab:blue", "trl": "tab:orange"}
    k = max(1, results["steps"] // 20)
    for fw in ("rllab", "trl"):
        for run in results["runs"][fw]:
            ax.plot([s["rollout/reward"] for s in run["steps"]], color=colors[fw], alpha=0.15, lw=0.8)
        mean = results["curves"][fw]
        ax.plot(moving_average(mean, k), color=colors[fw], lw=2, label=f"{fw} (mean of {len(results['runs'][fw])}, {k}-step avg)")
    ax.set_xlabel("step")
    ax.set_ylabel(f"mean training reward ({results['settings']['prompts_per_step'] * results['settings']['group_size']} samples/step)")
    ax.set_title("GRPO on 2-digit addition, tiny Qwen2, CPU")
    ax.legend()
    ax.grid(alpha=0.3)
    before = results["accuracy"]["initial"]
    for i, fw in enumerate(("rllab", "trl")):
        accs = [r["after"] for r in results["accuracy"][fw]]
        bx.scatter([i] * len(accs), accs, color=colors[fw], zorder=3)
        bx.bar(i, statistics.fmean(accs), color=colors[fw], alpha=0.4, width=0.6)
    bx.axhline(before, color="gray", ls="--", label=f"before: {before:.1%}")
    bx.set_xticks([0, 1], ["rllab", "TRL"])
    bx.set_ylabel("held-out greedy accuracy after training")
    bx.legend(loc="best", fontsize="small")
    bx.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default: rllab's train.steps)")
    p.add_argument("--repeats", type=int, default=3, help="runs per framework (seeds seed, seed+1, …)")
    p.add_argument("--seed", type=int, default=0, help="first seed; both frameworks use the same seed per repeat")
    p.add_argument("--eval-size", type=int, default=200, help="held-out examples for the shared evaluation")
    p.add_argument("--trl-python", type=Path, default=DEFAULT_TRL_PYTHON, help="python of the TRL environment")
    p.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/peers/results/grpo-TIMESTAMP)")
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch threads of both training processes (0: torch's default). 1 by default: on a small shared "
        "machine, multi-threaded runs stall whenever another process holds a core, which swamps the comparison",
    )  # fmt: skip
    p.add_argument("--skip-steps", type=int, default=1, help="leading steps left out of the timing medians (warm-up)")
    p.add_argument("--plugin", action="append", default=[], metavar="PATH_OR_MODULE", help="extra rllab plugin (repeatable), as for `rllab run`")
    p.add_argument(
        "--max-staleness", type=int, default=0, metavar="K",
        help="also run rllab with rollout.max_staleness = K (asynchronous rollouts; not a TRL setting, so not mirrored) "
        "in every repeat, beside the synchronous run, as the side 'rllab_kK'",
    )  # fmt: skip
    p.add_argument(
        "--ahead-override", action="append", default=[], metavar="KEY=VALUE",
        help="an rllab override for the --max-staleness side only (repeatable), e.g. backend.process=true",
    )
    p.add_argument(
        "--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE…]",
        help="another rllab side with these overrides (not mirrored on the TRL side), repeatable, e.g. "
        "async_tis:rollout.max_staleness=1,correction=token_truncate",
    )
    p.add_argument("--no-trl", action="store_true", help="rllab only (with --max-staleness: synchronous against asynchronous)")
    p.add_argument("overrides", nargs="*", help="extra rllab overrides (key=value), mirrored on the TRL side where possible")
    args = p.parse_args(argv)

    THREADS["n"] = args.threads
    if not args.no_trl and not args.trl_python.exists():
        raise SystemExit(f"{args.trl_python} not found: run `bash benchmarks/peers/setup_trl.sh` first")
    import rllab

    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} ({os.cpu_count()} CPUs)")
    lab = rllab.Lab(plugins=args.plugin)
    cfg = experiment_config(args.steps, [*args.overrides, f"train.eval_size={args.eval_size}"], lab)
    args.steps = cfg.train.steps
    settings = check_comparable(cfg, lab)
    task_ref = cfg.component("task")
    task = lab.get("task", task_ref.name, **task_ref.knobs)()
    model_dir = build_model_dir(cfg, task)
    out = args.out or HERE / "results" / f"grpo-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    # every rllab run reads this one file, so the settings cannot drift while the benchmark runs
    from rllab.config import dump_toml

    config_file = out / "rllab-config.toml"
    config_file.write_text(dump_toml(cfg.to_dict()))
    print(f"model: {model_dir}\nsettings: {json.dumps(settings)}\nresults: {out}")

    variants = {f"rllab_k{args.max_staleness}": (f"rollout.max_staleness={args.max_staleness}", *args.ahead_override)} if args.max_staleness else {}
    for v in args.variant:
        name, _, over = v.partition(":")
        variants[name] = tuple(x for x in over.split(",") if x)
    sides = ("rllab", *variants, *(() if args.no_trl else ("trl",)))
    runs: dict[str, list[dict]] = {fw: [] for fw in sides}
    loads: list[dict] = []
    for rep in range(args.repeats):
        seed = args.seed + rep
        prompts = out / f"prompts-seed{seed}.jsonl"
        write_prompts(task, seed, args.steps, settings["prompts_per_step"], prompts)
        order = sides[rep % len(sides):] + sides[:rep % len(sides)]  # each side goes first in turn
        for fw in order:
            if fw == "rllab":
                run = run_rllab(config_file, args.plugin, seed, model_dir, out / f"rllab-seed{seed}")
            elif fw in variants:
                run = run_rllab(config_file, args.plugin, seed, model_dir, out / f"{fw}-seed{seed}", variants[fw])
            else:
                run = run_trl(args.trl_python, settings, args.steps, seed, model_dir, prompts, out / f"trl-seed{seed}", args.threads)
            run["seed"] = seed
            run["medians"] = run_medians(run, args.skip_steps)
            runs[fw].append(run)
            loads.append({"after": f"{fw} seed {seed}", "load": os.getloadavg()})
            m = run["medians"]
            print(
                f"  {fw:5s} seed {seed}: {m['s_per_step']:.3f} s/step, {m['gen_completions_per_s']:.0f} completions/s "
                f"generating, {m['completions_per_s']:.0f} end to end, mean reward {m['mean_reward']:.3f}, "
                f"wall {run['wall']:.0f} s, load {os.getloadavg()[0]:.2f}"
            )

    # shared evaluation of every model, after the timed runs
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    evaluate = lambda m: shared_accuracy(m, tokenizer, task, eval_size=args.eval_size, max_new_tokens=settings["max_new_tokens"])  # noqa: E731
    initial = evaluate(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    accuracy: dict = {"initial": initial, **{fw: [] for fw in sides}}
    for fw in sides[:-1] if not args.no_trl else sides:
        for run in runs[fw]:
            after = evaluate(load_rllab_final(out / f"{fw}-seed{run['seed']}", model_dir))
            accuracy[fw].append({"seed": run["seed"], "before": initial, "after": after, "rllab_own_eval": run["own_eval"]})
    for run in runs.get("trl", []):
        after = evaluate(AutoModelForCausalLM.from_pretrained(out / f"trl-seed{run['seed']}" / "model", dtype=torch.float32))
        accuracy["trl"].append({"seed": run["seed"], "before": initial, "after": after})

    # the two sides must have stepped through the same learning rates. TRL logs the rate a step
    # used; rllab's optim/lr is read after the scheduler has stepped (the next step's rate), so
    # both alignments are tried
    def lr_gap(shift: int) -> float:
        return max(
            abs(a["optim/lr"] - b["optim/lr"]) / max(abs(b["optim/lr"]), 1e-30)
            for rr, tr in zip(runs["rllab"], runs["trl"])
            for a, b in zip(rr["steps"], tr["steps"][shift:])
        )

    lr_mismatch = 0.0 if args.no_trl else min(lr_gap(0), lr_gap(1)) if args.steps > 1 else lr_gap(0)
    if lr_mismatch > 1e-6:
        print(f"WARNING: learning rates differ between rllab and TRL (max relative difference {lr_mismatch:.2g})")

    summary = {fw: {k: spread([r["medians"][k] for r in runs[fw]]) for k in runs[fw][0]["medians"]} for fw in runs}
    for fw in runs:
        summary[fw]["accuracy_after"] = spread([a["after"] for a in accuracy[fw]])
    ref = "rllab" if args.no_trl else "trl"  # what the rllab sides are divided by
    sides_over = [fw for fw in sides if fw != ref]

    def ratios(fw: str) -> dict:
        a, b = summary[fw], summary[ref]
        return {
            "gen_completions_per_s": a["gen_completions_per_s"]["median"] / b["gen_completions_per_s"]["median"],
            "completions_per_s": a["completions_per_s"]["median"] / b["completions_per_s"]["median"],
            "gen_tokens_per_s": a["gen_tokens_per_s"]["median"] / b["gen_tokens_per_s"]["median"],
            "step_speedup": b["s_per_step"]["median"] / a["s_per_step"]["median"],
            "s_per_step_p10": a["s_per_step_p10"]["median"] / b["s_per_step_p10"]["median"],
        }

    ratio = ratios("rllab") if not args.no_trl else {}
    load_after = os.getloadavg()
    results = {
        "steps": args.steps,
        "repeats": args.repeats,
        "settings": settings,
        "rllab_config": cfg.to_dict(),
        "lr_mismatch": lr_mismatch,
        "model_dir": str(model_dir),
        "trl_versions": None if args.no_trl else runs["trl"][0]["summary"]["versions"],
        "summary": summary,
        "ratio_rllab_over_trl": ratio,
        f"ratio_over_{ref}": {fw: ratios(fw) for fw in sides_over},
        "accuracy": accuracy,
        "curves": {fw: curve(runs[fw]) for fw in runs},
        "load": {"before": load_before, "after": load_after, "per_run": loads, "cpus": os.cpu_count()},
        "threads": args.threads,
        "runs": runs,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if not args.no_trl:
        plot(results, out / "grpo_curves.png")

    print(f"\n{args.steps} steps × {args.repeats} repeats; medians over repeats of per-run medians (min–max)")
    print(f"{'':28s}" + "".join(f"{fw:>28s}" for fw in sides) + "".join(f"{fw + '/' + ref:>18s}" for fw in sides_over))
    rows = [
        ("completions/s (generation)", "gen_completions_per_s", True),
        ("completions/s (end to end)", "completions_per_s", True),
        ("tokens/s (generation)", "gen_tokens_per_s", True),
        ("s/step", "s_per_step", True),
        ("s/step, 10th percentile", "s_per_step_p10", True),
        ("response length (tokens)", "response_length", False),
        ("mean training reward", "mean_reward", False),
        ("held-out accuracy after", "accuracy_after", False),
    ]
    for label, key, with_ratio in rows:
        cells = "".join(f"{fmt(summary[fw][key]):>28s}" for fw in sides)
        if with_ratio:
            cells += "".join(
                f"{(1 / ratios(fw)['step_speedup'] if key == 's_per_step' else ratios(fw)[key]):>18.2f}" for fw in sides_over
            )
        print(f"{label:28s}{cells}")
    print(f"held-out accuracy before: {initial:.3f} (shared greedy evaluation, {args.eval_size} examples)")
    for fw in sides:
        own = [a.get("rllab_own_eval") for a in accuracy[fw]]
        if all(own):
            print(f"{fw}'s own eval before → after: " + ", ".join(f"{o['before']:.3f} → {o['after']:.3f}" for o in own))
    for fw in sides:
        c = results["curves"][fw]
        q = max(1, len(c) // 5)
        print(f"{fw:5s} reward per step (mean over repeats): first {q} steps {statistics.fmean(c[:q]):.3f}, last {q} steps {statistics.fmean(c[-q:]):.3f}")
    print(f"plot: {out / 'grpo_curves.png'}")
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

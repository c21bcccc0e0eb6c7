"""``rllab crosscheck trl CONFIG``: TRL's ``GRPOTrainer`` and rllab, same config, model, prompts, reward.

1. **Step for step** (always): TRL trains ``--steps`` generation batches from the config as given
   (:mod:`rllab_referee.trl_capture`); rllab imports the same config (``rllab import trl``) and
   trains on TRL's own batches (:mod:`rllab_referee.stepcheck`). Per optimizer step the loss, the
   gradient norm, the learning rate and the update of the weights are compared
   (:mod:`rllab_referee.crosscheck_report`); a disagreement is reported as the first step and
   quantity that differ. Exit status 1 on a disagreement.

   **Signal.** Per generation batch the mean reward, the groups with a non-zero advantage (rewards
   that differ) and both sides' loss and gradient norms are printed. A step whose batch has no such
   group is never counted as agreement: the prompts are screened for signal first
   (:func:`signal_prompts`), and when a batch TRL sampled still has none, the next seeds are tried
   (``--tries``); failing that the verdict is "no signal", exit status 2.

   The config passes the importer's checks (``rllab import trl``) before anything of TRL's is built,
   so a config TRL refuses gets the importer's message; its ``seed`` is the seed of both sides.
2. **Learning curves** (``--seeds N``, N ≥ 2): per seed, TRL and rllab (``rllab run`` of the
   imported config) each train ``--curve-steps`` steps on the same prompts; the mean reward per
   run is compared with the suite statistics (bootstrap CIs, P(rllab > TRL)), and the throughput
   ratio (completions/s of the whole step, rllab / TRL) is reported: median, min and max over
   seeds, with the machine's load average.

Both sides start from rllab's tiny default model saved as a Hugging Face directory, draw the
prompts rllab's task draws (``prompts_per_step`` per step, in order) and score with the task's
reward. TRL is an optional dependency (``pip install 'rllab[trl]'``); ``--install-trl`` installs it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllab import ConfigError, RllabError

if TYPE_CHECKING:
    import torch

VERL_KEYS = ("actor_rollout_ref", "algorithm", "data", "trainer", "critic", "reward_model")


def _trl_config(path: str) -> dict:
    from rllab_referee.source import read_config_file

    raw = read_config_file(path, what="TRL GRPOConfig")
    if raw.get("use_vllm"):
        raise ConfigError(f"{path}: use_vllm = true: rllab crosscheck runs TRL's own generation on the CPU (no vLLM), which "
                          "changes TRL's loss (no importance-sampling correction); set use_vllm: false to crosscheck")
    verl = [k for k in VERL_KEYS if isinstance(raw.get(k), dict)]
    if verl:
        raise ConfigError(f"{path} looks like a verl config (sections {', '.join(verl)}), not a TRL GRPOConfig: "
                          "rllab crosscheck runs TRL only; import verl configs with: rllab import verl CONFIG")
    return raw


def _ensure_trl(install: bool) -> None:
    from rllab_referee.trl_capture import TRL_VERSION, trl_missing

    problem = trl_missing()
    if problem is None:
        return
    if not install:
        raise RllabError(f"rllab crosscheck trl: {problem}\n  or rerun with --install-trl to have it installed now")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", f"trl=={TRL_VERSION}"]
    print("installing TRL:", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0 or (problem := trl_missing()) is not None:
        raise RllabError(f"rllab crosscheck trl: installing TRL failed; {problem or 'see pip output above'}")


def _imported(raw: dict, name: str, lab, steps: int) -> tuple[dict, Any]:
    """The rllab config ``rllab import trl`` makes of ``raw`` for a run of ``steps`` generation
    batches: TRL's ``max_steps`` set to their optimizer steps on both sides (the schedule's horizon,
    a warm-up ratio's base)."""
    from rllab.config import load_config
    from rllab_referee import trl
    from rllab_referee.trl_capture import layout

    t = trl.translate({**raw, "max_steps": steps * layout(raw)[1]})
    t.set("", "name", f"trl-{name}", how=f"imported from {t.source}")
    t.finish()
    data = t.to_dict()
    data.setdefault("train", {}).update(checkpoint_every=0, steps=steps)
    return data, load_config(data, lab=lab)


def _setup(raw: dict, name: str, lab, steps: int):
    """The imported rllab config and data (``steps`` training steps), the tiny model directory, the task."""
    from rllab.models import tiny as tinymodel
    from rllab.training import parts

    data, cfg = _imported(raw, name, lab, steps)
    task = parts.component(cfg, lab, "task")()
    if cfg.model.path:
        model_dir = Path(cfg.model.path).expanduser()
    else:
        model_dir = tinymodel.get_or_build(tinymodel.TinyModelConfig(**cfg.model.tiny), task, cfg.component("task").to_dict(),
                                           tinymodel.WarmStartConfig(**cfg.model.warm_start), progress=False)
    return data, cfg, task, str(model_dir)


def _examples(task, cfg, seed: int, steps: int) -> list:
    """The prompts rllab's trainer draws at steps 0 … steps − 1 for ``seed``, in order."""
    import torch

    from rllab.algorithm import seed_for

    out = []
    for step in range(steps):
        out.extend(task.train_examples(cfg.rollout.prompts_per_step, torch.Generator().manual_seed(seed_for(seed, step, 0))))
    return out


def signal_prompts(task, cfg, model_dir: str, seed: int, count: int, *, pool: int = 8, samples: int = 8) -> list:
    """``count`` prompts likely to give a group with signal: from ``pool × count`` prompts the task draws at
    ``seed``, those whose ``samples`` completions by the initial model (the config's sampling) have the largest
    reward variance, in draw order among equals. Screening does not decide the check: the signal counted is
    that of the batches TRL samples."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rllab.algorithm import seed_for

    drawn = task.train_examples(pool * count, torch.Generator().manual_seed(seed_for(seed, 0, 7)))
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    r = cfg.rollout
    torch.manual_seed(seed)
    spread = []
    for ex in drawn:
        if isinstance(ex.prompt, str):
            ids = tok(ex.prompt, return_tensors="pt").input_ids
        else:
            ids = tok.apply_chat_template(ex.prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=r.temperature,
                                 top_p=r.top_p, top_k=r.top_k if r.top_k > 0 else 0, max_new_tokens=r.max_new_tokens,
                                 num_return_sequences=samples, pad_token_id=tok.pad_token_id or tok.eos_token_id)
        texts = tok.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        spread.append(statistics.pvariance([float(task.reward(ex, t)) for t in texts]))
    order = sorted(range(len(drawn)), key=lambda i: -spread[i])
    return [drawn[i] for i in sorted(order[:count])]


def _flat(w: dict[str, torch.Tensor]) -> torch.Tensor:
    import torch

    return torch.cat([v.reshape(-1).double() for k, v in sorted(w.items())])


def generation_signal(generation) -> dict:
    """One TRL generation batch's mean reward and its groups with signal (a reward that differs)."""
    from rllab_referee.crosscheck_report import group_signal

    rewards = [float(x) for c in generation.chunks for x in c["rllab_reward"]]
    trained = [bool(m.any()) for c in generation.chunks for m in c["completion_mask"]]
    groups, live = group_signal(rewards, [int(x) for c in generation.chunks for x in c["rllab_group"]], trained)
    return {"reward": statistics.fmean(rewards), "groups": groups, "live": live}


def step_check(raw: dict, cfg, task, model_dir: str, lab, *, steps: int, workdir: str, examples: list | None = None):
    """Run both sides on TRL's batches for ``steps`` generations; returns (rows, TrlRun, per-generation
    summary: reward, groups with signal, both sides' loss and gradient norms)."""
    import torch

    from rllab_referee import crosscheck_report as report
    from rllab_referee import stepcheck
    from rllab_referee.trl_capture import Generation, layout, run_trl

    seed = cfg.train.seed
    if examples is None:
        examples = _examples(task, cfg, seed, steps)
    k, _ = layout(raw)  # TRL's generation batches per rllab step
    trl = run_trl(raw, model_dir=model_dir, examples=examples, reward=task.reward, generations=steps * k, seed=seed, out=workdir)
    if len(trl.generations) != steps * k:
        raise RllabError(f"TRL trained {len(trl.generations)} generation batches, expected {steps * k}")
    batches = [Generation([c for g in trl.generations[i * k:(i + 1) * k] for c in g.chunks]) for i in range(steps)]
    ours = stepcheck.run_rllab(cfg, lab, model_dir=model_dir, generations=batches)
    from transformers import AutoModelForCausalLM

    w0 = _flat(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict())
    n = min(len(trl.weights), len(ours["weights"]))
    moved_t = [float((_flat(w) - w0).norm()) for w in trl.weights[:n]]
    moved_r = [float((_flat(w) - w0).norm()) for w in ours["weights"][:n]]
    dist = [float((_flat(a) - _flat(b)).norm()) for a, b in zip(trl.weights[:n], ours["weights"][:n])]
    if len(trl.grad_norms) != len(ours["grad_norm"]):
        raise RllabError(f"optimizer steps differ: TRL took {len(trl.grad_norms)}, rllab {len(ours['grad_norm'])} "
                         f"on the same {steps} generation batches (the import's minibatches/epochs are off)")
    rows = report.compare({"grad_norm": trl.grad_norms, "lr": trl.lrs, "weights": moved_t},
                          {"grad_norm": ours["grad_norm"], "lr": ours["lr"], "weights": moved_r}, distance={"weights": dist})
    per = layout(raw)[1]
    trl_loss = [statistics.fmean(trl.losses[g * per:(g + 1) * per]) for g in range(steps)]
    loss_rows = report.compare({"loss": trl_loss}, {"loss": ours["loss"]})
    rows += [report.Row(step=r.step * per, quantity=r.quantity, trl=r.trl, rllab=r.rllab, rel=r.rel, tol=r.tol) for r in loss_rows]
    order = {q: j for j, q in enumerate(report.QUANTITIES)}
    summary = []
    for g, generation in enumerate(batches):
        summary.append({**generation_signal(generation), "trl_loss": trl_loss[g], "rllab_loss": ours["loss"][g],
                        "trl_grad_norm": trl.grad_norms[g * per:(g + 1) * per],
                        "rllab_grad_norm": ours["grad_norm"][g * per:(g + 1) * per]})
    rows = report.with_signal(rows, [s["live"] > 0 for s in summary], per)
    return sorted(rows, key=lambda r: (r.step, order[r.quantity])), trl, summary


def signal_table(summary: list[dict]) -> str:
    """Per generation batch: the rewards, the groups with signal, both sides' loss and gradient norms."""
    lines = ["| batch | mean reward | groups with signal | TRL loss | rllab loss | TRL grad norm | rllab grad norm |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for g, s in enumerate(summary):
        def norms(xs):
            return ", ".join(f"{x:.6g}" for x in xs)

        lines.append(f"| {g} | {s['reward']:.3f} | {s['live']}/{s['groups']} ({s['live'] / max(s['groups'], 1):.0%}) | "
                     f"{s['trl_loss']:.6g} | {s['rllab_loss']:.6g} | {norms(s['trl_grad_norm'])} | {norms(s['rllab_grad_norm'])} |")
    return "\n".join(lines)


def seek_signal(raw: dict, name: str, lab, *, steps: int, tries: int, workdir: Path, log=print):
    """Step-check at the config's seed on prompts screened for signal (:func:`signal_prompts`), then at the
    next seeds (other prompts, other samples) until every generation batch has a group with signal, at most ``tries`` seeds; returns (seed, rows, summary) of the
    first such seed, else of the seed with most batches with signal."""
    base = int(raw.get("seed", 42))
    best = None
    for i in range(tries):
        seed = base + i
        _, cfg, task, model_dir = _setup({**raw, "seed": seed}, name, lab, steps)
        examples = signal_prompts(task, cfg, model_dir, seed, cfg.rollout.prompts_per_step * steps)
        rows, _, summary = step_check({**raw, "seed": seed}, cfg, task, model_dir, lab, steps=steps,
                                      workdir=str(workdir / f"trl-{seed}"), examples=examples)
        blind = sum(1 for s in summary if not s["live"])
        if best is None or blind < best[0]:
            best = (blind, seed, rows, summary)
        if not blind:
            break
        more = f"; trying seed {seed + 1}" if i + 1 < tries else ""
        log(f"seed {seed}: {blind} of {steps} generation batch(es) without signal (every group's rewards equal){more}")
    _, seed, rows, summary = best
    return seed, rows, summary


def curves(raw: dict, name: str, lab, task, model_dir: str, *, seeds: int, steps: int, workdir: Path, threads: int = 1) -> str:
    """Reward curves and throughput over ``seeds`` seeds (see the module docstring); a markdown report."""
    from rllab_suite import mean_ci, prob_improvement

    from rllab.records.tomlio import dump_toml
    from rllab_referee.trl_capture import run_trl

    data, cfg = _imported(raw, name, lab, steps)  # this length's schedule
    toml = workdir / "rllab.toml"
    toml.write_text(dump_toml(data))
    rl_means, trl_means, ratios, loads = [], [], [], []
    lines = ["| seed | TRL mean reward | rllab mean reward | TRL compl./s | rllab compl./s | ratio |", "|---:|---:|---:|---:|---:|---:|"]
    for s in range(seeds):
        seed = cfg.train.seed + s
        loads.append(os.getloadavg()[0])
        trl = run_trl(raw, model_dir=model_dir, examples=_examples(task, cfg, seed, steps), reward=task.reward,
                      generations=steps, seed=seed, out=str(workdir / f"trl-{s}"), keep_weights=False)
        run_dir = workdir / f"rllab-{s}"
        cmd = [sys.executable, "-m", "rllab.cli", "run", str(toml), f"train.seed={seed}", f"train.steps={steps}",
               f"model.path={model_dir}", "train.eval_every=0", "--run-dir", str(run_dir), "-q"]
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        if done.returncode != 0:
            raise RllabError(f"rllab run failed (seed {seed}):\n{done.stderr[-2000:]}")
        import json

        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        rows = [r for r in rows if "time/step" in r]
        loads.append(os.getloadavg()[0])
        rl_reward = statistics.fmean(r["rollout/reward"] for r in rows)
        trl_reward = statistics.fmean(trl.rewards)
        # whole steps, the first (warm-up) left out on both sides
        rl_tput = trl.completions_per_step / statistics.median(r["time/step"] for r in rows[1:] or rows)
        times = trl.generation_times  # a generation batch's optimizer steps together: one rllab step
        trl_tput = trl.completions_per_step / statistics.median(times[1:] or times)
        rl_means.append(rl_reward)
        trl_means.append(trl_reward)
        ratios.append(rl_tput / trl_tput)
        lines.append(f"| {seed} | {trl_reward:.3f} | {rl_reward:.3f} | {trl_tput:.1f} | {rl_tput:.1f} | {ratios[-1]:.2f} |")
    m_t, m_r = mean_ci(trl_means), mean_ci(rl_means)
    poi = prob_improvement([(rl_means, trl_means)])
    lines += ["", f"mean reward over {steps} steps: TRL {m_t[0]:.3f} [{m_t[1]:.3f}, {m_t[2]:.3f}], "
              f"rllab {m_r[0]:.3f} [{m_r[1]:.3f}, {m_r[2]:.3f}] (95% bootstrap CIs, {seeds} seeds)"]
    lines.append(f"P(rllab > TRL) = {poi[0]:.2f} [{poi[1]:.2f}, {poi[2]:.2f}]" if poi else
                 f"P(rllab > TRL): needs more seeds than {seeds}")
    lines.append(f"throughput rllab/TRL (completions per second of a whole step): median {statistics.median(ratios):.2f}, "
                 f"min {min(ratios):.2f}, max {max(ratios):.2f}; 1-min load average {min(loads):.1f}–{max(loads):.1f} "
                 f"on {os.cpu_count()} CPUs")
    return "\n".join(lines)


def cmd_crosscheck(args) -> int:
    import torch

    from rllab_referee import crosscheck_report as report

    if args.framework == "verl":
        from rllab_referee import verl_check

        return verl_check.cmd(args)
    if args.overrides:
        raise RllabError(f"rllab crosscheck trl takes no overrides ({args.overrides[0]!r}): edit the YAML")
    if args.seeds == 1:
        raise ConfigError("rllab crosscheck: --seeds 1 gives no spread to compare; use --seeds 0 (no curves) or ≥ 2 (5 recommended)")
    raw = _trl_config(args.config)
    name = Path(args.config).stem
    _imported(raw, name, args.lab, args.steps)  # the importer's checks, before anything of TRL's is built
    from rllab_referee import trl as trl_import

    t = trl_import.translate(raw)
    for knob, how in t.differs.items():
        print(f"the import differs from TRL on {knob} (a disagreement there is expected): {how}", file=sys.stderr)
    from rllab_referee.trl_capture import FORCED

    forced = [f"{k} = {raw[k]!r} → {v!r}" for k, v in FORCED.items() if k in raw and raw[k] != v]
    if raw.get("max_steps", -1) > 0:
        forced.append(f"max_steps = {raw['max_steps']} → the optimizer steps of --steps (and --curve-steps) generation batches")
    if forced:
        print("the crosscheck runs TRL locally, in float32 on the CPU, prompts in order: " + "; ".join(forced), file=sys.stderr)
    _ensure_trl(args.install_trl)
    torch.set_num_threads(args.threads)
    from rllab.models.forward import transformers_progress_bars_off

    with tempfile.TemporaryDirectory(prefix="rllab-crosscheck-") as tmp, transformers_progress_bars_off():
        seed, rows, summary = seek_signal(raw, name, args.lab, steps=args.steps, tries=args.tries, workdir=Path(tmp),
                                          log=lambda text: print(text, file=sys.stderr, flush=True))
        print(f"step for step, {args.steps} generation batches of {args.config} at seed {seed} (TRL's batches fed to rllab):\n")
        print(signal_table(summary) + "\n")
        print(report.table(rows if args.all_rows else _shown(rows)))
        print("\n" + report.verdict(rows))
        if args.seeds:
            _, cfg, task, model_dir = _setup({**raw, "seed": seed}, name, args.lab, args.steps)
            print(f"\nlearning curves, {args.seeds} seeds × {args.curve_steps} steps:\n")
            print(curves({**raw, "seed": seed}, name, args.lab, task, model_dir, seeds=args.seeds, steps=args.curve_steps,
                         workdir=Path(tmp), threads=args.threads))
    return report.status(rows)


def _shown(rows):
    """Every row up to the first disagreement and that step's rows."""
    from rllab_referee.crosscheck_report import first_disagreement

    bad = first_disagreement(rows)
    return rows if bad is None else [r for r in rows if r.step <= bad.step]


def add_parser(subparsers) -> None:
    from rllab_suite import whole_number

    positive = whole_number(1)
    p = subparsers.add_parser("crosscheck", help="check rllab against TRL's GRPOTrainer (step for step, learning curves) or "
                              "verl's core_algos functions, on one config")
    p.add_argument("framework", choices=("trl", "verl"), help="the framework to check against")
    p.add_argument("config", metavar="CONFIG", help="a TRL GRPOConfig (YAML or JSON), or a verl ppo_trainer YAML")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value", help="verl: dotted overrides, as on verl's command line")
    p.add_argument("--batches", type=positive, default=3, help="verl: shared batches compared (default 3)")
    p.add_argument("--prompts", type=positive, default=4, help="verl: prompts per batch (default 4)")
    p.add_argument("--width", type=positive, default=16, help="verl: response tokens per row at most (default 16)")
    p.add_argument("--steps", type=positive, default=2, help="generation batches compared step for step (default 2)")
    p.add_argument("--seeds", type=whole_number(0, of="seeds"), default=0, help="learning curves over this many seeds (0: none; 5 recommended)")
    p.add_argument("--curve-steps", type=positive, default=20, help="steps of each learning-curve run (default 20)")
    p.add_argument("--threads", type=positive, default=1, help="torch threads for both frameworks (default 1)")
    p.add_argument("--tries", type=positive, default=3,
                   help="seeds tried (the config's, then the next ones) until every batch has a group with signal (default 3)")
    p.add_argument("--all-rows", action="store_true", help="show every row, also after the first disagreement")
    p.add_argument("--install-trl", action="store_true", help="pip-install TRL (without its dependencies) if it is missing")
    p.set_defaults(func=cmd_crosscheck)

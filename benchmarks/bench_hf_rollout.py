"""Rollout throughput of the hf backend against transformers' ``model.generate``.

Workload: the tiny Qwen2 (random init, so no row stops early: every completion is
``max_new_tokens`` long — the worst case), 64 addition prompts × n = 8 samples, temperature 1,
with per-token log-probs. The baseline is ``model.generate(do_sample=True,
num_return_sequences=n, output_scores=True)`` followed by ``compute_transition_scores``
(the same log-probs, ``log_softmax(logits / T)``).

    python benchmarks/bench_hf_rollout.py                    # both, 1 and 2 threads
    python benchmarks/bench_hf_rollout.py --layers 4 --repeats 7 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import rllab
from rllab.models.tiny import TinyModelConfig, build_tiny_model, count_parameters


def hf_generate(model, tok, prompts, n, max_new_tokens, temperature):
    """transformers' own sampler, returning (token ids, log-probs) per completion."""
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=tok.pad_token_id,
        )
        lp = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    return out.sequences[:, enc.input_ids.shape[1] :].tolist(), lp.tolist()


def timed(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=TinyModelConfig().num_layers)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    args = ap.parse_args()

    model, tok = build_tiny_model(TinyModelConfig(num_layers=args.layers))
    lab = rllab.Lab()
    task = lab.get("task", "addition")()
    texts = [e.prompt for e in task.train_examples(args.prompts, torch.Generator().manual_seed(0))]
    prompts = [tok(t).input_ids for t in texts]
    params = rllab.SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
    rows = args.prompts * args.n
    print(f"model: {count_parameters(model):,} parameters, {args.layers} layers; "
          f"{args.prompts} prompts × n={args.n}, {args.max_new_tokens} new tokens; repeats={args.repeats}")
    print(f"loadavg before: {os.getloadavg()}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        backend = lab.get("rollout_backend", "hf")()
        backend.update_weights(model)
        ours = timed(lambda: backend.generate(prompts, params), args.repeats)
        base = timed(lambda: hf_generate(model, tok, texts, args.n, args.max_new_tokens, 1.0), args.repeats)
        for name, ts in (("rllab hf backend", ours), ("model.generate", base)):
            med = statistics.median(ts)
            print(f"threads={threads}  {name:17s} median {med * 1e3:7.1f} ms  min {min(ts) * 1e3:7.1f}  "
                  f"max {max(ts) * 1e3:7.1f}  -> {rows / med:7.0f} completions/s")
        print(f"threads={threads}  speed-up (median): {statistics.median(base) / statistics.median(ours):.2f}x")
    print(f"loadavg after:  {os.getloadavg()}")


if __name__ == "__main__":
    main()

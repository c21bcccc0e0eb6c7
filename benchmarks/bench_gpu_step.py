"""One policy-gradient training step of a Qwen2.5-0.5B-shaped model on a CUDA GPU.

The model is built from a config (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate
4864, vocabulary 151,936, tied embeddings; random weights, nothing downloaded), in bfloat16,
SDPA attention. A step: ``rllab.models.forward.response_logprobs`` (decoder forward + the chunked
hidden-state log-prob / entropy path) on ``B`` rows of ``P`` prompt + ``T`` response tokens, a
PPO-style clipped policy-gradient loss with an entropy bonus, backward, and a fused AdamW step.
Each configuration runs in its own process.

Reported: tokens/s (B·(P+T) per step time), peak memory (``max_memory_allocated``, the model,
gradients and AdamW state included), and model FLOP utilisation

    MFU = (6 · N_params · B·L  +  6 · n_layers · B · L² · d_model) / step time / 989 TFLOP/s

with L = P + T, N_params the parameter count (tied embedding counted once), the second term the
causal attention score and value products (QKᵀ and PV: 2·2·L²·d per layer and row in forward,
halved by the causal mask, ×3 for forward + backward), and 989 TFLOP/s the H100 SXM dense
bf16 peak. Recomputation under gradient checkpointing is not counted (it is work, not model
FLOPs).

    python benchmarks/bench_gpu_step.py              # {Triton, torch} head path × {no, with} checkpointing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PEAK_TFLOPS = 989.0


def worker(head: str, ckpt: bool, B: int, P: int, T: int, steps: int, warmup: int) -> dict:
    os.environ["RLLAB_TRITON"] = "1" if head == "triton" else "0"
    import torch
    import transformers

    from rllab.models.forward import response_logprobs

    cfg = transformers.Qwen2Config(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151_936, tie_word_embeddings=True,
        max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.config.use_cache = False
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0, fused=True)
    L = P + T
    g = torch.Generator(device="cuda").manual_seed(0)
    input_ids = torch.randint(0, cfg.vocab_size, (B, L), device="cuda", generator=g)
    mask = torch.ones(B, L, dtype=torch.bool, device="cuda")
    for b in range(B):  # some left padding in prompts, some right padding in responses
        mask[b, : (b * 37) % 64] = False
        mask[b, L - (b * 53) % 96 :] = False
    resp_mask = mask[:, -T:].float()
    adv = torch.randn(B, 1, device="cuda", generator=g).expand(B, T)
    old_lp = None

    def step():
        nonlocal old_lp
        lp, ent = response_logprobs(model, input_ids, mask, T, with_entropy=True, temperature=1.0)
        if old_lp is None:
            old_lp = lp.detach() - 0.01
        ratio = torch.exp(lp - old_lp)
        pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        loss = ((pg - 1e-3 * ent) * resp_mask).sum() / resp_mask.sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    t = statistics.median(times)
    flops = 6 * n_params * B * L + 6 * cfg.num_hidden_layers * B * L * L * cfg.hidden_size
    return {
        "n_params": n_params,
        "tokens": B * L,
        "step_s": t,
        "min_s": min(times),
        "max_s": max(times),
        "tokens_per_s": B * L / t,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "mfu": flops / t / (PEAK_TFLOPS * 1e12),
        "device": torch.cuda.get_device_name(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--heads", default="triton,torch")
    ap.add_argument("--json", default="")
    ap.add_argument("--worker", nargs=2, metavar=("HEAD", "CKPT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = (a.batch, a.prompt, a.response, a.steps, a.warmup)
    if a.worker:
        print("RESULT " + json.dumps(worker(a.worker[0], a.worker[1] == "1", *sizes)))
        return
    results = []
    for head in a.heads.split(","):
        for ckpt in (False, True):
            cmd = [sys.executable, __file__, "--batch", str(a.batch), "--prompt", str(a.prompt),
                   "--response", str(a.response), "--steps", str(a.steps), "--warmup", str(a.warmup),
                   "--worker", head, "1" if ckpt else "0"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            r = json.loads(line[-1][7:]) if line else {"error": (proc.stderr or proc.stdout)[-800:]}
            r.update(head=head, ckpt=ckpt)
            results.append(r)
            print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"\nB={a.batch}, prompt {a.prompt} + response {a.response} tokens, bf16, AdamW")
    print("| head path | grad. checkpointing | step s, median [min, max] | tokens/s | peak GiB | MFU |")
    print("|---|---|---|---|---|---|")
    for r in results:
        if "step_s" not in r:
            print(f"| {r['head']} | {'yes' if r['ckpt'] else 'no'} | error | | | |")
            continue
        print(
            f"| {r['head']} | {'yes' if r['ckpt'] else 'no'} | {r['step_s']:.3f} [{r['min_s']:.3f}, {r['max_s']:.3f}] "
            f"| {r['tokens_per_s']:,.0f} | {r['peak_gib']:.1f} | {100 * r['mfu']:.1f}% |"
        )


if __name__ == "__main__":
    main()

"""Weight sync, client side: seconds per ``update_weights`` of the sglang backend.

The backend's disk sync writes the policy with ``save_pretrained`` (safetensors) into a fresh
directory, renames it into place, and POSTs ``/update_weights_from_disk`` to every server. Here
the server is the stand-in (tests/sglang_standin.py) in ``--instant`` mode, which answers without
loading the files, so the time is what rllab spends: serialising, writing, renaming and the
request. A real server then reads the files (its own cost, on its side). With ``--sync
distributed`` the stand-in (a separate process) joins the trainer's group over gloo and receives
every broadcast tensor (``distributed_backend = "gloo"``: loopback TCP; NCCL between GPUs is the
production route and is faster).

    python benchmarks/bench_sglang_sync.py                     # the tiny default and a 0.5B Qwen2 shape
    python benchmarks/bench_sglang_sync.py --shapes tiny --repeats 10
    python benchmarks/bench_sglang_sync.py --sync distributed --dtype bfloat16
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sglang_client import start_standin  # noqa: E402

import rllab  # noqa: E402

SHAPES = ("tiny", "0.5B")
"""``tiny``: the default model of ``rllab run``; ``0.5B``: Qwen2.5-0.5B's shape (494M parameters,
tied embeddings), random weights."""


def build(shape: str, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rllab.models.tiny import TinyModelConfig, build_tiny_model

    if shape == "tiny":
        return build_tiny_model(TinyModelConfig())[0].to(device)
    cfg = Qwen2Config(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=2048,
    )  # fmt: skip
    with torch.device(device):
        return Qwen2ForCausalLM(cfg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="where the policy lives (cuda: includes the device-to-host copy)")
    ap.add_argument("--sync", default="disk", choices=("disk", "distributed"))
    ap.add_argument("--dtype", default="model", help="distributed: distributed_dtype")
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    lab = rllab.Lab()
    for shape in args.shapes:
        model = build(shape, args.device)
        params = sum(p.numel() for p in model.parameters())
        proc, url = start_standin(4)
        try:
            with tempfile.TemporaryDirectory() as d:
                knobs = {"sync_dir": d}
                if args.sync == "distributed":
                    knobs.update(weight_sync="distributed", distributed_backend="gloo", distributed_dtype=args.dtype)
                backend = lab.get("rollout_backend", "sglang", urls=url, **knobs)()
                backend.update_weights(model)  # the first sync (directory, connections)
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    backend.update_weights(model)
                    times.append(time.perf_counter() - t0)
                backend.close()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        mb = params * 4 / 2**20
        print(
            f"{shape:>5}: {params / 1e6:8.1f}M parameters ({mb:7.0f} MiB float32), {args.device}, {args.sync}"
            f"{'' if args.sync == 'disk' else ' ' + args.dtype}: "
            f"{statistics.median(times):.3f} s per sync (median of {len(times)}; min {min(times):.3f}, max {max(times):.3f})"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

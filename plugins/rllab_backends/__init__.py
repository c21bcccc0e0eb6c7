"""rllab_backends — rollout backends: where completions come from (``register_rollout_backends``).

* :mod:`rllab_backends.hf` — ``hf`` (alias ``transformers``): in-process sampling with a
  transformers causal LM and a KV cache, the default on a machine without a GPU server;
* :mod:`rllab_backends.sglang` — ``sglang``: SGLang servers over their native HTTP API, with
  weight sync after each step, retries and fault handling.
"""

import rllab


@rllab.hookimpl
def register_rollout_backends(register):
    # the components' modules import torch: loaded when they register, not with the plugin
    from . import hf, sglang

    register("hf", hf.hf, config=hf.HFBackendConfig, aliases=("transformers",), sharded_policy=None, shares_weights=_hf_shares_weights)
    register("sglang", sglang.sglang, config=sglang.SGLangBackendConfig, needs_cuda=_sglang_needs_cuda, sharded_policy=_sglang_sharded_policy)


def _sglang_sharded_policy(config) -> str | None:
    """Why this SGLang config cannot serve a sharded (fsdp2) policy, or None: rank 0 saves the
    gathered weights and the servers load them (weight_sync = 'disk')."""
    if config.weight_sync != "disk":
        return (f"weight_sync = {config.weight_sync!r} sends the trainer's own tensors, but a sharded policy's full weights "
                "are a CPU copy gathered on rank 0; use weight_sync = 'disk'")
    if config.launch:
        return "launch = true starts a server on rank 0 that the other ranks do not know; start the servers yourself and list them in urls"
    return None


def _sglang_needs_cuda(config) -> str | None:
    """Why this SGLang config (an ``SGLangBackendConfig``) needs the policy on CUDA (read at config load), or None."""
    if config.weight_sync == "tensor":
        return "weight_sync = 'tensor' sends CUDA-IPC handles (use weight_sync = 'disk' on a CPU policy)"
    if config.weight_sync == "distributed" and config.distributed_backend == "nccl":
        return "weight_sync = 'distributed' with distributed_backend = 'nccl' (use 'gloo' on a CPU policy)"
    return None


def _hf_shares_weights(config) -> str | None:
    """Why this hf config samples from the trainer's own weights (no copy of its own), or None."""
    return "backend.share_weights = true" if config.share_weights else None

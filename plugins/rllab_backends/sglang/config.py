"""The sglang backend's knobs (:class:`SGLangBackendConfig`) and their validation."""

from __future__ import annotations

import attrs

import rllab

DEFAULT_LAUNCH = (
    "{python} -m sglang.launch_server --model-path {model_path} --host {host} --port {port} "
    "--skip-tokenizer-init --weight-version {weight_version}"
)


def parse_urls(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """``"a, b"``, ``"a b"`` or ``["a", "b"]`` → ``("a", "b")`` (no trailing slashes)."""
    text = value if isinstance(value, str) else ",".join(value)
    return tuple(u.strip().rstrip("/") for u in text.replace(" ", ",").split(",") if u.strip())


def _need_a_server(inst, launch: bool) -> None:
    if not launch and not parse_urls(inst.urls):
        raise ValueError("set urls (a server or router, e.g. urls = \"http://127.0.0.1:30000\") or launch = true")


def _check_urls(inst, attribute, value):
    for u in parse_urls(value or ""):
        if not u.startswith(("http://", "https://")):
            raise ValueError(f"{attribute.name}: {u!r} is not an http:// or https:// URL")


@attrs.frozen
class SGLangBackendConfig:
    """Knobs of the sglang rollout backend."""

    urls: str | tuple[str, ...] = rllab.knob(
        "",
        help="where /generate goes: one server, several (a list, or comma-separated), or one sglang-router URL; "
        "empty with launch = true: the launched server",
        validator=_check_urls,
    )
    admin_urls: str | tuple[str, ...] = rllab.knob(
        "",
        help="servers that receive weight updates (a list, or comma-separated); empty: urls (behind a router, "
        "list its workers here)",
        validator=_check_urls,
    )
    launch: bool = rllab.knob(
        False,
        help="start an SGLang server for the run, wait for /health, stop it at close()",
        validator=lambda i, a, v: _need_a_server(i, v),
    )
    launch_command: str = rllab.knob(
        DEFAULT_LAUNCH,
        help="command launch runs (printed); fields {python} {model_path} {host} {port} {weight_version}",
    )
    launch_args: str = rllab.knob("", help="extra server flags appended to launch_command, e.g. '--mem-fraction-static 0.5'")
    launch_timeout_s: float = rllab.knob(900.0, help="longest wait for a launched server's /health", gt=0.0)
    model_path: str | None = rllab.knob(
        None, help="model directory a launched server starts from; None: a snapshot of the first update_weights"
    )
    weight_sync: str = rllab.knob(
        "disk",
        help="how update_weights reaches the servers: 'disk' (safetensors + /update_weights_from_disk), "
        "'tensor' (colocated, CUDA IPC), 'distributed' (torch.distributed broadcast from the trainer)",
        choices=("disk", "tensor", "distributed"),
    )
    distributed_backend: str = rllab.knob(
        "nccl",
        help="weight_sync = 'distributed': the group's backend ('nccl': CUDA policy; 'gloo': CPU tensors)",
        choices=("nccl", "gloo"),
    )
    distributed_address: str = rllab.knob(
        "", help="weight_sync = 'distributed': the address servers reach the trainer at; empty: 127.0.0.1 for local "
        "servers, else this machine's address on the route to them"
    )
    distributed_port: int = rllab.knob(0, help="weight_sync = 'distributed': rendezvous port on the trainer; 0: a free one", ge=0, le=65535)
    distributed_dtype: str = rllab.knob(
        "model",
        help="weight_sync = 'distributed': dtype on the wire ('model': the policy's own; 'bfloat16' halves float32 traffic)",
        choices=("model", "bfloat16", "float16", "float32"),
    )
    push: str = rllab.knob(
        "drain",
        help="how a weight push meets the requests in flight: 'drain' = SGLang's update waits until they have "
        "finished (and rllab's asynchronous rollouts wait for the batch being sampled: a deterministic schedule); "
        "'pause' = /pause_generation, the update, /continue_generation: they finish with the new weights, each "
        "completion counted under its oldest version (not deterministic; docs/async.md)",
        choices=("drain", "pause"),
    )
    pause_mode: str = rllab.knob(
        "in_place",
        help="push = 'pause': SGLang's pause mode. 'in_place' keeps the requests' KV cache (computed with the old "
        "weights; the prefix cache is flushed before the next batch instead); 'retract' moves them back to the "
        "queue, flushes the cache with the update and recomputes their KV with the new weights",
        choices=("in_place", "retract"),
    )
    sync_dir: str | None = rllab.knob(
        None, help="directory for weight snapshots, visible to every server; None: a private temporary directory"
    )
    tp_size: int = rllab.knob(
        1, help="tensor-parallel ranks of each server ('tensor' sends one payload per rank; 'distributed': each rank "
        "joins the group, checked against the server's /server_info)", ge=1
    )
    prompts_per_request: int = rllab.knob(
        16, help="prompts batched into one /generate request (× n rows; SGLang warns above 128 rows with n > 1)", ge=1
    )
    max_in_flight: int = rllab.knob(64, help="most /generate requests outstanding at once (over all servers)", ge=1)
    timeout_s: float = rllab.knob(600.0, help="per-request time limit in seconds", gt=0.0)
    retries: int = rllab.knob(3, help="extra tries of a failed request (refused, dropped, timed out, 5xx)", ge=0)
    abort_retries: int = rllab.knob(
        8, help="resubmissions of one aborted sample (finish_reason abort) before the run stops; only the aborted "
        "samples of a request are sent again, each counted in sglang/aborted", ge=0,
    )
    backoff_s: float = rllab.knob(0.5, help="first retry delay; doubles each try (capped at 30 s)", ge=0.0)
    logprobs: str = rllab.knob(
        "temperature",
        help="rollout log-probs: 'temperature' = output_token_logprobs, log_softmax(z/T) before top-k/top-p "
        "(the hf backend's default); 'processed' = output_token_sampling_logprobs (return_sampling_mask): the "
        "truncated, renormalised distribution each token was drawn from — exact TIS under top-k/top-p",
        choices=("temperature", "processed"),
    )
    stale: str = rllab.knob(
        "drop",
        help="a completion from other weights than the last pushed: 'drop' it, 'keep' it, or raise ('error'); "
        "always counted in rollout/stale",
        choices=("drop", "keep", "error"),
    )

    def __attrs_post_init__(self):
        if self.push != "pause" and self.pause_mode != attrs.fields(type(self)).pause_mode.default:
            raise ValueError(f"pause_mode acts only with push = 'pause' (push is {self.push!r})")
        if self.weight_sync != "distributed":
            fields = attrs.fields(type(self))
            set_ = [f.name for f in fields if f.name.startswith("distributed_") and getattr(self, f.name) != f.default]
            if set_:
                verb = "acts" if len(set_) == 1 else "act"
                raise ValueError(f"{', '.join(set_)} {verb} only with weight_sync = 'distributed' (weight_sync is {self.weight_sync!r})")

"""``opd``: on-policy distillation — a teacher model scores the student's own samples.

The step is the ``rl`` step (:mod:`rllab_algorithms.rl`) with the teacher's log-probs ``t`` of
the tokens the student sampled (same tokenizer). The teacher is one of

- a local model directory (``teacher = "/path"``), loaded once in float32 on the policy's device; one
  more no-grad forward, at the rollout's temperature (``log_softmax(z / T)``, as the student's);
- an SGLang server (or router) serving the teacher (``teacher = "http://host:port"``): each step sends every row's
  prompt + response to its ``/generate`` with ``max_new_tokens = 0`` and ``logprob_start_len``
  at the response (:mod:`rllab_backends.sglang.score`), and reads back ``input_token_logprobs``.
  SGLang takes prompt log-probs before temperature, so this needs ``rollout.temperature = 1``.

Per response token, with ``s`` the student's log-prob, the reverse KL of student to teacher is
estimated as

    k1   loss_t = sg(s − t) · exp(s − sg(s))       value s − t; gradient (s − t)·∇s, the
                                                   policy gradient of KL(π_s ‖ π_t) with the
                                                   per-token reward −(s − t) (slime --use-opd,
                                                   prime-rl opd)
    k3   loss_t = exp(t − s) − (t − s) − 1         value ≥ 0; gradient through s (verl's
                                                   distillation loss_mode k3)

aggregated by the run's ``aggregation`` and weighted by ``kl_coef``. ``with_rl = False`` trains on
that alone (the task's rewards are still sampled and logged); ``True`` adds it to the RL loss.
Logged: ``distill/k1`` and ``distill/k3`` (means over the response tokens), ``loss/distill``.
"""

from __future__ import annotations

import attrs
import torch

import rllab
from rllab import ops

from .rl import RL, RLConfig, _logprobs

ESTIMATORS = ("k1", "k3")


def is_url(teacher: str) -> bool:
    """``teacher`` names a server (``http://`` or ``https://``), not a directory."""
    return teacher.startswith(("http://", "https://"))


def _check_teacher(inst, attribute, value):
    from pathlib import Path
    from urllib.parse import urlsplit

    from rllab.models.modeldir import check_model_dir

    if is_url(value):
        if not urlsplit(value).hostname:
            raise ValueError(f"{attribute.name} = {value!r} is a URL without a host; give the SGLang server's, e.g. \"http://127.0.0.1:30000\"")
        return
    if "://" in value:
        raise ValueError(f"{attribute.name} = {value!r}: a teacher is a local model directory or an SGLang server's "
                         f"http:// or https:// URL")
    if not Path(value).expanduser().is_dir():
        raise ValueError(f"{attribute.name} = {value!r} is not a directory; give the teacher's local model directory "
                         f"(config.json, weights and the student's tokenizer) or an SGLang server's URL (http://HOST:PORT)")
    try:
        check_model_dir(value, setting=f"algorithm.{attribute.name}")
    except rllab.ConfigError as e:
        raise ValueError(f"{attribute.name} = {value!r}: {e}") from None


@attrs.frozen(kw_only=True)
class OPDConfig(RLConfig):
    """Knobs of on-policy distillation (and those of ``rl``)."""

    teacher: str = rllab.knob(help="the teacher (required): a local model directory with the student's tokenizer, or "
                              "the http(s):// URL of an SGLang server or router serving it (needs rollout.temperature = 1)",
                              validator=_check_teacher)
    estimator: str = rllab.knob("k1", help="the per-token reverse-KL estimate trained on: k1 (policy-gradient form) or k3", choices=ESTIMATORS)
    kl_coef: float = rllab.knob(1.0, help="the distillation loss's weight (slime's --opd-kl-coef)", gt=0.0)
    with_rl: bool = rllab.knob(False, help="add the distillation loss to the RL loss (False: the distillation loss alone)")



def reverse_kl_loss(log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, estimator: str) -> torch.Tensor:
    """The per-token distillation loss (same shape as ``log_prob``; see the module docstring)."""
    t = teacher_log_prob.detach()
    if estimator == "k1":
        return (log_prob - t).detach() * torch.exp(log_prob - log_prob.detach())
    r = t - log_prob
    return torch.exp(r) - r - 1.0


_TEACHERS: dict[tuple[str, str], torch.nn.Module] = {}


def load_teacher(path: str, device: torch.device) -> torch.nn.Module:
    """The teacher at ``path`` on ``device``, in eval mode, loaded once per process."""
    key = (path, str(device))
    if key not in _TEACHERS:
        from transformers import AutoModelForCausalLM

        from pathlib import Path

        local = str(Path(path).expanduser())  # validated as a directory with ~ expanded: loaded the same way
        model = AutoModelForCausalLM.from_pretrained(local, dtype=torch.float32).to(device).eval()
        model.requires_grad_(False)
        _TEACHERS[key] = model
    return _TEACHERS[key]


class OPD(RL):
    """On-policy distillation: the RL step with a teacher's reverse KL in the loss."""

    async_rollouts = False

    @property
    def policy_loss_coef(self) -> float:
        return 1.0 if self.config.with_rl else 0.0

    def prepare(self, ctx, batch, extra=None):
        prepared, metrics = super().prepare(ctx, batch, extra)
        if is_url(self.config.teacher):
            from .teacher_server import server_logprobs

            t = server_logprobs(self.config.teacher, ctx, batch)
        else:
            t = self._local_logprobs(ctx, batch)
        s_old = prepared.old_log_prob
        if s_old is not None:
            metrics["distill/k1_before"] = ops.masked_mean(s_old - t, batch.response_mask).item()
        return attrs.evolve(prepared, teacher_log_prob=t), metrics

    def _local_logprobs(self, ctx, batch) -> torch.Tensor:
        teacher = load_teacher(self.config.teacher, ctx.device)
        vocab = teacher.get_output_embeddings().weight.shape[0]
        student = ctx.policy.get_output_embeddings().weight.shape[0]
        if vocab != student:
            raise rllab.ConfigError(
                f"algorithm 'opd': the teacher {self.config.teacher!r} has {vocab} output tokens and the student {student}; "
                f"a teacher must share the student's tokenizer", key="teacher",
            )
        with torch.no_grad():
            return _logprobs(ctx, teacher, batch)

    def extra_loss(self, ctx, p, rows, log_prob, mask, agg, out):
        t = p.teacher_log_prob[rows]
        d = (log_prob - t).detach()
        out["distill/k1"] = ops.masked_mean(d, mask).item()
        out["distill/k3"] = ops.masked_mean(torch.exp(-d) + d - 1.0, mask).item()
        loss = agg(reverse_kl_loss(log_prob, t, self.config.estimator), mask)
        out["loss/distill"] = loss.item()
        return self.config.kl_coef * loss


def opd(*, config: OPDConfig) -> OPD:
    """On-policy distillation: a teacher's per-token reverse KL on the student's own samples, alone or added to the RL loss."""
    return OPD(config=config)

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

or exactly over the teacher's ``topk`` most likely tokens ``K`` at each position (a local teacher;
``S``, ``P`` the student's and teacher's log-probs over the vocabulary, both clamped below at
``topk_log_prob_min`` as verl's ``log_prob_min_clamp``):

    reverse_topk   loss_t = Σ_{v∈K} s_v·log(s_v / p_v) + s_r·log(s_r / p_r)
                   with s_v = exp(S_v), p_v = exp(P_v), and the rest of the vocabulary as one
                   token: s_r = 1 − Σ_K s_v, p_r = 1 − Σ_K p_v. The reverse KL between the two
                   distributions over K and "the rest": ≥ 0, and 0 only where the student gives
                   K the teacher's probabilities (without the rest, a sum over K alone is
                   lowered by moving the student's mass off K). Gradient through every S_v.
    forward_topk   loss_t = Σ_{v∈K} p_v·(P_v − S_v)   KL(π_t ‖ π_s) over K alone (verl's
                   distillation loss_mode forward_kl_topk): it raises the student's mass on K.

The exact forms read the student's sampled-token log-probs, entropies and top-k log-probs from one
forward that keeps its (rows, T, V) log-probs in memory (not the fused log-prob kernels), and log ``distill/teacher_mass`` and ``distill/student_mass`` (the mass of K
under each). Every estimate is
aggregated by the run's ``aggregation`` and weighted by ``kl_coef``. ``with_rl = False`` trains on
that alone (the task's rewards are still sampled and logged); ``True`` adds it to the RL loss.
Logged: ``distill/k1`` and ``distill/k3`` (means over the response tokens), ``loss/distill``.

A local teacher is hashed by content (the sha256 of its files, as a starting model is) into the
run's ``provenance.json`` (``hashes.inputs``); ``teacher_sha256`` pins it: a teacher that hashes
otherwise is refused before the first step. A server's weights cannot be hashed here, so a URL
teacher refuses ``teacher_sha256``.
"""

from __future__ import annotations

import attrs
import torch

import rllab
from rllab import ops

from rllab.models.forward import response_log_softmax

from .rl import RL, RLConfig, _logprobs

ESTIMATORS = ("k1", "k3", "reverse_topk", "forward_topk")
EXACT = ("reverse_topk", "forward_topk")


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


def _check_teacher_sha256(inst, attribute, value):
    import re

    if value is None:
        return
    if not re.fullmatch(r"(sha256:)?[0-9a-fA-F]{8,64}", value.strip()):
        raise ValueError(f"{attribute.name} = {value!r} is not a sha256: give the 64 hex digits of the teacher's "
                         f"(or a prefix of at least 8), as 'rllab provenance RUN' prints it under hashes.inputs")
    if is_url(inst.teacher):
        raise ValueError(f"{attribute.name} = {value!r} pins a local teacher directory's contents, and teacher = {inst.teacher!r} "
                         f"is a server, whose weights cannot be hashed here: remove {attribute.name} or give the teacher's directory")


@attrs.frozen(kw_only=True)
class OPDConfig(RLConfig):
    """Knobs of on-policy distillation (and those of ``rl``)."""

    teacher: str = rllab.knob(help="the teacher (required): a local model directory with the student's tokenizer, or "
                              "the http(s):// URL of an SGLang server or router serving it (needs rollout.temperature = 1)",
                              validator=_check_teacher)
    estimator: str = rllab.knob(
        "k1", choices=ESTIMATORS,
        help="the per-token KL trained on: k1 (the reverse KL's policy-gradient form) or k3 estimates from the sampled token; "
        "reverse_topk or forward_topk, exact over the teacher's topk most likely tokens (a local teacher)",
    )
    topk: int = rllab.knob(32, help="estimator reverse_topk / forward_topk: the teacher's most likely tokens the KL sums over", ge=1,
                           validator=lambda i, a, v: _exact_only(i, a, v, 32))
    topk_log_prob_min: float = rllab.knob(
        -10.0, help="estimator reverse_topk / forward_topk: both log-probs clamped below at this (verl's log_prob_min_clamp; "
        "-inf: off)", validator=lambda i, a, v: _exact_only(i, a, v, -10.0),
    )
    kl_coef: float = rllab.knob(1.0, help="the distillation loss's weight (slime's --opd-kl-coef)", gt=0.0)
    with_rl: bool = rllab.knob(False, help="add the distillation loss to the RL loss (False: the distillation loss alone)")
    teacher_sha256: str | None = rllab.knob(
        None, help="pins a local teacher by content: the sha256 of its directory's files (as model.sha256 hashes a start; "
        "64 hex digits or a prefix of at least 8); a teacher that hashes otherwise is refused before the first step",
        validator=_check_teacher_sha256,
    )



def _exact_only(inst, attribute, value, default) -> None:
    if value != default and inst.estimator not in EXACT:
        raise ValueError(f"{attribute.name} = {value!r} applies only with estimator = 'reverse_topk' or 'forward_topk' "
                         f"(estimator is {inst.estimator!r})")
    if inst.estimator in EXACT and is_url(inst.teacher):
        raise ValueError(f"estimator = {inst.estimator!r} needs the teacher's whole distribution: a local model directory "
                         f"(teacher = {inst.teacher!r} is a server, which gives the sampled tokens' log-probs: use k1 or k3)")


def topk_kl_loss(student: torch.Tensor, teacher: torch.Tensor, estimator: str, log_prob_min: float = -10.0) -> torch.Tensor:
    """(…) the exact per-token KL over the teacher's top-k (see the module docstring): ``student``
    and ``teacher`` (…, k) log-probs of the same k tokens; the gradient flows through ``student``."""
    s = student.clamp_min(log_prob_min)
    t = teacher.detach().clamp_min(log_prob_min)
    if estimator == "forward_topk":
        return (t.exp() * (t - s)).sum(-1)
    tiny = torch.finfo(s.dtype).tiny
    rest_s = (1.0 - s.exp().sum(-1)).clamp_min(tiny)  # the rest of the vocabulary, as one token
    rest_t = (1.0 - t.exp().sum(-1)).clamp_min(tiny)
    return (s.exp() * (s - t)).sum(-1) + rest_s * (rest_s.log() - rest_t.log())


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

    _student_full: torch.Tensor | None = None
    """The exact top-k KL: the micro-batch's (rows, T, V) log-probs, from policy_forward to extra_loss."""

    @property
    def policy_loss_coef(self) -> float:
        return 1.0 if self.config.with_rl else 0.0

    _teacher_hash: str | None = None

    def needs(self, ctx) -> set[str]:
        if is_url(self.config.teacher):  # refused when the run is built, before any sampling
            from .teacher_server import check_temperature

            check_temperature(self.config.teacher, ctx.config.rollout.temperature)
        else:
            self.teacher_hash()  # teacher_sha256 checked when the run is built, before the first step
        return super().needs(ctx)

    def teacher_hash(self) -> str | None:
        """The sha256 of the local teacher's files (:func:`rllab.records.provenance.model_sha256`, as a
        start is hashed; None for a server), checked against ``teacher_sha256`` when it is set."""
        if is_url(self.config.teacher):
            return None
        if self._teacher_hash is None:
            from pathlib import Path

            from rllab.records.provenance import model_sha256

            path = Path(self.config.teacher).expanduser()
            actual = model_sha256(path)
            pin = self.config.teacher_sha256
            if pin is not None:
                want = pin.strip().lower().removeprefix("sha256:")
                if not actual.startswith(want):
                    raise rllab.ConfigError(
                        f"algorithm 'opd': algorithm.teacher_sha256 = {pin!r}, and the teacher {str(path)!r} hashes to {actual}, "
                        f"not {want}: it is not the pinned teacher. Point algorithm.teacher at the teacher with that hash, "
                        f"or remove algorithm.teacher_sha256 to accept this one", key="teacher_sha256",
                    )
            self._teacher_hash = actual
        return self._teacher_hash

    def provenance_inputs(self) -> list[dict]:
        """The local teacher, by the hash of its files (``hashes.inputs`` in provenance.json)."""
        digest = self.teacher_hash()
        if digest is None:
            return []
        from pathlib import Path

        return [{"setting": "algorithm.teacher", "path": str(Path(self.config.teacher).expanduser()), "sha256": digest}]

    def policy_forward(self, ctx, p, rows):
        """With the exact top-k KL: one forward gives the whole distribution, from which the sampled
        tokens' log-probs and the entropies are read and which :meth:`extra_loss` takes (kept for it)."""
        if p.teacher_topk is None:
            return super().policy_forward(ctx, p, rows)
        batch = p.batch
        with ctx.autocast():
            full = response_log_softmax(ctx.policy, batch.input_ids[rows], batch.attention_mask[rows], batch.response_length,
                                        temperature=ctx.config.rollout.temperature)
        self._student_full = full
        log_prob = full.gather(-1, batch.input_ids[rows][:, -batch.response_length:, None]).squeeze(-1)
        entropy = -(full.exp() * full).sum(-1)
        return log_prob, entropy

    def prepare(self, ctx, batch, extra=None):
        prepared, metrics = super().prepare(ctx, batch, extra)
        topk = None
        if is_url(self.config.teacher):
            from .teacher_server import server_logprobs

            t = server_logprobs(self.config.teacher, ctx, batch)
        elif self.config.estimator in EXACT:
            t, topk = self._local_topk(ctx, batch)
        else:
            t = self._local_logprobs(ctx, batch)
        s_old = prepared.old_log_prob
        if s_old is not None:
            metrics["distill/k1_before"] = ops.masked_mean(s_old - t, batch.response_mask).item()
        return attrs.evolve(prepared, teacher_log_prob=t, teacher_topk=topk), metrics

    def _teacher(self, ctx) -> torch.nn.Module:
        teacher = load_teacher(self.config.teacher, ctx.device)
        vocab = teacher.get_output_embeddings().weight.shape[0]
        student = ctx.policy.get_output_embeddings().weight.shape[0]
        if vocab != student:
            raise rllab.ConfigError(
                f"algorithm 'opd': the teacher {self.config.teacher!r} has {vocab} output tokens and the student {student}; "
                f"a teacher must share the student's tokenizer", key="teacher",
            )
        return teacher

    def _local_topk(self, ctx, batch, rows_per_chunk: int = 8):
        """The teacher's log-probs of the sampled tokens (B, T) and its top-k (log-probs, ids), each
        (B, T, k), from its whole distribution, ``rows_per_chunk`` rows of (T, V) at a time."""
        teacher = self._teacher(ctx)
        T = batch.response_length
        labels = batch.input_ids[:, -T:]
        k = min(self.config.topk, teacher.get_output_embeddings().weight.shape[0])
        sampled, values, ids = [], [], []
        with torch.no_grad(), ctx.autocast():
            for r in range(0, batch.input_ids.shape[0], rows_per_chunk):
                full = response_log_softmax(teacher, batch.input_ids[r:r + rows_per_chunk], batch.attention_mask[r:r + rows_per_chunk],
                                            T, temperature=ctx.config.rollout.temperature)
                sampled.append(full.gather(-1, labels[r:r + rows_per_chunk, :, None]).squeeze(-1))
                top = full.topk(k, dim=-1)
                values.append(top.values)
                ids.append(top.indices)
        mask = batch.response_mask
        t = torch.where(mask, torch.cat(sampled), torch.zeros_like(mask, dtype=torch.float32))
        return t, (torch.cat(values), torch.cat(ids))

    def _local_logprobs(self, ctx, batch) -> torch.Tensor:
        teacher = self._teacher(ctx)
        with torch.no_grad():
            return _logprobs(ctx, teacher, batch)

    def extra_loss(self, ctx, p, rows, log_prob, mask, agg, out):
        t = p.teacher_log_prob[rows]
        d = (log_prob - t).detach()
        out["distill/k1"] = ops.masked_mean(d, mask).item()
        out["distill/k3"] = ops.masked_mean(torch.exp(-d) + d - 1.0, mask).item()
        if p.teacher_topk is None:
            loss = agg(reverse_kl_loss(log_prob, t, self.config.estimator), mask)
        else:
            values, ids = (x[rows] for x in p.teacher_topk)
            full, self._student_full = self._student_full, None  # policy_forward's, for these rows
            student = full.gather(-1, ids)
            out["distill/teacher_mass"] = ops.masked_mean(values.exp().sum(-1), mask).item()
            out["distill/student_mass"] = ops.masked_mean(student.detach().exp().sum(-1), mask).item()
            per_token = topk_kl_loss(student, values, self.config.estimator, self.config.topk_log_prob_min)
            loss = agg(torch.where(mask, per_token, torch.zeros_like(per_token)), mask)
        out["loss/distill"] = loss.item()
        return self.config.kl_coef * loss


def opd(*, config: OPDConfig) -> OPD:
    """On-policy distillation: a teacher's per-token reverse KL on the student's own samples, alone or added to the RL loss."""
    return OPD(config=config)

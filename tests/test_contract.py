"""Every registered component of every kind passes the contract suite (parametrised over the
registry, so a newly registered plugin is checked without editing this file)."""

import json
import tempfile
from pathlib import Path

import pytest

import rllab
from rllab.testing import contract_cases, required_knobs

_LAB = rllab.Lab()

# Components whose required knobs need real inputs get them here.
_DATA = Path(tempfile.mkdtemp(prefix="rllab-contract-")) / "rows.jsonl"
_DATA.write_text("".join(json.dumps({"prompt": f"{i}*2=", "answer": str(2 * i)}) + "\n" for i in range(40)))
from tests.sglang_standin import launch_knobs  # noqa: E402  (the sglang backend runs against a stand-in server)

from tests.reward_standin import RewardStandIn  # noqa: E402  (the remote and llm_judge rewards ask a stand-in server)

_REWARD_SERVER = RewardStandIn()


def _teacher_dir() -> str:
    """A small model directory for opd's teacher."""
    from rllab.models.tiny import TinyModelConfig, build_tiny_model

    model, tok = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64))
    out = _DATA.parent / "teacher"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


_KNOBS = {("task", "jsonl"): {"path": str(_DATA)}, ("task", "dataset"): {"path": str(_DATA)}, ("rollout_backend", "sglang"): launch_knobs(), ("policy_loss", "dro"): {"beta": 0.1},
          ("reward_function", "remote"): {"url": _REWARD_SERVER.url}, ("reward_function", "llm_judge"): {"url": _REWARD_SERVER.url},
          ("algorithm", "opd"): {"teacher": _teacher_dir()}}
from tests import openenv_server  # noqa: E402  (the openenv environment runs against a local OpenEnv server, started by the fixture below)

_KNOBS[("environment", "openenv")] = {"url": openenv_server.URL, "eval_size": 4}

_CASES = []
for _spec in _LAB.specs():
    _given = _KNOBS.get((_spec.kind, _spec.name), {})
    _CASES += [c for c in contract_cases(lab=_LAB, names=[_spec.name], knobs=_given) if c.kind == _spec.kind]


OPTIONAL_LIBRARIES = {"openenv": "openenv.core.generic_client", "gem": "gem"}
"""Environments whose library is an extra outside ``dev`` (``rllab[openenv]``, ``rllab[gem]``):
their cases skip when it is not installed."""


@pytest.fixture
def _optional_library(request):
    case = request.node.callspec.params["case"]
    if case.name in OPTIONAL_LIBRARIES:
        pytest.importorskip(OPTIONAL_LIBRARIES[case.name])
    if case.name == "openenv":
        openenv_server.ensure_started()


@pytest.mark.parametrize("case", _CASES, ids=str)
def test_contract(case, _optional_library):
    case.run()


def test_no_component_is_left_unchecked():
    """Every component can be built for the suite (none skipped for missing knobs)."""
    missing = [
        (s.kind, s.name, m)
        for s in _LAB.specs()
        if (m := required_knobs(_LAB, s.kind, s.name, _KNOBS.get((s.kind, s.name), {})))
    ]
    assert missing == []


def test_suite_covers_every_tensor_kind():
    kinds = {c.kind for c in _CASES}
    for kind in ("advantage_estimator", "policy_loss", "kl_penalty", "loss_aggregation", "importance_correction", "value_loss", "preference_loss", "kl_controller", "task", "logger", "rollout_backend", "reward_function"):
        assert kind in kinds, f"no {kind} registered"


# --------------------------------------------------------------------------- the suite bites


class _Impostors:
    """Test-only components that break a contract on purpose."""

    @staticmethod
    def batch_baseline(*, token_rewards, mask, index, values=None, config):
        """Baseline over the whole batch, undeclared: each group's advantages depend on the others."""
        import torch

        scores = torch.where(mask, token_rewards, 0.0).sum(-1)
        rows = mask.any(-1)
        adv = scores - scores[rows].mean()
        out = torch.where(mask, adv[:, None], 0.0)
        return out, out.clone()

    @staticmethod
    def declared_batch_baseline(**kw):
        """The same estimator, honest about its batch step: x → x + b for the other groups."""
        return _Impostors.batch_baseline(**kw)

    @staticmethod
    def squared_batch_baseline(**kw):
        """Declares a batch step, but moves the other groups by a non-affine map."""
        adv, _ = _Impostors.batch_baseline(**kw)
        adv = adv * adv.abs()
        return adv, adv.clone()

    @staticmethod
    def self_reducing_loss(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
        """−A·log π averaged over tokens without calling aggregate, undeclared."""
        import torch

        loss = torch.where(mask, -advantages * log_prob, 0.0).sum() / mask.sum()
        zero = torch.zeros(())
        return loss, {"actor/approx_kl": zero, "actor/clipfrac": zero}

    @staticmethod
    def token_mean_declared_seq_mean(**kw):
        """Declares a per-sequence mean but computes a token mean."""
        return _Impostors.self_reducing_loss(**kw)

    @staticmethod
    def batch_normalised_loss(*, log_prob, old_log_prob, advantages, mask, aggregate, config, weights=None):
        """−Â·log π with Â = A / max |A| over the batch it is given: its gradient depends on the split."""
        import torch

        scale = torch.where(mask, advantages.abs(), 0.0).max()
        zero = torch.zeros(())
        return aggregate(-(advantages / scale) * log_prob, mask), {"actor/approx_kl": zero, "actor/clipfrac": zero}

    @staticmethod
    def local_count_mean(*, loss_mat, mask, config, global_tokens=None, global_seqs=None):
        """A token mean over the micro-batch's own tokens (the global count ignored)."""
        import torch

        return torch.where(mask, loss_mat, 0.0).sum() / mask.sum().clamp(min=1)

    @rllab.hookimpl
    def register_loss_aggregations(self, register):
        register("local_count_mean", self.local_count_mean)

    @rllab.hookimpl
    def register_advantage_estimators(self, register):
        register("batch_baseline", self.batch_baseline)
        register("declared_batch_baseline", self.declared_batch_baseline, batch_step="batch mean")
        register("squared_batch_baseline", self.squared_batch_baseline, batch_step="batch mean")

    @rllab.hookimpl
    def register_policy_losses(self, register):
        register("self_reducing_loss", self.self_reducing_loss)
        register("token_mean_declared_seq_mean", self.token_mean_declared_seq_mean, aggregation="seq-mean")
        register("batch_normalised_loss", self.batch_normalised_loss)
        register("declared_batch_normalised_loss", self.batch_normalised_loss, partition="advantages scaled by their batch maximum")


def _outcome(name, check_prefix):
    import pytest as _pytest

    lab = rllab.Lab([_Impostors()], entry_points=False)
    cases = [c for c in contract_cases(lab=lab, names=[name]) if c.check.startswith(check_prefix)]
    assert len(cases) == 1, [c.check for c in cases]
    try:
        cases[0].run()
    except AssertionError as e:
        return "failed", str(e)
    except _pytest.skip.Exception as e:
        return "skipped", str(e)
    return "passed", ""


def test_an_undeclared_batch_baseline_fails_group_isolation():
    status, message = _outcome("batch_baseline", "changing one group's rewards")
    assert status == "failed" and "batch_step" in message


def test_a_declared_batch_step_is_checked_separately():
    assert _outcome("declared_batch_baseline", "changing one group's rewards")[0] == "skipped"
    assert _outcome("declared_batch_baseline", "a declared batch-level step")[0] == "passed"
    status, message = _outcome("squared_batch_baseline", "a declared batch-level step")
    assert status == "failed" and "affine" in message


def test_a_loss_that_bypasses_aggregate_must_declare_it():
    status, message = _outcome("self_reducing_loss", "the loss goes through aggregate")
    assert status == "failed" and "aggregation=" in message
    status, message = _outcome("token_mean_declared_seq_mean", "the loss goes through aggregate")
    assert status == "failed" and "halves" in message


def test_every_component_is_in_the_components_table():
    """docs/components.md names every registered component with its reference."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "components.md").read_text()
    missing = [f"{s.kind} {s.name}" for s in _LAB.specs() if f"`{s.name}`" not in text]
    assert missing == []


@pytest.mark.parametrize(
    "name, knobs, batch_step",
    [("grpo", {"scale": "batch"}, True), ("grpo", {"scale": "none"}, False), ("gae", {"whiten": False}, False)],
)
def test_batch_step_declarations_follow_the_knobs(name, knobs, batch_step):
    """A knob that turns a batch-level step on or off moves the estimator between the two checks."""
    cases = {c.check: c for c in contract_cases(lab=_LAB, names=[name], knobs=knobs) if c.kind == "advantage_estimator"}
    isolation = cases["changing one group's rewards leaves the other groups alone"]
    affine = cases["a declared batch-level step moves other groups by one affine map"]
    ran, skipped = (affine, isolation) if batch_step else (isolation, affine)
    ran.run()
    with pytest.raises(pytest.skip.Exception):
        skipped.run()


def test_partition_invariance_is_checked_or_its_exception_stated():
    """A loss whose gradient depends on the micro-batch split fails, unless it declares why
    (then the check is skipped with that reason); an aggregation that ignores the global counts
    fails; an estimator coupling the batch without declaring it fails the split at a group boundary."""
    status, message = _outcome("batch_normalised_loss", "micro-batches with gradient accumulation")
    assert status == "failed" and "micro-batch" in message
    status, message = _outcome("declared_batch_normalised_loss", "micro-batches with gradient accumulation")
    assert status == "skipped" and "advantages scaled by their batch maximum" in message
    assert _outcome("local_count_mean", "micro-batches with global counts")[0] == "failed"
    status, message = _outcome("batch_baseline", "the batch split at a group boundary")
    assert status == "failed" and "halves" in message
    status, message = _outcome("declared_batch_baseline", "the batch split at a group boundary")
    assert status == "skipped" and "batch mean" in message


def test_the_builtins_that_depend_on_the_split_say_why():
    """Among the built-in losses only the covariance losses (a batch-wide token selection, as verl)
    declare a dependence on the split; every other built-in is checked."""
    declared = {s.name for s in _LAB.specs() if s.kind == "policy_loss" and _LAB.get("policy_loss", s.name, **_KNOBS.get(("policy_loss", s.name), {})).trait("partition")}
    assert declared == {"clip_cov", "kl_cov"}

"""The tiny local model: tokenizer, model directory round trip, warm start, on-disk cache."""

import json
import time

import attrs
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllab.models import tiny as tinymodel
from rllab.models.tiny import (
    CHARACTERS,
    TinyModelConfig,
    WarmStartConfig,
    build_tiny_model,
    build_tokenizer,
    cache_key,
    count_parameters,
    encode_demonstrations,
    get_or_build,
    warm_start,
)
from rllab.types import Example

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
FEW = WarmStartConfig(steps=6, batch_size=8, warmup_steps=2, target_accuracy=None, eval_limit=8, eval_max_new_tokens=4)


class CopyTask:
    """A minimal task: "ab|" -> "ab" (repeat the letters before the bar)."""

    def __init__(self):
        letters = "abcdefgh"
        self.all = [a + b for a in letters for b in letters]

    def train_examples(self, n, rng):
        idx = torch.randint(0, 48, (n,), generator=rng).tolist()
        return [Example(prompt=self.all[i] + "|", answer=self.all[i]) for i in idx]

    def eval_examples(self):
        return [Example(prompt=s + "|", answer=s) for s in self.all[48:]]

    def reward(self, example, completion):
        return 1.0 if completion.strip() == example.answer else 0.0

    def demonstration(self, example):
        return example.answer


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_every_character_and_prepends_bos():
    tok = build_tokenizer()
    ids = tok(CHARACTERS).input_ids
    assert ids[0] == tok.bos_token_id == 1
    assert ids[1:] == list(range(4, 4 + len(CHARACTERS)))  # one token per character, in order
    assert tok.decode(ids, skip_special_tokens=True) == CHARACTERS
    assert tok("12+34=", add_special_tokens=False).input_ids == [tok.convert_tokens_to_ids(c) for c in "12+34="]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(CHARACTERS)


def test_tokenizer_unknown_character_and_decoding_specials():
    tok = build_tokenizer()
    assert tok("aé", add_special_tokens=False).input_ids == [tok.convert_tokens_to_ids("a"), tok.unk_token_id]
    ids = tok("46").input_ids + [tok.eos_token_id]
    assert tok.decode(ids) == "<bos>46<eos>"
    assert tok.decode(ids, skip_special_tokens=True) == "46"


def test_tokenizer_save_and_load_gives_identical_encodings(tmp_path):
    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "make 22 from 3 5 7: (3*5)+7 \n sort {a,b}!"
    assert loaded(text).input_ids == tok(text).input_ids
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    batch = loaded(["1+2=", "12+34="], padding=True)
    assert batch.input_ids[0][:2] == [0, 0]  # left padding, as generation wants


# --------------------------------------------------------------------------- model


def test_default_model_size_and_config():
    model, tok = build_tiny_model(TinyModelConfig())
    n = count_parameters(model)
    assert 400_000 <= n <= 2_000_000
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tok)
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_init_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, _ = build_tiny_model(SMALL)
    after = torch.rand(1)
    b, _ = build_tiny_model(SMALL)
    c, _ = build_tiny_model(attrs.evolve(SMALL, seed=1))
    assert torch.equal(before, after)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_model_directory_round_trip(tmp_path):
    model, tok = build_tiny_model(SMALL)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tok("12+34=").input_ids])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


@pytest.mark.parametrize(
    "bad", [{"hidden_size": 30, "num_heads": 4}, {"num_heads": 4, "num_kv_heads": 3}, {"num_layers": 0}]
)
def test_invalid_model_config(bad):
    with pytest.raises(ValueError):
        TinyModelConfig(**bad)


# --------------------------------------------------------------------------- warm start


def test_encode_demonstrations_masks_only_completion_and_eos():
    tok = build_tokenizer()
    ids, attn, loss_mask = encode_demonstrations(tok, ["1+2=", "10+20="], ["3", "30"])
    t = {c: tok.convert_tokens_to_ids(c) for c in "0123+="}
    assert ids[0].tolist() == [1, t["1"], t["+"], t["2"], t["="], t["3"], 2, 0, 0, 0]
    assert ids[1].tolist() == [1, t["1"], t["0"], t["+"], t["2"], t["0"], t["="], t["3"], t["0"], 2]
    assert attn[0].tolist() == [True] * 7 + [False] * 3 and attn[1].all()
    # targets are input_ids[:, 1:]; row 0 predicts "3" (index 5) and <eos> (index 6)
    assert loss_mask[0].nonzero().flatten().tolist() == [4, 5]
    assert loss_mask[1].nonzero().flatten().tolist() == [6, 7, 8]


def test_demonstration_loss_ignores_prompt_tokens():
    model, tok = build_tiny_model(SMALL)
    ids, attn, mask = encode_demonstrations(tok, ["ab|"], ["ab"])
    loss = tinymodel.demonstration_loss(model, ids, attn, mask)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    targets = ids[0, 1:]
    hand = -logp[torch.arange(len(targets)), targets][3:].mean()  # "a", "b", <eos>
    assert loss.item() == pytest.approx(hand.item(), rel=1e-5)


def test_warm_start_lowers_the_loss_and_reports_metrics():
    model, tok = build_tiny_model(SMALL)
    cfg = attrs.evolve(FEW, steps=30, lr=1e-2, check_every=10)
    m = warm_start(model, tok, CopyTask(), cfg)
    assert m["warm/steps"] == 30
    assert m["warm/loss"] < m["warm/loss_first"] - 0.5
    assert 0.0 <= m["warm/eval_accuracy"] <= 1.0 and 0.0 <= m["warm/probe_accuracy"] <= 1.0
    assert m["warm/parameters"] == count_parameters(model)
    assert not model.training


def test_warm_start_stops_at_target_accuracy():
    class AlwaysRight(CopyTask):
        def reward(self, example, completion):
            return 1.0

    model, tok = build_tiny_model(SMALL)
    m = warm_start(model, tok, AlwaysRight(), attrs.evolve(FEW, steps=50, check_every=3, target_accuracy=0.5))
    assert m["warm/steps"] == 3 and m["warm/probe_accuracy"] == 1.0


def test_the_warm_start_trains_on_while_a_probe_is_scored_and_ends_on_the_probed_weights():
    class SlowJudge(CopyTask):
        """Every answer right, after a wait (a reward service): the first probe already stops."""

        def __init__(self):
            super().__init__()
            self.draws, self.scored = 0, []

        def train_examples(self, n, rng):
            self.draws += 1
            return super().train_examples(n, rng)

        def reward_batch(self, examples, completions, *, completion_ids=None):
            self.scored.append(len(completions))
            deadline = time.monotonic() + 30
            while self.draws < AHEAD and time.monotonic() < deadline:  # until it has trained as far ahead as it may
                time.sleep(0.01)
            return [1.0] * len(completions)

        def reward(self, example, completion):
            return 1.0

    # the probe's draw, its 4 steps, then 4 more per probe taken ahead and the one being trained towards
    AHEAD = 1 + 4 + 4 * (tinymodel.PROBES_AHEAD + 1)
    cfg = attrs.evolve(FEW, steps=50, check_every=4, target_accuracy=0.5, eval_limit=0, probe_size=16)
    model, tok = build_tiny_model(SMALL)
    task = SlowJudge()
    m = warm_start(model, tok, task, cfg)
    time.sleep(0.2)
    assert task.draws == AHEAD  # the steps after the probe were trained while it was scored, and no further …
    assert task.scored == [16]  # … the probes taken ahead were never scored …
    assert m["warm/steps"] == 4 and m["warm/probe_accuracy"] == 1.0
    plain, tok = build_tiny_model(SMALL)
    m2 = warm_start(plain, tok, CopyTask(), attrs.evolve(cfg, steps=4, target_accuracy=None))
    assert m2["warm/loss"] == m["warm/loss"] and m2["warm/loss_first"] == m["warm/loss_first"]
    for (name, a), b in zip(model.state_dict().items(), plain.state_dict().values()):  # … and undone: 4 steps' weights
        assert torch.equal(a, b), name


def test_the_steps_trained_ahead_stop_at_once_when_a_probe_ends_the_warm_start():
    """The probe at step 20 reaches the target while the next interval is being trained: that
    training stops within a step or so, not at the next probe 100 steps on, and is undone."""

    class SlowJudge(CopyTask):
        def __init__(self):
            super().__init__()
            self.draws = 0

        def train_examples(self, n, rng):
            self.draws += 1
            return super().train_examples(n, rng)

        def reward_batch(self, examples, completions, *, completion_ids=None):
            deadline = time.monotonic() + 30
            while self.draws < 1 + 20 + 3 and time.monotonic() < deadline:  # the probe's draw, its 20 steps, 3 more
                time.sleep(0.01)
            return [1.0] * len(completions)

        def reward(self, example, completion):
            return 1.0

    cfg = attrs.evolve(FEW, steps=400, check_every=20, target_accuracy=0.5, eval_limit=0, probe_size=8)
    model, tok = build_tiny_model(SMALL)
    task = SlowJudge()
    m = warm_start(model, tok, task, attrs.evolve(cfg, check_every=20))
    drawn = task.draws
    time.sleep(0.2)
    assert task.draws == drawn  # nothing trains after the warm start returns
    assert 1 + 20 + 3 <= drawn < 1 + 20 + 20  # the next probe (step 40) was never reached
    plain, tok = build_tiny_model(SMALL)
    m2 = warm_start(plain, tok, CopyTask(), attrs.evolve(cfg, steps=20, target_accuracy=None))
    assert m["warm/steps"] == 20 and m2["warm/loss"] == m["warm/loss"]
    for (name, a), b in zip(model.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name


def test_warm_start_restores_thread_count():
    before = torch.get_num_threads()
    model, tok = build_tiny_model(SMALL)
    warm_start(model, tok, CopyTask(), attrs.evolve(FEW, steps=1, eval_limit=0, num_threads=1))
    assert torch.get_num_threads() == before


def test_warm_start_with_zero_steps_only_evaluates():
    model, tok = build_tiny_model(SMALL)
    w0 = model.model.embed_tokens.weight.clone()
    m = warm_start(model, tok, CopyTask(), attrs.evolve(FEW, steps=0))
    assert m["warm/steps"] == 0 and "warm/loss" not in m
    assert torch.equal(model.model.embed_tokens.weight, w0)


# --------------------------------------------------------------------------- cache


def test_cache_key_depends_on_every_config():
    task_cfg = {"name": "copy"}
    base = cache_key(SMALL, task_cfg, FEW)
    assert cache_key(SMALL, dict(task_cfg), attrs.evolve(FEW)) == base
    assert cache_key(attrs.evolve(SMALL, num_layers=2), task_cfg, FEW) != base
    assert cache_key(SMALL, {"name": "copy", "digits": 3}, FEW) != base
    assert cache_key(SMALL, task_cfg, attrs.evolve(FEW, lr=1e-4)) != base


def test_get_or_build_caches_and_reproduces(tmp_path, monkeypatch):
    task = CopyTask()
    t0 = time.perf_counter()
    path = get_or_build(SMALL, task, {"name": "copy"}, FEW, cache_dir=tmp_path, progress=False)
    first = time.perf_counter() - t0
    assert path.parent == tmp_path and path.name.startswith("tiny-qwen2-")
    for f in ("config.json", "model.safetensors", "tokenizer.json", tinymodel.METRICS_FILE):
        assert (path / f).is_file()
    record = json.loads((path / tinymodel.METRICS_FILE).read_text())
    assert record["metrics"]["warm/steps"] == FEW.steps and record["task_config"] == {"name": "copy"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]

    # A second call finds the directory without building anything.
    monkeypatch.setattr(tinymodel, "warm_start", lambda *a, **k: pytest.fail("rebuilt a cached model"))
    t0 = time.perf_counter()
    again = get_or_build(SMALL, task, {"name": "copy"}, FEW, cache_dir=tmp_path, progress=False)
    assert again == path and time.perf_counter() - t0 < min(0.5, first)
    monkeypatch.undo()

    # The cached model is exactly what the same recipe builds in memory.
    model, tok = build_tiny_model(SMALL)
    warm_start(model, tok, task, FEW)
    loaded = AutoModelForCausalLM.from_pretrained(path)
    loaded_tok = AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([loaded_tok("cd|").input_ids])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert tinymodel.warm_start_metrics(path)["warm/steps"] == FEW.steps


def test_cache_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RLLAB_CACHE", str(tmp_path / "env-cache"))
    assert tinymodel.cache_root() == tmp_path / "env-cache"
    assert tinymodel.cache_root(tmp_path / "explicit") == tmp_path / "explicit"
    path = get_or_build(SMALL, CopyTask(), {"name": "copy"}, attrs.evolve(FEW, steps=1, eval_limit=0), progress=False)
    assert path.parent == tmp_path / "env-cache"
    monkeypatch.delenv("RLLAB_CACHE")
    assert tinymodel.cache_root() == tinymodel.Path.home() / ".cache" / "rllab" / "models"


def test_progress_bar_runs(tmp_path, capsys):
    cfg = attrs.evolve(FEW, steps=3, eval_limit=0)
    get_or_build(SMALL, CopyTask(), {"name": "copy"}, cfg, cache_dir=tmp_path, progress=True)
    assert "warm start" in capsys.readouterr().err


@pytest.mark.slow
def test_default_warm_start_on_addition_is_partly_right(tmp_path):
    import rllab

    comp = rllab.Lab().get("task", "addition")
    task = comp()
    task_cfg = {"name": "addition", **attrs.asdict(comp.config)}
    path = get_or_build(TinyModelConfig(), task, task_cfg, WarmStartConfig(), cache_dir=tmp_path, progress=False)
    acc = tinymodel.warm_start_metrics(path)["warm/eval_accuracy"]
    assert 0.1 <= acc <= 0.4


def test_a_model_cache_that_is_a_file_is_refused_naming_the_variable(tmp_path, monkeypatch):
    """Traceback: ``$RLLAB_CACHE`` naming a file warm-started the model, then crashed with
    FileExistsError when saving it."""
    from rllab.errors import ConfigError

    afile = tmp_path / "cache.toml"
    afile.write_text("x")
    monkeypatch.setenv(tinymodel.CACHE_ENV, str(afile))
    with pytest.raises(ConfigError, match=r"\$RLLAB_CACHE = '.*cache.toml' is a file, not a directory"):
        tinymodel.cache_root()
    with pytest.raises(ConfigError, match=r"the model cache '.*cache.toml' is a file"):
        tinymodel.cache_root(afile)
    monkeypatch.setenv(tinymodel.CACHE_ENV, str(tmp_path / "new"))
    assert tinymodel.cache_root() == tmp_path / "new"  # a directory not made yet is fine

"""The textarena environment: single-player textarena games played offline, one game per episode."""

from __future__ import annotations

import random
import socket

import pytest
import torch

pytest.importorskip("textarena")

from rllab.types import Example  # noqa: E402
from rllab_tasks.environments.textarena import GAMES, TextArenaConfig, TextArenaError, textarena_env  # noqa: E402


def _env(**knobs):
    return textarena_env(config=TextArenaConfig(**{"eval_size": 4, **knobs}))


def _play(env, example, turns):
    episode = env.start(example)
    return [episode.step(t) for t in turns]


def test_a_wrong_guess_gets_only_the_new_hint_and_the_right_one_ends_with_textarenas_reward():
    env = _env(game="GuessTheNumber-v0")
    ex = env.eval_examples()[0]
    assert ex.prompt.startswith("[GAME] You are Player 0. You are playing Guess The Number.\n")
    assert ex.prompt.endswith("Enter your guess.\n") and env.max_turns == 10
    episode = env.start(ex)
    secret = episode.game.state.game_state["game_number"]
    low = 1 if secret > 1 else 2
    first = episode.step(f"I say [{low}]")
    hint = "higher" if low < secret else "lower"
    assert first == type(first)(observation=f"[GAME] The target number is {hint}.\n", metrics={"invalid_moves": 0.0})
    last = episode.step(f"[{secret}]")
    assert (last.done, last.reward, last.observation) == (True, 1.0, None)
    with pytest.raises(TextArenaError, match="step after the game ended"):
        episode.step("[1]")


def test_a_game_board_delta_is_the_move_and_the_new_board_not_the_transcript():
    env = _env(game="TowerOfHanoi-v0")
    ex = env.eval_examples()[0]
    (step,) = _play(env, ex, ["[A C]"])
    assert step.observation == "[GAME] You moved disk 1 from A to C.\n[GAME] Current Board: \nA: [3, 2]\nB: []\nC: [1]\n.\n"
    assert not step.done and step.reward == 0.0


def test_two_invalid_moves_end_the_game_with_textarenas_penalty():
    env = _env(game="GuessTheNumber-v0")
    a, b = _play(env, env.eval_examples()[0], ["no guess", "still none"])
    assert a.observation.startswith("[GAME] You attempted an invalid move.") and not a.done
    assert a.metrics == {"invalid_moves": 1.0}
    # GuessTheNumber's penalty is its completion fraction, 0 with no valid guess yet
    assert (b.done, b.reward, b.metrics) == (True, 0.0, {"invalid_moves": 1.0})


def test_bracket_actions_wraps_a_bare_turn_like_textarenas_default_wrapper():
    ex = _env().eval_examples()[0]
    on, off = _env(), _env(bracket_actions=False)
    assert not on.start(ex).step("3").observation.startswith("[GAME] You attempted an invalid move")
    assert off.start(ex).step("3").observation.startswith("[GAME] You attempted an invalid move")


def test_the_demonstrations_win_guess_the_number_by_binary_search_and_hanoi_by_recursion():
    env = _env(game="GuessTheNumber-v0", eval_size=8)
    for ex in env.eval_examples():
        turns = env.demonstration(ex)
        steps = _play(env, ex, turns)
        assert len(turns) <= 5 and steps[-1].done and steps[-1].reward == 1.0
    for game, disks in (("TowerOfHanoi-v0", 3), ("TowerOfHanoi-v0-medium", 4)):
        hanoi = _env(game=game)
        ex = hanoi.eval_examples()[0]
        turns = hanoi.demonstration(ex)
        steps = _play(hanoi, ex, turns)
        assert len(turns) == 2**disks - 1 and turns[:3] == (["[A C]", "[A B]", "[C B]"] if disks == 3 else ["[A B]", "[A C]", "[B C]"])
        assert [s.done for s in steps] == [False] * (len(turns) - 1) + [True] and steps[-1].reward == 1.0
        assert hanoi.warm_start_defaults["steps"] > 0  # a shorter warm start than a task's: a game is hundreds of tokens
    mines = _env(game="Minesweeper-v0-small")
    assert mines.warm_start_defaults == {"steps": 0}
    with pytest.raises(TextArenaError, match=r"no demonstrations \(only GuessTheNumber, TowerOfHanoi do\); set warm_start.steps=0"):
        mines.demonstration(mines.eval_examples()[0])


def test_registered_and_passing_the_environment_contract():
    import rllab
    from rllab.testing import run_contract

    lab = rllab.Lab()
    assert type(lab.get("environment", "textarena", game="TowerOfHanoi-v0", eval_size=2)()).__name__ == "TextArenaEnvironment"
    for knobs in ({"eval_size": 4}, {"game": "TowerOfHanoi-v0", "eval_size": 4}):
        failed = [(r.check, r.message) for r in run_contract(lab, "environment", "textarena", knobs) if not r.passed]
        assert failed == []


def test_an_episode_replays_from_its_seed_however_episodes_interleave_and_leaves_random_alone():
    # 2048 draws each new tile from `random` while playing: a shared generator would differ
    env = _env(game="2048-v0-3x3", max_turns=20)
    a, b = env.eval_examples()[:2]
    moves = ["[up]", "[left]", "[down]", "[right]", "[up]", "[left]"]
    alone = [s.observation for s in _play(env, a, moves)]
    random.seed(7)
    expected_next = random.Random(7).random()
    ea, eb = env.start(a), env.start(b)
    interleaved = []
    for m in moves:
        interleaved.append(ea.step(m).observation)
        eb.step(m)
        random.random()  # the caller's own draws between turns
    assert interleaved == alone and len(set(alone)) > 1
    random.seed(7)
    env.start(a).step("[up]")
    assert random.random() == expected_next


def test_seeds_split_into_a_fixed_eval_list_and_disjoint_generator_draws():
    env = _env(game="FrozenLake-v0", max_turns=20, eval_size=6)
    seeds = [e.meta["seed"] for e in env.eval_examples()]
    assert seeds == sorted(seeds) and seeds == [e.meta["seed"] for e in _env(game="FrozenLake-v0", max_turns=20, eval_size=6).eval_examples()]
    draw = lambda: [e.meta["seed"] for e in env.train_examples(8, torch.Generator().manual_seed(3))]  # noqa: E731
    assert draw() == draw() and set(draw()).isdisjoint(seeds)
    assert [e.meta["seed"] for e in _env(game="FrozenLake-v0", max_turns=20, eval_size=6, seed=1).eval_examples()] != seeds
    # an example whose prompt is not what its seed opens with is refused
    with pytest.raises(TextArenaError, match="not deterministic given its seed"):
        env.start(Example(prompt="something else", answer="", meta={"seed": seeds[0]}))


def test_unsupported_and_unknown_games_are_refused_by_name():
    with pytest.raises(ValueError, match=r"game = 'Wordle-v0' is not supported \(it calls nltk.download.*GuessTheNumber-v0"):
        TextArenaConfig(game="Wordle-v0")
    with pytest.raises(ValueError, match=r"game = 'Chess-v0' is not supported: the single-player textarena games verified"):
        TextArenaConfig(game="Chess-v0")
    with pytest.raises(ValueError, match="'2048-v0' has no turn limit of its own; set env.max_turns"):
        _env(game="2048-v0")
    assert _env(game="2048-v0", max_turns=30).max_turns == 30


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network, no NLTK data."""
    import nltk

    def refuse(*a, **k):
        raise AssertionError("a listed game reached for the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(nltk, "download", refuse)
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])


@pytest.mark.parametrize("game", GAMES)
def test_every_listed_game_plays_offline_and_replays_from_its_seed(game, offline):
    env = _env(game=game, eval_size=1, max_turns=50)
    ex = env.eval_examples()[0]
    turns = ["[1]", "[2 2]", "[up]", "hello", "bye"]

    def play():
        episode, out = env.start(ex), []
        for t in turns:
            out.append(episode.step(t))
            if out[-1].done:
                return out
        return out

    first = play()
    assert first == play() and isinstance(ex.prompt, str) and ex.prompt


@pytest.mark.slow
def test_rllab_run_plays_textarena_games_with_the_tiny_model(tmp_path, model_cache):
    import json

    from rllab.cli import main

    run = tmp_path / "run"
    rc = main(["run", "env=textarena", "env.game=GuessTheNumber-v0", "env.eval_size=4", "--steps", "2", "-q", "--run-dir", str(run),
               "rollout.prompts_per_step=2", "rollout.group_size=2", "train.eval_size=4", "model.warm_start.steps=5",
               "model.tiny.max_position_embeddings=1024", "rollout.max_episode_tokens=400", "rollout.max_new_tokens=8"])
    assert rc == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward" in r]
    assert len(steps) == 2 and all(r["env/turns"] >= 1.0 and "env/invalid_moves" in r for r in steps)


def test_the_docs_commands_configure_the_environments_they_name():
    import importlib.util
    import shlex
    from pathlib import Path

    import rllab
    from rllab.config import load_config

    pytest.importorskip("reasoning_gym")
    text = (Path(__file__).resolve().parents[2] / "docs" / "environment-libraries.md").read_text().replace("\\\n", " ")
    lines = [ln.split("#")[0] for ln in text.splitlines() if ln.startswith("rllab run env=")]
    assert len(lines) >= 4
    lab = rllab.Lab()
    for line in lines:
        args = [a for a in shlex.split(line)[2:] if not a.startswith("--") and not a.isdigit()]
        cfg = load_config(None, args, lab=lab)
        name = cfg.component("env").name
        if name == "gem" and importlib.util.find_spec("gem") is None:
            continue  # gem-llm is an extra of its own
        knobs = {**cfg.component("env").knobs, "eval_size": 2}
        env = lab.get("environment", name, **knobs)()
        assert env.eval_examples() and env.max_turns >= 1

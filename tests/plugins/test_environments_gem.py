"""The gem environment: GEM hub environments (gem-llm) played offline, one GEM episode per rllab episode."""

from __future__ import annotations

import json
import random
import socket

import numpy as np
import pytest
import torch

pytest.importorskip("gem")

from rllab.errors import NoDemonstrationError  # noqa: E402
from rllab_tasks.environments.gem import GemConfig, GemError, gem_env  # noqa: E402


def _env(**knobs):
    return gem_env(config=GemConfig(**{"eval_size": 4, **knobs}))


def test_a_wrong_guess_gets_the_new_hint_and_the_right_one_ends_with_gems_reward():
    env = _env()
    ex = env.eval_examples()[0]
    assert ex.prompt.startswith("You are playing Guess The Number.\nYou have to guess the number between 1 and 10 (inclusive) within 4 turns.")
    assert ex.prompt.endswith("Enter your first guess to start the game.\nEnter your next guess.") and env.max_turns == 4
    episode = env.start(ex)
    secret = episode.game.game_number
    low = 1 if secret > 1 else 2
    first = episode.step(f"I say \\boxed{{{low}}}")
    hint = "higher" if low < secret else "lower"
    assert first == type(first)(observation=f"At turn 1, you guessed {low}, and the target number is {hint} than {low}.\nEnter your next guess.")
    last = episode.step(f"\\boxed{{{secret}}}")
    assert (last.done, last.reward, last.observation) == (True, 1.0, None)
    with pytest.raises(GemError, match="step after the episode ended"):
        episode.step("\\boxed{1}")


def test_a_turn_without_a_boxed_guess_ends_with_gems_format_penalty():
    env = _env()
    (step,) = [env.start(env.eval_examples()[1]).step("five")]
    assert step.done and step.reward == pytest.approx(-0.1)


def test_a_reasoning_gym_id_is_one_question_with_the_boxed_instruction_scored_by_reasoning_gym():
    env = _env(id="rg:basic_arithmetic")
    ex = env.eval_examples()[0]
    assert env.max_turns == 1 and ex.prompt.endswith("\nPut your final answer within \\boxed{}.")
    question = ex.prompt.split("\n")[0]
    answer = str(env.start(ex).game.data["answer"])  # reasoning-gym's own reference answer for the question
    assert question.startswith("Calculate ") and answer
    assert env.demonstration(ex) == ["\\boxed{" + answer + "}"]
    right, wrong = env.start(ex).step(f"so \\boxed{{{answer}}}"), env.start(ex).step("\\boxed{0.5}")
    assert (right.done, right.reward, wrong.done, wrong.reward) == (True, 1.0, True, 0.0)
    assert _env(id="rg:basic_arithmetic", instruction="").eval_examples()[0].prompt == question + "\n"


def test_the_guess_the_number_demonstration_wins_by_binary_search():
    for game in ("game:GuessTheNumber-v0-easy", "game:GuessTheNumber-v0-hard"):
        env = _env(id=game, eval_size=6)
        for ex in env.eval_examples():
            turns = env.demonstration(ex)
            episode = env.start(ex)
            steps = [episode.step(t) for t in turns]
            assert len(turns) <= env.max_turns and steps[-1].done and steps[-1].reward == 1.0
    with pytest.raises(NoDemonstrationError, match="'game:Sudoku-v0-easy' has no demonstrations"):
        sudoku = _env(id="game:Sudoku-v0-easy")
        sudoku.demonstration(sudoku.eval_examples()[0])
    assert sudoku.warm_start_defaults == {"steps": 0}


def test_an_episode_replays_from_its_seed_however_episodes_interleave_and_leaves_the_generators_alone():
    env = _env(id="game:Game2048-v0-easy")  # 2048 draws each new tile while playing
    a, b = env.eval_examples()[:2]
    moves = ["\\boxed{up}", "\\boxed{left}", "\\boxed{down}", "\\boxed{right}", "\\boxed{up}"]
    ea = env.start(a)
    alone = [ea.step(m).observation for m in moves]
    random.seed(7)
    np.random.seed(7)
    expected = (random.Random(7).random(), np.random.RandomState(7).rand())
    ea, eb = env.start(a), env.start(b)
    interleaved = []
    for m in moves:
        interleaved.append(ea.step(m).observation)
        eb.step(m)
        random.random()  # the caller's own draws between turns
    assert interleaved == alone and len(set(alone)) > 1
    random.seed(7)
    np.random.seed(7)
    env.start(a).step("\\boxed{up}")
    assert (random.random(), np.random.rand()) == expected


def test_seeds_split_into_a_fixed_eval_list_and_disjoint_generator_draws():
    env = _env(eval_size=6)
    seeds = [e.meta["seed"] for e in env.eval_examples()]
    assert seeds == sorted(seeds) and seeds == [e.meta["seed"] for e in _env(eval_size=6).eval_examples()]
    draw = lambda: [e.meta["seed"] for e in env.train_examples(8, torch.Generator().manual_seed(3))]  # noqa: E731
    assert draw() == draw() and set(draw()).isdisjoint(seeds)
    from rllab.types import Example

    with pytest.raises(GemError, match="not deterministic given its seed"):
        env.start(Example(prompt="something else", answer="", meta={"seed": seeds[0]}))


def test_unsupported_unknown_and_unbounded_ids_are_refused_by_name():
    with pytest.raises(ValueError, match=r"id = 'game:Wordle-v0-easy' is not supported \(it calls nltk.download"):
        GemConfig(id="game:Wordle-v0-easy")
    with pytest.raises(ValueError, match=r"GEM has no environment 'game:GuessTheNumber-v0'; did you mean 'game:GuessTheNumber-v0-"):
        _env(id="game:GuessTheNumber-v0")
    with pytest.raises(ValueError, match=r"'game:GuessTheNumber-v0-random' has no fixed turn limit .*set env.max_turns"):
        _env(id="game:GuessTheNumber-v0-random")
    assert _env(id="game:GuessTheNumber-v0-random", max_turns=9).max_turns == 9


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network, no NLTK data."""
    import nltk

    def refuse(*a, **k):
        raise AssertionError("a GEM environment reached for the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(nltk, "download", refuse)
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])


@pytest.mark.parametrize("env_id", ["game:GuessTheNumber-v0-hard", "game:Mastermind-v0-easy", "game:Minesweeper-v0-easy", "game:Sudoku-v0-easy",
                                    "game:TowerofHanoi-v0-easy", "game:FifteenPuzzle-v0-easy", "game:Crosswords-v0-hard", "game:Sokoban-v0-easy",
                                    "rg:letter_counting", "rg:chain_sum"])
def test_gem_ids_play_offline_and_replay_from_their_seed(env_id, offline):
    env = _env(id=env_id, eval_size=1)
    ex = env.eval_examples()[0]

    def play():
        episode, out = env.start(ex), []
        for t in ["\\boxed{1}", "\\boxed{2 2}", "\\boxed{up}", "hello"]:
            out.append(episode.step(t))
            if out[-1].done:
                break
        return out

    assert play() == play() and isinstance(ex.prompt, str) and ex.prompt


def test_registered_and_passing_the_environment_contract():
    import rllab
    from rllab.testing import run_contract

    lab = rllab.Lab()
    failed = [(r.check, r.message) for r in run_contract(lab, "environment", "gem", {"id": "rg:basic_arithmetic", "eval_size": 4}) if not r.passed]
    assert failed == []


def test_rllab_run_trains_on_a_gem_environment(tmp_path, model_cache):
    from rllab.cli import main

    run = tmp_path / "run"
    rc = main(["run", "env=gem", "env.id=rg:basic_arithmetic", "env.eval_size=4", "--steps", "2", "-q", "--run-dir", str(run),
               "rollout.prompts_per_step=2", "rollout.group_size=2", "train.eval_size=4", "model.warm_start.steps=0",
               "rollout.max_new_tokens=8"])
    assert rc == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["env/turns"] == 1.0 for r in steps)

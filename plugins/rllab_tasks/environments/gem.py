"""``gem``: an environment of the GEM hub (``gem-llm``, "a Gym for generalist LLMs") as an rllab
environment (``pip install rllab[gem]``, tested with gem-llm 0.1.0).

``env.id`` names the GEM environment by its registry id: the games (``game:GuessTheNumber-v0-easy``,
``game:Sudoku-v0-easy``, ``game:Minesweeper-v0-easy``, ...), the reasoning-gym tasks
(``rg:letter_counting``, ``rg:basic_arithmetic``, ...), and the data-set ids (``math:GSM8K``,
``qa:HotpotQA``, ``code:…``), which download their data set from the Hugging Face hub when built.
The games in :data:`UNSUPPORTED` are refused by name: they need the network or fail in gem-llm 0.1.0.

An episode is one GEM episode on a fresh copy of the environment (GEM's contract,
``reset(seed) -> (obs, info)``, ``step(action) -> (obs, reward, terminated, truncated, info)``):

- the opening prompt is ``info["prefix"] + obs + info["suffix"]`` of ``reset(seed=example.meta["seed"])``
  (a newline after ``obs`` when it has none: GEM's ``concat`` observation wrapper), then
  ``instruction``;
- each model turn goes to ``step(turn)``; the observation is the step's ``obs + info["suffix"]``
  (the delta, not GEM's concatenated history: the transcript is already in the tokens), with the
  role ``tool`` when GEM marks it ``use_tool``; the episode ends when GEM says terminated or truncated;
- each step's reward is GEM's reward for it, on that turn's last token (GEM's games give per-turn
  rewards: GuessTheNumber −0.1 for a turn without a ``\\boxed{}`` guess, 1 for the right number).
  A run counts an episode solved when its total reward is ≥ 1.

Determinism: GEM seeds the process-wide ``random`` and ``numpy.random`` in ``reset`` and its games
draw from them while playing. Every call into an episode runs under a lock with those states
swapped for the episode's own, so an episode replays identically from its seed however episodes
interleave, and the caller's generators are left untouched.

Examples are seeds, split as in :mod:`rllab_tasks.environments.textarena`. Demonstrations: the
reasoning-gym ids (``\\boxed{answer}``) and GuessTheNumber (a binary search on the game's
higher/lower hints); the other ids default to ``warm_start.steps = 0``.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import random
import threading

import attrs
import numpy as np

import rllab
from rllab.rollout.environment import Step
from rllab.errors import NoDemonstrationError
from rllab.types import Example

from ..split import SeededExamples, eval_fraction_knob, eval_size_knob, seed_knob

SINGLE_TURN = ("rg:", "math:", "qa:", "logic:", "code:", "eval:")
"""GEM's data-set environments: one question, one answer (GEM's "contextual bandits")."""

UNSUPPORTED = {
    "game:Hangman": "it calls nltk.download, which needs the network, for its word list",
    "game:Wordle": "it calls nltk.download, which needs the network, for its word list",
    "game:WordSearch": "it needs NLTK's 'words' corpus, which is downloaded from the network",
    "game:Crosswords-v0-random": "its reset fails in gem-llm 0.1.0 (no words match its criteria)",
    "game:FifteenPuzzle-v0-random": "its reset fails in gem-llm 0.1.0 (a TypeError)",
}
"""GEM ids refused, with the reason (matched on the id, then on its game name)."""

DEFAULT_INSTRUCTION = "Put your final answer within \\boxed{}."
"""Appended to a data-set id's question when ``instruction`` is None: GEM scores the last ``\\boxed{}``."""

WARM_START = {"steps": 60, "batch_size": 16, "probe_size": 16, "check_every": 20, "eval_limit": 16}
"""The tiny model's warm start on a game with demonstrations (a game is hundreds of tokens)."""


class GemError(rllab.RllabError):
    """A GEM environment broke the environment protocol (a malformed observation or reward)."""


MISSING = "the gem environment needs the gem-llm package: pip install 'rllab[gem]'"


def _installed() -> None:
    """Refuse, naming the ``pip install``, when gem-llm is not installed: asked before a run
    creates anything (:func:`rllab.training.parts.check_installed`)."""
    if importlib.util.find_spec("gem") is None:
        raise rllab.MissingExtraError(MISSING)


def _gem():
    """``import gem``, keeping the logging configuration (gem calls ``logging.basicConfig`` on import)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import gem
    except ImportError:
        raise rllab.MissingExtraError(MISSING) from None
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return gem


def _id(inst, attribute, value):
    reason = UNSUPPORTED.get(value) or UNSUPPORTED.get(value.split("-")[0])
    if reason:
        raise ValueError(f"id = {value!r} is not supported ({reason}); 'rllab plugins show gem --doc' lists the GEM ids that work offline")


@attrs.frozen
class GemConfig:
    """Knobs of the gem environment."""

    id: str = rllab.knob(
        "game:GuessTheNumber-v0-easy",
        help="a GEM environment id: game:… (GuessTheNumber-v0-easy, Sudoku-v0-easy, Mastermind-v0-easy, …), rg:… "
        "(reasoning-gym tasks), math:/qa:/code:… (data sets from the Hugging Face hub)",
        validator=_id,
    )
    max_turns: int | None = rllab.knob(
        None, help="the most model turns of an episode; None: 1 for data-set ids, the game's own max_turns for games", ge=1
    )
    instruction: str | None = rllab.knob(
        None, help="text appended to the opening prompt; None: for data-set ids, ask for the answer in \\boxed{} (GEM scores it), else nothing"
    )
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = eval_size_knob()
    seed: int = seed_knob()


_LOCK = threading.RLock()
"""Serialises calls into GEM environments: they share the process-wide ``random`` and ``numpy.random``."""


class _Generators:
    """The ``random`` and ``numpy.random`` states of one episode, swapped in for each call."""

    def __init__(self):
        self.state = None

    def call(self, fn):
        with _LOCK:
            outer = (random.getstate(), np.random.get_state())
            if self.state is not None:
                random.setstate(self.state[0])
                np.random.set_state(self.state[1])
            try:
                return fn()
            finally:
                self.state = (random.getstate(), np.random.get_state())
                random.setstate(outer[0])
                np.random.set_state(outer[1])


def _line(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _text(value, what: str, name: str) -> str:
    if not isinstance(value, str):
        raise GemError(f"{name}: GEM returned a {what} {value!r} of type {type(value).__name__}, not text")
    return value


class GemEpisode:
    """One GEM episode on a fresh copy of the environment, reset from ``seed``."""

    def __init__(self, env: "GemEnvironment", seed: int):
        self.name = f"gem {env.config.id!r} seed {seed}"
        self.done = False
        self._gen = _Generators()
        self.game = self._gen.call(lambda: copy.deepcopy(env.template))

        def reset():
            obs, info = self.game.reset(seed=seed)
            info = info or {}
            body = info.get("prefix", "") + _line(_text(obs, "observation", self.name)) + info.get("suffix", "")
            return _line(body) + env.instruction if env.instruction else body

        self.opening = self._gen.call(reset)

    def step(self, text: str) -> Step:
        if self.done:
            raise GemError(f"{self.name}: step after the episode ended")
        obs, reward, terminated, truncated, info = self._gen.call(lambda: self.game.step(text))
        if isinstance(reward, bool) or not isinstance(reward, (int, float, np.number)):
            raise GemError(f"{self.name}: GEM returned the reward {reward!r}, not a number")
        self.done = bool(terminated or truncated)
        if self.done:
            return Step(reward=float(reward), done=True)
        info = info or {}
        observation = _line(_text(obs, "observation", self.name)) + info.get("suffix", "")
        return Step(observation=observation or None, reward=float(reward), role="tool" if info.get("use_tool") else "user")


class GemEnvironment(SeededExamples, rllab.Environment):
    """A GEM environment: an example is a seed, an episode is one GEM episode."""

    name = "gem"

    def __init__(self, config: GemConfig):
        gem = _gem()
        from gem.envs.registration import ENV_REGISTRY

        self.config = config
        if config.id not in ENV_REGISTRY:
            import difflib

            close = difflib.get_close_matches(config.id, list(ENV_REGISTRY), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else "; gem.print_envs() lists them"
            raise ValueError(f"environment 'gem': GEM has no environment {config.id!r}{hint}")
        single = config.id.startswith(SINGLE_TURN)
        try:
            self.template = _Generators().call(lambda: gem.make(config.id))  # its constructor may draw from random
        except Exception as e:  # noqa: BLE001  (a data set that cannot be downloaded, a missing optional package)
            raise GemError(f"environment 'gem': GEM could not build {config.id!r}: {type(e).__name__}: {e}") from e
        own = getattr(self.template, "max_turns", None)
        if config.max_turns is not None:
            self.max_turns = config.max_turns
        elif single:
            self.max_turns = 1
        elif config.id.endswith("-random") or not isinstance(own, int):
            raise ValueError(f"environment 'gem': {config.id!r} has no fixed turn limit (it draws one per game); set env.max_turns")
        else:
            self.max_turns = own
        self.instruction = config.instruction if config.instruction is not None else (DEFAULT_INSTRUCTION if single else "")
        self._demo = _demonstration_of(config.id)
        if self._demo is None:
            self.warm_start_defaults = {"steps": 0}
        elif not single:
            self.warm_start_defaults = dict(WARM_START)
        self._eval: list[Example] | None = None

    @property
    def tiny_model_defaults(self) -> dict:
        """The tiny model's context for this id: the least power of two ≥ 256 that holds the opening
        prompt in the character tokenizer and 256 more tokens for the episode's turns."""
        need = len(self.example(0).prompt) + 1 + 256
        return {"max_position_embeddings": max(256, 1 << (need - 1).bit_length())}

    def example(self, seed: int) -> Example:
        """The example of seed ``seed``: the opening prompt, no reference answer."""
        return Example(prompt=GemEpisode(self, seed).opening, answer="", meta={"seed": seed, "id": self.config.id})

    def start(self, example: Example) -> GemEpisode:
        """A fresh episode from the example's seed; its opening must be the example's prompt."""
        episode = GemEpisode(self, example.meta["seed"])
        if episode.opening != example.prompt:
            raise GemError(
                f"environment 'gem': {self.config.id!r} seed {example.meta['seed']} opened with a different prompt "
                "than when the example was drawn (not deterministic given its seed)"
            )
        return episode

    def demonstration(self, example: Example) -> list[str]:
        """A solved episode's turns, for the ids with a solver; the others have none."""
        if self._demo is None:
            raise NoDemonstrationError(
                f"environment 'gem': {self.config.id!r} has no demonstrations (the rg: ids and GuessTheNumber do); "
                "set model.warm_start.steps=0 or train a model of your own (model.path=...)"
            )
        return self._demo(self.start(example))

    def __repr__(self):
        return f"<environment {self.name!r} {self.config!r}>"


def _reasoning_gym(episode: GemEpisode) -> list[str]:
    """The data set's own answer, boxed (GEM scores the last ``\\boxed{}``)."""
    return ["\\boxed{" + str(episode.game.data["answer"]) + "}"]


def _guess_the_number(episode: GemEpisode) -> list[str]:
    """Binary search on the game's higher/lower hints (never on the secret): always a win
    within GEM's turn limits (⌈log2(range + 1)⌉ guesses)."""
    lo, hi = episode.game.min_number, episode.game.max_number
    turns: list[str] = []
    while True:
        guess = (lo + hi) // 2
        turns.append("\\boxed{" + str(guess) + "}")
        step = episode.step(turns[-1])
        if step.done:
            return turns
        if "higher" in step.observation:
            lo = guess + 1
        else:
            hi = guess - 1


def _demonstration_of(env_id: str):
    if env_id.startswith("rg:"):
        return _reasoning_gym
    if env_id.startswith("game:GuessTheNumber"):
        return _guess_the_number
    return None


def gem_env(*, config: GemConfig) -> GemEnvironment:
    """A GEM hub environment (gem-llm): games, reasoning-gym tasks and data sets by their GEM id."""
    return GemEnvironment(config)


gem_env.check_installed = _installed

"""``textarena``: a single-player game of the ``textarena`` package as a multi-turn environment
(offline; needs the ``envs`` extra, tested with textarena 0.7.4).

``env.game`` names the game by its textarena id (``GuessTheNumber-v0``, ``TowerOfHanoi-v0``,
``Minesweeper-v0-small``, ...). Only the ids in :data:`GAMES` are accepted: each was checked to
reset, play to its end and replay identically from a seed with the network blocked and no NLTK
data. The others are refused by name, with the reason when it is known (:data:`UNSUPPORTED`).

An episode is one game, played on the *raw* textarena env (``textarena.make(game + "-raw")``):

- ``env.reset(num_players=1, seed=example.meta["seed"])``; the opening prompt is the game's first
  observation, rendered as ``"[GAME] <message>\\n"`` per message (textarena's own
  ``LLMObservationWrapper`` tags, without its accumulated history).
- Each model turn goes to ``env.step(turn)``; with ``bracket_actions`` a turn holding no square
  bracket is wrapped in ``[...]`` first (textarena's ``ActionFormattingWrapper``, part of its
  default wrappers). The step's observation is the **delta**: the messages the game sent the
  player since the previous turn, rendered the same way, minus the echo of the player's own action
  (``PLAYER_ACTION``), which is already in the trajectory as the model's tokens.
- When the game ends, the reward is textarena's ``env.close()`` reward for player 0 (games differ:
  1 for a win, a completion fraction or -1 on a loss or a second invalid move). Earlier turns
  score 0. ``Step.metrics`` counts ``invalid_moves`` (textarena allows one invalid move in a row
  with a warning; the second ends the game).

Determinism: textarena seeds the process-wide ``random`` module in ``reset`` and draws from it
while playing (2048's new tiles, Bandit's payouts). Every call into a game runs under a lock with
``random``'s state swapped for the episode's own, so an episode replays identically from its seed
however many episodes are interleaved, and the caller's ``random`` state is left untouched. What a
game prints to stdout while it runs is discarded.

Examples: an example is a seed. ``train_examples`` draws seeds in ``[0, 2**31)`` from the
``torch.Generator``; a seed belongs to the held-out split when a salted hash of it falls below
``eval_fraction`` (:mod:`rllab_tasks.split`); ``eval_examples`` are the first ``eval_size``
held-out seeds counting up from 0. Disjoint seeds are not always distinct games: GuessTheNumber-v0
has only 20 secret numbers.

Demonstrations (:data:`DEMONSTRATIONS`): ``GuessTheNumber`` (a binary search driven by the
game's higher/lower hints, never by the secret) and ``TowerOfHanoi`` (the classic recursion) have
winning ones; the other games set ``warm_start.steps = 0`` by default and refuse a warm start (and
``rllab check``'s episode checks, which play demonstrations).

The tiny character model: every game's prompt is hundreds of characters (GuessTheNumber-v0: 516,
TowerOfHanoi-v0: 373, Minesweeper-v0-small: 858), beyond the tiny model's default 256 positions.
The environment's ``tiny_model_defaults`` give the tiny model the context the game needs (1024
positions for GuessTheNumber-v0, 2048 for Minesweeper-v0-small) unless ``model.tiny.max_position_embeddings``
is set; a pretrained model keeps its own. Blackjack (``♣ ♦``) and PegJump (``○ ●``) use characters
the character tokenizer encodes as ``<unk>``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import random
import threading

import attrs

import rllab
from rllab.rollout.environment import Step
from rllab.types import Example

from ..split import SeededExamples, eval_fraction_knob, eval_size_knob, seed_knob

GAMES = (
    "GuessTheNumber-v0", "GuessTheNumber-v0-hardcore",
    "TowerOfHanoi-v0", "TowerOfHanoi-v0-medium", "TowerOfHanoi-v0-hard", "TowerOfHanoi-v0-hardcore",
    "TowerOfHanoi-v0-extreme",
    "Minesweeper-v0", "Minesweeper-v0-small", "Minesweeper-v0-medium", "Minesweeper-v0-hard",
    "Mastermind-v0", "Mastermind-v0-hard", "Mastermind-v0-extreme",
    "FrozenLake-v0", "FrozenLake-v0-random", "FrozenLake-v0-hardcore",
    "2048-v0-ultra-easy", "2048-v0-mega-easy", "2048-v0-super-easy", "2048-v0-very-easy", "2048-v0-easy", "2048-v0",
    "2048-v0-hard", "2048-v0-very-hard", "2048-v0-extreme", "2048-v0-3x3", "2048-v0-5x5", "2048-v0-6x6",
    "2048-v0-8x8", "2048-v0-10x10",
    "Bandit-v0", "Bandit-v0-hard",
    "Blackjack-v0", "Blackjack-v0-long",
    "Crosswords-v0", "Crosswords-v0-hardcore",
    "FifteenPuzzle-v0",
    "LightsOut-v0",
    "LogicPuzzle-v0", "LogicPuzzle-v0-hard",
    "PegJump-v0",
    "RushHour-v0",
    "Secretary-v0", "Secretary-v0-long",
    "Set-v0",
    "Sudoku-v0-very-easy", "Sudoku-v0-easy", "Sudoku-v0", "Sudoku-v0-medium",
)
"""The textarena 0.7.4 single-player games verified to run offline, deterministically from a seed."""

UNSUPPORTED = {
    "Hangman": "it calls nltk.download, which needs the network, for its word list",
    "Wordle": "it calls nltk.download, which needs the network, for its word list",
    "WordLadder": "it calls nltk.download, which needs the network, for its word list",
    "WordSearch": "it calls nltk.download, which needs the network, for its word list",
    "GuessWho": "it needs an OpenRouter API key: a hosted LLM plays the other side",
    "TwentyQuestions": "it needs an OpenRouter API key: a hosted LLM plays the other side",
    "Klondike": "its module does not import in textarena 0.7.4, a SyntaxError",
    "UltimateTexasHoldem": "its module does not import in textarena 0.7.4, a SyntaxError",
    "Countdown": "its raw observations are not (sender, text, type) tuples in textarena 0.7.4",
    "Cryptarithm": "its raw observations are not (sender, text, type) tuples in textarena 0.7.4",
    "Slitherlink": "its raw observations are not (sender, text, type) tuples in textarena 0.7.4",
    "ThreeCardMonte": "its reward is a string on an invalid move in textarena 0.7.4",
    "Sokoban": "it draws from numpy's global generator and its larger levels take seconds to minutes to generate",
    "Sudoku-v0-hard": "its reset takes seconds, 8 s measured",
}
"""Why other single-player textarena ids are refused (matched on the id, then on its game name)."""


WARM_START = {"steps": 60, "batch_size": 16, "probe_size": 16, "check_every": 20, "eval_limit": 16}
"""The tiny model's warm start on a game with demonstrations (``model.warm_start.*`` set in the config win)."""


class TextArenaError(rllab.RllabError):
    """A textarena game broke the environment protocol (a malformed observation or reward)."""


MISSING = "the textarena environment needs the textarena package: pip install 'rllab[envs]'"


def _installed() -> None:
    """Refuse, naming the ``pip install``, when textarena is not installed: asked before a run
    creates anything (:func:`rllab.training.parts.check_installed`)."""
    if importlib.util.find_spec("textarena") is None:
        raise rllab.MissingExtraError(MISSING)


def _textarena():
    try:
        import textarena
    except ImportError:
        raise rllab.MissingExtraError(MISSING) from None
    return textarena


def _game(inst, attribute, value):
    if value in GAMES:
        return
    reason = UNSUPPORTED.get(value) or UNSUPPORTED.get(value.split("-")[0])
    why = f" ({reason})" if reason else ""
    raise ValueError(
        f"game = {value!r} is not supported{why}: the single-player textarena games verified offline are "
        + ", ".join(GAMES)
    )


@attrs.frozen
class TextArenaConfig:
    """Knobs of the textarena environment."""

    game: str = rllab.knob(
        "GuessTheNumber-v0",
        help="a textarena single-player game id verified offline: " + ", ".join(GAMES),
        validator=_game,
    )
    max_turns: int | None = rllab.knob(
        None,
        help="the most model turns of an episode; None: the game's own turn limit (its max_turns or num_turns), "
        "refused for a game without one",
        ge=1,
    )
    bracket_actions: bool = rllab.knob(
        True, help="wrap a turn with no square bracket in [...] before the game reads it (textarena's ActionFormattingWrapper)"
    )
    eval_fraction: float = eval_fraction_knob()
    eval_size: int = eval_size_knob()
    seed: int = seed_knob()


_LOCK = threading.RLock()
"""Serialises calls into textarena games: they share the process-wide ``random`` module."""


def render(messages) -> str:
    """Textarena messages as text: ``"[GAME] <message>\\n"`` per message (``[Player] ...`` for a
    message a player sent), the player's own echoed actions left out."""
    ta = _textarena()
    out = []
    for msg in messages:
        if not (isinstance(msg, tuple) and len(msg) == 3 and isinstance(msg[1], str) and isinstance(msg[2], ta.ObservationType)):
            raise TextArenaError(f"a textarena observation {msg!r} is not a (sender, text, type) tuple")
        sender, text, kind = msg
        if kind == ta.ObservationType.PLAYER_ACTION:
            continue
        out.append(f"[{'GAME' if sender == ta.GAME_ID else 'Player'}] {text}\n")
    return "".join(out)


class TextArenaEpisode:
    """One textarena game, reset from ``seed``; :meth:`step` plays one model turn."""

    def __init__(self, env: "TextArenaEnvironment", seed: int):
        self.name = f"textarena {env.config.game!r} seed {seed}"
        ta = _textarena()
        self.game = ta.make(env.config.game + "-raw")
        if env.config.bracket_actions:
            self.game = ta.wrappers.ActionFormattingWrapper(self.game)
        self.done = False
        self._random = None
        self.opening = self._call(lambda: (self.game.reset(num_players=1, seed=seed), self._observe())[1])

    def _call(self, fn):
        """Run ``fn`` with the episode's own ``random`` state (stdout discarded); the caller's
        state is restored after."""
        with _LOCK, contextlib.redirect_stdout(io.StringIO()):
            outer = random.getstate()
            if self._random is not None:
                random.setstate(self._random)
            try:
                return fn()
            finally:
                self._random = random.getstate()
                random.setstate(outer)

    def _observe(self) -> str:
        player, messages = self.game.get_observation()
        if player != 0:
            raise TextArenaError(f"{self.name}: the game asked player {player} to move in a single-player game")
        return render(messages)

    def step(self, text: str) -> Step:
        if self.done:
            raise TextArenaError(f"{self.name}: step after the game ended")
        state = self.game.state

        def play():
            errors = state.error_count
            done, _ = self.game.step(text)
            invalid = state.error_count > errors
            if not done:
                return Step(observation=self._observe() or None, metrics={"invalid_moves": float(invalid)})
            rewards, info = self.game.close()
            reward = (rewards or {}).get(0)
            if isinstance(reward, bool) or not isinstance(reward, (int, float)):
                raise TextArenaError(f"{self.name}: the game ended with reward {reward!r} for player 0, not a number")
            invalid = invalid or bool(info.get(0, {}).get("invalid_move"))
            return Step(reward=float(reward), done=True, metrics={"invalid_moves": float(invalid)})

        out = self._call(play)
        self.done = out.done
        return out


class TextArenaEnvironment(SeededExamples, rllab.Environment):
    """A textarena single-player game: an example is a seed, an episode is one game."""

    name = "textarena"

    def __init__(self, config: TextArenaConfig):
        ta = _textarena()
        self.config = config
        spec = ta.envs.registration.ENV_REGISTRY.get(config.game)
        if spec is None:
            raise ValueError(f"environment 'textarena': textarena {ta.__version__} has no game {config.game!r}")
        own = spec.kwargs.get("max_turns", spec.kwargs.get("num_turns"))
        if config.max_turns is None and own is None:
            raise ValueError(
                f"environment 'textarena': game {config.game!r} has no turn limit of its own; set env.max_turns"
            )
        self.max_turns = config.max_turns if config.max_turns is not None else int(own)
        if _family(config.game) not in DEMONSTRATIONS:
            self.warm_start_defaults = {"steps": 0}
        else:  # a demonstration is a whole game of hundreds of tokens: smaller batches and probes, so it takes minutes
            self.warm_start_defaults = dict(WARM_START)
        self._eval: list[Example] | None = None

    @property
    def tiny_model_defaults(self) -> dict:
        """The tiny model's context for this game (``rllab.models.tiny.task_tiny_model``): the least power
        of two ≥ 1024 that holds the opening prompt in the character tokenizer (a token per character
        and ``<bos>``) and 256 more tokens for the episode's turns (RoPE: no parameters are added)."""
        need = len(self.example(0).prompt) + 1 + 256
        return {"max_position_embeddings": max(1024, 1 << (need - 1).bit_length())}

    def example(self, seed: int) -> Example:
        """The example of game seed ``seed``: the opening prompt, no reference answer."""
        prompt = TextArenaEpisode(self, seed).opening
        return Example(prompt=prompt, answer="", meta={"seed": seed, "game": self.config.game})

    def start(self, example: Example) -> TextArenaEpisode:
        """A fresh game from the example's seed; its opening must be the example's prompt."""
        episode = TextArenaEpisode(self, example.meta["seed"])
        if episode.opening != example.prompt:
            raise TextArenaError(
                f"environment 'textarena': game {self.config.game!r} seed {example.meta['seed']} opened with a "
                "different prompt than when the example was drawn (not deterministic given its seed)"
            )
        return episode

    def demonstration(self, example: Example) -> list[str]:
        """A winning game for the games with a solver (:data:`DEMONSTRATIONS`); the others have none."""
        solver = DEMONSTRATIONS.get(_family(self.config.game))
        if solver is None:
            raise TextArenaError(
                f"environment 'textarena': game {self.config.game!r} has no demonstrations (only "
                f"{', '.join(sorted(DEMONSTRATIONS))} do); set warm_start.steps=0"
            )
        return solver(self.start(example))

    def __repr__(self):
        return f"<environment {self.name!r} {self.config!r}>"


def _family(game: str) -> str:
    return game.split("-")[0]


def _guess_the_number(episode: TextArenaEpisode) -> list[str]:
    """Binary search on the game's higher/lower hints (never on the secret): at most
    ceil(log2(range + 1)) guesses, always a win."""
    lo, hi = episode.game.min_number, episode.game.max_number
    turns: list[str] = []
    while True:
        guess = (lo + hi) // 2
        turns.append(f"[{guess}]")
        step = episode.step(turns[-1])
        if step.done:
            return turns
        if "higher" in step.observation:
            lo = guess + 1
        else:
            hi = guess - 1


def _tower_of_hanoi(episode: TextArenaEpisode) -> list[str]:
    """The classic recursion moving every disk from A to C: 2**disks - 1 moves."""

    def moves(n, source, target, spare):
        if n:
            yield from moves(n - 1, source, spare, target)
            yield f"[{source} {target}]"
            yield from moves(n - 1, spare, target, source)

    return list(moves(episode.game.num_disks, "A", "C", "B"))


DEMONSTRATIONS = {"GuessTheNumber": _guess_the_number, "TowerOfHanoi": _tower_of_hanoi}
"""The game families with a demonstration: a function of a fresh episode -> its model turns."""


def textarena_env(*, config: TextArenaConfig) -> TextArenaEnvironment:
    """A textarena single-player game (GuessTheNumber, TowerOfHanoi, Minesweeper, ...), one game per episode."""
    return TextArenaEnvironment(config)


textarena_env.check_installed = _installed

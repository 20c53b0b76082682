"""textarena's single-player text games as environment tasks (flywheel.tasks.environment).

textarena (`pip install "flywheel[textarena]"`, 0.7.4) ships about 30 single-player games that
take one text action a turn (Mastermind, GuessTheNumber, Minesweeper, Sudoku, ...). One problem
is one seed of one game: `TextArenaTask(env_id="Mastermind-v0-raw")` with the seed 7 reads

    You are playing Mastermind. ... You have 20 turns to guess the code.    <- the prompt
    [1 2 3 4]                                                              <- action 1
    Submitted [1 2 3 4]. Feedback: 1 black peg(s), 2 white peg(s).         <- observation 1
    [3 2 4 6]
    You have cracked the code, solving 4 out of 4 pegs correctly           <- a win: done, reward +1

An action is one line (the step's delimiter "\\n" ends it and is not passed to the game). The
observation is the game's messages after that action, one a line, without textarena's echo of
the action; a done turn adds textarena's closing reason as its last line (a Mastermind win has
no other message).

Replay. `respond` builds a fresh game, resets it with the problem's seed and plays every action
so far: the game is rebuilt from (seed, actions) on every call, so no game object is kept and the
task pickles. textarena's `reset(seed)` reseeds Python's process-wide `random` (its
`State.__init__`) and some games draw from it during `step` (Blackjack). A replay runs start to
end inside one call, the global `random` seeded with the problem's seed before the game is built,
and put back as it was found afterwards: one replay sees only its own stream and the caller's
`random` is never reseeded. Replays in two threads at once are serialised (`_REPLAY`).

Reasons of a done turn (the closed set `REASONS`):
    "win"           textarena's reward is 1 (its "solved") and the game did not end on an invalid move;
    "invalid"       textarena ended the game on an invalid move (Mastermind: the second in a row);
    "out_of_turns"  `max_turns` actions without the game ending, or textarena's own limit (its
                    reason says "turn limit" or "move limit");
    "lost"          any other ending (a FrozenLake hole, a wrong Bandit button, ...).

Invalid moves, measured on textarena 0.7.4: `step`'s info dict stays empty; a move the game
forgives is answered by a GAME_ADMIN message ("You attempted an invalid move. Reason: ...";
single-player games emit GAME_ADMIN for nothing else) and does not use one of textarena's turns,
though it uses one of the task's `max_turns`; the move that ends a game sets the closing
`game_info`'s `invalid_move`. Either sets `Turn.invalid`.

Seeds, not files: a problem's `answer` holds its seed as text ("7"), its `question` is empty (the
prompt is the game's own opening), and the built-in splits are seed ranges (`BUILT_IN_SPLITS`), so
nothing ships. Distinct seeds are distinct problems (`problem_key`), yet a small game repeats
instances: Mastermind-v0 has 360 secrets, and its train seeds hold every one (all 360 by seed 3317,
measured), so the val and test seeds' secrets are all train secrets too. Its val and test splits
measure a policy on fresh seeds, not on held-out secrets.
"""

from __future__ import annotations

import difflib
import random
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Mapping, Sequence

from flywheel.tasks.base import FileSplits, Problem, StepSpec, problem_id
from flywheel.tasks.environment import EnvironmentTask, Turn

__all__ = ["BUILT_IN_SPLITS", "REASONS", "TextArenaProblem", "TextArenaTask", "observation_text"]

BUILT_IN_SPLITS = {"train": range(0, 10_000), "val": range(1_000_000, 1_000_200), "test": range(2_000_000, 2_000_200)}
"""Split name -> its seeds (disjoint ranges)."""
REASONS = ("win", "out_of_turns", "invalid", "lost")
"""The reasons of a done turn (the module docstring)."""
INSTALL = 'pip install "flywheel[textarena]"'

PLAYER = 0  # a single-player game's only player id
_TURN_LIMIT = re.compile(r"\b(turn|move) limit\b", re.IGNORECASE)
_REPLAY = threading.Lock()  # the process-wide `random` is one stream: one replay at a time


@dataclass(frozen=True)
class TextArenaProblem(Problem):
    """One seed of a game; `answer` is the seed as text ("7"), `question` is empty (the prompt is
    the game's opening). Build one with `TextArenaProblem.create`."""

    @classmethod
    def create(cls, problem_id: str, seed: int) -> TextArenaProblem:
        return cls(id=problem_id, question="", answer=str(seed))


def observation_text(messages: Sequence[tuple[int, str, Any]]) -> str:
    """The player's text of textarena's messages `[(sender, text, ObservationType)]`: each message
    a line (its own trailing newlines dropped), the echo of the player's action (PLAYER_ACTION)
    left out, since the context holds the action already; "" when nothing is left."""
    lines = [text.rstrip("\n") for _, text, kind in messages if kind.name != "PLAYER_ACTION" and text.strip()]
    return "".join(line + "\n" for line in lines)


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as err:
        raise ImportError(f"TextArenaTask needs the textarena package ({err}); install it with: {INSTALL}") from None
    return textarena


@contextmanager
def _episode_random(seed: int) -> Iterator[None]:
    """Python's `random` seeded with `seed` for one replay, then put back as it was found."""
    with _REPLAY:
        found = random.getstate()
        random.seed(seed)
        try:
            yield
        finally:
            random.setstate(found)


class TextArenaTask(FileSplits, EnvironmentTask):
    """A textarena single-player game (the module docstring): one problem is one seed.

    Args:
        env_id: textarena's id of the game, its raw variant ("Mastermind-v0-raw",
            "GuessTheNumber-v0-raw", ...): the default ids wrap the game so that each
            observation repeats the whole dialogue, and they cannot be unpickled. Games that
            download data on first use (Wordle, Hangman: nltk corpora) need network then.
        max_turns: actions in one episode at most; the last one without the game ending ends
            the episode lost ("out_of_turns"). Every action counts, a forgiven invalid move too,
            though textarena does not count that one. 20 is Mastermind-v0's own stated limit
            (textarena lets it run to a 21st guess).
        max_step_tokens: most tokens in one action line; a Mastermind guess "[1 2 3 4]" is 10
            characters with its newline, and 32 leaves room for a subword tokenizer's pieces or
            a few words before the bracketed move.
        max_response_tokens: most tokens a whole episode generates (its actions, not the
            observations); None: `max_turns * max_step_tokens`.
        reward: a done turn's reward. "binary": +1 a win, -1 anything else. "textarena": the
            game's own reward r in [0, 1] (1 solved; partial credit otherwise, e.g. Mastermind's
            (black + white / 2) / code length of the last guess) as 2r - 1, so 0 -> -1 and
            1 -> +1; a game's negative reward (Blackjack's -1) is -1. An episode cut by
            `max_turns` has no game reward: -1 in both.
        split_files: split files to add or replace, as {"split name": "path.jsonl"}, over the
            built-in seed ranges (`BUILT_IN_SPLITS`): "train" seeds 0-9999, "val" 1000000-1000199,
            "test" 2000000-2000199. A row is {"id": "...", "seed": 12} (`problem_from_row`).
    """

    chat_template = False

    split_label = "textarena"

    def __init__(
        self,
        env_id: str = "Mastermind-v0-raw",
        max_turns: int = 20,
        max_step_tokens: int = 32,
        max_response_tokens: int | None = None,
        reward: Literal["binary", "textarena"] = "binary",
        split_files: dict[str, str] | None = None,
    ) -> None:
        if not env_id.endswith("-raw"):
            raise ValueError(f"env_id {env_id!r} is a wrapped textarena game: its observations repeat the whole "
                             f"dialogue every turn and it cannot be unpickled; use its raw variant: "
                             f"--data.task.init_args.env_id={env_id}-raw")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_response_tokens is not None and max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be >= 1 or None (max_turns * max_step_tokens), "
                             f"got {max_response_tokens}")
        if reward not in ("binary", "textarena"):
            raise ValueError(f"reward must be 'binary' or 'textarena', got {reward!r}")
        self.env_id = env_id
        self.max_turns = max_turns
        self.reward = reward
        self.step = StepSpec(max_tokens=max_step_tokens, delimiter="\n")
        self.max_response_tokens = max_turns * max_step_tokens if max_response_tokens is None else max_response_tokens
        self.init_splits({}, split_files)
        self._check_game()

    def _check_game(self) -> None:
        """Refuse now, not at the first episode, a game textarena lacks or cannot start here."""
        registry = _textarena().envs.registration.ENV_REGISTRY
        if self.env_id not in registry:
            close = difflib.get_close_matches(self.env_id, [k for k in registry if k.endswith("-raw")], n=3)
            known = (f"did you mean {', '.join(close)}?" if close
                     else "its ids are textarena.envs.registration.ENV_REGISTRY's keys")
            raise ValueError(f"textarena has no game {self.env_id!r}; {known}")
        try:
            self.prompt(TextArenaProblem.create("check", 0))
        except AssertionError as err:  # SinglePlayerState's check, or a two-player game's
            raise ValueError(f"{self.env_id} is not a single-player game ({err})") from None
        except Exception as err:
            said = next((line.strip() for line in str(err).splitlines() if any(c.isalnum() for c in line)), "")
            hint = ("; it downloads data (nltk corpora) on first use, which needs network once"
                    if isinstance(err, LookupError) else "")
            raise ValueError(f"textarena could not start {self.env_id} ({type(err).__name__}: {said}){hint}") from err

    def seed(self, problem: Problem) -> int:
        """The problem's seed (ValueError when its answer is not one)."""
        if not (problem.answer.isascii() and problem.answer.isdigit()):
            raise ValueError(f"problem {problem.id}: the answer {problem.answer!r:.40} is not a seed "
                             "(a TextArenaTask problem's answer is its seed as text, e.g. '7')")
        return int(problem.answer)

    def _reset(self, problem: Problem) -> Any:
        """A fresh game reset with the problem's seed; call inside `_episode_random`."""
        env = _textarena().make(env_id=self.env_id)
        env.reset(num_players=1, seed=self.seed(problem))
        return env

    def prompt(self, problem: Problem) -> str:
        """The game's opening: what textarena shows the player after reset."""
        with _episode_random(self.seed(problem)):
            _, messages = self._reset(problem).get_observation()
        return observation_text(messages)

    def problem_key(self, problem: Problem) -> str:
        return f"{self.env_id}:{self.seed(problem)}"

    def respond(self, problem: Problem, actions: Sequence[str]) -> Turn:
        """The game's answer to the last action, replayed from reset through every action."""
        if not 1 <= len(actions) <= self.max_turns:
            raise ValueError(f"an episode has 1 to {self.max_turns} actions (max_turns), got {len(actions)}")
        delimiter = self.step.delimiter or ""
        with _episode_random(self.seed(problem)):
            env = self._reset(problem)
            env.get_observation()  # the opening (the prompt); messages are drained on read
            for number, action in enumerate(actions, start=1):
                done, _ = env.step(action=action.removesuffix(delimiter))
                _, messages = env.get_observation()
                if done and number < len(actions):
                    raise ValueError(f"the game ended at action {number} of {len(actions)}: an episode "
                                     "answers actions up to its first done turn")
            text = observation_text(messages)
            invalid = any(kind.name == "GAME_ADMIN" for _, _, kind in messages)
            if done:
                rewards, game_info = env.close()
                return self._ending(text, invalid, float(rewards[PLAYER]), game_info[PLAYER])
        if len(actions) == self.max_turns:
            return Turn(text, done=True, reward=-1.0, reason="out_of_turns", invalid=invalid)
        return Turn(text, invalid=invalid)

    def _ending(self, text: str, invalid: bool, game_reward: float, info: Mapping[str, Any]) -> Turn:
        """The done turn of a game textarena ended (`info`: its closing game_info of the player)."""
        ended_invalid = bool(info.get("invalid_move"))
        closing = str(info.get("reason") or "")
        won = game_reward >= 1.0 and not ended_invalid
        reason = ("win" if won else "invalid" if ended_invalid else
                  "out_of_turns" if _TURN_LIMIT.search(closing) else "lost")
        if self.reward == "binary":
            reward = 1.0 if won else -1.0
        else:
            reward = min(1.0, max(-1.0, 2.0 * game_reward - 1.0))
        closing_line = closing.rstrip("\n") + "\n" if closing.strip() else ""
        return Turn(text + closing_line, done=True, reward=reward, correct=won, reason=reason,
                    invalid=invalid or ended_invalid)

    def problems(self, split: str) -> list[TextArenaProblem]:
        if split in self.split_files:
            return super().problems(split)
        if split in BUILT_IN_SPLITS:
            return [TextArenaProblem.create(f"{split}-{seed}", seed) for seed in BUILT_IN_SPLITS[split]]
        raise ValueError(f"unknown textarena split {split!r}; known: {sorted({*BUILT_IN_SPLITS, *self.split_files})}. "
                         "Add one with split_files={name: path.jsonl}.")

    def problem_from_row(self, row: Mapping[str, Any], where: str) -> TextArenaProblem:
        """A row `{"id": "mm-0007", "seed": 7}`: the seed is a non-negative integer (Python's
        `random.seed` takes a negative seed's absolute value, so -7 would repeat 7)."""
        if "seed" not in row:
            raise ValueError(f"{where}: no column 'seed' (a {self.env_id} row is {{\"id\": \"...\", \"seed\": 7}}); "
                             f"the row has {sorted(map(str, row))}")
        value = row["seed"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where}: `seed` must be a non-negative integer (the game's seed), got {value!r:.80}")
        return TextArenaProblem.create(problem_id(row.get("id"), where), value)



"""textarena's games as environment tasks (flywheel.tasks.textarena_env): a hand-played
Mastermind episode, exact replays, invalid moves, the turn limits, pickling, problem rows, and a
flat episode through the rollouts. Offline: every game here runs without network."""

from __future__ import annotations

import pickle
import random
import re
import subprocess
import sys

import pytest

pytest.importorskip("textarena", reason='the textarena extra is not installed (pip install "flywheel[textarena]")')

from flywheel.generation.base import Completion  # noqa: E402
from flywheel.reporting.problem_view import search_problems  # noqa: E402
from flywheel.search.config import SearchConfig  # noqa: E402
from flywheel.search.flat import flat_rollouts  # noqa: E402
from scripted import ScriptedGenerator  # noqa: E402
from flywheel.tasks.environment import Turn  # noqa: E402
from flywheel.tasks.sources import load_problems  # noqa: E402
from flywheel.tasks.textarena_env import INSTALL, TextArenaProblem, TextArenaTask  # noqa: E402
from toy_env import EOS, CharTokenizer, decode, encode  # noqa: E402

pytestmark = pytest.mark.textarena

TASK = TextArenaTask()  # Mastermind-v0-raw: 4 distinct digits 1-6
SEED_7 = TextArenaProblem.create("mm-7", 7)  # textarena draws the secret 3246 for seed 7
RULES = ("You are playing Mastermind.\n"
         "You need to find the code that is 4 digits long, each digit from 1 to 6, with no duplicates.\n"
         "In your response, you can submit your guess in the following format: '[2 1 4 5]'.\n"
         "After each guess, you will receive feedback in the form of black and white pegs.\n"
         "A black peg indicates a correct digit in the correct position, while a white peg indicates a correct "
         "digit in the wrong position.\n"
         "You have 20 turns to guess the code.\n")
NOT_A_GUESS = ("You attempted an invalid move. Reason: You did not respond with a space-separated list of numbers "
               "wrapped in square brackets. Please resubmit a valid move and remember to follow the game rules to "
               "avoid penalties.\n")
# Secret 3246. [1 2 3 4]: the 2 in place (1B); 3 and 4 elsewhere (2W). [5 6 1 2]: 6 and 2 elsewhere
# (0B 2W). [3 4 5 6]: 3 and 6 in place (2B), 4 elsewhere (1W). [3 2 4 6]: the code.
ACTIONS = ["[1 2 3 4]\n", "[5 6 1 2]\n", "not a guess\n", "[3 4 5 6]\n", "[3 2 4 6]\n"]
TURNS = [
    Turn("Submitted [1 2 3 4]. Feedback: 1 black peg(s), 2 white peg(s).\n"),
    Turn("Submitted [5 6 1 2]. Feedback: 0 black peg(s), 2 white peg(s).\n"),
    Turn(NOT_A_GUESS, invalid=True),
    Turn("Submitted [3 4 5 6]. Feedback: 2 black peg(s), 1 white peg(s).\n"),
    Turn("You have cracked the code, solving 4 out of 4 pegs correctly\n", done=True, reward=1.0, correct=True,
         reason="win"),  # a win has no feedback message: the closing reason is the observation
]


# ------------------------------------------------------------------------------ one episode
def test_a_hand_played_mastermind_episode():
    assert TASK.prompt(SEED_7) == RULES
    assert [TASK.respond(SEED_7, ACTIONS[:end]) for end in range(1, 6)] == TURNS
    assert TASK.episode(SEED_7, ACTIONS) == TURNS
    won = TASK.score(SEED_7, "".join(ACTIONS))
    assert (won.correct, won.reward, won.answer, won.reason) == (True, 1.0, "[3 2 4 6]\n", "win")
    assert TASK.score(SEED_7, "".join(ACTIONS[:4])).reason == "unfinished"
    with pytest.raises(ValueError, match="ended at action 5 of 6"):  # no action after the game is over
        TASK.respond(SEED_7, ACTIONS + ["[1 2 3 4]\n"])


def test_the_seed_is_the_problem():
    other = TextArenaProblem.create("mm-8", 8)
    assert TASK.prompt(other) == RULES  # the rules are the same; the secret is not
    assert TASK.respond(other, ACTIONS[:1]) != TURNS[0]
    assert (TASK.problem_key(SEED_7), TASK.problem_key(other)) == ("Mastermind-v0-raw:7", "Mastermind-v0-raw:8")


# ------------------------------------------------------------------------------ replay
def test_a_replay_is_exact_and_leaves_the_global_random_as_it_found_it():
    random.seed(123)
    expected = [random.random() for _ in range(3)]
    random.seed(123)
    first = TASK.respond(SEED_7, ACTIONS[:2])
    assert random.random() == expected[0]  # textarena's reset(seed) reseeded it inside; respond put it back
    opening = TASK.prompt(SEED_7)
    assert random.random() == expected[1]
    second = TASK.respond(SEED_7, ACTIONS[:2])
    assert random.random() == expected[2]
    assert first == second == TURNS[1] and opening == RULES


def test_a_game_that_draws_from_random_during_its_steps_replays_exactly():
    # Blackjack deals every card with the global `random` in `step`: a replay that let another
    # draw in between (a cached, stepped-on game) would deal other cards.
    task = TextArenaTask(env_id="Blackjack-v0-raw", max_turns=5)
    hand = TextArenaProblem.create("bj-1", 1)
    assert task.prompt(hand).endswith("Hand 1/5\nYour hand: 4♠, 6♠ (Score: 10)\nDealer shows: 9♣\n")
    first = task.respond(hand, ["[hit]\n", "[stand]\n"])
    random.random()
    assert task.respond(hand, ["[hit]\n", "[stand]\n"]) == first
    assert first == Turn("Hand 1: you win. Your final 21, Dealer 18.\nHand 2/5\n"
                         "Your hand: 3♣, 2♣ (Score: 5)\nDealer shows: 8♠\n")


# ------------------------------------------------------------------------------ invalid moves, limits
def test_a_forgiven_invalid_move_goes_on_and_a_second_in_a_row_ends_the_game():
    assert TASK.respond(SEED_7, ["[1 2 3 4]\n", "not a guess\n"]) == Turn(NOT_A_GUESS, invalid=True)
    # A repeated guess is invalid too; after "not a guess" it is the second in a row: the game ends.
    repeated = "Invalid Move: You have already guessed [1, 2, 3, 4]. Please try a different guess.\n"
    ended = ["[1 2 3 4]\n", "not a guess\n", "[1 2 3 4]\n"]
    assert TASK.respond(SEED_7, ended) == Turn(repeated, done=True, reward=-1.0, reason="invalid", invalid=True)
    # textarena's own reward: the last valid guess [1 2 3 4] earned (1 + 2 / 2) / 4 = 0.5 -> 2 * 0.5 - 1 = 0.
    assert TextArenaTask(reward="textarena").respond(SEED_7, ended).reward == 0.0


def test_the_tasks_turn_limit_ends_the_episode_lost_and_counts_every_action():
    task = TextArenaTask(max_turns=3)
    cut = ["[1 2 3 4]\n", "not a guess\n", "[5 6 1 2]\n"]  # textarena counts 2 turns, the task 3
    assert task.respond(SEED_7, cut) == Turn("Submitted [5 6 1 2]. Feedback: 0 black peg(s), 2 white peg(s).\n",
                                             done=True, reward=-1.0, reason="out_of_turns")
    assert task.respond(SEED_7, cut[:2]) == Turn(NOT_A_GUESS, invalid=True)
    with pytest.raises(ValueError, match=r"1 to 3 actions \(max_turns\), got 4"):
        task.respond(SEED_7, cut + ["[3 2 4 6]\n"])


def test_textarenas_own_turn_limit_is_out_of_turns():
    # Mastermind-v0 says 20 turns and ends the game at the 21st valid guess. The first 21 codes in
    # order, [1 2 3 4] ... [1 3 5 6], none the secret 3246; [1 3 5 6] earns the 6 in place and the 3
    # elsewhere: 1B 1W, textarena's reward (1 + 1 / 2) / 4 = 0.375 -> 2 * 0.375 - 1 = -0.25.
    codes = [f"[{a} {b} {c} {d}]\n" for a in range(1, 7) for b in range(1, 7) for c in range(1, 7)
             for d in range(1, 7) if len({a, b, c, d}) == 4][:21]
    assert codes[-1] == "[1 3 5 6]\n"
    task = TextArenaTask(max_turns=25)
    assert not task.respond(SEED_7, codes[:20]).done
    assert task.respond(SEED_7, codes) == Turn(
        "Submitted [1 3 5 6]. Feedback: 1 black peg(s), 1 white peg(s).\n"
        "Turn limit reached. You guessed 37.50 percent of the numbers correctly.\n",
        done=True, reward=-1.0, reason="out_of_turns")
    assert TextArenaTask(max_turns=25, reward="textarena").respond(SEED_7, codes).reward == -0.25


# ------------------------------------------------------------------------------ pickling, problems
def test_the_task_pickles_and_holds_no_game():
    copy = pickle.loads(pickle.dumps(TASK))
    assert copy.episode(SEED_7, ACTIONS) == TURNS
    assert {type(v).__name__ for v in vars(TASK).values()} <= {"str", "int", "StepSpec", "dict"}


def test_the_built_in_splits_are_disjoint_seed_ranges():
    train, val, test = (TASK.problems(split) for split in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (10_000, 200, 200)
    assert (train[0], val[0], test[-1]) == (TextArenaProblem("train-0", "", "0"), TextArenaProblem(
        "val-1000000", "", "1000000"), TextArenaProblem("test-2000199", "", "2000199"))
    keys = [{TASK.problem_key(p) for p in split} for split in (train, val, test)]
    assert sum(map(len, keys)) == len(set().union(*keys)) == 10_400
    with pytest.raises(ValueError, match=r"unknown textarena split 'dev'; known: \['test', 'train', 'val'\]"):
        TASK.problems("dev")


@pytest.mark.parametrize("bad, message", [
    ('{"id": "b"}', r"no column 'seed' .*the row has \['id'\]"),
    ('{"id": "b", "seed": -7}', r"`seed` must be a non-negative integer \(the game's seed\), got -7"),
    ('{"id": "b", "seed": "7"}', r"`seed` must be a non-negative integer .*got '7'"),
    ('{"id": "b", "seed": 7.5}', r"`seed` must be a non-negative integer .*got 7.5"),
    ('{"id": "b", "seed": true}', r"`seed` must be a non-negative integer .*got True"),
    ('{"id": "b", "seed": 7', r"not valid JSON"),
    ('[7]', r"a row must be a JSON object, got list"),
])
def test_a_bad_row_is_refused_with_its_file_and_line(tmp_path, bad, message):
    path = tmp_path / "seeds.jsonl"
    path.write_text('{"id": "good", "seed": 3}\n' + bad + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{path}:2: {message}"):
        TextArenaTask(split_files={"mine": str(path)}).problems("mine")


def test_rows_make_problems_from_a_split_file_and_from_the_command_lines_files(tmp_path):
    path = tmp_path / "seeds.jsonl"
    path.write_text('{"id": "a", "seed": 7}\n\n{"seed": 8}\n', encoding="utf-8")
    expected = [TextArenaProblem("a", "", "7"), TextArenaProblem(f"{path}:3", "", "8")]
    assert TextArenaTask(split_files={"train": str(path)}).problems("train") == expected
    assert list(load_problems(TASK, [str(path)], "train").problems) == expected
    path.write_text('{"id": "a", "answer": "3246"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{path}:1: no column 'seed'"):
        load_problems(TASK, [str(path)], "train")


# ------------------------------------------------------------------------------ construction
def test_a_game_the_task_cannot_play_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"wrapped textarena game.*--data.task.init_args.env_id=Mastermind-v0-raw$"):
        TextArenaTask(env_id="Mastermind-v0")
    with pytest.raises(ValueError, match=r"no game 'Mastermnd-v0-raw'; did you mean Mastermind-v0-raw"):
        TextArenaTask(env_id="Mastermnd-v0-raw")
    with pytest.raises(ValueError, match=r"TicTacToe-v0-raw is not a single-player game"):
        TextArenaTask(env_id="TicTacToe-v0-raw")
    with pytest.raises(ValueError, match=r"must be >= 1"):
        TextArenaTask(max_turns=0)


def test_without_textarena_flywheel_imports_and_the_task_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # `import textarena` now raises ImportError
    with pytest.raises(ImportError, match=f"install it with: {re.escape(INSTALL)}$"):
        TextArenaTask()
    blocked = "import sys; sys.modules['textarena'] = None; import flywheel.tasks.textarena_env"
    subprocess.run([sys.executable, "-c", blocked], check=True)


# ------------------------------------------------------------------------------ through the rollouts
def action(text: str) -> Completion:
    ids = encode(text)
    return Completion(ids, (-0.5,) * len(ids), "stop")


def test_a_flat_episode_reads_each_observation_before_its_next_action():
    # The scripted generator answers only the prefixes below: the second request's context is the
    # prompt, the first guess and its feedback, so the observation's tokens are in the context.
    (problem,) = search_problems(CharTokenizer(), TASK, [SEED_7])
    prompt = encode(RULES)
    assert problem.prompt_ids == prompt
    feedback = TURNS[0].observation
    generator = ScriptedGenerator({
        prompt: [action("[1 2 3 4]\n")],
        prompt + encode("[1 2 3 4]\n" + feedback): [action("[3 2 4 6]\n")],
    })
    (result,) = flat_rollouts([problem], generator, n=1, step=TASK.step, decode=decode,
                              config=SearchConfig(max_depth=8, overlong_penalty=False), eos_token_ids=[EOS])
    (episode,) = result.trajectories
    won = TURNS[-1].observation
    assert episode.response_text == "[1 2 3 4]\n" + feedback + "[3 2 4 6]\n" + won
    assert (episode.reward, episode.verdict.reason) == (1.0, "win")
    # Trained on: the two guesses (10 characters each); the observations are prefilled.
    assert episode.loss_mask == (True,) * 10 + (False,) * len(feedback) + (True,) * 10 + (False,) * len(won)
    assert result.stats.generated_tokens == 20

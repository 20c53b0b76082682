"""Mastermind: the pegs (hand-worked and against a second, textbook count), the environment's
turns and episodes, the shipped splits and their rows, and the noisy player and its failure
kinds (flywheel.rewards.mastermind, flywheel.tasks.mastermind, flywheel.tasks.mastermind_data,
tools/make_mastermind_splits.py)."""

from __future__ import annotations

import doctest
import itertools
import json
import pickle
import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel.rewards import mastermind as rules
from flywheel.rewards.mastermind import Feedback, consistent, feedback, marks, parse_code
from flywheel.tasks import mastermind as task_module
from flywheel.tasks import mastermind_data
from flywheel.tasks.environment import Turn
from flywheel.tasks.mastermind import MastermindProblem, MastermindTask, read_observation
from flywheel.tasks.mastermind_data import NoisySolver, all_codes, failure_kind, malformed_guess, measure, play
from flywheel.tasks.sources import load_problems

ROOT = Path(__file__).resolve().parents[1]
SECRET = MastermindProblem.create("s", (3, 5, 1, 2))


def code(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text)


def test_doctests_pass():
    for module in (rules, task_module, mastermind_data):
        assert doctest.testmod(module).failed == 0, module.__name__


# -- the pegs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("secret, guess, black, white", [
    ("1122", "2211", 0, 4),  # every digit shared (two 1s, two 2s), none in place
    ("1234", "1111", 1, 0),  # the secret has one 1: it is black, the other three 1s earn nothing
    ("1111", "1234", 1, 0),  # the same from the other side
    ("1234", "1234", 4, 0),
    ("1234", "4321", 0, 4),
    ("1123", "1312", 1, 3),  # shared: 1 twice, 3 once, 2 once = 4; black: position 1
    ("1112", "2111", 2, 2),  # shared: 1 three times, 2 once = 4; black: positions 2 and 3
    ("3512", "1122", 1, 1),  # shared: one 1, one 2; black: the 2 at position 4
    ("6666", "1234", 0, 0),
])
def test_feedback_hand_worked(secret, guess, black, white):
    assert feedback(code(secret), code(guess)) == Feedback(black=black, white=white)


def textbook_pegs(secret: tuple[int, ...], guess: tuple[int, ...]) -> Feedback:
    """The count as a person does it: mark the blacks, then give each other guess digit the first
    unmarked equal secret digit (a second way to the same numbers as `feedback`'s counts)."""
    used = [s == g for s, g in zip(secret, guess)]
    white = 0
    for position, digit in enumerate(guess):
        if secret[position] == digit:
            continue
        for other, s in enumerate(secret):
            if not used[other] and s == digit and secret[other] != guess[other]:
                used[other] = True
                white += 1
                break
    return Feedback(black=sum(s == g for s, g in zip(secret, guess)), white=white)


def test_feedback_equals_the_textbook_count_on_every_pair_of_three_digit_codes():
    codes = all_codes(3, 4)  # 64 codes, 4096 pairs: every repeat pattern of a 3-digit code
    for secret, guess in itertools.product(codes, codes):
        assert feedback(secret, guess) == textbook_pegs(secret, guess) == feedback(guess, secret)


def test_feedback_refuses_codes_of_two_lengths():
    with pytest.raises(ValueError, match="3 digits cannot be scored against a secret of 4"):
        feedback((1, 2, 3, 4), (1, 2, 3))


@pytest.mark.parametrize("text, expected", [
    ("3512", (3, 5, 1, 2)), ("6666", (6, 6, 6, 6)), ("1111", (1, 1, 1, 1)),
    ("3517", None), ("0512", None), ("351", None), ("35123", None), ("35a2", None), (" 3512", None),
    ("3512\n", None), ("", None), ("\uff13\uff15\uff11\uff12", None),  # full-width digits
    ("-512", None), ("3.12", None),
])
def test_parse_code_is_exact(text, expected):
    assert parse_code(text, 4, 6) == expected


def test_parse_code_reads_a_huge_text_in_constant_time():
    assert parse_code("1" * 10_000_000, 4, 6) is None  # refused by its length before any character is read


def test_consistent_hand_worked():
    # secret 3512: 1122 earned 1B 1W, then 1314 earned 1B 1W
    history = [(code("1122"), Feedback(1, 1)), (code("1314"), Feedback(1, 1))]
    assert consistent(history, code("3512"))
    assert consistent(history, code("4512"))  # vs 1122: the 2 in place, a 1 elsewhere; vs 1314: the 1 in place, the 4
    assert not consistent(history, code("1122"))  # a repeated guess would have earned 4B
    assert not consistent(history[:1], code("2222"))  # against 1122 it would earn 2B 0W
    assert consistent([], code("6666"))


# -- the environment --------------------------------------------------------------------------


def test_the_prompt_and_the_step():
    task = MastermindTask()
    assert task.prompt(SECRET) == ("Guess the code: 4 digits 1-6. One guess per line; each digit is answered "
                                   "G (right place), Y (in the code, elsewhere) or . (not in the code).\n")
    assert MastermindTask(feedback="pegs").prompt(SECRET) == (
        "Guess the code: 4 digits 1-6. One guess per line; each is answered "
        "B (right digit, right place) and W (right digit, wrong place).\n")
    assert (task.step.delimiter, task.step.max_tokens, task.max_turns, task.max_response_tokens) == ("\n", 16, 8, 128)
    assert task.chat_template is False
    assert "secret" not in task.prompt(SECRET) and "3512" not in task.prompt(SECRET)


def test_a_won_episode_hand_worked():
    task = MastermindTask(feedback="pegs")
    actions = ["1122\n", "1314\n", "3512\n"]
    assert task.episode(SECRET, actions) == [
        Turn("1B 1W\n"),  # the 2 in place; a 1 elsewhere
        Turn("1B 1W\n"),  # the 1 at position 3 in place; the 3 elsewhere
        Turn("4B 0W\n", done=True, reward=1.0, correct=True, reason="win"),
    ]
    verdict = task.score(SECRET, "".join(actions))
    assert (verdict.correct, verdict.reward, verdict.reason, verdict.answer) == (True, 1.0, "win", "3512\n")
    assert task.score(SECRET, "1122\n3512").correct  # a last guess without its newline (EOS) is read
    assert task.score(SECRET, "1122\n1314\n").reason == "unfinished"


def test_an_invalid_guess_uses_a_turn_and_the_episode_goes_on():
    task = MastermindTask()
    for garbage in ["12\n", "1237\n", "abcd\n", "\n", " 3512\n", "3512 3512\n", "3" * 40]:
        assert task.respond(SECRET, [garbage]) == Turn("invalid\n", invalid=True)
    assert task.episode(SECRET, ["12\n", "3512\n"])[-1].reason == "win"


def test_the_last_turn_ends_the_episode():
    task = MastermindTask(max_turns=3, feedback="pegs")
    assert task.episode(SECRET, ["1122\n", "1314\n", "4512\n"])[-1] == Turn(
        "3B 0W\n", done=True, reward=-1.0, reason="out_of_turns")  # 5, 1, 2 in place; the 4 is not in 3512
    assert task.respond(SECRET, ["1122\n", "1314\n", "zz\n"]) == Turn(
        "invalid\n", done=True, reward=-1.0, reason="out_of_turns", invalid=True)
    assert task.respond(SECRET, ["1122\n", "1314\n", "3512\n"]).reason == "win"  # a win on the last turn is a win
    verdict = task.score(SECRET, "1111\n" * 10)  # actions past the limit are never played
    assert (verdict.correct, verdict.reward, verdict.reason, verdict.answer) == (False, -1.0, "out_of_turns", "1111\n")
    with pytest.raises(ValueError, match="1 to 3 actions"):
        task.respond(SECRET, ["1111\n"] * 4)


def test_other_code_shapes():
    task = MastermindTask(code_length=2, digits=3, max_turns=2, feedback="pegs")
    problem = MastermindProblem.create("p", (3, 1))
    assert task.prompt(problem).startswith("Guess the code: 2 digits 1-3.")
    assert task.episode(problem, ["13\n", "31\n"]) == [Turn("0B 2W\n"), Turn("2B 0W\n", done=True, reward=1.0,
                                                                             correct=True, reason="win")]
    assert task.respond(problem, ["14\n"]).invalid  # 4 is past the task's digits
    marked = MastermindTask(code_length=2, digits=3, max_turns=2)
    assert marked.episode(problem, ["13\n", "31\n"]) == [Turn("YY\n"), Turn("GG\n", done=True, reward=1.0,
                                                                             correct=True, reason="win")]


def test_a_won_episode_under_marks_hand_worked():
    # The lowest player's game for 3512 (mastermind.py's docstring)
    task = MastermindTask()
    actions = ["1111\n", "2212\n", "3312\n", "3412\n", "3512\n"]
    assert [turn.observation for turn in task.episode(SECRET, actions)] == [
        "..G.\n",  # the secret's one 1, in place at position 3
        "..GG\n",  # the 1 and the 2 in place; its one 2 used, the 2s at 1 and 2 are marked .
        "G.GG\n", "G.GG\n", "GGGG\n"]
    assert failure_kind(task, SECRET, actions) is None
    assert task.respond(SECRET, ["2135\n"]).observation == "YYYY\n"  # every digit in the code, none in place
    assert task.respond(SECRET, ["5555\n"]).observation == ".G..\n"  # one 5: matched in place, none left for Y
    assert task.respond(SECRET, ["5111\n"]).observation == "Y.G.\n"  # the 5 elsewhere; the one 1 in place
    lost = ["1111\n", "1234\n", "3412\n"]  # 1234 puts a 1 at position 1, which 1111's marks ruled out
    assert failure_kind(MastermindTask(max_turns=3), SECRET, lost) == "inconsistent_guess"

@pytest.mark.parametrize("kwargs, message", [
    ({"code_length": 0}, "code_length must be 1-8"), ({"digits": 10}, "digits must be 1-9"),
    ({"max_turns": 0}, "max_turns must be >= 1"), ({"max_response_tokens": 0}, "max_response_tokens must be >= 1"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MastermindTask(**kwargs)


def test_a_problem_whose_secret_the_task_cannot_read_is_refused():
    with pytest.raises(ValueError, match="problem bad: the secret '3517' is not a code of 4 digits 1-6"):
        MastermindTask().respond(MastermindProblem("bad", "", "3517"), ["1111\n"])


def test_unknown_feedback_rule_is_refused():
    with pytest.raises(ValueError, match="unknown feedback rule 'wordle'; known: marks, pegs"):
        MastermindTask(feedback="wordle")


def test_observations_read_back():
    for black, white in [(0, 0), (1, 2), (4, 0), (0, 4)]:
        assert read_observation(task_module.observation_text(Feedback(black, white))) == Feedback(black, white)
    assert read_observation("invalid\n") is None
    with pytest.raises(ValueError, match="not a Mastermind observation"):
        read_observation("1B2W\n")
    task = MastermindTask()
    assert [task.read_feedback(t) for t in ("G.Y.\n", "invalid\n")] == ["G.Y.", None]
    with pytest.raises(ValueError, match="not a Mastermind observation of marks"):
        task.read_feedback("1B 2W\n")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(list("0123456789 \nabBW\t\u0663")), max_size=12),
                min_size=1, max_size=8))
def test_any_actions_get_a_turn(actions):
    task = MastermindTask()
    turn = task.respond(SECRET, actions)
    assert turn.observation.endswith("\n")
    assert turn.done == (turn.correct or len(actions) == task.max_turns)
    assert turn.invalid == (task.read_guess(actions[-1]) is None)


def test_the_task_pickles_with_its_loaded_problems():
    task = MastermindTask(max_turns=5)
    task.problems("val")
    copy = pickle.loads(pickle.dumps(task))
    assert copy.problems("val") == task.problems("val")
    assert (copy.max_turns, copy.step, copy.split_files) == (5, task.step, task.split_files)
    actions = ["1122\n", "1314\n", "oops\n", "3512\n"]
    assert copy.episode(SECRET, actions) == task.episode(SECRET, actions)


# -- rows and splits --------------------------------------------------------------------------


def test_the_shipped_splits_are_disjoint_and_cover_every_code():
    task = MastermindTask()
    splits = {name: task.problems(name) for name in ("train", "val", "test")}
    assert {name: len(p) for name, p in splits.items()} == {"train": 896, "val": 200, "test": 200}
    secrets = {name: {p.answer for p in problems} for name, problems in splits.items()}
    assert all(len(secrets[name]) == len(splits[name]) for name in splits)  # no repeat inside a split
    for one, other in itertools.combinations(secrets.values(), 2):
        assert not one & other
    assert set().union(*secrets.values()) == {rules.code_text(c) for c in all_codes(4, 6)}
    assert all(isinstance(p, MastermindProblem) and p.id.startswith(name) for name, ps in splits.items() for p in ps)


def test_the_split_tool_rebuilds_the_shipped_files(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import make_mastermind_splits
    finally:
        sys.path.remove(str(ROOT / "tools"))
    rows = make_mastermind_splits.build_splits(make_mastermind_splits.SEED)
    for name, split in rows.items():
        shipped = (ROOT / "flywheel" / "assets" / "mastermind" / f"{name}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in shipped] == split
    assert make_mastermind_splits.build_splits(1) != rows


def test_rows_read_as_text_or_integer_and_a_bad_row_is_named(tmp_path):
    task = MastermindTask()
    assert task.problem_from_row({"id": "a", "answer": "3512"}, "f:1") == MastermindProblem.create("a", (3, 5, 1, 2))
    assert task.problem_from_row({"answer": 3512}, "f:7").id == "f:7"  # no id: its place
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a", "answer": "3512"}\n\n{"id": "b", "answer": 1234}\n{"id": "c", "answer": "3517"}\n')
    task = MastermindTask(split_files={"mine": str(path)})
    with pytest.raises(ValueError, match=rf"{path}:4: `answer` '3517' is not a secret code of 4 digits each 1-6"):
        task.problems("mine")
    with pytest.raises(ValueError, match=rf"{path}:4: .*3517"):  # the generic loader names it too
        load_problems(MastermindTask(), [str(path)], "train")


@pytest.mark.parametrize("row, message", [
    ({"id": "x", "answer": True}, "must be the secret code as text"),
    ({"id": "x", "answer": [3, 5, 1, 2]}, "must be the secret code as text"),
    ({"id": "x", "answer": "35120"}, "is not a secret code"),
    ({"id": "x", "answer": -3512}, "is not a secret code"),
    ({"id": "x", "answer": "3" * 100_000}, "is not a secret code"),
    ({"id": "x"}, "no column 'answer'"),
    ({"id": "", "answer": "3512"}, "the id '' must be a non-empty string"),
])
def test_bad_rows_are_refused(row, message):
    with pytest.raises(ValueError, match=message):
        MastermindTask().problem_from_row(row, "f.jsonl:3")


def test_a_row_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"id": "a", "answer": "3512"}\n{"id": \n')
    with pytest.raises(ValueError, match=rf"{path}:2: not valid JSON"):
        MastermindTask(split_files={"train": str(path)}).problems("train")
    with pytest.raises(ValueError, match="unknown mastermind split 'nope'"):
        MastermindTask().problems("nope")


# -- the noisy player and its failures --------------------------------------------------------


def test_play_is_deterministic_given_the_seed():
    task, solver = MastermindTask(), NoisySolver(noise=0.5)
    problems = MastermindTask().problems("val")[:20]
    first = [play(task, p, solver, random.Random(7 + i)) for i, p in enumerate(problems)]
    again = [play(task, p, solver, random.Random(7 + i)) for i, p in enumerate(problems)]
    other = [play(task, p, solver, random.Random(8 + i)) for i, p in enumerate(problems)]
    assert first == again and first != other
    assert all(a.endswith("\n") and a.count("\n") == 1 for actions in first for a in actions)  # one line each


@pytest.mark.parametrize("rule, pick, longest", [("pegs", "random", 7), ("marks", "random", 6), ("marks", "lowest", 6)])
def test_the_noiseless_player_only_makes_consistent_guesses_and_wins_within_eight(rule, pick, longest):
    task = MastermindTask(feedback=rule)
    score = {"pegs": feedback, "marks": marks}[rule]
    for index, problem in enumerate(task.problems("test")[:60]):
        actions = play(task, problem, NoisySolver(pick=pick), random.Random(index))
        turns = task.episode(problem, actions)
        assert turns[-1].reason == "win" and len(actions) <= longest  # the measured worst game over all 1296
        assert failure_kind(task, problem, actions) is None
        history = []
        for action, turn in zip(actions, turns):
            assert consistent(history, task.read_guess(action), score)
            history.append((task.read_guess(action), task.read_feedback(turn.observation)))
    lowest = [play(task, p, NoisySolver(pick="lowest"), random.Random(0)) for p in task.problems("val")[:5]]
    assert all(actions[0] == "1111\n" for actions in lowest)
    if pick == "lowest":  # deterministic: the seed does not matter without noise
        assert lowest == [play(task, p, NoisySolver(pick="lowest"), random.Random(9)) for p in task.problems("val")[:5]]
    with pytest.raises(ValueError, match="pick must be one of random, lowest"):
        NoisySolver(pick="first")


def test_a_malformed_guess_is_never_a_code():
    task = MastermindTask()
    rng = random.Random(0)
    shapes = set()
    for _ in range(500):
        line = malformed_guess(4, 6, rng)
        assert line.endswith("\n") and line.count("\n") == 1 and task.read_guess(line) is None
        shapes.add(len(line))
    assert shapes == {1, 4, 5, 6, 10}  # empty, short, one changed digit or letter, long, two codes


def test_a_player_of_only_mistakes_fails_each_way():
    task = MastermindTask()
    problem = task.problems("val")[0]
    malformed = play(task, problem, NoisySolver(noise=1.0, malformed_share=1.0), random.Random(0))
    assert len(malformed) == 8 and all(turn.invalid for turn in task.episode(problem, malformed))
    assert failure_kind(task, problem, malformed) == "invalid_guess"
    kinds = {failure_kind(task, p, play(task, p, NoisySolver(noise=1.0, malformed_share=0.0), random.Random(i)))
             for i, p in enumerate(task.problems("val")[:20])}
    assert kinds == {"inconsistent_guess"}  # random codes: some guess soon ignores what the feedback said


@pytest.mark.parametrize("actions, kind", [
    (["1122\n", "3512\n"], None),  # won
    (["1122\n", "1122\n", "3512\n"], None),  # won after a wasted guess: still a win
    (["1122\n", "1314\n", "4512\n"], "out_of_turns"),  # each guess fits the feedback before it (see test_consistent)
    (["1111\n", "2222\n", "3333\n"], "inconsistent_guess"),  # 1111 earned 1B 0W; 2222 would have earned 0B 0W
    (["1122\n", "1122\n", "4512\n"], "inconsistent_guess"),  # a repeated guess
    (["1122\n", "xx\n", "4512\n"], "invalid_guess"),
    (["1111\n", "2222\n", "oops\n"], "invalid_guess"),  # invalid before inconsistent
    (["1122\n"], "unfinished"),
    (["1122\n", "1314\n"], "unfinished"),
])
def test_failure_kinds_on_hand_built_actions(actions, kind):
    assert failure_kind(MastermindTask(max_turns=3, feedback="pegs"), SECRET, actions) == kind


def test_measure_agrees_with_games_under_each_limit():
    """`measure` plays each game once under a high limit; the same seed under a low limit must
    play the same first turns, so its record is that of games played under the low limit."""
    problems = MastermindTask().problems("val")[:30]
    solver = NoisySolver(noise=0.4)
    records = measure(MastermindTask(max_turns=12), problems, solver, seed=3, limits=[4, 6])
    for record in records:
        task = MastermindTask(max_turns=record.max_turns)
        games = [play(task, p, solver, random.Random(3 + i)) for i, p in enumerate(problems)]
        wins = sum(task.episode(p, a)[-1].correct for p, a in zip(problems, games))
        assert record.win_rate == wins / len(problems)
        assert record.mean_turns == sum(map(len, games)) / len(problems)
    assert records[0].win_rate < records[1].win_rate
    with pytest.raises(ValueError, match="max_turns >= 9"):
        measure(MastermindTask(max_turns=8), problems, solver, seed=0, limits=[9])


def test_the_player_refuses_a_code_space_too_big_to_list():
    with pytest.raises(ValueError, match="more than the player handles"):
        all_codes(8, 9)


def test_mistake_credit_blames_the_first_bad_guess_of_a_saved_tree(tmp_path):
    """tools/mistake_credit.py --task mastermind on a hand-made tree of a train secret without a 1:
    a shared first guess 1111 (marked ....), then the secret itself (a win) or 1234, which holds
    a 1 that 1111's marks ruled out: the first bad guess, at turn 2."""
    import json as json_module
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    from mistake_credit import mastermind_first_wrong, measure

    task = MastermindTask()
    secret = next(p for p in task.problems("train") if "1" not in p.answer)
    node = lambda i, parent, text, q, reward=None: {"id": i, "parent": parent, "q": q, "q_soft": q, "text": text,
                                                   "reward": reward}
    nodes = [node(0, None, "", 0.0), node(1, 0, "1111\n", 0.0), node(2, 1, secret.answer + "\n", 1.0, 1.0),
             node(3, 1, "1234\n", -1.0, -1.0)]
    trajectory = lambda ids, reward: {"node_ids": ids, "reward": reward, "final_score": reward, "overlong_penalty": 0.0,
                                      "response_text": ""}
    tree = {"problem_id": secret.id, "nodes": nodes, "trajectories": [trajectory([1, 2], 1.0), trajectory([1, 3], -1.0)]}
    run = tmp_path / "run"
    (run / "version_0" / "trees").mkdir(parents=True)
    (run / "version_0" / "trees" / "epoch_0000.jsonl").write_text(json_module.dumps(tree) + "\n")
    first_wrong = mastermind_first_wrong("train")
    assert first_wrong(tree, tree["trajectories"][1]) == 2
    m = measure(run, ["outcome", "subtree"], first_wrong)
    # Outcome: the failure's every step gets its negative advantage, the shared first guess too;
    # subtree: the bad guess's subtree (-1) against its parent's (0) is negative, the first guess 0.
    assert m["outcome"]["mistakes"] == 1 and m["outcome"]["mistake_mean"] < 0 and m["outcome"]["before_mean"] < 0
    assert m["subtree"]["mistake_mean"] < 0 and m["subtree"]["before_mean"] == pytest.approx(0.0, abs=1e-6)

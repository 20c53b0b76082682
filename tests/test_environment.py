"""Episodes of an environment (flywheel.tasks.environment) through the search, the flat rollouts,
the credit and the batch, on the two-turn guessing game of tests/toy_env.py, by hand."""

from __future__ import annotations

import math
from dataclasses import replace
import pickle

import pytest
import torch

from data_modules.examples import collate
from flywheel.reporting.problem_view import Observations
from flywheel.generation.base import Completion
from flywheel.objectives.credit import Credit, Group, credit_groups
from flywheel.search.config import SearchConfig, SearchAblations
from flywheel.search.driver import SearchDriver, SearchProblem
from flywheel.search.flat import flat_rollouts
from flywheel.search.rule_table import SELECTION
from scripted import ScriptedGenerator
from flywheel.tasks.base import Problem
from flywheel.tasks.environment import Turn, guard_turn
from flywheel.tasks.grading import Grader, GradingConfig
from toy_env import EOS, CharTokenizer, GuessTask, decode, encode

TASK = GuessTask()
SECRET_3 = Problem("s3", "", "3")
PROMPT = encode("G:")


def step(text: str, eos: bool = False) -> Completion:
    """One action as the generator returns it: one token a character, log-prob -0.5 each."""
    ids = encode(text) + ((EOS,) if eos else ())
    return Completion(ids, (-0.5,) * len(ids), "eos" if eos else "stop")


def episode_problem(problem: Problem = SECRET_3, respond=None) -> SearchProblem:
    respond = respond or (lambda actions: TASK.respond(problem, actions))
    return SearchProblem(PROMPT, lambda text, truncated=False: TASK.score(problem, text, truncated=truncated),
                         problem.id, respond=Observations(respond, encode))


# ------------------------------------------------------------------------------ the task
def test_the_environment_answers_each_action_after_the_ones_before():
    assert TASK.respond(SECRET_3, ["1\n"]) == Turn("hi\n")
    assert TASK.respond(SECRET_3, ["1\n", "3\n"]) == Turn("ok\n", done=True, reward=1.0, correct=True, reason="win")
    assert TASK.respond(SECRET_3, ["4\n", "2\n"]) == Turn("hi\n", done=True, reward=-1.0, reason="out_of_turns")
    assert TASK.respond(SECRET_3, ["x\n"]) == Turn("?\n", invalid=True)
    assert [t.observation for t in TASK.episode(SECRET_3, ["4\n", "3\n", "1\n"])] == ["lo\n", "ok\n"]  # stops at done


def test_a_transcript_of_actions_is_graded_by_its_last_turn():
    assert TASK.score(SECRET_3, "1\n3\n").reason == "win" and TASK.score(SECRET_3, "1\n3\n").correct
    lost = TASK.score(SECRET_3, "4\n2\n")
    assert (lost.correct, lost.reward, lost.answer, lost.reason) == (False, -1.0, "2\n", "out_of_turns")
    assert TASK.score(SECRET_3, "1\n").reason == "unfinished"  # an episode not over is lost
    assert TASK.split_actions("1\n3") == ["1\n", "3"]
    assert pickle.loads(pickle.dumps(TASK)).respond(SECRET_3, ["3\n"]).correct


# ------------------------------------------------------------------------------ the tree
def test_the_tree_forks_at_turns_and_each_action_continues_after_its_observation():
    # Root: "1" (hi, the episode goes on) and "3" (a win at the first turn). The only live node is
    # "1", so it is expanded next, from the prompt + "1\n" + the observation "hi\n": "2" ends the
    # episode lost (out of turns, hi), "3" wins. The generator's prefixes prove where the observation went.
    generator = ScriptedGenerator({
        PROMPT: [step("1\n"), step("3\n")],
        PROMPT + encode("1\nhi\n"): [step("2\n"), step("3\n")],
    })
    config = SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=4, overlong_penalty=False)
    driver = SearchDriver(generator, config, step=TASK.step, decode=decode, eos_token_ids=[EOS])
    (result,) = driver.run([episode_problem()])
    tree = result.tree
    assert [decode(t) for t in tree.tokens] == ["", "1\n", "3\n", "2\n", "3\n"]
    assert [decode(o) for o in tree.observation] == ["", "hi\n", "ok\n", "hi\n", "ok\n"]
    assert tree.parent == [-1, 0, 0, 1, 1] and tree.depth == [0, 1, 1, 2, 2]
    assert tree.terminal == [False, False, True, True, True]
    assert [tree.kind[n] for n in (2, 3, 4)] == ["correct", "incorrect", "correct"]
    assert [tree.verdicts[n].reason for n in (2, 3, 4)] == ["win", "out_of_turns", "win"]
    assert tree.texts[4] == "1\nhi\n3\nok\n"  # the episode as the policy read it
    assert [t.terminal_id for t in result.trajectories] == [2, 4] and result.status == "complete"
    # Generated tokens are the actions only: 2 + 2 + 2 + 2 characters; the observations are prefilled.
    assert result.stats.generated_tokens == 8 and driver.stats.generated_tokens == 8
    second = result.trajectories[1]
    assert decode(second.response_ids) == "1\nhi\n3\nok\n"
    assert second.loss_mask == (True, True, False, False, False, True, True, False, False, False)
    assert second.step_lengths == (5, 5)
    lps = second.response_logprobs
    assert lps[:2] == (-0.5, -0.5) and all(math.isnan(x) for x in lps[2:5]) and lps[5:7] == (-0.5, -0.5)
    assert result.to_json(decode)["nodes"][1]["turn"] == {"observation": "hi\n", "done": False, "invalid": False,
                                                          "reason": ""}


def test_an_episode_ends_at_max_depth_without_the_environment_incomplete_and_by_eos_incorrect():
    generator = ScriptedGenerator({PROMPT: [step("1\n"), step("2\n", eos=True)]})
    config = SearchConfig(expansion_width=2, trajectories_per_tree=1, max_depth=1, overlong_penalty=False,
                          ablations=SearchAblations(backup_all_terminals=True))
    (result,) = SearchDriver(generator, config, step=TASK.step, decode=decode, eos_token_ids=[EOS]).run([episode_problem()])
    tree = result.tree
    assert [tree.kind[n] for n in (1, 2)] == ["incomplete", "incorrect"]
    assert [tree.verdicts[n].reason for n in (1, 2)] == ["turn_limit", "ended_by_policy"]


def test_the_rollout_tree_plays_its_rollouts_turn_by_turn_and_forks_at_turns():
    # Expansion 1, from the root, 2 rollouts: round 1 one request of n=2 at the prompt ("1" hi,
    # "4" lo: both go on); round 2 one request at each of their nodes: "1" then "3" wins, "4" then
    # "2" is lost out of turns. The fork rule (uct) then picks the node with the win below, "1"
    # (its Q is positive, "4"'s negative, the root's near 0 with a bonus no larger), and
    # expansion 2 plays 2 rollouts from it in one request of n=2: "3" repeats the win (one node,
    # a rollout but no new trajectory), "2" is a new loss. K = 3 counts rollouts: 4 >= 3, done.
    generator = ScriptedGenerator({
        PROMPT: [step("1\n"), step("4\n")],
        PROMPT + encode("1\nhi\n"): [step("3\n"), step("2\n")],
        PROMPT + encode("4\nlo\n"): [step("2\n")],
    })
    config = SearchConfig(expansion="rollout", expansion_width=2, trajectories_per_tree=3, max_depth=4,
                          overlong_penalty=False, merge_duplicate_steps=True)
    driver = SearchDriver(generator, config, step=TASK.step, decode=decode, eos_token_ids=[EOS])
    (result,) = driver.run([episode_problem()])
    calls = [[(decode(r.prompt_ids[len(PROMPT):]), r.n) for r in call] for call in generator.calls]
    assert calls == [[("", 2)], [("1\nhi\n", 1), ("4\nlo\n", 1)], [("1\nhi\n", 2)]]
    tree = result.tree
    assert [decode(t) for t in tree.tokens] == ["", "1\n", "4\n", "3\n", "2\n", "2\n"]
    assert tree.parent == [-1, 0, 0, 1, 2, 1] and tree.expanded[:3] == [1, 1, 0]
    assert [tree.verdicts[n].reason for n in (3, 4, 5)] == ["win", "out_of_turns", "out_of_turns"]
    assert [decode(t.response_ids) for t in result.trajectories] == ["1\nhi\n3\nok\n", "4\nlo\n2\nhi\n",
                                                                        "1\nhi\n2\nhi\n"]
    assert result.status == "complete" and result.stats.expansions == 2 and result.stats.rounds == 3
    assert tree.visits[3] == 2  # the repeated win was backed up twice
    assert result.stats.generated_tokens == 12 and driver.stats.generated_tokens == 12  # actions only
    assert result.trajectories[2].loss_mask == (True, True, False, False, False, True, True, False, False, False)


def test_the_rollout_tree_of_an_episode_refuses_cuts_inside_actions_and_flat_starts():
    config = SearchConfig(expansion="rollout", fork_rule="entropy", trajectories_per_tree=2)
    driver = SearchDriver(ScriptedGenerator({}), config, step=TASK.step, decode=decode)
    with pytest.raises(ValueError, match="environment's episode: its rollouts fork at turns.*fork_rule=entropy"):
        driver.run([episode_problem()])
    flat = replace(episode_problem(), first_rollouts=(step("1\n"),))
    driver = SearchDriver(ScriptedGenerator({}), SearchConfig(expansion="rollout"), step=TASK.step, decode=decode)
    with pytest.raises(ValueError, match="cannot start from flat samples"):
        driver.run([flat])


# ------------------------------------------------------------------ flat episodes, credit, batch
def flat_pair():
    """Two flat episodes of secret 3: "1" hi "3" ok (won at turn 2) and "4" lo "2" hi (lost)."""
    generator = ScriptedGenerator({
        PROMPT: [step("1\n"), step("4\n")],
        PROMPT + encode("1\nhi\n"): [step("3\n")],
        PROMPT + encode("4\nlo\n"): [step("2\n")],
    })
    config = SearchConfig(max_depth=8, overlong_penalty=False)
    (result,) = flat_rollouts([episode_problem()], generator, n=2, step=TASK.step, decode=decode, config=config,
                              eos_token_ids=[EOS])
    return result


def test_flat_episodes_go_turn_by_turn():
    result = flat_pair()
    assert [t.response_text for t in result.trajectories] == ["1\nhi\n3\nok\n", "4\nlo\n2\nhi\n"]
    assert [(t.reward, t.verdict.reason) for t in result.trajectories] == [(1.0, "win"), (-1.0, "out_of_turns")]
    assert result.stats.generated_tokens == 8 and result.stats.expansions == 3  # one request of n=2, then one a chain


def test_observations_are_credited_but_never_trained_on():
    # DAPO on the flat pair: final scores +1 and -1, mean 0: every token of the win +1, of the loss -1.
    credited = credit_groups([Group.of(flat_pair())], Credit(advantage="outcome"), "flat")
    won, lost = credited.rows[0]
    assert won.advantages == (1.0,) * 10 and lost.advantages == (-1.0,) * 10
    assert won.loss_mask == (True, True, False, False, False) * 2
    batch = flat_batch([won, lost], pad_id=0)
    # Position t predicts token t+1: the prompt is 2 tokens, so the response's tokens are predicted at 1..10.
    expected = torch.zeros(11, dtype=torch.bool)
    expected[[1, 2, 6, 7]] = True
    assert torch.equal(batch.loss_mask[0], expected) and torch.equal(batch.loss_mask[1], expected)


def flat_batch(rows, pad_id: int):
    """The rows as a mini-batch of one row per trajectory; pi_old (unread here) zero."""
    return collate(rows, pad_id, pack=lambda ids, mask, groups: None,
                   score=lambda ids, mask, packed: torch.zeros(ids.shape[0], ids.shape[1] - 1))


# ---------------------------------------------------------------------------- the guard
FAST = GradingConfig(timeout_s=1.0, backstop_s=2.0)


@pytest.mark.parametrize("trap, reason", [("hang", "timeout"), ("fail", "error")])
def test_a_hanging_or_raising_environment_ends_its_episode_lost_and_the_next_answer_comes(trap, reason):
    grader = Grader(GuessTask(trap=trap), FAST)
    try:
        assert grader.respond(SECRET_3, ("1\n", "9\n")) == guard_turn(reason)
        assert grader.respond(SECRET_3, ("1\n", "3\n")).correct  # a fresh worker, or the same one, answers
        assert grader.counts() == {"timeouts": reason == "timeout", "errors": reason == "error"}
    finally:
        grader.close()


def test_a_guarded_episode_in_the_search_is_graded_lost_with_the_guards_reason():
    grader = Grader(GuessTask(trap="fail"), FAST)
    generator = ScriptedGenerator({PROMPT: [step("9\n"), step("3\n")]})
    config = SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=2, overlong_penalty=False,
                          ablations=SearchAblations(backup_all_terminals=True))
    try:
        problem = episode_problem(respond=lambda actions: grader.respond(SECRET_3, actions))
        (result,) = SearchDriver(generator, config, step=TASK.step, decode=decode).run([problem])
    finally:
        grader.close()
    assert sorted((t.verdict.reason, t.reward) for t in result.trajectories) == [("error", -1.0), ("win", 1.0)]


def test_an_epoch_counts_invalid_actions_and_observation_tokens():
    from data_modules.epoch_metrics import epoch_metrics
    from flywheel.search.lockstep import DriverStats

    # Flat episodes of secret 3: "x" is invalid ("?", the episode goes on), then "3" wins; "1" hi, "2" hi lost.
    generator = ScriptedGenerator({
        PROMPT: [step("x\n"), step("1\n")],
        PROMPT + encode("x\n?\n"): [step("3\n")],
        PROMPT + encode("1\nhi\n"): [step("2\n")],
    })
    results = flat_rollouts([episode_problem()], generator, n=2, step=TASK.step, decode=decode,
                            config=SearchConfig(max_depth=8, overlong_penalty=False), eos_token_ids=[EOS])
    metrics = epoch_metrics(results, DriverStats(), 1.0, 0, None)
    assert metrics["search/invalid_actions"] == 1 and metrics["search/invalid_action_share"] == 1 / 4
    assert metrics["compute/epoch_observation_tokens"] == 2 + 3 + 3 + 3  # "?\n" "ok\n" "hi\n" "hi\n"
    assert [t.verdict.reason for t in results[0].trajectories] == ["win", "out_of_turns"]



def test_evaluation_plays_whole_episodes_turn_by_turn():
    from flywheel.reporting.evaluation import EvalConfig, evaluate

    generator = ScriptedGenerator({
        PROMPT: [step("1\n"), step("4\n")],
        PROMPT + encode("1\nhi\n"): [step("3\n")],
        PROMPT + encode("4\nlo\n"): [step("2\n")],
    })
    result = evaluate(generator, CharTokenizer(), TASK, [SECRET_3], EvalConfig(samples=2, k=2))
    assert result.correct == (1,) and result.samples == (2,) and result.generated_tokens == 8
    assert dict(result.reasons) == {"win": 1, "out_of_turns": 1}


def test_an_environments_instances_differ_by_what_the_prompt_hides():
    # Every Mastermind prompt is the rules alone: the key adds the secret, so the shipped splits
    # hold no repeat and no held-out instance (one key per secret).
    from flywheel.tasks.mastermind import MastermindTask
    from flywheel.tasks.overlap import find_overlap

    task = MastermindTask()
    train, val = task.problems("train"), task.problems("val")
    assert len({task.prompt(p) for p in train}) == 1
    assert find_overlap(train, val, task.problem_key) == find_overlap(train, [], task.problem_key)
    overlap = find_overlap(train, val, task.problem_key)
    assert overlap.repeats == () and overlap.leaks == ()
    assert find_overlap(train[:1], train[:1], task.problem_key).leaks == (train[0].id,)


def test_fork_gain_forks_a_failed_episode_at_its_turns_and_inside_an_action():
    from flywheel.reporting.fork_gain import ForkSetup, measure

    # The pool's one episode of secret 3: "1" (hi), then " 2" (hi: lost at the turn limit). Its
    # surprisals (no entropies from this generator): 0.5 0.5 | 0.1 3.0 0.1, so `entropy` keeps the
    # 3 tokens before "2" (inside the second action: its " " is kept), `step1` and `mid` keep the
    # first action (2 tokens). From " " the continuation writes "3": the action " 3" wins; from
    # the first action the policy writes " 2" again; from the prompt it plays the pool's episode again.
    second = Completion(encode(" 2\n"), (-0.1, -3.0, -0.1), "stop")
    generator = ScriptedGenerator({
        PROMPT: [step("1\n")],
        PROMPT + encode("1\nhi\n"): [second],
        PROMPT + encode("1\nhi\n "): [step("3\n")],
    })
    setup = ForkSetup([episode_problem()], generator, SearchConfig(max_depth=2), TASK.step, lambda piece: False,
                      decode, frozenset([EOS]), chatty=False)
    pool, forks, root = measure(setup, samples=1, resamples=1, max_step_forks=8, seed=0, chunk=64)
    assert (pool["samples"], pool["solved"], pool["failed"], pool["tokens"]) == (1, 0, 1, 5)
    assert sorted(forks) == ["entropy", "mid", "step1"]
    (entropy,), (step1,) = forks["entropy"], forks["step1"]
    assert (entropy.tries, entropy.solves, entropy.tokens, entropy.kept, entropy.kept_steps) == (1, 1, 2, 3, 1)
    assert (step1.tries, step1.solves, step1.tokens, step1.kept, step1.kept_steps) == (1, 0, 3, 2, 1)
    assert (root[0].tries, root[0].solves, root[0].tokens) == (1, 0, 5)


def test_packed_training_masks_observations_as_the_unpacked_forward_does(one_thread, tok):
    # Two episodes of one problem sharing their first action and its observation, trained as rows
    # with the loss mask the credit gives them (observations 0): the tree-packed pass (the shared
    # prefix computed once) gives the unpacked pass's loss and gradients, and the observations'
    # advantages never reach the loss.
    from flywheel.objectives import policy_loss
    from flywheel.objectives.credit import TrainingRow
    from flywheel.policies.tiny import build_tiny_llama
    from flywheel.training.packing import pack_rows, packed_logprobs

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok(text, add_special_tokens=False)["input_ids"])

    prompt = tuple(tok("G:")["input_ids"])
    rows = []
    for group, turns in enumerate([(("1\n", "hi\n"), ("3\n", "ok\n")), (("1\n", "hi\n"), ("2\n", "hi\n"))]):
        response, mask = (), ()
        for action, observation in turns:
            response += ids(action) + ids(observation)
            mask += (True,) * len(ids(action)) + (False,) * len(ids(observation))
        rows.append(TrainingRow("p", 0, prompt, response, (1.0 - 2 * group,) * len(response), (0.0,) * len(response),
                                (0,) * len(response), 1.0 - 2 * group, loss_mask=mask))
    batch = flat_batch(rows, pad_id=tok.pad_token_id)
    assert int(batch.loss_mask.sum()) == 8  # 2 episodes x 2 actions x 2 tokens
    model = build_tiny_llama(tok, seed=0, initializer_range=0.2).float().train()
    input_ids, attention = batch.input_ids, batch.attention_mask
    flat = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].log_softmax(-1)
    flat = torch.where(attention[:, 1:].bool(), flat.gather(2, input_ids[:, 1:, None])[..., 0], 0.0)
    old = flat.detach() + 0.05

    def loss_of(logprobs, advantages):
        return policy_loss(logprobs, old, advantages, batch.loss_mask)[0]

    packed = packed_logprobs(model, pack_rows(input_ids, attention, batch.group_ids), input_ids.shape)
    assert torch.allclose(packed, flat, atol=1e-5)
    flat_loss, packed_loss = loss_of(flat, batch.advantages), loss_of(packed, batch.advantages)
    params = list(model.parameters())
    for a, b in zip(torch.autograd.grad(flat_loss, params, retain_graph=True),
                    torch.autograd.grad(packed_loss, params, retain_graph=True)):
        assert torch.allclose(a, b, atol=1e-5)
    on_observations = batch.advantages.clone()
    on_observations[~batch.loss_mask & batch.attention_mask[:, 1:].bool()] = 100.0
    assert torch.equal(loss_of(packed, on_observations), packed_loss)  # observations are never trained on
    on_actions = batch.advantages.clone()
    on_actions[batch.loss_mask] = 100.0
    assert not torch.equal(loss_of(packed, on_actions), packed_loss)


class GuessingGenerator:
    """Guesses a digit 1-4 (or, 1 time in 8, "x": invalid), a pure function of the request's
    seed, sample index and context length: any prefix gets an answer."""

    def __init__(self) -> None:
        from flywheel.generation.base import GenerationStats

        self.stats = GenerationStats()

    def sample(self, requests):
        out = []
        for request in requests:
            comps = []
            for j in range(request.n):
                h = hash((request.seed, j, len(request.prompt_ids))) % 64
                comps.append(step("x\n" if h % 8 == 0 else f"{1 + h % 4}\n"))
            out.append(comps)
        return out


@pytest.mark.parametrize("selection", SELECTION.library_names())
def test_every_selection_rule_plays_episodes_the_environment_agrees_with(selection):
    # Whatever the rule picks, every trajectory is an episode: its actions, replayed through the
    # environment alone, give its verdict, and its text interleaves each action with its answer.
    from flywheel.search.rule_table import SELECTION

    config = SearchConfig(selection=selection, expansion_width=2, trajectories_per_tree=4, max_depth=4,
                          max_expansions_per_tree=12, overlong_penalty=False, seed=3)
    problems = [episode_problem(Problem(f"s{d}", "", str(d))) for d in (1, 2, 3, 4)]
    driver = SearchDriver(GuessingGenerator(), config, step=TASK.step, decode=decode, eos_token_ids=[EOS],
                          value_fn=(lambda prefixes: [0.5] * len(prefixes)) if SELECTION[selection].uses_value_head else None)
    results = driver.run(problems)
    assert sum(len(r.trajectories) for r in results) >= 4
    for result, secret in zip(results, (1, 2, 3, 4)):
        tree = result.tree
        for trajectory in result.trajectories:
            path = tree.path(trajectory.terminal_id)[1:]
            actions = [decode(tree.tokens[v]) for v in path]
            replayed = TASK.episode(Problem("s", "", str(secret)), actions)
            assert [decode(tree.observation[v]) for v in path] == [t.observation for t in replayed]
            assert (trajectory.verdict.reason, trajectory.reward) == (replayed[-1].reason, replayed[-1].reward)
            assert trajectory.response_text == "".join(a + t.observation for a, t in zip(actions, replayed))


def test_a_cached_episode_keeps_its_mask_through_the_buffer_and_the_mixed_rollout():
    from flywheel.adaptive.replay import CachedSolution, ReplayBuffer, ReplayConfig

    won, lost = flat_pair().trajectories
    buffer = ReplayBuffer(ReplayConfig(rule="code"))
    assert buffer.register("s3", [won], round=1, search_trajectories=8)
    restored = ReplayBuffer.from_dict(buffer.to_dict())
    (cached,) = restored.solutions("s3")
    assert cached == CachedSolution("s3", won.response_ids, won.response_text, 1, 1.0, won.loss_mask)
    assert cached.loss_mask == (True, True, False, False, False) * 2
    # A mixed rollout of 2: the cached win (+1) beside one direct episode (the lost one, -1).
    direct = flat_pair()
    direct = type(direct)(**{**direct.__dict__, "trajectories": (lost,)})
    rows = credit_groups([Group("s3", PROMPT, direct, (cached,), 2)], Credit(advantage="outcome"), "search").rows[0]
    assert [row.loss_mask for row in rows] == [cached.loss_mask, lost.loss_mask]
    assert [row.advantages[0] for row in rows] == [1.0, -1.0]


def test_gigpo_credits_flat_episodes_by_their_anchor_states():
    # The flat pair: "1" hi "3" ok (+1) and "4" lo "2" hi (-1). gamma 0.5, step weight 1, no std.
    # Episode terms: +1, -1 (mean 0). Step returns: 0.5, 1 and -0.5, -1. Both first steps start
    # from the one start state: 0.5 and -0.5 about their mean 0; each second step's state ("1"
    # so far, "4" so far) is reached once: 0. So the win's steps get 1.5, 1; the loss's -1.5, -1.
    credit = Credit(advantage="gigpo", gigpo_gamma=0.5)
    won, lost = credit_groups([Group.of(flat_pair())], credit, "flat").rows[0]
    assert won.advantages == (1.5,) * 5 + (1.0,) * 5 and lost.advantages == (-1.5,) * 5 + (-1.0,) * 5
    assert won.loss_mask == (True, True, False, False, False) * 2


def test_the_tree_viewer_shows_each_actions_answer():
    from flywheel.reporting.viewer import render_tree_html

    generator = ScriptedGenerator({PROMPT: [step("1\n"), step("x\n")],
                                   PROMPT + encode("1\nhi\n"): [step("3\n"), step("2\n")],
                                   PROMPT + encode("x\n?\n"): [step("3\n"), step("4\n")]})
    config = SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=4, overlong_penalty=False)
    (result,) = SearchDriver(generator, config, step=TASK.step, decode=decode).run([episode_problem()])
    page = render_tree_html(result.to_json(decode))
    assert "#1 depth 1" in page and ": 1\n -&gt; hi\n" in page  # the node's tooltip: the action, then the answer
    assert "an invalid action" in page and "m.turn.observation" in page  # the details panel's lines

"""One tree being searched: its state between the driver's rounds, how it absorbs an
expansion (§1-4, or rollout expansion) and how it picks its next node (§5)."""

from __future__ import annotations

import random
import time
from typing import Callable, Sequence

from flywheel.generation.base import Completion, GenerationRequest, SamplingParams
from flywheel.rewards import Verdict
from flywheel.search.backup import backup_trajectory
from flywheel.search.config import SearchConfig
from flywheel.search.expansion import (
    Decode,
    SearchProblem,
    derive_seed,
    distinct_steps,
    emitted_eos,
    grade_terminal,
    rollout_sampling_params,
)
from flywheel.search.outputs import TreeResult, TreeStats, build_trajectory
from flywheel.search.rollout import insert_path, select_fork, split_steps
from flywheel.search.selection import descend_puct, descend_uct, local_uct_select, select_frontier
from flywheel.search.terminal import choose_terminals, is_terminal_step
from flywheel.search.tree import ROOT, SearchTree
from flywheel.tasks.base import StepSpec


class LiveTree:
    """One tree being searched: its state between rounds."""

    def __init__(
        self, index: int, problem: SearchProblem, config: SearchConfig, step: StepSpec, ends_step: Callable[[Sequence[int]], bool]
    ) -> None:
        self.index = index
        self.step = step
        self.ends_step = ends_step
        self.problem = problem
        self.config = config
        self.tree = SearchTree(problem.prompt_ids)
        self.rng = random.Random(derive_seed(config.seed, index, -1))
        self.next_node: int = ROOT
        self.expansions = 0
        self.trajectories: list[int] = []
        self.rollouts = 0
        """Rollout mode: rollouts that reached a terminal, repeats of a trajectory included."""
        self.generated_tokens = 0
        self.graded: dict[tuple[tuple[int, ...], bool], tuple[str, Verdict]] = {}
        self.terminals = 0
        self.first_correct_tokens: int | None = None
        self.rounds = 0
        self.status: str | None = None
        self.started = time.perf_counter()
        # The last request's prefix: while local UCT dives, the next node is a child of the
        # last expanded one, so its prefix is that prefix + one step (no walk to the root).
        self._prefix_node = -1
        self._prefix: tuple[int, ...] = ()

    def request(self, params: SamplingParams) -> GenerationRequest:
        tree, node = self.tree, self.next_node
        if self.config.expansion == "rollout":
            params = rollout_sampling_params(self.step, self.config, tree.depth[node])
        if node != ROOT and tree.parent[node] == self._prefix_node:
            prefix = self._prefix + tree.tokens[node]
        else:
            prefix = tree.prefix_ids(node)
        self._prefix_node, self._prefix = node, prefix
        return GenerationRequest(
            prompt_ids=prefix,
            n=self.config.expansion_width,
            params=params,
            seed=derive_seed(self.config.seed, self.index, self.expansions),
            affinity=self.index,
        )

    def requests(self, params: SamplingParams) -> list[GenerationRequest]:
        """This round's requests (one: the node the tree selected)."""
        return [self.request(params)]

    def absorb_all(self, outputs: Sequence[Sequence[Completion]], decode: Decode, eos_ids: frozenset[int]) -> None:
        """`absorb` the one request's completions."""
        (completions,) = outputs
        self.absorb(completions, decode, eos_ids)

    def absorb(self, completions: Sequence[Completion], decode: Decode, eos_ids: frozenset[int]) -> None:
        """Expand `next_node` with `completions` and back up (or finish); `choose_next` then
        picks the next node, after a value model has scored the new children."""
        cfg, tree = self.config, self.tree
        node = self.next_node
        depth = tree.depth[node] + 1
        self.generated_tokens += sum(len(c.token_ids) for c in completions)
        tree.expanded[node] += 1
        self.expansions += 1
        self.rounds += 1
        if cfg.expansion == "rollout":
            self._absorb_rollouts(completions, decode, eos_ids)
            return
        if cfg.merge_duplicate_steps:
            completions = distinct_steps(completions)
        # step_end for the whole expansion: a child is terminal if it emitted EOS or sits at d_T (§1).
        at_max_depth = depth >= cfg.max_depth
        ends = [(at_max_depth or eos, eos) for eos in [emitted_eos(c, eos_ids) for c in completions]]
        terminal = [t for t, _ in ends]
        children = tree.add_children(node, completions, terminal)
        new_terminals: list[int] = []
        self._new_live = []
        for child, is_terminal in zip(children, terminal):
            (new_terminals if is_terminal else self._new_live).append(child)
        grade_children(tree, node, children, ends, self.problem, decode, cfg, self.graded)
        self.terminals += len(new_terminals)
        if self.first_correct_tokens is None and any(tree.kind[c] == "correct" for c in new_terminals):
            self.first_correct_tokens = self.generated_tokens
        if new_terminals:
            self._back_up(new_terminals)
        self._expanded, self._produced_terminal = node, bool(new_terminals)
        self._check_stop()

    def _absorb_rollouts(self, completions: Sequence[Completion], decode: Decode, eos_ids: frozenset[int]) -> None:
        """Rollout expansion (flywheel.search.rollout): hang each whole continuation below the
        chosen node as a path of steps, grade its terminal and back every one up."""
        cfg, tree, node = self.config, self.tree, self.next_node
        self._new_live = []
        for completion in completions:
            pieces = split_steps(completion, self.step, self.ends_step, cfg.max_depth - tree.depth[node])
            eos = emitted_eos(pieces[-1], eos_ids)  # False when the cut at max depth dropped the end
            last_depth = tree.depth[node] + len(pieces)
            terminal = is_terminal_step("eos" if eos else pieces[-1].finish_reason, last_depth, cfg.max_depth)
            leaf, new = insert_path(tree, node, pieces, terminal, cfg.merge_duplicate_steps)
            self._new_live.extend(v for v in new if not tree.terminal[v])
            if not tree.terminal[leaf]:
                continue
            fresh = leaf in new
            if fresh:
                grade_terminal(tree, leaf, self.problem, decode, eos, cfg, self.graded)
                self.terminals += 1
            reward = tree.reward[leaf]
            assert reward is not None
            backup_trajectory(tree, leaf, reward, cfg)
            self.rollouts += 1
            if fresh:
                tree.backup_index[leaf] = len(self.trajectories)
                self.trajectories.append(leaf)
                if self.first_correct_tokens is None and tree.kind[leaf] == "correct":
                    self.first_correct_tokens = self.generated_tokens
        self._expanded, self._produced_terminal = node, True
        self._check_stop()

    def _check_stop(self) -> None:
        # Step mode counts backed-up trajectories; rollout mode counts rollouts (a repeated
        # trajectory too), so a policy that keeps writing one wrong answer cannot keep a tree alive.
        cfg = self.config
        done = self.rollouts if cfg.expansion == "rollout" else len(self.trajectories)
        if done >= cfg.trajectories_per_tree:
            self.status = "complete"
        elif cfg.stop_when_solved and self.first_correct_tokens is not None and done >= cfg.stop_when_solved:
            self.status = "solved"
        elif self.expansions >= cfg.max_expansions_per_tree:
            self.status = "expansion_cap"

    def new_live_children(self) -> list[int]:
        """The non-terminal nodes the last expansion added (what a value model scores)."""
        return self._new_live

    def choose_next(self) -> None:
        """Pick the node to expand next round (or finish the tree as exhausted)."""
        if self.status is not None:
            return
        nxt = self._select(self._expanded, produced_terminal=self._produced_terminal)
        if nxt is None:
            self.status = "exhausted"
        else:
            self.next_node = nxt

    def _back_up(self, new_terminals: list[int]) -> None:
        cfg, tree = self.config, self.tree
        if cfg.terminal_choice == "entropy":
            missing = [t for t in new_terminals if tree.entropies[t] is None]
            if missing:
                raise RuntimeError(
                    "search.terminal_choice='entropy' needs per-token entropies, but the generator returned "
                    "Completion.entropies=None; use a backend that honours SamplingParams.top_logprobs or set "
                    "search.terminal_choice='mean_nll'"
                )
            uncertainty = [tree.trajectory_mean_entropy(t) for t in new_terminals]
        else:
            uncertainty = [tree.trajectory_mean_nll(t) for t in new_terminals]
        chosen = choose_terminals(
            new_terminals,
            [tree.kind[t] or "incomplete" for t in new_terminals],
            uncertainty,
            rule=cfg.terminal_choice,
            rng=self.rng,
            back_up_all=cfg.backup_all_terminals,
        )
        for terminal in chosen:
            if len(self.trajectories) >= cfg.trajectories_per_tree:
                break
            reward = tree.reward[terminal]
            assert reward is not None
            backup_trajectory(tree, terminal, reward, cfg)
            tree.backup_index[terminal] = len(self.trajectories)
            self.trajectories.append(terminal)

    def _select(self, expanded: int, produced_terminal: bool) -> int | None:
        """§5: local UCT among the new children while no terminal appeared, else the global rule."""
        cfg, tree = self.config, self.tree
        if cfg.expansion == "rollout":
            return select_fork(tree, cfg, self.rng)
        if cfg.selection == "puct":
            return descend_puct(tree, cfg)
        if not produced_terminal:
            child = local_uct_select(tree, expanded, cfg, self.rng)
            if child is not None:
                return child
        if cfg.selection == "frontier":
            return select_frontier(tree, cfg)
        return descend_uct(tree, cfg, self.rng)

    def _trained_terminals(self) -> list[int]:
        """The backed-up terminals, then (train_all_terminals) every other graded terminal
        whose response differs from all taken so far."""
        if not self.config.train_all_terminals:
            return self.trajectories
        tree, out = self.tree, list(self.trajectories)
        seen = {tuple(tree.response_ids(t)) for t in out}
        for node in range(len(tree)):
            if tree.terminal[node] and tree.kind[node] is not None and tree.backup_index[node] < 0:
                ids = tuple(tree.response_ids(node))
                if ids not in seen:
                    seen.add(ids)
                    out.append(node)
        return out

    def result(self) -> TreeResult:
        tree = self.tree
        assert self.status is not None
        shared: dict = {}  # node id -> StepRecord: trajectories share their common prefix's records
        return finished_result(
            self, tuple(build_trajectory(tree, t, self.config, shared_steps=shared) for t in self._trained_terminals())
        )


def grade_children(
    tree: SearchTree,
    node: int,
    children: Sequence[int],
    ends: Sequence[tuple[bool, bool]],
    problem: SearchProblem,
    decode: Decode,
    config: SearchConfig,
    graded: dict[tuple[tuple[int, ...], bool], tuple[str, Verdict]],
) -> None:
    """Grade the terminal children of one expansion of `node` (`ends`: their (terminal, EOS)
    flags). Their responses are `node`'s response plus their own step, so the path to the
    root is walked once per expansion, not once per child; siblings that sampled the same
    step (and EOS flag) share one grading: the same text, verdict, kind and reward."""
    base: tuple[int, ...] | None = None
    twins: dict[tuple[tuple[int, ...], bool], int] = {}
    for child, (is_terminal, is_eos) in zip(children, ends):
        if not is_terminal:
            continue
        step = tuple(tree.tokens[child])
        twin = twins.get((step, is_eos))
        if twin is not None:
            tree.texts[child], tree.verdicts[child] = tree.texts[twin], tree.verdicts[twin]
            tree.kind[child], tree.reward[child] = tree.kind[twin], tree.reward[twin]
            continue
        twins[step, is_eos] = child
        if base is None:
            base = tuple(tree.response_ids(node))
        grade_terminal(tree, child, problem, decode, is_eos, config, graded, ids=base + step)


def finished_result(live, trajectories: tuple) -> TreeResult:
    """The TreeResult of a finished live tree (a LiveTree or an AgentTree: the same counters)."""
    tree = live.tree
    return TreeResult(
        index=live.index,
        problem_id=live.problem.id,
        prompt_ids=live.problem.prompt_ids,
        trajectories=trajectories,
        status=live.status,  # type: ignore[arg-type]
        stats=TreeStats(
            expansions=live.expansions,
            nodes=len(tree),
            generated_tokens=live.generated_tokens,
            max_depth=max(tree.depth),
            terminals=live.terminals,
            rounds=live.rounds,
            wall_seconds=time.perf_counter() - live.started,
            tokens_to_first_correct=live.first_correct_tokens,
        ),
        config=live.config,
        tree=tree,
    )

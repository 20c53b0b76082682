"""One tree being searched: its state between the driver's rounds, and the phases of a round the
driver's loop calls on it (flywheel.search.driver.SearchDriver.search_round): `requests` (the
node it selected), `grow` (the samples added, new terminals graded), `back_up`, `select`. How an
expansion grows it (one step of a node, §1-4, or whole rollouts) and how the next node is picked
(§5, or a fork rule) are its ExpansionMode, resolved once from the config (flywheel.search.rules)."""

from __future__ import annotations

import random
import time
from typing import Protocol, Sequence

from flywheel.generation.base import Completion, GenerationRequest, SamplingParams
from flywheel.rewards import Verdict
from flywheel.search.config import SearchConfig
from flywheel.search.expansion import Decode, SearchProblem, derive_seed
from flywheel.search.outputs import TreeResult, TreeStats, build_trajectory
from flywheel.search.tree import ROOT, SearchTree


class ExpansionMode(Protocol):
    """How expansions grow a LiveTree: step expansion (flywheel.search.step_expansion) or
    rollout expansion (flywheel.search.rollout). One object serves every tree of a driver, so
    it keeps no state of its own: it reads and writes the LiveTree it is given."""

    def sampling_params(self, live: LiveTree, node: int, params: SamplingParams) -> SamplingParams:
        """The request's sampling parameters to expand `node` (`params`: one step's)."""
        ...

    def width(self, live: LiveTree, node: int) -> int:
        """n, the samples of the request that expands `node`."""
        ...

    def grow(self, live: LiveTree, completions: Sequence[Completion], decode: Decode,
             eos_ids: frozenset[int]) -> tuple[list[int], bool, object]:
        """Add `live.next_node`'s completions to the tree and grade its new terminals; returns the
        new non-terminal nodes, whether the expansion produced a terminal, and what `back_up`
        backs up."""
        ...

    def back_up(self, live: LiveTree, pending: object) -> None:
        """Back up what `grow` graded (its third return value)."""
        ...

    def next_node(self, live: LiveTree) -> int | None:
        """The node to expand next round; None: nothing is left to expand."""
        ...

    def counted(self, live: LiveTree) -> int:
        """What `trajectories_per_tree` (K) and `stop_when_solved` count."""
        ...


class LiveTree:
    """One tree being searched: its state between rounds, grown by `mode`."""

    def __init__(self, index: int, problem: SearchProblem, config: SearchConfig, mode: ExpansionMode) -> None:
        self.index = index
        self.problem = problem
        self.config = config
        self.mode = mode
        self.tree = SearchTree(problem.prompt_ids)
        self.rng = random.Random(derive_seed(config.seed, index, -1))
        self.next_node: int = ROOT
        self.expansions = 0
        self.trajectories: list[int] = []
        self.rollouts = 0
        """Rollout expansion: rollouts that reached a terminal, repeats of a trajectory included."""
        self.generated_tokens = 0
        self.reused_tokens = 0
        """Of `generated_tokens`, those of the rollouts the tree started from (`start_from`)."""
        self.graded: dict[tuple[tuple[int, ...], bool], tuple[str, Verdict]] = {}
        self.terminals = 0
        self.first_correct_tokens: int | None = None
        self.rounds = 0
        self.status: str | None = None
        self.started = time.perf_counter()
        self.last_expanded = ROOT
        self.produced_terminal = False
        """Whether the last expansion added a terminal (step selection reads it, §5)."""
        self.new_live: list[int] = []
        self._graded: object = None
        """What this round's `grow` graded and `back_up` backs up (the mode's own record)."""
        # The last request's prefix: while local UCT dives, the next node is a child of the
        # last expanded one, so its prefix is that prefix + one step (no walk to the root).
        self._prefix_node = -1
        self._prefix: tuple[int, ...] = ()

    def request(self, params: SamplingParams) -> GenerationRequest:
        tree, node = self.tree, self.next_node
        params = self.mode.sampling_params(self, node, params)
        if node != ROOT and tree.parent[node] == self._prefix_node:
            prefix = self._prefix + tree.tokens[node] + tree.observation[node]
        else:
            prefix = tree.prefix_ids(node)
        self._prefix_node, self._prefix = node, prefix
        return GenerationRequest(
            prompt_ids=prefix,
            n=self.mode.width(self, node),
            params=params,
            seed=derive_seed(self.config.seed, self.index, self.expansions),
            affinity=self.index,
        )

    def requests(self, params: SamplingParams) -> list[GenerationRequest]:
        """This round's requests: one, the node the tree selected; none once it finished."""
        return [self.request(params)] if self.status is None else []

    def grow(self, outputs: Sequence[Sequence[Completion]], decode: Decode, eos_ids: frozenset[int]) -> None:
        """Expand `next_node` with the one request's completions: new children (or paths), new
        terminals graded; `back_up` then backs them up."""
        if self.status is not None:
            return
        (completions,) = outputs
        node = self.next_node
        self.generated_tokens += sum(len(c.token_ids) for c in completions)
        self.tree.expanded[node] += 1
        self.expansions += 1
        self.rounds += 1
        self.new_live, self.produced_terminal, self._graded = self.mode.grow(self, completions, decode, eos_ids)
        self.last_expanded = node

    def back_up(self) -> None:
        """Back up what this round's expansion graded, then finish if a stopping rule says so."""
        if self.status is not None:
            return
        self.mode.back_up(self, self._graded)
        self._check_stop()

    def start_from(self, rollouts: Sequence[Completion], decode: Decode, eos_ids: frozenset[int]) -> None:
        """Begin the tree with `rollouts`, whole responses to the prompt sampled before it (the
        flat samples of `--data.batching.flat_first`): they are absorbed as if the root's first
        expansion had sampled them (rollout expansion cuts each into steps, grades and backs it
        up, and they count towards K), then the mode picks the first node to fork from. Their
        tokens are in this tree's `generated_tokens` (its chains hold them) and in
        `reused_tokens`, but no request was made for them: the driver, which counts what its
        generator calls return, never counts them, so the epoch's budget sees them once, where
        they were sampled."""
        tokens = sum(len(c.token_ids) for c in rollouts)
        self.generated_tokens += tokens
        self.reused_tokens += tokens
        self.next_node = ROOT
        self.tree.expanded[ROOT] += 1
        self.new_live, self.produced_terminal, graded = self.mode.grow(self, rollouts, decode, eos_ids)
        self.mode.back_up(self, graded)
        self.last_expanded = ROOT
        self._check_stop()

    def _check_stop(self) -> None:
        cfg = self.config
        done = self.mode.counted(self)
        if done >= cfg.trajectories_per_tree:
            self.status = "complete"
        elif cfg.stop_when_solved and self.first_correct_tokens is not None and done >= cfg.stop_when_solved:
            self.status = "solved"
        elif self.expansions >= cfg.max_expansions_per_tree:
            self.status = "expansion_cap"

    def new_live_children(self) -> list[int]:
        """The non-terminal nodes the last expansion added (what a value model scores)."""
        return self.new_live

    @property
    def done(self) -> bool:
        return self.status is not None

    def select(self) -> None:
        """Pick the node to expand next round (or finish the tree as exhausted)."""
        if self.status is not None:
            return
        nxt = self.mode.next_node(self)
        if nxt is None:
            self.status = "exhausted"
        else:
            self.next_node = nxt

    def _trained_terminals(self) -> list[int]:
        """The backed-up terminals, then (train_all_terminals) every other graded terminal
        whose response differs from all taken so far."""
        if not self.config.ablations.train_all_terminals:
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
            self, tuple(build_trajectory(tree, t, self.config, shared_steps=shared) for t in self._trained_terminals()),
            self.reused_tokens,
        )


def finished_result(live, trajectories: tuple, reused_tokens: int = 0) -> TreeResult:
    """The TreeResult of a finished live tree (a LiveTree or an AgentTree: the same counters);
    `reused_tokens`: of its generated tokens, those it started from (LiveTree.start_from)."""
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
            reused_tokens=reused_tokens,
        ),
        config=live.config,
        tree=tree,
    )

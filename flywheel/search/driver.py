"""The batched multi-tree driver: many DeepSearch trees in lock-step over one Generator.

Every round: each live tree names the one leaf it wants expanded; ONE `generator.sample`
call carries all of those expansions (n children each); then each tree adds its
children, grades its new terminals, backs one up (§3-4) and selects its next leaf (§5).
Finished trees leave and queued problems join at once (continuous batching), so the
generator batch stays at `max_concurrent_trees` requests until the queue runs dry.

A tree's evolution depends only on its own generator outputs, its index in the input
and the config seed (per-request seeds and its rng are derived from them), so the same
seed and the same generator outputs give an identical tree at any concurrency.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from flywheel.generation.base import Completion, GenerationRequest, Generator, SamplingParams
from flywheel.rewards import Verdict
from flywheel.search.backup import backup_trajectory
from flywheel.search.config import SearchConfig
from flywheel.search.outputs import TreeResult, TreeStats, build_trajectory
from flywheel.search.rollout import insert_path, select_fork, split_steps
from flywheel.search.selection import descend_puct, descend_uct, local_uct_select, select_frontier
from flywheel.search.terminal import choose_terminals, is_terminal_step, terminal_kind, terminal_reward
from flywheel.search.tree import ROOT, SearchTree
from flywheel.tasks.base import StepSpec

log = logging.getLogger(__name__)

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class SearchProblem:
    """One problem to search: the prompt as token ids and its grader.

    `score` grades the full response text (every step from the root to a terminal, decoded;
    never the prompt), e.g. `functools.partial(task.score, problem)`.
    """

    prompt_ids: tuple[int, ...]
    score: Callable[[str], Verdict]
    id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(self.prompt_ids))  # a list is accepted
        if not self.prompt_ids:
            raise ValueError(f"problem {self.id!r}: prompt_ids must not be empty")


@dataclass(frozen=True)
class SearchProgress:
    """A snapshot after each round, for a progress bar (the DataModule wraps it in tqdm)."""

    trees_done: int
    trees_live: int
    trees_total: int | None
    """None when the problems came from an iterable without len()."""
    trajectories: int
    """Backed-up trajectories so far, finished and live trees together."""
    expansions: int
    generated_tokens: int
    rounds: int
    elapsed_seconds: float


@dataclass
class DriverStats:
    """Cumulative accounting of one driver (logged under search/)."""

    rounds: int = 0
    requests: int = 0
    expansions: int = 0
    generated_tokens: int = 0
    trees_done: int = 0
    trajectories: int = 0
    generator_seconds: float = 0.0
    total_seconds: float = 0.0
    value_calls: int = 0
    valued_nodes: int = 0
    value_sum: float = 0.0
    value_seconds: float = 0.0
    """Time in the value model (a model call like the generator's, not bookkeeping)."""

    @property
    def bookkeeping_seconds(self) -> float:
        """Everything that is not a model call: selection, grading, backup, batching."""
        return self.total_seconds - self.generator_seconds - self.value_seconds

    @property
    def overhead_pct(self) -> float:
        """Share of the driver's wall time spent outside generator calls (paper: < 0.4%)."""
        return 100.0 * self.bookkeeping_seconds / self.total_seconds if self.total_seconds else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "rounds": float(self.rounds),
            "requests": float(self.requests),
            "expansions": float(self.expansions),
            "generated_tokens": float(self.generated_tokens),
            "trees_done": float(self.trees_done),
            "trajectories": float(self.trajectories),
            "generator_seconds": self.generator_seconds,
            "bookkeeping_seconds": self.bookkeeping_seconds,
            "overhead_pct": self.overhead_pct,
        }


def derive_seed(*parts: int) -> int:
    """A stable 31-bit seed from integers (same on every machine and Python run).

    >>> derive_seed(0, 1, 2) == derive_seed(0, 1, 2) != derive_seed(0, 2, 1)
    True
    """
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(int(part).to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "little") >> 33


def step_sampling_params(step: StepSpec, config: SearchConfig) -> SamplingParams:
    """One step's request (§1): a fixed chunk of max_tokens, or text up to the delimiter capped at max_tokens."""
    return SamplingParams(
        max_new_tokens=step.max_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        stop_strings=(step.delimiter,) if step.delimiter is not None else (),
        top_logprobs=config.entropy_top_k if config.terminal_choice == "entropy" else 0,
    )


def rollout_sampling_params(step: StepSpec, config: SearchConfig, depth: int) -> SamplingParams:
    """A rollout expansion's request: a whole continuation (no stop string), room for every step
    left above max depth."""
    return SamplingParams(
        max_new_tokens=step.max_tokens * (config.max_depth - depth),
        temperature=config.temperature,
        top_p=config.top_p,
        top_logprobs=config.entropy_top_k if config.terminal_choice == "entropy" else 0,
    )


def emitted_eos(completion: Completion, eos_token_ids: frozenset[int]) -> bool:
    """EOS as the generator reports it, or as the last token when the caller names EOS ids."""
    if completion.finish_reason == "eos":
        return True
    return bool(eos_token_ids) and bool(completion.token_ids) and completion.token_ids[-1] in eos_token_ids


def grade_terminal(
    tree: SearchTree,
    node: int,
    problem: SearchProblem,
    decode: Decode,
    eos: bool,
    config: SearchConfig,
    graded: dict[tuple[int, ...], tuple[str, Verdict]] | None = None,
) -> None:
    """Grade the trajectory ending at `node`: store its text, verdict, kind and reward (§2).

    `graded` memoises (text, verdict) by response token ids within one tree: siblings often
    repeat a response exactly, and decoding and grading are pure."""
    ids = tuple(tree.response_ids(node))
    if graded is not None and ids in graded:
        text, verdict = graded[ids]
    else:
        text = decode(ids)
        try:
            verdict = problem.score(text)
        except Exception as err:  # a verifier must never raise; say which problem broke it
            raise RuntimeError(f"the verifier of problem {problem.id!r} raised on a completion: {err!r}") from err
        if graded is not None:
            graded[ids] = (text, verdict)
    kind = terminal_kind(verdict, emitted_eos=eos)
    tree.texts[node] = text
    tree.verdicts[node] = verdict
    tree.kind[node] = kind
    tree.reward[node] = terminal_reward(kind, verdict, config.incomplete_reward)


def distinct_steps(completions: Sequence[Completion]) -> list[Completion]:
    """The first completion of each distinct token sequence, in sampling order."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for completion in completions:
        key = tuple(completion.token_ids)
        if key not in seen:
            seen.add(key)
            out.append(completion)
    return out


def step_end(completion: Completion, depth: int, max_depth: int, eos_token_ids: frozenset[int]) -> tuple[bool, bool]:
    """(terminal, emitted EOS) of a new child at `depth` (§1)."""
    eos = emitted_eos(completion, eos_token_ids)
    return is_terminal_step("eos" if eos else completion.finish_reason, depth, max_depth), eos


def check_outputs(
    generator: Generator, requests: Sequence[GenerationRequest], outputs: Sequence[Sequence[Completion]]
) -> None:
    """The Generator contract: one list per request, `n` completions each."""
    name = type(generator).__name__
    if len(outputs) != len(requests):
        raise RuntimeError(f"{name}.sample returned {len(outputs)} results for {len(requests)} requests")
    for i, (request, comps) in enumerate(zip(requests, outputs)):
        if len(comps) != request.n:
            raise RuntimeError(
                f"{name}.sample returned {len(comps)} completions for request {i} with n={request.n}"
            )


class _LiveTree:
    """One tree being searched: its state between rounds."""

    def __init__(
        self, index: int, problem: SearchProblem, config: SearchConfig, step: StepSpec, ends_step: Callable[[int], bool]
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
        self.graded: dict[tuple[int, ...], tuple[str, Verdict]] = {}
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
        ends = [step_end(c, depth, cfg.max_depth, eos_ids) for c in completions]
        terminal = [t for t, _ in ends]
        children = tree.add_children(node, completions, terminal)

        new_terminals = [c for c, t in zip(children, terminal) if t]
        for child, (_, is_eos) in zip(children, ends):
            if tree.terminal[child]:
                grade_terminal(tree, child, self.problem, decode, is_eos, cfg, self.graded)
        self.terminals += len(new_terminals)
        if self.first_correct_tokens is None and any(tree.kind[c] == "correct" for c in new_terminals):
            self.first_correct_tokens = self.generated_tokens
        if new_terminals:
            self._back_up(new_terminals)
        self._expanded, self._produced_terminal = node, bool(new_terminals)
        self._new_live = [c for c in children if not tree.terminal[c]]
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
        return TreeResult(
            index=self.index,
            problem_id=self.problem.id,
            prompt_ids=self.problem.prompt_ids,
            trajectories=tuple(build_trajectory(tree, t, self.config) for t in self._trained_terminals()),
            status=self.status,  # type: ignore[arg-type]
            stats=TreeStats(
                expansions=self.expansions,
                nodes=len(tree),
                generated_tokens=self.generated_tokens,
                max_depth=max(tree.depth),
                terminals=self.terminals,
                rounds=self.rounds,
                wall_seconds=time.perf_counter() - self.started,
                tokens_to_first_correct=self.first_correct_tokens,
            ),
            config=self.config,
            tree=tree,
        )


class SearchDriver:
    """Runs DeepSearch trees for a stream of problems over one Generator, in lock-step rounds.

    Args:
        generator: any `Generator`; each round makes exactly one `sample` call.
        config: the search rules and their parameters.
        step: what one step is (the Task's StepSpec): fixed chunk or delimiter + cap.
        decode: token ids -> text, used to build the response text the verifier grades.
        max_concurrent_trees: trees searched at once = requests per generator call (the
            official code: 16 per rank). Finished trees are replaced from the queue at once.
        eos_token_ids: also treat a completion whose last token is one of these as EOS (for
            backends that report it as "stop"); the generator's "eos" finish reason always counts.
        progress: called with a SearchProgress after every round.
        log_every_seconds: how often to log progress at INFO level (0 = every round).
        value_fn: a value model (e.g. the previous round's PRM): prefixes (prompt + partial
            response) -> values in [0, 1]; called once per round for every new non-terminal
            node of every live tree; the values enter selection with weight
            `config.prm_weight` (rest-mcts-and-countdown.md §A).
    """

    def __init__(
        self,
        generator: Generator,
        config: SearchConfig,
        *,
        step: StepSpec,
        decode: Decode,
        max_concurrent_trees: int = 16,
        eos_token_ids: Iterable[int] = (),
        progress: Callable[[SearchProgress], None] | None = None,
        log_every_seconds: float = 30.0,
        value_fn: Callable[[list[tuple[int, ...]]], Sequence[float]] | None = None,
    ) -> None:
        if max_concurrent_trees < 1:
            raise ValueError(f"max_concurrent_trees must be >= 1, got {max_concurrent_trees}")
        self.generator = generator
        self.config = config
        self.step = step
        self.decode = decode
        self.max_concurrent_trees = max_concurrent_trees
        self.eos_token_ids = frozenset(eos_token_ids)
        self.progress = progress
        self.log_every_seconds = log_every_seconds
        self.value_fn = value_fn
        self.stats = DriverStats()
        self.params = step_sampling_params(step, config)
        self._step_enders: dict[int, bool] = {}

    def ends_step(self, token: int) -> bool:
        """Does this token end a step (its text holds the delimiter)? Memoised per token id."""
        known = self._step_enders.get(token)
        if known is None:
            known = self._step_enders[token] = self.step.delimiter is not None and self.step.delimiter in self.decode([token])
        return known

    def _score_new_nodes(self, trees: list[_LiveTree]) -> None:
        """One value-model call for the new non-terminal children of every live tree."""
        nodes = [(t, c) for t in trees for c in t.new_live_children()]
        if not nodes:
            return
        start = time.perf_counter()
        values = self.value_fn([t.tree.prefix_ids(c) for t, c in nodes])
        if len(values) != len(nodes):
            raise RuntimeError(f"value_fn returned {len(values)} values for {len(nodes)} nodes")
        for (t, c), v in zip(nodes, values):
            t.tree.prm_value[c] = float(v)
        self.stats.value_calls += 1
        self.stats.valued_nodes += len(nodes)
        self.stats.value_sum += float(sum(values))
        self.stats.value_seconds += time.perf_counter() - start

    def run(self, problems: Iterable[SearchProblem]) -> list[TreeResult]:
        """Search every problem; results in input order."""
        results = list(self.iter_run(problems))
        results.sort(key=lambda r: r.index)
        return results

    def iter_run(self, problems: Iterable[SearchProblem]) -> Iterator[TreeResult]:
        """Search every problem, yielding each TreeResult as soon as its tree finishes (so the
        caller can persist it); the order is completion order, `TreeResult.index` is input order."""
        total = len(problems) if hasattr(problems, "__len__") else None  # type: ignore[arg-type]
        queue = enumerate(problems)
        live: list[_LiveTree] = []
        stats = self.stats
        done = done_trajectories = 0
        start = last_log = time.perf_counter()

        def refill() -> None:
            while len(live) < self.max_concurrent_trees:
                item = next(queue, None)
                if item is None:
                    return
                live.append(_LiveTree(item[0], item[1], self.config, self.step, self.ends_step))

        refill()
        while live:
            round_start = time.perf_counter()
            requests = [t.request(self.params) for t in live]
            gen_start = time.perf_counter()
            outputs = self.generator.sample(requests)
            gen_seconds = time.perf_counter() - gen_start
            check_outputs(self.generator, requests, outputs)
            finished: list[TreeResult] = []
            still: list[_LiveTree] = []
            for tree, completions in zip(live, outputs):
                before = tree.generated_tokens
                tree.absorb(completions, self.decode, self.eos_token_ids)
                stats.generated_tokens += tree.generated_tokens - before
            if self.value_fn is not None:
                self._score_new_nodes([t for t in live if t.status is None])
            for tree in live:
                tree.choose_next()
                if tree.status is None:
                    still.append(tree)
                else:
                    finished.append(tree.result())
                    done_trajectories += len(tree.trajectories)
            live[:] = still
            refill()
            done += len(finished)
            stats.rounds += 1
            stats.requests += len(requests)
            stats.expansions += len(requests)
            stats.trees_done += len(finished)
            stats.trajectories += sum(len(r.trajectories) for r in finished)
            stats.generator_seconds += gen_seconds
            now = time.perf_counter()
            stats.total_seconds += now - round_start
            if self.progress is not None or now - last_log >= self.log_every_seconds:
                snapshot = SearchProgress(
                    trees_done=done,
                    trees_live=len(live),
                    trees_total=total,
                    trajectories=done_trajectories + sum(len(t.trajectories) for t in live),
                    expansions=stats.expansions,
                    generated_tokens=stats.generated_tokens,
                    rounds=stats.rounds,
                    elapsed_seconds=now - start,
                )
                if self.progress is not None:
                    self.progress(snapshot)
                if now - last_log >= self.log_every_seconds:
                    last_log = now
                    log.info(
                        "search: %d/%s trees done, %d live, %d trajectories, %d expansions, %d tokens, %.0f s",
                        done, total if total is not None else "?", len(live), snapshot.trajectories,
                        snapshot.expansions, snapshot.generated_tokens, snapshot.elapsed_seconds,
                    )
            yield from finished


def run_search(
    problems: Iterable[SearchProblem],
    generator: Generator,
    config: SearchConfig,
    *,
    step: StepSpec,
    decode: Decode,
    max_concurrent_trees: int = 16,
    eos_token_ids: Iterable[int] = (),
    progress: Callable[[SearchProgress], None] | None = None,
) -> list[TreeResult]:
    """Search every problem with a fresh SearchDriver; results in input order."""
    driver = SearchDriver(
        generator,
        config,
        step=step,
        decode=decode,
        max_concurrent_trees=max_concurrent_trees,
        eos_token_ids=eos_token_ids,
        progress=progress,
    )
    return driver.run(problems)

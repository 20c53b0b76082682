"""Credit: how one problem's responses become training rows, every rule in one table.

A credit rule is a name (`--data.credit.advantage`), the optional `--data.credit.*`
settings it reads, and a function from a group's responses to each response's per-step
advantages (None = left out of training). `RULES` holds them all (a flywheel.tables.Table);
the command line's choices, --help, the settings check and the rows read it, so a new rule is
one `RULES.register(CreditRule(...))`, in this file or in a user's module (`--plugins`), and its
test (docs/credit.md shows one).

A group is one problem's responses and their baseline: a search tree's K trajectories, a
flat rollout's samples, or a replay-buffer problem's mixed rollout (its cached correct
solutions in place of the first direct samples, deepsearch.md §7). A mixed rollout has no
tree: each response is one step, a cached one scored +1, and the chosen rule credits it as
it credits a tree (node and outcome: the DAPO advantage r - mean; best_of_n: the correct
ones only, +1; subtree: 2 (r - mean), its local and global terms being the same step).
Flat rollouts (`--data.rollout=flat|best_of_n`) are credited by their kind's own rule
(`ROLLOUTS`: "outcome", DAPO's r - mean, or "best_of_n") whatever the chosen rule, except one
that weights paths (self-training) or credits flat groups itself (GiGPO).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Callable, Hashable, Sequence

from flywheel.adaptive import CachedSolution, DegenerateFilter, mixed_rollout
from flywheel.objectives.advantages import (gigpo_advantages, pass_at_k_advantages, per_token, subtree_advantages,
                                            tree_grpo_advantages)
from flywheel.objectives.losses import LOSSES
from flywheel.objectives.paths import SearchedGroup, SearchedPath, TrainingRow
from flywheel.objectives.self_training import PathWeighting, weight_paths
from flywheel.prm import ValueFn
from flywheel.tables import Table


@dataclass(frozen=True)
class Scored:
    """One response of a group as a rule reads it."""

    step_scores: tuple[float, ...]
    """[S] q~(s_j) + overlong of each step (a terminal's q~ is its reward)."""
    node_ids: tuple[Hashable, ...]
    """[S] the tree node of each step; steps shared by several responses share it."""
    final_score: float
    """Terminal reward + overlong: what the group mean averages."""
    correct: bool
    states: tuple[Hashable, ...] = ()
    """[S] the state each step was taken from: the steps before it (equal in two responses = the
    same state, in a deterministic environment); what "gigpo" groups steps by."""


GroupCredit = Callable[[Sequence[Scored], bool], list]
"""(a group's responses, normalize_std) -> per response its [S] step advantages, or None."""


@dataclass(frozen=True)
class CreditRule:
    """One credit rule: `credit` gives every response of a group its step advantages."""

    name: str
    summary: str
    """What it does, for messages and docs."""
    credit: GroupCredit
    reads: frozenset[str] = frozenset()
    """The optional settings it reads (OPTIONAL); setting another one is refused."""
    weights_paths: bool = False
    """Its rows' advantages become ReST-MCTS* path weights (the self-training loss reads them)."""
    keywords: tuple[str, ...] = ()
    """`Credit` settings handed to `credit` by name, after the group and `normalize_std`."""
    keeps_only_correct: bool = False
    """Trains the correct responses only (best-of-N): no path weighting can replace it."""
    warnings: Callable[[Credit, int], list[str]] | None = None
    """(settings, trajectories per tree) -> what the rule cannot use as given, on trees."""
    caution: str = ""
    """A flaw of the rule measured on trees: logged at the start of every fit that credits
    trees by it (`fit_cautions`), the rule kept as chosen."""
    credits_flat: bool = False
    """Credits flat groups too, in place of DAPO's rule (`ROLLOUTS`): its step credit needs no tree."""

    def __call__(self, group: Sequence[Scored], settings: Credit) -> list:
        return self.credit(group, settings.normalize_std, **{name: getattr(settings, name) for name in self.keywords})


def node_credit(group: Sequence[Scored], normalize_std: bool) -> list[list[float]]:
    """Tree-GRPO (DeepSearch Eq. 14-15): A_j = q~(s_j) + overlong - mean final score."""
    return tree_grpo_advantages([r.step_scores for r in group], normalize_std=normalize_std)


def outcome_credit(group: Sequence[Scored], normalize_std: bool) -> list[list[float]]:
    """The paper's "coarse scores" (Table 4): every step gets its final score - mean."""
    return tree_grpo_advantages([[r.final_score] * len(r.step_scores) for r in group], normalize_std=normalize_std)


def subtree_credit(group: Sequence[Scored], normalize_std: bool) -> list[list[float]]:
    """TreeRL: `subtree_advantages` over the group's paths (never divided by a std)."""
    return subtree_advantages([r.node_ids for r in group], [r.final_score for r in group])


def best_of_n_credit(group: Sequence[Scored], normalize_std: bool) -> list[list[float] | None]:
    """Rejection sampling: the correct responses only, +1 on every step."""
    return [[1.0] * len(r.step_scores) if r.correct else None for r in group]


def pass_at_k_credit(group: Sequence[Scored], normalize_std: bool, pass_k: int) -> list[list[float]]:
    """Pass@k training: every step gets its response's `pass_at_k_advantages` value."""
    values = pass_at_k_advantages([r.correct for r in group], pass_k, normalize_std)
    return [[value] * len(r.step_scores) for r, value in zip(group, values)]


def gigpo_credit(group: Sequence[Scored], normalize_std: bool, gigpo_gamma: float,
                 gigpo_step_weight: float) -> list[list[float]]:
    """GiGPO: the episode's advantage plus the step's among the steps from the same state
    (`gigpo_advantages`; states: the steps before it)."""
    return gigpo_advantages([r.states for r in group], [r.final_score for r in group], gamma=gigpo_gamma,
                            step_weight=gigpo_step_weight, normalize_std=normalize_std)


def self_training_credit(group: Sequence[Scored], normalize_std: bool) -> list[list[float]]:
    """Every response, 0 until `weight_paths` gives it its path weight."""
    return [[0.0] * len(r.step_scores) for r in group]


def pass_k_warnings(settings: Credit, n: int) -> list[str]:
    """A pass_k that n trajectories per tree cannot use as given: the rule caps k at n - 1."""
    if settings.pass_k < n:
        return []
    return [f"--data.credit.pass_k={settings.pass_k} is not below --data.search.trajectories_per_tree={n}: each "
            f"tree's pass@k uses k = {n - 1}, the largest at which a solved tree still has failing subsets"]


NODE_CAUTION = (
    "--data.credit.advantage=node (the paper's Tree-GRPO node credit, the default) was measured collapsing on chains: "
    "it gives the step holding the first wrong line a positive advantage in 79-82% of failed trajectories (so does "
    "DeepSearch's own code in any tree whose returned trajectories all fail: q~ - mu = tanh(q) + 1 > 0 on every "
    "step but the last), and all 3 seeds ended below the base policy (held-out pass@1 0.266 +- 0.039 against 0.387); "
    "see docs/results.md, \"Node credit rewards the wrong step\". --data.credit.advantage=subtree (TreeRL's rule, "
    "positive there in 6-18%) did not collapse (0.386 +- 0.008)"
)
"""Why a fit crediting trees by the paper's rule says so (docs/credit.md, "The paper's rule")."""

RULES: Table[CreditRule] = Table("--data.credit.advantage")
"""Every credit rule by name (flywheel.tables); the first is the default."""
RULES.register(CreditRule("node", "Tree-GRPO: each step's q~ + overlong minus the group's mean final score",
                          node_credit, frozenset({"normalize_std", "degenerate_filter"}), caution=NODE_CAUTION))
RULES.register(CreditRule("outcome", "every token gets its final score minus the group mean",
                          outcome_credit, frozenset({"normalize_std", "degenerate_filter"})))
RULES.register(CreditRule("subtree", "TreeRL: a step's mean outcome against its parent and the root, / sqrt(sharing)",
                          subtree_credit, frozenset({"degenerate_filter"})))
RULES.register(CreditRule("best_of_n", "the correct responses only, every token +1",
                          best_of_n_credit, keeps_only_correct=True))
RULES.register(CreditRule("pass_at_k", "Pass@k training: each response's share in the group's pass@k, on every token",
                          pass_at_k_credit, frozenset({"normalize_std", "degenerate_filter", "pass_k"}),
                          keywords=("pass_k",), warnings=pass_k_warnings))
RULES.register(CreditRule("self_training", "ReST-MCTS*: every path weighted by its (estimated) reward",
                          self_training_credit, frozenset({"degenerate_filter", "path_weights"}), weights_paths=True))
RULES.register(CreditRule("gigpo", "GiGPO: the episode's advantage plus the step's among the group's steps from the "
                          "same state", gigpo_credit,
                          frozenset({"normalize_std", "degenerate_filter", "gigpo_gamma", "gigpo_step_weight"}),
                          keywords=("gigpo_gamma", "gigpo_step_weight"), credits_flat=True))

OPTIONAL = ("normalize_std", "degenerate_filter", "path_weights", "pass_k", "gigpo_gamma", "gigpo_step_weight")
"""The settings a rule may ignore; the others (drop_uniform_groups) apply to every rule."""


@dataclass(frozen=True)
class Credit:
    """How trajectories become training rows (docs/credit.md).

    Args:
        advantage: the credit rule, a name in `RULES` (--help lists the registered ones with
            their summaries; docs/credit.md works each through a tree): "node", Tree-GRPO's
            node-level values q~(s_j) minus the group's mean final score, is the paper's default.
            Replay-buffer problems follow it too. Flat rollouts are credited by their kind's own
            rule (`ROLLOUTS`) unless the chosen one weights paths or `credits_flat`.
        normalize_std: divide advantages by the group's std (off: mean-only, paper Table 4);
            read by "node", "outcome" and "pass_at_k" only (refused otherwise).
        drop_uniform_groups: leave out of training every tree (or flat group) whose
            trajectories all ended with the same final score (all wrong, or all right), as
            DAPO's dynamic sampling does (without refilling). Off in the paper and its code;
            with node values such a tree still carries a signal (its early steps score
            above the all-wrong mean), which is what this switch removes.
        degenerate_filter: incorrect responses with garbled text or endless repetition are
            left out of training (as the DeepSearch paper, arXiv 2509.25454, describes; its code
            lacks it); best-of-N trains no incorrect ones anyway.
        path_weights: how "self_training" weights the paths (value model or outcome, per-
            problem softmax temperature, correct-only and threshold filters).
        positive_weight: every positive per-token advantage is multiplied by this, the
            negative ones kept (W-REINFORCE's lambda, Zhu et al. 2025: pushing down wrong
            answers keeps the policy's other answers, pushing up right ones sharpens it onto
            them, so damping the second keeps pass@k); 1 = off, 0 = negative samples only.
            Every advantage rule; not the path weights of "self_training".
        pass_k: the k of "pass_at_k" (read by it only; larger k rewards covering more answers).
            2 by default: on Countdown's validation split it kept Pass@4 with more Pass@1 than 4
            (docs/results.md, "The quickstart must not narrow the policy").
        gigpo_gamma: the discount of "gigpo"'s step returns (read by it only; verl-agent's 0.95).
        gigpo_step_weight: the weight of "gigpo"'s step advantage beside the episode's (read by
            it only; 1 as in the paper). "gigpo" credits flat groups too (`--data.rollout=flat`):
            the steps of a group's episodes that start from the same state (the same actions so
            far) are compared with each other; the paper divides by the stds
            (`--data.credit.normalize_std=true`).
    """

    advantage: str = "node"
    normalize_std: bool = False
    drop_uniform_groups: bool = False
    degenerate_filter: DegenerateFilter = field(default_factory=DegenerateFilter)
    path_weights: PathWeighting = field(default_factory=PathWeighting)
    positive_weight: float = 1.0
    pass_k: int = 2
    gigpo_gamma: float = 0.95
    gigpo_step_weight: float = 1.0

    def __post_init__(self) -> None:
        RULES.check(self.advantage)
        if not (isinstance(self.positive_weight, (int, float)) and 0 <= self.positive_weight < float("inf")):
            raise ValueError(f"--data.credit.positive_weight must be a number >= 0, got {self.positive_weight!r}")
        if isinstance(self.pass_k, bool) or not (isinstance(self.pass_k, int) and self.pass_k >= 1):
            raise ValueError(f"--data.credit.pass_k must be an integer >= 1, got {self.pass_k!r}")
        for name in ("gigpo_gamma", "gigpo_step_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
                raise ValueError(f"--data.credit.{name} must be a number >= 0, got {value!r}")
        if self.gigpo_gamma > 1:
            raise ValueError(f"--data.credit.gigpo_gamma must be at most 1 (a discount), got {self.gigpo_gamma!r}")
        if self.positive_weight != 1 and RULES[self.advantage].weights_paths:
            raise ValueError(f"--data.credit.positive_weight={self.positive_weight} scales advantages, but "
                             f"--data.credit.advantage={self.advantage} trains on path weights: remove one")

    def drops(self, trajectory: SearchedPath) -> bool:
        """Whether a trajectory stays out of training: an incorrect, degenerate one."""
        return not trajectory.verdict.correct and self.degenerate_filter(trajectory.response_text, trajectory.response_ids) is not None

    def changed(self) -> list[str]:
        """The OPTIONAL settings given a value other than their default."""
        defaults = {f.name: f.default_factory() if callable(f.default_factory) else f.default for f in fields(self)}
        return [name for name in OPTIONAL if getattr(self, name) != defaults[name]]


@dataclass(frozen=True)
class RolloutKind:
    """One `--data.rollout` kind.

    Attributes:
        name: its flag value.
        searches: its groups are search trees (the hard set and the replay buffer observe them).
        credit: the credit rule its groups get whatever the chosen one; None: the chosen rule
            (as trees are; a rule that weights paths, or that `credits_flat`, credits flat
            groups too).
    """

    name: str
    searches: bool
    credit: str | None
    summary: str = ""
    """One line for --help and messages."""


ROLLOUTS: Table[RolloutKind] = Table("--data.rollout")
"""Every `--data.rollout` kind by name (flywheel.tables); the first is the default; the data
module's choices read this table, and callers ask a kind's properties, never its name."""
ROLLOUTS.register(RolloutKind("search", searches=True, credit=None,
                              summary="tree search, credited by --data.credit.advantage"))
ROLLOUTS.register(RolloutKind("flat", searches=False, credit="outcome",
                              summary="independent samples per problem, DAPO's credit (reward - group mean)"))
ROLLOUTS.register(RolloutKind("best_of_n", searches=False, credit="best_of_n",
                              summary="independent samples per problem, the correct ones trained on"))


def group_rule(settings: Credit, rollout: str = "search") -> CreditRule:
    """The rule that credits each group under `--data.rollout` (`ROLLOUTS`): the chosen one for
    trees and for one that weights paths; the kind's own rule otherwise."""
    chosen, own = RULES[settings.advantage], ROLLOUTS[rollout].credit
    if own is None or ((chosen.weights_paths or chosen.credits_flat) and not RULES[own].keeps_only_correct):
        return chosen
    return RULES[own]


def check(settings: Credit, rollout: str = "search", trajectories_per_tree: int | None = None) -> list[str]:
    """Refuse (ValueError naming the flag) a setting the credit of `rollout` ignores; return
    the warnings (a chosen rule that the rollout's groups do not use; a `pass_k` the trees of
    `trajectories_per_tree` cannot use as given, the rule capping k at n - 1)."""
    chosen, rule = RULES[settings.advantage], group_rule(settings, rollout)
    where = f"--data.credit.advantage={chosen.name}" if ROLLOUTS[rollout].searches else f"--data.rollout={rollout}"
    reads = rule.reads | ({"path_weights"} if chosen.weights_paths else set())
    for name in settings.changed():
        if name not in reads:
            value = getattr(settings, name)
            given = f"={str(value).lower()}" if isinstance(value, bool) else " is set"
            users = ", ".join(repr(r.name) for r in RULES.values() if name in r.reads)
            raise ValueError(f"--data.credit.{name}{given} but {where} credits by the {rule.name!r} rule, which "
                             f"ignores it: remove it (the rules that read it: {users})")
    default = next(iter(RULES))
    if rule is not chosen and not chosen.weights_paths and chosen.name != default:
        return [f"--data.credit.advantage={chosen.name} is not used with --data.rollout={rollout}: its groups are credited "
                f"by the {rule.name!r} rule ({rule.summary}); remove --data.credit.advantage or use --data.rollout=search"]
    if rule.warnings is not None and ROLLOUTS[rollout].searches and trajectories_per_tree is not None:
        return rule.warnings(settings, trajectories_per_tree)
    return []


def fit_cautions(settings: Credit, rollout: str = "search") -> list[str]:
    """The measured flaws (`CreditRule.caution`) of the rule that credits `rollout`'s groups,
    where those groups are trees (a flat rollout's groups are credited by its kind's own rule)."""
    rule = group_rule(settings, rollout)
    return [rule.caution] if rule.caution and ROLLOUTS[rollout].searches else []


def check_loss(advantage: str, loss_type: str) -> None:
    """A rule that weights paths needs the self-training loss, and only it does."""
    if RULES[advantage].weights_paths != LOSSES[loss_type].weights_paths:
        raise ValueError(
            f"--data.credit.advantage={advantage!r} and --model.objective.loss_type={loss_type!r} do not "
            "go together: the self-training loss needs path weights, not advantages, and the other losses need "
            "advantages; set both to self_training (ReST-MCTS*, conf/rest_mcts.yaml) or neither"
        )


@dataclass(frozen=True)
class Group:
    """One problem's responses: a tree or flat group (`result`), or with `cached` solutions a
    mixed rollout of `n` (`result` then holds its direct samples, None when none were needed)."""

    problem_id: str
    prompt_ids: tuple[int, ...]
    result: SearchedGroup | None
    cached: tuple[CachedSolution, ...] = ()
    n: int = 0

    @classmethod
    def of(cls, result: SearchedGroup) -> Group:
        return cls(result.problem_id, result.prompt_ids, result)


@dataclass(frozen=True)
class Credited:
    """An epoch's training rows per group (in group order; [] for a group left out)."""

    rows: list[list[TrainingRow]]
    uniform_groups: int
    """Groups left out by `drop_uniform_groups`."""


def credit_groups(groups: Sequence[Group], settings: Credit, rollout: str = "search",
                  value_fn: ValueFn | None = None) -> Credited:
    """Every group's training rows under `settings` (the one entry of the data module).

    The rule of `group_rule` credits each group; a trajectory `settings.drops` leaves out
    still counts in its group's baseline, which describes the search as it happened. A rule
    that weights paths then gives every row its path weight (`weight_paths`; `value_fn`
    scores the paths with source "value"). Last, `drop_uniform_groups` empties the groups
    whose responses all ended with the same final score.
    """
    rule = group_rule(settings, rollout)
    rows = [_mixed_rows(g, rule, settings) if g.cached else _tree_rows(g, rule, settings) for g in groups]
    if RULES[settings.advantage].weights_paths:
        rows = weight_paths(rows, settings.path_weights, value_fn)
    elif settings.positive_weight != 1:
        rows = [[damp_positive(row, settings.positive_weight) for row in group_rows] for group_rows in rows]
    uniform = 0
    if settings.drop_uniform_groups:
        for i, (group, group_rows) in enumerate(zip(groups, rows)):
            if group.cached:  # cached + direct samples: every row is kept
                finals = {row.reward for row in group_rows}
            else:  # every trajectory of the search, the degenerate ones included
                finals = {t.final_score for t in group.result.trajectories}
            if len(finals) <= 1 and group_rows:
                uniform += 1
                rows[i] = []
    return Credited(rows, uniform)


def damp_positive(row: TrainingRow, weight: float) -> TrainingRow:
    """`row` with its positive per-token advantages multiplied by `weight` (`positive_weight`).

    >>> damp_positive(TrainingRow("p", 0, (1,), (2, 3, 4), (0.5, -0.5, 0.0), (0.0,) * 3, (0, 0, 1), 1.0), 0.1).advantages
    (0.05, -0.5, 0.0)
    """
    return replace(row, advantages=tuple(a * weight if a > 0 else a for a in row.advantages))


def step_states(trajectory: SearchedPath) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """The state each step of `trajectory` was taken from: the token ids of the steps before it."""
    before = tuple(step.token_ids for step in trajectory.steps)
    return tuple(before[:j] for j in range(len(before)))


def _tree_rows(group: Group, rule: CreditRule, settings: Credit) -> list[TrainingRow]:
    trajectories = group.result.trajectories
    if not trajectories:
        return []
    scored = [Scored(tuple(s.q_soft + t.overlong_penalty for s in t.steps), tuple(s.node_id for s in t.steps),
                     t.final_score, t.verdict.correct, step_states(t)) for t in trajectories]
    rows = []
    for trajectory, advantages in zip(trajectories, rule(scored, settings)):
        if advantages is None or settings.drops(trajectory):
            continue
        lengths = trajectory.step_lengths
        rows.append(TrainingRow(
            problem_id=group.problem_id, group=0, prompt_ids=group.prompt_ids, response_ids=trajectory.response_ids,
            advantages=tuple(per_token(advantages, lengths)), behaviour_logprobs=trajectory.response_logprobs,
            step_ids=tuple(j for j, n in enumerate(lengths) for _ in range(n)), reward=trajectory.reward,
            correct=trajectory.verdict.correct, loss_mask=trajectory.loss_mask,
        ))
    return rows


def _mixed_rows(group: Group, rule: CreditRule, settings: Credit) -> list[TrainingRow]:
    """A replay-buffer problem's mixed rollout: one step per response (a cached one correct, +1)."""
    direct = group.result.trajectories if group.result is not None else ()
    items: list[SearchedPath | CachedSolution] = mixed_rollout(list(group.cached), list(direct), group.n)
    scores = [1.0 if isinstance(item, CachedSolution) else item.final_score for item in items]
    correct = [isinstance(item, CachedSolution) or item.verdict.correct for item in items]
    scored = [Scored((score,), (i,), score, ok, ((),)) for i, (score, ok) in enumerate(zip(scores, correct))]
    rows = []
    for item, score, ok, advantages in zip(items, scores, correct, rule(scored, settings)):
        cached = isinstance(item, CachedSolution)
        if advantages is None or (not cached and settings.drops(item)):
            continue
        length = len(item.response_ids)
        rows.append(TrainingRow(
            problem_id=group.problem_id, group=0, prompt_ids=group.prompt_ids, response_ids=tuple(item.response_ids),
            advantages=(advantages[0],) * length, behaviour_logprobs=(float("nan"),) * length if cached else item.response_logprobs,
            step_ids=(0,) * length, reward=score, correct=ok, loss_mask=tuple(item.loss_mask),
        ))
    return rows

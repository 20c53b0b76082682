"""SearchConfig: every knob of the DeepSearch tree search, with the paper's defaults.

Equation and section numbers refer to shared/specs/deepsearch.md (arXiv 2509.25454).
Where the paper and the official code differ, the paper's rule is the default and the
code's rule sits behind a switch.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

from flywheel.finite import check_finite_fields
from flywheel.search.rule_table import EXPANSION, FORK, SELECTION

DepthBonus = Literal["sqrt", "linear", "log"]
BackupRule = Literal["constrained", "vanilla"]
GammaRule = Literal["paper", "code"]
TerminalChoice = Literal["mean_nll", "entropy", "random"]
UctSampling = Literal["argmax", "softmax"]
"""Each choice is written once: a value-only choice in its Literal, which SearchConfig and the
command line check; a rule (`selection`, `fork_rule`, `expansion`) in its rule table
(flywheel.search.rule_table), where a test or a plugin may register one and the command line
then accepts it."""

MAX_CONCURRENT_TREES = 64
"""Trees searched at once (= requests per generator call) unless set: the default of
`--data.batching.max_concurrent_trees` and of the SearchDriver."""

MAX_EXPANSION_WIDTH = 1024
"""The most children one expansion may sample: `expansion_width=10000` produced no token in
150 s (issue 37); no recipe comes near it (the paper: 8)."""


@dataclass(frozen=True)
class RolloutSettings:
    """The settings of rollout expansion (`--data.search.expansion=rollout`, flywheel.search.rollout);
    a fork width or a children cap is refused with step expansion.

    Args:
        fork_width: T, continuations sampled per fork below the root (TreeRL's script: 2);
            0 = expansion_width. The root's expansions sample expansion_width.
        max_children: a node with this many children is no longer forked from (0 = no cap).
        entropy_forks_per_chain: fork_rule "entropy": N, the tokens of each new rollout (its
            highest per-token entropies, the first token excepted) before which it is cut into
            fork points (TreeRL's released script: 2).
    """

    fork_width: int = 0
    max_children: int = 0
    entropy_forks_per_chain: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.fork_width <= MAX_EXPANSION_WIDTH:
            raise ValueError(f"--data.search.rollout.fork_width must be in [0, {MAX_EXPANSION_WIDTH}] (0 = "
                             f"expansion_width), got {self.fork_width}; set it to 0 or a width")
        if self.max_children < 0:
            raise ValueError(f"--data.search.rollout.max_children must be >= 0 (0 = off), got {self.max_children}; "
                             "set it to 0 or more")


@dataclass(frozen=True)
class AgentSettings:
    """The settings of a selection rule with `agents` (puct_agents: the Countdown MCTS of
    at2005/llm-mcts, flywheel.search.agents), refused with any other rule.

    Args:
        count: workers descending the tree per round (the reference: 16); each makes at most one
            expansion request per round, all of them in the driver's one generator call.
        iterations: M, rounds of selection per tree (the reference: 100 per worker);
            max_expansions_per_tree still caps the expansions.
        virtual_loss: a pending selection counts on every node of its path as a visit with value
            -virtual_loss until its expansion returns, so the other agents of the round spread out
            (0 = a visit with value 0).
    """

    count: int = 1
    iterations: int = 100
    virtual_loss: float = 1.0

    def __post_init__(self) -> None:
        check_finite_fields(self, "data.search.agents")
        for name in ("count", "iterations"):
            if getattr(self, name) < 1:
                raise ValueError(f"--data.search.agents.{name} must be >= 1, got {getattr(self, name)}; set it to 1 or more")
        if self.virtual_loss < 0:
            raise ValueError(f"--data.search.agents.virtual_loss must be >= 0, got {self.virtual_loss}; set it to 1.0")


@dataclass(frozen=True)
class SearchAblations:
    """Switches that turn a rule of the search into one of the paper's ablations or the official
    code's variant. No recipe, tool or result in docs/ sets them; they are kept so each ablation
    can be run again, and grouped (`--data.search.ablations.*`) so the search's own settings read
    as the algorithm. The defaults are the paper's rules.

    Args:
        uct_sampling: "argmax" (paper) or "softmax" (code option: sample a child from the
            softmax of the UCT scores).
        depth_bonus: D(d) of the frontier score: "sqrt" = sqrt(d / d_T) (paper), "linear" = d,
            "log" = log(d + 1).
        backup_all_terminals: back up every new terminal of an expansion, best first, instead
            of only one (keeps correct siblings that the official code drops, §9).
        train_all_terminals: a finished tree hands every distinct graded terminal to training,
            not only the K backed up (the backed-up ones first, then the others by creation);
            rollout mode always does.
    """

    uct_sampling: UctSampling = "argmax"
    depth_bonus: DepthBonus = "sqrt"
    backup_all_terminals: bool = False
    train_all_terminals: bool = False

    def __post_init__(self) -> None:
        check_literal_fields(self, "data.search.ablations")


def check_literal_fields(settings: Any, section: str) -> None:
    """Every Literal-typed field of `settings` holds one of its annotation's values; else the one-line
    refusal naming `--{section}.{field}` and the choices."""
    for name, allowed in literal_choices(type(settings)).items():
        if getattr(settings, name) not in allowed:
            raise ValueError(f"--{section}.{name} must be one of {allowed}, got {getattr(settings, name)!r}; "
                             "pick one of those")


@functools.cache
def literal_choices(settings_class: type) -> dict[str, tuple[Any, ...]]:
    """The allowed values of every Literal-typed field of a settings class, read once from its
    annotations (every construction of the class checks against them)."""
    return {name: get_args(hint) for name, hint in get_type_hints(settings_class).items() if get_origin(hint) is Literal}


@dataclass(frozen=True)
class SearchConfig:
    """How one DeepSearch tree is grown, backed up and read out.

    Args:
        expansion_width: n, children sampled per expansion; all are added (§1); at most 1024.
        max_depth: d_T, a node at this depth is terminal (§1). Root (the prompt) is depth 0.
        trajectories_per_tree: K, a tree stops once K terminal trajectories were backed up (§1).
        max_expansions_per_tree: safety cap on expansions (generator requests) per tree; a tree
            that hits it finishes with the trajectories it has (status "expansion_cap").
        selection: step expansion: the rule that picks the node to expand next (§5), a name in
            `SELECTION` (flywheel.search.rule_table; --help lists the registered ones). The
            paper's "frontier" dives by local UCT while expansions produce no terminal and picks
            by the global frontier score after one does. A rule with `agents` (the Countdown MCTS
            of at2005/llm-mcts, flywheel.search.agents) has `agents.count` workers descend one shared
            tree by pUCT each round with virtual loss, a new node's Q starting at its value (a
            value model's V(s), a terminal's reward); after `agents.iterations` rounds the
            most-visited path to a terminal is the tree's ONE training trajectory
            (trajectories_per_tree is not used), to train with the value baseline
            (--model.objective.value_baseline=true, conf/countdown_mcts.yaml).
        uct_lambda: lambda of local UCT, Q(c) + lambda * sqrt(ln N(parent) / N(c)) (§5).
        frontier_lambda1: weight of tanh(Q(parent)) in the frontier score (§5).
        frontier_lambda2: weight of the node's uncertainty H(s) (mean NLL of its own step);
            0 = off, as in the paper's final configuration.
        frontier_lambda3: weight of the depth bonus D(depth) (§5).
        puct_c: c in Q + c * P * sqrt(N(parent)) / (1 + N) for selection "puct".
        prm_weight: weight of a value model's V(s) in [0, 1] (ReST-MCTS*, when the driver has
            one): added to the frontier score F(s), to local UCT and to pUCT of every scored
            node. 0 = off (DeepSearch alone).
        backup: "constrained" (Eq. 5) or "vanilla" (Table 4 row 1 ablation).
        gamma_min: floor of the time-decay weight gamma(i, l) (Eq. 3).
        gamma_rule: "paper" = max(i / l, gamma_min); "code" = max((i + 1) / (l + 1), gamma_min).
        terminal_choice: which new terminal of an expansion is backed up, within the best kind
            (correct > incorrect > incomplete): "mean_nll" = lowest mean negative log-prob of
            the whole trajectory (paper A.2 and code), "entropy" = lowest mean Shannon entropy
            (needs a generator that returns entropies), "random" (Table 5 ablation).
        entropy_top_k: top log-probs the generator uses for entropies (terminal_choice "entropy").
        merge_duplicate_steps: keep one child per distinct step among the n samples of an
            expansion (the first; the paper adds all n, §1). With 256-token chunks siblings never
            coincide, so this changes nothing there; with short steps (a Countdown line) the n
            samples often repeat one line, and identical siblings would spend the K trajectories
            of a tree on copies of one path.
        incomplete_reward: terminal reward of an incomplete trajectory (max depth, no EOS, no
            parsable answer), Eq. 4.
        overlong_penalty: add the DAPO overlong penalty to the trajectory outputs (§2).
        overlong_max_tokens: L_max, the response budget of the overlong penalty.
        overlong_buffer_tokens: L_buf, the penalty ramps from 0 at L_max - L_buf to -1 at L_max.
        soft_clip_eps: eps_q of the soft clip q~ = tanh(q / eps_q) * q_max (§6).
        soft_clip_qmax: q_max of the soft clip.
        temperature: sampling temperature of expansions (§1: 1.0).
        top_p: nucleus sampling of expansions (§1: 1.0).
        seed: root of every random choice and every per-request generator seed.
        expansion: how an expansion grows a tree, a name in `EXPANSION` (--help lists them).
            "step" samples n single steps of a leaf and adds them all (§1, the paper); a mode with
            `whole_rollouts` ("rollout", flywheel.search.rollout) samples n whole continuations
            (to EOS or max depth) of any non-terminal node, cut into steps afterwards, so every
            generated token ends in a graded terminal and later rollouts fork from steps of the
            trajectories found so far: every new terminal is backed up and trained on, the tree
            stops after K rollouts (a repeat of a trajectory counts, so K bounds the tree's
            cost), and the node to fork from is chosen by `fork_rule` (selection, local UCT and
            the frontier are step-mode rules).
        fork_rule: rollout mode: where the next rollouts start, a name in `FORK` (--help lists
            them): "uct" = argmax of Q(s) + uct_lambda * sqrt(ln N(root) / N(s)) (+ prm_weight *
            V(s)) over the non-terminal nodes; "root" forks at the root only (flat sampling in
            rounds of n with the tree's stopping rules, the control that tells what the forks
            buy); a rule with `cut` (TreeRL's EPTree forks, "entropy", arXiv 2506.11902) also
            cuts every new rollout just before its `rollout.entropy_forks_per_chain` highest-entropy
            tokens and forks from the untried cut with the highest entropy. A mid-step cut is no
            reasoning step: it does not count towards max_depth (docs/search.md, "Entropy forks").
        distinct_children: the n children of one expansion start with n different tokens: their
            first token is drawn without replacement (Gumbel-top-k over the policy's first-token
            distribution), the rest as usual. The recorded log-probs stay the policy's, so the
            trainer's ratio ignores that the n first tokens were not drawn independently (a bias
            towards unlikely first tokens; docs/search.md, "Distinct children"). Needs a generator
            that can (the in-process HFBackend; the vLLM sidecar refuses it).
        stop_when_solved: a tree that has found a correct answer stops as soon as it holds this
            many trajectories (rollout mode: rollouts) (0 = off: every tree runs to K). With K above it, the expansions a
            solved tree would have spent go to trees that have not found an answer yet.
        rollout: the settings of rollout expansion: fork widths, the cap on a node's children, the
            entropy fork's cuts (`--data.search.rollout.*`, RolloutSettings).
        agents: the settings of a selection rule with `agents` (puct_agents): how many agents,
            their rounds, their virtual loss (`--data.search.agents.*`, AgentSettings).
        ablations: the switches of the paper's ablations and the official code's variants that
            no recipe, tool or result in docs/ uses (`--data.search.ablations.*`, SearchAblations).
    """

    expansion_width: int = 8
    max_depth: int = 64
    trajectories_per_tree: int = 8
    max_expansions_per_tree: int = 1024
    selection: str = "frontier"
    uct_lambda: float = 2.0
    frontier_lambda1: float = 0.4
    frontier_lambda2: float = 0.0
    frontier_lambda3: float = 0.01
    puct_c: float = 0.5
    prm_weight: float = 0.0
    backup: BackupRule = "constrained"
    gamma_min: float = 0.1
    gamma_rule: GammaRule = "paper"
    terminal_choice: TerminalChoice = "mean_nll"
    entropy_top_k: int = 20
    merge_duplicate_steps: bool = False
    incomplete_reward: float = -1.0
    overlong_penalty: bool = True
    overlong_max_tokens: int = 16384
    overlong_buffer_tokens: int = 4096
    soft_clip_eps: float = 1.0
    soft_clip_qmax: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    expansion: str = "step"
    fork_rule: str = "uct"
    distinct_children: bool = False
    stop_when_solved: int = 0
    rollout: RolloutSettings = RolloutSettings()
    agents: AgentSettings = AgentSettings()
    ablations: SearchAblations = SearchAblations()

    def __post_init__(self) -> None:
        check_finite_fields(self, "data.search")
        self._check_choices()
        self._check_tree_shape()
        self._check_scores()
        self._check_sampling()
        self._check_rule_combinations()

    def _check_choices(self) -> None:
        """Every named choice is one its table (or its Literal) holds."""
        check_literal_fields(self, "data.search")
        for table, name in ((SELECTION, self.selection), (FORK, self.fork_rule), (EXPANSION, self.expansion)):
            table.check(name)

    def _check_tree_shape(self) -> None:
        """Widths, depths and counts of a tree, its agents and its stopping rules."""
        for name in ("expansion_width", "max_depth", "trajectories_per_tree", "max_expansions_per_tree"):
            if getattr(self, name) < 1:
                raise ValueError(f"--data.search.{name} must be >= 1, got {getattr(self, name)}; set it to 1 or more")
        if self.expansion_width > MAX_EXPANSION_WIDTH:
            raise ValueError(
                f"--data.search.expansion_width={self.expansion_width}: at most {MAX_EXPANSION_WIDTH} children per "
                "expansion (the paper samples 8); every tree in flight expands in each generator call, so the "
                "first call alone would sample that many sequences per tree before any progress. Set it to "
                f"{MAX_EXPANSION_WIDTH} or less"
            )
        if self.stop_when_solved < 0:
            raise ValueError(f"--data.search.stop_when_solved must be >= 0 (0 = off), got {self.stop_when_solved}; "
                             "set it to 0 or more")

    def _check_scores(self) -> None:
        """The backup's and the selection scores' constants, and the overlong penalty."""
        if not 0 < self.gamma_min <= 1:
            raise ValueError(
                f"--data.search.gamma_min must be in (0, 1], got {self.gamma_min}: a zero weight would let a node "
                "on a correct path keep q = 0 (Eq. 3); set --data.search.gamma_min=0.1"
            )
        for name in ("uct_lambda", "puct_c", "frontier_lambda1", "frontier_lambda2", "frontier_lambda3", "prm_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"--data.search.{name} must be >= 0, got {getattr(self, name)}; set it to 0 (off) or more")
        if self.terminal_choice == "entropy" and self.entropy_top_k < 1:
            raise ValueError(
                "--data.search.terminal_choice='entropy' needs --data.search.entropy_top_k >= 1 (the generator computes "
                f"entropies from that many top log-probs), got {self.entropy_top_k}"
            )
        if self.overlong_penalty and not 0 < self.overlong_buffer_tokens <= self.overlong_max_tokens:
            raise ValueError(
                f"--data.search.overlong_buffer_tokens must be in (0, --data.search.overlong_max_tokens={self.overlong_max_tokens}], "
                f"got {self.overlong_buffer_tokens}; or turn the penalty off with --data.search.overlong_penalty=false"
            )
        if self.soft_clip_eps <= 0 or self.soft_clip_qmax <= 0:
            raise ValueError(
                f"--data.search.soft_clip_eps and --data.search.soft_clip_qmax must be > 0, got {self.soft_clip_eps}, "
                f"{self.soft_clip_qmax}; set both > 0 (defaults 1.0 and 1.0)"
            )

    def _check_sampling(self) -> None:
        """The step sampler's temperature and nucleus."""
        if self.temperature < 0:
            raise ValueError(f"--data.search.temperature must be >= 0 (0 = greedy), got {self.temperature}; set it to 0 or more")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--data.search.top_p must be in (0, 1], got {self.top_p}; set 1.0 to turn nucleus sampling off")

    def _check_rule_combinations(self) -> None:
        """What the chosen rules need of the other settings (their capabilities, never their
        names); the names were checked by `_check_choices`."""
        selection, fork, expansion = SELECTION[self.selection], FORK[self.fork_rule], EXPANSION[self.expansion]
        if selection.expansion is not None and self.expansion != selection.expansion:
            raise ValueError(f"search.selection={self.selection!r} grows the tree by {selection.expansion} expansion; it "
                             f"cannot be combined with --data.search.expansion={self.expansion} (set "
                             f"--data.search.expansion={selection.expansion})")
        if fork.cut is not None and self.rollout.entropy_forks_per_chain < 1 or fork.needs_entropy and self.entropy_top_k < 1:
            raise ValueError(
                f"--data.search.fork_rule={self.fork_rule!r} cuts every rollout at its highest-entropy tokens: it needs "
                f"--data.search.rollout.entropy_forks_per_chain >= 1 (got {self.rollout.entropy_forks_per_chain}) and "
                f"--data.search.entropy_top_k >= 1 (got {self.entropy_top_k}); set both to 1 or more"
            )
        changed = [name for name in ("fork_width", "max_children")
                   if getattr(self.rollout, name) != getattr(RolloutSettings(), name)]
        if changed and not expansion.whole_rollouts:
            raise ValueError(f"--data.search.rollout.{changed[0]}={getattr(self.rollout, changed[0])} is a setting of rollout "
                             f"forks; it needs --data.search.expansion=rollout (or leave it at its default)")
        if self.agents != AgentSettings() and not selection.agents:
            raise ValueError(f"--data.search.agents.* set, but --data.search.selection={self.selection} has no agents: "
                             "use a selection rule with agents (puct_agents) or leave them at their defaults")

    @property
    def whole_rollouts(self) -> bool:
        """Does an expansion sample whole continuations (rollout expansion: fork rules, fork
        widths and first rollouts apply) rather than single steps?"""
        return EXPANSION[self.expansion].whole_rollouts

    @property
    def needs_entropy(self) -> bool:
        """Does a rule read per-token entropies from the generator (terminal_choice "entropy",
        or a fork rule that needs them under rollout expansion)?"""
        return self.terminal_choice == "entropy" or FORK[self.fork_rule].needs_entropy

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

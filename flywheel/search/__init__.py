"""DeepSearch tree search (deepsearch.md §1-5): pure Python over token ids, driven through
the Generator seam. No torch, no Lightning, no I/O.

    results = run_search(problems, generator, SearchConfig(), step=task.step, decode=decode,
                         max_concurrent_trees=16)
    for tree in results:
        for trajectory in tree.trajectories:   # K per complete tree
            ... trajectory.steps[j].q_soft, trajectory.reward, trajectory.overlong_penalty

Files: config (SearchConfig), tree (flat node storage), backup (Eq. 3, 5), selection
(local UCT, frontier score, vanilla UCT, pUCT), terminal (Eq. 2, 4), values (soft clip,
overlong), expansion (what every expansion rule shares: seeds, sampling, grading), live (one
tree between rounds, grown by an expansion mode), step_expansion (the paper's mode: n steps of
a node), rollout (rollout expansion and its fork rules), agents and live_agents (several agents
per tree, pUCT with virtual loss), episode_rollouts (the rollout tree over an environment's
turns), rule_table (every rule family's table, by config name: a new rule is one registration),
rules (the built-in rules, registered on import), lockstep (the batching loop and DriverStats),
driver (the batched multi-tree driver), flat (baseline rollouts), outputs (records and the JSON
dump). The fake generators of the tests and benchmarks are tests/scripted.py.
"""

import flywheel.search.rules  # noqa: F401  (registers the built-in rules in the rule tables)
from flywheel.search.config import SearchConfig
from flywheel.search.driver import (
    DriverStats,
    SearchDriver,
    SearchProblem,
    SearchProgress,
    derive_seed,
    run_search,
)
from flywheel.search.flat import flat_rollouts
from flywheel.search.outputs import StepRecord, Trajectory, TreeResult, TreeStats, tree_to_json
from flywheel.search.tree import SearchTree

__all__ = [
    "DriverStats",
    "SearchConfig",
    "SearchDriver",
    "SearchProblem",
    "SearchProgress",
    "SearchTree",
    "StepRecord",
    "Trajectory",
    "TreeResult",
    "TreeStats",
    "derive_seed",
    "flat_rollouts",
    "run_search",
    "tree_to_json",
]

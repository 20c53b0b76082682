"""Tree-GRPO / DAPO objectives as pure tensor functions (DeepSearch §3.3, Eq. 13-15; DAPO).

Data flow: the search gives each step its score q~(s_j) (soft-clipped, a terminal keeps its
reward) and each trajectory its overlong penalty (`flywheel.search.values`); the objectives
turn those scores into advantages and losses: `tree_grpo_advantages` subtracts the tree's
mean final score, `per_token` spreads the step advantages over tokens, and the module
computes `token_logprobs` and `policy_loss`. ReST-MCTS*'s self-training instead weights each
path of a tree by its (estimated) reward (`path_weights`) and minimises the weighted negative
log-likelihood plus a KL to a frozen reference (`self_training_loss`). `credit` holds every
credit rule (`--data.credit.advantage`): its name, the settings it reads, its computation.
"""

from flywheel.objectives.advantages import (
    group_baseline,
    per_token,
    subtree_advantages,
    tree_grpo_advantages,
)
from flywheel.objectives.aggregation import aggregate, masked_mean
from flywheel.objectives.config import Aggregation, KLEstimator, ObjectiveConfig
from flywheel.objectives.kl import kl_penalty, kl_per_token
from flywheel.logprobs import token_logprobs
from flywheel.objectives.policy_loss import policy_loss, truncated_importance_weight
from flywheel.objectives.self_training import path_weights, self_training_loss

__all__ = [
    "Aggregation",
    "KLEstimator",
    "ObjectiveConfig",
    "aggregate",
    "group_baseline",
    "kl_penalty",
    "kl_per_token",
    "masked_mean",
    "path_weights",
    "per_token",
    "policy_loss",
    "self_training_loss",
    "subtree_advantages",
    "token_logprobs",
    "tree_grpo_advantages",
    "truncated_importance_weight",
]

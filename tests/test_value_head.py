"""The value head of the seed's Countdown MCTS (rest-mcts-and-countdown.md §B): the value loss
(V(s_t) - r)^2 at step starts and the baseline A_t = r - sg(V_old(s_t)), worked by hand; the
head inside the LightningModule (its loss, its optimizer, its checkpoint keys) and its values
of search prefixes."""

import doctest
import math

import pytest
import torch

import flywheel.objectives.value as value_mod
from data_modules.examples import collate
from flywheel.objectives.credit import TrainingRow
from flywheel.module import OptimizerConfig, PolicyModule
from flywheel.objectives import ObjectiveConfig
from flywheel.objectives.value import step_start_values, step_starts, value_baseline_advantages, value_loss
from flywheel.policies.tiny import build_char_tokenizer, build_tiny_llama


def test_docstring_examples():
    result = doctest.testmod(value_mod)
    assert result.attempted > 0 and result.failed == 0


# Two rows, target positions 0..5. Row 0: prompt predicts nothing at 0, steps 0 (pos 1-2) and 1
# (pos 3-5). Row 1: one step (pos 2-3), padding after.
STEP_IDS = torch.tensor([[-1, 0, 0, 1, 1, 1], [-1, -1, 0, 0, -1, -1]])
MASK = STEP_IDS >= 0
VALUES = torch.tensor([[9.0, 0.2, 0.7, -0.4, 0.1, 0.3], [9.0, 9.0, 0.5, -0.5, 9.0, 9.0]])
REWARDS = torch.tensor([1.0, -0.9])


def test_step_starts_and_their_values():
    assert step_starts(STEP_IDS, MASK).tolist() == [
        [False, True, False, True, False, False],
        [False, False, True, False, False, False],
    ]
    # Each token carries V of the position its step opened at: 0.2, 0.2, -0.4 x 3; 0.5 x 2.
    expected = torch.tensor([[0.0, 0.2, 0.2, -0.4, -0.4, -0.4], [0.0, 0.0, 0.5, 0.5, 0.0, 0.0]])
    assert torch.allclose(step_start_values(VALUES, STEP_IDS, MASK), expected)


def test_baseline_advantages_and_value_loss_by_hand():
    values = VALUES.clone().requires_grad_(True)
    adv = value_baseline_advantages(values, REWARDS, STEP_IDS, MASK)
    # Row 0: 1 - 0.2 = 0.8 on step 0, 1 - (-0.4) = 1.4 on step 1; row 1: -0.9 - 0.5 = -1.4.
    assert torch.allclose(adv, torch.tensor([[0, 0.8, 0.8, 1.4, 1.4, 1.4], [0, 0, -1.4, -1.4, 0, 0]]))
    assert not adv.requires_grad  # sg(V_old)
    # Three step starts: (0.2 - 1)^2 = 0.64, (-0.4 - 1)^2 = 1.96, (0.5 + 0.9)^2 = 1.96 -> mean 1.52.
    loss = value_loss(values, REWARDS, STEP_IDS, MASK)
    assert loss.item() == pytest.approx(1.52)
    loss.backward()
    # d/dV of the mean: 2 (V - r) / 3 at the starts only: -0.5333, -0.9333, 0.9333.
    assert torch.allclose(values.grad, torch.tensor([[0, -1.6 / 3, 0, -2.8 / 3, 0, 0], [0, 0, 2.8 / 3, 0, 0, 0]]))
    empty = value_loss(values, REWARDS, STEP_IDS, torch.zeros_like(MASK))
    assert empty.item() == 0.0 and empty.requires_grad


def test_value_baseline_needs_the_value_head():
    with pytest.raises(ValueError, match="--model.objective.value_coef"):
        ObjectiveConfig(value_baseline=True)
    with pytest.raises(ValueError, match="--model.objective.value_coef"):
        ObjectiveConfig(value_coef=-1.0)


def module_with(tmp_path, **objective) -> PolicyModule:
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return PolicyModule(policy=str(tmp_path), objective=ObjectiveConfig(**objective),
                          optimizer=OptimizerConfig(lr=1e-2, weight_decay=0.0, warmup_steps=0))


def rows(tok, rewards):
    """Equal-length one-step responses with the given rewards and (unused) advantages 0."""
    p = tuple(tok("1 2|3\n")["input_ids"])
    out = []
    for i, reward in enumerate(rewards):
        r = tuple(tok("1+2=3\n" if i % 2 == 0 else "2+1=3\n", add_special_tokens=False)["input_ids"])
        out.append(TrainingRow("p", 0, p, r, (0.0,) * len(r), (0.0,) * len(r), (0,) * len(r), reward))
    return out


def test_module_loss_is_policy_term_with_value_baseline_plus_value_loss(tmp_path):
    assert module_with(tmp_path / "none").value_head is None
    module = module_with(tmp_path / "v", value_coef=0.5, value_baseline=True)
    assert "value_head.out.bias" in module.state_dict()  # saved in every checkpoint with the policy
    optimizer = module.configure_optimizers()["optimizer"]
    assert any(p is module.value_head.out.bias for g in optimizer.param_groups for p in g["params"])
    with torch.no_grad():
        module.value_head.out.bias.fill_(0.5)  # out.weight is 0: V = tanh(0.5) everywhere
    c = math.tanh(0.5)
    tok = module.tokenizer
    # pi_old is the policy now (on-policy): ratio 1, the PPO term is -A. The value head's rows are never packed.
    batch = collate(rows(tok, [1.0, -1.0]), tok.pad_token_id, pack=module.pack_batch, score=module.score_batch)
    assert batch.packed is None
    # Token mean of -A over equally long rows: -((1 - c) + (-1 - c)) / 2 = c; value loss at the two
    # step starts: ((c - 1)^2 + (c + 1)^2) / 2 = 1 + c^2, weighted 0.5.
    loss = module.training_step(batch, 0)
    assert loss.item() == pytest.approx(c + 0.5 * (1 + c * c), rel=1e-5)
    loss.backward()
    assert module.value_head.out.bias.grad is not None and module.value_head.out.bias.grad.abs() > 0


def test_search_values_are_the_heads_at_each_prefix_end_whatever_the_padding(tmp_path):
    module = module_with(tmp_path, value_coef=1.0)
    with torch.no_grad():
        torch.nn.init.normal_(module.value_head.out.weight, std=1.0)
    short, long = (3, 4, 5), (3, 4, 5, 6, 7, 8, 9)
    together = module.search_values([short, long])
    alone = [module.search_values([short])[0], module.search_values([long])[0]]
    assert together == pytest.approx(alone, abs=1e-5)
    assert together[0] != pytest.approx(together[1], abs=1e-4)  # the state matters
    assert all(-1 < v < 1 for v in together)
    assert module.policy.training == module.value_head.training  # modes restored as they were

"""PolicyModule: gradients reach only response tokens, a step moves log-probs the way
the advantages say; pi_old from the generator ("behaviour") or recomputed with truncated
importance weights ("recompute_tis"), the KL penalty to a frozen reference, and the warmup,
each worked out by hand."""

from dataclasses import replace

import pytest
import torch

from data_modules.examples import collate
from flywheel.objectives.credit import TrainingRow
from flywheel.module import OptimizerConfig, PolicyModule
from flywheel.policies.tiny import build_char_tokenizer, build_tiny_llama


def make_module(tmp_path) -> PolicyModule:
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return PolicyModule(policy=str(tmp_path), optimizer=OptimizerConfig(lr=1e-2, weight_decay=0.0, warmup_steps=0))


def row(tokenizer, prompt: str, response: str, advantage: float, group: int = 0) -> TrainingRow:
    p = tuple(tokenizer(prompt)["input_ids"])
    r = tuple(tokenizer(response, add_special_tokens=False)["input_ids"])
    return TrainingRow("p", group, p, r, (advantage,) * len(r), (0.0,) * len(r), (0,) * len(r), advantage)


def built(module, rows):
    """The rows as the data module builds them for `module`: its packing decision, its pi_old."""
    return collate(rows, module.tokenizer.pad_token_id, pack=module.pack_batch, score=module.score_batch)


def response_logprob(module, batch) -> torch.Tensor:
    lp = module.sequence_logprobs(module.policy, batch.input_ids, batch.attention_mask)
    return (lp * batch.loss_mask).sum(dim=1)  # [B]


def test_a_step_follows_the_advantage_signs(tmp_path):
    module = make_module(tmp_path)
    tok = module.tokenizer
    batch = built(module, [row(tok, "1 2|3\n", "1+2=3\n", +1.0), row(tok, "1 2|3\n", "2-1=1\n", -1.0)])
    before = response_logprob(module, batch).detach()
    # One small on-policy step (ratio = 1): the gradient is -A * grad log pi.
    optimizer = torch.optim.SGD(module.policy.parameters(), lr=0.05)
    module.training_step(batch, 0).backward()
    optimizer.step()
    after = response_logprob(module, batch).detach()
    assert after[0] > before[0]  # positive advantage: more likely
    assert after[1] < before[1]  # negative advantage: less likely


def test_gradients_come_only_from_response_tokens(tmp_path):
    module = make_module(tmp_path)
    tok = module.tokenizer
    batch = built(module, [row(tok, "7 8|15\n", "7+8=15\n", 0.5)])
    embeddings = module.policy.get_input_embeddings()
    module.training_step(batch, 0).backward()
    grad_a = embeddings.weight.grad.clone()
    # Changing the advantages of non-response positions (masked) must not change anything.
    module.policy.zero_grad()
    poisoned = replace(batch, advantages=torch.where(batch.loss_mask, batch.advantages, torch.full_like(batch.advantages, 1e6)))
    module.training_step(poisoned, 0).backward()
    assert torch.equal(grad_a, embeddings.weight.grad)
    # With no response token at all the loss is zero and so is every gradient.
    module.policy.zero_grad()
    empty = replace(batch, loss_mask=torch.zeros_like(batch.loss_mask))
    loss = module.training_step(empty, 0)
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or not p.grad.any() for p in module.policy.parameters())


def test_packing_gives_the_same_loss_and_gradients(tmp_path):
    module = make_module(tmp_path)
    tok = module.tokenizer
    rows = [row(tok, "1 2|3\n", "1+2=3\n<answer>1+2</answer>", 1.0), row(tok, "1 2|3\n", "1+2=3\n<answer>2+1</answer>", 0.5),
            row(tok, "1 2|3\n", "2-1=1\n", -1.0), row(tok, "4 4|8\n", "4+4=8\n", 0.3, group=1)]
    module.packing = False
    flat = built(module, rows)
    assert flat.packed is None
    module.packing = True
    packed = replace(flat, packed=module.pack_batch(flat.input_ids, flat.attention_mask, flat.group_ids))
    assert packed.packed is not None
    losses, grads = [], []
    for batch in (flat, packed):
        module.policy.zero_grad()
        loss = module.training_step(batch, 0)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in module.policy.parameters()])
    assert torch.allclose(losses[0], losses[1], atol=1e-6)
    assert any(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_auto_packing_packs_shared_trees_and_leaves_distinct_rows_flat(tmp_path):
    module = make_module(tmp_path)
    assert module.packing == "auto"
    tok = module.tokenizer
    # Three trajectories of one tree share the prompt and "1+2=3\n<answer>": 79 flat tokens, 51 packed.
    shared = built(module, [row(tok, "1 2|3\n", "1+2=3\n<answer>1+2</answer>", 1.0),
                            row(tok, "1 2|3\n", "1+2=3\n<answer>2+1</answer>", 0.5),
                            row(tok, "1 2|3\n", "2-1=1\n", -1.0)])
    # Two unrelated one-row problems share only the first token: 26 flat, 25 packed (< 1.2x).
    distinct = built(module, [row(tok, "1 2|3\n", "1+2=3\n", 1.0), row(tok, "7 9|2\n", "9-7=2\n", -1.0, group=1)])
    for batch, packs in ((shared, True), (distinct, False)):
        flat = module.sequence_logprobs(module.policy, batch.input_ids, batch.attention_mask)
        auto = module.batch_logprobs(module.policy, batch)
        assert (batch.packed is not None) is packs
        assert torch.allclose(auto, flat * batch.attention_mask[:, 1:], atol=1e-5)


# ---- where pi_old comes from, the KL penalty, the warmup -----------------------------------

def module_with(tmp_path, **kwargs) -> PolicyModule:
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    kwargs.setdefault("optimizer", OptimizerConfig(lr=1e-2, weight_decay=0.0, warmup_steps=0))
    return PolicyModule(policy=str(tmp_path), **kwargs)


def on_policy_batch(module, advantage: float, behaviour_shift: float):
    """One response of 6 tokens; pi_old = the current policy; the generator's log-probs are the
    current ones minus `behaviour_shift` (so pi / pi_generator = exp(behaviour_shift))."""
    batch = built(module, [row(module.tokenizer, "1 2|3\n", "1+2=3\n", advantage)])
    return replace(batch, behaviour_logprobs=batch.old_logprobs - behaviour_shift)


def test_behaviour_old_logprobs_take_the_generators_as_pi_old(tmp_path):
    import math

    recompute = module_with(tmp_path / "a", old_logprobs="recompute")
    behaviour = module_with(tmp_path / "b", old_logprobs="behaviour")
    # ratio pi / pi_generator = 1.1 on every token, A = +1: loss -min(1.1, clip(1.1)) = -1.1
    # per token, token-mean -1.1; recomputed pi_old = pi gives ratio 1 and loss -1.
    batch = on_policy_batch(behaviour, 1.0, math.log(1.1))
    assert behaviour.training_step(batch, 0).item() == pytest.approx(-1.1, abs=1e-5)
    assert recompute.training_step(batch, 0).item() == pytest.approx(-1.0, abs=1e-5)
    # ratio 2 is clipped at 1 + clip_high = 1.28 for A > 0.
    batch = on_policy_batch(behaviour, 1.0, math.log(2.0))
    assert behaviour.training_step(batch, 0).item() == pytest.approx(-1.28, abs=1e-5)


def test_recompute_tis_weights_each_token_by_the_truncated_importance_weight(tmp_path):
    import math

    module = module_with(tmp_path, old_logprobs="recompute_tis")  # tis_cap 2.0
    # pi_old = pi (ratio 1), pi_old / pi_generator = 1.5: every token's loss -1 * 1.5.
    batch = on_policy_batch(module, 1.0, math.log(1.5))
    assert module.training_step(batch, 0).item() == pytest.approx(-1.5, abs=1e-5)
    # pi_old / pi_generator = 5 is truncated to the cap 2: loss -2.
    batch = on_policy_batch(module, 1.0, math.log(5.0))
    assert module.training_step(batch, 0).item() == pytest.approx(-2.0, abs=1e-5)


def test_kl_coef_adds_the_penalty_to_a_frozen_reference(tmp_path):
    import math

    from flywheel.objectives import ObjectiveConfig

    assert module_with(tmp_path / "none").reference is None  # kl_coef 0: no reference model at all
    module = module_with(tmp_path / "kl", objective=ObjectiveConfig(kl_coef=0.5, kl_estimator="k3"))
    assert all(not p.requires_grad for p in module.reference.parameters())
    batch = on_policy_batch(module, 0.0, 0.0)  # A = 0: the policy-gradient term is 0
    # The reference starts as the policy: KL 0.
    assert module.training_step(batch, 0).item() == pytest.approx(0.0, abs=1e-6)
    # Now a reference with a zero LM head, uniform over the V tokens (log pi_ref = -ln V), and a
    # policy made peaky (head x 30). k3 = exp(d) - d - 1 with d = log pi_ref - log pi = -ln V - lp
    # per response token; loss = 0.5 * token-mean(k3).
    with torch.no_grad():
        module.reference.lm_head.weight.zero_()
        module.policy.lm_head.weight.mul_(30.0)
    batch = on_policy_batch(module, 0.0, 0.0)
    d = -math.log(module.policy.config.vocab_size) - batch.old_logprobs[batch.loss_mask].double()
    expected = 0.5 * (d.exp() - d - 1).mean().item()
    assert expected > 0.05  # far from 0: the check below can tell a missing penalty
    assert module.training_step(batch, 0).item() == pytest.approx(expected, rel=1e-4)


def test_warmup_rises_linearly_to_the_peak_then_stays(tmp_path):
    module = module_with(tmp_path, optimizer=OptimizerConfig(lr=1e-3, weight_decay=0.0, warmup_steps=4))
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"  # per optimizer step, not per epoch
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # step k uses lr * (k + 1) / 4 until the 4th, then lr.
    assert lrs == pytest.approx([0.25e-3, 0.5e-3, 0.75e-3, 1e-3, 1e-3, 1e-3])
    flat = module_with(tmp_path / "flat", optimizer=OptimizerConfig(lr=1e-3, warmup_steps=0)).configure_optimizers()
    assert flat["optimizer"].param_groups[0]["lr"] == pytest.approx(1e-3)

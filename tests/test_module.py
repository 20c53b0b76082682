"""TreeGRPOModule: gradients reach only response tokens, and a step moves log-probs the way
the advantages say."""

import torch

from data_modules.examples import TrainingRow, collate
from flywheel.module import OptimizerConfig, TreeGRPOModule
from flywheel.tiny import build_char_tokenizer, build_tiny_llama


def make_module(tmp_path) -> TreeGRPOModule:
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return TreeGRPOModule(policy=str(tmp_path), optimizer=OptimizerConfig(lr=1e-2, weight_decay=0.0, warmup_steps=0))


def row(tokenizer, prompt: str, response: str, advantage: float, group: int = 0) -> TrainingRow:
    p = tuple(tokenizer(prompt)["input_ids"])
    r = tuple(tokenizer(response, add_special_tokens=False)["input_ids"])
    return TrainingRow("p", group, p, r, (advantage,) * len(r), (0.0,) * len(r), (0,) * len(r), advantage)


def response_logprob(module, batch) -> torch.Tensor:
    lp = module.sequence_logprobs(module.policy, batch["input_ids"], batch["attention_mask"])
    return (lp * batch["loss_mask"]).sum(dim=1)  # [B]


def test_a_step_follows_the_advantage_signs(tmp_path):
    module = make_module(tmp_path)
    tok = module.tokenizer
    batch = collate([row(tok, "1 2|3\n", "1+2=3\n", +1.0), row(tok, "1 2|3\n", "2-1=1\n", -1.0)], tok.pad_token_id)
    batch["old_logprobs"] = module.score_batch(batch)
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
    batch = collate([row(tok, "7 8|15\n", "7+8=15\n", 0.5)], tok.pad_token_id)
    batch["old_logprobs"] = module.score_batch(batch)
    embeddings = module.policy.get_input_embeddings()
    module.training_step(batch, 0).backward()
    grad_a = embeddings.weight.grad.clone()
    # Changing the advantages of non-response positions (masked) must not change anything.
    module.policy.zero_grad()
    poisoned = dict(batch)
    poisoned["advantages"] = torch.where(batch["loss_mask"], batch["advantages"], torch.full_like(batch["advantages"], 1e6))
    module.training_step(poisoned, 0).backward()
    assert torch.equal(grad_a, embeddings.weight.grad)
    # With no response token at all the loss is zero and so is every gradient.
    module.policy.zero_grad()
    empty = dict(batch)
    empty["loss_mask"] = torch.zeros_like(batch["loss_mask"])
    loss = module.training_step(empty, 0)
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or not p.grad.any() for p in module.policy.parameters())


def test_packing_gives_the_same_loss_and_gradients(tmp_path):
    module = make_module(tmp_path)
    tok = module.tokenizer
    rows = [row(tok, "1 2|3\n", "1+2=3\n<answer>1+2</answer>", 1.0), row(tok, "1 2|3\n", "1+2=3\n<answer>2+1</answer>", 0.5),
            row(tok, "1 2|3\n", "2-1=1\n", -1.0), row(tok, "4 4|8\n", "4+4=8\n", 0.3, group=1)]
    batch = collate(rows, tok.pad_token_id)
    batch["old_logprobs"] = module.score_batch(batch)
    losses, grads = [], []
    for packing in (False, True):
        module.packing = packing
        module.policy.zero_grad()
        loss = module.training_step(dict(batch), 0)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in module.policy.parameters()])
    assert torch.allclose(losses[0], losses[1], atol=1e-6)
    assert any(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)

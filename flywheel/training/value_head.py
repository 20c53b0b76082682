"""A value head on the policy's last hidden state (the seed's Countdown MCTS: MLP + tanh), and
batched V(s) of search nodes for the driver's value function."""

from __future__ import annotations

from typing import Sequence

import torch


class ValueHead(torch.nn.Module):
    """V(s) = tanh(W2 gelu(W1 h + b1) + b2) from the last hidden state h [.., H], in (-1, 1).

    The output layer starts at zero, so an untrained head says V = 0 everywhere: the search
    is then pUCT on priors and rewards alone, and the baseline is the plain reward.
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(hidden_size, hidden_size)
        self.out = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.out.weight)
        torch.nn.init.zeros_(self.out.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[.., H] -> [..]."""
        h = hidden.to(self.hidden.weight.dtype)
        return torch.tanh(self.out(torch.nn.functional.gelu(self.hidden(h)))).squeeze(-1)


@torch.no_grad()
def prefix_values(
    policy: torch.nn.Module, head: ValueHead, prefixes: Sequence[Sequence[int]], pad_id: int, batch_size: int = 64
) -> list[float]:
    """V of each prefix (prompt + steps) at its last token: right-padded batches, one forward each."""
    device = head.hidden.weight.device
    was_training = policy.training, head.training
    policy.eval()
    head.eval()
    out: list[float] = []
    try:
        for first in range(0, len(prefixes), batch_size):
            chunk = prefixes[first : first + batch_size]
            length = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), length), pad_id, dtype=torch.long, device=device)
            attention = torch.zeros_like(ids)
            for i, prefix in enumerate(chunk):
                ids[i, : len(prefix)] = torch.tensor(prefix, device=device)
                attention[i, : len(prefix)] = 1
            hidden = policy(input_ids=ids, attention_mask=attention, output_hidden_states=True).hidden_states[-1]
            last = attention.sum(dim=1) - 1  # [B]
            values = head(hidden[torch.arange(len(chunk), device=device), last])  # [B]
            out.extend(float(v) for v in values)
    finally:
        policy.train(was_training[0])
        head.train(was_training[1])
    return out

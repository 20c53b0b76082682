"""CopyBackend: in-process sampling from a copy of the policy that only `sync_weights`
changes, i.e. a generator with weights of its own like the vLLM sidecar's servers, so the
default suite can run `--data.async_search` (the search ahead) without vLLM:
`--data.generator=copy_backend.CopyBackend` (tests/ is on the path under pytest)."""

from __future__ import annotations

import copy
from typing import Any

from flywheel.generation.backends import HFBackend


class CopyBackend(HFBackend):
    own_weights = True

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed=seed)
        self.copy = None
        self.syncs: list[int] = []
        """The versions pushed, in order."""

    def build(self, model: Any, tokenizer: Any, dist=None):
        self.copy = copy.deepcopy(model).eval().requires_grad_(False)
        return super().build(self.copy, tokenizer, dist)

    def sync_weights(self, model: Any, version: int) -> None:
        self.copy.load_state_dict(model.state_dict())  # in place: the prefix cache sees the new weights
        self.syncs.append(version)

"""Lightning's DeepSpeed strategy made to run on CPU, for tests only (shared/notes/lightning-cpu.md
§3: Lightning refuses DeepSpeed without CUDA; these three overrides lift that). Unsupported
for real training: flywheel's DeepSpeed recipe is for GPUs. Used by tests/test_deepspeed_cpu.py
to produce real DeepSpeed checkpoint folders and ZeRO-3 partitioned models on a CPU machine.

    python tests/scripts/deepspeed_cpu.py fit --config conf/quickstart.yaml \\
        --trainer.strategy=deepspeed_cpu.CPUDeepSpeedStrategy --trainer.strategy.stage=2 ...
    python tests/scripts/deepspeed_cpu.py gather OUT.pt   # ZeRO-3 gather of a tiny model

With FLYWHEEL_TEST_SAVE_POLICY=PATH, `fit` saves the trained policy's state dict there
(gathered: the module's own view under ZeRO-2, where every rank holds full weights).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_only


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    def setup_environment(self) -> None:
        # Skip DeepSpeedStrategy's CUDA check; run the parallel strategy's setup.
        super(DeepSpeedStrategy, self).setup_environment()

    def setup_distributed(self) -> None:
        from lightning.fabric.utilities.seed import reset_seed

        reset_seed()
        self.set_world_ranks()
        rank_zero_only.rank = self.global_rank
        self._init_deepspeed_distributed()

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu", 0)


def gather(out: str) -> None:
    """Partition a tiny Llama with raw DeepSpeed ZeRO-3 (one process, gloo) and save what the
    vLLM sidecar's weight gather makes of it next to the weights before partitioning."""
    import os

    import deepspeed

    from flywheel.generation.vllm.weights import full_state
    from flywheel.policies.tiny import build_char_tokenizer, build_tiny_llama

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    model = build_tiny_llama(build_char_tokenizer(), hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_allow_untested_optimizer": True}
    deepspeed.init_distributed(dist_backend="gloo")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    partitioned = [n for n, p in engine.module.named_parameters() if hasattr(p, "ds_id") and p.numel() == 0]
    gathered = dict(full_state(engine.module, rank=0, adapter_only=False))
    torch.save({"before": before, "gathered": gathered, "partitioned": partitioned}, out)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    if sys.argv[1] == "gather":
        gather(sys.argv[2])
        sys.exit(0)
    import os

    from flywheel.__main__ import main

    cli = main(sys.argv[1:])
    target = os.environ.get("FLYWHEEL_TEST_SAVE_POLICY")
    if target and cli.trainer.is_global_zero:
        torch.save({k: v.detach().cpu().clone() for k, v in cli.model.policy.state_dict().items()}, target)

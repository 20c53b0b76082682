"""A policy, its task and a generator as `flywheel fit` builds them from a recipe, for the tools
that sample from a policy without training it (bench_explore, headroom).

The policy is the recipe's `--model.policy`, or `policy`: a name, a Hugging Face folder or a
`flywheel fit` checkpoint file (.ckpt), whose weights are exported to a temporary folder first.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass
class PolicySetup:
    module: Any  # the LightningModule (its policy in eval mode)
    dm: Any  # the DataModule: task, batching, credit, backend
    generator: Any  # dm.backend built over the policy
    config: Any  # the search config fit's first epoch on rank 0 uses
    decode: Callable[[Sequence[int]], str]
    eos: list[int]

    @property
    def tokenizer(self):
        return self.module.tokenizer

    @property
    def task(self):
        return self.dm.task


def load(configs: Sequence[str], overrides: Sequence[str], policy: str | None = None) -> PolicySetup:
    from flywheel.__main__ import main as cli_main

    cli_args = [a for c in configs for a in ("--config", c)] + list(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        if policy is not None and policy.endswith(".ckpt"):
            from tools.export_hf import export

            policy = str(export(Path(policy), Path(tmp) / "policy"))
        if policy is not None:
            cli_args.append(f"--model.policy={policy}")
        cli = cli_main(cli_args + ["--trainer.logger=false", f"--trainer.default_root_dir={tmp}"], run=False)
    module, dm = cli.model, cli.datamodule
    module.policy.eval()
    tokenizer = module.tokenizer
    return PolicySetup(
        module=module, dm=dm, generator=dm.backend.build(module.policy, tokenizer),
        config=dm.effective_search_config(epoch=0, rank=0),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        eos=[tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [],
    )

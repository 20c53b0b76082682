"""LoRA adapters (`--model.lora.rank`): only the adapters train, the packed and the
in-process paths see them, and checkpoints export as plain merged models."""

import copy
from pathlib import Path

import pytest
import torch

from flywheel.policies.load import LoraSettings, add_lora, load_policy, merged

pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[1]


def test_only_the_adapters_train_and_a_fresh_adapter_changes_nothing():
    base, _ = load_policy("tiny-countdown")
    model = add_lora(copy.deepcopy(base), LoraSettings(rank=4, target_modules=("q_proj", "v_proj")))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert len(trainable) == 2 * 2 * base.config.num_hidden_layers  # A and B of q and v, per layer
    ids = torch.tensor([[1, 20, 30, 40]])
    with torch.no_grad():  # B starts at zero: the adapted model is the base model
        assert torch.equal(model(input_ids=ids).logits, base(input_ids=ids).logits)
    assert add_lora(base, LoraSettings(rank=0)) is base


def test_merged_folds_the_adapters_into_a_plain_model():
    base, _ = load_policy("tiny-countdown")
    model = add_lora(base, LoraSettings(rank=4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    plain = merged(model)
    assert not hasattr(plain, "peft_config") and hasattr(model, "peft_config")  # the original keeps its adapters
    ids = torch.tensor([[1, 20, 30, 40, 50]])
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)


def test_negative_rank_is_refused():
    with pytest.raises(ValueError, match="lora.rank"):
        LoraSettings(rank=-1)


@pytest.mark.slow
def test_fit_with_lora_moves_only_adapters_and_exports_a_merged_model(tmp_path):
    from test_fit import run_fit

    from flywheel.reporting.eval_command import load_checkpoint_policy
    from flywheel.prm.model import ValueModel

    cli = run_fit(tmp_path, "--model.lora.rank=4", "--model.packing=true", "--model.optimizer.lr=1e-2")
    policy = cli.model.policy
    base, _ = load_policy("tiny-countdown")
    state = policy.state_dict()
    for name, value in base.state_dict().items():  # the base weights did not move
        peft_name = "base_model.model." + name
        key = peft_name if peft_name in state else peft_name.replace(".weight", ".base_layer.weight")
        assert torch.equal(value, state[key]), name
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in state.items() if "lora_B" in k), "adapters did not train"

    exported, _, step = load_checkpoint_policy(str(tmp_path / "checkpoints" / "last.ckpt"))
    assert step == cli.trainer.global_step and not hasattr(exported, "peft_config")
    ids = torch.tensor([[1, 20, 30, 40, 50]])
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=ids).logits, policy.eval()(input_ids=ids).logits, atol=1e-5)
    value = ValueModel.from_policy(policy)  # the PRM's backbone: the merged decoder
    assert not any("lora_" in n for n, _ in value.named_parameters())

"""DeepSpeed configs are checked before a run: DeepSpeed ignores unknown keys silently."""

from pathlib import Path

import pytest

from flywheel.run.deepspeed_config import DeepSpeedConfigError, check_deepspeed_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["zero2.json", "zero3.json"])
def test_shipped_configs_pass(name):
    config = check_deepspeed_config(ROOT / "conf" / "deepspeed" / name)
    assert config["zero_optimization"]["stage"] in (2, 3)


@pytest.mark.parametrize(
    "config, path, suggestion",
    [
        ({"zero_optimisation": {"stage": 2}}, "zero_optimisation", "zero_optimization"),
        ({"zero_optimization": {"stage": 2, "overlap_com": True}}, "zero_optimization.overlap_com", "zero_optimization.overlap_comm"),
        ({"zero_optimization": {"offload_optimizer": {"devise": "cpu"}}}, "zero_optimization.offload_optimizer.devise",
         "zero_optimization.offload_optimizer.device"),
        ({"bf16": {"enable": True}}, "bf16.enable", "bf16.enabled"),
        ({"gradient_clip": 1.0}, "gradient_clip", "gradient_clipping"),
    ],
)
def test_misspelled_keys_name_the_path_and_the_fix(config, path, suggestion):
    with pytest.raises(DeepSpeedConfigError) as err:
        check_deepspeed_config(config)
    assert repr(path) in str(err.value) and repr(suggestion) in str(err.value)


def test_bad_values_and_files(tmp_path):
    with pytest.raises(DeepSpeedConfigError, match="stage must be"):
        check_deepspeed_config({"zero_optimization": {"stage": 4}})
    with pytest.raises(DeepSpeedConfigError, match="must be an object"):
        check_deepspeed_config({"zero_optimization": 2})
    bad = tmp_path / "ds.json"
    bad.write_text("{not json")
    with pytest.raises(DeepSpeedConfigError, match="ds.json"):
        check_deepspeed_config(bad)
    # Free-form sections pass through: optimizer params belong to the optimizer.
    check_deepspeed_config({"optimizer": {"type": "AdamW", "params": {"lr": 1e-6, "anything": 1}}})

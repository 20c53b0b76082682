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


def test_a_zero_checkpoint_resumed_on_another_world_size_is_refused_with_the_conversion(tmp_path):
    from types import SimpleNamespace

    from flywheel.run.zero_checkpoint import saved_ranks, to_universal, use_universal, world_size_refusal

    folder = tmp_path / "last.ckpt"  # Lightning's layout of a 2-rank ZeRO-2 checkpoint
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "latest").write_text("checkpoint")
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                 "zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        (folder / "checkpoint" / name).touch()
    assert saved_ranks(folder) == 2 and saved_ranks(tmp_path) is None
    assert world_size_refusal(folder, 2) is None
    refusal = world_size_refusal(folder, 1)
    assert f"--ckpt_path {folder} is a DeepSpeed checkpoint written by 2 processes, and this run has 1" in refusal
    assert f"python tools/zero_to_universal.py {folder} {tmp_path / 'last-universal.ckpt'}" in refusal
    with pytest.raises(ValueError, match="not a DeepSpeed checkpoint folder"):
        to_universal(tmp_path / "checkpoint-less", tmp_path / "out")
    with pytest.raises(FileExistsError):
        to_universal(folder, folder)

    strategy = SimpleNamespace(config={"zero_optimization": {"stage": 2}})
    assert not use_universal(strategy, folder) and "checkpoint" not in strategy.config
    (folder / "latest_universal").write_text("universal")  # what tools/zero_to_universal.py adds
    assert world_size_refusal(folder, 1) is None
    assert use_universal(strategy, folder) and strategy.config["checkpoint"] == {"load_universal": True}

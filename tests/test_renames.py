"""Renamed settings (flywheel.run.renames): a flag of the flat data layout, on the command line or
in a YAML `--config`, reaches its new section with a one-line warning naming the new flag;
settings recorded in a checkpoint before the rename compare under the new names."""

import logging
from pathlib import Path

import pytest
import yaml

from flywheel.__main__ import main
from flywheel.run.renames import RENAMED, rename_config, rename_flags, rename_settings, renamed
from flywheel.run.settings import changed_settings

ROOT = Path(__file__).resolve().parents[1]


def test_old_names_map_to_their_sections_and_new_names_are_left_alone():
    assert renamed("data.advantage") == "data.credit.advantage"
    assert renamed("data.degenerate_filter.max_period") == "data.credit.degenerate_filter.max_period"
    assert renamed("data.mini_batch_problems") == "data.batching.mini_batch_problems"
    assert renamed("data.max_eval_problems") == "data.problems.max_eval_problems"
    assert renamed("eval.at_start") == "data.eval.at_start"
    for new in RENAMED.values():
        assert renamed(new) is None
    assert renamed("data.advantages") is None and renamed("data.search.expansion_width") is None


def test_command_line_flags_are_rewritten_in_both_spellings(caplog):
    with caplog.at_level(logging.WARNING, logger="flywheel.run.renames"):
        out = rename_flags(["fit", "--data.advantage=outcome", "--data.mini_batch_problems", "4", "--data.seed=1"])
    assert out == ["fit", "--data.credit.advantage=outcome", "--data.batching.mini_batch_problems", "4", "--data.seed=1"]
    lines = caplog.text.strip().splitlines()
    assert len(lines) == 2
    assert "--data.advantage was renamed --data.credit.advantage" in lines[0]


def test_a_config_moves_old_keys_into_their_sections_and_the_new_name_wins():
    old = {"data": {"advantage": "subtree", "mini_batch_problems": 4, "batching": {"mini_batch_problems": 2},
                    "path_weights": {"temperature": 0.5}, "eval": {"samples": 2}},
           "eval": {"at_start": False}}
    new, moves = rename_config(old)
    assert new == {"data": {"batching": {"mini_batch_problems": 2},
                            "eval": {"samples": 2, "at_start": False},
                            "credit": {"advantage": "subtree", "path_weights": {"temperature": 0.5}}}}
    assert ("eval.at_start", "data.eval.at_start") in moves and len(moves) == 4
    assert old["data"]["advantage"] == "subtree"  # the input is not modified


def test_old_flags_and_an_old_yaml_reach_the_components(tmp_path, caplog):
    config = tmp_path / "old.yaml"
    config.write_text(yaml.safe_dump({"data": {"advantage": "subtree", "mini_batch_problems": 4,
                                               "degenerate_filter": {"max_period": 64}},
                                      "eval": {"at_start": False}}))
    with caplog.at_level(logging.WARNING, logger="flywheel.run.renames"):
        cli = main(["--config", str(ROOT / "conf" / "quickstart.yaml"), "--config", str(config),
                    "--data.flat_samples=3", "--data.max_eval_problems=5"], run=False)
    dm = cli.datamodule
    assert (dm.credit.advantage, dm.credit.degenerate_filter.max_period) == ("subtree", 64)
    assert (dm.batching.mini_batch_problems, dm.batching.flat_samples) == (4, 3)
    assert dm.pool.config.max_eval_problems == 5 and dm.eval.at_start is False
    assert f"{config}: --data.advantage was renamed --data.credit.advantage" in caplog.text
    assert "command line: --data.flat_samples was renamed --data.batching.flat_samples" in caplog.text


def test_a_checkpoint_s_old_settings_compare_under_the_new_names():
    before = rename_settings({"--data.mini_batch_problems": 8, "--eval.at_start": True, "--data.seed": 0})
    now = {"--data.batching.mini_batch_problems": 8, "--data.eval.at_start": True, "--data.seed": 0}
    assert changed_settings(before, now) == []
    assert changed_settings(before, {**now, "--data.batching.mini_batch_problems": 4}) == [
        "--data.batching.mini_batch_problems: 8 -> 4"]


def test_fit_help_groups_the_data_settings_and_has_one_eval_section(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    for flag in ("--data.problems.train_files", "--data.batching.mini_batch_problems", "--data.credit.advantage",
                 "--data.credit.path_weights.temperature", "--data.eval.samples", "--data.eval.at_start"):
        assert flag in out, flag
    for gone in ("--data.mini_batch_problems ", "--data.advantage ", "--eval.at_start"):
        assert gone not in out, gone


@pytest.mark.parametrize("section", ["hard_set_refresh: {}\n", "hard_set_refresh:\n"], ids=["empty", "null"])
def test_the_removed_hard_set_refresh_section_is_dropped_from_an_old_config_with_a_warning(tmp_path, caplog, section):
    # The hard-set refresh had a CLI section without a setting; the round protocol runs it now.
    config = tmp_path / "old.yaml"
    config.write_text(section)
    with caplog.at_level(logging.WARNING, logger="flywheel.run.renames"):
        cli = main(["--config", str(ROOT / "conf" / "quickstart.yaml"), "--config", str(config),
                    f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert cli.datamodule.curriculum.hard_set_config.enabled is False  # the quickstart's, untouched
    assert f"{config}: the `hard_set_refresh:` section was removed" in caplog.text


def test_a_removed_section_with_a_setting_is_refused_in_one_line(tmp_path, capsys):
    from flywheel.run.preflight import PreflightError

    config = tmp_path / "old.yaml"
    config.write_text("hard_set_refresh:\n  every: 2\n")
    quickstart = ["--config", str(ROOT / "conf" / "quickstart.yaml")]
    with pytest.raises(PreflightError, match=rf"^{config}: `hard_set_refresh:` holds settings, but the `hard_set_refresh` "
                                             r"section was removed \(.*--data\.hard_set\.\*\); delete it$"):
        main(quickstart + ["--config", str(config)], run=False)
    with pytest.raises(PreflightError, match=r"^the command line: --hard_set_refresh\.every: the `hard_set_refresh` section"):
        main(quickstart + ["--hard_set_refresh.every=2"], run=False)
    with pytest.raises(SystemExit):  # and `fit --help` no longer lists it
        main(["fit", "--help"])
    out = capsys.readouterr().out
    assert "--budget.max_tokens" in out and "hard_set_refresh" not in out

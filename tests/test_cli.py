"""The CLI: every shipped YAML parses and instantiates; --help documents the subcommands."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from data_modules.search import SearchDataModule
from flywheel.__main__ import main
from flywheel.module import PolicyModule

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "conf").glob("*.yaml"))
OVERLAYS = {"dapo.yaml", "best_of_n.yaml", "cispo.yaml", "rest_mcts.yaml", "quickstart_vllm.yaml", "countdown_mcts.yaml",
            "smollm2_vllm.yaml", "deepsearch_plateau.yaml"}
GPU_RECIPES = {
    # Instantiated here with its GPU parts swapped for CPU ones (DeepSpeed and vLLM are GPU
    # extras); its DeepSpeed file is checked by tests/test_deepspeed_config.py.
    "deepsearch.yaml": ["--trainer.accelerator=cpu", "--trainer.strategy=auto", "--trainer.precision=32-true",
                        "--data.generator=flywheel.generation.backends.HFBackend", "--model.policy=tiny-countdown",
                        "--model.dtype=float32"],
    # The real model is the realmodel group's (tests/test_real_model.py); here the recipe's
    # settings are instantiated around the tiny policy.
    "smollm2_cpu.yaml": ["--model.policy=tiny-countdown"],
    "smollm2_chain.yaml": ["--model.policy=tiny-chain"],  # its policy is a `flywheel sft` folder (docs/sft.md)
}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_parses_and_instantiates(config, tmp_path, caplog):
    args = ["--config", str(config)]
    if config.name in OVERLAYS:  # overlays modify a recipe: check them on top of the quickstart
        args = ["--config", str(ROOT / "conf" / "quickstart.yaml")] + args
    args += GPU_RECIPES.get(config.name, [])
    with caplog.at_level(logging.WARNING, logger="data_modules.search"):
        cli = main(args + [f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert isinstance(cli.model, PolicyModule)
    assert isinstance(cli.datamodule, SearchDataModule)
    # a shipped recipe or overlay sets no credit its rollout ignores (an overlay pins its own rule)
    assert not [r.getMessage() for r in caplog.records if "is not used with --data.rollout" in r.getMessage()]


@pytest.mark.parametrize("overlay", sorted((ROOT / "conf" / "data").glob("*.yaml")), ids=lambda p: p.name)
def test_every_data_shape_overlay_parses_on_the_math_recipe(overlay, tmp_path):
    # conf/data/*.yaml set a MathTask's answer convention and the files' columns; they go after
    # a MathTask recipe, whose other task settings they keep (tests/test_problem_shapes.py fits each).
    cli = main(["--config", str(ROOT / "conf" / "deepsearch_cpu.yaml"), "--config", str(overlay),
                f"--trainer.default_root_dir={tmp_path}"], run=False)
    task, columns = cli.datamodule.task, cli.datamodule.pool.config.columns
    assert task.step.max_tokens == 16 and task.max_response_tokens == 128  # the recipe's, kept
    expected = {"gsm8k.yaml": ("hashes", "question", "answer"), "math.yaml": ("boxed", "problem", "solution"),
                "deepmath.yaml": ("plain", "question", "final_answer")}[overlay.name]
    assert (task.gold_format, columns.problem, columns.answer) == expected


def test_overlays_change_the_rollout():
    base = ["--config", str(ROOT / "conf" / "quickstart.yaml")]
    assert main(base, run=False).datamodule.rollout == "search"
    assert main(base + ["--config", str(ROOT / "conf" / "dapo.yaml")], run=False).datamodule.rollout == "flat"
    assert main(base + ["--config", str(ROOT / "conf" / "best_of_n.yaml")], run=False).datamodule.rollout == "best_of_n"


def test_command_line_overrides_reach_the_components():
    cli = main(
        [
            "--config", str(ROOT / "conf" / "quickstart.yaml"),
            "--data.search.expansion_width=3",
            "--data.search.selection=puct",
            "--model.optimizer.lr=0.0005",
            "--data.eval.samples=2",
        ],
        run=False,
    )
    assert cli.datamodule.search.expansion_width == 3
    assert cli.datamodule.search.selection == "puct"
    assert cli.model.optimizer_config.lr == 0.0005
    assert cli.datamodule.eval.samples == 2


def test_seed_everything_seeds_the_search_and_the_problem_order_unless_data_seed_is_given():
    base = ["--config", str(ROOT / "conf" / "quickstart.yaml")]

    def data_seed(*overrides):
        data = main(base + list(overrides), run=False).datamodule
        assert data.pool.seed == data.seed and data.curriculum.seed == data.seed
        return data.seed

    assert data_seed() == 0  # the recipe's seed_everything: 0
    assert data_seed("--seed_everything=3") == 3  # a second seed is a different run, not torch's alone
    assert data_seed("--seed_everything=3", "--data.seed=5") == 5  # an explicit data seed wins
    assert data_seed("--seed_everything=false") == 0
    drawn = main(base + ["--seed_everything=true"], run=False)
    assert drawn.datamodule.seed == drawn.config["seed_everything"]  # Lightning's drawn seed, as saved
    assert SearchDataModule().seed == 0  # built outside the command line


def test_bad_values_fail_with_the_flag_named():
    with pytest.raises(ValueError, match="--data.rollout"):
        SearchDataModule(rollout="tree")
    with pytest.raises(ValueError, match="--model.policy"):  # a PreflightError: one line on the command line
        PolicyModule(policy="/no/such/folder")


def test_help_lists_subcommands_and_documents_options():
    out = subprocess.run([sys.executable, "-m", "flywheel", "--help"], capture_output=True, text=True, check=True).stdout
    for sub in ("fit", "validate", "test", "sft", "eval", "tree"):
        assert sub in out
    fit_help = subprocess.run(
        [sys.executable, "-m", "flywheel", "fit", "--help"], capture_output=True, text=True, check=True
    ).stdout
    # Constructor docstrings become the option help.
    assert "--data.search.expansion_width" in fit_help
    assert "children sampled per expansion" in fit_help
    assert "--data.rollout" in fit_help and "best_of_n" in fit_help
    for sub, option in (("sft", "--response_column"), ("eval", "--checkpoint"), ("tree", "--epoch")):
        sub_help = subprocess.run([sys.executable, "-m", "flywheel", sub, "--help"], capture_output=True, text=True, check=True).stdout
        assert option in sub_help


def test_validate_and_test_report_pass_at_k(tmp_path):
    args = ["--config", str(ROOT / "conf" / "quickstart.yaml"), "--data.problems.max_eval_problems=8",
            "--data.eval.samples=2", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    for sub, stage in (("validate", "eval"), ("test", "test")):
        cli = main([sub, *args])
        metrics = cli.trainer.callback_metrics
        assert 0.0 <= float(metrics[f"{stage}/pass@1"]) <= float(metrics[f"{stage}/pass@2"]) <= 1.0


def test_countdown_mcts_overlay_puts_the_seed_recipe_together():
    base = ["--config", str(ROOT / "conf" / "quickstart.yaml")]
    cli = main(base + ["--config", str(ROOT / "conf" / "countdown_mcts.yaml")], run=False)
    quick = main(base, run=False)
    search, objective = cli.datamodule.search, cli.model.objective
    assert (search.selection, search.expansion_width, search.temperature, search.puct_c) == ("puct_agents", 4, 0.8, 0.5)
    assert search.agents.count > 1 and cli.model.value_head is not None
    assert (objective.loss_type, objective.kl_coef, objective.value_baseline) == ("cispo", 0.05, True)
    assert cli.model.reference is not None  # the KL's frozen initial policy
    assert cli.datamodule.task.reward == "dense" and quick.datamodule.task.reward == "binary"
    assert cli.datamodule.task.numbers_count == quick.datamodule.task.numbers_count  # the quickstart's init_args kept
    assert cli.model.optimizer_config.lr == quick.model.optimizer_config.lr  # scaled: the quickstart's lr
    assert not cli.datamodule.curriculum.replay_config.enabled and not cli.datamodule.credit.drop_uniform_groups


def test_deepsearch_plateau_overlay_puts_the_allocation_together():
    base = ["--config", str(ROOT / "conf" / "quickstart.yaml")]
    dm = main(base + ["--config", str(ROOT / "conf" / "deepsearch_plateau.yaml")], run=False).datamodule
    hard, replay = dm.curriculum.hard_set_config, dm.curriculum.replay_config
    assert (hard.enabled, hard.k, hard.delta, hard.comparison) == (True, 4, 0.25, "le")  # Pass1@4 of 0% or 25%
    assert (hard.rescreen, hard.screen_problems) == ("all", 512)
    assert (replay.enabled, replay.rule) == (True, "paper") and dm.rollout == "search"
    assert dm.task.numbers_count == 4 and dm.pool.config.eval_split == "test_hard"
    assert dm.search.terminal_choice == "random"  # the quickstart's search kept


def test_each_recipe_checkpoints_under_its_own_run_name(tmp_path):
    """An overlay that renames the run (dapo, best-of-N, CISPO, ReST-MCTS*) must not write into the
    quickstart's checkpoint folder, or a later `--ckpt_path last` of the quickstart would resume
    another recipe's weights."""
    base = ["--config", str(ROOT / "conf" / "quickstart.yaml")]
    save_dir = f"--trainer.logger.init_args.save_dir={tmp_path}"
    folders = {}
    for overlay in (None, "dapo.yaml", "best_of_n.yaml", "cispo.yaml", "rest_mcts.yaml", "countdown_mcts.yaml",
                    "deepsearch_plateau.yaml"):
        args = base + (["--config", str(ROOT / "conf" / overlay)] if overlay else []) + [save_dir]
        folders[overlay] = main(args, run=False).trainer.checkpoint_callback.dirpath
    assert folders[None] == str(tmp_path / "quickstart" / "checkpoints")
    assert folders["dapo.yaml"] == str(tmp_path / "dapo" / "checkpoints")
    assert len(set(folders.values())) == len(folders)
    # A dirpath given explicitly is kept.
    explicit = main(base + [save_dir, f"--trainer.callbacks.init_args.dirpath={tmp_path / 'mine'}"], run=False)
    assert explicit.trainer.checkpoint_callback.dirpath == str(tmp_path / "mine")


def test_a_self_training_credit_without_the_self_training_loss_is_refused_at_fit_start():
    from flywheel.objectives.credit import Credit

    module = PolicyModule()
    module.connect(SearchDataModule(credit=Credit(advantage="self_training")))  # the port, as the CLI connects it
    with pytest.raises(ValueError, match=r"--data\.credit\.advantage='self_training' and --model\.objective\.loss_type='ppo'"):
        module.on_fit_start()
    module.connect(SearchDataModule(credit=Credit(advantage="outcome")))
    module.on_fit_start()  # the clipped loss on advantages: fine


def test_a_missing_config_file_is_refused_before_torch_or_lightning_load():
    """The command line's own checks run before the heavy imports: a newcomer's typo is one line in
    a fraction of a second, not after half a minute of imports."""
    code = ("import sys\nfrom flywheel.__main__ import main\nfrom flywheel.run.errors import PreflightError\n"
            "try:\n    main(['fit', '--config', 'no_such_recipe.yaml'])\nexcept PreflightError as err:\n    print(err)\n"
            "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == ["--config no_such_recipe.yaml: no such file", "[]"], done.stderr


def test_what_a_user_cannot_act_on_is_silenced_and_the_rest_kept(caplog):
    import warnings

    from flywheel.__main__ import quiet_what_users_cannot_act_on

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_what_users_cannot_act_on()
        warnings.warn("Total length of `DataLoader` across ranks is zero. Please make sure this was your intention.")
        warnings.warn("Found 46 module(s) in eval mode at the start of training.")
        warnings.warn("The dataloader does not have many workers")  # a user can act on this one
    assert [str(w.message) for w in seen] == ["The dataloader does not have many workers"]
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        rank_zero.info("💡 Tip: For seamless cloud logging, try installing [litlogger](https://pypi.org/project/litlogger/)")
        rank_zero.info("GPU available: False")
    assert "litlogger" not in caplog.text and "GPU available: False" in caplog.text


def test_every_help_section_title_is_a_whole_sentence():
    """`fit --help` titles a section with the first line of its class's docstring: that line must
    be the whole first paragraph (before: "... with the current policy. It is the:")."""
    import inspect

    from callbacks.budget import GenerationBudget
    from callbacks.prm import PRMUpdate

    for cls in (PolicyModule, SearchDataModule, GenerationBudget, PRMUpdate):
        first = inspect.getdoc(cls).split("\n\n")[0]
        assert "\n" not in first and first.endswith("."), (cls.__name__, first)


def test_help_of_one_section(capsys):
    """`fit --help data.search` prints that section's options and no other section's; an unknown
    section is one line listing the sections there are."""
    from flywheel.run.errors import PreflightError
    from flywheel.run.section_help import help_section

    assert help_section(["fit", "--help", "data.search"]) == (["fit", "--help"], "data.search")
    assert help_section(["fit", "--help=budget", "--config", "x.yaml"]) == (["fit", "--help", "--config", "x.yaml"], "budget")
    assert help_section(["fit", "--help", "--config", "x.yaml"]) == (["fit", "--help", "--config", "x.yaml"], None)
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--help", "data.credit"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "--data.credit.advantage" in out and "--data.credit.path_weights.temperature" in out  # its subsections too
    assert "--data.search.expansion_width" not in out and "--trainer.max_epochs" not in out
    assert len(out.splitlines()) < 300  # the whole help is about 1,500 lines
    with pytest.raises(PreflightError, match=r"no such section; the sections are: trainer, model, .*data\.search"):
        main(["fit", "--help", "data.serch"])

"""One rule of every family registered from outside the library (tests/plugin_rules.py), loaded
by `--plugins` as a user's module is: the command line accepts each, --help lists each with its
summary, and the docs' check still passes (it asks only that every rule a doc names is registered)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.run.errors import PreflightError
from flywheel.run.plugins import load_plugins, plugin_modules
from test_architecture import documented_rules, plugin_rules_loaded, rule_tables, tables_kept

FAMILIES = rule_tables()

QUICKSTART = ["--config", str(Path(__file__).resolve().parents[1] / "conf" / "quickstart.yaml")]
CHOSEN = {  # one plugin rule per family, as the command line names it
    "--data.search.selection": "breadth_first",
    "--data.search.fork_rule": "newest",
    "--data.search.expansion": "single_step",
    "--data.credit.advantage": "halved_node",
    "--data.rollout": "flat_outcome",
    "--model.objective.loss_type": "reinforce",
}


@pytest.fixture
def plugin_tables():
    """The tables as the library left them, restored after the test (which loads the plugin
    through the command line)."""
    with tables_kept():
        yield


def test_every_family_has_a_plugin_rule_here():
    assert set(CHOSEN) == set(FAMILIES)


def test_the_flag_is_taken_out_of_the_command_line_wherever_it_stands():
    assert plugin_modules(["fit", "--plugins", "a,b", "--config", "x.yaml", "--plugins=c"]) == (
        ["a", "b", "c"], ["fit", "--config", "x.yaml"])
    with pytest.raises(PreflightError, match="--plugins needs the module"):
        plugin_modules(["fit", "--plugins", "--config", "x.yaml"])


def test_a_module_that_cannot_be_imported_is_one_line_naming_it(plugin_tables):
    with pytest.raises(PreflightError, match=r"--plugins no_such_rules: the module could not be imported "
                                             r"\(ModuleNotFoundError"):
        load_plugins(["fit", "--plugins", "no_such_rules"])


def test_the_command_line_accepts_a_plugin_rule_of_every_family(plugin_tables):
    from flywheel.__main__ import main

    # Four command lines: a fork rule needs rollout expansion, a plugin expansion mode is step-like.
    cli = main(QUICKSTART + ["--plugins", "plugin_rules", "--data.search.selection=breadth_first"], run=False)
    assert cli.datamodule.search.selection == "breadth_first"
    cli = main(QUICKSTART + ["--plugins=plugin_rules", "--data.rollout=flat_outcome"], run=False)
    assert cli.datamodule.rollout == "flat_outcome"
    cli = main(QUICKSTART + ["--plugins", "plugin_rules", "--data.search.expansion=rollout",
                             "--data.search.fork_rule=newest", "--data.credit.advantage=halved_node",
                             "--model.objective.loss_type=reinforce"], run=False)
    assert (cli.datamodule.search.fork_rule, cli.datamodule.credit.advantage, cli.model.objective.loss_type) == (
        "newest", "halved_node", "reinforce")
    cli = main(QUICKSTART + ["--plugins", "plugin_rules", "--data.search.expansion=single_step"], run=False)
    assert cli.datamodule.search.expansion == "single_step"


def test_without_the_plugin_its_rule_is_refused_with_the_way_to_load_it():
    from flywheel.__main__ import main

    with pytest.raises(Exception, match=r"--data.search.selection must be one of .*, got 'breadth_first'; .*--plugins"):
        main(QUICKSTART + ["--data.search.selection=breadth_first"], run=False)


def test_help_lists_the_plugin_rules_with_their_summaries(plugin_tables, capsys):
    from flywheel.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["--plugins", "plugin_rules", "--help"], run=False)
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag, name in CHOSEN.items():
        summary = FAMILIES[flag][name].summary
        assert f"{name}: {summary}" in text, flag


def test_the_docs_check_accepts_the_plugin_rules():
    with plugin_rules_loaded() as tables:
        for flag, table in tables.items():
            assert CHOSEN[flag] in table and CHOSEN[flag] not in table.library_names()
        assert all(name in tables[flag] for _, flag, name in documented_rules(tables))


@pytest.mark.parametrize("settings", [{"selection": "breadth_first"}, {"expansion": "rollout", "fork_rule": "newest"},
                                      {"expansion": "single_step"}])
def test_the_plugin_search_rules_grow_trees(plugin_tables, settings):
    """The plugin's search rules, bound as the built-in ones are, drive a whole search: the rule
    is called with the tree and its rng alone, and its trees finish with graded trajectories."""
    from flywheel.search import SearchConfig, SearchProblem, run_search
    from flywheel.tasks.base import StepSpec
    from scripted import HashGenerator, toy_decode, toy_score

    load_plugins(["fit", "--plugins", "plugin_rules"])
    cfg = SearchConfig(expansion_width=2, trajectories_per_tree=2, max_depth=3, overlong_penalty=False, **settings)
    results = run_search([SearchProblem((0,), toy_score, id=f"p{i}") for i in range(3)], HashGenerator(), cfg,
                         step=StepSpec(2), decode=toy_decode)
    assert len(results) == 3 and all(r.trajectories for r in results)

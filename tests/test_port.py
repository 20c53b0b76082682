"""The data module's port (flywheel/ports.py): the data module has every member, the parts that
drive rounds read nothing else and never reach the data module through the trainer, the CLI
connects every one of them, and an epoch's end pushes the weights exactly once."""

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

from callbacks.rounds import RoundProtocol
from data_modules.search import SearchDataModule
from flywheel.ports import DataPort

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "conf" / "quickstart.yaml"
MEMBERS = sorted(set(DataPort.__annotations__) | {
    name for name, value in vars(DataPort).items() if callable(value) or isinstance(value, property)
} - {name for name in vars(DataPort) if name.startswith("_")})


def sources(*folders):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def test_the_port_members():
    assert MEMBERS == sorted([
        "credit", "end_round", "epoch_metrics", "epoch_results", "eval", "eval_problems", "finish_search_ahead",
        "generated_tokens", "generator", "grader", "push_weights", "round_ends", "round_facts", "round_starts", "rounds_completed",
        "search_after_push", "solved_problems", "task", "use_value_model", "wall"])


def test_the_data_module_has_every_member_of_the_port():
    dm = SearchDataModule()
    missing = []
    for name in MEMBERS:
        try:  # statically: the generator property raises until the generator is started
            inspect.getattr_static(dm, name)
        except AttributeError:
            missing.append(name)
    assert missing == []
    for name in MEMBERS:
        if callable(getattr(DataPort, name, None)):
            want = list(inspect.signature(getattr(DataPort, name)).parameters)[1:]
            assert list(inspect.signature(getattr(dm, name)).parameters) == want, name


def test_no_callback_and_not_the_module_reach_around_the_port():
    """`trainer.datamodule.x`, `dm = trainer.datamodule` or getattr(trainer, "datamodule") in
    callbacks/ or flywheel/ would read the data module behind the port's back; only the CLI's
    wiring (`self.datamodule` in flywheel/run/cli.py, handed to the parts) may name it."""
    reaches = []
    for path, tree in sources("callbacks", "flywheel"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "datamodule":
                wiring = path == "flywheel/run/cli.py" and isinstance(node.value, ast.Name) and node.value.id == "self"
                if not wiring:
                    reaches.append(f"{path}:{node.lineno}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "datamodule"):
                reaches.append(f"{path}:{node.lineno}")
    assert reaches == []


def test_the_parts_read_only_members_of_the_port():
    read = set()
    for path, tree in sources("callbacks", "flywheel"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (
                    (isinstance(node.value, ast.Name) and node.value.id == "port")
                    or (isinstance(node.value, ast.Attribute) and node.value.attr == "port")):
                read.add(node.attr)
    assert read and read <= set(MEMBERS), read - set(MEMBERS)


def test_the_cli_connects_the_data_module_to_every_part(tmp_path):
    from callbacks.budget import GenerationBudget
    from callbacks.evaluation import HeldOutEval
    from callbacks.prm import PRMUpdate
    from callbacks.run_summary import RunSummary
    from callbacks.wall_time import WallTime
    from flywheel.__main__ import main

    cli = main(["--config", str(QUICKSTART), "--budget.max_tokens=1000", f"--trainer.default_root_dir={tmp_path}"],
               run=False)
    dm, callbacks = cli.datamodule, cli.trainer.callbacks
    assert cli.model.port is dm
    for kind in (RunSummary, HeldOutEval, GenerationBudget, RoundProtocol):
        (part,) = [c for c in callbacks if isinstance(c, kind)]
        assert part.port is dm, kind
    # One run summary, handed to every part that writes to it (none looks for another).
    (summary,) = [c for c in callbacks if isinstance(c, RunSummary)]
    for kind in (HeldOutEval, PRMUpdate, RoundProtocol, WallTime):
        (part,) = [c for c in callbacks if isinstance(c, kind)]
        assert part.summary is summary, kind
    # One wall clock, handed to the data module and every callback that times its work.
    (wall,) = [c for c in callbacks if isinstance(c, WallTime)]
    for part in [dm, *(c for c in callbacks if isinstance(c, (HeldOutEval, PRMUpdate, RoundProtocol)))]:
        assert part.wall is wall, type(part)
    names = [type(c).__name__ for c in callbacks]
    assert names.index("RunSummary") < names.index("HeldOutEval")  # its clock starts before the base evaluation
    assert "WeightSync" not in names and "HardSetRefresh" not in names  # folded into the round protocol
    assert names.index("RoundProtocol") < names.index("ModelCheckpoint")  # the round ends before the save


class CountingPort:
    """A stand-in data module: counts what the round protocol asks of it."""

    def __init__(self, rounds_every: int = 2) -> None:
        self.pushes, self.refreshes, self.rounds_every, self.rounds_completed = [], 0, rounds_every, 0
        self.epoch_results, self.epoch_metrics, self.generated_tokens = [], {}, 0

    def finish_search_ahead(self, abandon):
        self.pushes.append(("search ahead ended", abandon))

    def push_weights(self, policy, version):
        self.pushes.append(version)
        return True

    def search_after_push(self):
        self.pushes.append("search started after the push")

    def round_ends(self, epoch):
        return (epoch + 1) % self.rounds_every == 0

    def end_round(self, tokenizer):
        self.refreshes += 1
        self.rounds_completed += 1
        return {"round/hard_set_size": 3.0, "round/cached": 1.0}

    def round_facts(self):
        return {"hard_set_size": 3, "cached": 1, "generated_tokens": self.generated_tokens}

    def use_value_model(self, value_fn):
        pass


def test_each_epoch_end_pushes_the_weights_once_and_a_round_end_refreshes_once():
    port = CountingPort(rounds_every=2)
    ended = []
    evaluation = SimpleNamespace(end_round=lambda trainer, module, index, facts, **kw: ended.append((index, facts, kw)))
    value_model = SimpleNamespace(collect=lambda results: None, end_round=lambda *a: False)
    protocol = RoundProtocol(port, evaluation, value_model, summary=SimpleNamespace())
    module = SimpleNamespace(policy="policy", tokenizer="tok", log_dict=lambda metrics: None)
    for epoch, step in [(0, 4), (1, 8), (2, 12)]:
        trainer = SimpleNamespace(current_epoch=epoch, global_step=step, max_epochs=3, max_steps=-1,
                                  is_global_zero=False, callbacks=[])
        protocol.on_train_epoch_end(trainer, module)
        assert [p for p in port.pushes if isinstance(p, int)][-1] == step
    # One push per epoch boundary, with the step as the version, after the search ahead ended
    # (--data.async_search; stopped, not waited for, when the run ends there); the next search
    # ahead starts after the push and the round's end, unless the run ends there.
    after = "search started after the push"
    assert port.pushes == [("search ahead ended", False), 4, after, ("search ahead ended", False), 8, after,
                           ("search ahead ended", True), 12]
    assert port.refreshes == 1  # epoch 1 ended round 1
    assert [(index, kw) for index, _, kw in ended] == [(1, {"last": False}), (2, {"partial": True})]


@pytest.mark.slow
def test_a_fit_pushes_the_weights_once_per_epoch(tmp_path, monkeypatch):
    from flywheel.__main__ import main

    pushes = []
    push = SearchDataModule.push_weights
    monkeypatch.setattr(SearchDataModule, "push_weights",
                        lambda self, policy, version: pushes.append(version) or push(self, policy, version))
    cli = main(["fit", "--config", str(QUICKSTART), "--trainer.max_epochs=2", "--data.batching.problems_per_epoch=4",
                "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=4", "--data.eval.samples=1",
                "--data.eval.at_start=false", "--data.search.expansion_width=2", "--data.search.trajectories_per_tree=2",
                "--data.epochs_per_round=1", f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"])
    assert cli.trainer.current_epoch == 2
    assert len(pushes) == 2 and pushes[-1] == cli.trainer.global_step  # one per epoch end (it used to be two)


def test_the_data_module_reaches_the_lightning_module_only_through_its_policy_port():
    """One property (SearchDataModule.policy_port, typed flywheel.ports.PolicyPort) reads
    `trainer.lightning_module`; everything else of the data module goes through it, and reads
    only the port's members from it."""
    from flywheel.ports import PolicyPort

    def is_port(node) -> bool:  # `self.policy_port`, or `self.policy_port if ... else None`
        if isinstance(node, ast.IfExp):
            return is_port(node.body)
        return isinstance(node, ast.Attribute) and node.attr == "policy_port"

    members = set(PolicyPort.__annotations__) | {n for n, v in vars(PolicyPort).items() if callable(v)}
    reaching, read = [], set()
    for name, tree in sources("data_modules"):
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef):
                continue
            aliases = set()  # local names bound to the port
            for node in ast.walk(func):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        pairs = (zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple)
                                 and isinstance(node.value, ast.Tuple) else [(target, node.value)])
                        aliases |= {t.id for t, v in pairs if isinstance(t, ast.Name) and is_port(v)}
            for node in ast.walk(func):
                if isinstance(node, ast.Attribute) and node.attr == "lightning_module":
                    reaching.append(f"{name}:{func.name}")
                if isinstance(node, ast.Attribute) and (is_port(node.value) or (
                        isinstance(node.value, ast.Name) and node.value.id in aliases)):
                    read.add(node.attr)
    assert reaching == ["data_modules/search.py:policy_port"]
    assert read and read <= members, read - members

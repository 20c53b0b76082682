"""Bad input and faults, third sweep (issue 49, item 4): a damaged policy folder, a tokenizer
without a chat template or a pad token, and a problem file listed twice. Each used to end in a
traceback or pass without a word; each is now one line naming the file and the fix, or a
warning where the run is still right. The vLLM cases (a server SIGKILLed mid-search, a weight
push that fails halfway) are in tests/test_vllm_faults.py; two fits into one folder in
tests/test_run_outputs.py."""

import json
import logging
import shutil
from pathlib import Path

import pytest

from flywheel.__main__ import main
from flywheel.assets import asset_path
from flywheel.policies.check import chat_template_warning, safetensors_problem
from flywheel.policies.load import load_policy
from flywheel.run.preflight import PreflightError
from flywheel.tasks.countdown import CountdownTask
from flywheel.tasks.math import MathTask
from flywheel.tasks.sources import load_problems

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "conf" / "quickstart.yaml")
TINY_POLICY = asset_path("policies", "tiny-countdown")


def policy_copy(tmp_path: Path, name: str = "policy") -> Path:
    folder = tmp_path / name
    shutil.copytree(TINY_POLICY, folder)
    return folder


def refused(args: list[str], *needles: str) -> str:
    with pytest.raises(PreflightError) as err:
        main(args, run=args[:1] != ["--config"])
    message = str(err.value)
    assert "\n" not in message and all(n in message for n in needles), message
    return message


@pytest.mark.parametrize("damage, needle", [
    ("half", "model.safetensors is truncated: 906,792 of its 1,813,584 bytes are there"),
    ("empty", "model.safetensors is empty or cut short (0 bytes)"),
    ("header", "model.safetensors is truncated or not a safetensors file: its header claims"),
    ("longer", "model.safetensors is damaged: 3 bytes more than its tensors take"),
])
def test_a_truncated_or_corrupt_safetensors_file_is_one_line(tmp_path, damage, needle):
    """Before: safetensors' "incomplete metadata, file not fully covered" as a traceback."""
    folder = policy_copy(tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    assert len(data) == 1_813_584 and safetensors_problem(weights) is None
    weights.write_bytes({"half": data[: len(data) // 2], "empty": b"", "header": b"\xff" * 8 + data[8:],
                         "longer": data + b"\x00\x00\x00"}[damage])
    refused(["eval", "--policy", str(folder), "--out", str(tmp_path / "e")],
            f"--policy={folder}: {folder} cannot be loaded: {needle}", "copy or download the folder again")
    refused(["--config", QUICK, f"--model.policy={folder}"], f"--model.policy={folder}", needle)


def test_a_tokenizer_without_a_pad_token_pads_with_its_end_token_and_without_an_end_token_is_refused(tmp_path, caplog):
    folder = policy_copy(tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["pad_token"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.INFO, logger="flywheel.policies.load"):
        _, tokenizer = load_policy(str(folder))
    assert tokenizer.pad_token == "<eos>" and "the tokenizer has no pad token; padding with its end token '<eos>'" in caplog.text

    del config["eos_token"]  # no end token anywhere: before, HFGenerator's "pass eos_token_id=..." as a traceback
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    for name in ("generation_config.json", "config.json"):
        settings = json.loads((folder / name).read_text())
        settings.pop("eos_token_id", None)
        (folder / name).write_text(json.dumps(settings))
    refused(["eval", "--policy", str(folder), "--out", str(tmp_path / "e")],
            f"--policy={folder}: {folder} cannot be loaded (ValueError: its tokenizer names no eos_token and its "
            "generation_config.json no eos_token_id, so a response could never end")


def test_a_task_asking_for_a_chat_template_the_tokenizer_lacks_is_warned_of(tmp_path):
    """Before: plain-text prompts without a word (an instruct model that lost its template answers badly)."""
    folder = policy_copy(tmp_path)
    _, tokenizer = load_policy(str(folder))
    warning = chat_template_warning(MathTask(), tokenizer, str(folder), "--data.task.init_args.chat_template")
    assert warning.startswith(f"MathTask asks for the tokenizer's chat template (--data.task.init_args.chat_template=true), "
                              f"but {folder.resolve()} has none")
    assert chat_template_warning(MathTask(chat_template=False), tokenizer, str(folder), "--x") is None
    assert chat_template_warning(MathTask(), tokenizer, "tiny-countdown", "--x") is None  # built-in: trained on plain text
    assert chat_template_warning(CountdownTask(), tokenizer, str(folder), "--x") is None  # asks for none
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert chat_template_warning(MathTask(), tokenizer, str(folder), "--x") is None


def test_a_problem_file_listed_twice_is_named(tmp_path):
    """Before: "duplicate problem id 'countdown-train-00000' ... ids must be unique", blaming the ids."""
    rows = (ROOT / "flywheel" / "assets" / "countdown" / "train.jsonl").read_text().splitlines()[:3]
    a = tmp_path / "a.jsonl"
    a.write_text("\n".join(rows) + "\n")
    (tmp_path / "link.jsonl").symlink_to(a)
    for twice in ([str(a), str(a)], [str(a), str(tmp_path / "." / "a.jsonl")], [str(a), str(tmp_path / "link.jsonl")]):
        with pytest.raises(ValueError, match=rf"the list names {twice[1]} twice \(entries 1 and 2 are the same file {a}\): "
                                             "its problems would count twice; list it once"):
            load_problems(CountdownTask(), twice, "train")
    refused(["fit", "--config", QUICK, f"--data.problems.train_files=[{a},{a}]", f"--trainer.logger.init_args.save_dir={tmp_path}"],
            f"the list names {a} twice",
            "[--data.problems.train_files]")


def test_a_generator_that_fails_mid_fit_names_the_checkpoint_and_the_command_that_resume(tmp_path, monkeypatch):
    """A sidecar past its retries and restarts (tests/test_vllm_sidecar.py kills a real server
    and breaks its relaunch) ends the fit in one line naming the newest checkpoint and the resume
    command (before: a traceback). Nothing of the failed epoch is kept: the resume redoes it.
    The failure is injected where the data module calls the search."""
    import torch

    from data_modules.search import SearchDataModule
    from flywheel.generation.vllm.client import SidecarError
    from flywheel.run.errors import GeneratorFailure

    args = ["fit", "--config", QUICK, "--data.batching.problems_per_epoch=4", "--data.batching.mini_batch_problems=4",
            "--data.eval.samples=1", "--data.problems.max_train_problems=8", "--data.problems.max_eval_problems=2",
            "--data.eval.at_start=false", "--data.search.max_expansions_per_tree=4", "--data.search.trajectories_per_tree=2",
            "--data.epochs_per_round=2", "--trainer.max_epochs=2", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    search = SearchDataModule.epoch_search

    def server_gone_in_epoch_1(self, tokenizer, epoch, *rest):
        if epoch == 1:
            raise SidecarError("vLLM request http://127.0.0.1:9/v1/completions failed 3 times: the vLLM server at "
                               "http://127.0.0.1:9 exited with code 3 while starting")
        return search(self, tokenizer, epoch, *rest)

    monkeypatch.setattr(SearchDataModule, "epoch_search", server_gone_in_epoch_1)
    last = tmp_path / "quickstart" / "checkpoints" / "last.ckpt"
    with pytest.raises(GeneratorFailure) as failed:
        main(args)
    assert str(failed.value) == (
        "the generator failed in epoch 1: vLLM request http://127.0.0.1:9/v1/completions failed 3 times: the vLLM server "
        "at http://127.0.0.1:9 exited with code 3 while starting. Nothing of epoch 1 was kept; "
        f"{last} (the newest checkpoint) resumes the run at its start, after fixing the cause: python -m flywheel "
        + " ".join(args) + " --ckpt_path last")
    # epoch 0's end-of-epoch checkpoint, untouched: `--ckpt_path last` redoes epoch 1 (tests/test_resume.py)
    assert torch.load(last, weights_only=False)["epoch"] == 0

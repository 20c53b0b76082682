"""Run `flywheel fit` and record, per rank, what each epoch searched and how many optimizer
steps the rank took, as JSON in $FLYWHEEL_TEST_RECORD/rank_<R>.json (for the DDP test).

    FLYWHEEL_TEST_RECORD=DIR python tests/scripts/record_fit.py fit-arguments...

Recorded per epoch: the epoch's whole problem list (drawn identically on every rank), the
problems this rank searched and those its rollouts solved; after each round's end the
curriculum's state (hard set, replay buffer, round, cursor, token and solved ledgers); the
curriculum's state right after a checkpoint restored it; the checkpoint files this rank wrote;
at teardown: the rank's global step, world size and solved-problems ledger (data_modules.solved).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data_modules.search import SearchDataModule  # noqa: E402
from flywheel.__main__ import main  # noqa: E402
from flywheel.run.checkpoint import AtomicCheckpointIO  # noqa: E402

RECORD = Path(os.environ["FLYWHEEL_TEST_RECORD"])
epochs: list[dict] = []
rounds: list[dict] = []
restored: list[dict] = []
saved: list[str] = []
next_problems, rollouts, teardown = SearchDataModule.next_problems, SearchDataModule.rollouts, SearchDataModule.teardown
end_round, load_state_dict, save_checkpoint = SearchDataModule.end_round, SearchDataModule.load_state_dict, AtomicCheckpointIO.save_checkpoint


def _next_problems(self, count):
    problems = next_problems(self, count)
    epochs.append({"epoch": self.trainer.current_epoch, "all": [p.id for p in problems], "mine": []})
    return problems


def _rollouts(self, problems, tokenizer, epoch, rank):
    out = rollouts(self, problems, tokenizer, epoch, rank)
    if epochs and epochs[-1]["epoch"] == epoch and not epochs[-1]["mine"]:
        epochs[-1].update(mine=[p.id for p in problems], solved=sorted(out.solved))
    return out


def _end_round(self, tokenizer):
    out = end_round(self, tokenizer)
    rounds.append({"epoch": self.trainer.current_epoch, "curriculum": self.curriculum.state_dict()})
    return out


def _load_state_dict(self, state):
    load_state_dict(self, state)
    restored.append({"curriculum": self.curriculum.state_dict(), "grading": self.grader.counts()})


def _save_checkpoint(self, checkpoint, path, storage_options=None):
    saved.append(Path(str(path)).name)
    return save_checkpoint(self, checkpoint, path, storage_options)


def _teardown(self, stage):
    trainer = self.trainer
    if stage == "fit" and trainer is not None:
        RECORD.mkdir(parents=True, exist_ok=True)
        record = {"rank": trainer.global_rank, "world": trainer.world_size, "global_step": trainer.global_step,
                  "epochs": epochs, "solved": self.curriculum.solved.to_json(), "rounds": rounds, "restored": restored,
                  "saved": saved, "grading": self.grader.counts(),
                  "cluster": type(trainer.strategy.cluster_environment).__name__}
        (RECORD / f"rank_{trainer.global_rank}.json").write_text(json.dumps(record))
    return teardown(self, stage)


SearchDataModule.next_problems, SearchDataModule.rollouts, SearchDataModule.teardown = _next_problems, _rollouts, _teardown
SearchDataModule.end_round, SearchDataModule.load_state_dict = _end_round, _load_state_dict
AtomicCheckpointIO.save_checkpoint = _save_checkpoint

if __name__ == "__main__":
    main(sys.argv[1:])

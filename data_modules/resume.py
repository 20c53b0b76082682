"""The data module's part of a checkpoint: the curriculum (hard set, replay buffer, round,
cursor), the run's token counters, when the problems are streamed the stream's position,
and with `--data.async_search` the problems drawn for the search ahead that is not trained on
yet (the resume searches them again: data_modules.search_ahead), under a format tag. Lightning stores it in every
checkpoint and restores it before the first `train_dataloader()` of a resumed run."""

from __future__ import annotations

from typing import Any, Mapping

from data_modules.curriculum import Curriculum
from data_modules.search_ahead import SearchAhead
from flywheel.tasks.grading import Grader

STATE_FORMAT = "flywheel.search_data_module/v1"


def data_state(curriculum: Curriculum, generated_tokens: int, screening_tokens: int,
               stream: Mapping[str, int] | None = None, ahead: Mapping[str, Any] | None = None,
               grading: Mapping[str, int] | None = None) -> dict[str, Any]:
    state = {"format": STATE_FORMAT, **curriculum.state_dict(), "generated_tokens": generated_tokens,
             "screening_tokens": screening_tokens}
    if stream is not None:  # absent without a stream (and in checkpoints from before streams)
        state["stream"] = dict(stream)
    if ahead is not None:  # absent with nothing drawn ahead (and in checkpoints from before it)
        state["search_ahead"] = dict(ahead)
    if grading is not None:  # the grading guard's counts (absent in checkpoints from before it)
        state["grading"] = dict(grading)
    return state


def restore_data_state(state: Mapping[str, Any], curriculum: Curriculum, source: str | None,
                       ahead: SearchAhead | None = None, grader: Grader | None = None) -> tuple[int, int, dict[str, int] | None]:
    """Load `state` into `curriculum`, the problems drawn ahead into `ahead` and the grading
    guard's counts into `grader`; returns
    (generated_tokens, screening_tokens, the stream's position or None). Raises
    ValueError naming the checkpoint `source` and the way out when the state is from another
    version or malformed (then nothing was restored)."""
    if state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"the checkpoint's SearchDataModule state has format {state.get('format')!r}, expected "
            f"{STATE_FORMAT!r}: it was written by another flywheel version; start a new run without --ckpt_path"
        )
    try:
        stream = state.get("stream")
        stream = {"epoch": int(stream["epoch"]), "drawn": int(stream["drawn"])} if stream is not None else None
        counters = int(state["generated_tokens"]), int(state["screening_tokens"]), stream
        drawn = SearchAhead()
        drawn.load(state.get("search_ahead"))
        grading = {key: int(value) for key, value in state.get("grading", {}).items()}
        curriculum.load_state_dict(state)
        if ahead is not None:
            ahead.load(drawn.state())
        if grader is not None:
            grader.restore(grading)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(
            f"the SearchDataModule state in checkpoint {source or '(unknown file)'} is malformed "
            f"({type(err).__name__}: {err}); nothing was restored. Way out: resume from another checkpoint of "
            "the run (--ckpt_path FILE), or start again without --ckpt_path"
        ) from err
    return counters

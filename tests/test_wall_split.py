"""flywheel.reporting.wall_split.WallSplit on a fake clock: sections count their own time only, a part
measured by another clock is carved out, and the split survives a checkpoint; and
callbacks.wall_time.split_of, the reported form."""

import pytest

from callbacks.wall_time import PARTS, split_of
from flywheel.reporting.wall_split import WallSplit, difference


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return FakeClock()


def test_a_nested_section_pauses_the_one_around_it(clock):
    split = WallSplit(clock)  # wall starts at t = 0
    clock.t = 1
    split.enter("rebuild")
    clock.t = 3
    split.enter("search")
    clock.t = 7
    assert split.exit("search") == 4
    clock.t = 8
    assert split.exit("rebuild") == 3  # 1 -> 3 and 7 -> 8: the search's 4 s are not the rebuild's
    clock.t = 10
    # rebuild 3 + search 4 = 7 of the 10 s wall: 3 s other (0 -> 1 and 8 -> 10).
    assert split.totals() == {"rebuild": 3, "search": 4, "wall": 10, "other": 3}


def test_the_generators_own_seconds_are_carved_out_of_the_search(clock):
    split = WallSplit(clock)
    generator = FakeClock(5.0)  # the generator's cumulative seconds, from earlier calls too
    with split.section("search", ("search_generator", generator)):
        clock.t, generator.t = 4, 7.5  # a 4 s search whose generator calls took 2.5 s
    assert split.totals() == {"search": 1.5, "search_generator": 2.5, "wall": 4, "other": 0}


def test_a_carved_part_is_at_most_the_sections_own_time(clock):
    split = WallSplit(clock)
    counter = FakeClock(0.0)
    with split.section("search", ("search_generator", counter)):
        clock.t, counter.t = 2, 9  # a counter that ran ahead (or elsewhere): 2 s, not 9
    with split.section("search", ("search_generator", counter)):
        clock.t, counter.t = 3, 1  # a counter that went back (a new generator): nothing carved
    assert split.totals() == {"search": 1, "search_generator": 2, "wall": 3, "other": 0}


def test_an_exception_closes_its_section_and_exit_closes_the_ones_left_inside(clock):
    split = WallSplit(clock)
    with pytest.raises(RuntimeError):
        with split.section("eval"):
            clock.t = 2
            raise RuntimeError("stopped")
    split.enter("train")
    clock.t = 3
    split.enter("checkpoint")  # never exited (an exception in Lightning's hooks)
    clock.t = 5
    assert split.exit("train") == 1  # train 2 -> 3; checkpoint 3 -> 5 closed with it
    assert split.exit("train") == 0.0  # not open: nothing happens
    split.enter("search")
    clock.t = 6
    split.exit_all()
    clock.t = 7
    assert split.totals() == {"eval": 2, "train": 1, "checkpoint": 2, "search": 1, "wall": 7, "other": 1}


def test_totals_count_the_open_section_so_far_and_differences_give_an_epoch(clock):
    split = WallSplit(clock)
    clock.t = 2
    mark = split.totals()  # {"wall": 2, "other": 2}
    split.enter("train")
    clock.t = 5
    now = split.totals()
    assert now == {"train": 3, "wall": 5, "other": 2}
    assert difference(now, mark) == {"train": 3, "wall": 3, "other": 0}
    clock.t = 6
    split.exit("train")
    assert split.totals()["train"] == 4  # counted once, not again from its start


def test_the_split_of_a_resumed_run_adds_both_parts(clock):
    first = WallSplit(clock)
    with first.section("search"):
        clock.t = 4
    clock.t = 10
    state = first.state_dict()  # search 4 of 10 s
    later = FakeClock(100.0)  # another process, another clock origin
    resumed = WallSplit(later)
    later.t = 101
    with resumed.section("train"):  # counted before the checkpoint was loaded: kept
        later.t = 102
    resumed.load_state_dict(state)
    with resumed.section("search"):
        later.t = 103
    # wall 10 + 3; search 4 + 1; train 1; other 13 - 6 = 7.
    assert resumed.totals() == {"train": 1, "search": 5, "wall": 13, "other": 7}


def test_overlapped_work_is_reported_beside_the_split_not_in_it(clock):
    split = WallSplit(clock)
    with split.section("train"):
        clock.t = 4
    split.add_overlapped("search", 3.0)  # a search on another thread during those 4 s
    assert split.totals() == {"train": 4, "wall": 4, "other": 0, "overlapped/search": 3.0}
    resumed = WallSplit(FakeClock())
    resumed.load_state_dict(split.state_dict())
    assert resumed.overlapped == {"search": 3.0}


def test_the_reported_split_names_every_part_and_adds_up_to_the_wall():
    totals = {"search": 1.5, "search_generator": 2.5, "train": 3.0, "checkpoint": 0.5, "wall": 10.0, "other": 2.5}
    out = split_of(totals)
    assert list(out)[: len(PARTS)] == [f"{p}_s" for p in PARTS]
    assert out["search_bookkeeping_s"] == 1.5 and out["search_s"] == 4.0 and out["eval_s"] == 0.0
    # busy = (generator 2.5 + train 3) / 10.
    assert out["busy_fraction"] == 0.55
    assert sum(out[f"{p}_s"] for p in PARTS) + out["other_s"] == pytest.approx(out["wall_s"])
    # A section of a name not among the parts is reported too, so the sum still holds.
    assert split_of({"warmup": 1.0, "wall": 2.0, "other": 1.0})["warmup_s"] == 1.0
    assert split_of({"wall": 0.0, "other": 0.0})["busy_fraction"] == 0.0


def test_one_time_work_stays_in_its_sections_and_is_counted_apart(clock):
    split = WallSplit(clock)
    with split.section("rebuild"):
        with split.once():  # the generator's launch, inside the first rebuild
            clock.t = 30
        clock.t = 40  # the search, after it
    with split.once(), split.section("eval"):  # the base evaluation
        with split.once():  # a once inside a once counts with the outer one
            clock.t = 60
    clock.t = 70
    # rebuild 40 + eval 20 = 60 of 70 s; one-time 30 + 20 = 50 s, inside those sections.
    assert split.totals() == {"rebuild": 40, "eval": 20, "wall": 70, "other": 10, "one_time": 50}
    reported = split_of(split.totals())
    assert reported["one_time_s"] == 50 and reported["wall_s"] == 70
    assert sum(reported[f"{p}_s"] for p in PARTS) + reported["other_s"] == reported["wall_s"]  # not a part
    resumed = WallSplit(FakeClock())
    resumed.load_state_dict(split.state_dict())
    with resumed.once():  # the resumed process launches its generator again
        resumed.clock.t = 5
    assert resumed.totals()["one_time"] == 55
    old = split.state_dict()
    del old["one_time"]  # a checkpoint from before one-time work was counted
    legacy = WallSplit(FakeClock())
    legacy.load_state_dict(old)
    assert "one_time" not in legacy.totals() and split_of(legacy.totals())["one_time_s"] == 0.0

"""`anysoftmax.testing.distributed.run_ranks`, the process runner under every multi-process test:
a rank whose work succeeded passes even when its interpreter's teardown would abort; a rank that
dies during its work raises, naming the ranks that had finished; a rank that hangs is killed."""

from __future__ import annotations

import atexit
import os
import time

import pytest

from anysoftmax.testing.distributed import run_ranks


def _write_then_abort_at_exit(rank: int, out: str) -> None:
    # stands for a C++ destructor that aborts while the interpreter is torn down
    atexit.register(os.abort)
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"rank {rank} done")


def _rank_one_aborts(rank: int) -> None:
    if rank == 1:
        os.abort()
    time.sleep(0.5)


def _rank_one_hangs(rank: int) -> None:
    if rank == 1:
        time.sleep(600)


def test_a_rank_that_finished_its_work_passes_whatever_its_teardown_does(tmp_path):
    out = str(tmp_path / "rank")
    run_ranks(_write_then_abort_at_exit, 2, (out,), 120)
    assert [open(f"{out}.{r}").read() for r in range(2)] == ["rank 0 done", "rank 1 done"]


def test_a_rank_that_dies_during_its_work_raises_and_names_the_ranks_that_finished():
    with pytest.raises(RuntimeError, match=r"process 1 terminated with signal SIGABRT.*finished _rank_one_aborts: "):
        run_ranks(_rank_one_aborts, 2, (), 120)


def test_a_rank_that_hangs_is_killed_after_the_timeout():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="2 processes still running after 5 s"):
        run_ranks(_rank_one_hangs, 2, (), 5)
    assert time.monotonic() - start < 120

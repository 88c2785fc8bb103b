"""Why an engine died, for the requests in it (cluster/engine/death.py)."""

from __future__ import annotations

import pytest

from cluster.engine.death import death_cause


@pytest.mark.parametrize("exit_codes", [[-9], [-15], [1, -9], [None, -9]])
def test_a_signal_on_any_engine_process_is_a_kill_from_outside(exit_codes):
    assert death_cause(exit_codes, killed_by_replica=False) == "killed"


@pytest.mark.parametrize("exit_codes", [[1], [0], [None], [], [1, None]])
def test_an_engine_that_ended_without_a_signal_crashed(exit_codes):
    assert death_cause(exit_codes, killed_by_replica=False) == "crashed"


def test_an_engine_its_replica_killed_for_hanging_was_killed():
    assert death_cause([1], killed_by_replica=True) == "killed"

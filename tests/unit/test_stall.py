"""Hung-engine detection (cluster/engine/stall.py): work held and no step for too long."""

from cluster.engine.stall import StepWatch, is_stalled


def test_an_idle_engine_is_never_stalled_however_long_it_waits():
    watch = StepWatch()
    assert watch.stalled_s(now=1_000.0) == 0.0
    watch.submitted(now=0.0)
    watch.stepped(now=0.1, has_requests=False)  # finished everything it had
    assert watch.stalled_s(now=1_000.0) == 0.0


def test_an_engine_with_requests_is_stalled_for_the_time_since_its_last_step():
    watch = StepWatch()
    watch.submitted(now=10.0)
    watch.stepped(now=10.5, has_requests=True)
    watch.stepped(now=11.0, has_requests=True)
    assert watch.stalled_s(now=11.0) == 0.0
    assert watch.stalled_s(now=71.0) == 60.0
    # a request handed over later does not reset the clock of an engine that stopped
    watch.submitted(now=50.0)
    assert watch.stalled_s(now=71.0) == 60.0


def test_a_request_handed_to_an_engine_that_looked_idle_starts_the_clock():
    watch = StepWatch()
    watch.stepped(now=5.0, has_requests=False)
    watch.submitted(now=100.0)  # the engine hung while idle: this request never steps
    assert watch.stalled_s(now=130.0) == 30.0
    watch.stepped(now=130.5, has_requests=True)  # it does step: the clock restarts
    assert watch.stalled_s(now=131.0) == 0.5


def test_a_request_the_engine_refused_leaves_no_stall_behind():
    """A request refused by the engine's input processor (a 400) never enters the engine,
    so no step follows it: it must not leave the clock running (it got a healthy engine
    killed a minute later)."""
    watch = StepWatch()
    watch.stepped(now=5.0, has_requests=False)
    watch.submitted(now=10.0)
    watch.refused()
    assert watch.stalled_s(now=1_000.0) == 0.0


def test_a_refusal_keeps_the_clock_of_other_work():
    watch = StepWatch()
    watch.submitted(now=10.0)  # entered, but the engine has not stepped since
    watch.submitted(now=11.0)
    watch.refused()            # the second was refused: the first is still unstepped
    assert watch.stalled_s(now=70.0) == 60.0
    watch.stepped(now=70.0, has_requests=True)
    watch.submitted(now=71.0)
    watch.refused()            # the engine still holds the first by its last step
    assert watch.stalled_s(now=100.0) == 30.0
    watch.refused()            # more refusals than submissions change nothing more
    assert watch.stalled_s(now=100.0) == 30.0


def test_a_stall_is_declared_from_the_limit_on_and_never_without_one():
    assert not is_stalled(59.9, 60.0)
    assert is_stalled(60.0, 60.0)
    assert not is_stalled(10_000.0, None)

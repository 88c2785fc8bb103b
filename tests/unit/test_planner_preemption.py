"""Preemption in the planner's simulator: a decode engine's answers grow their KV a token a
step, and when the next step does not fit, the sequence admitted last is preempted and
later computes its prompt and answer so far again (vLLM v1's recompute)."""

from __future__ import annotations

from tools.planner.des import ClusterSpec, EngineLimits, SimRequest, Simulation

STEP_S = 0.01


def _run(capacity: int, work: list[SimRequest]) -> tuple[Simulation, object]:
    """One decode engine (every request decode-local) with ``capacity`` KV tokens."""
    spec = ClusterSpec(0, 1, lambda n, p, c: STEP_S, lambda n, p, c: STEP_S, lambda t: 0.0,
                       decode_limits=EngineLimits(4096, 64, capacity), threshold_tokens=10**6)
    simulation = Simulation(spec, work)
    return simulation, simulation.run()


# three at once, 90-token prompts and 60-token answers: 270 tokens fit 300, 450 do not
WORK = [SimRequest(0.0, 90, 60) for _ in range(3)]


def test_answers_that_outgrow_the_kv_cache_preempt_the_latest_and_recompute_it():
    simulation, result = _run(300, WORK)
    assert result.preemptions >= 1
    assert all(o.e2e_s is not None for o in result.outcomes)
    assert sum(count for _, _, count in result.token_gaps) == sum(r.output_tokens - 1
                                                                  for r in WORK)
    # the preempted one waited for a slot and recomputed: one gap far above a step
    assert max(gap for _, gap, _ in result.token_gaps) > 10 * STEP_S
    engine = simulation.decode[0]
    assert engine.reserved == 0 and not engine.running and not engine.waiting
    # each prompt counted once, however often it was computed
    counted = result.prompt_tokens["decode"]
    assert counted["computed"] + counted["cached"] == sum(r.prompt_tokens for r in WORK)


def test_answers_that_fit_are_never_preempted_and_finish_sooner():
    _, roomy = _run(450, WORK)
    _, tight = _run(300, WORK)
    assert roomy.preemptions == 0
    assert max(gap for _, gap, _ in roomy.token_gaps) == STEP_S
    assert max(o.e2e_s for o in roomy.outcomes) < max(o.e2e_s for o in tight.outcomes)


def test_a_sequence_alone_is_never_preempted():
    simulation, result = _run(100, [SimRequest(0.0, 90, 60)])
    assert result.preemptions == 0 and result.outcomes[0].e2e_s is not None
    assert simulation.decode[0].reserved == 0

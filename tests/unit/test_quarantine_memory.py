"""What the router remembers of quarantined requests (router/quarantine_memory.py)."""

from __future__ import annotations

from types import SimpleNamespace

from router.quarantine_memory import QuarantineMemory, fingerprint


def test_a_request_is_known_by_its_prompt_and_its_sampling_parameters():
    seeded = SimpleNamespace(seed=5, n=2)
    assert fingerprint((1, 2, 3), seeded) == fingerprint((1, 2, 3), SimpleNamespace(seed=5, n=2))
    assert fingerprint((1, 2, 3), seeded) != fingerprint((1, 2, 4), seeded)
    assert fingerprint((1, 2, 3), seeded) != fingerprint((1, 2, 3), SimpleNamespace(seed=6, n=2))


def test_a_print_is_held_for_its_time_then_forgotten():
    memory = QuarantineMemory(ttl_s=10)
    memory.remember("a", now=0)
    assert memory.holds("a", now=9.9) and not memory.holds("b", now=1)
    assert not memory.holds("a", now=10) and len(memory) == 0


def test_the_oldest_print_is_forgotten_first_past_the_bound():
    memory = QuarantineMemory(ttl_s=100, max_entries=2)
    for index, print_ in enumerate("abc"):
        memory.remember(print_, now=index)
    assert [memory.holds(p, now=3) for p in "abc"] == [False, True, True]

"""A discrete-event simulation of a pdserve cluster (pure: seeded, no clock, no I/O).

Requests arrive at a router replica, which admits them by pdserve's own
``AdmissionController`` when a ``RouterTier`` is given (waiting for budget, or refused),
take the path pdserve's own policy gives them
(``router.disaggregation.choose_path``), are placed by the router's own rankings
(``rank_prefill``, ``rank_decode``) on load snapshots that are ``report_interval_s`` old
at most, as the replicas' reports are (each router replica with its own sends since and
its own ``OtherRouters``, from which it draws its first choice, unless
``shared_router_view``), and run on engines that schedule like vLLM v1:

- a step computes at most ``max_num_batched_tokens`` tokens: one for every running
  sequence first, then prompt chunks in arrival order (chunked prefill);
- at most ``max_num_seqs`` sequences run; a sequence is admitted when the KV of its prompt
  fits beside the running ones, and its answer's KV grows a token a step. On a decode
  engine, when the next step's tokens do not fit, the sequence admitted last is
  preempted: its KV freed (its prompt's blocks kept in the prefix cache) and it waits at
  the head of the queue to compute its prompt and its answer so far again (vLLM v1's
  recompute preemption);
- a step's time comes from the step cost model (tools/planner/cost_model.py);
- an engine keeps the KV blocks of finished sequences in its prefix cache (vLLM's: kept
  until their room is needed, least recently used out first), and a sequence it admits
  computes only the part of its prompt after the longest cached head.

A disaggregated request is prefilled on a prefill replica, its KV moves to a decode
replica (``Transfer``; only the blocks that replica's cache lacks), and its first token
comes from that replica's first step with it. A decode-local one is prefilled by its
decode engine, inside its steps. TTFT is the end of the step that made the first token;
each later token's gap is its step's time. A speculating decode engine (``speculation``,
tools/planner/speculation.py) also verifies each sequence's drafts in the step, at
their compute and KV cost; the drafts it accepts leave with the step's token, gaps of 0,
as a client sees a chunk of several tokens.

Prompts are not token lists here but chains of KV-block ids (``block_chain``): two
requests share a block exactly when they share the whole prefix up to it (a system
prompt of their group, the earlier turns of their conversation), as the router's block
hashes do. The router's beliefs about the caches are its own classes (``PrefixIndex``,
``DecodeCacheBelief``) fed those chains, so affinity and the cache-aware next turn
(router/disaggregation.py) are pdserve's policies too. A later turn of a conversation
arrives its think time after the turn before it finished (closed loop).

Each router replica of a ``RouterTier`` routes on what it alone knows, as pdserve's do:
the replicas' reports are the same for all of them, but the sends since those reports
(its ``PendingTally``), where it sent each prefix and what it believes each decode cache
holds are its own. Routers that cannot see each other's sends rank alike between two
reports, and can herd onto the same replica; a conversation's next turn may reach a
router that never saw its history.

The concepts live in modules of their own, all re-exported here: the requests and their
block chains (des_requests.py), the cluster (des_spec.py), the engines (des_engine.py),
the routers' routing (des_routing.py) and admission (des_admission.py), the clock
(des_events.py) and the results (des_results.py). This module runs a request through
them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tools.planner.des_admission import AdmissionTier
from tools.planner.des_engine import Engine, Seq, summed_prompt_tokens
from tools.planner.des_events import EventLoop
from tools.planner.des_requests import (
    AnswerReuse,
    SimRequest,
    block_chain,
    check_answer_reuse,
    repeated_tokens,
)
from tools.planner.des_results import Outcome, SimResult
from tools.planner.des_routing import Routing
from tools.planner.des_spec import ClusterSpec, EngineLimits, RouterTier, StepTime

__all__ = ["AnswerReuse", "ClusterSpec", "EngineLimits", "Outcome", "RouterTier",
           "SimRequest", "SimResult", "Simulation", "StepTime", "block_chain",
           "check_answer_reuse", "repeated_tokens"]


class Simulation(EventLoop):
    """One run of ``requests`` on the cluster ``spec``; ``rng`` breaks ranking ties."""

    def __init__(self, spec: ClusterSpec, requests: Sequence[SimRequest],
                 rng: random.Random | None = None):
        super().__init__()
        self.spec = spec
        self.requests = list(requests)
        self.rng = rng or random.Random(0)
        self.prefill = [Engine(f"p{i}", spec.prefill_limits, spec.prefill_step,
                               block_size=spec.block_size)
                        for i in range(spec.prefill_replicas)]
        self._draft_rng = random.Random(len(self.requests) + 1)   # speculation's draws
        self.decode = [Engine(f"d{i}", spec.decode_limits, spec.decode_step,
                              block_size=spec.block_size, speculation=spec.speculation,
                              draft_rng=self._draft_rng)
                       for i in range(spec.decode_replicas)]
        self.arrivals = [r.arrival_s for r in self.requests]
        self._followers: dict[int, list[int]] = {}
        for index, request in enumerate(self.requests):
            if request.follows is not None:
                self._followers.setdefault(request.follows, []).append(index)
        self.outcomes = [Outcome("") for _ in self.requests]
        self.gaps: list[tuple[float, float, int]] = []
        self._decode_seqs = 0
        self._concurrency = 0.0
        self._last_change = 0.0
        self._last_arrival = max((r.arrival_s for r in self.requests
                                  if r.follows is None), default=0.0)
        self.routing = Routing(spec, self.prefill, self.decode, self.rng, self)
        self.admission = AdmissionTier(spec.routers, len(self.requests), self,
                                       self._route, self._refused)

    def run(self) -> SimResult:
        """Every request through the cluster, until the last answer."""
        for index, request in enumerate(self.requests):
            if request.follows is None:
                self.at(request.arrival_s, lambda i=index: self._arrive(i))
        self.run_events()
        self._count_decode(0)
        return SimResult(self.requests, self.outcomes, self.gaps,
                         {"prefill": sum(e.busy_s for e in self.prefill),
                          "decode": sum(e.busy_s for e in self.decode)},
                         self._last_arrival,
                         self._concurrency, self.now, self.arrivals,
                         {"prefill": summed_prompt_tokens(self.prefill),
                          "decode": summed_prompt_tokens(self.decode)},
                         self.routing.reports, sum(e.preemptions for e in self.decode))

    # -- requests ------------------------------------------------------------------------

    def _arrive(self, index: int) -> None:
        self.arrivals[index] = self.now
        self.admission.arrive(index, self.requests[index])

    def _refused(self, index: int) -> None:
        self.outcomes[index].path = "refused"

    def _route(self, index: int) -> None:
        request = self.requests[index]
        cached = min(request.cached_tokens, request.prompt_tokens - 1)  # it computes the last
        seq = Seq(index, request.prompt_tokens, request.output_tokens, computed=cached,
                  chain=block_chain(request, request.prompt_tokens, self.spec.block_size),
                  router=self.routing.view_for(self.admission.router_of.get(index, 0)))
        choice = self.routing.path(seq)
        self.outcomes[index].path = choice.route
        if choice.route == "decode_local":
            self._to_decode(seq, self.routing.pick_decode(seq, choice.decode_replica))
            return
        engine = self.routing.pick_prefill(seq)
        self.routing.sent(seq, engine, f"prefill-{index}", request.prompt_tokens - cached)
        engine.waiting.append(seq)
        self._kick(engine, decoding=False)

    def _prefilled(self, engine: Engine, seq: Seq) -> None:
        """Its prefill replica is done with it; its decode replica is chosen, which pulls
        the blocks its cache lacks."""
        engine.ongoing -= 1
        engine.served += 1
        self.routing.completed(seq, engine, f"prefill-{seq.index}", "prefill")
        outcome = self.outcomes[seq.index]
        outcome.prefill_done_s = self.now - self.arrivals[seq.index]
        moved = Seq(seq.index, seq.prompt, seq.output, computed=seq.prompt, chain=seq.chain,
                    router=seq.router)
        engine = self.routing.pick_decode(moved)
        held = engine.cache.hit(moved.chain) * self.spec.block_size
        engine.prompt_tokens["cached"] += held
        engine.prompt_tokens["transferred"] += seq.prompt - held
        self.at(self.now + self.spec.transfer_s(seq.prompt - held),
                lambda: self._to_decode(moved, engine))

    def _to_decode(self, seq: Seq, engine: Engine) -> None:
        self.outcomes[seq.index].ready_s = self.now - self.arrivals[seq.index]
        self.outcomes[seq.index].decode_replica = engine.name
        self.routing.sent(seq, engine, f"decode-{seq.index}", seq.prompt - seq.computed)
        engine.waiting.append(seq)
        self._kick(engine, decoding=True)

    # -- engines -------------------------------------------------------------------------

    def _kick(self, engine: Engine, decoding: bool) -> None:
        """Start ``engine``'s next step, unless it is stepping or has nothing to do."""
        if engine.busy:
            return
        before = len(engine.running)
        engine.admit(self.now)
        if decoding:
            engine.make_room()
            self._count_decode(len(engine.running) - before)
        decoders, chunks, new, pairs, context = engine.plan_step(decoding)
        if new == 0:
            return
        took = engine.step_time(new, pairs, context)
        engine.busy = True
        if self.now <= self._last_arrival:   # utilization while traffic arrives, not the drain
            engine.busy_s += took
        self.at(self.now + took,
                lambda: self._stepped(engine, decoding, decoders, chunks, took))

    def _stepped(self, engine: Engine, decoding: bool, decoders: list, chunks: list,
                 took: float) -> None:
        """The step ends: its tokens are out, and who is done leaves the engine."""
        step = engine.finish_step(self.now, decoding, decoders, chunks, took)
        self.gaps.extend(step.gaps)
        for seq in step.first_tokens:
            self.outcomes[seq.index].ttft_s = self.now - self.arrivals[seq.index]
        for seq in step.done:
            engine.release(seq)
            if decoding:
                self._answered(engine, seq)
            else:
                engine.cache.keep(seq.chain)
                self._prefilled(engine, seq)
        if decoding:
            self._count_decode(-len(step.done))
        self._kick(engine, decoding)

    def _answered(self, engine: Engine, seq: Seq) -> None:
        """Its engine caches the prompt and answer (less the last token, never fed back),
        the router's belief records them, and the conversation's next turn is due."""
        request = self.requests[seq.index]
        outcome = self.outcomes[seq.index]
        outcome.e2e_s = self.now - self.arrivals[seq.index]
        outcome.decode_s = self.now - seq.admitted_s
        engine.ongoing -= 1
        engine.served += 1
        self.routing.completed(seq, engine, f"decode-{seq.index}", "decode")
        self.admission.released(seq.index)
        if seq.chain:
            whole = block_chain(request, seq.prompt + seq.output - 1, self.spec.block_size)
            engine.cache.keep(whole)
            self.routing.finished(seq, whole)
        for later in self._followers.get(seq.index, ()):
            self.at(self.now + self.requests[later].think_s,
                    lambda i=later: self._arrive(i))

    def _count_decode(self, change: int) -> None:
        """Sequences held by decode engines over time (Little's law's L)."""
        self._concurrency += self._decode_seqs * (self.now - self._last_change)
        self._last_change = self.now
        self._decode_seqs += change

"""A discarded sample leaves a seeded request's CPU generator as it was (shell).

vLLM 0.32 samples a token for every scheduled request, also for one whose prompt is only
partly computed (a chunk of a chunked prefill), and throws that token away. So that the
throw-away draw does not shift the request's seeded stream, ``GPUModelRunner.
_bookkeeping_sync`` rewinds the request's ``torch.Generator``:
``gen.set_offset(gen.get_offset() - 4)``. Only CUDA's Philox generators have an offset; a
CPU generator (``CPUModelRunner`` inherits the method) raises "CPU Generator does not use
offset", which kills the engine on any seeded request whose prompt is prefilled in chunks.

``keep_discarded_samples_unseen`` adapts the two methods on the CPU platform only (a GPU
engine never imports this module's patch): ``_sample`` first saves ``get_state()`` of the
CPU generators of the rows in ``discard_request_mask`` (set for this step by
``_prepare_inputs``, before ``sample_tokens`` runs ``_sample``; indexed, like
``input_batch.generators``, by the row in the input batch), and ``_bookkeeping_sync`` runs
with those rows' generators replaced by ``RewindToState``, whose ``set_offset`` puts the
saved state back instead. Between the two calls nothing draws from a generator (the
drafters and the grammar bitmask do not), rows move only in ``_update_states`` at the next
``execute_model``, and vLLM turns async scheduling off on CPU. So a seeded answer is the
same whether its prompt was computed in one pass, in chunks or by a prefill engine. Why:
docs/design.md, "A discarded sample leaves a seeded CPU generator as it was".
"""

from __future__ import annotations

from typing import Any

_SAVED = "_pdserve_discarded_generator_states"  # the runner's attribute: row -> state


def keep_discarded_samples_unseen() -> None:
    """Patch vLLM's ``CPUModelRunner`` (idempotent); nothing on any other platform."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    patch_runner(CPUModelRunner)


def patch_runner(runner_class: type) -> None:
    """Wrap ``runner_class``'s ``_sample`` and ``_bookkeeping_sync`` as the module says."""
    sample, bookkeeping_sync = runner_class._sample, runner_class._bookkeeping_sync
    if getattr(sample, "_pdserve_wrapped", False):
        return

    def _sample(self, *args, **kwargs):
        setattr(self, _SAVED, discarded_cpu_generator_states(self))
        return sample(self, *args, **kwargs)

    def _bookkeeping_sync(self, *args, **kwargs):
        saved = getattr(self, _SAVED, None)
        setattr(self, _SAVED, None)
        if not saved:
            return bookkeeping_sync(self, *args, **kwargs)
        batch = self.input_batch
        generators = batch.generators
        batch.generators = {**generators, **{
            row: RewindToState(generators[row], state) for row, state in saved.items()}}
        try:
            return bookkeeping_sync(self, *args, **kwargs)
        finally:
            batch.generators = generators

    _sample._pdserve_wrapped = True
    runner_class._sample = _sample
    runner_class._bookkeeping_sync = _bookkeeping_sync


def discarded_cpu_generator_states(runner: Any) -> dict[int, Any]:
    """``get_state()`` of each CPU generator whose row's sample this step will discard."""
    batch = runner.input_batch
    discard = runner.discard_request_mask.np[:batch.num_reqs]
    return {row: generator.get_state() for row, generator in batch.generators.items()
            if row < len(discard) and discard[row] and generator.device.type == "cpu"}


class RewindToState:
    """What ``_bookkeeping_sync``'s rewind sees in place of a CPU generator: its offset
    arithmetic becomes a return to the state saved before the discarded sample."""

    def __init__(self, generator: Any, state: Any) -> None:
        self._generator = generator
        self._state = state

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        self._generator.set_state(self._state)

"""A discarded sample leaves a seeded CPU generator as it was (cluster/engine/seeded_cpu.py).

vLLM's own ``GPUModelRunner._bookkeeping_sync`` runs on a stand-in model runner that
carries real CPU ``torch.Generator``s and samples as vLLM's CPU sampler does (one draw per
seeded request a step). Without the patch its rewind of a discarded sample raises; with it,
a discarded sample leaves the generator exactly as it was, a kept one advances it, and a
GPU-like generator gets vLLM's own offset arithmetic. Then a real engine on the tiny model
answers a seeded request whose prompt it prefills in chunks as it does in one pass.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from cluster.engine import seeded_cpu
from cluster.engine.seeded_cpu import patch_runner

MAX_LEN = 64


def draw(generator) -> int:
    """One draw as vLLM 0.32's CPU sampler makes it (``TopKTopPSampler.forward_cpu``)."""
    return int(torch.randint(0, 2**31, (1,), generator=generator, dtype=torch.long).item())


class GpuLikeGenerator:
    """A CUDA generator's offset, as ``_bookkeeping_sync`` uses it; it has no state to save."""

    device = torch.device("cuda")

    def __init__(self) -> None:
        self.offset = 0

    def get_offset(self) -> int:
        return self.offset

    def set_offset(self, offset: int) -> None:
        self.offset = offset

    def get_state(self):
        raise AssertionError("a GPU generator's state is never saved")


class StandInRunner:
    """What vLLM's ``_sample`` and ``_bookkeeping_sync`` read of a model runner, with vLLM's
    own ``_bookkeeping_sync``."""

    _bookkeeping_sync = GPUModelRunner._bookkeeping_sync
    use_async_scheduling = False
    max_model_len = MAX_LEN

    def __init__(self, generators: dict, discard: list[bool]) -> None:
        rows = len(discard)
        self.input_batch = types.SimpleNamespace(
            num_reqs=rows, generators=generators, req_ids=[f"r{i}" for i in range(rows)],
            req_id_to_index={f"r{i}": i for i in range(rows)},
            num_tokens_no_spec=np.zeros(rows, dtype=np.int32),
            token_ids_cpu=np.zeros((rows, MAX_LEN), dtype=np.int32),
            is_token_ids=np.zeros((rows, MAX_LEN), dtype=bool))
        self.discard_request_mask = types.SimpleNamespace(np=np.array(discard))
        self.requests = {f"r{i}": types.SimpleNamespace(output_token_ids=[])
                         for i in range(rows)}

    def _sample(self, logits, spec_decode_metadata):
        tokens = []
        for row in range(self.input_batch.num_reqs):
            generator = self.input_batch.generators.get(row)
            if isinstance(generator, GpuLikeGenerator):
                generator.offset += 4  # Philox's advance for one draw
            tokens.append(draw(generator) % 256 if isinstance(generator, torch.Generator)
                          else 7)
        return types.SimpleNamespace(sampled_token_ids=torch.tensor(tokens).view(-1, 1),
                                     logprobs_tensors=None)

    def _to_list(self, sampled_token_ids):
        return sampled_token_ids.tolist()

    def _get_prompt_logprobs_dict(self, hidden_states, num_scheduled_tokens):
        return {}

    def step(self) -> list[list[int]]:
        """``sample_tokens``'s two calls; the tokens kept for each row."""
        output = self._sample(None, None)
        rows = self.input_batch.num_reqs
        scheduler_output = types.SimpleNamespace(num_scheduled_tokens={})
        return self._bookkeeping_sync(scheduler_output, output, None,
                                      torch.zeros(rows, 1), rows)[3]


@pytest.fixture
def patched():
    class Runner(StandInRunner):
        pass

    patch_runner(Runner)
    patch_runner(Runner)  # idempotent: wrapped once
    return Runner


def seeded(seed: int) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return generator


def test_vllms_own_rewind_fails_on_a_cpu_generator():
    runner = StandInRunner({0: seeded(5)}, discard=[True])
    with pytest.raises(RuntimeError, match="CPU Generator does not use offset"):
        runner.step()


def test_a_discarded_sample_leaves_the_generator_as_it_was_and_a_kept_one_advances_it(patched):
    chunked, kept = seeded(5), seeded(6)
    chunked_before, kept_before = chunked.get_state(), kept.get_state()
    runner = patched({0: chunked, 1: kept}, discard=[True, False])
    tokens = runner.step()
    assert torch.equal(chunked.get_state(), chunked_before)
    assert not torch.equal(kept.get_state(), kept_before)
    once = seeded(6)
    draw(once)
    assert torch.equal(kept.get_state(), once.get_state())  # advanced by exactly one draw
    assert tokens[0] == [] and len(tokens[1]) == 1  # vLLM's own bookkeeping ran
    assert runner.input_batch.generators == {0: chunked, 1: kept}  # the real ones back
    assert runner.requests["r1"].output_token_ids == tokens[1]


def test_a_prompt_in_chunks_samples_what_it_samples_in_one_pass(patched):
    """Three discarded samples (the prompt's first chunks), then the kept one: the token a
    fresh generator draws first, as in one pass."""
    generator = seeded(5)
    runner = patched({0: generator}, discard=[True])
    for _ in range(3):
        assert runner.step() == [[]]
    runner.discard_request_mask.np[0] = False
    assert runner.step() == [[draw(seeded(5)) % 256]]


def test_a_gpu_like_generator_gets_vllms_own_rewind(patched):
    gpu, cpu = GpuLikeGenerator(), seeded(5)
    cpu_before = cpu.get_state()
    runner = patched({0: gpu, 1: cpu}, discard=[True, True])
    runner.step()
    assert gpu.offset == 0  # advanced by 4, rewound by vLLM's arithmetic
    assert torch.equal(cpu.get_state(), cpu_before)
    assert runner.input_batch.generators[0] is gpu


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "gpu"])
def test_only_the_cpu_platform_patches_vllms_runner(monkeypatch, cpu):
    from vllm.platforms import current_platform

    patched_classes = []
    monkeypatch.setattr(current_platform, "is_cpu", lambda: cpu)
    monkeypatch.setattr(seeded_cpu, "patch_runner", patched_classes.append)
    seeded_cpu.keep_discarded_samples_unseen()
    assert patched_classes == ([CPUModelRunner] if cpu else [])


# -- a real engine --------------------------------------------------------------------------

BUDGET = 64  # max_num_batched_tokens: tokens one engine step computes
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this process
              "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1",
              "TORCH_COMPILE_DISABLE": "1"}


def _seeded_answers(model: str, conn) -> None:
    """In a process of its own: one engine, a step of ``BUDGET`` tokens. A seeded prompt of
    60 tokens alone is computed in one pass; sent after a 10-token prompt, in two chunks
    (54 tokens beside the other's 10, then 6). Then a seeded n=2 request of 200 tokens (four
    chunks each). Sends back each seeded answer's tokens, or the error."""
    import os

    os.environ.update(ENGINE_ENV)
    from vllm import EngineArgs, SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.llm_engine import LLMEngine

    try:
        engine = LLMEngine.from_engine_args(EngineArgs(
            model=model, dtype="float32", max_model_len=512, enforce_eager=True,
            max_num_batched_tokens=BUDGET, enable_chunked_prefill=True,
            enable_prefix_caching=False, seed=0))  # no cache: each prompt computed in full

        def run(requests: list[tuple[list[int], SamplingParams]]) -> dict[str, list]:
            for i, (prompt, params) in enumerate(requests):
                engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
            answers: dict[str, list] = {}
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        answers[output.request_id] = [o.token_ids for o in output.outputs]
            return answers

        seeded = SamplingParams(temperature=1.0, seed=5, max_tokens=8, ignore_eos=True)
        prompt = [32 + (i * 7) % 90 for i in range(60)]
        one_pass = run([(prompt, seeded)])["0"]
        chunked = run([([65] * 10, SamplingParams(max_tokens=2)), (prompt, seeded)])["1"]
        pair = SamplingParams(temperature=1.0, seed=5, n=2, max_tokens=8, ignore_eos=True,
                              output_kind=RequestOutputKind.FINAL_ONLY)  # both choices
        long_prompt = [32 + (i * 11) % 90 for i in range(200)]
        twice = [run([(long_prompt, pair)])["0"] for _ in range(2)]
        conn.send((one_pass, chunked, twice))
    except Exception as error:  # the engine's error is the result
        conn.send(repr(error))


@pytest.mark.timeout(300)
def test_a_real_engine_samples_a_chunked_seeded_prompt_as_in_one_pass(tmp_path):
    import multiprocessing

    from cluster.config import TinyModelSpec
    from cluster.tiny_model import ensure_model

    model = ensure_model(tmp_path / "tiny", TinyModelSpec(
        num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=64,
        max_position_embeddings=512))
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_seeded_answers, args=(str(model), child))
    process.start()
    try:
        assert parent.poll(240), "the engine never answered"
        result = parent.recv()
    finally:
        process.join(60)
        if process.is_alive():
            process.kill()
    assert not isinstance(result, str), f"the engine failed: {result}"
    one_pass, chunked, twice = result
    assert chunked == one_pass
    assert twice[0] == twice[1] and len(twice[0]) == 2 and twice[0][0] != twice[0][1]

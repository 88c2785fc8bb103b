"""How failures inside the pools reach a client (router/failures.py), on Ray's and vLLM's
own exception types."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError
from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.exceptions import EngineDeadError

from router.failures import failure_kind, failure_response


def wrapped(cause: Exception) -> RayTaskError:
    """What a Serve handle raises for an exception inside the replica."""
    return RayTaskError("generate", "traceback text", cause)


def answer(error: BaseException) -> tuple[int, dict, dict]:
    response = failure_response(error, "cmpl-1")
    return response.status_code, json.loads(response.body)["error"], response.headers


@pytest.mark.parametrize("error", [EngineDeadError(), wrapped(EngineDeadError()),
                                   ActorDiedError()])
def test_a_dead_engine_or_replica_is_a_retryable_503(error):
    status, body, headers = answer(error)
    assert (status, body["code"]) == (503, "service_unavailable")
    assert headers["retry-after"]


def test_a_replica_that_died_is_told_from_one_that_may_come_back():
    """The retry policy spends no attempt on a replica Serve will not pick again."""
    assert failure_kind(ActorDiedError()) == failure_kind(wrapped(ActorDiedError())) == "died"
    assert failure_kind(EngineDeadError()) == "unavailable"
    assert failure_kind(ActorUnavailableError(error_message="busy", actor_id=None)) \
        == "unavailable"


def test_a_request_vllm_refuses_keeps_vllms_status_through_ray():
    status, body, _ = answer(wrapped(VLLMValidationError("bad stop", parameter="stop")))
    assert status == 400 and body["param"] == "stop"


def test_anything_else_is_a_500_without_internals():
    status, body, _ = answer(wrapped(RuntimeError("secret path /srv/x")))
    assert (status, body["code"]) == (500, "internal_error")
    assert "secret" not in body["message"] and "cmpl-1" in body["message"]


def test_an_engine_that_died_of_its_own_error_is_told_alone_from_among_others():
    """As it crosses Ray (pickled inside the replica's RayTaskError)."""
    import pickle

    from cluster.engine.messages import EngineCrashed

    alone = pickle.loads(pickle.dumps(wrapped(EngineCrashed("cmpl-1", 1))))
    shared = pickle.loads(pickle.dumps(wrapped(EngineCrashed("cmpl-1", 3))))
    assert failure_kind(alone) == "crashed"
    assert failure_kind(shared) == "crashed_shared"
    status, body, headers = answer(shared)  # if it reaches a client: retryable
    assert (status, body["code"]) == (503, "service_unavailable") and headers["retry-after"]


def test_a_plain_value_error_inside_a_replica_is_a_500_without_its_text():
    """Raised there it is a fault of the replica, not the client's request: neither a 400
    nor retried, and its text (paths, addresses) stays in the log."""
    error = wrapped(ValueError("bad state at /srv/pdserve 10.0.0.7"))
    assert failure_kind(error) == "internal"
    status, body, _ = answer(error)
    assert (status, body["code"]) == (500, "internal_error")
    assert "srv" not in body["message"] and "10.0.0.7" not in body["message"]


def test_a_plain_value_error_of_vllms_layer_in_the_router_is_vllms_400():
    assert failure_kind(ValueError("prompt too long")) == "refused"
    status, body, _ = answer(ValueError("prompt too long"))
    assert status == 400 and "prompt too long" in body["message"]

"""How failures inside the cluster reach a client (shell: knows Ray's exception types).

Kept out of ``router.server``: Serve captures the ingress class while that module is still
being imported, so helpers the class calls must live in a module imported before it.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi.responses import JSONResponse

from cluster.engine.messages import EngineCrashed
from router.errors import APIError, internal_error, service_unavailable
from router.retry import Failure

logger = logging.getLogger(__name__)


def error_response(error: APIError, request_id: str | None = None) -> JSONResponse:
    headers = dict(error.headers)
    if request_id:
        headers["x-request-id"] = request_id
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _raised(error: BaseException) -> BaseException:
    """What a replica raised: Ray wraps an exception inside a replica in ``RayTaskError``."""
    from ray import exceptions as ray_exceptions

    return error.cause if isinstance(error, ray_exceptions.RayTaskError) else error


def failure_kind(error: BaseException) -> Failure:
    """How the retry policy sees a failed stage (router/retry.py): the cluster's fault
    (a replica or engine gone or unavailable, a deadline passed), a refusal of the
    request itself, or something unexpected."""
    if isinstance(error, TimeoutError):
        return "deadline"
    if isinstance(error, APIError):
        return "unavailable" if error.status == 503 else "refused"
    from ray import exceptions as ray_exceptions
    from ray.serve import exceptions as serve_exceptions
    from vllm.v1.engine.exceptions import EngineDeadError

    if _vllms_refusal(error):
        return "refused"
    error = _raised(error)
    if isinstance(error, EngineCrashed):  # its engine died of its own error (no signal)
        return "crashed" if error.requests_in_engine <= 1 else "crashed_shared"
    if isinstance(error, ray_exceptions.ActorDiedError):
        return "died"
    if isinstance(error, serve_exceptions.BackPressureError
                  | serve_exceptions.DeploymentUnavailableError
                  | ray_exceptions.RayActorError | ray_exceptions.ActorUnavailableError
                  | EngineDeadError):
        return "unavailable"
    return "internal"


def _vllms_refusal(error: BaseException) -> bool:
    """vLLM refused the request itself: a ``VLLMClientError`` from anywhere, or a plain
    ``ValueError`` (vLLM's layer still raises some) raised here in the router. One raised
    inside a replica is a fault there, not the client's: its text must not reach the
    client as a 400 (nor would a retry help)."""
    from vllm.exceptions import VLLMClientError

    cause = _raised(error)
    return isinstance(cause, VLLMClientError) or (
        cause is error and isinstance(error, ValueError | TypeError | OverflowError))


def client_error(error: BaseException, request_id: str, log: bool = True) -> APIError:
    """What the client is told about a failure inside the pools (details go to the log,
    unless ``log`` is off: the caller logs it)."""
    if isinstance(error, APIError):
        return error
    kind = failure_kind(error)
    if kind == "deadline":
        if log:
            logger.warning("request %s: an engine passed its deadline", request_id)
        return service_unavailable("the model's engines did not answer in time; retry")
    # A dead engine too: Serve replaces its replica.
    if kind in ("died", "unavailable", "crashed_shared"):
        if log:
            logger.warning("request %s: engine unavailable: %r", request_id, error)
        return service_unavailable("the model's engines are unavailable; retry shortly")
    if log:
        logger.error("request %s failed: %r", request_id, error, exc_info=error)
    return internal_error(request_id)


def for_vllms_layer(error: Exception, request_id: str) -> Exception:
    """A failure of the pools as vLLM's serving layer is to see it: it writes the
    exception's text into a stream's error event. vLLM's own refusals pass as they are
    (unwrapped from Ray's exception, whose text holds a traceback); anything else becomes
    pdserve's answer to it, whose text holds no exception, address or process id."""
    from vllm.exceptions import GracefulHTTPError

    if (vllms := _vllms_to_answer(error)) is not None:
        return vllms
    answer = client_error(error, request_id, log=False)  # the router logs it as it answers
    return GracefulHTTPError(answer.message, HTTPStatus(answer.status))


def vllm_error_response(error: BaseException) -> JSONResponse | None:
    """vLLM's own answer to an error of its request handling (invalid sampling parameters,
    a grammar it cannot compile, ...), as its server gives it; None for other failures.

    An engine-side error arrives wrapped by Ray: its cause is what vLLM raised.
    """
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    vllms = _vllms_to_answer(error)
    if vllms is None:
        return None
    response = create_error_response(vllms)
    return JSONResponse(response.model_dump(), status_code=response.error.code)


def _vllms_to_answer(error: BaseException) -> BaseException | None:
    """The error vLLM's own handling answers (unwrapped from Ray's exception); None when
    pdserve answers it."""
    from vllm.exceptions import VLLMError, VLLMServerError

    cause = _raised(error)
    if cause is not error and not isinstance(cause, VLLMError):
        return None  # raised inside a replica: a fault there (failure_kind: "internal")
    if not isinstance(cause, VLLMError | ValueError | TypeError | OverflowError
                      | NotImplementedError):
        return None
    if isinstance(cause, VLLMServerError):  # a dead engine, say: pdserve's 503 or 500
        return None
    return cause


def failure_response(error: BaseException, request_id: str) -> JSONResponse:
    """The answer to a failed request: vLLM's to its own errors, pdserve's to the rest."""
    response = vllm_error_response(error)
    if response is None:
        response = error_response(client_error(error, request_id), request_id)
    return response

"""OpenAI-style errors (pure): every failure a client sees is one of these.

The body is ``{"error": {"message", "type", "param", "code"}}`` as OpenAI's API sends it,
so official clients raise their usual exception classes (``BadRequestError``, …).
"""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error answered to the client with ``status`` and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",  # OpenAI calls the field "type"
        param: str | None = None,
        code: str | int | None = None,  # pdserve's own are strings; vLLM's, the status
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def model_not_found(model: str) -> APIError:
    """An unknown served name, answered as vLLM's server answers it (its type, its code)."""
    return APIError(404, f"The model `{model}` does not exist.", "NotFoundError", "model", 404)


def route_not_found(path: str) -> APIError:
    return APIError(404, f"Unknown path {path}", "invalid_request_error", None, "not_found")


def method_not_allowed(method: str, path: str) -> APIError:
    return APIError(
        405, f"Method {method} is not allowed on {path}", "invalid_request_error", None,
        "method_not_allowed",
    )


def request_timeout(timeout_s: float) -> APIError:
    """A body that did not arrive within ``router.deadlines.body_s``."""
    return APIError(408, f"The request body did not arrive within {timeout_s:g} s",
                    "invalid_request_error", None, "request_timeout")


def service_unavailable(message: str, retry_after_s: int = 1) -> APIError:
    return APIError(
        503, message, "service_unavailable", None, "service_unavailable",
        headers={"Retry-After": str(retry_after_s)},
    )


def internal_error(request_id: str) -> APIError:
    # Never the exception text: it may hold internals. The id finds it in the logs.
    return APIError(
        500, f"Internal error while serving request {request_id}", "internal_error", None,
        "internal_error",
    )


def unauthorized(has_key: bool) -> APIError:
    # Never echo the key: it would land in client logs and proxies.
    message = ("Incorrect API key provided." if has_key else
               "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
    return APIError(401, message, "invalid_request_error", None, "invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})


def admin_key_required() -> APIError:
    return APIError(403, "This key may not use the admin endpoints; they take an admin key.",
                    "permission_error", None, "admin_key_required")


class Quarantined(APIError):
    """A request an engine died of, as far as pdserve can tell (router/retry.py,
    ``quarantines``): it is not sent to another engine, which it might kill too."""


def quarantined(request_id: str, resent: bool = False) -> Quarantined:
    """The 500 of a quarantined request; ``resent``: of the same request sent again
    moments later (router/quarantine_memory.py), refused before any engine saw it."""
    why = ("was not run: the same request made a model engine fail moments ago, and "
           "sending it again would fail the next one." if resent else
           "was not retried: a model engine failed while running it, and it could fail "
           "the next one too. Report it with this id.")
    return Quarantined(
        500, f"Request {request_id} {why} Changing the request (its length, its sampling "
        "parameters) may avoid the failure.", "internal_error", None, "internal_error")


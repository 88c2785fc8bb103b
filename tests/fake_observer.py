"""A stand-in for the router's ``RequestObserver`` that records what it was told, for the
tests of the request's accounting (lifecycle, engine client, vLLM's layer in the router)."""

from __future__ import annotations


class RecordingObserver:
    """Everything a ``RequestLifecycle`` reported, in order; it counts nothing itself (the
    real observer counts only the first outcome)."""

    def __init__(self):
        self.routes: list[tuple[str, int]] = []  # (path, prompt tokens) per prompt
        self.marks: list[str] = []               # timing marks: rendered, dispatched, ...
        self.token_counts: list[int] = []        # tokens per engine output
        self.outcomes: list[str] = []

    def routed(self, path: str, prompt_tokens: int) -> None:
        self.routes.append((path, prompt_tokens))

    def served_from_cache(self, prompt_tokens: int) -> None:
        self.routes.append(("cache", prompt_tokens))

    def rendered(self) -> None:
        self.marks.append("rendered")

    def dispatched(self) -> None:
        self.marks.append("dispatched")

    def prefilled(self) -> None:
        self.marks.append("prefilled")

    def answered(self) -> None:
        self.marks.append("answered")

    def tokens(self, count: int) -> None:
        self.token_counts.append(count)

    def faulted(self) -> None:
        self.marks.append("faulted")

    def finish(self, outcome: str) -> None:
        self.outcomes.append(outcome)

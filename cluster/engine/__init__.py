"""The engine both pools run: a vLLM ``AsyncLLM`` hosted in a Serve replica.

- ``host``: ``EngineHost``, the vLLM engine and its requests.
- ``replica``: ``EngineReplica``, the Serve deployment class that ``prefill/`` and
  ``decode/`` specialise.
- ``stats_logger``: vLLM's stat-logger callbacks turned into ``EngineStats`` and metrics.
- ``args``: the engine config turned into vLLM's arguments and environment (one place).
- ``messages``: what the router and the engines exchange (requests, prefill results, chunks).
- ``stats``, ``load_report``, ``routing_stats``: what a replica reports for replica choice,
  autoscaling and ``/admin/stats``.
- ``identity``: which NIXL side-channel address a replica's engine listens on.
"""

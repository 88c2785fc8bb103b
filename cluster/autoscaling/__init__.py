"""Per-pool autoscaling: pure, replayable policies and a thin Ray Serve adapter.

``config`` holds the pydantic models, ``schedule`` the standby floor of a time-of-day
schedule, ``policy`` the decisions for the prefill pool, the decode pool and both together,
and ``serve_policy`` maps Ray Serve's ``AutoscalingContext`` onto them.
"""

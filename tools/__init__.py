"""What is run *against* a pdserve cluster, never by one: load generation and comparisons
(``bench``), capacity planning by simulation (``planner``), the fixtures that start servers
for them and for the tests (``processes``, ``redis_local``), and one-off measurements
(``experiments``, not installed). No runtime module imports this package
(tests/unit/test_purity.py); docs/design.md, "Architecture", draws the two wings."""

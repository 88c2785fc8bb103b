"""``make soak``: steady mixed load on a two-replica cluster while replicas and engines are
killed and poison requests sent (shell: tools/soak/run.py; its verdicts, pure:
tools/soak/report.py). docs/reliability.md, "Soak", has what it prints and a run's figures."""

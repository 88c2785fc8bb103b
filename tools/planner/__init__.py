"""``pdserve plan``: size a cluster with a discrete-event simulation of pdserve's own
policies (docs/planning.md)."""

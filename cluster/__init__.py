"""The runtime's common ground: the config, the application Serve runs, the engine both pools
host (``engine/``), each pool's autoscaling (``autoscaling/``), metrics, and the ``pdserve``
command. docs/design.md, "Architecture", places it among the other packages."""

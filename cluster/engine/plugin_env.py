"""The engine plugin's settings, as environment variable names (pure).

cluster/engine/vllm_plugin.py reads them in vLLM's processes; ``engine.args`` sets them, and
names them here so that it need not import the plugin."""

WAIT_ENV = "PDSERVE_ENGINE_WAIT"
EMPTY_STEP_SLEEP_ENV = "PDSERVE_EMPTY_STEP_SLEEP"
NICE_ENV = "PDSERVE_SCHEDULER_NICE"

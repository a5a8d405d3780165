"""The vLLM engine: its config, the engine and its step loop, the worker extension that reloads
weights in place, the model directory, placement, bucketed publishes and the vLLM teacher; and
the engine over vLLM servers on other machines (``server_*``: config, HTTP client, the fleet of
servers, publishes into them, the engine).

Nothing here imports vLLM at import time: :mod:`.config` is read by YAML and the CLI on machines
without it, and the engine imports vLLM when it is built.
"""

__all__: list[str] = []  # its public names are exported once, by thundersync_lightning.rollout

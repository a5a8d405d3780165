"""The vLLM engine: its config, the engine and its step loop, the worker extension that reloads
weights in place, the model directory, placement, bucketed publishes and the vLLM teacher.

Nothing here imports vLLM at import time: :mod:`.config` is read by YAML and the CLI on machines
without it, and the engine imports vLLM when it is built.
"""

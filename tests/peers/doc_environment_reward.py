"""A TRL reward standing in for TRL's ``environment_factory`` wrapper of ``get_reward``: the values
our environment gave, carried in a column (imported by the TRL venv: standard library only)."""


def scratchpad(environment_reward, **kwargs):  # noqa: ANN001, ANN003, ANN201 - TRL's reward signature
    return list(environment_reward)

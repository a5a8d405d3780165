"""SWE-bench: instances from a local file, the agent loop in the instance's image, swebench grading.

:mod:`.source` is the task source, :mod:`.workspace` an episode's container workspace, and
:mod:`.eval_run` the graded eval run inside it.
"""

from .source import SWEbenchTasks, load_instances
from .workspace import SWEbenchSettings, SWEbenchWorkspace

__all__ = ["SWEbenchSettings", "SWEbenchWorkspace", "SWEbenchTasks", "load_instances"]

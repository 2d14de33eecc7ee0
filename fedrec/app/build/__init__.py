"""Turn a composed config into a task, checking it first.

* :mod:`~fedrec.app.build.kinds`: the task kinds, each registered with its builder and config groups;
* :mod:`~fedrec.app.build.groups`: the checks of a config's groups and fields against its kind, and instantiating a
  group so that its errors name it;
* :mod:`~fedrec.app.build.builders`: the builders of the three kinds fedrec ships;
* :mod:`~fedrec.app.build.capacity`: refusing a run too large for the memory, from the estimates its objects state;
* :mod:`~fedrec.app.build.data`: the dataset a run reads, fetched first when asked.
"""
from fedrec.app.build.builders import build_task
from fedrec.app.build.capacity import (
    available_memory,
    bandit_memory_estimate,
    check_fits,
    largest_chunk,
    multi_agent_memory_estimate,
    recommendation_memory_estimate,
)
from fedrec.app.build.data import RunDataset, build_task_fetching_data, run_dataset
from fedrec.app.build.groups import (
    check_groups,
    check_ignored,
    check_privacy,
    check_used,
    group_class,
    group_target,
    ignored_fields,
    instantiate_group,
    one_line,
    task_kind,
    unused_groups,
)
from fedrec.app.build.kinds import KINDS, Kind, register_kind

__all__ = [
    "KINDS", "Kind", "RunDataset", "available_memory", "bandit_memory_estimate", "build_task",
    "build_task_fetching_data", "check_fits", "check_groups", "check_ignored", "check_privacy", "check_used",
    "group_class", "group_target", "ignored_fields", "instantiate_group", "largest_chunk",
    "multi_agent_memory_estimate", "one_line", "recommendation_memory_estimate", "register_kind", "run_dataset",
    "task_kind", "unused_groups",
]

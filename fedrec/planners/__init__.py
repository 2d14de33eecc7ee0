"""Privacy-budget planners: trainer callbacks that set every client's budget before each round."""
from fedrec.planners.base import BudgetPlanner, SchedulePlanner
from fedrec.planners.baselines import ADAPPlanner, ADPMLPlanner, UniformPlanner
from fedrec.planners.bgtplanner import BGTPlanner

__all__ = ["ADAPPlanner", "ADPMLPlanner", "BGTPlanner", "BudgetPlanner", "SchedulePlanner", "UniformPlanner"]

"""fedrec: federated recommendation and federated bandits.

The public API lives in the subpackages (each lists its names in ``__all__``): :mod:`fedrec.bandits`,
:mod:`fedrec.protocols`, :mod:`fedrec.envs`, :mod:`fedrec.federation`, :mod:`fedrec.privacy`, :mod:`fedrec.planners`,
:mod:`fedrec.models`, :mod:`fedrec.recsys`, :mod:`fedrec.data`, :mod:`fedrec.tasks`, :mod:`fedrec.trainer`, and the
modules :mod:`fedrec.aggregation`, :mod:`fedrec.metrics` and :mod:`fedrec.errors`. :mod:`fedrec.app` holds the
command lines and the builders they run on, :mod:`fedrec.utils` the leaf utilities. ``import fedrec`` itself imports
nothing (not even torch).
"""

__all__: list[str] = []

"""Bandit environments: synthetic linear worlds, streams built from real interaction logs, and multi-agent
multi-armed bandits (synthetic :mod:`fedrec.envs.mab`, UCI diabetes :mod:`fedrec.envs.diabetes`)."""

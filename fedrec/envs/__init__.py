"""Bandit environments: synthetic linear worlds and streams built from real interaction logs."""

"""Plain reference implementations of fedrec's protocols: the tests' oracles and the benchmarks' baselines."""

"""Leaf utilities the whole library builds on: keyed random draws (:mod:`.rng`), numba compilation
(:mod:`.jit`), atomic files (:mod:`.io`), seeded generators, thread counts, tables, lazy package exports, and the
commands and stop requests fedrec leaves for the user. They import nothing of fedrec above :mod:`fedrec.errors`."""

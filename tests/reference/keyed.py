"""fedrec's keyed uniforms in plain Python integers (splitmix64's output function): the oracle of the keyed draws."""
from __future__ import annotations

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(z: int) -> int:
    """splitmix64's finaliser on a 64-bit integer."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_uniform(key: int, owner: int, counter: int) -> float:
    """Uniform ``counter`` of ``owner``'s stream under ``key``, in (0, 1)."""
    state = mix(key ^ mix((owner + GOLDEN) & MASK))
    bits = mix((state + (counter + 1) * GOLDEN) & MASK)
    return ((bits >> 11) + 0.5) * 2.0 ** -53

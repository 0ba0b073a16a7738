"""Divisors and prime factors of loop extents: the values a tile knob may take, and the moves between them.

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import functools
import math


@functools.cache
def divisors(n: int) -> tuple[int, ...]:
    """Divisors of `n` ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


@functools.cache
def prime_factors(n: int) -> tuple[int, ...]:
    """Distinct prime factors of `n`."""
    out, p = [], 2
    while p * p <= n:
        if n % p == 0:
            out.append(p)
            while n % p == 0:
                n //= p
        p += 1
    if n > 1:
        out.append(n)
    return tuple(out)

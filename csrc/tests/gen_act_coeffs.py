"""Prints the constants of csrc/dp_act.c (needs mpmath; run once, pasted by hand).

1. The normal CDF's tail for GELU. With z = |x| / sqrt(2) and t = 3 / (3 + z) in (0, 1],
       0.5 erfc(z) = 0.5 t exp(-x^2 / 2) g(t),   g(t) = erfc(z) exp(z^2) (3 + z) / 3,
   and g is smooth on [0, 1] (g(0) = 1 / (3 sqrt(pi))), so a Chebyshev series in u = 2t - 1
   covers the whole half-line with one polynomial (the idea of Numerical Recipes' erfccheb,
   3rd ed. 6.2.2, with the scale 3 instead of 2: fewer terms). Printed: a_0 .. a_23 with
   g = sum_k a_k T_k(u) (a_0 already halved). Degree 23 gives 4e-16 relative error in double,
   degree 10 gives 2.5e-7 in float (rounding-limited; measured over z in [0, 30]).
2. tanh near 0: the Lambert continued fraction tanh x = x / (1 + x^2 / (3 + x^2 / (5 + ...)))
   cut after 2n + 1 is x P(x^2) / Q(x^2) with integer coefficients; |x| <= 0.55: n = 7 is
   8e-19 relative (double), n = 4 is 2e-10 (float).
"""

from fractions import Fraction

import mpmath as mp

mp.mp.dps = 40
SCALE = 3


def g(t):
    z = SCALE / t - SCALE
    return mp.erfc(z) * mp.exp(z * z) * (SCALE + z) / SCALE


def chebyshev(f, n, nodes=160):
    us = [mp.cos(mp.pi * (q + mp.mpf(1) / 2) / nodes) for q in range(nodes)]
    vals = [f((u + 1) / 2) for u in us]
    a = [
        2
        * sum(v * mp.cos(mp.pi * j * (q + mp.mpf(1) / 2) / nodes) for q, v in enumerate(vals))
        / nodes
        for j in range(n)
    ]
    a[0] /= 2
    return a


def lambert(n):
    num, den = [Fraction(2 * n + 1)], [Fraction(1)]
    for k in range(n - 1, -1, -1):
        new = [Fraction(0)] * max(len(num), len(den) + 1)
        for i, c in enumerate(num):
            new[i] += (2 * k + 1) * c
        for i, c in enumerate(den):
            new[i + 1] += c
        num, den = new, num
    return den, num  # tanh x = x P(x^2) / Q(x^2)


if __name__ == "__main__":
    for k, a in enumerate(chebyshev(g, 24)):
        print(f"    {mp.nstr(a, 21, min_fixed=0, max_fixed=0)},   /* a_{k} */")
    for n in (7, 4):
        p, q = lambert(n)
        print(f"n={n}: P", [int(c) for c in p], "Q", [int(c) for c in q])

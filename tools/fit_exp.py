#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The coefficients c2..c6 of core/exp.hpp's polynomial, reproducibly.

exp(r) ~ 1 + r + r^2 q(r) on |r| <= ln2 / 2 (a little wider: the reduction's n ln2 is rounded),
q of degree 4, fitted to exp's relative error: a weighted least-squares fit at Chebyshev nodes,
reweighted by each node's error (Lawson's algorithm) until it approaches the minimax fit. Prints
the error of the fit and the float32 coefficients the header holds. Needs numpy and mpmath (the golden venv has both:
mpmath comes with torch).

    python3 tools/fit_exp.py
"""
import numpy as np
from mpmath import exp as mexp
from mpmath import mp, mpf

mp.dps = 40
HALF = float(np.log(2) / 2) * 1.0005
NODES = 4000
DEGREE = 4  # of q: the polynomial in r has degree 6


def q_target(x: float) -> float:
    x = mpf(x)
    return 0.5 if abs(x) < 1e-30 else float((mexp(x) - 1 - x) / x**2)


def main() -> None:
    r = np.cos(np.pi * (np.arange(NODES) + 0.5) / NODES) * HALF
    t = np.array([q_target(x) for x in r])
    w = r**2 / np.exp(r)  # an error in q, times r^2 / exp(r): exp's relative error
    a = np.vander(r, DEGREE + 1, increasing=True)
    weights = np.full(NODES, 1.0 / NODES)
    for _ in range(200):
        sw = np.sqrt(weights) * w
        c, *_ = np.linalg.lstsq(a * sw[:, None], t * sw, rcond=None)
        err = np.abs((a @ c - t) * w)
        weights = weights * err
        weights /= weights.sum()
    print(f"max relative error of the fit: {err.max():.3g}")
    for k, v in enumerate(c, start=2):
        print(f"c{k} = {np.float32(v):.10e}f")


if __name__ == "__main__":
    main()

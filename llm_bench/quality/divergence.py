"""How far a configuration's next-token distributions are from the reference's over one teacher-forced
text, each figure with a block-bootstrap interval.

Input: for every scored position of the text, each side's top-k next-token log-probabilities as the
server reported them before sampling (token id -> natural log-probability). Output: the mean KL
divergence KLD(P_ref || P_cfg) in nats, its 99th percentile, and the share of positions where both
sides put the same token first, each with a 95 % interval.

The divergence at one position is taken over the union of both top-k sets plus one "other" cell:

- A token a side listed has the probability that side reported.
- A token of the union that one side did not list gets, on that side, ``q = min(f, r / (m + 1))``:
  ``f`` is that side's smallest listed probability (the token ranked below every listed one, so it
  has at most ``f``), ``r = 1 - sum(listed)`` is the mass that side did not list, and ``m`` how many
  tokens of the union it did not list (together they have at most ``r``; the ``+ 1`` leaves the rest
  of the vocabulary at least an equal share). This is the largest value both bounds allow. When two
  configurations are close, the tokens only one side lists sit at the edge of the top-k, just below
  the other side's k-th probability, and the upper end then adds almost no divergence that is not
  there; a token one side ranks high and the other does not list at all still counts in full
  against ``f``.
- "other" holds the rest of each side's mass, ``r - m * q``: every token neither side listed.
- Each cell is floored at 1e-10 and each side renormalised, so that a side whose top-k carry all of
  its mass (``r`` rounds to 0) never makes the divergence infinite.

Identical lists give exactly 0. The top token of a side is the token with the highest listed
log-probability (the first listed on a tie).

Neighbouring positions correlate (a hard passage is hard for several tokens), so the intervals come
from a circular block bootstrap (Politis & Romano 1992): the positions are resampled in contiguous
blocks, wrapping at the end so every position is equally likely to be drawn. The block length is
chosen from the data by Politis & White's rule (2004, corrected by Patton, Politis & White 2009) for
the per-position divergence and the same-top indicator, the longer of the two; an uncorrelated series
gets blocks of 1 (the ordinary bootstrap). Intervals are the bootstrap percentiles; the generator is
seeded, so a report is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
REPLICATES = 2000
# Below this many positions a bootstrap interval says little; the figure is given without one.
MIN_POSITIONS = 30
FLOOR = 1e-10
TAIL = 0.99

TopLogprobs = Mapping[int, float]  # token id -> natural log-probability


@dataclass(frozen=True)
class Estimate:
    """A figure and its interval (``low``/``high`` None when the positions are too few for one)."""

    value: float
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Divergence:
    """A configuration against the reference over ``positions`` teacher-forced positions."""

    positions: int
    mean_kld: Estimate  # nats
    p99_kld: Estimate  # nats
    same_top: Estimate  # share of positions, 0..1
    block_length: int
    replicates: int
    confidence: float
    seed: int


def side_probabilities(listed: TopLogprobs, union: Sequence[int]) -> np.ndarray:
    """One side's probabilities over ``union`` and a last "other" cell, by the rule in the module's
    docstring, floored and renormalised."""
    probs = {token: math.exp(logprob) for token, logprob in listed.items()}
    rest = max(0.0, 1.0 - sum(probs.values()))
    missing = sum(1 for token in union if token not in probs)
    fill = min(min(probs.values()), rest / (missing + 1)) if missing else 0.0
    cells = np.array([probs.get(token, fill) for token in union] + [rest - missing * fill])
    cells = np.maximum(cells, FLOOR)
    return cells / cells.sum()


def position_kld(ref: TopLogprobs, cfg: TopLogprobs) -> float:
    """KLD(P_ref || P_cfg) in nats at one position, over the union of both top-k sets and "other"."""
    if not ref or not cfg:
        raise ValueError("a position without listed log-probabilities has no divergence")
    union = sorted(ref.keys() | cfg.keys())
    p = side_probabilities(ref, union)
    q = side_probabilities(cfg, union)
    return max(0.0, float(np.sum(p * np.log(p / q))))  # max: renormalising can leave -1e-17


def top_token(listed: TopLogprobs) -> int:
    best = max(listed.values())
    return next(token for token, logprob in listed.items() if logprob == best)


def per_position(refs: Sequence[TopLogprobs], cfgs: Sequence[TopLogprobs]) -> tuple[np.ndarray, np.ndarray]:
    """The divergence and the same-top indicator (1.0 or 0.0) at each position."""
    if len(refs) != len(cfgs):
        raise ValueError(f"the reference has {len(refs)} positions and the configuration {len(cfgs)}")
    kld = np.array([position_kld(r, c) for r, c in zip(refs, cfgs, strict=True)], dtype=float)
    same = np.array([float(top_token(r) == top_token(c)) for r, c in zip(refs, cfgs, strict=True)])
    return kld, same


def _flat_top(t: np.ndarray) -> np.ndarray:
    """Politis & Romano's flat-top lag window: 1 up to |t| = 1/2, falling linearly to 0 at |t| = 1."""
    a = np.abs(t)
    return np.where(a <= 0.5, 1.0, np.where(a <= 1.0, 2.0 * (1.0 - a), 0.0))


def block_length(series: np.ndarray) -> int:
    """Politis & White's block length for the circular block bootstrap of the mean of ``series``.

    The autocovariances are summed up to 2 m, where m is the first lag after which K_n = max(5,
    sqrt(log10 n)) autocorrelations in a row are insignificant (below 2 sqrt(log10(n) / n));
    b = (2 G^2 / D)^(1/3) n^(1/3) with G = sum |k| w(k) R(k), D = 4/3 (sum w(k) R(k))^2, w the
    flat-top window. Kept between 1 and min(3 sqrt(n), n / 3)."""
    n = len(series)
    x = np.asarray(series, dtype=float) - float(np.mean(series))
    if n < 8 or not np.any(x):
        return 1
    runs = max(5, math.ceil(math.sqrt(math.log10(n))))
    m_max = math.ceil(math.sqrt(n)) + runs
    lags = min(m_max + runs, n - 1)
    acov = np.array([x[: n - k] @ x[k:] / n for k in range(lags + 1)])
    insignificant = np.abs(acov / acov[0]) < 2.0 * math.sqrt(math.log10(n) / n)
    m = next((m for m in range(lags - runs + 1) if insignificant[m + 1: m + runs + 1].all()), m_max)
    if m == 0:
        return 1  # no significant correlation: single positions
    big_m = min(2 * m, m_max, lags)
    k = np.arange(1, big_m + 1)
    w = _flat_top(k / big_m)
    g = 2.0 * float(np.sum(w * k * acov[k]))
    spectrum = acov[0] + 2.0 * float(np.sum(w * acov[k]))
    if spectrum <= 0.0:
        return 1
    b = (2.0 * g * g / (4.0 / 3.0 * spectrum * spectrum)) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    return int(min(max(1, math.ceil(b)), max(1, math.floor(min(3.0 * math.sqrt(n), n / 3.0)))))


def circular_block_indices(n: int, block: int, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """``replicates`` rows of ``n`` position indices, each row a run of blocks of ``block`` contiguous
    positions starting anywhere and wrapping at the end."""
    blocks = math.ceil(n / block)
    starts = rng.integers(0, n, size=(replicates, blocks))
    rows = (starts[:, :, None] + np.arange(block)[None, None, :]) % n
    return rows.reshape(replicates, blocks * block)[:, :n]


def _interval(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(samples, [tail, 1.0 - tail])
    return float(low), float(high)


def summarise(kld: np.ndarray, same: np.ndarray, *, confidence: float = CONFIDENCE,
              replicates: int = REPLICATES, seed: int = 0) -> Divergence:
    """The three figures over per-position values, with block-bootstrap intervals (one set of
    resampled positions for all three)."""
    n = len(kld)
    if n == 0 or len(same) != n:
        raise ValueError("no positions to summarise" if n == 0 else "per-position series of different lengths")
    values = (float(np.mean(kld)), float(np.quantile(kld, TAIL)), float(np.mean(same)))
    if n < MIN_POSITIONS:
        mean, p99, share = (Estimate(v, None, None) for v in values)
        return Divergence(n, mean, p99, share, 1, 0, confidence, seed)
    block = max(block_length(kld), block_length(same))
    rows = circular_block_indices(n, block, replicates, np.random.default_rng(seed))
    resampled = kld[rows]
    mean = Estimate(values[0], *_interval(resampled.mean(axis=1), confidence))
    p99 = Estimate(values[1], *_interval(np.quantile(resampled, TAIL, axis=1), confidence))
    share = Estimate(values[2], *_interval(same[rows].mean(axis=1), confidence))
    return Divergence(n, mean, p99, share, block, replicates, confidence, seed)


def compare(refs: Sequence[TopLogprobs], cfgs: Sequence[TopLogprobs], *, confidence: float = CONFIDENCE,
            replicates: int = REPLICATES, seed: int = 0) -> Divergence:
    """A configuration's distributions against the reference's, position by position."""
    kld, same = per_position(refs, cfgs)
    return summarise(kld, same, confidence=confidence, replicates=replicates, seed=seed)

"""Does a configuration answer worse than the reference? The paired comparison of right/wrong results
on the same exact-answer items, with McNemar's exact test.

Only the discordant items carry evidence: ``lost`` (right in the reference, wrong in the
configuration) and ``gained`` (the other way round). If the configuration answered as well as the
reference, each discordant item would be either with probability 1/2, so ``lost`` follows
Binomial(lost + gained, 1/2); the two-sided exact p-value is twice the smaller tail, capped at 1.
Below ``ALPHA`` the verdict is "answers worse" (more lost than gained) or "answers better"; otherwise
"answers within noise". Items both got right or both got wrong say nothing about the difference and
are only counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb

ALPHA = 0.05
WORSE = "answers worse"
WITHIN_NOISE = "answers within noise"
BETTER = "answers better"


@dataclass(frozen=True)
class PairedVerdict:
    kind: str
    items: int
    both_right: int
    lost: int  # right in the reference, wrong in the configuration
    gained: int  # wrong in the reference, right in the configuration
    both_wrong: int
    p_value: float

    @property
    def reference_right(self) -> int:
        return self.both_right + self.lost

    @property
    def configuration_right(self) -> int:
        return self.both_right + self.gained

    def describe(self) -> str:
        return (f"{self.kind}: {self.configuration_right}/{self.items} right against the reference's "
                f"{self.reference_right}/{self.items} ({self.lost} lost, {self.gained} gained, "
                f"McNemar exact p = {self.p_value:.3g})")


def mcnemar_exact(lost: int, gained: int) -> float:
    """Two-sided exact p-value of McNemar's test on the discordant counts (1.0 when there are none)."""
    n = lost + gained
    tail = sum(comb(n, i) for i in range(min(lost, gained) + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def paired_verdict(reference: Sequence[bool], configuration: Sequence[bool], alpha: float = ALPHA) -> PairedVerdict:
    """``reference[i]`` and ``configuration[i]``: whether each got item i right."""
    if len(reference) != len(configuration):
        raise ValueError(f"the reference answered {len(reference)} items and the configuration "
                         f"{len(configuration)}: a paired comparison needs the same items")
    pairs = list(zip(reference, configuration, strict=True))
    both_right = sum(r and c for r, c in pairs)
    lost = sum(r and not c for r, c in pairs)
    gained = sum(c and not r for r, c in pairs)
    p = mcnemar_exact(lost, gained)
    kind = WITHIN_NOISE if p >= alpha else WORSE if lost > gained else BETTER
    return PairedVerdict(kind, len(pairs), both_right, lost, gained, len(pairs) - both_right - lost - gained, p)

"""Data regimes, parsed in one place: ``<train>-<test>``, each side ``u`` (unbalanced: every row of the split part)
or ``b`` (balanced: the class-balanced subset, retinabench.data.splits). ``u-b`` trains on all training rows and
tests on the balanced test rows. Validation rows follow the training side (the protocols select on them).

Torch-free and dependency-free: the plan, the protocols, the statistics and the analysis all parse here.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

UNBALANCED_SIDE, BALANCED_SIDE = "u", "b"
SIDES = (UNBALANCED_SIDE, BALANCED_SIDE)
REGIMES = ("u-u", "u-b", "b-b", "b-u")
# The two regimes whose training and test data agree (the agreement and analysis layers compare them).
UNBALANCED, BALANCED = "u-u", "b-b"


@dataclass(frozen=True)
class Regime:
    """One regime: its training side and its test side (``u`` or ``b`` each)."""
    train: str
    test: str

    @classmethod
    def parse(cls, text: str) -> Regime:
        """``"u-b"`` -> Regime(train="u", test="b"); anything else is an error naming the valid regimes."""
        parts = text.split("-") if isinstance(text, str) else []
        if len(parts) != 2 or any(p not in SIDES for p in parts):
            raise ValueError(f"regime {text!r} is not one of {', '.join(REGIMES)} (<train>-<test>, each side "
                             f"u = unbalanced or b = class-balanced)")
        return cls(*parts)

    @property
    def train_balanced(self) -> bool:
        return self.train == BALANCED_SIDE

    @property
    def test_balanced(self) -> bool:
        return self.test == BALANCED_SIDE

    def __str__(self) -> str:
        return f"{self.train}-{self.test}"


def parse_regimes(regimes: Iterable[str], where: str = "regimes") -> list[Regime]:
    """Every regime of a non-empty list, parsed (an error names ``where`` and the whole list)."""
    regimes = list(regimes)
    if not regimes:
        raise ValueError(f"{where}: no regimes given; choose from {', '.join(REGIMES)}")
    try:
        return [Regime.parse(r) for r in regimes]
    except ValueError as err:
        raise ValueError(f"{where} {regimes}: {err}") from None


def is_balanced(side: str) -> bool:
    """Whether a regime side (``u`` / ``b``) is the class-balanced one."""
    if side not in SIDES:
        raise ValueError(f"regime side {side!r} is not one of {SIDES} (u = unbalanced, b = class-balanced)")
    return side == BALANCED_SIDE


def train_sides(regimes: Iterable[str]) -> list[str]:
    """The distinct training sides of ``regimes``, sorted (``b`` before ``u``): one model is trained per side and
    tested under each regime that starts with it."""
    return sorted({Regime.parse(r).train for r in regimes})


def trained_on(regimes: Iterable[str], side: str) -> list[str]:
    """The regimes of ``regimes`` (in their order) whose training side is ``side``."""
    return [r for r in regimes if Regime.parse(r).train == side]

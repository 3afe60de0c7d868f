"""The one regime parser (retinabench.regimes) and that nothing else in the package parses regime strings."""
import re
from pathlib import Path

import pytest

from retinabench.regimes import REGIMES, Regime, is_balanced, parse_regimes, train_sides, trained_on

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "retinabench"


def test_parse_gives_both_sides():
    r = Regime.parse("u-b")
    assert (r.train, r.test, r.train_balanced, r.test_balanced, str(r)) == ("u", "b", False, True, "u-b")
    assert [str(Regime.parse(x)) for x in REGIMES] == list(REGIMES)


@pytest.mark.parametrize("bad", ["ub", "u-x", "u-b-u", "", "U-U", None])
def test_parse_refuses_anything_else_naming_the_valid_regimes(bad):
    with pytest.raises(ValueError, match="u-u, u-b, b-b, b-u"):
        Regime.parse(bad)


def test_parse_regimes_names_where_and_refuses_empty():
    with pytest.raises(ValueError, match=r"finetune.regimes \['u-u', 'x-u'\]"):
        parse_regimes(["u-u", "x-u"], "finetune.regimes")
    with pytest.raises(ValueError, match="no regimes"):
        parse_regimes([], "finetune.regimes")


def test_training_sides_and_their_regimes():
    regimes = ["u-u", "b-u", "u-b"]
    assert train_sides(regimes) == ["b", "u"]
    assert trained_on(regimes, "u") == ["u-u", "u-b"] and trained_on(regimes, "b") == ["b-u"]
    assert is_balanced("b") and not is_balanced("u")
    with pytest.raises(ValueError, match="regime side"):
        is_balanced("u-u")


def test_no_module_parses_regime_strings_by_hand():
    """A regime string is split only in retinabench.regimes (issue 24: it was parsed in 11 places)."""
    by_hand = re.compile(r"""split\(["']-["']\)|endswith\(["']-[ub]["']\)|startswith\([^)]*\+ ["']-["']\)""")
    offenders = [f"{p.relative_to(PACKAGE)}:{i}" for p in PACKAGE.rglob("*.py") if p.name != "regimes.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if by_hand.search(line)]
    assert not offenders, f"regime strings parsed outside retinabench.regimes: {offenders}"

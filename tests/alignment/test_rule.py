"""The IP/OOP split rule: threshold boundary, cleaning cuts, presets, bad input, warnings."""

import numpy as np
import pytest

from dg_plugins.alignment import PRESETS, SplitRule, lopsided_warnings, resolve_rule
from dg_plugins.alignment.rule import subset_counts


def test_score_equal_to_threshold_is_ip():
    rule = resolve_rule()
    assert rule.threshold == 0.4 and rule.drop_below is None and rule.drop_above is None
    t = 0.4
    below = np.nextafter(t, 0.0)
    assert rule.assign([t, below, 1.0, -1.0]).tolist() == ["ip", "oop", "ip", "oop"]
    custom = resolve_rule(threshold=0.25)
    assert custom.assign([0.25, np.nextafter(0.25, 0.0)]).tolist() == ["ip", "oop"]


def test_teterwak2025_preset_cuts_and_boundaries():
    rule = resolve_rule(preset="teterwak2025")
    assert (rule.threshold, rule.drop_below, rule.drop_above) == (0.21, 0.15, 0.40)
    scores = [0.1499, 0.15, 0.2099, 0.21, 0.30, 0.40, 0.4001, -0.2]
    assert rule.assign(scores).tolist() == ["drop", "oop", "oop", "ip", "ip", "ip", "drop",
                                            "drop"]
    counts = subset_counts(rule.assign(scores))
    assert counts == {"ip": 3, "oop": 2, "drop": 3}


def test_cleaning_cuts_alone_and_inline_preset():
    rule = resolve_rule(threshold=0.3, drop_below=0.1)
    assert rule.assign([0.05, 0.1, 0.35, 0.9]).tolist() == ["drop", "oop", "ip", "ip"]
    rule = resolve_rule(threshold=0.3, drop_above=0.5)
    assert rule.assign([0.05, 0.5, 0.51]).tolist() == ["oop", "ip", "drop"]
    inline = resolve_rule(preset="threshold=0.21,drop_below=0.15,drop_above=0.4")
    assert inline == PRESETS["teterwak2025"]
    assert resolve_rule(preset="default") == SplitRule()


def test_bad_rules_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown alignment preset 'paper'.*teterwak2025"):
        resolve_rule(preset="paper")
    with pytest.raises(ValueError, match="sets its own threshold.*threshold"):
        resolve_rule(threshold=0.3, preset="teterwak2025")
    with pytest.raises(ValueError, match="drop_below"):
        resolve_rule(preset="teterwak2025", drop_below=0.1)
    with pytest.raises(ValueError, match="every image would be dropped"):
        SplitRule(0.2, drop_below=0.5, drop_above=0.3)
    with pytest.raises(ValueError, match="finite"):
        SplitRule(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        SplitRule().assign([0.2, float("nan")])
    with pytest.raises(ValueError, match="not a number"):
        resolve_rule(preset="threshold=abc")


def test_lopsided_split_warns_and_points_to_the_preset():
    rule = SplitRule()  # 0.4: typical cosines are below it
    warnings = lopsided_warnings("env 0", subset_counts(rule.assign([0.2, 0.25, 0.3])), rule)
    assert len(warnings) == 1 and "100.0%" in warnings[0] and "teterwak2025" in warnings[0]
    balanced = subset_counts(rule.assign([0.2, 0.5]))
    assert lopsided_warnings("env 0", balanced, rule) == []
    dropped = subset_counts(PRESETS["teterwak2025"].assign([0.01, 0.9]))
    assert "dropped" in lopsided_warnings("env 0", dropped, PRESETS["teterwak2025"])[0]

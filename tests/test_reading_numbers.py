"""The number check of the hand-written readings (recipes/common/reading.py): which numbers of a reading it reads,
and that each must be a json value as the page formats it."""

from __future__ import annotations

from recipes.common.reading import checked_numbers, number_values, unmatched_numbers

FORMATS = ("{:.4f}".format, "{:.2f}".format, "{:.0f}".format)


def test_it_reads_decimals_percentages_and_numbers_with_units_not_counts_code_or_versions():
    text = (
        "MoS-3 ends 0.0201 nats [0.0167, 0.0235] below (b), at 1.575x the time, in 15 min over 3 seeds (64%); "
        "1,932 tests, d = 4, x-transformers 2.31.10, `--lr 2.5e-3`, Holm p 1.8e-06, -0.2011 and +0.0071"
    )
    assert checked_numbers(text) == [
        ("0.0201", "nats"),
        ("0.0167", ""),
        ("0.0235", ""),
        ("1.575", "x"),
        ("15", "min"),
        ("64", "%"),
        ("1.8e-06", ""),
        ("-0.2011", ""),
        ("+0.0071", ""),
    ]


def test_a_number_must_be_a_formatted_value_with_its_sign_unless_listed():
    values = number_values({"diff": -0.02011, "cells": [{"ppl": 25.8712, "ok": True}], "minutes": 15, "share": 0.64})
    assert values == [-0.02011, 25.8712, 15.0, 0.64]
    good = "0.0201 nats below, -0.0201 as a difference, perplexity 25.87, 15 min, 64% of them"
    assert unmatched_numbers(good, values, FORMATS) == []
    bad = "+0.0201 (the sign), 25.88 (a digit), 16 min, 65%, 0.02011 (more digits than the page shows)"
    assert unmatched_numbers(bad, values, FORMATS) == ["+0.0201", "25.88", "16 min", "65%", "0.02011"]
    assert unmatched_numbers(bad, values, FORMATS, exceptions=["+0.0201", "16 min"]) == ["25.88", "65%", "0.02011"]

"""Reading rows as the driver hands them over (fleet/selectors/rows.py): JSON columns decoded by
orjson, with the standard library's reading where orjson refuses."""

from __future__ import annotations

import json
import math

from hypothesis import given, strategies as st

from fleet.selectors.rows import json_loads, raw_json

READING = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text())
LOADS = st.recursive(
    READING,
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(), inner, max_size=8),
    max_leaves=40,
)


@given(LOADS)
def test_json_is_decoded_as_the_standard_library_decodes_it(value):
    text = json.dumps(value)
    assert json_loads(text) == json.loads(text)
    assert json_loads(text.encode()) == json.loads(text)


def test_what_only_pythons_encoder_writes_is_still_read():
    """Django writes a JSON column with Python's json, which writes NaN and Infinity;
    orjson refuses them, and the row is not lost for it."""
    load = json_loads(json.dumps({"cpu_percent": float("nan"), "load1": float("inf")}))
    assert math.isnan(load["cpu_percent"]) and load["load1"] == math.inf


def test_a_value_the_driver_already_decoded_is_left_as_it_is():
    load = {"gpus": [{"index": 0}]}
    assert raw_json(load) is load
    assert raw_json('{"gpus": []}') == {"gpus": []}

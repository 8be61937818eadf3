"""Bounded numbers in JSON schemas: a schema's integers and numbers, given a finite length.

A schema's `{"type": "integer"}` allows an integer of any length, and a small model at
temperature 0 takes it: `"population": 1111111111…` until max_tokens. So, before compiling,
every integer or number that leaves a side open is bounded on that side to the interoperable
range ±(2⁵³−1) (RFC 7493, I-JSON: what every JSON parser reads exactly), and a number without
a `multipleOf` gets one of 10⁻¹⁰, which bounds its fraction to 10 digits (llguidance reads a
`multipleOf` as a double and refuses one whose decimal needs more than ~16 significant digits:
10⁻¹¹ already does). llguidance writes a bounded number in plain decimal: no exponent, so the
exponent is bounded to no digits at all, and a value under 10⁻¹⁰ is written 0.

A bound the schema states is kept as stated (a `maximum` of 10¹⁸ stays 10¹⁸); only an open side
is closed. Values whose type is left open (`{}`, a json_object's members) are not rewritten.
"""

from __future__ import annotations

from typing import Any

SAFE_INTEGER = 2**53 - 1  # RFC 7493 §2.2: the integers every IEEE double holds exactly
FRACTION_DIGITS = 10
FRACTION_STEP = 1e-10  # as multipleOf: at most FRACTION_DIGITS digits after the point

# Keywords whose value is one subschema, a list of them, or a name -> subschema map. Not
# `not` and `if`: a bound inside a negation or a condition would widen what the schema allows.
_ONE = (
    "additionalProperties",
    "additionalItems",
    "items",
    "contains",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def bounded_schema(schema: Any) -> Any:
    """schema with every open integer and number bounded (a new value; schema is not changed)."""
    if isinstance(schema, list):
        return [bounded_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema  # true, false, or a value that is not a schema
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = bounded_schema(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [bounded_schema(s) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: bounded_schema(s) for name, s in out[key].items()}
    types = _types(out)
    listed = "enum" in out or "const" in out  # the values are named: nothing runs on
    if ("integer" in types or "number" in types) and not listed:
        if "minimum" not in out and not _numeric(out.get("exclusiveMinimum")):
            out["minimum"] = -SAFE_INTEGER
        if "maximum" not in out and not _numeric(out.get("exclusiveMaximum")):
            out["maximum"] = SAFE_INTEGER
        if "number" in types and "multipleOf" not in out:
            out["multipleOf"] = FRACTION_STEP
    return out


def _numeric(value: Any) -> bool:
    """A draft-6+ exclusive bound (a number); draft 4's `true` only qualifies `minimum`."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _types(schema: dict[str, Any]) -> set[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    return set()

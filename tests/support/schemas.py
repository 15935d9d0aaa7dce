"""Large JSON schemas for structured-output scenarios (tests and benchmarks)."""

from __future__ import annotations


def large_json_schema(tag: str, properties: int = 90) -> dict:
    """A JSON schema of its own (``properties``: integers, enums, nested objects, named after ``tag``):
    compiling its grammar takes the structured-output backend tens to hundreds of milliseconds here, even
    on the tiny model's vocabulary, and no schema of another tag shares its compiled grammar."""
    props: dict = {}
    for k in range(properties):
        name = f"{tag}_f{k}"
        if k % 3 == 0:
            props[name] = {"type": "integer", "minimum": 0, "maximum": 1000 + k}
        elif k % 3 == 1:
            props[name] = {"enum": [f"{tag}_{k}_{e}" for e in range(4)]}
        else:
            props[name] = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}},
                           "required": ["a"]}
    return {"type": "object", "properties": props, "required": list(props)[:30]}

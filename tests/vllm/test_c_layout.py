"""The C accelerators' idea of the step record, read out of their sources and compared with the Python
declarations it must follow: the wire header's fields and offsets (step_wire.HEADER_FIELDS), its flags,
the extras' counts, the StepRecord's slots, the step payload's positions (step_wire.StepPayload), the
entry the scheduler hooks keep between their two calls (step_hooks.Pending) and the highest queue_blocked
a reader takes (timeline.BLOCKED_*, value 5: structured_output). A change on one side only fails here,
whether or not the extensions are built."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from otel_llm.core import timeline
from otel_llm.instrumentation.vllm import step_hooks, step_wire

HERE = Path(step_wire.__file__).parent
STEP_C = (HERE / "_step_fast.c").read_text()
HOOKS_C = (HERE / "_hooks_fast.c").read_text()

# the C variables (decode's locals, the record_t's members) that hold each header field
C_NAMES = {"step_id": "step_id", "start": "start", "end": "end", "running": "running", "waiting": "waiting",
           "preempted": "preempted", "kv": "kv_cache_usage", "blocked": "queue_blocked",
           "schedule_s": "schedule_s", "execute_s": "execute_s", "output_s": "output_s", "idle": "idle_s",
           "model": "model_s", "n": "shares", "z": "no_output", "m": "prompts", "version": "version",
           "flags": "flags"}


def _define(source: str, name: str) -> int:
    found = re.search(rf"^#define {name} (\w+)", source, re.M)
    assert found, f"#define {name} not found"
    return int(found.group(1), 0)


def _function(source: str, signature: str) -> str:
    start = source.index(signature)
    return source[start:source.index("\n}\n", start)]


def test_the_header_size_and_offsets_the_c_decoder_reads_are_the_declared_ones():
    assert _define(STEP_C, "HEADER_SIZE") == step_wire.HEADER.size
    offsets = step_wire.header_offsets()
    body = _function(STEP_C, "static PyObject *decode(")
    read = {C_NAMES[v]: int(at) for v, at in re.findall(r"memcpy\(&(\w+), b \+ (\d+), \d+\)", body)}
    read.update({C_NAMES[v]: int(at) for v, at in re.findall(r"\b(\w+) = b\[(\d+)\];", body)})
    read["version"] = 0  # b[0] != wire_version
    assert re.search(r"b\[0\] != wire_version", body)
    assert "flags = b[1]" in body
    read["flags"] = 1
    assert read == offsets


def test_the_c_encoder_writes_the_header_fields_in_the_declared_order():
    body = _function(STEP_C, "static void emit(")
    head = body[:body.index("if (r->nvals)")]
    written = [C_NAMES[re.sub(r"^r->", "", v)] for v in re.findall(r"PUT\(([\w>-]+)\)", head)]
    assert written == [name for name, _ in step_wire.HEADER_FIELDS]


def test_the_flags_and_the_extras_counts_are_the_declared_ones():
    assert _define(STEP_C, "F_IDLE") == step_wire._HAS_IDLE
    assert _define(STEP_C, "F_MODEL") == step_wire._HAS_MODEL
    assert _define(STEP_C, "F_ONE_EACH") == step_wire._ONE_EACH
    assert _define(STEP_C, "F_SAME_IDS") == step_wire._SAME_IDS
    assert _define(STEP_C, "F_EXTRAS") == step_wire._EXTRAS
    assert _define(STEP_C, "EXTRA_COUNTS_SIZE") == step_wire._EXTRA_COUNTS.size


def test_the_highest_queue_blocked_is_structured_output_on_both_sides():
    assert timeline.BLOCKED_STRUCTURED_OUTPUT == 5 == timeline.BLOCKED_NAMES.index("structured_output")
    assert _define(STEP_C, "BLOCKED_LAST") == step_wire.BLOCKED_LAST == len(timeline.BLOCKED_NAMES) - 1
    assert max(timeline.BLOCKED_NONE, timeline.BLOCKED_MAX_SEQS, timeline.BLOCKED_KV_CACHE,
               timeline.BLOCKED_TOKEN_BUDGET, timeline.BLOCKED_OTHER,
               timeline.BLOCKED_STRUCTURED_OUTPUT) == step_wire.BLOCKED_LAST


def test_the_record_slots_the_c_decoder_sets_are_the_step_records():
    assert _define(STEP_C, "N_SLOTS") == len(timeline.StepRecord.__slots__)
    listed = re.search(r"slot_strs\[N_SLOTS\] = \{(.*?)\};", STEP_C, re.S).group(1)
    assert tuple(re.findall(r'"(\w+)"', listed)) == timeline.StepRecord.__slots__


def test_the_payload_positions_the_c_encoder_reads_are_the_step_payloads():
    body = STEP_C[STEP_C.index("r->step_id = PyLong_AsLongLongAndOverflow(p[0]") - 400:]
    body = body[:body.index("F_ONE_EACH;")]
    read = {C_NAMES[v]: int(i) for i, v in re.findall(r"get_double\(p\[(\d+)\], &r->(\w+)\)", body)}
    read.update({C_NAMES[v]: int(i) for i, v in
                 re.findall(r"get_uint\(p\[(\d+)\], 0x\w+, &u\)\) return 0;\s*r->(\w+) =", body)})
    read.update({C_NAMES[v]: int(i) for i, v in re.findall(r"get_optional\(p\[(\d+)\], &r->(\w+)", body)})
    assert "step_id = PyLong_AsLongLongAndOverflow(p[0]" in body
    read["step_id"] = 0
    fields = step_wire.StepPayload._fields
    assert read == {name: fields.index(name) for name in read}
    assert len(read) == 14 - 1  # every payload value but the shares (their counts are the header's last three)


def test_the_hooks_pending_entry_and_shares_are_the_declared_ones():
    enum = re.search(r"enum \{ (P_START.*?) \};", HOOKS_C, re.S).group(1)
    names = [n.strip() for n in enum.split(",")]
    assert names == ["P_" + f.upper() for f in step_hooks.Pending._fields] + ["P_SIZE"]
    assert _define(HOOKS_C, "SHARES_SIZE") == len(step_wire.Shares._fields)
    assert step_hooks._SHARES == step_hooks.Pending._fields.index("shares")


def test_the_hooks_payload_is_built_in_the_step_payloads_order():
    packed = re.search(r"payload = PyTuple_Pack\((\d+), (.*?)\);", HOOKS_C, re.S)
    assert int(packed.group(1)) == len(step_wire.StepPayload._fields)
    args = [a.strip() for a in re.split(r",\s*(?![^()]*\))", packed.group(2))]
    assert len(args) == len(step_wire.StepPayload._fields)
    for field, arg in zip(step_wire.StepPayload._fields, args):
        taken = re.fullmatch(r"PyTuple_GET_ITEM\(p, P_(\w+)\)", arg)
        if taken:  # a value schedule() kept: the pending entry's field of the same name
            assert taken.group(1).lower() == field, (field, arg)


@pytest.mark.parametrize("blocked", range(step_wire.BLOCKED_LAST + 1))
def test_every_queue_blocked_value_reads_back_and_one_past_them_is_refused(blocked):
    shares = step_wire.Shares(["a", "b"], None, [3, 4], (), (), (), ())
    payload = step_wire.StepPayload(1, 1.0, 2.0, 2, 1, 0, 0.5, shares, blocked, 0.1, 0.2, 0.3, None, None)
    data = step_wire.encode_py(payload)
    assert step_wire.decode_py(data).queue_blocked == blocked
    assert step_wire.decode(data).queue_blocked == blocked  # the C decoder, where built
    at = step_wire.header_offsets()["queue_blocked"]
    bad = data[:at] + bytes((step_wire.BLOCKED_LAST + 1,)) + data[at + 1:]
    with pytest.raises(step_wire.WireError, match="queue_blocked"):
        step_wire.decode_py(bad)
    with pytest.raises(step_wire.WireError, match="queue_blocked"):
        step_wire.decode(bad)


def test_the_header_declaration_is_the_wires_layout():
    assert step_wire.HEADER.format == "<BBqddIIIdBdddddIII"  # the wire of version 4, unchanged
    assert step_wire.HEADER.size == sum(struct.calcsize("<" + c) for _, c in step_wire.HEADER_FIELDS) == 99

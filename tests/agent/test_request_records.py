"""The per-request records an engine sends its agent (otel_llm/agent/records.py): named fields, a version,
untrusted bytes refused with a clear error, fields added by a newer writer ignored."""

from __future__ import annotations

import dataclasses
import marshal
import random

import pytest

from otel_llm.agent import records
from otel_llm.agent.records import RecordError, RequestEnrichment, RequestFinish, RequestStart


def _start(**kw) -> RequestStart:
    base = dict(request_id="cmpl-1-0-abcdefgh", arrival=1700000000.5, queued=12.25, prompt_tokens=7,
                external_id="cmpl-1-0", model="tiny", trace_headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
                sampling={"gen_ai.request.max_tokens": 8, "gen_ai.request.temperature": 0.0},
                lora_name="a", lora_id=1, client_index=0)
    base.update(kw)
    return RequestStart(**base)


def _finish(**kw) -> RequestFinish:
    base = dict(request_id="cmpl-1-0-abcdefgh", reason="length", arrival=1700000000.5, queued=12.25, end=13.5,
                end_wall=1700000001.75, prompt_tokens=7, output_tokens=8, preemptions=1,
                external_id="cmpl-1-0", model="tiny")
    base.update(kw)
    return RequestFinish(**base)


def _enrichment(**kw) -> RequestEnrichment:
    base = dict(request_id="cmpl-1-0-abcdefgh", operation="chat", server=True,
                parent={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, response_id="chatcmpl-1",
                model="tiny", attributes={"gen_ai.request.model": "alias", "gen_ai.request.stream": True},
                reason="stop", output_tokens=5, output_characters=17, first_output=1700000000.75,
                last_output=1700000001.5, end=1700000001.5, prompt_text="hi", output_text="there",
                group_id="cmpl-1", group_size=2, group_expected=2, choice_index=1)
    base.update(kw)
    return RequestEnrichment(**base)


def test_round_trip_by_name():
    for record in (_start(), _finish(), _start(trace_headers=None, external_id=None, lora_name=None, lora_id=None),
                   _start(enriched=True), _finish(enriched=True), _enrichment(), RequestEnrichment("r", "chat")):
        data = records.encode(record)
        assert data[0] == records.TAG
        assert records.decode(data) == record


def test_a_field_a_newer_writer_added_is_ignored_and_a_missing_optional_one_defaults():
    values = {"request_id": "r", "arrival": 1.0, "queued": 2.0, "prompt_tokens": 3, "tenant": "t1"}
    data = bytes((records.TAG, records.START)) + marshal.dumps((1, values))
    got = records.decode(data)
    assert got == RequestStart(request_id="r", arrival=1.0, queued=2.0, prompt_tokens=3)


@pytest.mark.parametrize("data, says", [
    (b"", "not a request record"),
    (bytes((0xC0, 1, 0)), "not a request record"),
    (bytes((records.TAG, 9)) + marshal.dumps((1, {})), "unknown kind"),
    (bytes((records.TAG, records.START)) + marshal.dumps((2, {})), "version 2"),
    (bytes((records.TAG, records.START)) + marshal.dumps([1, {}]), "another shape"),
    (bytes((records.TAG, records.START)) + marshal.dumps((1, {"request_id": 5})), "request_id: int"),
    (bytes((records.TAG, records.START)) + marshal.dumps((1, {"request_id": "r"})), "RequestStart"),
    (bytes((records.TAG, records.FINISH)) + marshal.dumps((1, {"request_id": "r", "prompt_tokens": True})),
     "prompt_tokens: bool"),
    (bytes((records.TAG, records.START)) + b"\x00garbage", "unreadable"),
])
def test_bad_bytes_are_refused_with_a_clear_error(data, says):
    with pytest.raises(RecordError, match=says):
        records.decode(data)


@pytest.mark.parametrize("body", [
    b"(" + (2 ** 31 - 1).to_bytes(4, "little"),  # a tuple of two billion items: 16 GiB before reading one
    b"\xa9\x02i\x01\x00\x00\x00[" + (2 ** 30).to_bytes(4, "little"),  # the same, nested in a list
    b"l" + (-(2 ** 30)).to_bytes(4, "little", signed=True),  # a long of a billion digits
])
def test_a_count_beyond_the_bytes_is_refused_before_marshal_allocates_it(body):
    with pytest.raises(RecordError, match="claims"):
        records.decode(bytes((records.TAG, records.ENRICH)) + body)


def test_headers_and_sampling_are_bounded_and_kept_plain():
    headers = {f"H{i}": "v" * 10_000 for i in range(40)}
    got = records.decode(records.encode(_start(trace_headers=headers, sampling={"a": 1, "b": {"nested": 1}})))
    assert len(got.trace_headers) == records.MAX_HEADERS
    assert all(k == k.lower() and len(v) == records.MAX_TEXT for k, v in got.trace_headers.items())
    assert got.sampling == {"a": 1}


def test_an_enrichment_too_long_for_a_record_goes_without_its_content_and_keeps_plain_attributes():
    got = records.decode(records.encode(_enrichment(output_text="x" * records.MAX_RECORD,
                                                    attributes={"a": "v", "b": {"nested": 1}})))
    assert (got.prompt_text, got.output_text) == (None, None)
    assert got.output_characters == 17 and got.attributes == {"a": "v"}


@pytest.mark.parametrize("good", [records.encode(_finish()), records.encode(_enrichment())])
def test_random_bytes_never_raise_anything_but_record_error(good):
    rng = random.Random(43)
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data[:rng.randint(0, len(data))]) if rng.random() < 0.3 else bytes(data)
        try:
            records.decode(data)
        except RecordError:
            pass


def test_a_batch_holds_encoded_records_and_refuses_anything_else():
    items = [records.encode(_start()), records.encode(_finish())]
    assert [records.decode(x) for x in records.unbatch(records.batch(items))] == [_start(), _finish()]
    for bad in (items[0], bytes((records.TAG, records.BATCH)) + marshal.dumps(("text",)),
                bytes((records.TAG, records.BATCH)) + b"(" + (2 ** 31 - 1).to_bytes(4, "little")):
        with pytest.raises(RecordError):
            records.unbatch(bad)


def _outcome(data: bytes) -> str:
    try:
        return repr(records.decode(data))  # (repr: a NaN the bytes hold is equal to itself there)
    except RecordError as exc:
        return f"RecordError: {exc}"


def _variants() -> list[bytes]:
    """Records as a writer may send them, well-formed or not: each kind, fields of every wrong type, fields
    unknown, missing or None, too many or too long headers, sampling parameters and attributes, keys that are
    not strings, and each of these with flipped bytes."""
    rng = random.Random(4306)
    bases = {records.START: dataclasses.asdict(_start()), records.FINISH: dataclasses.asdict(_finish()),
             records.ENRICH: dataclasses.asdict(_enrichment()),
             records.SINK_COUNTS: {"pid": 7, "steps_dropped": 3, "requests_dropped": 1}}
    odd = [None, True, False, 0, -5, 2 ** 70, 1.5, float("nan"), "", "x" * (records.MAX_TEXT + 3), b"b", (), (1, "a"),
           [1], {}, {"k": "v"}, {5: "v"}, {"Traceparent": "v", "b": 1}, {1, 2}, frozenset()]
    long_maps = [{f"a{i}": i for i in range(70)}, {f"H{i}": "v" * 5000 for i in range(20)},
                 {"k" * 5000: "v", "s": "w" * 5000, "t": (1, 2), "d": {"x": 1}, 3: 4}]
    long_maps += [{"a": 1, **one} for one in ({"d": {"x": 1}}, {3: 4}, {"s": "w" * 5000}, {"k" * 5000: 1},
                                                {"l": [1]}, {"n": None}, {"b": b"x"}, {"t": ("x" * 5000,)})]
    out = []
    for kind, base in bases.items():
        out.append(bytes((records.TAG, kind)) + marshal.dumps((1, base)))
        for name in list(base) + ["tenant", 7]:
            for value in odd + long_maps:
                values = dict(base)
                values[name] = value
                out.append(bytes((records.TAG, kind)) + marshal.dumps((1, values)))
            values = dict(base)
            values.pop(name, None)
            out.append(bytes((records.TAG, kind)) + marshal.dumps((1, values)))
    for data in list(out):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(2, len(flipped))
            flipped[i] ^= 1 << rng.randrange(8)
        out.append(bytes(flipped))
    return out


def test_the_quick_field_checks_decide_as_the_per_field_ones(monkeypatch):
    """decode takes a record's fields, sampling parameters and attributes whole where a set lookup shows them
    plain; where not, it checks them one by one. Both decide alike on every record here."""
    variants = _variants()
    quick = [_outcome(data) for data in variants]
    # every field checked, every map filtered
    monkeypatch.setattr(records.CODEC, "accepts", {cls: frozenset() for cls in records.CODEC.accepts})
    monkeypatch.setattr(records, "_plain", lambda values, most: False)
    slow = [_outcome(data) for data in variants]
    assert quick == slow
    taken = sum(not o.startswith("RecordError") for o in quick)
    assert len(variants) > 2000 and 500 < taken < len(variants) - 500  # both outcomes, many times


def test_every_record_reads_attribute_values_by_one_rule():
    """Sampling parameters, an enrichment's attributes, a frontend start's attributes and the agent's resource
    keep span attribute values only (declared.attribute_value): a sequence of scalars as a tuple; a sequence
    holding anything else is left out, on the quick path as on the per-field one."""
    from otel_llm.agent import control, protocol
    from otel_llm.agent.declared import attribute_value

    assert attribute_value(["a", 1]) == ("a", 1) and attribute_value(("a", {"x": 1})) is None
    assert attribute_value(None) is None and attribute_value(2.5) == 2.5
    odd = {"ok": ("zz", "yy"), "listed": ["a", "b"], "nested": ("a", {"x": 1}), "n": 3}
    start = records.decode(bytes((records.TAG, records.START)) + marshal.dumps(
        (1, {"request_id": "r", "arrival": 1.0, "queued": 2.0, "prompt_tokens": 3, "sampling": odd})))
    enrichment = records.decode(bytes((records.TAG, records.ENRICH)) + marshal.dumps(
        (1, {"request_id": "r", "operation": "chat", "attributes": odd})))
    frontend = protocol.Starts().timeline(control.StartRecord("r", 1.0, attributes=dict(odd)))
    kept = {"ok": ("zz", "yy"), "listed": ("a", "b"), "n": 3}
    assert start.sampling == enrichment.attributes == frontend.request_attributes == kept
    assert records.decode(records.encode(_start(sampling={"ok": ("zz",)}))).sampling == {"ok": ("zz",)}

"""The frontend's control records to its agent (otel_llm/agent/control.py): the options and an engine's
shape as declared records (named fields, a version, no pickle), untrusted bytes refused with a clear error."""

from __future__ import annotations

import marshal
import random

import pytest

from otel_llm.agent import control
from otel_llm.agent.control import ConfigRecord, EngineRecord, ReleaseRecord
from otel_llm.agent.destinations import Destinations
from otel_llm.agent.records import RecordError
from otel_llm.core.config import Config, Detail
from otel_llm.core.diagnosis.anatomy import EngineFacts
from otel_llm.core.diagnosis.roofline import ModelShape


def _config() -> Config:
    return Config.resolve({"slo": "ttft=0.5,goodput=0.99; tiny: e2e=3; @team-a: tpot=0.1; tiny@team-b: ttft=2",
                           "tenant": "header:x-tenant", "detail": "phases", "sample_rate": 0.25,
                           "capture_content": True, "device": "H100", "peak_flops": 1e15}, environ={})


def _destinations() -> Destinations:
    return Destinations([("http", 5.0), ("grpc", None)], [("http", 60000.0)],
                        {"service.name": "svc", "k8s.pod.ports": (80, 443)}, "https://opentelemetry.io/schemas/1.41.0")


def _engine() -> EngineFacts:
    shape = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=1000,
                       experts=8, experts_per_token=2, tied_embeddings=True)
    return EngineFacts(shape, on_cuda=True, devices=2, max_loras=4, kv_cache={"llm.kv_cache.dtype": "fp8"})


def test_the_options_and_destinations_round_trip_by_name():
    config, dest = control.setup_of(control.decode(control.config_message(_config(), _destinations())))
    assert config == _config() and dest == _destinations()
    assert config.detail is Detail.PHASES and config.slo.for_request("tiny", "team-b").ttft == 2
    default = Config.resolve({}, environ={})
    assert control.setup_of(control.decode(control.config_message(default, Destinations())))[0] == default


def test_an_engine_round_trips_with_and_without_a_model_shape():
    for facts in (_engine(), EngineFacts(None, on_cuda=False)):
        assert control.engine_of(control.decode(control.engine_message(facts))) == facts


def test_the_end_of_an_instrumentation_is_a_record_of_its_own():
    assert control.decode(control.release_message()) == ReleaseRecord()


def _raw(kind: int, version: int, values) -> bytes:
    """A message as a writer would frame it, whatever its values."""
    return bytes((control.TAG, kind)) + marshal.dumps((version, values))


def test_no_pickle_on_the_wire():
    for kind, data in ((control.CONFIG, control.config_message(_config(), _destinations())),
                       (control.ENGINE, control.engine_message(_engine()))):
        assert data[:2] == bytes((control.TAG, kind))
        version, values = marshal.loads(data[2:])  # built-in values only
        assert version == 1 and isinstance(values, dict)


def test_a_field_a_newer_writer_added_is_ignored_and_a_missing_optional_one_defaults():
    data = _raw(control.ENGINE, 1, {"on_cuda": False, "npu": "yes"})
    assert control.engine_of(control.decode(data)) == EngineFacts(None, on_cuda=False)
    options = {"sample_rate": 0.5, "a_newer_option": 7}
    data = _raw(control.CONFIG, 1, {"options": options, "spans": [], "metrics": []})
    config, dest = control.setup_of(control.decode(data))
    assert config == Config(sample_rate=0.5) and dest == Destinations()


@pytest.mark.parametrize("data, says", [
    (_raw(control.CONFIG, 2, {}), "version 2"),
    (_raw(control.ENGINE, 0, {}), "version 0"),
    (_raw(99, 1, {}), "unknown kind"),
    (_raw(control.ENGINE, 1, [1]), "another shape"),
    (bytes((control.TAG, control.ENGINE)) + marshal.dumps((1,)), "another shape"),
    (_raw(control.ENGINE, True, {}), "another shape"),
    (_raw(control.ENGINE, 1, {"devices": 2}), "EngineRecord"),
    (_raw(control.ENGINE, 1, {"on_cuda": 1}), "on_cuda: int"),
    (_raw(control.ENGINE, 1, {"on_cuda": False, "devices": True}), "devices: bool"),
    (_raw(control.CONFIG, 1, {"options": {}, "spans": [], "metrics": [], "schema_url": 5}), "schema_url: int"),
    # the positional control messages of earlier releases: (kind, version, fields)
    (marshal.dumps((control.ENGINE, 1, {"on_cuda": False})), "not a record of the agent link"),
])
def test_bad_messages_are_refused_with_a_clear_error(data, says):
    with pytest.raises(RecordError, match=says):
        control.decode(data)


@pytest.mark.parametrize("options, says", [
    ({"sample_rate": "0.5"}, "sample_rate: str"),
    ({"sample_rate": 2.0}, "sample_rate: expected a rate"),
    ({"max_steps": 0}, "max_steps: expected a positive integer"),
    ({"max_steps": 1.5}, "max_steps: float"),
    ({"capture_content": 1}, "capture_content: int"),
    ({"detail": 9}, "no detail 9"),
    ({"agent": "sometimes"}, "agent: expected one of"),
    ({"tenant": ("header", None)}, "not a tenant source"),
    ({"slo": {"default": (-1.0, None, None, None)}}, "must be a positive number"),
    ({"slo": {"per_model": {1: (None,) * 4}}}, "not a string"),
    ({"slo": {"per_model_tenant": [("m", 2, (None,) * 4)]}}, "not a \\(model, tenant, SLO\\)"),
])
def test_bad_options_are_refused_as_the_options_parser_would(options, says):
    data = _raw(control.CONFIG, 1, {"options": options, "spans": [], "metrics": []})
    with pytest.raises(RecordError, match=says):
        control.setup_of(control.decode(data))


@pytest.mark.parametrize("field, value, says", [
    ("spans", [("ftp", 1.0)], "spans"),
    ("spans", [("http", "soon")], "delay: str"),
    ("metrics", [("grpc", None)], "interval: NoneType"),
    ("resource", {"a": object.__name__, "b": {"nested": 1}}, "resource\\['b'\\]: dict"),
])
def test_bad_destinations_are_refused(field, value, says):
    values = {"options": {}, "spans": [], "metrics": [], field: value}
    with pytest.raises(RecordError, match=says):
        control.setup_of(control.decode(_raw(control.CONFIG, 1, values)))


def test_a_model_shape_of_the_wrong_types_is_refused():
    model = {"layers": 2, "hidden": "64"}
    with pytest.raises(RecordError, match="model.hidden: str"):
        control.engine_of(control.decode(_raw(control.ENGINE, 1, {"on_cuda": False, "model": model})))
    with pytest.raises(RecordError, match="EngineRecord.model"):
        control.engine_of(control.decode(_raw(control.ENGINE, 1, {"on_cuda": False, "model": {}})))


def test_random_bytes_never_raise_anything_but_record_error():
    rng = random.Random(43)
    goods = [control.config_message(_config(), _destinations()), control.engine_message(_engine()),
             control.release_message()]
    for i in range(4000):
        data = bytearray(goods[i % len(goods)])
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data[:rng.randint(0, len(data))]) if rng.random() < 0.3 else bytes(data)
        try:
            record = control.decode(data)
            if isinstance(record, ConfigRecord):
                control.setup_of(record)
            elif isinstance(record, EngineRecord):
                control.engine_of(record)
        except RecordError:
            pass


def test_a_length_past_the_end_is_refused_before_it_is_allocated():
    """marshal allocates a list's slots before reading them: a changed length must not ask for gigabytes."""
    import struct

    for bomb in (b"[" + struct.pack("<i", 2**31 - 1), b"(" + struct.pack("<i", 10**9) + b"N",
                 b")\x03NN", b"{" + b"z\x01a", b"c" + b"\x00" * 40, b"\xdb" + struct.pack("<i", 5) + b"ab"):
        with pytest.raises(RecordError, match="unreadable"):
            control.decode(bytes((control.TAG, control.CONFIG)) + bomb)

"""Tenants: which team a request is for, from a configured source, bounded before it becomes a label.

``TenantSource`` (the ``tenant`` option, ``OTEL_LLM_TENANT``) says where a request's tenant comes from:

* ``header:<name>``: a request header (case-insensitive), under the Python ``vllm serve`` frontend;
* ``user``: the OpenAI request's ``user`` field, under the Python ``vllm serve`` frontend;
* ``lora``: the LoRA adapter's name (one adapter per team), on every frontend and offline;
* ``resource``: the resource attribute ``llm.request.tenant`` (``OTEL_RESOURCE_ATTRIBUTES``): every request of
  a single-tenant process.

vLLM's Rust frontend hands the engine no headers and no ``user`` field (its EngineCore receives the request as
the engine sees it): there only ``lora`` and ``resource`` work.

The value is user input. ``clean`` cuts it to ``MAX_LENGTH`` characters and replaces every character outside
``[A-Za-z0-9._:@/+-]`` with ``_`` (what stays is safe as a label value, in a TraceQL or PromQL string, and in a
URL); the request span carries the cleaned value. ``TenantLabels`` then bounds the label exactly as the LoRA
adapter's (``core.lora.AdapterLabels``): the first ``cap`` distinct tenants get series of their own (tenants
named in the SLO table first), every later one is ``other``, counted in ``stats()``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .. import semconv as sc
from .lora import AdapterLabels

MAX_LENGTH = 64  # characters of a tenant value kept (span attribute and label)
DEFAULT_CAP = 64  # tenants with series of their own (per process); more share ``other``
_BAD = re.compile(r"[^A-Za-z0-9._:@/+\-]")
SOURCES = ("header", "user", "lora", "resource")


def clean(value: Any) -> str | None:
    """A tenant value as it may become a span attribute and a label: a string, cut to ``MAX_LENGTH``
    characters, characters outside the allowed set replaced with ``_``; ``None`` for nothing usable."""
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    elif not isinstance(value, str):
        return None
    value = value.strip()[:MAX_LENGTH]
    if not value:
        return None
    return _BAD.sub("_", value)


class TenantLabels(AdapterLabels):
    """The tenant label of the per-request metrics: ``AdapterLabels``' cap and ``other``, and its count
    (``collapsed``); ``reserve`` admits the SLO table's tenants ahead of the first-come ones."""

    reserved = frozenset((sc.TENANT_OTHER,))
    other = sc.TENANT_OTHER

    def __init__(self, cap: int = DEFAULT_CAP, max_length: int = MAX_LENGTH) -> None:
        super().__init__(cap, max_length)

    def reserve(self, names: Iterable[str]) -> None:
        for name in names:
            cleaned = clean(name)
            if cleaned is not None and cleaned not in self.reserved and len(self._admitted) < self.cap:
                self._admitted.add(cleaned)


@dataclass(frozen=True)
class TenantSource:
    """Where a request's tenant comes from (see the module's doc); ``kind`` None: no tenant."""

    kind: str | None = None
    header: str | None = None  # kind header: the header's name, lower case
    fixed: str | None = None  # kind resource: the process's tenant

    @classmethod
    def parse(cls, raw: "TenantSource | str | None") -> "TenantSource":
        if raw is None or isinstance(raw, TenantSource):
            return raw or cls()
        text = str(raw).strip()
        kind, _, arg = text.partition(":")
        kind = kind.strip().lower()
        if kind in ("", "none", "off"):
            return cls()
        if kind == "header":
            name = arg.strip().lower()
            if not name or not re.fullmatch(r"[a-z0-9!#$%&'*+.^_`|~-]+", name):
                raise ValueError(f"expected header:<name>, e.g. header:x-tenant-id; got {raw!r}")
            return cls("header", header=name)
        if kind in ("user", "lora") and not arg:
            return cls(kind)
        if kind == "resource" and not arg:
            from opentelemetry.sdk.resources import Resource  # reads OTEL_RESOURCE_ATTRIBUTES

            return cls("resource", fixed=clean(Resource.create().attributes.get(sc.REQUEST_TENANT)))
        raise ValueError(f"expected one of header:<name>, user, lora, resource; got {raw!r}")

    @property
    def reads_request(self) -> bool:
        """Whether the serving layer must read the request (its headers or its ``user`` field)."""
        return self.kind in ("header", "user")

    def from_request(self, headers: Mapping[str, str] | Any, user: Any) -> str | None:
        """The tenant of an OpenAI-compatible request: its header's value or its ``user`` field."""
        if self.kind == "header" and headers is not None:
            return clean(headers.get(self.header))
        if self.kind == "user":
            return clean(user)
        return None

    def resolve(self, from_request: str | None, lora_name: str | None) -> str | None:
        """A request's tenant: what the serving layer read, the adapter's name, or the process's."""
        if self.kind == "lora":
            return clean(lora_name)
        if self.kind == "resource":
            return self.fixed
        return from_request

"""One wrap table drives both wrap and unwrap; arguments are bound by name, never by position."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import wrapt

from ..core.guard import GUARD


@dataclass(frozen=True)
class Target:
    module: str
    name: str  # "Class.method" or "function"
    wrapper: Callable[..., Any]


class WrapTable:
    def __init__(self, targets: list[Target]) -> None:
        self.targets = targets
        self.applied: list[Target] = []

    def wrap(self) -> None:
        for t in self.targets:
            try:
                module = importlib.import_module(t.module)
                owner, attr = _resolve(module, t.name)
            except (ImportError, AttributeError):
                continue  # not in this engine version: nothing to wrap
            if is_wrapped(owner, attr):
                continue
            wrapt.wrap_function_wrapper(owner, attr, t.wrapper)
            self.applied.append(t)

    def unwrap(self) -> None:
        for t in reversed(self.applied):
            try:
                owner, attr = _resolve(importlib.import_module(t.module), t.name)
                if is_wrapped(owner, attr):
                    setattr(owner, attr, _own(owner, attr).__wrapped__)
            except Exception as exc:  # a module never imported was never wrapped
                GUARD.failed(f"unwrap {t.module}.{t.name}", exc)
        self.applied.clear()


def _own(owner: Any, attr: str) -> Any:
    # a class's own attribute, not what its descriptor returns (a bound wrapper)
    return owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)


def is_wrapped(owner: Any, attr: str) -> bool:
    # FunctionWrapper, not ObjectProxy: under wrapt 2 the public ObjectProxy is not its base
    return isinstance(_own(owner, attr), wrapt.FunctionWrapper)


def _resolve(module: Any, dotted: str) -> tuple[Any, str]:
    owner = module
    *path, attr = dotted.split(".")
    for part in path:
        owner = getattr(owner, part)
    getattr(owner, attr)  # raises AttributeError when absent
    return owner, attr


class ArgBinder:
    """Finds named arguments in ``(args, kwargs)`` using positions read once from the signature.

    Cheaper than ``inspect.signature(...).bind`` on every call, and still by name: a
    parameter inserted before ours in a new engine release moves its position here too.
    """

    def __init__(self, func: Callable[..., Any], skip_self: bool = True) -> None:
        params = list(inspect.signature(func).parameters.values())
        if skip_self and params and params[0].name in ("self", "cls"):
            params = params[1:]
        self.positions = {p.name: i for i, p in enumerate(params)
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}

    def get(self, args: tuple, kwargs: dict, name: str, default: Any = None) -> Any:
        if name in kwargs:
            return kwargs[name]
        i = self.positions.get(name)
        if i is not None and i < len(args):
            return args[i]
        return default

    def set(self, args: tuple, kwargs: dict, name: str, value: Any) -> tuple[tuple, dict]:
        i = self.positions.get(name)
        if name not in kwargs and i is not None and i < len(args):
            args = args[:i] + (value,) + args[i + 1:]
        else:
            kwargs = {**kwargs, name: value}
        return args, kwargs

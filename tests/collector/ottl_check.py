"""A syntax checker for the OTTL the scale-config files carry, written from upstream's grammar.

Source: open-telemetry/opentelemetry-collector-contrib pkg/ottl/grammar.go (read @ f17fbd00556102b017899af775ec2a3d3809e42a):
the participle grammar (booleanExpression / term / booleanValue / comparison / value / mathExpression /
converter / path / key) and ``buildLexer()``; the lexer rules below are the current ones: the String
rule ``"(\\\\.|[^\\\\"])*"`` from PR #30839 (fixes issue #23238: a string ending in an escaped backslash
swallowed the next string), the ``Nil`` token and the unsigned ``Int``/``Float`` rules (sign handled by
``mathValue``'s unary operator). String tokens are unquoted with participle's ``Unquote`` =
Go ``strconv.Unquote``, reproduced in ``go_unquote``.

Only the subset of the language our generator uses is semantic-checked (converter names, span paths);
the syntax is the whole grammar minus editors (conditions and value expressions never contain them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# buildLexer(): the order matters (participle's simple lexer tries the rules in order at each position)
_RULES = [
    ("Bytes", r"0x[a-fA-F0-9]+"),
    ("Float", r"(\d+\.\d*|\d*\.\d+)([eE][-+]?\d+)?"),
    ("Int", r"\d+"),
    ("String", r'"(\\.|[^\\"])*"'),
    ("Nil", r"\b(nil)\b"),
    ("OpNot", r"\b(not)\b"),
    ("OpOr", r"\b(or)\b"),
    ("OpAnd", r"\b(and)\b"),
    ("OpComparison", r"==|!=|>=|<=|>|<"),
    ("OpAddSub", r"\+|\-"),
    ("OpMultDiv", r"\/|\*"),
    ("Boolean", r"\b(true|false)\b"),
    ("Equal", r"="),
    ("LParen", r"\("),
    ("RParen", r"\)"),
    ("LBrace", r"\{"),
    ("RBrace", r"\}"),
    ("Colon", r"\:"),
    ("Punct", r"[,.\[\]]"),
    ("Uppercase", r"[A-Z][A-Z0-9_]*"),
    ("Lowercase", r"[a-z][a-z0-9_]*"),
    ("whitespace", r"\s+"),
]
_LEXER = re.compile("|".join(f"(?P<{name}>{pattern})" for name, pattern in _RULES))

# ottlfuncs converters (pkg/ottl/ottlfuncs/README.md) used or likely in span-context expressions, plus the
# signal_to_metrics connector's own (internal/customottl: AdjustedCount)
CONVERTERS = {"Double", "Int", "String", "Bool", "IsDouble", "IsInt", "IsString", "IsBool", "IsMap", "IsList",
              "Milliseconds", "Microseconds", "Nanoseconds", "Seconds", "Duration", "Len", "Concat", "Log",
              "AdjustedCount"}
# ottlspan context paths (pkg/ottl/contexts/ottlspan): the first field of a path
SPAN_PATHS = {"attributes", "name", "kind", "status", "start_time", "end_time", "start_time_unix_nano",
              "end_time_unix_nano", "trace_id", "span_id", "parent_span_id", "trace_state", "events",
              "links", "dropped_attributes_count", "resource", "instrumentation_scope", "cache", "span"}


class OTTLSyntaxError(ValueError):
    pass


@dataclass
class Token:
    kind: str
    text: str
    pos: int


@dataclass
class Parsed:
    """What a parse found: enough for the tests to check meaning, not only form."""

    strings: list[str] = field(default_factory=list)      # unquoted string literals
    converters: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)        # first field of each path


def tokenize(text: str) -> list[Token]:
    out, pos = [], 0
    while pos < len(text):
        m = _LEXER.match(text, pos)
        if not m or m.end() == pos:
            raise OTTLSyntaxError(f"invalid input text {text[pos:pos + 20]!r} at {pos}")
        if m.lastgroup != "whitespace":
            out.append(Token(m.lastgroup or "", m.group(), pos))
        pos = m.end()
    return out


_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
                   '"': '"'}


def go_unquote(literal: str) -> str:
    """Go's ``strconv.Unquote`` for a double-quoted literal (the only kind OTTL's lexer produces)."""
    if len(literal) < 2 or literal[0] != '"' or literal[-1] != '"':
        raise OTTLSyntaxError(f"not a quoted string: {literal!r}")
    body, out, i = literal[1:-1], [], 0
    while i < len(body):
        c = body[i]
        if c == "\n":
            raise OTTLSyntaxError("newline in string literal")
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(body):
            raise OTTLSyntaxError("dangling backslash")
        e = body[i + 1]
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
            i += 2
        elif e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i + 2:i + 2 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise OTTLSyntaxError(f"bad \\{e} escape")
            out.append(chr(int(digits, 16)))
            i += 2 + n
        elif e in "01234567":
            digits = body[i + 1:i + 4]
            if len(digits) != 3 or not all(d in "01234567" for d in digits) or int(digits, 8) > 255:
                raise OTTLSyntaxError("bad octal escape")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise OTTLSyntaxError(f"invalid escape \\{e}")
    return "".join(out)


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = tokenize(text)
        self.i = 0
        self.found = Parsed()

    # -- helpers
    def peek(self, k: int = 0) -> Token | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def at(self, kind: str, text: str | None = None) -> bool:
        t = self.peek()
        return t is not None and t.kind == kind and (text is None or t.text == text)

    def take(self, kind: str, text: str | None = None) -> Token:
        if not self.at(kind, text):
            got = self.peek()
            raise OTTLSyntaxError(f"expected {text or kind}, got {got.text if got else 'end of input'!r}")
        t = self.toks[self.i]
        self.i += 1
        return t

    def attempt(self, fn):  # noqa: ANN001 - backtracking like participle's lookahead
        save_i, save = self.i, (list(self.found.strings), list(self.found.converters), list(self.found.paths))
        try:
            return fn()
        except OTTLSyntaxError:
            self.i = save_i
            self.found.strings, self.found.converters, self.found.paths = (list(x) for x in save)
            return None

    def end(self) -> None:
        if self.peek() is not None:
            raise OTTLSyntaxError(f"unexpected {self.peek().text!r} at {self.peek().pos}")

    # -- grammar
    def boolean_expression(self) -> bool:
        self.term()
        while self.at("OpOr"):
            self.take("OpOr")
            self.term()
        return True

    def term(self) -> None:
        self.boolean_value()
        while self.at("OpAnd"):
            self.take("OpAnd")
            self.boolean_value()

    def boolean_value(self) -> None:
        if self.at("OpNot"):
            self.take("OpNot")
        if self.attempt(self.comparison):
            return
        if self.at("Boolean"):
            self.take("Boolean")
            return
        if self.attempt(self.converter):
            return
        self.take("LParen")
        self.boolean_expression()
        self.take("RParen")

    def comparison(self) -> bool:
        self.value()
        self.take("OpComparison")
        self.value()
        return True

    def value(self) -> bool:
        if self.at("Nil"):
            self.take("Nil")
            return True
        if self.attempt(self._literal_alone):
            return True
        if self.attempt(self.math_expression):
            return True
        for kind in ("Bytes", "Boolean"):
            if self.at(kind):
                self.take(kind)
                return True
        if self.at("String"):
            self.found.strings.append(go_unquote(self.take("String").text))
            return True
        if self.at("Uppercase") and not (self.peek(1) and self.peek(1).kind == "Lowercase"):
            self.take("Uppercase")  # enum symbol
            return True
        if self.at("Punct", "["):
            self.take("Punct", "[")
            while not self.at("Punct", "]"):
                self.value()
                if self.at("Punct", ","):
                    self.take("Punct", ",")
            self.take("Punct", "]")
            return True
        raise OTTLSyntaxError(f"expected a value, got {self.peek().text if self.peek() else 'end of input'!r}")

    def _literal_alone(self) -> bool:
        self.math_expr_literal()
        if self.at("OpAddSub") or self.at("OpMultDiv"):
            raise OTTLSyntaxError("a math expression, not a literal")
        return True

    def math_expr_literal(self) -> bool:
        if self.at("Lowercase") and self.peek(1) is not None and self.peek(1).kind == "LParen":
            raise OTTLSyntaxError(f"converter names must start with an uppercase letter but got "
                                  f"{self.peek().text!r}")
        if self.attempt(self.converter):
            return True
        for kind in ("Float", "Int"):
            if self.at(kind):
                self.take(kind)
                return True
        return self.path()

    def converter(self) -> bool:
        name = self.take("Uppercase").text
        while self.at("Uppercase") or self.at("Lowercase"):
            name += self.take(self.peek().kind).text
        self.take("LParen")
        if not self.at("RParen"):
            self.argument()
            while self.at("Punct", ","):
                self.take("Punct", ",")
                self.argument()
        self.take("RParen")
        self.found.converters.append(name)
        self.keys()
        return True

    def argument(self) -> None:
        if self.at("Lowercase") and self.peek(1) is not None and self.peek(1).kind == "Equal":
            self.take("Lowercase")
            self.take("Equal")
        self.value()

    def path(self) -> bool:
        first = self.take("Lowercase").text
        self.keys()
        while self.at("Punct", "."):
            self.take("Punct", ".")
            self.take("Lowercase")
            self.keys()
        self.found.paths.append(first)
        return True

    def keys(self) -> None:
        while self.at("Punct", "["):
            self.take("Punct", "[")
            if self.at("String"):
                self.found.strings.append(go_unquote(self.take("String").text))
            elif self.at("Int"):
                self.take("Int")
            else:
                self.math_expression()
            self.take("Punct", "]")

    def math_expression(self) -> bool:
        self.add_sub_term()
        while self.at("OpAddSub"):
            self.take("OpAddSub")
            self.add_sub_term()
        return True

    def add_sub_term(self) -> None:
        self.math_value()
        while self.at("OpMultDiv"):
            self.take("OpMultDiv")
            self.math_value()

    def math_value(self) -> None:
        if self.at("OpAddSub"):
            self.take("OpAddSub")
        if self.at("LParen"):
            self.take("LParen")
            self.math_expression()
            self.take("RParen")
        else:
            self.math_expr_literal()


def _semantic(found: Parsed, text: str) -> Parsed:
    unknown = [c for c in found.converters if c not in CONVERTERS]
    if unknown:
        raise OTTLSyntaxError(f"{text!r}: unknown converter(s) {unknown}")
    bad = [p for p in found.paths if p not in SPAN_PATHS]
    if bad:
        raise OTTLSyntaxError(f"{text!r}: not a span path: {bad}")
    return found


def parse_condition(text: str) -> Parsed:
    """A boolean expression (``ParseCondition``: tail_sampling ottl_condition, signal_to_metrics conditions)."""
    p = _Parser(text)
    p.boolean_expression()
    p.end()
    return _semantic(p.found, text)


def parse_value_expression(text: str) -> Parsed:
    """A value (``ParseValueExpression``: signal_to_metrics histogram/sum ``value`` and ``count``)."""
    p = _Parser(text)
    p.value()
    p.end()
    return _semantic(p.found, text)

"""Label and field selectors with the grammar and matching rules of a real kube-apiserver.

The simulated API server filters LIST and WATCH results with these, so a client that
relies on e.g. ``labelSelector=app notin (a,b)`` or ``fieldSelector=spec.nodeName=n1``
sees exactly what it would see against a real cluster, including the 400 errors a real
server returns for selectors it cannot parse or fields it does not index.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FieldSelector",
    "LabelSelector",
    "SelectorError",
    "field_value",
    "parse_field_selector",
    "parse_label_selector",
]

_NAME_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SPECIAL = frozenset("!=<>(),")
_SET_OPS = frozenset({"in", "notin"})
_INT_OPS = frozenset({"gt", "lt"})


class SelectorError(ValueError):
    """A selector string that a real API server would reject with 400 BadRequest."""


def _check_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if not name or len(name) > 63 or not _NAME_RE.match(name):
        raise SelectorError(f"invalid label key {key!r}: name part must be a qualified name")
    if "/" in key and (not prefix or len(prefix) > 253 or not _PREFIX_RE.match(prefix)):
        raise SelectorError(f"invalid label key {key!r}: prefix part must be a DNS subdomain")


def _check_value(value: str) -> None:
    if len(value) > 63 or not _NAME_RE.match(value):
        raise SelectorError(f"invalid label value: {value!r}: must be a valid label value")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "!=" and i + 1 < n and text[i + 1] == "=":
            out.append(text[i : i + 2])
            i += 2
        elif ch in _SPECIAL:
            out.append(ch)
            i += 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in _SPECIAL:
                j += 1
            out.append(text[i:j])
            i = j
    return out


@dataclass(frozen=True, slots=True)
class Requirement:
    """One label requirement: ``op`` is one of =, !=, in, notin, exists, !, gt, lt."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Apply this requirement with the semantics of k8s.io/apimachinery/pkg/labels."""
        has = self.key in labels
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and labels[self.key] in self.values
        if self.op in ("!=", "notin"):
            return not has or labels[self.key] not in self.values
        if not has:
            return False
        try:
            have = int(labels[self.key])
        except ValueError:
            return False
        want = int(next(iter(self.values)))
        return have > want if self.op == "gt" else have < want


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A parsed label selector: the AND of its requirements (empty matches everything)."""

    requirements: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        """True when the selector selects everything."""
        return not self.requirements

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether an object with these labels is selected."""
        if not self.requirements:
            return True
        lab = labels or {}
        return all(req.matches(lab) for req in self.requirements)


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse ``labelSelector`` syntax: ``a=b,c!=d,e in (f,g),h notin (i),j,!k,l>3``."""
    if not text or not text.strip():
        return LabelSelector()
    toks = _tokens(text)
    reqs: list[Requirement] = []
    pos = 0

    def peek() -> str | None:
        return toks[pos] if pos < len(toks) else None

    while True:
        tok = peek()
        if tok is None:
            raise SelectorError(f"unable to parse requirement: found '', expected: identifier in {text!r}")
        if tok == "!":
            pos += 1
            key = peek()
            if key is None or key in _SPECIAL:
                raise SelectorError(f"unable to parse requirement: expected identifier after '!' in {text!r}")
            _check_key(key)
            pos += 1
            reqs.append(Requirement(key, "!"))
        else:
            if tok in _SPECIAL or tok in ("==", "!="):
                raise SelectorError(f"unable to parse requirement: found {tok!r}, expected: identifier")
            _check_key(tok)
            key = tok
            pos += 1
            op = peek()
            if op is None or op == ",":
                reqs.append(Requirement(key, "exists"))
            elif op in ("=", "==", "!="):
                pos += 1
                value = peek()
                if value is None or value == ",":
                    value = ""
                elif value in _SPECIAL:
                    raise SelectorError(f"unable to parse requirement: found {value!r}, expected: value")
                else:
                    pos += 1
                _check_value(value)
                reqs.append(Requirement(key, "!=" if op == "!=" else "=", frozenset({value})))
            elif op in ("<", ">"):
                pos += 1
                value = peek()
                try:
                    int(value or "")
                except ValueError:
                    raise SelectorError(
                        f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must be "
                        f"an integer: {value!r}"
                    ) from None
                pos += 1
                reqs.append(Requirement(key, "gt" if op == ">" else "lt", frozenset({value or ""})))
            elif op in _SET_OPS:
                pos += 1
                if peek() != "(":
                    raise SelectorError(f"unable to parse requirement: found {peek()!r}, expected: '('")
                pos += 1
                values: set[str] = set()
                expect_value = True
                while True:
                    cur = peek()
                    if cur is None:
                        raise SelectorError(f"unable to parse requirement: unterminated set in {text!r}")
                    if cur == ")":
                        if expect_value and values:
                            values.add("")
                        pos += 1
                        break
                    if cur == ",":
                        if expect_value:
                            values.add("")
                        expect_value = True
                    elif cur in _SPECIAL or not expect_value:
                        raise SelectorError(f"unable to parse requirement: found {cur!r} in value set")
                    else:
                        _check_value(cur)
                        values.add(cur)
                        expect_value = False
                    pos += 1
                if not values:
                    raise SelectorError("for 'in', 'notin' operators, values set can't be empty")
                reqs.append(Requirement(key, op, frozenset(values)))
            else:
                raise SelectorError(f"unable to parse requirement: found {op!r}, expected: operator")
        nxt = peek()
        if nxt is None:
            break
        if nxt != ",":
            raise SelectorError(f"found {nxt!r}, expected: ',' or 'end of string'")
        pos += 1
    return LabelSelector(tuple(reqs))


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string value of a selectable field, rendered as the API server renders it."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """A parsed field selector: ``(field, negated, value)`` terms, all of which must hold."""

    terms: tuple[tuple[str, bool, str], ...] = ()

    @property
    def empty(self) -> bool:
        """True when the selector selects everything."""
        return not self.terms

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is selected."""
        return all((field_value(obj, path) == value) != negated for path, negated, value in self.terms)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    buf: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            buf.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    if escaped:
        buf.append("\\")
    parts.append("".join(buf))
    return parts


def _unescape(value: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise SelectorError(f"invalid field selector value escape in {value!r}")
            out.append(value[i + 1])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _split_term(term: str) -> tuple[str, str, str] | None:
    for i in range(len(term)):
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op) :]
    return None


def parse_field_selector(text: str | None, allowed: frozenset[str]) -> FieldSelector:
    """Parse ``fieldSelector`` (``f=v``, ``f==v``, ``f!=v``, comma-joined), checking fields.

    Fields outside ``allowed`` raise the error a real server gives for a field label it
    does not support for the resource.
    """
    if not text or not text.strip():
        return FieldSelector()
    terms: list[tuple[str, bool, str]] = []
    for raw in _split_unescaped(text, ","):
        term = raw.strip()
        split = _split_term(term)
        if split is None:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        field, op, value = split
        negated = op == "!="
        field = field.strip()
        if field not in allowed:
            raise SelectorError(f"field label not supported: {field}")
        terms.append((field, negated, _unescape(value)))
    return FieldSelector(tuple(terms))

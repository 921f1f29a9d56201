"""Fault injection for the simulated API server, reproducible from a seed.

The garbage collector must survive an API server that fails, throttles, stalls and drops
watches, so tests and demos need to switch such behaviour on and off at runtime: from
Python through ``server.faults`` or from another process through ``POST /_sim/faults``.
A rule matches requests by verb, resource, name and namespace and can inject an error
(500, 429 with ``Retry-After``, 503, 504), added latency, a watch connection dropped
after N events or at a per-event rate, or a forced 410 on the next watch or
list-continue. All randomness comes from one seeded ``random.Random``.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

__all__ = ["ERROR_REASONS", "VERBS", "FaultDecision", "FaultInjector", "FaultRule"]

# `discovery` (the `/api`, `/apis` documents) matches only the rules that name it.
VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete", "discovery"})

#: Injectable HTTP error codes with the Status reason and message a real server uses.
ERROR_REASONS: dict[int, tuple[str, str]] = {
    500: ("InternalError", "Internal error occurred: injected fault"),
    429: ("TooManyRequests", "Too many requests, please try again later."),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "the server was unable to return a response in the time allotted"),
}


def _names(value: Any, what: str) -> frozenset[str] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(v, str) for v in items):
        raise ValueError(f"{what} must be strings")
    return frozenset(items)


@dataclass
class FaultRule:
    """What to inject into matching requests. ``None`` matchers match everything.

    ``times`` limits how often the rule takes effect; it is then spent and ignored.
    """

    verbs: frozenset[str] | None = None
    resources: frozenset[str] | None = None
    name: str | None = None
    namespace: str | None = None
    error_rate: float = 0.0
    error_code: int = 500
    retry_after: float | None = None
    latency: float = 0.0
    drop_watch_after: int | None = None
    drop_watch_rate: float = 0.0
    expire: bool = False
    times: int | None = None
    id: int = 0
    hits: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        self.verbs = _names(self.verbs, "verbs")
        self.resources = _names(self.resources, "resources")
        if self.verbs is not None and not self.verbs <= VERBS:
            raise ValueError(f"unknown verbs {sorted(self.verbs - VERBS)}; known: {sorted(VERBS)}")
        if self.error_code not in ERROR_REASONS:
            raise ValueError(f"error_code must be one of {sorted(ERROR_REASONS)}")
        for rate in (self.error_rate, self.drop_watch_rate):
            if not 0.0 <= rate <= 1.0:
                raise ValueError("rates must be within [0, 1]")
        if self.latency < 0 or (self.drop_watch_after is not None and self.drop_watch_after < 0):
            raise ValueError("latency and drop_watch_after must not be negative")

    @property
    def spent(self) -> bool:
        """Whether the rule has taken effect ``times`` times already."""
        return self.times is not None and self.hits >= self.times

    def matches(self, verb: str, resource: str | None, name: str | None, namespace: str | None) -> bool:
        """Whether a request is selected by this rule's matchers."""
        return (
            (verb in self.verbs if self.verbs is not None else verb != "discovery")
            and (self.resources is None or resource in self.resources)
            and (self.name is None or self.name == name)
            and (self.namespace is None or self.namespace == namespace)
        )

    def to_json(self) -> dict[str, Any]:
        """The rule as the control endpoint renders it."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = sorted(value) if isinstance(value, frozenset) else value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FaultRule:
        """Build a rule from JSON; ``verb``/``resource`` are accepted as singular aliases."""
        known = {f.name for f in fields(cls)} - {"id", "hits"}
        args = dict(data)
        for alias, key in (("verb", "verbs"), ("resource", "resources")):
            if alias in args:
                args[key] = args.pop(alias)
        unknown = set(args) - known
        if unknown:
            raise ValueError(f"unknown fault rule fields: {sorted(unknown)}")
        return cls(**args)


@dataclass(frozen=True, slots=True)
class FaultDecision:
    """The combined effect of all rules on one request."""

    latency: float = 0.0
    error_code: int | None = None
    retry_after: float | None = None
    expire: bool = False
    drop_after: int | None = None
    drop_rate: float = 0.0
    rule_ids: tuple[int, ...] = ()

    @property
    def error_reason(self) -> str | None:
        """The Status reason of the injected error, if any."""
        return ERROR_REASONS[self.error_code][0] if self.error_code else None

    @property
    def error_message(self) -> str:
        """The Status message of the injected error."""
        return ERROR_REASONS[self.error_code][1] if self.error_code else ""

    @property
    def retry_after_header(self) -> str | None:
        """``Retry-After`` in whole seconds, as client-go expects it."""
        if self.retry_after is None:
            return None
        return str(max(0, math.ceil(self.retry_after)))

    def describe(self) -> str | None:
        """A short summary for the request log (``None`` when nothing was injected)."""
        parts = []
        if self.latency:
            parts.append(f"latency={self.latency:g}s")
        if self.error_code:
            parts.append(f"error={self.error_code}")
        if self.expire:
            parts.append("expire")
        if self.drop_after is not None or self.drop_rate:
            parts.append("drop-watch")
        return ",".join(parts) or None


_NO_FAULT = FaultDecision()


class FaultInjector:
    """Thread-safe rule set consulted by the API server for every request."""

    def __init__(self, seed: int | None = 0) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self._next_id = 1
        self._seed = seed
        self._rng = random.Random(seed)

    def seed(self, seed: int | None) -> None:
        """Reseed the random source (rule hit counters are kept)."""
        with self._lock:
            self._seed = seed
            self._rng = random.Random(seed)

    @property
    def rules(self) -> list[FaultRule]:
        """Copies of the installed rules."""
        with self._lock:
            return [replace(r) for r in self._rules]

    def add(self, rule: FaultRule | None = None, **kwargs: Any) -> FaultRule:
        """Install ``rule`` (or one built from keyword arguments); returns it with its id."""
        if rule is None:
            rule = FaultRule(**kwargs)
        elif kwargs:
            raise TypeError("pass either a FaultRule or keyword arguments, not both")
        with self._lock:
            rule.id = self._next_id
            self._next_id += 1
            self._rules.append(rule)
            return rule

    def remove(self, rule_id: int) -> bool:
        """Remove one rule; False if there was none with that id."""
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if r.id != rule_id]
            return len(self._rules) != before

    def clear(self) -> None:
        """Remove every rule."""
        with self._lock:
            self._rules.clear()

    def decide(
        self,
        verb: str,
        resource: str | None,
        name: str | None = None,
        namespace: str | None = None,
        *,
        continuing: bool = False,
    ) -> FaultDecision:
        """Roll the dice for one request. ``continuing``: a LIST with a continue token."""
        with self._lock:
            if not self._rules:
                return _NO_FAULT
            latency, drop_rate = 0.0, 0.0
            error: tuple[int, float | None] | None = None
            expire = False
            drop_after: int | None = None
            fired: list[int] = []
            for rule in self._rules:
                if rule.spent or not rule.matches(verb, resource, name, namespace):
                    continue
                effect = False
                if rule.latency:
                    latency += rule.latency
                    effect = True
                if rule.error_rate and error is None and self._rng.random() < rule.error_rate:
                    retry = rule.retry_after
                    if retry is None and rule.error_code == 429:
                        retry = 1.0
                    error = (rule.error_code, retry)
                    effect = True
                if rule.expire and (verb == "watch" or (verb == "list" and continuing)):
                    expire = effect = True
                if verb == "watch" and rule.drop_watch_after is not None:
                    after = rule.drop_watch_after
                    drop_after = after if drop_after is None else min(drop_after, after)
                    effect = True
                if verb == "watch" and rule.drop_watch_rate:
                    drop_rate = max(drop_rate, rule.drop_watch_rate)
                    effect = True
                if effect:
                    rule.hits += 1
                    fired.append(rule.id)
            if not fired:
                return _NO_FAULT
            return FaultDecision(
                latency=latency,
                error_code=error[0] if error else None,
                retry_after=error[1] if error else None,
                expire=expire,
                drop_after=drop_after,
                drop_rate=drop_rate,
                rule_ids=tuple(fired),
            )

    def roll(self, rate: float) -> bool:
        """One seeded Bernoulli trial (used per watch event for ``drop_watch_rate``)."""
        if rate <= 0:
            return False
        with self._lock:
            return self._rng.random() < rate

    def set_rules(self, rules: Iterable[FaultRule]) -> list[FaultRule]:
        """Replace every rule."""
        self.clear()
        return [self.add(r) for r in rules]

    def control(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Apply a control-endpoint request; raises ValueError/TypeError when malformed.

        ``{"action": "add", "rule": {...}}`` or ``"rules": [...]``; ``"set"`` (replace all);
        ``"remove"`` with ``"id"``; ``"clear"``; ``"seed"`` with ``"seed"``.
        """
        action = payload.get("action", "set" if "rules" in payload else "list")
        raw = payload.get("rules", [payload["rule"]] if "rule" in payload else [])
        if not isinstance(raw, list) or not all(isinstance(r, Mapping) for r in raw):
            raise ValueError("rules must be a list of objects")
        if action == "add":
            for r in raw:
                self.add(FaultRule.from_json(r))
        elif action == "set":
            self.set_rules([FaultRule.from_json(r) for r in raw])
        elif action == "remove":
            self.remove(int(payload["id"]))
        elif action == "clear":
            self.clear()
        elif action == "seed":
            self.seed(payload.get("seed"))
        elif action != "list":
            raise ValueError(f"unknown action {action!r}")
        return {"seed": self._seed, "rules": [r.to_json() for r in self.rules]}

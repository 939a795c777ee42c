"""One registry idiom for every kind of pluggable thing: backends, mechanisms, models, tasks, bench suites.

A :class:`Registry` maps names to entries (a class or an object) in registration
order. It registers (:meth:`~Registry.register`, usable as a decorator), lists
(:meth:`~Registry.names`, :meth:`~Registry.entries`), looks up with an error that
names every known entry (:meth:`~Registry.get`), creates (:meth:`~Registry.create`:
calls a class entry with the settings) and asks an entry why it cannot serve a
request (:meth:`~Registry.why_not`: None when it can, else the reason in words).

Every registry in attnlab is one of these, so a new entry enrolls itself in dispatch,
``attnlab info`` and the generated conformance grid (``tests/test_conformance.py``)
by registering. This module imports nothing from attnlab (a leaf of the import contract).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _default_check(entry: Any, *args: Any, **kwargs: Any) -> str | None:
    """Ask the entry's own ``supports(...)``; an entry without one serves every request."""
    supports = getattr(entry, "supports", None)
    return None if supports is None else supports(*args, **kwargs)


class Registry(Generic[T]):
    """Named entries of one kind, in registration order.

    Args:
        kind: what an entry is, in words ("backend", "mechanism"): used in error messages.
        name_of: how to read an entry's name when :meth:`register` is given none
            (default: its ``name`` attribute).
        check: how to ask an entry whether it can serve a request (default: the entry's
            ``supports(*args, **kwargs)``); returns None or the reason in words.
        create: how to build from an entry and settings (default: call a class entry,
            return any other entry as it is).
        base: when set, what is registered must be a subclass of it (a class decorator).
        instance: register one instance of the decorated class (built with no arguments)
            instead of the class itself; the decorator still returns the class.
        requires: class attributes an entry must have to be registered (``config_class``).
    """

    def __init__(self, kind: str, *, name_of: Callable[[T], str] | None = None,
                 check: Callable[..., str | None] | None = None, create: Callable[..., Any] | None = None,
                 base: type | None = None, instance: bool = False, requires: tuple[str, ...] = ()):
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"kind must be a non-empty string, got {kind!r}")
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._name_of = name_of or (lambda entry: getattr(entry, "name", ""))
        self._check = check or _default_check
        self._create = create
        self._base, self._instance, self._requires = base, instance, tuple(requires)

    def register(self, entry: Any = None, *, name: str | None = None) -> Any:
        """Enroll ``entry`` under ``name`` (default: its name); replaces an entry of that name.

        The one registration path of attnlab: works as a plain call (``reg.register(obj)``)
        and as a class decorator (``@reg.register`` or ``@reg.register(name="x")``), which
        every ``register_backend``, ``register_mechanism``, ``register_model``,
        ``register_task`` and ``register_suite`` is. Returns what it was given.

        Raises:
            ValueError: when the entry is not a subclass of the registry's ``base``, lacks a
                required attribute, or has no name; the message names the entry and the kind.
        """
        if entry is None:
            return lambda e: self.register(e, name=name)
        what = getattr(entry, "__name__", repr(entry))
        if self._base is not None and not (isinstance(entry, type) and issubclass(entry, self._base)):
            raise ValueError(f"cannot register {what} as a {self.kind}: it must be a {self._base.__name__} "
                             f"subclass, got {entry!r}")
        missing = [a for a in self._requires if not hasattr(entry, a)]
        if missing:
            raise ValueError(f"cannot register {what} as a {self.kind}: it must have {', '.join(missing)}")
        key = name if name is not None else self._name_of(entry)
        if not isinstance(key, str) or not key:
            raise ValueError(f"cannot register {what} as a {self.kind}: it must have a non-empty string name, "
                             f"got {key!r}")
        self._entries[key] = entry() if self._instance else entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove and return the entry ``name`` (tests register temporary entries)."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    def entries(self) -> dict[str, T]:
        """A copy of the name -> entry mapping, in registration order."""
        return dict(self._entries)

    def get(self, name: str) -> T:
        """The entry registered as ``name``.

        Raises:
            ValueError: for an unknown name, listing the known ones.
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"{self.kind} must be one of {sorted(self._entries)}, got {name!r}") from None

    def create(self, name: str, /, **settings: Any) -> Any:
        """Build the entry ``name`` with keyword ``settings`` (a class entry is called with them).

        Raises:
            ValueError: for an unknown name, or settings the entry does not take.
        """
        entry = self.get(name)
        if self._create is not None:
            return self._create(entry, **settings)
        if not isinstance(entry, type):
            if settings:
                raise ValueError(f"{self.kind} {name!r} is an object, not a class: it takes no settings, "
                                 f"got {sorted(settings)}")
            return entry
        try:
            return entry(**settings)
        except TypeError as e:
            raise ValueError(f"bad settings for {self.kind} {name!r}: {e}") from e

    def why_not(self, name: str, /, *args: Any, **kwargs: Any) -> str | None:
        """None when the entry ``name`` can serve the request ``(*args, **kwargs)``, else why not, in words.

        An unknown name is itself a reason (never an exception).
        """
        if name not in self:
            return f"no {self.kind} named {name!r} (known: {sorted(self._entries)})"
        return self._check(self._entries[name], *args, **kwargs)

    def reasons(self, *args: Any, **kwargs: Any) -> dict[str, str | None]:
        """:meth:`why_not` of every entry for one request, by name."""
        return {name: self.why_not(name, *args, **kwargs) for name in self._entries}

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:  # an unhashable "name" (a list, a dict) names nothing
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


__all__ = ["Registry"]

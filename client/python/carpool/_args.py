"""Argument checks made before anything reaches the server: a wrong type raises TypeError, a bad
value ValueError, each naming the argument, the value and the fix. Internal to the package."""

from __future__ import annotations

import numbers
import os
from typing import Any, Optional


def _shown(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def integer(name: str, value: Any, minimum: Optional[int] = None,
            maximum: Optional[int] = None) -> int:
    """`value` as an int; bool and float are refused (True is no batch size, 2.5 no epoch count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {_shown(value)}; pass e.g. {name}="
                        f"{minimum if minimum is not None else 0}")
    n = int(value)
    if minimum is not None and n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}; pass {name}={minimum} or more")
    if maximum is not None and n > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {n}; pass {name}={maximum} or less")
    return n


def optional_integer(name: str, value: Any, minimum: Optional[int] = None) -> Optional[int]:
    return None if value is None else integer(name, value, minimum)


def number(name: str, value: Any, positive: bool = True) -> float:
    """`value` as a float (an int is fine); positive=True refuses 0 and below."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {_shown(value)}; pass e.g. {name}=10.0")
    x = float(value)
    if x != x or (positive and x <= 0):
        raise ValueError(f"{name} must be a number > 0, got {x}; pass e.g. {name}=10.0")
    return x


def text(name: str, value: Any, allow_empty: bool = True) -> str:
    """`value` as a str; bytes and other types are refused rather than str()-ed into nonsense."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {_shown(value)}; pass the {name} as text")
    if not allow_empty and not value.strip():
        raise ValueError(f"{name} must not be empty, got {value!r}; pass a {name}")
    if "\0" in value:
        raise ValueError(f"{name} {value!r} holds a NUL character; pass it without one")
    return value


def optional_text(name: str, value: Any) -> Optional[str]:
    return None if value is None else text(name, value)


def path(name: str, value: Any) -> str:
    """A filesystem path given as str or os.PathLike, as a str."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a path (str or pathlib.Path), got {_shown(value)}")
    if not value or "\0" in value:
        raise ValueError(f"{name} must be a non-empty path without NUL characters, got {value!r}")
    return value


def optional_path(name: str, value: Any) -> Optional[str]:
    return None if value is None else path(name, value)

"""The docstrings' facts that come from the registry: each method, its
summary and its parameters, and the lists of methods by property."""

from __future__ import annotations

from typing import Any

from . import _hubnorm

#: The properties of :func:`hubnorm.methods` a docstring names as
#: ``{property}``, filled with the methods that have it.
PROPERTIES = ("transductive", "iterating", "screened_bank_pass")


def method_list() -> str:
    """The registry as docstring lines: each method, its summary and its
    parameters' keywords with their defaults."""
    lines = ["", "Methods (``methods=``) and their parameters (``**params``, defaults shown):", ""]
    for method in _hubnorm.methods():
        params = ", ".join(f"{name}={default:g}" for name, default, _ in method["parameters"])
        lines.append(f"- ``{method['name']}``: {method['summary']}" + (f" ({params})" if params else ""))
    return "\n".join(f"    {line}" if line else line for line in lines)


def names_where(property: str) -> str:
    """The methods with ``property``, as "``a``, ``b`` and ``c``"."""
    names = [f"``{m['name']}``" for m in _hubnorm.methods() if m[property]]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def complete(*functions: Any) -> None:
    """Fills each function's ``{property}`` placeholders and appends the
    method list to its docstring."""
    names = {key: names_where(key) for key in PROPERTIES}
    for function in functions:
        doc = function.__doc__ or ""
        for key, listed in names.items():
            doc = doc.replace("{" + key + "}", listed)
        function.__doc__ = doc + method_list()

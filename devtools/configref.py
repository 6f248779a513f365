"""What the configuration reference (docs/configuration.md) says about each setting.

autodoc-traits writes the reference from the traits when the site is built
(``make docs``); docs/conf.py asks this module which traits are gpuspawner's own
(every configurable trait, ``.tag(config=True)``, that gpuspawner's classes define
on ``GPUSwarmSpawner``, found by introspection, so a new trait appears without
editing anything; those inherited from dockerspawner and JupyterHub are left to
their own docs) and adds each one's type, range and default. Those depend only on
the code, never on the machine: a default computed at start (e.g.
``local_gpu_host``, the hub's hostname) is shown as computed.
"""

from __future__ import annotations

import inspect
import math
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

from traitlets import Container, Dict, Enum, Float, HasTraits, Int, TraitType, Tuple, Union
from traitlets.traitlets import DefaultHandler

from gpuspawner.spawn.spawner import GPUSwarmSpawner


@dataclass(frozen=True)
class Setting:
    name: str
    module: str
    type: str
    default: str
    help: str


def first_sentence(text: str) -> str:
    """The first sentence of a docstring, on one line."""
    flat = " ".join(inspect.cleandoc(text).split())
    match = re.match(r"(.+?[.!?])(\s|$)", flat)
    return match.group(1) if match else flat


def _blocks(text: str) -> Iterator[tuple[str, str]]:
    """The help's blocks in order, reStructuredText's way: ``("text", paragraph on one
    line)``, and ``("code", block)`` for the indented literal block after a paragraph
    that ends in ``::`` (which then reads ``:``, or loses it after a space)."""
    lines = inspect.cleandoc(text).splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].strip():
            i += 1
        flat = " ".join(" ".join(lines[start:i]).split())
        if not flat.endswith("::"):
            yield "text", flat
            continue
        head = flat[:-2].rstrip() if flat == "::" or flat[-3] == " " else flat[:-1]
        if head:
            yield "text", head
        start = i
        while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
            i += 1
        code = textwrap.dedent("\n".join(lines[start:i])).strip("\n")
        if code:
            yield "code", code


def paragraphs(text: str) -> str:
    """Help text dedented, each paragraph on one line, paragraphs separated by a blank
    line; a literal block (``Example::`` and an indented block) as a fenced Python block."""
    return "\n\n".join(block if kind == "text" else f"```python\n{block}\n```" for kind, block in _blocks(text))


def examples(text: str) -> list[str]:
    """The literal blocks of a help text (``Example::`` and the indented block after it), as code."""
    return [block for kind, block in _blocks(text) if kind == "code"]


def type_name(trait: TraitType) -> str:
    """A readable name of a trait's type: ``List of Enum('static','agent','local')``."""
    if isinstance(trait, Union):
        name = "Union of " + "/".join(type_name(t) for t in trait.trait_types)
    elif isinstance(trait, Enum):
        name = "Enum(" + ",".join(repr(v) for v in trait.values or ()) + ")"
    elif isinstance(trait, Tuple):
        inner = getattr(trait, "_traits", None)
        name = "Tuple(" + ", ".join(type_name(t) for t in inner) + ")" if inner else "Tuple"
    elif isinstance(trait, Dict):
        key, value = getattr(trait, "_key_trait", None), getattr(trait, "_value_trait", None)
        if key is not None and value is not None:
            name = f"Dict of {type_name(key)} to {type_name(value)}"
        elif value is not None:
            name = f"Dict of {type_name(value)} values"
        elif key is not None:
            name = f"Dict of {type_name(key)} keys"
        else:
            name = "Dict"
    elif isinstance(trait, Container):  # List, Set
        item = getattr(trait, "_trait", None)
        name = type(trait).__name__ + (f" of {type_name(item)}" if item is not None else "")
    elif isinstance(trait, Int):  # also gpuspawner's BoundedInteger
        name = "Integer"
    else:
        # gpuspawner's own trait classes read as the traitlets type they refine (FiniteFloat: Float)
        cls = next(c for c in type(trait).__mro__ if c.__module__.startswith("traitlets"))
        name = cls.__name__
    if getattr(trait, "allow_none", False):
        name += " or None"
    return name


def bounds(trait: TraitType) -> str:
    """`` (min 0)``, `` (1 to 65535)``, `` (0, or 0.01 to 3650)`` or nothing, for an Integer or Float."""
    if not isinstance(trait, (Int, Float)):
        return ""
    span = getattr(trait, "span", None)  # gpuspawner's ranged numbers say their range
    if isinstance(span, str):
        return f" ({span})"
    low, high = (b if b is not None and math.isfinite(b) else None for b in (trait.min, trait.max))
    if low is not None and high is not None:
        return f" ({low!r} to {high!r})"
    if low is not None:
        return f" (min {low!r})"
    if high is not None:
        return f" (max {high!r})"
    return ""


def default_handler(name: str, root: type[HasTraits] = GPUSwarmSpawner) -> object | None:
    """The method that computes ``name``'s default on ``root``, if one does:
    the first, along the MRO, of a ``@default(name)`` method (or a legacy
    ``_NAME_default``) and the class that defines the trait itself."""
    for cls in root.__mro__:
        for value in vars(cls).values():
            if isinstance(value, DefaultHandler) and value.trait_name == name:
                return value.func
        if f"_{name}_default" in vars(cls):
            return vars(cls)[f"_{name}_default"]
        if name in vars(cls):
            return None
    return None


def default_text(name: str, trait: TraitType, root: type[HasTraits] = GPUSwarmSpawner) -> str:
    """``repr`` of the default, or what computes it: never a value of this machine."""
    handler = default_handler(name, root)
    if handler is not None:
        doc = inspect.getdoc(handler)
        return f"computed: {first_sentence(doc)}" if doc else "computed at start"
    return repr(trait.default())


def gpuspawner_classes(root: type[HasTraits] = GPUSwarmSpawner) -> Iterator[type[HasTraits]]:
    """``root`` and the classes it inherits from gpuspawner, in MRO order."""
    for cls in root.__mro__:
        if cls.__module__.startswith("gpuspawner") and isinstance(cls, type) and issubclass(cls, HasTraits):
            yield cls


def settings(root: type[HasTraits] = GPUSwarmSpawner) -> list[Setting]:
    """Every configurable trait gpuspawner defines, grouped by module (in MRO
    order), sorted by name within a group. A trait defined twice counts where
    GPUSwarmSpawner takes it from: the first definition along the MRO."""
    seen: set[str] = set()
    out: list[Setting] = []
    modules: list[str] = []
    for cls in gpuspawner_classes(root):
        for name, trait in cls.class_own_traits(config=True).items():
            if name in seen:
                continue
            seen.add(name)
            if cls.__module__ not in modules:
                modules.append(cls.__module__)
            out.append(
                Setting(
                    name=name,
                    module=cls.__module__,
                    type=type_name(trait) + bounds(trait),
                    default=default_text(name, trait, root),
                    help=paragraphs(trait.help or ""),
                )
            )
    return sorted(out, key=lambda s: (modules.index(s.module), s.name))

"""The public surface: every entry a user reaches (``dptrain.__all__`` and the public
modules' ``__all__``) has a real signature and a docstring in ``help()``, as issue #11 asks."""

import importlib
import inspect
import pydoc

import pytest

import dptrain

MODULES = [
    "dptrain",
    "dptrain.nn",
    "dptrain.models",
    "dptrain.data",
    "dptrain.comm",
    "dptrain.optim",
    "dptrain.engine",
    "dptrain.measure.sweep",
    "dptrain.measure.perfmodel",
    "dptrain.measure.plots",
    "dptrain.measure.timing",
]


def public_entries():
    seen = set()
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        names = getattr(mod, "__all__", None)
        assert names, f"{mod_name} has no __all__: its public names are not declared"
        for name in names:
            obj = getattr(mod, name)
            if callable(obj) and id(obj) not in seen:
                seen.add(id(obj))
                yield pytest.param(obj, id=f"{mod_name}.{name}")


@pytest.mark.parametrize("obj", list(public_entries()))
def test_help_shows_a_signature_and_a_docstring(obj):
    doc = inspect.getdoc(obj)
    assert doc and len(doc.split()) >= 4, f"{obj!r} has no docstring worth the name"
    if inspect.isclass(obj) and not any(
        "__init__" in vars(c) or "__new__" in vars(c)
        for c in obj.__mro__[:-1]
        if c.__module__ != "builtins"
    ):
        return  # an exception or a dict with the builtin's constructor: nothing to show
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        pytest.fail(f"{obj!r} has no signature inspect can read")
    text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    # the parameters' names appear as written (not '*args, **kwargs')
    for p in sig.parameters.values():
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            assert p.name in text, f"help({obj.__name__}) does not show parameter {p.name}"


def test_every_name_in_dptrain_all_exists():
    for name in dptrain.__all__:
        assert hasattr(dptrain, name), name

"""The one registration path (``attnlab.registry.Registry.register``) and the one set of validators (``attnlab.utils``)."""

from __future__ import annotations

import pytest

from attnlab.bench.suite import Suite, register_suite
from attnlab.exact import Backend, register_backend
from attnlab.mechanisms import Mechanism, register_mechanism
from attnlab.models.io import register_model
from attnlab.registry import Registry
from attnlab.tasks import Task, register_task
from attnlab.utils import int_at_least, positive_int, positive_number, probability


class _Base:
    name = ""


def test_register_as_a_decorator_with_a_base_and_instances():
    reg: Registry = Registry("widget", base=_Base, instance=True)

    @reg.register
    class Knob(_Base):
        name = "knob"

    assert isinstance(reg.get("knob"), Knob) and Knob.name == "knob"  # an instance enrolled, the class returned
    with pytest.raises(ValueError, match=r"cannot register int as a widget: it must be a _Base subclass"):
        reg.register(int)
    with pytest.raises(ValueError, match=r"cannot register Nameless as a widget: it must have a non-empty string "
                                         r"name, got ''"):
        reg.register(type("Nameless", (_Base,), {}))
    assert reg.names() == ["knob"]


def test_required_attributes_and_explicit_names():
    reg: Registry = Registry("model", name_of=lambda cls: cls.__name__, requires=("config_class",))
    with pytest.raises(ValueError, match=r"cannot register Bare as a model: it must have config_class"):
        reg.register(type("Bare", (), {}))
    cls = reg.register(name="alias")(type("Full", (), {"config_class": dict}))
    assert reg.get("alias") is cls and reg.names() == ["alias"]


@pytest.mark.parametrize("decorator, base", [(register_backend, Backend), (register_mechanism, Mechanism),
                                             (register_task, Task), (register_suite, Suite)])
def test_every_kind_of_plug_in_says_the_same_words(decorator, base):
    """Backends, mechanisms, tasks, models and suites register through Registry.register: one wording."""
    assert getattr(decorator, "__func__", None) is Registry.register
    with pytest.raises(ValueError, match=r"cannot register object as a \w+: it must be a \w+ subclass"):
        decorator(object)
    with pytest.raises(ValueError, match=r"cannot register Unnamed as a \w+: it must have a non-empty string name"):
        decorator(type("Unnamed", (base,), {"name": ""}))


def test_models_register_through_the_same_path():
    assert register_model.__func__ is Registry.register
    with pytest.raises(ValueError, match=r"cannot register NoConfig as a model: it must have config_class"):
        register_model(type("NoConfig", (), {}))


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "4", None])
def test_positive_int_rejects_what_is_not_an_int_of_at_least_one(bad):
    with pytest.raises(ValueError, match=rf"heads must be a positive int, got {bad!r}"):
        positive_int(bad, "heads")


def test_validators_return_the_value_and_name_it_in_errors():
    assert positive_int(7, "n") == 7 and positive_int(None, "n", allow_none=True) is None
    with pytest.raises(ValueError, match=r"n must be a positive int or None, got 0"):
        positive_int(0, "n", allow_none=True)
    assert int_at_least(0, "seed", 0) == 0
    with pytest.raises(ValueError, match=r"buckets must be an int >= 4, got 3"):
        int_at_least(3, "buckets", 4)
    assert positive_number(0.5, "eps") == 0.5
    with pytest.raises(ValueError, match=r"eps must be a positive number, got 0"):
        positive_number(0, "eps")
    assert probability(0.0, "dropout") == 0.0
    with pytest.raises(ValueError, match=r"dropout must be a number in \[0, 1\), got 1"):
        probability(1, "dropout")

"""The one registry primitive (``diffsweep.config.registry.Registry``) that the schedulers, the probes and
the law forms use: order, lazy imports, one entry per name, and the errors a user sees. (Entry points
are used for real by tests/plugins/test_toy_kind.py, which installs a package that has them.)"""

from __future__ import annotations

import sys

import pytest

from diffsweep.config import ConfigError, EnvironmentUnavailable
from diffsweep.config.registry import Registry


class Animal:
    name = "?"


class Cat(Animal):
    name = "cat"


class Dog(Animal):
    name = "dog"


def zoo(**builtin) -> Registry[Animal]:
    return Registry("animal", "diffsweep.test_animals", Animal, builtin or {"cat": Cat, "dog": Dog}, key="pet")


def test_names_come_in_order_and_each_entry_is_made_once():
    animals = zoo()
    animals.register("hen", Animal())  # an object, not a class: taken as it is
    assert animals.names() == list(animals) == ["cat", "dog", "hen"]
    assert "dog" in animals and "cow" not in animals
    cat = animals.get("cat")
    assert isinstance(cat, Cat) and animals.get("cat") is cat


def test_a_module_named_by_a_string_is_imported_only_when_its_entry_is_asked_for(tmp_path, monkeypatch):
    (tmp_path / "far_zoo.py").write_text("from tests.config.test_registry import Animal\n\n"
                                         "class Owl(Animal):\n    name = 'owl'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    animals = zoo(owl="far_zoo:Owl")
    assert animals.names() == ["owl"] and "far_zoo" not in sys.modules
    assert type(animals.get("owl")).__name__ == "Owl" and "far_zoo" in sys.modules
    monkeypatch.delitem(sys.modules, "far_zoo")


def test_a_name_is_registered_once_and_a_tests_entry_can_be_removed():
    animals = zoo()
    with pytest.raises(ValueError, match="animal 'cat' is already registered"):
        animals.register("cat", Dog)
    animals.register("pup", Dog)
    with pytest.raises(ValueError, match="already registered"):
        animals.register("pup", Dog)
    animals.unregister("pup")
    assert animals.names() == ["cat", "dog"]


def test_an_unknown_name_names_the_closest_and_lists_them_all_on_the_callers_key():
    animals = zoo()
    with pytest.raises(ConfigError) as caught:
        animals.get("dgo")
    message = "unknown animal 'dgo' (did you mean 'dog'?); expected one of [cat, dog]"
    assert (caught.value.key, caught.value.message) == ("pet", message)
    with pytest.raises(ConfigError) as caught:
        animals.get("zebra", "sweep.animal")
    assert (caught.value.key, caught.value.message) == ("sweep.animal", "unknown animal 'zebra'; expected one of [cat, dog]")


def test_an_entry_of_the_wrong_type_or_under_another_name_is_refused():
    animals = zoo(cat=Cat, rock=object, fido=Dog)
    with pytest.raises(TypeError, match="animal 'rock': .* is not a tests.config.test_registry.Animal"):
        animals.get("rock")
    with pytest.raises(ConfigError, match="animal 'fido' is registered as .*Dog.*, whose name is 'dog'"):
        animals.get("fido")


def test_a_plugin_that_does_not_load_is_an_environment_error_naming_it_and_a_builtin_one_a_bug():
    """A user's broken package (a module that is not there, a class whose constructor fails) is one
    ``EnvironmentUnavailable`` naming the entry and why (the CLI prints it as one line, exit 3);
    the same failure of a built-in entry is diffsweep's bug and keeps its own exception."""

    class Sick(Animal):
        name = "sick"

        def __init__(self):
            raise OSError("no licence file")

    animals = zoo(builtin_sick="no_such_package_xyz.animals:Gone")
    animals.register("gone", "no_such_package_xyz.animals:Gone")
    animals.register("sick", Sick)
    with pytest.raises(EnvironmentUnavailable, match=r"animal 'gone' \('no_such_package_xyz.animals:Gone'\) could "
                       "not be loaded: ModuleNotFoundError: No module named 'no_such_package_xyz'"):
        animals.get("gone")
    with pytest.raises(EnvironmentUnavailable, match="animal 'sick' .* could not be loaded: OSError: no licence file"):
        animals.get("sick")
    with pytest.raises(ModuleNotFoundError):
        animals.get("builtin_sick")

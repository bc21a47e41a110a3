"""Flags of `projector run` added for hostile input: protected namespaces, ConfigMaps off."""

from __future__ import annotations

import pytest

from projector import config


def test_protected_namespaces_default_to_the_system_ones_and_always_hold_our_own() -> None:
    cfg = config.parse(["--namespace=projector"])
    assert cfg.protected == {"kube-system", "kube-public", "kube-node-lease", "projector"}
    narrowed = config.parse(["--namespace=projector", "--protected-namespaces= a, ,b"])
    assert narrowed.protected == {"a", "b", "projector"}


def test_protected_namespaces_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECTOR_PROTECTED_NAMESPACES", "x,y")
    assert config.parse([]).protected_namespaces == ("x", "y")


def test_configmaps_are_served_unless_turned_off() -> None:
    assert config.parse([]).configmaps
    assert not config.parse(["--no-configmaps"]).configmaps

"""ProjectionExport parsing and the producer's consent rule (`exports.consented`), pure."""

from __future__ import annotations

from typing import Any

import pytest

from projector.core.exports import LABEL, MAX_EXPORT_KEYS, consented, parse_export
from projector.core.model import ObjectKey, SourceKind
from projector.core.plans import SourceState
from projector.core.status import copies_by_export, export_status
from tests.unit.factories import make_export, make_source


def export_obj(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"source": {"name": "hub"}, "to": ["dask-gateway"]}
    base.update(spec)
    meta = {"namespace": "jupyterhub", "name": "token", "uid": "u", "generation": 2}
    return {"metadata": meta, "spec": base}


def test_parse_export_defaults() -> None:
    e = parse_export(export_obj())
    assert e.source == ObjectKey("jupyterhub", "hub", SourceKind.SECRET)  # its own namespace
    assert e.keys is None  # omitted: every key
    assert e.to == ("dask-gateway",) and e.generation == 2 and not e.refused
    assert str(e) == "jupyterhub/token"
    assert e.exports_to("dask-gateway") and not e.exports_to("other")


def test_parse_export_keys_globs_and_kind() -> None:
    e = parse_export(
        export_obj(source={"name": "cfg", "kind": "ConfigMap"}, keys=["a"], to=["team-*", "!x"])
    )
    assert e.source.kind is SourceKind.CONFIG_MAP
    assert e.keys == frozenset({"a"})
    assert e.ignored_to == ("!x",) and e.to == ("team-*",)
    assert e.exports_to("team-1") and not e.exports_to("x")


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        pytest.param({"to": [f"n{i}" for i in range(257)]}, "entries", id="to-entries"),
        pytest.param({"to": [f"g{i}-*" for i in range(33)]}, "globs", id="to-globs"),
        pytest.param({"keys": [f"k{i}" for i in range(MAX_EXPORT_KEYS + 1)]}, "keys", id="keys"),
    ],
)
def test_an_export_past_its_bounds_consents_to_nothing(spec: dict[str, Any], why: str) -> None:
    """A tenant writes every byte of an export: past a bound it lets nothing leave, and says so."""
    e = parse_export(export_obj(**spec))
    assert why in e.refused
    assert not e.exports_to("n1") and not e.exports_to("g1-a") and not e.exports_to("dask-gateway")


def test_a_broken_export_raises_and_is_skipped() -> None:
    with pytest.raises(KeyError):
        parse_export({"metadata": {"namespace": "n", "name": "e"}, "spec": {"to": ["*"]}})


def test_consent_is_the_label_or_a_matching_export_and_keys_are_their_union() -> None:
    labelled = make_source(export_to="a", export_keys=frozenset({"token"}))
    url = make_export(("a", "b"), frozenset({"url"}))
    everything = make_export(("c",), name="all")
    assert consented(labelled, (), "b") is None
    got = consented(labelled, (url,), "a")
    assert got is not None and got.keys == frozenset({"token", "url"})
    assert got.via == (LABEL, "export src/hub-token")
    only_export = consented(labelled, (url, everything), "b")
    assert only_export is not None and only_export.keys == frozenset({"url"})
    every = consented(labelled, (url, everything), "c")
    assert every is not None and every.keys is None
    unlabelled = make_source(export_to="*", labelled=False)
    assert consented(unlabelled, (), "a") is None  # its own export-to says nothing unlabelled


def test_an_exports_status_counts_only_the_copies_it_lets_in() -> None:
    """Names and counts only: the source found, this source's grants, the copies this export
    (not the label, not another export) lets in."""
    source = make_source(export_to="a")  # the label lets a in
    mine = make_export(("b", "c"), name="mine")
    other = make_export(("c", "d"), name="other")
    assert copies_by_export(source, (mine, other), ["a", "b", "c", "d"])[str(mine)] == 2
    status = export_status(mine, SourceState.AVAILABLE, ["g2", "g1"], 2)
    assert status["grants"] == ["g1", "g2"] and status["copies"] == 2
    assert status["conditions"][0]["status"] == "True"
    unknown = export_status(mine, None, [], 0)["conditions"][0]
    assert (unknown["status"], unknown["reason"]) == ("Unknown", "SourceUnknown")
    many = export_status(mine, SourceState.MISSING, [f"g{i}" for i in range(30)], 0)
    assert len(many["grants"]) == 20 and many["conditions"][0]["status"] == "False"

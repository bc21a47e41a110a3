"""The value types and parsers at the informer edge: grants, selectors, export-to, copies."""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from projector.core.grantspec import parse_grant, parse_grant_record
from projector.core.model import (
    DEFAULT_ON_REVOKE,
    DEFAULT_ON_SOURCE_DELETED,
    DEFAULT_SOURCE_KIND,
    EXPORT_KEYS_ANNOTATION,
    EXPORT_LABEL,
    EXPORT_TO_ANNOTATION,
    EXPORT_VALUE,
    GRANT_UID_ANNOTATION,
    HASH_ANNOTATION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    PREFIX,
    Copy,
    KeyMapping,
    LabelSelector,
    ObjectKey,
    OnRevoke,
    OnSourceDeleted,
    Source,
    content_hash,
    invalid_export_to,
    marked_by_projector,
    own_metadata,
    parse_copy,
    parse_export_to,
    parse_namespace,
    parse_source,
)
from projector.core.names import FIELD_MANAGER
from projector.errors import InvalidGrant
from tests.unit.factories import BY_HAND, b64, make_grant, make_source, stored_secret

CRD = (
    Path(__file__).parents[2]
    / "deploy/helm/projector/crds"
    / "projector.nebari.dev_projectiongrants.yaml"
)

# -- parse_grant -----------------------------------------------------------------------------------


def grant_obj(**spec: Any) -> dict[str, Any]:
    """A minimal valid ProjectionGrant; `spec` keys replace the defaults (None removes one)."""
    base: dict[str, Any] = {
        "source": {"namespace": "jupyterhub", "name": "hub"},
        "target": {"namespaces": ["dask-gateway"]},
    }
    for k, v in spec.items():
        if v is None:
            base.pop(k, None)
        else:
            base[k] = v
    return {
        "apiVersion": "projector.nebari.dev/v1alpha1",
        "kind": "ProjectionGrant",
        "metadata": {
            "name": "hub-to-dask",
            "uid": "u-1",
            "generation": 3,
            "creationTimestamp": "2024-01-01T00:00:00Z",
        },
        "spec": base,
    }


def test_parse_grant_defaults() -> None:
    g = parse_grant(grant_obj())
    assert g.name == "hub-to-dask"
    assert g.uid == "u-1"
    assert g.generation == 3
    assert g.created == "2024-01-01T00:00:00Z"
    assert g.source == ObjectKey("jupyterhub", "hub")
    assert g.keys is None  # omitted = every key
    assert g.target_name == "hub"  # default = source.name
    assert g.namespaces == frozenset({"dask-gateway"})
    assert g.selector is None
    assert g.labels == ()
    assert g.annotations == ()
    assert g.on_revoke is OnRevoke.DELETE
    assert g.on_source_deleted is OnSourceDeleted.RETAIN
    assert g.deleting is False


def test_the_crd_defaults_are_the_models() -> None:
    """The policy defaults are written once, in the model: what the API server fills in (the
    CRD's schema defaults) must say the same, or a grant would mean two things."""
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    policy = spec["policy"]["properties"]
    assert spec["source"]["properties"]["kind"]["default"] == DEFAULT_SOURCE_KIND
    assert policy["onRevoke"]["default"] == DEFAULT_ON_REVOKE
    assert policy["onSourceDeleted"]["default"] == DEFAULT_ON_SOURCE_DELETED
    assert parse_grant(grant_obj(policy=None)).on_revoke is DEFAULT_ON_REVOKE


def test_parse_grant_full_spec() -> None:
    g = parse_grant(
        grant_obj(
            keys=[
                {"from": "hub.services.dask-gateway.apiToken", "to": "api-token"},
                {"from": "url"},
            ],
            target={
                "name": "jupyterhub-contract",
                "namespaces": ["dask-gateway", "team-a"],
                "namespaceSelector": {
                    "matchLabels": {"nebari.dev/pack": "dask"},
                    "matchExpressions": [
                        {"key": "env", "operator": "In", "values": ["dev", "prod"]},
                        {"key": "frozen", "operator": "DoesNotExist"},
                    ],
                },
                "labels": {"app": "dask"},
                "annotations": {"team": "data"},
            },
            policy={"onRevoke": "Retain", "onSourceDeleted": "Delete"},
        )
    )
    assert g.keys == (
        KeyMapping("hub.services.dask-gateway.apiToken", "api-token"),
        KeyMapping("url", "url"),  # `to` defaults to `from`
    )
    assert g.target_name == "jupyterhub-contract"
    assert g.namespaces == frozenset({"dask-gateway", "team-a"})
    assert g.selector == LabelSelector(
        (("nebari.dev/pack", "dask"),),
        (("env", "In", ("dev", "prod")), ("frozen", "DoesNotExist", ())),
    )
    assert g.labels == (("app", "dask"),)
    assert g.annotations == (("team", "data"),)
    assert g.on_revoke is OnRevoke.RETAIN
    assert g.on_source_deleted is OnSourceDeleted.DELETE


@pytest.mark.parametrize(
    ("target", "namespaces", "has_selector"),
    [
        pytest.param({"namespaces": ["a"]}, {"a"}, False, id="namespaces-only"),
        pytest.param(
            {"namespaceSelector": {"matchLabels": {"x": "y"}}}, set(), True, id="selector"
        ),
        pytest.param(
            {"namespaces": ["a"], "namespaceSelector": {"matchLabels": {"x": "y"}}},
            {"a"},
            True,
            id="both",
        ),
    ],
)
def test_parse_grant_targets(
    target: dict[str, Any], namespaces: set[str], has_selector: bool
) -> None:
    g = parse_grant(grant_obj(target=target))
    assert g.namespaces == namespaces
    assert (g.selector is not None) is has_selector


def test_parse_grant_deleting_from_deletion_timestamp() -> None:
    obj = grant_obj()
    obj["metadata"]["deletionTimestamp"] = "2024-02-01T00:00:00Z"
    assert parse_grant(obj).deleting is True


def test_parse_grant_empty_to_defaults_to_from() -> None:
    g = parse_grant(grant_obj(keys=[{"from": "a", "to": ""}]))
    assert g.keys == (KeyMapping("a", "a"),)


def test_parse_grant_same_from_twice_under_two_names_is_allowed() -> None:
    g = parse_grant(grant_obj(keys=[{"from": "a", "to": "x"}, {"from": "a", "to": "y"}]))
    assert g.keys == (KeyMapping("a", "x"), KeyMapping("a", "y"))


def test_parse_grant_does_not_mutate_its_input() -> None:
    obj = grant_obj(keys=[{"from": "a"}], target={"namespaces": ["b"], "labels": {"x": "1"}})
    before = copy.deepcopy(obj)
    parse_grant(obj)
    assert obj == before


TARGET = {"namespaces": ["dask-gateway"]}


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        pytest.param({"source": None}, "required", id="no-source"),
        pytest.param({"source": {"namespace": "jupyterhub"}}, "required", id="no-source-name"),
        pytest.param({"source": {"name": "hub"}}, "required", id="no-source-namespace"),
        pytest.param(
            {"source": {"namespace": "", "name": "hub"}}, "required", id="empty-source-ns"
        ),
        pytest.param({"target": None}, "namespaces or namespaceSelector", id="no-target"),
        pytest.param({"target": {"name": "x"}}, "namespaces or namespaceSelector", id="no-targets"),
        pytest.param(
            {"target": {"namespaces": []}}, "namespaces or namespaceSelector", id="empty-namespaces"
        ),
        pytest.param(
            {"keys": [{"from": "a", "to": "x"}, {"from": "b", "to": "x"}]},
            "unique",
            id="duplicate-to",
        ),
        pytest.param(
            {"keys": [{"from": "x"}, {"from": "b", "to": "x"}]},
            "unique",
            id="duplicate-to-by-default",
        ),
        pytest.param({"keys": [{"from": "a/b"}]}, "invalid Secret key", id="key-with-slash"),
        pytest.param({"keys": [{"from": "a", "to": "b c"}]}, "invalid Secret key", id="to-space"),
        pytest.param({"keys": [{"from": ""}]}, "`from`", id="empty-key"),
        pytest.param({"keys": [{"from": "a", "to": "b\tc"}]}, "invalid Secret key", id="to-tab"),
        pytest.param({"keys": [{"from": "k" * 254}]}, "invalid Secret key", id="key-254-chars"),
        pytest.param({"keys": [{"from": "ключ"}]}, "invalid Secret key", id="key-non-ascii"),
        pytest.param(
            {"target": {**TARGET, "labels": {"projector.nebari.dev/grant": "other"}}},
            "reserved",
            id="reserved-label",
        ),
        pytest.param(
            {"target": {**TARGET, "annotations": {"projector.nebari.dev/grant-uid": "u"}}},
            "reserved",
            id="reserved-annotation",
        ),
        pytest.param(
            {"target": {**TARGET, "labels": {"sub.projector.nebari.dev/x": "1"}}},
            "reserved",
            id="reserved-subdomain-label",
        ),
        pytest.param(
            {"target": {**TARGET, "name": "Hub"}}, "DNS-1123 subdomain", id="target-name-upper"
        ),
        pytest.param(
            {"target": {**TARGET, "name": "hub_token"}},
            "DNS-1123 subdomain",
            id="target-name-underscore",
        ),
        pytest.param(
            {"target": {**TARGET, "name": "-hub"}}, "DNS-1123 subdomain", id="target-name-dash"
        ),
        pytest.param(
            {"target": {**TARGET, "name": "h" * 254}},
            "DNS-1123 subdomain",
            id="target-name-254-chars",
        ),
        pytest.param(
            {"source": {"namespace": "jupyterhub", "name": "Hub"}},
            "spec.source must name a valid namespace and Secret",
            id="default-target-name-from-bad-source-name",
        ),
        pytest.param({"target": {"namespaces": ["Team-A"]}}, "DNS-1123 label", id="ns-upper"),
        pytest.param({"target": {"namespaces": ["team.a"]}}, "DNS-1123 label", id="ns-dot"),
        pytest.param({"target": {"namespaces": ["n" * 64]}}, "DNS-1123 label", id="ns-64-chars"),
        pytest.param({"target": {"namespaces": ["a-"]}}, "DNS-1123 label", id="ns-trailing-dash"),
        pytest.param({"target": {"namespaces": ["team-*"]}}, "DNS-1123 label", id="ns-glob"),
        pytest.param({"policy": {"onRevoke": "delete"}}, "OnRevoke", id="policy-lowercase"),
        pytest.param({"policy": {"onRevoke": "Orphan"}}, "OnRevoke", id="policy-on-revoke"),
        pytest.param(
            {"policy": {"onSourceDeleted": "Keep"}}, "OnSourceDeleted", id="policy-on-source-del"
        ),
        pytest.param({"policy": {"onRevoke": None}}, "OnRevoke", id="policy-null"),
        # Inputs the parser once accepted or crashed on.
        pytest.param(
            {"target": {"namespaces": ["team-a\n"]}}, "DNS-1123 label", id="ns-trailing-newline"
        ),
        pytest.param(
            {"keys": [{"from": "token\n"}]}, "invalid Secret key", id="key-trailing-newline"
        ),
        pytest.param(
            {"keys": [{"from": "token", "to": "api-token\n"}]},
            "invalid Secret key",
            id="to-trailing-newline",
        ),
        pytest.param(
            {"target": {**TARGET, "name": "hub\n"}},
            "DNS-1123 subdomain",
            id="target-name-trailing-newline",
        ),
        pytest.param({"keys": [{"from": ".."}]}, "invalid Secret key", id="key-dot-dot"),
        pytest.param({"keys": [{"from": "."}]}, "invalid Secret key", id="key-dot"),
        pytest.param({"keys": [{"from": "a", "to": ".."}]}, "invalid Secret key", id="to-dot-dot"),
        pytest.param(
            {"keys": [{"from": "a.b"}, {"from": "."}]}, "invalid Secret key", id="second-key-dot"
        ),
        pytest.param(
            {"keys": [{"from": "token", "to": "..data"}]},
            "invalid Secret key",
            id="to-starts-with-dot-dot",
        ),
        pytest.param(
            {"target": {**TARGET, "name": "hub..contract"}},
            "DNS-1123 subdomain",
            id="target-name-empty-label",
        ),
        pytest.param(
            {"target": {**TARGET, "name": "hub.-contract"}},
            "DNS-1123 subdomain",
            id="target-name-label-leading-dash",
        ),
        pytest.param(
            {"target": {**TARGET, "name": "hub-.contract"}},
            "DNS-1123 subdomain",
            id="target-name-label-trailing-dash",
        ),
        pytest.param(
            {"target": {**TARGET, "name": "hub."}}, "DNS-1123 subdomain", id="target-name-dot-end"
        ),
        pytest.param(
            {
                "target": {
                    "namespaceSelector": {"matchExpressions": [{"key": "x", "operator": "Eq"}]}
                }
            },
            "operator",
            id="selector-unknown-operator",
        ),
        pytest.param(
            {
                "target": {
                    "namespaces": ["a"],
                    "namespaceSelector": {"matchExpressions": [{"key": "x", "operator": "in"}]},
                }
            },
            "operator",
            id="selector-operator-lowercase",
        ),
        pytest.param(
            {"target": {"namespaceSelector": {"matchExpressions": [{"key": "x"}]}}},
            "operator",
            id="selector-operator-missing",
        ),
        pytest.param(
            {"target": {"namespaceSelector": {}}}, "at least one matchLabels", id="empty-selector"
        ),
        pytest.param(
            {
                "target": {
                    **TARGET,
                    "namespaceSelector": {"matchLabels": {}, "matchExpressions": []},
                }
            },
            "at least one matchLabels",
            id="empty-selector-lists-beside-namespaces",
        ),
        pytest.param(
            {"target": {"namespaceSelector": {"matchLabels": {"team": "a b"}}}},
            "matchLabels entry 'team'",
            id="selector-label-value-space",
        ),
        pytest.param(
            {"target": {"namespaceSelector": {"matchLabels": {"my team": "a"}}}},
            "matchLabels entry 'my team'",
            id="selector-label-key-space",
        ),
        pytest.param(
            {
                "target": {
                    "namespaceSelector": {"matchExpressions": [{"key": "x", "operator": "In"}]}
                }
            },
            "non-empty for In",
            id="selector-in-without-values",
        ),
        pytest.param(
            {
                "target": {
                    "namespaceSelector": {
                        "matchExpressions": [{"key": "x", "operator": "Exists", "values": ["y"]}]
                    }
                }
            },
            "empty for Exists",
            id="selector-exists-with-values",
        ),
        pytest.param(
            {
                "target": {
                    "namespaceSelector": {
                        "matchExpressions": [{"key": "a/b/c", "operator": "Exists"}]
                    }
                }
            },
            "expression on 'a/b/c'",
            id="selector-key-two-slashes",
        ),
        pytest.param(
            {"target": {**TARGET, "labels": {"team": "a b"}}},
            "target label 'team' has an invalid value",
            id="label-value-space",
        ),
        pytest.param(
            {"target": {**TARGET, "labels": {"team": "x" * 64}}},
            "invalid value",
            id="label-value-64-chars",
        ),
        pytest.param(
            {"target": {**TARGET, "labels": {"Example.com/team": "a"}}},
            "not a qualified name",
            id="label-key-upper-prefix",
        ),
        pytest.param(
            {"target": {**TARGET, "annotations": {"a note": "free text is fine"}}},
            "not a qualified name",
            id="annotation-key-space",
        ),
        pytest.param(
            {"target": {**TARGET, "annotations": {f"{'p' * 254}/x": "v"}}},
            "not a qualified name",
            id="annotation-key-prefix-254",
        ),
        pytest.param({"keys": [{"to": "x"}]}, "`from`", id="key-without-from"),
        pytest.param({"keys": [{"from": "", "to": "x"}]}, "`from`", id="key-empty-from"),
        pytest.param({"keys": ["token"]}, "`from`", id="key-not-a-mapping"),
        pytest.param({"keys": "token"}, "at least one key", id="keys-not-a-list"),
        pytest.param(
            {"keys": []}, "keys, when given, must list at least one key", id="empty-keys-list"
        ),
        pytest.param({"target": {"namespaces": "dask"}}, "namespaces", id="namespaces-not-a-list"),
        pytest.param(
            {"target": {"namespaces": ["a", 1]}}, "list of strings", id="namespaces-not-strings"
        ),
        pytest.param(
            {"source": {"namespace": "jupyterhub", "name": "hub\n"}},
            "spec.source",
            id="source-name-trailing-newline",
        ),
        pytest.param(
            {"source": {"namespace": "jupyterhub", "name": "hub..x"}, "target": TARGET},
            "spec.source",
            id="source-name-empty-label",
        ),
        pytest.param(
            {
                "source": {"namespace": "jupyterhub", "name": "Hub"},
                "target": {**TARGET, "name": "hub"},
            },
            "spec.source",
            id="bad-source-name-with-valid-target-name",
        ),
        pytest.param(
            {"source": {"namespace": "Jupyterhub", "name": "hub"}},
            "spec.source",
            id="source-ns-upper",
        ),
        pytest.param(
            {"source": {"namespace": "jupyterhub\n", "name": "hub"}},
            "spec.source",
            id="source-ns-trailing-newline",
        ),
        pytest.param(
            {"source": {"namespace": "jupyter.hub", "name": "hub"}},
            "spec.source",
            id="source-ns-dot",
        ),
    ],
)
def test_parse_grant_rejects(spec: dict[str, Any], why: str) -> None:
    with pytest.raises(InvalidGrant) as info:
        parse_grant(grant_obj(**spec))
    assert info.value.grant == "hub-to-dask"
    assert why in info.value.why
    assert str(info.value).startswith("grant hub-to-dask: ")


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"keys": [{"from": "tls.crt"}, {"from": "a_B-9"}]}, id="key-charset"),
        pytest.param({"keys": [{"from": "k" * 253}]}, id="key-253-chars"),
        pytest.param({"target": {"namespaces": ["n" * 63]}}, id="ns-63-chars"),
        pytest.param({"target": {"namespaces": ["0a"]}}, id="ns-leading-digit"),
        pytest.param({"target": {**TARGET, "name": "hub.contract-1"}}, id="name-with-dot"),
        pytest.param({"target": {**TARGET, "labels": {"example.com/projector": "x"}}}, id="label"),
        pytest.param({"target": {**TARGET, "labels": {"nebari.dev/pack": "x"}}}, id="parent-dom"),
        pytest.param({"target": {**TARGET, "labels": {"a": "", "b": "x" * 63}}}, id="label-values"),
        pytest.param(
            {"target": {**TARGET, "annotations": {"note": "a b, anything: goes"}}}, id="note-value"
        ),
        pytest.param(
            {"target": {**TARGET, "annotations": {f"{'p' * 253}/{'n' * 63}": "v"}}},
            id="annotation-key-longest",
        ),
        pytest.param(
            {
                "target": {
                    "namespaceSelector": {
                        "matchExpressions": [{"key": "x", "operator": "Exists", "values": []}]
                    }
                }
            },
            id="exists-with-an-empty-values-list",
        ),
        pytest.param({"keys": None}, id="keys-null-means-every-key"),
        pytest.param({"keys": [{"from": ".a"}, {"from": "a..b", "to": "b."}]}, id="dotted-keys"),
        pytest.param({"target": {**TARGET, "name": "a.b.c"}}, id="name-three-labels"),
        pytest.param({"target": {**TARGET, "name": f"{'a' * 63}.{'b' * 63}"}}, id="name-63-labels"),
        pytest.param({"target": {**TARGET, "name": "h" * 253}}, id="name-253"),
        pytest.param(
            {"source": {"namespace": "jupyterhub", "name": "hub-" + "x" * 96}},
            id="source-name-100-chars",
        ),
        pytest.param({"source": {"namespace": "n" * 63, "name": "hub"}}, id="source-ns-63-chars"),
        pytest.param(
            {
                "target": {
                    "namespaceSelector": {
                        "matchExpressions": [
                            {"key": "a", "operator": "In", "values": ["x"]},
                            {"key": "b", "operator": "NotIn", "values": ["y"]},
                            {"key": "c", "operator": "Exists"},
                            {"key": "d", "operator": "DoesNotExist"},
                        ]
                    }
                }
            },
            id="every-selector-operator",
        ),
    ],
)
def test_parse_grant_accepts(spec: dict[str, Any]) -> None:
    parse_grant(grant_obj(**spec))


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"keys": [{"to": "x"}]}, id="key-without-from"),
        pytest.param({"keys": []}, id="empty-keys-list"),
        pytest.param({"target": {"namespaces": "dask"}}, id="namespaces-not-a-list"),
        pytest.param(
            {"target": {"namespaceSelector": {"matchExpressions": [{"key": "x"}]}}},
            id="selector-operator-missing",
        ),
        pytest.param({"source": {"namespace": "jupyterhub", "name": "Hub"}}, id="bad-source"),
    ],
)
def test_parse_grant_record_records_an_invalid_spec(spec: dict[str, Any]) -> None:
    """A malformed grant is cached as invalid (to be reported), never raised past the edge."""
    rec = parse_grant_record(grant_obj(**spec))
    assert rec.grant is None
    assert rec.invalid
    assert (rec.name, rec.uid, rec.generation) == ("hub-to-dask", "u-1", 3)


def test_parse_grant_record_of_a_valid_spec() -> None:
    obj = grant_obj()
    obj["status"] = {"observedGeneration": 2}
    rec = parse_grant_record(obj)
    assert rec.grant == parse_grant(obj)
    assert rec.invalid is None
    assert rec.status == {"observedGeneration": 2}


# -- export-to ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "patterns"),
    [
        pytest.param(None, (), id="missing"),
        pytest.param("", (), id="empty"),
        pytest.param("  ", (), id="blank"),
        pytest.param(" , ,", (), id="only-commas"),
        pytest.param("dask-gateway", ("dask-gateway",), id="one"),
        pytest.param("dask-gateway, team-*", ("dask-gateway", "team-*"), id="spaces-trimmed"),
        pytest.param("a,,b,", ("a", "b"), id="empty-parts-dropped"),
        pytest.param("*", ("*",), id="star"),
    ],
)
def test_parse_export_to(value: str | None, patterns: tuple[str, ...]) -> None:
    assert parse_export_to(value) == patterns


@pytest.mark.parametrize(
    ("export_to", "namespace", "allowed"),
    [
        pytest.param("", "dask", False, id="empty-means-nobody"),
        pytest.param("dask", "dask", True, id="exact"),
        pytest.param("dask", "dask-gateway", False, id="exact-is-not-prefix"),
        pytest.param("*", "anything", True, id="star"),
        pytest.param("team-*", "team-a", True, id="glob"),
        pytest.param("team-*", "team-", True, id="glob-empty-suffix"),
        pytest.param("team-*", "team", False, id="glob-needs-dash"),
        pytest.param("team-*", "my-team-a", False, id="glob-anchored"),
        pytest.param("Team-*", "team-a", False, id="case-sensitive"),
        pytest.param("team-?", "team-a", True, id="question-mark"),
        pytest.param("team-?", "team-ab", False, id="question-mark-one-char"),
        pytest.param("dask,team-*", "team-b", True, id="second-pattern"),
        pytest.param("dask,team-*", "prod", False, id="no-pattern-matches"),
    ],
)
def test_source_exports_to(export_to: str, namespace: str, allowed: bool) -> None:
    assert make_source(export_to=export_to).exports_to(namespace) is allowed


@given(
    st.lists(st.from_regex(r"[a-z0-9*?][-a-z0-9*?]{0,8}", fullmatch=True), max_size=6),
    st.from_regex(r"[a-z0-9][-a-z0-9]{0,10}", fullmatch=True),
)
def test_one_expression_matches_as_fnmatch_does_pattern_by_pattern(
    patterns: list[str], namespace: str
) -> None:
    expected = any(fnmatch.fnmatchcase(namespace, p) for p in patterns)
    assert make_source(export_to=",".join(patterns)).exports_to(namespace) is expected


def source_with_export_to(value: str, **meta: Any) -> Source:
    obj = {
        "metadata": {
            "namespace": "p",
            "name": "s",
            "labels": {EXPORT_LABEL: EXPORT_VALUE},
            "annotations": {EXPORT_TO_ANNOTATION: value},
            **meta,
        },
        "data": {"k": "dg=="},
    }
    return parse_source(obj)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param(",".join(f"team-{i}" for i in range(257)), "more than 256", id="entries"),
        pytest.param("a" * 16385, "longer than 16384", id="length"),
        pytest.param(",".join(["-bad"] * 20000), "longer than 16384", id="the-240-KiB-bomb"),
        pytest.param(",".join(f"t{i}-*" for i in range(33)), "more than 32 globs", id="globs"),
    ],
)
def test_an_export_to_past_its_cap_is_ignored_as_a_whole(value: str, why: str) -> None:
    s = source_with_export_to(value)
    assert why in s.export_to_refused
    assert (s.export_to, s.ignored_export_to) == ((), ())
    assert not s.exports_to("team-1")  # nobody, never a guess at the first 256


def test_an_export_to_at_its_cap_is_read() -> None:
    globs = [f"x{i}-*" for i in range(32)]
    s = source_with_export_to(",".join([*(f"team-{i}" for i in range(224)), *globs]))
    assert s.export_to_refused == ""
    assert s.exports_to("team-223") and s.exports_to("x31-a") and not s.exports_to("team-224")


@pytest.mark.parametrize(
    ("meta", "type_", "why"),
    [
        pytest.param({}, "kubernetes.io/service-account-token", "credential", id="sa-token"),
        pytest.param({}, "bootstrap.kubernetes.io/token", "credential", id="bootstrap"),
        pytest.param(
            {"labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}}, "Opaque", "copy", id="managed"
        ),
        pytest.param({"annotations": {GRANT_UID_ANNOTATION: "u"}}, "Opaque", "copy", id="owned"),
        pytest.param({}, "kubernetes.io/tls", "", id="tls-is-fine"),
    ],
)
def test_sources_that_may_never_be_projected(meta: dict[str, Any], type_: str, why: str) -> None:
    obj = {"metadata": {"namespace": "p", "name": "s", **meta}, "type": type_}
    refused = parse_source(obj).refused
    assert (why in refused) if why else refused == ""


# -- selectors and targeting ---------------------------------------------------------------------

ENV = "env"


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        pytest.param(LabelSelector(), {}, True, id="empty-matches-all"),
        pytest.param(LabelSelector((("a", "1"),)), {"a": "1", "b": "2"}, True, id="labels"),
        pytest.param(LabelSelector((("a", "1"),)), {"a": "2"}, False, id="labels-value"),
        pytest.param(LabelSelector((("a", "1"),)), {}, False, id="labels-absent"),
        pytest.param(
            LabelSelector((("a", "1"), ("b", "2"))), {"a": "1"}, False, id="labels-all-needed"
        ),
        pytest.param(
            LabelSelector((), ((ENV, "In", ("dev", "prod")),)), {ENV: "dev"}, True, id="in"
        ),
        pytest.param(
            LabelSelector((), ((ENV, "In", ("dev", "prod")),)), {ENV: "qa"}, False, id="in-other"
        ),
        pytest.param(LabelSelector((), ((ENV, "In", ("dev",)),)), {}, False, id="in-absent"),
        pytest.param(LabelSelector((), ((ENV, "NotIn", ("dev",)),)), {ENV: "qa"}, True, id="notin"),
        pytest.param(
            LabelSelector((), ((ENV, "NotIn", ("dev",)),)), {ENV: "dev"}, False, id="notin-value"
        ),
        pytest.param(LabelSelector((), ((ENV, "NotIn", ("dev",)),)), {}, True, id="notin-absent"),
        pytest.param(LabelSelector((), ((ENV, "Exists", ()),)), {ENV: ""}, True, id="exists"),
        pytest.param(LabelSelector((), ((ENV, "Exists", ()),)), {}, False, id="exists-absent"),
        pytest.param(LabelSelector((), ((ENV, "DoesNotExist", ()),)), {}, True, id="dne"),
        pytest.param(
            LabelSelector((), ((ENV, "DoesNotExist", ()),)), {ENV: "x"}, False, id="dne-present"
        ),
        pytest.param(
            LabelSelector((("a", "1"),), ((ENV, "In", ("dev",)),)),
            {"a": "1", ENV: "prod"},
            False,
            id="labels-and-expressions",
        ),
    ],
)
def test_label_selector_matches(
    selector: LabelSelector, labels: dict[str, str], matches: bool
) -> None:
    assert selector.matches(labels) is matches


@pytest.mark.parametrize(
    ("namespaces", "selector", "namespace", "labels", "targeted"),
    [
        pytest.param(("a",), None, "a", {}, True, id="listed"),
        pytest.param(("a",), None, "b", {"pack": "x"}, False, id="not-listed"),
        pytest.param((), {"pack": "x"}, "b", {"pack": "x"}, True, id="selected"),
        pytest.param((), {"pack": "x"}, "b", {"pack": "y"}, False, id="not-selected"),
        pytest.param(("a",), {"pack": "x"}, "a", {}, True, id="listed-or-selected"),
    ],
)
def test_grant_targets(
    namespaces: tuple[str, ...],
    selector: dict[str, str] | None,
    namespace: str,
    labels: dict[str, str],
    targeted: bool,
) -> None:
    g = make_grant(namespaces=namespaces, selector=selector)
    assert g.targets(namespace, labels) is targeted


def test_grant_seniority_orders_by_creation_then_name() -> None:
    old_z = make_grant("z", created="2024-01-01T00:00:00Z")
    new_a = make_grant("a", created="2024-02-01T00:00:00Z")
    same_time_a = make_grant("a", created="2024-01-01T00:00:00Z")
    assert sorted([new_a, old_z, same_time_a], key=lambda g: g.seniority) == [
        same_time_a,
        old_z,
        new_a,
    ]


def test_object_key_str_and_order() -> None:
    assert str(ObjectKey("ns", "name")) == "ns/name"
    assert sorted([ObjectKey("b", "a"), ObjectKey("a", "z")]) == [
        ObjectKey("a", "z"),
        ObjectKey("b", "a"),
    ]


# -- sources and namespaces -----------------------------------------------------------------------


def test_parse_source() -> None:
    obj = stored_secret("jupyterhub", "hub", type_="kubernetes.io/tls", data={"tls.crt": "Y3J0"})
    obj["metadata"]["annotations"] = {"projector.nebari.dev/export-to": "dask, team-*"}
    s = parse_source(obj)
    assert s.key == ObjectKey("jupyterhub", "hub")
    assert s.type == "kubernetes.io/tls"
    assert s.data == {"tls.crt": "Y3J0"}
    assert s.export_to == ("dask", "team-*")


def test_parse_source_defaults() -> None:
    s = parse_source({"metadata": {"namespace": "n", "name": "s"}})
    assert s.type == "Opaque"
    assert s.data == {}
    assert s.export_to == ()  # default deny
    assert s.export_keys is None  # no export-keys: every key may leave


@pytest.mark.parametrize(
    ("value", "keys", "refused"),
    [
        pytest.param(None, None, False, id="absent-every-key"),
        pytest.param(" token , url,,", frozenset({"token", "url"}), False, id="listed"),
        pytest.param("", frozenset(), False, id="blank-no-key"),
        pytest.param("a," * 300, frozenset(), True, id="past-the-entries-cap-no-key"),
        pytest.param("k" * 20000, frozenset(), True, id="past-the-length-cap-no-key"),
    ],
)
def test_export_keys_fail_closed(
    value: str | None, keys: frozenset[str] | None, refused: bool
) -> None:
    """The producer's key scope: absent lets every key leave; anything it cannot honour lets
    none leave (a hostile or broken value never widens what leaves)."""
    notes = {} if value is None else {EXPORT_KEYS_ANNOTATION: value}
    s = parse_source({"metadata": {"namespace": "n", "name": "s", "annotations": notes}})
    assert s.export_keys == keys
    assert bool(s.export_keys_refused) is refused


@pytest.mark.parametrize(
    ("obj", "terminating"),
    [
        pytest.param({"metadata": {"name": "a"}}, False, id="active"),
        pytest.param({"metadata": {"name": "a"}, "status": {"phase": "Active"}}, False, id="phase"),
        pytest.param(
            {"metadata": {"name": "a"}, "status": {"phase": "Terminating"}}, True, id="terminating"
        ),
        pytest.param(
            {"metadata": {"name": "a", "deletionTimestamp": "2024-01-01T00:00:00Z"}},
            True,
            id="deletion-timestamp",
        ),
    ],
)
def test_parse_namespace(obj: dict[str, Any], terminating: bool) -> None:
    assert parse_namespace(obj).terminating is terminating


def test_parse_namespace_labels() -> None:
    ns = parse_namespace({"metadata": {"name": "a", "labels": {"pack": "x"}}})
    assert ns.name == "a"
    assert ns.labels == {"pack": "x"}


# -- content hash and copies ----------------------------------------------------------------------

BASE: dict[str, Any] = {
    "type_": "Opaque",
    "data": {"a": b64("1"), "b": b64("2")},
    "labels": {"l": "1"},
    "annotations": {"x": "1"},
}


def test_content_hash_format_and_determinism() -> None:
    h = content_hash(**BASE)
    assert h.startswith("sha256:")
    assert len(h) == len("sha256:") + 64
    assert content_hash(**BASE) == h


@given(
    st.dictionaries(st.text(), st.text(), max_size=3),
    st.dictionaries(st.text(), st.text(), max_size=3),
)
def test_content_hash_hashes_the_bytes_it_always_hashed(
    labels: dict[str, str], annotations: dict[str, str]
) -> None:
    """The hash stored on every copy is of json.dumps's bytes: a faster encoder must give the
    same hash for any text (non-ASCII and DEL included), or an upgrade rewrites every copy."""
    parts = [
        "Opaque",
        sorted(BASE["data"].items()),
        sorted(labels.items()),
        sorted((k, v) for k, v in annotations.items() if k != HASH_ANNOTATION),
    ]
    blob = json.dumps(parts, separators=(",", ":")).encode()
    want = "sha256:" + hashlib.sha256(blob).hexdigest()
    assert content_hash("Opaque", BASE["data"], labels, annotations) == want


def test_content_hash_of_a_known_copy_is_pinned() -> None:
    assert content_hash("Opaque", {"k": b64("v")}, {"é": "\x7f"}, {}) == (
        "sha256:"
        + hashlib.sha256(b'["Opaque",[["k","dg=="]],[["\\u00e9","\\u007f"]],[]]').hexdigest()
    )


def test_content_hash_ignores_order_and_its_own_annotation() -> None:
    h = content_hash(**BASE)
    reordered = content_hash(
        "Opaque",
        {"b": b64("2"), "a": b64("1")},
        {"l": "1"},
        {HASH_ANNOTATION: "sha256:x", "x": "1"},
    )
    assert reordered == h


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"type_": "kubernetes.io/tls"}, id="type"),
        pytest.param({"data": {"a": b64("1"), "b": b64("3")}}, id="value"),
        pytest.param({"data": {"a": b64("1"), "c": b64("2")}}, id="key-renamed"),
        pytest.param({"data": {"a": b64("1")}}, id="key-dropped"),
        pytest.param({"labels": {"l": "2"}}, id="label"),
        pytest.param({"labels": {}}, id="label-removed"),
        pytest.param({"annotations": {"x": "2"}}, id="annotation"),
    ],
)
def test_content_hash_changes_with_content(change: dict[str, Any]) -> None:
    assert content_hash(**{**BASE, **change}) != content_hash(**BASE)


def test_content_hash_does_not_confuse_labels_and_annotations() -> None:
    assert content_hash("Opaque", {}, {"k": "v"}, {}) != content_hash("Opaque", {}, {}, {"k": "v"})


def secret_with(data: dict[str, str], **kw: Any) -> dict[str, Any]:
    """A copy of grant `g` (uid u-1) that projector stored; `kw` overrides stored_secret's
    arguments (by default projector's field manager owns every annotation)."""
    kw.setdefault("labels", {"projector.nebari.dev/grant": "g"})
    kw.setdefault("annotations", {GRANT_UID_ANNOTATION: "u-1", HASH_ANNOTATION: "sha256:stored"})
    kw.setdefault("managers", {FIELD_MANAGER: list(kw["annotations"])})
    return stored_secret("dask", "hub", data=data, **kw)


def test_parse_copy_keeps_metadata_and_drops_data() -> None:
    secret = "s3cr3t-value"
    c = parse_copy(secret_with({"token": b64(secret)}, resource_version="42", uid="u-copy"))
    assert c.key == ObjectKey("dask", "hub")
    assert c.uid == "u-copy"
    assert c.resource_version == "42"
    assert c.type == "Opaque"
    assert c.grant_uid == "u-1"
    assert c.annotations[HASH_ANNOTATION] == "sha256:stored"
    assert not c.deleting
    # the cache of copies holds no Secret value, in any field
    assert "data" not in {f.name for f in dataclasses.fields(Copy)}
    assert b64(secret) not in repr(c)
    assert secret not in repr(c)


def test_parse_copy_observed_hash_is_the_content_of_what_is_stored() -> None:
    obj = secret_with({"token": b64("t0")})
    obj["metadata"]["labels"]["team"] = "data"
    obj["metadata"]["annotations"]["note"] = "x"
    c = parse_copy(obj)
    assert c.observed_hash == content_hash(
        "Opaque",
        {"token": b64("t0")},
        own_metadata(obj["metadata"]["labels"]),
        own_metadata(obj["metadata"]["annotations"]),
    )
    assert own_metadata(obj["metadata"]["labels"]) == {"projector.nebari.dev/grant": "g"}
    # the stored hash annotation is not what observed_hash reports
    assert c.observed_hash != "sha256:stored"
    # metadata is kept whole, only the hash is limited to projector's own keys
    assert c.labels == obj["metadata"]["labels"]
    assert c.annotations == obj["metadata"]["annotations"]


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param({"data": {"token": b64("edited")}}, id="data-edited"),
        pytest.param({"data": {}}, id="data-emptied"),
        pytest.param({"data": {"token": b64("t0"), "extra": b64("x")}}, id="key-added"),
        pytest.param({"type_": "kubernetes.io/basic-auth"}, id="type"),
        pytest.param({"labels": {"projector.nebari.dev/grant": "other"}}, id="our-label-changed"),
        pytest.param({"labels": {}}, id="our-label-removed"),
        pytest.param({"labels": {"projector.nebari.dev/grant": "g", PREFIX + "x": ""}}, id="ours+"),
        pytest.param({"annotations": {GRANT_UID_ANNOTATION: "u-2"}}, id="our-annotation-changed"),
        pytest.param({"annotations": {}}, id="our-annotation-removed"),
    ],
)
def test_parse_copy_sees_edits_of_what_is_stored(edit: dict[str, Any]) -> None:
    base = parse_copy(secret_with({"token": b64("t0")}))
    kw: dict[str, Any] = {k: v for k, v in edit.items() if k != "data"}
    edited = parse_copy(secret_with(edit.get("data", {"token": b64("t0")}), **kw))
    assert edited.observed_hash != base.observed_hash


@pytest.mark.parametrize(
    ("labels", "annotations"),
    [
        pytest.param({"team": "data"}, {}, id="label-added"),
        pytest.param({}, {"kubectl.kubernetes.io/last-applied-configuration": "{}"}, id="note"),
        pytest.param({"app": "x"}, {"webhook.example.com/injected": "true"}, id="both"),
        pytest.param({"projector.nebari.dev": "x"}, {"sub.projector.nebari.dev/x": "y"}, id="near"),
    ],
)
def test_parse_copy_observed_hash_ignores_metadata_others_add(
    labels: dict[str, str], annotations: dict[str, str]
) -> None:
    """Labels and annotations outside projector's prefix are not ours to police: no drift."""
    base = secret_with({"token": b64("t0")})
    obj = copy.deepcopy(base)
    obj["metadata"]["labels"].update(labels)
    obj["metadata"]["annotations"].update(annotations)
    assert parse_copy(obj).observed_hash == parse_copy(base).observed_hash


def test_own_metadata_is_the_reserved_prefix_only() -> None:
    meta = {
        "projector.nebari.dev/grant": "g",
        GRANT_UID_ANNOTATION: "u",
        HASH_ANNOTATION: "sha256:x",
        "projector.nebari.dev": "no-slash",
        "sub.projector.nebari.dev/x": "subdomain",
        "app": "x",
    }
    assert own_metadata(meta) == {
        "projector.nebari.dev/grant": "g",
        GRANT_UID_ANNOTATION: "u",
        HASH_ANNOTATION: "sha256:x",
    }
    assert own_metadata({}) == {}


@pytest.mark.parametrize(
    ("stored", "immutable"),
    [
        pytest.param({}, False, id="absent"),
        pytest.param({"immutable": False}, False, id="false"),
        pytest.param({"immutable": None}, False, id="null"),
        pytest.param({"immutable": True}, True, id="true"),
    ],
)
def test_parse_copy_immutable(stored: dict[str, Any], immutable: bool) -> None:
    obj = {**secret_with({"token": b64("t0")}), **stored}
    c = parse_copy(obj)
    assert c.immutable is immutable
    assert c.observed_hash == content_hash(  # the content, whether or not it was frozen
        "Opaque",
        {"token": b64("t0")},
        own_metadata(obj["metadata"]["labels"]),
        own_metadata(obj["metadata"]["annotations"]),
    )


UID_MARK = f"f:{GRANT_UID_ANNOTATION}"


def entry(manager: str, annotations: dict[str, Any] | None) -> dict[str, Any]:
    """A managedFields entry whose fieldsV1 holds these `f:annotations` (None: no metadata)."""
    fields: dict[str, Any] = {"f:data": {}}
    if annotations is not None:
        fields["f:metadata"] = {"f:annotations": annotations}
    return {"manager": manager, "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": fields}


@pytest.mark.parametrize(
    ("managed", "owner"),
    [
        pytest.param([entry(FIELD_MANAGER, {".": {}, UID_MARK: {}})], "u-1", id="projector-wrote"),
        pytest.param(
            [entry(BY_HAND, {"f:x": {}}), entry(FIELD_MANAGER, {UID_MARK: {}})],
            "u-1",
            id="projector-among-others",
        ),
        pytest.param(
            [entry(BY_HAND, {UID_MARK: {}}), entry(FIELD_MANAGER, {UID_MARK: {}})],
            "u-1",
            id="shared-with-another-manager",
        ),
        pytest.param(None, None, id="no-managed-fields"),
        pytest.param([], None, id="empty-managed-fields"),
        pytest.param([entry(BY_HAND, {UID_MARK: {}})], None, id="copied-by-hand"),
        pytest.param(
            [entry(FIELD_MANAGER, {"f:projector.nebari.dev/source": {}}), entry(BY_HAND, {})],
            None,
            id="projector-wrote-other-annotations-only",
        ),
        pytest.param([entry(FIELD_MANAGER, None)], None, id="projector-wrote-no-metadata"),
        pytest.param([entry(FIELD_MANAGER, {})], None, id="projector-wrote-no-annotation"),
        pytest.param([entry("projector-tests", {UID_MARK: {}})], None, id="other-manager-name"),
        pytest.param(
            [{"manager": FIELD_MANAGER, "operation": "Update"}], None, id="entry-without-fields"
        ),
    ],
)
def test_parse_copy_owner_needs_projector_to_have_written_the_mark(
    managed: list[dict[str, Any]] | None, owner: str | None
) -> None:
    """The grant-uid annotation counts only if managedFields say projector wrote it."""
    obj = secret_with({"token": b64("t0")}, managers=None)
    if managed is not None:
        obj["metadata"]["managedFields"] = managed
    c = parse_copy(obj)
    assert c.grant_uid == owner
    assert c.marked_by_projector is (owner is not None)
    assert c.annotations[GRANT_UID_ANNOTATION] == "u-1"  # the annotation itself is kept as is
    assert marked_by_projector(obj["metadata"]) is (owner is not None)


def test_parse_copy_ownership_proof_does_not_change_the_hash() -> None:
    marked = parse_copy(secret_with({"token": b64("t0")}))
    unmarked = parse_copy(secret_with({"token": b64("t0")}, managers=None))
    assert marked.observed_hash == unmarked.observed_hash


def test_parse_copy_defaults() -> None:
    c = parse_copy({"metadata": {"namespace": "n", "name": "s"}})
    assert c.type == "Opaque"
    assert c.grant_uid is None
    assert c.labels == {}
    assert c.observed_hash == content_hash("Opaque", {}, {}, {})
    assert c.deleting is False
    assert c.immutable is False
    assert c.marked_by_projector is False


def test_parse_copy_deleting() -> None:
    assert parse_copy(secret_with({}, deleting=True)).deleting is True


@pytest.mark.parametrize(
    ("value", "ignored"),
    [
        pytest.param("dask-gateway,team-*,*,ns-[ab]?", (), id="names-and-globs"),
        pytest.param("-foo,!bar,Team,a b,ok", ("-foo", "!bar", "Team", "a b"), id="refused"),
    ],
)
def test_export_to_entries_that_match_no_namespace_are_named(
    value: str, ignored: tuple[str, ...]
) -> None:
    assert invalid_export_to(parse_export_to(value)) == ignored


def test_an_ignored_export_to_entry_is_never_matched() -> None:
    """fnmatch would read `[!a]*` as "not starting with a": an entry reported as matching
    nothing must really match nothing."""
    obj = {
        "metadata": {
            "namespace": "src",
            "name": "hub",
            "labels": {EXPORT_LABEL: EXPORT_VALUE},
            "annotations": {EXPORT_TO_ANNOTATION: "[!a]*, -b*,dask"},
        }
    }
    source = parse_source(obj)
    assert source.ignored_export_to == ("[!a]*", "-b*")
    assert source.export_to == ("dask",)
    assert [n for n in ("b", "team-x", "dask", "a") if source.exports_to(n)] == ["dask"]


def test_copies_with_equal_metadata_share_one_object_and_equal_strings() -> None:
    """10,000 copies of 1,000 grants keep 1,000 label and annotation maps, not 10,000."""
    from projector.core.model import parse_copy

    def raw(ns: str, uid: str) -> dict[str, object]:
        return {
            "metadata": {
                "namespace": "".join(ns),  # a fresh string, as a decoded response has
                "name": "".join(["co", "py"]),
                "uid": uid,
                "resourceVersion": "1",
                "labels": {"projector.nebari.dev/grant": "g"},
                "annotations": {"projector.nebari.dev/grant-uid": "".join(["u", "1"])},
            },
            "data": {"k": "dg=="},
        }

    a, b = parse_copy(raw("ns-a", "1")), parse_copy(raw("ns-b", "2"))
    assert a.labels is b.labels and a.annotations is b.annotations
    assert a.labels == {"projector.nebari.dev/grant": "g"}
    assert a.key.name is b.key.name and a.observed_hash is b.observed_hash
    c = parse_copy({**raw("ns-c", "3"), "data": {"k": "dw=="}})
    assert c.observed_hash != a.observed_hash and c.annotations is a.annotations
    other = parse_copy(
        {**raw("ns-a", "4"), "metadata": {**raw("ns-a", "4")["metadata"], "labels": {}}}  # type: ignore[dict-item]
    )
    assert other.labels == {} and other.labels is not a.labels


def test_a_grant_records_status_is_kept_equal_with_its_strings_interned() -> None:
    from projector.core.model import interned

    status = {"conditions": [{"type": "".join(["Re", "ady"]), "observedGeneration": 2}], "x": []}
    out = interned(status)
    assert out == status and out["conditions"][0]["type"] is "Ready"  # noqa: F632

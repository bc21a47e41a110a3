"""The consent rule (`reconcile.consent`) against an independent model of DESIGN §2.

The model below is written from the design's words, not from the code: a copy may exist in a
namespace only if the admin's grant lists or selects it, the producer's Secret carries
`projector.nebari.dev/export: "true"` (no other spelling), one entry of its `export-to`
annotation (comma-separated namespace names or shell globs, `*` for any; missing or empty means
nobody; an entry that is neither a name nor a glob matches nothing) matches it, and it is not
the source's own namespace. Hypothesis draws worlds of grants, labels, annotations and
namespaces (the source's own among them); the product must agree with the model in every one,
and the worlds are checked not to be vacuous: both verdicts and every reason are drawn often.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from projector.core.grantspec import parse_grant
from projector.core.model import (
    is_exported,
    parse_source,
)
from projector.core.ownership import Consent, consent

EXPORT_LABEL = "projector.nebari.dev/export"
EXPORT_TO = "projector.nebari.dev/export-to"

# A small universe, so that coincidences (a glob matching, the source's namespace listed) are
# frequent; `src` is where the source lives in most worlds.
NAMES = ("src", "a", "b", "ab", "a-b", "team-a", "team-b", "team-ab", "kube-system", "a1")
LABEL_KEYS = ("pack", "team")
LABEL_VALUES = ("x", "y")


# --- the independent model ------------------------------------------------------------------------


def _glob(entry: str) -> re.Pattern[str] | None:
    """A shell glob over namespace names as a regex; None if the entry is not a name or glob."""
    if (
        not entry
        or entry[0] == "-"
        or any(c not in "abcdefghijklmnopqrstuvwxyz0123456789-*?[]" for c in entry)
    ):
        return None
    out, i = "", 0
    while i < len(entry):
        c = entry[i]
        close = entry.find("]", i + 1)
        if c == "*":
            out += ".*"
        elif c == "?":
            out += "."
        elif c == "[" and close > i + 1:
            out += "[" + entry[i + 1 : close] + "]"
            i = close
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out)


def producer_allows(annotation: str | None, namespace: str) -> bool:
    """export-to: missing or empty is nobody; else any valid entry matching."""
    if annotation is None:
        return False
    entries = [e.strip() for e in annotation.split(",")]
    globs = [g for e in entries if e and (g := _glob(e)) is not None]
    return any(g.fullmatch(namespace) for g in globs)


def selected(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: every matchLabels pair and every expression holds."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or ():
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def missing_consents(w: World) -> set[Consent]:
    """Every consent that is missing for a copy in `w.namespace` (empty: a copy may exist)."""
    missing = set()
    if w.namespace == w.source_namespace:
        missing.add(Consent.SOURCE_NAMESPACE)
    target = w.grant["spec"]["target"]
    admin = w.namespace in (target.get("namespaces") or ()) or (
        "namespaceSelector" in target and selected(target["namespaceSelector"], w.labels)
    )
    if not admin:
        missing.add(Consent.NOT_TARGETED)
    if w.export_label != "true":
        missing.add(Consent.NOT_EXPORTED)
    elif not producer_allows(w.export_to, w.namespace):
        missing.add(Consent.EXPORT_TO_MISMATCH)
    return missing


# --- worlds ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    grant: dict[str, Any]
    source_namespace: str
    export_label: str | None
    export_to: str | None
    namespace: str
    labels: dict[str, str]


def _from_name(name: str) -> st.SearchStrategy[str]:
    """Globs derived from a name, so that they often match it or its neighbours."""
    return st.sampled_from(
        [
            name,
            name + "*",
            name[:1] + "*",
            "*" + name[-1:],
            name[:-1] + "?",
            "[" + name[:1] + "z]*",
            "team-*",
            "*",
        ]
    )


ENTRY = st.one_of(
    st.sampled_from(NAMES).flatmap(_from_name),
    # neither a name nor a glob: reported, and they match nothing
    st.sampled_from(["[!a]*", "[!z]*", "-a", "!a", "a b", "A*", "Team-*", "*,", " * "]),
)
EXPORT_TO_VALUE = st.one_of(
    st.none(),
    st.just(""),
    st.lists(ENTRY, min_size=1, max_size=4).map(",".join),
    st.lists(ENTRY, min_size=1, max_size=3).map(" , ".join),
)
LABELS = st.fixed_dictionaries({}, optional={k: st.sampled_from(LABEL_VALUES) for k in LABEL_KEYS})
NON_EMPTY_LABELS = st.fixed_dictionaries(
    {}, optional={k: st.sampled_from(LABEL_VALUES) for k in LABEL_KEYS}
).filter(bool)
EXPRESSION = st.one_of(
    st.builds(
        lambda k, op, vs: {"key": k, "operator": op, "values": vs},
        st.sampled_from(LABEL_KEYS),
        st.sampled_from(["In", "NotIn"]),
        st.lists(st.sampled_from(LABEL_VALUES), min_size=1, max_size=2, unique=True),
    ),
    st.builds(
        lambda k, op: {"key": k, "operator": op},
        st.sampled_from(LABEL_KEYS),
        st.sampled_from(["Exists", "DoesNotExist"]),
    ),
)
SELECTOR = st.one_of(
    st.builds(lambda m: {"matchLabels": m}, NON_EMPTY_LABELS),
    st.builds(lambda e: {"matchExpressions": e}, st.lists(EXPRESSION, min_size=1, max_size=2)),
    st.builds(
        lambda m, e: {"matchLabels": m, "matchExpressions": e},
        NON_EMPTY_LABELS,
        st.lists(EXPRESSION, min_size=1, max_size=2),
    ),
)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    namespace = draw(st.sampled_from(NAMES[1:]))  # the source's own: drawn just below
    source_namespace = draw(st.sampled_from(("src",) * 7 + (namespace,)))
    listed = draw(st.lists(st.sampled_from(NAMES), max_size=3, unique=True))
    if draw(st.sampled_from([True, True, True, False])):
        listed = sorted({*listed, namespace})
    target: dict[str, Any] = {}
    selector = draw(st.none() | SELECTOR)
    if listed or selector is None:
        target["namespaces"] = listed or [draw(st.sampled_from(NAMES))]
    if selector is not None:
        target["namespaceSelector"] = selector
    grant = {
        "metadata": {"name": "g", "uid": "u"},
        "spec": {"source": {"namespace": source_namespace, "name": "hub"}, "target": target},
    }
    label = draw(st.sampled_from(["true"] * 10 + [None, "True", "false", "1", ""]))
    near = st.one_of(_from_name(namespace), _from_name(namespace), ENTRY)
    kind = draw(st.sampled_from(["near"] * 6 + ["missing", "empty", "any"]))
    export_to = {
        "near": lambda: draw(st.lists(near, min_size=1, max_size=4).map(",".join)),
        "missing": lambda: None,
        "empty": lambda: "",
        "any": lambda: draw(EXPORT_TO_VALUE),
    }[kind]()
    return World(
        grant=grant,
        source_namespace=source_namespace,
        export_label=label,
        export_to=export_to,
        namespace=namespace,
        labels=draw(LABELS),
    )


def product(w: World) -> Consent:
    """What projector decides, from the raw objects as the informers would see them."""
    labels = {} if w.export_label is None else {EXPORT_LABEL: w.export_label}
    secret = {
        "metadata": {
            "namespace": w.source_namespace,
            "name": "hub",
            "labels": labels,
            "annotations": {} if w.export_to is None else {EXPORT_TO: w.export_to},
        },
        "data": {},
    }
    source = parse_source(secret) if is_exported(labels) else None
    return consent(parse_grant(w.grant), source, w.namespace, w.labels)


# --- the property ---------------------------------------------------------------------------------


def test_consent_agrees_with_the_design_in_every_world() -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=600, deadline=None, derandomize=True, database=None)
    @given(worlds())
    def check(w: World) -> None:
        missing = missing_consents(w)
        verdict = product(w)
        if missing:
            assert verdict is not Consent.GRANTED, (w, missing)
            assert verdict in missing, (w, verdict, missing)  # a true reason, never a made-up one
        else:
            assert verdict is Consent.GRANTED, (w, verdict)
        event(verdict.value)
        seen[verdict.value] += 1
        seen["allowed" if not missing else "denied"] += 1
        if w.namespace == w.source_namespace and w.namespace in (
            w.grant["spec"]["target"].get("namespaces") or ()
        ):
            seen["source namespace listed"] += 1

    check()
    total = seen["allowed"] + seen["denied"]
    assert total >= 550
    # not vacuous: both verdicts are common, and every reason is drawn many times
    assert seen["allowed"] >= 0.25 * total, seen
    assert seen["denied"] >= 0.25 * total, seen
    for reason in Consent:
        assert seen[reason.value] >= 0.05 * total, (reason, seen)
    assert seen["source namespace listed"] >= 0.03 * total, seen


def test_the_model_itself_on_known_cases() -> None:
    """The model is only a reference if it reads the design right on the plain cases."""
    assert producer_allows("dask-gateway,team-*", "team-a")
    assert producer_allows("*", "anything")
    assert not producer_allows(None, "a") and not producer_allows("", "a")
    assert not producer_allows("[!a]*", "b")  # not a glob of names: matches nothing
    assert producer_allows("team-[ab]", "team-b") and not producer_allows("team-[ab]", "team-c")
    assert selected({"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["x"]}]}, {})

"""The pure core against the independent oracle (tests/model/oracle.py), on every small world.

Each world is built twice: as the oracle's values, and as the raw objects the informers would
cache (parsed by the product: `parse_grant`, `parse_source`, `parse_export`, `parse_namespace`,
`parse_copy`).
A small controller loop then plans every grant name (the live grants' and the names orphans
carry) and applies the plans' writes the way the writer would, until a round writes nothing.
Two things must hold in every world:

- every write takes its place to a state the oracle allows from where it was (`closure`), and
  never touches a foreign object (a squatter, a source);
- where the loop ends, every place is in a state the oracle says it may rest in (`settle`).

The worlds are exhaustive over their dimensions (families below): one grant with every admin
targeting of three namespaces, every producer state, key selection, policy, namespace mode and
initial state of its places; two grants competing for one place with every consent and
projection combination; a grant re-created under the same name over its predecessor's copies;
one grant whose producer consents by the label, by ProjectionExports or both, with every key
scope (export-keys, an export's keys, their union) against every key selection; two grants
competing for one place where the producer consents by an export.
"""

from __future__ import annotations

import base64
import functools
import itertools
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest

from projector.core.desired import desired_copy
from projector.core.exports import Export as ProductExport
from projector.core.exports import parse_export
from projector.core.grantspec import parse_grant
from projector.core.model import (
    GRANT_LABEL,
    GRANT_UID_ANNOTATION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ON_REVOKE_ANNOTATION,
    ON_SOURCE_DELETED_ANNOTATION,
    SOURCE_ANNOTATION,
    Copy,
    ObjectKey,
    is_exported,
    parse_copy,
    parse_namespace,
    parse_source,
)
from projector.core.model import Grant as ProductGrant
from projector.core.model import Namespace as ProductNamespace
from projector.core.model import Source as ProductSource
from projector.core.plans import Action, Snapshot, SourceState
from projector.core.reconcile import plan
from tests.model import oracle
from tests.model.oracle import (
    ABSENT,
    DELETE,
    RETAIN,
    Export,
    Grant,
    Key,
    Namespace,
    Source,
    World,
)
from tests.unit.factories import make_grant, make_source, stored_manifest, stored_secret

T0, T1, T2 = "2024-01-01T00:00:00Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"
NS = ("a", "b", "c")
S1: Key = ("a", "s")
S2: Key = ("b", "s")
DATA = (("k", "v1"), ("x", "v2"))
OLD = (("k", "v0"),)
OTHER_TYPE = "example.com/other"
BOOTSTRAP = "bootstrap.kubernetes.io/token"


# --- the oracle's world, as the product sees it -----------------------------------------------


def b64(v: str) -> str:
    return base64.b64encode(v.encode()).decode()


def raw_grant(g: Grant) -> dict[str, Any]:
    target: dict[str, Any] = {}
    if g.namespaces:
        target["namespaces"] = list(g.namespaces)
    if g.selector is not None:
        target["namespaceSelector"] = {"matchLabels": dict(g.selector)}
    if g.target_name:
        target["name"] = g.target_name
    spec: dict[str, Any] = {
        "source": {"namespace": g.source[0], "name": g.source[1]},
        "target": target,
        "policy": {"onRevoke": g.on_revoke, "onSourceDeleted": g.on_source_deleted},
    }
    if g.keys is not None:
        spec["keys"] = [{"from": f, "to": t} for f, t in g.keys]
    meta = {"name": g.name, "uid": g.uid, "generation": 1, "creationTimestamp": g.created}
    return {"metadata": meta, "spec": spec}


def raw_source(s: Source) -> dict[str, Any]:
    labels = {} if s.export_label is None else {oracle.EXPORT_LABEL: s.export_label}
    notes = {} if s.export_to is None else {"projector.nebari.dev/export-to": s.export_to}
    if s.export_keys is not None:
        notes["projector.nebari.dev/export-keys"] = s.export_keys
    meta: dict[str, Any] = {"namespace": s.namespace, "name": s.name, "labels": labels}
    meta |= {"uid": f"uid-{s.namespace}-{s.name}", "annotations": notes}
    return {"metadata": meta, "type": s.type, "data": {k: b64(v) for k, v in s.data}}


@functools.lru_cache(maxsize=4096)
def stored_copy(place: Key, c: oracle.Copy) -> Copy:
    """The Secret projector writes for the oracle's copy (as its writer would, through
    `desired_copy` of a grant like the one that wrote it)."""
    grant = make_grant(
        c.grant_name,
        uid=c.grant_uid,
        source=c.source,
        namespaces=(place[0],),
        target_name=place[1],
        on_revoke=oracle_policy(c.on_revoke),
        on_source_deleted=oracle_policy(c.on_source_deleted, deleted=True),
    )
    source = make_source(*c.source, data={k: b64(v) for k, v in c.data}, type_=c.type)
    desired = desired_copy(grant, source)
    assert not isinstance(desired, str)
    return parse_copy(stored_manifest(desired.manifest(place[0])))


def oracle_policy(value: str, *, deleted: bool = False) -> Any:
    from projector.core.model import OnRevoke, OnSourceDeleted

    return OnSourceDeleted(value) if deleted else OnRevoke(value)


@functools.lru_cache(maxsize=4096)
def spoofed(place: Key, grant: Grant) -> Copy:
    """A foreign Secret dressed as a copy of `grant`: our labels, and its uid written by hand."""
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, GRANT_LABEL: grant.name}
    notes = {GRANT_UID_ANNOTATION: grant.uid}
    return parse_copy(
        stored_secret(
            *place,
            data={"k": b64("theirs")},
            labels=labels,
            annotations=notes,
            uid=f"uid-spoof-{place[0]}",
            managers={"kubectl": [GRANT_UID_ANNOTATION]},
        )
    )


def to_oracle(c: Copy, data: Mapping[str, str]) -> oracle.Copy:
    notes, labels = c.annotations, c.labels
    src_ns, _, src_name = notes[SOURCE_ANNOTATION].partition("/")
    return oracle.Copy(
        notes[GRANT_UID_ANNOTATION],
        labels[GRANT_LABEL],
        (src_ns, src_name),
        tuple(sorted((k, base64.b64decode(v).decode()) for k, v in data.items())),
        c.type,
        notes[ON_REVOKE_ANNOTATION],
        notes[ON_SOURCE_DELETED_ANNOTATION],
    )


@dataclass
class Places:
    """The simulated cluster: the product's copy at each place, the oracle's reading of it."""

    stored: dict[Key, Copy]
    states: dict[Key, oracle.State]
    spoofs: dict[Key, Copy]


@functools.lru_cache(maxsize=4096)
def product_grant(g: Grant) -> ProductGrant:
    return parse_grant(raw_grant(g))


@functools.lru_cache(maxsize=4096)
def product_source(s: Source, exported: bool = False) -> ProductSource | None:
    """The cached source (None: neither labelled nor named by an export, so never cached; an
    export's source is held by a watch of its own)."""
    raw = raw_source(s)
    return parse_source(raw) if exported or is_exported(raw["metadata"]["labels"]) else None


@functools.lru_cache(maxsize=4096)
def product_export(e: Export) -> ProductExport:
    spec: dict[str, Any] = {"source": {"name": e.source}, "to": list(e.to)}
    if e.keys is not None:
        spec["keys"] = list(e.keys)
    meta = {"namespace": e.namespace, "name": e.name, "uid": f"uid-{e.namespace}-{e.name}"}
    return parse_export({"metadata": meta | {"generation": 1}, "spec": spec})


def cached_source(world: World, key: Key) -> ProductSource | None:
    raw = world.sources.get(key)
    if raw is None:
        return None
    return product_source(raw, bool(oracle.exports_of(world, key)))


@functools.lru_cache(maxsize=4096)
def product_namespace(ns: Namespace) -> ProductNamespace:
    meta: dict[str, Any] = {"name": ns.name, "labels": dict(ns.labels)}
    if ns.terminating:
        meta["deletionTimestamp"] = T2
    return parse_namespace({"metadata": meta})


def snapshot(world: World, places: Places, name: str) -> Snapshot:
    g = world.grants.get(name)
    grant = product_grant(g) if g is not None else None
    source, state = None, SourceState.UNKNOWN
    if g is not None:
        raw = world.sources.get(g.source)
        if raw is None:
            state = SourceState.MISSING
        elif (source := cached_source(world, g.source)) is None:
            state = SourceState.NOT_EXPORTED
        else:
            state = SourceState.AVAILABLE
    rivals = tuple(
        product_grant(r)
        for r in world.grants.values()
        if g is not None and r.name != name and r.target == g.target
    )
    rival_sources = {}
    for r in rivals:
        if (cached := cached_source(world, (r.source.namespace, r.source.name))) is not None:
            rival_sources[r.source] = cached
    named = {(k.namespace, k.name) for k in (r.source for r in rivals)}
    if g is not None:
        named.add(g.source)
    exports = {
        ObjectKey(*k): tuple(product_export(e) for e in oracle.exports_of(world, k))
        for k in named
        if oracle.exports_of(world, k)
    }
    namespaces = {n: product_namespace(ns) for n, ns in world.namespaces.items()}
    copies = {ObjectKey(*k): c for k, c in {**places.stored, **places.spoofs}.items()}
    return Snapshot(
        grant_name=name,
        grant=grant,
        source=source,
        source_state=state,
        namespaces=namespaces,
        copies=copies,
        live_grant_uids=frozenset(x.uid for x in world.grants.values()),
        rivals=rivals,
        rival_sources=rival_sources,
        protected=world.protected,
        exports=exports,
    )


class Disagreement(AssertionError):
    pass


class Judge:
    """The oracle's graph of each place in one world, explored once from where it started."""

    def __init__(self, world: World, initial: Mapping[Key, oracle.State]) -> None:
        self.world = world
        self.initial = initial
        self.graphs: dict[Key, dict[oracle.State, frozenset[oracle.State]]] = {}

    def graph(self, place: Key) -> dict[oracle.State, frozenset[oracle.State]]:
        if place not in self.graphs:
            start = self.initial.get(place, ABSENT)
            self.graphs[place] = oracle.explore(self.world, place, {start})
        return self.graphs[place]

    def reachable(self, place: Key, state: oracle.State) -> set[oracle.State]:
        graph = self.graph(place)
        if state not in graph:
            return set(oracle.closure(self.world, place, {state}))
        seen, todo = {state}, [state]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    def rest(self, place: Key) -> set[oracle.State]:
        return {s for s, nxt in self.graph(place).items() if s in nxt}


def run_controller(world: World, places: Places, judge: Judge, rounds: int = 6) -> None:
    """Plan every grant name and apply its writes until a round writes nothing; each write is
    checked against the oracle: the state it leaves must be reachable from the one before."""
    for _ in range(rounds):
        names = sorted(set(world.grants) | {c.labels[GRANT_LABEL] for c in places.stored.values()})
        wrote = False
        for name in names:
            p = plan(snapshot(world, places, name))
            for step in p.writes:
                place = (step.namespace, step.name)
                before = places.states.get(place, ABSENT)
                if world.occupied(place) or place in places.spoofs:
                    if step.action is not Action.CREATE:
                        raise Disagreement(f"{name}: {step.action} on a foreign object at {place}")
                    continue  # the create is refused (AlreadyExists): a Conflict
                if step.action is Action.DELETE:
                    places.stored.pop(place, None)
                    places.states[place] = ABSENT
                else:
                    desired = step.desired or p.desired  # each step its own key scope
                    assert desired is not None
                    keep = places.stored.get(place) if step.action is Action.UPDATE else None
                    manifest = desired.manifest(place[0], "1" if keep else None, keep=keep)
                    copy = parse_copy(stored_manifest(manifest))
                    places.stored[place] = copy
                    places.states[place] = to_oracle(copy, desired.data)
                after = places.states[place]
                allowed = judge.reachable(place, before)
                if after not in allowed:
                    raise Disagreement(
                        f"{name}: {step.action} at {place} took {oracle.describe(before)} to "
                        f"{oracle.describe(after)}; the oracle allows "
                        + "; ".join(sorted(oracle.describe(s) for s in allowed))
                    )
                wrote = True
        if not wrote:
            return
    raise Disagreement("the plans never stop writing")


def check(world: World, initial: Mapping[Key, oracle.State], spoofs: Mapping[Key, Copy]) -> str:
    """Run the loop on one world; return how it ended, or raise Disagreement."""
    places = Places(
        stored={k: stored_copy(k, s) for k, s in initial.items() if s is not None},
        states=dict(initial),
        spoofs=dict(spoofs),
    )
    judge = Judge(world, initial)
    run_controller(world, places, judge)
    universe = {(n, g.target) for g in world.grants.values() for n in NS} | set(initial)
    ended = []
    for place in sorted(universe):
        now = places.states.get(place, ABSENT)
        rest = judge.rest(place)
        if now not in rest:
            start = initial.get(place, ABSENT)
            raise Disagreement(
                f"{place} ended {oracle.describe(now)} from {oracle.describe(start)}; the oracle "
                "says it rests in: " + "; ".join(sorted(oracle.describe(s) for s in rest))
            )
        ended.append("absent" if now is None else "copy")
    return ",".join(ended)


# --- the worlds -------------------------------------------------------------------------------

LABELS = {"a": (), "b": (("pack", "x"),), "c": (("pack", "x"),)}

OVERSIZED = ",".join(["b", "c", *(f"n{i}" for i in range(255))])
"""257 entries, two of which would match: past the cap, the whole annotation means nobody."""
MANY_GLOBS = ",".join(["*", *(f"x{i}*" for i in range(32))])
"""33 globs, one of them `*`: past the cap, nobody."""

SOURCE_STATES: dict[str, Source | None] = {
    "missing": None,
    "unlabelled": Source(*S1, DATA, export_label=None, export_to="*"),
    "label-True": Source(*S1, DATA, export_label="True", export_to="*"),
    "export-to-none": Source(*S1, DATA),
    "export-to-empty": Source(*S1, DATA, export_to=""),
    "export-to-all": Source(*S1, DATA, export_to="*"),
    "export-to-b": Source(*S1, DATA, export_to="b"),
    "export-to-glob-c": Source(*S1, DATA, export_to="c*,!b"),
    "export-to-a-b-c": Source(*S1, DATA, export_to="a, b ,c"),
    "export-to-oversized": Source(*S1, DATA, export_to=OVERSIZED),
    "export-to-many-globs": Source(*S1, DATA, export_to=MANY_GLOBS),
    "other-type": Source(*S1, DATA, type=OTHER_TYPE, export_to="*"),
    "refused-type": Source(*S1, DATA, type=BOOTSTRAP, export_to="*"),
}

TARGETING: dict[str, dict[str, Any]] = {
    **{
        "list-" + "".join(sub): {"namespaces": sub}
        for r in (1, 2, 3)
        for sub in itertools.combinations(NS, r)
    },
    "select-pack-x": {"selector": (("pack", "x"),)},
    "list-a-and-select": {"namespaces": ("a",), "selector": (("pack", "x"),)},
}

KEYS: dict[str, tuple[tuple[str, str], ...] | None] = {
    "every-key": None,
    "renamed": (("k", "token"),),
    "all-unrenamed": (("k", "k"), ("x", "x")),
    "missing-key": (("nope", "nope"),),
}

NS_MODES = ("normal", "c-protected", "c-terminating")
"""What namespace `c` is; crossed with the targetings that reach `c`."""
CONSENTING = frozenset(
    {"export-to-all", "export-to-b", "export-to-glob-c", "export-to-a-b-c", "other-type"}
)
"""Source states under which the producer consents somewhere: key selections matter there."""
PARSE_VARIANTS = frozenset({"label-True", "export-to-empty", "export-to-many-globs"})
"""Source states that only spell another one differently (not exported; nobody): crossed with
fewer initial places, since the planner sees what they parse to."""


def namespaces(mode: str) -> tuple[dict[str, Namespace], frozenset[str]]:
    out = {n: Namespace(n, LABELS[n]) for n in NS}
    if mode == "c-terminating":
        out["c"] = Namespace("c", LABELS["c"], terminating=True)
    return out, frozenset({"c"}) if mode == "c-protected" else frozenset()


def initial_copy(g: Grant, kind: str) -> oracle.State:
    """What the grant's places hold at first (the same at each: places decide independently)."""
    own = oracle.Copy(g.uid, g.name, g.source, DATA, "Opaque", g.on_revoke, g.on_source_deleted)
    other_policy = RETAIN if g.on_revoke == DELETE else DELETE
    return {
        "absent": ABSENT,
        "own-current": own,
        "own-stale": replace(own, data=OLD),
        "own-other-type": replace(own, type=OTHER_TYPE),
        "own-recorded-other-policy": replace(own, on_revoke=other_policy),
        "orphan-delete": oracle.Copy("uid-old", g.name, g.source, OLD, "Opaque", DELETE),
        "orphan-retain": oracle.Copy("uid-old", g.name, g.source, OLD, "Opaque", RETAIN),
        "orphan-retain-other-source": oracle.Copy("uid-old", g.name, S2, OLD, "Opaque", RETAIN),
        "other-name-orphan": oracle.Copy("uid-gone", "gone", g.source, OLD, "Opaque", DELETE),
    }[kind]


PLACE_KINDS = (
    "absent",
    "own-current",
    "own-stale",
    "own-other-type",
    "own-recorded-other-policy",
    "orphan-delete",
    "orphan-retain",
    "orphan-retain-other-source",
    "other-name-orphan",
    "squatter",
    "spoof",
)

Case = tuple[str, World, dict[Key, oracle.State], dict[Key, Copy]]
"""A world's name, the world, what its places hold at first, and foreign Secrets dressed as
copies there (the product caches them; the oracle counts them as squatters)."""


def one_grant_worlds() -> Iterator[Case]:
    """One grant `g` (source a/s): every admin targeting of a, b, c, every producer state,
    key selection, target name and policy pair, what `c` is, and what the places hold."""
    dimensions = itertools.product(
        SOURCE_STATES.items(),
        TARGETING.items(),
        KEYS.items(),
        (None, "c0"),
        (DELETE, RETAIN),
        (RETAIN, DELETE),
    )
    for (src_name, source), (t_name, targeting), (k_name, keys), *rest in dimensions:
        target, revoke, deleted = rest
        g = Grant(
            "g",
            "uid-g",
            T1,
            S1,
            targeting.get("namespaces", ()),
            targeting.get("selector"),
            target,
            keys,
            revoke,
            deleted,
        )
        if k_name != "every-key" and src_name not in CONSENTING:
            continue  # nothing is projected: which keys would be makes no difference
        reaches_c = t_name in ("list-c", "list-abc", "select-pack-x")
        for mode in NS_MODES if reaches_c else NS_MODES[:1]:
            nss, protected = namespaces(mode)
            places = [(n, g.target) for n in nss if (n, g.target) != S1]
            kinds = PLACE_KINDS if src_name not in PARSE_VARIANTS else PLACE_KINDS[:2]
            for kind in kinds:
                world = World(
                    namespaces=nss,
                    sources={S1: source} if source is not None else {},
                    grants={"g": g},
                    squatters=frozenset(places) if kind in ("squatter", "spoof") else frozenset(),
                    protected=protected,
                )
                init: dict[Key, oracle.State] = {}
                spoofs: dict[Key, Copy] = {}
                if kind == "spoof":
                    spoofs = {p: spoofed(p, g) for p in places}
                elif kind != "squatter":
                    init = {p: initial_copy(g, kind) for p in places}
                name = f"{src_name}/{t_name}/{k_name}/{target}/{revoke}/{deleted}/{mode}/{kind}"
                yield name, world, init, spoofs


def deleted_grant_worlds() -> Iterator[Case]:
    """No grant of the copies' name any more (deleted, perhaps while the controller was down)."""
    for recorded, src in itertools.product((DELETE, RETAIN), (None, "export-to-all")):
        source = SOURCE_STATES[src] if src else None
        copies = {
            (n, "s"): oracle.Copy("uid-old", "g", S1, OLD, "Opaque", recorded) for n in ("b", "c")
        }
        world = World(
            namespaces={n: Namespace(n, LABELS[n]) for n in NS},
            sources={S1: source} if source is not None else {},
        )
        yield f"deleted/{recorded}/{src}", world, dict(copies), {}


def rival_worlds() -> Iterator[Case]:
    """Two grants for one place name (`c0`): every way each may aim at b and c, what each
    projects, who holds the places first, and a tie on creationTimestamp broken by name."""
    listings = [("b",), ("c",), ("b", "c"), ("a",)]
    projections = {
        "ok": (None, "*"),
        "key-missing": ((("nope", "nope"),), "*"),
        "refused": (None, "*"),
        "not-exported-to-c": (None, "b"),
    }
    for l1, l2, (p1, (keys1, to1)), (p2, (keys2, to2)), first, tie, revoke in itertools.product(
        listings,
        listings,
        projections.items(),
        [(k, v) for k, v in projections.items() if k != "refused"],
        ("absent", "g1", "g2", "squatter"),
        (False, True),
        (DELETE, RETAIN),
    ):
        s1 = Source(*S1, DATA, type=BOOTSTRAP if p1 == "refused" else "Opaque", export_to=to1)
        s2 = Source(*S2, (("k", "w1"),), export_to=to2)
        g1 = Grant("g1", "uid-1", T0, S1, l1, None, "c0", keys1, revoke)
        g2 = Grant("g2" if not tie else "g0", "uid-2", T0 if tie else T1, S2, l2, None, "c0", keys2)
        world = World(
            namespaces={n: Namespace(n, LABELS[n]) for n in NS},
            sources={S1: s1, S2: s2},
            grants={g1.name: g1, g2.name: g2},
        )
        init: dict[Key, oracle.State] = {}
        squatters: set[Key] = set()
        for n in ("b", "c"):
            holder = {"g1": g1, "g2": g2}.get(first)
            if holder is not None:
                src = world.sources[holder.source]
                init[(n, "c0")] = oracle.Copy(
                    holder.uid, holder.name, holder.source, src.data, "Opaque", holder.on_revoke
                )
            elif first == "squatter":
                squatters.add((n, "c0"))
        world = replace(world, squatters=frozenset(squatters))
        name = f"{l1}/{l2}/{p1}/{p2}/{first}/tie={tie}/{revoke}"
        yield name, world, init, {}


PRODUCER_SAYS: dict[str, Source] = {
    "unlabelled": Source(*S1, DATA, type=OTHER_TYPE, export_label=None, export_to="*"),
    "unlabelled-export-keys-k": Source(
        *S1, DATA, type=OTHER_TYPE, export_label=None, export_to="*", export_keys="k"
    ),
    **{
        f"label-to-{to}-keys-{keys}": Source(
            *S1, DATA, type=OTHER_TYPE, export_to=to, export_keys=keys
        )
        for to in (None, "b", "*")
        for keys in (None, "k", "", "k,x", "z")
    },
}
"""The source's own say: unlabelled (its export-to and export-keys say nothing), or labelled
with each export-to and export-keys (absent, one key, blank, both keys, a key it lacks)."""

EXPORT_SETS: dict[str, tuple[Export, ...]] = {
    "none": (),
    "to-c": (Export("a", "e0", "s", ("c",)),),
    "to-all-keys-k": (Export("a", "e0", "s", ("*",), ("k",)),),
    "to-b-keys-x": (Export("a", "e0", "s", ("b",), ("x",)),),
    "to-b-keys-empty": (Export("a", "e0", "s", ("b",), ()),),
    "two": (Export("a", "e0", "s", ("b",), ("k",)), Export("a", "e1", "s", ("b", "c"), ("x",))),
    "of-another-secret": (Export("a", "e0", "other", ("*",)),),
    "in-another-namespace": (Export("b", "e0", "s", ("*",)),),
}

EXPORT_KEY_SELECTIONS: dict[str, tuple[tuple[str, str], ...] | None] = {
    **KEYS,
    "x-only": (("x", "x"),),
}


def export_worlds() -> Iterator[Case]:
    """One grant `g` (source a/s, of a type of its own) listing b and c: every say of the
    source itself, every set of exports, every key selection, both onRevoke, and what b and c
    hold at first."""
    nss = {n: Namespace(n, LABELS[n]) for n in NS}
    dimensions = itertools.product(
        PRODUCER_SAYS.items(),
        EXPORT_SETS.items(),
        EXPORT_KEY_SELECTIONS.items(),
        (DELETE, RETAIN),
        ("absent", "own-current", "own-stale", "orphan-retain"),
    )
    for (say, source), (ex_name, exports), (k_name, keys), revoke, kind in dimensions:
        g = Grant("g", "uid-g", T1, S1, ("b", "c"), None, None, keys, revoke)
        world = World(
            namespaces=nss,
            sources={S1: source},
            grants={"g": g},
            exports={e.key: e for e in exports},
        )
        init = {(n, "s"): initial_copy(g, kind) for n in ("b", "c")}
        yield f"{say}/{ex_name}/{k_name}/{revoke}/{kind}", world, init, {}


def export_rival_worlds() -> Iterator[Case]:
    """Two grants for one place name (`c0`), one of them of an unlabelled source that an export
    lets out (to b and c, or to b only; every key, or `k` only), the other of a labelled one:
    every way each aims at b and c, which is the older, what each projects, who holds the
    places first."""
    listings = [("b",), ("c",), ("b", "c")]
    exported = {
        "ok": (None, Export("a", "e0", "s", ("b", "c"))),
        "key-missing": ((("nope", "nope"),), Export("a", "e0", "s", ("b", "c"))),
        "key-not-exported": ((("x", "x"),), Export("a", "e0", "s", ("b", "c"), ("k",))),
        "to-b-only": (None, Export("a", "e0", "s", ("b",))),
    }
    for l1, l2, (p1, (keys1, export)), senior, first, revoke in itertools.product(
        listings,
        listings,
        exported.items(),
        ("by-export", "by-label"),
        ("absent", "g1", "g2", "squatter"),
        (DELETE, RETAIN),
    ):
        s1 = Source(*S1, DATA, export_label=None)
        s2 = Source(*S2, (("k", "w1"),), export_to="*")
        t1, t2 = (T0, T1) if senior == "by-export" else (T1, T0)
        g1 = Grant("g1", "uid-1", t1, S1, l1, None, "c0", keys1, revoke)
        g2 = Grant("g2", "uid-2", t2, S2, l2, None, "c0")
        world = World(
            namespaces={n: Namespace(n, LABELS[n]) for n in NS},
            sources={S1: s1, S2: s2},
            grants={g1.name: g1, g2.name: g2},
            exports={export.key: export},
        )
        init: dict[Key, oracle.State] = {}
        squatters: set[Key] = set()
        for n in ("b", "c"):
            holder = {"g1": g1, "g2": g2}.get(first)
            if holder is not None:
                src = world.sources[holder.source]
                init[(n, "c0")] = oracle.Copy(
                    holder.uid, holder.name, holder.source, src.data, "Opaque", holder.on_revoke
                )
            elif first == "squatter":
                squatters.add((n, "c0"))
        world = replace(world, squatters=frozenset(squatters))
        yield f"{l1}/{l2}/{p1}/senior-{senior}/{first}/{revoke}", world, init, {}


FAMILIES = {
    "one grant": one_grant_worlds,
    "deleted grant": deleted_grant_worlds,
    "two grants for one place": rival_worlds,
    "exports and key scopes": export_worlds,
    "two grants for one place, one by an export": export_rival_worlds,
}


@pytest.mark.parametrize(
    "family",
    [f for f in FAMILIES],
)
def test_the_planner_agrees_with_the_oracle_on_every_small_world(family: str) -> None:
    ends: Counter[str] = Counter()
    worlds = 0
    for name, world, init, spoofs in FAMILIES[family]():
        worlds += 1
        try:
            ends[check(world, init, spoofs)] += 1
        except Disagreement as e:
            raise AssertionError(f"world {family}: {name}: {e}") from None
    assert worlds > 0
    # not vacuous: copies are made, and places stay empty, in many worlds
    assert sum(n for end, n in ends.items() if "copy" in end) > worlds // 10, ends
    assert sum(n for end, n in ends.items() if "absent" in end) > worlds // 10, ends


# --- the oracle itself, on the plain rows ------------------------------------------------------


def test_the_oracle_reads_the_design_right_on_plain_rows() -> None:
    """A reference is only one if it reads DESIGN §3 right where nobody could doubt it."""
    nss = {n: Namespace(n) for n in ("p", "q", "r")}
    src = Source("p", "s", (("k", "v"),), export_to="q,r")
    g = Grant("g", "u1", T0, ("p", "s"), ("q", "r"))
    w = World(namespaces=nss, sources={src.key: src}, grants={"g": g})
    copy = oracle.Copy("u1", "g", ("p", "s"), (("k", "v"),), "Opaque")
    # grant + opted-in source + target namespace: a copy in every target namespace
    assert oracle.settle(w, ("q", "s"), {ABSENT}) == {copy}
    # the source's own namespace is never a target
    assert oracle.settle(w, ("p", "s"), {ABSENT}) == {ABSENT}
    # export-to stops matching: onRevoke (Delete by default)
    narrowed = replace(w, sources={src.key: replace(src, export_to="q")})
    assert oracle.settle(narrowed, ("r", "s"), {copy}) == {ABSENT}
    assert oracle.settle(narrowed, ("q", "s"), {copy}) == {copy}
    # source deleted: onSourceDeleted (Retain by default): the last good copy stays
    assert oracle.settle(replace(w, sources={}), ("q", "s"), {copy}) == {copy}
    # someone edits the copy: restored
    edited = replace(copy, data=(("k", "by hand"),))
    assert oracle.settle(w, ("q", "s"), {edited}) == {copy}
    # a squatter: left alone, no copy
    assert oracle.settle(replace(w, squatters=frozenset({("q", "s")})), ("q", "s"), {ABSENT}) == {
        ABSENT
    }
    # grant deleted: onRevoke recorded on the copy
    assert oracle.settle(replace(w, grants={}), ("q", "s"), {copy}) == {ABSENT}
    kept = replace(copy, on_revoke=RETAIN)
    assert oracle.settle(replace(w, grants={}), ("q", "s"), {kept}) == {kept}
    # a refused source type: nothing projected, earlier copies follow onRevoke
    token = replace(w, sources={src.key: replace(src, type=BOOTSTRAP)})
    assert oracle.settle(token, ("q", "s"), {ABSENT}) == {ABSENT}
    assert oracle.settle(token, ("q", "s"), {copy}) == {ABSENT}
    # a key missing: the last copy is kept
    keyed = replace(w, grants={"g": replace(g, keys=(("nope", "nope"),))})
    assert oracle.settle(keyed, ("q", "s"), {copy}) == {copy}
    # renamed keys: Opaque, whatever the source's type
    typed = replace(w, sources={src.key: replace(src, type=OTHER_TYPE)})
    renamed = replace(typed, grants={"g": replace(g, keys=(("k", "t"),))})
    (only,) = oracle.settle(renamed, ("q", "s"), {ABSENT})
    assert only is not None and only.type == "Opaque" and only.data == (("t", "v"),)
    (whole,) = oracle.settle(typed, ("q", "s"), {ABSENT})
    assert whole is not None and whole.type == OTHER_TYPE
    # a source whose namespace is terminating: there until its namespace controller deletes it
    dying = replace(w, dying=frozenset({src.key}))
    assert oracle.settle(dying, ("q", "s"), {ABSENT}) == {ABSENT, copy}
    # two grants aiming at one copy: the older wins
    young = Grant("a-young", "u2", T1, ("p", "s"), ("q",))
    both = replace(w, grants={"g": g, "a-young": young})
    assert oracle.settle(both, ("q", "s"), {ABSENT}) == {copy}


def test_issue_42_the_source_moves_into_a_namespace_holding_its_copy() -> None:
    """Issue 42 (a): the grant's source moves to p2/other, where it holds the copy p2/copy."""
    nss = {n: Namespace(n) for n in ("p1", "p2")}
    s = Source("p1", "s", (("k", "v"),), export_to="*")
    other = Source("p2", "other", (("k", "w"),), export_to="*")
    g = Grant("g", "u", T0, ("p1", "s"), ("p2",), target_name="copy")
    w = World(namespaces=nss, sources={s.key: s, other.key: other}, grants={"g": g})
    (copy,) = oracle.settle(w, ("p2", "copy"), {ABSENT})
    assert copy is not None
    moved = replace(w, grants={"g": replace(g, source=("p2", "other"))})
    assert oracle.settle(moved, ("p2", "copy"), {copy}) == {ABSENT}
    retained = replace(moved, grants={"g": replace(g, source=("p2", "other"), on_revoke=RETAIN)})
    assert oracle.settle(retained, ("p2", "copy"), {replace(copy, on_revoke=RETAIN)}) == {
        replace(copy, on_revoke=RETAIN)
    }


def test_seed_194_a_copy_landing_at_a_deleted_sources_key_revokes_that_sources_copies() -> None:
    """Seed 194: g0's source n1/s1 went with its namespace; g0's copy at (n2, s1) is retained.
    One operation lets the younger g1 (source pr/s1, target s1) land a copy at n1/s1 too: g0's
    source then reads "not exported", its copy follows onRevoke (Delete), and g1 takes (n2, s1),
    all between two observations. A single world, explored place by place, misses it."""
    nss = {n: Namespace(n) for n in ("n1", "n2", "pr")}
    s = Source("pr", "s1", (("k", "v"),), export_to="*")
    g0 = Grant("g0", "u0", T0, ("n1", "s1"), ("n2",), keys=(("k", "t"),))
    g1 = Grant("g1", "u1", T1, ("pr", "s1"), ("n1", "n2"))
    w = World(namespaces=nss, sources={s.key: s}, grants={"g0": g0, "g1": g1})
    retained = oracle.Copy("u0", "g0", ("n1", "s1"), (("t", "old"),), "Opaque")
    possible = {("n1", "s1"): frozenset({ABSENT}), ("n2", "s1"): frozenset({retained})}
    # place by place, in the world as it was: g0's source deleted, its copy retained
    assert oracle.reachable([w], ("n2", "s1"), {retained}) == {retained}
    worlds, reached = oracle.reach([w], possible)
    ours = oracle.Copy("u1", "g1", ("pr", "s1"), (("k", "v"),), "Opaque")
    assert reached[("n1", "s1")] == {ABSENT, ours}
    assert reached[("n2", "s1")] == {retained, ABSENT, ours}
    assert worlds[0].others == {("n1", "s1"): None, ("n2", "s1"): None}


def test_the_oracle_reads_the_design_right_on_export_rows() -> None:
    """DESIGN §2-3's ProjectionExport and key-scope rows, where nobody could doubt them."""
    nss = {n: Namespace(n) for n in ("p", "q", "r")}
    src = Source("p", "s", (("k", "v"), ("x", "w")), type=OTHER_TYPE, export_label=None)
    g = Grant("g", "u1", T0, ("p", "s"), ("q", "r"))
    export = Export("p", "e", "s", ("q",))
    w = World(namespaces=nss, sources={src.key: src}, grants={"g": g}, exports={export.key: export})
    copy = oracle.Copy("u1", "g", ("p", "s"), src.data, OTHER_TYPE)
    # an unlabelled source an export names and lets into q: projected there, exactly as with
    # the label (its own type: every key); not in r (Denied), whatever its export-to says
    assert oracle.settle(w, ("q", "s"), {ABSENT}) == {copy}
    assert oracle.settle(w, ("r", "s"), {ABSENT}) == {ABSENT}
    exported_to_all = replace(w, sources={src.key: replace(src, export_to="*")})
    assert oracle.settle(exported_to_all, ("r", "s"), {ABSENT}) == {ABSENT}
    # an export of another Secret, or in another namespace, consents to nothing here
    elsewhere = Export("q", "e", "s", ("*",))
    for other in (replace(export, source="t"), elsewhere):
        assert oracle.settle(replace(w, exports={other.key: other}), ("q", "s"), {ABSENT}) == {
            ABSENT
        }
    # the export narrowed, or deleted: onRevoke (Delete by default; Retain keeps the copy)
    narrowed = replace(w, exports={export.key: replace(export, to=("r",))})
    assert oracle.settle(narrowed, ("q", "s"), {copy}) == {ABSENT}
    retain = replace(w, exports={}, grants={"g": replace(g, on_revoke=RETAIN)})
    kept = replace(copy, on_revoke=RETAIN)
    assert oracle.settle(retain, ("q", "s"), {kept}) == {kept}
    # an export's keys: copies hold only those (Opaque: not every key)
    scoped = replace(w, exports={export.key: replace(export, keys=("k",))})
    only_k = replace(copy, data=(("k", "v"),), type="Opaque")
    assert oracle.settle(scoped, ("q", "s"), {copy}) == {only_k}
    # a grant naming a key outside the scope: nothing there, what it held follows onRevoke,
    # even if the source lacks that key too (a hard boundary)
    for key in ("x", "nope"):
        naming = replace(scoped, grants={"g": replace(g, keys=((key, key),))})
        assert oracle.settle(naming, ("q", "s"), {ABSENT}) == {ABSENT}
        assert oracle.settle(naming, ("q", "s"), {only_k}) == {ABSENT}
    # a labelled source's export-keys scopes the label path alike; the consents' scopes unite
    labelled = replace(src, export_label="true", export_to="q,r", export_keys="k")
    by_label = replace(w, sources={src.key: labelled}, exports={})
    assert oracle.settle(by_label, ("r", "s"), {ABSENT}) == {only_k}
    both = replace(by_label, exports={export.key: replace(export, keys=("x",))})
    assert oracle.settle(both, ("q", "s"), {ABSENT}) == {copy}  # k by the label, x by the export
    assert oracle.settle(both, ("r", "s"), {ABSENT}) == {only_k}
    # export-keys absent: every key; blank: none (a grant without keys: ambiguous, below)
    every = replace(by_label, sources={src.key: replace(labelled, export_keys=None)})
    assert oracle.settle(every, ("r", "s"), {ABSENT}) == {copy}
    blank = replace(by_label, sources={src.key: replace(labelled, export_keys="")})
    notes: set[str] = set()
    empty = replace(copy, data=(), type="Opaque")
    assert oracle.settle(blank, ("r", "s"), {ABSENT}, notes) == {ABSENT, empty}
    assert notes == {oracle.AMBIGUOUS_EMPTY_SCOPE}


def test_a_secret_an_export_names_is_a_source_whatever_stands_there() -> None:
    """An export names p/s, where no source but a squatter (or another grant's copy) stands:
    "an unlabelled source an export names is projected like a labelled one", with what it
    holds (`World.contents`); where a copy only may stand, also as a deleted source."""
    nss = {n: Namespace(n) for n in ("p", "q")}
    g = Grant("g", "u1", T0, ("p", "s"), ("q",), on_source_deleted=DELETE)
    export = Export("p", "e", "s", ("*",))
    held = frozenset({((("k", "theirs"),), "Opaque")})
    w = World(
        namespaces=nss,
        grants={"g": g},
        squatters=frozenset({("p", "s")}),
        others={("p", "s"): True},
        contents={("p", "s"): held},
        exports={export.key: export},
    )
    copy = oracle.Copy("u1", "g", ("p", "s"), (("k", "theirs"),), "Opaque", DELETE, DELETE)
    assert oracle.settle(w, ("q", "s"), {ABSENT}) == {copy}
    # without the export it is only a Secret without the label: nothing
    assert oracle.settle(replace(w, exports={}), ("q", "s"), {ABSENT}) == {ABSENT}
    # a Secret carrying projector's mark (dressed, or a copy that may stand there): projected
    # on, or refused as a source (AMBIGUOUS_COPY_AS_SOURCE)
    notes: set[str] = set()
    dressed = replace(w, marked=frozenset({("p", "s")}))
    assert oracle.settle(dressed, ("q", "s"), {ABSENT}, notes) == {ABSENT, copy}
    assert oracle.settle(dressed, ("q", "s"), {copy}) == {ABSENT, copy}
    assert notes == {oracle.AMBIGUOUS_COPY_AS_SOURCE}
    maybe = replace(w, squatters=frozenset(), others={("p", "s"): None})
    assert oracle.settle(maybe, ("q", "s"), {ABSENT}) == {ABSENT, copy}
    # the copy standing at p/s is its own place's state, not a foreign object there: its
    # grant may still take it away
    h = Grant("h", "u2", T0, ("q", "x"), ("p",), target_name="s", on_source_deleted=DELETE)
    standing = oracle.Copy("u2", "h", ("q", "x"), (("k", "theirs"),), "Opaque", DELETE, DELETE)
    owned = replace(w, squatters=frozenset(), grants={"g": g, "h": h})
    assert oracle.settle(owned, ("p", "s"), {standing}) == {ABSENT}

"""DESIGN §2-3 restated as a second, independent program: which copy each place should hold.

Written from the design's words, never from projector's code: nothing here imports projector,
and nothing calls `plan`, `consent` or `claim`. Where this file and the controller disagree, one
of them is wrong, and the model-based tests say which operation sequence shows it.

The world is what the tests created (namespaces, sources, grants, foreign Secrets); a **place**
is a (namespace, name) where a copy may stand; its **state** is ABSENT or a `Copy` (what
projector wrote there, or a hand edit of it). A foreign object at a place is part of the world,
not of the place's state: while it stands, no copy can.

`successors(world, place, state)` is the set of states one step of a correct controller may
take the place to, in that world; `settle` is where a place ends once the controller has acted
on a world and stopped (the states reachable from which nothing moves). A set, not one state,
because the design leaves some choices open (below) and because a test does not know which of
several states a place was in between two observations: Retain keeps whatever the copy held
when it stopped being wanted, which depends on timing. At a convergence point (every change
seen, the controller idle) the place must be in `settle(...)` exactly.

The rules, each a row of DESIGN §3 (or a sentence of §2):

- Both consents: the admin's grant lists or selects the namespace; the producer's Secret has
  the label `projector.nebari.dev/export: "true"` (that spelling only) and an `export-to` entry
  (a name, or a shell glob; `*` any) matching it. Missing or empty export-to: nobody. Past 256
  entries, 32 globs or 16 KiB the annotation is ignored as a whole (nobody). An entry that is
  neither a name nor a glob (`!a`, `-a`) matches nothing.
- Never a target: the source's own namespace, a protected namespace, a missing or terminating
  namespace (terminating: no write at all; the copy goes with the namespace).
- A grant *aims* at a place when both consents hold there and the place's name is its target
  name (default: the source's name). Of the grants aiming at one place the oldest
  (creationTimestamp, then name) wins; the others conflict.
- The winner *serves* the place when its source may be projected (not a service-account or
  bootstrap token) and has every granted key: the place then holds exactly its projection:
  the granted keys (renamed by `to`), the source's type if every key is projected unrenamed
  (else Opaque), marked with the grant's uid and name and the source. A key missing: the last
  copy is kept. A refused source: what was projected before follows onRevoke.
- A copy of a live grant that no longer aims at its place follows the grant's onRevoke, or its
  onSourceDeleted when the source is gone and the place is still targeted. A younger grant's
  copy at a place an older grant aims at is the older one's to take.
- A copy whose grant is gone (deleted, maybe while the controller was down) follows the
  onRevoke recorded on it when it was written.
- Anything that is not a copy (no projector mark: a squatter, a source) is never written or
  deleted; a copy of another live grant that does not aim there is not taken either.

Where DESIGN §3 is ambiguous, `successors` allows every reading (so only the safety
invariants are checked there), and names the ambiguity in `notes` so a test can count how often
it decided an outcome:

- AMBIGUOUS_ADOPTION: a grant re-created under the same name (a new uid) aims at a place where
  its predecessor's copy stands (retained, or not yet deleted). §2 says a copy with another
  grant's uid is never overwritten, and §3 that an orphan follows the policy recorded on it;
  a GitOps re-apply makes exactly this situation, where taking the copy over as the new
  grant's own (rewritten, or kept while a key is missing) is what an admin expects.
- AMBIGUOUS_REFUSED_SENIOR: the oldest grant aiming at a place has a refused source (a token
  type); does it still "aim at the same copy" and block a younger grant, or does the younger
  one win?
- AMBIGUOUS_POLICY_CHANGED: a live grant's onRevoke changed, and before its copy was rewritten
  with it, the copy stopped being wanted: "the policy it was created under" (the one recorded
  on the copy) or the grant's current one?
- AMBIGUOUS_SOURCE_GONE_UNTARGETED: the source is deleted and the place is no longer targeted
  (or never was, e.g. an old target name): onSourceDeleted (source deleted) or onRevoke
  (namespace untargeted)?

Not modelled (they do not exist yet, or are other tests' subject): ProjectionExport objects
and `export-keys` key scopes, ConfigMap sources, a grant's extra labels and annotations.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

Key = tuple[str, str]
"""(namespace, name) of a Secret: a source, a foreign object, or a place for a copy."""
Data = tuple[tuple[str, str], ...]
"""A Secret's data, decoded, as sorted (key, value) pairs."""

EXPORT_LABEL = "projector.nebari.dev/export"
REFUSED_TYPES = frozenset({"kubernetes.io/service-account-token", "bootstrap.kubernetes.io/token"})
MAX_ENTRIES, MAX_GLOBS, MAX_CHARS = 256, 32, 16384
DELETE, RETAIN = "Delete", "Retain"

AMBIGUOUS_ADOPTION = "ambiguous: a re-created grant meets its predecessor's retained copy"
AMBIGUOUS_REFUSED_SENIOR = "ambiguous: the oldest grant aiming here has a refused source"
AMBIGUOUS_POLICY_CHANGED = "ambiguous: onRevoke changed before the copy recorded it"
AMBIGUOUS_SOURCE_GONE_UNTARGETED = "ambiguous: source deleted where no longer targeted"


@dataclass(frozen=True)
class Namespace:
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    terminating: bool = False


@dataclass(frozen=True)
class Source:
    """A Secret a grant may name. `export_label` is the label's value (None: no label)."""

    namespace: str
    name: str
    data: Data = ()
    type: str = "Opaque"
    export_label: str | None = "true"
    export_to: str | None = None

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class Grant:
    name: str
    uid: str
    created: str
    """creationTimestamp as the API server wrote it (RFC 3339: string order is time order)."""
    source: Key
    namespaces: tuple[str, ...] = ()
    selector: tuple[tuple[str, str], ...] | None = None
    """matchLabels; None: no selector."""
    target_name: str | None = None
    keys: tuple[tuple[str, str], ...] | None = None
    """(from, to) pairs; None: every key."""
    on_revoke: str = DELETE
    on_source_deleted: str = RETAIN

    @property
    def target(self) -> str:
        return self.target_name or self.source[1]

    @property
    def seniority(self) -> tuple[str, str]:
        return (self.created, self.name)


@dataclass(frozen=True)
class Copy:
    """What projector wrote at a place (or a hand edit of it).

    The policies are what the copy recorded when written: hidden from `visible`, since which
    policy a copy recorded is the controller's business; what it does with it is the oracle's.
    """

    grant_uid: str
    grant_name: str
    source: Key
    data: Data
    type: str
    on_revoke: str = DELETE
    on_source_deleted: str = RETAIN

    def visible(self) -> Visible:
        return (self.grant_uid, self.grant_name, self.source, self.data, self.type)


Visible = tuple[str, str, Key, Data, str]
"""What a test can see of a copy: owner uid and name, source, data, type."""
State = Copy | None
ABSENT: State = None


@dataclass(frozen=True)
class World:
    """What the tests made exist at one moment."""

    namespaces: Mapping[str, Namespace] = field(default_factory=dict)
    sources: Mapping[Key, Source] = field(default_factory=dict)
    grants: Mapping[str, Grant] = field(default_factory=dict)
    squatters: frozenset[Key] = frozenset()
    """Foreign Secrets (no projector mark) the tests put at places."""
    others: Mapping[Key, bool | None] = field(default_factory=dict)
    """Where a Secret that is not a source stands (True), or may stand (None): a copy at a key
    that some grant names as its source makes that source "not exported", not "deleted"."""
    protected: frozenset[str] = frozenset()
    dying: frozenset[Key] = frozenset()
    """Sources in a terminating namespace: its controller deletes them at a moment nobody
    knows, so each is, until the namespace is gone, there or not."""

    def occupied(self, place: Key) -> bool:
        """A Secret that is not a copy stands there: no copy can."""
        return place in self.squatters or place in self.sources

    def grant_by_uid(self, uid: str) -> Grant | None:
        return next((g for g in self.grants.values() if g.uid == uid), None)


# --- the producer's consent ----------------------------------------------------------------------

_VALID_ENTRY = re.compile(r"[a-z0-9*?\[][a-z0-9*?\[\]-]*")


def producer_allows(source: Source, namespace: str) -> bool:
    """The label, then one export-to entry matching (missing, empty or oversized: nobody)."""
    if source.export_label != "true" or not source.export_to:
        return False
    value = source.export_to
    entries = [e.strip() for e in value.split(",")]
    if len(value) > MAX_CHARS or len(entries) > MAX_ENTRIES:
        return False
    entries = [e for e in entries if e]
    if sum(1 for e in entries if any(c in e for c in "*?[")) > MAX_GLOBS:
        return False
    return any(
        _VALID_ENTRY.fullmatch(e) is not None and fnmatch.fnmatchcase(namespace, e) for e in entries
    )


# --- the admin's consent, and who aims where ------------------------------------------------------


def admin_targets(grant: Grant, ns: Namespace) -> bool:
    if ns.name in grant.namespaces:
        return True
    labels = dict(ns.labels)
    return grant.selector is not None and all(labels.get(k) == v for k, v in grant.selector)


def writable(world: World, namespace: str) -> Namespace | None:
    """The namespace, if a copy may be written there at all."""
    ns = world.namespaces.get(namespace)
    if ns is None or ns.terminating or namespace in world.protected:
        return None
    return ns


def aims(world: World, grant: Grant, place: Key) -> bool:
    """Both consents hold at this place, which is the grant's target name."""
    namespace, name = place
    ns = writable(world, namespace)
    if ns is None or name != grant.target or namespace == grant.source[0]:
        return False
    source = world.sources.get(grant.source)
    return source is not None and admin_targets(grant, ns) and producer_allows(source, namespace)


def targeted_place(world: World, grant: Grant, place: Key) -> bool:
    """The admin's side alone: the grant would aim here if the producer agreed."""
    namespace, name = place
    ns = writable(world, namespace)
    return (
        ns is not None
        and name == grant.target
        and namespace != grant.source[0]
        and admin_targets(grant, ns)
    )


KEY_MISSING = "KeyMissing"
REFUSED = "Refused"


def projection(world: World, grant: Grant) -> Copy | str:
    """The copy the grant writes, or why it writes none (KEY_MISSING, REFUSED)."""
    source = world.sources[grant.source]
    if source.type in REFUSED_TYPES:
        return REFUSED
    data = dict(source.data)
    if grant.keys is None:
        out, whole = data, True
    else:
        if any(f not in data for f, _ in grant.keys):
            return KEY_MISSING
        out = {t: data[f] for f, t in grant.keys}
        whole = {f for f, _ in grant.keys} == set(data) and all(f == t for f, t in grant.keys)
    return Copy(
        grant.uid,
        grant.name,
        grant.source,
        tuple(sorted(out.items())),
        source.type if whole else "Opaque",
        grant.on_revoke,
        grant.on_source_deleted,
    )


def claimants(world: World, place: Key) -> list[Grant]:
    """The grants aiming at a place, oldest first: the first one wins."""
    return sorted(
        (g for g in world.grants.values() if aims(world, g, place)), key=lambda g: g.seniority
    )


# --- one step, and where it ends ------------------------------------------------------------------


def revoke(state: Copy, policy: str) -> frozenset[State]:
    return frozenset({ABSENT}) if policy == DELETE else frozenset({state})


def successors(
    world: World, place: Key, state: State, notes: set[str] | None = None
) -> frozenset[State]:
    """The states one step of a correct controller may take the place to (itself included when
    nothing is to be done). Every reading of the world's uncertain keys, and of the design's
    ambiguities, is allowed."""
    out: set[State] = set()
    for w in resolutions(world):
        out |= _successors(w, place, state, notes if notes is not None else set())
    return frozenset(out)


def _successors(world: World, place: Key, state: State, notes: set[str]) -> set[State]:
    ns = world.namespaces.get(place[0])
    if ns is None:
        return {ABSENT}  # the copy went with its namespace
    if ns.terminating:
        return {state, ABSENT}  # skipped quietly; the namespace's deletion takes it
    if world.occupied(place):
        return {state}  # a foreign object stands there: never touched (and no copy can be)
    aiming = claimants(world, place)
    winners: list[Grant | None] = [*aiming[:1]]
    if aiming and projection(world, aiming[0]) == REFUSED and len(aiming) > 1:
        notes.add(AMBIGUOUS_REFUSED_SENIOR)
        serving = [g for g in aiming if projection(world, g) != REFUSED]
        winners = [aiming[0], *serving[:1]]
    out: set[State] = set()
    for winner in winners or [None]:
        out |= _step(world, place, state, winner, aiming, notes)
    if state is not None and any(s is not None and s.type != state.type for s in out):
        out.add(ABSENT)  # "source type changes: copy replaced (delete + create)": absent between
    return out


def _step(
    world: World,
    place: Key,
    state: State,
    winner: Grant | None,
    aiming: list[Grant],
    notes: set[str],
) -> set[State]:
    served = projection(world, winner) if winner is not None else None
    if state is None:  # an empty place: the winner's copy, if it has one to write
        return {served} if isinstance(served, Copy) else {ABSENT}
    owner = world.grant_by_uid(state.grant_uid)
    if owner is None:  # its grant is gone: the policy recorded on the copy
        out = set(revoke(state, state.on_revoke))
        heir = world.grants.get(state.grant_name)
        if heir is not None and aims(world, heir, place):
            # or the grant re-created under its name takes it over, as if it were its own
            notes.add(AMBIGUOUS_ADOPTION)
            adopted = replace(state, grant_uid=heir.uid)
            then = _step(world, place, adopted, winner, aiming, notes)
            out |= {state if s == adopted else s for s in then}
        return out
    if owner in aiming:
        own = projection(world, owner)
        if winner is not None and owner.uid == winner.uid:
            if isinstance(own, Copy):
                return {own}
            if own == KEY_MISSING:
                return {state}  # the last copy is kept
            return _revoked(state, owner, ON_REVOKE, notes)  # refused: follows onRevoke
        # A younger grant's copy where an older one aims: the older takes it (if it has
        # something to write), and the younger gives it up if its own source is refused.
        # Two actors: the place rests only if neither moves it.
        moves: set[State] = {served} if isinstance(served, Copy) else set()
        if own == REFUSED:
            moves |= _revoked(state, owner, ON_REVOKE, notes) - {state}
        return moves or {state}
    # its grant no longer aims here: onSourceDeleted if the source is gone from a targeted
    # place, else onRevoke
    if owner.source not in world.sources:
        if targeted_place(world, owner, place):
            return _revoked(state, owner, ON_SOURCE_DELETED, notes)
        notes.add(AMBIGUOUS_SOURCE_GONE_UNTARGETED)
        return _revoked(state, owner, ON_REVOKE, notes) | _revoked(
            state, owner, ON_SOURCE_DELETED, notes
        )
    return _revoked(state, owner, ON_REVOKE, notes)


ON_REVOKE, ON_SOURCE_DELETED = "onRevoke", "onSourceDeleted"


def _revoked(state: Copy, owner: Grant, which: str, notes: set[str]) -> set[State]:
    """A live grant's copy no longer wanted, by the grant's policy `which` (ON_REVOKE or
    ON_SOURCE_DELETED), or by the one the copy recorded if the grant's has changed since."""
    if which == ON_REVOKE:
        policy, recorded = owner.on_revoke, state.on_revoke
    else:
        policy, recorded = owner.on_source_deleted, state.on_source_deleted
    out = set(revoke(state, policy))
    if recorded != policy:
        notes.add(AMBIGUOUS_POLICY_CHANGED)
        out |= revoke(state, recorded)
    return out


def explore(
    world: World, place: Key, states: Iterable[State], notes: set[str] | None = None
) -> dict[State, frozenset[State]]:
    """Every state the place may reach from `states` in this world, with its successors."""
    graph: dict[State, frozenset[State]] = {}
    todo = list(states)
    while todo:
        state = todo.pop()
        if state in graph:
            continue
        graph[state] = successors(world, place, state, notes)
        todo.extend(s for s in graph[state] if s not in graph)
    return graph


def closure(
    world: World, place: Key, states: Iterable[State], notes: set[str] | None = None
) -> frozenset[State]:
    """Every state the place may reach from `states` in this world (them included)."""
    return frozenset(explore(world, place, states, notes))


def settle(
    world: World, place: Key, states: Iterable[State], notes: set[str] | None = None
) -> frozenset[State]:
    """Where the place may rest once a correct controller is done with this world: the states
    reachable from `states` that it leaves as they are."""
    return frozenset(s for s, nxt in explore(world, place, states, notes).items() if s in nxt)


def reachable(worlds: Sequence[World], place: Key, states: Iterable[State]) -> frozenset[State]:
    """Every state the place may reach from `states` by steps taken in any of `worlds`."""
    seen = set(states)
    todo = list(seen)
    while todo:
        state = todo.pop()
        for w in worlds:
            new = successors(w, place, state) - seen
            seen |= new
            todo.extend(new)
    return frozenset(seen)


def reach(
    worlds: Sequence[World], possible: Mapping[Key, frozenset[State]]
) -> tuple[list[World], dict[Key, frozenset[State]]]:
    """Every state each place may reach through `worlds` (in any order), and those worlds as
    they may have been meanwhile.

    A copy written in one of these worlds may stand at a key a grant names as its source: that
    source then reads "not exported" (not "deleted") in the very same worlds, which moves other
    places (the grant's copies follow onRevoke, not onSourceDeleted). So each world learns
    where a copy may now stand (`World.others`), and the places are explored again, until
    nothing new is reachable.
    """
    worlds = list(worlds)
    reached = dict(possible)
    while True:
        reached = {place: reachable(worlds, place, states) for place, states in reached.items()}
        may = {p for p, states in reached.items() if any(s is not None for s in states)}
        wider = [
            replace(w, others={**dict.fromkeys(may - set(w.others)), **w.others})
            if may - set(w.others)
            else w
            for w in worlds
        ]
        if wider == worlds:
            return worlds, reached
        worlds = wider


def consented(world: World) -> Iterator[tuple[Key, Visible]]:
    """Every (place, copy) both consents allow now: a copy may only ever hold one of these
    (or what a person wrote into it), whichever grant wins."""
    for w in resolutions(world):
        for grant in w.grants.values():
            source = w.sources.get(grant.source)
            if source is None:
                continue
            for namespace in w.namespaces:
                place = (namespace, grant.target)
                if aims(w, grant, place) and not w.occupied(place):
                    copy = projection(w, grant)
                    if isinstance(copy, Copy):
                        yield place, copy.visible()


def resolutions(world: World) -> Iterator[World]:
    """The world under each reading of its uncertain keys (those some grant names).

    A source key where a Secret that is not a source may stand is, in one reading, a Secret
    without the export label, and in the other, nothing (a deleted source). A dying source (its
    namespace terminating) is, in one reading, still there, and in the other, deleted.
    """
    if not world.others and not world.dying:
        yield world
        return
    named = {g.source for g in world.grants.values()}
    maybe = [k for k in sorted(named - set(world.sources)) if k in world.others]
    certain = {k: Source(*k, export_label=None) for k in maybe if world.others[k]}
    uncertain = [k for k in maybe if world.others[k] is None]
    dying = [k for k in sorted(named & set(world.sources)) if k in world.dying]
    for present in itertools.product((False, True), repeat=len(uncertain)):
        sources = {**world.sources, **certain}
        chosen = [k for k, p in zip(uncertain, present, strict=True) if p]
        sources.update((k, Source(*k, export_label=None)) for k in chosen)
        for gone in itertools.product((False, True), repeat=len(dying)):
            deleted = {k for k, g in zip(dying, gone, strict=True) if g}
            left = {k: v for k, v in sources.items() if k not in deleted}
            yield replace(world, sources=left, others={}, dying=frozenset())


def expected(world: World, place: Key, states: Iterable[State]) -> str:
    """The settled states of a place, for a failure message."""
    return ", ".join(sorted(describe(s) for s in settle(world, place, states))) or "(none)"


def describe(state: State) -> str:
    if state is None:
        return "absent"
    keys = ",".join(f"{k}={v}" for k, v in state.data)
    return (
        f"copy of {state.grant_name} (uid {state.grant_uid[:8]}) from "
        f"{state.source[0]}/{state.source[1]} type {state.type} {{{keys}}} "
        f"[recorded onRevoke {state.on_revoke}, onSourceDeleted {state.on_source_deleted}]"
    )

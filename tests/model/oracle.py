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

- Both consents: the admin's grant lists or selects the namespace; the producer consents there
  by the *label path* (the Secret has the label `projector.nebari.dev/export: "true"`, that
  spelling only, and an `export-to` entry, a name or a shell glob, `*` any, matching it) **or**
  by any `ProjectionExport` of the source's namespace naming the source whose `to` matches
  (an unlabelled source an export names is projected exactly like a labelled one; its own
  export-to says nothing). Missing or empty export-to: nobody by the label path. Past 256
  entries, 32 globs or 16 KiB the annotation is ignored as a whole (nobody); an export past
  256 `to` entries or 32 globs consents to nothing. An entry that is neither a name nor a glob
  (`!a`, `-a`) matches nothing.
- The producer's key scope, per namespace: the union of the scopes of the consents that let a
  copy in there (the label path: its `export-keys` annotation, comma-separated, absent = every
  key, blank or past export-to's bounds = no key; each matching export: its `keys`, omitted =
  every key, an empty list = no key). A grant without keys copies the source's keys within the
  scope (the source's type only if that is every key, else Opaque); a grant whose keys name
  one outside the scope writes nothing there (KeyNotExported, even if the source lacks the key
  too: the scope is a hard boundary, and a kept last copy could hold a key no longer
  exported), and what it held there follows onRevoke, as when consent is withdrawn.
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
- AMBIGUOUS_EMPTY_SCOPE: a grant without keys where the producer's scope leaves none of the
  source's keys (a blank export-keys, `keys: []`, or a scope naming only keys the source
  lacks): "copies exactly those keys" (a copy holding no key, Opaque), or "no key leaves"
  read as nothing written there (what stood there follows onRevoke)?
- AMBIGUOUS_UNEXPORTED_SENIOR: the oldest grant aiming here names a key the producer does not
  export here: KeyNotExported is "like Denied" (the producer does not consent to it, so it
  does not aim and a younger grant may win), or it still aims at the same copy and blocks a
  younger grant as an older grant with a missing key does? (Its own copy follows onRevoke
  either way.)
- A Secret that is not a source (a copy of another grant, a squatter) at the key an export
  names is, by the words, "an unlabelled source an export names": projected as any source,
  its content what that place may hold (`World.contents`); the oracle follows where copies
  may stand, place by place (`reach`).
- AMBIGUOUS_COPY_AS_SOURCE: that Secret carries projector's mark (a copy, or a squatter
  dressed as one): projected on as any source an export names, or refused as a source (like
  a token type: nothing projected, what was follows onRevoke)? Before exports a copy could
  never be a source (it cannot carry the export label); an export beside a copy would let
  the receiving namespace pass on what the producer consented to send there only.

Not modelled (other tests' subject): ConfigMap sources, a grant's extra labels and
annotations, the producer's Warning Events and an export's status.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
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
AMBIGUOUS_EMPTY_SCOPE = "ambiguous: a grant without keys, no key of the source in scope"
AMBIGUOUS_UNEXPORTED_SENIOR = "ambiguous: the oldest grant aiming here names an unexported key"
AMBIGUOUS_COPY_AS_SOURCE = "ambiguous: an export names a Secret carrying projector's mark"

EMPTY_COPY, EMPTY_NOTHING = "a copy holding no key", "nothing written"
"""The two readings of AMBIGUOUS_EMPTY_SCOPE (`World.empty_scope`)."""


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
    export_keys: str | None = None
    """The `export-keys` annotation as written (None: absent, every key)."""
    marked: bool = False
    """It carries projector's mark (a copy, or a Secret dressed as one): see
    AMBIGUOUS_COPY_AS_SOURCE."""

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class Export:
    """A ProjectionExport: the Secret `source` of its own namespace may go `to` these
    namespaces (names, globs, `*`), with only `keys` (None: every key)."""

    namespace: str
    name: str
    source: str
    to: tuple[str, ...]
    keys: tuple[str, ...] | None = None

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def source_key(self) -> Key:
        return (self.namespace, self.source)


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
    exports: Mapping[Key, Export] = field(default_factory=dict)
    """ProjectionExports by (namespace, name)."""
    dying_exports: frozenset[Key] = frozenset()
    """Exports in a terminating namespace: there or not, as a dying source."""
    contents: Mapping[Key, frozenset[tuple[Data, str]]] = field(default_factory=dict)
    """What a Secret that is not a source may hold at a key of `others` ((data, type) each):
    it matters where an export names that key, which makes it a source like any other."""
    empty_scope: str = EMPTY_COPY
    """The reading of AMBIGUOUS_EMPTY_SCOPE this world takes (`resolutions` tries both)."""
    marked: frozenset[Key] = frozenset()
    """Squatters carrying projector's mark (dressed as copies)."""
    refuse_marked: bool = False
    """The reading of AMBIGUOUS_COPY_AS_SOURCE this world takes (`resolutions` tries both)."""
    stand_ins: frozenset[Key] = frozenset()
    """Sources a resolution made of a copy that stands at a key a grant names: a Secret as
    far as that grant is concerned, but, at its own place, that place's state (its grant may
    still rewrite or delete it), not a foreign object."""

    def occupied(self, place: Key) -> bool:
        """A Secret that is not a copy stands there: no copy can."""
        return place in self.squatters or (place in self.sources and place not in self.stand_ins)

    def grant_by_uid(self, uid: str) -> Grant | None:
        return next((g for g in self.grants.values() if g.uid == uid), None)


# --- the producer's consent ----------------------------------------------------------------------

_VALID_ENTRY = re.compile(r"[a-z0-9*?\[][a-z0-9*?\[\]-]*")


def _audience(entries: Sequence[str], namespace: str) -> bool:
    """One entry (a name or a glob; `*` any) matches; past 32 globs, nobody."""
    entries = [e for e in entries if e]
    if sum(1 for e in entries if any(c in e for c in "*?[")) > MAX_GLOBS:
        return False
    return any(
        _VALID_ENTRY.fullmatch(e) is not None and fnmatch.fnmatchcase(namespace, e) for e in entries
    )


def _entries(value: str) -> list[str] | None:
    """A comma-separated annotation's entries, or None past its bounds (256, 16 KiB)."""
    entries = [e.strip() for e in value.split(",")]
    if len(value) > MAX_CHARS or len(entries) > MAX_ENTRIES:
        return None
    return entries


def producer_allows(source: Source, namespace: str) -> bool:
    """The label path: the label, then one export-to entry matching (missing, empty or
    oversized: nobody)."""
    if source.export_label != "true" or not source.export_to:
        return False
    entries = _entries(source.export_to)
    return entries is not None and _audience(entries, namespace)


Scope = frozenset[str] | None
"""The keys that may leave; None: every key."""


def label_scope(source: Source) -> Scope:
    """The label path's keys: export-keys (absent: every key; blank or oversized: none)."""
    if source.export_keys is None:
        return None
    entries = _entries(source.export_keys)
    return frozenset(e for e in entries or () if e)


def export_allows(export: Export, namespace: str) -> bool:
    """An export's `to` matches (past 256 entries or 32 globs it consents to nothing)."""
    return len(export.to) <= MAX_ENTRIES and _audience([e.strip() for e in export.to], namespace)


def exports_of(world: World, key: Key) -> list[Export]:
    """The exports naming the source `key` (each in the source's own namespace)."""
    return [e for _, e in sorted(world.exports.items()) if e.source_key == key]


def scopes(world: World, source: Source, namespace: str) -> list[Scope]:
    """The key scope of each consent the producer gives in `namespace` (none: no consent)."""
    out: list[Scope] = []
    if producer_allows(source, namespace):
        out.append(label_scope(source))
    for e in exports_of(world, source.key):
        if export_allows(e, namespace):
            out.append(None if e.keys is None else frozenset(e.keys))
    return out


def union(found: Sequence[Scope]) -> Scope:
    """The keys any of these consents lets leave."""
    if any(s is None for s in found):
        return None
    return frozenset().union(*(s for s in found if s is not None))


def producer_consents(world: World, source: Source, namespace: str) -> bool:
    """The label path, or any export of the source, lets a copy into `namespace`."""
    return bool(scopes(world, source, namespace))


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
    return (
        source is not None
        and admin_targets(grant, ns)
        and producer_consents(world, source, namespace)
    )


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
KEY_NOT_EXPORTED = "KeyNotExported"
NO_KEY = "NoKeyInScope"
"""AMBIGUOUS_EMPTY_SCOPE read as nothing written (`EMPTY_NOTHING`)."""
WRITES_NOTHING = frozenset({REFUSED, KEY_NOT_EXPORTED, NO_KEY})
"""Why a grant writes nothing at a place it aims at, and what it held there follows onRevoke."""


def key_scope(world: World, source: Source, namespace: str) -> Scope:
    """The keys a copy of `source` may hold in `namespace` (every key if nobody consents
    there: the question is then moot)."""
    found = scopes(world, source, namespace)
    return union(found) if found else None


def empty_scoped(world: World, grant: Grant, namespace: str) -> bool:
    """AMBIGUOUS_EMPTY_SCOPE arises for this grant there: no keys of its own, a producer's
    scope that leaves none of the source's keys."""
    source = world.sources.get(grant.source)
    if grant.keys is not None or source is None or not source.data:
        return False
    scope = key_scope(world, source, namespace)
    return scope is not None and not scope & {k for k, _ in source.data}


def projection(world: World, grant: Grant, namespace: str) -> Copy | str:
    """The copy the grant writes into `namespace`, or why it writes none (KEY_MISSING, and
    WRITES_NOTHING: REFUSED, KEY_NOT_EXPORTED, NO_KEY)."""
    source = world.sources[grant.source]
    if source.type in REFUSED_TYPES or (source.marked and world.refuse_marked):
        return REFUSED
    data = dict(source.data)
    scope = key_scope(world, source, namespace)
    if grant.keys is None:
        out = {k: v for k, v in data.items() if scope is None or k in scope}
        if data and not out and world.empty_scope == EMPTY_NOTHING:
            return NO_KEY
        whole = len(out) == len(data)
    else:
        if scope is not None and any(f not in scope for f, _ in grant.keys):
            return KEY_NOT_EXPORTED
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
    if any(empty_scoped(world, g, place[0]) for g in aiming):
        notes.add(AMBIGUOUS_EMPTY_SCOPE)
    if world.refuse_marked and any(world.sources[g.source].marked for g in aiming):
        notes.add(AMBIGUOUS_COPY_AS_SOURCE)
    winners: list[Grant | None] = [*aiming[:1]]

    senior = projection(world, aiming[0], place[0]) if aiming else None
    if senior in WRITES_NOTHING and len(aiming) > 1:
        notes.add(AMBIGUOUS_REFUSED_SENIOR if senior == REFUSED else AMBIGUOUS_UNEXPORTED_SENIOR)
        serving = [g for g in aiming if projection(world, g, place[0]) not in WRITES_NOTHING]
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
    served = projection(world, winner, place[0]) if winner is not None else None
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
        own = projection(world, owner, place[0])
        if winner is not None and owner.uid == winner.uid:
            if isinstance(own, Copy):
                return {own}
            if own == KEY_MISSING:
                return {state}  # the last copy is kept
            # refused, or a key not exported here: follows onRevoke
            return _revoked(state, owner, ON_REVOKE, notes)
        # A younger grant's copy where an older one aims: the older takes it (if it has
        # something to write), and the younger gives it up if it writes nothing here.
        # Two actors: the place rests only if neither moves it.
        moves: set[State] = {served} if isinstance(served, Copy) else set()
        if own in WRITES_NOTHING:
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
    places (the grant's copies follow onRevoke, not onSourceDeleted), or, where an export
    names that key, is projected with what the copy holds. So each world learns where a copy
    may now stand (`World.others`) and what it may hold (`World.contents`), and the places
    are explored again, until nothing new is reachable.
    """
    worlds = list(worlds)
    reached = dict(possible)
    while True:
        reached = {place: reachable(worlds, place, states) for place, states in reached.items()}
        held = {
            p: frozenset((s.data, s.type) for s in states if s is not None)
            for p, states in reached.items()
        }
        held = {p: h for p, h in held.items() if h}
        emptied = {p for p, states in reached.items() if ABSENT in states}
        wider = [_widened(w, held, emptied) for w in worlds]
        if wider == worlds:
            return worlds, reached
        worlds = wider


def _widened(
    world: World, held: Mapping[Key, frozenset[tuple[Data, str]]], emptied: AbstractSet[Key]
) -> World:
    """The world, knowing that a copy may stand at each key of `held`, holding one of those,
    and that the copies at the keys of `emptied` may be gone (a squatter stays certain)."""
    new = {k for k in held if k not in world.others}
    grown = {k for k, h in held.items() if not h <= world.contents.get(k, frozenset())}
    unsure = {k for k, v in world.others.items() if v and k in emptied and k not in world.squatters}
    if not new and not grown and not unsure:
        return world
    contents = {
        **world.contents,
        **{k: world.contents.get(k, frozenset()) | held[k] for k in grown},
    }
    others = {**dict.fromkeys(new), **world.others, **dict.fromkeys(unsure)}
    return replace(world, others=others, contents=contents)


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
                    copy = projection(w, grant, namespace)
                    if isinstance(copy, Copy):
                        yield place, copy.visible()


def resolutions(world: World) -> Iterator[World]:
    """The world under each reading of its uncertain keys (those some grant names), and of
    AMBIGUOUS_EMPTY_SCOPE where it arises.

    A source key where a Secret that is not a source may stand is, in one reading, a Secret
    without the export label (holding what `World.contents` says it may, if an export names
    it), and in the other, nothing (a deleted source). A dying source (its namespace
    terminating) is, in one reading, still there, and in the other, deleted; so is a dying
    export.
    """
    for resolved in _resolved(world):
        named = {g.source for g in resolved.grants.values()}
        marked = any(s.marked and s.key in named for s in resolved.sources.values())
        for w in (resolved, replace(resolved, refuse_marked=True)) if marked else (resolved,):
            yield w
            if any(empty_scoped(w, g, n) for g in w.grants.values() for n in w.namespaces):
                yield replace(w, empty_scope=EMPTY_NOTHING)


def _resolved(world: World) -> Iterator[World]:
    if not world.others and not world.dying and not world.dying_exports:
        yield world
        return
    named = {g.source for g in world.grants.values()}
    exported = {e.source_key for e in world.exports.values()}
    maybe = [k for k in sorted(named - set(world.sources)) if k in world.others]
    uncertain = [k for k in maybe if world.others[k] is None]
    dying = [k for k in sorted(named & set(world.sources)) if k in world.dying]
    dying_exports = [k for k in sorted(world.dying_exports) if world.exports[k].source_key in named]

    def held(k: Key) -> list[Source]:
        contents = world.contents.get(k, frozenset()) if k in exported else frozenset()
        marked = k in world.marked or k not in world.squatters  # a dressed squatter, a copy
        return [Source(*k, d, t, None, marked=marked) for d, t in sorted(contents)] or [
            Source(*k, export_label=None, marked=marked)
        ]

    for present in itertools.product((False, True), repeat=len(uncertain)):
        here = {k for k, p in zip(uncertain, present, strict=True) if p}
        chosen = [k for k in maybe if world.others[k] or k in here]
        for found in itertools.product(*(held(k) for k in chosen)):
            sources = {**world.sources, **{s.key: s for s in found}}
            stand_ins = frozenset(k for k in chosen if k not in world.squatters)
            for gone in itertools.product((False, True), repeat=len(dying) + len(dying_exports)):
                fate = dict(
                    zip(
                        [("source", k) for k in dying] + [("export", k) for k in dying_exports],
                        gone,
                        strict=True,
                    )
                )
                left = {k: v for k, v in sources.items() if not fate.get(("source", k))}
                exports = {k: e for k, e in world.exports.items() if not fate.get(("export", k))}
                yield replace(
                    world,
                    sources=left,
                    exports=exports,
                    others={},
                    dying=frozenset(),
                    dying_exports=frozenset(),
                    contents={},
                    marked=frozenset(),
                    stand_ins=stand_ins,
                )


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

"""The pure core: from a snapshot of the cluster to a plan of what to do in each namespace.

No I/O and no asyncio here: `plan()` is a function of immutable values, and `decide` is the
per-namespace decision of DESIGN §3, one branch per row of its table, so every row is decided
in one place that unit tests can drive exhaustively. Who may act on a copy (`claim`, `policy`)
and who may receive one (`consent`) are `ownership`'s; the copy itself is `desired`'s; the
values a plan reads and yields are `plans`'.

Work is keyed by grant name, not by (grant, namespace): the copy's content and its hash are the
same in every namespace, so they are computed once per grant and each namespace then costs a
few dict lookups (see `benchmarks/`); the writes a plan yields run concurrently in the writer.
A grant name with no live grant behind it still gets a plan: it revokes what that name left.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from projector.core.desired import Desired, desired_copy, unexported_key
from projector.core.model import Copy, Grant, HashKey, Namespace, ObjectKey, Source
from projector.core.ownership import (
    Claim,
    Consent,
    claim,
    consent_scope,
    may_write,
    policy,
    wants,
)
from projector.core.plans import (
    ORPHAN_DELETED,
    ORPHAN_MESSAGE,
    Action,
    Plan,
    Reason,
    Snapshot,
    SourceState,
    Step,
    conflict_message,
)

_NO_LABELS: Mapping[str, str] = MappingProxyType({})


Scope = frozenset[str] | None
"""The keys the producer lets leave into a namespace (None: every key): `exports.consented`."""


@dataclass(frozen=True, slots=True)
class Offer:
    """What the grant's source offers this reconcile under one key scope.

    Read once per scope, however many namespaces share it (`scoped`): most grants meet one.
    """

    state: SourceState
    source: Source | None
    """The source, only when it is AVAILABLE."""
    desired: Desired | None
    """The copy to write, unless the source is not available or lacks a key."""
    missing_key: str = ""
    """The first granted key the source lacks."""
    refused_key: str = ""
    """The first granted key the producer's key scope does not let leave: nothing is written."""
    grant: Grant | None = None
    hash_key: HashKey | None = None
    variants: dict[Scope, Offer] = field(default_factory=dict, repr=False, compare=False)

    def scoped(self, keys: Scope) -> Offer:
        """The offer where the producer lets `keys` leave (built once per scope)."""
        if self.source is None or self.grant is None:
            return self
        got = self.variants.get(keys)
        if got is None:
            got = self.variants[keys] = _build(self.state, self.source, self.grant, keys, self)
        return got


def offer(snap: Snapshot, grant: Grant, hash_key: HashKey | None = None) -> Offer:
    """Read the source once for every namespace; an inconsistent snapshot is uncertainty."""
    state = snap.source_state
    if state is SourceState.AVAILABLE and snap.source is None:
        state = SourceState.UNKNOWN  # an inconsistent snapshot is uncertainty, not absence
    if state is SourceState.AVAILABLE and snap.source is not None and snap.source.refused:
        state = SourceState.REFUSED  # never projected, whatever both consents say
    source = snap.source if state is SourceState.AVAILABLE else None
    if source is None:
        return Offer(state, None, None)
    return Offer(state, source, None, grant=grant, hash_key=hash_key)


def _build(state: SourceState, source: Source, grant: Grant, keys: Scope, base: Offer) -> Offer:
    hash_key, variants = base.hash_key, base.variants
    if refused := unexported_key(grant, keys):
        return Offer(state, source, None, "", refused, grant, hash_key, variants)
    built = desired_copy(grant, source, hash_key, keys)
    if isinstance(built, Desired):
        return Offer(state, source, built, "", "", grant, hash_key, variants)
    return Offer(state, source, None, built, "", grant, hash_key, variants)


def plan(snap: Snapshot, hash_key: HashKey | None = None) -> Plan:
    """Decide, for every namespace touched by a grant name, what to write and why.

    `hash_key` signs the copies' content-hash annotation (the controller always has one; None:
    the unkeyed hash, for `projector explain`, see `desired`).
    """
    grant = snap.grant
    # Copies this grant name may act on wherever they are: its own, and orphans of its name.
    held = {k: c for k, c in snap.copies.items() if claim(snap, c) is not Claim.FOREIGN}

    if grant is None or grant.deleting:  # "grant deleted": copies handled by onRevoke
        gone = tuple(_revoke(snap, c, Reason.REVOKED) for c in held.values())
        return Plan(snap, snap.source_state, None, gone, 0)

    got = offer(snap, grant, hash_key)
    candidates = set(grant.namespaces)
    if grant.selector is not None:
        candidates.update(n for n, ns in snap.namespaces.items() if grant.targets(n, ns.labels))
    steps: list[Step] = []
    handled: set[ObjectKey] = set()
    matched = 0
    lookup, target, kind = snap.copies, grant.target_name, grant.kind
    home = grant.source.namespace
    for name in sorted(candidates):  # the hot loop: locals only, no work that can be hoisted
        key = ObjectKey(name, target, kind)
        existing = lookup.get(key)
        mine = existing if existing is not None and key in held else None
        if mine is not None:
            handled.add(key)  # decide() settles it: every branch that refuses revokes it
        step = decide(snap, grant, got, name, existing, mine)
        if step is not None:
            steps.append(step)
            matched += name != home  # the source's own namespace is never a target

    # "a namespace stops being targeted": what the grant name holds where it no longer aims.
    steps.extend(_unwanted(snap, got, c) for k, c in held.items() if k not in handled)
    return Plan(snap, got.state, _most_held(steps), tuple(steps), matched)


def _most_held(steps: list[Step]) -> Desired | None:
    """The copy most namespaces should hold: the one a grant of one key scope writes everywhere.

    Its writes' echoes are told by it (`Controller._want`).
    """
    held = {id(s.desired): s.desired for s in steps if s.desired is not None}
    counts = Counter(id(s.desired) for s in steps if s.desired is not None)
    return held[counts.most_common(1)[0][0]] if counts else None


def decide(
    snap: Snapshot, grant: Grant, got: Offer, name: str, existing: Copy | None, mine: Copy | None
) -> Step | None:
    """One namespace the grant aims at: the rows of DESIGN §3, one branch each, in order.

    `existing` is the Secret at the copy's place, `mine` the same if this grant name may act
    on it. None: the source's own namespace, merely selected (nothing to report).
    """
    ns = snap.namespaces.get(name)
    exports = snap.exports_of(grant.source)
    labels = ns.labels if ns is not None else _NO_LABELS
    verdict, said = consent_scope(grant, got.source, name, labels, exports)
    target = grant.target_name
    # "source namespace == target namespace with the same name": refused; condition, no write.
    # A copy the grant holds there (its source moved into that namespace) is no longer wanted:
    # it follows onRevoke, as in any namespace the grant stops targeting.
    if verdict is Consent.SOURCE_NAMESPACE:
        if mine is not None:
            gone = _unwanted(snap, got, mine)
            if gone.action is Action.DELETE or name not in grant.namespaces:
                return gone
        if name not in grant.namespaces:
            return None
        why = "the source's own namespace is never a target"
        return Step(name, Action.NOOP, Reason.SOURCE_NAMESPACE, mine, target, why)
    # "target in a protected namespace": refused with a reason, never written; a copy held
    # there from before follows onRevoke
    if name in snap.protected:
        if mine is not None and (gone := _unwanted(snap, got, mine)).action is Action.DELETE:
            return gone
        why = "a protected namespace is never a target"
        return Step(name, Action.NOOP, Reason.PROTECTED_NAMESPACE, mine, target, why)
    # "new namespace created that matches the selector": copy created there, once it exists
    if ns is None:
        why = "the namespace does not exist; a copy follows when it is created"
        return Step(name, Action.NOOP, Reason.NAMESPACE_MISSING, name=target, message=why)
    # "target namespace is terminating": skipped quietly; copy goes with the namespace
    if ns.terminating:
        return Step(name, Action.NOOP, Reason.TERMINATING, existing, target)
    # "API server unreachable, watch broken, cache not yet synced": no deletes
    if got.state is SourceState.UNKNOWN:
        return Step(name, Action.NOOP, Reason.SOURCE_UNKNOWN, existing, target)
    # "source deleted": copies handled by onSourceDeleted
    if got.state is SourceState.MISSING:
        return _withdraw(snap, name, target, mine, Reason.SOURCE_MISSING)
    # "source of type service-account-token or bootstrap token": refused, never written; what
    # was projected from it before follows onRevoke, as when the producer withdraws
    if got.state is SourceState.REFUSED:
        return _withdraw(snap, name, target, mine, Reason.DENIED)
    # "source has no export-to, or it does not match a target namespace" and "source loses the
    # export label, or export-to stops matching": copies there handled by onRevoke; Denied
    if verdict is not Consent.GRANTED:
        return _withdraw(snap, name, target, mine, Reason.DENIED)
    # the producer's key scope here: the keys its consenting label or exports let leave
    got = got.scoped(said.keys if said is not None else None)
    # "export-keys scopes keys": a grant naming another key writes nothing there, the key named;
    # what it held there follows onRevoke, as when the producer withdraws
    if got.refused_key:
        why = f"the producer does not export key {got.refused_key!r}"
        return _withdraw(snap, name, target, mine, Reason.KEY_NOT_EXPORTED, why)
    # "a copy orphaned while the controller was down": handled by the policy it was created under
    if mine is not None and mine.grant_uid != grant.uid and claim(snap, mine, ns) is Claim.ORPHAN:
        return _orphaned(snap, mine, _serve(snap, got.desired, got.missing_key, ns, None))
    # "grant + opted-in source + target namespace exists": copy created (or updated, restored,
    # replaced; left alone if the name is taken by an object that is not ours)
    return _serve(snap, got.desired, got.missing_key, ns, existing)


def _senior_rival(snap: Snapshot, grant: Grant, ns: Namespace) -> Grant | None:
    """The oldest other grant that also wants this grant's copy in `ns`, if older than us."""
    best: Grant | None = None
    for rival in snap.rivals:
        if rival.seniority >= grant.seniority or rival.deleting:
            continue
        if wants(
            rival, snap.rival_sources.get(rival.source), ns, snap.exports_of(rival.source)
        ) and (best is None or rival.seniority < best.seniority):
            best = rival
    return best


def _unwanted(snap: Snapshot, got: Offer, copy: Copy) -> Step:
    """A copy the live grant holds where it no longer aims: it follows onRevoke.

    Not while the source is unreadable: no delete on uncertainty.
    """
    if got.state is SourceState.UNKNOWN:
        return Step(copy.key.namespace, Action.NOOP, Reason.SOURCE_UNKNOWN, copy, copy.key.name)
    return _revoke(snap, copy, Reason.REVOKED)


def _revoke(snap: Snapshot, copy: Copy, reason: Reason) -> Step:
    """Handle a copy that is no longer wanted where it is, by the policy it falls under."""
    if copy.deleting:
        return Step(copy.key.namespace, Action.NOOP, Reason.COPY_DELETING, copy, copy.key.name)
    if policy(snap, copy, reason).value == "Delete":
        return Step(copy.key.namespace, Action.DELETE, reason, copy, copy.key.name)
    return Step(copy.key.namespace, Action.NOOP, Reason.RETAINED, copy, copy.key.name)


def _withdraw(
    snap: Snapshot, ns: str, name: str, held: Copy | None, reason: Reason, why: str = ""
) -> Step:
    """A namespace the grant does not serve: what it holds there follows `policy`.

    Kept, the namespace still reports why it is not served (denied, source missing); an
    orphan deleted here is deleted because its own grant was revoked.
    """
    if held is not None:
        own = snap.grant is not None and held.grant_uid == snap.grant.uid
        step = _revoke(snap, held, reason if own else Reason.REVOKED)
        if step.action is Action.DELETE:
            return step
    return Step(ns, Action.NOOP, reason, held, name, why)


def _orphaned(snap: Snapshot, orphan: Copy, then: Step) -> Step:
    """An earlier grant's copy where this grant wants its own, by the policy recorded on it.

    Delete: it goes, replaced by this grant's copy when `then` (the step for a free place)
    creates one. Retain: it stays, a conflict the admin settles.
    """
    gone = _revoke(snap, orphan, Reason.REVOKED)
    if gone.reason is Reason.RETAINED:
        return Step(then.namespace, Action.NOOP, Reason.CONFLICT, orphan, then.name, ORPHAN_MESSAGE)
    if gone.action is Action.DELETE and then.action is Action.CREATE:
        return Step(
            then.namespace,
            Action.REPLACE,
            Reason.PROJECTED,
            orphan,
            then.name,
            ORPHAN_DELETED,
            then.desired,
        )
    return gone


def _serve(
    snap: Snapshot, desired: Desired | None, missing_key: str, ns: Namespace, existing: Copy | None
) -> Step:
    """A namespace both consents grant: converge, unless a key or the place is missing."""
    grant = snap.grant
    assert grant is not None, "only a live grant serves namespaces"
    if desired is None:
        return Step(
            ns.name,
            Action.NOOP,
            Reason.KEY_MISSING,
            existing,
            grant.target_name,
            message=f"source has no key {missing_key!r}; last copy kept",
        )
    rival = _senior_rival(snap, grant, ns) if snap.rivals else None
    if rival is not None:
        return Step(
            ns.name,
            Action.NOOP,
            Reason.GRANT_CONFLICT,
            existing,
            desired.name,
            message=f"older grant {rival.name} projects to the same Secret",
        )
    return _converge(snap, desired, ns, existing)


def _converge(snap: Snapshot, desired: Desired, ns: Namespace, existing: Copy | None) -> Step:
    """Bring the copy in one wanted namespace to the desired content, if `claim` says we may."""
    name = desired.name
    if existing is None:
        return Step(ns.name, Action.CREATE, Reason.PROJECTED, None, name, desired=desired)
    if not may_write(snap, existing, ns):
        why = conflict_message(desired.kind)
        return Step(ns.name, Action.NOOP, Reason.CONFLICT, existing, name, why)
    if existing.deleting:
        return Step(ns.name, Action.NOOP, Reason.COPY_DELETING, existing, name)
    in_sync = desired.in_sync(existing)
    if existing.type != desired.type or (existing.immutable and not in_sync):
        return Step(
            ns.name,
            Action.REPLACE,
            Reason.PROJECTED,
            existing,
            name,
            message=f"type {existing.type} -> {desired.type}"
            if existing.type != desired.type
            else "the copy was made immutable",
            desired=desired,
        )
    action = Action.NOOP if in_sync else Action.UPDATE
    return Step(ns.name, action, Reason.PROJECTED, existing, name, desired=desired)

"""Why a Secret is (or is not) in a namespace, from the same `plan()` the controller runs.

Pure: it reads a `reconcile.Plan` taken on a one-shot snapshot (`store.Store.load`) and says, per
namespace, one of these states, with the reason code and the consent or object behind it:

| state | meaning |
|---|---|
| projected | the copy is there and in sync |
| pending | the controller would write now (create, update, replace, delete) or waits |
| denied | a consent is missing: no grant target, no export label, or export-to does not match |
| conflicted | another object holds the target name: a foreign Secret, or an older grant |
| terminating | the namespace is being deleted; the copy goes with it |
| retained | not wanted any more; kept by the policy `Retain` |
| refused | the source's own namespace, never a target |
| unknown | the source could not be read; nothing is decided on uncertainty |

Nothing here ever reads a Secret's data: the output holds names, labels and reasons only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from projector.core.exports import Export, consented
from projector.core.model import (
    EXPORT_LABEL,
    EXPORT_TO_ANNOTATION,
    Copy,
    Namespace,
    SourceKind,
    parse_copy,
)
from projector.core.ownership import Claim, Consent, claim, consent
from projector.core.plans import Action, Plan, Reason, SourceState, Step

_PENDING = {
    Action.CREATE: "the controller creates the copy",
    Action.UPDATE: "the copy differs from the source; the controller updates it",
    Action.REPLACE: "the controller replaces the copy",
    Action.DELETE: "the copy is no longer wanted; the controller deletes it",
}


@dataclass(frozen=True, slots=True)
class Entry:
    """One namespace's state for one grant."""

    namespace: str
    state: str
    reason: str
    why: str
    secret: str = ""
    """The copy's place, namespace/name (a Secret, or a ConfigMap for a ConfigMap grant)."""


@dataclass(frozen=True, slots=True)
class GrantReport:
    """One grant, its source and every namespace it touches."""

    grant: str
    source: str
    source_state: str
    target_name: str
    matched: int
    invalid: str = ""
    entries: tuple[Entry, ...] = ()
    counts: Mapping[str, int] = field(default_factory=dict)
    kind: str = SourceKind.SECRET.value
    """What the source and its copies are: Secret or ConfigMap."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self) | {"counts": dict(self.counts)}


def _verdict(plan: Plan, namespace: str, ns: Namespace | None = None) -> Consent:
    """The controller's own consent rule, on the snapshot the plan was made on."""
    snap, grant = plan.snapshot, plan.grant
    assert grant is not None, "only a live grant's namespaces are explained"
    ns = ns or snap.namespaces.get(namespace)
    source = snap.source if plan.source_state is SourceState.AVAILABLE else None
    labels = ns.labels if ns is not None else {}
    return consent(grant, source, namespace, labels, snap.exports_of(grant.source))


def _consented_by(plan: Plan, namespace: str) -> str:
    """Which of the producer's consents lets the copy in: the label, or which exports."""
    snap = plan.snapshot
    source = snap.source
    exports = snap.exports_of(source.key) if source is not None else ()
    got = consented(source, exports, namespace)
    if got is None:
        return "no producer consent"
    keys = "every key" if got.keys is None else "keys " + ", ".join(sorted(got.keys))
    return f"producer consent by {' and '.join(got.via)} ({keys})"


def _denied_why(plan: Plan, namespace: str) -> str:
    source = plan.snapshot.source
    if plan.source_state is SourceState.REFUSED and source is not None:
        return f"refused: {source.refused}"
    verdict = _verdict(plan, namespace)
    if verdict is Consent.NOT_EXPORTED or source is None:
        return (
            f"producer consent missing: the source has no label {EXPORT_LABEL}=true "
            "and no ProjectionExport names it"
        )
    if verdict is not Consent.EXPORT_TO_MISMATCH:
        return f"consent: {verdict.value}"
    exports = plan.snapshot.exports_of(source.key)
    if exports:
        names = ", ".join(str(e) for e in exports[:5])
        own = "" if source.labelled else " (the source has no export label)"
        return f"producer consent missing: no `to` of the exports {names} matches{own}"
    if source.export_to_refused:
        return f"producer consent missing: {source.export_to_refused} (a bound on hostile input)"
    if not source.export_to and not source.ignored_export_to:
        return (
            f"producer consent missing: the source has no {EXPORT_TO_ANNOTATION} annotation "
            "(missing or empty means nobody)"
        )
    allowed = ",".join(source.export_to + source.ignored_export_to)
    return (
        f"producer consent missing: {EXPORT_TO_ANNOTATION}={allowed!r} does not match {namespace}"
    )


def _holder_why(plan: Plan, holder: Copy, grants_by_uid: Mapping[str, str]) -> str:
    """Who holds the target name, by the controller's own ownership rule (`reconcile.claim`)."""
    where = f"{holder.key.kind.value} {holder.key.namespace}/{holder.key.name}"
    held = claim(plan.snapshot, holder, plan.snapshot.namespaces.get(holder.key.namespace))
    if held is Claim.ORPHAN:
        return (
            f"{where} was left by an earlier grant of this name for another source; "
            "it is kept by the policy recorded on it (delete it to let this grant project)"
        )
    owner = grants_by_uid.get(holder.grant_uid or "")
    if owner:
        return f"{where} belongs to grant {owner}"
    return f"{where} exists and is not owned by this grant"


def _conflict_why(plan: Plan, step: Step, grants_by_uid: Mapping[str, str]) -> str:
    if step.reason is Reason.GRANT_CONFLICT:
        return step.message or f"an older grant projects to {step.namespace}/{step.name}"
    if step.existing is not None:
        return _holder_why(plan, step.existing, grants_by_uid)
    kind = plan.grant.kind.value if plan.grant is not None else SourceKind.SECRET.value
    return f"{kind} {step.namespace}/{step.name} exists and is not owned by this grant"


def entry(
    plan: Plan,
    step: Step,
    grants_by_uid: Mapping[str, str],
    blockers: Mapping[str, Mapping[str, Any]] | None = None,
) -> Entry:
    """The state of one planned namespace.

    `blockers` holds, by namespace, the metadata of a Secret found (by a read after planning)
    where the plan would create a copy: the controller caches only its own copies, so such a
    Secret shows up to it as a Conflict at write time; explain names it at once.
    """
    r, a, ns = step.reason, step.action, step.namespace
    secret = f"{ns}/{step.name}" if step.name else ""

    def e(state: str, why: str) -> Entry:
        return Entry(ns, state, r.value, why, secret)

    blocker = (blockers or {}).get(ns)
    if a is Action.CREATE and blocker is not None:
        meta = {**blocker, "namespace": ns, "name": step.name}
        held = parse_copy({"metadata": meta}, kind_of(plan))
        why = _holder_why(plan, held, grants_by_uid)
        return Entry(ns, "conflicted", Reason.CONFLICT.value, why, secret)
    if a is not Action.NOOP:
        why = _PENDING[a] + (f" ({step.message})" if step.message else "")
        return e("pending", f"{why}; {_consented_by(plan, ns)}" if r is Reason.PROJECTED else why)
    if r is Reason.PROJECTED:
        return e("projected", f"the copy is in sync with the source; {_consented_by(plan, ns)}")
    if r is Reason.DENIED:
        return e("denied", _denied_why(plan, ns))
    if r in (Reason.CONFLICT, Reason.GRANT_CONFLICT):
        return e("conflicted", _conflict_why(plan, step, grants_by_uid))
    if r is Reason.TERMINATING:
        return e("terminating", "the namespace is being deleted; nothing is written there")
    if r is Reason.NAMESPACE_MISSING:
        return e("pending", "the namespace does not exist; a copy follows when it is created")
    if r is Reason.SOURCE_NAMESPACE:
        return e("refused", "the source's own namespace is never a target")
    if r is Reason.PROTECTED_NAMESPACE:
        return e("refused", "a protected namespace is never a target (--protected-namespaces)")
    if r is Reason.RETAINED:
        return e("retained", "no longer wanted here; kept by the policy Retain")
    if r is Reason.SOURCE_MISSING:
        kept = "the last copy is kept" if step.existing is not None else "no copy"
        return e("pending", f"the source {kind_of(plan).value} does not exist ({kept})")
    if r is Reason.KEY_NOT_EXPORTED:
        return e("refused", step.message or "a key the grant names is not exported")
    if r is Reason.KEY_MISSING:
        return e("pending", step.message or "a key the grant names is missing from the source")
    if r is Reason.COPY_DELETING:
        return e("pending", "the copy is being deleted; it is re-created after")
    if r is Reason.SOURCE_UNKNOWN:
        return e("unknown", "the source could not be read; nothing is decided on uncertainty")
    return e("pending", step.message or r.value)


def not_targeted(plan: Plan, namespace: str, ns: Namespace | None) -> Entry:
    """A namespace the plan does not cover: the admin's consent (or the source's own namespace)."""
    if _verdict(plan, namespace, ns) is Consent.SOURCE_NAMESPACE:
        return Entry(
            namespace, "refused", Reason.SOURCE_NAMESPACE.value, "the source's own namespace"
        )
    if ns is None:
        why = "admin consent missing: no such namespace, and the grant does not list it"
    else:
        why = (
            "admin consent missing: no grant target (not in spec.target.namespaces, "
            "and spec.target.namespaceSelector does not match its labels)"
        )
    return Entry(namespace, "denied", Consent.NOT_TARGETED.value, why)


def report(
    plan: Plan,
    grants_by_uid: Mapping[str, str],
    *,
    namespace: str | None = None,
    namespace_obj: Namespace | None = None,
    blockers: Mapping[str, Mapping[str, Any]] | None = None,
) -> GrantReport:
    """Everything `explain GRANT` says about one grant (or one namespace of it)."""
    snap = plan.snapshot
    record = snap.record
    grant = plan.grant
    if grant is None:
        invalid = record.invalid if record is not None and record.invalid else "no such grant"
        return GrantReport(snap.grant_name, "", "", "", 0, invalid=invalid)
    entries = [entry(plan, s, grants_by_uid, blockers) for s in plan.steps]
    if namespace is not None:
        entries = [x for x in entries if x.namespace == namespace] or [
            not_targeted(plan, namespace, namespace_obj)
        ]
    entries.sort(key=lambda x: x.namespace)
    counts: dict[str, int] = {}
    for x in entries:
        counts[x.state] = counts.get(x.state, 0) + 1
    return GrantReport(
        grant=grant.name,
        source=str(grant.source),
        source_state=plan.source_state.value,
        target_name=grant.target_name,
        matched=plan.matched,
        entries=tuple(entries),
        counts=counts,
        kind=grant.kind.value,
    )


def kind_of(plan: Plan) -> SourceKind:
    """What the plan's grant projects (a Secret for a grant that no longer exists)."""
    return plan.grant.kind if plan.grant is not None else SourceKind.SECRET


def text(reports: Iterable[GrantReport]) -> str:
    """Human-readable lines, one table per grant."""
    out: list[str] = []
    for r in reports:
        if r.invalid:
            out.append(f"grant {r.grant}: {r.invalid}")
            continue
        summary = ", ".join(f"{n} {s}" for s, n in sorted(r.counts.items())) or "nothing"
        out.append(
            f"grant {r.grant}: source {r.source} ({r.source_state}), "
            f"target {r.kind} {r.target_name!r}, {r.matched} namespace(s) targeted: {summary}"
        )
        width = max([len("NAMESPACE"), *(len(x.namespace) for x in r.entries)])
        out.append(f"  {'NAMESPACE':<{width}}  {'STATE':<11}  {'REASON':<20}  WHY")
        for x in r.entries:
            out.append(f"  {x.namespace:<{width}}  {x.state:<11}  {x.reason:<20}  {x.why}")
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class SecretReport:
    """`explain --secret NS/NAME`: the producer's opt-in, the grants of it, and the rest."""

    secret: str
    exists: bool
    exported: bool
    export_to: tuple[str, ...]
    grants: tuple[GrantReport, ...]
    untargeted: tuple[str, ...]
    """Existing namespaces export-to allows that no grant targets (the admin's say is missing)."""
    untargeted_total: int
    exports: tuple[str, ...] = ()
    """The ProjectionExports naming it (namespace/name: to, keys), the label's peers."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self) | {"grants": [g.as_dict() for g in self.grants]}


def secret_report(
    secret: str,
    *,
    exists: bool,
    exported: bool,
    export_to: tuple[str, ...],
    grants: Iterable[GrantReport],
    allowed_untargeted: Iterable[str],
    exports: Iterable[Export] = (),
    limit: int = 50,
) -> SecretReport:
    """Assemble a SecretReport; the untargeted list is cut at `limit` names (the total stays)."""
    rest = sorted(allowed_untargeted)
    told = tuple(
        f"{e}: to {','.join(e.to) or 'nobody'}"
        + ("" if e.keys is None else f"; keys {','.join(sorted(e.keys))}")
        + (f" ({e.refused})" if e.refused else "")
        for e in exports
    )
    return SecretReport(
        secret, exists, exported, export_to, tuple(grants), tuple(rest[:limit]), len(rest), told
    )


def secret_text(r: SecretReport) -> str:
    """Human-readable lines for a SecretReport."""
    if not r.exists:
        head = f"Secret {r.secret}: does not exist"
    elif not r.exported and r.exports:
        head = f"Secret {r.secret}: exported by ProjectionExport only (no label {EXPORT_LABEL})"
    elif not r.exported:
        head = f"Secret {r.secret}: not exported (no label {EXPORT_LABEL}=true): projected nowhere"
    elif not r.export_to:
        head = (
            f"Secret {r.secret}: exported, but no {EXPORT_TO_ANNOTATION} annotation: "
            "allowed to nobody"
        )
    else:
        head = f"Secret {r.secret}: exported to {','.join(r.export_to)!r}"
    lines = [head, *(f"exported by ProjectionExport {e}" for e in r.exports)]
    if not r.grants:
        lines.append("no ProjectionGrant names this Secret as its source: projected nowhere")
    else:
        lines.append(text(r.grants))
    if r.untargeted_total:
        more = r.untargeted_total - len(r.untargeted)
        names = ", ".join(r.untargeted) + (f" (and {more} more)" if more else "")
        lines.append(
            f"allowed by the producer but targeted by no grant ({r.untargeted_total}): {names}"
        )
    return "\n".join(lines)

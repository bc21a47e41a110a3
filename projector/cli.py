"""`projector validate` and `projector explain`: the operator's commands besides `run`.

`validate` is offline (grants and exports, each against its CRD's own schema and CEL rules,
`projector.core.validate`). `explain` reads the cluster once (`Store.load`: one list of each
kind, no watch), takes the same snapshot the controller would, runs the same `reconcile.plan()`
and says why each namespace is in its state (`projector.core.explain`). It needs read access
to grants, namespaces and Secrets, like a cluster admin; it never prints a Secret's value.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from projector.core import explain as explaining
from projector.core import validate as validating
from projector.core.kinds import BY_KIND, SECRETS
from projector.core.model import EXPORT_TO_ANNOTATION, ObjectKey, is_exported, parse_export_to
from projector.core.plans import Action, Plan
from projector.core.reconcile import plan
from projector.errors import NotFound, ProjectorError

if TYPE_CHECKING:  # explain only: `validate` stays offline and quick to start
    from projector.cache.store import Store
    from projector.client.kube import Kube


def _validate(args: argparse.Namespace) -> int:
    crds = validating.load_crds(args.crd or ())
    found: dict[str, int] = dict.fromkeys(crds, 0)
    files = 0
    errors: list[validating.Error] = []
    for path in validating.manifests(args.paths):
        files += 1
        counts, errs = validating.check_file(crds, path)
        for kind, n in counts.items():
            found[kind] += n
        errors += errs
    for e in errors:
        print(e)
    for w in validating.consent_warnings(args.paths):
        print(f"warning: {w}", file=sys.stderr)
    if files == 0 or (not any(found.values()) and not errors):
        print(f"projector validate: no {' or '.join(crds)} found", file=sys.stderr)
        return 1
    verdict = "ok" if not errors else f"{len(errors)} error(s)"
    counted = ", ".join(f"{n} {kind}(s)" for kind, n in found.items())
    print(f"{counted} in {files} file(s): {verdict}", file=sys.stderr)
    return 1 if errors else 0


async def _explain(args: argparse.Namespace) -> str:
    from projector.cache.probe import snapshot
    from projector.cache.store import Store
    from projector.client.kube import Kube

    kube = await Kube.connect(args.kubeconfig)
    try:
        store = Store(kube)
        await store.load()
        uids: dict[str, str] = {rec.uid: name for name, rec in store.grants.items()}
        if args.secret is None:
            snap = await snapshot(store, args.grant)
            if snap.record is None:
                raise ProjectorError(f"no ProjectionGrant named {args.grant!r}")
            ns = store.namespaces.get(args.namespace) if args.namespace else None
            p = plan(snap)
            r = explaining.report(
                p,
                uids,
                namespace=args.namespace,
                namespace_obj=ns,
                blockers=await _blockers(kube, p),
            )
            return (
                json.dumps(r.as_dict(), indent=2) if args.output == "json" else explaining.text([r])
            )
        return await _explain_secret(args, kube, store, uids)
    finally:
        await kube.close()


async def _blockers(kube: Kube, p: Plan) -> dict[str, dict[str, Any]]:
    """Metadata of the Secrets that stand where the plan would create a copy (not cached)."""
    found: dict[str, dict[str, Any]] = {}
    for step in p.steps:
        if step.action is not Action.CREATE:
            continue
        res = BY_KIND[p.grant.kind] if p.grant is not None else SECRETS
        try:
            obj = await kube.get(res, step.name, namespace=step.namespace, metadata_only=True)
        except NotFound:
            continue
        found[step.namespace] = dict(obj.get("metadata") or {})
    return found


async def _explain_secret(
    args: argparse.Namespace, kube: Kube, store: Store, uids: dict[str, str]
) -> str:
    from projector.cache.probe import snapshot

    ns_name, _, name = args.secret.partition("/")
    if not ns_name or not name:
        raise ProjectorError("--secret takes NAMESPACE/NAME")
    key = ObjectKey(ns_name, name)
    exists = True
    labels: dict[str, str] = {}
    notes: dict[str, str] = {}
    try:
        meta = (await kube.get(SECRETS, name, namespace=ns_name, metadata_only=True)).get(
            "metadata"
        ) or {}
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    except NotFound:
        exists = False
    export_to = parse_export_to(notes.get(EXPORT_TO_ANNOTATION))
    exported = is_exported(labels)
    reports = []
    targeted: set[str] = set()
    for gname, rec in sorted(store.grants.items()):
        if rec.grant is None or rec.grant.source != key:
            continue
        p = plan(await snapshot(store, gname))
        targeted |= {s.namespace for s in p.steps}
        reports.append(
            explaining.report(
                p,
                uids,
                namespace=args.namespace,
                namespace_obj=store.namespaces.get(args.namespace or ""),
            )
        )
    source = store.source(key)
    exports = store.exports_of(key)
    allowed = {
        n
        for n in store.namespaces
        if n != ns_name
        and (
            (source is not None and exported and source.exports_to(n))
            or any(e.exports_to(n) for e in exports)
        )
    } - targeted
    if args.namespace:
        allowed &= {args.namespace}
    r = explaining.secret_report(
        str(key),
        exists=exists,
        exported=exported,
        export_to=export_to,
        grants=reports,
        allowed_untargeted=allowed,
        exports=exports,
    )
    return json.dumps(r.as_dict(), indent=2) if args.output == "json" else explaining.secret_text(r)


def parser() -> argparse.ArgumentParser:
    """The flags of `validate` and `explain`."""
    p = argparse.ArgumentParser(prog="projector")
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser(
        "validate", help="check ProjectionGrant and ProjectionExport manifests offline"
    )
    v.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="files or directories")
    v.add_argument(
        "--crd",
        type=Path,
        action="append",
        help="a CRD to check its kind against instead of the packaged one (repeatable)",
    )
    e = sub.add_parser("explain", help="why a Secret is (not) projected where")
    e.add_argument("grant", nargs="?", help="a ProjectionGrant name")
    e.add_argument("--secret", metavar="NS/NAME", help="explain a source Secret instead")
    e.add_argument("-n", "--namespace", help="only this target namespace")
    e.add_argument("-o", "--output", choices=["text", "json"], default="text")
    e.add_argument("--kubeconfig", default=None)
    return p


def main(argv: Sequence[str]) -> int:
    """Run `validate` or `explain`; exit 0 on success, 1 on a finding or error, 2 on usage."""
    p = parser()
    args = p.parse_args(list(argv))
    if args.command == "validate":
        return _validate(args)
    if (args.grant is None) == (args.secret is None):
        p.error("explain takes a GRANT or --secret NS/NAME (one of them)")
    try:
        print(asyncio.run(_explain(args)))
    except ProjectorError as e:
        print(f"projector explain: {e}", file=sys.stderr)
        return 1
    return 0

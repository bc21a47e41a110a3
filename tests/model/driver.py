"""Runs model-based operations against the real API server and the real `projector run`, and
judges every observation with the oracle (tests/model/oracle.py).

The driver keeps the test's own record of what it made (namespaces, sources, grants, foreign
Secrets, each with the uid and resourceVersion its last write returned) and, per place, the set
of states the oracle allows it to be in (`possible`): since the last convergence point, the
controller may have acted on any of the worlds the operations went through, at any time, or not
at all. After every operation it lists the Secrets of every namespace of the run and checks:

- S0, transition: each place holds a state reachable from its possible set (the oracle's
  `successors`, in any world since the last convergence point, or a mix of two of them that
  the controller's caches may make, `_mixes`, plus the test's own edits);
- S1, not ours: every source, squatter and bystander the test made is there with the
  resourceVersion of the test's own last write (nothing projector does not own is modified or
  deleted), and every other Secret carries projector's grant-uid mark; every ProjectionExport
  the test made is there with the uid, generation, spec and metadata of the test's own last
  write (projector writes an export's status only, which is not compared), and no other;
- S2, consent: every copy holds data that was, at some moment (or in such a mix: the grant as
  it was at one moment, the producer's consent at another), the consented projection of its
  grant's source into that very place (or what the test itself wrote into it);
- S3, source namespace: a copy in its grant's source namespace is never written while it is;
- S4, no delete on uncertainty: a copy whose grant won its place and served it at the last
  observation, and kept doing so through every world since, is still there, the same object
  (deleted and re-created counts as gone), whatever faults happened meanwhile.

At a convergence point (`Converge`: faults end, the controller runs and is ready, every grant's
status has observed its generation, the queue is idle) every place must be in a state the
oracle says it rests in (`settle`), exactly; the possible sets collapse to what was seen. At the
end of a run, no planted Secret value (a canary) may be in the Events of the run's namespaces
(the fixtures scan the controller's logs and the grants' statuses and Events).
"""

from __future__ import annotations

import base64
import functools
import signal
import socket
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, cast

from kubernetes import client

from tests.bed.controlplane.plane import ControlPlane
from tests.bed.kube import eventually
from tests.bed.launcher import ControllerProcess
from tests.bed.proxy import Relay
from tests.model import oracle
from tests.model.operations import (
    INITIAL_PACKS,
    NAMESPACES,
    PLACE_NAMES,
    ApiServerRestart,
    Blackhole,
    Converge,
    CopyDelete,
    CopyEdit,
    CutWatches,
    ExportCreate,
    ExportDelete,
    ExportUpdate,
    Generator,
    GrantCreate,
    GrantDelete,
    GrantUpdate,
    Kill,
    NsCreate,
    NsDelete,
    NsLabel,
    Op,
    RestoreWatches,
    SourceCreate,
    SourceData,
    SourceDelete,
    SourceExportKeys,
    SourceExportTo,
    SourceLabel,
    SourceRetype,
    Squat,
    Start,
    Unsquat,
    View,
)
from tests.support import EXPORTS, GROUP, PLURAL, VERSION, Canaries, Cluster, status_of

Key = tuple[str, str]
EXPORT_LABEL = "projector.nebari.dev/export"
EXPORT_TO = "projector.nebari.dev/export-to"
EXPORT_KEYS = "projector.nebari.dev/export-keys"
MANAGED_BY = "projector.nebari.dev/managed-by"
GRANT_LABEL = "projector.nebari.dev/grant"
GRANT_UID = "projector.nebari.dev/grant-uid"
SOURCE = "projector.nebari.dev/source"
PACK = "model.projector.test/pack"
BYSTANDERS = ("unrelated", "bystander")
"""Secrets in every namespace of the run that no grant names: an unlabelled one, and an
exported one (`export-to: *`). Nothing may touch them."""
OVERSIZED = ["*", *(f"z{i}" for i in range(256))]
"""An export-to of 257 entries, `*` first: past the cap, nobody."""
OVERSIZED_KEYS = ["k", "x", *(f"z{i}" for i in range(255))]
"""An export-keys of 257 entries, `k` and `x` among them: past the cap, no key."""
CONVERGE_TIMEOUT = 60.0
PLACES: tuple[Key, ...] = tuple((n, p) for n in NAMESPACES for p in PLACE_NAMES)

StartController = Callable[..., ControllerProcess]


class Violation(AssertionError):
    """An invariant or the oracle's exact expectation did not hold."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant
        self.message = message
        self.executed: list[Op] = []
        """The operations run until it broke, the breaking one last."""


@dataclass
class Stats:
    """What runs covered, for docs/reliability.md."""

    runs: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    """Operations the API server refused or that did not apply (a create where something
    stands, an update of what is gone): they changed nothing."""
    observations: int = 0
    place_checks: int = 0
    convergences: int = 0
    settled: Counter[str] = field(default_factory=Counter)
    """At convergence points: places by what they held (copy, absent, foreign)."""
    ambiguous: Counter[str] = field(default_factory=Counter)
    """At convergence points: places whose expectation an ambiguity of the design shaped."""
    seconds: float = 0.0

    def merge(self, other: Stats) -> None:
        self.runs += other.runs
        for name in ("ops", "refused", "settled", "ambiguous"):
            getattr(self, name).update(getattr(other, name))
        self.observations += other.observations
        self.place_checks += other.place_checks
        self.convergences += other.convergences
        self.seconds += other.seconds


@dataclass
class SourceRec:
    data: oracle.Data
    type: str
    label: str | None
    export_to: tuple[str, ...] | str | None
    uid: str
    rv: str
    export_keys: tuple[str, ...] | str | None = None


@dataclass
class ExportRec:
    """An export as the test last wrote it, and what the API server answered."""

    source: str
    to: tuple[str, ...]
    keys: tuple[str, ...] | None
    uid: str
    generation: int


@dataclass
class GrantRec:
    spec: GrantCreate
    uid: str
    created: str


@dataclass
class Seen:
    """A copy as one observation saw it."""

    visible: oracle.Visible
    rv: str
    uid: str
    """The Secret's own metadata.uid: a copy deleted and created again has a new one."""


@dataclass
class Environment:
    """What a run needs from the fixtures."""

    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    k8s: Cluster
    canaries: Canaries
    start_controller: StartController
    relay: Relay
    kubeconfig: Path
    """The controller's kubeconfig through the relay."""
    control_plane: ControlPlane
    prefixes: list[str] = field(default_factory=list)
    """Every run's prefix: the fixture deletes their namespaces at the end."""


class Driver:
    """One run: a fresh universe (namespaces `<prefix>-n0`...), one controller at a time."""

    def __init__(self, env: Environment, prefix: str, stats: Stats | None = None) -> None:
        self.env = env
        self.core, self.custom = env.core, env.custom
        self.prefix = prefix
        self.canary = f"{prefix.upper()}-"
        self.stats = stats if stats is not None else Stats()
        self.ns: dict[str, str | None] = {}
        """Namespaces that exist and are not terminating, with their pack label."""
        self.terminating: set[str] = set()
        self.sources: dict[Key, SourceRec] = {}
        self.dying: dict[Key, SourceRec] = {}
        """Sources of terminating namespaces, until the namespace is gone."""
        self.leaving: set[Key] = set()
        """What the test made in terminating namespaces (a squatter dressed as a copy
        included), on its way out with them: never taken for a copy."""
        self.grants: dict[str, GrantRec] = {}
        self.squatters: dict[Key, tuple[str, str]] = {}
        self.squatted: dict[Key, oracle.Data] = {}
        """What each squatter holds (an export naming its key makes it a source)."""
        self.dressed: set[Key] = set()
        """Squatters dressed in projector's mark."""
        self.exports: dict[Key, ExportRec] = {}
        """ProjectionExports by (namespace, name), in namespaces that are not terminating."""
        self.dying_exports: dict[Key, ExportRec] = {}
        self.bystanders: dict[Key, tuple[str, str]] = {}
        self.possible: dict[Key, set[oracle.State]] = {p: {oracle.ABSENT} for p in PLACES}
        self.since: list[oracle.World] = []
        """The worlds the operations went through since the last convergence point."""
        self.pool: list[oracle.World] = []
        """Those, and the mixes the controller's caches may make of them (`_mixes`)."""
        self.consented: set[tuple[Key, oracle.Visible]] = set()
        self.seen: dict[Key, Seen] = {}
        self.guards: dict[Key, tuple[str, str, str]] = {}
        """S4: place -> (grant uid, Secret uid, type) of a copy that must stay."""
        self.home: dict[Key, tuple[str, str]] = {}
        """S3: place -> (grant uid, resourceVersion) of a copy in its grant's source namespace."""
        self.ctl: ControllerProcess | None = None
        self.cut = False
        self.executed: list[Op] = []

    # --- names ----------------------------------------------------------------------------------

    def real(self, ns: str) -> str:
        return f"{self.prefix}-{ns}"

    def abstract(self, ns: str) -> str:
        return ns.removeprefix(f"{self.prefix}-")

    def value(self, token: str) -> str:
        self.env.canaries.add(self.canary + token)
        return self.canary + token

    def token(self, raw: bytes | str) -> str:
        text = base64.b64decode(raw).decode(errors="replace")
        return text.removeprefix(self.canary)

    def encode(self, data: oracle.Data) -> dict[str, bytes | str]:
        return {k: base64.b64encode(self.value(v).encode()).decode() for k, v in data}

    def export_to(self, value: tuple[str, ...] | str | None, *, real: bool) -> str | None:
        if value is None:
            return None
        entries = OVERSIZED if value == "oversized" else list(value)
        if real:
            entries = self.audience(entries)
        return ",".join(entries)

    def audience(self, entries: Iterable[str]) -> list[str]:
        """Namespace names and globs of the universe, qualified with the run's prefix."""
        out = [e if e.startswith(("*", "!", "z")) else self.real(e) for e in entries]
        return [f"!{self.real(e[1:])}" if e.startswith("!") else e for e in out]

    @staticmethod
    def export_keys(value: tuple[str, ...] | str | None) -> str | None:
        if value is None:
            return None
        return ",".join(OVERSIZED_KEYS if value == "oversized" else value)

    # --- the oracle's view ----------------------------------------------------------------------

    def world(self) -> oracle.World:
        namespaces = {
            n: oracle.Namespace(n, (("pack", pack),) if pack else ()) for n, pack in self.ns.items()
        }
        namespaces |= {n: oracle.Namespace(n, terminating=True) for n in self.terminating}
        sources = {
            k: oracle.Source(
                *k,
                r.data,
                r.type,
                r.label,
                self.export_to(r.export_to, real=False),
                self.export_keys(r.export_keys),
            )
            for k, r in (self.sources | self.dying).items()
        }
        exports = {
            k: oracle.Export(*k, r.source, r.to, r.keys)
            for k, r in (self.exports | self.dying_exports).items()
        }
        grants = {
            name: oracle.Grant(
                name,
                r.uid,
                r.created,
                r.spec.source,
                r.spec.namespaces,
                (("pack", r.spec.selector),) if r.spec.selector else None,
                r.spec.target,
                r.spec.keys,
                r.spec.on_revoke,
                r.spec.on_source_deleted,
            )
            for name, r in self.grants.items()
        }
        others: dict[Key, bool | None] = dict.fromkeys(self.squatters, True)
        contents: dict[Key, frozenset[tuple[oracle.Data, str]]] = {
            k: frozenset({(self.squatted[k], "Opaque")}) for k in self.squatters
        }
        for place, states in self.possible.items():
            if any(s is not None for s in states):
                others[place] = None if oracle.ABSENT in states else True
                held = {(s.data, s.type) for s in states if s is not None}
                contents[place] = contents.get(place, frozenset()) | held
        return oracle.World(
            namespaces=namespaces,
            sources=sources,
            grants=grants,
            squatters=frozenset(self.squatters),
            others=others,
            protected=frozenset({"pr"}),
            dying=frozenset(self.dying),
            exports=exports,
            dying_exports=frozenset(self.dying_exports),
            contents=contents,
            marked=frozenset(self.dressed & set(self.squatters)),
        )

    def view(self) -> View:
        specs = {name: r.spec for name, r in self.grants.items()}
        return View(
            namespaces=dict(self.ns),
            sources={k: r.type for k, r in self.sources.items()},
            grants=specs,
            squatters=frozenset(self.squatters),
            copies=frozenset(self.seen),
            controller_up=self.ctl is not None,
            watches_cut=self.cut,
            exports={k: ExportCreate(*k, r.source, r.to, r.keys) for k, r in self.exports.items()},
        )

    # --- a run -----------------------------------------------------------------------------------

    def setup(self) -> None:
        for n, pack in INITIAL_PACKS.items():
            self._create_namespace(n, pack)
        self.start()
        self.advance([self.world()])

    def run(self, ops: Iterable[Op]) -> None:
        """Apply each operation and check; a final convergence point ends the run."""
        for op in ops:
            self.apply(op)
        self.apply(Converge())

    def generate(self, gen: Generator, count: int) -> None:
        for _ in range(count):
            self.apply(gen.next(self.view()))
        self.apply(Converge())

    def apply(self, op: Op) -> None:
        self.executed.append(op)
        try:
            self._apply(op)
        except Violation as v:
            v.executed = list(self.executed)
            raise

    def _apply(self, op: Op) -> None:
        self.stats.ops[type(op).__name__] += 1
        if isinstance(op, Converge):
            self.converge(op.within)
            return
        worlds = self.do(op)
        if worlds is None:
            self.stats.refused[type(op).__name__] += 1
            worlds = []
        self.advance(worlds)
        self.check()

    def teardown(self) -> None:
        """Stop the controller (its exit checked), scan Events, delete what the run made."""
        if self.cut:
            self.env.relay.restore()
            self.cut = False
        if self.ctl is not None:
            code = self.ctl.stop()
            assert code == 0, f"controller exit code {code}:\n{self.ctl.logs()[-3000:]}"
            self.ctl = None
        self.env.relay.release()  # the black-holed connections of this run's controllers
        for n in list(self.ns) + list(self.terminating):
            events = self.core.list_namespaced_event(self.real(n)).items
            text = " ".join(f"{e.reason} {e.message}" for e in events)
            self.env.canaries.assert_absent(f"events of namespace {n}", text)
        for key, obj in self._list_exports().items():
            status = str(obj.get("status") or {})
            self.env.canaries.assert_absent(f"status of export {key}", status)
        for name in list(self.grants):
            self.env.k8s.delete_grant(self.real(name))
        for n in list(self.ns):
            self.core.delete_namespace(self.real(n))

    # --- operations -----------------------------------------------------------------------------

    def do(self, op: Op) -> list[oracle.World] | None:
        """Carry out one operation; the worlds it went through, or None if it did not apply."""
        try:
            return self._do(op)
        except client.ApiException as e:
            if e.status in (404, 409, 422):
                return None
            raise

    def _do(self, op: Op) -> list[oracle.World] | None:
        if isinstance(op, NsCreate | NsLabel | NsDelete):
            return self._namespace_op(op)
        if isinstance(op, SourceCreate):
            return self._source_create(op)
        if isinstance(op, SourceData | SourceLabel | SourceExportTo | SourceExportKeys):
            return self._source_patch(op)
        if isinstance(op, SourceRetype | SourceDelete):
            return self._source_delete(op)
        if isinstance(op, GrantUpdate):
            return self._grant_update(op)
        if isinstance(op, GrantCreate | GrantDelete):
            return self._grant_op(op)
        if isinstance(op, ExportCreate | ExportUpdate | ExportDelete):
            return self._export_op(op)
        if isinstance(op, CopyEdit | CopyDelete):
            return self._hand(op)
        if isinstance(op, Squat | Unsquat):
            return self._squat(op)
        return self._fault(op)

    def _namespace_op(self, op: NsCreate | NsLabel | NsDelete) -> list[oracle.World] | None:
        if isinstance(op, NsCreate):
            if op.ns in self.ns:
                return None
            if op.ns in self.terminating:
                self._wait_gone(op.ns)
            self._create_namespace(op.ns, op.pack)
            return [self.world()]
        if op.ns not in self.ns:
            return None
        if isinstance(op, NsLabel):
            self.core.patch_namespace(self.real(op.ns), {"metadata": {"labels": {PACK: op.pack}}})
            self.ns[op.ns] = op.pack
            return [self.world()]
        self.core.delete_namespace(self.real(op.ns))
        del self.ns[op.ns]
        self.terminating.add(op.ns)
        self._forget_namespace(op.ns)
        # The namespace controller deletes what is in it, in its own time: until the namespace
        # is gone, its sources may still be projected (`oracle.World.dying`).
        self.dying |= {k: r for k, r in self.sources.items() if k[0] == op.ns}
        self.dying_exports |= {k: r for k, r in self.exports.items() if k[0] == op.ns}
        self.exports = {k: r for k, r in self.exports.items() if k[0] != op.ns}
        made = (*self.sources, *self.squatters, *self.bystanders)
        self.leaving |= {k for k in made if k[0] == op.ns}
        self.sources = {k: r for k, r in self.sources.items() if k[0] != op.ns}
        self.squatters = {k: r for k, r in self.squatters.items() if k[0] != op.ns}
        self.bystanders = {k: r for k, r in self.bystanders.items() if k[0] != op.ns}
        return [self.world()]

    def _source_create(self, op: SourceCreate) -> list[oracle.World] | None:
        key = (op.ns, op.name)
        if op.ns not in self.ns or key in self.sources or key in self.squatters:
            return None
        body = self._source_body(op.name, op.data, op.type, op.label, op.export_to)
        made = self.core.create_namespaced_secret(self.real(op.ns), body)
        uid, rv = _ids(made)
        self.sources[key] = SourceRec(op.data, op.type, op.label, op.export_to, uid, rv)
        return [self.world()]

    def _source_patch(
        self, op: SourceData | SourceLabel | SourceExportTo | SourceExportKeys
    ) -> list[oracle.World] | None:
        rec = self.sources.get((op.ns, op.name))
        if rec is None:
            return None
        meta: dict[str, Any] = {"uid": rec.uid, "resourceVersion": rec.rv}
        patch: dict[str, Any] = {"metadata": meta}
        if isinstance(op, SourceData):
            removed = {k: None for k, _ in rec.data if k not in dict(op.data)}
            patch["data"] = {**self.encode(op.data), **removed}
        elif isinstance(op, SourceLabel):
            meta["labels"] = {EXPORT_LABEL: op.label}
        elif isinstance(op, SourceExportKeys):
            meta["annotations"] = {EXPORT_KEYS: self.export_keys(op.keys)}
        else:
            meta["annotations"] = {EXPORT_TO: self.export_to(op.export_to, real=True)}
        done = self.core.patch_namespaced_secret(op.name, self.real(op.ns), patch)
        if isinstance(op, SourceData):
            rec.data = op.data
        elif isinstance(op, SourceLabel):
            rec.label = op.label
        elif isinstance(op, SourceExportKeys):
            rec.export_keys = op.keys
        else:
            rec.export_to = op.export_to
        rec.rv = _ids(done)[1]
        return [self.world()]

    def _source_delete(self, op: SourceRetype | SourceDelete) -> list[oracle.World] | None:
        key = (op.ns, op.name)
        rec = self.sources.get(key)
        if rec is None or (isinstance(op, SourceRetype) and rec.type == op.type):
            return None
        self._delete_secret(key, rec.uid, rec.rv)
        del self.sources[key]
        gone = self.world()
        if isinstance(op, SourceDelete):
            return [gone]
        body = self._source_body(
            op.name, rec.data, op.type, rec.label, rec.export_to, rec.export_keys
        )
        try:
            made = self.core.create_namespaced_secret(self.real(op.ns), body)
        except client.ApiException as e:
            if e.status != 409:
                raise
            return [gone]  # a copy took the name meanwhile: the source stays deleted
        uid, rv = _ids(made)
        self.sources[key] = replace(rec, type=op.type, uid=uid, rv=rv)
        return [gone, self.world()]

    def _grant_update(self, op: GrantUpdate) -> list[oracle.World] | None:
        rec = self.grants.get(op.grant)
        if rec is None:
            return None
        body = self._grant_body(op) | {"metadata": {"uid": rec.uid}}
        self.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, self.real(op.grant), body)
        rec.spec = GrantCreate(**{f.name: getattr(op, f.name) for f in fields(op)})
        return [self.world()]

    def _grant_op(self, op: GrantCreate | GrantDelete) -> list[oracle.World] | None:
        if isinstance(op, GrantDelete):
            if op.grant not in self.grants:
                return None
            self.env.k8s.delete_grant(self.real(op.grant))
            del self.grants[op.grant]
            return [self.world()]
        if op.grant in self.grants:
            return None
        body = self._grant_body(op) | {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ProjectionGrant",
            "metadata": {"name": self.real(op.grant)},
        }
        made = cast(
            dict[str, Any],
            self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _pruned(body)),
        )
        self.env.k8s.grants.append(self.real(op.grant))
        meta = made["metadata"]
        self.grants[op.grant] = GrantRec(op, meta["uid"], meta["creationTimestamp"])
        return [self.world()]

    def _squat(self, op: Squat | Unsquat) -> list[oracle.World] | None:
        key = (op.ns, op.name)
        if isinstance(op, Unsquat):
            if key not in self.squatters:
                return None
            uid, rv = self.squatters.pop(key)
            self.squatted.pop(key, None)
            self.dressed.discard(key)
            self._delete_secret(key, uid, rv)
            return [self.world()]
        if op.ns not in self.ns or key in self.sources or key in self.squatters:
            return None
        labels: dict[str, str] = {}
        notes: dict[str, str] = {}
        if op.dressed and self.grants:
            name, grant = sorted(self.grants.items())[0]
            labels = {MANAGED_BY: "projector", GRANT_LABEL: self.real(name)}
            source = f"{self.real(grant.spec.source[0])}/{grant.spec.source[1]}"
            notes = {GRANT_UID: grant.uid, SOURCE: source}
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=op.name, labels=labels, annotations=notes),
            data=self.encode((("k", op.value),)),
        )
        self.squatters[key] = _ids(self.core.create_namespaced_secret(self.real(op.ns), body))
        self.squatted[key] = (("k", op.value),)
        if notes:
            self.dressed.add(key)
        return [self.world()]

    def _export_op(
        self, op: ExportCreate | ExportUpdate | ExportDelete
    ) -> list[oracle.World] | None:
        key = (op.ns, op.name)
        rec = self.exports.get(key)
        if isinstance(op, ExportDelete):
            if rec is None:
                return None
            pre = client.V1Preconditions(uid=rec.uid)
            self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.real(op.ns),
                EXPORTS,
                op.name,
                body=client.V1DeleteOptions(preconditions=pre),
            )
            del self.exports[key]
            return [self.world()]
        keys = None if op.keys is None else list(op.keys)
        spec: dict[str, Any] = {"to": self.audience(op.to), "keys": keys}
        if isinstance(op, ExportUpdate):
            if rec is None:
                return None
            patch = {"metadata": {"uid": rec.uid}, "spec": spec}
            done = self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.real(op.ns), EXPORTS, op.name, patch
            )
            meta = cast(dict[str, Any], done)["metadata"]
            self.exports[key] = replace(rec, to=op.to, keys=op.keys, generation=meta["generation"])
            return [self.world()]
        if op.ns not in self.ns or rec is not None:
            return None
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ProjectionExport",
            "metadata": {"name": op.name},
            "spec": {"source": {"name": op.source}, **spec},
        }
        made = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.real(op.ns), EXPORTS, _pruned(body)
        )
        meta = cast(dict[str, Any], made)["metadata"]
        self.exports[key] = ExportRec(op.source, op.to, op.keys, meta["uid"], meta["generation"])
        return [self.world()]

    def _fault(self, op: Op) -> list[oracle.World] | None:
        if isinstance(op, Kill):
            if self.ctl is None:
                return None
            sig = signal.SIGTERM if op.graceful else signal.SIGKILL
            code = self.ctl.stop(sig)
            if op.graceful:
                assert code == 0, f"controller exit code {code}:\n{self.ctl.logs()[-3000:]}"
            self.ctl = None
            return []
        if isinstance(op, Start):
            if self.ctl is not None:
                return None
            self.start()
            return []
        if isinstance(op, CutWatches):
            if self.cut:
                return None
            self.env.relay.cut()
            self.cut = True
            return []
        if isinstance(op, RestoreWatches):
            if not self.cut:
                return None
            self.env.relay.restore()
            self.cut = False
            return []
        if isinstance(op, Blackhole):
            self.env.relay.blackhole()
            return []
        if isinstance(op, ApiServerRestart):
            ctl = self.ctl
            with self.env.control_plane.apiserver_down():
                if ctl is not None and not self.cut:
                    eventually(lambda: ctl.get("/readyz")[0] == 503, timeout=60)
            return []
        raise TypeError(f"unknown operation {op!r}")

    def start(self) -> None:
        if not self.cut:
            try:  # the relay accepts (a controller that cannot connect is never ready)
                socket.create_connection(("127.0.0.1", self.env.relay.port), timeout=5).close()
            except OSError as e:
                raise AssertionError(f"the relay to the API server accepts nothing: {e!r}") from e
        self.ctl = self.env.start_controller(
            f"--kubeconfig={self.env.kubeconfig}",
            f"--protected-namespaces={self.real('pr')}",
            "--watch-timeout=4",
            "--informer-stall-after=10s",
            wait_ready=not self.cut,
        )

    def _hand(self, op: CopyEdit | CopyDelete) -> list[oracle.World] | None:
        """A person edits or deletes a copy: exactly the object seen now (preconditions)."""
        place = (op.ns, op.name)
        if op.ns not in self.ns or place in self.sources or place in self.squatters:
            return None
        secret = self.core.read_namespaced_secret(op.name, self.real(op.ns))
        seen = self._seen(place, secret)
        if seen is None:
            return None
        if isinstance(op, CopyDelete):
            self._delete_secret(place, seen.uid, seen.rv)
            self.possible[place] = {oracle.ABSENT}
            self.guards.pop(place, None)
            self.home.pop(place, None)
            return [self.world()]
        secret.data = self.encode((("k", op.value),))
        done = self.core.replace_namespaced_secret(op.name, self.real(op.ns), secret)
        edited: set[oracle.State] = {
            replace(s, data=(("k", op.value),))
            for s in self.possible[place]
            if s is not None and s.visible() == seen.visible
        }
        if not edited:
            raise Violation(
                "S0 transition",
                f"{place}: before the edit, it held {seen.visible}, which the oracle never "
                f"allowed: {self._describe(self.possible[place])}",
            )
        self.consented |= {(place, s.visible()) for s in edited}
        self.possible[place] = edited
        if place in self.home:
            self.home[place] = (self.home[place][0], _ids(done)[1])
        return [self.world()]

    # --- bookkeeping ------------------------------------------------------------------------------

    def advance(self, worlds: Sequence[oracle.World]) -> None:
        """The operation's worlds happened: what each place may hold now, what was consented,
        and which S3/S4 guards still hold through all of them."""
        if not worlds:
            return
        # Worlds seen before may be widened too (a copy this operation lets land at a source's
        # key): each is taken in again, which only ever adds consent and removes guards.
        seq = [*self.since, *worlds]
        pool, reached = oracle.reach([*seq, *_mixes(seq)], self._frozen())
        self.since, self.pool = pool[: len(seq)], pool
        self.possible = {p: set(states) for p, states in reached.items()}
        for w in pool:
            self.consented.update(oracle.consented(w))
            for place, (uid, _, type_) in list(self.guards.items()):
                if not self._must_stay(w, place, uid, type_):
                    del self.guards[place]
            for place, (uid, _) in list(self.home.items()):
                owner = w.grant_by_uid(uid)
                if owner is None or owner.source[0] != place[0]:
                    del self.home[place]

    def _frozen(self) -> dict[Key, frozenset[oracle.State]]:
        return {p: frozenset(states) for p, states in self.possible.items()}

    def _closure(self, place: Key, states: Iterable[oracle.State]) -> set[oracle.State]:
        return set(oracle.reachable(self.pool, place, states))

    @staticmethod
    def _must_stay(world: oracle.World, place: Key, uid: str, type_: str | None = None) -> bool:
        """S4: the copy's grant wins the place and serves it with a copy of this type (or
        keeps it: a key missing), whatever the world's uncertain keys turn out to be."""
        return all(Driver._must_stay_in(w, place, uid, type_) for w in oracle.resolutions(world))

    @staticmethod
    def _must_stay_in(world: oracle.World, place: Key, uid: str, type_: str | None) -> bool:
        aiming = oracle.claimants(world, place)
        if not aiming or aiming[0].uid != uid:
            return False
        served = oracle.projection(world, aiming[0], place[0])
        if served == oracle.KEY_MISSING:
            return True
        return isinstance(served, oracle.Copy) and type_ in (None, served.type)

    def _forget_namespace(self, ns: str) -> None:
        for place in [p for p in self.guards if p[0] == ns]:
            del self.guards[place]
        for place in [p for p in self.home if p[0] == ns]:
            del self.home[place]

    # --- observing ------------------------------------------------------------------------------

    def observe(self) -> dict[Key, Seen]:
        """Every copy of the run's namespaces; S1 is checked on the way."""
        self.stats.observations += 1
        for n in list(self.terminating):
            if self._gone(n):
                self._gone_for_good(n)
        copies: dict[Key, Seen] = {}
        found: set[Key] = set()
        for n in [*self.ns, *self.terminating]:
            for secret in self.core.list_namespaced_secret(self.real(n)).items:
                key = (n, str(secret.metadata.name))
                mine = self._mine(key)
                if mine is not None:
                    found.add(key)
                    uid, rv = mine
                    if (secret.metadata.uid, secret.metadata.resource_version) != (uid, rv):
                        raise Violation(
                            "S1 not ours",
                            f"{key} ({self._what(key)}) was rewritten by someone else: "
                            f"resourceVersion {secret.metadata.resource_version}, the test's "
                            f"last write {rv}",
                        )
                    continue
                seen = self._seen(key, secret)
                if n in self.terminating and (
                    seen is None or key not in self.possible or key in self.leaving
                ):
                    continue  # what the test made there, on its way out with the namespace
                if seen is None:
                    raise Violation("S1 not ours", f"{key}: a Secret nobody made, without a mark")
                copies[key] = seen
        for n in self.ns:
            for key in (k for k in (*self.sources, *self.squatters, *self.bystanders) if k[0] == n):
                if key not in found:
                    raise Violation("S1 not ours", f"{key} ({self._what(key)}) was deleted")
        self._check_exports()
        return copies

    def _list_exports(self) -> dict[Key, dict[str, Any]]:
        """Every ProjectionExport of the run's namespaces (terminating ones included)."""
        listed = cast(
            dict[str, Any], self.custom.list_cluster_custom_object(GROUP, VERSION, EXPORTS)
        )
        mine = {self.real(n): n for n in [*self.ns, *self.terminating]}
        out: dict[Key, dict[str, Any]] = {}
        for obj in listed.get("items") or ():
            meta = obj["metadata"]
            if meta["namespace"] in mine:
                out[(mine[meta["namespace"]], meta["name"])] = obj
        return out

    def _check_exports(self) -> None:
        """S1 for exports: each as the test last wrote it (its status aside), and no other."""
        found = self._list_exports()
        for key, rec in self.exports.items():
            obj = found.get(key)
            if obj is None:
                raise Violation("S1 not ours", f"the export {key} was deleted")
            meta, spec = obj["metadata"], obj.get("spec") or {}
            got = (
                meta.get("uid"),
                meta.get("generation"),
                (spec.get("source") or {}).get("name"),
                spec.get("to"),
                spec.get("keys"),
                meta.get("labels"),
                meta.get("annotations"),
                meta.get("finalizers"),
                meta.get("ownerReferences"),
            )
            keys = None if rec.keys is None else list(rec.keys)
            want = (rec.uid, rec.generation, rec.source, self.audience(rec.to), keys)
            if got != (*want, None, None, None, None):
                raise Violation(
                    "S1 not ours",
                    f"the export {key} was rewritten by someone else: {got}, the test's last "
                    f"write {want}",
                )
        for key in found.keys() - self.exports.keys():
            if key[0] in self.ns:
                raise Violation("S1 not ours", f"an export nobody made: {key}")

    def _mine(self, key: Key) -> tuple[str, str] | None:
        if key in self.sources:
            return self.sources[key].uid, self.sources[key].rv
        return self.squatters.get(key) or self.bystanders.get(key)

    def _what(self, key: Key) -> str:
        if key in self.sources:
            return "a source"
        return "a squatter" if key in self.squatters else "a bystander"

    def _seen(self, place: Key, secret: client.V1Secret) -> Seen | None:
        notes = secret.metadata.annotations or {}
        labels = secret.metadata.labels or {}
        if GRANT_UID not in notes:
            return None
        src_ns, _, src_name = notes.get(SOURCE, "/").partition("/")
        data = tuple(sorted((k, self.token(v)) for k, v in (secret.data or {}).items()))
        visible = (
            notes[GRANT_UID],
            self.abstract(labels.get(GRANT_LABEL, "")),
            (self.abstract(src_ns), src_name),
            data,
            secret.type or "Opaque",
        )
        uid, rv = _ids(secret)
        return Seen(visible, rv, uid)

    def check(self) -> None:
        """S0-S4 on one observation (nothing to observe while the API server is away)."""
        copies = self.observe()
        world = self.world()
        for place in PLACES:
            self.stats.place_checks += 1
            seen = copies.get(place)
            visible = seen.visible if seen is not None else None
            states = {s for s in self.possible[place] if _visible(s) == visible}
            if not states:
                raise Violation(
                    "S0 transition",
                    f"{place} holds {self._show(visible)}, which no sequence of correct steps "
                    f"through the worlds since the last convergence point reaches; allowed: "
                    f"{self._describe(self.possible[place])}",
                )
            # What the place holds now, and wherever the controller may take it from there.
            self.possible[place] = self._closure(place, states)
            if seen is not None and (place, seen.visible) not in self.consented:
                raise Violation(
                    "S2 consent",
                    f"{place} holds {self._show(visible)}, never the consented projection of its "
                    "grant's source into that place (nor written there by the test)",
                )
            self._check_guards(place, seen)
            self._set_guards(world, place, seen)
        for place in set(copies) - set(PLACES):
            raise Violation("S2 consent", f"a copy at {place}, where no grant ever aimed")
        self.seen = copies

    def _check_guards(self, place: Key, seen: Seen | None) -> None:
        guard = self.guards.get(place)
        if guard is not None and (seen is None or seen.uid != guard[1]):
            what = "gone" if seen is None else "deleted and created again"
            raise Violation(
                "S4 no delete on uncertainty",
                f"{place}: the copy of grant uid {guard[0][:8]} is {what}, though its grant "
                "won and served the place at the last observation and in every world since",
            )
        home = self.home.get(place)
        moved = home is not None and seen is not None and seen.visible[0] == home[0]
        if moved and seen is not None and home is not None and seen.rv != home[1]:
            raise Violation(
                "S3 source namespace",
                f"{place}: the copy was written while its place is its grant's source namespace",
            )

    def _set_guards(self, world: oracle.World, place: Key, seen: Seen | None) -> None:
        self.guards.pop(place, None)
        if seen is None:
            self.home.pop(place, None)
            return
        # A guard is only set where every world since the last convergence point agrees: the
        # controller may still act on any of them (a plan made before the last operation).
        uid = seen.visible[0]
        if all(self._must_stay(w, place, uid, seen.visible[4]) for w in [*self.pool, world]):
            self.guards[place] = (uid, seen.uid, seen.visible[4])
        homes = [w.grant_by_uid(uid) for w in [*self.pool, world]]
        if all(g is not None and g.source[0] == place[0] for g in homes):
            if place not in self.home or self.home[place][0] != uid:
                self.home[place] = (uid, seen.rv)
        else:
            self.home.pop(place, None)

    # --- convergence ----------------------------------------------------------------------------

    def converge(self, within: float = CONVERGE_TIMEOUT) -> None:
        """Faults end; once the controller is ready and idle every place rests where the oracle
        says, exactly."""
        if self.cut:
            self.env.relay.restore()
            self.cut = False
        if self.ctl is None:
            self.start()
        ctl = self.ctl
        assert ctl is not None
        eventually(ctl.ready, timeout=CONVERGE_TIMEOUT, message="controller /readyz")
        world = self.world()
        notes: dict[Key, set[str]] = {p: set() for p in PLACES}
        rest = {p: oracle.settle(world, p, self.possible[p], notes[p]) for p in PLACES}
        if any(not r for r in rest.values()):
            empty = [p for p, r in rest.items() if not r]
            raise Violation("oracle", f"no state to rest in at {empty}: the oracle loops")

        def matches() -> tuple[dict[Key, Seen]] | None:
            copies = self.observe()
            for place in PLACES:
                seen = copies.get(place)
                visible = seen.visible if seen is not None else None
                if visible not in {_visible(s) for s in rest[place]}:
                    return None
            for name in self.grants:
                obj = cast(
                    dict[str, Any],
                    self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, self.real(name)),
                )
                generation = obj["metadata"]["generation"]
                if (obj.get("status") or {}).get("observedGeneration") != generation:
                    return None
            return (copies,)

        try:
            eventually(lambda: bool(matches() and ctl.idle()), timeout=within, interval=0.1)
            found = eventually(matches, timeout=within, interval=0.1)
        except AssertionError:
            raise Violation("convergence", self._mismatch(rest)) from None
        assert found is not None
        (copies,) = found
        self.stats.convergences += 1
        for place in PLACES:
            seen = copies.get(place)
            visible = seen.visible if seen is not None else None
            self.possible[place] = {s for s in rest[place] if _visible(s) == visible}
            kind = (
                "copy"
                if seen
                else "foreign"
                if place in self.squatters or place in self.sources
                else "absent"
            )
            self.stats.settled[kind] += 1
            for note in notes[place]:
                self.stats.ambiguous[note] += 1
        self.since = self.pool = [world]
        self.check()

    def _mismatch(self, rest: dict[Key, frozenset[oracle.State]]) -> str:
        copies = self.observe()
        lines = ["after the controller had time to act, some places are not where they rest:"]
        for place in PLACES:
            seen = copies.get(place)
            visible = seen.visible if seen is not None else None
            if visible not in {_visible(s) for s in rest[place]}:
                lines.append(
                    f"  {place}: holds {self._show(visible)}; the oracle says it rests in: "
                    f"{self._describe(rest[place])}"
                )
        return "\n".join(lines)

    # --- helpers ----------------------------------------------------------------------------------

    def _create_namespace(self, ns: str, pack: str | None) -> None:
        labels = {PACK: pack} if pack else None
        meta = client.V1ObjectMeta(name=self.real(ns), labels=labels)
        self.core.create_namespace(client.V1Namespace(metadata=meta))
        self.ns[ns] = pack
        for name in BYSTANDERS:
            body = self._source_body(
                name,
                (("k", f"{name}-{ns}"),),
                "Opaque",
                "true" if name == "bystander" else None,
                ("*",),
            )
            made = self.core.create_namespaced_secret(self.real(ns), body)
            self.bystanders[(ns, name)] = _ids(made)

    def _gone(self, ns: str) -> bool:
        return status_of(functools.partial(self.core.read_namespace, self.real(ns))) == 404

    def _wait_gone(self, ns: str) -> None:
        eventually(
            functools.partial(self._gone, ns),
            timeout=120,
            message=f"namespace {ns} never went away",
        )
        self._gone_for_good(ns)

    def _gone_for_good(self, ns: str) -> None:
        self.terminating.discard(ns)
        self.dying = {k: r for k, r in self.dying.items() if k[0] != ns}
        self.dying_exports = {k: r for k, r in self.dying_exports.items() if k[0] != ns}
        self.leaving = {k for k in self.leaving if k[0] != ns}
        self.advance([self.world()])

    def _source_body(
        self,
        name: str,
        data: oracle.Data,
        type_: str,
        label: str | None,
        export_to: tuple[str, ...] | str | None,
        export_keys: tuple[str, ...] | str | None = None,
    ) -> client.V1Secret:
        labels = {EXPORT_LABEL: label} if label is not None else None
        value = self.export_to(export_to, real=True)
        notes = {EXPORT_TO: value} if value is not None else {}
        scope = self.export_keys(export_keys)
        if scope is not None:
            notes[EXPORT_KEYS] = scope
        meta = client.V1ObjectMeta(name=name, labels=labels, annotations=notes or None)
        return client.V1Secret(metadata=meta, type=type_, data=self.encode(data))

    def _grant_body(self, spec: GrantCreate) -> dict[str, Any]:
        target: dict[str, Any] = {
            "namespaces": [self.real(n) for n in spec.namespaces] or None,
            "namespaceSelector": {"matchLabels": {PACK: spec.selector}} if spec.selector else None,
            "name": spec.target,
        }
        keys = None if spec.keys is None else [{"from": f, "to": t} for f, t in spec.keys]
        return {
            "spec": {
                "source": {"namespace": self.real(spec.source[0]), "name": spec.source[1]},
                "target": target,
                "keys": keys,
                "policy": {"onRevoke": spec.on_revoke, "onSourceDeleted": spec.on_source_deleted},
            }
        }

    def _delete_secret(self, key: Key, uid: str, rv: str) -> None:
        pre = client.V1Preconditions(uid=uid, resource_version=rv)
        self.core.delete_namespaced_secret(
            key[1], self.real(key[0]), body=client.V1DeleteOptions(preconditions=pre)
        )

    def _show(self, visible: oracle.Visible | None) -> str:
        if visible is None:
            return "nothing"
        uid, grant, source, data, type_ = visible
        who = next((n for n, r in self.grants.items() if r.uid == uid), "a deleted grant")
        keys = ",".join(f"{k}={v}" for k, v in data)
        return (
            f"a copy of {grant} (uid {uid[:8]}: {who}) from {source[0]}/{source[1]} "
            f"type {type_} {{{keys}}}"
        )

    @staticmethod
    def _describe(states: Iterable[oracle.State]) -> str:
        return "; ".join(sorted(oracle.describe(s) for s in states)) or "(nothing)"


def _mixes(worlds: Sequence[oracle.World]) -> list[oracle.World]:
    """The worlds a controller's caches may make of `worlds`, besides themselves: the grants of
    one with everything else of another.

    Informers of different kinds are not ordered with each other (each watch stream is, no
    two together): once a watch breaks, or when two writes of different kinds come close
    together, the controller may act on its grants as they were at one moment and on
    sources, exports and namespaces as they were at another (seed 455749577: a grant deleted,
    then an export created; on reconnection the export was seen first, and the grant, still
    cached, wrote a copy, kept as an orphan by its Retain). Mixing the grants with the rest
    covers that; finer mixes (sources against namespaces, say) are not modelled.
    """
    grants: list[Any] = []
    for w in worlds:
        if w.grants not in grants:
            grants.append(w.grants)
    out: list[oracle.World] = []
    for g in grants:
        for w in worlds:
            if w.grants != g:
                mixed = replace(w, grants=g)
                if mixed not in out and mixed not in worlds:
                    out.append(mixed)
    return out


def _ids(secret: client.V1Secret) -> tuple[str, str]:
    """A Secret's (uid, resourceVersion)."""
    return str(secret.metadata.uid), str(secret.metadata.resource_version)


def _pruned(value: Any) -> Any:
    """A body without its None values (a create has nothing to remove)."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    return value


def _visible(state: oracle.State) -> oracle.Visible | None:
    return None if state is None else state.visible()


def prefixes(base: str) -> Iterator[str]:
    """Run prefixes: `base`, then `base` with a count."""
    yield base
    n = 1
    while True:
        n += 1
        yield f"{base}{n}"

"""The operations a model-based run makes, and the seeded generator that draws them.

Every operation is a frozen dataclass of plain values naming things in an abstract universe
(namespaces `n0`-`n2` and the protected `pr`, sources `s0`/`s1`, grants `g0`-`g2`, target names
`s0`/`s1`/`c0`, ProjectionExports `e0`/`e1` in any namespace, data keys `k`/`x` (and `z`, which
no source holds), data values `v<n>`), so that a sequence prints as Python that replays in any
fresh universe (`render`), and a shrinker can drop any operation: one that no longer applies
when it runs (a grant to update that does not exist, a copy to edit that is not there) is skipped,
never an error.

The generator draws each operation from a `random.Random(seed)` and the run's state so far
(`View`): most operations apply, a few do not on purpose (a source created where a copy stands).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

NAMESPACES = ("n0", "n1", "n2", "pr")
"""`pr` is protected (`--protected-namespaces`): never a target."""
INITIAL_PACKS = {"n0": None, "n1": "x", "n2": "x", "pr": None}
"""A run starts with these namespaces, labelled so (`pack`): a selector matches from the start."""
SOURCES = ("s0", "s1")
GRANTS = ("g0", "g1", "g2")
TARGETS = (None, None, "c0", "c0", "c0", "c0", "c0", "c0", "s1")
"""A grant's target name: None is the source's own name."""
PLACE_NAMES = ("s0", "s1", "c0")
DATA_KEYS = ("k", "x")
TYPES = ("Opaque", "example.com/a", "bootstrap.kubernetes.io/token")
LABELS = ("true",) * 12 + (None, None, None, "True")
"""The export label's value (None: no label; `True` is not consent). An unlabelled source
is projected only where an export names it."""
EXPORT_TO: tuple[tuple[str, ...] | str | None, ...] = (
    *((("*",),) * 14),
    ("n0", "n1", "n2"),
    ("n0", "n1", "n2"),
    ("n1",),
    ("n1", "n2"),
    ("n*",),
    ("n[02]",),
    ("pr", "n0"),
    (),
    None,
    ("!n1",),
    "oversized",
)
"""An export-to annotation: None absent, () empty, entries (names and globs of the universe,
qualified when rendered), or "oversized" (past the 256-entry cap, `*` among them)."""
EXPORT_KEYS: tuple[tuple[str, ...] | str | None, ...] = (
    None,
    None,
    ("k",),
    ("k",),
    ("x",),
    ("k", "x"),
    ("k", "z"),
    (),
    "oversized",
)
"""An export-keys annotation: None absent (every key), () blank (no key), key names, or
"oversized" (past export-to's 256-entry bound, `k` and `x` among them: no key)."""
EXPORTS = ("e0", "e1")
"""ProjectionExport names (each namespace may hold both)."""
EXPORT_TOS: tuple[tuple[str, ...], ...] = (
    ("*",),
    ("*",),
    ("*",),
    ("n1",),
    ("n1", "n2"),
    ("n2",),
    ("n0",),
    ("n*",),
    ("n[02]",),
    ("pr", "n1"),
)
"""An export's `to` (required, non-empty; names and globs of the universe, qualified when
rendered)."""
EXPORT_SCOPES: tuple[tuple[str, ...] | None, ...] = (
    None,
    None,
    None,
    ("k",),
    ("k",),
    ("x",),
    ("k", "x"),
    ("z",),
    (),
)
"""An export's `keys`: None omitted (every key), () an empty list (no key), or key names."""
PACKS = ("x", "x", "y", None)
FAULTS = ("kill", "watch", "blackhole", "apiserver")
"""`kill`: the controller killed (SIGKILL or SIGTERM), started again later; `watch`: its
connections cut and restored later; `blackhole`: its connections silenced; `apiserver`: the
API server stopped and started (seconds; `make fuzz` only by default)."""
QUICK_FAULTS = ("kill", "watch")

Data = tuple[tuple[str, str], ...]


# --- operations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NsCreate:
    ns: str
    pack: str | None = None


@dataclass(frozen=True)
class NsLabel:
    ns: str
    pack: str | None


@dataclass(frozen=True)
class NsDelete:
    ns: str


@dataclass(frozen=True)
class SourceCreate:
    ns: str
    name: str
    data: Data
    type: str = "Opaque"
    label: str | None = "true"
    export_to: tuple[str, ...] | str | None = ("*",)


@dataclass(frozen=True)
class SourceData:
    ns: str
    name: str
    data: Data


@dataclass(frozen=True)
class SourceLabel:
    ns: str
    name: str
    label: str | None


@dataclass(frozen=True)
class SourceExportTo:
    ns: str
    name: str
    export_to: tuple[str, ...] | str | None


@dataclass(frozen=True)
class SourceExportKeys:
    """The export-keys annotation set (a tuple: comma-joined; () blank), removed (None), or
    "oversized"."""

    ns: str
    name: str
    keys: tuple[str, ...] | str | None


@dataclass(frozen=True)
class SourceRetype:
    """The type of a Secret cannot change: deleted and created again with the same data."""

    ns: str
    name: str
    type: str


@dataclass(frozen=True)
class SourceDelete:
    ns: str
    name: str


@dataclass(frozen=True)
class GrantCreate:
    grant: str
    source: tuple[str, str]
    namespaces: tuple[str, ...] = ()
    selector: str | None = None
    """matchLabels {pack: <this>}; None: no selector."""
    target: str | None = None
    keys: tuple[tuple[str, str], ...] | None = None
    on_revoke: str = "Delete"
    on_source_deleted: str = "Retain"


@dataclass(frozen=True)
class GrantUpdate(GrantCreate):
    """The whole spec written again (as `kubectl apply` would), whatever changed in it."""


@dataclass(frozen=True)
class GrantDelete:
    grant: str


@dataclass(frozen=True)
class ExportCreate:
    """A ProjectionExport `name` in namespace `ns`, of the Secret `source` of that namespace."""

    ns: str
    name: str
    source: str
    to: tuple[str, ...] = ("*",)
    keys: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ExportUpdate:
    """An export's `to` and `keys` written again (its source stays)."""

    ns: str
    name: str
    to: tuple[str, ...]
    keys: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ExportDelete:
    ns: str
    name: str


@dataclass(frozen=True)
class CopyEdit:
    """Someone overwrites a copy's data by hand."""

    ns: str
    name: str
    value: str


@dataclass(frozen=True)
class CopyDelete:
    ns: str
    name: str


@dataclass(frozen=True)
class Squat:
    """A foreign Secret at a copy's place; `dressed`: with projector's labels, and the uid of
    a live grant in a grant-uid annotation written by hand."""

    ns: str
    name: str
    value: str
    dressed: bool = False


@dataclass(frozen=True)
class Unsquat:
    ns: str
    name: str


@dataclass(frozen=True)
class Kill:
    """The controller ends: SIGKILL, or SIGTERM if `graceful`."""

    graceful: bool = False


@dataclass(frozen=True)
class Start:
    """A new controller process (if none runs)."""


@dataclass(frozen=True)
class CutWatches:
    """Every connection between the controller and the API server reset; new ones refused."""


@dataclass(frozen=True)
class RestoreWatches:
    pass


@dataclass(frozen=True)
class Blackhole:
    """Every open connection of the controller silenced (never closed); new ones flow."""


@dataclass(frozen=True)
class ApiServerRestart:
    """kube-apiserver stopped until the controller is not ready, then started again."""


@dataclass(frozen=True)
class Converge:
    """A convergence point: faults end, the controller runs, and once it is idle every place
    must be exactly where the oracle says it rests, `within` seconds."""

    within: float = 60.0


Op = (
    NsCreate
    | NsLabel
    | NsDelete
    | SourceCreate
    | SourceData
    | SourceLabel
    | SourceExportTo
    | SourceExportKeys
    | SourceRetype
    | SourceDelete
    | GrantCreate
    | GrantDelete
    | ExportCreate
    | ExportUpdate
    | ExportDelete
    | CopyEdit
    | CopyDelete
    | Squat
    | Unsquat
    | Kill
    | Start
    | CutWatches
    | RestoreWatches
    | Blackhole
    | ApiServerRestart
    | Converge
)
FAULT_OPS = (Kill, Start, CutWatches, RestoreWatches, Blackhole, ApiServerRestart)


def render(ops: Sequence[Op], indent: int = 8) -> str:
    """The operations as Python list items, one a line (every field spelled out)."""
    pad = " " * indent
    lines = []
    for op in ops:
        args = ", ".join(f"{f.name}={getattr(op, f.name)!r}" for f in fields(op))
        lines.append(f"{pad}{type(op).__name__}({args}),")
    return "\n".join(lines)


# --- the generator -------------------------------------------------------------------------------


@dataclass
class View:
    """What the generator may know of the run so far (all of it the run's own doing, but the
    copies, which are what the last observation saw)."""

    namespaces: Mapping[str, str | None]
    """Existing (not terminating) namespaces and their pack label."""
    sources: Mapping[tuple[str, str], str]
    """Existing sources and their type."""
    grants: Mapping[str, GrantCreate]
    squatters: frozenset[tuple[str, str]]
    copies: frozenset[tuple[str, str]]
    controller_up: bool
    watches_cut: bool
    exports: Mapping[tuple[str, str], ExportCreate] = field(default_factory=dict)
    """Existing exports (not in a terminating namespace), by (namespace, name)."""


class Generator:
    """Draws operations from a seed; `faults` says which kinds of fault it may inject."""

    def __init__(self, seed: int, faults: Sequence[str] = QUICK_FAULTS, converge_every: int = 6):
        unknown = set(faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
        self.rng = random.Random(seed)
        self.faults = tuple(faults)
        self.converge_every = converge_every
        self._values = 0
        self._since_converge = 0

    def value(self) -> str:
        self._values += 1
        return f"v{self._values}"

    def data(self) -> Data:
        keys = self.rng.choice((("k",), ("k", "x"), ("k", "x"), ("k", "x"), ("x",)))
        return tuple((k, self.value()) for k in keys)

    def spec(self, view: View, grant: str) -> GrantCreate:
        """A grant spec: most name an existing source and existing namespaces (so that both
        consents often hold), the rest anything of the universe."""
        rng = self.rng
        if view.sources and rng.random() < 0.9:
            source = rng.choice(sorted(view.sources))
        else:
            source = (rng.choice(NAMESPACES), rng.choice(SOURCES))
        pool = [n for n in sorted(view.namespaces) if n != source[0]] or list(NAMESPACES)
        if rng.random() < 0.1:
            pool = list(NAMESPACES)  # the source's own, a missing or the protected one
        listed = tuple(sorted(rng.sample(pool, min(len(pool), rng.choice((0, 1, 2, 3, 3, 3))))))
        selector = "x" if not listed or rng.random() < 0.3 else None
        keys = rng.choice(
            (None,) * 6 + ((("k", "k"),), (("k", "t"),), (("k", "k"), ("x", "x")), (("z", "z"),))
        )
        return GrantCreate(
            grant,
            source,
            listed,
            selector,
            rng.choice(TARGETS),
            keys,
            rng.choice(("Delete", "Delete", "Retain")),
            rng.choice(("Retain", "Retain", "Delete")),
        )

    def _retype(self, type_: str) -> str:
        """Another type: a refused one (a bootstrap token) one time in five."""
        if type_ != TYPES[2] and self.rng.random() < 0.2:
            return TYPES[2]
        return next(t for t in TYPES[:2] if t != type_) if type_ in TYPES[:2] else TYPES[0]

    def _export(self, view: View) -> Op:
        """Most exports stand beside a source (an unlabelled one is projected only so); one
        draw in ten names an export that may not exist (an update or delete that does not
        apply)."""
        rng = self.rng
        homes = sorted({ns for ns, _ in view.sources if ns in view.namespaces})
        if homes and rng.random() < 0.85:
            ns = rng.choice(homes)
        else:
            ns = rng.choice(tuple(view.namespaces) or NAMESPACES)
        name = rng.choice(EXPORTS)
        spec = view.exports.get((ns, name))
        if spec is None:
            if rng.random() < 0.1:
                return rng.choice(
                    (
                        ExportUpdate(ns, name, rng.choice(EXPORT_TOS), rng.choice(EXPORT_SCOPES)),
                        ExportDelete(ns, name),
                    )
                )
            beside = sorted(n for n_, n in view.sources if n_ == ns)
            source = rng.choice(beside) if beside and rng.random() < 0.9 else rng.choice(SOURCES)
            return ExportCreate(ns, name, source, rng.choice(EXPORT_TOS), rng.choice(EXPORT_SCOPES))
        to, keys = rng.choice(EXPORT_TOS), rng.choice(EXPORT_SCOPES)
        return rng.choice(
            (
                ExportUpdate(ns, name, to, spec.keys),
                ExportUpdate(ns, name, to, spec.keys),
                ExportUpdate(ns, name, spec.to, keys),
                ExportUpdate(ns, name, to, keys),
                ExportDelete(ns, name),
            )
        )

    def next(self, view: View) -> Op:
        self._since_converge += 1
        if self._since_converge > self.converge_every and self.rng.random() < 0.5:
            self._since_converge = 0
            return Converge()
        while True:
            op = self._draw(view)
            if op is not None:
                return op

    def _draw(self, view: View) -> Op | None:
        rng = self.rng
        weights = {
            "ns": 10,
            "source": 28,
            "grant": 26,
            "export": 12,
            "copy": 12,
            "squat": 6,
            "fault": 12,
        }
        if not self.faults:
            weights["fault"] = 0
        if len(view.sources) < 2:
            weights["source"] *= 3  # a world without sources or grants projects nothing
        if not view.grants:
            weights["grant"] *= 3
        kind = rng.choices(tuple(weights), weights=tuple(weights.values()))[0]
        if kind == "ns":
            ns = rng.choice(NAMESPACES)
            if ns not in view.namespaces:
                return NsCreate(ns, rng.choice(PACKS))
            return rng.choice((NsLabel(ns, rng.choice(PACKS)),) * 5 + (NsDelete(ns),))
        if kind == "source":
            key = (rng.choice(tuple(view.namespaces) or NAMESPACES), rng.choice(SOURCES))
            if key not in view.sources:
                return SourceCreate(
                    *key,
                    self.data(),
                    rng.choice(TYPES[:2] * 4 + TYPES[2:]),
                    rng.choice(LABELS),
                    rng.choice(EXPORT_TO),
                )
            return rng.choice(
                (
                    SourceData(*key, self.data()),
                    SourceData(*key, self.data()),
                    SourceData(*key, self.data()),
                    SourceLabel(*key, rng.choice(LABELS)),
                    SourceExportTo(*key, rng.choice(EXPORT_TO)),
                    SourceExportTo(*key, rng.choice(EXPORT_TO)),
                    SourceRetype(*key, self._retype(view.sources[key])),
                    SourceDelete(*key),
                    SourceData(*key, self.data()),
                    SourceExportTo(*key, rng.choice(EXPORT_TO)),
                    SourceExportKeys(*key, rng.choice(EXPORT_KEYS)),
                    SourceExportKeys(*key, rng.choice(EXPORT_KEYS)),
                )
            )
        if kind == "export":
            return self._export(view)
        if kind == "grant":
            grant = rng.choice(GRANTS)
            if grant not in view.grants:
                return self.spec(view, grant)
            spec = view.grants[grant]
            new = self.spec(view, grant)
            field = rng.choice(
                ("source", "namespaces", "target", "keys", "on_revoke", "on_source_deleted", "all")
            )
            changes = {f.name: getattr(new, f.name) for f in fields(new)}
            if field != "all":
                changes = {field: changes[field]}
                if field == "namespaces" and not changes["namespaces"] and not spec.selector:
                    changes["selector"] = "x"
            updated = {f.name: getattr(spec, f.name) for f in fields(spec)} | changes
            return rng.choice((GrantUpdate(**updated),) * 5 + (GrantDelete(grant),))
        if kind == "copy":
            if not view.copies:
                return None
            place = rng.choice(sorted(view.copies))
            return rng.choice((CopyEdit(*place, self.value()), CopyDelete(*place)))
        if kind == "squat":
            if view.squatters and rng.random() < 0.4:
                return Unsquat(*rng.choice(sorted(view.squatters)))
            ns = rng.choice(tuple(view.namespaces) or NAMESPACES)
            return Squat(ns, rng.choice(PLACE_NAMES), self.value(), rng.random() < 0.3)
        fault = rng.choice(self.faults)
        if fault == "kill":
            return Kill(rng.random() < 0.3) if view.controller_up else Start()
        if fault == "watch":
            return RestoreWatches() if view.watches_cut else CutWatches()
        if fault == "blackhole":
            return Blackhole()
        return ApiServerRestart()

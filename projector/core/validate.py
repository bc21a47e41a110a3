"""Offline validation of ProjectionGrant and ProjectionExport manifests against their CRDs.

The rules are read from the CustomResourceDefinitions that the chart installs (never a second,
hand-copied schema), one per kind (`CRDS`): each document is checked against its own kind's
CRD, so grants and exports may share a file. The CRD's OpenAPI v3 schema is checked with
`jsonschema`, and every `x-kubernetes-validations` CEL rule is evaluated with a CEL
interpreter, as the API server does, with `self` bound to the value at the rule's place.
Kubernetes adds CEL extension libraries to the standard ones; those the CRDs' rules use are
provided here (`KUBERNETES_CEL`) and a rule calling anything else is reported as an error
rather than passed.

Like `kubectl apply` (strict field validation), a field the schema does not declare is an
error, since the API server would drop it. Each error names the file and line, the field, and
a message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import cel
import jsonschema
import yaml

from projector.core.model import EXPORT_TO_ANNOTATION, is_exported
from projector.core.names import is_label, is_subdomain

CRDS: Mapping[str, tuple[str, str]] = {
    "ProjectionGrant": ("crd.yaml", "projector.nebari.dev_projectiongrants.yaml"),
    "ProjectionExport": ("export-crd.yaml", "projector.nebari.dev_projectionexports.yaml"),
}
"""Each kind validated by default: the name its CRD is packaged under in the wheel (beside this
package's modules, `[tool.hatch.build.targets.wheel.force-include]` in pyproject.toml), and the
chart's file it comes from, read from a checkout when the package carries none (editable)."""
_CHART_CRDS = Path(__file__).resolve().parents[2] / "deploy/helm/projector/crds"
_REQUIRED = re.compile(r"'(.+)' is a required property")

KUBERNETES_CEL: Mapping[str, Callable[..., Any]] = {
    "split": lambda s, sep: s.split(sep),
}
"""Functions of the Kubernetes CEL strings extension that the CRD's rules use."""


@dataclass(frozen=True, slots=True)
class Error:
    """One problem in one manifest."""

    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.field}: {self.message}"


@dataclass(frozen=True, slots=True)
class Rule:
    """One CEL rule of the CRD and the schema path it applies at."""

    rule: str
    message: str
    field_path: str = ""


class Crd:
    """What validation needs from a CRD: kind, scope, served apiVersions, schema and CEL rules."""

    def __init__(self, crd: Mapping[str, Any], source: str) -> None:
        self.source = source
        spec = crd["spec"]
        self.kind: str = spec["names"]["kind"]
        self.namespaced: bool = spec.get("scope") == "Namespaced"
        self.schemas: dict[str, dict[str, Any]] = {
            f"{spec['group']}/{v['name']}": v["schema"]["openAPIV3Schema"]
            for v in spec["versions"]
            if v.get("served", True)
        }

    @classmethod
    def load(cls, path: Path | None = None, kind: str = "ProjectionGrant") -> Crd:
        """The CRD at `path`; by default `kind`'s packaged one, else the chart's in a checkout."""
        if path is not None:
            return cls(yaml.safe_load(path.read_text()), str(path))
        resource, chart_file = CRDS[kind]
        packaged = resources.files("projector") / resource
        if packaged.is_file():
            return cls(yaml.safe_load(packaged.read_text()), f"projector/{resource}")
        chart = _CHART_CRDS / chart_file
        return cls(yaml.safe_load(chart.read_text()), str(chart))


def load_crds(paths: Sequence[Path] = ()) -> dict[str, Crd]:
    """The CRD of each kind to validate, by kind.

    Every kind of `CRDS` from the package (or the checkout); each CRD at `paths` in place of
    its kind's (or beside them, for another kind).
    """
    crds = {kind: Crd.load(kind=kind) for kind in CRDS}
    for path in paths:
        crd = Crd.load(path)
        crds[crd.kind] = crd
    return crds


def _strict(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema as JSON Schema: objects with declared properties refuse unknown fields."""
    out: dict[str, Any] = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    if isinstance(schema.get("items"), Mapping):
        out["items"] = _strict(schema["items"])
    if schema.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True  # the API server refuses a duplicate in a set
    if isinstance(schema.get("additionalProperties"), Mapping):
        out["additionalProperties"] = _strict(schema["additionalProperties"])
    if (
        out.get("type") == "object"
        and "properties" not in schema
        and "additionalProperties" not in schema
    ):
        out.pop("additionalProperties", None)  # e.g. metadata: {type: object}
    return out


Path_ = tuple[str | int, ...]


def _field(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


def _line(node: yaml.Node, path: Path_) -> int:
    """The 1-based line of the deepest element of `path` in the YAML (a field's key line)."""
    line = int(node.start_mark.line)
    for p in path:
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == p), None)
            if pair is None:
                break
            line, node = int(pair[0].start_mark.line), pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(p, int) and p < len(node.value):
            node = node.value[p]
            line = int(node.start_mark.line)
        else:
            break
    return line + 1


def _rules_at(
    schema: Mapping[str, Any], value: Any, path: Path_
) -> Iterator[tuple[Path_, Any, Rule]]:
    """Every (place, value, rule) of the CEL rules that apply to `value`, depth first."""
    if isinstance(value, Mapping):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from _rules_at(sub, value[name], (*path, name))
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for k, v in value.items():
                yield from _rules_at(extra, v, (*path, k))
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, v in enumerate(value):
            yield from _rules_at(schema["items"], v, (*path, i))
    for r in schema.get("x-kubernetes-validations", ()):
        if "oldSelf" in r["rule"]:
            continue  # a transition rule: the API server checks it on updates only, never here
        yield path, value, Rule(r["rule"], r.get("message", ""), r.get("fieldPath", ""))


def _evaluate(rule: Rule, value: Any) -> str | None:
    """None if the rule holds, else the error message."""
    context = cel.Context()
    for name, fn in KUBERNETES_CEL.items():
        context.add_function(name, fn)
    context.add_variable("self", value)
    try:
        result = cel.evaluate(rule.rule, context)
    except Exception as e:  # the interpreter raises RuntimeError/ValueError/TypeError alike
        return f"rule {rule.rule!r} could not be evaluated: {e}"
    if result is True:
        return None
    return rule.message or f"failed rule: {rule.rule}"


def check_document(crd: Crd, doc: Any, node: yaml.Node, file: str) -> list[Error]:
    """Every error in one document of `crd`'s kind, as the API server would report it."""
    api_version = doc.get("apiVersion")
    schema = crd.schemas.get(str(api_version))
    if schema is None:
        served = ", ".join(sorted(crd.schemas))
        return [
            Error(file, _line(node, ("apiVersion",)), "apiVersion", f"must be one of: {served}")
        ]
    errors: list[Error] = []

    def add(path: Path_, message: str) -> None:
        errors.append(Error(file, _line(node, path), _field(path), message))

    meta = doc.get("metadata") if isinstance(doc.get("metadata"), Mapping) else {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        add(("metadata",), "metadata.name is required")
    elif not is_subdomain(name):
        add(("metadata", "name"), "must be a DNS-1123 subdomain (lower case, digits, '-', '.')")
    # A namespaced object's namespace may be left to kubectl's context, but not be malformed.
    if crd.namespaced and "namespace" in meta and not is_label(meta["namespace"]):
        add(("metadata", "namespace"), "must be a DNS-1123 label (lower case, digits, '-')")

    bad_places: list[Path_] = []
    validator = jsonschema.Draft7Validator(_strict(schema))
    for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        path: Path_ = tuple(e.absolute_path)
        bad_places.append(path)
        if e.validator == "additionalProperties" and isinstance(e.instance, Mapping):
            declared = e.schema.get("properties", {}) if isinstance(e.schema, Mapping) else {}
            for extra in sorted(k for k in e.instance if k not in declared):
                add((*path, extra), "unknown field (the API server would drop it)")
            continue
        missing = _REQUIRED.fullmatch(e.message) if e.validator == "required" else None
        if missing is not None:  # name the missing field itself, as the API server does
            add((*path, missing.group(1)), "required field missing")
            continue
        add(path, _schema_message(e))
    for path, value, rule in _rules_at(schema, doc, ()):
        # CEL runs on well-typed values only, as in the API server; the schema error is enough.
        if any(b[: len(path)] == path for b in bad_places):
            continue
        message = _evaluate(rule, value)
        if message is not None:
            place = path + tuple(p for p in rule.field_path.split(".") if p)
            add(place, message)
    return errors


def _schema_message(e: jsonschema.ValidationError) -> str:
    """The API server's words where jsonschema's would quote a whole (maybe huge) value."""
    if e.validator == "pattern":
        return f"{e.instance!r} does not match {e.validator_value!r}"
    if e.validator == "enum":
        values = e.validator_value if isinstance(e.validator_value, list) else []
        return f"{e.instance!r} is not one of {', '.join(map(str, values))}"
    size = len(e.instance) if isinstance(e.instance, (list, str)) else 0
    if e.validator == "maxItems":
        return f"too many: {size}: must have at most {e.validator_value} items"
    if e.validator == "minItems":
        return f"should have at least {e.validator_value} items"
    if e.validator == "maxLength":
        return f"too long: {size}: may not be longer than {e.validator_value}"
    if e.validator == "minLength":
        return f"should be at least {e.validator_value} chars long"
    if e.validator == "uniqueItems" and isinstance(e.instance, list):
        items = e.instance
        dup = next((v for i, v in enumerate(items) if v in items[:i]), None)
        return f"duplicate value: {dup!r}"
    return e.message


def manifests(paths: Sequence[Path]) -> Iterator[Path]:
    """The YAML files named, directories searched recursively in sorted order."""
    for p in paths:
        if p.is_dir():
            yield from sorted(f for f in p.rglob("*") if f.suffix in (".yaml", ".yml"))
        else:
            yield p


def check_file(crds: Crd | Mapping[str, Crd], path: Path) -> tuple[dict[str, int], list[Error]]:
    """({kind: documents found}, errors) in one file; kinds without a CRD here are skipped.

    A file may hold several documents of several kinds: each is checked against its own CRD.
    """
    by_kind = {crds.kind: crds} if isinstance(crds, Crd) else crds
    found: dict[str, int] = {}
    file = str(path)
    try:
        text = path.read_text()
    except OSError as e:
        return found, [Error(file, 0, "(file)", e.strerror or str(e))]
    loader = yaml.SafeLoader(text)
    errors: list[Error] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            doc = loader.construct_document(node)
            crd = by_kind.get(str(doc.get("kind"))) if isinstance(doc, Mapping) else None
            if crd is None:
                continue
            found[crd.kind] = found.get(crd.kind, 0) + 1
            errors += check_document(crd, doc, node, file)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else 0
        errors.append(Error(file, line, "(yaml)", f"{e.problem or e}"))
    finally:
        loader.dispose()
    return found, errors


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def consent_warnings(paths: Sequence[Path]) -> list[str]:
    """Warnings (never errors: the API server accepts all of it) on consent, across all `paths`.

    A grant that selects namespaces by label, whose source (found among the same manifests)
    is exported to `*` or a glob (by its export-to annotation or by a ProjectionExport), hands
    a copy to any namespace that is labelled to match: it is only as safe as who may label or
    create namespaces (docs/security.md). An export whose `to` names its own namespace says
    something that never happens: the source's namespace never receives a copy.
    """
    selecting: list[tuple[str, tuple[str, str, str]]] = []
    open_sources: dict[tuple[str, str, str], str] = {}
    own_namespace: list[str] = []
    for path in manifests(paths):
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except (OSError, yaml.YAMLError):
            continue  # check_file reports it
        for doc in map(_map, docs):
            meta, spec = _map(doc.get("metadata")), _map(doc.get("spec"))
            source = _map(spec.get("source"))
            if doc.get("kind") == "ProjectionGrant":
                if _map(spec.get("target")).get("namespaceSelector") is not None:
                    kind = str(source.get("kind") or "Secret")
                    key = (kind, str(source.get("namespace")), str(source.get("name")))
                    selecting.append((f"{path}: ProjectionGrant {meta.get('name')}", key))
            elif doc.get("kind") == "ProjectionExport":
                ns, to = str(meta.get("namespace")), spec.get("to")
                to = [str(t) for t in to] if isinstance(to, list) else []
                key = (str(source.get("kind") or "Secret"), ns, str(source.get("name")))
                if any(c in t for t in to for c in "*?["):
                    by = f"ProjectionExport {ns}/{meta.get('name')}"
                    open_sources.setdefault(key, f"is exported to {','.join(to)!r} by {by}")
                if "namespace" in meta and ns in to:
                    own_namespace.append(
                        f"{path}: ProjectionExport {ns}/{meta.get('name')}: spec.to names its "
                        f"own namespace {ns!r}, which never receives a copy of its own source"
                    )
            elif doc.get("kind") in ("Secret", "ConfigMap"):
                export_to = str(_map(meta.get("annotations")).get(EXPORT_TO_ANNOTATION, ""))
                if is_exported(_map(meta.get("labels"))) and any(c in export_to for c in "*?["):
                    key = (str(doc["kind"]), str(meta.get("namespace")), str(meta.get("name")))
                    open_sources[key] = f"exports to {export_to!r}"
    return [
        f"{where}: selects namespaces by label and its source {kind} {ns}/{name} "
        f"{open_sources[(kind, ns, name)]}: any namespace labelled to match gets a copy, so "
        "this is only as safe as who may label namespaces (docs/security.md)"
        for where, (kind, ns, name) in selecting
        if (kind, ns, name) in open_sources
    ] + own_namespace

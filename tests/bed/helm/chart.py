"""The Helm chart as the one source of truth for everything else `deploy/` and the docs ship.

`python -m tests.bed.helm.chart` (or `make manifests`) renders the chart with helm and writes:

- `deploy/install.yaml`: the Namespace, then `helm template --include-crds` with default values,
  for `kubectl apply` users;
- `deploy/crds/`: the chart's CRD, byte for byte (the control plane of the tests installs it);
- `deploy/rbac/rbac.yaml`: the ServiceAccount, ClusterRole, Roles and bindings (the tests run the
  controller with exactly these);
- `deploy/rbac/admission.yaml`: the ValidatingAdmissionPolicy and binding that confine that
  ServiceAccount's writes (installed with the RBAC, so every controller test runs under it);
- `deploy/rbac/rollouts/rbac.yaml` and `deploy/rbac/rollouts/admission.yaml`: what
  `rollouts.enabled=true` adds to them (the rollout tests add exactly these);
- `docs/reference/grant.md`: the grant reference, generated from the CRD's schema.

`--check` writes nothing and exits 1 naming every stale file; the test suite runs it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deploy" / "helm" / "projector"
CRD_FILE = "projector.nebari.dev_projectiongrants.yaml"
EXPORT_CRD_FILE = "projector.nebari.dev_projectionexports.yaml"
WHO = {
    "ProjectionGrant": "only cluster admins can create one",
    "ProjectionExport": "whoever holds the admin or edit role in a namespace may create one there",
}
"""Who may create each kind, for its reference page."""
BUILD_SCRIPT = Path(__file__).resolve().parent / "build.sh"
RELEASE, NAMESPACE = "projector", "projector-system"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")

GENERATED = "# Generated from deploy/helm/projector by `make manifests`; do not edit.\n"


def helm_binary() -> Path:
    """Build helm from its Go module (a no-op when cached) and return its path."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{BUILD_SCRIPT} failed with exit code {result.returncode}")
    return Path(lines[-1])


def helm(binary: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """Run helm; its stdout, or RuntimeError with its stderr."""
    result = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, check=False, env=env, timeout=300
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)}: exit {result.returncode}\n{result.stderr}")
    return result.stdout


def template(binary: Path, *args: str) -> str:
    """`helm template` of the chart as release `projector` in `projector-system`."""
    return helm(binary, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)


def documents(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a stream."""
    return [d for d in yaml.safe_load_all(text) if d]


def _dump(docs: Sequence[Mapping[str, Any]]) -> str:
    return "---\n".join(yaml.safe_dump(dict(d), sort_keys=False, width=100) for d in docs)


def render(binary: Path) -> dict[Path, str]:
    """Every generated file and its content."""
    crd = (CHART / "crds" / CRD_FILE).read_text()
    export_crd = (CHART / "crds" / EXPORT_CRD_FILE).read_text()
    rendered = template(binary, "--include-crds")
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    install = (
        GENERATED
        + "# kubectl apply --server-side -f deploy/install.yaml  (the chart's default values)\n"
        + "---\n"
        + yaml.safe_dump(namespace, sort_keys=False)
        + rendered
    )
    default = documents(template(binary))
    rbac = [d for d in default if d["kind"] in RBAC_KINDS]
    admission = [d for d in default if d["kind"] in ADMISSION_KINDS]
    with_rollouts = documents(template(binary, "--set=rollouts.enabled=true"))
    rollouts = [d for d in with_rollouts if d["kind"] in RBAC_KINDS and d not in rbac]
    rollouts_admission = [
        d for d in with_rollouts if d["kind"] in ADMISSION_KINDS and d not in admission
    ]
    return {
        REPO / "deploy" / "install.yaml": install,
        REPO / "deploy" / "crds" / CRD_FILE: GENERATED + crd,
        REPO / "deploy" / "crds" / EXPORT_CRD_FILE: GENERATED + export_crd,
        REPO / "deploy" / "rbac" / "rbac.yaml": GENERATED + _dump(rbac),
        REPO / "deploy" / "rbac" / "admission.yaml": GENERATED + _dump(admission),
        REPO / "deploy" / "rbac" / "rollouts" / "rbac.yaml": GENERATED + _dump(rollouts),
        REPO / "deploy" / "rbac" / "rollouts" / "admission.yaml": GENERATED
        + _dump(rollouts_admission),
        REPO / "docs" / "reference" / "grant.md": reference(yaml.safe_load(crd)),
        REPO / "docs" / "reference" / "export.md": reference(yaml.safe_load(export_crd)),
    }


def stale(files: Mapping[Path, str]) -> list[Path]:
    """The generated files whose committed content differs from what the chart renders."""
    return [p for p, text in files.items() if not p.exists() or p.read_text() != text]


# --- the grant reference, from the CRD's schema ---------------------------------------------------


def _type(schema: Mapping[str, Any]) -> str:
    t = str(schema.get("type", "object"))
    if t == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if t == "object" and "additionalProperties" in schema:
        return f"map of {_type(schema['additionalProperties'])}"
    return t


def _constraints(schema: Mapping[str, Any]) -> list[str]:
    out = []
    for key, label in (
        ("enum", "one of"),
        ("default", "default"),
        ("pattern", "pattern"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
    ):
        if key in schema:
            value = schema[key]
            shown = ", ".join(f"`{v}`" for v in value) if key == "enum" else f"`{value}`"
            if key == "default" and value == {}:
                shown = "`{}`"
            out.append(f"{label} {shown}")
    if schema.get("x-kubernetes-list-type") == "set":
        out.append("unique items")
    return out


def _fields(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    required = set(schema.get("required", ()))
    for name, sub in schema.get("properties", {}).items():
        p = f"{path}.{name}" if path else name
        yield p, sub, name in required
        yield from _fields(sub, p)
        items = sub.get("items")
        if isinstance(items, Mapping) and "properties" in items:
            yield from _fields(items, f"{p}[]")


def _rules(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, str, str]]:
    for rule in schema.get("x-kubernetes-validations", ()):
        yield path or "(root)", rule["rule"], rule.get("message", "")
    for name, sub in schema.get("properties", {}).items():
        yield from _rules(sub, f"{path}.{name}" if path else name)
    items = schema.get("items")
    if isinstance(items, Mapping):
        yield from _rules(items, f"{path}[]")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference(crd: Mapping[str, Any]) -> str:
    """A kind's reference page, every field and rule as its CRD declares it."""
    version = crd["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    lines = [
        "<!-- Generated from the CRD in deploy/helm/projector/crds/ by `make manifests`. -->",
        f"# {kind} reference",
        "",
        f"`apiVersion: {group}/{version['name']}`, `kind: {kind}`, "
        f"scope `{crd['spec']['scope']}` ({WHO[kind]}). "
        "Short names: " + ", ".join(f"`{n}`" for n in crd["spec"]["names"]["shortNames"]) + ".",
        "",
        f"Every rule below is enforced by the API server when a {kind} is applied, and by "
        "`projector validate` offline (it reads this same CRD).",
        "",
        "## Fields of `spec`",
        "",
        "| field | type | required | constraints | description |",
        "|---|---|---|---|---|",
    ]
    for path, sub, required in _fields(spec, "spec"):
        lines.append(
            f"| `{path}` | {_type(sub)} | {'yes' if required else ''} | "
            f"{_cell('; '.join(_constraints(sub)))} | {_cell(str(sub.get('description', '')))} |"
        )
    lines += [
        "",
        "## Validation rules (CEL)",
        "",
        "| applies to | rule | message |",
        "|---|---|---|",
    ]
    for path, rule, message in _rules(spec, "spec"):
        lines.append(f"| `{path}` | `{_cell(rule)}` | {_cell(message)} |")
    lines += [
        "",
        "## Printer columns",
        "",
        "| column | JSONPath |",
        "|---|---|",
    ]
    for col in version.get("additionalPrinterColumns", ()):
        lines.append(f"| {col['name']} | `{col['jsonPath']}` |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    """Write the generated files, or with --check name the stale ones and exit 1."""
    files = render(helm_binary())
    if "--check" in argv:
        bad = stale(files)
        for p in bad:
            print(f"stale: {p.relative_to(REPO)} (run `make manifests`)", file=sys.stderr)
        return 1 if bad else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Check Kubernetes / KServe manifests offline against the API models of the official Python clients.

    python scripts/validate_manifests.py deploy/kserve/*.yaml

No cluster is needed: every field name and value type is checked against the `openapi_types` and
`attribute_map` of the generated models in the `kserve` and `kubernetes` packages (read as source,
not imported: `pip install --no-deps kserve kubernetes` is enough, scripts/test.sh does it).
A misspelt or misplaced field, a list where an object belongs, a number where a flag belongs: all
are reported with their path. Not checked: values inside strings (quantities, enums), required
fields, admission webhooks, and whether the cluster's KServe version has every field.
"""

import ast
import functools
import importlib.util
import re
import sys
from pathlib import Path

import yaml

from ts_compiled_handlers.scripts.python_source import parsed

# (apiVersion, kind) -> the model class of the document
KINDS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "Pod"): "V1Pod",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
}
# Strings take numbers too: quantities ("2" or 2) and int-or-string fields are written either way.
SCALARS = {
    **dict.fromkeys(("str", "datetime", "bytes", "ResourceQuantity"), (str, int, float)),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "object": (object,),
}


def _model_files() -> list[Path]:
    files = []
    for package, models in (("kserve", "models"), ("kubernetes", "client/models")):
        spec = importlib.util.find_spec(package)  # finds, does not import (kserve's imports are heavy)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"the '{package}' package is needed: pip install --no-deps {package}")
        files += sorted((Path(spec.submodule_search_locations[0]) / models).glob("*.py"))
    return files


@functools.cache
def models() -> dict[str, tuple[dict, dict]]:
    """Class name -> (field -> type string, field -> JSON key), from every generated model."""
    found = {}
    for path in _model_files():
        for node in parsed(path).body:
            if isinstance(node, ast.ClassDef):
                tables = {
                    target.id: ast.literal_eval(statement.value)
                    for statement in node.body
                    if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None
                    for target in getattr(statement, "targets", [getattr(statement, "target", None)])
                    if isinstance(target, ast.Name) and target.id in ("openapi_types", "attribute_map")
                }
                if len(tables) == 2:
                    found[node.name] = (tables["openapi_types"], tables["attribute_map"])
    return found


def check(value, type_name: str, path: str) -> list[str]:
    """Errors of `value` against the generated type `type_name` (a class, list[...], dict(str, ...), scalar)."""
    if value is None:
        return []
    if match := re.fullmatch(r"[lL]ist\[(.+)\]", type_name):
        if not isinstance(value, list):
            return [f"{path}: a list was expected"]
        return [error for i, item in enumerate(value) for error in check(item, match.group(1), f"{path}[{i}]")]
    if match := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name):
        if not isinstance(value, dict):
            return [f"{path}: a mapping was expected"]
        inner = match.group(1) or match.group(2)
        return [error for key, item in value.items() for error in check(item, inner, f"{path}.{key}")]
    if type_name in SCALARS:
        ok = isinstance(value, SCALARS[type_name]) and not (type_name != "bool" and isinstance(value, bool))
        return [] if ok or type_name == "object" else [f"{path}: {type_name} expected, got {type(value).__name__}"]
    return check_object(value, type_name, path)


def check_object(value, type_name: str, path: str) -> list[str]:
    """Errors of a mapping against a generated model class: unknown keys, then each field's value."""
    if type_name not in models():
        return [f"{path}: unknown type {type_name}"]
    if not isinstance(value, dict):
        return [f"{path}: an object ({type_name}) was expected"]
    types, keys = models()[type_name]
    fields = {json_key: field for field, json_key in keys.items()}
    errors = [f"{path}.{key}: no such field in {type_name}" for key in value if key not in fields]
    for key, item in value.items():
        if key in fields:
            errors += check(item, types[fields[key]], f"{path}.{key}")
    return errors


def validate(document: dict) -> list[str]:
    kind = (document.get("apiVersion"), document.get("kind"))
    if kind not in KINDS:
        return [f"{kind}: not a kind this check knows ({', '.join(k for _, k in KINDS)})"]
    return check(document, KINDS[kind], document["kind"])


def validate_file(path: Path) -> list[str]:
    return [f"{path}: {error}" for document in yaml.safe_load_all(path.read_text()) for error in validate(document)]


def main(argv=None) -> int:
    paths = [Path(arg) for arg in (argv if argv is not None else sys.argv[1:])]
    errors = [error for path in paths for error in validate_file(path)]
    print("\n".join(errors) or f"{len(paths)} file(s) valid")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

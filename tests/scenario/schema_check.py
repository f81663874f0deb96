"""Validate a result against results/schema/result.schema.json, with or without jsonschema.

Every end-to-end test validates what stallbench wrote. Where the `jsonschema` package is
installed (here, CI: scripts/setup installs it) it does the work. Where it is not (the
GPU machine, which has no registry), a strict built-in validator does, for exactly the
keywords our schema uses; a schema that uses any other keyword is refused, so validation
is never skipped and never weakened in silence. tests/scenario/test_schema_check.py holds
the two against each other on every published result and on broken copies of them.

    errors(doc, schema) -> list of "path: message" strings (empty when valid)
    validator_name()    -> "jsonschema x.y" or "built-in"
"""
import math
import re

# The keywords the built-in validator implements. Annotations are accepted and ignored.
_ANNOTATIONS = {"$schema", "$id", "title", "description", "$comment", "examples", "default"}
_IMPLEMENTED = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "const", "enum",
    "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "minLength", "pattern", "$ref", "$defs",
    "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
}


def _use_jsonschema():
    try:
        import jsonschema  # noqa: F401
        return jsonschema
    except ImportError:
        return None


def validator_name():
    js = _use_jsonschema()
    if js is None:
        return "built-in"
    try:
        from importlib.metadata import version
        return "jsonschema " + version("jsonschema")
    except Exception:
        return "jsonschema"


def _type_ok(value, t):
    if isinstance(t, list):
        return any(_type_ok(value, x) for x in t)
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list)
    if t == "string":
        return isinstance(value, str)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "null":
        return value is None
    if t == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value == int(value))
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    raise ValueError(f"schema: unknown type {t!r}")


def _equal(a, b):
    # JSON equality: 1 == 1.0, but true != 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


class _Builtin:
    def __init__(self, root):
        self.root = root
        self._check_keywords(root, "#")

    def _check_keywords(self, s, where):
        if isinstance(s, bool):
            return
        if not isinstance(s, dict):
            raise ValueError(f"schema {where}: not an object")
        unknown = set(s) - _IMPLEMENTED - _ANNOTATIONS
        if unknown:
            raise ValueError(f"schema {where}: keyword(s) {sorted(unknown)} not implemented by the built-in "
                             "validator; install jsonschema or extend tests/scenario/schema_check.py")
        for k in ("properties", "$defs"):
            for name, sub in s.get(k, {}).items():
                self._check_keywords(sub, f"{where}/{k}/{name}")
        for k in ("additionalProperties", "items", "not", "if", "then", "else"):
            if k in s and not isinstance(s[k], bool):
                self._check_keywords(s[k], f"{where}/{k}")
        for k in ("allOf", "anyOf", "oneOf"):
            for i, sub in enumerate(s.get(k, [])):
                self._check_keywords(sub, f"{where}/{k}/{i}")

    def _resolve(self, ref):
        if not ref.startswith("#/"):
            raise ValueError(f"schema: only local $ref is supported, not {ref!r}")
        node = self.root
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def errors(self, v, s, path="$"):
        if s is True:
            return []
        if s is False:
            return [f"{path}: no value is allowed here"]
        out = []
        if "$ref" in s:
            out += self.errors(v, self._resolve(s["$ref"]), path)
        if "type" in s and not _type_ok(v, s["type"]):
            return out + [f"{path}: {v!r:.60} is not of type {s['type']!r}"]
        if "const" in s and not _equal(v, s["const"]):
            out.append(f"{path}: {v!r:.60} is not {s['const']!r}")
        if "enum" in s and not any(_equal(v, e) for e in s["enum"]):
            out.append(f"{path}: {v!r:.60} is not one of {s['enum']!r}")
        num = isinstance(v, (int, float)) and not isinstance(v, bool)
        if num and "minimum" in s and v < s["minimum"]:
            out.append(f"{path}: {v} is less than the minimum {s['minimum']}")
        if num and "exclusiveMinimum" in s and v <= s["exclusiveMinimum"]:
            out.append(f"{path}: {v} is not greater than {s['exclusiveMinimum']}")
        if num and "maximum" in s and v > s["maximum"]:
            out.append(f"{path}: {v} is more than the maximum {s['maximum']}")
        if num and "exclusiveMaximum" in s and v >= s["exclusiveMaximum"]:
            out.append(f"{path}: {v} is not less than {s['exclusiveMaximum']}")
        if isinstance(v, str):
            if "minLength" in s and len(v) < s["minLength"]:
                out.append(f"{path}: {v!r} is shorter than {s['minLength']}")
            if "pattern" in s and not re.search(s["pattern"], v):
                out.append(f"{path}: {v!r} does not match {s['pattern']!r}")
        if isinstance(v, list):
            if "minItems" in s and len(v) < s["minItems"]:
                out.append(f"{path}: {len(v)} items, fewer than {s['minItems']}")
            if "items" in s:
                for i, x in enumerate(v):
                    out += self.errors(x, s["items"], f"{path}[{i}]")
        if isinstance(v, dict):
            props = s.get("properties", {})
            for name in s.get("required", []):
                if name not in v:
                    out.append(f"{path}: {name!r} is a required property")
            for name, x in v.items():
                if name in props:
                    out += self.errors(x, props[name], f"{path}.{name}")
                elif "additionalProperties" in s:
                    ap = s["additionalProperties"]
                    if ap is False:
                        out.append(f"{path}: additional property {name!r} is not allowed")
                    else:
                        out += self.errors(x, ap, f"{path}.{name}")
        for sub in s.get("allOf", []):
            out += self.errors(v, sub, path)
        if "anyOf" in s and not any(not self.errors(v, sub, path) for sub in s["anyOf"]):
            out.append(f"{path}: matches none of anyOf")
        if "oneOf" in s and sum(1 for sub in s["oneOf"] if not self.errors(v, sub, path)) != 1:
            out.append(f"{path}: does not match exactly one of oneOf")
        if "not" in s and not self.errors(v, s["not"], path):
            out.append(f"{path}: matches a schema it must not match")
        if "if" in s:
            if not self.errors(v, s["if"], path):
                if "then" in s:
                    out += self.errors(v, s["then"], path)
            elif "else" in s:
                out += self.errors(v, s["else"], path)
        return out


def errors(doc, schema, builtin=False):
    """builtin=True uses the built-in validator even where jsonschema is installed (the self-test)."""
    js = None if builtin else _use_jsonschema()
    if js is not None:
        js.Draft202012Validator.check_schema(schema)
        return sorted(f"$/{'/'.join(str(p) for p in e.absolute_path)}: {e.message}"
                      for e in js.Draft202012Validator(schema).iter_errors(doc))
    return _Builtin(schema).errors(doc, schema)

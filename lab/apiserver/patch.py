"""The three PATCH flavours the API server accepts, as pure functions on JSON objects.

JSON merge patch (RFC 7386), strategic merge patch (merge patch plus the keyed list merging
built-in types declare; CRDs do not get it) and JSON patch (RFC 6902). Kept apart from the
store because they are self-contained document algebra: :func:`patch_object` is all the
store calls, and it turns a :class:`PatchError` into the matching API error.
"""

from __future__ import annotations

from typing import Any

from lab.apiserver.resources import JsonObj, ResourceType, SimApiError, deep_copy

__all__ = [
    "PatchError",
    "apply_patch",
    "check_patch_type",
    "json_patch",
    "merge_patch",
    "patch_object",
    "strategic_merge_patch",
]

#: List fields that strategic merge patch merges by a key instead of replacing.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "addresses": "type",
    "podIPs": "ip",
    "hostIPs": "ip",
    "hostAliases": "ip",
}
#: Primitive lists that strategic merge patch unions.
_MERGE_PRIMITIVES = frozenset({"finalizers", "podCIDRs"})


class PatchError(Exception):
    """A patch that cannot be decoded (400) or applied (422)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = "BadRequest" if code == 400 else "Invalid"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (unchanged subtrees are shared, not copied)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _strategic_list(current: list[Any], items: list[Any], merge_key: str) -> list[Any]:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in items):
        return [i for i in items if not (isinstance(i, dict) and "$patch" in i)]
    out = list(current)
    for item in items:
        if not isinstance(item, dict) or merge_key not in item:
            out.append(item)
            continue
        idx = next(
            (n for n, c in enumerate(out) if isinstance(c, dict) and c.get(merge_key) == item[merge_key]),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del out[idx]
        elif idx is None:
            out.append(strategic_merge_patch({}, item))
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch for built-in types: merge patch plus keyed list merging."""
    if not isinstance(patch, dict):
        return patch
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        cur = result.get(key)
        if key.startswith("$deleteFromPrimitiveList/"):
            fld = key.split("/", 1)[1]
            if isinstance(result.get(fld), list) and isinstance(value, list):
                result[fld] = [x for x in result[fld] if x not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(cur, list) and key in _MERGE_KEYS:
            result[key] = _strategic_list(cur, value, _MERGE_KEYS[key])
        elif isinstance(value, list) and isinstance(cur, list) and key in _MERGE_PRIMITIVES:
            result[key] = cur + [x for x in value if x not in cur]
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(cur, value)
        else:
            result[key] = value
    return result


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(400, f"invalid JSON pointer: {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _index(container: list[Any], token: str, path: str, *, insert: bool = False) -> int:
    if insert and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(422, f"invalid array index {token!r} in {path}")
    idx = int(token)
    if idx > len(container) or (idx == len(container) and not insert):
        raise PatchError(422, f"array index out of bounds: {path}")
    return idx


def _resolve(doc: Any, tokens: list[str], path: str) -> Any:
    cur = doc
    for tok in tokens:
        if isinstance(cur, dict) and tok in cur:
            cur = cur[tok]
        elif isinstance(cur, list):
            cur = cur[_index(cur, tok, path)]
        else:
            raise PatchError(422, f"doc is missing path: {path}")
    return cur


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test) on a copy of ``doc``."""
    if not isinstance(ops, list):
        raise PatchError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = deep_copy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(400, f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        tokens = _pointer(path)
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(400, f"{kind} operation requires a value: {path}")
        if kind == "test":
            if _resolve(doc, tokens, path) != op["value"]:
                raise PatchError(422, f"testing value {path} failed: test failed")
            continue
        if kind in ("move", "copy"):
            src = _pointer(op.get("from"))
            value = deep_copy(_resolve(doc, src, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, src, op["from"])
            doc = _add(doc, tokens, path, value)
        elif kind == "add":
            doc = _add(doc, tokens, path, op["value"])
        elif kind == "remove":
            doc = _remove(doc, tokens, path)
        elif kind == "replace":
            _resolve(doc, tokens, path)
            doc = _add(_remove(doc, tokens, path), tokens, path, op["value"])
        else:
            raise PatchError(400, f"unsupported JSON patch operation: {kind!r}")
    return doc


def _add(doc: Any, tokens: list[str], path: str, value: Any) -> Any:
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1], path)
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, tokens[-1], path, insert=True), value)
    else:
        raise PatchError(422, f"add operation does not apply: doc is missing path: {path}")
    return doc


def _remove(doc: Any, tokens: list[str], path: str) -> Any:
    if not tokens:
        return None
    parent = _resolve(doc, tokens[:-1], path)
    if isinstance(parent, dict) and tokens[-1] in parent:
        del parent[tokens[-1]]
    elif isinstance(parent, list):
        del parent[_index(parent, tokens[-1], path)]
    else:
        raise PatchError(422, f"remove operation does not apply: doc is missing path: {path}")
    return doc


def apply_patch(obj: JsonObj, patch: Any, patch_type: str) -> Any:
    """Apply a "merge", "strategic" or "json" patch to ``obj`` without mutating it."""
    if patch_type == "json":
        return json_patch(obj, patch)
    if not isinstance(patch, dict):
        raise PatchError(400, "a merge patch must be a JSON object")
    if patch_type == "merge":
        return merge_patch(obj, patch)
    if patch_type == "strategic":
        return strategic_merge_patch(obj, patch)
    raise PatchError(400, f"unknown patch type {patch_type!r}")


def check_patch_type(rt: ResourceType, patch_type: str) -> None:
    """415 for a strategic merge patch of a custom resource (CRDs do not support it)."""
    if patch_type == "strategic" and rt.custom:
        raise SimApiError(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )


def patch_object(current: JsonObj, patch: Any, patch_type: str) -> JsonObj:
    """``current`` patched, as a new object with its own metadata dict; patch errors as API errors."""
    try:
        patched = apply_patch(current, patch, patch_type)
    except PatchError as exc:
        raise SimApiError(exc.code, exc.reason, str(exc)) from None
    if not isinstance(patched, dict) or not isinstance(patched.get("metadata", {}), dict):
        raise SimApiError.bad_request("the patched object must be a JSON object")
    patched["metadata"] = dict(patched.get("metadata") or {})
    return patched

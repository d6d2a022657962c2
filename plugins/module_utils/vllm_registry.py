# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read vLLM's built-in model registry statically, from the text of its source file.

vLLM lists the architectures it supports in ``vllm/model_executor/models/registry.py``:
several module-level dicts named ``_*_MODELS`` (architecture -> (module, class)) that are
merged into ``_VLLM_MODELS`` with ``**name`` unpacking. ``parse_registry`` rebuilds that
merged dict from the file's syntax tree. The file is never imported or executed; only a
few literal shapes are evaluated (string constants, 2-tuples, dict displays with ``**``
unpacking, and dict comprehensions over ``<name>.items()`` with simple comparisons).
Anything else that ``_VLLM_MODELS`` depends on is reported as ``RegistryParseError``.

Pure standard library, no I/O: the caller reads the file.
"""

from __future__ import annotations

import ast
import re

MODELS_PACKAGE = "vllm.model_executor.models"
REGISTRY_FILE = "vllm/model_executor/models/registry.py"
MERGED_NAME = "_VLLM_MODELS"

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MUTATORS = frozenset({"update", "pop", "popitem", "setdefault", "clear", "__setitem__"})


class RegistryParseError(ValueError):
    """The registry text cannot be read into an architecture map."""


class _Unusable:
    """A module-level name whose value is not an architecture map we can evaluate."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _fail(node: ast.AST | None, message: str) -> RegistryParseError:
    line = getattr(node, "lineno", None)
    return RegistryParseError(f"line {line}: {message}" if line else message)


def _shape(node: ast.AST) -> str:
    text = ast.unparse(node) if hasattr(ast, "unparse") else type(node).__name__
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(node).__name__} `{text}`"


# --------------------------------------------------------------------------- evaluation


def _entry(key: object, value: object, node: ast.AST) -> tuple[str, tuple[str, str]]:
    if not isinstance(key, str):
        raise _fail(node, f"architecture key is not a string: {key!r}")
    if not (
        isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)
    ):
        raise _fail(node, f"value for {key!r} is not a (module, class) pair of strings")
    return key, value


def _lookup(env: dict, node: ast.Name) -> dict[str, tuple[str, str]]:
    value = env.get(node.id)
    if value is None:
        raise _fail(node, f"{node.id} is not defined before it is used")
    if isinstance(value, _Unusable):
        raise _fail(node, f"{node.id} is not an architecture map: {value.reason}")
    return value


def _eval_map(node: ast.expr, env: dict) -> dict[str, tuple[str, str]]:
    """Evaluate an expression that must yield architecture -> (module, class)."""
    if isinstance(node, ast.Name):
        return dict(_lookup(env, node))
    if isinstance(node, ast.Dict):
        out: dict[str, tuple[str, str]] = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:  # ``**mapping``: later keys override, first position kept
                out.update(_eval_map(value_node, env))
                continue
            key = _eval_literal(key_node)
            value = _eval_literal(value_node)
            key, value = _entry(key, value, value_node)
            out[key] = value
        return out
    if isinstance(node, ast.DictComp):
        return _eval_dictcomp(node, env)
    raise _fail(node, f"unsupported expression for a model map: {_shape(node)}")


def _eval_literal(node: ast.expr) -> object:
    """A string constant or a tuple of them (the only literal shapes in the maps)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_eval_literal(elt) for elt in node.elts)
    raise _fail(node, f"unsupported literal: {_shape(node)}")


def _eval_dictcomp(node: ast.DictComp, env: dict) -> dict[str, tuple[str, str]]:
    """``{K: V for T in M.items() if C ...}`` with simple targets and comparisons."""
    scopes: list[dict[str, object]] = [{}]
    for gen in node.generators:
        if gen.is_async:
            raise _fail(gen.iter, "async comprehensions are not supported")
        source = _eval_iter(gen.iter, env)
        nxt: list[dict[str, object]] = []
        for scope in scopes:
            for item in source:
                local = dict(scope)
                _bind(gen.target, item, local)
                if all(_truth(_eval_expr(cond, local), cond) for cond in gen.ifs):
                    nxt.append(local)
        scopes = nxt
    out: dict[str, tuple[str, str]] = {}
    for scope in scopes:
        key, value = _entry(_eval_expr(node.key, scope), _eval_expr(node.value, scope), node)
        out[key] = value
    return out


def _eval_iter(node: ast.expr, env: dict) -> list[tuple[str, tuple[str, str]]]:
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "items"
        and not node.args
        and not node.keywords
    ):
        return list(_eval_map(node.func.value, env).items())
    raise _fail(node, f"unsupported comprehension source (want NAME.items()): {_shape(node)}")


def _bind(target: ast.expr, value: object, local: dict[str, object]) -> None:
    if isinstance(target, ast.Name):
        local[target.id] = value
        return
    if isinstance(target, (ast.Tuple, ast.List)):
        if any(isinstance(elt, ast.Starred) for elt in target.elts):
            raise _fail(target, "starred comprehension targets are not supported")
        if not isinstance(value, tuple) or len(value) != len(target.elts):
            raise _fail(target, f"cannot unpack {value!r} into {_shape(target)}")
        for elt, part in zip(target.elts, value, strict=True):
            _bind(elt, part, local)
        return
    raise _fail(target, f"unsupported comprehension target: {_shape(target)}")


def _truth(value: object, node: ast.expr) -> bool:
    if not isinstance(value, bool):
        raise _fail(node, f"condition is not a comparison: {_shape(node)}")
    return value


def _eval_expr(node: ast.expr, local: dict[str, object]) -> object:
    """Expressions inside a comprehension: names, strings, tuples, comparisons."""
    if isinstance(node, ast.Name):
        if node.id not in local:
            raise _fail(node, f"comprehension uses unknown name {node.id!r}")
        return local[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_eval_expr(elt, local) for elt in node.elts)
    if isinstance(node, ast.Compare):
        left = _eval_expr(node.left, local)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval_expr(right_node, local)
            if isinstance(op, ast.Eq):
                ok = left == right
            elif isinstance(op, ast.NotEq):
                ok = left != right
            elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, tuple):
                ok = (left in right) == isinstance(op, ast.In)
            else:
                raise _fail(node, f"unsupported comparison: {_shape(node)}")
            if not ok:
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        values = [_truth(_eval_expr(v, local), v) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _truth(_eval_expr(node.operand, local), node.operand)
    raise _fail(node, f"unsupported expression in comprehension: {_shape(node)}")


# --------------------------------------------------------------------------- module walk


def _assigned_names(stmt: ast.stmt) -> list[str] | None:
    """Names bound by ``NAME = ...`` / ``NAME: T = ...``; None for any other statement."""
    if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
        return [t.id for t in stmt.targets]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id] if stmt.value is not None else []
    return None


def _touched_names(stmt: ast.stmt) -> set[str]:
    """Module-level names a statement may rebind or mutate (nested defs excluded)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    names: set[str] = set()
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, (ast.Store, ast.Del))
            and isinstance(node.value, ast.Name)
        ):
            names.add(node.value.id)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
            and isinstance(node.func.value, ast.Name)
        ):
            names.add(node.func.value.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        todo.extend(ast.iter_child_nodes(node))
    return names


def parse_registry_raw(text: str) -> dict[str, tuple[str, str]]:
    """``_VLLM_MODELS`` as written: architecture -> (module as written, class)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise RegistryParseError(
            f"registry source does not parse: line {exc.lineno}: {exc.msg}"
        ) from exc
    env: dict[str, object] = {}
    for stmt in tree.body:
        names = _assigned_names(stmt)
        if names is None:
            for name in _touched_names(stmt):
                env[name] = _Unusable(f"changed by a statement at line {stmt.lineno}")
            continue
        if not names:
            continue
        try:
            value: object = _eval_map(stmt.value, env)
        except RegistryParseError as exc:
            value = _Unusable(str(exc))
        for name in names:
            env[name] = value
    merged = env.get(MERGED_NAME)
    if merged is None:
        raise RegistryParseError(
            f"no {MERGED_NAME} assignment found at module level; is this vLLM's {REGISTRY_FILE}?"
        )
    if isinstance(merged, _Unusable):
        raise RegistryParseError(f"cannot evaluate {MERGED_NAME}: {merged.reason}")
    if not merged:
        raise RegistryParseError(f"{MERGED_NAME} is empty")
    return dict(merged)


def qualify_module(module: str) -> str:
    """Module as vLLM imports it: relative names live in ``vllm.model_executor.models``."""
    if module.startswith("vllm."):
        return module
    return f"{MODELS_PACKAGE}.{module}"


def parse_registry(text: str) -> dict[str, tuple[str, str]]:
    """The merged registry: architecture -> (fully qualified module, class), in vLLM's order."""
    return {
        arch: (qualify_module(module), cls)
        for arch, (module, cls) in parse_registry_raw(text).items()
    }


def module_file(module: str) -> str:
    """``vllm.model_executor.models.qwen3_5`` -> ``vllm/model_executor/models/qwen3_5.py``.

    Relative to site-packages. A module may instead be a package (several fully qualified
    ``vllm.models.*`` entries are): see ``package_file``.
    """
    parts = module.split(".")
    if not all(_IDENT.match(p) for p in parts):
        raise ValueError(f"not a module name: {module!r}")
    return "/".join(parts) + ".py"


def package_file(module: str) -> str:
    """``vllm.models.beam`` -> ``vllm/models/beam/__init__.py`` (relative to site-packages)."""
    return module_file(module)[: -len(".py")] + "/__init__.py"

"""Build helper: the compiled request path keeps its docstrings (``setup.py`` runs it).

mypyc writes into its C tables a text signature for each function (``request($self, tokens,
*, namespace='', lifetime=None)``) and for a class whose ``__init__`` defaults are literals, but
no docstring: ``help()`` of the default (compiled) install showed bare names.  A method
descriptor's ``__doc__`` cannot be set afterwards, and wrapping the methods in Python would add
a call to every request.  mypyc is itself compiled, so its code generator cannot be patched
either; :func:`add_docstrings` edits the C it generated instead, before the compiler runs: each
method's and function's ``PyDoc_STR(...)``, each class's ``tp_doc`` and each read-only
property's doc slot get the docstring the source gives them (read with :mod:`ast`), appended to
mypyc's text signature as an adjacent C string literal.  Nothing else in the C changes: the
request path's instructions are the same (``PYTHONHASHSEED=0 python bench/impl_instructions.py
--split --lengths 1K --warmup 60``: 111,936 per cycle with the docstrings, 112,220 without, hits
92,543 / 92,766, misses 189,510 / 190,036).

It reads mypyc's naming of C symbols (``CPyPy_<module>___<Class>___<method>``, the module named
by its last component within the build's group); the build pins mypyc's version (``mypy==`` in
``pyproject.toml``'s build requirements), and ``tests/impl/test_impl_public_docs.py`` fails in
the compiled build when the docstrings stop arriving.  Never imported by the package (it lives outside ``impl/`` for that reason).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

_C_STRING = r'"(?:[^"\\\n]|\\.)*"'
_DOC = rf"(?P<doc>NULL|{_C_STRING}(?:\s*{_C_STRING})*)"
# a method-table entry: {"name", (PyCFunction)CPyPy_<symbol>, METH_..., PyDoc_STR(<doc>)}
_METHOD = re.compile(
    rf"\(PyCFunction\)CPyPy_(?P<sym>\w+),\s*(?P<flags>METH_[A-Z_ |]+),\s*PyDoc_STR\({_DOC}\)"
)
# a class's type template: static PyTypeObject CPyType_<symbol>_template_ = { ... .tp_doc = ...
_CLASS = re.compile(
    rf"(?P<head>static PyTypeObject CPyType_(?P<sym>\w+)_template_ = \{{(?:(?!\}};).)*?"
    rf"\.tp_doc = )PyDoc_STR\({_DOC}\)",
    re.DOTALL,
)
# a read-only property: {"name", (getter)<symbol>_get_<name>, NULL, NULL, NULL}
_PROPERTY = re.compile(
    r'\{"(?P<name>\w+)",\s*\(getter\)(?P<sym>\w+)_get_(?P=name),\s*NULL, NULL, NULL\}'
)


def _symbol(*parts: str) -> str:
    """mypyc's C name for a dotted name (``mypyc.namegen.exported_name``)."""
    return ".".join(parts).replace("___", "___3_").replace(".", "___")


def docstrings(path: Path, module: str) -> tuple[dict[str, str], dict[str, str]]:
    """The docstrings of a module's functions, classes and methods keyed by C symbol, and of
    its properties keyed by ``<class symbol>_get_<name>``."""
    tree = ast.parse(path.read_text(), str(path))
    short = module.rpartition(".")[2]
    out: dict[str, str] = {}
    props: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and (doc := ast.get_docstring(node)):
            out[_symbol(short, node.name)] = doc
        elif isinstance(node, ast.ClassDef):
            if doc := ast.get_docstring(node):
                out[_symbol(short, node.name)] = doc
            for item in node.body:
                if not isinstance(item, ast.FunctionDef) or not (doc := ast.get_docstring(item)):
                    continue
                if any(ast.unparse(d) == "property" for d in item.decorator_list):
                    props[f"{_symbol(short, node.name)}_get_{item.name}"] = doc
                else:
                    out[_symbol(short, node.name, item.name)] = doc
                # a method of a non-native class (a named tuple's, say) is a callable object
                # whose type's doc is the method's (and a property's, which copies it)
                out[_symbol(short, f"{item.name}_{node.name}_obj")] = doc
    return out, props


def c_literal(text: str) -> str:
    """A C string literal of ``text`` (UTF-8; octal escapes, never greedy hex ones)."""
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch == "\\" or ch == '"':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif 32 <= byte < 127 and ch != "?":  # (no "??" trigraphs)
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _with(doc: str, text: str) -> str:
    """``PyDoc_STR``'s argument: mypyc's text signature (if any) and the docstring after it."""
    if doc == "NULL":
        return c_literal(text)
    if re.fullmatch(_C_STRING, doc) is None:
        return doc  # already has one
    return f"{doc} {c_literal(text)}"


def add_docstrings(c_files: Iterable[Path], modules: Iterable[tuple[str, Path]]) -> int:
    """Give the C that mypyc generated for ``modules`` (import name, source file) their
    docstrings; returns how many it placed."""
    docs: dict[str, str] = {}
    props: dict[str, str] = {}
    for name, path in modules:
        d, p = docstrings(path, name)
        docs.update(d)
        props.update(p)
    placed = 0

    def method(m: re.Match[str]) -> str:
        nonlocal placed
        text = docs.get(m["sym"])
        if text is None:
            return m[0]
        placed += 1
        return f"(PyCFunction)CPyPy_{m['sym']}, {m['flags'].strip()}, PyDoc_STR({_with(m['doc'], text)})"

    def cls(m: re.Match[str]) -> str:
        nonlocal placed
        text = docs.get(m["sym"])
        if text is None:
            return m[0]
        placed += 1
        return f"{m['head']}PyDoc_STR({_with(m['doc'], text)})"

    def prop(m: re.Match[str]) -> str:
        nonlocal placed
        text = props.get(f"{m['sym']}_get_{m['name']}")
        if text is None:
            return m[0]
        placed += 1
        getter = f"{m['sym']}_get_{m['name']}"
        return f'{{"{m["name"]}", (getter){getter}, NULL, PyDoc_STR({c_literal(text)}), NULL}}'

    for path in c_files:
        source = path.read_text()
        edited = _PROPERTY.sub(prop, _CLASS.sub(cls, _METHOD.sub(method, source)))
        if edited != source:
            path.write_text(edited)
    return placed

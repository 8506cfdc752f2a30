"""Writes docs/tool-api.md, the reference of the public tool API, from its docstrings.

Run ``python docs/api_reference.py`` after changing ``onceflow.tools`` (``make docs``); a
test fails while the checked-in page differs from what this script writes.
"""

import ast
import enum
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parent.parent
PAGE = REPOSITORY / "docs" / "tool-api.md"


def render() -> str:
    """The whole reference page as Markdown."""
    sys.path.insert(0, str(REPOSITORY))
    from onceflow import tools as onceflow_tools

    parts = [
        "# onceflow tool API reference",
        "",
        "Generated from the docstrings by `docs/api_reference.py`; do not edit by hand.",
        "Everything here is importable from `onceflow.tools`.",
        "",
        _doc(onceflow_tools),
    ]
    for name in sorted(onceflow_tools.__all__, key=lambda name: (name.isupper(), name.lower())):
        parts.append(_entry(name, getattr(onceflow_tools, name)))
    return "\n".join(parts).rstrip() + "\n"


def _entry(name: str, value: Any) -> str:
    if inspect.isclass(value):
        return _class(name, value)
    if inspect.isfunction(value):
        return f"## `{name}{_signature(value)}`\n\n{_doc(value)}\n"
    # An object's default repr holds its address, which differs on every run.
    shown = re.sub(r"<(\w+\.)*(\w+) object at 0x[0-9a-f]+>", r"\2()", repr(value))
    return f"## `{name}`\n\n`{name} = {shown}`\n"


def _class(name: str, cls: type) -> str:
    kind = (
        "enum"
        if issubclass(cls, enum.Enum)
        else "exception"
        if issubclass(cls, BaseException)
        else "class"
    )
    lines = [f"## {kind} `{name}`", "", _doc(cls), ""]
    fields = _attribute_docs(cls)
    if fields:
        lines += ["| member | type / value | meaning |", "| --- | --- | --- |"]
        lines += [f"| `{field}` | {kind_text} | {doc} |" for field, kind_text, doc in fields]
        lines.append("")
    for member_name, member in vars(cls).items():
        if member_name.startswith("_") or member_name in {field for field, _, _ in fields}:
            continue
        if isinstance(member, property):
            lines += [f"### `{name}.{member_name}` (property)", "", _doc(member.fget), ""]
        elif inspect.isfunction(member) and member.__doc__:
            lines += [f"### `{name}.{member_name}{_signature(member)}`", "", _doc(member), ""]
    return "\n".join(lines)


def _attribute_docs(cls: type) -> list[tuple[str, str, str]]:
    """Fields declared in the class body with the string literal that follows each."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return []
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    found = []
    for index, node in enumerate(body):
        following = body[index + 1] if index + 1 < len(body) else None
        doc = ""
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            doc = " ".join(str(following.value.value).split())
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id.startswith("_"):
                continue
            text = f"`{ast.unparse(node.annotation)}`"
            if node.value is not None:
                text += f" = `{ast.unparse(node.value)}`"
            found.append((node.target.id, text, doc.replace("|", "\\|")))
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found.append(
                (node.targets[0].id, f"`{ast.unparse(node.value)}`", doc.replace("|", "\\|"))
            )
    return found


def _signature(function: Any) -> str:
    try:
        text = str(inspect.signature(function)).replace("'", "")
    except (TypeError, ValueError):
        return "(…)"
    text = re.sub(r"<(\w+\.)*(\w+) object at 0x[0-9a-f]+>", r"\2", text)
    text = re.sub(r"<class (\w+\.)*(\w+)>", r"\2", text)
    return re.sub(r"\b(?:[a-z_]\w*\.)+([A-Za-z_]\w*)", r"\1", text)


_SECTION = re.compile(r"(Args|Attributes|Returns|Raises|Yields):$")
_ITEM = re.compile(r"    (\*{0,2}[\w.]+): (.*)")


def _doc(value: Any) -> str:
    """The docstring with Google-style sections as Markdown lists and ``::`` blocks fenced."""
    lines = (inspect.getdoc(value) or "").splitlines()
    out: list[str] = []
    in_code = False
    for line in lines:
        if in_code and line and not line.startswith("    "):
            _close_code(out)
            in_code = False
        if in_code:
            if line or out[-1] != "```python":
                out.append(line.removeprefix("    "))
        elif line.endswith("::"):
            out += [line[:-1].replace("``", "`"), "", "```python"]
            in_code = True
        elif _SECTION.fullmatch(line):
            out += [f"**{line[:-1]}**", ""]
        elif match := _ITEM.fullmatch(line):
            out.append(f"- `{match.group(1)}`: {match.group(2)}")
        elif line.startswith("        ") and out:
            out[-1] += " " + line.strip()
        elif line.startswith("    ") and out and out[-1].startswith("- "):
            out[-1] += " " + line.strip()
        else:
            out.append(line)
        if not in_code:
            out[-1] = out[-1].replace("``", "`")
    if in_code:
        _close_code(out)
    return "\n".join(out) + "\n"


def _close_code(out: list[str]) -> None:
    while out and not out[-1]:
        out.pop()
    out += ["```", ""]


def main() -> None:
    """Write the page, or with ``--check`` exit 1 if the page is out of date."""
    page = render()
    if "--check" in sys.argv:
        sys.exit(0 if PAGE.read_text() == page else 1)
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(REPOSITORY)}")


if __name__ == "__main__":
    main()

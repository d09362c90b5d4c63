"""The configuration reference, read from the typed config schemas (flowllm.config.schema).

Every field of every dataclass reached from the root schema becomes one entry: its dotted key (what an override
types), its type, its default and what the schema says about it (the class docstring, the comments above a field
and the one at the end of its line). Choices (the schema's enums) are listed with their own comments.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import io
import re
import textwrap
import tokenize
import typing
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

# Fields typed Any or a plain mapping whose entries a schema of the same module describes (the config checks
# apply it); each is documented under the key an override uses.
ENTRY_SCHEMAS = {"tools.servers.NAME": "ToolServerConfig"}


@dataclass(frozen=True)
class Setting:
    key: str
    type: str
    default: str
    about: str
    choices: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Section:
    key: str
    schema: str
    about: str
    settings: tuple[Setting, ...]


def _comments(source: str) -> dict[int, str]:
    """Line number (1-based, in ``source``) -> the comment's text on that line."""
    found: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


def _class_tree(cls: type) -> tuple[ast.ClassDef, dict[int, str], set[int]]:
    source = textwrap.dedent(inspect.getsource(cls))
    tree = ast.parse(source).body[0]
    assert isinstance(tree, ast.ClassDef)
    code = enumerate(source.splitlines(), 1)
    code_lines = {n for n, text in code if text.strip() and not text.lstrip().startswith("#")}
    return tree, _comments(source), code_lines


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment: the comment lines just above it, then the one that ends its line."""
    tree, comments, code_lines = _class_tree(cls)
    found: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.AnnAssign | ast.Assign):
            continue
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
        if not isinstance(target, ast.Name):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        end = node.end_lineno or node.lineno
        trailing = [comments[n] for n in range(node.lineno, end + 1) if n in comments and n in code_lines]
        found[target.id] = " ".join(above + trailing)
    return found


def class_doc(cls: type) -> str:
    """The class's own docstring (a dataclass without one has a generated ``__doc__``: not a description)."""
    tree, _, _ = _class_tree(cls)
    return inspect.cleandoc(ast.get_docstring(tree) or "")


def _default(item: dataclasses.Field[Any]) -> str:
    if item.default is not dataclasses.MISSING:
        value = item.default
    elif item.default_factory is not dataclasses.MISSING:
        value = item.default_factory()
    else:
        return "none: required"
    if isinstance(value, str) and value == MISSING:
        return "none: required, given by a config file or an override"
    if dataclasses.is_dataclass(value):
        return "see below"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{yaml_text(value)}`"


def yaml_text(value: Any) -> str:
    """A default as a YAML file or an override writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value.strip() and value == value.strip() else repr(value)
    return repr(value)


def _enum_of(hint: Any) -> type[enum.Enum] | None:
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            return candidate
    return None


def _dataclass_of(hint: Any) -> type | None:
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def choices_of(choice: type[enum.Enum]) -> tuple[tuple[str, str], ...]:
    notes = field_comments(choice)
    return tuple((str(member.value), notes.get(name, "")) for name, member in choice.__members__.items())


def sections(root: type, prefix: str = "") -> list[Section]:
    """The root schema and every schema under it, depth first, each keyed as an override spells it."""
    hints = typing.get_type_hints(root)
    notes = field_comments(root)
    settings: list[Setting] = []
    below: list[Section] = []
    for item in dataclasses.fields(root):
        key = f"{prefix}{item.name}"
        hint = hints[item.name]
        nested = _dataclass_of(hint) or _dataclass_of(next(iter(typing.get_args(hint)[1:2]), None))
        choice = _enum_of(hint)
        settings.append(
            Setting(key, str(item.type), _default(item), notes.get(item.name, ""), choices_of(choice) if choice else ())
        )
        if nested is not None:
            entry = f"{key}." if _dataclass_of(hint) else f"{key}.NAME."
            below += sections(nested, entry)
    own = Section(prefix.rstrip(".") or "top level", root.__name__, class_doc(root), tuple(settings))
    return [own, *below]


def entry_sections(module: Any) -> list[Section]:
    found = []
    for key, name in ENTRY_SCHEMAS.items():
        found += sections(getattr(module, name), f"{key}.")
    return found


_PROSE = str.maketrans({"<": "&lt;", ">": "&gt;", "*": r"\*", "_": r"\_"})


def prose(text: str) -> str:
    """Schema text as Markdown: RST literals become code spans; outside them nothing reads as markup."""
    parts = re.split(r"``(.+?)``", text)
    return "".join(f"`{part}`" if odd else part.translate(_PROSE) for odd, part in enumerate(parts) if part or odd)


def _entry(setting: Setting) -> list[str]:
    about = f": {prose(setting.about)}" if setting.about else ""
    kind = setting.type.replace("|", "or")
    lines = [f"- **`{setting.key}`** (`{kind}`, default {setting.default}){about}"]
    for value, note in setting.choices:
        lines.append(f"    - `{value}`" + (f": {prose(note)}" if note else ""))
    return lines


def render(all_sections: list[Section], intro: str) -> str:
    lines = ["# Configuration reference", "", intro, ""]
    for section in all_sections:
        title = f"`{section.key}`" if section.key != "top level" else "Top level"
        lines += [f"## {title}", "", f"Schema: `{section.schema}`.", ""]
        if section.about:
            lines += [prose(" ".join(section.about.split())), ""]
        for setting in section.settings:
            lines += _entry(setting)
        lines.append("")
    return "\n".join(lines)


def reference_page() -> str:
    from flowllm.config import schema

    intro = (
        "Generated from the typed config schemas (`flowllm/config/schema.py`) when the site is built: every "
        "setting, its type, its default and what the schema says about it. A key is written as an override "
        "spells it (`agent.max_turns=3`); `NAME` stands for a name you choose. A required setting without a "
        "default is given by the files under `flowllm/conf/`: the chosen file of its group (`provider/`, "
        "`pipeline/`, `runner/`, `repair/`, `tools/`, `subagents/`) or `config.yaml`, whose shape the schema checks."
    )
    return render(sections(schema.FlowConfig) + entry_sections(schema), intro)

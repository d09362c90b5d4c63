"""The base of every config choice: an enum whose members OmegaConf finds whatever the case."""

from __future__ import annotations

from collections.abc import Mapping
from enum import EnumType, StrEnum
from typing import Any


class _ChoiceType(EnumType):
    """OmegaConf reads a config value as ``Enum[value]``: a choice is found whatever its case, by name or value."""

    def __getitem__(cls, name: str) -> Any:
        members: Mapping[str, Any] = cls.__members__
        if name in members:
            return members[name]
        folded = name.casefold() if isinstance(name, str) else name
        for key, member in members.items():
            if folded in (key.casefold(), str(member.value).casefold()):
                return member
        raise KeyError(name)


class Choice(StrEnum, metaclass=_ChoiceType):
    """A config setting's choices, spelled as the README writes them (lower case: the names are the values, so
    an invalid value's error lists them so), accepted in any case (``stats.interval=Bootstrap``)."""

"""The catalogue: every tool a worker and the boundary know, by name."""

from collections.abc import Iterator

from tools._contract import ToolContract


class UnknownTool(LookupError):
    """No tool of that name is registered."""


class Catalogue:
    """Tool contracts by name; registering a name twice is refused."""

    def __init__(self, contracts: tuple[ToolContract, ...] = ()) -> None:
        self._contracts: dict[str, ToolContract] = {}
        for contract in contracts:
            self.register(contract)

    def register(self, contract: ToolContract) -> None:
        """Add a tool; a second tool with the same name is a configuration error."""
        if contract.name in self._contracts:
            raise ValueError(f"tool {contract.name!r} is already registered")
        self._contracts[contract.name] = contract

    def get(self, name: str) -> ToolContract:
        """The contract of ``name``; raises ``UnknownTool`` when there is none."""
        try:
            return self._contracts[name]
        except KeyError:
            raise UnknownTool(f"unknown tool {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._contracts

    def __iter__(self) -> Iterator[ToolContract]:
        return iter(sorted(self._contracts.values(), key=lambda contract: contract.name))

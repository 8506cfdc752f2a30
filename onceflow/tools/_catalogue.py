"""The catalogue: every tool a worker and the boundary know, by name."""

from collections.abc import Iterable, Iterator

from onceflow.errors import OnceflowError
from onceflow.tools._checks import contract_problems, refuse
from onceflow.tools._contract import ToolContract
from onceflow.tools._policy import ToolPolicy


class UnknownTool(OnceflowError, LookupError):
    """No tool of that name is registered."""

    code = "unknown-tool"
    title = "Unknown tool"


class Catalogue:
    """Tool contracts by name; an unsafe contract or a name taken twice is refused."""

    def __init__(self, contracts: tuple[ToolContract, ...] = ()) -> None:
        self._contracts: dict[str, ToolContract] = {}
        for contract in contracts:
            self.register(contract)

    def register(self, contract: ToolContract) -> None:
        """Add a tool; raises ``ToolRegistrationError`` naming every mistake and its fix."""
        problems = contract_problems(contract)
        if contract.name in self._contracts:
            problems.append(
                (
                    "another tool of that name is already registered",
                    "give each tool its own name",
                )
            )
        if problems:
            raise refuse(contract.name, problems)
        self._contracts[contract.name] = contract

    def get(self, name: str) -> ToolContract:
        """The contract of ``name``; raises ``UnknownTool`` when there is none."""
        try:
            return self._contracts[name]
        except KeyError:
            raise UnknownTool(f"unknown tool {name!r}") from None

    def policies(self, tools: Iterable[str]) -> dict[str, ToolPolicy]:
        """Every named tool's policy under this process's contracts, for a task or a call
        to carry from its admission into its history.

        Raises:
            UnknownTool: One of them is not registered here (a task without its policies
                would be refused by the workflow: this says so before anything is sent).
        """
        names = sorted(set(tools))
        unknown = [name for name in names if name not in self._contracts]
        if unknown:
            raise UnknownTool(
                f"no tool named {', '.join(map(repr, unknown))} is registered in this "
                "process: load the tools (register_tools) before starting tasks that use them"
            )
        return {name: self._contracts[name].policy() for name in names}

    def __contains__(self, name: object) -> bool:
        return name in self._contracts

    def __iter__(self) -> Iterator[ToolContract]:
        return iter(sorted(self._contracts.values(), key=lambda contract: contract.name))


CATALOGUE = Catalogue()
"""This process's tools: every entry point registers the built-in and configured tools
here at start-up (``register_tools``); the workflow and the boundary read it."""

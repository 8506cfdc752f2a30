"""What a chaos run records: each task and call as its agent saw it, and the report the
checker hands back (its summary table is the run's output: per tool, the figures, and
the recovery table, per kind of fault)."""

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .config import OPEN_TASK_TOOLS, TOOLS, ChaosConfig
from .recovery import MEASURES


@dataclass
class CallRecord:
    """One call of an open task (one key) and what its agent saw of it."""

    index: int
    tool: str
    key: str
    arguments: dict[str, Any]
    call_id: str | None = None
    """Sent as ``call_id`` (the charge, so the refund can name it); None: derived from
    the key."""
    repeats: "CallRecord | None" = None
    """The earlier call the model repeats under this call's new key."""
    lose_first_answer: bool = False
    step_id: str | None = None
    answers: Counter[int] = field(default_factory=Counter)
    first: dict[str, Any] | None = None
    """The first answer (200/202) the agent got."""
    final: dict[str, Any] | None = None
    """The answer that said the call ended."""
    refusal: str | None = None

    @property
    def identity(self) -> int:
        """The index of the call whose effect this one names (its own, or the repeated
        call's)."""
        return self.repeats.identity if self.repeats is not None else self.index


@dataclass
class TaskRecord:
    """One logical agent call and everything observed about it."""

    number: int
    tool: str
    key: str
    body: dict[str, Any]
    task_ids: set[str] = field(default_factory=set)
    acknowledged: bool = False
    answers: Counter[int] = field(default_factory=Counter)
    final_state: str | None = None
    final_status: dict[str, Any] | None = None
    undecided_in_a_row: int = 0
    """How many times in a row the run's operator found the task waiting and could take
    no decision (the task refused each, or none was possible yet)."""
    parked_seen: list[dict[str, Any]] = field(default_factory=list)
    reconciled: list[str] = field(default_factory=list)
    approvals: list[bool] = field(default_factory=list)
    refusal: str | None = None
    deny: bool = False
    """Whether the operator denies this task's approval (some deployments)."""
    calls: list[CallRecord] = field(default_factory=list)
    """An open task's calls, in the order its agent sends them."""
    did_not_happen: Counter[str] = field(default_factory=Counter)
    """``did_not_happen`` decisions per step."""
    reconciled_steps: set[str] = field(default_factory=set)
    """When the operator first saw each step parked (this run's monotonic clock)."""

    @property
    def task_id(self) -> str | None:
        return next(iter(self.task_ids)) if len(self.task_ids) == 1 else None


class ChaosTimeout(Exception):
    """The run passed its ``time_limit``; the message says where it stood."""


@dataclass
class ChaosReport:
    """What a run did and found."""

    config: ChaosConfig
    tasks: list[TaskRecord]
    figures: dict[str, Any]
    violations: list[str]
    stuck: list[str]
    per_tool: dict[str, Counter[str]]

    @property
    def ok(self) -> bool:
        return not self.violations and not self.stuck

    def table(self) -> str:
        """The summary table: per tool, then the run's figures."""
        columns = (
            "tasks",
            "succeeded",
            "failed",
            "were parked",
            "reconciled",
            "parked at end",
            "stuck",
            "effects",
        )
        lines = [f"{'tool':<22}" + "".join(f"{name:>14}" for name in columns)]
        total: Counter[str] = Counter()
        for tool in TOOLS:
            counts = self.per_tool.get(tool, Counter())
            total.update(counts)
            lines.append(f"{tool:<22}" + "".join(f"{counts[name]:>14}" for name in columns))
        lines.append(f"{'all':<22}" + "".join(f"{total[name]:>14}" for name in columns))
        # An open task's calls, per tool ("tasks": calls; repeats answered by the guard
        # count in their own row of the figures, not here).
        for tool in OPEN_TASK_TOOLS:
            counts = self.per_tool.get(f"open/{tool}", Counter())
            lines.append(
                f"{'open/' + tool:<22}" + "".join(f"{counts[name]:>14}" for name in columns)
            )
        lines.append("")
        figures = {n: v for n, v in self.figures.items() if not n.startswith("recovery: ")}
        width = max(len(name) for name in figures)
        lines.extend(f"{name:<{width}}  {value}" for name, value in figures.items())
        lines.append("")
        lines.extend(self.recovery_table())
        lines.append("")
        lines.append(
            f"violations: {len(self.violations)}   stuck: {len(self.stuck)}   "
            f"verdict: {'PASS' if self.ok else 'FAIL'}"
        )
        lines.extend(f"  VIOLATION {line}" for line in self.violations[:50])
        lines.extend(f"  STUCK {line}" for line in self.stuck[:50])
        return "\n".join(lines)

    def recovery_table(self) -> list[str]:
        """Per kind of fault: how many, and each recovery time from its end (median /
        worst, s; ``-``: not measured for that kind)."""
        kinds = [
            name.removeprefix("recovery: ").removesuffix(": faults")
            for name in self.figures
            if name.startswith("recovery: ") and name.endswith(": faults")
        ]
        lines = [
            "recovery from each fault's end (s, median / worst)",
            f"{'fault':<22}{'faults':>8}" + "".join(f"{name:>28}" for name in MEASURES),
        ]
        for kind in kinds:
            cells = []
            for name in MEASURES:
                median = self.figures.get(f"recovery: {kind}: {name}, median (s)")
                worst = self.figures.get(f"recovery: {kind}: {name}, worst (s)")
                cells.append("-" if median is None else f"{median:.2f} / {worst:.2f}")
            faults = self.figures[f"recovery: {kind}: faults"]
            lines.append(f"{kind:<22}{faults:>8}" + "".join(f"{cell:>28}" for cell in cells))
        return lines

"""Shared measurement and reporting for the benchmarks: percentiles, ratios, plots, and the
record of how each result was produced (``run_info``) that BENCHMARKS.md is generated from.

Every results file written here carries a ``run`` block: the exact command, the machine,
N per arm, concurrency, rounds, the load average when the run began and when it ended,
the time and the commit. ``python -m bench.write_benchmarks`` renders BENCHMARKS.md from
these files, so a number in it always comes from the file of the run that measured it.
"""

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
REPOSITORY = Path(__file__).resolve().parent.parent

_LOAD_AT_START = os.getloadavg()
"""Load average when the benchmark process imported this module: when its run began."""
_STARTED_AT = datetime.now(UTC)


@dataclass
class Arm:
    """One measured variant: its per-operation latencies (seconds), wall time, and the CPU
    seconds each process used while it ran (empty when not measured)."""

    name: str
    latencies: list[float] = field(default_factory=list)
    wall_seconds: float = 0.0
    cpu_seconds: dict[str, float] = field(default_factory=dict)

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        index = min(int(fraction * len(ordered)), len(ordered) - 1)
        return ordered[index]

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.wall_seconds if self.wall_seconds else 0.0

    def summary(self) -> dict[str, Any]:
        numbers: dict[str, Any] = {
            "n": len(self.latencies),
            "mean_ms": statistics.fmean(self.latencies) * 1000,
            "p50_ms": self.percentile(0.50) * 1000,
            "p99_ms": self.percentile(0.99) * 1000,
            "throughput_per_s": self.throughput,
        }
        if self.cpu_seconds:
            numbers["cpu_ms_per_op"] = {
                name: seconds / len(self.latencies) * 1000
                for name, seconds in self.cpu_seconds.items()
            }
            numbers["total_cpu_ms_per_op"] = sum(numbers["cpu_ms_per_op"].values())
        return numbers


def machine() -> str:
    """What the numbers were measured on: the processor's model where Linux names it
    (sessions may run on different machines), cores and Python."""
    processor = platform.processor() or platform.machine()
    return f"{processor}{_cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f" ({line.partition(':')[2].strip()})"
    except OSError:
        pass
    return ""


def command_line() -> str:
    """The command that started this process, as it would be typed in the repository."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    program = f"-m {spec.name}" if spec is not None and spec.name else sys.argv[0]
    return shlex.join([".venv/bin/python", *program.split(), *sys.argv[1:]])


def _commit() -> str | None:
    """The checked-out commit, marked ``+changes`` when the tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPOSITORY,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+changes" if dirty else head


def run_info(
    *,
    n_per_arm: int | str | None,
    concurrency: int | str | None,
    rounds: int | str | None,
    arguments: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """How this run was made, for its results file: command, every argument's value (the
    defaults included, so the run can be repeated after a default changed), machine, N,
    concurrency, rounds (each a text where the benchmark has no such number: an open
    loop's concurrency), load average at start and end (1, 5, 15 min), time and commit."""
    return {
        "command": command_line(),
        "arguments": arguments,
        "machine": machine(),
        "n_per_arm": n_per_arm,
        "concurrency": concurrency,
        "rounds": rounds,
        "load_average_at_start": [round(load, 2) for load in _LOAD_AT_START],
        "load_average_at_end": [round(load, 2) for load in os.getloadavg()],
        "started_at": _STARTED_AT.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
    }


def report(
    title: str,
    baseline: Arm,
    candidate: Arm,
    notes: dict[str, object],
    *,
    run: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Print the two arms and their ratios, save JSON and a latency plot; return the ratios.

    Args:
        title: Names the results files (``bench/results/<slug>.json`` and ``.png``).
        baseline: The arm the candidate is compared to.
        candidate: onceflow's arm.
        notes: What the reader needs to know about the run (sizes, outcomes).
        run: ``run_info(...)``. Default: one built from ``notes`` (its ``concurrency``
            and ``rounds``, or ``storms``) and the arms' sizes.
        extra: More figures to save beside the arms (per-round ratios, ...).
    """
    base, cand = baseline.summary(), candidate.summary()
    ratios = {
        "p50": cand["p50_ms"] / base["p50_ms"],
        "p99": cand["p99_ms"] / base["p99_ms"],
        "mean": cand["mean_ms"] / base["mean_ms"],
        "throughput": cand["throughput_per_s"] / base["throughput_per_s"],
    }
    if "total_cpu_ms_per_op" in base and "total_cpu_ms_per_op" in cand:
        ratios["cpu"] = cand["total_cpu_ms_per_op"] / max(base["total_cpu_ms_per_op"], 1e-9)
    if run is None:
        rounds = notes.get("rounds", notes.get("storms"))
        concurrency = notes.get("concurrency")
        run = run_info(
            n_per_arm=len(baseline.latencies),
            concurrency=concurrency if isinstance(concurrency, int) else None,
            rounds=rounds if isinstance(rounds, int) else None,
        )
    print(f"\n== {title} ==  ({machine()}; {', '.join(f'{k}={v}' for k, v in notes.items())})")
    for arm, numbers in ((baseline, base), (candidate, cand)):
        cpu = (
            f"  CPU {numbers['total_cpu_ms_per_op']:6.1f} ms/op"
            if "total_cpu_ms_per_op" in numbers
            else ""
        )
        print(
            f"  {arm.name:<44} n={numbers['n']:<5.0f} mean {numbers['mean_ms']:8.2f} ms  "
            f"p50 {numbers['p50_ms']:8.2f} ms  p99 {numbers['p99_ms']:8.2f} ms  "
            f"{numbers['throughput_per_s']:8.1f}/s{cpu}"
        )
    print(
        f"  ratio {candidate.name} / {baseline.name}: p50 {ratios['p50']:.2f}x  "
        f"p99 {ratios['p99']:.2f}x  mean {ratios['mean']:.2f}x  "
        f"throughput {ratios['throughput']:.2f}x"
        + (f"  CPU {ratios['cpu']:.2f}x" if "cpu" in ratios else "")
    )
    RESULTS.mkdir(exist_ok=True)
    slug = title.lower().replace(" ", "_").replace("/", "_")
    (RESULTS / f"{slug}.json").write_text(
        json.dumps(
            {
                "title": title,
                "machine": run.get("machine", machine()),
                "run": run,
                "notes": notes,
                "baseline": baseline.name,
                "candidate": candidate.name,
                baseline.name: base,
                candidate.name: cand,
                "ratios": ratios,
                **(extra or {}),
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    _plot(title, slug, baseline, candidate)
    return ratios


def pyplot() -> Any:
    """``matplotlib.pyplot`` drawing to files, or None (said once) when the ``bench``
    extra is not installed (``make bench`` installs it): a plot is extra, and every
    benchmark writes its results file before it plots."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (`make bench` installs it): no plot")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot(title: str, slug: str, *arms: Arm) -> None:
    plt = pyplot()
    if plt is None:
        return
    figure, axis = plt.subplots(figsize=(7, 3.5))
    for arm in arms:
        axis.hist([latency * 1000 for latency in arm.latencies], bins=50, alpha=0.6, label=arm.name)
    axis.set_xlabel("latency (ms)")
    axis.set_ylabel("operations")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(RESULTS / f"{slug}.png", dpi=110)
    plt.close(figure)

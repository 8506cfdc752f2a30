"""Shared measurement and reporting for the benchmarks: percentiles, ratios, plots."""

import json
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


@dataclass
class Arm:
    """One measured variant: its per-operation latencies (seconds) and wall time."""

    name: str
    latencies: list[float] = field(default_factory=list)
    wall_seconds: float = 0.0

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        index = min(int(fraction * len(ordered)), len(ordered) - 1)
        return ordered[index]

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.wall_seconds if self.wall_seconds else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "n": len(self.latencies),
            "mean_ms": statistics.fmean(self.latencies) * 1000,
            "p50_ms": self.percentile(0.50) * 1000,
            "p99_ms": self.percentile(0.99) * 1000,
            "throughput_per_s": self.throughput,
        }


def machine() -> str:
    """What the numbers were measured on."""
    processor = platform.processor() or platform.machine()
    return f"{processor}, {os.cpu_count()} cores, Python {platform.python_version()}"


def report(
    title: str, baseline: Arm, candidate: Arm, notes: dict[str, object]
) -> dict[str, object]:
    """Print the two arms and their ratios, save JSON and a latency plot; return the ratios."""
    base, cand = baseline.summary(), candidate.summary()
    ratios = {
        "p50": cand["p50_ms"] / base["p50_ms"],
        "p99": cand["p99_ms"] / base["p99_ms"],
        "mean": cand["mean_ms"] / base["mean_ms"],
        "throughput": cand["throughput_per_s"] / base["throughput_per_s"],
    }
    print(f"\n== {title} ==  ({machine()}; {', '.join(f'{k}={v}' for k, v in notes.items())})")
    for arm, numbers in ((baseline, base), (candidate, cand)):
        print(
            f"  {arm.name:<34} n={numbers['n']:<5.0f} mean {numbers['mean_ms']:8.2f} ms  "
            f"p50 {numbers['p50_ms']:8.2f} ms  p99 {numbers['p99_ms']:8.2f} ms  "
            f"{numbers['throughput_per_s']:8.1f}/s"
        )
    print(
        f"  ratio {candidate.name} / {baseline.name}: p50 {ratios['p50']:.2f}x  "
        f"p99 {ratios['p99']:.2f}x  mean {ratios['mean']:.2f}x  "
        f"throughput {ratios['throughput']:.2f}x"
    )
    RESULTS.mkdir(exist_ok=True)
    slug = title.lower().replace(" ", "_").replace("/", "_")
    (RESULTS / f"{slug}.json").write_text(
        json.dumps(
            {
                "title": title,
                "machine": machine(),
                "notes": notes,
                baseline.name: base,
                candidate.name: cand,
                "ratios": ratios,
            },
            indent=2,
            default=str,
        )
    )
    _plot(title, slug, baseline, candidate)
    return ratios


def _plot(title: str, slug: str, *arms: Arm) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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

"""The chaos run: many tasks of every tool through the real stack while it is being broken.

Usage: ``.venv/bin/python -m tests.chaos.harness --tasks 2000 --kill-every-tasks 16
--min-worker-kills 50 --json chaos.json`` (the large run; ``--help`` lists every flag;
exit status 1 on any violation or stuck task, or fewer kills than asked).
``bench/write_benchmarks.py`` reads this file's ``add_argument`` calls to write the
command that repeats a recorded run.
"""

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from .config import OPEN_TASK_TOOLS, ChaosConfig
from .run import run_chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.harness",
        description=__doc__.splitlines()[0],
        epilog=(
            "The large run (>= 2,000 tasks, >= 50 worker kills, open tasks in the mix): "
            "python -m tests.chaos.harness --tasks 2000 --kill-every-tasks 16 "
            "--min-worker-kills 50 --json chaos.json. Exit status 1 on any violation or "
            "stuck task, or on fewer worker kills than --min-worker-kills."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    defaults = ChaosConfig()
    parser.add_argument(
        "--tasks",
        type=int,
        default=2000,
        help="tasks (keys) to drive: open tasks and one-tool plans of the six tools",
    )
    parser.add_argument("--concurrency", type=int, default=24, help="agents at once")
    parser.add_argument(
        "--kill-every-tasks",
        type=int,
        default=defaults.kill_every_tasks,
        help="tasks that end between worker SIGKILLs (0: none); each kill waits for a "
        "ready worker, never the SIGSTOPped one",
    )
    parser.add_argument(
        "--fault-every-tasks",
        type=int,
        default=defaults.fault_every_tasks,
        help="tasks that end between provider faults and between SMTP faults (0: none)",
    )
    parser.add_argument(
        "--pg-kill-every-tasks",
        type=int,
        default=defaults.pg_kill_every_tasks,
        help="tasks that end between rounds of pg_terminate_backend (0: none)",
    )
    parser.add_argument(
        "--open-task-share",
        type=float,
        default=defaults.open_task_share,
        help="share of the tasks that are open tasks (a call of each of "
        f"{', '.join(OPEN_TASK_TOOLS)}, some resent or repeated, then closed)",
    )
    parser.add_argument(
        "--lost-answer-share",
        type=float,
        default=defaults.lost_answer_share,
        help="share of open-task calls whose first answer the agent loses and resends",
    )
    parser.add_argument(
        "--model-repeat-share",
        type=float,
        default=defaults.model_repeat_share,
        help="share of open-task calls the model repeats under a new key",
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=300,
        help="after the faults heal, how long tasks get to end before counting as stuck",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="stop the run after this many seconds, saying where it stood (default: none)",
    )
    parser.add_argument(
        "--min-worker-kills",
        type=int,
        default=0,
        help="fail the run (exit 1) if fewer workers were SIGKILLed than this",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="the driver's seed")
    parser.add_argument(
        "--scratch", type=Path, default=None, help="keep the processes' logs in this folder"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the config, figures and findings here"
    )
    arguments = parser.parse_args(argv)
    config = ChaosConfig(
        tasks=arguments.tasks,
        concurrency=arguments.concurrency,
        kill_every_tasks=arguments.kill_every_tasks,
        fault_every_tasks=arguments.fault_every_tasks,
        pg_kill_every_tasks=arguments.pg_kill_every_tasks,
        open_task_share=arguments.open_task_share,
        lost_answer_share=arguments.lost_answer_share,
        model_repeat_share=arguments.model_repeat_share,
        settle_seconds=arguments.settle_seconds,
        time_limit=arguments.time_limit,
        seed=arguments.seed,
    )

    def say(line: str) -> None:
        print(line, flush=True)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # asyncio.run cancels the run: its processes are stopped

    signal.signal(signal.SIGTERM, interrupt)
    report = asyncio.run(run_chaos(config, scratch=arguments.scratch, say=say))
    print(report.table(), flush=True)
    if arguments.json is not None:
        arguments.json.write_text(
            json.dumps(
                {
                    "config": config.__dict__,
                    "figures": report.figures,
                    "per_tool": {tool: dict(c) for tool, c in report.per_tool.items()},
                    "violations": report.violations,
                    "stuck": report.stuck,
                },
                indent=2,
                default=str,
            )
        )
    kills = int(report.figures.get("workers SIGKILLed (each replaced)", 0))
    if kills < arguments.min_worker_kills:
        print(f"only {kills} worker kills, fewer than --min-worker-kills", flush=True)
        return 1
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

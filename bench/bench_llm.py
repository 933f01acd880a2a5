"""Model benchmark: plain ``remember`` operations through the streams while 10% of
the operations need a model that answers in 500 ms, against the same load with
none needing it, side by side in one run.

    python -m bench.bench_llm [--ops 20000] [--model-share 0.1] [--latency-ms 500]
                              [--rate 800] [--seconds 10] [--repeat 3]

Both loads go to the same system: ``engram worker`` processes configured with a
model (``ENGRAM_LLM_URL``) that is a local OpenAI-compatible server answering
every reconciliation after ``--latency-ms`` (an ADD of the new fact), with the
embedded PostgreSQL and valkey of the stream benchmark. Every one of 1,000
scopes first gets a record, so each reconciling remember finds a similar record
and makes one real HTTP call. In the "10% model" load a seeded random tenth of
the remembers are ``supersede: reconcile``, the others ``add``; in the "none"
load all are ``add``. For each: the maximum rate (the load enqueued in bulk),
then a paced run (one by one, 4 producer threads) at ``--rate``. Plain
operations' latencies are also reported for those that did not arrive while a
model call of their own scope was pending (a scope's operations keep their
order, so those others wait for it by design). Runs are interleaved; the
median run (by plain rate) of each load is reported. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench.bench_worker import SCOPES, Engram, Result, _busy, _stolen, drive, make_load
from bench.common import fresh_database, percentile, sentences
from engram.store import Operation
from engram.store.server import EmbeddedPostgres
from engram.worker.embedded.valkey import EmbeddedValkey

WORKERS = 2


# -- the model: a local OpenAI-compatible server, in a process of its own -------------


def _serve_model(latency_s: float, conn: Connection) -> None:
    from tests.openai_server import OpenAIServer, Reply, Request, chat

    def respond(request: Request) -> Reply:
        user = request.body["messages"][1]["content"]
        new_facts = json.loads(user.split("NEW FACTS:", 1)[1])
        reply = chat(
            json.dumps(
                {"memory": [{"event": "ADD", "id": None, "text": fact} for fact in new_facts]}
            )
        )
        reply.delay_s = latency_s
        return reply

    with OpenAIServer(respond) as server:
        conn.send(server.url)
        conn.recv()  # until told to stop


class FakeModel:
    def __init__(self, latency_ms: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve_model, args=(latency_ms / 1000, child), daemon=True
        )
        self._process.start()
        if not self._conn.poll(60):
            raise RuntimeError("the model server did not start")
        self.url: str = self._conn.recv()

    def stop(self) -> None:
        self._conn.send("stop")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


# -- the system -------------------------------------------------------------------------


class Reconciling(Engram):
    """engram, its remembers ``add`` except those named, which ``reconcile``."""

    def __init__(self, *args: Any, model_ops: set[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_ops = model_ops

    def _request(self, op_id: str, text: str) -> dict[str, str]:
        return {"text": text, "supersede": "reconcile" if op_id in self.model_ops else "add"}

    def enqueue(self, op_id: str, scope: dict[str, str], text: str) -> None:
        self.producer.submit("remember", scope, self._request(op_id, text), operation_id=op_id)

    def enqueue_bulk(self, items: list[tuple[str, dict[str, str], str]]) -> None:
        self.producer.enqueue_many(
            [
                Operation.build("remember", scope, self._request(op_id, text), op_id)
                for op_id, scope, text in items
            ]
        )


@dataclass
class Split:
    """One run's figures, plain operations apart from those needing the model."""

    plain_rate: float
    plain: tuple[float, float]  # p50, p99 ms
    plain_unblocked: tuple[float, float]  # those sent while no model call of their scope ran
    model: tuple[float, float] | None
    result: Result


def split(
    result: Result, load: list[tuple[str, dict[str, str], str]], model_ops: set[str]
) -> Split:
    plain_ids = [op_id for op_id, _, _ in load if op_id not in model_ops]
    # A plain operation waits for its scope's model call if it was sent while one was
    # pending (sent before it, answered after it was sent).
    pending: dict[str, list[tuple[float, float]]] = {}
    for op_id, scope, _ in load:
        if op_id in model_ops:
            span = (result.sent_s[op_id], result.answered_s[op_id])
            pending.setdefault(scope["user_id"], []).append(span)
    scope_of = {op_id: scope["user_id"] for op_id, scope, _ in load}

    def blocked(op_id: str) -> bool:
        at = result.sent_s[op_id]
        return any(s <= at < e for s, e in pending.get(scope_of[op_id], ()))

    def p(ids: list[str]) -> tuple[float, float]:
        values = [result.latencies_ms[i] for i in ids]
        return (percentile(values, 50), percentile(values, 99)) if values else (0.0, 0.0)

    last_plain = max(result.answered_s[i] for i in plain_ids)
    model_ids = [op_id for op_id, _, _ in load if op_id in model_ops]
    return Split(
        plain_rate=len(plain_ids) / last_plain,
        plain=p(plain_ids),
        plain_unblocked=p([i for i in plain_ids if not blocked(i)]),
        model=p(model_ids) if model_ids else None,
        result=result,
    )


def choose(load: list[tuple[str, dict[str, str], str]], share: float, seed: int) -> set[str]:
    rng = random.Random(seed)
    return {op_id for op_id, _, _ in load if rng.random() < share}


def run(
    name: str,
    postgres: EmbeddedPostgres,
    valkey_url: str,
    client: redis.Redis,
    env: dict[str, str],
    args: argparse.Namespace,
    texts: list[str],
    tag: str,
    servers: list[int],
) -> tuple[Split, Split, dict[str, int]]:
    client.flushall()
    share = args.model_share if name == "model" else 0.0
    full_load = make_load(f"{tag}-max", args.ops, texts)
    paced_load = make_load(f"{tag}-paced", int(args.rate * args.seconds), texts)
    model_ops = choose(full_load, share, 1) | choose(paced_load, share, 2)
    dsn = fresh_database(postgres, f"b_llm_{tag}")
    system = Reconciling(dsn, valkey_url, WORKERS, args.batch_size, env=env, model_ops=model_ops)
    system.start()
    try:
        # Every scope gets a record: a reconciling remember then always has something
        # similar, and makes its call.
        warm = [(f"{tag}-warm:{s}", {"user_id": f"user-{s}"}, texts[s]) for s in range(SCOPES)]
        drive(system, client, warm, None, servers)
        full = split(drive(system, client, full_load, None, servers), full_load, model_ops)
        system.settle()
        paced = split(drive(system, client, paced_load, args.rate, servers), paced_load, model_ops)
    finally:
        system.stop()
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE model_calls > 0), coalesce(sum(model_calls), 0),"
            " count(*) FILTER (WHERE error IS NOT NULL) FROM engram_receipts"
        ).fetchone()
    assert row is not None
    counts = {"reconciled": row[0], "model_calls": row[1], "refused": row[2]}
    expected = len(model_ops)
    print(
        f"  {name}: plain {full.plain_rate:,.0f} ops/s at max,"
        f" p99 {full.plain[1]:,.0f} ms; paced {paced.plain[0]:.1f}/{paced.plain[1]:.1f} ms"
        f" ({paced.plain_unblocked[1]:.1f} ms not behind a model call);"
        f" {counts['model_calls']} model calls for {expected} reconciling operations",
        file=sys.stderr,
        flush=True,
    )
    return full, paced, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=20_000, help="operations in the max run")
    parser.add_argument("--model-share", type=float, default=0.1)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--rate", type=float, default=800.0, help="ops/s of the paced run")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the paced run")
    parser.add_argument("--concurrency", type=int, default=64, help="ENGRAM_LLM_CONCURRENCY")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="engram-bench-llm-"))
    postgres = EmbeddedPostgres(home)
    valkey = EmbeddedValkey(home).start()
    client = redis.Redis.from_url(valkey.url)
    model = FakeModel(args.latency_ms)
    env = {
        "ENGRAM_LLM_URL": model.url,
        "ENGRAM_LLM_MODEL": "fake-model",
        "ENGRAM_LLM_CONCURRENCY": str(args.concurrency),
    }
    runs: dict[str, list[tuple[Split, Split, dict[str, int]]]] = {"none": [], "model": []}
    servers = [pid for pid in (postgres.pid, valkey.pid) if pid]  # their CPU is counted too
    try:
        texts = sentences(20_000)
        for r in range(args.repeat):  # interleaved, so that a noisy minute hits both
            for name in runs:
                runs[name].append(
                    run(name, postgres, valkey.url, client, env, args, texts, f"{name}{r}", servers)
                )
    finally:
        model.stop()
        client.close()
        valkey.stop()
        postgres.stop()
        shutil.rmtree(home, ignore_errors=True)  # a run leaves gigabytes
    _report(runs, args)


def _report(
    runs: dict[str, list[tuple[Split, Split, dict[str, int]]]], args: argparse.Namespace
) -> None:
    median = {
        name: sorted(rs, key=lambda r: r[0].plain_rate)[len(rs) // 2] for name, rs in runs.items()
    }
    print(
        f"\n## Model benchmark ({os.cpu_count()} CPUs; {WORKERS} worker processes; model"
        f" answers in {args.latency_ms:g} ms; {args.concurrency} calls at once per worker;"
        f" median of {args.repeat} runs)\n"
    )
    print(
        "| load | plain ops/s (max) | plain p50 / p99 ms at max | not behind a model call |"
        " model ops p50 / p99 ms at max | plain p50 / p99 ms paced | not behind a model call |"
        " model ops p50 / p99 ms paced | CPU busy max / paced |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    labels = {"none": "none need a model", "model": f"{args.model_share:.0%} need a model"}
    for name, (full, paced, _) in median.items():
        print(
            f"| {labels[name]} | {full.plain_rate:,.0f} | {_ms(full.plain)} |"
            f" {_ms(full.plain_unblocked)} | {_ms(full.model)} | {_ms(paced.plain)} |"
            f" {_ms(paced.plain_unblocked)} |"
            f" {_ms(paced.model)} | {_busy(full.result)} / {_busy(paced.result)}"
            f" (stolen {_stolen(full.result)} / {_stolen(paced.result)}) |"
        )
    none, model = median["none"][0], median["model"][0]
    print(
        f"\nPlain remembers at max with {args.model_share:.0%} needing the model:"
        f" {model.plain_rate / none.plain_rate:.2f}x the rate with none."
        f" Paced at {args.rate:,.0f} ops/s for {args.seconds:g} s."
    )
    for name, rs in runs.items():
        print(
            f"{labels[name]}, every run: "
            + "; ".join(
                f"{r[0].plain_rate:,.0f} ops/s, {r[2]['model_calls']} model calls,"
                f" {r[2]['refused']} refused"
                for r in rs
            )
        )


def _ms(pair: tuple[float, float] | None) -> str:
    return "-" if pair is None else f"{pair[0]:,.1f} / {pair[1]:,.1f}"


if __name__ == "__main__":
    main()

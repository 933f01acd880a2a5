"""Re-embedding benchmark: the whole store moved to another model while stream writes
go on, against the raw embedder on the same texts in the same run.

    python -m bench.bench_reembed      # --records 100000 --model minilm --write-rate 20

A scratch PostgreSQL and valkey; ``--records`` records written with the default
model (WordLlama); then, while one ``engram worker`` commits remembers sent
through the streams at ``--write-rate`` per second:

1. raw: the embedder alone on every current text, in batches of 64 (this process);
2. engram: ``engram reembed`` to ``--model``, run by an ``engram jobs`` process
   (listing the records in batches, embedding them, storing the vectors, keeping
   the progress, passes, the switch), from ``reembed.start`` to the activation.

Two measures of the store's overhead: ``1 - engram rate / raw rate`` (records
per second; the two run one after the other under the same write load, so a
change in what else the machine does shows in it), and the share of the job's
own time spent outside the embedder (``store_s`` against ``embed_s`` in its
progress, measured inside the same run of the job). Every write sent meanwhile
must commit. (The raw embedder is not run again after the switch: the stream
worker then embeds its writes with the new model, a heavier load than before.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from bench.common import MachineCpu, discard, fresh_database, scratch_postgres, sentences
from engram import procs
from engram.demo_reembed import SteadyWriter
from engram.jobs import reembed
from engram.jobs.progress import Progress
from engram.jobs.settings import Reembed
from engram.store import Operation, Store, WordLlamaEmbedder
from engram.store.vectors.registry import EmbedderRegistry
from engram.worker.embedded.runtime import connect_redis
from engram.worker.embedded.valkey import EmbeddedValkey
from engram.worker.producer import Producer

REPO = Path(__file__).resolve().parent.parent
BATCH = 64


def load(store: Store, count: int) -> None:
    texts = sentences(count)
    embedder = WordLlamaEmbedder()
    for start in range(0, count, 1000):
        ops = [
            Operation.build("remember", {"user_id": f"u{i % 100}"}, {"text": t})
            for i, t in enumerate(texts[start : start + 1000], start)
        ]
        for result in store.execute(ops, embedder):
            assert not isinstance(result, Exception), result


def current_texts(store: Store) -> list[str]:
    with store.pool.connection() as conn:
        rows = conn.execute(
            "SELECT v.text FROM engram_records r JOIN engram_revisions v"
            " ON v.scope_id = r.scope_id AND v.record_id = r.id AND v.revision = r.revision"
            " ORDER BY r.scope_id, r.id"
        ).fetchall()
    return [r[0] for r in rows]


def raw(registry: EmbedderRegistry, model: str, texts: list[str]) -> float:
    """Records per second of the embedder alone, in the job's batch size."""
    embedder = registry.create(model)
    getattr(embedder, "load", lambda: None)()
    started = time.perf_counter()
    for start in range(0, len(texts), BATCH):
        embedder.embed(texts[start : start + BATCH])
    return len(texts) / (time.perf_counter() - started)


def engram_reembed(store: Store, redis_url: str, model: str) -> Progress:
    client = connect_redis(redis_url)
    started = reembed.start(
        store, client, EmbedderRegistry(), model, requested_by="bench", settings=Reembed()
    )
    while True:
        generation = store.embeddings.get(started.generation_id)
        progress = Progress.from_dict(generation.progress) if generation else None
        if progress is not None and progress.finished:
            if progress.state != "activated":
                raise SystemExit(f"the re-embedding ended {progress.state}: {progress.message}")
            return progress
        time.sleep(0.2)


def spawn(command: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "engram", "--log-level", "WARNING", command],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            preexec_fn=procs.die_with_parent(),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--write-rate", type=float, default=20.0, help="stream writes per second")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="engram-bench-reembed-"))
    server = scratch_postgres()
    valkey = EmbeddedValkey(home).start()
    children: list[subprocess.Popen[bytes]] = []
    try:
        dsn = fresh_database(server, "reembed")
        env = {
            **os.environ,
            "DATABASE_URL": dsn,
            "REDIS_URL": valkey.url,
            "PYTHONPATH": str(REPO),
            "ENGRAM_RETAIN_HISTORY": "off",
            "ENGRAM_RETAIN_DEAD_LETTERS": "off",
        }
        with Store.connect(dsn) as store, Producer.from_url(valkey.url) as producer:
            print(f"loading {args.records:,} records (WordLlama)...", flush=True)
            load(store, args.records)
            children.append(spawn("worker", env, home / "worker.log"))
            writer = SteadyWriter(producer, args.write_rate, {"user_id": "writer"}, "w").start()
            registry = EmbedderRegistry()
            cpu = MachineCpu()

            texts = current_texts(store)
            raw_rate = raw(registry, args.model, texts)
            print(f"raw {args.model}: {raw_rate:,.1f} records/s ({len(texts):,})", flush=True)

            children.append(spawn("jobs", env, home / "jobs.log"))
            began = time.perf_counter()
            done = engram_reembed(store, valkey.url, args.model)
            seconds = time.perf_counter() - began
            rate = done.done / seconds
            shares = cpu.shares()
            outcomes: Counter[str] = writer.stop()
            sent = len(writer.sent)
            dead = connect_redis(valkey.url).xlen("engram:dead")
        print(
            f"\nrecords: {args.records:,}, and {sent:,} remembers sent through the streams at"
            f" {args.write_rate:g}/s meanwhile ({dict(outcomes)}, {dead} dead letters)\n"
            f"raw {args.model}:       {raw_rate:,.1f} records/s\n"
            f"engram reembed:   {rate:,.1f} records/s ({done.done:,} records in {seconds:.1f} s,"
            f" passes {done.pass_}, skipped {done.skipped}; {done.message})\n"
            f"store's overhead: {1 - rate / raw_rate:.1%} of the re-embedding's time against the"
            f" raw rate; {done.store_s / (done.store_s + done.embed_s):.1%} of the job's own time"
            f" (store {done.store_s:.1f} s, embedder {done.embed_s:.1f} s)"
            + (f"\nCPU busy {shares.busy:.0%}, stolen {shares.stolen:.0%}" if shares else "")
        )
        assert outcomes["committed"] == sent and not dead, "a write was refused"
    finally:
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs.stop_process(psutil.Process(child.pid), signal.SIGTERM, 60)
            child.wait()
        valkey.stop()
        discard(server)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

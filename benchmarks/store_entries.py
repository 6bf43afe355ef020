"""One beat with 100,000 store entries: its start-up to the first tick, its idle CPU and its memory.

    .venv/bin/python benchmarks/store_entries.py [--url redis://127.0.0.1:6379/5]
        [--entries 100000] [--idle 20] [--threads 8] [--profile]

1. **seed**: ``--entries`` store entries written through the store API (``put_entry``, from
   ``--threads`` threads; benchmarks/schedules_sync.py ``seed``), each a daily crontab twelve hours
   away (nothing comes due), in a namespace of their own (``bench-se-<random>``);
2. **start-up**: one real ``celery beat`` (benchmarks/dispatch_app.py with no ``beat_schedule``
   entry, ``DISPATCH_NAMESPACE`` the seeded one, broker ``memory://``: nothing is sent): from the
   process's start to the end of its first tick (``DISPATCH_READY``: the scheduler built, the store
   prepared), and to its first ``synced entries version`` line (every store entry loaded and
   checked into a plan); the CPU of the process until each;
3. **idle**: after a 5-s settle, the process's CPU over ``--idle`` seconds (% of one core), its
   VmRSS at the end and its VmHWM (peak);
4. every key of the namespace is deleted at the end (``SCAN`` on the namespace's hash tag).

``--profile``: py-spy (100 Hz, ``raw``) on the beat from its start until the first sync line;
prints the functions with the most samples, inclusive and own.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE]

from procs import CeleryProcs  # noqa: E402
from schedules_sync import cpu_seconds, rss_mb, seed  # noqa: E402

SYNCED = re.compile(r"anarchon: synced entries version (\d+): .*\((\d+) store entries\)")
SETTLE_S = 5
START_TIMEOUT_S = 900


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def summarise(path: str, top: int = 25) -> str:
    """The functions with the most py-spy samples (inclusive, then own) of a ``raw`` file."""
    own, incl, total = collections.Counter(), collections.Counter(), 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            n = int(count)
            total += n
            frames = [frame.rsplit(" (", 1)[0] + " (" + frame.rsplit(" (", 1)[1].split(":")[0]
                      .replace(os.path.dirname(HERE) + "/", "") + ")" if " (" in frame else frame
                      for frame in stack.split(";")]
            own[frames[-1]] += n
            for frame in set(frames):
                incl[frame] += n
    if not total:
        return "(no samples)"
    lines = [f"py-spy: {total} samples (100 Hz, wall time, idle included); inclusive:"]
    lines += [f"  {n / total:6.1%}  {frame}" for frame, n in incl.most_common(top)]
    lines.append("own:")
    lines += [f"  {n / total:6.1%}  {frame}" for frame, n in own.most_common(top)]
    return "\n".join(lines)


def delete_namespace(url: str, namespace: str) -> int:
    client = redis.Redis.from_url(url)
    deleted = 0
    batch = []
    for key in client.scan_iter(match=f"*{namespace}*", count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            deleted += client.unlink(*batch)
            batch = []
    if batch:
        deleted += client.unlink(*batch)
    client.close()
    return deleted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/5", help="the Redis store")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--idle", type=float, default=20.0, help="idle window, seconds")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--profile", action="store_true", help="py-spy the start-up")
    args = parser.parse_args()

    namespace = "bench-se-" + uuid.uuid4().hex[:8]
    hour = (datetime.datetime.now(datetime.timezone.utc).hour + 12) % 24
    print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"store {args.url}, namespace {namespace}", flush=True)
    folder = tempfile.mkdtemp(prefix="anarchon-store-entries-")
    proc = profiler = None
    out: dict = {"entries": args.entries}
    try:
        out["seed_s"] = seed(args.url, namespace, args.entries, hour, args.threads)
        print(f"seeded {args.entries:,} store entries in {out['seed_s']:.1f} s", flush=True)
        ready = os.path.join(folder, "ready")
        procs = CeleryProcs(folder, app="dispatch_app", pythonpath=(HERE,))
        env = {"DISPATCH_BROKER": "memory://", "DISPATCH_SCHEDULER": "anarchon",
               "DISPATCH_ENTRIES": "0", "DISPATCH_STORE": args.url,
               "DISPATCH_NAMESPACE": namespace, "DISPATCH_READY": ready}
        out["load_before"] = os.getloadavg()[0]
        started = time.time()
        proc = procs.beat("beat", "--pidfile=", env=env)
        pid = proc.popen.pid
        if args.profile:
            binary = os.path.join(os.path.dirname(sys.executable), "py-spy")
            profiler = subprocess.Popen(
                [binary, "record", "--pid", str(pid), "--rate", "100", "--format", "raw", "--idle",
                 "--nonblocking", "-o", os.path.join(folder, "py-spy.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        tick = sync = None
        while tick is None or sync is None:
            if not proc.alive() or time.monotonic() > deadline:
                raise SystemExit(f"beat did not start (exit {proc.popen.poll()}):\n"
                                 f"{proc.text()[-3000:]}")
            if tick is None and os.path.exists(ready) and open(ready).read().strip():
                at, cpu = map(float, open(ready).read().split())
                tick = (at - started, cpu)
            if sync is None:
                found = SYNCED.search(proc.text())
                if found:
                    sync = (time.time() - started, cpu_seconds(pid), int(found.group(2)))
            time.sleep(0.05)
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(60)
        out.update(first_tick_s=tick[0], first_tick_cpu_s=tick[1], first_sync_s=sync[0],
                   first_sync_cpu_s=sync[1], synced_entries=sync[2],
                   rss_at_start_mb=rss_mb(pid))
        time.sleep(SETTLE_S)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(args.idle)
        cpu1, t1 = cpu_seconds(pid), time.monotonic()
        out.update(idle_cpu_pct=100 * (cpu1 - cpu0) / (t1 - t0), rss_mb=rss_mb(pid),
                   peak_rss_mb=peak_rss_mb(pid), load_after=os.getloadavg()[0])
    finally:
        if proc is not None and proc.alive():
            os.killpg(proc.popen.pid, signal.SIGTERM)
            try:
                proc.popen.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
        if profiler is not None and profiler.poll() is None:
            profiler.kill()
        out["deleted_keys"] = delete_namespace(args.url, namespace)
    print(f"{args.entries:,} store entries, one beat: first tick {out['first_tick_s']:.1f} s "
          f"({out['first_tick_cpu_s']:.1f} CPU s); first sync ({out['synced_entries']:,} entries) "
          f"{out['first_sync_s']:.1f} s ({out['first_sync_cpu_s']:.1f} CPU s); idle "
          f"{out['idle_cpu_pct']:.2f} % of a core over {args.idle:g} s; RSS {out['rss_mb']:.0f} MB "
          f"(at start-up {out['rss_at_start_mb']:.0f} MB, peak {out['peak_rss_mb']:.0f} MB); "
          f"load average {out['load_before']:.2f} before, {out['load_after']:.2f} after; "
          f"{out['deleted_keys']:,} keys deleted")
    print(out)
    if args.profile and os.path.exists(os.path.join(folder, "py-spy.txt")):
        print(summarise(os.path.join(folder, "py-spy.txt")))
    if proc is not None:
        warnings = [line for line in proc.text().splitlines() if "WARNING" in line or "ERROR" in line]
        if warnings:
            print("beat log:", *warnings[:10], sep="\n  ")


if __name__ == "__main__":
    main()

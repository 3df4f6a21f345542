#!/usr/bin/env python3
"""Soak test: back-to-back `run`, `search` and `sql` invocations over the
development data, a random share of them SIGKILLed part-way, each killed
`run` taken up by the next `run --resume`.

After every invocation it checks that each final output file is either
absent (nothing completed yet), or byte-identical to the complete output of
one of the job's variants (the previous complete file, or the new one): never
a partial file. Every `run` that completes after resumes must equal the
uninterrupted reference run. It records, per invocation, the peak resident
memory (wait4's ru_maxrss) and the most file descriptors the process held
(sampled from /proc), and fails when either grows across the loop: the last
tenth's median above the first tenth's by more than `--growth`.

Standard library only. Usage:

    python3 benches/soak/soak.py --bin target/release/hubnorm \
        --data ../shared/dev-data/wordnet-minilm --work /tmp/soak \
        --iterations 100 --out benches/runs/DATE-soak
"""

import argparse
import csv
import hashlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def count_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def launch(argv, kill_after):
    """Runs argv; SIGKILLs it after kill_after seconds when set. Returns
    (exit status, seconds, peak RSS in KiB, most fds seen, killed)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    most_fds, killed = 0, False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        most_fds = max(most_fds, count_fds(proc.pid))
        if kill_after is not None and time.monotonic() - start >= kill_after:
            os.kill(proc.pid, signal.SIGKILL)
            killed = True
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.01)
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    return code, time.monotonic() - start, usage.ru_maxrss, most_fds, killed, stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, type=Path)
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--kill-share", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--memory-limit", default="256M")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--growth", type=float, default=1.2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    data = args.data
    common = ["--memory-limit", args.memory_limit, "--threads", args.threads, "--quiet"]

    def run_argv(out, checkpoint=("--resume", "--checkpoint-interval", "0")):
        return [str(args.bin), "run", "--queries", str(data / "queries.parquet"),
                "--gallery", str(data / "gallery.parquet"), "--bank", str(data / "bank.parquet"),
                "--methods", "is,nnn,sn", "--k", "10", "--out", str(out),
                "--overwrite", *checkpoint] + common

    # The reference run (uninterrupted), whose statistics the searches use.
    reference = work / "reference"
    code, seconds, _, _, _, err = launch(run_argv(reference, ["--no-checkpoint"]), None)
    if code != 0:
        sys.exit(f"reference run failed: {err}")
    stats = reference / "gallery_stats.parquet"

    def search_argv(k):
        return [str(args.bin), "search", "--queries", str(data / "queries.parquet"),
                "--gallery", str(data / "gallery.parquet"), "--stats", str(stats),
                "--methods", "is,nnn", "--k", str(k), "--out", str(work / "search.parquet"),
                "--overwrite"] + common

    def sql_argv(k):
        # A pass inside the query: hubnorm_search's rows, sorted.
        query = (f"SELECT method, query_id, rank, gallery_id, score FROM hubnorm_search("
                 f"'{data / 'queries.parquet'}', '{data / 'gallery.parquet'}', '{stats}', "
                 f"'is,nnn', {k}) ORDER BY method, query_id, rank")
        return [str(args.bin), "sql", "--format", "parquet", "--out", str(work / "sql.parquet"),
                "--overwrite", "--memory-limit", args.memory_limit, "--threads", args.threads,
                query]

    run_files = ["results.parquet", "gallery_stats.parquet", "summary.json"]
    expected = {("run", name): {digest(reference / name)} for name in run_files}
    durations = {"run": seconds}
    # Each variant's complete output, made once uninterrupted.
    for job, argv_of, target in [("search", search_argv, "search.parquet"),
                                 ("sql", sql_argv, "sql.parquet")]:
        expected[(job, target)] = set()
        for k in (5, 10):
            start = time.monotonic()
            code, _, _, _, _, err = launch(argv_of(k), None)
            if code != 0:
                sys.exit(f"{job} k={k} failed: {err}")
            durations[job] = time.monotonic() - start
            expected[(job, target)].add(digest(work / target))
            (work / target).unlink()

    rng = random.Random(args.seed)
    rows = []
    run_out = work / "run"
    for i in range(args.iterations):
        job = ["run", "search", "sql"][i % 3]
        k = rng.choice([5, 10])
        argv = {"run": lambda: run_argv(run_out), "search": lambda: search_argv(k),
                "sql": lambda: sql_argv(k)}[job]()
        kill_after = None
        if rng.random() < args.kill_share:
            kill_after = rng.uniform(0.0, 1.1 * durations[job])
        code, seconds, rss_kib, fds, killed, err = launch(argv, kill_after)
        if not killed and code != 0:
            sys.exit(f"iteration {i}: {job} failed with exit {code}: {err}")
        # Every final name: absent, or some complete output of the job.
        if job == "run":
            finals = [("run", name, run_out / name) for name in run_files]
        else:
            target = f"{job}.parquet"
            finals = [(job, target, work / target)]
        for kind, name, path in finals:
            got = digest(path)
            if got is not None and got not in expected[(kind, name)]:
                sys.exit(f"iteration {i}: {path} is not a complete output ({job}, killed={killed})")
        leftovers = [p.name for p in work.iterdir() if p.name.startswith(".") and ".tmp-" in p.name]
        resumed_ok = ""
        if job == "run" and not killed:
            resumed_ok = all(digest(run_out / n) in expected[("run", n)] for n in run_files)
            if not resumed_ok or (run_out / "run.checkpoint").exists():
                sys.exit(f"iteration {i}: a completed run differs from the reference or kept its checkpoint")
        rows.append({"iteration": i, "job": job, "k": k if job != "run" else 10,
                     "killed_after_s": "" if kill_after is None else f"{kill_after:.3f}",
                     "killed": killed, "exit": code, "seconds": f"{seconds:.3f}",
                     "peak_rss_kib": rss_kib, "most_fds": fds,
                     "equal_to_reference": resumed_ok, "stray_temporaries": len(leftovers)})
        print(f"{i:3d} {job:6s} k={k:2d} {'KILL' if killed else 'done'} exit={code:4d} "
              f"{seconds:6.2f}s rss={rss_kib / 1024:6.1f}MiB fds={fds}", flush=True)

    verdicts = []
    for job in ("run", "search", "sql"):
        done = [r for r in rows if r["job"] == job and not r["killed"]]
        tenth = max(1, len(done) // 10)
        for field in ("peak_rss_kib", "most_fds"):
            first = statistics.median(r[field] for r in done[:tenth])
            last = statistics.median(r[field] for r in done[-tenth:])
            flat = last <= args.growth * first
            verdicts.append((job, field, first, last, flat))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "soak.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        killed = sum(r["killed"] for r in rows)
        completed_runs = sum(1 for r in rows if r["job"] == "run" and not r["killed"])
        lines = [
            "# Soak: run / search / sql with random SIGKILLs and --resume",
            "",
            f"Machine: {cpu_model()}, {os.cpu_count()} CPUs. Binary: `{args.bin}`. "
            f"Data: `{args.data}`. Seed {args.seed}, {args.iterations} invocations, "
            f"{killed} SIGKILLed, {completed_runs} runs completed (each checked byte-identical "
            "to the uninterrupted reference run).",
            "",
            "Every final file after every invocation was absent or a complete output "
            "of the job (checked by SHA-256 against the uninterrupted outputs).",
            "",
            "| job | measure | median of the first tenth | median of the last tenth | flat |",
            "|---|---|---|---|---|",
        ]
        for job, field, first, last, flat in verdicts:
            lines.append(f"| {job} | {field} | {first} | {last} | {'yes' if flat else 'NO'} |")
        lines += ["", "Raw rows: soak.csv (one per invocation).", ""]
        (args.out / "summary.md").write_text("\n".join(lines))
    for job, field, first, last, flat in verdicts:
        print(f"{job} {field}: first tenth {first}, last tenth {last} -> {'flat' if flat else 'GREW'}")
    if not all(v[4] for v in verdicts):
        sys.exit("memory or file descriptors grew across the loop")


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()

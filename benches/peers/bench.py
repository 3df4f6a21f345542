#!/usr/bin/env python3
"""hubnorm against its peers, on the same data in the same run, with the machine's f32 peak.

Run through benches/peers/run.sh (it makes the virtual environment and builds hubnorm):

    benches/peers/run.sh --sizes dev,10k --threads 1,2
    benches/peers/run.sh --summarize benches/runs/2025-11-23     # regenerate summary.md only

Every measurement is a separate child process (hubnorm, or `python peers.py JOB`), timed here
with os.wait4: wall time, user+sys CPU time and peak RSS of that child alone. Tools alternate
within each repeat (hubnorm, peer A, peer B, hubnorm, ...); medians are reported. Peers run under
an address-space limit, so a dense peer that cannot hold its matrix fails fast: `oom` is a result.
Every peer's output is checked against hubnorm's (same top-k ids except at exact ties, statistics
within 1e-5) before its time counts. Writes setup.md, raw.csv, commands.log and summary.md into
--out; summary.md is generated from raw.csv alone (--summarize), except for hand-written sections
below KEEP_MARKER, which regenerating keeps.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)

# the peak job's row for the bf16 dot loop of `hubnorm bench --peak-only` (CPUs with AVX512_BF16)
BF16_PEAK_TOOL = "hubnorm-bf16-dot"
JOBS_ALL = ["peak", "topk", "is-pass1", "is-pass2", "dis", "nnn", "sn", "hubness", "object-store", "memory",
            "scaling", "cluster"]
RAW_FIELDS = ["run_id", "job", "size", "tool", "threads", "repeat", "wall_s", "cpu_s", "max_rss_mib",
              "gflop", "status", "check", "gflops_reported", "n_queries", "n_gallery", "n_bank", "dim",
              "loadavg", "note"]

# generated sizes: gallery x bank x queries x d
GENERATED = {
    "tiny": dict(d=64, gallery=2_000, bank=3_000, queries=1_000),
    "10k": dict(d=384, gallery=10_000, bank=100_000, queries=10_000),
    "100k": dict(d=384, gallery=100_000, bank=100_000, queries=10_000),
    "1m": dict(d=384, gallery=1_000_000, bank=100_000, queries=10_000),
}
SIZE_ORDER = ["tiny", "dev", "10k", "100k", "1m"]


def generated_size(name):
    """The shape of a generated size: `100k`, or `100k@768` for the same rows in another dimension."""
    base, _, d = name.partition("@")
    s = dict(GENERATED[base])
    if d:
        s["d"] = int(d)
    return s
K = 10
# method defaults of METHODS.md, and the gallery_stats.parquet columns they give
BETA, KA, ALPHA, NNN_K, TAU, ITER = 20, 1, 0.75, 128, 0.01, 10
COL = {
    "is": "is_beta20_correction",
    "dis": "dis_beta20_ka1_correction",
    "dis_active": "dis_beta20_ka1_active",
    "nnn": "nnn_alpha0.75_k128_correction",
    "sn": "sn_tau0.01_t10_correction",
}
TIE = 1e-6  # a top-k id mismatch is forgiven when the scores tie within this
SCORE_TOL = 1e-4  # scores at the same rank must agree within this
STAT_TOL = 1e-5  # per-gallery statistics must agree within this (absolute)
PEER_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

JOB_TEXT = {
    "topk": "Top-10 inner-product search, no correction. hubnorm `search --method none`; faiss "
            "`IndexFlatIP.search`; numpy blocked matmul (~1024 queries per block) + argpartition + sort. "
            "GFLOP = 2·queries·gallery·d.",
    "is-pass1": "Pass 1 of inverted softmax (β = 20): h(g) over bank × gallery. hubnorm `stats --method "
                "is`; dense numpy: the whole bank × gallery matrix, then the column log-sum-exp (QB-Norm "
                "reference style). GFLOP = 2·bank·gallery·d.",
    "is-pass2": "Pass 2 of inverted softmax: top-10 of s(q, g) − h(g) with h from hubnorm's pass 1 "
                "(the same file for every tool). hubnorm `search --method is --stats F`; faiss `IndexFlatIP` "
                "on (d+1)-vectors [g, h(g)] · [q, −1] (the README's export convention); dense numpy "
                "query × gallery matrix. GFLOP = 2·queries·gallery·d.",
    "dis": "Dynamic inverted softmax (β = 20, k_A = 1), both passes. hubnorm `stats --method dis` then "
           "`search --method dis` (two processes, times added, RSS the larger); dense numpy bank × gallery "
           "and query × gallery matrices. GFLOP = 2·d·(bank + queries)·gallery.",
    "nnn": "NNN (α = 0.75, k = 128), both passes. hubnorm `stats` + `search --method nnn`; peer: chunked "
           "top-k of bank similarities per gallery item (~256 MB chunks), then a faiss `IndexFlatIP` search "
           "on (d+1)-vectors. GFLOP = 2·d·(bank + queries)·gallery.",
    "sn": "Sinkhorn normalisation (τ = 0.01, T = 10, uniform marginals, bank × gallery), both passes. "
          "hubnorm `stats` + `search --method sn`; numpy: dense matrix, log-domain loop (f32 blocks, f64 sums); "
          "POT: `ot.sinkhorn(method='sinkhorn_log', numItermax=10, stopThr=0)` on the transposed problem "
          "(its first update is then METHODS.md's source update; f = −τ·log_u). GFLOP counts the GEMM "
          "once: 2·d·(bank + queries)·gallery, although every iteration sweeps the matrix twice.",
    "object-store": "`hubnorm run --methods is` (both passes) on local files against the same run with every "
                    "input and output on a local S3-compatible server started by the harness on 127.0.0.1 "
                    "(`hubnorm-s3-moto`: moto, Python; `hubnorm-s3-s3s-fs`: s3s-fs, Rust; inputs uploaded once, "
                    "untimed). The server runs on the same cores as hubnorm, so its own CPU time counts against "
                    "the S3 run. The S3 runs' outputs are downloaded and checked against the local run's. "
                    "GFLOP = 2·d·(bank + queries)·gallery.",
    "cluster": "Pass 1 of inverted softmax (`hubnorm stats --method is`) on one machine with `--threads 1` "
               "and `--threads 2`, against `hubnorm stats --cluster` (16 shards) on a Ballista cluster of "
               "hubnorm processes on 127.0.0.1: a scheduler and 1 or 2 executors of one task slot each "
               "(`hubnorm-cluster-1x1`, `hubnorm-cluster-2x1`; both clusters run through the whole job, the "
               "idle one polling its scheduler). The cluster's output is checked byte for byte against the "
               "local one. cpu_s counts the client only. GFLOP = 2·bank·gallery·d.",
    "cluster-search": "Pass 2 of inverted softmax (`hubnorm search --method is`, k = 10, statistics from one "
                      "`hubnorm stats` run made beforehand, untimed) on one machine with `--threads 1` and "
                      "`--threads 2`, against `hubnorm search --cluster` (shards of query rows, "
                      "`--cluster-search-shards`, 4 by default) on the same two clusters. Results checked byte "
                      "for byte against the local file. cpu_s counts the client only. "
                      "GFLOP = 2·queries·gallery·d.",
    "cluster-sn": "Pass 1 of Sinkhorn normalisation (`hubnorm stats --method sn`, τ = 0.01, T = 10) on one "
                  "machine with `--threads 1` and `--threads 2` (the similarity tiles cached when they fit "
                  "the memory limit, each iteration one fused pass over them), against `hubnorm stats "
                  "--cluster` (16 shards) on the same two clusters: T + 1 rounds, each a job sharded over the "
                  "gallery's rows, two sweeps per shard. Checked: the potentials within 1e-6 of the scores' scale "
                  "(max(1, |f|)) "
                  "(not bit for bit: the rounds compute every update in the exact form), other columns "
                  "identical. cpu_s counts the client only. GFLOP = 2·bank·gallery·d (one sweep's GEMM).",
    "hubness": "k-occurrence skewness (k = 10, all gallery items) of the same neighbour lists (hubnorm `run "
               "--methods none`'s results.parquet). hubnorm `report`; peer: pyarrow + numpy bincount + "
               "`scipy.stats.skew`. Checked against summary.json of `hubnorm run`.",
}


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------

def parse_size(s: str) -> int:
    """'10k' -> 10000, '1m' -> 1000000, '256MiB' -> bytes."""
    s = s.strip()
    m = re.fullmatch(r"(?i)([0-9.]+)\s*(k|m|g|kib|mib|gib|kb|mb|gb|b)?", s)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r}")
    v, unit = float(m.group(1)), (m.group(2) or "").lower()
    mult = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "kb": 1e3, "mb": 1e6, "gb": 1e9,
            "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3}[unit]
    return int(round(v * mult))


def human_bytes(b: float) -> str:
    if b >= 1e9:
        return f"{b / 1e9:.1f} GB"
    if b >= 1e6:
        return f"{b / 1e6:.0f} MB"
    return f"{b / 1e3:.0f} kB"


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def mem_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def loadavg() -> float:
    try:
        return float(open("/proc/loadavg").read().split()[0])
    except OSError:
        return float("nan")


def fmt(v, digits=3):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.2f}"
    return str(v)


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------

class Data:
    def __init__(self, name, queries, gallery, bank, nq, ng, nb, d):
        self.name, self.queries, self.gallery, self.bank = name, queries, gallery, bank
        self.nq, self.ng, self.nb, self.d = nq, ng, nb, d
        self._gidx = self._qidx = None

    def gallery_index(self):
        import common
        if self._gidx is None:
            self._gidx = common.id_index(common.load_ids(self.gallery))
        return self._gidx

    def query_index(self):
        import common
        if self._qidx is None:
            self._qidx = common.id_index(common.load_ids(self.queries))
        return self._qidx

    def input_bytes(self):
        return (self.nq + self.ng + self.nb) * self.d * 4


def gen_paths(data_dir, d, ng, nb, nq):
    base = os.path.join(data_dir, f"d{d}")
    return (os.path.join(base, f"queries_{nq}_of_{ng}.parquet"), os.path.join(base, f"gallery_{ng}.parquet"),
            os.path.join(base, f"bank_{nb}.parquet"))


def generated(name, data_dir, d, ng, nb, nq, log) -> Data:
    import common
    q, g, b = gen_paths(data_dir, d, ng, nb, nq)
    common.write_stream(g, d, common.STREAM_GALLERY, ng, log=log)
    common.write_stream(b, d, common.STREAM_BANK, nb, log=log)
    if nq:
        common.write_queries(q, d, ng, nq, log=log)
    return Data(name, q if nq else None, g, b, nq, ng, nb, d)


def size_data(name, args, log):
    import common
    if name == "dev":
        root = args.dev_data
        q, g, b = (os.path.join(root, f) for f in ("queries.parquet", "gallery.parquet", "bank.parquet"))
        if not all(os.path.exists(p) for p in (q, g, b)):
            log(f"size dev: skipped, no development data at {root} (set --dev-data)")
            return None
        return Data("dev", q, g, b, common.parquet_rows(q), common.parquet_rows(g), common.parquet_rows(b),
                    common.parquet_dim(g))
    s = generated_size(name)
    return generated(name, args.data_dir, s["d"], s["gallery"], s["bank"], s["queries"], log)


# ----------------------------------------------------------------------------------------------
# running one measurement
# ----------------------------------------------------------------------------------------------

class Measurement:
    def __init__(self):
        self.wall = self.cpu = 0.0
        self.rss_kib = 0
        self.status = "ok"
        self.note = ""
        self.output = ""


_CURRENT = {"pid": None}
SPAWN = os.path.join(HERE, "spawn.py")


class RU:
    def __init__(self, user, sys_, maxrss):
        self.ru_utime, self.ru_stime, self.ru_maxrss = user, sys_, maxrss


def run_child(argv, env, log_path, timeout, as_limit):
    """Run one child through spawn.py (a small launcher, so that the child's peak RSS is its own and
    not the driver's; see spawn.py). Returns (wall, rusage, exit code, timed_out)."""
    result = log_path + ".result"
    launcher = [sys.executable, "-S", "-I", SPAWN, result, log_path, f"{timeout:g}", str(int(as_limit or 0)), "--"]
    p = subprocess.Popen(launcher + list(argv), env=env, start_new_session=True,
                         stdin=subprocess.DEVNULL)
    _CURRENT["pid"] = p.pid
    try:
        try:
            p.wait(timeout=timeout + 120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    finally:
        _CURRENT["pid"] = None
    try:
        with open(result) as f:
            wall, user, sys_, rss, rc, to = f.read().split()
        os.unlink(result)
        return float(wall), RU(float(user), float(sys_), int(rss)), int(rc), to == "1"
    except (OSError, ValueError):
        with open(log_path, "a") as f:
            f.write(f"\nbench.py: the launcher failed (exit {p.returncode})\n")
        return 0.0, RU(0.0, 0.0, 0), p.returncode if p.returncode else 1, False


def classify(rc, timed_out, text, peer):
    if timed_out:
        return "timeout"
    if rc == 0:
        return "ok"
    # under RLIMIT_AS, failing to map a thread stack is also running out of (address) space
    oom_words = ("MemoryError", "out of memory", "bad_alloc", "Cannot allocate memory",
                 "Failed to launch worker thread", "pthread_create failed", "Resource temporarily unavailable")
    if peer and (rc == 3 or any(w in text for w in oom_words)):
        return "oom"
    if rc < 0:
        return f"failed (signal {-rc})"
    return f"failed (rc {rc})"


def last_line(text):
    """The first line that starts with 'error', else the last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    err = [ln for ln in lines if ln.lower().startswith(("error", "out of memory", "memoryerror"))]
    return (err[0] if err else lines[-1] if lines else "")[:300]


# ----------------------------------------------------------------------------------------------
# tools
# ----------------------------------------------------------------------------------------------

class Tool:
    """One timed tool of a job: its child command(s) per repeat directory, memory need and check."""

    def __init__(self, name, steps, peer=False, need=0, check=None, limited=None, env=None, checked=None):
        self.name, self.steps, self.peer, self.need, self.check = name, steps, peer, need, check
        self.limited = peer if limited is None else limited  # run under the address-space limit
        self.env = env or {}  # added to the child's environment
        self.checked = peer if checked is None else checked  # compared with the first hubnorm output


class Bench:
    def __init__(self, args):
        self.args = args
        self.run_id = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.work = os.path.abspath(os.path.join(args.work_dir, self.run_id))
        os.makedirs(self.work, exist_ok=True)
        self.raw_path = os.path.join(self.out, "raw.csv")
        new = not os.path.exists(self.raw_path)
        self.raw = open(self.raw_path, "a", newline="")
        self.writer = csv.DictWriter(self.raw, fieldnames=RAW_FIELDS)
        if new:
            self.writer.writeheader()
        self.cmdlog = open(os.path.join(self.out, "commands.log"), "a")
        self.cmdlog.write(f"# run {self.run_id}: {' '.join(map(shlex.quote, sys.argv))}\n")
        self.examples = {}  # (job, tool) -> command line, for setup.md
        self.prep_cache = {}
        self.hub = args.hubnorm_bin
        self.blas = args.hubnorm_blas
        self.py = sys.executable
        self.peers = os.path.join(HERE, "peers.py")
        self.max_threads = max(args.threads)
        # Untimed preparation (the statistics that pass-2 jobs read) uses every usable core whatever
        # --threads says: at 1M a 1-thread pass 1 would add 14 unmeasured minutes.
        self.prep_threads = len(os.sched_getaffinity(0))
        self._s3 = {}  # the object-store job's servers by kind: started on first use, None if they cannot

    # -- logging -------------------------------------------------------------------------------
    def log(self, msg):
        print(f"[{dt.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)

    def as_limit(self):
        if self.args.peer_memory:
            return self.args.peer_memory
        return int(0.9 * mem_available())

    def env(self, threads, peer):
        env = dict(os.environ)
        env.pop("HUBNORM_BLAS", None)  # only the hubnorm+blas tool gets one
        if peer:
            for v in PEER_ENV:
                env[v] = str(threads)
            env["OPENBLAS_CORETYPE"] = "SkylakeX"
        return env

    def hub_common(self, threads, limit=None):
        return ["--threads", str(threads), "--memory-limit", limit or self.args.memory_limit_text,
                "--quiet", "--overwrite"]

    # -- measuring -----------------------------------------------------------------------------
    def measure(self, job, tool: Tool, threads, rdir):
        m = Measurement()
        steps = tool.steps(rdir, threads)
        env = {**self.env(threads, tool.peer), **tool.env}
        as_limit = self.as_limit() if tool.limited else None
        texts = []
        for i, argv in enumerate(steps):
            line = " ".join(shlex.quote(a) for a in argv)
            if tool.peer:
                line = " ".join(f"{v}={threads}" for v in PEER_ENV) + " OPENBLAS_CORETYPE=SkylakeX " + line
            line = "".join(f"{k}={shlex.quote(v)} " for k, v in tool.env.items()) + line
            self.cmdlog.write(line + "\n")
            self.cmdlog.flush()
            examples = self.examples.setdefault((job, tool.name), [])
            if len(examples) < len(steps):
                examples.append(line)
            log_path = os.path.join(rdir, f"step{i}.log")
            wall, ru, rc, timed_out = run_child(argv, env, log_path, self.args.timeout, as_limit)
            text = open(log_path, errors="replace").read()
            texts.append(text)
            m.wall += wall
            m.cpu += ru.ru_utime + ru.ru_stime
            m.rss_kib = max(m.rss_kib, ru.ru_maxrss)
            m.status = classify(rc, timed_out, text, tool.peer)
            if m.status != "ok":
                m.note = last_line(text)
                break
        m.output = "\n".join(texts)
        ph = re.findall(r"^phases: (.*)$", m.output, re.M)
        if ph and m.status == "ok":
            m.note = ph[-1]
        return m

    def write_row(self, **row):
        row.setdefault("run_id", self.run_id)
        self.writer.writerow({k: row.get(k, "") for k in RAW_FIELDS})
        self.raw.flush()

    def out_of_memory(self, tool):
        """(status, note) for a peer whose stated need exceeds the address-space limit, else None."""
        limit = self.as_limit()
        if tool.peer and tool.need and tool.need > limit:
            return f"oom (needs {human_bytes(tool.need)})", f"needs {tool.need} bytes > address-space limit {limit}"
        return None

    def run_group(self, job, size_label, data: Data | None, threads, tools, repeats, gflop, note_extra=""):
        """Repeats × tools, alternating tools within each repeat (hubnorm first)."""
        ref_dir = None
        skip = {}
        checked = set()
        dims = dict(n_queries=data.nq if data else "", n_gallery=data.ng if data else "",
                    n_bank=data.nb if data else "", dim=data.d if data else "")
        base = os.path.join(self.work, size_label, job, f"t{threads}")
        for rep in range(repeats):
            for tool in tools:
                if tool.name in skip:
                    continue
                if rep > 0 and tool is tools[0] and not tool.peer and self.args.reference_once:
                    continue
                oom = self.out_of_memory(tool)
                if oom:
                    status, note = oom
                    self.log(f"{job} {size_label} t{threads} {tool.name}: {status}; not run")
                    self.write_row(job=job, size=size_label, tool=tool.name, threads=threads, repeat=rep,
                                   gflop=f"{gflop:.3f}" if gflop else "", status=status,
                                   note=note + (f"; {note_extra}" if note_extra else ""), **dims)
                    skip[tool.name] = status
                    continue
                rdir = os.path.join(base, tool.name, f"r{rep}")
                os.makedirs(rdir, exist_ok=True)
                la = loadavg()
                m = self.measure(job, tool, threads, rdir)
                check = ""
                if m.status == "ok" and job != "peak":
                    if not tool.peer and ref_dir is None:
                        ref_dir = rdir
                        check = "reference"
                    elif tool.checked and tool.check and tool.name not in checked:
                        checked.add(tool.name)
                        try:
                            check = tool.check(ref_dir, rdir) if ref_dir else "n/a (no hubnorm output)"
                        except Exception as e:  # a check that cannot run is reported, not fatal
                            check = f"n/a (check failed: {type(e).__name__}: {e})"
                gf = ""
                rep_gf = re.search(r"(?:peak_gflops|gflops)=([0-9.eE+-]+)", m.output or "")
                if job == "peak":
                    if m.status == "ok" and rep_gf:
                        gf = rep_gf.group(1)
                    elif m.status != "ok" or not rep_gf:
                        if "unexpected argument" in m.output or (m.status == "ok" and not rep_gf):
                            m.status = "n/a (--peak-only not supported)"
                note = m.note + (f"; {note_extra}" if note_extra else "")
                rss_mib = m.rss_kib / 1024
                self.log(f"{job} {size_label} t{threads} r{rep} {tool.name}: {m.status} wall {m.wall:.2f}s "
                         f"cpu {m.cpu:.2f}s rss {rss_mib:.0f}MiB" + (f" {check}" if check else "")
                         + (f" gflops={gf}" if gf else ""))
                self.write_row(job=job, size=size_label, tool=tool.name, threads=threads, repeat=rep,
                               wall_s=f"{m.wall:.4f}", cpu_s=f"{m.cpu:.4f}", max_rss_mib=f"{rss_mib:.1f}",
                               gflop=f"{gflop:.3f}" if gflop else "", status=m.status, check=check,
                               gflops_reported=gf, loadavg=f"{la:.2f}", note=note, **dims)
                bf16 = re.search(r"bf16_peak_gflops=([0-9.eE+-]+)", m.output or "")
                if job == "peak" and m.status == "ok" and bf16:
                    # `bench --peak-only` times a vdpbf16ps loop after the FMA loop where the CPU has
                    # AVX512_BF16: the screen's own ceiling, kept as a row of its own
                    self.write_row(job=job, size=size_label, tool=BF16_PEAK_TOOL, threads=threads, repeat=rep,
                                   wall_s=f"{m.wall:.4f}", cpu_s=f"{m.cpu:.4f}", max_rss_mib=f"{rss_mib:.1f}",
                                   status="ok", gflops_reported=bf16.group(1), loadavg=f"{la:.2f}", **dims)
                if m.status != "ok":
                    skip[tool.name] = m.status
                if rep > 0 and not self.args.keep_work:
                    shutil.rmtree(rdir, ignore_errors=True)
        return ref_dir

    # -- preparation (untimed) -----------------------------------------------------------------
    def prep(self, key, argv):
        """Run an untimed hubnorm command once per invocation (cached by key). `argv(d)` gives the command
        without the common flags, which are added here with the preparation's thread count."""
        if key in self.prep_cache:
            return self.prep_cache[key]
        d = os.path.join(self.work, "prep", *key)
        os.makedirs(d, exist_ok=True)
        cmd = argv(d) + self.hub_common(self.prep_threads)
        self.cmdlog.write("# prep: " + " ".join(shlex.quote(a) for a in cmd) + "\n")
        self.log(f"prep {'/'.join(key)}")
        wall, ru, rc, to = run_child(cmd, self.env(self.prep_threads, False), os.path.join(d, "prep.log"),
                                     self.args.timeout, None)
        if rc != 0:
            text = open(os.path.join(d, "prep.log"), errors="replace").read()
            self.log(f"prep {'/'.join(key)} failed: {last_line(text)}")
            d = None
        self.prep_cache[key] = d
        return d

    def prep_stats(self, data, method):
        d = self.prep((data.name, f"stats_{method}"),
                      lambda d: [self.hub, "stats", "--gallery", data.gallery, "--bank", data.bank,
                                 "--method", method, "--out", os.path.join(d, "gallery_stats.parquet")])
        return os.path.join(d, "gallery_stats.parquet") if d else None

    def prep_run_none(self, data):
        return self.prep((data.name, "run_none"),
                         lambda d: [self.hub, "run", "--queries", data.queries, "--gallery", data.gallery,
                                    "--bank", data.bank, "--methods", "none", "--k", str(K),
                                    "--bootstrap", "0", "--out", os.path.join(d, "run")])

    def s3_server(self, kind):
        """The harness's S3-compatible server of `kind` (see --s3-servers), started on first use; None
        (logged) when it cannot start."""
        if kind not in self._s3:
            try:
                self._s3[kind] = LocalS3Server(kind, self.args, self.work, self.log)
            except (OSError, RuntimeError) as e:
                self.log(f"object-store: no {kind} server ({e})")
                self._s3[kind] = None
        return self._s3[kind]

    def stop_s3_servers(self):
        for server in self._s3.values():
            if server:
                server.stop()
        self._s3 = {}

    # -- peer commands -------------------------------------------------------------------------
    def peer(self, job, data, *extra, out="out.npz"):
        def steps(rdir, threads):
            argv = [self.py, self.peers, job, "--threads", str(threads), "--out", os.path.join(rdir, out)]
            for flag, val in (("--queries", data.queries), ("--gallery", data.gallery), ("--bank", data.bank)):
                if val:
                    argv += [flag, val]
            return [argv + list(extra)]
        return steps

    # -- jobs ----------------------------------------------------------------------------------
    def job_peak(self):
        for threads in self.args.threads:
            tools = [
                Tool("hubnorm-fma", lambda rdir, t: [[self.hub, "bench", "--peak-only", "--threads", str(t)]]),
                Tool("numpy-sgemm", lambda rdir, t: [[self.py, self.peers, "peak-sgemm", "--threads", str(t)]],
                     peer=True, limited=False),
            ]
            self.run_group("peak", "-", None, threads, tools, self.args.peak_repeats, 0)

    def with_blas_variant(self, tools, data):
        """With --hubnorm-blas: the hubnorm tool again, right after it, as `hubnorm+blas` (its tiles by that
        library's cblas_sgemm), checked against the plain hubnorm output like a peer."""
        if not self.blas or not tools or tools[0].name != "hubnorm":
            return tools
        hub = tools[0]
        variant = Tool("hubnorm+blas", hub.steps, env={"HUBNORM_BLAS": self.blas},
                       check=lambda ref, mine: check_hubnorm_pair(ref, mine, data), checked=True)
        return [hub, variant] + tools[1:]

    def tools_for(self, job, data: Data):
        nq, ng, nb, d = data.nq, data.ng, data.nb, data.d
        from peers import block_rows
        blk = block_rows(ng)
        sel = blk * ng * 12  # one block of scores + argpartition indices
        inp_qg = (nq + ng) * d * 4
        inp_all = data.input_bytes()
        hc = self.hub_common
        res = lambda rdir: os.path.join(rdir, "results.parquet")  # noqa: E731
        stats = lambda rdir: os.path.join(rdir, "gallery_stats.parquet")  # noqa: E731

        def stats_search(method, *extra):
            return lambda rdir, t: [
                [self.hub, "stats", "--gallery", data.gallery, "--bank", data.bank, "--method", method,
                 "--out", stats(rdir), *extra] + hc(t),
                [self.hub, "search", "--queries", data.queries, "--gallery", data.gallery, "--stats", stats(rdir),
                 "--method", method, "--k", str(K), "--bootstrap", "0", "--out", res(rdir), *extra] + hc(t)]

        if job == "topk":
            chk = lambda ref, mine: check_topk(ref and res(ref), "none", mine, data)  # noqa: E731
            plain = lambda rdir, t, *extra: [[self.hub, "search", "--queries", data.queries,  # noqa: E731
                                              "--gallery", data.gallery, "--method", "none", "--k", str(K),
                                              "--bootstrap", "0", "--out", res(rdir), *extra] + hc(t)]
            return 2.0 * nq * ng * d, [
                Tool("hubnorm", plain),
            ] + ([
                Tool("hubnorm-screened", lambda rdir, t: plain(rdir, t, "--precision", "screened"),
                     check=check_same_results, checked=True),
            ] if has_avx512_bf16() else []) + [
                Tool("faiss-flatip", self.peer("topk-faiss", Data("", data.queries, data.gallery, None, 0, 0, 0, 0)),
                     peer=True, need=inp_qg, check=chk),
                Tool("numpy-blocked", self.peer("topk-numpy", Data("", data.queries, data.gallery, None, 0, 0, 0, 0)),
                     peer=True, need=inp_qg + ng * d * 4 + sel, check=chk),
            ]
        if job == "is-pass1":
            chk = lambda ref, mine: check_stats(ref and stats(ref), {"h": COL["is"]}, mine, data)  # noqa: E731
            return 2.0 * nb * ng * d, [
                Tool("hubnorm", lambda rdir, t: [[self.hub, "stats", "--gallery", data.gallery, "--bank", data.bank,
                                                  "--method", "is", "--out", stats(rdir)] + hc(t)]),
                Tool("numpy-dense", self.peer("is-pass1", Data("", None, data.gallery, data.bank, 0, 0, 0, 0),
                                              "--beta", str(BETA)),
                     peer=True, need=(nb + ng) * d * 4 + nb * ng * 4, check=chk),
            ]
        if job == "is-pass2":
            f = self.prep_stats(data, "is")
            if not f:
                return None, []
            chk = lambda ref, mine: check_topk(ref and res(ref), "is", mine, data)  # noqa: E731
            qg = Data("", data.queries, data.gallery, None, 0, 0, 0, 0)
            search = lambda rdir, t, *extra: [[self.hub, "search", "--queries", data.queries,  # noqa: E731
                                               "--gallery", data.gallery, "--stats", f, "--method", "is", "--k",
                                               str(K), "--bootstrap", "0", "--out", res(rdir), *extra] + hc(t)]
            sq = lambda kind: Tool(  # noqa: E731
                f"faiss-sq-{kind}+refine", self.peer("is-faiss-sq", qg, "--stats", f, "--stats-column", COL["is"],
                                                     "--sq", kind, "--k-factor", str(self.args.refine_k_factor)),
                peer=True, need=2 * (nq + ng) * (d + 1) * 4 + ng * (d + 1) * 2, check=chk)
            return 2.0 * nq * ng * d, [
                Tool("hubnorm", search),
            ] + ([
                Tool("hubnorm-screened", lambda rdir, t: search(rdir, t, "--precision", "screened"),
                     check=check_same_results, checked=True),
            ] if has_avx512_bf16() else []) + [
                Tool("faiss-flatip", self.peer("is-faiss", qg, "--stats", f, "--stats-column", COL["is"]),
                     peer=True, need=2 * (nq + ng) * (d + 1) * 4, check=chk),
                sq("bf16"),
                sq("fp16"),
                Tool("numpy-dense", self.peer("is-pass2", qg, "--stats", f, "--stats-column", COL["is"]),
                     peer=True, need=inp_qg + nq * ng * 4 + sel, check=chk),
            ]
        both = 2.0 * d * (nb + nq) * ng
        if job == "dis":
            chk = lambda ref, mine: combine(  # noqa: E731
                check_stats(ref and stats(ref), {"h": COL["dis"], "active": COL["dis_active"]}, mine, data),
                check_topk(ref and res(ref), "dis", mine, data))
            return both, [
                Tool("hubnorm", stats_search("dis")),
                Tool("numpy-dense", self.peer("dis-dense", data, "--beta", str(BETA), "--activation-k", str(KA)),
                     peer=True, need=inp_all + max(nb * ng * 4, nq * ng * 4 + sel), check=chk),
            ]
        if job == "nnn":
            chk = lambda ref, mine: combine(  # noqa: E731
                check_stats(ref and stats(ref), {"h": COL["nnn"]}, mine, data),
                check_topk(ref and res(ref), "nnn", mine, data))
            chunk = max(1, min(ng, (1 << 26) // max(1, nb)))
            return both, [
                Tool("hubnorm", stats_search("nnn")),
            ] + ([
                Tool("hubnorm-screened", stats_search("nnn", "--precision", "screened"),
                     check=check_same_results, checked=True),
            ] if has_avx512_bf16() else []) + [
                Tool("chunked+faiss", self.peer("nnn-chunked", data, "--alpha", str(ALPHA), "--nnn-k", str(NNN_K)),
                     peer=True, need=2 * inp_all + 2 * chunk * nb * 4 + 2 * (nq + ng) * (d + 1) * 4, check=chk),
            ]
        if job == "sn":
            chk = lambda ref, mine: combine(  # noqa: E731
                check_stats(ref and stats(ref), {"h": COL["sn"]}, mine, data),
                check_topk(ref and res(ref), "sn", mine, data))
            flags = ("--tau", str(TAU), "--iterations", str(ITER))
            return both, [
                Tool("hubnorm", stats_search("sn")),
                Tool("numpy-logdomain", self.peer("sn-numpy", data, *flags),
                     peer=True, need=inp_all + ng * d * 4 + nb * ng * 4 + 2 * (1 << 26) + sel, check=chk),
                # POT holds about 9 float32 copies of the matrix (M, -M/reg, the arguments and
                # results of logsumexp, the plan): 1.86 GB peak RSS for 10k x 5k on the dev data
                Tool("pot-sinkhorn-log", self.peer("sn-pot", data, *flags),
                     peer=True, need=inp_all + 9 * nb * ng * 4, check=chk),
            ]
        if job == "object-store":
            run = lambda q, g, b, out: [self.hub, "run", "--queries", q, "--gallery", g, "--bank", b,  # noqa: E731
                                        "--methods", "is", "--k", str(K), "--bootstrap", "0", "--out", out]
            tools = [Tool("hubnorm-local", lambda rdir, t: [run(data.queries, data.gallery, data.bank,
                                                                os.path.join(rdir, "run")) + hc(t)])]
            for kind in self.args.s3_servers:
                s3 = self.s3_server(kind)
                if s3 is None:
                    continue
                remote = s3.upload(data)

                def check(ref, mine, s3=s3):
                    s3.download(s3.out_url(self.work, mine), mine, ("results.parquet", "gallery_stats.parquet"))
                    return check_hubnorm_pair(ref and os.path.join(ref, "run"), mine, data)
                tools.append(Tool(f"hubnorm-s3-{kind}",
                                  lambda rdir, t, s3=s3, remote=remote: [run(*remote, s3.out_url(self.work, rdir))
                                                                         + hc(t)],
                                  env=s3.env, check=check, checked=True))
            return both, tools if len(tools) > 1 else []
        if job == "hubness":
            run_dir = self.prep_run_none(data)
            if not run_dir:
                return None, []
            results = os.path.join(run_dir, "run", "results.parquet")
            summary = os.path.join(run_dir, "run", "summary.json")
            chk = lambda ref, mine: check_hubness(ref, summary, mine)  # noqa: E731
            return 0.0, [
                Tool("hubnorm-report", lambda rdir, t: [[self.hub, "report", "--results", results, "--gallery",
                                                         data.gallery, "--k", str(K), "--bootstrap", "0",
                                                         "--out", os.path.join(rdir, "report")] + hc(t)]),
                Tool("scipy-skew", lambda rdir, t: [[self.py, self.peers, "hubness", "--results", results,
                                                     "--gallery", data.gallery, "--k", str(K), "--method", "none",
                                                     "--out", os.path.join(rdir, "out.npz")]],
                     peer=True, need=0, check=chk),
            ]
        raise ValueError(job)

    def job_size(self, job, size_label, data):
        a = self.args
        if job == "sn" and data.nb * data.ng > a.sn_max_pairs:
            self.sn_not_run(size_label, data)
            return
        for threads in a.threads:
            gflop, tools = self.tools_for(job, data)
            tools = self.with_blas_variant(tools, data)
            if a.tools:
                # The first tool is the reference the others are checked against: always kept.
                tools = tools[:1] + [t for t in tools[1:] if t.name in a.tools]
            if not tools:
                self.log(f"{job} {size_label}: skipped (preparation failed)")
                return
            self.run_group(job, size_label, data, threads, tools, a.repeats_for(size_label), gflop / 1e9)
        if not a.keep_work:
            shutil.rmtree(os.path.join(self.work, size_label, job), ignore_errors=True)

    def sn_not_run(self, size_label, data):
        """sn above --sn-max-pairs: what each tool would need, recorded without running it. No dense peer
        holds the matrix there (out of memory is the result), and hubnorm alone recomputes the GEMM on every
        sweep once the matrix exceeds --memory-limit (2·T sweeps, about 40 min per run at 100k), so there is
        no ratio to measure."""
        a = self.args
        dims = dict(n_queries=data.nq, n_gallery=data.ng, n_bank=data.nb, dim=data.d)
        skipped = f"skipped (above --sn-max-pairs {a.sn_max_pairs:.3g})"
        self.log(f"sn {size_label}: bank × gallery = {data.nb * data.ng:.3g} pairs is above --sn-max-pairs "
                 f"{a.sn_max_pairs:.3g} (every iteration sweeps them twice; raise it to run); recording the "
                 f"peers' memory needs only")
        for threads in a.threads:
            gflop, tools = self.tools_for("sn", data)
            for tool in tools:
                status, note = self.out_of_memory(tool) or (skipped, f"needs {tool.need} bytes" if tool.need else "")
                self.log(f"sn {size_label} t{threads} {tool.name}: {status}; not run")
                self.write_row(job="sn", size=size_label, tool=tool.name, threads=threads, repeat=0,
                               gflop=f"{gflop / 1e9:.3f}", status=status, note=note, **dims)

    def job_memory(self):
        """hubnorm with inputs >= 4x its --memory-limit: peak RSS against the limit."""
        a = self.args
        name = a.memory_size
        if name == "dev":
            base = size_data("dev", a, self.log)
            if base is None:
                return
            d, ng, nq = base.d, base.ng, base.nq
            bank = base.bank
            nb = base.nb
            data = base
        else:
            s = GENERATED[name]
            d, ng, nq, nb = s["d"], s["gallery"], s["queries"], a.memory_bank_rows
            data = generated(f"{name}-bank{nb}", a.data_dir, d, ng, nb, nq, self.log)
            bank = data.bank
        limit = a.memory_small_limit
        gallery_bytes = ng * d * 4
        label = f"{name}/bank{nb}"
        if gallery_bytes < 4 * limit:
            self.log(f"memory: the gallery ({human_bytes(gallery_bytes)}) is less than 4x the limit "
                     f"({human_bytes(limit)}); the test is weaker than asked")
        dense1 = nb * ng * 4
        dense2 = nq * ng * 4
        note = (f"limit_bytes={limit};gallery_bytes={gallery_bytes};input_bytes={data.input_bytes()};"
                f"dense_pass1_bytes={dense1};dense_pass2_bytes={dense2}")
        lt = a.memory_small_limit_text
        threads = self.max_threads
        res = lambda rdir: os.path.join(rdir, "out")  # noqa: E731
        tools = [
            Tool("hubnorm-stats", lambda rdir, t: [[self.hub, "stats", "--gallery", data.gallery, "--bank", bank,
                                                    "--method", "is", "--out",
                                                    os.path.join(rdir, "gallery_stats.parquet")]
                                                   + self.hub_common(t, lt)]),
            Tool("hubnorm-run", lambda rdir, t: [[self.hub, "run", "--queries", data.queries, "--gallery",
                                                  data.gallery, "--bank", bank, "--methods", "none,is", "--k",
                                                  str(K), "--bootstrap", "0", "--out", res(rdir)]
                                                 + self.hub_common(t, lt)]),
            Tool("numpy-dense-is-pass1", self.peer("is-pass1", Data("", None, data.gallery, bank, 0, 0, 0, 0),
                                                   "--beta", str(BETA)),
                 peer=True, need=(nb + ng) * d * 4 + dense1,
                 check=lambda ref, mine: check_stats(ref and os.path.join(ref, "gallery_stats.parquet"),
                                                     {"h": COL["is"]}, mine, data)),
        ]
        gflop = 2.0 * nb * ng * d / 1e9
        self.run_group("memory", label, data, threads, tools, a.memory_repeats, gflop, note_extra=note)
        if not a.keep_work:
            shutil.rmtree(os.path.join(self.work, label), ignore_errors=True)

    def job_scaling(self):
        """hubnorm stats --method is over gallery sizes and over bank sizes."""
        a = self.args
        d = a.scaling_dim
        points = [(g, a.scaling_fixed_bank) for g in a.scaling_gallery]
        points += [(a.scaling_fixed_gallery, b) for b in a.scaling_bank]
        seen = set()
        for ng, nb in points:
            if (ng, nb) in seen:
                continue
            seen.add((ng, nb))
            data = generated(f"g{ng}xb{nb}", a.data_dir, d, ng, nb, 0, self.log)
            label = f"g{ng}xb{nb}"
            tools = [Tool("hubnorm", lambda rdir, t, data=data: [
                [self.hub, "stats", "--gallery", data.gallery, "--bank", data.bank, "--method", "is",
                 "--out", os.path.join(rdir, "gallery_stats.parquet")] + self.hub_common(t)])]
            self.run_group("scaling", label, data, a.scaling_threads or self.max_threads, tools,
                           a.scaling_repeats, 2.0 * nb * ng * d / 1e9)
            shutil.rmtree(os.path.join(self.work, label), ignore_errors=True)

    def job_cluster(self):
        """hubnorm stats --method is: local 1 and 2 threads against clusters of 1 and 2 one-slot executors."""
        a = self.args
        data = size_data(a.cluster_size, a, self.log)
        if data is None:
            return
        clusters = {n: LocalCluster(self.hub, n, os.path.join(self.work, f"cluster{n}"), self.log)
                    for n in (1, 2)}
        try:
            def stats(rdir, extra):
                return [[self.hub, "stats", "--gallery", data.gallery, "--bank", data.bank, "--method", "is",
                         "--out", os.path.join(rdir, "gallery_stats.parquet"), "--memory-limit",
                         a.memory_limit_text, "--quiet", "--overwrite"] + extra]

            def same(name):
                def check(ref, mine):
                    with open(os.path.join(ref, name), "rb") as x, open(os.path.join(mine, name), "rb") as y:
                        return "ok: byte-identical" if x.read() == y.read() else "mismatch: the files differ"
                return check

            same_file = same("gallery_stats.parquet")

            tools = [Tool(f"hubnorm-t{t}", lambda rdir, _, t=t: stats(rdir, ["--threads", str(t)]),
                          check=same_file, checked=True) for t in (1, 2)]
            tools += [Tool(f"hubnorm-cluster-{n}x1",
                           lambda rdir, _, n=n: stats(rdir, ["--cluster", clusters[n].url, "--shards", "16"]),
                           check=same_file, checked=True) for n in (1, 2)]
            gflop = 2.0 * data.nb * data.ng * data.d / 1e9
            if "stats" in a.cluster_passes:
                self.run_group("cluster", a.cluster_size, data, 2, tools, a.cluster_repeats, gflop)
            if "sn" in a.cluster_passes:
                self.cluster_sn(data, clusters)
            if "search" not in a.cluster_passes:
                return

            # Pass 2 with one stats file made here (untimed): the search in shards of query rows.
            stats_dir = os.path.join(self.work, a.cluster_size, "cluster-search-stats")
            os.makedirs(stats_dir, exist_ok=True)
            stats_file = os.path.join(stats_dir, "gallery_stats.parquet")
            made = stats(stats_dir, ["--threads", str(self.max_threads)])[0]
            self.log(" ".join(shlex.quote(x) for x in made))
            subprocess.run(made, check=True)

            def search(rdir, extra):
                return [[self.hub, "search", "--queries", data.queries, "--gallery", data.gallery, "--stats",
                         stats_file, "--method", "is", "--k", str(K), "--out",
                         os.path.join(rdir, "results.parquet"), "--memory-limit", a.memory_limit_text, "--quiet",
                         "--overwrite"] + extra]

            same_results = same("results.parquet")

            tools = [Tool(f"hubnorm-t{t}", lambda rdir, _, t=t: search(rdir, ["--threads", str(t)]),
                          check=same_results, checked=True) for t in (1, 2)]
            tools += [Tool(f"hubnorm-cluster-{n}x1",
                           lambda rdir, _, n=n: search(rdir, ["--cluster", clusters[n].url, "--shards",
                                                              str(a.cluster_search_shards)]),
                           check=same_results, checked=True) for n in (1, 2)]
            gflop = 2.0 * data.nq * data.ng * data.d / 1e9
            self.run_group("cluster-search", a.cluster_size, data, 2, tools, a.cluster_repeats, gflop)
        finally:
            for n, c in clusters.items():
                peaks = ", ".join(f"{p:.0f}" for p in c.peak_rss_mib())
                self.log(f"cluster of {n} executor(s) (--memory-limit 4GiB each): peak RSS MiB of the "
                         f"scheduler, then each executor: {peaks}")
                c.stop()

    def cluster_sn(self, data, clusters):
        """hubnorm stats --method sn (τ = 0.01, T = 10): local 1 and 2 threads against the two clusters,
        which run the T iterations as T + 1 rounds sharded over the gallery's rows."""
        a = self.args

        def sn(rdir, extra):
            return [[self.hub, "stats", "--gallery", data.gallery, "--bank", data.bank, "--method", "sn",
                     "--out", os.path.join(rdir, "gallery_stats.parquet"), "--memory-limit",
                     a.memory_limit_text, "--quiet", "--overwrite"] + extra]

        def close(ref, mine):
            import numpy as np
            import pyarrow.parquet as pq
            x = pq.read_table(os.path.join(ref, "gallery_stats.parquet"))
            y = pq.read_table(os.path.join(mine, "gallery_stats.parquet"))
            if x.column_names != y.column_names or x.num_rows != y.num_rows:
                return "mismatch: other columns or rows"
            # Scores of unit vectors are at most 1 in size: the f32 kernel's rounding is relative to them.
            worst, scale = 0.0, 1.0
            for name in x.column_names:
                u, v = x.column(name).to_numpy(), y.column(name).to_numpy()
                if name.startswith("sn_"):
                    worst = max(worst, float(np.max(np.abs(u - v))))
                    scale = max(scale, float(np.max(np.abs(u))))
                elif not np.array_equal(u, v):
                    return f"mismatch: column {name} differs"
            if worst > 1e-6 * scale:
                return f"mismatch: potentials off by {worst:.2e} (scale {scale:.2e})"
            return f"ok: potentials within {worst:.1e} (scale {scale:.1f}), other columns identical"

        tools = [Tool(f"hubnorm-t{t}", lambda rdir, _, t=t: sn(rdir, ["--threads", str(t)]),
                      check=close, checked=True) for t in (1, 2)]
        tools += [Tool(f"hubnorm-cluster-{n}x1",
                       lambda rdir, _, n=n: sn(rdir, ["--cluster", clusters[n].url, "--shards", "16"]),
                       check=close, checked=True) for n in (1, 2)]
        # One sweep's GEMM: one machine caches the tiles when they fit and then only sums exps.
        gflop = 2.0 * data.nb * data.ng * data.d / 1e9
        self.run_group("cluster-sn", a.cluster_size, data, 2, tools, a.cluster_repeats, gflop)

    # -- everything ----------------------------------------------------------------------------
    def run(self):
        a = self.args
        write_setup(self, started=True)
        if "peak" in a.jobs:
            self.job_peak()
        per_size = [j for j in a.jobs if j not in ("peak", "memory", "scaling", "cluster")]
        for size in a.sizes:
            if not per_size:
                break
            data = size_data(size, a, self.log)
            if data is None:
                continue
            self.log(f"size {size}: {data.nq} queries × {data.ng} gallery × bank {data.nb}, d {data.d}")
            for job in per_size:
                self.job_size(job, size, data)
        if "memory" in a.jobs:
            self.job_memory()
        if "scaling" in a.jobs:
            self.job_scaling()
        if "cluster" in a.jobs:
            self.job_cluster()
        self.stop_s3_servers()
        write_setup(self, started=False)
        self.raw.close()
        self.cmdlog.close()
        summarize(self.out)
        if not a.keep_work:
            shutil.rmtree(self.work, ignore_errors=True)
        self.log(f"wrote {self.out}/{{setup.md,raw.csv,commands.log,summary.md}}")


class LocalCluster:
    """`hubnorm cluster scheduler` and `executors` executors of one task slot each on free ports of
    127.0.0.1, logging into `work`; stopped by their process ids (SIGTERM, then SIGINT)."""

    def __init__(self, hub, executors, work, log):
        import socket
        import time
        os.makedirs(work, exist_ok=True)
        self.procs = []
        out = open(os.path.join(work, "scheduler.log"), "w")
        self.procs.append(subprocess.Popen([hub, "cluster", "scheduler", "--bind", "127.0.0.1:0"],
                                           stdout=out, stderr=out, cwd=work))
        port, start = None, time.time()
        while port is None:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", open(os.path.join(work, "scheduler.log")).read())
            if m:
                port = int(m.group(1))
            elif time.time() - start > 60:
                raise RuntimeError("the scheduler did not start")
            time.sleep(0.05)
        self.url = f"df://127.0.0.1:{port}"
        for i in range(executors):
            out = open(os.path.join(work, f"executor{i}.log"), "w")
            self.procs.append(subprocess.Popen(
                [hub, "cluster", "executor", "--scheduler", f"127.0.0.1:{port}", "--bind", "127.0.0.1:0",
                 "--threads", "1", "--memory-limit", "4GiB"], stdout=out, stderr=out, cwd=work))
        start = time.time()
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    said = sock.recv(4096).decode(errors="replace")
            except OSError:
                said = ""
            if f"ready: {executors} executors" in said:
                break
            if time.time() - start > 60:
                raise RuntimeError(f"{executors} executors did not register: {said}")
            time.sleep(0.1)
        log(f"cluster: scheduler on {self.url} with {executors} executor(s)")

    def peak_rss_mib(self):
        """Each process's peak resident memory so far (VmHWM), in MiB: scheduler first."""
        peaks = []
        for p in self.procs:
            try:
                status = open(f"/proc/{p.pid}/status").read()
                peaks.append(int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024)
            except (OSError, AttributeError):
                peaks.append(float("nan"))
        return peaks

    def stop(self):
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM if p is not self.procs[0] else signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


class LocalS3Server:
    """An S3-compatible server on a free port of 127.0.0.1 for the object-store job, with a bucket, the
    inputs uploaded once per size, and the environment hubnorm needs to reach it; ended by its process id.
    `moto`: moto_server from the bench venv (Python; it spends about 20 CPU-seconds serving one 100k run,
    on the cores hubnorm computes on). `s3s-fs`: the s3s-fs binary (Rust, files on disk; `cargo install
    s3s-fs --features binary`), at --s3s-fs or on PATH."""

    bucket = "bench"

    def __init__(self, kind, args, work, log):
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if kind == "moto":
            exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
            argv = [exe, "-H", "127.0.0.1", "-p", str(port)]
        elif kind == "s3s-fs":
            exe = args.s3s_fs or shutil.which("s3s-fs") or ""
            root = os.path.join(work, "s3s-fs")
            os.makedirs(root, exist_ok=True)
            argv = [exe, "--host", "127.0.0.1", "--port", str(port), "--access-key", "testing",
                    "--secret-key", "testing", root]
        else:
            raise RuntimeError(f"unknown S3 server {kind!r}")
        if not exe or not os.access(exe, os.X_OK):
            raise RuntimeError(f"{kind}: no executable ({exe or 'not on PATH'})")
        self.kind = kind
        self.endpoint = f"http://127.0.0.1:{port}"
        self.log_file = open(os.path.join(work, f"{kind}.log"), "w")
        self.proc = subprocess.Popen(argv, stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True)
        self.env = {"AWS_ENDPOINT": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
                    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        self.uploaded = {}
        self.log_ = log
        import time
        for _ in range(100):
            try:
                self.client().create_bucket(Bucket=self.bucket)
                break
            except Exception:  # noqa: BLE001 - not listening yet
                time.sleep(0.2)
        else:
            self.stop()
            raise RuntimeError(f"{kind} did not answer on {self.endpoint}")
        log(f"object-store: {kind} (pid {self.proc.pid}) on {self.endpoint}")

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def upload(self, data):
        """(queries, gallery, bank) as s3:// URLs, uploaded on first use."""
        key = (data.queries, data.gallery, data.bank)
        if key not in self.uploaded:
            urls = []
            for role, path in zip(("queries", "gallery", "bank"), key):
                name = f"in/{data.name}/{role}.parquet"
                self.log_(f"object-store: uploading {path} to {self.kind} s3://{self.bucket}/{name}")
                self.client().upload_file(path, self.bucket, name)
                urls.append(f"s3://{self.bucket}/{name}")
            self.uploaded[key] = tuple(urls)
        return self.uploaded[key]

    def out_url(self, work, rdir):
        """Where the run of repeat folder `rdir` writes."""
        return f"s3://{self.bucket}/out/{os.path.relpath(rdir, work)}"

    def download(self, url, into, names):
        prefix = url.removeprefix(f"s3://{self.bucket}/")
        for name in names:
            self.client().download_file(self.bucket, f"{prefix}/{name}", os.path.join(into, name))

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log_file.close()


# ----------------------------------------------------------------------------------------------
# correctness checks
# ----------------------------------------------------------------------------------------------

def _npz(rdir):
    import numpy as np
    return np.load(os.path.join(rdir, "out.npz"))


def load_hub_topk(path, method, data: Data, k=K):
    import numpy as np
    import pyarrow.parquet as pq
    import common
    t = pq.read_table(path, columns=["method", "query_id", "rank", "gallery_id", "score"],
                      filters=[("method", "=", method)])
    q = common.map_ids(t["query_id"], data.query_index())
    g = common.map_ids(t["gallery_id"], data.gallery_index())
    r = t["rank"].to_numpy() - 1
    ids = np.full((data.nq, k), -1, np.int64)
    scores = np.full((data.nq, k), np.nan, np.float32)
    keep = r < k
    ids[q[keep], r[keep]] = g[keep]
    scores[q[keep], r[keep]] = t["score"].to_numpy()[keep]
    return ids, scores


def check_topk(ref_results, method, mine_dir, data: Data):
    import numpy as np
    if not ref_results:
        return "n/a (no hubnorm output)"
    hi, hs = load_hub_topk(ref_results, method, data)
    z = _npz(mine_dir)
    return compare_topk(hi, hs, z["ids"], z["scores"].astype(np.float32), data.nq)


def compare_topk(hi, hs, pi, ps, nq):
    """hubnorm's top-k (ids, scores) against another's: equal ids except at ties within TIE."""
    import numpy as np
    if pi.shape != hi.shape:
        return f"mismatch: shape {pi.shape} vs hubnorm {hi.shape}"
    kth_h, kth_p = hs[:, -1], ps[:, -1]
    bad_q, swaps, first = set(), 0, None
    for i, r in np.argwhere(hi != pi):
        if (abs(hs[i, r] - ps[i, r]) < TIE or abs(ps[i, r] - kth_h[i]) < TIE or abs(hs[i, r] - kth_p[i]) < TIE):
            swaps += 1
            continue
        bad_q.add(int(i))
        if first is None:
            first = (int(i), int(r) + 1, int(hi[i, r]), float(hs[i, r]), int(pi[i, r]), float(ps[i, r]))
    dmax = float(np.nanmax(np.abs(hs - ps))) if hs.size else 0.0
    if bad_q:
        q, r, a, sa, b, sb = first
        return (f"mismatch: {len(bad_q)}/{nq} queries differ (first: query row {q} rank {r}: hubnorm "
                f"row {a} {sa:.7f}, peer row {b} {sb:.7f}); max Δscore {dmax:.1e}")
    if dmax > SCORE_TOL:
        return f"mismatch: same ids but scores differ by up to {dmax:.1e}"
    return "ok" + (f" ({swaps} tie swaps)" if swaps else "") + f", max Δscore {dmax:.0e}"


def check_stats(ref_stats, columns, mine_dir, data: Data):
    import numpy as np
    import pyarrow.parquet as pq
    import common
    if not ref_stats:
        return "n/a (no hubnorm output)"
    t = pq.read_table(ref_stats, columns=["gallery_id"] + list(columns.values()))
    rows = common.map_ids(t["gallery_id"], data.gallery_index())
    z = _npz(mine_dir)
    parts, bad = [], False
    for key, col in columns.items():
        ref = np.empty(data.ng, dtype=t.schema.field(col).type.to_pandas_dtype())
        ref[rows] = t[col].to_numpy(zero_copy_only=False)
        mine = z[key]
        if ref.dtype == bool:
            n = int((ref != mine.astype(bool)).sum())
            parts.append(f"{key} {'ok' if n == 0 else f'{n} items differ'}")
            bad |= n > 0
        else:
            diff = np.abs(ref - mine.astype(np.float64))
            dmax = float(diff.max())
            n = int((diff > STAT_TOL).sum())
            parts.append(f"{key} max Δ {dmax:.0e}" + (f" ({n} items > {STAT_TOL:g})" if n else ""))
            bad |= n > 0
    return ("mismatch: " if bad else "ok: ") + ", ".join(parts)


def check_same_results(ref_dir, mine_dir):
    """A screened hubnorm run against the exact one: results.parquet row for row, value for value, and
    gallery_stats.parquet's columns likewise where the run wrote one (all but its metadata, which records
    the precision)."""
    import pyarrow.parquet as pq
    if not ref_dir:
        return "n/a (no hubnorm output)"
    parts = []
    for name in ("results.parquet", "gallery_stats.parquet"):
        paths = [os.path.join(d, name) for d in (ref_dir, mine_dir)]
        if name != "results.parquet" and not all(os.path.exists(x) for x in paths):
            continue
        a, b = (pq.read_table(x) for x in paths)
        if a.num_rows != b.num_rows:
            return f"mismatch: {name} has {b.num_rows} rows vs {a.num_rows}"
        for column in a.column_names:
            if column not in b.column_names or not a[column].equals(b[column]):
                return f"mismatch: {name} column {column} differs"
        parts.append(f"{name.split('.')[0]} {a.num_rows} rows")
    return f"ok (identical: {', '.join(parts)})"


def has_avx512_bf16() -> bool:
    """Whether this CPU has AVX512_BF16 (hubnorm's --precision screened needs it)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512_bf16" in line for line in f)
    except OSError:
        return False


def check_hubnorm_pair(ref_dir, mine_dir, data: Data):
    """A second hubnorm's outputs (hubnorm+blas) against the first's: every method's top-k as a peer's, and
    every float column of gallery_stats.parquet within STAT_TOL."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import common
    if not ref_dir:
        return "n/a (no hubnorm output)"
    parts, bad = [], False
    ref_res, mine_res = (os.path.join(d, "results.parquet") for d in (ref_dir, mine_dir))
    if os.path.exists(ref_res) and os.path.exists(mine_res):
        methods = sorted(pc.unique(pq.read_table(ref_res, columns=["method"])["method"]).to_pylist())
        for method in methods:
            hi, hs = load_hub_topk(ref_res, method, data)
            pi, ps = load_hub_topk(mine_res, method, data)
            c = compare_topk(hi, hs, pi, ps, data.nq)
            bad |= not c.startswith("ok")
            parts.append(f"{method} top-k {c}")
    ref_st, mine_st = (os.path.join(d, "gallery_stats.parquet") for d in (ref_dir, mine_dir))
    if os.path.exists(ref_st) and os.path.exists(mine_st):
        a, b = pq.read_table(ref_st), pq.read_table(mine_st)
        ra = common.map_ids(a["gallery_id"], data.gallery_index())
        rb = common.map_ids(b["gallery_id"], data.gallery_index())
        dmax, over = 0.0, 0
        for field in a.schema:
            if not (field.type.equals("float") or field.type.equals("double")):
                continue
            x = np.empty(data.ng)
            y = np.empty(data.ng)
            x[ra] = a[field.name].to_numpy(zero_copy_only=False)
            y[rb] = b[field.name].to_numpy(zero_copy_only=False)
            diff = state_difference(field.name, x, y)
            dmax = max(dmax, float(np.nanmax(diff)))
            over += int((diff > STAT_TOL).sum())
        bad |= over > 0
        parts.append(f"stats max Δ {dmax:.0e}" + (f" ({over} values > {STAT_TOL:g})" if over else ""))
    if not parts:
        return "n/a (no outputs to compare)"
    return ("mismatch: " if bad else "ok: ") + "; ".join(parts)


def state_difference(column, x, y):
    """How far two hubnorm runs' gallery_stats column differs, in the units STAT_TOL is stated in.

    A log-sum-exp state of β·s (`…beta<β>…_lse_max`, `…_lse_sum`) magnifies a score's last-bit difference
    β times, and two f32 GEMMs with different summation orders differ there by ~1e-7: compared raw, β = 20
    alone turns that into 2e-6 relative, and an unlucky cell past 1e-5. So the state is compared as the
    correction it stands for, in similarity units: Δmax/β and Δln(sum)/β (h = (max + ln sum)/β). Every
    other column (corrections, means, potentials) is compared relatively, as before."""
    import numpy as np
    beta = re.search(r"beta([0-9]+(?:\.[0-9]+)?)", column)
    if beta and column.endswith("_lse_max"):
        return np.abs(x - y) / float(beta.group(1))
    if beta and column.endswith("_lse_sum"):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.abs(np.log(x) - np.log(y)) / float(beta.group(1))
    return np.abs(x - y) / np.maximum(1.0, np.abs(x))


def check_hubness(ref_dir, summary_path, mine_dir):
    import pyarrow.parquet as pq
    z = _npz(mine_dir)
    mine = float(z["skewness"])
    out = []
    bad = False
    with open(summary_path) as f:
        summ = json.load(f)
    s_run = next(m["k_occurrence_skewness"] for m in summ["methods"] if m["method"] == "none")
    out.append(f"run summary.json {s_run:.6f}")
    bad |= abs(mine - s_run) > STAT_TOL
    if ref_dir:
        t = pq.read_table(os.path.join(ref_dir, "report", "report.parquet")).to_pylist()
        s_rep = next((r["value"] for r in t if r["measure"] == "skewness" and r.get("method", "none") == "none"), None)
        if s_rep is not None:
            out.append(f"report {s_rep:.6f}")
            bad |= abs(mine - s_rep) > STAT_TOL
    return ("mismatch: " if bad else "ok: ") + f"scipy {mine:.6f} vs " + ", ".join(out)


def combine(*checks):
    bad = any(c.startswith("mismatch") for c in checks)
    na = all(c.startswith("n/a") for c in checks)
    body = "; ".join(b for b in (re.sub(r"^(ok|mismatch)[:,]?\s*", "", c).strip() for c in checks) if b)
    if na:
        return checks[0]
    return ("mismatch: " if bad else "ok: ") + body


# ----------------------------------------------------------------------------------------------
# setup.md
# ----------------------------------------------------------------------------------------------

def sh(cmd, cwd=None):
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"n/a ({e})"


def blas_info(py):
    code = r"""
import json, numpy
cfg = numpy.show_config(mode='dicts')
blas = cfg.get('Build Dependencies', {}).get('blas', {})
out = {'numpy_blas': {k: blas.get(k) for k in ('name', 'version', 'openblas configuration')}}
try:
    import faiss
    out['faiss_compile_options'] = faiss.get_compile_options()
except Exception as e:
    out['faiss_compile_options'] = str(e)
try:
    from threadpoolctl import threadpool_info
    out['threadpools'] = [{k: p.get(k) for k in ('internal_api', 'version', 'architecture', 'num_threads',
                                                  'threading_layer', 'filepath')} for p in threadpool_info()]
except Exception as e:
    out['threadpools'] = str(e)
print(json.dumps(out))
"""
    env = dict(os.environ, OPENBLAS_CORETYPE="SkylakeX")
    try:
        r = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        return json.loads(r.stdout)
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}


def mkl_runtime():
    """Intel MKL's single dynamic library (PyPI package `mkl`) in this venv, installed on first use."""
    import glob
    def find():
        return sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    if not find():
        print("installing mkl (PyPI) into the bench venv for --hubnorm-blas mkl", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "mkl"], check=True)
    found = find()
    if not found:
        raise SystemExit("error: pip installed mkl but no libmkl_rt.so* is in " + os.path.join(sys.prefix, "lib"))
    return found[0]


def versions():
    out = {"python": platform.python_version()}
    for mod, name in (("numpy", "numpy"), ("faiss", "faiss-cpu"), ("scipy", "scipy"), ("pyarrow", "pyarrow"),
                      ("ot", "POT"), ("threadpoolctl", "threadpoolctl")):
        try:
            m = __import__(mod)
            out[name] = getattr(m, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            out[name] = f"n/a ({e})"
    try:
        import importlib.metadata
        out["mkl"] = importlib.metadata.version("mkl")
    except Exception:  # noqa: BLE001  (only installed for --hubnorm-blas mkl)
        pass
    return out


def first_cpuinfo():
    """The first processor's fields in /proc/cpuinfo ("model name", "cpu family", "flags", ...); {} where
    there is none."""
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            if not line.strip():
                if fields:
                    break  # the first processor's block is enough
                continue
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model():
    """The CPU's model name with its family and model numbers: a VM may report only "AMD EPYC", and
    the numbers tell the generations apart (family 25 model 17 is Zen 4, family 26 is Zen 5)."""
    fields = first_cpuinfo()
    name = fields.get("model name") or platform.processor()
    numbers = ", ".join(f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)
    return f"{name} ({numbers})" if numbers else name


def cpu_flags():
    flags = first_cpuinfo().get("flags", "").split()
    return " ".join(f for f in flags if f.startswith(("avx", "fma", "amx")))


def write_setup(b: Bench, started: bool):
    a = b.args
    path = os.path.join(b.out, "setup.md")
    if started:
        b.setup_start = dt.datetime.now().astimezone()
        b.setup_load = loadavg()
        return
    end = dt.datetime.now().astimezone()
    new = not os.path.exists(path)
    rev = sh(["git", "rev-parse", "HEAD"], cwd=REPO)
    # A results folder inside the repository is written by this run: not a source change.
    results = os.path.relpath(os.path.abspath(b.out), REPO)
    pathspec = [] if results.startswith("..") else ["--", ".", f":(exclude){results}"]
    dirty = sh(["git", "status", "--porcelain", "--untracked-files=no", *pathspec], cwd=REPO)
    hub_ver = sh([b.hub, "--version"]) if b.hub else "n/a"
    blas = blas_info(b.py)
    floor_log = os.path.join(b.work if os.path.isdir(b.work) else b.out, "floor.log")
    _, floor_ru, _, _ = run_child(["true"], dict(os.environ), floor_log, 60, None)
    for p_ in (floor_log,):
        if os.path.exists(p_):
            os.unlink(p_)
    lines = []
    if new:
        lines += ["# Benchmark setup", "",
                  "One section per invocation of `benches/peers/bench.py` into this folder; `summary.md` uses each "
                  "measurement's latest run.", ""]
    lines += [f"## Run {b.run_id}", "",
              f"- started {b.setup_start.isoformat(timespec='seconds')}, finished {end.isoformat(timespec='seconds')} "
              f"({(end - b.setup_start).total_seconds() / 60:.1f} min)",
              f"- command: `{' '.join(map(shlex.quote, sys.argv))}`",
              f"- host: {platform.node()}, {platform.platform()}",
              f"- CPU: {cpu_model()}; {os.cpu_count()} logical cores, {len(os.sched_getaffinity(0))} usable; "
              f"flags: {cpu_flags()}",
              f"- memory: {human_bytes(mem_total())} total, {human_bytes(mem_available())} available at the end; "
              f"peers' address-space limit {'%s' % human_bytes(a.peer_memory) if a.peer_memory else '90% of MemAvailable at each launch'}",
              f"- load average (1 min): {b.setup_load:.2f} at the start, {loadavg():.2f} at the end "
              "(each raw.csv row has the load at its start; other processes on the machine make wall times longer)",
              f"- hubnorm: `{b.hub}` ({hub_ver}); repository {REPO} at {rev}"
              + (" with uncommitted changes" if dirty else ""),
              f"- hubnorm+blas: " + (f"the same binary with `HUBNORM_BLAS={b.blas}` (tiles by that library's "
                                      "cblas_sgemm)" if b.blas else "not run (no --hubnorm-blas)"),
              "- Python packages: " + ", ".join(f"{k} {v}" for k, v in versions().items()),
              f"- numpy BLAS: {json.dumps(blas.get('numpy_blas'))}",
              f"- runtime thread pools (with OPENBLAS_CORETYPE=SkylakeX): {json.dumps(blas.get('threadpools'))}",
              f"- faiss compile options: {blas.get('faiss_compile_options')}",
              f"- peak RSS floor: a trivial child (`true`) measured the same way reports "
              f"{floor_ru.ru_maxrss / 1024:.1f} MiB (the launcher spawn.py's resident size, which a forked child "
              "inherits in ru_maxrss); every tool measured here is larger, so its RSS is its own",
              f"- peers' environment: {', '.join(PEER_ENV)} = the thread count, OPENBLAS_CORETYPE=SkylakeX, "
              "faiss.omp_set_num_threads(N); hubnorm gets `--threads N`",
              f"- threads {','.join(map(str, a.threads))}; repeats {a.repeats_text} (median reported; tools alternate "
              f"within a repeat); hubnorm `--memory-limit {a.memory_limit_text}`; timeout {a.timeout:.0f} s per "
              "measurement",
              f"- jobs: {','.join(a.jobs)}; sizes: {','.join(a.sizes)}",
              "", "| size | queries | gallery | bank | d | files |", "|---|---|---|---|---|---|"]
    for s in a.sizes:
        if s == "dev":
            lines.append(f"| dev | 5000 | 5000 | 10000 | 384 | {a.dev_data} (WordNet definitions, MiniLM) |")
        else:
            g = generated_size(s)
            q, gp, bp = gen_paths(a.data_dir, g["d"], g["gallery"], g["bank"], g["queries"])
            lines.append(f"| {s} | {g['queries']} | {g['gallery']} | {g['bank']} | {g['d']} | {os.path.dirname(q)} "
                         f"(generated, seed {__import__('common').GEN_SEED}) |")
    lines += ["", "Generated data (common.py): unit vectors from a mixture of 300 centres with Zipf-like weights "
              "plus a shared offset (so hubs exist), float32, `id` int64 + `embedding` FixedSizeList<float32>, "
              "row groups of 65,536 rows, snappy; queries are noisy copies of distinct gallery items "
              "(`target_id`); each file is a prefix of the longer ones of its stream.", "",
              "Commands (one example per job and tool; every command is in commands.log):", ""]
    for (job, tool), cmds in b.examples.items():
        for c in cmds:
            lines.append(f"- {job} / {tool}: `{c}`")
    lines.append("")
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------------------
# summary.md from raw.csv
# ----------------------------------------------------------------------------------------------

# Everything in summary.md from this line on is hand-written and kept when the tables are regenerated.
KEEP_MARKER = "<!-- Hand-written below: bench.py --summarize keeps everything from this line on. -->"

def _f(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def load_raw(out_dir):
    with open(os.path.join(out_dir, "raw.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    latest = {}
    for r in rows:
        key = (r["job"], r["size"], r["tool"], r["threads"])
        latest[key] = max(latest.get(key, ""), r["run_id"])
    return [r for r in rows if r["run_id"] == latest[(r["job"], r["size"], r["tool"], r["threads"])]]


class Group:
    def __init__(self, rows):
        self.rows = rows
        ok = [r for r in rows if r["status"] == "ok"]
        self.ok = ok
        self.n = len(ok)
        self.repeats = len(rows)
        med = lambda k: statistics.median([_f(r[k]) for r in ok]) if ok else float("nan")  # noqa: E731
        self.wall, self.cpu, self.rss = med("wall_s"), med("cpu_s"), med("max_rss_mib")
        self.gflop = _f(rows[0]["gflop"]) if rows else float("nan")
        self.gfr = statistics.median([_f(r["gflops_reported"]) for r in ok if r["gflops_reported"]]) \
            if any(r["gflops_reported"] for r in ok) else float("nan")
        self.check = next((r["check"] for r in rows if r["check"]), "")
        self.status = "ok" if ok else (rows[0]["status"] if rows else "not run")
        self.load = statistics.median([_f(r["loadavg"]) for r in rows if r["loadavg"]]) \
            if any(r["loadavg"] for r in rows) else float("nan")
        self.note = next((r["note"] for r in rows if r["note"]), "")
        r0 = rows[0] if rows else {}
        self.nq, self.ng, self.nb, self.d = (_f(r0.get(k)) for k in ("n_queries", "n_gallery", "n_bank", "dim"))

    @property
    def gflops(self):
        return self.gflop / self.wall if self.n and self.gflop and self.gflop > 0 else float("nan")


def esc(s):
    return str(s).replace("|", "\\|")


def _size_key(s):
    base = s.partition("@")[0]
    return (SIZE_ORDER.index(base) if base in SIZE_ORDER else len(SIZE_ORDER), s)


def screened_targets(G, bf16_peak):
    """The target table of `--precision screened` (issue 31): at most 0.5× faiss `IndexFlatIP`'s time and
    faster than faiss's reduced-precision route, at equal results, with the share of the bf16 dot peak."""
    L = ["", "### Screened search (`--precision screened`): ≤ 0.5× faiss IndexFlatIP, faster than faiss's "
         "bf16/fp16 route, equal results", "",
         "GFLOP/s counts the f32 path's work (2·queries·gallery·d); % bf16 peak is that over the bf16 dot "
         "peak measured in the same run at that thread count.", "",
         "| job | size | threads | screened s | exact s | faiss IndexFlatIP s | screened/faiss | faiss SQ+refine s "
         "| GFLOP/s | % bf16 peak | equal results | target |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted([k for k in G if k[0] in ("topk", "is-pass2") and k[2] == "hubnorm-screened"],
                  key=lambda k: (k[0], _size_key(k[1]), k[3]))
    for job, size, _, t in keys:
        s = G[(job, size, "hubnorm-screened", t)]
        exact = G.get((job, size, "hubnorm", t))
        flat = G.get((job, size, "faiss-flatip", t))
        sq = [g for name in ("faiss-sq-bf16+refine", "faiss-sq-fp16+refine")
              for g in [G.get((job, size, name, t))] if g and g.n]
        sq_best = min(sq, key=lambda g: g.wall) if sq else None
        ratio = s.wall / flat.wall if s.n and flat and flat.n else float("nan")
        checks = [s.check] + [g.check for g in [flat] + sq if g and g.n]
        eq = bool(s.n) and all(c.startswith("ok") for c in checks)
        share = s.gflops / bf16_peak.get(t, float("nan")) * 100
        if math.isnan(ratio):
            verdict = "—"
        else:
            met = ratio <= 0.5 and eq and (sq_best is None or s.wall < sq_best.wall)
            verdict = ("met" if met else "missed") + ("" if sq_best else " (SQ route not run)")
        L.append(f"| {job} | {size} | {t} | {fmt(s.wall) if s.n else s.status} | "
                 f"{fmt(exact.wall) if exact and exact.n else '—'} | {fmt(flat.wall) if flat and flat.n else '—'} | "
                 f"{fmt(ratio)} | {fmt(sq_best.wall) if sq_best else 'not run'} | {fmt(s.gflops)} | {fmt(share)} | "
                 f"{esc('; '.join(checks))} | {verdict} |")
    if not keys:
        L.append("| — | — | — | not run | — | — | — | — | — | — | — | — |")
    return L


def summarize(out_dir):
    rows = load_raw(out_dir)
    groups = {}
    for r in rows:
        groups.setdefault((r["job"], r["size"], r["tool"], int(r["threads"])), []).append(r)
    G = {k: Group(v) for k, v in groups.items()}
    run_ids = sorted({r["run_id"] for r in rows})

    # measured peak per thread count
    peak = {}
    bf16_peak = {}
    peak_rows = []
    for t in sorted({k[3] for k in G if k[0] == "peak"}):
        npy = G.get(("peak", "-", "numpy-sgemm", t))
        hub = G.get(("peak", "-", "hubnorm-fma", t))
        vals = [g.gfr for g in (npy, hub) if g and not math.isnan(g.gfr)]
        peak[t] = max(vals) if vals else float("nan")
        bf16 = G.get(("peak", "-", BF16_PEAK_TOOL, t))
        bf16_peak[t] = bf16.gfr if bf16 and bf16.n else float("nan")
        peak_rows.append((t, npy, hub))

    L = ["# Peer benchmark summary", "",
         f"Generated from raw.csv by `bench.py --summarize` (runs {', '.join(run_ids)}; each measurement's latest "
         "run). Setup, versions and commands: setup.md. Times are medians over the runs that succeeded; "
         "`runs` = successful/attempted. GFLOP/s = the job's GEMM work (stated per job) / median wall time; "
         "% peak = that over the measured f32 peak at the same thread count. hubnorm/peer = hubnorm's median "
         "wall time over the peer's (below 1: hubnorm faster). check = the peer's output against hubnorm's "
         f"(top-k ids equal except at ties within {TIE:g}, scores within {SCORE_TOL:g}, statistics within "
         f"{STAT_TOL:g}). Every time is a whole process, as a user runs it: reading the Parquet inputs, and for "
         "the Python peers starting the interpreter and importing numpy/faiss/scipy/POT (0.3–3 s, which "
         "dominates the small sizes; raw.csv's note column has each peer's time per phase).", ""]
    loads = [_f(r["loadavg"]) for r in rows if r["loadavg"]]
    if loads:
        L += [f"Load average (1 min) at the start of the measurements: median {statistics.median(loads):.2f}, "
              f"max {max(loads):.2f} on {os.cpu_count()} cores here. Above the thread count, other processes "
              "shared the cores and wall times are longer than on an idle machine (CPU times are less affected).",
              ""]

    L += ["## Measured f32 peak", "",
          "numpy sgemm: (4096×1024)·(1024×16384), OPENBLAS_CORETYPE=SkylakeX, median of 3 products per process. "
          "hubnorm: `hubnorm bench --peak-only` (an FMA loop). The higher is the peak used below. bf16 dot: "
          "the same command's `vdpbf16ps` loop (2 flops per bf16 pair, AVX512_BF16 only), the ceiling of "
          "`--precision screened`'s screen.", "",
          "| threads | numpy sgemm GFLOP/s | hubnorm FMA GFLOP/s | measured peak GFLOP/s | bf16 dot GFLOP/s |",
          "|---|---|---|---|---|"]
    for t, npy, hub in peak_rows:
        cell = lambda g: (fmt(g.gfr) if g and g.n and not math.isnan(g.gfr) else (g.status if g else "not run"))  # noqa: E731
        L.append(f"| {t} | {cell(npy)} | {cell(hub)} | {fmt(peak[t])} | {fmt(bf16_peak[t])} |")
    if not peak_rows:
        L.append("| — | not run | not run | — | — |")
    L.append("")

    def pct(g, t):
        p = peak.get(t, float("nan"))
        return g.gflops / p * 100 if p and not math.isnan(p) and not math.isnan(g.gflops) else float("nan")

    job_order = ["topk", "is-pass1", "is-pass2", "dis", "nnn", "sn", "hubness", "object-store", "cluster",
                 "cluster-search", "cluster-sn"]
    for job in job_order:
        keys = [k for k in G if k[0] == job]
        if not keys:
            continue
        L += [f"## {job}", "", JOB_TEXT.get(job, ""), "",
              "| size | threads | tool | runs | wall s | CPU s | peak RSS MiB | GFLOP/s | % peak | hubnorm/peer | check |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for size in sorted({k[1] for k in keys}, key=_size_key):
            for t in sorted({k[3] for k in keys if k[1] == size}):
                tools = [k for k in keys if k[1] == size and k[3] == t]
                tools.sort(key=lambda k: (not k[2].startswith("hubnorm"), k[2]))
                hub = next((G[k] for k in tools if k[2].startswith("hubnorm")), None)
                hub_blas = next((G[k] for k in tools if k[2] == "hubnorm+blas"), None)
                for k in tools:
                    g = G[k]
                    is_hub = k[2].startswith("hubnorm")
                    ratio = (hub.wall / g.wall if hub and hub.n and g.n and not is_hub else float("nan"))
                    ratio_text = fmt(ratio)
                    if hub_blas and hub_blas.n and g.n and not is_hub:
                        ratio_text += f" (+blas {fmt(hub_blas.wall / g.wall)})"
                    if g.n:
                        cells = [fmt(g.wall), fmt(g.cpu), fmt(g.rss), fmt(g.gflops), fmt(pct(g, t))]
                    else:
                        cells = [g.status, "—", "—", "—", "—"]
                    L.append(f"| {size} | {t} | {k[2]} | {g.n}/{g.repeats} | " + " | ".join(cells)
                             + f" | {ratio_text if not is_hub else '—'} | {esc(g.check or ('reference' if is_hub and g.n else '—'))} |")
        if job == "object-store":
            L += [""] + [
                f"- {k[1]}, {k[3]} thread(s), {k[2]}: the S3 run takes {G[k].wall / G[loc].wall:.2f}× the local run's "
                f"median wall time (target ≤ 1.25×)"
                for k in keys if k[2].startswith("hubnorm-s3") and G[k].n
                for loc in [(k[0], k[1], "hubnorm-local", k[3])] if loc in G and G[loc].n]
        if job in ("cluster", "cluster-search", "cluster-sn"):
            for size in sorted({k[1] for k in keys}, key=_size_key):
                w = {k[2]: G[k].wall for k in keys if k[1] == size and G[k].n}
                if all(t in w for t in ("hubnorm-t2", "hubnorm-cluster-1x1", "hubnorm-cluster-2x1")):
                    L += ["",
                          f"- {size}: 2 executors take {w['hubnorm-cluster-2x1'] / w['hubnorm-t2']:.2f}× the local "
                          f"2-thread run's median wall time (target ≤ 1.2×); 1 → 2 executors is "
                          f"{w['hubnorm-cluster-1x1'] / w['hubnorm-cluster-2x1']:.2f}× faster (target ≥ 1.7×)"]
                if all(t in w for t in ("hubnorm-t1", "hubnorm-cluster-1x1")):
                    overhead = {"cluster": "planning, bank reads per shard, Flight transfers",
                                "cluster-search": "planning, gallery reads per shard, Flight transfers",
                                "cluster-sn": "a job per round, bank reads per shard and round, two sweeps "
                                              "per round where one machine fuses them over cached tiles"}[job]
                    L.append(f"- {size}: 1 executor takes {w['hubnorm-cluster-1x1'] / w['hubnorm-t1']:.2f}× the "
                             f"local 1-thread run (the cluster's overhead: {overhead})")
        L.append("")

    # targets
    L += ["## Targets", ""]
    L += ["### Pass 1 (inverted softmax statistics): ≥ 70% of the measured f32 peak", "",
          "| size | threads | tool | `stats --method is` GFLOP/s | measured peak | % of peak | target |",
          "|---|---|---|---|---|---|---|"]
    hub_tools = ("hubnorm", "hubnorm+blas")
    p1 = sorted([k for k in G if k[0] in ("is-pass1",) and k[2] in hub_tools],
                key=lambda k: (_size_key(k[1]), k[3], k[2]))
    for k in p1:
        g = G[k]
        p = pct(g, k[3])
        verdict = "—" if math.isnan(p) else ("met" if p >= 70 else "missed")
        L.append(f"| {k[1]} | {k[3]} | {k[2]} | {fmt(g.gflops) if g.n else g.status} | {fmt(peak.get(k[3]))} | "
                 f"{fmt(p)} | {verdict} |")
    if not p1:
        L.append("| — | — | — | not run | — | — | — |")
    L += ["", "### Pass 2 (top-10 corrected search): faster than faiss IndexFlatIP at equal results", "",
          "| size | threads | tool | `search --method is` s | faiss (d+1) s | tool/faiss | equal results | target |",
          "|---|---|---|---|---|---|---|---|"]
    p2 = sorted([k for k in G if k[0] == "is-pass2" and k[2] in hub_tools],
                key=lambda k: (_size_key(k[1]), k[3], k[2]))
    for k in p2:
        h = G[k]
        f = G.get(("is-pass2", k[1], "faiss-flatip", k[3]))
        if f and f.n and h.n:
            ratio = h.wall / f.wall
            # faiss is checked against plain hubnorm; hubnorm+blas against plain hubnorm too
            checks = [f.check] + ([h.check] if k[2] != "hubnorm" else [])
            eq = all(c.startswith("ok") for c in checks)
            verdict = ("met" if ratio < 1 and eq else "missed") + ("" if eq else " (results differ)")
            L.append(f"| {k[1]} | {k[3]} | {k[2]} | {fmt(h.wall)} | {fmt(f.wall)} | {fmt(ratio)} | "
                     f"{esc('; '.join(checks))} | {verdict} |")
        else:
            L.append(f"| {k[1]} | {k[3]} | {k[2]} | {fmt(h.wall) if h.n else h.status} | "
                     f"{f.status if f else 'not run'} | — | — | — |")
    if not p2:
        L.append("| — | — | — | not run | — | — | — | — |")

    L += screened_targets(G, bf16_peak)

    mem = sorted([k for k in G if k[0] == "memory"], key=lambda k: k[2])
    L += ["", "### Memory: inputs ≥ 4× `--memory-limit`, peak RSS within the limit plus a stated overhead", ""]
    if mem:
        L += ["| data | threads | tool | limit | inputs (gallery) | peak RSS | overhead = RSS − limit | wall s | "
              "the dense peer would need | status |", "|---|---|---|---|---|---|---|---|---|---|"]
        for k in mem:
            g = G[k]
            kv = dict(x.split("=", 1) for x in re.findall(r"[a-z_0-9]+=[0-9.]+", g.note))
            lim = _f(kv.get("limit_bytes")) / 2 ** 20
            inp = _f(kv.get("input_bytes"))
            gal = _f(kv.get("gallery_bytes"))
            need = max(_f(kv.get("dense_pass1_bytes")), _f(kv.get("dense_pass2_bytes")))
            peer = not k[2].startswith("hubnorm")
            over = g.rss - lim if g.n and not peer else float("nan")
            st = esc(g.status if g.check in ("", "reference") else f"{g.status}; {g.check}")
            L.append(f"| {k[1]} | {k[3]} | {k[2]} | {fmt(lim)} MiB | {human_bytes(inp)} ({human_bytes(gal)}; "
                     f"{gal / (lim * 2 ** 20):.1f}× the limit) | {fmt(g.rss) + ' MiB' if g.n else '—'} | "
                     f"{fmt(over) + ' MiB' if g.n and not peer else '—'} | {fmt(g.wall) if g.n else '—'} | "
                     f"{human_bytes(need)} for one dense matrix (bank × gallery {human_bytes(_f(kv.get('dense_pass1_bytes')))}, "
                     f"queries × gallery {human_bytes(_f(kv.get('dense_pass2_bytes')))}) | {st} |")
    else:
        L.append("Not run.")

    sc = [k for k in G if k[0] == "scaling"]
    L += ["", "### Scaling: hubnorm `stats --method is` over gallery and bank sizes", ""]
    if sc:
        L += ["| gallery | bank | threads | wall s | ns per (bank × gallery) pair | GFLOP/s | % peak | peak RSS MiB |",
              "|---|---|---|---|---|---|---|---|"]
        pts = sorted(sc, key=lambda k: (G[k].nb, G[k].ng))
        per_pair, rss = [], []
        for k in pts:
            g = G[k]
            pp = g.wall / (g.ng * g.nb) * 1e9 if g.n else float("nan")
            if g.n:
                per_pair.append(pp)
                rss.append(g.rss)
            L.append(f"| {int(g.ng)} | {int(g.nb)} | {k[3]} | {fmt(g.wall) if g.n else g.status} | {fmt(pp)} | "
                     f"{fmt(g.gflops)} | {fmt(pct(g, k[3]))} | {fmt(g.rss)} |")
        if per_pair:
            L += ["", f"Time per pair ranges {min(per_pair):.3g}–{max(per_pair):.3g} ns (max/min "
                  f"{max(per_pair) / min(per_pair):.2f}; 1.00 = exactly linear in bank × gallery, small sizes carry "
                  f"a fixed start-up cost); peak RSS ranges {min(rss):.0f}–{max(rss):.0f} MiB."]
    else:
        L.append("Not run.")
    L.append("")
    path = os.path.join(out_dir, "summary.md")
    # Hand-written sections (e.g. a run's narrative) live below KEEP_MARKER
    # in the same file; regenerating the tables keeps them.
    kept = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        at = old.find(KEEP_MARKER)
        if at >= 0:
            kept = "\n" + old[at:]
    with open(path, "w") as f:
        f.write("\n".join(L) + kept)
    return path


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------

def main(argv=None):
    home = os.path.expanduser("~")
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="dev,10k", help="comma list of tiny, dev, 10k, 100k, 1m (default dev,10k)")
    p.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    p.add_argument("--repeats", default="3,1m=1",
                   help="runs per measurement, optionally per size: '3,1m=1' (default) = 3, but 1 for the 1m size")
    p.add_argument("--reference-once", action="store_true",
                   help="run the reference hubnorm (whose output the others are checked against) in the first "
                        "repeat only: for large sizes where only the other tools' times are wanted")
    p.add_argument("--jobs", default=",".join(JOBS_ALL), help=f"comma list of {','.join(JOBS_ALL)} (default all)")
    p.add_argument("--out", default=None, help="results folder (default benches/runs/<YYYY-MM-DD>)")
    p.add_argument("--data-dir", default=os.path.join(home, ".cache/hubnorm/bench-data"),
                   help="generated Parquet, made once and reused")
    p.add_argument("--work-dir", default=os.path.join(home, ".cache/hubnorm/bench-work"),
                   help="outputs of the runs while they are checked (removed afterwards unless --keep-work)")
    p.add_argument("--keep-work", action="store_true")
    p.add_argument("--tools", type=lambda v: [t.strip() for t in v.split(",") if t.strip()], default=[],
                   help="only these tools besides the reference hubnorm, e.g. hubnorm-screened,faiss-flatip "
                        "(default all)")
    p.add_argument("--refine-k-factor", type=int, default=8,
                   help="is-pass2: faiss IndexRefineFlat's k_factor for the reduced-precision peers")
    p.add_argument("--dev-data", default=os.path.normpath(os.path.join(REPO, "..", "shared", "dev-data", "wordnet-minilm")))
    p.add_argument("--memory-limit", default="1GiB", help="hubnorm --memory-limit of every job but memory")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per measurement (default 3600)")
    p.add_argument("--hubnorm-bin", default=os.environ.get("HUBNORM_BIN"))
    p.add_argument("--hubnorm-blas", default=os.environ.get("HUBNORM_BENCH_BLAS"), metavar="LIB|mkl",
                   help="also time hubnorm with HUBNORM_BLAS=LIB (a cblas_sgemm shared library) as the tool "
                        "`hubnorm+blas`, checked against plain hubnorm; `mkl` installs Intel MKL from PyPI into the "
                        "bench venv and uses its libmkl_rt")
    p.add_argument("--peer-memory", default=None,
                   help="address-space limit of the peers (default 90%% of MemAvailable at each launch)")
    p.add_argument("--peak-repeats", type=int, default=3)
    p.add_argument("--memory-size", default="1m", help="data of the memory job: its gallery and queries (default 1m)")
    p.add_argument("--memory-bank-rows", default="10k", help="bank rows of the memory job (default 10k)")
    p.add_argument("--memory-small-limit", default="256MiB", help="hubnorm --memory-limit in the memory job")
    p.add_argument("--memory-repeats", type=int, default=1)
    p.add_argument("--scaling-gallery", default="10k,100k,1m", help="gallery sizes at the fixed bank")
    p.add_argument("--scaling-fixed-bank", default="100k")
    p.add_argument("--scaling-bank", default="10k,30k,100k", help="bank sizes at the fixed gallery")
    p.add_argument("--scaling-fixed-gallery", default="100k")
    p.add_argument("--scaling-dim", type=int, default=384)
    p.add_argument("--cluster-size", default="100k", help="the cluster job's size (gallery × bank, d)")
    p.add_argument("--cluster-repeats", type=int, default=3)
    p.add_argument("--cluster-passes", type=lambda v: v.split(","), default=["stats", "search"],
                   help="the cluster job's passes: stats (pass 1), search (pass 2), sn (pass 1 of sn), "
                        "comma separated")
    p.add_argument("--cluster-search-shards", type=int, default=4,
                   help="shards of query rows of the cluster job's search")
    p.add_argument("--scaling-repeats", type=int, default=1)
    p.add_argument("--scaling-threads", type=int, default=0, help="default: the largest of --threads")
    p.add_argument("--sn-max-pairs", type=float, default=2e9,
                   help="skip the sn job above this many bank × gallery pairs (default 2e9: dev and 10k run, 100k "
                        "and 1m do not; no dense peer fits there, and hubnorm recomputes 2·T = 20 sweeps of the "
                        "matrix when it exceeds --memory-limit, about 40 min per run at 100k)")
    p.add_argument("--s3-servers", default="moto",
                   help="S3-compatible servers of the object-store job: comma list of moto, s3s-fs (default moto)")
    p.add_argument("--s3s-fs", default=None, help="the s3s-fs binary (default: on PATH)")
    p.add_argument("--summarize", metavar="DIR", help="only regenerate DIR/summary.md from DIR/raw.csv")
    a = p.parse_args(argv)

    if a.summarize:
        print(summarize(a.summarize))
        return 0

    a.sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    for s in a.sizes:
        base, _, d = s.partition("@")
        if base not in SIZE_ORDER or (d and (base == "dev" or not d.isdigit())):
            p.error(f"unknown size {s!r} (choose from {', '.join(SIZE_ORDER)}; a generated size may name "
                    "its dimension, e.g. 100k@768)")
    a.threads = [int(t) for t in a.threads.split(",")]
    a.jobs = [j.strip() for j in a.jobs.split(",") if j.strip()]
    a.s3_servers = [x.strip() for x in a.s3_servers.split(",") if x.strip()]
    for j in a.jobs:
        if j not in JOBS_ALL:
            p.error(f"unknown job {j!r} (choose from {', '.join(JOBS_ALL)})")
    a.repeats_text = a.repeats
    default_rep, per = 3, {}
    for part in a.repeats.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            per[k.strip()] = int(v)
        else:
            default_rep = int(part)
    a.repeats_for = lambda size: per.get(size, default_rep)
    a.memory_limit_text = a.memory_limit
    a.memory_small_limit_text = a.memory_small_limit
    a.memory_small_limit = parse_size(a.memory_small_limit)
    a.memory_bank_rows = parse_size(a.memory_bank_rows)
    if a.memory_size not in SIZE_ORDER:
        p.error(f"unknown --memory-size {a.memory_size!r}")
    a.peer_memory = parse_size(a.peer_memory) if a.peer_memory else None
    a.scaling_gallery = [parse_size(x) for x in a.scaling_gallery.split(",") if x]
    a.scaling_bank = [parse_size(x) for x in a.scaling_bank.split(",") if x]
    a.scaling_fixed_bank = parse_size(a.scaling_fixed_bank)
    a.scaling_fixed_gallery = parse_size(a.scaling_fixed_gallery)
    if a.out is None:
        a.out = os.path.join(REPO, "benches", "runs", dt.date.today().isoformat())
    if not a.hubnorm_bin or not os.access(a.hubnorm_bin, os.X_OK):
        p.error(f"no hubnorm binary (--hubnorm-bin or HUBNORM_BIN): {a.hubnorm_bin!r}")
    a.hubnorm_bin = os.path.abspath(a.hubnorm_bin)
    if a.hubnorm_blas == "mkl":
        a.hubnorm_blas = mkl_runtime()
    elif a.hubnorm_blas and not os.path.exists(a.hubnorm_blas):
        p.error(f"--hubnorm-blas {a.hubnorm_blas!r}: no such file")

    b = Bench(a)

    def on_signal(signum, frame):
        pid = _CURRENT["pid"]
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        b.stop_s3_servers()
        print("\ninterrupted; summary of what was measured so far:", flush=True)
        b.raw.flush()
        try:
            summarize(b.out)
        except Exception:  # noqa: BLE001
            pass
        os._exit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    b.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Peer implementations for the hubnorm benchmark: one job per process.

    python peers.py JOB --queries Q --gallery G --bank B --out OUT.npz [--threads N] [job flags]

Each job does what a user would do today with numpy / faiss / POT / scipy, written from the
formulas of shared/spec/METHODS.md (no peer project's code is copied). Outputs go to an .npz:
`ids` (queries x k, gallery *row indices*), `scores` (float32, the method's score in similarity
units, s - h), `h` (float64 per gallery row) and `active` (dis) where the job has them. A line
`phases: name=seconds ...` on stdout tells where the time went. Exit code 3 = out of memory.

Thread count: the driver sets OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS; --threads
also goes to faiss.omp_set_num_threads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PHASES: list[tuple[str, float]] = []
_T0 = [time.perf_counter()]


def phase(name: str):
    now = time.perf_counter()
    PHASES.append((name, now - _T0[0]))
    _T0[0] = now


def load(path, **kw):
    _, X, _ = common.load_embeddings(path, want_ids=False, **kw)
    return X


# ----------------------------------------------------------------------------------------------
# Top-k helpers
# ----------------------------------------------------------------------------------------------

def topk_rows(S: np.ndarray, k: int):
    """Top-k of each row of S by argpartition + sort; ties by the smaller column index."""
    n = S.shape[1]
    idx = np.argpartition(S, n - k, axis=1)[:, n - k:]
    sc = np.take_along_axis(S, idx, axis=1)
    order = np.lexsort((idx, -sc), axis=-1)
    return np.take_along_axis(idx, order, axis=1).astype(np.int64), np.take_along_axis(sc, order, axis=1)


def block_rows(n_cols: int, cap: int = 1024, budget_entries: int = 1 << 28) -> int:
    """Query rows per block: ~1024, fewer when a block's scores + argpartition indices
    (12 bytes per entry) would pass 3 GiB."""
    return int(max(16, min(cap, budget_entries // max(1, n_cols))))


def blocked_search(Q, G, k, correction=None, block=None):
    """numpy blocked matmul + argpartition top-k, optionally minus a per-gallery correction."""
    nq, n = Q.shape[0], G.shape[0]
    block = block or block_rows(n)
    ids = np.empty((nq, k), np.int64)
    scores = np.empty((nq, k), np.float32)
    GT = np.ascontiguousarray(G.T)
    t_mm = t_sel = 0.0
    for s in range(0, nq, block):
        t = time.perf_counter()
        S = Q[s:s + block] @ GT
        if correction is not None:
            S -= correction
        t2 = time.perf_counter()
        ids[s:s + block], scores[s:s + block] = topk_rows(S, k)
        t_mm += t2 - t
        t_sel += time.perf_counter() - t2
        del S
    PHASES.append(("matmul", t_mm))
    PHASES.append(("select", t_sel))
    _T0[0] = time.perf_counter()
    return ids, scores


def faiss_search(Q, G, k, threads):
    import faiss
    faiss.omp_set_num_threads(threads)
    phase("import")
    index = faiss.IndexFlatIP(G.shape[1])
    index.add(G)
    phase("index_add")
    scores, ids = index.search(Q, k)
    phase("search")
    return ids.astype(np.int64), scores.astype(np.float32)


def augmented(G, Q, h):
    """README 'export' convention: g' = [g, h(g)], q' = [q, -1], so <q', g'> = s(q, g) - h(g)."""
    Gp = np.empty((G.shape[0], G.shape[1] + 1), np.float32)
    Gp[:, :-1] = G
    Gp[:, -1] = h
    Qp = np.empty((Q.shape[0], Q.shape[1] + 1), np.float32)
    Qp[:, :-1] = Q
    Qp[:, -1] = -1.0
    return Gp, Qp


def read_correction(stats_path, column, gallery_path):
    """A per-gallery column of hubnorm's gallery_stats.parquet, in gallery row order."""
    import pyarrow.parquet as pq
    t = pq.read_table(stats_path, columns=["gallery_id", column])
    gids = common.load_ids(gallery_path)
    rows = common.map_ids(t["gallery_id"], common.id_index(gids))
    h = np.full(len(gids), np.nan)
    h[rows] = t[column].to_numpy(zero_copy_only=False)
    if np.isnan(h).any():
        raise SystemExit(f"{stats_path}: {int(np.isnan(h).sum())} gallery items have no {column}")
    return h


# ----------------------------------------------------------------------------------------------
# Dense statistics (METHODS.md)
# ----------------------------------------------------------------------------------------------

def is_correction_dense(S: np.ndarray, beta: float) -> np.ndarray:
    """h(g) = (1/beta) LSE_b beta*s(b, g) over the columns of the dense bank x gallery matrix S
    (destroyed: max-subtraction, scaling and exp are done in place; sums in float64)."""
    mx = S.max(axis=0)
    S -= mx
    S *= beta
    np.exp(S, out=S)
    total = S.sum(axis=0, dtype=np.float64)
    return mx.astype(np.float64) + np.log(total) / beta


def row_lse(S, shift_cols, scale, out_rows, block_entries=1 << 24):
    """out[b] = LSE_t (S[b, t] - shift_cols[t]) * scale, f32 work blocks, f64 sums."""
    m, n = S.shape
    rb = max(1, block_entries // n)
    shift = shift_cols.astype(np.float32)
    for r in range(0, m, rb):
        W = S[r:r + rb] - shift
        W *= scale
        mx = W.max(axis=1)
        W -= mx[:, None]
        np.exp(W, out=W)
        out_rows[r:r + rb] = mx + np.log(W.sum(axis=1, dtype=np.float64))
    return out_rows


def col_lse(S, shift_rows, scale, out_cols, block_entries=1 << 24):
    """out[t] = LSE_b (S[b, t] - shift_rows[b]) * scale."""
    m, n = S.shape
    cb = max(1, block_entries // m)
    shift = shift_rows.astype(np.float32)[:, None]
    for c in range(0, n, cb):
        W = S[:, c:c + cb] - shift
        W *= scale
        mx = W.max(axis=0)
        W -= mx
        np.exp(W, out=W)
        out_cols[c:c + cb] = mx + np.log(W.sum(axis=0, dtype=np.float64))
    return out_cols


# ----------------------------------------------------------------------------------------------
# Jobs
# ----------------------------------------------------------------------------------------------

def job_peak_sgemm(a):
    """numpy sgemm GFLOP/s of (4096 x 1024) . (1024 x 16384): one warm-up, median of 3."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((4096, 1024), dtype=np.float32)
    B = rng.standard_normal((1024, 16384), dtype=np.float32)
    C = np.empty((4096, 16384), np.float32)
    np.matmul(A, B, out=C)
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        np.matmul(A, B, out=C)
        runs.append(2.0 * 4096 * 1024 * 16384 / (time.perf_counter() - t) / 1e9)
    print(f"gflops={float(np.median(runs)):.3f} runs={','.join(f'{r:.2f}' for r in runs)}")
    return {}


def job_topk_faiss(a):
    Q, G = load(a.queries), load(a.gallery)
    phase("load")
    ids, scores = faiss_search(Q, G, a.k, a.threads)
    return {"ids": ids, "scores": scores}


def job_topk_numpy(a):
    Q, G = load(a.queries), load(a.gallery)
    phase("load")
    ids, scores = blocked_search(Q, G, a.k, block=a.block)
    return {"ids": ids, "scores": scores}


def job_is_pass1(a):
    """QB-Norm reference style: the whole bank x gallery matrix, then the IS correction."""
    B, G = load(a.bank), load(a.gallery)
    phase("load")
    S = B @ G.T
    phase("matmul")
    h = is_correction_dense(S, a.beta)
    phase("lse")
    return {"h": h}


def job_is_pass2(a):
    """Dense query x gallery matrix minus the correction (from --stats), top-k."""
    Q, G = load(a.queries), load(a.gallery)
    h = read_correction(a.stats, a.stats_column, a.gallery).astype(np.float32)
    phase("load")
    S = Q @ G.T
    phase("matmul")
    S -= h
    phase("correct")
    ids = np.empty((S.shape[0], a.k), np.int64)
    scores = np.empty((S.shape[0], a.k), np.float32)
    blk = block_rows(S.shape[1])
    for s in range(0, S.shape[0], blk):
        ids[s:s + blk], scores[s:s + blk] = topk_rows(S[s:s + blk], a.k)
    phase("select")
    return {"ids": ids, "scores": scores}


def augmented_inputs(a):
    """The job's queries and gallery as (d+1)-vectors carrying the correction (`augmented`)."""
    Q, G = load(a.queries), load(a.gallery)
    h = read_correction(a.stats, a.stats_column, a.gallery)
    phase("load")
    Gp, Qp = augmented(G, Q, h)
    del G, Q
    phase("augment")
    return Gp, Qp


def job_is_faiss(a):
    """Corrected search at equal results with faiss: the correction as an extra coordinate."""
    Gp, Qp = augmented_inputs(a)
    ids, scores = faiss_search(Qp, Gp, a.k, a.threads)
    return {"ids": ids, "scores": scores}


def job_is_faiss_sq(a):
    """Corrected search through faiss's reduced-precision route: the (d+1)-vectors in an
    `IndexScalarQuantizer` (bf16 or fp16, inner product), `IndexRefineFlat` re-ranking
    k·k_factor of its candidates with the f32 vectors."""
    import faiss
    faiss.omp_set_num_threads(a.threads)
    Gp, Qp = augmented_inputs(a)
    kind = {"bf16": faiss.ScalarQuantizer.QT_bf16, "fp16": faiss.ScalarQuantizer.QT_fp16}[a.sq]
    base = faiss.IndexScalarQuantizer(Gp.shape[1], kind, faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexRefineFlat(base)
    index.k_factor = a.k_factor
    index.train(Gp)
    index.add(Gp)
    phase("index_add")
    scores, ids = index.search(Qp, a.k)
    phase("search")
    return {"ids": ids.astype(np.int64), "scores": scores.astype(np.float32)}


def job_dis_dense(a):
    """Dynamic inverted softmax (QB-Norm), dense: activation set from each bank query's top-k_A
    over the gallery, IS correction, then each query corrected iff its raw top-1 is activated."""
    B, G = load(a.bank), load(a.gallery)
    phase("load")
    S = B @ G.T
    phase("matmul_bank")
    n = S.shape[1]
    active = np.zeros(n, bool)
    if a.activation_k == 1:
        active[np.argmax(S, axis=1)] = True  # first maximum: ties to the smaller row index
    else:
        for s in range(0, S.shape[0], 4096):
            idx, _ = topk_rows(S[s:s + 4096], a.activation_k)
            active[idx.ravel()] = True
    phase("activation")
    h = is_correction_dense(S, a.beta)
    del S
    phase("lse")
    Q = load(a.queries)
    Sq = Q @ G.T
    phase("matmul_queries")
    top1 = np.argmax(Sq, axis=1)
    gate = active[top1]
    Sq[gate] -= h.astype(np.float32)
    phase("correct")
    ids = np.empty((Sq.shape[0], a.k), np.int64)
    scores = np.empty((Sq.shape[0], a.k), np.float32)
    blk = block_rows(n)
    for s in range(0, Sq.shape[0], blk):
        ids[s:s + blk], scores[s:s + blk] = topk_rows(Sq[s:s + blk], a.k)
    phase("select")
    return {"ids": ids, "scores": scores, "h": h, "active": active,
            "normalised_fraction": np.array(gate.mean())}


def job_nnn_chunked(a):
    """NNN as in its reference: per gallery chunk, similarities to every bank query, the k largest
    per gallery item, h = alpha * their mean; then the corrected search."""
    B, G = load(a.bank), load(a.gallery)
    phase("load")
    m, n = B.shape[0], G.shape[0]
    k = a.nnn_k
    chunk = max(1, min(n, (1 << 26) // m))  # ~256 MB of similarities per chunk
    h = np.empty(n, np.float64)
    BT = np.ascontiguousarray(B.T)
    t_mm = t_sel = 0.0
    for s in range(0, n, chunk):
        t = time.perf_counter()
        S = G[s:s + chunk] @ BT
        t2 = time.perf_counter()
        top = np.partition(S, m - k, axis=1)[:, m - k:]
        h[s:s + chunk] = a.alpha * top.mean(axis=1, dtype=np.float64)
        t_mm += t2 - t
        t_sel += time.perf_counter() - t2
    PHASES.append(("matmul_bank", t_mm))
    PHASES.append(("topk_bank", t_sel))
    _T0[0] = time.perf_counter()
    del B, BT
    Q = load(a.queries)
    phase("load_queries")
    if a.search == "faiss":
        Gp, Qp = augmented(G, Q, h)
        del G, Q
        ids, scores = faiss_search(Qp, Gp, a.k, a.threads)
    else:
        ids, scores = blocked_search(Q, G, a.k, correction=h.astype(np.float32))
    return {"ids": ids, "scores": scores, "h": h}


def sn_search(a, G, f):
    Q = load(a.queries)
    phase("load_queries")
    return blocked_search(Q, G, a.k, correction=f.astype(np.float32))


def job_sn_numpy(a):
    """Sinkhorn normalisation (METHODS.md sn): dense bank x gallery matrix, T log-domain
    iterations from f = 0, source (bank) update first, uniform marginals; f32 work blocks with
    float64 sums (the log-sum-exp of scipy.special.logsumexp, written out to bound temporaries)."""
    B, G = load(a.bank), load(a.gallery)
    phase("load")
    S = B @ G.T
    phase("matmul")
    m, n = S.shape
    tau = a.tau
    f = np.zeros(n)
    g = np.zeros(m)
    for _ in range(a.iterations):
        row_lse(S, f, 1.0 / tau, g)
        g = tau * g + tau * np.log(m)
        col_lse(S, g, 1.0 / tau, f)
        f = tau * f + tau * np.log(n)
    phase("sinkhorn")
    del S, B
    ids, scores = sn_search(a, G, f)
    return {"ids": ids, "scores": scores, "h": f}


def job_sn_pot(a):
    """Sinkhorn normalisation with POT's ot.sinkhorn(method='sinkhorn_log'). POT updates its
    column potential first from u = v = 0, so the problem is passed transposed (rows = gallery,
    columns = bank): its first update is then METHODS.md's source update, and after numItermax
    = T iterations f(g) = -tau * log_u. Cost M = -S, reg = tau, a = 1/n, b = 1/m."""
    import ot
    phase("import")
    B, G = load(a.bank), load(a.gallery)
    phase("load")
    M = G @ B.T
    np.negative(M, out=M)
    phase("matmul")
    n, m = M.shape
    wa = np.full(n, 1.0 / n, np.float32)
    wb = np.full(m, 1.0 / m, np.float32)
    plan, log = ot.sinkhorn(wa, wb, M, a.tau, method="sinkhorn_log", numItermax=a.iterations,
                            stopThr=0.0, log=True, warn=False)
    del plan, M
    f = -a.tau * np.asarray(log["log_u"], dtype=np.float64)
    phase("sinkhorn")
    del B
    ids, scores = sn_search(a, G, f)
    return {"ids": ids, "scores": scores, "h": f}


def job_hubness(a):
    """k-occurrence skewness (REPORTS.md: k = 10, all gallery items, population skewness) of the
    neighbour lists in a results file (method --method), with scipy.stats.skew."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from scipy import stats
    phase("import")
    t = pq.read_table(a.results, columns=["method", "rank", "gallery_id"])
    t = t.filter(pc.and_(pc.equal(t["method"], a.method), pc.less_equal(t["rank"], a.k)))
    gids = common.load_ids(a.gallery)
    n_g = len(gids)
    rows = common.map_ids(t["gallery_id"], common.id_index(gids))
    phase("load")
    N = np.bincount(rows, minlength=n_g).astype(np.float64)
    out = {
        "skewness": np.array(stats.skew(N)),
        "kurtosis": np.array(stats.kurtosis(N)),
        "max": np.array(N.max()),
        "antihub_rate": np.array((N == 0).mean()),
    }
    phase("measures")
    print("measures: " + json.dumps({k: float(v) for k, v in out.items()}))
    return out


JOBS = {
    "peak-sgemm": job_peak_sgemm,
    "topk-faiss": job_topk_faiss,
    "topk-numpy": job_topk_numpy,
    "is-pass1": job_is_pass1,
    "is-pass2": job_is_pass2,
    "is-faiss": job_is_faiss,
    "is-faiss-sq": job_is_faiss_sq,
    "dis-dense": job_dis_dense,
    "nnn-chunked": job_nnn_chunked,
    "sn-numpy": job_sn_numpy,
    "sn-pot": job_sn_pot,
    "hubness": job_hubness,
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", choices=sorted(JOBS))
    p.add_argument("--queries")
    p.add_argument("--gallery")
    p.add_argument("--bank")
    p.add_argument("--stats", help="hubnorm gallery_stats.parquet (is-pass2, is-faiss)")
    p.add_argument("--stats-column", default="is_beta20_correction")
    p.add_argument("--results", help="results.parquet (hubness)")
    p.add_argument("--method", default="none", help="method whose lists the hubness job reads")
    p.add_argument("--out")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--sq", choices=["bf16", "fp16"], default="bf16", help="is-faiss-sq: the quantizer")
    p.add_argument("--k-factor", type=int, default=8,
                   help="is-faiss-sq: candidates re-ranked in f32, as a multiple of k")
    p.add_argument("--block", type=int, default=0, help="topk-numpy query block (0 = ~1024)")
    p.add_argument("--beta", type=float, default=20.0)
    p.add_argument("--activation-k", type=int, default=1)
    p.add_argument("--alpha", type=float, default=0.75)
    p.add_argument("--nnn-k", type=int, default=128)
    p.add_argument("--search", choices=["faiss", "numpy"], default="faiss",
                   help="nnn-chunked: corrected search with faiss (extra coordinate) or numpy")
    p.add_argument("--tau", type=float, default=0.01)
    p.add_argument("--iterations", type=int, default=10)
    a = p.parse_args(argv)
    phase("start")
    PHASES.clear()
    try:
        out = JOBS[a.job](a)
        if a.out and out:
            tmp = a.out + f".tmp-{os.getpid()}.npz"
            np.savez(tmp, **out)
            os.replace(tmp, a.out)
            phase("write")
    except MemoryError as e:
        print(f"out of memory: MemoryError: {e}", flush=True)
        return 3
    print("phases: " + " ".join(f"{n}={t:.3f}" for n, t in PHASES), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

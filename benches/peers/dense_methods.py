#!/usr/bin/env python3
"""Independent dense f64 reference figures for the toolkit methods of METHODS.md.

Standalone (numpy, pyarrow, and scipy.special.log_ndtr for log Φ), written from
../shared/spec/METHODS.md ("Methods of the hubness toolkits, with banks") and
../shared/spec/REPORTS.md alone, not from the library. Whole matrices in f64.

For the WordNet dev set (../shared/dev-data/wordnet-minilm) it prints a
markdown table, `| method | R@1 | R@5 | R@10 | MRR | skew(N10) |` (then the
same at full precision), after a self-check on a 2-D case, for
none, mp, ls, nicdm and dissim-local at their defaults (k = 5), and mp without
the gallery bank:

- rows L2-normalised in f64, s(x, y) = <x, y>, d(x, y) = sqrt(max(0, 2 - 2 s));
- N_k(g) = the k bank queries with the largest s(b, g), ties to the smaller
  bank row (a stable sort of each bank column);
- mp: log Φ((s - μ_B(g))/σ_B(g)) + log Φ((s - μ(q))/σ(q)), μ_B, σ_B (population)
  of s(b, g) over the bank, μ(q), σ(q) of s(q, ĝ) over the gallery bank
  (gallery_bank.parquet), both straight from the similarity matrices; the row
  "mp, no gallery bank" takes μ(q), σ(q) over the gallery instead;
- ls: -d(q, g)² / d(b_k, g), b_k the k-th of N_k(g);
- nicdm: -d(q, g) / sqrt(mean of d(b, g) over N_k(g));
- dissim-local: s(q, g) - (‖g‖² - ‖g - c_k(g)‖²)/2, c_k(g) the mean of the
  vectors of N_k(g);
- rank = 1 + gallery items scored strictly higher than the target + half the
  other items scored equal (REPORTS.md), over the whole gallery; R@K = share
  of queries with rank ≤ K; MRR = mean 1/rank;
- N10(g) = number of queries whose top-10 (score descending, ties to the
  smaller gallery row) holds g, over all gallery items; skew = m3 / m2^1.5
  (population moments).

Usage: python benches/peers/dense_methods.py [--data DIR] [--k K]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from scipy.special import log_ndtr

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared" / "dev-data" / "wordnet-minilm"

# The `none` row of the dev set's README (R@K to 1e-4, MRR to 1e-4, skew to 1e-3).
README_NONE = {"R@1": 0.3786, "R@5": 0.5498, "R@10": 0.6006, "MRR": 0.4584, "skew": 1.992}


def read(path: Path, with_target: bool = False):
    table = pq.read_table(path)
    col = table.column("embedding").combine_chunks()
    dim = col.type.list_size
    x = np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=np.float64).reshape(-1, dim)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise SystemExit(f"{path}: a zero-norm row")
    x = x / norms
    ids = table.column("id").to_pylist()
    targets = table.column("target_id").to_pylist() if with_target else None
    return ids, x, targets


def top_k_lists(scores: np.ndarray, k: int) -> np.ndarray:
    """Per query the k best gallery rows: score descending, ties to the smaller row."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def metrics(scores: np.ndarray, target: np.ndarray, k_occ: int = 10) -> dict:
    nq, n = scores.shape
    t = scores[np.arange(nq), target][:, None]
    ahead = (scores > t).sum(axis=1)
    ties = (scores == t).sum(axis=1) - 1  # the other items scored equal
    rank = 1.0 + ahead + 0.5 * ties
    out = {f"R@{k}": float(np.mean(rank <= k)) for k in (1, 5, 10)}
    out["MRR"] = float(np.mean(1.0 / rank))
    top = top_k_lists(scores, k_occ)
    counts = np.bincount(top.ravel(), minlength=n).astype(np.float64)
    c = counts - counts.mean()
    m2, m3 = np.mean(c**2), np.mean(c**3)
    out["skew"] = float(m3 / m2**1.5) if m2 > 0 else 0.0
    out["exact_ties_at_target"] = int(np.sum(ties))
    return out


def dist_from_sim(s: np.ndarray) -> np.ndarray:
    """d = sqrt(max(0, 2 - 2 s)) for unit rows."""
    return np.sqrt(np.maximum(0.0, 2.0 - 2.0 * s))


def method_scores(Q, G, B, H, k):
    """(name, scores) of none, mp (and mp without the gallery bank), ls, nicdm
    and dissim-local, one at a time
    (rows of Q, G, B, H unit length, f64)."""
    n = G.shape[0]
    cols = np.arange(n)
    S = Q @ G.T  # s(q, g)
    BG = B @ G.T  # s(b, g)
    # N_k(g), nearest first, ties to the smaller bank row.
    nbr = np.argsort(-BG, axis=0, kind="stable")[:k]  # (k, n) bank rows
    nbr_sim = BG[nbr, cols[None, :]]  # (k, n): s(b, g) for b in N_k(g)

    yield "none", S

    # mp: μ_B, σ_B over the query bank (per gallery item), μ(q), σ(q) over the
    # gallery bank (per query); population std, straight from the similarities.
    mu_b, sd_b = BG.mean(axis=0), BG.std(axis=0)
    QH = Q @ H.T  # s(q, ĝ)
    mu_q, sd_q = QH.mean(axis=1), QH.std(axis=1)
    del QH
    assert sd_b.min() >= 1e-12 and sd_q.min() >= 1e-12
    mp = log_ndtr((S - mu_b[None, :]) / sd_b[None, :]) + log_ndtr((S - mu_q[:, None]) / sd_q[:, None])
    assert np.all(np.isfinite(mp))
    yield "mp", mp
    # The same with μ(q), σ(q) over the gallery (a run without a gallery bank).
    mu_g, sd_g = S.mean(axis=1), S.std(axis=1)
    assert sd_g.min() >= 1e-12
    mp = log_ndtr((S - mu_b[None, :]) / sd_b[None, :]) + log_ndtr((S - mu_g[:, None]) / sd_g[:, None])
    yield "mp, no gallery bank", mp
    del mp

    D = dist_from_sim(S)  # d(q, g)
    # ls: σ_k(g) = d(b_k, g), b_k the k-th of N_k(g).
    sigma = dist_from_sim(nbr_sim[k - 1])
    assert sigma.min() > 0
    yield "ls", -(D**2) / sigma[None, :]

    # nicdm: r_k(g) = mean of d(b, g) over N_k(g).
    r = dist_from_sim(nbr_sim).mean(axis=0)
    assert r.min() > 0
    yield "nicdm", -D / np.sqrt(r)[None, :]
    del D

    # dissim-local: c_k(g) = mean of the gathered vectors of N_k(g).
    C = B[nbr].mean(axis=0)  # (n, dim)
    h = (np.sum(G * G, axis=1) - np.sum((G - C) ** 2, axis=1)) / 2.0
    yield "dissim-local", S - h[None, :]


def unit(rows) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# A 2-D case with expected scores from mpmath (40 digits, straight from the
# METHODS.md formulas); the same case as toolkit_methods_on_normalised_rows and
# mp_on_normalised_rows in tests/reference_checks.rs. k = 2.
SELF_CHECK = {
    "queries": [(1, 2), (-3, -1)],
    "gallery": [(3, 4), (0, 2), (-5, 0)],
    "bank": [(2, 0), (0, -3), (1, 1), (4, 3), (-1, 2)],
    "gallery_bank": [(1, 3), (-2, 1), (2, -1), (0, 1)],
    "expected": {
        "none": [[0.9838699100999074, 0.894427190999916, -0.4472135954999579],
                 [-13 / (5 * 10**0.5), -0.31622776601683794, 0.9486832980505138]],
        "mp": [[-0.37562869550745101, -0.39226891051423709, -4.3983693186520696],
               [-5.5552279671119982, -2.388442985268005, -0.024110669404236022]],
        "ls": [[-0.11405695949504071, -0.27587504467495464, -2.0466690944067709],
               [-12.884844553364928, -3.4394689048391387, -0.072572775873221231]],
        "nicdm": [[-0.38980533769967443, -0.58716553475045394, -1.5322454040611867],
                  [-4.1431101373598703, -2.0732422044338878, -0.28853026794287547]],
        "dissim-local": [[0.50638253668461583, 0.42271714641089366, -0.64442719099991588],
                         [-1.2996795650590703, -0.78793781060586015, 0.75146970255055586]],
    },
}


def self_check() -> None:
    c = SELF_CHECK
    got = dict(method_scores(unit(c["queries"]), unit(c["gallery"]), unit(c["bank"]),
                             unit(c["gallery_bank"]), k=2))
    for name, want in c["expected"].items():
        err = np.max(np.abs(got[name] - np.array(want)) / np.maximum(1.0, np.abs(want)))
        assert err <= 1e-12, f"self-check: {name} off by {err:.2e}"
    # The metrics on a hand-made score matrix: target ranks 1, 2.5 (row 1
    # ahead, row 0 tied) and 3; top-2 lists [0, 1], [1, 0] (rows 0 and 2 tie
    # for second, the smaller row wins) and [2, 1], so N2 = (2, 3, 1).
    scores = np.array([[3.0, 2.0, 1.0], [1.0, 2.0, 1.0], [0.0, 1.0, 2.0]])
    assert top_k_lists(scores, 2).tolist() == [[0, 1], [1, 0], [2, 1]]
    m = metrics(scores, np.array([0, 2, 0]), k_occ=2)
    assert m["R@1"] == 1 / 3 and m["R@5"] == 1.0, m
    assert abs(m["MRR"] - (1 + 1 / 2.5 + 1 / 3) / 3) < 1e-15, m
    assert abs(m["skew"]) < 1e-12, m  # (2, 3, 1) is symmetric
    # Population skewness of (0, 0, 0, 4): m2 = 3, m3 = 6, skew = 6 / 3^1.5.
    m = metrics(np.tile([1.0, 0.0, 0.0, 2.0], (4, 1)), np.array([3, 3, 3, 3]), k_occ=1)
    assert abs(m["skew"] - 6 / 3**1.5) < 1e-12, m
    print("self-check: ok (method scores of a 2-D case against mpmath to 1e-12; rank, R@K, MRR, top-k ties, skewness on hand-made scores)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--k", type=int, default=5, help="k of ls, nicdm and dissim-local")
    args = ap.parse_args()
    k = args.k
    t0 = time.time()
    self_check()

    _, Q, targets = read(args.data / "queries.parquet", with_target=True)
    g_ids, G, _ = read(args.data / "gallery.parquet")
    _, B, _ = read(args.data / "bank.parquet")
    _, H, _ = read(args.data / "gallery_bank.parquet")
    row_of = {g: i for i, g in enumerate(g_ids)}
    target = np.array([row_of[t] for t in targets])
    n = G.shape[0]

    results = {name: metrics(scores, target) for name, scores in method_scores(Q, G, B, H, k)}

    elapsed = time.time() - t0
    print("| method | R@1 | R@5 | R@10 | MRR | skew(N10) |")
    print("|---|---|---|---|---|---|")
    for name, m in results.items():
        print(f"| {name} | {m['R@1']:.4f} | {m['R@5']:.4f} | {m['R@10']:.4f} | {m['MRR']:.4f} | {m['skew']:.3f} |")
    print()
    print("Full precision (exact ties at the target: other items scored equal to it, summed over queries):")
    print()
    print("| method | R@1 | R@5 | R@10 | MRR | skew(N10) | ties |")
    print("|---|---|---|---|---|---|---|")
    for name, m in results.items():
        print(
            f"| {name} | {m['R@1']} | {m['R@5']} | {m['R@10']} | {m['MRR']!r} | {m['skew']!r} | {m['exact_ties_at_target']} |"
        )
    print()
    none = results["none"]
    ok = all(abs(none[key] - want) <= (1e-3 if key == "skew" else 1e-4) / 2 + 1e-12
             for key, want in README_NONE.items())
    print(
        f"none row against the dev set README (R@1 0.3786, R@5 0.5498, R@10 0.6006, MRR 0.4584, skew 1.992): "
        f"{'reproduced' if ok else 'MISMATCH'}"
    )
    print(
        f"inputs: {Q.shape[0]} queries, {n} gallery, {B.shape[0]} bank, {H.shape[0]} gallery bank, "
        f"dim {G.shape[1]}; k = {k}; numpy {np.__version__}; {elapsed:.1f} s"
    )


if __name__ == "__main__":
    main()

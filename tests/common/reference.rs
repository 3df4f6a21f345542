//! A dense f64 reference of every method of METHODS.md that hubnorm runs
//! (`none`, `is`, `dis`, `nnn`, `csls`, `gc`, `dn`, `dual-is`, `dual-dis`,
//! and the toolkit methods `mp`, `ls`, `nicdm`, `dissim-local`),
//! written from the spec alone and independently of the library: whole
//! similarity matrices in f64, plain loops, sorting where the library keeps
//! heaps. Slow (O(q·n·d + m·n·d)) and easy to check by eye is the point.
//!
//! Conventions (METHODS.md): s(x, y) = ⟨x, y⟩ of rows L2-normalised in f64
//! (unless `normalize` is false); every top-k and argmax breaks ties by the
//! smaller gallery row; reported scores are in similarity units, except the
//! toolkit methods' own units (`mp`: a log-probability; `ls`, `nicdm`: minus
//! a scaled distance, d(x, y) = sqrt(max(0, ‖x‖² + ‖y‖² − 2·s(x, y))) with the
//! norms of the f64 rows). N_k(g), the k bank rows with the largest s(b, g),
//! breaks ties by the smaller bank row; `mp` refuses a σ below 1e-12, `ls` and
//! `nicdm` a zero scale (the spec leaves that case open).
#![allow(dead_code)]

use super::{dot, to_f64, Table};

/// A method with its parameters, as the reference understands it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Method {
    None,
    Is {
        beta: f64,
    },
    Dis {
        beta: f64,
        activation_k: usize,
    },
    Nnn {
        alpha: f64,
        k: usize,
    },
    Csls {
        k: usize,
    },
    Gc,
    Dn {
        lambda: f64,
    },
    DualIs {
        beta1: f64,
        beta2: f64,
    },
    DualDis {
        beta1: f64,
        beta2: f64,
        activation_k: usize,
    },
    /// Gaussian mutual proximity (no parameters).
    Mp,
    /// Local scaling: −d(q, g)² / σ_k(g).
    Ls {
        k: usize,
    },
    /// NICDM: −d(q, g) / sqrt(r_k(g)).
    Nicdm {
        k: usize,
    },
    /// DisSimLocal: s(q, g) − h(g), h from the centroid of N_k(g).
    DissimLocal {
        k: usize,
    },
}

impl Method {
    /// The `method` column value of results.parquet.
    pub fn name(&self) -> &'static str {
        match self {
            Method::None => "none",
            Method::Is { .. } => "is",
            Method::Dis { .. } => "dis",
            Method::Nnn { .. } => "nnn",
            Method::Csls { .. } => "csls",
            Method::Gc => "gc",
            Method::Dn { .. } => "dn",
            Method::DualIs { .. } => "dual-is",
            Method::DualDis { .. } => "dual-dis",
            Method::Mp => "mp",
            Method::Ls { .. } => "ls",
            Method::Nicdm { .. } => "nicdm",
            Method::DissimLocal { .. } => "dissim-local",
        }
    }
}

/// s(x, g) for every row x and gallery item g: `rows.len()` × `gallery.len()`.
pub fn similarities(rows: &[Vec<f64>], gallery: &[Vec<f64>]) -> Vec<Vec<f64>> {
    rows.iter()
        .map(|x| gallery.iter().map(|g| dot(x, g)).collect())
        .collect()
}

/// log Σ_i exp(β·x_i), with max subtraction.
pub fn log_sum_exp(values: impl Iterator<Item = f64> + Clone, beta: f64) -> f64 {
    let max = values
        .clone()
        .map(|v| beta * v)
        .fold(f64::NEG_INFINITY, f64::max);
    max + values.map(|v| (beta * v - max).exp()).sum::<f64>().ln()
}

/// Mean of the k largest values.
pub fn mean_top_k(mut values: Vec<f64>, k: usize) -> f64 {
    assert!(
        k >= 1 && k <= values.len(),
        "k = {k} with {} values",
        values.len()
    );
    // Partition so that the first k are the k largest (in any order).
    values.select_nth_unstable_by(k - 1, |a, b| b.partial_cmp(a).unwrap());
    values[..k].iter().sum::<f64>() / k as f64
}

/// The indices of the k largest values, ties to the smaller index: the same
/// as `reference_topk`, by insertion into a short sorted list (O(n·k)), for
/// the small k of activation sets and top-1s over long rows.
pub fn top_k(values: &[f64], k: usize) -> Vec<usize> {
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    for (i, &v) in values.iter().enumerate() {
        if best.len() == k && values[best[k - 1]] >= v {
            continue; // not better than the k-th (an equal value keeps the earlier row)
        }
        let at = best.partition_point(|&j| values[j] >= v);
        best.insert(at, i);
        best.truncate(k);
    }
    best
}

/// ‖x‖² of every row.
pub fn squared_norms(rows: &[Vec<f64>]) -> Vec<f64> {
    rows.iter().map(|r| dot(r, r)).collect()
}

/// The Euclidean distance from a similarity and the two squared norms:
/// d(x, y) = sqrt(max(0, ‖x‖² + ‖y‖² − 2·s(x, y))) (METHODS.md, toolkit methods).
pub fn distance(squared_norm_x: f64, squared_norm_y: f64, s: f64) -> f64 {
    (squared_norm_x + squared_norm_y - 2.0 * s).max(0.0).sqrt()
}

/// Mean and population standard deviation (two passes: mean first, then the
/// mean squared deviation from it).
pub fn mean_and_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

// ------------------------------------------------------------------ erfc, log Φ

// W. J. Cody, "Rational Chebyshev approximations for the error function",
// Math. Comp. 23 (1969) 631–637; coefficients as in his netlib SPECFUN routine
// CALERF (double precision, near-minimax, ≥ 18 significant digits in theory).
// Written here highest degree first, for `horner`:
//   |x| ≤ 0.46875:      erf(x)        ≈ x · ERF_NUM(x²) / ERF_DEN(x²)
//   0.46875 < y ≤ 4:    exp(y²)·erfc(y) ≈ ERFCX_MID_NUM(y) / ERFCX_MID_DEN(y)
//   y > 4, z = 1/y²:    exp(y²)·erfc(y) ≈ (1/√π − z · ERFCX_TAIL_NUM(z) / ERFCX_TAIL_DEN(z)) / y
// The digits are Cody's (more than an f64 holds, hence the clippy allows).
// Checked against mpmath in tests/reference_checks.rs (≤ 1e-13 relative).
const ERF_SMALL: f64 = 0.46875;
#[allow(clippy::excessive_precision)]
const ERF_NUM: [f64; 5] = [
    1.85777706184603153e-1,
    3.16112374387056560e0,
    1.13864154151050156e2,
    3.77485237685302021e2,
    3.20937758913846947e3,
];
#[allow(clippy::excessive_precision)]
const ERF_DEN: [f64; 5] = [
    1.0,
    2.36012909523441209e1,
    2.44024637934444173e2,
    1.28261652607737228e3,
    2.84423683343917062e3,
];
#[allow(clippy::excessive_precision)]
const ERFCX_MID_NUM: [f64; 9] = [
    2.15311535474403846e-8,
    5.64188496988670089e-1,
    8.88314979438837594e0,
    6.61191906371416295e1,
    2.98635138197400131e2,
    8.81952221241769090e2,
    1.71204761263407058e3,
    2.05107837782607147e3,
    1.23033935479799725e3,
];
#[allow(clippy::excessive_precision)]
const ERFCX_MID_DEN: [f64; 9] = [
    1.0,
    1.57449261107098347e1,
    1.17693950891312499e2,
    5.37181101862009858e2,
    1.62138957456669019e3,
    3.29079923573345963e3,
    4.36261909014324716e3,
    3.43936767414372164e3,
    1.23033935480374942e3,
];
#[allow(clippy::excessive_precision)]
const ERFCX_TAIL_NUM: [f64; 6] = [
    1.63153871373020978e-2,
    3.05326634961232344e-1,
    3.60344899949804439e-1,
    1.25781726111229246e-1,
    1.60837851487422766e-2,
    6.58749161529837803e-4,
];
#[allow(clippy::excessive_precision)]
const ERFCX_TAIL_DEN: [f64; 6] = [
    1.0,
    2.56852019228982242e0,
    1.87295284992346047e0,
    5.27905102951428412e-1,
    6.05183413124413191e-2,
    2.33520497626869185e-3,
];

/// Σ c_i t^(deg − i), coefficients highest degree first.
fn horner(coefficients: &[f64], t: f64) -> f64 {
    coefficients.iter().fold(0.0, |acc, &c| acc * t + c)
}

/// exp(y²)·erfc(y) for y > 0.46875 (Cody's second and third intervals).
fn erfcx_cody(y: f64) -> f64 {
    assert!(y > ERF_SMALL, "erfcx_cody({y}) is for y > {ERF_SMALL}");
    if y <= 4.0 {
        horner(&ERFCX_MID_NUM, y) / horner(&ERFCX_MID_DEN, y)
    } else {
        let z = 1.0 / (y * y);
        let frac_1_sqrt_pi = 0.5 * std::f64::consts::FRAC_2_SQRT_PI;
        (frac_1_sqrt_pi - z * horner(&ERFCX_TAIL_NUM, z) / horner(&ERFCX_TAIL_DEN, z)) / y
    }
}

/// −y² as y₀² + (y − y₀)(y + y₀) with y₀ = y rounded down to a multiple of
/// 1/16, so that y₀² is exact (Cody's device against the rounding of y²).
fn minus_square(y: f64) -> (f64, f64) {
    let y0 = (y * 16.0).trunc() / 16.0;
    (-(y0 * y0), -((y - y0) * (y + y0)))
}

/// The complementary error function, to about 1e-15 relative (0 past x ≈ 26.5,
/// where it underflows: use `ln_erfc` there).
pub fn erfc(x: f64) -> f64 {
    let y = x.abs();
    if y <= ERF_SMALL {
        let t = x * x;
        return 1.0 - x * horner(&ERF_NUM, t) / horner(&ERF_DEN, t);
    }
    let (big, small) = minus_square(y);
    let upper = big.exp() * small.exp() * erfcx_cody(y); // erfc(|x|)
    if x < 0.0 {
        2.0 - upper
    } else {
        upper
    }
}

/// ln erfc(x), finite for every finite x: past 0.46875 it is
/// −x² + ln(exp(x²)·erfc(x)), with no underflow.
pub fn ln_erfc(x: f64) -> f64 {
    if x > ERF_SMALL {
        let (big, small) = minus_square(x);
        big + small + erfcx_cody(x).ln()
    } else {
        erfc(x).ln()
    }
}

/// log Φ(x) of the standard normal CDF Φ(x) = ½·erfc(−x/√2): log(½·erfc(−x/√2))
/// for x ≤ 0, finite and accurate far into the lower tail; ln(1 − ½·erfc(x/√2))
/// for x > 0, so that log Φ ≈ −Φ(−x) keeps its digits there.
pub fn log_ndtr(x: f64) -> f64 {
    let z = x * std::f64::consts::FRAC_1_SQRT_2;
    if x > 0.0 {
        (-0.5 * erfc(z)).ln_1p()
    } else {
        ln_erfc(-z) - std::f64::consts::LN_2
    }
}

/// Column g of a row-major matrix.
fn column(matrix: &[Vec<f64>], g: usize) -> impl Iterator<Item = f64> + Clone + '_ {
    matrix.iter().map(move |row| row[g])
}

/// The activation set of DIS: gallery items in the top-k_A of at least one row.
pub fn activation_set(rows_by_gallery: &[Vec<f64>], activation_k: usize, n: usize) -> Vec<bool> {
    let mut active = vec![false; n];
    for row in rows_by_gallery {
        for g in top_k(row, activation_k) {
            active[g] = true;
        }
    }
    active
}

/// Mean of the rows.
pub fn mean_row(rows: &[Vec<f64>]) -> Vec<f64> {
    let dim = rows[0].len();
    let mut mean = vec![0.0; dim];
    for r in rows {
        for (m, v) in mean.iter_mut().zip(r) {
            *m += v;
        }
    }
    mean.iter_mut().for_each(|m| *m /= rows.len() as f64);
    mean
}

/// The inputs of one case in f64 and their dense similarity matrices.
pub struct Dense {
    pub queries: Vec<Vec<f64>>,
    pub gallery: Vec<Vec<f64>>,
    pub bank: Vec<Vec<f64>>,
    pub gallery_bank: Option<Vec<Vec<f64>>>,
    /// s(q, g), queries × gallery: the raw score.
    pub qg: Vec<Vec<f64>>,
    /// s(b, g), bank × gallery.
    pub bg: Vec<Vec<f64>>,
    /// s(ĝ, g), gallery bank × gallery.
    pub hg: Option<Vec<Vec<f64>>>,
}

/// Scores of one method for every query and gallery item.
pub enum Scores {
    /// Real-valued scores (queries × gallery), ranked by score descending,
    /// then by the smaller gallery row.
    Real(Vec<Vec<f64>>),
    /// `gc`: ranked by the count ascending, then raw score descending, then row.
    Gc(Gc),
}

impl Dense {
    pub fn new(
        queries: &Table,
        gallery: &Table,
        bank: &Table,
        gallery_bank: Option<&Table>,
        normalize: bool,
    ) -> Dense {
        let queries = to_f64(queries, normalize);
        let gallery = to_f64(gallery, normalize);
        let bank = to_f64(bank, normalize);
        let gallery_bank = gallery_bank.map(|t| to_f64(t, normalize));
        let qg = similarities(&queries, &gallery);
        let bg = similarities(&bank, &gallery);
        let hg = gallery_bank.as_ref().map(|h| similarities(h, &gallery));
        Dense {
            queries,
            gallery,
            bank,
            gallery_bank,
            qg,
            bg,
            hg,
        }
    }

    pub fn n(&self) -> usize {
        self.gallery.len()
    }

    fn gallery_bank_sims(&self, method: &str) -> &[Vec<f64>] {
        self.hg
            .as_deref()
            .unwrap_or_else(|| panic!("{method} needs a gallery bank"))
    }

    /// log Σ_b exp(β·s(b, g)) for every g (not divided by β).
    pub fn bank_lse(&self, beta: f64) -> Vec<f64> {
        (0..self.n())
            .map(|g| log_sum_exp(column(&self.bg, g), beta))
            .collect()
    }

    /// log Σ_ĝ exp(β·s(ĝ, g)) for every g, over the gallery bank.
    pub fn gallery_bank_lse(&self, beta: f64) -> Vec<f64> {
        let hg = self.gallery_bank_sims("the gallery-bank LSE");
        (0..self.n())
            .map(|g| log_sum_exp(column(hg, g), beta))
            .collect()
    }

    /// r_B(g): the mean of the k largest s(b, g) over the bank.
    pub fn bank_mean_top_k(&self, k: usize) -> Vec<f64> {
        (0..self.n())
            .map(|g| mean_top_k(column(&self.bg, g).collect(), k))
            .collect()
    }

    /// N_k(g): the k bank rows with the largest s(b, g), nearest first, ties
    /// to the smaller bank row (a full sort of the column).
    pub fn bank_neighbours(&self, g: usize, k: usize) -> Vec<usize> {
        let m = self.bank.len();
        assert!(k >= 1 && k <= m, "k = {k} with {m} bank rows");
        super::reference_topk(&column(&self.bg, g).collect::<Vec<_>>(), k)
    }

    /// `mp`: log Φ((s − μ_B(g))/σ_B(g)) + log Φ((s − μ(q))/σ(q)), with μ_B, σ_B
    /// over the bank column of g and μ(q), σ(q) over s(q, ĝ) for the gallery
    /// bank when given, else s(q, g) over the gallery; all straight from the
    /// similarity matrices (not from moments). A σ below 1e-12 is refused.
    fn mutual_proximity(&self) -> Vec<Vec<f64>> {
        let gallery_stats: Vec<(f64, f64)> = (0..self.n())
            .map(|g| {
                let (mu, sd) = mean_and_sd(&column(&self.bg, g).collect::<Vec<_>>());
                assert!(sd >= 1e-12, "mp: σ_B of gallery row {g} is {sd:e} < 1e-12");
                (mu, sd)
            })
            .collect();
        let query_rows = match &self.gallery_bank {
            Some(h) => similarities(&self.queries, h),
            None => self.qg.clone(),
        };
        let query_stats: Vec<(f64, f64)> = query_rows
            .iter()
            .enumerate()
            .map(|(q, row)| {
                let (mu, sd) = mean_and_sd(row);
                assert!(sd >= 1e-12, "mp: σ of query row {q} is {sd:e} < 1e-12");
                (mu, sd)
            })
            .collect();
        self.qg
            .iter()
            .zip(&query_stats)
            .map(|(row, &(mu_q, sd_q))| {
                row.iter()
                    .zip(&gallery_stats)
                    .map(|(&s, &(mu_b, sd_b))| {
                        log_ndtr((s - mu_b) / sd_b) + log_ndtr((s - mu_q) / sd_q)
                    })
                    .collect()
            })
            .collect()
    }

    /// `ls` and `nicdm`: −d(q, g)^power / scale(g) for every query and gallery
    /// item, d from the similarities and the norms.
    fn scaled_distances(&self, scale: &[f64], power: i32) -> Vec<Vec<f64>> {
        let qn = squared_norms(&self.queries);
        let gn = squared_norms(&self.gallery);
        self.qg
            .iter()
            .zip(&qn)
            .map(|(row, &nq)| {
                row.iter()
                    .enumerate()
                    .map(|(g, &s)| -distance(nq, gn[g], s).powi(power) / scale[g])
                    .collect()
            })
            .collect()
    }

    /// d(b, g) for the bank rows of N_k(g), nearest first (`bn`: the bank's
    /// squared norms).
    fn neighbour_distances(&self, bn: &[f64], g: usize, k: usize) -> Vec<f64> {
        let gn = dot(&self.gallery[g], &self.gallery[g]);
        self.bank_neighbours(g, k)
            .into_iter()
            .map(|b| distance(bn[b], gn, self.bg[b][g]))
            .collect()
    }

    /// h(g) of `dissim-local`: (‖g‖² − ‖g − c_k(g)‖²)/2, with c_k(g) the mean
    /// of the gathered vectors of N_k(g).
    pub fn dissim_local_corrections(&self, k: usize) -> Vec<f64> {
        (0..self.n())
            .map(|g| {
                let rows: Vec<Vec<f64>> = self
                    .bank_neighbours(g, k)
                    .into_iter()
                    .map(|b| self.bank[b].clone())
                    .collect();
                let centroid = mean_row(&rows);
                let x = &self.gallery[g];
                let diff: Vec<f64> = x.iter().zip(&centroid).map(|(a, c)| a - c).collect();
                (dot(x, x) - dot(&diff, &diff)) / 2.0
            })
            .collect()
    }

    /// The query's raw top-1 (smaller row on ties).
    pub fn raw_top1(&self, q: usize) -> usize {
        top_k(&self.qg[q], 1)[0]
    }

    /// A of DIS from the query bank.
    pub fn bank_activation(&self, activation_k: usize) -> Vec<bool> {
        activation_set(&self.bg, activation_k, self.n())
    }

    /// A_G of dual-dis from the gallery bank.
    pub fn gallery_bank_activation(&self, activation_k: usize) -> Vec<bool> {
        activation_set(self.gallery_bank_sims("dual-dis"), activation_k, self.n())
    }

    /// Per query, whether its raw top-1 is in (A_Q, A_G). A_G is `false`
    /// without a gallery bank.
    pub fn gating(&self, activation_k: usize) -> Vec<(bool, bool)> {
        let a_q = self.bank_activation(activation_k);
        let a_g = self
            .hg
            .as_ref()
            .map(|_| self.gallery_bank_activation(activation_k));
        (0..self.queries.len())
            .map(|q| {
                let top = self.raw_top1(q);
                (a_q[top], a_g.as_ref().is_some_and(|a| a[top]))
            })
            .collect()
    }

    /// Queries whose gating decision f32 rounding could change: the raw top-1
    /// and top-2 within `tol`, or the top-1 an item whose place in some bank
    /// row's top-k_A is decided by a gap of at most `tol`. Fixtures should
    /// have none, so that the library must gate exactly as the reference.
    pub fn fragile_gating(&self, activation_k: usize, tol: f64) -> usize {
        let n = self.n();
        let mut fragile_item = vec![false; n];
        let mut rows: Vec<&Vec<f64>> = self.bg.iter().collect();
        if let Some(hg) = &self.hg {
            rows.extend(hg.iter());
        }
        for row in rows {
            if activation_k >= n {
                continue;
            }
            let top = top_k(row, activation_k + 1);
            let (inside, outside) = (top[activation_k - 1], top[activation_k]);
            if row[inside] - row[outside] <= tol {
                fragile_item[inside] = true;
                fragile_item[outside] = true;
            }
        }
        (0..self.queries.len())
            .filter(|&q| {
                let top = top_k(&self.qg[q], 2);
                let near_tie = top.len() == 2 && self.qg[q][top[0]] - self.qg[q][top[1]] <= tol;
                near_tie || fragile_item[top[0]]
            })
            .count()
    }

    /// The scores of `method` for every query and gallery item.
    pub fn scores(&self, method: Method) -> Scores {
        let additive = |h: Vec<f64>| -> Vec<Vec<f64>> {
            self.qg
                .iter()
                .map(|row| row.iter().zip(&h).map(|(s, h)| s - h).collect())
                .collect()
        };
        match method {
            Method::None => Scores::Real(self.qg.clone()),
            Method::Is { beta } => {
                let h = self.bank_lse(beta).iter().map(|l| l / beta).collect();
                Scores::Real(additive(h))
            }
            Method::Dis { beta, activation_k } => {
                let h: Vec<f64> = self.bank_lse(beta).iter().map(|l| l / beta).collect();
                let active = self.bank_activation(activation_k);
                Scores::Real(
                    (0..self.queries.len())
                        .map(|q| {
                            let row = &self.qg[q];
                            if active[self.raw_top1(q)] {
                                row.iter().zip(&h).map(|(s, h)| s - h).collect()
                            } else {
                                row.clone()
                            }
                        })
                        .collect(),
                )
            }
            Method::Nnn { alpha, k } => {
                let h = self.bank_mean_top_k(k).iter().map(|r| alpha * r).collect();
                Scores::Real(additive(h))
            }
            Method::Csls { k } => {
                let r_b = self.bank_mean_top_k(k);
                Scores::Real(
                    self.qg
                        .iter()
                        .map(|row| {
                            let r_g = mean_top_k(row.clone(), k);
                            row.iter()
                                .zip(&r_b)
                                .map(|(s, rb)| s - 0.5 * rb - 0.5 * r_g)
                                .collect()
                        })
                        .collect(),
                )
            }
            Method::Gc => Scores::Gc(Gc::new(self, GC_TOLERANCE)),
            Method::Dn { lambda } => {
                let mu_q = mean_row(&self.bank);
                let mu_g = mean_row(self.gallery_bank.as_deref().unwrap_or(&self.gallery));
                let shift = |rows: &[Vec<f64>], mu: &[f64]| -> Vec<Vec<f64>> {
                    rows.iter()
                        .map(|r| r.iter().zip(mu).map(|(v, m)| v - lambda * m).collect())
                        .collect()
                };
                Scores::Real(similarities(
                    &shift(&self.queries, &mu_q),
                    &shift(&self.gallery, &mu_g),
                ))
            }
            Method::DualIs { beta1, beta2 } => {
                let l1 = self.bank_lse(beta1);
                let l2 = self.gallery_bank_lse(beta2);
                let h = l1
                    .iter()
                    .zip(&l2)
                    .map(|(a, b)| (a + b) / (beta1 + beta2))
                    .collect();
                Scores::Real(additive(h))
            }
            Method::DualDis {
                beta1,
                beta2,
                activation_k,
            } => {
                let l1 = self.bank_lse(beta1);
                let l2 = self.gallery_bank_lse(beta2);
                let gating = self.gating(activation_k);
                Scores::Real(
                    (0..self.queries.len())
                        .map(|q| {
                            let h = |g: usize| match gating[q] {
                                (true, true) => (l1[g] + l2[g]) / (beta1 + beta2),
                                (true, false) => l1[g] / beta1,
                                (false, true) => l2[g] / beta2,
                                (false, false) => 0.0,
                            };
                            self.qg[q]
                                .iter()
                                .enumerate()
                                .map(|(g, s)| s - h(g))
                                .collect()
                        })
                        .collect(),
                )
            }
            Method::Mp => Scores::Real(self.mutual_proximity()),
            Method::Ls { k } => {
                // σ_k(g) = d(b_k, g), b_k the k-th of N_k(g).
                let bn = squared_norms(&self.bank);
                let sigma: Vec<f64> = (0..self.n())
                    .map(|g| {
                        let sigma = self.neighbour_distances(&bn, g, k)[k - 1];
                        assert!(sigma > 0.0, "ls: σ_k of gallery row {g} is 0");
                        sigma
                    })
                    .collect();
                Scores::Real(self.scaled_distances(&sigma, 2))
            }
            Method::Nicdm { k } => {
                // sqrt(r_k(g)), r_k(g) = the mean of d(b, g) over N_k(g).
                let bn = squared_norms(&self.bank);
                let scale: Vec<f64> = (0..self.n())
                    .map(|g| {
                        let r = self.neighbour_distances(&bn, g, k).iter().sum::<f64>() / k as f64;
                        assert!(r > 0.0, "nicdm: r_k of gallery row {g} is 0");
                        r.sqrt()
                    })
                    .collect();
                Scores::Real(self.scaled_distances(&scale, 1))
            }
            Method::DissimLocal { k } => Scores::Real(additive(self.dissim_local_corrections(k))),
        }
    }
}

/// Bounds on the REPORTS.md rank of `positive` (1 + items strictly ahead +
/// half the ties) when every score may be off by `tol`: items within `tol` of
/// the positive may land on either side. Without such items both bounds are
/// the exact rank.
pub fn rank_bounds(scores: &[f64], positive: usize, tol: f64) -> (f64, f64) {
    let t = scores[positive];
    let others = || {
        scores
            .iter()
            .enumerate()
            .filter(move |&(g, _)| g != positive)
    };
    let certainly_ahead = others().filter(|&(_, &s)| s > t + tol).count();
    let near = others().filter(|&(_, &s)| (s - t).abs() <= tol).count();
    let exact = super::reference_rank(scores, positive);
    if near == 0 {
        (exact, exact)
    } else {
        (
            1.0 + certainly_ahead as f64,
            1.0 + (certainly_ahead + near) as f64,
        )
    }
}

/// How far apart two similarities computed in f32 and in f64 may be: a bank
/// similarity this close to the query's similarity may be counted either way
/// by the library.
pub const GC_TOLERANCE: f64 = 2e-6;

/// `gc`: count(q, g) = |{b : s(b, g) > s(q, g)}|, score = −count, ordered by
/// (score, raw score, smaller row). `lo`/`hi` bound the count when the
/// similarities carry an error of up to the tolerance: |{b : s(b, g) > s(q, g) ± tol}|.
pub struct Gc {
    pub count: Vec<Vec<u32>>,
    pub lo: Vec<Vec<u32>>,
    pub hi: Vec<Vec<u32>>,
    pub raw: Vec<Vec<f64>>,
}

impl Gc {
    pub fn new(dense: &Dense, tol: f64) -> Gc {
        let (nq, n) = (dense.queries.len(), dense.n());
        let mut count = vec![vec![0u32; n]; nq];
        let mut lo = count.clone();
        let mut hi = count.clone();
        for g in 0..n {
            let mut sorted: Vec<f64> = column(&dense.bg, g).collect();
            sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
            // |{b : s(b, g) > x}| = m − |{b : s(b, g) ≤ x}|.
            let above = |x: f64| (sorted.len() - sorted.partition_point(|&v| v <= x)) as u32;
            for q in 0..nq {
                let s = dense.qg[q][g];
                count[q][g] = above(s);
                lo[q][g] = above(s + tol);
                hi[q][g] = above(s - tol);
            }
        }
        Gc {
            count,
            lo,
            hi,
            raw: dense.qg.clone(),
        }
    }

    /// Whether gallery item a ranks before b for query q.
    fn before(&self, q: usize, a: usize, b: usize) -> std::cmp::Ordering {
        let (c, r) = (&self.count[q], &self.raw[q]);
        c[a].cmp(&c[b])
            .then(r[b].partial_cmp(&r[a]).unwrap())
            .then(a.cmp(&b))
    }

    /// The first k gallery rows in gc order.
    pub fn topk(&self, q: usize, k: usize) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..self.raw[q].len()).collect();
        idx.sort_by(|&a, &b| self.before(q, a, b));
        idx.truncate(k);
        idx
    }

    /// REPORTS.md rank of `positive` under the (score, raw) order: 1 + items
    /// strictly ahead + half the exact ties.
    pub fn rank(&self, q: usize, positive: usize) -> f64 {
        let (c, r) = (&self.count[q], &self.raw[q]);
        let key = |g: usize| (c[g], r[g]);
        let (ct, rt) = key(positive);
        let mut ahead = 0usize;
        let mut ties = 0usize;
        for g in 0..r.len() {
            if g == positive {
                continue;
            }
            let (cg, rg) = key(g);
            if cg < ct || (cg == ct && rg > rt) {
                ahead += 1;
            } else if cg == ct && rg == rt {
                ties += 1;
            }
        }
        1.0 + ahead as f64 + 0.5 * ties as f64
    }

    /// Whether f32 rounding could change how a and b compare: their count
    /// intervals overlap and are not the same single value, or the counts are
    /// certainly equal and the raw scores are within `raw_tol`.
    pub fn ambiguous(&self, q: usize, a: usize, b: usize, raw_tol: f64) -> bool {
        let (lo, hi) = (&self.lo[q], &self.hi[q]);
        let overlap = lo[a] <= hi[b] && lo[b] <= hi[a];
        let certainly_equal = lo[a] == hi[a] && lo[b] == hi[b] && lo[a] == lo[b];
        if certainly_equal {
            (self.raw[q][a] - self.raw[q][b]).abs() <= raw_tol
        } else {
            overlap
        }
    }

    /// Bounds on the rank of `positive` under f32 rounding: items whose
    /// comparison with it is ambiguous may land on either side.
    pub fn rank_bounds(&self, q: usize, positive: usize) -> (f64, f64) {
        let mut certainly_ahead = 0usize;
        let mut uncertain = 0usize;
        for g in 0..self.raw[q].len() {
            if g == positive {
                continue;
            }
            if self.ambiguous(q, g, positive, 1e-6) {
                uncertain += 1;
            } else if self.before(q, g, positive).is_lt() {
                certainly_ahead += 1;
            }
        }
        let exact = self.rank(q, positive);
        if uncertain == 0 {
            (exact, exact)
        } else {
            (
                1.0 + certainly_ahead as f64,
                1.0 + (certainly_ahead + uncertain) as f64,
            )
        }
    }

    /// Checks one query's gc list `(gallery row, score, raw score)` against the
    /// reference: scores are exact integers within the count bounds, the raw
    /// scores within `tol`, the list is sorted by (score desc, raw desc, row
    /// asc), and it equals the reference order except where the reference
    /// itself is ambiguous under f32 rounding.
    pub fn assert_ranking_matches(
        &self,
        q: usize,
        ours: &[(usize, f32, f32)],
        k: usize,
        tol: f64,
        context: &str,
    ) {
        let expected = self.topk(q, k);
        assert_eq!(ours.len(), expected.len(), "{context}: list length");
        for (r, &(g, score, raw)) in ours.iter().enumerate() {
            assert_eq!(
                score,
                score.round(),
                "{context}: rank {r}: gc score {score} is not an integer"
            );
            let count = -score as f64;
            assert!(
                count >= self.lo[q][g] as f64 && count <= self.hi[q][g] as f64,
                "{context}: rank {r}: gallery row {g} has gc score {score}, reference −{} (bounds −{}..−{})",
                self.count[q][g],
                self.hi[q][g],
                self.lo[q][g]
            );
            assert!(
                (raw as f64 - self.raw[q][g]).abs() <= tol,
                "{context}: rank {r}: raw score {raw} vs reference {}",
                self.raw[q][g]
            );
            if r > 0 {
                let (pg, ps, pr) = ours[r - 1];
                let ordered = ps > score || (ps == score && (pr > raw || (pr == raw && pg < g)));
                assert!(
                    ordered,
                    "{context}: rank {r}: ({pg}, {ps}, {pr}) listed before ({g}, {score}, {raw}) breaks the (score, raw, row) order"
                );
            }
        }
        for (r, (&(got, _, _), &want)) in ours.iter().zip(&expected).enumerate() {
            if got != want {
                assert!(
                    self.ambiguous(q, got, want, 1e-6),
                    "{context}: rank {r}: got gallery row {got} (count {}, raw {}) but reference has {want} (count {}, raw {})",
                    self.count[q][got],
                    self.raw[q][got],
                    self.count[q][want],
                    self.raw[q][want]
                );
            }
        }
    }
}

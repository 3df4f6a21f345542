//! The bf16 screen: similarities computed from bf16 copies of the
//! embeddings (products accumulated in f32, `vdpbf16ps` on AVX512_BF16),
//! with a proven bound on how far they can be from the f32 GEMM's scores.
//! A search keeps every item the bound cannot rule out of its top-k and
//! re-scores only those in f32 ([`super::gemm::tile_score`]), so that its
//! lists and scores are the f32 path's exactly. docs/precision.md derives
//! the bound; `tests` below and tests/screen.rs try to break it.
//!
//! Conversion rounds to nearest, ties to even, and flushes values below
//! f32's normal range to zero itself, so the instruction's denormals-are-zero
//! rule never meets a denormal input. Values that would round beyond bf16's
//! range are refused ([`convert_rows`] returns `None`): such a block is
//! searched in f32 only.

/// The smallest positive normal f32 (and bf16): 2⁻¹²⁶.
const MIN_NORMAL: f64 = 1.1754943508222875e-38;

/// `x` in bf16 (the upper 16 bits of an f32), rounded to nearest with ties
/// to even; values below 2⁻¹²⁶ in magnitude become a zero of their sign.
/// A NaN stays a (quiet) NaN; a value that rounds past bf16's largest
/// finite one becomes infinite.
pub fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    if (x.abs() as f64) < MIN_NORMAL {
        return ((bits >> 16) as u16) & 0x8000;
    }
    let lsb = (bits >> 16) & 1;
    let rounded = bits.wrapping_add(0x7fff + lsb);
    (rounded >> 16) as u16
}

/// The f32 value of a bf16.
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `rows` (row-major f32) in bf16, or `None` when a value is not finite
/// in bf16 (it rounds past bf16's range, or was not finite).
pub fn convert_rows(rows: &[f32]) -> Option<Vec<u16>> {
    let converted: Vec<u16> = rows.iter().map(|&x| to_bf16(x)).collect();
    converted
        .iter()
        .all(|&h| h & 0x7f80 != 0x7f80)
        .then_some(converted)
}

/// The bound on |screened − f32 score| for rows of one dimension: for rows
/// q and g, `relative · ‖q‖₂‖g‖₂ + absolute · (‖q‖₂ + ‖g‖₂) + floor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScreenBound {
    relative: f64,
    absolute: f64,
    floor: f64,
}

impl ScreenBound {
    /// The bound for rows of `dim` values (docs/precision.md):
    /// - bf16 rounding of both factors: |q̂ĝ − qg| ≤ (2u + u²)|qg|, u = 2⁻⁸;
    /// - the screen's f32 accumulation of `dim` exact bf16 products, in any
    ///   order (the kernel's: pair after pair in one lane per column):
    ///   γ(dim + 16)(1 + u)² Σ|qg|;
    /// - the f32 GEMM's chain of `dim` fused multiply-adds: γ(dim) Σ|qg|,
    ///   with γ(n) = n·2⁻²⁴ / (1 − n·2⁻²⁴) and Σ|qg| ≤ ‖q‖‖g‖;
    /// - values flushed to zero by the conversion (below 2⁻¹²⁶):
    ///   2⁻¹²⁶ (‖q‖₁ + ‖g‖₁)(1 + u) ≤ 2⁻¹²⁶ √dim (‖q‖₂ + ‖g‖₂)(1 + u);
    /// - products and partial sums flushed by the instruction: under 2⁻¹²⁶
    ///   each, 2(dim + 16) of them at most.
    pub fn new(dim: usize) -> Self {
        let u = 2f64.powi(-8);
        let gamma = |n: usize| {
            let nu = n as f64 * 2f64.powi(-24);
            nu / (1.0 - nu)
        };
        let relative = 2.0 * u + u * u + gamma(dim + 16) * (1.0 + u) * (1.0 + u) + gamma(dim);
        // f64 rounding of the bound's own arithmetic and of the norms, with room.
        let slack = 1.0 + 1e-9;
        ScreenBound {
            relative: relative * slack,
            absolute: MIN_NORMAL * (dim as f64).sqrt() * (1.0 + u) * slack,
            floor: MIN_NORMAL * 2.0 * (dim as f64 + 16.0) * slack,
        }
    }

    /// The bound for rows with these L2 norms, rounded up to an f32.
    pub fn of(&self, q_norm: f64, g_norm: f64) -> f32 {
        let bound =
            self.relative * q_norm * g_norm + self.absolute * (q_norm + g_norm) + self.floor;
        round_up(bound)
    }

    /// Its main term: the bound is `relative · ‖q‖‖g‖` plus terms below 2⁻¹⁰⁰.
    pub fn relative(&self) -> f64 {
        self.relative
    }
}

/// The smallest f32 at least `x`.
fn round_up(x: f64) -> f32 {
    let y = x as f32;
    if (y as f64) < x {
        f32::from_bits(y.to_bits() + 1)
    } else {
        y
    }
}

/// The L2 norm of each row of `rows` (`dim` values each), in f64.
pub fn row_norms(rows: &[f32], dim: usize) -> Vec<f64> {
    rows.chunks_exact(dim.max(1))
        .map(|row| row.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt())
        .collect()
}

/// Whether [`screen_tile`] runs the AVX512_BF16 kernel on this CPU.
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Screened similarities: `out[i · ld_out + j]` ≈ ⟨q_i, g_j⟩ from bf16 rows
/// (`m` rows of `q`, `n` of `g`, `dim` values each), products accumulated
/// in f32 — by `vdpbf16ps` where the CPU has AVX512_BF16, else by the same
/// arithmetic in scalar code (slow: for tests and for checking the bound
/// anywhere). Within [`ScreenBound`] of the f32 GEMM's scores either way.
pub fn screen_tile(
    out: &mut [f32],
    ld_out: usize,
    q: &[u16],
    m: usize,
    g: &[u16],
    n: usize,
    dim: usize,
) {
    assert!(
        q.len() >= m * dim && g.len() >= n * dim,
        "rows shorter than their shapes"
    );
    assert!(
        m == 0 || n == 0 || out.len() >= (m - 1) * ld_out + n,
        "output shorter than its shape"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: the features were detected; the asserts bound every index.
        unsafe { avx512::screen_tile(out, ld_out, q, m, g, n, dim) };
        return;
    }
    screen_tile_scalar(out, ld_out, q, m, g, n, dim);
}

/// [`screen_tile`]'s arithmetic without the instruction: each column's
/// pairs of products added to an f32 sum in order, the odd dimension's
/// product first as `vdpbf16ps` adds them (each sum flushed below 2⁻¹²⁶ as
/// the instruction flushes).
pub fn screen_tile_scalar(
    out: &mut [f32],
    ld_out: usize,
    q: &[u16],
    m: usize,
    g: &[u16],
    n: usize,
    dim: usize,
) {
    let flush = |x: f32| {
        if (x.abs() as f64) < MIN_NORMAL {
            0.0
        } else {
            x
        }
    };
    for i in 0..m {
        let qi = &q[i * dim..(i + 1) * dim];
        for j in 0..n {
            let gj = &g[j * dim..(j + 1) * dim];
            let mut sum = 0.0f32;
            for (qp, gp) in qi.chunks(2).zip(gj.chunks(2)) {
                for (&a, &b) in qp.iter().zip(gp).rev() {
                    sum = flush(sum + flush(from_bf16(a) * from_bf16(b)));
                }
            }
            out[i * ld_out + j] = sum;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Gallery columns per panel: one register of 16 f32 lanes, each lane
    /// one column's dot product.
    const PANEL: usize = 16;
    /// Query rows and panels of the register block (16 accumulators).
    const BLOCK_ROWS: usize = 4;
    const BLOCK_PANELS: usize = 4;

    /// The tile as a small GEMM: the gallery rows packed into panels of 16
    /// columns (for each pair of dimensions, 16 columns' two values side by
    /// side, odd dimensions padded with a zero), the query rows as pairs
    /// broadcast to every lane; `vdpbf16ps` adds both products of a pair to
    /// each column's lane. Blocks of 4 rows × 64 columns keep 16
    /// accumulators in registers; each lane sums its pairs in order.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn screen_tile(
        out: &mut [f32],
        ld_out: usize,
        q: &[u16],
        m: usize,
        g: &[u16],
        n: usize,
        dim: usize,
    ) {
        if m == 0 || n == 0 {
            return;
        }
        let pairs = dim.div_ceil(2);
        let panels = n.div_ceil(PANEL);
        let mut packed = vec![0u32; panels * pairs * PANEL];
        for c in 0..n {
            let row = &g[c * dim..(c + 1) * dim];
            let base = (c / PANEL) * pairs * PANEL + c % PANEL;
            for p in 0..pairs {
                let high = row.get(2 * p + 1).copied().unwrap_or(0) as u32;
                packed[base + p * PANEL] = row[2 * p] as u32 | high << 16;
            }
        }
        let mut query_pairs = vec![0u32; m * pairs];
        for i in 0..m {
            let row = &q[i * dim..(i + 1) * dim];
            for p in 0..pairs {
                let high = row.get(2 * p + 1).copied().unwrap_or(0) as u32;
                query_pairs[i * pairs + p] = row[2 * p] as u32 | high << 16;
            }
        }
        let mut i = 0;
        while i < m {
            let rows = (m - i).min(BLOCK_ROWS);
            let mut panel = 0;
            while panel < panels {
                let count = (panels - panel).min(BLOCK_PANELS);
                block(
                    &query_pairs[i * pairs..(i + rows) * pairs],
                    rows,
                    &packed[panel * pairs * PANEL..(panel + count) * pairs * PANEL],
                    count,
                    pairs,
                    out,
                    ld_out,
                    i,
                    panel * PANEL,
                    n,
                );
                panel += count;
            }
            i += rows;
        }
    }

    /// `rows` (≤ 4) query rows × `count` (≤ 4) panels, written at row
    /// `row0` and column `col0` of `out` (columns from `n` on are not).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn block(
        query_pairs: &[u32],
        rows: usize,
        panels: &[u32],
        count: usize,
        pairs: usize,
        out: &mut [f32],
        ld_out: usize,
        row0: usize,
        col0: usize,
        n: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); BLOCK_PANELS]; BLOCK_ROWS];
        let qp = query_pairs.as_ptr();
        let pp = panels.as_ptr();
        if rows == BLOCK_ROWS && count == BLOCK_PANELS {
            for p in 0..pairs {
                let b: [__m512bh; BLOCK_PANELS] = std::array::from_fn(|j| {
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        pp.add((j * pairs + p) * PANEL) as *const _,
                    ))
                });
                for (r, acc_row) in acc.iter_mut().enumerate() {
                    let a = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                        *qp.add(r * pairs + p) as i32,
                    ));
                    for (j, lane) in acc_row.iter_mut().enumerate() {
                        *lane = _mm512_dpbf16_ps(*lane, a, b[j]);
                    }
                }
            }
        } else {
            for p in 0..pairs {
                for r in 0..rows {
                    let a = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                        *qp.add(r * pairs + p) as i32,
                    ));
                    for j in 0..count {
                        let b = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                            pp.add((j * pairs + p) * PANEL) as *const _,
                        ));
                        acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a, b);
                    }
                }
            }
        }
        for (r, acc_row) in acc.iter().enumerate().take(rows) {
            for (j, lane) in acc_row.iter().enumerate().take(count) {
                let col = col0 + j * PANEL;
                let valid = (n - col).min(PANEL);
                let mask: __mmask16 = if valid == PANEL {
                    0xffff
                } else {
                    (1u16 << valid) - 1
                };
                let dst = out.as_mut_ptr().add((row0 + r) * ld_out + col);
                _mm512_mask_storeu_ps(dst, mask, *lane);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_rounds_to_nearest_even_and_flushes_denormals() {
        // 1 + 2⁻⁸ is halfway between bf16 1 and 1 + 2⁻⁷: ties to even (1).
        assert_eq!(from_bf16(to_bf16(1.0 + 2f32.powi(-8))), 1.0);
        // 1 + 3·2⁻⁸ is halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶: even is 1 + 2⁻⁶.
        assert_eq!(
            from_bf16(to_bf16(1.0 + 3.0 * 2f32.powi(-8))),
            1.0 + 2f32.powi(-6)
        );
        // Just above halfway rounds up.
        let above = f32::from_bits((1.0f32 + 2f32.powi(-8)).to_bits() + 1);
        assert_eq!(from_bf16(to_bf16(above)), 1.0 + 2f32.powi(-7));
        assert_eq!(to_bf16(1e-39), 0);
        assert_eq!(to_bf16(-1e-39), 0x8000);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert!(convert_rows(&[1.0, f32::MAX]).is_none());
        assert!(convert_rows(&[1.0, -2.5e38]).is_some());
        // Relative error of every normal value is at most 2⁻⁸ (checked over a sweep).
        let mut x = 1e-37f32;
        while x < 1e37 {
            let r = from_bf16(to_bf16(x)) as f64;
            assert!(((r - x as f64) / x as f64).abs() <= 2f64.powi(-8), "{x}");
            x *= 1.000_37;
        }
    }

    #[test]
    fn the_instruction_and_its_scalar_model_agree_within_the_bound() {
        let dim = 77;
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let q: Vec<f32> = (0..3 * dim).map(|_| next()).collect();
        let g: Vec<f32> = (0..5 * dim).map(|_| next()).collect();
        let (qb, gb) = (convert_rows(&q).unwrap(), convert_rows(&g).unwrap());
        let mut fast = vec![0.0; 15];
        let mut slow = vec![0.0; 15];
        screen_tile(&mut fast, 5, &qb, 3, &gb, 5, dim);
        screen_tile_scalar(&mut slow, 5, &qb, 3, &gb, 5, dim);
        let bound = ScreenBound::new(dim);
        let (qn, gn) = (row_norms(&q, dim), row_norms(&g, dim));
        for i in 0..3 {
            for j in 0..5 {
                let e = bound.of(qn[i], gn[j]);
                // Both approximate the same exact bf16 dot product.
                assert!((fast[i * 5 + j] - slow[i * 5 + j]).abs() <= e, "{i},{j}");
            }
        }
    }
}

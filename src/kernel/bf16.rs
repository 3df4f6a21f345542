//! The bf16 screen: similarities computed from bf16 copies of the
//! embeddings (products accumulated in f32, `vdpbf16ps` on AVX512_BF16),
//! with a proven bound on how far they can be from the f32 GEMM's scores.
//! A search keeps every item the bound cannot rule out of its top-k and
//! re-scores only those in f32 ([`super::gemm::TileScorer`]), so that its
//! lists and scores are the f32 path's exactly. docs/precision.md derives
//! the bound; `tests` below and tests/screen.rs try to break it.
//!
//! Conversion rounds to nearest, ties to even, and flushes values below
//! f32's normal range to zero itself, so the instruction's denormals-are-zero
//! rule never meets a denormal input. Values that would round beyond bf16's
//! range are refused ([`convert_rows`] returns `None`): such a block is
//! searched in f32 only.
//!
//! The kernel reads packed copies: query rows as pairs of bf16 values (one
//! u32 per pair of dimensions, [`pack_query_rows`]) and gallery rows in
//! panels of 16 columns ([`pack_gallery_panels`]), made once per block.

use rayon::prelude::*;

/// The smallest positive normal f32 (and bf16): 2⁻¹²⁶.
const MIN_NORMAL: f64 = 1.1754943508222875e-38;

/// Gallery columns per packed panel: one register of 16 f32 lanes, each
/// lane one column's dot product.
pub const PANEL: usize = 16;

/// `x` in bf16 (the upper 16 bits of an f32), rounded to nearest with ties
/// to even; values below 2⁻¹²⁶ in magnitude become a zero of their sign.
/// A NaN stays a (quiet) NaN; a value that rounds past bf16's largest
/// finite one becomes infinite. Branch-free, so that loops vectorise.
#[inline(always)]
pub fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let magnitude = bits & 0x7fff_ffff;
    let upper = (bits >> 16) as u16;
    let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
    if magnitude > 0x7f80_0000 {
        upper | 0x0040
    } else if magnitude < 0x0080_0000 {
        upper & 0x8000
    } else {
        rounded
    }
}

/// The f32 value of a bf16.
#[inline]
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Whether a bf16 is finite (not an infinity or NaN).
#[inline]
fn finite_bf16(h: u16) -> bool {
    h & 0x7f80 != 0x7f80
}

/// `rows` (row-major f32) in bf16, or `None` when a value is not finite
/// in bf16 (it rounds past bf16's range, or was not finite).
pub fn convert_rows(rows: &[f32]) -> Option<Vec<u16>> {
    let converted: Vec<u16> = rows.iter().map(|&x| to_bf16(x)).collect();
    converted
        .iter()
        .all(|&h| finite_bf16(h))
        .then_some(converted)
}

/// A value the packers take: an f32 (rounded by [`to_bf16`]) or a bf16.
pub trait Bf16Value: Copy + Send + Sync {
    /// The value in bf16.
    fn bf16(self) -> u16;
    /// The value itself.
    fn value(self) -> f32;
    /// Packs one row of this type into bf16 pairs and returns its norms.
    fn pack_row(row: &[Self], out: &mut [u32]) -> RowNorms;
}

impl Bf16Value for f32 {
    fn pack_row(row: &[f32], out: &mut [u32]) -> RowNorms {
        pack_f32_row(row, out)
    }
    #[inline(always)]
    fn bf16(self) -> u16 {
        to_bf16(self)
    }
    #[inline(always)]
    fn value(self) -> f32 {
        self
    }
}

impl Bf16Value for u16 {
    fn pack_row(row: &[u16], out: &mut [u32]) -> RowNorms {
        pack_row(row, out)
    }
    #[inline(always)]
    fn bf16(self) -> u16 {
        self
    }
    #[inline(always)]
    fn value(self) -> f32 {
        from_bf16(self)
    }
}

/// One row in pairs of bf16 as `vdpbf16ps` reads them (the even dimension
/// in the low half, the odd one in the high, 0 past the end) into `out`
/// (⌈dim/2⌉ slots), and the row's [`RowNorms`].
#[inline(always)]
fn pack_row<T: Bf16Value>(row: &[T], out: &mut [u32]) -> RowNorms {
    // Lane-wise f64 sums (any order is within the bound's room), so that
    // the loop vectorises.
    const WIDTH: usize = 16;
    let mut sums = [[0f64; WIDTH]; 3];
    let mut add = |l: usize, x: f32, h: u16| {
        let (x, r) = (x as f64, from_bf16(h) as f64);
        // Products of f32 values and differences of an f32 and its
        // rounding are exact in f64.
        sums[0][l] += x * x;
        sums[1][l] += (x - r) * (x - r);
        sums[2][l] += r * r;
    };
    let full = row.len() / WIDTH * WIDTH;
    for (values, out) in row[..full]
        .chunks_exact(WIDTH)
        .zip(out.chunks_exact_mut(WIDTH / 2))
    {
        let mut h = [0u16; WIDTH];
        for l in 0..WIDTH {
            h[l] = values[l].bf16();
            add(l, values[l].value(), h[l]);
        }
        for (p, slot) in out.iter_mut().enumerate() {
            *slot = h[2 * p] as u32 | (h[2 * p + 1] as u32) << 16;
        }
    }
    for (l, values) in row[full..].chunks(2).enumerate() {
        let h: [u16; 2] = std::array::from_fn(|i| values.get(i).map_or(0, |v| v.bf16()));
        for (i, v) in values.iter().enumerate() {
            add(i, v.value(), h[i]);
        }
        out[full / 2 + l] = h[0] as u32 | (h[1] as u32) << 16;
    }
    let total = |sums: &[f64; WIDTH]| sums.iter().sum::<f64>().sqrt();
    RowNorms {
        norm: total(&sums[0]),
        rounding: total(&sums[1]),
        rounded: total(&sums[2]),
    }
}

super::dispatch::dispatched! {
    fn pack_f32_row(row: &[f32], out: &mut [u32]) -> RowNorms = pack_row::<f32>;
}

/// Rows (of `dim` values) packed for the kernel as query rows: row after
/// row, ⌈dim/2⌉ pairs each; and each row's norms.
pub fn pack_query_rows<T: Bf16Value>(rows: &[T], dim: usize) -> (Vec<u32>, Vec<RowNorms>) {
    let mut packed = (Vec::new(), Vec::new());
    pack_query_rows_into(rows, dim, &mut packed);
    packed
}

/// [`pack_query_rows`] into the buffers of `packed` (reused, not zeroed
/// first: every slot is written).
pub fn pack_query_rows_into<T: Bf16Value>(
    rows: &[T],
    dim: usize,
    (packed, norms): &mut (Vec<u32>, Vec<RowNorms>),
) {
    let pairs = dim.div_ceil(2);
    let n = rows.len() / dim.max(1);
    // What the buffers hold stays (every slot is written below), so a
    // block's buffer reused for the next one is not faulted in again.
    packed.resize(n * pairs, 0);
    norms.resize(n, RowNorms::default());
    packed
        .par_chunks_mut(pairs.max(1))
        .zip(rows.par_chunks(dim.max(1)))
        .zip(norms)
        .with_min_len(64)
        .for_each(|((out, row), norms)| *norms = T::pack_row(row, out));
}

/// Rows (of `dim` values) packed for the kernel as gallery columns: panels
/// of 16 columns; within a panel, for each pair of dimensions, the 16
/// columns' pairs side by side (columns past the last row are zeros); and
/// each row's norms.
pub fn pack_gallery_panels<T: Bf16Value>(rows: &[T], dim: usize) -> (Vec<u32>, Vec<RowNorms>) {
    let mut packed = (Vec::new(), Vec::new());
    pack_gallery_panels_into(rows, dim, &mut packed);
    packed
}

/// [`pack_gallery_panels`] into the buffers of `packed` (reused, not zeroed
/// first: every slot is written).
pub fn pack_gallery_panels_into<T: Bf16Value>(
    rows: &[T],
    dim: usize,
    (packed, norms): &mut (Vec<u32>, Vec<RowNorms>),
) {
    let pairs = dim.div_ceil(2);
    let n = rows.len() / dim.max(1);
    packed.resize(n.div_ceil(PANEL) * pairs * PANEL, 0);
    norms.resize(n, RowNorms::default());
    packed
        .par_chunks_mut(pairs.max(1) * PANEL)
        .zip(rows.par_chunks(dim.max(1) * PANEL))
        .zip(norms.par_chunks_mut(PANEL))
        .with_min_len(4)
        .for_each(|((panel, rows), norms)| {
            let columns = rows.len() / dim.max(1);
            if columns < PANEL {
                panel.fill(0);
            }
            let mut row_pairs = vec![0u32; pairs];
            for (c, (row, norms)) in rows.chunks_exact(dim).zip(norms).enumerate() {
                *norms = T::pack_row(row, &mut row_pairs);
                for (p, &v) in row_pairs.iter().enumerate() {
                    panel[p * PANEL + c] = v;
                }
            }
        });
}

/// Whether every bf16 of packed rows is finite: `false` when a value
/// rounded past bf16's range (or was not finite), and the rows cannot be
/// screened.
pub fn packed_finite(packed: &[u32]) -> bool {
    packed.par_chunks(1 << 16).all(|chunk| {
        chunk
            .iter()
            .all(|&v| finite_bf16(v as u16) && finite_bf16((v >> 16) as u16))
    })
}

/// The norms of one row that the bound needs: ‖x‖₂, the norm of its
/// conversion error ‖x − x̂‖₂ (flushed values included) and ‖x̂‖₂, in f64.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowNorms {
    pub norm: f64,
    pub rounding: f64,
    pub rounded: f64,
}

impl RowNorms {
    /// The largest of each norm over `rows`: the bound of any of them.
    pub fn max_of(rows: &[RowNorms]) -> RowNorms {
        rows.iter().fold(RowNorms::default(), |a, b| RowNorms {
            norm: a.norm.max(b.norm),
            rounding: a.rounding.max(b.rounding),
            rounded: a.rounded.max(b.rounded),
        })
    }
}

/// [`RowNorms`] of each row of `rows` (`dim` values each).
pub fn row_norms(rows: &[f32], dim: usize) -> Vec<RowNorms> {
    pack_query_rows(rows, dim).1
}

/// The bound on |screened − f32 score| for rows of one dimension, from
/// the rows' [`RowNorms`]: ‖q‖‖g − ĝ‖ + ‖q − q̂‖‖ĝ‖ + γ(d + 16)‖q̂‖‖ĝ‖ +
/// γ(d)‖q‖‖g‖ + 2⁻¹²⁶·2(d + 16).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScreenBound {
    dim: usize,
    screen_sum: f64,
    gemm_sum: f64,
    floor: f64,
}

impl ScreenBound {
    /// The bound for rows of `dim` values (docs/precision.md):
    /// - the conversion: |q·g − q̂·ĝ| = |q·(g − ĝ) + (q − q̂)·ĝ| ≤
    ///   ‖q‖‖g − ĝ‖ + ‖q − q̂‖‖ĝ‖ (Cauchy–Schwarz; ≤ (2u + u²)‖q‖‖g‖, u = 2⁻⁸);
    /// - the screen's f32 accumulation of `dim` exact bf16 products, in any
    ///   order: γ(dim + 16) Σ|q̂ĝ| ≤ γ(dim + 16)‖q̂‖‖ĝ‖;
    /// - the f32 GEMM's chain of `dim` fused multiply-adds: γ(dim)‖q‖‖g‖,
    ///   with γ(n) = n·2⁻²⁴ / (1 − n·2⁻²⁴);
    /// - products and partial sums flushed by the instruction: under 2⁻¹²⁶
    ///   each, 2(dim + 16) of them at most.
    pub fn new(dim: usize) -> Self {
        let gamma = |n: usize| {
            let nu = n as f64 * 2f64.powi(-24);
            nu / (1.0 - nu)
        };
        ScreenBound {
            dim,
            screen_sum: gamma(dim + 16),
            gemm_sum: gamma(dim),
            floor: MIN_NORMAL * 2.0 * (dim as f64 + 16.0),
        }
    }

    /// The bound for rows with these norms (or for any rows whose norms
    /// are at most these), with room for the f64 rounding of the norms and
    /// of this arithmetic.
    #[inline]
    pub fn of(&self, q: &RowNorms, g: &RowNorms) -> f64 {
        let bound = q.norm * g.rounding
            + q.rounding * g.rounded
            + self.screen_sum * q.rounded * g.rounded
            + self.gemm_sum * q.norm * g.norm
            + self.floor;
        bound * (1.0 + 1e-9)
    }

    /// The bound's worst case for rows of these L2 norms: each value
    /// rounded by u = 2⁻⁸ of itself or flushed (under 2⁻¹²⁶), so
    /// ‖x − x̂‖ ≤ u‖x‖ + 2⁻¹²⁶√d; the conversion term is then about
    /// (2u + u²)‖q‖‖g‖.
    pub fn worst_case(&self, q_norm: f64, g_norm: f64) -> f64 {
        let u = 2f64.powi(-8);
        let flushed = MIN_NORMAL * (self.dim as f64).sqrt();
        let worst = |norm: f64| RowNorms {
            norm,
            rounding: u * norm + flushed,
            rounded: (1.0 + u) * norm,
        };
        self.of(&worst(q_norm), &worst(g_norm))
    }
}

/// Whether the screen may run in this process: on AVX512_BF16, or in
/// scalar code once [`allow_scalar_screen`] was called.
pub fn screen_available() -> bool {
    has_avx512_bf16() || SCALAR_SCREEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// Lets `--precision screened` and `auto` screen on a CPU without
/// AVX512_BF16, by the same arithmetic in scalar code ([`screen_packed`]'s
/// fallback): slower than the f32 path, and meant for testing the screened
/// path anywhere (the command line's `HUBNORM_SCALAR_SCREEN=1`). The lists
/// and scores are the exact search's either way.
pub fn allow_scalar_screen() {
    SCALAR_SCREEN.store(true, std::sync::atomic::Ordering::Relaxed);
}

static SCALAR_SCREEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether [`screen_packed`] runs the AVX512_BF16 kernel on this CPU.
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

/// Screened similarities of unpacked bf16 rows (`m` rows of `q`, `n` of
/// `g`, `dim` values each): packs them and runs [`screen_packed`].
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
    let (q, _) = pack_query_rows(&q[..m * dim], dim);
    let (g, _) = pack_gallery_panels(&g[..n * dim], dim);
    screen_packed(out, ld_out, &q, m, &g, n, dim);
}

/// Screened similarities: `out[i · ld_out + j]` ≈ ⟨q_i, g_j⟩ for the `m`
/// packed query rows `q` ([`pack_query_rows`]) and the `n` packed gallery
/// columns `g` ([`pack_gallery_panels`]; the slice starts on a panel),
/// products accumulated in f32 — by `vdpbf16ps` where the CPU has
/// AVX512_BF16, else by the same arithmetic in scalar code (slow: for
/// tests and for checking the bound anywhere). Within [`ScreenBound`] of
/// the f32 GEMM's scores either way.
pub fn screen_packed(
    out: &mut [f32],
    ld_out: usize,
    q: &[u32],
    m: usize,
    g: &[u32],
    n: usize,
    dim: usize,
) {
    let pairs = dim.div_ceil(2);
    assert!(
        q.len() >= m * pairs && g.len() >= n.div_ceil(PANEL) * pairs * PANEL,
        "packed rows shorter than their shapes"
    );
    assert!(
        m == 0 || n == 0 || out.len() >= (m - 1) * ld_out + n,
        "output shorter than its shape"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: the features were detected; the asserts bound every index.
        unsafe { avx512::screen_packed(out, ld_out, q, m, g, n, pairs) };
        return;
    }
    screen_packed_scalar(out, ld_out, q, m, g, n, pairs);
}

/// [`screen_packed`]'s arithmetic without the instruction: each column's
/// pairs of products added to an f32 sum in order, the odd dimension's
/// product first as `vdpbf16ps` adds them (each sum flushed below 2⁻¹²⁶ as
/// the instruction flushes).
pub fn screen_packed_scalar(
    out: &mut [f32],
    ld_out: usize,
    q: &[u32],
    m: usize,
    g: &[u32],
    n: usize,
    pairs: usize,
) {
    let flush = |x: f32| {
        if (x.abs() as f64) < MIN_NORMAL {
            0.0
        } else {
            x
        }
    };
    let halves = |v: u32| [from_bf16(v as u16), from_bf16((v >> 16) as u16)];
    for i in 0..m {
        let qi = &q[i * pairs..(i + 1) * pairs];
        for j in 0..n {
            let panel = &g[(j / PANEL) * pairs * PANEL..];
            let mut sum = 0.0f32;
            for (p, &qp) in qi.iter().enumerate() {
                let (a, b) = (halves(qp), halves(panel[p * PANEL + j % PANEL]));
                for h in [1, 0] {
                    sum = flush(sum + flush(a[h] * b[h]));
                }
            }
            out[i * ld_out + j] = sum;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::PANEL;
    use std::arch::x86_64::*;

    /// Query rows and gallery panels of the register block: 8 × 2 = 16
    /// accumulators, 2 panel loads and 8 broadcasts per pair of dimensions.
    const BLOCK_ROWS: usize = 8;
    const BLOCK_PANELS: usize = 2;

    /// The tile as a small GEMM: for each group of panels (its packed
    /// values stay in L1 for every query row of the tile), the query rows in
    /// blocks; each query pair is broadcast to every lane and `vdpbf16ps`
    /// adds both products of the pair to each column's lane, pair after
    /// pair in order.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn screen_packed(
        out: &mut [f32],
        ld_out: usize,
        q: &[u32],
        m: usize,
        g: &[u32],
        n: usize,
        pairs: usize,
    ) {
        let panels = n.div_ceil(PANEL);
        let mut panel = 0;
        while panel < panels {
            let count = (panels - panel).min(BLOCK_PANELS);
            let b = &g[panel * pairs * PANEL..(panel + count) * pairs * PANEL];
            let col0 = panel * PANEL;
            let mut i = 0;
            if count == BLOCK_PANELS {
                while i + BLOCK_ROWS <= m {
                    let a = &q[i * pairs..(i + BLOCK_ROWS) * pairs];
                    block::<BLOCK_ROWS, BLOCK_PANELS>(a, b, pairs, out, ld_out, i, col0, n);
                    i += BLOCK_ROWS;
                }
            }
            // The edges, one row and one panel at a time.
            for row in i..m {
                let a = &q[row * pairs..(row + 1) * pairs];
                for j in 0..count {
                    let b = &b[j * pairs * PANEL..(j + 1) * pairs * PANEL];
                    block::<1, 1>(a, b, pairs, out, ld_out, row, col0 + j * PANEL, n);
                }
            }
            panel += count;
        }
    }

    /// `R` query rows (`a`, packed) × `P` panels (`b`), written at row
    /// `row0` and column `col0` of `out` (columns from `n` on are not).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn block<const R: usize, const P: usize>(
        a: &[u32],
        b: &[u32],
        pairs: usize,
        out: &mut [f32],
        ld_out: usize,
        row0: usize,
        col0: usize,
        n: usize,
    ) {
        debug_assert!(a.len() >= R * pairs && b.len() >= P * pairs * PANEL);
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        for p in 0..pairs {
            let panel: [__m512bh; P] = std::array::from_fn(|j| {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    bp.add((j * pairs + p) * PANEL) as *const _,
                ))
            });
            for (r, acc_row) in acc.iter_mut().enumerate() {
                let x = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                    *ap.add(r * pairs + p) as i32,
                ));
                for (lane, y) in acc_row.iter_mut().zip(&panel) {
                    *lane = _mm512_dpbf16_ps(*lane, x, *y);
                }
            }
        }
        for (r, acc_row) in acc.iter().enumerate() {
            for (j, lane) in acc_row.iter().enumerate() {
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
        let (qp, gp) = (pack_query_rows(&qb, dim).0, pack_gallery_panels(&gb, dim).0);
        screen_packed_scalar(&mut slow, 5, &qp, 3, &gp, 5, dim.div_ceil(2));
        let bound = ScreenBound::new(dim);
        let (qn, gn) = (row_norms(&q, dim), row_norms(&g, dim));
        for i in 0..3 {
            for j in 0..5 {
                let e = bound.of(&qn[i], &gn[j]);
                // Both approximate the same exact bf16 dot product.
                assert!(
                    ((fast[i * 5 + j] - slow[i * 5 + j]).abs() as f64) <= e,
                    "{i},{j}"
                );
            }
        }
    }

    #[test]
    fn packing_into_used_buffers_gives_fresh_copies() {
        let dim = 37;
        let rows = |n: usize, salt: f32| -> Vec<f32> {
            (0..n * dim)
                .map(|i| ((i as f32 + salt) * 0.37).sin())
                .collect()
        };
        // A full block, then a shorter one whose last panel is part empty
        // (its padding must be zeros again), then a longer one.
        let (mut queries, mut gallery) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
        for (n, salt) in [(64, 1.0), (21, 2.0), (80, 3.0)] {
            let block = rows(n, salt);
            pack_query_rows_into(&block, dim, &mut queries);
            assert_eq!(queries, pack_query_rows(&block, dim), "{n} query rows");
            pack_gallery_panels_into(&block, dim, &mut gallery);
            assert_eq!(
                gallery,
                pack_gallery_panels(&block, dim),
                "{n} gallery rows"
            );
        }
    }
}

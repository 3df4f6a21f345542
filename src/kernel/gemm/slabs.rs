//! hubnorm's own AVX-512 micro-kernel for the exact passes' tiles: a tile
//! computed one slab of rows × columns at a time, with the bits the `gemm`
//! crate gives the whole tile.
//!
//! Why not the crate: a pass-1 tile is 2048 bank rows × 512 gallery columns
//! and a pass-2 tile 512 queries × 2048 gallery columns, and their epilogues
//! (the log-sum-exp fold, the top-k lists) read a tile back after the crate
//! has written all of it: 4 MiB, beyond the L2 cache. Here the callers ask
//! for 128 rows × at most 512 columns at a time and fold them while they are
//! in L2. The columns are packed once for all the rows that pass them (a
//! pass-1 strip's bank block, a pass-2 strip's 512 queries); the rows are
//! read in place, one stream each.
//!
//! Bits: every element is, as in the crate ([`super::TileScorer`]), a chain
//! of fused multiply-adds from +0 over each depth block of `kc` dimensions,
//! the blocks' sums added to the element in order. The depth block is the
//! process's ([`super::slab_depth`]), passed in by the caller, so a slab's
//! elements equal the whole tile's (`tests::slabs_are_the_gemm_crates_tiles`).
//!
//! The micro-kernel keeps [`ROWS`] × [`VECTORS`] accumulators (8 rows × 48
//! columns, 24 of the 32 vector registers): per dimension, 3 vector loads of
//! packed columns and 8 broadcasts of row values feed 24 fused
//! multiply-adds. Measured on Zen 4 (`examples/slab_speed.rs`, one thread,
//! 2048 × 512 tiles): 8 × 48 at 111 GFLOP/s at d = 384 and 110 at d = 768,
//! 6 × 64 at 110 and 107–109, 12 × 32 at 110–111 and 109, against the
//! crate's 108 and 104; packing the rows as well cost 3% more.

use std::arch::x86_64::*;

/// Rows of the micro-kernel (the broadcast side: bank rows or queries).
const ROWS: usize = 8;
/// 16-lane vectors of columns of the micro-kernel (gallery items).
const VECTORS: usize = 3;
const LANES: usize = 16;
/// Columns of one packed panel.
const PANEL: usize = VECTORS * LANES;

/// A 64-byte aligned f32 buffer.
#[derive(Debug, Default)]
struct Aligned {
    data: Vec<f32>,
    offset: usize,
}

impl Aligned {
    /// `len` zeroed floats starting on a 64-byte boundary.
    fn zeroed(&mut self, len: usize) -> &mut [f32] {
        self.data.clear();
        self.data.resize(len + LANES, 0.0);
        self.offset = self.data.as_ptr().align_offset(64).min(LANES);
        &mut self.data[self.offset..self.offset + len]
    }

    fn as_ptr(&self) -> *const f32 {
        self.data[self.offset..].as_ptr()
    }
}

/// The columns of the tiles to come (a pass-1 strip, a 512-column piece of
/// a pass-2 tile), packed for the micro-kernel. Made only by
/// [`SlabTiles::new`], which checks the CPU (no `Default`).
#[derive(Debug)]
pub struct SlabTiles {
    /// Panels of [`PANEL`] columns (the last one a multiple of 16, zero
    /// padded), each `dim` × its width, dimension-major.
    cols: Aligned,
    n: usize,
    dim: usize,
}

impl SlabTiles {
    /// A kernel with no columns yet, or `None` without AVX-512 (the caller
    /// then uses [`super::similarity_tile`]).
    pub fn new() -> Option<SlabTiles> {
        crate::kernel::dispatch::has_avx512().then(|| SlabTiles {
            cols: Aligned::default(),
            n: 0,
            dim: 0,
        })
    }

    /// Packs the `n` rows of `cols` (row-major, `dim` wide) as the columns
    /// of the tiles to come, in the buffer of the previous columns.
    ///
    /// # Panics
    /// When `cols` is shorter than `n · dim`.
    pub fn pack_columns(&mut self, cols: &[f32], n: usize, dim: usize) {
        assert!(cols.len() >= n * dim, "columns shorter than their shape");
        let padded = n.next_multiple_of(LANES);
        (self.n, self.dim) = (n, dim);
        let packed = self.cols.zeroed(padded * dim);
        for p0 in (0..padded).step_by(PANEL) {
            let width = PANEL.min(padded - p0);
            let panel = &mut packed[p0 * dim..(p0 + width) * dim];
            for j in p0..(p0 + width).min(n) {
                let col = &cols[j * dim..(j + 1) * dim];
                for (k, &x) in col.iter().enumerate() {
                    panel[k * width + j - p0] = x;
                }
            }
        }
    }

    /// Writes `out[i · ld + j] = ⟨rows_i, cols_j⟩` for the `m` rows of
    /// `rows` and every column, in depth blocks of `kc` (the `gemm` crate's
    /// for the tile the caller cuts these rows from).
    ///
    /// # Panics
    /// When a slice is shorter than its shape says, `ld` is smaller than the
    /// column count, or `kc` is 0.
    pub fn slab(&self, out: &mut [f32], ld: usize, rows: &[f32], m: usize, kc: usize) {
        let (n, dim) = (self.n, self.dim);
        if m == 0 || n == 0 {
            return;
        }
        assert!(kc > 0, "an empty depth block");
        assert!(ld >= n, "output stride {ld} is smaller than the width {n}");
        assert!(rows.len() >= m * dim, "rows shorter than their shape");
        assert!(
            out.len() >= (m - 1) * ld + n,
            "output shorter than its shape"
        );
        // SAFETY: AVX-512F was detected in `new`; the asserts above and
        // `pack_columns` bound every offset the loops form.
        unsafe { slab_avx512(self, rows.as_ptr(), out.as_mut_ptr(), ld, m, kc) };
    }
}

/// The micro-kernel over a slab: for each depth block, each block of
/// [`ROWS`] rows (whose values stay in L1 while it runs), each panel of
/// packed columns (streamed from L2).
///
/// # Safety
/// AVX-512F must be available; `a` must hold `m` rows of `tiles.dim`
/// floats, `out` `(m - 1) · ld + tiles.n` floats.
#[target_feature(enable = "avx512f")]
unsafe fn slab_avx512(
    tiles: &SlabTiles,
    a: *const f32,
    out: *mut f32,
    ld: usize,
    m: usize,
    kc: usize,
) {
    let (n, dim) = (tiles.n, tiles.dim);
    let padded = n.next_multiple_of(LANES);
    let b = tiles.cols.as_ptr();
    let mut k0 = 0;
    while k0 < dim {
        let depth = kc.min(dim - k0);
        for b0 in (0..m).step_by(ROWS) {
            let height = ROWS.min(m - b0);
            let a_block = a.add(b0 * dim + k0);
            for p0 in (0..padded).step_by(PANEL) {
                let width = PANEL.min(padded - p0);
                let vectors = width / LANES;
                let valid = n - p0 - (vectors - 1) * LANES;
                let last_mask: __mmask16 = if valid >= LANES {
                    !0
                } else {
                    (1u16 << valid) - 1
                };
                let block = Block {
                    a: a_block,
                    lda: dim,
                    b: b.add(p0 * dim + k0 * width),
                    depth,
                    c: out.add(b0 * ld + p0),
                    ld,
                    last_mask,
                    add: k0 > 0,
                };
                dispatch_shape(height, vectors, &block);
            }
        }
        k0 += depth;
    }
}

/// One call of the micro-kernel: `depth` dimensions of a block of rows
/// (`a`, rows `lda` apart) × a panel of columns (packed `b`), stored to
/// (or, after the first depth block, added to) `c`.
struct Block {
    a: *const f32,
    lda: usize,
    b: *const f32,
    depth: usize,
    c: *mut f32,
    ld: usize,
    /// The columns of the panel's last vector that exist.
    last_mask: __mmask16,
    add: bool,
}

/// Runs the micro-kernel instance for a block of `height` rows and a panel
/// of `vectors` vectors (full ones are [`ROWS`] × [`VECTORS`]; the slab's
/// last rows and the strip's last columns take smaller ones).
#[inline(always)]
unsafe fn dispatch_shape(height: usize, vectors: usize, block: &Block) {
    macro_rules! shapes {
        ($($r:literal),*) => {
            match height {
                $(
                    $r => match vectors {
                        1 => micro::<$r, 1>(block),
                        2 => micro::<$r, 2>(block),
                        _ => micro::<$r, 3>(block),
                    },
                )*
                _ => unreachable!("blocks have 1 to {ROWS} rows"),
            }
        };
    }
    const _: () = assert!(
        ROWS == 8 && VECTORS == 3,
        "the lists below name every shape"
    );
    shapes!(1, 2, 3, 4, 5, 6, 7, 8)
}

/// `R` rows × `V` vectors of columns: per dimension, `V` loads and `R`
/// broadcasts feed `R · V` independent chains of fused multiply-adds.
#[inline(always)]
unsafe fn micro<const R: usize, const V: usize>(block: &Block) {
    let b = block.b;
    let rows: [*const f32; R] = std::array::from_fn(|i| block.a.add(i * block.lda));
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for k in 0..block.depth {
        let cols: [__m512; V] =
            std::array::from_fn(|v| _mm512_load_ps(b.add(k * V * LANES + v * LANES)));
        for (i, acc) in acc.iter_mut().enumerate() {
            let row = _mm512_set1_ps(*rows[i].add(k));
            for v in 0..V {
                acc[v] = _mm512_fmadd_ps(row, cols[v], acc[v]);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (v, &sum) in acc.iter().enumerate() {
            let mask = if v == V - 1 { block.last_mask } else { !0 };
            let c = block.c.add(i * block.ld + v * LANES);
            let value = if block.add {
                _mm512_add_ps(_mm512_maskz_loadu_ps(mask, c), sum)
            } else {
                sum
            };
            _mm512_mask_storeu_ps(c, mask, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{similarity_tile, slab_depth};
    use super::*;

    /// `count` seeded values of both signs and of magnitudes from 1e-20 to
    /// 1.5, so that another summation order would show in the last bits.
    fn values(count: usize, seed: u64) -> Vec<f32> {
        let mut next = super::super::tests::mixed_magnitudes(seed);
        (0..count).map(|_| next()).collect()
    }

    /// Slabs of rows × pieces of columns cut from tiles of pass 1's and
    /// pass 2's shapes and of edge shapes (rows and columns not multiples
    /// of the micro-kernel's, a last partial vector), at dimensions on both
    /// sides of the depth blocks, equal the `gemm` crate's whole tile bit
    /// for bit; cells beyond a piece's width stay untouched.
    #[test]
    #[allow(clippy::print_stderr)] // a skipped test says so
    fn slabs_are_the_gemm_crates_tiles() {
        if SlabTiles::new().is_none() {
            eprintln!("SKIPPED: no AVX-512 here");
            return;
        }
        let (slab_rows, piece_cols) = (128, 512);
        let shapes = [
            (2048, 512),
            (512, 2048),
            (300, 448),
            (131, 77),
            (70, 65),
            (17, 300),
        ];
        let mut checked = 0;
        for (seed, &(m, n)) in shapes.iter().enumerate() {
            for dim in [3, 384, 511, 513, 768, 1000] {
                let a = values(m * dim, 2 * seed as u64 + 1);
                let b = values(n * dim, 2 * seed as u64 + 2);
                let ld = n + 5;
                let mut whole = vec![f32::NAN; m * ld];
                similarity_tile(&mut whole, ld, &a, m, &b, n, dim);
                let kc = slab_depth(dim).expect("a micro-kernel tile");
                let mut tiles = SlabTiles::new().expect("AVX-512");
                for p0 in (0..n).step_by(piece_cols) {
                    let p1 = (p0 + piece_cols).min(n);
                    tiles.pack_columns(&b[p0 * dim..p1 * dim], p1 - p0, dim);
                    for g0 in (0..m).step_by(slab_rows) {
                        let g1 = (g0 + slab_rows).min(m);
                        let mut slab = vec![f32::NAN; slab_rows * ld];
                        tiles.slab(&mut slab, ld, &a[g0 * dim..g1 * dim], g1 - g0, kc);
                        for i in g0..g1 {
                            let got = &slab[(i - g0) * ld..(i - g0 + 1) * ld];
                            let expected = &whole[i * ld + p0..i * ld + p1];
                            for (j, (x, y)) in got.iter().zip(expected).enumerate() {
                                assert_eq!(
                                    x.to_bits(),
                                    y.to_bits(),
                                    "{m}×{n}, dim {dim}, cell ({i}, {}): {x} vs {y}",
                                    p0 + j
                                );
                            }
                            let beyond = &got[p1 - p0..];
                            assert!(beyond.iter().all(|x| x.is_nan()), "cells beyond written");
                            checked += p1 - p0;
                        }
                    }
                }
            }
        }
        assert!(checked > 1_000_000, "{checked}");
    }
}

//! The similarity tile: S = A·Bᵀ for row-major embedding blocks, by the `gemm`
//! crate (AVX-512 kernels chosen at run time through its `x86-v4` feature), or
//! by a system BLAS the process chose once with [`use_blas`] (the command line's
//! `HUBNORM_BLAS`).
//!
//! Before touching this, run `cargo bench --bench kernel`
//! and compare `gemm_tile` against `naive_tile` and the machine peak in DESIGN.md.

use std::path::Path;
use std::sync::OnceLock;

pub mod blas;

use self::blas::{Blas, BlasError};

/// The BLAS every tile uses, when one was chosen; otherwise the `gemm` crate.
static BLAS: OnceLock<Blas> = OnceLock::new();

/// Makes every later similarity tile of this process use `cblas_sgemm` from the
/// shared library at `path` (see [`blas`]). Once per process: a second
/// call, even with the same path, is refused, because tiles already computed
/// would not match later ones bit for bit.
pub fn use_blas(path: &Path) -> Result<(), BlasError> {
    let already = |current: &Blas| BlasError::AlreadyInUse {
        path: path.to_path_buf(),
        current: current.path().to_path_buf(),
    };
    // Checked before loading: a library that is already in use may refuse
    // the set-up calls that `Blas::load` makes (MKL's mode is set once).
    if let Some(current) = BLAS.get() {
        return Err(already(current));
    }
    let blas = Blas::load(path)?;
    BLAS.set(blas)
        .map_err(|_| already(BLAS.get().expect("set by the thread that won")))
}

/// The BLAS chosen with [`use_blas`], if any.
pub fn blas() -> Option<&'static Blas> {
    BLAS.get()
}

/// Which GEMM computes the tiles: `gemm crate` or `blas:<path>`. Recorded in
/// the outputs' metadata, since the last bits of a score depend on it.
pub fn backend_name() -> String {
    match BLAS.get() {
        Some(blas) => format!("blas:{}", blas.path().display()),
        None => "gemm crate".into(),
    }
}

/// Writes `out[i * ld_out + j] = ⟨a_i, b_j⟩` for the `m` rows of `a` and the
/// `n` rows of `b`, both row-major with `dim` columns. Single-threaded: the
/// passes parallelise over tiles, which keeps results independent of the thread
/// count.
///
/// # Panics
/// When a slice is shorter than its shape says (`a.len() < m * dim`,
/// `b.len() < n * dim`, `out.len() < (m - 1) * ld_out + n`) or `ld_out < n`.
pub fn similarity_tile(
    out: &mut [f32],
    ld_out: usize,
    a: &[f32],
    m: usize,
    b: &[f32],
    n: usize,
    dim: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        ld_out >= n,
        "output stride {ld_out} is smaller than the tile width {n}"
    );
    assert!(
        a.len() >= m * dim && b.len() >= n * dim,
        "input slices shorter than their shapes"
    );
    assert!(
        out.len() >= (m - 1) * ld_out + n,
        "output slice shorter than its shape"
    );
    if dim == 0 {
        for i in 0..m {
            out[i * ld_out..i * ld_out + n].fill(0.0);
        }
        return;
    }
    if let Some(blas) = BLAS.get() {
        if blas.tile(out, ld_out, a, m, b, n, dim) {
            return;
        }
    }
    // SAFETY: the asserts above guarantee that every index the strides describe
    // lies inside the slices; `out` is exclusively borrowed.
    unsafe {
        gemm::gemm(
            m,
            n,
            dim,
            out.as_mut_ptr(),
            1,               // dst column stride
            ld_out as isize, // dst row stride
            false,           // do not read dst
            a.as_ptr(),
            1,            // lhs column stride (over dim)
            dim as isize, // lhs row stride
            b.as_ptr(),
            dim as isize, // rhs column stride: column j of Bᵀ is row j of B
            1,            // rhs row stride (over dim)
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// The textbook triple loop, kept as the baseline the benchmark compares with
/// and as a reference in tests. Never used on the hot path.
pub fn naive_similarity_tile(
    out: &mut [f32],
    ld_out: usize,
    a: &[f32],
    m: usize,
    b: &[f32],
    n: usize,
    dim: usize,
) {
    for i in 0..m {
        let ai = &a[i * dim..(i + 1) * dim];
        for j in 0..n {
            let bj = &b[j * dim..(j + 1) * dim];
            out[i * ld_out + j] = ai.iter().zip(bj).map(|(x, y)| x * y).sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_product_with_padding() {
        let (m, n, dim, ld) = (7, 5, 13, 9);
        let a: Vec<f32> = (0..m * dim)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 7.0)
            .collect();
        let b: Vec<f32> = (0..n * dim)
            .map(|i| ((i * 53 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let mut fast = vec![f32::NAN; m * ld];
        let mut slow = vec![f32::NAN; m * ld];
        similarity_tile(&mut fast, ld, &a, m, &b, n, dim);
        naive_similarity_tile(&mut slow, ld, &a, m, &b, n, dim);
        for i in 0..m {
            for j in 0..n {
                let (x, y) = (fast[i * ld + j], slow[i * ld + j]);
                assert!((x - y).abs() < 1e-5, "({i},{j}): {x} vs {y}");
            }
            // Padding beyond the tile width is left alone.
            assert!(fast[i * ld + n..(i + 1) * ld].iter().all(|v| v.is_nan()));
        }
    }
}

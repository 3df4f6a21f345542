//! An optional system BLAS for the similarity tile, loaded at run time.
//!
//! The `gemm` crate is the default: pure Rust, no system library, AVX-512 by
//! run-time dispatch. On some CPUs a vendor BLAS is faster (Intel MKL on
//! Skylake-SP runs the tile's shape 10–50% faster here; see "With a system
//! BLAS" in benches/runs/2026-11-25-xeon/summary.md). Loading it at run time
//! keeps the default build free of a system dependency and lets a user point
//! the same binary at whatever `cblas_sgemm` their machine has (MKL's
//! `libmkl_rt.so`, OpenBLAS, BLIS).
//!
//! Only the LP64 CBLAS interface (32-bit integer arguments) is supported; a
//! library that does not compute a known product correctly is refused.
//!
//! Reproducibility: the passes call one single-threaded product per tile, so
//! the library is told to use one thread. MKL is also put in its strict
//! conditional-numerical-reproducibility mode (`MKL_CBWR_Set`), in which a
//! product's bits do not depend on the matrix shape or alignment; without it the
//! bits of a cell would change with the tile edges, hence with the memory limit.

use std::ffi::c_int;
use std::path::{Path, PathBuf};

/// Why a BLAS library could not be used.
#[derive(Debug, thiserror::Error)]
pub enum BlasError {
    /// The shared library could not be opened.
    #[error("cannot load the BLAS library {path}: {message}")]
    Load { path: PathBuf, message: String },
    /// The library has no `cblas_sgemm`.
    #[error("{path} has no cblas_sgemm symbol (an LP64 CBLAS interface is required): {message}")]
    NoSgemm { path: PathBuf, message: String },
    /// The library's product disagreed with the reference on a known input.
    #[error(
        "{path}: cblas_sgemm gave a wrong product on a self-test (max error {error:e}); \
         an LP64 CBLAS interface (32-bit integers) is required"
    )]
    WrongProduct { path: PathBuf, error: f32 },
    /// The process already computes its tiles with a BLAS (see
    /// [`super::use_blas`]); tiles from two libraries would not match bit for bit.
    #[error("cannot switch to {path}: {current} is already in use")]
    AlreadyInUse { path: PathBuf, current: PathBuf },
    /// MKL refused its reproducibility mode, so results would depend on the tile shapes.
    #[error("{path}: MKL_CBWR_Set refused strict reproducibility mode (status {status})")]
    Reproducibility { path: PathBuf, status: c_int },
}

type SgemmFn = unsafe extern "C" fn(
    layout: c_int,
    trans_a: c_int,
    trans_b: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: f32,
    c: *mut f32,
    ldc: c_int,
);

const CBLAS_ROW_MAJOR: c_int = 101;
const CBLAS_NO_TRANS: c_int = 111;
const CBLAS_TRANS: c_int = 112;
/// `MKL_CBWR_AUTO | MKL_CBWR_STRICT` from `mkl_cbwr.h`.
const MKL_CBWR_AUTO_STRICT: c_int = 2 | 0x10000;

/// A loaded `cblas_sgemm`. The library stays loaded for the life of the value.
pub struct Blas {
    sgemm: SgemmFn,
    path: PathBuf,
    shape_independent: bool,
    // Declared last: dropped after the function pointer is no longer reachable.
    _library: libloading::Library,
}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas").field("path", &self.path).finish()
    }
}

impl Blas {
    /// Opens `path`, finds `cblas_sgemm`, asks the library for one thread (and,
    /// for MKL, strict reproducibility), then checks one known product.
    pub fn load(path: &Path) -> Result<Blas, BlasError> {
        // SAFETY: loading a library runs its initialisers; the user asked for
        // this library by name, as they would by linking it.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| BlasError::Load {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        // SAFETY: the symbol's type is the LP64 CBLAS prototype; the self-test
        // below refuses a library whose product does not match it.
        let sgemm: SgemmFn = unsafe { library.get::<SgemmFn>(b"cblas_sgemm\0") }
            .map(|symbol| *symbol)
            .map_err(|e| BlasError::NoSgemm {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        // MKL reads its reproducibility mode once, before its first product.
        let mut shape_independent = false;
        // SAFETY: `int MKL_CBWR_Set(int)` in mkl_cbwr.h.
        if let Ok(set_mode) =
            unsafe { library.get::<unsafe extern "C" fn(c_int) -> c_int>(b"MKL_CBWR_Set\0") }
        {
            let status = unsafe { set_mode(MKL_CBWR_AUTO_STRICT) };
            if status != 0 {
                return Err(BlasError::Reproducibility {
                    path: path.to_path_buf(),
                    status,
                });
            }
            shape_independent = true;
        }
        for name in [&b"MKL_Set_Num_Threads\0"[..], b"openblas_set_num_threads\0"] {
            // SAFETY: both are `void f(int)`.
            if let Ok(set_threads) = unsafe { library.get::<unsafe extern "C" fn(c_int)>(name) } {
                unsafe { set_threads(1) };
            }
        }
        // SAFETY: BLIS's `void bli_thread_set_num_threads(dim_t)`, dim_t = int64.
        if let Ok(set_threads) =
            unsafe { library.get::<unsafe extern "C" fn(i64)>(b"bli_thread_set_num_threads\0") }
        {
            unsafe { set_threads(1) };
        }
        let blas = Blas {
            sgemm,
            path: path.to_path_buf(),
            shape_independent,
            _library: library,
        };
        blas.self_test()?;
        Ok(blas)
    }

    /// The library's path, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a cell's bits are independent of the product's shape, hence of
    /// the tile edges and the memory limit: true for MKL in its strict mode.
    /// With other libraries (OpenBLAS 0.3 computes small products with other
    /// kernels) a cell's last bits may change with the tile edges, so outputs
    /// can differ in the last place between memory limits; the ranking is the
    /// same except at near-ties.
    pub fn shape_independent(&self) -> bool {
        self.shape_independent
    }

    /// `out[i * ld_out + j] = ⟨a_i, b_j⟩`, as [`super::similarity_tile`],
    /// or `false` (nothing written) when a size does not fit a 32-bit integer.
    /// The caller has checked the slice lengths.
    // The same arguments as `similarity_tile`, plus the library.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tile(
        &self,
        out: &mut [f32],
        ld_out: usize,
        a: &[f32],
        m: usize,
        b: &[f32],
        n: usize,
        dim: usize,
    ) -> bool {
        let fits = |x: usize| c_int::try_from(x).is_ok();
        if !(fits(m) && fits(n) && fits(dim) && fits(ld_out)) {
            return false;
        }
        debug_assert!(a.len() >= m * dim && b.len() >= n * dim);
        debug_assert!(out.len() >= (m - 1) * ld_out + n);
        // SAFETY: row-major A (m × dim, lda = dim) and B (n × dim, used
        // transposed, ldb = dim) lie inside `a` and `b`; C (m × n, ldc =
        // ld_out ≥ n) inside `out`, which is exclusively borrowed. beta = 0, so
        // C is not read.
        unsafe {
            (self.sgemm)(
                CBLAS_ROW_MAJOR,
                CBLAS_NO_TRANS,
                CBLAS_TRANS,
                m as c_int,
                n as c_int,
                dim as c_int,
                1.0,
                a.as_ptr(),
                dim as c_int,
                b.as_ptr(),
                dim as c_int,
                0.0,
                out.as_mut_ptr(),
                ld_out as c_int,
            );
        }
        true
    }

    /// A product with a padded output stride, checked against the triple loop.
    fn self_test(&self) -> Result<(), BlasError> {
        let (m, n, dim, ld) = (5, 7, 19, 9);
        let a: Vec<f32> = (0..m * dim)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) / 8.0)
            .collect();
        let b: Vec<f32> = (0..n * dim)
            .map(|i| ((i * 5 % 17) as f32 - 8.0) / 4.0)
            .collect();
        let mut got = vec![f32::NAN; m * ld];
        let mut want = vec![f32::NAN; m * ld];
        self.tile(&mut got, ld, &a, m, &b, n, dim);
        super::naive_similarity_tile(&mut want, ld, &a, m, &b, n, dim);
        let mut error = 0f32;
        for i in 0..m {
            for j in 0..n {
                let d = (got[i * ld + j] - want[i * ld + j]).abs();
                // NaN (an untouched cell) counts as infinitely wrong.
                error = if d.is_nan() {
                    f32::INFINITY
                } else {
                    error.max(d)
                };
            }
        }
        if error > 1e-4 {
            return Err(BlasError::WrongProduct {
                path: self.path.clone(),
                error,
            });
        }
        Ok(())
    }
}

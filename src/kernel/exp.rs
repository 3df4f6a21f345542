//! A branch-free exp for f32 that the compiler vectorises (16 lanes with
//! AVX-512). libm's scalar `expf` would cost more than the GEMM it follows.
//!
//! Method: exp(x) = 2^n · exp(r), n = round(x / ln 2), r = x − n·ln 2 split in
//! two parts (Cody–Waite), exp(r) by a degree-6 Taylor polynomial on
//! |r| ≤ ln2/2 (truncation error < 1.5e-7 relative), and 2^n built from the
//! exponent bits. Inputs below −87 are clamped, giving ≈1e-38 instead of a
//! denormal or 0: negligible next to the sums it is added to.

const LOG2_E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5·2^23: adding and subtracting it rounds to the nearest integer.
const ROUND_MAGIC: f32 = 12_582_912.0;
const MIN_ARG: f32 = -87.0;
const MAX_ARG: f32 = 88.0;

/// exp(x) with a relative error below 3e-7 for x in [−87, 88].
///
/// The reduction and the polynomial use fused multiply-adds (`mul_add`):
/// 9 of the ~20 vector operations instead of 18, which measured 1.5× faster
/// on this machine's AVX-512 cores. The dispatched kernels are compiled with
/// FMA enabled (`kernel::dispatch`); where a CPU lacks it, `mul_add` falls
/// back to libm's correctly rounded `fmaf`: slower, but the same bits.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    let x = if x < MIN_ARG { MIN_ARG } else { x };
    let x = if x > MAX_ARG { MAX_ARG } else { x };
    let shifted = x.mul_add(LOG2_E, ROUND_MAGIC);
    let n = shifted - ROUND_MAGIC;
    // The integer n sits in the low mantissa bits of `shifted`.
    let n_int = (shifted.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    // Horner, highest degree first: 1 + r + r²/2 + … + r⁶/720.
    let mut p: f32 = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    let scale = f32::from_bits(((n_int + 127) as u32) << 23);
    p * scale
}

/// Clamp of [`fast_exp2`]'s argument, so that 2^n is a normal number.
const MIN_ARG2: f32 = -125.0;
const MAX_ARG2: f32 = 127.0;

/// 2^x with a relative error below 3e-7 for x in [−125, 127]; clamped
/// outside. Cheaper than [`fast_exp`] by the range reduction: n = round(x)
/// and f = x − n are exact in base 2 (no Cody–Waite split). So a caller that
/// can fold log₂e into a factor it multiplies by anyway (β·s in pass 1) saves
/// two of the ~18 vector operations of `exp(β·s − m)`.
///
/// 2^f on |f| ≤ 1/2 is the degree-6 Taylor polynomial of exp(f·ln 2)
/// (truncation error < 1.2e-7 relative, as for [`fast_exp`]).
#[inline(always)]
pub fn fast_exp2(x: f32) -> f32 {
    // ln(2)^k / k!, k = 1..6.
    const C: [f32; 6] = [
        std::f32::consts::LN_2,
        0.240_226_5,
        0.055_504_11,
        0.009_618_129,
        0.001_333_355_8,
        0.000_154_035_3,
    ];
    let x = if x < MIN_ARG2 { MIN_ARG2 } else { x };
    let x = if x > MAX_ARG2 { MAX_ARG2 } else { x };
    let shifted = x + ROUND_MAGIC;
    let n = shifted - ROUND_MAGIC;
    let n_int = (shifted.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let f = x - n;
    let mut p = C[5];
    for c in [C[4], C[3], C[2], C[1], C[0], 1.0] {
        p = p.mul_add(f, c);
    }
    // Multiplied rather than added to p's exponent bits: one operation more,
    // but a NaN stays a NaN.
    let scale = f32::from_bits(((n_int + 127) as u32) << 23);
    p * scale
}

/// Exps computed per step of the accumulating loops below: four 16-lane
/// vectors. One vector at a time leaves the core waiting on the polynomial's
/// dependency chain; four independent ones ran 1.3–1.5× faster on this
/// machine's AVX-512 cores (a throwaway microbenchmark, data in L1).
pub const EXP_CHUNK: usize = 64;

/// `acc[j] += exp(arg(cells[j], shift[j]))` for every `j < acc.len()`.
///
/// Each element gets exactly the arithmetic of the plain loop, in the same
/// order, so the bits do not depend on the chunking; the chunks only let the
/// compiler keep several exps in flight.
#[inline(always)]
pub fn add_exps(
    acc: &mut [f32],
    cells: &[f32],
    shift: &[f32],
    arg: impl Fn(f32, f32) -> f32 + Copy,
) {
    add_mapped_exps(acc, cells, shift, arg, |e| e);
}

/// `acc[j] += map(exp(arg(cells[j], shift[j])))`, chunked as [`add_exps`].
#[inline(always)]
pub fn add_mapped_exps(
    acc: &mut [f32],
    cells: &[f32],
    shift: &[f32],
    arg: impl Fn(f32, f32) -> f32 + Copy,
    map: impl Fn(f32) -> f32 + Copy,
) {
    let n = acc.len();
    let (cells, shift) = (&cells[..n], &shift[..n]);
    let full = n - n % EXP_CHUNK;
    for ((a, s), m) in acc[..full]
        .chunks_exact_mut(EXP_CHUNK)
        .zip(cells[..full].chunks_exact(EXP_CHUNK))
        .zip(shift[..full].chunks_exact(EXP_CHUNK))
    {
        let a: &mut [f32; EXP_CHUNK] = a.try_into().expect("chunk");
        let s: &[f32; EXP_CHUNK] = s.try_into().expect("chunk");
        let m: &[f32; EXP_CHUNK] = m.try_into().expect("chunk");
        for l in 0..EXP_CHUNK {
            a[l] += map(fast_exp(arg(s[l], m[l])));
        }
    }
    for ((a, &s), &m) in acc[full..]
        .iter_mut()
        .zip(&cells[full..])
        .zip(&shift[full..])
    {
        *a += map(fast_exp(arg(s, m)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest relative error of `approx` against `exact` on `from..=to`
    /// in steps of `step`.
    fn worst_relative_error(
        approx: impl Fn(f32) -> f32,
        exact: impl Fn(f64) -> f64,
        from: f32,
        to: f32,
        step: f32,
    ) -> f64 {
        let mut worst = 0f64;
        let mut x = from;
        while x <= to {
            let want = exact(x as f64);
            worst = worst.max(((approx(x) as f64 - want) / want).abs());
            x += step;
        }
        worst
    }

    #[test]
    fn relative_error_is_small_over_the_range() {
        let worst = worst_relative_error(fast_exp, f64::exp, -87.0, 88.0, 0.0137);
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(fast_exp(0.0), 1.0);
        assert!(fast_exp(-1000.0) > 0.0 && fast_exp(-1000.0) < 1e-37);
    }

    #[test]
    fn exp2_relative_error_is_small_over_the_range() {
        let worst = worst_relative_error(fast_exp2, f64::exp2, -125.0, 127.0, 0.0131);
        assert!(worst < 3e-7, "worst relative error {worst}");
        for n in -125..=127 {
            assert_eq!(fast_exp2(n as f32), (n as f32).exp2(), "2^{n}");
        }
        assert_eq!(fast_exp2(-1000.0), (-125f32).exp2());
        assert_eq!(fast_exp2(1000.0), 127f32.exp2());
        assert!(fast_exp2(f32::NAN).is_nan());
    }

    #[test]
    fn chunked_accumulation_gives_the_bits_of_the_plain_loop() {
        // Lengths below, at and around the chunk, so the tail path runs too.
        for n in [0, 1, 15, 63, 64, 65, 200] {
            let cells: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32) / 101.0).collect();
            let shift: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 0.3).collect();
            let arg = |s: f32, m: f32| (s - 0.25) * 40.0 - m;
            let mut chunked: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
            let mut plain = chunked.clone();
            add_exps(&mut chunked, &cells, &shift, arg);
            for ((a, &s), &m) in plain.iter_mut().zip(&cells).zip(&shift) {
                *a += fast_exp(arg(s, m));
            }
            assert_eq!(chunked, plain, "n = {n}");
        }
    }
}

//! Runtime CPU dispatch for the epilogues: the same bodies compiled for the
//! baseline target, for AVX2 + FMA and for AVX-512, picked once per call by
//! feature detection, so a binary built for generic x86-64 still runs 16-lane
//! loops where the CPU has them. All three give the same bits (IEEE
//! arithmetic in the same order; `mul_add` is fused everywhere). The GEMM
//! itself dispatches inside the `gemm` crate.
//!
//! The epilogues are declared with [`dispatched!`] beside their bodies, in
//! the modules that use them; this module holds only the mechanism.

/// Whether the AVX-512 versions run on this CPU.
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the AVX2 + FMA versions run on this CPU (8 lanes, and the exp's
/// fused multiply-adds in hardware rather than libm's).
pub(super) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Declares each `[vis] fn name(args) [-> ret] = body;` as a function `name`
/// that runs `body` compiled for AVX-512 where the CPU has it, else for AVX2 +
/// FMA, else for the baseline target. `body` should be `#[inline(always)]`,
/// so that each copy is compiled with its own target features.
macro_rules! dispatched {
    ($($vis:vis fn $name:ident($($arg:ident : $ty:ty),*) $(-> $ret:ty)? = $body:path;)*) => {
        $(
            #[inline]
            $vis fn $name($($arg: $ty),*) $(-> $ret)? {
                #[cfg(target_arch = "x86_64")]
                {
                    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
                    fn wide($($arg: $ty),*) $(-> $ret)? {
                        $body($($arg),*)
                    }
                    if $crate::kernel::dispatch::has_avx512() {
                        // SAFETY: the features `wide` was compiled for were detected above.
                        return unsafe { wide($($arg),*) };
                    }
                    #[target_feature(enable = "avx2,fma")]
                    fn fused($($arg: $ty),*) $(-> $ret)? {
                        $body($($arg),*)
                    }
                    if $crate::kernel::dispatch::has_avx2_fma() {
                        // SAFETY: as above.
                        return unsafe { fused($($arg),*) };
                    }
                }
                $body($($arg),*)
            }
        )*
    };
}

pub(super) use dispatched;

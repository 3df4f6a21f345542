//! Seeded values the kernel's unit tests share.

/// `n` values in [−0.5, 0.5) from a xorshift generator seeded by `seed`.
pub(crate) fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

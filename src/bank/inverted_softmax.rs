//! Inverted softmax (METHODS.md, `is`): h(g) = (1/β)·LSE_b β·s(b, g).

use crate::kernel::LogSumExp;
use crate::options::Beta;

/// The inverted-softmax statistic for one β.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InvertedSoftmax {
    pub beta: Beta,
}

impl InvertedSoftmax {
    /// The correction h(g) in similarity units from the merged state of
    /// β·s(b, g) over the bank. Rank-equivalent to QB-Norm's
    /// η(q, g) = exp(β s(q, g)) / Σ_b exp(β s(b, g)), since
    /// log η / β = s(q, g) − h(g).
    pub fn correction(&self, state: &LogSumExp) -> f64 {
        state.value() / self.beta.0
    }
}

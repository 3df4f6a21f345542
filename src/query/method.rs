//! A scoring method as pass 2 sees it: score(q, g) = s(q, g) − h(g).

use crate::options::MethodSpec;

/// A method with its per-gallery correction h(g), one value per gallery row
/// (all zeros for the baseline).
#[derive(Debug, Clone)]
pub struct ScoringMethod {
    pub spec: MethodSpec,
    pub corrections: Vec<f32>,
}

impl ScoringMethod {
    /// The raw inner product.
    pub fn baseline(gallery_rows: usize) -> Self {
        ScoringMethod {
            spec: MethodSpec::None,
            corrections: vec![0.0; gallery_rows],
        }
    }

    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.corrections.capacity() * 4
    }
}

//! Pass 2: blocked top-k search with each method's correction fused into the
//! kernel, plus the full-gallery rank of each query's ground truth.

pub mod method;
pub mod pass;
pub mod plan;
pub mod results;
pub mod sinkhorn_pp;
pub mod targets;

pub use method::{MethodRule, QueryTerm, Scoring, ScoringPlan, Selection};
pub use pass::{search, QueryBlockResult, SearchRequest};
pub use plan::load_plan;

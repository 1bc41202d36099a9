//! GRPO itself, in the order of GRPO-SPEC §2: sample, score, advantages, frozen
//! log-probs, μ optimizer steps on the per-token loss.

pub mod advantage;
pub mod fused;
pub mod kernels;
pub mod loss;
pub mod sampling;
pub mod trainer;

pub use advantage::{AllAdvantages, GroupStats, advantages, all_advantages};
pub use trainer::{Timings, TrainError, Trainer};

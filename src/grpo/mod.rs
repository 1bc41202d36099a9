//! GRPO itself: one iteration in the order of GRPO-SPEC §2 (`iteration.rs`), the prompt
//! sampler, dynamic sampling, the record builder, and the `Trainer` that keeps the counters,
//! the config and the engine.

mod dynamic;
mod iteration;
pub mod prompts;
pub mod record;
pub mod replay;
mod schedule;
mod staleness;
pub mod trainer;

pub use trainer::{LIVE_SECTIONS, Timings, TrainError, Trainer, TrainerState};

//! The run loop, checkpoints and metric sinks.

pub mod checkpoint;
pub mod lock;
pub mod progress;
pub mod run;

pub use lock::{LockError, RunLock};
pub use run::{
    RunError, RunOptions, RunOutcome, check_resume, install_interrupt_handler, interrupted,
    mark_complete, read_metrics, run,
};

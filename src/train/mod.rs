//! The run loop, checkpoints and metric sinks.

pub mod run;

pub use run::{
    RunError, RunOptions, RunOutcome, clear_interrupts, install_interrupt_handler, read_metrics,
    request_interrupt, run,
};

//! grpo-lab: GRPO on the sorting toy task, on any GPU through wgpu.
//!
//! Layers, bottom up (an arrow only points down):
//! 1. [`config`], [`metrics`], [`task`], [`gpu`], [`rng`]
//! 2. [`model`]
//! 3. [`grpo`]
//! 4. [`train`], [`report`]
//! 5. [`app`] (egui; nothing imports it)
//! 6. the CLI (`main.rs`)

pub mod app;
pub mod config;
pub mod experiment;
pub mod gpu;
pub mod grpo;
pub mod metrics;
pub mod model;
pub mod report;
pub mod rng;
pub mod task;
pub mod train;

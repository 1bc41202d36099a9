//! grpo-lab: GRPO on the sorting toy task, on any GPU through wgpu.
//!
//! Layers, bottom up (an arrow only points down):
//! 1. [`config`], [`estimate`], [`metrics`], [`task`], [`objective`] (the formulas), [`gpu`], [`rng`]
//! 2. [`model`], [`engine`] (the compute paths behind one seam)
//! 3. [`grpo`] (one iteration, top to bottom; no burn, gemm or wgpu)
//! 4. [`train`], [`lab`] (the gradient lab), [`report`], [`export`] (TRL / verl / OpenRLHF configs, TensorBoard / UNIPO logs)
//! 5. [`experiment`], [`app`] (egui; nothing imports it), `web` (the browser entry, wasm32)
//! 6. the CLI (`main.rs`) and `bench`
//!
//! Without the default `native` feature the library builds for `wasm32-unknown-unknown`.

pub mod app;
#[cfg(feature = "native")]
pub mod bench;
pub mod config;
pub mod engine;
pub mod estimate;
pub mod experiment;
pub mod export;
pub mod gpu;
pub mod grpo;
pub mod lab;
pub mod metrics;
pub mod model;
pub mod objective;
pub mod report;
pub mod rng;
pub mod task;
pub mod train;
#[cfg(all(target_arch = "wasm32", feature = "web"))]
pub mod web;

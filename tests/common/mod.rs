//! Shared helpers for the integration tests.
#![allow(dead_code)]

use grpo_lab::config::{DeviceChoice, RunConfig};
use grpo_lab::gpu::Compute;
use std::path::PathBuf;

/// The software wgpu adapter (lavapipe); a hardware GPU first where `GRPO_TEST_DEVICE=gpu`
/// (the same tests on a machine with one). Where `CI` is set a missing adapter fails the
/// test instead of quietly falling back, so the wgpu path is exercised for real.
pub fn wgpu_compute() -> Option<Compute> {
    let order = if std::env::var("GRPO_TEST_DEVICE").is_ok_and(|v| v == "gpu") {
        [DeviceChoice::Gpu, DeviceChoice::Software]
    } else {
        [DeviceChoice::Software, DeviceChoice::Gpu]
    };
    match Compute::select(order[0]).or_else(|_| Compute::select(order[1])) {
        Ok(c) => Some(c),
        Err(e) if std::env::var_os("CI").is_some() => panic!("CI needs a wgpu adapter: {e}"),
        Err(e) => {
            eprintln!("skipping wgpu part: {e}");
            None
        }
    }
}

/// lecture17 shortened to `iterations`.
pub fn short_lecture(iterations: usize) -> RunConfig {
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.iterations = iterations;
    c.run.checkpoint_every = 2;
    c
}

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grpo-lab-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// metrics.jsonl without the wall-clock fields (the only ones that may differ between runs).
pub fn metrics_without_timing(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let o = v.as_object_mut().unwrap();
            o.remove("step_time_secs");
            o.remove("tokens_per_second");
            v
        })
        .collect()
}

/// `a` and `b` agree within `tol`, relative to the larger of the two (absolute below 1).
pub fn close(a: f32, b: f32, tol: f32) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

/// The optimizer step's scalars of two records, side by side, by name (the engines' equality
/// tests compare them).
pub fn step_scalars(
    a: &grpo_lab::metrics::StepRecord,
    b: &grpo_lab::metrics::StepRecord,
) -> [(&'static str, f32, f32); 7] {
    [
        ("loss", a.loss, b.loss),
        ("kl", a.kl, b.kl),
        ("entropy", a.entropy, b.entropy),
        ("ratio", a.ratio_mean, b.ratio_mean),
        ("grad_norm", a.grad_norm, b.grad_norm),
        ("clip_low", a.clip_ratio_low, b.clip_ratio_low),
        ("clip_high", a.clip_ratio_high, b.clip_ratio_high),
    ]
}

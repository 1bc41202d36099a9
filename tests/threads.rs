//! `run.threads` changes how fast a run goes, never what it computes: the fused engines cut
//! each batch into parts by its shape alone and add the parts' sums in part order, so 1, 2 and
//! 3 threads write the same `metrics.jsonl` byte for byte (the wall-clock fields aside) and the
//! same Adam moments and trainer state in the last checkpoint — the transformer's, and the
//! lecture model's at a shape its step cuts into parts.

mod common;

use common::temp_dir;
use grpo_lab::config::RunConfig;
use grpo_lab::gpu::Compute;
use grpo_lab::train::{self, RunOptions};

/// transformer-sort at a size that the engine cuts into several parts everywhere: 4 parts for
/// the rollout and the step (16 prompts × 8), 2 for the held-out evaluation, 4 for the cold
/// start's batches of 64 — with dynamic sampling's redraws and clip-higher as in the preset.
fn config() -> RunConfig {
    let mut c = RunConfig::preset("transformer-sort").unwrap();
    c.task.train_size = 256;
    c.task.heldout_size = 32;
    c.task.max_len = 6;
    c.model.d_model = 32;
    c.model.layers = 1;
    c.algorithm.prompts_per_iteration = 16;
    c.sft.steps = 2;
    c.sft.examples = 128;
    c.sft.batch_size = 64;
    c.run.iterations = 2;
    c.run.checkpoint_every = 0;
    c.run.eval_every = 1;
    c.run.pass_k = 2;
    c.validate().unwrap();
    c
}

/// `scaled` (the lecture model) at 128 prompts × 4 responses, D = 32: 2 parts for the rollout,
/// log π, the step and the held-out evaluation (the objective's terms each part's own, Adam by
/// spans on the threads).
fn lecture_config() -> RunConfig {
    let mut c = RunConfig::preset("scaled").unwrap();
    c.task.train_size = 512;
    c.task.heldout_size = 128;
    c.model.d_model = 32;
    c.algorithm.prompts_per_iteration = 128;
    c.algorithm.num_generations = 4;
    c.algorithm.mu = 2;
    c.algorithm.beta = 0.05;
    c.run.iterations = 2;
    c.run.checkpoint_every = 2;
    c.run.eval_every = 1;
    c.validate().unwrap();
    c
}

/// The text of `metrics.jsonl` without the wall-clock fields, and the last checkpoint's
/// Adam moments and trainer state, byte for byte.
fn run_with(threads: usize) -> (Vec<String>, Vec<(String, Vec<u8>)>) {
    run_config(config(), threads)
}

fn run_config(mut c: RunConfig, threads: usize) -> (Vec<String>, Vec<(String, Vec<u8>)>) {
    c.run.threads = threads;
    let out = temp_dir(&format!("threads-{}-{threads}", c.run.name));
    let outcome = train::run(
        c,
        Compute::cpu(),
        RunOptions {
            out: out.clone(),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(outcome.summary.status, "completed");
    let lines = common::metrics_without_timing(&out.join("metrics.jsonl"))
        .iter()
        .map(|v| v.to_string())
        .collect();
    let mut ckpt: Vec<(String, Vec<u8>)> = Vec::new();
    let dirs = std::fs::read_dir(out.join("checkpoints")).unwrap();
    let last = dirs
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("iter-"))
        })
        .max()
        .unwrap();
    for f in std::fs::read_dir(&last).unwrap().filter_map(|e| e.ok()) {
        let name = f.file_name().to_string_lossy().into_owned();
        if name.ends_with(".bpk") {
            // burn's record file differs between two runs of the same build (its metadata):
            // Adam's moments below are what every gradient of the run left, bit for bit.
            continue;
        }
        let mut bytes = std::fs::read(f.path()).unwrap();
        if name == "state.json" || name == "manifest.json" {
            // The state records the config, whose `run.threads` differs by design (and the
            // manifest the state's checksum): compare them without it.
            let mut state: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            if let Some(toml) = state.get_mut("config_toml")
                && let Some(text) = toml.as_str()
            {
                let kept: Vec<&str> = text
                    .lines()
                    .filter(|l| !l.starts_with("threads ="))
                    .collect();
                *toml = kept.join("\n").into();
            }
            bytes = match name.as_str() {
                "state.json" => state.to_string().into_bytes(),
                _ => Vec::new(),
            };
        }
        ckpt.push((name, bytes));
    }
    ckpt.sort();
    let _ = std::fs::remove_dir_all(out);
    (lines, ckpt)
}

#[test]
fn one_two_and_three_threads_write_the_same_run() {
    same_run_on_any_threads(run_with);
}

#[test]
fn the_lecture_model_s_run_is_the_same_on_any_threads() {
    same_run_on_any_threads(|threads| run_config(lecture_config(), threads));
}

fn same_run_on_any_threads(run_with: impl Fn(usize) -> (Vec<String>, Vec<(String, Vec<u8>)>)) {
    let (one, w1) = run_with(1);
    assert!(!one.is_empty() && !w1.is_empty());
    for threads in [2, 3] {
        let (lines, w) = run_with(threads);
        assert_eq!(lines.len(), one.len(), "{threads} threads");
        for (i, (a, b)) in one.iter().zip(&lines).enumerate() {
            assert_eq!(a, b, "record {i}: 1 thread vs {threads}");
        }
        assert_eq!(w1.len(), w.len());
        for ((name, a), (_, b)) in w1.iter().zip(&w) {
            let first = a.iter().zip(b).position(|(x, y)| x != y);
            assert!(
                a == b,
                "{name}: 1 thread vs {threads} ({} vs {} bytes, first difference at {first:?})",
                a.len(),
                b.len()
            );
        }
    }
}

/// A small shape stays on the calling thread (lecture17's whole step is ~10–20 µs, a hand-off
/// to a worker and its cache lines back cost several): at `run.threads = 2` its iterations —
/// rollout, rewards, every advantage mode, log π, the steps and Adam, the held-out evaluation
/// and the record — hand the pool no job. Before the engines weighed each job (Adam's spans,
/// the advantage modes) two threads ran lecture17 at 0.5–0.75× of one.
#[test]
fn lecture17_hands_its_threads_no_job() {
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.threads = 2;
    c.run.iterations = 4;
    c.run.eval_every = 1;
    c.validate().unwrap();
    let mut t = grpo_lab::grpo::Trainer::new(c, Compute::cpu()).unwrap();
    let cores = t.engine().cores();
    assert_eq!(cores.threads(), 2);
    let before = cores.jobs();
    for _ in 0..4 * t.config.algorithm.mu {
        t.step().unwrap();
    }
    assert_eq!(cores.jobs(), before, "jobs handed to the pool");
}

//! `kill -9` at random moments — before the first checkpoint, mid-step, mid-checkpoint-write,
//! during the cold start — then `--resume`, again and again until the run completes: the
//! result is the uninterrupted run's, `metrics.jsonl` (apart from wall-clock fields) and
//! `summary.json` (apart from wall time) alike. 50 seeds of kill times on lecture17, 6 on a
//! small transformer with a cold start.

mod common;

use common::{metrics_without_timing, temp_dir};
use grpo_lab::rng::SplitMix64;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn train(args: &[String], out: &Path, resume: bool) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_grpo-lab"));
    c.arg("train");
    if resume {
        c.args(["--resume", out.to_str().unwrap()]);
    } else {
        c.args(args)
            .args(["--out", out.to_str().unwrap(), "--force"]);
    }
    c.args(["--quiet", "--device", "cpu"]);
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

fn summary_without_timing(out: &Path) -> serde_json::Value {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let o = v.as_object_mut().unwrap();
    o.remove("wall_time_secs");
    o.remove("ms_per_step");
    v
}

/// Run to completion, killed after a random delay (up to `max_ms`) each time until a run
/// finishes by itself; returns how many kills it took.
fn run_with_kills(args: &[String], out: &Path, seed: u64, max_ms: u64) -> usize {
    let mut rng = SplitMix64::new(seed);
    let mut kills = 0;
    let mut started_once = false;
    loop {
        // Until a config.toml exists there is nothing to resume: start again.
        let resume = started_once && out.join("config.toml").exists();
        let mut child = train(args, out, resume).spawn().unwrap();
        started_once = true;
        let deadline = Instant::now() + Duration::from_millis(rng.below(max_ms) + 1);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if Instant::now() >= deadline && kills < 6 {
                child.kill().unwrap();
                child.wait().unwrap();
                break None;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        match status {
            None => kills += 1,
            Some(s) => {
                let mut err = String::new();
                use std::io::Read;
                child.stderr.take().unwrap().read_to_string(&mut err).ok();
                assert!(s.success(), "seed {seed}, after {kills} kills: {s}\n{err}");
                return kills;
            }
        }
    }
}

fn check(args: &[String], seeds: std::ops::Range<u64>, name: &str) {
    let full = temp_dir(&format!("kill-{name}-full"));
    let started = Instant::now();
    let o = train(args, &full, false).output().unwrap();
    // Kill times spread over the uninterrupted run's own duration.
    let max_ms = started.elapsed().as_millis() as u64 + 1;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (want_metrics, want_summary) = (
        metrics_without_timing(&full.join("metrics.jsonl")),
        summary_without_timing(&full),
    );
    let mut total_kills = 0;
    for seed in seeds {
        let out = temp_dir(&format!("kill-{name}-{seed}"));
        total_kills += run_with_kills(args, &out, seed, max_ms);
        assert_eq!(
            metrics_without_timing(&out.join("metrics.jsonl")),
            want_metrics,
            "{name} seed {seed}: metrics differ from the uninterrupted run"
        );
        assert_eq!(
            summary_without_timing(&out),
            want_summary,
            "{name} seed {seed}"
        );
        let _ = std::fs::remove_dir_all(&out);
    }
    eprintln!("{name}: {total_kills} kills, every run identical to the uninterrupted one");
    assert!(total_kills > 0, "no kill landed: the runs were too short");
}

fn sets(preset: &str, sets: &[&str]) -> Vec<String> {
    let mut a = vec!["--preset".to_string(), preset.to_string()];
    for s in sets {
        a.extend(["--set".to_string(), s.to_string()]);
    }
    a
}

#[test]
fn lecture17_killed_at_random_times_ends_as_the_uninterrupted_run() {
    let args = sets(
        "lecture17",
        &[
            "run.iterations=200",
            "run.checkpoint_every=7",
            "task.heldout_size=4",
        ],
    );
    check(&args, 0..50, "lecture17");
}

#[test]
fn a_cold_start_killed_at_random_times_ends_as_the_uninterrupted_run() {
    let args = sets(
        "transformer-sort",
        &[
            "task.n=3",
            "task.vocab=5",
            "task.train_size=64",
            "task.heldout_size=16",
            "task.max_len=6",
            "model.d_model=16",
            "model.heads=2",
            "model.context=8",
            "algorithm.num_generations=4",
            "algorithm.prompts_per_iteration=4",
            "algorithm.dynamic_sampling=false",
            "sft.steps=30",
            "sft.batch_size=8",
            "run.iterations=4",
            "run.checkpoint_every=1",
        ],
    );
    check(&args, 0..6, "transformer");
}

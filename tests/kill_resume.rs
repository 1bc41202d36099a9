//! `kill -9` at random moments — before the first checkpoint, mid-step, mid-checkpoint-write,
//! during the cold start — then `--resume`, again and again until the run completes: the
//! result is the uninterrupted run's, `metrics.jsonl` (apart from wall-clock fields) and
//! `summary.json` (apart from wall time) alike. 50 seeds of kill times on lecture17, 6 on a
//! small transformer with a cold start. And one writer per run directory: a second writer
//! (train, --force, --resume, compare) is refused while the first holds the directory, and a
//! first writer killed with `kill -9` leaves no lock behind.

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
        let got = metrics_without_timing(&out.join("metrics.jsonl"));
        if got != want_metrics {
            // Say where: the first record that differs and its differing keys (a whole run's
            // records in one assertion message are unreadable).
            let at = got.iter().zip(&want_metrics).position(|(a, b)| a != b);
            let keys: Vec<String> = at
                .map(|i| {
                    let (a, b) = (
                        got[i].as_object().unwrap(),
                        want_metrics[i].as_object().unwrap(),
                    );
                    a.keys()
                        .chain(b.keys())
                        .filter(|k| a.get(*k) != b.get(*k))
                        .map(|k| format!("{k}: {:?} vs {:?}", a.get(k), b.get(k)))
                        .collect()
                })
                .unwrap_or_default();
            let log = std::fs::read_to_string(out.join("train.log")).unwrap_or_default();
            panic!(
                "{name} seed {seed}: metrics differ from the uninterrupted run after {} kills: {} records vs {}, first difference at record {at:?}: {keys:?}\n{log}",
                total_kills,
                got.len(),
                want_metrics.len()
            );
        }
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

#[cfg(unix)]
fn grpo(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_grpo-lab"));
    c.args(args).stdin(Stdio::null());
    c
}

#[cfg(unix)]
/// Send a signal (`STOP`, `CONT`, `KILL`) to a process (the shell's own `kill`: no package
/// needed beyond `sh`).
fn signal(pid: u32, name: &str) {
    let ok = Command::new("sh")
        .args(["-c", &format!("kill -{name} {pid}")])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} {pid}");
}

#[cfg(unix)]
/// Start `train` on `out` and freeze it (SIGSTOP) once it holds the directory's lock (its line,
/// `pid N, ...`, is in the lock file) and `also` holds.
fn start_frozen_writer(
    args: &[String],
    out: &Path,
    also: impl Fn() -> bool,
) -> std::process::Child {
    let child = train(args, out, false).spawn().unwrap();
    let pid = child.id();
    let lock = out.join(grpo_lab::train::lock::LOCK_FILE);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(std::fs::read_to_string(&lock).is_ok_and(|t| t.starts_with(&format!("pid {pid},")))
        && also())
    {
        assert!(
            Instant::now() < deadline,
            "the first writer never took the lock"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(pid, "STOP");
    let mut child = child;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the writer ended before it was frozen: make its run longer"
    );
    child
}

#[cfg(unix)]
/// Every file under `dir` with its length and modification time.
fn listing(dir: &Path) -> Vec<(std::path::PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().filter_map(Result::ok) {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.push((e.path(), m.len(), m.modified().unwrap()));
        }
    }
    out.sort();
    out
}

#[cfg(unix)]
#[test]
fn a_second_writer_is_refused_naming_the_first_and_a_killed_writer_leaves_no_lock() {
    let args = sets(
        "lecture17",
        &[
            "run.iterations=200",
            "run.checkpoint_every=7",
            "task.heldout_size=4",
        ],
    );
    let alone = temp_dir("writer-alone");
    let o = train(&args, &alone, false).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let dir = temp_dir("writer-first");
    // Frozen once it has written records, so the reader below has some to read.
    let metrics = dir.join("metrics.jsonl");
    let mut first = start_frozen_writer(&args, &dir, || {
        std::fs::metadata(&metrics).is_ok_and(|m| m.len() > 0)
    });
    let pid = first.id();
    let before = listing(&dir);
    let d = dir.to_str().unwrap();
    let mut new_run: Vec<&str> = vec!["train", "--quiet", "--device", "cpu", "--out", d];
    new_run.extend(args.iter().map(String::as_str));
    let mut forced = new_run.clone();
    forced.push("--force");
    let seconds: [(&str, Vec<&str>); 4] = [
        ("train", new_run),
        ("train --force", forced),
        (
            "train --resume",
            vec!["train", "--quiet", "--device", "cpu", "--resume", d],
        ),
        (
            "compare",
            vec![
                "compare",
                "--quiet",
                "--experiment",
                "lecture-table",
                "--seeds",
                "0",
                "--iterations",
                "1",
                "--device",
                "cpu",
                "--out",
                d,
            ],
        ),
    ];
    for (name, argv) in &seconds {
        let started = Instant::now();
        let o = grpo(argv).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(&format!(
                "{d} is being written by another process (pid {pid}, `grpo-lab train "
            )) && err.contains(" UTC)"),
            "{name} must name the directory and its holder: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{name} was not refused at once"
        );
        assert_eq!(listing(&dir), before, "{name} touched the run directory");
    }
    // A reader never blocks on a writer: export-log reads the records written so far.
    let tb = temp_dir("writer-tb");
    let o = grpo(&[
        "export-log",
        "--to",
        "tensorboard",
        d,
        "--out",
        tb.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    signal(pid, "CONT");
    let status = first.wait().unwrap();
    assert!(status.success(), "the first writer: {status}");
    assert_eq!(
        metrics_without_timing(&dir.join("metrics.jsonl")),
        metrics_without_timing(&alone.join("metrics.jsonl")),
        "the first writer's metrics differ from a run alone"
    );
    assert_eq!(summary_without_timing(&dir), summary_without_timing(&alone));

    // kill -9 of a writer (frozen while it holds the lock, after its first checkpoint): the
    // next --resume proceeds.
    let killed = temp_dir("writer-killed");
    let latest = killed.join("checkpoints").join("latest");
    let mut victim = start_frozen_writer(&args, &killed, || latest.exists());
    signal(victim.id(), "KILL");
    victim.wait().unwrap();
    let o = train(&args, &killed, true).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        metrics_without_timing(&killed.join("metrics.jsonl")),
        metrics_without_timing(&alone.join("metrics.jsonl"))
    );
    for d in [alone, dir, killed, tb] {
        let _ = std::fs::remove_dir_all(d);
    }
}

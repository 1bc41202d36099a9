//! Property: whatever config a user writes, `grpo-lab train` either validates it and runs, or
//! refuses it with exit code 2 naming what is wrong — never a panic, an abort or an allocation
//! past the cap. Cases are generated from the field table (every key) with hostile values
//! (zero, negative, huge, NaN, ∞, wrong types, garbage), one to three at a time, on every
//! preset; plus garbage config files. The same for the CLI's own arguments (`score`, `advantages`,
//! `compare`, `bench`, `bench-rollout`, `train --seed`): sizes, lists, ranges. A bounded number in CI (`FUZZ_CASES`, default 40); run
//! `FUZZ_CASES=2000 cargo test --release --test fuzz` for a long local run. The seed of a
//! failing case is printed; `FUZZ_SEED=N` replays one.

mod common;

use common::temp_dir;
use grpo_lab::config::FIELDS;
use grpo_lab::rng::SplitMix64;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PRESETS: &[&str] = &[
    "lecture17",
    "scaled",
    "random-sort",
    "transformer-sort",
    "length-bias",
    "r1-vs-r1-zero",
];

const HOSTILE: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "64",
    "1000000000",
    "18446744073709551615",
    "-9223372036854775808",
    "1e30",
    "-1e30",
    "0.5",
    "1.0",
    "nan",
    "inf",
    "-inf",
    "true",
    "\"x\"",
    "[]",
    "[[1, 2, 3]]",
    "{}",
    "{exact=1.0}",
    "{bogus=1.0}",
    "",
];

fn pick<'a, T>(rng: &mut SplitMix64, xs: &'a [T]) -> &'a T {
    &xs[rng.below(xs.len() as u64) as usize]
}

/// One generated case: a preset and `--set` overrides (or a garbage file).
fn case(seed: u64, dir: &std::path::Path) -> Vec<String> {
    let mut rng = SplitMix64::new(seed);
    let mut args = vec!["train".to_string()];
    if rng.below(12) == 0 {
        // A config file of garbage or of half a real one.
        let text = if rng.below(2) == 0 {
            "[task\nn = = 3\n\u{0}\u{1}".to_string()
        } else {
            let preset: &&str = pick(&mut rng, PRESETS);
            let full = grpo_lab::config::RunConfig::preset(preset)
                .unwrap()
                .to_toml();
            let cut = rng.below(full.len() as u64) as usize;
            full.char_indices()
                .take_while(|(i, _)| *i < cut)
                .map(|(_, c)| c)
                .collect()
        };
        let file = dir.join(format!("case-{seed}.toml"));
        std::fs::write(&file, text).unwrap();
        args.extend(["--config".into(), file.display().to_string()]);
    } else {
        args.extend(["--preset".into(), pick(&mut rng, PRESETS).to_string()]);
    }
    for _ in 0..1 + rng.below(3) {
        let field = pick(&mut rng, FIELDS);
        let value = pick(&mut rng, HOSTILE);
        args.extend(["--set".into(), format!("{}={value}", field.key)]);
    }
    // A tiny budget: one iteration, a small memory cap, no cold start beyond a few steps.
    for fixed in [
        "run.iterations=1",
        "run.max_memory_mib=256",
        "run.checkpoint_every=0",
    ] {
        args.extend(["--set".into(), fixed.into()]);
    }
    args.extend([
        "--device".into(),
        "cpu".into(),
        "--quiet".into(),
        "--force".into(),
        "--out".into(),
        dir.join(format!("run-{seed}")).display().to_string(),
    ]);
    args
}

#[test]
fn every_generated_config_runs_or_is_refused_with_exit_2() {
    let dir = temp_dir("fuzz");
    fuzz("config", |seed| case(seed, &dir));
}

/// Hostile values for the CLI's own arguments (sizes, lists, ranges, numbers).
const HOSTILE_ARGS: &[&str] = &[
    "0",
    "1",
    "2",
    "-1",
    "nan",
    "inf",
    "",
    "a",
    "1,,2",
    "3,1,2",
    "1,2,2,5",
    "0..3",
    "5..2",
    "0..0",
    "1e30",
    "1000000000",
    "18446744073709551616",
];

/// One generated call of a subcommand other than `train --set`, each argument drawn from
/// [`HOSTILE_ARGS`] or left at a small valid value.
fn cli_case(seed: u64, dir: &std::path::Path) -> Vec<String> {
    let mut rng = SplitMix64::new(seed);
    let mut hostile = |valid: &str| -> String {
        if rng.below(3) == 0 {
            pick(&mut rng, HOSTILE_ARGS).to_string()
        } else {
            valid.to_string()
        }
    };
    let out = dir.join(format!("cli-{seed}")).display().to_string();
    let v = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    match seed % 6 {
        0 => v(&[
            "score",
            "--reward",
            &hostile("distance"),
            "--prompt",
            &hostile("3,1,2"),
            "--response",
            &hostile("1,2,3"),
        ]),
        1 => v(&["advantages", "--rewards", &hostile("1,2,2,5")]),
        2 => v(&[
            "compare",
            "--preset",
            "lecture17",
            "--seeds",
            &hostile("0..2"),
            "--iterations",
            &hostile("1"),
            "--jobs",
            &hostile("1"),
            "--threshold",
            &hostile("2"),
            "--vary",
            &format!("algorithm.mu={}", hostile("1,2")),
            "--device",
            "cpu",
            "--quiet",
            "--force",
            "--out",
            &out,
        ]),
        3 => v(&[
            "bench",
            "--preset",
            "lecture17",
            "--iterations",
            &hostile("2"),
            "--seed",
            &hostile("1"),
            "--device",
            "cpu",
            "--json",
        ]),
        4 => v(&[
            "bench-rollout",
            "--prompts",
            &hostile("8"),
            "--generations",
            &hostile("4"),
            "--n",
            &hostile("5"),
            "--vocab",
            &hostile("10"),
            "--repeats",
            &hostile("1"),
            "--device",
            "software",
            "--json",
        ]),
        _ => v(&[
            "train",
            "--preset",
            "lecture17",
            "--seed",
            &hostile("3"),
            "--set",
            &format!("run.iterations={}", hostile("1")),
            "--device",
            "cpu",
            "--quiet",
            "--force",
            "--out",
            &out,
        ]),
    }
}

#[test]
fn every_generated_cli_call_runs_or_is_refused_with_exit_2() {
    let dir = temp_dir("fuzz-cli");
    fuzz("cli", |seed| cli_case(seed, &dir));
}

/// Run `FUZZ_CASES` generated calls (or the one `FUZZ_SEED` names): each exits 0 or exits 2
/// with an error message; never a panic, an abort or another code.
fn fuzz(what: &str, case: impl Fn(u64) -> Vec<String>) {
    let cases: u64 = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let only: Option<u64> = std::env::var("FUZZ_SEED").ok().and_then(|v| v.parse().ok());
    let (mut ran, mut refused, mut slow) = (0, 0, 0);
    for seed in only.map_or(0..cases, |s| s..s + 1) {
        let args = case(seed);
        let mut child = Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A valid config may still be slow on a debug build; it is not a crash. Bounded.
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if started.elapsed() > Duration::from_secs(20) {
                child.kill().ok();
                child.wait().ok();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        use std::io::Read;
        child.stderr.take().unwrap().read_to_string(&mut err).ok();
        let Some(status) = status else {
            slow += 1;
            continue;
        };
        let replay = format!("FUZZ_SEED={seed}: grpo-lab {}\n{err}", args.join(" "));
        assert!(!err.contains("panicked"), "a panic\n{replay}");
        match status.code() {
            Some(0) => ran += 1,
            Some(2) => {
                refused += 1;
                assert!(err.contains("error"), "exit 2 without a message\n{replay}");
            }
            other => panic!("exit {other:?} (a signal if None)\n{replay}"),
        }
    }
    eprintln!(
        "fuzz {what}: {ran} ran, {refused} refused with exit 2, {slow} still running after 20 s"
    );
    // Both paths were exercised (a valid case still running at the limit counts as run).
    assert!(
        only.is_some() || (ran + slow > 0 && refused > 0),
        "{ran} ran, {refused} refused"
    );
}

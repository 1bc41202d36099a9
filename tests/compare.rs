//! `grpo-lab compare`: every experiment file as a smoke run at a tiny budget, resuming an
//! interrupted matrix, and refusing to mix configs.

mod common;

use common::temp_dir;
use std::process::Command;

fn grpo_lab(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn every_experiment_file_runs_at_a_tiny_budget() {
    for (name, _) in grpo_lab::experiment::EXPERIMENTS {
        let out = temp_dir(&format!("exp-{name}"));
        let o = grpo_lab(&[
            "compare",
            "--experiment",
            name,
            "--seeds",
            "0",
            "--iterations",
            "1",
            // The burn CPU backend: the transformer cells on lavapipe would only add minutes;
            // the wgpu path has its own tests.
            "--device",
            "cpu",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
        assert!(md.contains("| cell |"), "{name}: {md}");
        let m = grpo_lab::experiment::Matrix::from_experiment(name).unwrap();
        // A card's claim and its report table reach summary.md, one row per cell.
        if !m.card.report.is_empty() {
            let report = md
                .split("What the mechanism shows")
                .nth(1)
                .unwrap_or_else(|| panic!("{name}: no report table in {md}"));
            // Up to the next section (a card's `part_from` adds one).
            let report = report.split("\n## ").next().unwrap();
            let rows = report
                .lines()
                .filter(|l| l.starts_with("| ") && !l.starts_with("| cell"))
                .count();
            assert_eq!(rows, m.cells().unwrap().len(), "{name}: {report}");
            assert!(md.contains(&m.card.claim), "{name}");
        }
        // `part_from`: a row per cell away from the value, each with its sibling's parting.
        if let Some((key, value)) = &m.card.part_from {
            let part = md
                .split("When the runs part")
                .nth(1)
                .unwrap_or_else(|| panic!("{name}: no parting table in {md}"));
            let rows = part
                .lines()
                .filter(|l| l.starts_with("| ") && !l.starts_with("| cell"))
                .count();
            let at = format!("{key}={value}");
            let away = m
                .cells()
                .unwrap()
                .iter()
                .filter(|c| {
                    c.sets
                        .iter()
                        .any(|s| s.starts_with(&format!("{key}=")) && *s != at)
                })
                .count();
            assert!(away > 0 && rows == away, "{name}: {part}");
        }
        assert!(
            out.join("summary.csv").exists()
                && out.join("charts/reward_mean.png").exists()
                && out.join("charts/reward_mean.svg").exists()
        );
        // `scatter`: every step of every seed, x against y (the entropy mechanism's
        // predicted against measured change), and each cell's correlation in the table.
        if let Some((x, y)) = &m.card.scatter {
            let stem = format!("scatter-{}-vs-{}", x.replace('/', "_"), y.replace('/', "_"));
            assert!(
                out.join(format!("charts/{stem}.svg")).exists(),
                "{name}: {stem}"
            );
            let corr = format!("corr({x},{y})");
            let report = md.split("What the mechanism shows").nth(1).unwrap();
            let column = report
                .lines()
                .find(|l| l.starts_with("| cell |") && l.contains(&corr))
                .and_then(|l| l.split(" | ").position(|c| c.contains(&corr)))
                .unwrap_or_else(|| panic!("{name}: no {corr} column in {md}"));
            for row in report.lines().filter(|l| l.starts_with("| loss=")) {
                let value = row.split(" | ").nth(column).unwrap();
                let r: f64 = value.split(' ').next().unwrap().parse().unwrap_or(f64::NAN);
                assert!(
                    (-1.0..=1.0).contains(&r),
                    "{name}: {corr} = {value} in {row}"
                );
            }
        }
    }
}

#[test]
fn a_matrix_resumes_without_redoing_cells_and_never_mixes_configs() {
    let out = temp_dir("cmp-resume");
    let dir = out.to_str().unwrap();
    let args = [
        "compare",
        "--preset",
        "lecture17",
        "--set",
        "run.iterations=2",
        "--vary",
        "algorithm.advantage=raw,centered",
        "--seeds",
        "0..2",
        "--quiet",
        "--out",
        dir,
    ];
    let o = grpo_lab(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("ran 4 runs, skipped 0"));
    // An interrupted matrix: one run lost its summary (as if stopped mid-way).
    std::fs::remove_file(out.join("runs/advantage_raw__seed1/summary.json")).unwrap();
    let o = grpo_lab(&args);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("ran 1 runs, skipped 3"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // The same directory with another config is refused before anything runs.
    let mut other = args.to_vec();
    other[4] = "run.iterations=3";
    let o = grpo_lab(&other);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("different config"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn bad_vary_keys_and_values_are_refused_before_any_run() {
    let out = temp_dir("cmp-bad");
    let dir = out.to_str().unwrap();
    for (vary, needle) in [
        ("algorithm.advantag=raw", "algorithm.advantage"),
        ("algorithm.epsilon_low=0.2,1.5", "algorithm.epsilon_low"),
        ("algorithm.advantage=best", "rloo"),
    ] {
        let o = grpo_lab(&[
            "compare",
            "--preset",
            "lecture17",
            "--vary",
            vary,
            "--out",
            dir,
            "--quiet",
        ]);
        assert_eq!(o.status.code(), Some(2), "{vary}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(needle),
            "{vary}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!out.join("runs").exists(), "{vary}: nothing may run");
    }
    // An experiment file brings its own config and seeds: the flags that would be ignored are
    // refused by name.
    for flag in [["--preset", "random-sort"], ["--seed", "3"]] {
        let mut args = vec![
            "compare",
            "--experiment",
            "kl-beta",
            "--out",
            dir,
            "--quiet",
        ];
        args.extend(flag);
        let o = grpo_lab(&args);
        assert_eq!(o.status.code(), Some(2), "{flag:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(flag[0]) && err.contains("--experiment"),
            "{err}"
        );
        assert!(!out.join("runs").exists(), "{flag:?}: nothing may run");
    }
}

/// Ambiguous matrices are refused before any run, naming what repeats: a key on two axes (its
/// cells would all run the last value while their labels name both), a value or a seed listed
/// twice, zero iterations.
#[test]
fn duplicate_axes_values_and_seeds_are_refused_by_name() {
    let out = temp_dir("cmp-dup");
    let dir = out.to_str().unwrap();
    for (args, needle) in [
        (
            vec![
                "--vary",
                "algorithm.advantage=raw,centered",
                "--vary",
                "algorithm.advantage=max",
            ],
            "`algorithm.advantage` is varied twice",
        ),
        (
            vec!["--vary", "algorithm.advantage=raw,raw"],
            "the value `raw` twice",
        ),
        (vec!["--seeds", "1,1,1"], "seed 1 is listed twice"),
        (vec!["--seeds", "3..1"], "the range is empty"),
        // Refused at once (a quadratic check over a million seeds hung with nothing printed).
        (vec!["--seeds", "0..1000000"], "at most 10000"),
        // compare's runs take their seeds from --seeds: --seed was silently overridden.
        (vec!["--seed", "3"], "--seed with compare"),
        (vec!["--threshold", "nan"], "allowed a finite number"),
        (vec!["--threshold", "inf"], "allowed a finite number"),
        (vec!["--iterations", "0"], "--iterations <ITERATIONS>"),
    ] {
        let mut all = vec!["compare", "--preset", "lecture17", "--out", dir, "--quiet"];
        all.extend(args.iter().copied());
        let o = grpo_lab(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!out.join("runs").exists(), "{args:?}: nothing may run");
    }
}

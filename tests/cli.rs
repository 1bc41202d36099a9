//! The command line as a user (and the checks) call it.

mod common;

use common::temp_dir;
use std::process::Command;

fn grpo_lab(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .args(args)
        .output()
        .unwrap()
}

/// `grpo-lab train --device cpu --quiet --out dir` with `args` (a preset, its overrides), in
/// the background, and a SIGINT for it.
fn spawn_train(args: &[&str], dir: &str) -> (std::process::Child, impl Fn(&std::process::Child)) {
    let child = Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .arg("train")
        .args(args)
        .args(["--device", "cpu", "--quiet", "--out", dir])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let int = |child: &std::process::Child| {
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
    };
    (child, int)
}

/// `grpo-lab train --quiet --device cpu` with `extra`.
fn train_cpu(extra: &[&str]) -> std::process::Output {
    let mut a = vec!["train", "--quiet", "--device", "cpu"];
    a.extend_from_slice(extra);
    grpo_lab(&a)
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn score_json_gives_reward_and_parts() {
    let o = grpo_lab(&[
        "score",
        "--reward",
        "inclusion_ordering",
        "--prompt",
        "3,1,0,2",
        "--response",
        "0,3,1,2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["reward"], 6.0);
    assert_eq!(v["parts"]["inclusion"], 4.0);
    assert_eq!(v["parts"]["ordering"], 2.0);
    let o = grpo_lab(&[
        "score",
        "--reward",
        "distance",
        "--prompt",
        "3,1,0,2",
        "--response",
        "7,2,2,5",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["reward"], 1.0);
    let o = grpo_lab(&[
        "score",
        "--reward",
        "exact",
        "--prompt",
        "3,1,0,2",
        "--response",
        "0,1,2,3",
    ]);
    assert!(stdout(&o).contains("exact: 1"), "{}", stdout(&o));
    // Tokens the tokenizer does not hold, an empty number, a prompt past task.n's 64: refused.
    for (prompt, response, needle) in [
        ("1024,7", "7,1024", "allowed 0..=1023"),
        ("1,,2", "1,2", "--prompt"),
        ("1,2", "1,1024", "--response: 1024: allowed 0..=1023"),
        (&["1"; 65].join(","), "1", "allowed 1..=64"),
    ] {
        let o = grpo_lab(&[
            "score",
            "--reward",
            "exact",
            "--prompt",
            prompt,
            "--response",
            response,
        ]);
        assert_eq!(o.status.code(), Some(2), "{prompt}");
        assert!(stderr(&o).contains(needle), "{prompt}: {}", stderr(&o));
    }
}

#[test]
fn advantages_json_gives_every_mode() {
    let o = grpo_lab(&["advantages", "--rewards", "1,2,2,5", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for mode in [
        "raw",
        "centered",
        "normalized",
        "max",
        "rloo",
        "batch_normalized",
    ] {
        assert_eq!(v[mode].as_array().map(|a| a.len()), Some(4), "{mode}");
    }
    assert_eq!(v["centered"][0], -1.5);
    assert_eq!(v["max"][3], 5.0);
    let o = grpo_lab(&["advantages", "--rewards", "-1,-3,-1", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["rloo"][1], -2.0);
    // Rewards whose std overflows f32 are refused, not printed as an infinite std and zeros.
    let o = grpo_lab(&["advantages", "--rewards", "1e20,2e20,3e20"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stderr(&o).contains("overflows f32"), "{}", stderr(&o));
    assert!(
        grpo_lab(&["advantages", "--rewards", "1e15,2e15,3e15"])
            .status
            .success()
    );
}

#[test]
fn objective_refuses_what_it_would_ignore_or_cannot_mean() {
    let o = grpo_lab(&[
        "objective",
        "--loss",
        "clipped",
        "--logp",
        "0.5,-1",
        "--old-logp",
        "-1,-1",
        "--advantage",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("--logp: token 0 has 0.5"),
        "{}",
        stderr(&o)
    );
    // Keys outside the objective, or the loss given twice: refused, naming the flag.
    for (set, needle) in [
        ("task.n=3", "only algorithm.* keys"),
        ("algorithm.loss=naive", "given by --loss"),
    ] {
        let o = grpo_lab(&[
            "objective",
            "--loss",
            "clipped",
            "--logp",
            "-1",
            "--old-logp",
            "-1",
            "--advantage",
            "1",
            "--set",
            set,
        ]);
        assert_eq!(o.status.code(), Some(2), "{set}");
        assert!(stderr(&o).contains(needle), "{set}: {}", stderr(&o));
    }
}

#[test]
fn bad_input_is_named_with_exit_code_2() {
    let out = temp_dir("cli-bad");
    let out = out.to_str().unwrap();
    let o = grpo_lab(&["train", "--preset", "lecture99", "--out", out]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("lecture99") && stderr(&o).contains("lecture17"),
        "{}",
        stderr(&o)
    );
    let o = grpo_lab(&[
        "train",
        "--preset",
        "lecture17",
        "--set",
        "algorithm.advantag=raw",
        "--out",
        out,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("algorithm.advantage"), "{}", stderr(&o));
    let o = grpo_lab(&[
        "train",
        "--preset",
        "lecture17",
        "--set",
        "algorithm.advantage=best",
        "--out",
        out,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("algorithm.advantage") && stderr(&o).contains("normalized"),
        "{}",
        stderr(&o)
    );
    let o = grpo_lab(&[
        "train",
        "--preset",
        "lecture17",
        "--device",
        "tpu",
        "--out",
        out,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("software"), "{}", stderr(&o));
    let o = grpo_lab(&[
        "score",
        "--reward",
        "closeness",
        "--prompt",
        "1",
        "--response",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("inclusion_ordering"), "{}", stderr(&o));
    assert!(!std::path::Path::new(out).join("metrics.jsonl").exists());
}

/// Values serde cannot read, a section given a value, counts past what a machine can start,
/// and flags a command would ignore: each refused with exit 2, naming what is allowed, before
/// anything runs (a thread count past the OS's limits aborted the process).
#[test]
fn bad_values_and_ignored_flags_are_refused_naming_what_is_allowed() {
    let out = temp_dir("cli-bad-values");
    let dir = out.to_str().unwrap();
    let train = |set: &str| {
        grpo_lab(&[
            "train",
            "--preset",
            "lecture17",
            "--device",
            "cpu",
            "--quiet",
            "--set",
            set,
            "--out",
            dir,
        ])
    };
    for (set, needles) in [
        ("algorithm.mu=abc", &["algorithm.mu", "allowed"][..]),
        ("run.iterations=-5", &["run.iterations", "allowed"][..]),
        ("algorithm=1", &["a section", "algorithm.advantage"][..]),
        ("run.threads=100000", &["run.threads", "1024"][..]),
    ] {
        let o = train(set);
        assert_eq!(o.status.code(), Some(2), "{set}: {}", stderr(&o));
        for needle in needles {
            assert!(stderr(&o).contains(needle), "{set}: {}", stderr(&o));
        }
    }
    assert!(!out.join("config.toml").exists());
    for (args, needle) in [
        (
            vec![
                "bench",
                "--preset",
                "lecture17",
                "--device",
                "cpu",
                "--threads",
                "100000",
            ],
            "allowed 0..=1024",
        ),
        (
            vec!["bench", "--preset", "lecture17", "--iterations", "0"],
            "allowed an integer ≥ 1",
        ),
        (vec!["bench-rollout", "--vocab", "1"], "allowed 2..=1024"),
        (
            vec!["gradient-lab", "--preset", "lecture17", "--budget", "0"],
            "--budget 0",
        ),
        (
            vec![
                "gradient-lab",
                "--preset",
                "lecture17",
                "--device",
                "software",
            ],
            "on the CPU",
        ),
        (
            vec!["gradient-lab", "--preset", "lecture17", "--kernels", "gpu"],
            "on the CPU",
        ),
    ] {
        let o = grpo_lab(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

/// Output into a reader that stops early (`grpo-lab advantages … | head -1`) ends the process
/// quietly, by SIGPIPE as other tools do, where it panicked with a backtrace.
#[cfg(target_os = "linux")]
#[test]
fn a_closed_pipe_ends_the_output_without_a_panic() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    // ~1 MB of output: far past a pipe's buffer, so the writer is still writing when the
    // reader goes.
    let rewards: Vec<String> = (0..20_000).map(|i| (i % 5).to_string()).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .args(["advantages", "--rewards", &rewards.join(",")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 64];
    let mut out = child.stdout.take().unwrap();
    out.read_exact(&mut first).unwrap();
    drop(out);
    let o = child.wait_with_output().unwrap();
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    assert_eq!(o.status.signal(), Some(13), "{:?}", o.status);
}

#[test]
fn train_writes_the_run_and_refuses_to_overwrite() {
    let out = temp_dir("cli-train");
    let dir = out.to_str().unwrap();
    let args = [
        "train",
        "--preset",
        "lecture17",
        "--set",
        "run.iterations=2",
        "--seed",
        "3",
        "--device",
        "cpu",
        "--quiet",
        "--out",
        dir,
    ];
    let o = grpo_lab(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in [
        "config.toml",
        "metrics.jsonl",
        "metrics.csv",
        "summary.json",
        "charts/reward.png",
        "charts/kl.svg",
        "checkpoints/latest",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    assert!(stdout(&o).contains("charts/reward.png"), "{}", stdout(&o));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert!(summary["final_reward_mean"].is_number() && summary["final_accuracy"].is_number());
    let first: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    for key in [
        "iteration",
        "step",
        "reward/mean",
        "reward/std",
        "kl",
        "entropy",
        "loss",
        "frac_reward_zero_std",
        "completions/mean_length",
    ] {
        assert!(first.get(key).is_some(), "metrics.jsonl lacks {key}");
    }
    let config = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(
        config.contains("seed = 3") && config.contains("iterations = 2"),
        "{config}"
    );
    // An existing run is refused without --resume or --force, and nothing is lost.
    let before = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let o = grpo_lab(&args);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--resume") && stderr(&o).contains("--force"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        before,
        std::fs::read_to_string(out.join("metrics.jsonl")).unwrap()
    );
}

/// Ctrl-C, and SIGTERM as a scheduler or `timeout` sends it (SIGHUP too), finish the iteration,
/// keep its metrics and write a checkpoint; exit 130.
#[test]
fn ctrl_c_flushes_metrics_and_writes_a_checkpoint() {
    for signal in ["INT", "TERM"] {
        let out = temp_dir(&format!("cli-sig{signal}"));
        let dir = out.to_str().unwrap();
        let (mut child, _) = spawn_train(
            &[
                "--preset",
                "lecture17",
                "--set",
                "run.iterations=100000",
                "--set",
                "run.checkpoint_every=0",
            ],
            dir,
        );
        // Wait until it is training for real.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while std::fs::metadata(out.join("metrics.jsonl"))
            .map(|m| m.len() < 2000)
            .unwrap_or(true)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the run never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Command::new("kill")
            .args([format!("-{signal}"), child.id().to_string()])
            .status()
            .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(130),
            "SIG{signal}: an interrupted run exits 130 once it has saved"
        );
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(summary["status"], "interrupted");
        let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
        let iteration = summary["iterations"].as_u64().unwrap();
        assert!(iteration > 0);
        assert_eq!(latest.trim(), format!("iter-{iteration:06}"));
        let lines = std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .count();
        assert_eq!(
            lines as u64,
            iteration * 10,
            "SIG{signal}: metrics must cover every finished iteration"
        );
    }
}

/// Ctrl-C during the last iteration: the iteration finishes, and so has the run — completed,
/// exit 0, its every step and its last checkpoint written (not "interrupted", exit 130).
#[test]
fn ctrl_c_in_the_last_iteration_completes_the_run() {
    let out = temp_dir("cli-sig-last");
    let dir = out.to_str().unwrap();
    // One iteration of 1 000 steps over groups of 4 096: the signal comes inside it.
    let (child, int) = spawn_train(
        &[
            "--preset",
            "lecture17",
            "--set",
            "run.iterations=1",
            "--set",
            "algorithm.mu=1000",
            "--set",
            "algorithm.num_generations=4096",
        ],
        dir,
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::metadata(out.join("metrics.jsonl")).map_or(true, |m| m.len() == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    int(&child);
    let o = child.wait_with_output().unwrap();
    assert!(
        stderr(&o).contains("finishing this iteration"),
        "the signal came after the run: {}",
        stderr(&o)
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["status"], "completed");
    let lines = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(lines, 1000);
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "iter-000001");
}

/// The cold start is one engine call that no step boundary interrupts: a second Ctrl-C there
/// ends the process at once (exit 130), with the initial checkpoint and no metrics, which a
/// resume redoes.
#[test]
fn a_second_ctrl_c_in_the_cold_start_stops_at_once() {
    let out = temp_dir("cli-sigint-cold");
    let dir = out.to_str().unwrap();
    let (mut child, int) = spawn_train(
        &["--preset", "transformer-sort", "--set", "sft.steps=20000"],
        dir,
    );
    let secs = std::time::Duration::from_secs;
    // The initial checkpoint is written right before the cold start.
    let deadline = std::time::Instant::now() + secs(120);
    while !out.join("checkpoints/latest").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    int(&child);
    std::thread::sleep(std::time::Duration::from_millis(300));
    int(&child);
    // 20 000 supervised steps take minutes; stopped at once, it is gone within seconds.
    let deadline = std::time::Instant::now() + secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("a second Ctrl-C in the cold start did not stop the run");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130));
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "iter-000000");
    assert_eq!(std::fs::read(out.join("metrics.jsonl")).unwrap().len(), 0);
}

#[test]
fn devices_lists_adapters() {
    let o = grpo_lab(&["devices"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("--device auto picks"));
    assert!(
        !stderr(&o).contains("XDG_RUNTIME_DIR"),
        "noisy probing: {}",
        stderr(&o)
    );
    // --json: the adapters, and auto's pick for each model's preset with the line's reason.
    let o = grpo_lab(&["devices", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["adapters"].is_array(), "{v}");
    let text = stdout(&grpo_lab(&["devices"]));
    for preset in ["lecture17", "transformer-sort"] {
        let (device, why) = (&v["auto"][preset]["device"], &v["auto"][preset]["why"]);
        let line = format!(
            "picks for {preset}: {} ({})",
            device.as_str().unwrap(),
            why.as_str().unwrap()
        );
        assert!(text.contains(&line), "{line} not in {text}");
    }
}

/// `bench` on lecture17, the CPU, two iterations.
const BENCH_LECTURE17: [&str; 7] = [
    "bench",
    "--preset",
    "lecture17",
    "--device",
    "cpu",
    "--iterations",
    "2",
];

#[test]
fn bench_json_reports_ms_per_step() {
    let o = grpo_lab(&[&BENCH_LECTURE17[..], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["ms_per_step"].as_f64().unwrap() > 0.0);
    // What else the machine ran meanwhile, per phase: null where a phase was too short for
    // the kernel's 10 ms ticks (these are) or /proc does not tell, else shares in [0, 1].
    let load = v["host_load"].as_object().expect("host_load");
    for phase in ["timed", "first_step", "burn", "pytorch"] {
        let l = &load[phase];
        assert!(
            l.is_null()
                || [l["steal_share"].as_f64(), l["others_share"].as_f64()]
                    .iter()
                    .all(|s| s.is_some_and(|s| (0.0..=1.0).contains(&s))),
            "{phase}: {l}"
        );
    }
    // `--vs-burn` on the CPU times burn's path, not the fused engine against itself.
    let o = grpo_lab(&[&BENCH_LECTURE17[..], &["--vs-burn", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let (ours, burn) = (
        v["engine"].as_str().unwrap(),
        v["burn_engine"].as_str().unwrap(),
    );
    assert!(
        ours.contains("fused") && burn.contains("burn") && !burn.contains("fused"),
        "{ours} / {burn}"
    );
}

/// `bench --scaling DIR --axes threads` sweeps the threads alone (its rows, no size axis's);
/// `--axes` needs `--scaling` and names its values when given another.
#[test]
fn bench_scaling_axes_threads_sweeps_the_threads_alone() {
    let dir = temp_dir("cli-scaling-threads");
    let sweep = ["--scaling", dir.to_str().unwrap(), "--axes", "threads"];
    let o = grpo_lab(&[&BENCH_LECTURE17[..], &sweep].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = std::fs::read_to_string(dir.join("scaling.csv")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert!(!rows.is_empty(), "{csv}");
    assert!(rows.iter().all(|r| r.starts_with("threads,")), "{csv}");
    assert!(rows[0].starts_with("threads,1,"), "{csv}");
    assert!(
        stdout(&o).contains("fused threads =   1:"),
        "{}",
        stdout(&o)
    );

    let o = grpo_lab(&["bench", "--preset", "lecture17", "--axes", "threads"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--scaling"), "{}", stderr(&o));
    let o = grpo_lab(&[
        "bench",
        "--preset",
        "lecture17",
        "--scaling",
        "x",
        "--axes",
        "thread",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("sizes, threads"), "{}", stderr(&o));
}

/// `bench --pytorch` on the transformer: refused (exit 2, naming the setting) for what the
/// PyTorch loop does not implement, refused when its greedy answers at init disagree with
/// ours (a stand-in "python" that prints someone else's answers), and — when torch is
/// installed — a ratio with its spread and both parts tables.
#[test]
fn bench_pytorch_transformer_compares_only_equal_models() {
    let o = grpo_lab(&[
        "bench",
        "--preset",
        "transformer-sort",
        "--device",
        "cpu",
        "--iterations",
        "1",
        "--pytorch",
        "python3",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("algorithm.dynamic_sampling=false"),
        "{}",
        stderr(&o)
    );

    let dir = temp_dir("cli-fake-python");
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("python");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho '{\"model\": \"transformer\", \"greedy\": [[0, 1, 2, 3, 4, 10]], \"ms_per_step\": 1.0}'\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let o = grpo_lab(&[
        "bench",
        "--preset",
        "transformer-sort",
        "--device",
        "cpu",
        "--iterations",
        "1",
        "--set",
        "algorithm.dynamic_sampling=false",
        "--set",
        "sft.steps=2",
        "--pytorch",
        fake.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("greedy answers at init: not comparing"),
        "{}",
        stderr(&o)
    );

    let has_torch = Command::new("python3")
        .args(["-c", "import torch"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_torch {
        eprintln!("skipped the PyTorch run: python3 cannot import torch");
        return;
    }
    let o = grpo_lab(&[
        "bench",
        "--preset",
        "transformer-sort",
        "--device",
        "cpu",
        "--iterations",
        "1",
        "--set",
        "algorithm.dynamic_sampling=false",
        "--set",
        "sft.steps=4",
        "--pytorch",
        "python3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["ratio_vs_pytorch"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["ratio_range"].as_array().unwrap().len(), 2);
    let p = &v["pytorch"];
    for part in [
        "rollout",
        "old_ref_logp",
        "forward_backward",
        "optimizer",
        "evaluation",
    ] {
        assert!(
            p["parts_ms_per_step"][part].as_f64().unwrap() >= 0.0,
            "{part}: {p}"
        );
    }
    assert!(p["no_cache"]["ms_per_step"].as_f64().unwrap() > 0.0, "{p}");
    assert!(p["peak_rss_mib"].as_f64().unwrap() > 0.0);
    assert!(v["parts_ms_per_step"]["step"].as_f64().unwrap() > 0.0);
}

#[test]
fn no_adapter_falls_back_to_the_cpu_backend_with_one_line() {
    // `auto` without a hardware GPU: the CPU engines, said once, and why.
    // WGPU_BACKEND=dx12 on Linux: wgpu sees no adapter at all.
    let out = temp_dir("cli-noadapter");
    let o = Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .env("WGPU_BACKEND", "dx12")
        .args([
            "train",
            "--preset",
            "lecture17",
            "--set",
            "run.iterations=1",
            "--device",
            "auto",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.matches("engine: ").count(), 1, "{err}");
    assert!(
        err.contains("engine: fused CPU lecture step") && err.contains("no hardware GPU"),
        "{err}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .env("WGPU_BACKEND", "dx12")
        .args([
            "train",
            "--preset",
            "lecture17",
            "--device",
            "software",
            "--out",
            out.to_str().unwrap(),
            "--force",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("lavapipe") && !stderr(&o).contains("panicked"),
        "{}",
        stderr(&o)
    );
}

/// `--resume` continues a run as recorded: both forms the README gives work, only a longer
/// `run.iterations` may be set, every other change is refused by name, and a hand-edited
/// `config.toml` is refused against the checkpoint's.
#[test]
fn resume_takes_only_what_keeps_it_the_same_run() {
    let out = temp_dir("cli-resume-flags");
    let dir = out.to_str().unwrap();
    let train = train_cpu;
    let o = train(&[
        "--preset",
        "lecture17",
        "--set",
        "run.iterations=2",
        "--out",
        dir,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The README's two forms.
    let o = train(&["--out", dir, "--resume"]);
    assert!(o.status.success(), "--out DIR --resume: {}", stderr(&o));
    let o = train(&["--resume", dir]);
    assert!(o.status.success(), "--resume DIR: {}", stderr(&o));
    // Extending is allowed, and recorded in config.toml.
    let o = train(&["--resume", dir, "--set", "run.iterations=3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(lines, 30);
    assert!(
        std::fs::read_to_string(out.join("config.toml"))
            .unwrap()
            .contains("iterations = 3")
    );
    // A run at its end resumed runs nothing and keeps its summary (its time per step).
    let summary = std::fs::read_to_string(out.join("summary.json")).unwrap();
    let o = train(&["--resume", dir]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("NaN"), "{}", stdout(&o));
    assert!(stderr(&o).contains("nothing to run"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(out.join("summary.json")).unwrap(),
        summary
    );
    // --dry-run validates the resumed config and changes nothing (it trained before).
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let o = train(&["--resume", dir, "--set", "run.iterations=5", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("is valid"), "{}", stdout(&o));
    assert_eq!(
        std::fs::read_to_string(out.join("metrics.jsonl")).unwrap(),
        metrics
    );
    assert!(
        std::fs::read_to_string(out.join("config.toml"))
            .unwrap()
            .contains("iterations = 3")
    );
    // Anything else is refused, naming what: flags that would not apply too.
    let other = temp_dir("cli-resume-flags-other");
    for (args, needle) in [
        (vec!["--set", "optimizer.lr=0.5"], "optimizer.lr=0.5"),
        (vec!["--seed", "7"], "--seed"),
        (vec!["--preset", "scaled"], "--preset"),
        (vec!["--set", "run.iterations=2"], "below the 3 iterations"),
        (vec!["--force"], "--force"),
        (
            vec!["--out", other.to_str().unwrap()],
            "names another directory",
        ),
    ] {
        let mut a = vec!["--resume", dir];
        a.extend(args.iter().copied());
        let o = train(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        // Refused before the run's banner: nothing was set up.
        assert!(
            !stderr(&o).contains(" steps → "),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert!(!other.join("config.toml").exists());
    assert_eq!(
        std::fs::read_to_string(out.join("metrics.jsonl")).unwrap(),
        metrics
    );
    // A hand edit of the stored config: refused against the checkpoint, naming the field.
    let toml = std::fs::read_to_string(out.join("config.toml")).unwrap();
    std::fs::write(
        out.join("config.toml"),
        toml.replace("lr = 0.001", "lr = 0.01"),
    )
    .unwrap();
    let o = train(&["--resume", dir]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("optimizer.lr"), "{}", stderr(&o));
    assert!(!stderr(&o).contains(" steps → "), "{}", stderr(&o));
}

/// A resume says where it goes on from, and how many records logged past that checkpoint it
/// redoes (they were dropped without a word).
#[test]
fn resume_says_where_it_goes_on_and_what_it_redoes() {
    let out = temp_dir("cli-resume-says");
    let dir = out.to_str().unwrap();
    let run = train_cpu;
    let o = run(&[
        "--preset",
        "lecture17",
        "--set",
        "run.iterations=3",
        "--set",
        "run.checkpoint_every=1",
        "--out",
        dir,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(out.join("checkpoints/iter-000003")).unwrap();
    let o = run(&["--resume", dir]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "resuming after iteration 2 (step 20); the 10 records logged after that checkpoint are redone"
        ),
        "{}",
        stderr(&o)
    );
    let lines = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(lines, 30);
}

/// `--set run.engine=…` on `--resume`, like `--device`, moves a run to another engine that
/// continues its checkpoint: the transformer from the WGSL engine (lavapipe) to the fused CPU
/// engine and back, each leg extending the same metrics; burn's path, which cannot continue
/// their Adam state, is refused naming the ways that can.
#[test]
fn resume_moves_a_run_between_the_wgsl_and_the_fused_engine() {
    if common::wgpu_compute().is_none() {
        return;
    }
    let out = temp_dir("cli-resume-engines");
    let dir = out.to_str().unwrap();
    let train = |extra: &[&str]| {
        let mut a = vec!["train", "--quiet"];
        a.extend_from_slice(extra);
        grpo_lab(&a)
    };
    let mut first = vec![
        "--preset",
        "transformer-sort",
        "--device",
        "software",
        "--out",
        dir,
    ];
    for set in [
        "run.engine=wgsl",
        "run.iterations=2",
        "run.checkpoint_every=1",
        "run.eval_every=0",
        "algorithm.prompts_per_iteration=4",
        "sft.steps=4",
        "sft.examples=32",
        "sft.batch_size=16",
    ] {
        first.extend(["--set", set]);
    }
    let o = train(&first);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines = || {
        grpo_lab::train::read_metrics(&out.join("metrics.jsonl"))
            .unwrap()
            .iter()
            .map(|r| r.iteration)
            .collect::<Vec<_>>()
    };
    let per = lines().len() / 2;
    assert!(per >= 1);
    // `--resume DIR` on `device` (the recorded one where None) with `sets`.
    let resume = |device: Option<&str>, sets: &[&str]| {
        let mut a = vec!["--resume", dir];
        if let Some(d) = device {
            a.extend(["--device", d]);
        }
        for set in sets {
            a.extend(["--set", set]);
        }
        train(&a)
    };
    let o = resume(Some("cpu"), &["run.engine=auto", "run.iterations=3"]);
    assert!(o.status.success(), "to the fused engine: {}", stderr(&o));
    assert!(
        stderr(&o).contains("fused CPU transformer"),
        "{}",
        stderr(&o)
    );
    // Where it moved is recorded: a plain `--resume` goes on there, even with nothing to
    // extend (a run already at its end continues nothing and stays as it is).
    let o = resume(None, &[]);
    assert!(o.status.success(), "plain resume: {}", stderr(&o));
    assert!(
        stderr(&o).contains("fused CPU transformer"),
        "{}",
        stderr(&o)
    );
    assert_eq!(lines().len(), 3 * per);
    let o = resume(Some("software"), &["run.engine=wgsl"]);
    assert!(
        o.status.success(),
        "moved back, nothing to run: {}",
        stderr(&o)
    );
    let toml = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(toml.contains("engine = \"wgsl\""), "{toml}");
    let o = resume(None, &["run.iterations=4"]);
    assert!(
        o.status.success(),
        "back to the WGSL engine: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("WGSL transformer"), "{}", stderr(&o));
    let its = lines();
    assert_eq!(its.len(), 4 * per, "{its:?}");
    assert!(its.windows(2).all(|w| w[0] <= w[1]), "{its:?}");
    assert!(
        std::fs::read_to_string(out.join("config.toml"))
            .unwrap()
            .contains("iterations = 4")
    );
    let o = resume(Some("software"), &["run.engine=burn", "run.iterations=5"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("fused_adam.bin") && err.contains("run.engine=wgsl"),
        "{err}"
    );
    assert_eq!(lines().len(), 4 * per, "a refused resume writes nothing");
}

/// Every bad input is exit 2 naming what: zero or absurd sizes in `bench-rollout` (they
/// panicked), a prompt space too small for the splits asked for (it exited 1).
#[test]
fn bad_sizes_are_refused_with_exit_2() {
    for (flag, value) in [
        ("--prompts", "0"),
        ("--n", "0"),
        ("--vocab", "0"),
        ("--generations", "0"),
    ] {
        let o = grpo_lab(&["bench-rollout", "--device", "cpu", flag, value]);
        assert_eq!(o.status.code(), Some(2), "{flag}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(flag) && !stderr(&o).contains("panicked"),
            "{}",
            stderr(&o)
        );
    }
    let out = temp_dir("cli-small-space");
    let random_sort = |sets: &[&str]| {
        let mut a = vec![
            "train",
            "--preset",
            "random-sort",
            "--device",
            "cpu",
            "--quiet",
        ];
        for set in sets {
            a.extend(["--set", set]);
        }
        a.extend(["--out", out.to_str().unwrap()]);
        grpo_lab(&a)
    };
    let o = random_sort(&[
        "task.n=3",
        "task.vocab=3",
        "task.allow_repeats=false",
        "task.train_size=30",
        "task.heldout_size=8",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("distinct prompts"), "{}", stderr(&o));
    // Refused before anything is written: the corrected command needs no --force.
    assert!(!out.join("config.toml").exists());
    let o = random_sort(&["run.iterations=1"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Absurd sizes are refused before anything is allocated (they aborted the process), naming
/// the fields that drive the estimate; `--dry-run` prints the estimate.
#[test]
fn absurd_sizes_are_refused_by_their_memory_estimate() {
    let out = temp_dir("cli-absurd");
    for (preset, set, field) in [
        (
            "random-sort",
            "task.train_size=1000000000",
            "task.train_size",
        ),
        ("transformer-sort", "model.d_ff=1000000000", "model.d_ff"),
        (
            "transformer-sort",
            "sft.batch_size=1000000000",
            "sft.batch_size",
        ),
        // train_size + heldout_size past i64::MAX panicked with "capacity overflow".
        (
            "random-sort",
            "task.train_size=9223372036854775000",
            "task.train_size",
        ),
    ] {
        let o = grpo_lab(&[
            "train",
            "--preset",
            preset,
            "--set",
            set,
            "--device",
            "cpu",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
            "--force",
        ]);
        assert_eq!(o.status.code(), Some(2), "{set}: {}", stderr(&o));
        // More random prompts than exist is refused before the estimate, by the same field.
        let why = if field == "task.train_size" {
            "distinct prompts"
        } else {
            "MiB"
        };
        assert!(
            stderr(&o).contains(field) && stderr(&o).contains(why),
            "{set}: {}",
            stderr(&o)
        );
        assert!(!out.join("config.toml").exists(), "{set}: nothing written");
    }
    let o = grpo_lab(&["train", "--preset", "lecture17", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("total") && stdout(&o).contains("MiB"),
        "{}",
        stdout(&o)
    );
    let o = grpo_lab(&[
        "train",
        "--preset",
        "scaled",
        "--dry-run",
        "--set",
        "run.max_memory_mib=1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("run.max_memory_mib"), "{}", stderr(&o));
}

/// What the engine cannot run on the device, and an `--out` that cannot be a directory, are
/// refused with exit 2 before the run says anything or writes a file, by `--dry-run` as by the
/// run; `--dry-run` names the engine that would run.
#[test]
fn refusals_come_before_the_run_starts() {
    // What the engine cannot run on the device is refused by --dry-run as by the run: exit 2,
    // before the run says anything or writes a file (the run exited 1 after its start line).
    let engine_out = temp_dir("cli-engine-refused");
    let engine_dir = engine_out.to_str().unwrap();
    for (args, why) in [
        (
            &["--device", "cpu", "--set", "run.engine=wgsl"][..],
            "needs a wgpu device",
        ),
        (
            &[
                "--device",
                "software",
                "--set",
                "run.engine=wgsl",
                "--set",
                "algorithm.loss=gmpo",
            ][..],
            "does not cover this config",
        ),
    ] {
        for dry in [true, false] {
            let mut a = vec!["train", "--preset", "lecture17", "--out", engine_dir];
            a.extend(args);
            if dry {
                a.push("--dry-run");
            }
            let o = grpo_lab(&a);
            assert_eq!(o.status.code(), Some(2), "{a:?}: {}", stderr(&o));
            assert!(stderr(&o).contains(why), "{a:?}: {}", stderr(&o));
            assert!(!stderr(&o).contains(" steps → "), "{a:?}: {}", stderr(&o));
            assert!(!engine_out.join("config.toml").exists(), "{a:?}");
        }
    }
    // An --out that cannot be a directory is the user's to change (exit 2, --out named), its
    // OS error said once (it was printed twice, exit 1).
    let file = engine_out.join("a-file");
    std::fs::create_dir_all(&engine_out).unwrap();
    std::fs::write(&file, "hi").unwrap();
    let o = grpo_lab(&[
        "train",
        "--preset",
        "lecture17",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--out"), "{}", stderr(&o));
    assert_eq!(stderr(&o).matches("os error").count(), 1, "{}", stderr(&o));
    let o = grpo_lab(&[
        "train",
        "--preset",
        "lecture17",
        "--device",
        "cpu",
        "--dry-run",
    ]);
    assert!(
        stderr(&o).contains("engine: fused CPU lecture step"),
        "{}",
        stderr(&o)
    );
}

/// The gradient lab as the issue asks for it: `--json` with `"exact": true` on lecture17,
/// every estimator's record, the KL against its estimators; `--out` writes the report and the
/// charts; `--checkpoint` studies a run's saved policy; `--dry-run` prints the estimate (the
/// transformer's with its own defaults) and an over-cap size is refused naming what drives it.
#[test]
fn gradient_lab_reports_every_estimator_against_the_exact_gradient() {
    let out = temp_dir("cli-gradient-lab");
    let small = [
        "--batches",
        "8",
        "--budget",
        "64",
        "--group-sizes",
        "2,64",
        "--quiet",
    ];
    let mut args = vec!["gradient-lab", "--preset", "lecture17", "--json"];
    args.extend_from_slice(&small);
    args.extend_from_slice(&["--out", out.to_str().unwrap()]);
    let o = grpo_lab(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["exact"], true);
    assert!(v["true_grad_norm"].as_f64().unwrap() > 0.0);
    let est = v["estimators"].as_array().unwrap();
    assert_eq!(est.len(), 2 * 5, "2 group sizes × 5 modes");
    for key in [
        "name",
        "G",
        "cosine_mean",
        "cosine_std",
        "snr",
        "bias",
        "variance",
    ] {
        assert!(est.iter().all(|e| !e[key].is_null()), "{key}");
    }
    for key in ["exact", "k1", "k2", "k3"] {
        assert!(
            v["kl"][key].as_f64().unwrap() > 0.0,
            "kl.{key}: at iteration 20 π ≠ π_ref"
        );
    }
    for file in [
        "gradient-lab.json",
        "gradient-lab.txt",
        "gradient-lab-cosine.svg",
        "gradient-lab-snr.png",
    ] {
        assert!(out.join(file).exists(), "{file}");
    }
    // A run's checkpoint: θ_old is the saved policy, the reference the run's.
    let run = out.join("run");
    let o = grpo_lab(&[
        "train",
        "--quiet",
        "--device",
        "cpu",
        "--preset",
        "lecture17",
        "--set",
        "run.iterations=2",
        "--out",
        run.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut args = vec!["gradient-lab", "--checkpoint", run.to_str().unwrap()];
    args.extend_from_slice(&small);
    let o = grpo_lab(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("truth: exact"), "{}", stdout(&o));
    // θ_old is named at the checkpoint's iteration (it said iteration 0).
    assert!(
        stdout(&o).contains("θ_old at iteration 2"),
        "{}",
        stdout(&o)
    );
    // The run's own config: a preset would not apply.
    args.extend_from_slice(&["--preset", "scaled"]);
    let o = grpo_lab(&args);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--preset"), "{}", stderr(&o));
    let o = grpo_lab(&["gradient-lab", "--preset", "lecture17", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("gradient evaluations") && stdout(&o).contains("MiB"));
    let o = grpo_lab(&[
        "gradient-lab",
        "--preset",
        "lecture17",
        "--dry-run",
        "--budget",
        "4194304",
        "--group-sizes",
        "2",
        "--set",
        "run.max_memory_mib=64",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--budget") && stderr(&o).contains("run.max_memory_mib"),
        "{}",
        stderr(&o)
    );
    // The transformer's lab (a sampled truth) has its own defaults and estimate.
    let o = grpo_lab(&["gradient-lab", "--preset", "transformer-sort", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("the truth's passes")
            && stdout(&o).contains("1250 gradient evaluations"),
        "{}",
        stdout(&o)
    );
}

//! Smoke runs of the real trainer: determinism, resume, backends, the lecture's behaviour.

mod common;

use common::*;
use grpo_lab::config::{AdvantageMode, RunConfig};
use grpo_lab::gpu::Compute;
use grpo_lab::train::{self, RunOptions};

fn run_to(
    config: RunConfig,
    compute: Compute,
    dir: &std::path::Path,
) -> grpo_lab::train::RunOutcome {
    train::run(
        config,
        compute,
        RunOptions {
            out: dir.to_path_buf(),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Continue the run in `dir` from its last checkpoint.
fn resume_in(
    config: &RunConfig,
    compute: Compute,
    dir: &std::path::Path,
) -> Result<grpo_lab::train::RunOutcome, grpo_lab::train::RunError> {
    train::run(
        config.clone(),
        compute,
        RunOptions {
            out: dir.to_path_buf(),
            resume: true,
            ..Default::default()
        },
    )
}

#[test]
fn same_seed_same_metrics_on_cpu_and_wgpu() {
    let config = short_lecture(4);
    let mut backends = vec![("cpu", Compute::cpu())];
    if let Some(w) = wgpu_compute() {
        backends.push(("wgpu", w));
    }
    for (name, compute) in backends {
        let a = temp_dir(&format!("det-a-{name}"));
        let b = temp_dir(&format!("det-b-{name}"));
        run_to(config.clone(), compute.clone(), &a);
        run_to(config.clone(), compute, &b);
        let ma = metrics_without_timing(&a.join("metrics.jsonl"));
        assert_eq!(ma.len(), 40);
        assert_eq!(
            ma,
            metrics_without_timing(&b.join("metrics.jsonl")),
            "{name}: same seed, different metrics"
        );
        let c = temp_dir(&format!("det-c-{name}"));
        let mut other = config.clone();
        other.run.seed += 1;
        run_to(other, Compute::cpu(), &c);
        assert_ne!(ma, metrics_without_timing(&c.join("metrics.jsonl")));
    }
}

/// The wgpu and CPU backends agree within a stated tolerance on a short run: the same
/// sampled responses (so the same rewards) and losses within 1e-4 relative.
#[test]
fn wgpu_and_cpu_agree() {
    let Some(wgpu) = wgpu_compute() else { return };
    let mut config = short_lecture(3);
    // burn's autodiff on both backends (the fused CPU step has its own test, tests/fused.rs;
    // the WGSL engine tests/wgsl_engine.rs).
    config.run.fused_step = grpo_lab::config::FusedChoice::Off;
    config.run.engine = grpo_lab::config::EngineChoice::Burn;
    let (a, b) = (temp_dir("agree-cpu"), temp_dir("agree-wgpu"));
    run_to(config.clone(), Compute::cpu(), &a);
    run_to(config, wgpu, &b);
    let ra = train::read_metrics(&a.join("metrics.jsonl")).unwrap();
    let rb = train::read_metrics(&b.join("metrics.jsonl")).unwrap();
    assert_eq!(ra.len(), rb.len());
    for (x, y) in ra.iter().zip(&rb) {
        assert_eq!(
            x.reward_mean, y.reward_mean,
            "step {}: rewards differ",
            x.step
        );
        if let (Some(gx), Some(gy)) = (&x.groups, &y.groups) {
            for (a, b) in gx.iter().zip(gy) {
                assert_eq!(
                    (&a.responses, &a.rewards),
                    (&b.responses, &b.rewards),
                    "step {}: sampled groups differ",
                    x.step
                );
                for (mode, va) in &a.advantages {
                    for (p, q) in va.iter().zip(&b.advantages[mode]) {
                        assert!(
                            (p - q).abs() <= 1e-5 * p.abs().max(1.0),
                            "step {}: {mode} {p} vs {q}",
                            x.step
                        );
                    }
                }
            }
        }
        for (name, p, q) in [
            ("loss", x.loss, y.loss),
            ("entropy", x.entropy, y.entropy),
            ("grad_norm", x.grad_norm, y.grad_norm),
        ] {
            assert!(
                (p - q).abs() <= 1e-4 * (1.0 + p.abs()),
                "step {}: {name} {p} vs {q}",
                x.step
            );
        }
    }
}

#[test]
fn resume_continues_bit_identically() {
    let mut config = short_lecture(6);
    config.run.checkpoint_every = 3;
    let full = temp_dir("resume-full");
    run_to(config.clone(), Compute::cpu(), &full);

    // Stop after 3 iterations (as an interrupted run would), then resume to 6.
    let part = temp_dir("resume-part");
    let mut short = config.clone();
    short.run.iterations = 3;
    run_to(short, Compute::cpu(), &part);
    // On the CPU backend lecture17 takes the fused step, whose Adam state is checkpointed too.
    assert!(
        std::fs::read_dir(part.join("checkpoints"))
            .unwrap()
            .flatten()
            .any(|e| e.path().join("fused_adam.bin").exists())
    );
    std::fs::write(part.join("config.toml"), config.to_toml()).unwrap();
    resume_in(&config, Compute::cpu(), &part).unwrap();
    assert_eq!(
        metrics_without_timing(&full.join("metrics.jsonl")),
        metrics_without_timing(&part.join("metrics.jsonl"))
    );
}

#[test]
fn existing_run_dir_is_refused_without_force() {
    let dir = temp_dir("exists");
    run_to(short_lecture(1), Compute::cpu(), &dir);
    let e = train::run(
        short_lecture(1),
        Compute::cpu(),
        RunOptions {
            out: dir.clone(),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("--force"), "{e}");
    train::run(
        short_lecture(1),
        Compute::cpu(),
        RunOptions {
            out: dir,
            force: true,
            ..Default::default()
        },
    )
    .unwrap();
}

#[test]
fn diverging_run_stops_and_keeps_metrics_and_checkpoint() {
    let dir = temp_dir("nan");
    let mut config = short_lecture(3);
    config.model.init_scale = 1e30; // logits overflow: the loss is not finite at once
    let e = train::run(
        config,
        Compute::cpu(),
        RunOptions {
            out: dir.clone(),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("step 1"), "{e}");
    // The diverged step's record is logged, its loss null: what blew up shows.
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert_eq!(lines[0]["step"], 1);
    assert!(lines[0]["loss"].is_null(), "{}", lines[0]);
    assert!(lines[0]["reward/mean"].is_number(), "{}", lines[0]);
    assert!(dir.join("checkpoints/latest").exists());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["status"], "diverged at step 1");
}

/// The lecture's qualitative result on a fixed seed: reward rises above the random policy,
/// entropy falls (collapse toward one answer per prompt), the reward stays below 5.
#[test]
fn lecture17_centered_learns_and_collapses_below_max() {
    let mut config = RunConfig::preset("lecture17").unwrap();
    config.algorithm.advantage = AdvantageMode::Centered;
    config.run.log_groups = 3;
    let dir = temp_dir("lecture");
    let out = run_to(config, Compute::cpu(), &dir);
    let records = train::read_metrics(&dir.join("metrics.jsonl")).unwrap();
    assert_eq!(records.len(), 1000);
    let first = &records[0];
    let last = records.last().unwrap();
    assert!(
        last.reward_mean > first.reward_mean,
        "{} -> {}",
        first.reward_mean,
        last.reward_mean
    );
    assert!(
        last.entropy < 0.5 * first.entropy,
        "entropy {} -> {}",
        first.entropy,
        last.entropy
    );
    assert!(out.summary.final_reward_mean < 5.0);
    assert!(out.summary.final_reward_mean > 2.0);
    // Every group logged in full (on each iteration's last step), every advantage mode present.
    assert!(
        records
            .iter()
            .all(|r| r.groups.is_some() == (r.step_in_iteration == 9))
    );
    let groups = records[9].groups.as_ref().unwrap();
    assert_eq!(groups[0].logp.len(), 10);
    assert_eq!(groups[0].old_logp[0].len(), 3);
    assert_eq!(groups.len(), 3);
    assert_eq!(groups[0].responses.len(), 10);
    assert_eq!(groups[0].advantages.len(), AdvantageMode::GROUP.len());
}

#[test]
fn charts_are_written() {
    let dir = temp_dir("charts");
    let out = train::run(
        short_lecture(2),
        Compute::cpu(),
        RunOptions {
            out: dir.clone(),
            charts: true,
            ..Default::default()
        },
    )
    .unwrap();
    for stem in [
        "reward",
        "advantages",
        "kl",
        "entropy",
        "length",
        "accuracy",
    ] {
        for ext in ["png", "svg"] {
            let p = dir.join("charts").join(format!("{stem}.{ext}"));
            assert!(
                std::fs::metadata(&p)
                    .map(|m| m.len() > 1000)
                    .unwrap_or(false),
                "{}",
                p.display()
            );
        }
    }
    assert_eq!(out.charts.len(), 12);
}

/// lecture17, seed 5: the WGSL kernel path and the Rust reference path sample the same
/// tokens and give the same rewards and advantages, record for record.
#[test]
fn kernel_and_reference_paths_give_the_same_rollouts() {
    let Some(wgpu) = wgpu_compute() else { return };
    let mut config = RunConfig::preset("lecture17").unwrap();
    config.run.iterations = 30;
    // burn's path with the rollout kernels (the WGSL engine samples with the same kernel:
    // tests/wgsl_engine.rs).
    config.run.engine = grpo_lab::config::EngineChoice::Burn;
    let mut paths = Vec::new();
    for kernels in [
        grpo_lab::config::KernelChoice::Gpu,
        grpo_lab::config::KernelChoice::Reference,
    ] {
        let mut c = config.clone();
        c.run.kernels = kernels;
        let dir = temp_dir(&format!("kernels-{kernels}"));
        run_to(c, wgpu.clone(), &dir);
        paths.push(train::read_metrics(&dir.join("metrics.jsonl")).unwrap());
    }
    assert_eq!(paths[0].len(), 300);
    for (a, b) in paths[0].iter().zip(&paths[1]) {
        assert_eq!(a.reward_mean, b.reward_mean, "step {}", a.step);
        assert_eq!(
            a.groups, b.groups,
            "step {}: groups (responses, rewards, advantages) differ",
            a.step
        );
        assert_eq!(a.loss, b.loss, "step {}", a.step);
    }
}

#[test]
fn kernels_gpu_on_the_cpu_backend_is_a_clear_error() {
    let mut c = short_lecture(1);
    c.run.kernels = grpo_lab::config::KernelChoice::Gpu;
    let e = grpo_lab::grpo::Trainer::new(c, Compute::cpu())
        .err()
        .unwrap();
    assert!(e.to_string().contains("--kernels reference"), "{e}");
}

/// Resume survives what a crash leaves: a `latest` that is empty or names a directory without
/// `state.json` (it takes the newest complete checkpoint) and a `metrics.jsonl` whose last
/// line was cut short (dropped); it refuses to start over a run it cannot continue, and
/// refuses metrics with records missing before the checkpoint.
#[test]
fn resume_survives_a_broken_latest_and_a_torn_last_line() {
    let mut config = short_lecture(6);
    config.run.checkpoint_every = 3;
    let full = temp_dir("broken-full");
    run_to(config.clone(), Compute::cpu(), &full);
    let resume = |dir: &std::path::Path| resume_in(&config, Compute::cpu(), dir);
    // A run killed in iteration 4: checkpoints 0 and 3, the metrics of 4½ iterations, the
    // last line cut in the middle.
    let crashed = |name: &str| {
        let part = temp_dir(&format!("broken-{name}"));
        run_to(config.clone(), Compute::cpu(), &part);
        let ck = part.join("checkpoints");
        std::fs::remove_dir_all(ck.join("iter-000006")).unwrap();
        std::fs::write(ck.join("latest"), "iter-000003").unwrap();
        let jsonl = part.join("metrics.jsonl");
        let text = std::fs::read_to_string(&jsonl).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut cut = lines[..45].join("\n");
        cut.push('\n');
        cut.push_str(&lines[45][..lines[45].len() / 2]);
        std::fs::write(&jsonl, cut).unwrap();
        part
    };
    for (name, damage) in [
        ("torn-line", ""),
        ("empty-latest", "latest"),
        ("no-state", "state"),
        ("escaping-latest", "escape"),
    ] {
        let part = crashed(name);
        let ck = part.join("checkpoints");
        match damage {
            "latest" => std::fs::write(ck.join("latest"), "").unwrap(),
            // latest names a directory a crash left without state.json: the newest complete
            // one (iter-000003) is taken.
            "state" => {
                std::fs::create_dir_all(ck.join("iter-000004")).unwrap();
                std::fs::write(ck.join("latest"), "iter-000004").unwrap();
            }
            // latest names another run's checkpoint (it verifies, and is further on): passed
            // over, as a name of one path component is all `latest` may hold.
            "escape" => {
                let other = full.file_name().unwrap().to_str().unwrap();
                let name = format!("../../{other}/checkpoints/iter-000006");
                assert!(ck.join(&name).join("state.json").exists() || ck.join(&name).is_dir());
                std::fs::write(ck.join("latest"), name).unwrap();
            }
            _ => {}
        }
        resume(&part).unwrap();
        assert_eq!(
            metrics_without_timing(&full.join("metrics.jsonl")),
            metrics_without_timing(&part.join("metrics.jsonl")),
            "{name}"
        );
    }
    // Records missing before the checkpoint: an error naming them, nothing rewritten.
    let part = crashed("gap");
    let jsonl = part.join("metrics.jsonl");
    let text = std::fs::read_to_string(&jsonl).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .enumerate()
        .filter(|(i, _)| *i != 12)
        .map(|(_, l)| l)
        .collect();
    std::fs::write(&jsonl, kept.join("\n")).unwrap();
    let before = std::fs::read_to_string(&jsonl).unwrap();
    let e = resume(&part).unwrap_err();
    assert!(e.to_string().contains("step 13"), "{e}");
    assert_eq!(std::fs::read_to_string(&jsonl).unwrap(), before);
    // No checkpoint at all but metrics: refused, and the metrics are kept.
    let part = temp_dir("broken-none");
    run_to(config.clone(), Compute::cpu(), &part);
    let before = std::fs::read_to_string(part.join("metrics.jsonl")).unwrap();
    std::fs::remove_dir_all(part.join("checkpoints")).unwrap();
    let e = resume(&part).unwrap_err();
    assert!(
        e.is_user_error() && e.to_string().contains("no readable checkpoint"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(part.join("metrics.jsonl")).unwrap(),
        before
    );
}

/// Charts read `metrics.jsonl` thinned to whole, evenly spaced iterations (memory flat for
/// any run length); a short run comes back whole, the last iteration always.
#[test]
fn charts_read_a_bounded_evenly_spaced_sample() {
    let dir = temp_dir("decimated");
    let mut config = short_lecture(37);
    config.algorithm.mu = 2;
    run_to(config, Compute::cpu(), &dir);
    let path = dir.join("metrics.jsonl");
    let all = train::read_metrics(&path).unwrap();
    assert_eq!(
        train::run::read_metrics_decimated(&path, 100)
            .unwrap()
            .len(),
        all.len()
    );
    let thin = train::run::read_metrics_decimated(&path, 4).unwrap();
    let its: Vec<usize> = thin
        .iter()
        .filter(|r| r.step_in_iteration == 0)
        .map(|r| r.iteration)
        .collect();
    assert!(its.len() <= 9 + 1, "{its:?}");
    assert_eq!(*its.last().unwrap(), 36, "{its:?}");
    let stride = its[1] - its[0];
    assert!(
        its[..its.len() - 1]
            .windows(2)
            .all(|w| w[1] - w[0] == stride),
        "{its:?}"
    );
    // Once thinned, an iteration keeps its first step and the step that logged its groups
    // (here the last of μ = 2): both.
    assert_eq!(thin.len(), 2 * its.len());
}

/// A checkpoint file altered after it was written (a bit flipped, same size) or deleted does
/// not load: resume says so, falls back to the newest checkpoint that verifies, and the run
/// still ends exactly as an uninterrupted one.
#[test]
fn resume_falls_back_past_a_checkpoint_that_does_not_verify() {
    let mut config = short_lecture(6);
    config.run.checkpoint_every = 3;
    let full = temp_dir("verify-full");
    run_to(config.clone(), Compute::cpu(), &full);
    for (name, damage) in [("flip", "policy.bpk"), ("gone", "fused_adam.bin")] {
        let part = temp_dir(&format!("verify-{name}"));
        run_to(config.clone(), Compute::cpu(), &part);
        let ck = part.join("checkpoints");
        // Killed in iteration 4; then iter-000003 damaged.
        std::fs::remove_dir_all(ck.join("iter-000006")).unwrap();
        std::fs::write(ck.join("latest"), "iter-000003").unwrap();
        let jsonl = part.join("metrics.jsonl");
        let text = std::fs::read_to_string(&jsonl).unwrap();
        let keep: Vec<&str> = text.lines().take(45).collect();
        std::fs::write(&jsonl, keep.join("\n") + "\n").unwrap();
        let file = ck.join("iter-000003").join(damage);
        if name == "flip" {
            let mut bytes = std::fs::read(&file).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x10;
            std::fs::write(&file, bytes).unwrap();
        } else {
            std::fs::remove_file(&file).unwrap();
        }
        resume_in(&config, Compute::cpu(), &part).unwrap();
        assert_eq!(
            metrics_without_timing(&full.join("metrics.jsonl")),
            metrics_without_timing(&part.join("metrics.jsonl")),
            "{name}"
        );
        assert!(
            ck.join("iter-000006").join("manifest.json").exists(),
            "{name}"
        );
    }
}

/// A checkpoint resumes on the engine that can continue it exactly: one written on burn's
/// path (here lavapipe) continues on burn's path with its Adam state even where `auto` would
/// pick the fused CPU step; one written by the fused step refuses burn's path, saying which
/// device continues it, instead of restarting Adam silently.
#[test]
fn a_checkpoint_continues_on_an_engine_that_holds_its_optimizer_state() {
    let Some(wgpu) = wgpu_compute() else {
        eprintln!("no wgpu adapter: skipped");
        return;
    };
    let mut config = short_lecture(2);
    // burn's path on lavapipe (the WGSL engine writes the fused engine's checkpoint format).
    config.run.engine = grpo_lab::config::EngineChoice::Burn;
    let resume = |dir: &std::path::Path, compute: Compute| resume_in(&config, compute, dir);
    let on_wgpu = temp_dir("engine-wgpu");
    run_to(config.clone(), wgpu.clone(), &on_wgpu);
    let out = resume(&on_wgpu, Compute::cpu()).unwrap();
    assert!(
        out.summary.device.starts_with("burn autodiff"),
        "{}",
        out.summary.device
    );
    let on_cpu = temp_dir("engine-cpu");
    run_to(config.clone(), Compute::cpu(), &on_cpu);
    let e = resume(&on_cpu, wgpu).unwrap_err();
    assert!(e.to_string().contains("--device cpu"), "{e}");
}

/// A resume from an older checkpoint (here the initial one: `latest` still named it when a
/// kill came between writing iter-000003 and updating `latest`) leaves that checkpoint as it
/// is — rewritten, its bytes would differ (burn records fresh parameter ids) and a kill
/// mid-rewrite would leave nothing that verifies — and drops the later ones at once: their
/// timeline is abandoned, and the metrics past the resume point are redone, so they must
/// never be a fallback. The run still ends exactly as an uninterrupted one.
#[test]
fn a_resume_keeps_its_checkpoint_and_drops_the_abandoned_later_ones() {
    let mut config = short_lecture(6);
    config.run.checkpoint_every = 3;
    let full = temp_dir("abandon-full");
    run_to(config.clone(), Compute::cpu(), &full);
    let part = temp_dir("abandon-part");
    let mut short = config.clone();
    short.run.iterations = 4;
    run_to(short, Compute::cpu(), &part);
    let ck = part.join("checkpoints");
    assert!(ck.join("iter-000003").is_dir());
    std::fs::write(ck.join("latest"), "iter-000000").unwrap();
    let initial = std::fs::read(ck.join("iter-000000").join("policy.bpk")).unwrap();
    // Resumed from iter-000000 and stopped at 2 iterations: nothing past 2 may be left.
    let mut two = config.clone();
    two.run.iterations = 2;
    resume_in(&two, Compute::cpu(), &part).unwrap();
    assert_eq!(
        std::fs::read(ck.join("iter-000000").join("policy.bpk")).unwrap(),
        initial,
        "the checkpoint resumed from was rewritten"
    );
    let left: Vec<String> = std::fs::read_dir(&ck)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("iter-") && n.as_str() > "iter-000002")
        .collect();
    assert!(
        left.is_empty(),
        "checkpoints of the abandoned timeline: {left:?}"
    );
    resume_in(&config, Compute::cpu(), &part).unwrap();
    assert_eq!(
        metrics_without_timing(&full.join("metrics.jsonl")),
        metrics_without_timing(&part.join("metrics.jsonl"))
    );
}

/// `Trainer::run_iteration` (the CLI's loop: steps 1–5, then the μ optimizer steps) and
/// `Trainer::step` (the app's, one step at a time) are the same iteration: the same records, bit
/// for bit (timing aside), on the fused engine and on burn's path.
#[test]
fn run_iteration_and_single_steps_give_the_same_records() {
    use grpo_lab::grpo::Trainer;
    let strip = |r: &grpo_lab::metrics::StepRecord| {
        let mut v = serde_json::to_value(r).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("step_time_secs");
        o.remove("tokens_per_second");
        v
    };
    for fused in ["auto", "off"] {
        let config = short_lecture(3)
            .with_overrides(&[format!("run.fused_step={fused}")])
            .unwrap();
        let mut by_step = Trainer::new(config.clone(), Compute::cpu()).unwrap();
        let mut stepped = Vec::new();
        while !by_step.is_done() {
            stepped.push(strip(&by_step.step().unwrap()));
        }
        let mut whole = Trainer::new(config.clone(), Compute::cpu()).unwrap();
        let mut iterated = Vec::new();
        while !whole.is_done() {
            assert!(whole.at_iteration_boundary());
            whole
                .run_iteration(|r| {
                    iterated.push(strip(&r));
                    true
                })
                .unwrap();
        }
        assert_eq!(iterated.len(), config.total_steps(), "fused_step = {fused}");
        assert_eq!(iterated, stepped, "fused_step = {fused}");
    }
}

/// `metrics.csv` of the run in `dir` against its `metrics.jsonl`, cell for cell: every scalar
/// key of the JSONL is a column (`step_in_iteration` too), a number equals the JSONL's as an
/// `f32`, and a cell is empty exactly where the JSONL has `null` or leaves the key out.
/// Returns the CSV's rows without its wall-clock columns.
fn csv_checked_against_jsonl(dir: &std::path::Path) -> Vec<Vec<String>> {
    let csv = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let jsonl = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), records.len());
    for (i, (row, record)) in rows.iter().zip(&records).enumerate() {
        assert_eq!(row.len(), header.len(), "row {i}");
        let record = record.as_object().unwrap();
        for (key, value) in record {
            if !value.is_array() && !value.is_object() {
                assert!(header.contains(&key.as_str()), "{key} is not in the CSV");
            }
        }
        for (name, cell) in header.iter().zip(row) {
            match record.get(*name) {
                None | Some(serde_json::Value::Null) => {
                    assert_eq!(*cell, "", "row {i} {name}: null in the JSONL")
                }
                Some(v) => {
                    let want = v.as_f64().unwrap() as f32;
                    let got: f32 = cell
                        .parse()
                        .unwrap_or_else(|e| panic!("row {i} {name}: {cell:?}: {e}"));
                    assert_eq!(got, want, "row {i} {name}");
                }
            }
        }
    }
    let timing = |name: &&str| matches!(*name, "step_time_secs" | "tokens_per_second");
    rows.iter()
        .map(|row| {
            header
                .iter()
                .zip(row)
                .filter(|(n, _)| !timing(n))
                .map(|(_, c)| c.to_string())
                .collect()
        })
        .collect()
}

/// A lecture17 run logs values that were not measured (no correct answer yet, no critic,
/// pass@k on its eval iterations only, a replay buffer's): `metrics.csv` leaves them empty as
/// the JSONL writes them `null`, in every column alike, and carries `step_in_iteration`. A
/// resumed run rebuilds its CSV from the JSONL: the same CSV as the uninterrupted run's.
#[test]
fn metrics_csv_says_what_the_jsonl_says_cell_for_cell() {
    let mut config = short_lecture(6);
    config.algorithm.replay_buffer = 4;
    config.run.eval_every = 4;
    config.run.checkpoint_every = 3;
    let full = temp_dir("csv-full");
    run_to(config.clone(), Compute::cpu(), &full);
    let want = csv_checked_against_jsonl(&full);
    let csv = std::fs::read_to_string(full.join("metrics.csv")).unwrap();
    assert!(
        csv.starts_with("iteration,step,step_in_iteration,"),
        "{csv}"
    );
    assert!(!csv.contains("NaN"), "{csv}");
    // Both kinds of missing value occur, and so the check above covered them.
    let jsonl = std::fs::read_to_string(full.join("metrics.jsonl")).unwrap();
    assert!(jsonl.contains("\"completions/mean_length_correct\":null"));
    assert!(jsonl.contains("\"replay/size\""));
    assert!(!jsonl.lines().all(|l| l.contains("\"eval/pass@1\"")));

    let part = temp_dir("csv-part");
    let mut short = config.clone();
    short.run.iterations = 3;
    run_to(short, Compute::cpu(), &part);
    std::fs::write(part.join("config.toml"), config.to_toml()).unwrap();
    resume_in(&config, Compute::cpu(), &part).unwrap();
    assert_eq!(csv_checked_against_jsonl(&part), want);

    // A diverged run's values that are really not finite: empty cells as well.
    let diverged = temp_dir("csv-diverged");
    let mut config = short_lecture(3);
    config.model.init_scale = 1e30;
    train::run(
        config,
        Compute::cpu(),
        RunOptions {
            out: diverged.clone(),
            ..Default::default()
        },
    )
    .unwrap_err();
    csv_checked_against_jsonl(&diverged);
}

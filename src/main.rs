//! The `grpo-lab` command line. Library errors are handled here, once: user errors
//! (bad config, bad arguments, an existing run directory, a diverged run) exit with 2.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use grpo_lab::config::{AdvantageMode, DeviceChoice, KernelChoice, RewardKind, RunConfig};
use grpo_lab::gpu::Compute;
use grpo_lab::grpo::{Trainer, advantage};
use grpo_lab::report::stats::{median, quantile};
use grpo_lab::task::{RewardFn, SortTokenizer};
use grpo_lab::train::{self, RunOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "grpo-lab",
    version,
    about = "GRPO on the sorting toy task: train, score, compare, benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Open the desktop app (the default when a display is available).
    App(AppArgs),
    /// Train a policy with GRPO; writes config, metrics, checkpoints, summary and charts to --out.
    Train(TrainArgs),
    /// Run a config × seed matrix (or an experiment file) in parallel; write summary.md/csv and overlay charts.
    Compare(CompareArgs),
    /// Score one response with a verifier: the reward and its parts.
    Score {
        #[arg(long, value_parser = parse_reward)]
        reward: RewardKind,
        /// Comma-separated numbers, e.g. 3,1,0,2
        #[arg(long)]
        prompt: String,
        /// Comma-separated numbers (may be empty or of another length than the prompt).
        #[arg(long, allow_hyphen_values = true)]
        response: String,
        #[arg(long)]
        json: bool,
    },
    /// Every advantage mode for one group of rewards.
    Advantages {
        /// Comma-separated rewards, e.g. 1,2,2,5
        #[arg(long, allow_hyphen_values = true)]
        rewards: String,
        #[arg(long)]
        json: bool,
    },
    /// List every wgpu adapter and what `--device auto` picks.
    Devices {
        #[arg(long)]
        json: bool,
    },
    /// Time the GRPO step of a preset (median ms per optimizer step, its share of rollout included).
    Bench(BenchArgs),
    /// Time rollout + verify + advantages on random logits: the WGSL kernels against the Rust reference.
    BenchRollout(BenchRolloutArgs),
}

#[derive(Args)]
struct BenchRolloutArgs {
    #[arg(long, default_value_t = 4096)]
    prompts: usize,
    #[arg(long, default_value_t = 16)]
    generations: usize,
    #[arg(long, default_value_t = 8)]
    n: usize,
    #[arg(long, default_value_t = 16)]
    vocab: usize,
    #[arg(long, default_value_t = 7)]
    repeats: usize,
    /// gpu or software (the kernels need a wgpu adapter)
    #[arg(long, value_parser = parse_device, default_value = "auto")]
    device: DeviceChoice,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ConfigArgs {
    /// A preset from assets/experiments (lecture17, scaled, random-sort, transformer-sort, length-bias, r1-vs-r1-zero).
    #[arg(long)]
    preset: Option<String>,
    /// A TOML config file (applied over the preset, if both are given).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one key, e.g. --set algorithm.advantage=centered (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    #[arg(long)]
    seed: Option<u64>,
    /// auto | gpu | software | cpu
    #[arg(long, value_parser = parse_device)]
    device: Option<DeviceChoice>,
    /// Sampling, verifier and advantages: auto | gpu (WGSL kernels) | reference (plain Rust)
    #[arg(long, value_parser = parse_kernels)]
    kernels: Option<KernelChoice>,
}

#[derive(Args)]
struct AppArgs {
    /// Start from this preset instead of the last session's config.
    #[arg(long)]
    preset: Option<String>,
    #[arg(long, value_parser = parse_device)]
    device: Option<DeviceChoice>,
    /// Start training at once.
    #[arg(long)]
    play: bool,
    /// Measure the app's own work per frame for SECS seconds while training lecture17 at full
    /// speed (100k steps), print a JSON report and close.
    #[arg(long, value_name = "SECS")]
    measure: Option<f64>,
}

#[derive(Args)]
struct TrainArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Run directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in DIR (or in --out) from its last checkpoint.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "")]
    resume: Option<PathBuf>,
    /// Overwrite an existing run in --out.
    #[arg(long)]
    force: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct CompareArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// An experiment file from assets/experiments (lecture-table, loss-modes, kl-beta, difficulty-bias, sparse-vs-shaped, entropy-collapse, bug-gallery, length-bias, r1-vs-r1-zero, dynamic-sampling).
    #[arg(long)]
    experiment: Option<String>,
    /// An axis of the matrix: KEY=V1,V2,... (repeatable: several make a grid).
    #[arg(long = "vary", value_name = "KEY=V1,V2")]
    vary: Vec<String>,
    /// Seeds: A..B or a list (default 0..5, or the experiment's).
    #[arg(long)]
    seeds: Option<String>,
    #[arg(long)]
    out: PathBuf,
    /// Parallel runs (default: the number of cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Discard finished runs in --out and start over.
    #[arg(long)]
    force: bool,
    /// Override every run's iteration count (a smoke test of the matrix).
    #[arg(long)]
    iterations: Option<usize>,
    /// Reward threshold for "iterations to reach".
    #[arg(long)]
    threshold: Option<f64>,
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Iterations to time (after one warm-up iteration).
    #[arg(long, default_value_t = 10)]
    iterations: usize,
    #[arg(long)]
    json: bool,
    /// Also time the vectorized PyTorch reference (bench/reference, `pip install ./bench/reference`)
    /// with this Python, on the same weights and prompts, and report the ratio.
    #[arg(long, value_name = "PYTHON")]
    pytorch: Option<String>,
    /// Threads for PyTorch (the baseline is 1).
    #[arg(long, default_value_t = 1)]
    pytorch_threads: usize,
    /// Scaling curves instead: step time as B×G, n and D grow around the preset, a log-log
    /// chart and a table written to this directory.
    #[arg(long, value_name = "DIR")]
    scaling: Option<std::path::PathBuf>,
}

fn parse_list(s: &str) -> Result<Vec<u32>, String> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            x.trim()
                .parse::<u32>()
                .map_err(|e| format!("`{x}`: {e} (expected e.g. 3,1,0,2)"))
        })
        .collect()
}

fn parse_floats(s: &str) -> Result<Vec<f32>, String> {
    s.split(',')
        .map(|x| {
            let v = x
                .trim()
                .parse::<f32>()
                .map_err(|e| format!("`{x}`: {e} (expected e.g. 1,2,2,5)"))?;
            if v.is_finite() {
                Ok(v)
            } else {
                Err(format!("`{x}` is not finite"))
            }
        })
        .collect()
}

fn parse_reward(s: &str) -> Result<RewardKind, String> {
    RewardKind::parse(s).ok_or_else(|| {
        format!("unknown reward `{s}`; allowed: distance, inclusion_ordering, exact")
    })
}

fn parse_kernels(s: &str) -> Result<KernelChoice, String> {
    KernelChoice::parse(s)
        .ok_or_else(|| format!("unknown kernels `{s}`; allowed: auto, gpu, reference"))
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    DeviceChoice::parse(s)
        .ok_or_else(|| format!("unknown device `{s}`; allowed: auto, gpu, software, cpu"))
}

/// A user error: printed as is, exit code 2.
#[derive(Debug)]
struct UserError(String);
impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UserError {}

fn user(e: impl std::fmt::Display) -> anyhow::Error {
    UserError(e.to_string()).into()
}

fn build_config(args: &ConfigArgs) -> Result<RunConfig> {
    let mut config = match (&args.preset, &args.config) {
        (Some(p), _) => RunConfig::preset(p).map_err(user)?,
        (None, Some(_)) => RunConfig::default(),
        (None, None) => {
            return Err(user(
                "give --preset NAME or --config FILE (presets: lecture17, scaled, random-sort, transformer-sort, length-bias, r1-vs-r1-zero)",
            ));
        }
    };
    if let Some(path) = &args.config {
        // The file alone must be a valid config (errors name the file and the key) ...
        RunConfig::from_file(path).map_err(user)?;
        // ... then its own keys go over the preset's, section by section.
        let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
        let table: toml::Table = toml::from_str(&text).map_err(user)?;
        let mut merged = toml::Table::try_from(&config).expect("serializes");
        for (k, v) in table {
            match (merged.get_mut(&k), v) {
                (Some(toml::Value::Table(base)), toml::Value::Table(over)) => base.extend(over),
                (_, v) => {
                    merged.insert(k, v);
                }
            }
        }
        config = RunConfig::from_table(merged).map_err(user)?;
    }
    config = config.with_overrides(&args.sets).map_err(user)?;
    if let Some(seed) = args.seed {
        config.run.seed = seed;
    }
    if let Some(device) = args.device {
        config.run.device = device;
    }
    if let Some(kernels) = args.kernels {
        config.run.kernels = kernels;
    }
    config.validate().map_err(user)?;
    Ok(config)
}

fn open_device(choice: DeviceChoice) -> Result<Compute> {
    Compute::select(choice).map_err(user)
}

fn train_cmd(args: TrainArgs) -> Result<()> {
    train::install_interrupt_handler();
    let resume_dir = args.resume.as_ref().map(|p| {
        if p.as_os_str().is_empty() {
            None
        } else {
            Some(p.clone())
        }
    });
    let out = match (&resume_dir, &args.out) {
        (Some(Some(dir)), _) => dir.clone(),
        (_, Some(out)) => out.clone(),
        (Some(None), None) => {
            return Err(user(
                "--resume needs a directory: --resume DIR or --out DIR --resume",
            ));
        }
        (None, None) => return Err(user("give --out DIR for the run's files")),
    };
    let resume = resume_dir.is_some();
    let config = if resume {
        let stored = out.join("config.toml");
        RunConfig::from_file(&stored).map_err(user)?
    } else {
        build_config(&args.config)?
    };
    let compute = open_device(args.config.device.unwrap_or(config.run.device))?;
    eprintln!(
        "grpo-lab: {} · {} · seed {} · {} iterations × {} steps → {}",
        config.run.name,
        compute.label,
        config.run.seed,
        config.run.iterations,
        config.algorithm.mu,
        out.display()
    );
    let outcome = train::run(
        config,
        compute,
        RunOptions {
            out,
            resume,
            force: args.force,
            progress: !args.quiet,
            sender: None,
            charts: true,
        },
    )
    .map_err(|e| if e.is_user_error() { user(e) } else { e.into() })?;
    let s = &outcome.summary;
    println!(
        "{}: final reward {:.3} (max {}), train accuracy {:.2}{}, {:.2} ms/step, {}",
        s.name,
        s.final_reward_mean,
        s.max_reward,
        s.final_accuracy,
        s.final_heldout_accuracy
            .map(|a| format!(", held-out accuracy {a:.2}"))
            .unwrap_or_default(),
        s.ms_per_step,
        s.status
    );
    println!("run directory: {}", outcome.out.display());
    println!(
        "metrics:       {}",
        outcome.out.join("metrics.jsonl").display()
    );
    println!(
        "summary:       {}",
        outcome.out.join("summary.json").display()
    );
    for chart in outcome
        .charts
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
    {
        println!("chart:         {}", chart.display());
    }
    Ok(())
}

fn score_cmd(reward: RewardKind, prompt: &str, response: &str, json: bool) -> Result<()> {
    let prompt = parse_list(prompt).map_err(|e| user(format!("--prompt: {e}")))?;
    let response = parse_list(response).map_err(|e| user(format!("--response: {e}")))?;
    if prompt.is_empty() {
        return Err(user("--prompt is empty"));
    }
    let r = RewardFn::single(reward).score(&prompt, &response);
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let tok = SortTokenizer::load()?;
        println!("prompt   {}", tok.decode(&prompt));
        println!("response {}", tok.decode(&response));
        println!(
            "truth    {}",
            tok.decode(&grpo_lab::task::sort::sorted(&prompt))
        );
        println!("{}: {}", reward.name(), r.reward);
        for (k, v) in &r.parts {
            println!("  {k}: {v}");
        }
    }
    Ok(())
}

fn advantages_cmd(rewards: &str, json: bool) -> Result<()> {
    let rewards = parse_floats(rewards).map_err(|e| user(format!("--rewards: {e}")))?;
    if rewards.is_empty() {
        return Err(user("--rewards is empty"));
    }
    let g = rewards.len();
    let all = advantage::all_advantages(&rewards, g);
    if json {
        println!("{}", serde_json::to_string(&all.by_mode)?);
    } else {
        let s = all.groups[0];
        println!(
            "rewards {rewards:?}: mean {:.4}, std (unbiased) {:.4}, max {}{}",
            s.mean,
            s.std,
            s.max,
            if s.zero_std {
                " — all equal: no learning signal"
            } else {
                ""
            }
        );
        for m in AdvantageMode::ALL {
            let v: Vec<String> = all.by_mode[m.name()]
                .iter()
                .map(|x| format!("{x:.4}"))
                .collect();
            println!("{:>17}: [{}]", m.name(), v.join(", "));
        }
    }
    Ok(())
}

fn devices_cmd(json: bool) -> Result<()> {
    let adapters = grpo_lab::gpu::context::list_adapters();
    if json {
        println!("{}", serde_json::to_string_pretty(&adapters)?);
        return Ok(());
    }
    if adapters.is_empty() {
        println!(
            "no wgpu adapter found (install lavapipe: apt-get install -y mesa-vulkan-drivers libvulkan1)"
        );
    }
    for (i, a) in adapters.iter().enumerate() {
        println!(
            "[{i}] {} — {} {} ({})",
            a.name, a.backend, a.device_type, a.driver
        );
        println!(
            "    max storage binding {} MiB, max buffer {} MiB, workgroup ≤ {} invocations, {} workgroups/dim, {} storage buffers/stage",
            a.max_storage_buffer_binding_size >> 20,
            a.max_buffer_size >> 20,
            a.max_compute_invocations_per_workgroup,
            a.max_compute_workgroups_per_dimension,
            a.max_storage_buffers_per_shader_stage
        );
    }
    println!("cpu — burn's pure-Rust CPU backend (--device cpu), always available");
    let hw = adapters.iter().any(|a| !a.is_software());
    let sw = adapters.iter().any(|a| a.is_software());
    println!(
        "--device auto picks: {}",
        if hw {
            "the hardware GPU"
        } else if sw {
            "the software adapter (lavapipe)"
        } else {
            "the CPU backend"
        }
    );
    Ok(())
}

/// Median ms per optimizer step (rollout share included) over `iterations` iterations after
/// one warm-up iteration.
fn time_config(mut config: RunConfig, compute: &Compute, iterations: usize) -> Result<f64> {
    config.run.iterations = iterations + 1;
    config.run.log_groups = 0;
    let mu = config.algorithm.mu;
    let mut trainer = Trainer::new(config, compute.clone()).map_err(user)?;
    for _ in 0..mu {
        trainer.step().map_err(user)?;
    }
    let mut per_step = Vec::new();
    for _ in 0..iterations {
        let t = std::time::Instant::now();
        for _ in 0..mu {
            trainer.step().map_err(user)?;
        }
        per_step.push(t.elapsed().as_secs_f64() * 1000.0 / mu as f64);
    }
    Ok(median(&per_step))
}

/// Step time as one dimension grows at a time around the preset; the local log-log slope
/// tells overhead-bound (≈ 0) from compute-bound (≈ 1 for B×G and n, ≈ 2 for D).
fn bench_scaling(args: &BenchArgs, out: &std::path::Path) -> Result<()> {
    let base = build_config(&args.config)?;
    let compute = open_device(base.run.device)?;
    let axes: [(&str, &str, Vec<usize>); 3] = [
        (
            "B·G",
            "algorithm.prompts_per_iteration",
            vec![1, 4, 16, 64, 256, 1024],
        ),
        ("n", "task.n", vec![4, 8, 16, 32]),
        ("D", "model.d_model", vec![8, 16, 32, 64, 128, 256]),
    ];
    let g = base.algorithm.num_generations;
    let mut series = Vec::new();
    let mut table = String::from("axis,value,size,ms_per_step,slope\n");
    println!(
        "scaling around {} on {} ({} iterations per point):",
        args.config.preset.as_deref().unwrap_or("config"),
        compute.label,
        args.iterations
    );
    for (name, key, values) in axes {
        let mut pts: Vec<(f64, f64)> = Vec::new();
        for v in values {
            let mut sets = vec![format!("{key}={v}")];
            if key == "algorithm.prompts_per_iteration" {
                sets.push(format!(
                    "task.train_size={}",
                    (v * 2).max(base.task.train_size)
                ));
            }
            let config = base.with_overrides(&sets).map_err(user)?;
            let ms = time_config(config, &compute, args.iterations)?;
            let size = if key == "algorithm.prompts_per_iteration" {
                v * g
            } else {
                v
            };
            let slope = pts
                .last()
                .map(|&(x0, y0)| (ms.log10() - y0) / ((size as f64).log10() - x0))
                .unwrap_or(f64::NAN);
            println!("  {name:>4} = {size:>6}: {ms:>9.3} ms/step   local slope {slope:>5.2}");
            table.push_str(&format!("{name},{v},{size},{ms:.4},{slope:.3}\n"));
            pts.push(((size as f64).log10(), ms.log10()));
        }
        series.push(grpo_lab::report::Series::line(
            format!("{name} (others at the preset)"),
            pts,
        ));
    }
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("scaling.csv"), table)?;
    let charts = grpo_lab::report::line_chart(
        out,
        "scaling",
        &format!("step time vs size on {} (log10–log10)", compute.label),
        "log10(size: B·G responses, n, or D)",
        "log10(ms per optimizer step)",
        &series,
    )?;
    println!("table: {}", out.join("scaling.csv").display());
    println!("chart: {}", charts[0].display());
    Ok(())
}

fn bench_cmd(args: BenchArgs) -> Result<()> {
    if let Some(out) = &args.scaling {
        return bench_scaling(&args, out);
    }
    let mut config = build_config(&args.config)?;
    config.run.iterations = args.iterations + 1;
    config.run.log_groups = 0;
    let compute = open_device(config.run.device)?;
    let mu = config.algorithm.mu;
    let mut trainer = Trainer::new(config.clone(), compute.clone()).map_err(user)?;
    let t0 = std::time::Instant::now();
    trainer.step().map_err(user)?;
    let first_step_ms = t0.elapsed().as_secs_f64() * 1000.0;
    while !trainer.at_iteration_boundary() {
        trainer.step().map_err(user)?;
    }
    let mut per_step = Vec::new();
    let mut rollout_steps = Vec::new();
    let mut plain_steps = Vec::new();
    let mut parts: Vec<grpo_lab::grpo::Timings> = Vec::new();
    for _ in 0..args.iterations {
        trainer.reset_timings();
        let t = std::time::Instant::now();
        for _ in 0..mu {
            let r = trainer.step().map_err(user)?;
            if r.step_in_iteration == 0 {
                rollout_steps.push(r.step_time_secs as f64 * 1000.0);
            } else {
                plain_steps.push(r.step_time_secs as f64 * 1000.0);
            }
        }
        per_step.push(t.elapsed().as_secs_f64() * 1000.0 / mu as f64);
        parts.push(trainer.timings());
    }
    let ms = median(&per_step);
    // Each part's share of one optimizer step (ms), median over the timed iterations.
    let part = |get: fn(&grpo_lab::grpo::Timings) -> f64| {
        median(
            &parts
                .iter()
                .map(|p| get(p) * 1000.0 / mu as f64)
                .collect::<Vec<_>>(),
        )
    };
    let parts_json = serde_json::json!({
        "rollout": part(|p| p.rollout),
        "advantages": part(|p| p.advantages),
        "old_ref_logp": part(|p| p.old_ref_logp),
        "evaluation": part(|p| p.evaluation),
        "forward_backward": part(|p| p.forward_backward),
        "optimizer": part(|p| p.optimizer),
    });
    let memory_mib = peak_rss_mib();
    let pytorch = match &args.pytorch {
        Some(python) => Some(pytorch_reference(python, &config, &trainer, &args)?),
        None => None,
    };
    let report = serde_json::json!({
        "preset": args.config.preset,
        "device": compute.label,
        "shape": {
            "prompts_per_iteration": config.batch_prompts(trainer.prompts.train.len()),
            "num_generations": config.algorithm.num_generations,
            "n": config.task.n, "vocab": config.task.vocab, "d_model": config.model.d_model, "mu": mu,
        },
        "iterations_timed": args.iterations,
        "ms_per_step": ms,
        "ms_per_step_p10": quantile(&per_step, 0.1),
        "ms_per_step_p90": quantile(&per_step, 0.9),
        "first_step_ms": first_step_ms,
        "rollout_step_ms": median(&rollout_steps),
        "optimizer_step_ms": median(&plain_steps),
        "parts_ms_per_step": parts_json,
        "peak_rss_mib": memory_mib,
        "pytorch": pytorch,
        "ratio_vs_pytorch": pytorch.as_ref().map(|p| ms / p["ms_per_step"].as_f64().unwrap_or(f64::NAN)),
        // The spread: our fast tail against PyTorch's slow one, and the other way round.
        "ratio_range": pytorch.as_ref().map(|p| {
            let theirs = |k: &str| p[k].as_f64().unwrap_or(f64::NAN);
            [
                quantile(&per_step, 0.1) / theirs("ms_per_step_p90"),
                quantile(&per_step, 0.9) / theirs("ms_per_step_p10"),
            ]
        }),
    });
    if args.json {
        println!("{report}");
    } else {
        println!(
            "{} on {}",
            args.config.preset.as_deref().unwrap_or("config"),
            compute.label
        );
        println!(
            "  ms/step (median, rollout share included): {:.3}  [p10 {:.3}, p90 {:.3}]",
            ms,
            report["ms_per_step_p10"].as_f64().unwrap_or(f64::NAN),
            report["ms_per_step_p90"].as_f64().unwrap_or(f64::NAN)
        );
        println!("  first step (kernel compilation): {:.1} ms", first_step_ms);
        println!(
            "  first step of an iteration (rollout + step): {:.3} ms; other steps: {:.3} ms",
            report["rollout_step_ms"].as_f64().unwrap_or(f64::NAN),
            report["optimizer_step_ms"].as_f64().unwrap_or(f64::NAN)
        );
        println!(
            "  parts per step (ms, median): rollout {:.3} · advantages {:.3} · log π_old/π_ref {:.3} · evaluation {:.3} · forward+backward {:.3} · optimizer {:.3}",
            parts_json["rollout"].as_f64().unwrap_or(f64::NAN),
            parts_json["advantages"].as_f64().unwrap_or(f64::NAN),
            parts_json["old_ref_logp"].as_f64().unwrap_or(f64::NAN),
            parts_json["evaluation"].as_f64().unwrap_or(f64::NAN),
            parts_json["forward_backward"].as_f64().unwrap_or(f64::NAN),
            parts_json["optimizer"].as_f64().unwrap_or(f64::NAN),
        );
        if let Some(m) = memory_mib {
            println!("  peak resident memory: {m:.0} MiB");
        }
        if let Some(p) = &report["pytorch"].as_object() {
            println!(
                "  vectorized PyTorch {} ({} thread): {:.3} ms/step [p10 {:.3}, p90 {:.3}], first step {:.1} ms; greedy rewards at init agree",
                p["torch"].as_str().unwrap_or("?"),
                p["threads"],
                p["ms_per_step"].as_f64().unwrap_or(f64::NAN),
                p["ms_per_step_p10"].as_f64().unwrap_or(f64::NAN),
                p["ms_per_step_p90"].as_f64().unwrap_or(f64::NAN),
                p["first_step_ms"].as_f64().unwrap_or(f64::NAN),
            );
            if let Some(r) = p.get("reordered") {
                let their_ms = r["ms_per_step"].as_f64().unwrap_or(f64::NAN);
                println!(
                    "  PyTorch with grpo-lab's order of products (not the baseline): {:.3} ms/step [p10 {:.3}, p90 {:.3}], ratio {:.2}×",
                    their_ms,
                    r["ms_per_step_p10"].as_f64().unwrap_or(f64::NAN),
                    r["ms_per_step_p90"].as_f64().unwrap_or(f64::NAN),
                    ms / their_ms
                );
            }
            let range = |i: usize| report["ratio_range"][i].as_f64().unwrap_or(f64::NAN);
            println!(
                "  ratio grpo-lab / PyTorch: {:.2}× [{:.2}, {:.2}] (medians; p10/p90 against p90/p10; < 1 is faster)",
                report["ratio_vs_pytorch"].as_f64().unwrap_or(f64::NAN),
                range(0),
                range(1)
            );
        }
    }
    Ok(())
}

/// Peak resident memory of this process (Linux), in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Run `bench/reference/grpo_ref.py` on the trainer's initial weights and prompts; refuse to
/// report a ratio unless both implementations give the same greedy responses and rewards at init.
fn pytorch_reference(
    python: &str,
    config: &RunConfig,
    trainer: &Trainer,
    args: &BenchArgs,
) -> Result<serde_json::Value> {
    use grpo_lab::model::lecture::{LecturePolicy, LectureWeights};
    if config.model.kind != grpo_lab::config::ModelKind::Lecture {
        return Err(user(
            "--pytorch compares the lecture model only (model.kind = lecture)",
        ));
    }
    let (t, m) = (&config.task, &config.model);
    let w = LectureWeights::init(t.vocab, t.n, m.d_model, m.init_scale, config.run.seed);
    let prompts = &trainer.prompts.train;
    let spec = serde_json::json!({
        "seed": config.run.seed,
        "shape": {
            "vocab": t.vocab, "n": t.n, "d_model": m.d_model,
            "num_generations": config.algorithm.num_generations, "mu": config.algorithm.mu,
            "prompts_per_iteration": config.batch_prompts(prompts.len()),
        },
        "lr": config.optimizer.lr,
        "weights": { "embedding": w.embedding, "encode": w.encode, "decode": w.decode },
        "prompts": prompts,
        "iterations": args.iterations,
        "warmup": 2,
    });
    let dir = std::env::temp_dir().join(format!("grpo-lab-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let spec_path = dir.join("spec.json");
    std::fs::write(&spec_path, spec.to_string())?;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/reference/grpo_ref.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(&spec_path)
        .arg("--threads")
        .arg(args.pytorch_threads.to_string())
        .output()
        .map_err(|e| user(format!("cannot run {python}: {e}")))?;
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        return Err(user(format!(
            "the PyTorch reference failed (is it installed? `{python} -m pip install ./bench/reference`):\n{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    // The same weights must give the same greedy answers and rewards in both implementations.
    let device = burn::tensor::Device::flex();
    let model = LecturePolicy::from_weights(&w, t.vocab, t.n, m.d_model, &device);
    let flat: Vec<i64> = prompts.iter().flatten().map(|&x| x as i64).collect();
    let logits = model.forward(burn::tensor::Tensor::from_data(
        burn::tensor::TensorData::new(flat, [prompts.len(), t.n]),
        &device,
    ));
    let logits: Vec<f32> = logits.into_data().try_to_vec::<f32>().expect("f32");
    let greedy = grpo_lab::grpo::sampling::argmax_rows(&logits, t.vocab);
    let reward_fn = RewardFn::from_task(t);
    let theirs = report["greedy_rewards"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut disagree = 0;
    for (i, (p, resp)) in prompts.iter().zip(greedy.chunks(t.n)).enumerate() {
        let ours = reward_fn.reward(p, resp) as f64;
        if theirs.get(i).and_then(|x| x.as_f64()) != Some(ours) {
            disagree += 1;
        }
    }
    if disagree > 0 || theirs.len() != prompts.len() {
        return Err(user(format!(
            "the PyTorch reference disagrees with grpo-lab on {disagree} of {} greedy rewards at init: not comparing times",
            prompts.len()
        )));
    }
    Ok(report)
}

fn bench_rollout_cmd(a: BenchRolloutArgs) -> Result<()> {
    use grpo_lab::grpo::kernels::Kernels;
    use grpo_lab::grpo::sampling::{self, SamplingParams};
    let compute = open_device(a.device)?;
    let Some(ctx) = compute.gpu.clone() else {
        return Err(user(
            "bench-rollout needs a wgpu adapter (--device software or gpu)",
        ));
    };
    let kernels = Kernels::new(ctx).map_err(user)?;
    let (b, g, n, v) = (a.prompts, a.generations, a.n, a.vocab);
    let mut rng = grpo_lab::rng::SplitMix64::new(0);
    let logits: Vec<f32> = (0..b * n * v).map(|_| rng.normal() as f32 * 2.0).collect();
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|_| (0..n).map(|_| rng.below(v as u64) as u32).collect())
        .collect();
    let flat: Vec<u32> = prompts.iter().flatten().copied().collect();
    let reward_fn = RewardFn::single(RewardKind::InclusionOrdering);
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    };
    let mut reference_ms = Vec::new();
    let mut kernel_ms = Vec::new();
    let mut agree = 0usize;
    for it in 0..a.repeats as u32 + 1 {
        let t = std::time::Instant::now();
        let tokens = sampling::sample_independent(&logits, b, n, v, g, params, 7, it);
        let rewards: Vec<f32> = tokens
            .chunks(n)
            .enumerate()
            .map(|(i, r)| reward_fn.reward(&prompts[i / g], r))
            .collect();
        let adv = advantage::all_advantages(&rewards, g);
        let r_ms = t.elapsed().as_secs_f64() * 1000.0;
        let t = std::time::Instant::now();
        let (k_tokens, k_score, k_adv) = kernels
            .rollout(
                &logits,
                &flat,
                (b, n, v, g, n),
                params,
                7,
                it,
                reward_fn.kernel_weights(),
                true,
            )
            .map_err(user)?;
        let k_ms = t.elapsed().as_secs_f64() * 1000.0;
        if it > 0 {
            // the first round compiles and allocates: not timed
            reference_ms.push(r_ms);
            kernel_ms.push(k_ms);
        }
        agree = k_tokens.iter().zip(&tokens).filter(|(x, y)| x == y).count();
        let _ = (k_score, k_adv, adv);
    }
    let (r, k) = (median(&reference_ms), median(&kernel_ms));
    let report = serde_json::json!({
        "device": compute.label,
        "shape": { "prompts": b, "generations": g, "n": n, "vocab": v },
        "reference_ms": r, "reference_ms_p10": quantile(&reference_ms, 0.1), "reference_ms_p90": quantile(&reference_ms, 0.9),
        "kernel_ms": k, "kernel_ms_p10": quantile(&kernel_ms, 0.1), "kernel_ms_p90": quantile(&kernel_ms, 0.9),
        "speedup": r / k,
        "tokens_identical_fraction": agree as f64 / (b * g * n) as f64,
    });
    if a.json {
        println!("{report}");
    } else {
        println!(
            "rollout + verify + advantages, {b} prompts × {g} responses × n = {n}, vocab {v}, on {}",
            compute.label
        );
        println!("  Rust reference: {r:.2} ms (median of {})", a.repeats);
        println!(
            "  WGSL kernels:   {k:.2} ms (upload of the logits and read-back of tokens, rewards, advantages included)"
        );
        println!(
            "  ratio reference / kernels: {:.2}×; identical tokens: {:.6}",
            r / k,
            agree as f64 / (b * g * n) as f64
        );
    }
    Ok(())
}

fn app_cmd(a: AppArgs) -> Result<()> {
    if !grpo_lab::app::display_available() {
        return Err(user(
            "no display (neither DISPLAY nor WAYLAND_DISPLAY is set): the app needs one; `grpo-lab train` runs headless",
        ));
    }
    let mut config = match &a.preset {
        Some(p) => Some(RunConfig::preset(p).map_err(user)?),
        None => None,
    };
    let measuring = a.measure.is_some();
    if measuring {
        // lecture17 at full speed on the CPU backend, long enough for 100k points.
        let mut c = RunConfig::preset("lecture17").expect("preset");
        c.run.iterations = 10_000;
        c.run.device = DeviceChoice::Cpu;
        c.run.log_groups = 3;
        config = Some(c);
    }
    if let (Some(c), Some(d)) = (config.as_mut(), a.device) {
        c.run.device = d;
    }
    if std::env::var_os("LP_NUM_THREADS").is_none() {
        // On Mesa's software rasterizer, draw the window with one thread: the trainer keeps
        // the other core. (No effect on hardware GPUs.)
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("LP_NUM_THREADS", "1") };
    }
    grpo_lab::app::run_app(grpo_lab::app::AppOptions {
        inline_trainer: false,
        config,
        autoplay: a.play || measuring,
        measure_secs: a.measure,
        fresh: measuring,
    })
    .map_err(|e| anyhow::anyhow!("the app could not open a window: {e}"))
}

fn compare_cmd(a: CompareArgs) -> Result<()> {
    use grpo_lab::experiment::{Axis, CompareOptions, Matrix, parse_seeds, run_matrix};
    train::install_interrupt_handler();
    let mut matrix = match &a.experiment {
        Some(name) => {
            let mut m = Matrix::from_experiment(name).map_err(user)?;
            m.base = m.base.with_overrides(&a.config.sets).map_err(user)?;
            m
        }
        None => {
            let base = build_config(&a.config)?;
            Matrix {
                name: base.run.name.clone(),
                base,
                axes: vec![],
                seeds: parse_seeds("0..5").map_err(user)?,
                threshold: None,
                description: String::new(),
            }
        }
    };
    for v in &a.vary {
        matrix.axes.push(Axis::parse(v).map_err(user)?);
    }
    if let Some(s) = &a.seeds {
        matrix.seeds = parse_seeds(s).map_err(user)?;
    }
    if a.threshold.is_some() {
        matrix.threshold = a.threshold;
    }
    // Every cell is built and validated before any run starts.
    let cells = matrix.cells().map_err(user)?;
    let jobs = a.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let device = a.config.device.unwrap_or(DeviceChoice::Cpu);
    eprintln!(
        "grpo-lab compare: {} cells × {} seeds = {} runs, {jobs} at a time on {} → {}",
        cells.len(),
        matrix.seeds.len(),
        cells.len() * matrix.seeds.len(),
        device.name(),
        a.out.display()
    );
    let outcome = run_matrix(
        &matrix,
        &CompareOptions {
            out: a.out.clone(),
            jobs,
            force: a.force,
            progress: !a.quiet,
            iterations: a.iterations,
            device,
        },
    )
    .map_err(|e| match e {
        grpo_lab::experiment::ExperimentError::DifferentConfig { .. }
        | grpo_lab::experiment::ExperimentError::Config(_) => user(e),
        e => e.into(),
    })?;
    println!("{}", std::fs::read_to_string(&outcome.summary_md)?);
    println!(
        "ran {} runs, skipped {} already complete",
        outcome.ran, outcome.skipped
    );
    println!("summary: {}", outcome.summary_md.display());
    for c in outcome
        .charts
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
    {
        println!("chart:   {}", c.display());
    }
    if train::interrupted() {
        println!("interrupted: rerun the same command to finish the matrix");
    }
    Ok(())
}

fn demo() -> Result<()> {
    if grpo_lab::app::display_available() {
        return app_cmd(AppArgs {
            preset: None,
            device: None,
            play: false,
            measure: None,
        });
    }
    println!(
        "grpo-lab: no display found (DISPLAY / WAYLAND_DISPLAY unset); running the lecture17 demo headless instead."
    );
    train_cmd(TrainArgs {
        config: ConfigArgs {
            preset: Some("lecture17".into()),
            config: None,
            sets: vec![],
            seed: None,
            device: None,
            kernels: None,
        },
        out: Some(PathBuf::from("runs/lecture17-demo")),
        resume: None,
        force: true,
        quiet: false,
    })
}

/// libwayland, probed by the Vulkan loader's window-system layer, prints
/// `XDG_RUNTIME_DIR is invalid or not set` on headless machines. Giving it a private
/// empty directory keeps the probe quiet; nothing is ever displayed through it.
fn quiet_window_system_probing() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join("grpo-lab-runtime");
        if std::fs::create_dir_all(&dir).is_ok() {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
            }
            // SAFETY: called first thing in main, before any thread exists.
            unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
        }
    }
}

fn main() -> ExitCode {
    quiet_window_system_probing();
    let cli = Cli::parse();
    let result = match cli.command {
        None => demo(),
        Some(Command::App(a)) => app_cmd(a),
        Some(Command::Train(a)) => train_cmd(a),
        Some(Command::Compare(a)) => compare_cmd(a),
        Some(Command::Score {
            reward,
            prompt,
            response,
            json,
        }) => score_cmd(reward, &prompt, &response, json),
        Some(Command::Advantages { rewards, json }) => advantages_cmd(&rewards, json),
        Some(Command::Devices { json }) => devices_cmd(json),
        Some(Command::Bench(a)) => bench_cmd(a),
        Some(Command::BenchRollout(a)) => bench_rollout_cmd(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<UserError>().is_some() => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

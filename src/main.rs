//! The `grpo-lab` command line. Library errors are handled here, once: user errors
//! (bad config, bad arguments, an existing run directory, a diverged run) exit with 2.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use grpo_lab::config::{AdvantageMode, DeviceChoice, KernelChoice, RewardKind, RunConfig};
use grpo_lab::gpu::Compute;
use grpo_lab::grpo::{Trainer, advantage};
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
    /// Train a policy with GRPO; writes config, metrics, checkpoints, summary and charts to --out.
    Train(TrainArgs),
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
}

#[derive(Args)]
struct ConfigArgs {
    /// A preset from assets/experiments (lecture17, scaled, random-sort).
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
struct BenchArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Iterations to time (after one warm-up iteration).
    #[arg(long, default_value_t = 10)]
    iterations: usize,
    #[arg(long)]
    json: bool,
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
                "give --preset NAME or --config FILE (presets: lecture17, scaled, random-sort)",
            ));
        }
    };
    if let Some(path) = &args.config {
        let file = RunConfig::from_file(path).map_err(user)?;
        // The file's own keys over the preset: re-parse it as overrides of the preset.
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
        let _ = file;
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[((v.len() - 1) as f64 * q).round() as usize]
    }
}

fn bench_cmd(args: BenchArgs) -> Result<()> {
    let mut config = build_config(&args.config)?;
    config.run.iterations = args.iterations + 1;
    config.run.log_groups = 0;
    let compute = open_device(config.run.device)?;
    let mu = config.algorithm.mu;
    let mut trainer = Trainer::new(config.clone(), compute.clone()).map_err(user)?;
    let t0 = std::time::Instant::now();
    let first = trainer.step().map_err(user)?;
    let first_step_ms = t0.elapsed().as_secs_f64() * 1000.0;
    while !trainer.at_iteration_boundary() {
        trainer.step().map_err(user)?;
    }
    let mut per_step = Vec::new();
    let mut rollout_steps = Vec::new();
    let mut plain_steps = Vec::new();
    for _ in 0..args.iterations {
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
    }
    let _ = first;
    let ms = median(per_step.clone());
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
        "ms_per_step_p10": quantile(per_step.clone(), 0.1),
        "ms_per_step_p90": quantile(per_step, 0.9),
        "first_step_ms": first_step_ms,
        "rollout_step_ms": median(rollout_steps),
        "optimizer_step_ms": median(plain_steps),
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
    }
    Ok(())
}

fn demo() -> Result<()> {
    println!(
        "grpo-lab: no command given; running the lecture17 demo headless (see `grpo-lab --help`)."
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
        Some(Command::Train(a)) => train_cmd(a),
        Some(Command::Score {
            reward,
            prompt,
            response,
            json,
        }) => score_cmd(reward, &prompt, &response, json),
        Some(Command::Advantages { rewards, json }) => advantages_cmd(&rewards, json),
        Some(Command::Devices { json }) => devices_cmd(json),
        Some(Command::Bench(a)) => bench_cmd(a),
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

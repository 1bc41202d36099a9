//! The `grpo-lab` command line. Library errors are handled here, once: user errors
//! (bad config, bad arguments, an existing run directory, a diverged run) exit with 2.

mod commands;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
// A user error (bad config, bad arguments, ...): printed as is, exit code 2.
use commands::{ObjectiveArgs, advantages_cmd, devices_cmd, objective_cmd, score_cmd};
use grpo_lab::bench::{self, UserError, user};
use grpo_lab::config::{AdvantageMode, DeviceChoice, KernelChoice, RewardKind, RunConfig};
use grpo_lab::gpu::Compute;
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
        /// The verifier: distance, inclusion_ordering or exact.
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
    /// The advantage modes computed from one group's rewards alone (the six group modes).
    Advantages {
        /// Comma-separated rewards, e.g. 1,2,2,5
        #[arg(long, allow_hyphen_values = true)]
        rewards: String,
        #[arg(long)]
        json: bool,
    },
    /// One response's objective under a loss: each token's term and ∂L/∂log π, and the loss.
    Objective(ObjectiveArgs),
    /// The gradient lab: every estimator (advantage mode × objective × G at an equal rollout
    /// budget) against the exact ∇J of the lecture policy, and k1/k2/k3 against the exact KL.
    GradientLab(GradientLabArgs),
    /// List every wgpu adapter and what `--device auto` picks.
    Devices {
        #[arg(long)]
        json: bool,
    },
    /// Print every config key (label, default, allowed values, help) as markdown.
    ConfigDocs,
    /// Time the GRPO step of a preset (median ms per optimizer step, its share of rollout included).
    Bench(BenchArgs),
    /// Time rollout + verify + advantages on random logits: the WGSL kernels against the Rust reference.
    BenchRollout(BenchRolloutArgs),
    /// Export a config (a preset, a file or a run directory) to TRL, verl or OpenRLHF: the
    /// framework's config with every key explicit, reward.py, the prompts and MAPPING.md.
    Export(ExportArgs),
    /// Export a run's metrics.jsonl to TensorBoard event files or UNIPO's canonical JSON.
    ExportLog(ExportLogArgs),
}

#[derive(Args)]
struct ExportArgs {
    /// trl | verl | openrlhf
    #[arg(long, value_parser = parse_framework)]
    to: grpo_lab::export::Framework,
    /// A run directory: export the config it ran with (its config.toml).
    #[arg(value_name = "RUN_DIR")]
    run_dir: Option<PathBuf>,
    /// A preset (lecture17, scaled, random-sort, transformer-sort, length-bias, r1-vs-r1-zero).
    #[arg(long)]
    preset: Option<String>,
    /// A TOML config file (applied over the preset, if both are given).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one key, e.g. --set algorithm.beta=0.04 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// The pretrained policy: a Hugging Face model id or a local path.
    #[arg(long, default_value = grpo_lab::export::DEFAULT_MODEL)]
    model: String,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Export keys without a counterpart anyway (listed in MAPPING.md) instead of refusing.
    #[arg(long)]
    lenient: bool,
    /// Overwrite an existing export in --out.
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
struct ExportLogArgs {
    /// tensorboard | unipo
    #[arg(long)]
    to: String,
    /// The run directory (config.toml and metrics.jsonl).
    #[arg(value_name = "RUN_DIR")]
    run_dir: PathBuf,
    /// Where to write (default: RUN_DIR/tensorboard/ or RUN_DIR/unipo.json).
    #[arg(long)]
    out: Option<PathBuf>,
    /// TensorBoard tags: trl (train/reward, ...; x = optimizer step), verl (critic/score/mean,
    /// ...; x = iteration) or grpo-lab. Metrics without a counterpart go under grpo_lab/.
    /// [default: trl]
    #[arg(long)]
    names: Option<String>,
    /// UNIPO: logged groups per step to include (UNIPO shows three). [default: 3]
    #[arg(long)]
    prompts: Option<usize>,
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
    /// auto, gpu or software (the kernels need a wgpu adapter; auto: a hardware one, else lavapipe)
    #[arg(long, value_parser = parse_device, default_value = "auto")]
    device: DeviceChoice,
    #[arg(long)]
    json: bool,
}

#[derive(Args, Default)]
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
    /// The run's seed (run.seed): the run is a function of its config and seed.
    #[arg(long, value_parser = clap::value_parser!(u64).range(..=i64::MAX as u64))]
    seed: Option<u64>,
    /// auto | gpu | software | cpu
    #[arg(long, value_parser = parse_device)]
    device: Option<DeviceChoice>,
    /// Sampling, verifier and advantages: auto | gpu (WGSL kernels) | reference (plain Rust)
    #[arg(long, value_parser = parse_kernels)]
    kernels: Option<KernelChoice>,
}

impl ConfigArgs {
    /// The flags given that define a run (`--preset`, `--config`, `--seed`, and with `kernels`
    /// `--kernels`): what a run continued or studied from its own config refuses.
    fn run_defining_flags(&self, kernels: bool) -> Vec<&'static str> {
        [
            ("--preset", self.preset.is_some()),
            ("--config", self.config.is_some()),
            ("--seed", self.seed.is_some()),
            ("--kernels", kernels && self.kernels.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }
}

#[derive(Args)]
struct GradientLabArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// θ_old: the run's policy after N iterations (default 20, where the KL is not zero).
    #[arg(long, value_name = "N", conflicts_with = "checkpoint")]
    at_iteration: Option<usize>,
    /// θ_old from a checkpoint instead: a run directory (its newest checkpoint) or
    /// RUN/checkpoints/iter-N; its reference is the run's.
    #[arg(long, value_name = "DIR")]
    checkpoint: Option<PathBuf>,
    /// θ = θ_old after k of the next iteration's μ optimizer steps (objectives differ once θ ≠ θ_old).
    #[arg(long, default_value_t = 0)]
    mu_step: usize,
    /// Independent batches per estimator (default 400; the transformer's 50).
    #[arg(long)]
    batches: Option<usize>,
    /// Answers per prompt in a batch (every G must divide it): the equal rollout budget
    /// (default 256; the transformer's 32).
    #[arg(long)]
    budget: Option<usize>,
    /// Group sizes (default 2,4,…,256; the transformer's 2,4,…,32).
    #[arg(long, value_delimiter = ',')]
    group_sizes: Vec<usize>,
    /// Advantage modes (default raw,centered,rloo,normalized,batch_normalized; rloo alone
    /// with --mu-step > 0, so that only the objectives differ).
    #[arg(long, value_delimiter = ',', value_parser = parse_advantage)]
    modes: Vec<AdvantageMode>,
    /// Objectives: naive, unclipped, clipped, cispo, sapo, gmpo, gspo (default: the config's;
    /// every one with --mu-step > 0).
    #[arg(long, value_delimiter = ',')]
    objectives: Vec<String>,
    #[arg(long)]
    json: bool,
    /// Also write the report (gradient-lab.json, gradient-lab.txt) and its charts here.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Print the lab's memory estimate against the cap and the gradient evaluations it will make, and exit (2 if over).
    #[arg(long)]
    dry_run: bool,
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
    /// Measure the app's own work per frame for SECS seconds while training at full speed
    /// (lecture17 unless --preset names another; its iterations raised to 10000), print a JSON
    /// report and close.
    #[arg(long, value_name = "SECS")]
    measure: Option<f64>,
    /// Open on this tab: plots, inspector, playground, runs, experiments.
    #[arg(long, value_parser = grpo_lab::app::Tab::from_name)]
    tab: Option<grpo_lab::app::Tab>,
    /// Start "walk me through one iteration" (the browser: `?tour=1`).
    #[arg(long)]
    tour: bool,
}

#[derive(Args)]
struct TrainArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Run directory (required, unless --resume DIR names it).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in DIR (or in --out) from its last checkpoint, as recorded (only
    /// `--set run.iterations=N` may extend it; `--device` picks where it computes).
    #[arg(long, value_name = "DIR", num_args = 0..=1)]
    resume: Option<Option<PathBuf>>,
    /// Overwrite an existing run in --out.
    #[arg(long)]
    force: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Validate the config, open its device and name the engine that would run (refusing
    /// what that engine cannot run there, as the run would), print its memory estimate
    /// against the cap, and exit (2 if refused or over the cap). Nothing is written.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args)]
struct CompareArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// An experiment file from assets/experiments (lecture-table, loss-modes, loss-family, kl-beta, difficulty-bias, sparse-vs-shaped, entropy-collapse, entropy-controls, entropy-mechanism, mismatch-lab, bug-gallery, length-bias, r1-vs-r1-zero, dynamic-sampling, …: every file there).
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
    #[arg(long, value_parser = at_least_one)]
    jobs: Option<usize>,
    /// Discard finished runs in --out and start over.
    #[arg(long)]
    force: bool,
    /// Override every run's iteration count (a smoke test of the matrix).
    #[arg(long, value_parser = at_least_one)]
    iterations: Option<usize>,
    /// Reward threshold for "iterations to reach".
    #[arg(long, value_parser = finite)]
    threshold: Option<f64>,
    #[arg(long)]
    quiet: bool,
}

/// A count that must be ≥ 1 (refused with exit 2 naming the argument otherwise; clap's own
/// range parser said "0 is not in 1..18446744073709551615").
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("allowed an integer ≥ 1".into()),
    }
}

/// A finite number (`nan` and `inf` parse as f64 but mean nothing as a threshold).
fn finite(s: &str) -> Result<f64, String> {
    let x = s.parse::<f64>().ok().filter(|x| x.is_finite());
    x.ok_or_else(|| "allowed a finite number".into())
}

/// An axis of `bench --scaling`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SweepAxis {
    Sizes,
    Threads,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Iterations to time (after one warm-up iteration).
    #[arg(long, default_value_t = 10, value_parser = at_least_one)]
    iterations: usize,
    #[arg(long)]
    json: bool,
    /// Also time the vectorized PyTorch reference (bench/reference, `pip install ./bench/reference`)
    /// with this Python, on the same weights and prompts, and report the ratio.
    #[arg(long, value_name = "PYTHON")]
    pytorch: Option<String>,
    /// Threads for both sides: `run.threads` of the fused CPU engines (0 = every core) and
    /// PyTorch's `torch.set_num_threads` (default: the config's `run.threads` for the engines,
    /// every core where it is 0; 1 for PyTorch).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Threads for PyTorch alone, overriding `--threads` (default: `--threads`, else 1).
    #[arg(long, value_parser = at_least_one)]
    pytorch_threads: Option<usize>,
    /// Scaling curves instead: step time as B×G, n and D grow around the preset, a log-log
    /// chart and a table written to this directory.
    #[arg(long, value_name = "DIR")]
    scaling: Option<std::path::PathBuf>,
    /// With `--scaling`: the axes to sweep, `sizes` (B·G, n, D; the transformer's D, layers,
    /// B·G, max_len) and `threads` (the fused engines on 1, 2, 4, … every core, timed in turn).
    #[arg(
        long,
        value_name = "AXES",
        value_delimiter = ',',
        requires = "scaling",
        default_value = "sizes,threads"
    )]
    axes: Vec<SweepAxis>,
    /// Also time burn's autodiff path (`run.engine = burn`, `run.fused_step = off`) on the same
    /// device and report this engine's speed-up over it (the WGSL engine's on a wgpu device,
    /// the fused engine's on the CPU): both warmed up, then their timed iterations in turn.
    #[arg(long)]
    vs_burn: bool,
}

/// Token ids `a,b,…` up to `max` (an empty string is no tokens).
fn parse_list(s: &str, max: u32) -> Result<Vec<u32>, String> {
    if s.trim().is_empty() {
        return Ok(vec![]);
    }
    s.split(',')
        .map(|x| {
            let v = x
                .trim()
                .parse::<u32>()
                .map_err(|e| format!("`{x}`: {e} (expected e.g. 3,1,0,2)"))?;
            if v > max {
                return Err(format!("{v}: allowed 0..={max}"));
            }
            Ok(v)
        })
        .collect()
}

fn parse_floats(s: &str) -> Result<Vec<f32>, String> {
    if s.trim().is_empty() {
        return Err("no numbers: give them comma-separated, e.g. 1,2,2,5 or -1.0,-2.1".into());
    }
    s.split(',')
        .map(|x| {
            let v = x
                .trim()
                .parse::<f32>()
                .map_err(|e| format!("`{x}`: {e} (expected comma-separated numbers)"))?;
            if v.is_finite() {
                Ok(v)
            } else if x.trim().parse::<f64>().is_ok_and(f64::is_finite) {
                Err(format!(
                    "`{x}` is outside f32's range (allowed |x| ≤ 3.4e38)"
                ))
            } else {
                Err(format!("`{x}` is not finite"))
            }
        })
        .collect()
}

fn parse_advantage(s: &str) -> Result<AdvantageMode, String> {
    AdvantageMode::parse(s).ok_or_else(|| {
        format!(
            "unknown advantage mode '{s}'; allowed: {}",
            AdvantageMode::NAMES.join(", ")
        )
    })
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

fn parse_framework(s: &str) -> Result<grpo_lab::export::Framework, String> {
    grpo_lab::export::Framework::parse(s).ok_or_else(|| {
        format!(
            "unknown framework `{s}`; allowed: {}",
            grpo_lab::export::Framework::NAMES.join(", ")
        )
    })
}

fn export_cmd(a: ExportArgs) -> Result<()> {
    use grpo_lab::export::{self, Options};
    let config = match (&a.run_dir, &a.preset, &a.config) {
        (Some(dir), None, None) => {
            let path = dir.join("config.toml");
            if !path.exists() {
                return Err(user(format!(
                    "{} holds no run (no config.toml)",
                    dir.display()
                )));
            }
            RunConfig::from_file(&path)
                .and_then(|c| c.with_overrides(&a.sets))
                .map_err(user)?
        }
        (Some(_), _, _) => {
            return Err(user("give a RUN_DIR or --preset / --config, not both"));
        }
        (None, None, None) => {
            return Err(user(
                "give --preset NAME, --config FILE or a RUN_DIR (presets: lecture17, scaled, random-sort, transformer-sort, length-bias, r1-vs-r1-zero)",
            ));
        }
        (None, preset, file) => {
            RunConfig::layered(preset.as_deref(), file.as_deref(), &a.sets).map_err(user)?
        }
    };
    if a.model.trim().is_empty() {
        return Err(user(
            "--model is empty: allowed a Hugging Face model id or a local path",
        ));
    }
    if a.out.exists() && !a.out.is_dir() {
        return Err(user(format!(
            "--out {}: a file; allowed a directory (new or holding an export)",
            a.out.display()
        )));
    }
    if a.out.join("MAPPING.md").exists() && !a.force {
        return Err(user(format!(
            "{} already holds an export; --force overwrites it",
            a.out.display()
        )));
    }
    let command = std::env::args()
        .skip(1)
        .map(|w| if w.contains(' ') { format!("'{w}'") } else { w })
        .collect::<Vec<_>>()
        .join(" ");
    let opts = Options {
        model: a.model.clone(),
        lenient: a.lenient,
        command: format!("grpo-lab {command}"),
    };
    let bundle = match export::export(&config, a.to, &opts) {
        Ok(b) => b,
        Err(e @ export::ExportError::Io { .. }) => return Err(e.into()),
        Err(e) => return Err(user(e)),
    };
    bundle
        .write(&a.out)
        .map_err(|e| user(format!("--out {}: {e}", a.out.display())))?;
    let (version, _) = a.to.version();
    println!(
        "exported `{}` to {version} in {}:",
        config.run.name,
        a.out.display()
    );
    for (name, _) in &bundle.files {
        println!("  {name}");
    }
    for w in &bundle.warnings {
        eprintln!("warning: {w}");
    }
    Ok(())
}

/// What of the run's config picks a tag (where it pays its KL; the std its advantages divide
/// by); a run without its config gets the defaults.
fn log_context(run_dir: &std::path::Path) -> grpo_lab::export::logs::LogContext {
    use grpo_lab::export::logs::LogContext;
    RunConfig::from_file(&run_dir.join("config.toml"))
        .map_or(LogContext::default(), |c| LogContext::of(&c))
}

fn export_log_cmd(a: ExportLogArgs) -> Result<()> {
    use grpo_lab::export::logs;
    let metrics = a.run_dir.join("metrics.jsonl");
    if !metrics.exists() {
        return Err(user(format!(
            "{} holds no run (no metrics.jsonl)",
            a.run_dir.display()
        )));
    }
    let records =
        train::read_metrics(&metrics).map_err(|e| user(format!("{}: {e}", metrics.display())))?;
    let gaps =
        logs::check_steps(&records).map_err(|e| user(format!("{}: {e}", metrics.display())))?;
    if gaps > 0 {
        eprintln!(
            "warning: {}: {gaps} steps missing between its records (lost lines); exported as they are",
            metrics.display()
        );
    }
    // Each flag belongs to one format: given to the other it would be ignored.
    for (flag, given, to) in [
        ("--names", a.names.is_some(), "tensorboard"),
        ("--prompts", a.prompts.is_some(), "unipo"),
    ] {
        if given && a.to != to && matches!(a.to.as_str(), "tensorboard" | "unipo") {
            return Err(user(format!("{flag} applies to --to {to} only")));
        }
    }
    match a.to.as_str() {
        "tensorboard" => {
            let name = a.names.as_deref().unwrap_or("trl");
            let names = logs::Names::parse(name).ok_or_else(|| {
                user(format!(
                    "unknown --names `{name}`; allowed: {}",
                    logs::Names::NAMES.join(", ")
                ))
            })?;
            // The run's steps end when metrics.jsonl was last written.
            let end = std::fs::metadata(&metrics)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0.0, |d| d.as_secs_f64());
            let total: f64 = records
                .iter()
                .map(|r| r.step_time_secs.max(0.0) as f64)
                .sum();
            let start = end - total;
            let dir = a.out.unwrap_or_else(|| a.run_dir.join("tensorboard"));
            let path = dir.join(logs::event_file_name(start, "grpo-lab"));
            let bytes = logs::tensorboard(&records, names, start, log_context(&a.run_dir));
            std::fs::create_dir_all(&dir)
                .and_then(|_| std::fs::write(&path, &bytes))
                .map_err(|e| {
                    user(format!(
                        "--out {}: {e} (allowed a directory)",
                        dir.display()
                    ))
                })?;
            let events = logs::read_events(&bytes).map_err(anyhow::Error::msg)?;
            println!(
                "wrote {} ({} events, {} steps): tensorboard --logdir {}",
                path.display(),
                events.len(),
                records.len(),
                dir.display()
            );
        }
        "unipo" => {
            let config_path = a.run_dir.join("config.toml");
            let config = RunConfig::from_file(&config_path).map_err(user)?;
            let path = a.out.unwrap_or_else(|| a.run_dir.join("unipo.json"));
            let json =
                serde_json::to_string(&logs::unipo(&config, &records, a.prompts.unwrap_or(3)))?
                    + "\n";
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            parent
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|_| std::fs::write(&path, json))
                .map_err(|e| {
                    user(format!(
                        "--out {}: {e} (allowed a file path)",
                        path.display()
                    ))
                })?;
            println!(
                "wrote {} ({} entries, algorithm {})",
                path.display(),
                records.len(),
                logs::unipo_algorithm(&config)
            );
        }
        other => {
            return Err(user(format!(
                "unknown --to `{other}`; allowed: tensorboard, unipo"
            )));
        }
    }
    Ok(())
}

fn build_config(args: &ConfigArgs) -> Result<RunConfig> {
    if args.preset.is_none() && args.config.is_none() {
        return Err(user(
            "give --preset NAME or --config FILE (presets: lecture17, scaled, random-sort, transformer-sort, length-bias, r1-vs-r1-zero)",
        ));
    }
    // --seed, --device and --kernels are the last overrides.
    let mut sets = args.sets.clone();
    if let Some(seed) = args.seed {
        sets.push(format!("run.seed={seed}"));
    }
    if let Some(device) = args.device {
        sets.push(format!("run.device={}", device.name()));
    }
    if let Some(kernels) = args.kernels {
        sets.push(format!("run.kernels={}", kernels.name()));
    }
    RunConfig::layered(args.preset.as_deref(), args.config.as_deref(), &sets).map_err(user)
}

fn open_device(choice: DeviceChoice) -> Result<Compute> {
    Compute::select(choice).map_err(user)
}

/// The device for a config: `auto` picks the fastest engine on this machine; one line on
/// stderr says which engine runs and why. A config its engine cannot run there is refused
/// first (before the run's set-up says anything).
fn open_device_for(choice: DeviceChoice, config: &RunConfig) -> Result<Compute> {
    let (compute, why) = grpo_lab::engine::select(choice, config).map_err(user)?;
    grpo_lab::engine::check(config, &compute).map_err(user)?;
    eprintln!("grpo-lab: {why}");
    Ok(compute)
}

/// The config a `--resume` goes on with: the recorded one, where only `--set
/// run.iterations=N` may change it (the resume rule, `RunConfig::changed_for_resume`).
fn resumed_config(c: &ConfigArgs, out: &std::path::Path) -> Result<RunConfig> {
    let stored = out.join("config.toml");
    if !stored.exists() {
        return Err(user(format!(
            "--resume: {} holds no run (no config.toml)",
            out.display()
        )));
    }
    let refused = c.run_defining_flags(true);
    if !refused.is_empty() {
        return Err(user(format!(
            "--resume continues the run as recorded; {} would change it (start a new run with --out, or extend this one with --set run.iterations=N)",
            refused.join(", ")
        )));
    }
    let stored = RunConfig::from_file(&stored).map_err(user)?;
    // `--device`, like `run.engine`, says where the run goes on; recorded, so that a later
    // `--resume` goes on there too.
    let mut sets = c.sets.clone();
    if let Some(device) = c.device {
        sets.push(format!("run.device={}", device.name()));
    }
    let wanted = stored.with_overrides(&sets).map_err(user)?;
    let changed = stored.changed_for_resume(&wanted);
    if !changed.is_empty() {
        return Err(user(format!(
            "--resume: `--set {}` would change the run ({}); only --set run.iterations=N (to extend it), run.threads, run.engine and --device may",
            sets.join(" --set "),
            changed.join(", ")
        )));
    }
    train::check_resume(out, &wanted).map_err(user)?;
    Ok(wanted)
}

/// The run directory's lock (a second writer is the user's error: exit 2, the holder named).
fn lock_run_dir(out: &std::path::Path) -> Result<train::RunLock> {
    train::RunLock::acquire(out).map_err(|e| match e {
        train::LockError::Held { .. } => user(e),
        // `--out` names something that cannot be a directory (a file, a path under one, a
        // place the user may not write): the user's to change.
        train::LockError::Io { path, source }
            if path == out && source.kind() != std::io::ErrorKind::StorageFull =>
        {
            user(format!(
                "--out {}: cannot be the run's directory ({source})",
                out.display()
            ))
        }
        e => e.into(),
    })
}

/// `train`'s flags that contradict `--resume` (a run continues where it is, as it is).
fn check_resume_flags(args: &TrainArgs) -> Result<()> {
    if let Some(Some(dir)) = &args.resume
        && let Some(out) = args.out.as_ref().filter(|out| *out != dir)
    {
        return Err(user(format!(
            "--resume {} continues the run there, --out {} names another directory: give one (--resume DIR, or --out DIR --resume)",
            dir.display(),
            out.display()
        )));
    }
    if args.resume.is_some() && args.force {
        return Err(user(
            "--force starts a run over and --resume continues it: give one of them",
        ));
    }
    Ok(())
}

/// `train --dry-run`: the config (a new run's, or with `--resume` the run's own with its
/// allowed overrides) checked and its memory estimate printed; nothing written.
fn train_dry_run(args: &TrainArgs) -> Result<()> {
    let config = match &args.resume {
        None => build_config(&args.config)?,
        Some(dir) => {
            let Some(dir) = dir.as_ref().or(args.out.as_ref()) else {
                return Err(user(
                    "--resume needs a directory: --resume DIR or --out DIR --resume",
                ));
            };
            resumed_config(&args.config, dir)?
        }
    };
    // The device opens as for the run (a missing adapter, an engine that does not cover the
    // config are refused here too), and the line says which engine would run.
    open_device_for(args.config.device.unwrap_or(config.run.device), &config)?;
    let e = grpo_lab::estimate::estimate(&config);
    println!(
        "{} is valid. Memory estimate:\n{}",
        config.run.name,
        e.table()
    );
    match train::run::memory_cap(&config) {
        Some((cap, from)) => {
            println!("cap: {cap:.0} MiB ({from})");
            train::run::check_memory(&config).map_err(user)
        }
        None => Ok(()),
    }
}

fn train_cmd(args: TrainArgs) -> Result<()> {
    check_resume_flags(&args)?;
    if args.dry_run {
        return train_dry_run(&args);
    }
    train::install_interrupt_handler();
    let resume_dir = args.resume.clone();
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
    // One writer per run directory: a directory that exists is locked before anything in it is
    // read, so a second writer is refused naming the first (before a device is opened); a new
    // one once the config is known to be valid and to fit in memory, so a refused config
    // creates nothing.
    let early_lock = out.is_dir().then(|| lock_run_dir(&out)).transpose()?;
    let config = if resume {
        resumed_config(&args.config, &out)?
    } else {
        build_config(&args.config)?
    };
    train::run::check_memory(&config).map_err(user)?;
    // Refused before the device opens and the start line prints (train::run refuses it too).
    if !resume && !args.force && train::run::is_run_dir(&out) {
        return Err(user(train::run::RunError::OutExists(out)));
    }
    let lock = match early_lock {
        Some(lock) => lock,
        None => lock_run_dir(&out)?,
    };
    let compute = open_device_for(args.config.device.unwrap_or(config.run.device), &config)?;
    eprintln!(
        "grpo-lab: {} · {} · seed {} · {} iterations × {} steps → {}",
        config.run.name,
        compute.label,
        config.run.seed,
        config.run.iterations,
        config.algorithm.steps_per_iteration(),
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
            lock: Some(lock),
        },
    )
    .map_err(|e| if e.is_user_error() { user(e) } else { e.into() })?;
    let s = &outcome.summary;
    if s.status == "completed" {
        train::mark_complete();
    }
    println!(
        "{}: final reward {:.3} (max {}), train accuracy {:.2}{} after the last update, {:.2} ms/step, {}",
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

/// `gradient-lab`'s flags that would not apply: it computes on the CPU (the exact gradient
/// and the fused engines), and a checkpoint brings its run's own config.
fn check_lab_flags(args: &GradientLabArgs) -> Result<()> {
    if let Some(d) = args
        .config
        .device
        .filter(|d| matches!(d, DeviceChoice::Gpu | DeviceChoice::Software))
    {
        return Err(user(format!(
            "--device {}: the gradient lab computes on the CPU (the exact ∇J and the fused engines); drop --device or give --device cpu",
            d.name()
        )));
    }
    if args.config.kernels == Some(KernelChoice::Gpu) {
        return Err(user(
            "--kernels gpu: the gradient lab computes on the CPU; drop --kernels or give --kernels reference",
        ));
    }
    if args.checkpoint.is_some() {
        let refused = args.config.run_defining_flags(false);
        if !refused.is_empty() {
            return Err(user(format!(
                "--checkpoint takes the run's own config; {} would not apply (only --set does)",
                refused.join(", ")
            )));
        }
    }
    Ok(())
}

fn gradient_lab_cmd(args: GradientLabArgs) -> Result<()> {
    use grpo_lab::lab::gradient;
    check_lab_flags(&args)?;
    let (config, checkpoint) = match &args.checkpoint {
        Some(dir) => {
            let (ckpt, stored) = gradient::checkpoint_of(dir).map_err(user)?;
            (
                stored.with_overrides(&args.config.sets).map_err(user)?,
                Some(ckpt),
            )
        }
        None => (build_config(&args.config)?, None),
    };
    let defaults = gradient::LabArgs::for_config(&config);
    let mut lab = gradient::LabArgs {
        at_iteration: args
            .at_iteration
            .unwrap_or(if checkpoint.is_some() { 0 } else { 20 }),
        mu_step: args.mu_step,
        batches: args.batches.unwrap_or(defaults.batches),
        budget: args.budget.unwrap_or(defaults.budget),
        objectives: args.objectives,
        ..defaults
    };
    if !args.group_sizes.is_empty() {
        // Ascending, each once: the report reads its columns from the smallest G to the largest.
        lab.group_sizes = args.group_sizes;
        lab.group_sizes.sort_unstable();
        lab.group_sizes.dedup();
    }
    if !args.modes.is_empty() {
        let mut modes = args.modes.clone();
        let mut seen = std::collections::HashSet::new();
        modes.retain(|m| seen.insert(m.name()));
        lab.modes = modes;
    }
    let lab = lab.off_policy_defaults(!args.modes.is_empty());
    gradient::check(&config, &lab).map_err(user)?;
    let e = gradient::estimate(&config, &lab);
    if args.dry_run {
        print!("{}", e.table());
        println!("{} gradient evaluations", gradient::evaluations(&lab));
    }
    if let Some((cap, from)) = train::run::memory_cap(&config)
        && e.total_mib() > cap
    {
        return Err(user(format!(
            "the gradient lab would need about {:.0} MiB, over the {cap:.0} MiB {from}; mostly: {} (--dry-run prints the whole estimate; run.max_memory_mib sets the cap)",
            e.total_mib(),
            e.drivers()
        )));
    }
    if args.dry_run {
        return Ok(());
    }
    let report =
        gradient::run_all(config, checkpoint.as_deref(), &lab, args.quiet).map_err(user)?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("gradient-lab.json"), &json)?;
        std::fs::write(dir.join("gradient-lab.txt"), report.text())?;
        for path in report.charts(dir)? {
            eprintln!("grpo-lab: wrote {}", path.display());
        }
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{}", report.text());
    }
    Ok(())
}

fn bench_cmd(args: BenchArgs) -> Result<()> {
    let mut config = build_config(&args.config)?;
    if let Some(n) = args.threads {
        if n > 1024 {
            return Err(user(format!(
                "--threads {n}: allowed 0..=1024 (0 = every core), as run.threads"
            )));
        }
        config.run.threads = n;
    }
    let both = args.threads.map(grpo_lab::engine::cores::resolve);
    let compute = open_device_for(config.run.device, &config)?;
    let options = bench::BenchOptions {
        preset: args.config.preset.clone(),
        iterations: args.iterations,
        json: args.json,
        pytorch: args.pytorch,
        pytorch_threads: args.pytorch_threads.or(both).unwrap_or(1),
        scaling: args.scaling,
        vs_burn: args.vs_burn,
        threads: args.threads,
        axes: bench::SweepAxes {
            sizes: args.axes.contains(&SweepAxis::Sizes),
            threads: args.axes.contains(&SweepAxis::Threads),
        },
    };
    bench::bench(config, &compute, &options)
}

fn bench_rollout_cmd(a: BenchRolloutArgs) -> Result<()> {
    // A benchmark of the WGSL kernels: `auto` is any wgpu adapter, a hardware one first.
    let compute = match a.device {
        DeviceChoice::Auto => Compute::select(DeviceChoice::Gpu)
            .or_else(|_| Compute::select(DeviceChoice::Software))
            .map_err(user)?,
        DeviceChoice::Gpu => Compute::select(DeviceChoice::Gpu).map_err(|e| match e {
            // Its own advice, not the trainer's (`--device cpu` has no adapter to time).
            grpo_lab::gpu::DeviceError::NoGpu { seen } => user(format!(
                "--device gpu: no hardware GPU adapter found (adapters seen: {seen}); use --device software (lavapipe)"
            )),
            e => user(e),
        })?,
        other => open_device(other)?,
    };
    bench::bench_rollout(
        &compute,
        &bench::RolloutBenchOptions {
            prompts: a.prompts,
            generations: a.generations,
            n: a.n,
            vocab: a.vocab,
            repeats: a.repeats,
            json: a.json,
        },
    )
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
        // The preset (lecture17 by default) at full speed on the CPU backend, long enough for
        // the whole measurement (100k points on lecture17).
        let mut c = config.unwrap_or_else(|| RunConfig::preset("lecture17").expect("preset"));
        c.run.iterations = c.run.iterations.max(10_000);
        c.run.device = DeviceChoice::Cpu;
        c.run.log_groups = c.run.log_groups.max(3);
        config = Some(c);
    }
    if let Some(d) = a.device {
        // `--device` without `--preset`: the app's default preset on that device.
        let c = config.get_or_insert_with(|| RunConfig::preset("lecture17").expect("preset"));
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
        tab: a.tab,
        tour: a.tour,
        ..Default::default()
    })
    .map_err(|e| anyhow::anyhow!("the app could not open a window: {e}"))
}

/// What a matrix runs: `2 cells × 5 seeds = 10 runs, 2 at a time on auto → DIR`.
fn matrix_line(
    cells: usize,
    seeds: usize,
    jobs: usize,
    device: DeviceChoice,
    out: &std::path::Path,
) -> String {
    let n = |k: usize, what: &str| format!("{k} {what}{}", if k == 1 { "" } else { "s" });
    let runs = cells * seeds;
    format!(
        "{} × {} = {}, {} at a time on {} → {}",
        n(cells, "cell"),
        n(seeds, "seed"),
        n(runs, "run"),
        jobs.min(runs).max(1),
        device.name(),
        out.display()
    )
}

fn compare_cmd(a: CompareArgs) -> Result<()> {
    use grpo_lab::experiment::{Axis, CompareOptions, Matrix, parse_seeds, run_matrix};
    train::install_interrupt_handler();
    let mut matrix = match &a.experiment {
        Some(name) => {
            let given = a.config.run_defining_flags(true);
            if !given.is_empty() {
                return Err(user(format!(
                    "{} with --experiment: the experiment file brings its own config and seeds (change them with --set KEY=VALUE and --seeds)",
                    given.join(", ")
                )));
            }
            let mut m = Matrix::from_experiment(name).map_err(user)?;
            m.base = m.base.with_overrides(&a.config.sets).map_err(user)?;
            m
        }
        None => {
            if a.config.seed.is_some() {
                return Err(user(
                    "--seed with compare: each run's seed comes from --seeds (default 0..5; one seed: --seeds N)",
                ));
            }
            let base = build_config(&a.config)?;
            Matrix {
                name: base.run.name.clone(),
                base,
                axes: vec![],
                seeds: parse_seeds("0..5").map_err(user)?,
                threshold: None,
                description: String::new(),
                card: Default::default(),
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
    let device = a.config.device.unwrap_or(DeviceChoice::Auto);
    eprintln!(
        "grpo-lab compare: {}",
        matrix_line(cells.len(), matrix.seeds.len(), jobs, device, &a.out)
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
        | grpo_lab::experiment::ExperimentError::Duplicate(_)
        | grpo_lab::experiment::ExperimentError::ZeroIterations
        | grpo_lab::experiment::ExperimentError::Lock(grpo_lab::train::LockError::Held {
            ..
        })
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
            tab: None,
            tour: false,
        });
    }
    println!(
        "grpo-lab: no display found (DISPLAY / WAYLAND_DISPLAY unset); running the lecture's experiment headless instead.\n\n\
         1/2 · The lecture's table: lecture17 (3 prompts, naive loss, init scale 1) under four advantage\n\
         modes, 20 seeds each. Every run collapses onto one answer per prompt below the maximum reward of 5."
    );
    compare_cmd(CompareArgs {
        config: ConfigArgs::default(),
        experiment: Some("lecture-table".into()),
        vary: vec![],
        seeds: None,
        out: PathBuf::from("runs/lecture-table"),
        jobs: None,
        force: false,
        iterations: None,
        threshold: None,
        quiet: true,
    })?;
    println!(
        "\n2/2 · What does sort: the same task with a small init (0.3), lr 0.01, the clipped loss and a\n\
         KL penalty β = 0.04 to a reference refreshed every 10 iterations (the `kl-beta` winner).\n\
         It sorts the three training prompts; held-out accuracy stays 0, since three prompts teach\n\
         an answer each, not sorting (`--preset random-sort` learns the task itself)."
    );
    train_cmd(TrainArgs {
        config: ConfigArgs {
            preset: Some("lecture17".into()),
            sets: [
                "run.name=lecture17-sorts",
                "model.init_scale=0.3",
                "optimizer.lr=0.01",
                "algorithm.loss=clipped",
                "algorithm.epsilon_low=0.2",
                "algorithm.epsilon_high=0.2",
                "algorithm.beta=0.04",
            ]
            .map(String::from)
            .to_vec(),
            ..ConfigArgs::default()
        },
        out: Some(PathBuf::from("runs/lecture17-sorts")),
        resume: None,
        force: true,
        quiet: false,
        dry_run: false,
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

/// Output piped into a reader that stops early (`grpo-lab config-docs | head`) ends the
/// process quietly, as other command-line tools do: Rust ignores SIGPIPE, so the next print
/// panicked with "failed printing to stdout: Broken pipe" and a backtrace.
fn default_sigpipe() {
    #[cfg(target_os = "linux")]
    {
        unsafe extern "C" {
            fn signal(signum: i32, handler: usize) -> usize;
        }
        const SIGPIPE: i32 = 13;
        const SIG_DFL: usize = 0;
        // SAFETY: restores the default disposition of one signal, before any other thread.
        unsafe {
            signal(SIGPIPE, SIG_DFL);
        }
    }
}

fn main() -> ExitCode {
    default_sigpipe();
    quiet_window_system_probing();
    grpo_lab::engine::cores::keep_freed_memory();
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
        Some(Command::Objective(a)) => objective_cmd(a),
        Some(Command::GradientLab(a)) => gradient_lab_cmd(a),
        Some(Command::Devices { json }) => devices_cmd(json),
        Some(Command::ConfigDocs) => {
            print!("{}", grpo_lab::config::config_docs());
            Ok(())
        }
        Some(Command::Bench(a)) => bench_cmd(a),
        Some(Command::BenchRollout(a)) => bench_rollout_cmd(a),
        Some(Command::Export(a)) => export_cmd(a),
        Some(Command::ExportLog(a)) => export_log_cmd(a),
    };
    match result {
        // Stopped by Ctrl-C, its metrics and checkpoint written: the shell's convention.
        Ok(()) if train::run::stopped_short() => ExitCode::from(130),
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<UserError>().is_some() => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {}", chain_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, each said once: errors that print their cause in their own text
/// (`{path}: {source}`) are not followed by it again.
fn chain_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
}

//! The headless run: a `Trainer` driven to the end, its records sent to the sinks
//! (`metrics.jsonl`, `metrics.csv`, an optional channel), checkpoints every N
//! iterations and at the end, `summary.json` and the charts. Ctrl-C finishes the
//! current iteration, writes a checkpoint and stops; a second Ctrl-C stops at once.

use crate::config::RunConfig;
use crate::gpu::Compute;
use crate::grpo::{TrainError, Trainer};
use crate::metrics::{RunSummary, StepRecord};
use std::fs::{self, File};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::time::Instant;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RunError {
    #[error("{0} already holds a run; pass --resume to continue it or --force to overwrite it")]
    OutExists(PathBuf),
    #[error("--resume: {0} holds no run (no config.toml)")]
    NothingToResume(PathBuf),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl RunError {
    /// Errors the user caused (exit code 2), as opposed to failures of the machine.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            Self::OutExists(_)
                | Self::NothingToResume(_)
                | Self::Config(_)
                | Self::Train(TrainError::NonFinite { .. })
        )
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How to run.
#[derive(Default)]
pub struct RunOptions {
    pub out: PathBuf,
    pub resume: bool,
    pub force: bool,
    pub progress: bool,
    /// Every record is also sent here (the app's channel).
    pub sender: Option<Sender<StepRecord>>,
    /// Draw the charts at the end.
    pub charts: bool,
}

/// What a finished (or stopped) run left behind.
#[derive(Debug)]
pub struct RunOutcome {
    pub summary: RunSummary,
    pub out: PathBuf,
    pub charts: Vec<PathBuf>,
}

/// Ctrl-C presses since the handler was installed.
static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);

/// Install the Ctrl-C handler once (the CLI calls this; library users may not want it).
pub fn install_interrupt_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            let n = INTERRUPTS.fetch_add(1, Ordering::SeqCst) + 1;
            if n == 1 {
                eprintln!("\ngrpo-lab: interrupted; finishing this iteration and writing a checkpoint (Ctrl-C again to stop now)");
            }
        });
    });
}

/// Whether Ctrl-C has been seen.
pub fn interrupted() -> bool {
    INTERRUPTS.load(Ordering::SeqCst) > 0
}

struct Sinks {
    jsonl: BufWriter<File>,
    csv: BufWriter<File>,
    sender: Option<Sender<StepRecord>>,
}

impl Sinks {
    fn write(&mut self, record: &StepRecord) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.jsonl, record)?;
        self.jsonl.write_all(b"\n")?;
        writeln!(self.csv, "{}", record.csv_row())?;
        if let Some(tx) = &self.sender {
            // The app may have closed; training goes on.
            let _ = tx.send(record.clone());
        }
        Ok(())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.jsonl.flush()?;
        self.csv.flush()
    }
}

/// Read `metrics.jsonl` back (for charts, resume and comparisons).
pub fn read_metrics(path: &Path) -> std::io::Result<Vec<StepRecord>> {
    let file = File::open(path)?;
    let mut out = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(&line)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?,
        );
    }
    Ok(out)
}

fn checkpoint_dir(out: &Path, iteration: usize) -> PathBuf {
    out.join("checkpoints").join(format!("iter-{iteration:06}"))
}

fn latest_checkpoint(out: &Path) -> Option<PathBuf> {
    let name = fs::read_to_string(out.join("checkpoints").join("latest")).ok()?;
    let dir = out.join("checkpoints").join(name.trim());
    dir.join("state.json").exists().then_some(dir)
}

fn write_checkpoint(trainer: &Trainer, out: &Path) -> Result<(), RunError> {
    let dir = checkpoint_dir(out, trainer.iteration());
    trainer.save_checkpoint(&dir)?;
    let latest = out.join("checkpoints").join("latest");
    let name = dir
        .file_name()
        .expect("named")
        .to_string_lossy()
        .to_string();
    fs::write(&latest, name).map_err(io(&latest))?;
    // Keep the three most recent checkpoints.
    let mut all: Vec<PathBuf> = fs::read_dir(out.join("checkpoints"))
        .map_err(io(out))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    all.sort();
    for old in all.iter().rev().skip(3) {
        let _ = fs::remove_dir_all(old);
    }
    Ok(())
}

fn is_run_dir(out: &Path) -> bool {
    out.join("config.toml").exists() || out.join("metrics.jsonl").exists()
}

/// Run `config` to the end (or resume the run in `opts.out`).
pub fn run(config: RunConfig, compute: Compute, opts: RunOptions) -> Result<RunOutcome, RunError> {
    let out = opts.out.clone();
    let config_path = out.join("config.toml");
    let config = if opts.resume {
        if !config_path.exists() {
            return Err(RunError::NothingToResume(out));
        }
        // The stored config wins: a resumed run is the same run.
        RunConfig::from_file(&config_path)?
    } else {
        if is_run_dir(&out) {
            if !opts.force {
                return Err(RunError::OutExists(out));
            }
            for name in [
                "metrics.jsonl",
                "metrics.csv",
                "summary.json",
                "config.toml",
            ] {
                let _ = fs::remove_file(out.join(name));
            }
            let _ = fs::remove_dir_all(out.join("checkpoints"));
            let _ = fs::remove_dir_all(out.join("charts"));
        }
        fs::create_dir_all(&out).map_err(io(&out))?;
        fs::write(&config_path, config.to_toml()).map_err(io(&config_path))?;
        config
    };

    let mut trainer = Trainer::new(config.clone(), compute.clone())?;
    let jsonl_path = out.join("metrics.jsonl");
    let csv_path = out.join("metrics.csv");
    let mut kept: Vec<StepRecord> = Vec::new();
    if opts.resume {
        if let Some(dir) = latest_checkpoint(&out) {
            trainer.load_checkpoint(&dir)?;
        }
        // Records after the checkpoint are redone, bit for bit.
        if jsonl_path.exists() {
            kept = read_metrics(&jsonl_path).map_err(io(&jsonl_path))?;
            kept.retain(|r| r.iteration < trainer.iteration());
        }
    }
    let jsonl = File::create(&jsonl_path).map_err(io(&jsonl_path))?;
    let csv = File::create(&csv_path).map_err(io(&csv_path))?;
    let mut sinks = Sinks {
        jsonl: BufWriter::new(jsonl),
        csv: BufWriter::new(csv),
        sender: opts.sender,
    };
    writeln!(sinks.csv, "{}", StepRecord::csv_header()).map_err(io(&csv_path))?;
    for r in &kept {
        sinks.write(r).map_err(io(&jsonl_path))?;
    }
    sinks.flush().map_err(io(&jsonl_path))?;

    let total = config.total_steps() as u64;
    let bar = if opts.progress {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps ({per_sec}, eta {eta}) {msg}",
            )
            .expect("valid template"),
        );
        bar.set_position(trainer.global_step() as u64);
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };

    let started = Instant::now();
    let steps_before = trainer.global_step();
    let mut status = "completed".to_string();
    let mut last: Option<StepRecord> = kept.last().cloned();
    let mut failure: Option<TrainError> = None;
    if !trainer.is_done() && trainer.at_iteration_boundary() && trainer.iteration() == 0 {
        // A checkpoint of the initial state, so even a run that diverges at once has one.
        write_checkpoint(&trainer, &out)?;
    }
    while !trainer.is_done() {
        match trainer.step() {
            Ok(record) => {
                sinks.write(&record).map_err(io(&jsonl_path))?;
                bar.inc(1);
                if record.step_in_iteration == 0 {
                    bar.set_message(format!(
                        "iter {} reward {:.3} acc {:.2}",
                        record.iteration, record.reward_mean, record.accuracy_train
                    ));
                }
                last = Some(record);
            }
            Err(e) => {
                if let TrainError::NonFinite { step, .. } = e {
                    status = format!("diverged at step {step}");
                }
                failure = Some(e);
                break;
            }
        }
        let interrupts = INTERRUPTS.load(Ordering::SeqCst);
        if trainer.at_iteration_boundary() {
            sinks.flush().map_err(io(&jsonl_path))?;
            let every = config.run.checkpoint_every;
            if interrupts > 0
                || (every > 0 && trainer.iteration() % every == 0)
                || trainer.is_done()
            {
                write_checkpoint(&trainer, &out)?;
            }
            if interrupts > 0 {
                status = "interrupted".into();
                break;
            }
        } else if interrupts > 1 {
            status = "interrupted".into();
            break;
        }
    }
    sinks.flush().map_err(io(&jsonl_path))?;
    bar.finish_and_clear();

    let wall = started.elapsed().as_secs_f64();
    let steps_done = trainer.global_step() - steps_before;
    let (final_accuracy, final_heldout_accuracy) = trainer.evaluate();
    let summary = RunSummary {
        name: config.run.name.clone(),
        seed: config.run.seed,
        device: compute.label.clone(),
        iterations: trainer.iteration(),
        steps: trainer.global_step(),
        final_reward_mean: last.as_ref().map(|r| r.reward_mean).unwrap_or(f32::NAN),
        final_accuracy,
        final_heldout_accuracy,
        sft_heldout_accuracy: trainer.sft_heldout_accuracy(),
        final_entropy: last.as_ref().map(|r| r.entropy).unwrap_or(f32::NAN),
        final_kl: last.as_ref().map(|r| r.kl).unwrap_or(f32::NAN),
        max_reward: crate::task::reward::max_reward_of(&config),
        wall_time_secs: wall,
        ms_per_step: if steps_done > 0 {
            wall * 1000.0 / steps_done as f64
        } else {
            f64::NAN
        },
        status,
    };
    let summary_path = out.join("summary.json");
    fs::write(
        &summary_path,
        serde_json::to_string_pretty(&summary).expect("summary serializes"),
    )
    .map_err(io(&summary_path))?;
    let charts = if opts.charts {
        let records = read_metrics(&jsonl_path).map_err(io(&jsonl_path))?;
        crate::report::run_charts(&records, &config, &out.join("charts")).map_err(io(&out))?
    } else {
        Vec::new()
    };
    if let Some(e) = failure {
        return Err(e.into());
    }
    Ok(RunOutcome {
        summary,
        out,
        charts,
    })
}

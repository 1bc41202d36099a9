//! The headless run: a `Trainer` driven to the end, its records sent to the sinks
//! (`metrics.jsonl`, `metrics.csv`, an optional channel), checkpoints every N
//! iterations and at the end, `summary.json` and the charts. Ctrl-C finishes the
//! current iteration, writes a checkpoint and stops; a second Ctrl-C stops at once.

use crate::config::RunConfig;
use crate::gpu::Compute;
use crate::grpo::{TrainError, Trainer};
use crate::metrics::{RunSummary, StepRecord};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use thiserror::Error;
use web_time::Instant;

use super::progress::Progress;
#[cfg(feature = "native")]
use super::progress::bar_shown;

/// `eprintln!` through [`say`]: above a drawn bar, not through it.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::train::progress::say(&format!($($arg)*))
    };
}

#[derive(Debug, Error)]
pub enum RunError {
    #[error("{0} already holds a run; pass --resume to continue it or --force to overwrite it")]
    OutExists(PathBuf),
    #[error("--resume: {0} holds no run (no config.toml)")]
    NothingToResume(PathBuf),
    #[error(
        "--resume: {0} holds metrics but no readable checkpoint; refusing to start it again from step 1 over them (pass --force without --resume to start over)"
    )]
    NoCheckpoint(PathBuf),
    #[error(
        "--resume: {path} does not hold every step before the checkpoint ({detail}); it was edited or damaged, so the run is not continued over it"
    )]
    MetricsGap { path: PathBuf, detail: String },
    #[error(
        "this config would need about {estimate:.0} MiB, over the {cap:.0} MiB {cap_from}; mostly: {drivers} (`grpo-lab train --dry-run` prints the whole estimate; run.max_memory_mib sets the cap)"
    )]
    TooBig {
        estimate: f64,
        cap: f64,
        cap_from: &'static str,
        drivers: String,
    },
    #[error(transparent)]
    Lock(#[from] super::lock::LockError),
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
                | Self::NoCheckpoint(_)
                | Self::MetricsGap { .. }
                | Self::TooBig { .. }
                | Self::Lock(super::lock::LockError::Held { .. })
                | Self::Config(_)
                | Self::Train(TrainError::NonFinite { .. })
                | Self::Train(TrainError::ConfigChanged(_))
                | Self::Train(TrainError::ShorterThanCheckpoint { .. })
                // A prompt space too small for the splits asked for is bad input too.
                | Self::Train(TrainError::Task(_))
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
    /// The directory's lock, when the caller took it already (the CLI takes it before it
    /// opens a device, so a second writer is refused at once); else `run` takes it.
    pub lock: Option<super::lock::RunLock>,
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

/// The runs of this process under way ([`run`]; `compare` runs several), and those of them in
/// an iteration that began with the cold start and has written no record yet. When every run
/// is there, a second Ctrl-C ends the process at once (see the handler).
static RUNS: AtomicUsize = AtomicUsize::new(0);
static IN_COLD_START: AtomicUsize = AtomicUsize::new(0);

/// One of [`RUNS`] while it lives.
struct Running;

impl Running {
    fn new() -> Self {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Install the Ctrl-C handler once (the CLI calls this; library users may not want it); it
/// takes SIGTERM and SIGHUP the same way (ctrlc's `termination`: a scheduler's or a closed
/// terminal's stop keeps the iteration's metrics and writes a checkpoint, as Ctrl-C does).
/// Without the `native` feature (the browser) there is no Ctrl-C: this does nothing.
pub fn install_interrupt_handler() {
    #[cfg(feature = "native")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let _ = ctrlc::set_handler(|| {
                let n = INTERRUPTS.fetch_add(1, Ordering::SeqCst) + 1;
                if n == 1 {
                    // Off the terminal's `^C` and the bar's line; a log gets no blank line.
                    // (A drawn bar's line, `^C` included, is cleared for the line instead.)
                    let fresh_line = if std::io::IsTerminal::is_terminal(&std::io::stderr()) && !bar_shown() { "\n" } else { "" };
                    say!("{fresh_line}grpo-lab: interrupted; finishing this iteration and writing a checkpoint (Ctrl-C again to stop now)");
                } else if IN_COLD_START.load(Ordering::SeqCst) > 0
                    && IN_COLD_START.load(Ordering::SeqCst) == RUNS.load(Ordering::SeqCst)
                {
                    // The cold start is one engine call (burn's path: ~40 s on lavapipe) that
                    // no step boundary interrupts, and nothing of the run is being written
                    // while it runs: stopping here loses nothing a resume would not redo.
                    say!("grpo-lab: stopped in the cold start; `--resume` runs it again from the same initial weights");
                    std::process::exit(130);
                }
            });
        });
    }
}

/// Whether Ctrl-C has been seen.
pub fn interrupted() -> bool {
    INTERRUPTS.load(Ordering::SeqCst) > 0
}

/// A run that ran to its end although Ctrl-C came during its last iteration ([`mark_complete`]).
static COMPLETE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `train`'s run finished every iteration: the process ends as a success even after a Ctrl-C.
pub fn mark_complete() {
    COMPLETE.store(true, Ordering::SeqCst);
}

/// Whether Ctrl-C stopped the work short (the CLI's exit code 130).
pub fn stopped_short() -> bool {
    interrupted() && !COMPLETE.load(Ordering::SeqCst)
}

/// Where stderr is not a terminal (a log file, a pipe, a batch job) the bar draws nothing: a
/// run says how it stands in plain lines instead, at most every `every` seconds and at its end.
struct LogLines {
    on: bool,
    every: f64,
    last: Option<Instant>,
}

impl LogLines {
    fn new(progress: bool) -> Self {
        #[cfg(feature = "native")]
        let on = progress && !std::io::IsTerminal::is_terminal(&std::io::stderr());
        #[cfg(not(feature = "native"))]
        let on = {
            let _ = progress;
            false
        };
        Self {
            on,
            every: 10.0,
            last: None,
        }
    }

    /// The cold start is one engine call that makes no step: said, and the bar kept moving.
    fn cold_start(&self, bar: &Progress, config: &RunConfig) {
        let what = format!("cold start: {} supervised steps", config.sft.steps);
        if self.on {
            say!("grpo-lab: {what}");
        }
        bar.set_message(|| what);
        bar.tick_steadily(true);
    }

    /// A line for an iteration that ended (always the run's last; otherwise when due).
    fn iteration(
        &mut self,
        trainer: &Trainer,
        config: &RunConfig,
        last: Option<&StepRecord>,
        started: Instant,
    ) {
        let due = self
            .last
            .is_none_or(|t| t.elapsed().as_secs_f64() >= self.every);
        if !self.on || !(due || trainer.is_done()) {
            return;
        }
        self.last = Some(Instant::now());
        let figures = last.map_or(String::new(), |r| {
            format!(
                " · reward {:.3} · batch accuracy {:.2}",
                r.reward_mean, r.accuracy_train
            )
        });
        say!(
            "grpo-lab: iteration {}/{} · step {}/{}{figures} · {:.0} s",
            trainer.iteration(),
            config.run.iterations,
            trainer.global_step(),
            config.total_steps(),
            started.elapsed().as_secs_f64()
        );
    }
}

struct Sinks {
    jsonl: BufWriter<File>,
    csv: BufWriter<File>,
    sender: Option<Sender<StepRecord>>,
}

impl Sinks {
    fn create(
        jsonl_path: &Path,
        csv_path: &Path,
        sender: Option<Sender<StepRecord>>,
    ) -> Result<Self, RunError> {
        let jsonl = File::create(jsonl_path).map_err(io(jsonl_path))?;
        let mut csv = BufWriter::new(File::create(csv_path).map_err(io(csv_path))?);
        writeln!(csv, "{}", StepRecord::csv_header()).map_err(io(csv_path))?;
        Ok(Self {
            jsonl: BufWriter::new(jsonl),
            csv,
            sender,
        })
    }

    /// Continue files whose first `keep` bytes of `metrics.jsonl` are the records to keep:
    /// the rest is cut in place (no copy of the run in memory), `metrics.csv` rebuilt from
    /// what is kept through a temporary file.
    fn resume(
        jsonl_path: &Path,
        csv_path: &Path,
        keep: u64,
        sender: Option<Sender<StepRecord>>,
    ) -> Result<Self, RunError> {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(jsonl_path)
            .map_err(io(jsonl_path))?;
        file.set_len(keep).map_err(io(jsonl_path))?;
        file.sync_data().map_err(io(jsonl_path))?;
        let mut text = StepRecord::csv_header();
        text.push('\n');
        use std::io::BufRead;
        let reader = std::io::BufReader::new(File::open(jsonl_path).map_err(io(jsonl_path))?);
        for line in reader.lines() {
            let line = line.map_err(io(jsonl_path))?;
            if let Ok(r) = serde_json::from_str::<StepRecord>(&line) {
                text.push_str(&r.csv_row());
                text.push('\n');
            }
        }
        super::checkpoint::write_atomic(csv_path, text.as_bytes()).map_err(io(csv_path))?;
        let csv = fs::OpenOptions::new()
            .append(true)
            .open(csv_path)
            .map_err(io(csv_path))?;
        Ok(Self {
            jsonl: BufWriter::new(file),
            csv: BufWriter::new(csv),
            sender,
        })
    }

    /// Flush and sync to disk: before a checkpoint, so no checkpoint outlives its metrics.
    fn sync(&mut self) -> std::io::Result<()> {
        self.flush()?;
        self.jsonl.get_ref().sync_data()?;
        self.csv.get_ref().sync_data()
    }

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

/// Read `metrics.jsonl` back (for charts, resume and comparisons). A last line cut short (a
/// kill in the middle of a write) is dropped with a warning; any other line that does not
/// parse is an error naming its line number.
pub fn read_metrics(path: &Path) -> std::io::Result<Vec<StepRecord>> {
    let mut out = Vec::new();
    for_each_metric(path, |r| out.push(r))?;
    Ok(out)
}

/// Stream `metrics.jsonl`'s records through `f` in constant memory, with [`read_metrics`]'s
/// rules for a torn last line and a bad line.
pub fn for_each_metric(path: &Path, mut f: impl FnMut(StepRecord)) -> std::io::Result<()> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(File::open(path)?);
    let (mut line, mut number) = (String::new(), 0usize);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        number += 1;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(r) => f(r),
            // No newline at its end: the last line, cut short.
            Err(_) if !line.ends_with('\n') => {
                say!(
                    "grpo-lab: {}: line {number} is incomplete (still being written, or cut by an interrupted write); dropped",
                    path.display()
                );
            }
            Err(e) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("line {number}: {e}"),
                ));
            }
        }
    }
}

/// Check `metrics.jsonl` against a checkpoint taken before iteration `iteration` (after
/// `steps` optimizer steps), streaming: the records before it must be exactly steps 1..=steps,
/// in order; a last line cut short is dropped with a warning. Returns the byte length of the
/// part to keep (the rest is redone), its last record, and how many whole records past it the
/// resume drops (to be redone).
fn reconcile_metrics(
    path: &Path,
    iteration: usize,
    steps: usize,
) -> Result<(u64, Option<StepRecord>, usize), RunError> {
    use std::io::BufRead;
    let gap = |detail: String| RunError::MetricsGap {
        path: path.to_path_buf(),
        detail,
    };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(_) if steps == 0 => return Ok((0, None, 0)),
        Err(e) => return Err(gap(format!("missing step 1..={steps} ({e})"))),
    };
    let mut reader = std::io::BufReader::new(file);
    let (mut line, mut offset, mut number) = (String::new(), 0u64, 0usize);
    let mut last: Option<StepRecord> = None;
    let mut seen = 0usize;
    loop {
        line.clear();
        let read = reader.read_line(&mut line).map_err(io(path))?;
        if read == 0 {
            break;
        }
        number += 1;
        let r: StepRecord = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(_) if !line.ends_with('\n') => {
                say!(
                    "grpo-lab: {}: line {number} is incomplete (still being written, or cut by an interrupted write); dropped",
                    path.display()
                );
                break;
            }
            Err(e) => {
                return Err(RunError::Io {
                    path: path.to_path_buf(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("line {number}: {e}"),
                    ),
                });
            }
        };
        if r.iteration >= iteration {
            // This record and every whole one after it belong to iterations redone.
            let mut dropped = 1;
            loop {
                line.clear();
                if reader.read_line(&mut line).map_err(io(path))? == 0 {
                    break;
                }
                dropped += usize::from(line.ends_with('\n'));
            }
            if seen != steps {
                return Err(gap(format!("missing step {}", seen + 1)));
            }
            return Ok((offset, last, dropped));
        }
        if r.step != seen + 1 {
            return Err(gap(if r.step > seen + 1 {
                format!("missing step {}", seen + 1)
            } else {
                format!("repeated step {} (line {number})", r.step)
            }));
        }
        seen = r.step;
        offset += read as u64;
        last = Some(r);
    }
    if seen != steps {
        return Err(gap(format!("missing step {}", seen + 1)));
    }
    Ok((offset, last, 0))
}

/// The iteration of the last record in `metrics.jsonl` that parses, read from the file's tail
/// (a torn last line is passed over); `None` for a file without one.
fn last_iteration(path: &Path) -> std::io::Result<Option<usize>> {
    use std::io::{Read, Seek, SeekFrom};
    #[derive(serde::Deserialize)]
    struct It {
        iteration: usize,
    }
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut window = 64 * 1024u64;
    loop {
        let start = len.saturating_sub(window);
        file.seek(SeekFrom::Start(start))?;
        let mut tail = Vec::with_capacity((len - start) as usize);
        (&mut file).take(len - start).read_to_end(&mut tail)?;
        // Lines wholly inside the window: after its first newline, unless it starts the file.
        let whole = if start == 0 {
            &tail[..]
        } else {
            match tail.iter().position(|&b| b == b'\n') {
                Some(i) => &tail[i + 1..],
                None => &[][..],
            }
        };
        let found = whole
            .split(|&b| b == b'\n')
            .rev()
            .find_map(|line| serde_json::from_slice::<It>(line).ok());
        if found.is_some() || start == 0 {
            return Ok(found.map(|r| r.iteration));
        }
        window *= 4;
    }
}

/// `metrics.jsonl` thinned for charts, in bounded memory for any run length: every record of
/// at most `max_iterations` (to 2×) evenly spaced iterations, always the last one. A run of up
/// to `max_iterations` iterations comes back whole.
pub fn read_metrics_decimated(
    path: &Path,
    max_iterations: usize,
) -> std::io::Result<Vec<StepRecord>> {
    use std::io::BufRead;
    /// Whole iterations, every `stride`-th; the stride doubles when too many are kept.
    struct Thinned {
        kept: Vec<StepRecord>,
        stride: usize,
        iterations: usize,
        max: usize,
    }
    impl Thinned {
        fn close(&mut self, current: &mut Vec<StepRecord>) {
            let Some(it) = current.first().map(|r| r.iteration) else {
                return;
            };
            if it % self.stride == 0 {
                if self.stride > 1 {
                    // A long run: per iteration, its first step and the step with the groups.
                    current.retain(|r| r.step_in_iteration == 0 || r.groups.is_some());
                }
                self.kept.append(current);
                self.iterations += 1;
                if self.iterations > 2 * self.max {
                    self.stride *= 2;
                    let stride = self.stride;
                    self.kept.retain(|r| {
                        r.iteration % stride == 0
                            && (r.step_in_iteration == 0 || r.groups.is_some())
                    });
                    self.iterations = self
                        .kept
                        .iter()
                        .filter(|r| r.step_in_iteration == 0)
                        .count();
                }
            }
            current.clear();
        }
    }
    let max = max_iterations.max(1);
    // Knowing the run's length up front, a long run is thinned from its first line: memory is
    // that of `max` iterations' first steps, not of `2·max` whole iterations.
    let stride = match last_iteration(path)? {
        Some(last) if last + 1 > max => (last + 1).div_ceil(max).next_power_of_two(),
        _ => 1,
    };
    let mut reader = std::io::BufReader::new(File::open(path)?);
    let mut t = Thinned {
        kept: Vec::new(),
        stride,
        iterations: 0,
        max,
    };
    let (mut current, mut line) = (Vec::new(), String::new());
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        // The charts tolerate what resume refuses: a line that does not parse is skipped.
        let Ok(mut r) = serde_json::from_str::<StepRecord>(&line) else {
            continue;
        };
        // Charts read the groups' advantages, not their tokens or per-token log-probs.
        for g in r.groups.iter_mut().flatten() {
            (g.responses, g.logp, g.old_logp) = (Vec::new(), Vec::new(), Vec::new());
            (g.ref_logp, g.entropy, g.cov_terms) = (Vec::new(), Vec::new(), Vec::new());
        }
        if current
            .first()
            .is_some_and(|c: &StepRecord| c.iteration != r.iteration)
        {
            t.close(&mut current);
        }
        current.push(r);
    }
    // The last iteration always shows, kept or not.
    if current.first().is_some_and(|c| c.iteration % t.stride != 0) {
        t.kept.append(&mut current);
    } else {
        t.close(&mut current);
    }
    Ok(t.kept)
}

/// What the trainer refuses on a resume ([`crate::grpo::TrainerState::check_resume`]), refused before
/// anything runs or prints (the trainer would say it after the run's start line).
pub fn check_resume(out: &Path, config: &RunConfig) -> Result<(), TrainError> {
    resume_state(out).map_or(Ok(()), |state| state.check_resume(config))
}

/// The trainer's state a resume of `out` would start from (the checkpoint it takes, chosen
/// without a word); None for a run without one.
pub(crate) fn resume_state(out: &Path) -> Option<crate::grpo::TrainerState> {
    pick_checkpoint(out, false).and_then(|dir| super::checkpoint::state_of(&dir).ok())
}

/// The iteration a checkpoint directory `iter-N` belongs to (numbers past 999 999 sort right).
fn checkpoint_number(dir: &Path) -> u64 {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("iter-"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn checkpoint_dir(out: &Path, iteration: usize) -> PathBuf {
    out.join("checkpoints").join(format!("iter-{iteration:06}"))
}

/// The checkpoint to resume from: the one `latest` names if it verifies against its manifest,
/// else the newest that does, each one passed over named with the reason (a crash mid-write,
/// a file cut, edited or deleted since).
pub(crate) fn latest_checkpoint(out: &Path) -> Option<PathBuf> {
    pick_checkpoint(out, true)
}

/// [`latest_checkpoint`]'s choice; `say`: name each one passed over, and why.
fn pick_checkpoint(out: &Path, say: bool) -> Option<PathBuf> {
    let root = out.join("checkpoints");
    // `latest` names one directory beside it: one plain path component (not `../other-run`).
    let written = fs::read_to_string(root.join("latest")).ok();
    let named = written
        .as_deref()
        .map(str::trim)
        .filter(|name| {
            let mut parts = Path::new(name).components();
            matches!(
                (parts.next(), parts.next()),
                (Some(std::path::Component::Normal(_)), None)
            )
        })
        .map(|name| root.join(name))
        .filter(|dir| dir.is_dir());
    if let (Some(text), None, true) = (&written, &named, say) {
        say!(
            "grpo-lab: passing over checkpoints/latest: it names {:?}, not a checkpoint directory of this run",
            text.trim()
        );
    }
    let mut all: Vec<PathBuf> = fs::read_dir(&root)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    all.sort_by_key(|p| std::cmp::Reverse(checkpoint_number(p)));
    let candidates = named
        .iter()
        .chain(all.iter().filter(|d| Some(*d) != named.as_ref()));
    for (i, dir) in candidates.enumerate() {
        match super::checkpoint::verify(dir) {
            Ok(()) => {
                if say && (i > 0 || named.is_none()) {
                    say!(
                        "grpo-lab: taking {}, the newest checkpoint that verifies",
                        dir.display()
                    );
                }
                return Some(dir.clone());
            }
            Err(why) if say => {
                say!("grpo-lab: passing over checkpoint {}: {why}", dir.display())
            }
            Err(_) => {}
        }
    }
    None
}

fn write_checkpoint(trainer: &Trainer, out: &Path) -> Result<(), RunError> {
    let dir = checkpoint_dir(out, trainer.iteration());
    super::checkpoint::save(trainer, &dir)?;
    let latest = out.join("checkpoints").join("latest");
    let name = dir
        .file_name()
        .expect("named")
        .to_string_lossy()
        .to_string();
    super::checkpoint::write_atomic(&latest, name.as_bytes()).map_err(io(&latest))?;
    // Keep this checkpoint and the two newest earlier ones; only once this one verifies, and
    // never one after it (a resume from an earlier checkpoint rewrites those in turn).
    if let Err(why) = super::checkpoint::verify(&dir) {
        return Err(RunError::Train(TrainError::Checkpoint {
            path: dir.display().to_string(),
            reason: format!("just written, it does not verify: {why}"),
        }));
    }
    let mut earlier: Vec<PathBuf> = fs::read_dir(out.join("checkpoints"))
        .map_err(io(out))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() && checkpoint_number(p) < checkpoint_number(&dir))
        .collect();
    earlier.sort_by_key(|p| checkpoint_number(p));
    for old in earlier.iter().rev().skip(2) {
        let _ = fs::remove_dir_all(old);
    }
    Ok(())
}

pub fn is_run_dir(out: &Path) -> bool {
    out.join("config.toml").exists() || out.join("metrics.jsonl").exists()
}

/// Memory this machine has available now, in MiB (Linux's `MemAvailable`; None elsewhere).
pub fn available_memory_mib() -> Option<f64> {
    // A browser tab: wasm32 addresses 4 GiB at most; half of it for the run, the rest for
    // the allocator's slack and the page (a larger run aborts the tab, blank, mid-allocation).
    #[cfg(target_arch = "wasm32")]
    return Some(2048.0);
    #[cfg(not(target_arch = "wasm32"))]
    {
        let info = fs::read_to_string("/proc/meminfo").ok()?;
        let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    }
}

/// The memory cap of a config and where it comes from (None: no cap known).
pub fn memory_cap(config: &RunConfig) -> Option<(f64, &'static str)> {
    let available = if cfg!(target_arch = "wasm32") {
        "a browser tab's WebAssembly memory can hold (wasm32: half of its 4 GiB)"
    } else {
        "this machine has available"
    };
    match config.run.max_memory_mib {
        0 => available_memory_mib().map(|m| (m, available)),
        m => Some((m as f64, "of run.max_memory_mib")),
    }
}

/// Refuse a config whose memory estimate exceeds its cap, before anything is allocated.
pub fn check_memory(config: &RunConfig) -> Result<(), RunError> {
    let e = crate::estimate::estimate(config);
    match memory_cap(config) {
        Some((cap, cap_from)) if e.total_mib() > cap => Err(RunError::TooBig {
            estimate: e.total_mib(),
            cap,
            cap_from,
            drivers: e.drivers(),
        }),
        _ => Ok(()),
    }
}

/// Run `config` to the end (or resume the run in `opts.out`): the directory's lock, the
/// config recorded (or checked against the recorded one), the trainer and its sinks (from the
/// last checkpoint, on a resume), the steps, then the summary and the charts.
pub fn run(config: RunConfig, compute: Compute, opts: RunOptions) -> Result<RunOutcome, RunError> {
    check_memory(&config)?;
    let _running = Running::new();
    let out = opts.out.clone();
    // One writer per run directory, held until this function returns.
    let _lock = match opts.lock {
        Some(lock) if lock.dir() == out => lock,
        other => {
            // A lock of another spelling of the directory would refuse this process itself.
            drop(other);
            super::lock::RunLock::acquire(&out)?
        }
    };
    // The engine first: a config it refuses (an engine that does not cover it, a task too
    // small for its splits) writes nothing, so the corrected command needs no --force.
    let mut trainer = Trainer::new(config.clone(), compute.clone())?;
    let config = record_config(config, &out, opts.resume, opts.force)?;
    let (mut sinks, last_kept) = if opts.resume {
        continue_from_checkpoint(&mut trainer, &config, &out, opts.sender)?
    } else {
        (
            Sinks::create(
                &out.join("metrics.jsonl"),
                &out.join("metrics.csv"),
                opts.sender,
            )?,
            None,
        )
    };
    let started = Instant::now();
    let steps_before = trainer.global_step();
    let driven = drive(
        &mut trainer,
        &config,
        &out,
        &mut sinks,
        opts.progress,
        last_kept,
    )?;
    // A resume of a run already at its end ran nothing: its summary (its time per step) stays.
    let kept = (opts.resume && trainer.global_step() == steps_before)
        .then(|| read_summary(&out))
        .flatten()
        .filter(|s| s.status == "completed" && s.steps == trainer.global_step());
    if kept.is_some() {
        say!(
            "grpo-lab: {} is complete at its {} iterations: nothing to run (--set run.iterations=N extends it)",
            out.display(),
            trainer.iteration()
        );
    }
    let summary = match kept {
        Some(summary) => summary,
        None => write_summary(&mut trainer, &config, &out, &driven, started, steps_before)?,
    };
    let charts = if opts.charts {
        // Charts from the file, thinned to at most 600 iterations (on a 900-pixel-wide chart):
        // memory stays flat however long the run was.
        let jsonl_path = out.join("metrics.jsonl");
        let records = read_metrics_decimated(&jsonl_path, 300).map_err(io(&jsonl_path))?;
        crate::report::run_charts(&records, &config, &out.join("charts")).map_err(io(&out))?
    } else {
        Vec::new()
    };
    if let Some(e) = driven.failure {
        return Err(e.into());
    }
    Ok(RunOutcome {
        summary,
        out,
        charts,
    })
}

/// A run's `summary.json`, if it has one that reads.
pub fn read_summary(dir: &Path) -> Option<RunSummary> {
    let text = fs::read_to_string(dir.join("summary.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// The config a run goes on with. A new run records it in `out` (refusing a directory that
/// holds a run, or clearing that run's files with `force`); a resumed run is the same run: the
/// recorded config, where only `run.iterations` may change (to extend it).
fn record_config(
    config: RunConfig,
    out: &Path,
    resume: bool,
    force: bool,
) -> Result<RunConfig, RunError> {
    let config_path = out.join("config.toml");
    if resume {
        if !config_path.exists() {
            return Err(RunError::NothingToResume(out.to_path_buf()));
        }
        let changed = RunConfig::from_file(&config_path)?.changed_for_resume(&config);
        if !changed.is_empty() {
            return Err(RunError::Train(TrainError::ConfigChanged(
                changed.join(", "),
            )));
        }
        return Ok(config);
    }
    if is_run_dir(out) {
        if !force {
            return Err(RunError::OutExists(out.to_path_buf()));
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
    fs::create_dir_all(out).map_err(io(out))?;
    fs::write(&config_path, config.to_toml()).map_err(io(&config_path))?;
    Ok(config)
}

/// A resume: the trainer from the newest checkpoint that verifies, the metrics cut back to it
/// (every record before it must be there), the sinks continuing them; and the last record
/// kept.
fn continue_from_checkpoint(
    trainer: &mut Trainer,
    config: &RunConfig,
    out: &Path,
    sender: Option<Sender<StepRecord>>,
) -> Result<(Sinks, Option<StepRecord>), RunError> {
    let (jsonl_path, csv_path, config_path) = (
        out.join("metrics.jsonl"),
        out.join("metrics.csv"),
        out.join("config.toml"),
    );
    match latest_checkpoint(out) {
        Some(dir) => {
            super::checkpoint::load(trainer, &dir)?;
            // Checkpoints after this one belong to a timeline being abandoned (the
            // metrics past it are redone): one of them must never be a later fallback.
            if let Ok(entries) = fs::read_dir(out.join("checkpoints")) {
                for later in entries.filter_map(|e| e.ok().map(|e| e.path())) {
                    if later.is_dir() && checkpoint_number(&later) > checkpoint_number(&dir) {
                        let _ = fs::remove_dir_all(later);
                    }
                }
            }
        }
        // Starting again would truncate the metrics of the run it is asked to continue.
        None if jsonl_path.exists() && fs::metadata(&jsonl_path).is_ok_and(|m| m.len() > 0) => {
            return Err(RunError::NoCheckpoint(out.to_path_buf()));
        }
        None => {}
    }
    // Records past the checkpoint are redone, bit for bit; the ones before it must all be
    // there (a deleted or shortened file is refused, not continued with a hole).
    let (keep, kept_last, dropped) =
        reconcile_metrics(&jsonl_path, trainer.iteration(), trainer.global_step())?;
    if trainer.iteration() > 0 || dropped > 0 {
        say!(
            "grpo-lab: resuming after iteration {} (step {}){}",
            trainer.iteration(),
            trainer.global_step(),
            match dropped {
                0 => String::new(),
                n => format!(
                    "; the {n} record{} logged after that checkpoint {} redone",
                    if n == 1 { "" } else { "s" },
                    if n == 1 { "is" } else { "are" }
                ),
            }
        );
    }
    // Extending the run (`--set run.iterations=N`), or where it now computes (`--device`,
    // `run.engine`, `run.threads`), is recorded once it is sure to go on.
    if RunConfig::from_file(&config_path)? != *config {
        super::checkpoint::write_atomic(&config_path, config.to_toml().as_bytes())
            .map_err(io(&config_path))?;
    }
    Ok((
        Sinks::resume(&jsonl_path, &csv_path, keep, sender)?,
        kept_last,
    ))
}

/// How the steps ended.
struct Driven {
    status: String,
    last: Option<StepRecord>,
    failure: Option<TrainError>,
}

impl Driven {
    /// The run stops on `e`; a diverged step's record is logged (which figure went
    /// non-finite first shows).
    fn fail(&mut self, mut e: TrainError, sinks: &mut Sinks) -> std::io::Result<()> {
        if let TrainError::NonFinite { step, record, .. } = &mut e {
            self.status = format!("diverged at step {step}");
            if let Some(record) = record.take() {
                sinks.write(&record)?;
            }
        }
        self.failure = Some(e);
        Ok(())
    }
}

/// Step the trainer to the end (or to Ctrl-C, or to a non-finite loss), each record to the
/// sinks, a checkpoint every `run.checkpoint_every` iterations and at the end (the metrics on
/// disk first).
fn drive(
    trainer: &mut Trainer,
    config: &RunConfig,
    out: &Path,
    sinks: &mut Sinks,
    progress: bool,
    last_kept: Option<StepRecord>,
) -> Result<Driven, RunError> {
    let jsonl_path = out.join("metrics.jsonl");
    let bar = Progress::new(
        progress,
        config.total_steps() as u64,
        "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps ({per_sec}, eta {eta}) {msg}",
    );
    bar.set_position(trainer.global_step() as u64);
    let mut driven = Driven {
        status: "completed".to_string(),
        last: last_kept,
        failure: None,
    };
    if !trainer.is_done()
        && trainer.at_iteration_boundary()
        && trainer.iteration() == 0
        && super::checkpoint::verify(&checkpoint_dir(out, 0)).is_err()
    {
        // A checkpoint of the initial state, so even a run that diverges at once has one — but
        // not over the one a resume starts from: a kill mid-rewrite would leave no checkpoint
        // that verifies (a rewrite is not byte-identical: burn records fresh parameter ids).
        write_checkpoint(trainer, out)?;
    }
    let mu = config.algorithm.steps_per_iteration();
    let (mut lines, started) = (LogLines::new(progress), Instant::now());
    while !trainer.is_done() {
        // One iteration, each record to the sinks as its step ends; a second Ctrl-C stops it
        // in the middle.
        let mut written = Ok(());
        let mut stopped = false;
        let mut cold = !trainer.cold_start_done();
        if cold {
            IN_COLD_START.fetch_add(1, Ordering::SeqCst);
            lines.cold_start(&bar, config);
        }
        let result = trainer.run_iteration(|record| {
            if std::mem::take(&mut cold) {
                IN_COLD_START.fetch_sub(1, Ordering::SeqCst);
                bar.tick_steadily(false);
            }
            written = sinks.write(&record);
            bar.inc(1);
            if record.step_in_iteration == 0 {
                bar.set_message(|| {
                    format!(
                        "iter {} reward {:.3} acc {:.2}",
                        record.iteration, record.reward_mean, record.accuracy_train
                    )
                });
            }
            // Not on the iteration's last step: its end is a checkpoint, below.
            stopped = INTERRUPTS.load(Ordering::SeqCst) > 1 && record.step_in_iteration + 1 < mu;
            driven.last = Some(record);
            written.is_ok() && !stopped
        });
        if cold {
            IN_COLD_START.fetch_sub(1, Ordering::SeqCst);
        }
        written.map_err(io(&jsonl_path))?;
        if let Err(e) = result {
            driven.fail(e, sinks).map_err(io(&jsonl_path))?;
            break;
        }
        if stopped {
            driven.status = "interrupted".into();
            break;
        }
        let interrupts = INTERRUPTS.load(Ordering::SeqCst);
        let every = config.run.checkpoint_every;
        if interrupts > 0
            || (every > 0 && trainer.iteration().is_multiple_of(every))
            || trainer.is_done()
        {
            // The metrics reach the disk before the checkpoint that follows them.
            sinks.sync().map_err(io(&jsonl_path))?;
            write_checkpoint(trainer, out)?;
        } else {
            sinks.flush().map_err(io(&jsonl_path))?;
        }
        lines.iteration(trainer, config, driven.last.as_ref(), started);
        // Stopped after the last iteration: the run is complete.
        if interrupts > 0 && !trainer.is_done() {
            driven.status = "interrupted".into();
            break;
        }
    }
    sinks.flush().map_err(io(&jsonl_path))?;
    bar.finish_and_clear();
    Ok(driven)
}

/// `summary.json`: the final evaluation and the run's figures.
fn write_summary(
    trainer: &mut Trainer,
    config: &RunConfig,
    out: &Path,
    driven: &Driven,
    started: Instant,
    steps_before: usize,
) -> Result<RunSummary, RunError> {
    let wall = started.elapsed().as_secs_f64();
    let steps_done = trainer.global_step() - steps_before;
    let (final_accuracy, final_heldout_accuracy) = trainer.evaluate()?;
    let last = driven.last.as_ref();
    let summary = RunSummary {
        name: config.run.name.clone(),
        seed: config.run.seed,
        device: trainer.engine_label(),
        iterations: trainer.iteration(),
        steps: trainer.global_step(),
        final_reward_mean: last.map(|r| r.reward_mean).unwrap_or(f32::NAN),
        final_accuracy,
        final_heldout_accuracy,
        sft_heldout_accuracy: trainer.sft_heldout_accuracy(),
        final_entropy: last.map(|r| r.entropy).unwrap_or(f32::NAN),
        final_kl: last.map(|r| r.kl).unwrap_or(f32::NAN),
        max_reward: crate::task::reward::max_reward_of(config),
        wall_time_secs: wall,
        ms_per_step: if steps_done > 0 {
            wall * 1000.0 / steps_done as f64
        } else {
            f64::NAN
        },
        status: driven.status.clone(),
        policy_parameters: trainer.engine().flat_weights().len(),
        critic_parameters: trainer.critic_parameters(),
    };
    let summary_path = out.join("summary.json");
    fs::write(
        &summary_path,
        serde_json::to_string_pretty(&summary).expect("summary serializes"),
    )
    .map_err(io(&summary_path))?;
    Ok(summary)
}

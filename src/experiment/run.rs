//! Running a matrix: every (cell, seed) run in `--out/runs/`, those already complete skipped,
//! cells in parallel, the directory locked for one writer.

use super::report::summarise;
use super::*;

/// Options for running a matrix.
pub struct CompareOptions {
    pub out: PathBuf,
    pub jobs: usize,
    pub force: bool,
    pub progress: bool,
    /// Override every cell's iteration count (CI smoke runs).
    pub iterations: Option<usize>,
    pub device: DeviceChoice,
}

/// What a finished matrix left behind.
pub struct CompareOutcome {
    pub cells: Vec<CellSummary>,
    pub summary_md: PathBuf,
    pub charts: Vec<PathBuf>,
    pub skipped: usize,
    pub ran: usize,
}

/// One writer per `--out` (and, inside, per cell: `train::run` locks each cell's directory);
/// with `--force`, the finished runs go, but not from under a writer still busy in one of them
/// (a `train --resume` there), and each cell's lock file stays (a writer that opened it before
/// must lock the same file as the next one).
pub(super) fn take_out(opts: &CompareOptions) -> Result<train::RunLock, ExperimentError> {
    let lock = train::RunLock::acquire(&opts.out)?;
    if opts.force {
        let entries = |dir: &Path| -> Vec<PathBuf> {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect()
        };
        let runs = entries(&opts.out.join("runs"));
        let cell_locks = runs
            .iter()
            .filter(|p| p.is_dir())
            .map(|p| train::RunLock::acquire(p))
            .collect::<Result<Vec<_>, _>>()?;
        for path in runs.iter().flat_map(|p| {
            if p.is_dir() {
                entries(p)
            } else {
                vec![p.clone()]
            }
        }) {
            if path
                .file_name()
                .is_some_and(|n| n == train::lock::LOCK_FILE)
            {
                continue;
            }
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
        drop(cell_locks);
    }
    Ok(lock)
}

/// Run every (cell, seed), skipping those already complete, then summarise.
pub fn run_matrix(
    matrix: &Matrix,
    opts: &CompareOptions,
) -> Result<CompareOutcome, ExperimentError> {
    if opts.iterations == Some(0) {
        return Err(ExperimentError::ZeroIterations);
    }
    let mut cells = matrix.cells()?;
    for c in &mut cells {
        if let Some(it) = opts.iterations {
            c.config.run.iterations = it;
        }
        c.config.run.device = opts.device;
        c.config.run.log_groups = c.config.run.log_groups.min(4);
    }
    let _lock = take_out(opts)?;
    let (todo, skipped) = plan(matrix, &cells, opts)?;
    std::fs::create_dir_all(opts.out.join("runs")).map_err(io(&opts.out))?;
    // Each cell on the fastest engine for it (`auto`; a lecture cell and a transformer cell may
    // differ), every device opened (and said) once, before any run starts.
    let mut computes = Vec::with_capacity(todo.len());
    let mut said = std::collections::BTreeSet::new();
    for (config, _, _) in &todo {
        let (compute, why) =
            crate::engine::select(opts.device, config).map_err(|e| ExperimentError::Run {
                dir: opts.out.display().to_string(),
                reason: e.to_string(),
            })?;
        if opts.progress && said.insert(why.clone()) {
            train::progress::say(&format!("grpo-lab: {why}"));
        }
        computes.push(compute);
    }
    // A resumed run makes only the steps past its checkpoint.
    let total_steps: u64 = todo
        .iter()
        .map(|(c, dir, resume)| {
            let done = resume
                .then(|| train::run::resume_state(dir))
                .flatten()
                .map_or(0, |s| s.global_step);
            c.total_steps().saturating_sub(done) as u64
        })
        .sum();
    // Counted in steps, as each run makes them (counted in runs, a matrix of long runs sat
    // at 0/N for hours).
    let bar = train::progress::Progress::new(
        opts.progress,
        total_steps,
        "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps (eta {eta}) {msg}",
    );
    let runs = todo.len();
    bar.set_message(|| format!("0 of {runs} runs done, {skipped} done before"));
    // The runs that reached their end (a Ctrl-C leaves the rest for the next call).
    let ran = run_all(&todo, &computes, opts.jobs, &bar, skipped)?;
    bar.finish_and_clear();
    summarise(matrix, &cells, opts).map(|(cells, summary_md, charts)| CompareOutcome {
        cells,
        summary_md,
        charts,
        skipped,
        ran,
    })
}

/// A run of the matrix: its config, its directory, and whether it continues a stopped one.
type Todo = (RunConfig, PathBuf, bool);

/// Which runs are done, which need running; a cell whose stored config differs is refused up
/// front. Returns the runs to do and how many are done already.
fn plan(
    matrix: &Matrix,
    cells: &[Cell],
    opts: &CompareOptions,
) -> Result<(Vec<Todo>, usize), ExperimentError> {
    let mut todo = Vec::new();
    let mut skipped = 0;
    for cell in cells {
        for &seed in &matrix.seeds {
            let mut config = cell.config.clone();
            config.run.seed = seed;
            config.run.name = format!("{} seed {seed}", cell.label);
            let dir = run_dir(&opts.out, cell, seed);
            let stored = dir.join("config.toml");
            if stored.exists() {
                let mut prev = RunConfig::from_file(&stored)?;
                // The threads a cell ran on change no result (engine::cores).
                prev.run.threads = config.run.threads;
                if prev != config {
                    let diff = prev.differing_keys(&config).join(", ");
                    return Err(ExperimentError::DifferentConfig {
                        dir: dir.display().to_string(),
                        cell: cell.label.clone(),
                        diff,
                    });
                }
                let done = read_summary(&dir).is_some_and(|s| s.status == "completed");
                if done {
                    skipped += 1;
                    continue;
                }
                todo.push((config, dir, true));
            } else {
                todo.push((config, dir, false));
            }
        }
    }
    Ok((todo, skipped))
}

/// Runs `todo` on `jobs` threads, `computes[i]` for run `i`; the first error, after all stop.
fn run_all(
    todo: &[Todo],
    computes: &[crate::gpu::Compute],
    jobs: usize,
    bar: &train::progress::Progress,
    skipped: usize,
) -> Result<usize, ExperimentError> {
    let (next, finished) = (&AtomicUsize::new(0), &AtomicUsize::new(0));
    let errors: &Mutex<Vec<ExperimentError>> = &Mutex::new(Vec::new());
    let jobs = jobs.max(1).min(todo.len().max(1));
    // Cells in parallel share the cores: `run.threads = 0` becomes each one's share.
    let share = (crate::engine::cores::available() / jobs).max(1);
    // Every run's records, to move the bar step by step.
    let (steps, records) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            records
                .iter()
                .for_each(|_: crate::metrics::StepRecord| bar.inc(1))
        });
        for _ in 0..jobs {
            let steps = steps.clone();
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some((config, dir, resume)) = todo.get(i) else {
                        break;
                    };
                    if train::interrupted() {
                        break;
                    }
                    let mut config = config.clone();
                    if config.run.threads == 0 {
                        config.run.threads = share;
                    }
                    let result = train::run(
                        config,
                        computes[i].clone(),
                        RunOptions {
                            out: dir.clone(),
                            resume: *resume,
                            force: false,
                            progress: false,
                            sender: Some(steps.clone()),
                            charts: false,
                            lock: None,
                        },
                    );
                    match result {
                        Ok(o) if o.summary.status == "interrupted" => {}
                        // A diverged run is a result.
                        Ok(_)
                        | Err(train::RunError::Train(crate::grpo::TrainError::NonFinite {
                            ..
                        })) => {
                            let done = finished.fetch_add(1, Ordering::SeqCst) + 1;
                            let runs = todo.len();
                            bar.set_message(|| {
                                format!("{done} of {runs} runs done, {skipped} done before")
                            });
                        }
                        // A cell another process writes: the user's error, as for `--out`.
                        Err(train::RunError::Lock(e)) => errors
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(ExperimentError::Lock(e)),
                        Err(e) => errors.lock().unwrap_or_else(|e| e.into_inner()).push(
                            ExperimentError::Run {
                                dir: dir.display().to_string(),
                                reason: e.to_string(),
                            },
                        ),
                    }
                }
            });
        }
        // The workers hold the senders now: the counter ends with the last of them.
        drop(steps);
    });
    match std::mem::take(&mut *errors.lock().unwrap_or_else(|e| e.into_inner()))
        .into_iter()
        .next()
    {
        Some(e) => Err(e),
        None => Ok(finished.load(Ordering::SeqCst)),
    }
}

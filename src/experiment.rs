//! Comparison experiments: a base config × `--vary` axes × seeds, run in parallel,
//! resumable, summarised in `summary.csv` / `summary.md` with overlay charts (mean ± std
//! over seeds). Experiment files (`assets/experiments/*.toml` with an `[experiment]`
//! table) describe one matrix each.

use crate::config::{ConfigError, DeviceChoice, RunConfig};
use crate::metrics::{Getter, RunSummary, StepRecord};
use crate::report::stats::mean_std;
use crate::report::{Series, line_chart};
use crate::train::{self, RunOptions};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ExperimentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("--vary `{0}`: expected KEY=V1,V2,... (e.g. algorithm.advantage=raw,centered)")]
    BadVary(String),
    #[error("report / plots: {0}")]
    BadReport(String),
    #[error("--seeds `{0}`: expected A..B (e.g. 0..20) or a list (e.g. 1,5,9)")]
    BadSeeds(String),
    #[error("the matrix is ambiguous: {0}; each key may vary on one axis, each value once")]
    Duplicate(String),
    #[error("--iterations 0: a run needs at least one iteration")]
    ZeroIterations,
    #[error("unknown experiment `{name}`; available: {available}")]
    UnknownExperiment { name: String, available: String },
    #[error("experiment file {path}: {reason}")]
    BadFile { path: String, reason: String },
    #[error(
        "{dir} holds a run of a different config than cell `{cell}` (it differs in {diff}); use another --out, or --force to start over"
    )]
    DifferentConfig {
        dir: String,
        cell: String,
        diff: String,
    },
    #[error("run {dir}: {reason}")]
    Run { dir: String, reason: String },
    #[error(transparent)]
    Lock(#[from] crate::train::LockError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ExperimentError + '_ {
    move |source| ExperimentError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// One axis of the matrix: a config key and its values.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub key: String,
    pub values: Vec<String>,
}

impl Axis {
    pub fn parse(s: &str) -> Result<Self, ExperimentError> {
        let (key, values) = s
            .split_once('=')
            .ok_or_else(|| ExperimentError::BadVary(s.into()))?;
        let values: Vec<String> = split_values(values);
        if key.trim().is_empty() || values.is_empty() {
            return Err(ExperimentError::BadVary(s.into()));
        }
        Ok(Self {
            key: key.trim().into(),
            values,
        })
    }
}

/// Split `a,b,{x=1,y=2}` on top-level commas (inline tables and arrays stay whole).
fn split_values(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for ch in s.chars() {
        match ch {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out.retain(|v| !v.is_empty());
    out
}

pub fn parse_seeds(s: &str) -> Result<Vec<u64>, ExperimentError> {
    let bad = || ExperimentError::BadSeeds(s.into());
    if let Some((a, b)) = s.split_once("..") {
        let a: u64 = a.trim().parse().map_err(|_| bad())?;
        let b: u64 = b.trim().parse().map_err(|_| bad())?;
        if b <= a {
            return Err(bad());
        }
        return Ok((a..b).collect());
    }
    let seeds: Vec<u64> = s
        .split(',')
        .map(|x| x.trim().parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    if let Some(dup) = first_repeat(&seeds) {
        return Err(ExperimentError::Duplicate(format!(
            "seed {dup} is listed twice"
        )));
    }
    Ok(seeds)
}

/// The first element that occurs twice.
fn first_repeat<T: PartialEq + Clone>(xs: &[T]) -> Option<T> {
    xs.iter()
        .enumerate()
        .find(|(i, x)| xs[..*i].contains(x))
        .map(|(_, x)| x.clone())
}

/// One cell of the matrix (one combination of axis values), over every seed.
#[derive(Debug, Clone)]
pub struct Cell {
    /// `algorithm.advantage=raw,algorithm.loss=naive`
    pub label: String,
    /// A file-system-safe name.
    pub slug: String,
    pub sets: Vec<String>,
    pub config: RunConfig,
}

/// The whole matrix.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub name: String,
    pub base: RunConfig,
    pub axes: Vec<Axis>,
    pub seeds: Vec<u64>,
    /// Reward threshold for "iterations to reach".
    pub threshold: Option<f64>,
    pub description: String,
    /// The claim it tests, what to look at, what it reports (the Experiments tab's card).
    pub card: Card,
}

/// What an experiment shows a student: the lecture's claim in one sentence with its source,
/// where to look, and the metrics its table and charts report beyond the reward.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Card {
    pub claim: String,
    /// Where the claim comes from (`seeds §3.2`, `lecture 17`, a paper).
    pub source: String,
    pub look_at: String,
    pub report: Vec<ReportMetric>,
    /// Metrics drawn per iteration (mean ± std over seeds) besides `BAND_METRICS`.
    pub plots: Vec<String>,
}

/// How one seed's run is reduced to a number for the report table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agg {
    /// Mean over every step where the metric was logged.
    Mean,
    /// Mean over the last 10 iterations' steps.
    Last10,
    /// The last logged value.
    Final,
    Max,
    Min,
    /// The first logged value (at the start of training: iteration 0).
    First,
}

impl Agg {
    pub const NAMES: &[&str] = &["mean", "last10", "final", "max", "min", "first"];
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "mean" => Agg::Mean,
            "last10" => Agg::Last10,
            "final" => Agg::Final,
            "max" => Agg::Max,
            "min" => Agg::Min,
            "first" => Agg::First,
            _ => return None,
        })
    }
    fn words(self) -> &'static str {
        match self {
            Agg::Mean => "mean over the run",
            Agg::Last10 => "mean, last 10 it.",
            Agg::Final => "final",
            Agg::Max => "max over the run",
            Agg::Min => "min over the run",
            Agg::First => "first",
        }
    }
}

/// A metric of the report table: `name@agg` in the file (`ratio/max@max`; `@mean` if omitted).
#[derive(Debug, Clone, PartialEq)]
pub struct ReportMetric {
    pub metric: String,
    pub agg: Agg,
}

impl ReportMetric {
    pub fn parse(s: &str) -> Result<Self, ExperimentError> {
        // `eval/pass@k` holds an `@` of its own: the suffix is an aggregation only when it
        // names one.
        let (metric, agg) = match s.rsplit_once('@') {
            Some((m, a)) if Agg::parse(a).is_some() => (m.to_string(), Agg::parse(a)),
            _ => (s.to_string(), Some(Agg::Mean)),
        };
        let agg = agg.unwrap_or(Agg::Mean);
        if !crate::metrics::CSV_COLUMNS
            .iter()
            .any(|(n, _)| *n == metric)
        {
            return Err(ExperimentError::BadReport(format!(
                "unknown metric `{metric}`; allowed: {} (each optionally @{})",
                crate::metrics::CSV_COLUMNS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
                Agg::NAMES.join("|@")
            )));
        }
        Ok(Self { metric, agg })
    }

    /// The column header: `ppo_kl (max over the run)`.
    pub fn header(&self) -> String {
        format!("{} ({})", self.metric, self.agg.words())
    }

    /// How each run is reduced, in words (`max over the run`).
    pub fn agg_words(&self) -> &'static str {
        self.agg.words()
    }
}

/// Reduces one run's records to its report numbers, one record at a time (constant memory).
#[derive(Debug, Clone)]
pub struct ReportAcc {
    metrics: Vec<ReportMetric>,
    /// Each metric's getter, looked up once (`None`: not a metric; never logged).
    getters: Vec<Option<Getter>>,
    sum: Vec<(f64, usize)>,
    extreme: Vec<f64>,
    last: Vec<f64>,
    first: Vec<f64>,
    /// Per metric: (iteration, sum, count) of the last 10 iterations seen.
    tail: Vec<std::collections::VecDeque<(usize, f64, usize)>>,
}

impl ReportAcc {
    pub fn new(metrics: &[ReportMetric]) -> Self {
        let n = metrics.len();
        Self {
            metrics: metrics.to_vec(),
            getters: metrics
                .iter()
                .map(|m| crate::metrics::getter(&m.metric))
                .collect(),
            sum: vec![(0.0, 0); n],
            extreme: metrics
                .iter()
                .map(|m| {
                    if m.agg == Agg::Min {
                        f64::INFINITY
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect(),
            last: vec![f64::NAN; n],
            first: vec![f64::NAN; n],
            tail: vec![Default::default(); n],
        }
    }

    pub fn push(&mut self, r: &StepRecord) {
        for (k, m) in self.metrics.iter().enumerate() {
            let Some(v) = self.getters[k]
                .and_then(|get| get(r))
                .filter(|v| v.is_finite())
            else {
                continue;
            };
            let v = v as f64;
            self.sum[k].0 += v;
            self.sum[k].1 += 1;
            self.last[k] = v;
            if self.sum[k].1 == 1 {
                self.first[k] = v;
            }
            self.extreme[k] = if m.agg == Agg::Min {
                self.extreme[k].min(v)
            } else {
                self.extreme[k].max(v)
            };
            let tail = &mut self.tail[k];
            match tail.back_mut() {
                Some(b) if b.0 == r.iteration => {
                    b.1 += v;
                    b.2 += 1;
                }
                _ => {
                    if tail.len() == 10 {
                        tail.pop_front();
                    }
                    tail.push_back((r.iteration, v, 1));
                }
            }
        }
    }

    /// One number per metric (NaN where it was never logged).
    pub fn finish(&self) -> Vec<f64> {
        self.metrics
            .iter()
            .enumerate()
            .map(|(k, m)| {
                if self.sum[k].1 == 0 {
                    return f64::NAN;
                }
                match m.agg {
                    Agg::Mean => self.sum[k].0 / self.sum[k].1 as f64,
                    Agg::Final => self.last[k],
                    Agg::First => self.first[k],
                    Agg::Max | Agg::Min => self.extreme[k],
                    Agg::Last10 => {
                        let (s, c) = self.tail[k]
                            .iter()
                            .fold((0.0, 0), |(s, c), x| (s + x.1, c + x.2));
                        s / c.max(1) as f64
                    }
                }
            })
            .collect()
    }
}

impl Matrix {
    /// Every cell, each validated: a bad key or value fails here, before any run starts.
    pub fn cells(&self) -> Result<Vec<Cell>, ExperimentError> {
        // A key on two axes would be set twice per cell (the last one silently winning) and a
        // value listed twice would be two cells of the same config: both refused, by name.
        let keys: Vec<&str> = self
            .axes
            .iter()
            .flat_map(|a| a.key.split('&').map(str::trim))
            .collect();
        if let Some(k) = first_repeat(&keys) {
            return Err(ExperimentError::Duplicate(format!("`{k}` is varied twice")));
        }
        for axis in &self.axes {
            if let Some(v) = first_repeat(&axis.values) {
                return Err(ExperimentError::Duplicate(format!(
                    "`{}` lists the value `{v}` twice",
                    axis.key
                )));
            }
        }
        if let Some(seed) = first_repeat(&self.seeds) {
            return Err(ExperimentError::Duplicate(format!(
                "seed {seed} is listed twice"
            )));
        }
        let mut combos: Vec<Vec<(String, String)>> = vec![vec![]];
        for axis in &self.axes {
            let mut next = Vec::new();
            for c in &combos {
                for v in &axis.values {
                    let mut c = c.clone();
                    // Linked keys move together: `a&b=x&y,z&w` is two cells, not four.
                    let keys: Vec<&str> = axis.key.split('&').map(str::trim).collect();
                    let vals: Vec<&str> = if keys.len() > 1 {
                        v.split('&').map(str::trim).collect()
                    } else {
                        vec![v.as_str()]
                    };
                    if keys.len() != vals.len() {
                        return Err(ExperimentError::BadVary(format!(
                            "{}={v}: {} linked keys but {} values",
                            axis.key,
                            keys.len(),
                            vals.len()
                        )));
                    }
                    for (k, x) in keys.iter().zip(vals) {
                        c.push((k.to_string(), x.to_string()));
                    }
                    next.push(c);
                }
            }
            combos = next;
        }
        combos
            .into_iter()
            .map(|combo| {
                let sets: Vec<String> = combo.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let config = self.base.with_overrides(&sets)?;
                let label = if sets.is_empty() {
                    "base".to_string()
                } else {
                    combo
                        .iter()
                        .map(|(k, v)| format!("{}={v}", k.rsplit('.').next().unwrap_or(k)))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                let slug: String = label
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                Ok(Cell {
                    label,
                    slug,
                    sets,
                    config,
                })
            })
            .collect()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExperimentFile {
    experiment: ExperimentSection,
    #[serde(flatten)]
    _rest: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExperimentSection {
    name: String,
    #[serde(default)]
    description: String,
    preset: String,
    seeds: String,
    #[serde(default)]
    vary: Vec<String>,
    #[serde(default)]
    set: Vec<String>,
    threshold: Option<f64>,
    #[serde(default)]
    claim: String,
    #[serde(default)]
    source: String,
    #[serde(default)]
    look_at: String,
    #[serde(default)]
    report: Vec<String>,
    #[serde(default)]
    plots: Vec<String>,
}

/// The compiled-in experiment files.
pub const EXPERIMENTS: &[(&str, &str)] = &[
    (
        "lecture-table",
        include_str!("../assets/experiments/lecture-table.toml"),
    ),
    (
        "loss-modes",
        include_str!("../assets/experiments/loss-modes.toml"),
    ),
    (
        "kl-beta",
        include_str!("../assets/experiments/kl-beta.toml"),
    ),
    (
        "difficulty-bias",
        include_str!("../assets/experiments/difficulty-bias.toml"),
    ),
    (
        "sparse-vs-shaped",
        include_str!("../assets/experiments/sparse-vs-shaped.toml"),
    ),
    (
        "entropy-collapse",
        include_str!("../assets/experiments/entropy-collapse.toml"),
    ),
    (
        "bug-gallery",
        include_str!("../assets/experiments/bug-gallery.toml"),
    ),
    (
        "length-bias",
        include_str!("../assets/experiments/length-bias-matrix.toml"),
    ),
    (
        "r1-vs-r1-zero",
        include_str!("../assets/experiments/r1-vs-r1-zero-matrix.toml"),
    ),
    (
        "dynamic-sampling",
        include_str!("../assets/experiments/dynamic-sampling.toml"),
    ),
    (
        "reward-hacking",
        include_str!("../assets/experiments/reward-hacking.toml"),
    ),
    (
        "pass-at-k",
        include_str!("../assets/experiments/pass-at-k.toml"),
    ),
    (
        "group-size",
        include_str!("../assets/experiments/group-size.toml"),
    ),
    (
        "prompt-sampling",
        include_str!("../assets/experiments/prompt-sampling.toml"),
    ),
    (
        "ppo-vs-grpo",
        include_str!("../assets/experiments/ppo-vs-grpo.toml"),
    ),
    (
        "ppo-vs-grpo-transformer",
        include_str!("../assets/experiments/ppo-vs-grpo-transformer.toml"),
    ),
    (
        "distill-vs-rl",
        include_str!("../assets/experiments/distill-vs-rl.toml"),
    ),
    (
        "std-blowup",
        include_str!("../assets/experiments/std-blowup.toml"),
    ),
];

impl Matrix {
    pub fn from_experiment(name: &str) -> Result<Self, ExperimentError> {
        let text = crate::config::named_asset(EXPERIMENTS, name).map_err(|available| {
            ExperimentError::UnknownExperiment {
                name: name.into(),
                available,
            }
        })?;
        Self::from_experiment_str(text, name)
    }

    pub fn from_experiment_str(text: &str, origin: &str) -> Result<Self, ExperimentError> {
        let file: ExperimentFile = toml::from_str(text).map_err(|e| ExperimentError::BadFile {
            path: origin.into(),
            reason: e.message().to_string(),
        })?;
        let e = file.experiment;
        let base = RunConfig::preset(&e.preset)?.with_overrides(&e.set)?;
        Ok(Self {
            name: e.name,
            base,
            axes: e
                .vary
                .iter()
                .map(|v| Axis::parse(v))
                .collect::<Result<_, _>>()?,
            seeds: parse_seeds(&e.seeds)?,
            threshold: e.threshold,
            description: e.description,
            card: Card {
                claim: e.claim,
                source: e.source,
                look_at: e.look_at,
                report: e
                    .report
                    .iter()
                    .map(|r| ReportMetric::parse(r))
                    .collect::<Result<_, _>>()?,
                plots: e
                    .plots
                    .iter()
                    .map(|p| ReportMetric::parse(p).map(|m| m.metric))
                    .collect::<Result<_, _>>()?,
            },
        })
    }
}

/// Per-cell results over seeds.
#[derive(Debug, Clone)]
pub struct CellSummary {
    pub label: String,
    pub seeds: usize,
    pub final_reward: (f64, f64),
    pub ci95: (f64, f64),
    pub reached: usize,
    pub iterations_to_threshold: Option<f64>,
    pub final_entropy: f64,
    pub frac_zero_std: f64,
    pub final_accuracy: f64,
    pub heldout_accuracy: f64,
    /// Mean response length over the last 10 iterations: all, correct, wrong.
    pub final_length: (f64, f64, f64),
    pub wall_secs: f64,
    /// The card's report metrics: (mean, std) over seeds, in `Card::report` order.
    pub report: Vec<(f64, f64)>,
}

/// Each report metric's (mean, std) over the seeds' numbers (a seed that never logged it is
/// left out).
pub fn report_over_seeds(per_seed: &[Vec<f64>], metrics: usize) -> Vec<(f64, f64)> {
    (0..metrics)
        .map(|k| {
            let v: Vec<f64> = per_seed
                .iter()
                .filter_map(|r| r.get(k).copied())
                .filter(|x| x.is_finite())
                .collect();
            if v.is_empty() {
                (f64::NAN, f64::NAN)
            } else {
                mean_std(&v)
            }
        })
        .collect()
}

impl Card {
    /// The metrics drawn per iteration besides `BAND_METRICS`: the plots, then the report's.
    pub fn band_metrics(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for m in self
            .plots
            .iter()
            .chain(self.report.iter().map(|r| &r.metric))
        {
            if !v.contains(m) && !BAND_METRICS.contains(&m.as_str()) {
                v.push(m.clone());
            }
        }
        v
    }

    /// The report as a markdown table (cells × metrics, mean ± std over seeds).
    pub fn report_markdown(&self, rows: &[(String, Vec<(f64, f64)>)]) -> String {
        if self.report.is_empty() {
            return String::new();
        }
        let mut md = format!(
            "| cell | {} |\n|---|{}\n",
            self.report
                .iter()
                .map(ReportMetric::header)
                .collect::<Vec<_>>()
                .join(" | "),
            "---|".repeat(self.report.len())
        );
        for (label, vals) in rows {
            md.push_str(&format!(
                "| {label} | {} |\n",
                vals.iter()
                    .map(|(m, s)| fmt_mean_std(*m, *s))
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
        }
        md
    }
}

/// `0.123 ± 0.004`, with digits for the magnitude; `–` when not logged.
pub fn fmt_mean_std(m: f64, s: f64) -> String {
    if !m.is_finite() {
        return "–".into();
    }
    let a = m.abs().max(s.abs());
    if a >= 1e5 {
        return format!("{m:.2e} ± {s:.2e}");
    }
    let d = if a >= 100.0 {
        1
    } else if a >= 1.0 {
        2
    } else if a >= 0.01 {
        3
    } else {
        4
    };
    format!("{m:.d$} ± {s:.d$}")
}

/// Two-sided 97.5 % quantile of Student's t with `df` degrees of freedom.
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    if df == 0 {
        f64::NAN
    } else if df <= 30 {
        T[df - 1]
    } else {
        1.96
    }
}

/// The metrics drawn as bands over seeds (compare charts and the app).
pub const BAND_METRICS: [&str; 6] = [
    "reward/mean",
    "kl",
    "entropy",
    "completions/mean_length",
    "completions/mean_length_wrong",
    "accuracy/heldout",
];

/// Per metric, per iteration: (iteration, mean, std) over the runs (seeds) of one cell. A
/// run's value at an iteration is the mean over its steps there (the rollout's metrics repeat
/// on each step; the step's own — KL, ratio, clip fractions — vary). `BAND_METRICS` and `extra`.
pub fn seed_bands(
    runs: &[Vec<StepRecord>],
    extra: &[String],
) -> BTreeMap<String, Vec<(f64, f64, f64)>> {
    let names: Vec<(&str, Getter)> = BAND_METRICS
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .filter_map(|n| crate::metrics::getter(n).map(|g| (n, g)))
        .collect();
    let mut per_iter: BTreeMap<&str, BTreeMap<usize, Vec<f64>>> = BTreeMap::new();
    for run in runs {
        // (metric, iteration) → (sum, count) within this run
        let mut acc: BTreeMap<(&str, usize), (f64, usize)> = BTreeMap::new();
        for r in run {
            for &(name, get) in &names {
                if let Some(v) = get(r).filter(|v| v.is_finite()) {
                    let e = acc.entry((name, r.iteration)).or_default();
                    e.0 += v as f64;
                    e.1 += 1;
                }
            }
        }
        for ((name, it), (sum, count)) in acc {
            per_iter
                .entry(name)
                .or_default()
                .entry(it)
                .or_default()
                .push(sum / count as f64);
        }
    }
    per_iter
        .into_iter()
        .map(|(name, by_iter)| {
            let pts = by_iter
                .iter()
                .map(|(it, v)| {
                    let (m, s) = mean_std(v);
                    (*it as f64, m, s)
                })
                .collect();
            (name.to_string(), pts)
        })
        .collect()
}

/// Per cell: its label and, per metric, (iteration, mean, std) over its seeds.
pub type CellBands = Vec<(String, BTreeMap<String, Vec<(f64, f64, f64)>>)>;

/// A compare directory read back: each cell's runs, grouped by the run directories' names
/// (`{cell}__seed{S}`), as bands over seeds.
pub fn load_compare_dir(dir: &Path) -> Result<CellBands, ExperimentError> {
    let runs_dir = if dir.join("runs").is_dir() {
        dir.join("runs")
    } else {
        dir.to_path_buf()
    };
    let mut cells: BTreeMap<String, Vec<Vec<StepRecord>>> = BTreeMap::new();
    for entry in std::fs::read_dir(&runs_dir).map_err(io(&runs_dir))? {
        let path = entry.map_err(io(&runs_dir))?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let Some((cell, _seed)) = name.rsplit_once("__seed") else {
            continue;
        };
        if let Ok(records) = train::run::read_metrics_decimated(&path.join("metrics.jsonl"), 300) {
            cells.entry(cell.to_string()).or_default().push(records);
        }
    }
    Ok(cells
        .into_iter()
        .map(|(cell, runs)| (cell, seed_bands(&runs, &[])))
        .collect())
}

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

/// A run's `summary.json`, if it has one that reads.
fn read_summary(dir: &Path) -> Option<RunSummary> {
    let text = std::fs::read_to_string(dir.join("summary.json")).ok()?;
    serde_json::from_str(&text).ok()
}

fn run_dir(out: &Path, cell: &Cell, seed: u64) -> PathBuf {
    out.join("runs").join(format!("{}__seed{seed}", cell.slug))
}

/// One writer per `--out` (and, inside, per cell: `train::run` locks each cell's directory);
/// with `--force`, the finished runs go, but not from under a writer still busy in one of them
/// (a `train --resume` there).
fn take_out(opts: &CompareOptions) -> Result<train::RunLock, ExperimentError> {
    let lock = train::RunLock::acquire(&opts.out)?;
    if opts.force {
        let runs = opts.out.join("runs");
        let cell_locks = std::fs::read_dir(&runs)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join(train::lock::LOCK_FILE).exists())
            .map(|p| train::RunLock::acquire(&p))
            .collect::<Result<Vec<_>, _>>()?;
        let _ = std::fs::remove_dir_all(&runs);
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
    // Plan: which runs are done, which need running; refuse mixed configs up front.
    let mut todo = Vec::new();
    let mut skipped = 0;
    for cell in &cells {
        for &seed in &matrix.seeds {
            let mut config = cell.config.clone();
            config.run.seed = seed;
            config.run.name = format!("{} seed {seed}", cell.label);
            let dir = run_dir(&opts.out, cell, seed);
            let stored = dir.join("config.toml");
            if stored.exists() {
                let prev = RunConfig::from_file(&stored)?;
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
            eprintln!("grpo-lab: {why}");
        }
        computes.push(compute);
    }
    let total_steps: u64 = todo.iter().map(|(c, _, _)| c.total_steps() as u64).sum();
    let bar = train::run::Progress::new(
        opts.progress,
        todo.len() as u64,
        "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs (eta {eta}) {msg}",
    );
    bar.set_message(|| format!("{total_steps} steps, {skipped} runs already done"));
    let next = AtomicUsize::new(0);
    let errors: Mutex<Vec<ExperimentError>> = Mutex::new(Vec::new());
    let jobs = opts.jobs.max(1).min(todo.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some((config, dir, resume)) = todo.get(i) else {
                        break;
                    };
                    if train::interrupted() {
                        break;
                    }
                    let result = train::run(
                        config.clone(),
                        computes[i].clone(),
                        RunOptions {
                            out: dir.clone(),
                            resume: *resume,
                            force: false,
                            progress: false,
                            sender: None,
                            charts: false,
                            lock: None,
                        },
                    );
                    match result {
                        Ok(_) => bar.inc(1),
                        // A diverged run is a result.
                        Err(train::RunError::Train(crate::grpo::TrainError::NonFinite {
                            ..
                        })) => bar.inc(1),
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
    });
    bar.finish_and_clear();
    if let Some(e) = errors
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .next()
    {
        return Err(e);
    }
    let ran = todo.len();
    summarise(matrix, &cells, opts).map(|(cells, summary_md, charts)| CompareOutcome {
        cells,
        summary_md,
        charts,
        skipped,
        ran,
    })
}

fn summarise(
    matrix: &Matrix,
    cells: &[Cell],
    opts: &CompareOptions,
) -> Result<(Vec<CellSummary>, PathBuf, Vec<PathBuf>), ExperimentError> {
    let mut summaries = Vec::new();
    let mut overlays: BTreeMap<String, Vec<Series>> = BTreeMap::new();
    for cell in cells {
        let mut finals = Vec::new();
        let mut entropies = Vec::new();
        let mut zero = Vec::new();
        let mut accs = Vec::new();
        let mut walls = Vec::new();
        let mut heldout = Vec::new();
        let mut lengths: [Vec<f64>; 3] = Default::default();
        let mut reach = Vec::new();
        let mut reports: Vec<Vec<f64>> = Vec::new();
        let mut seed_records: Vec<Vec<StepRecord>> = Vec::new();
        for &seed in &matrix.seeds {
            let dir = run_dir(&opts.out, cell, seed);
            let path = dir.join("metrics.jsonl");
            // Statistics streamed (constant memory for any run length), bands from the
            // decimated read the charts use.
            let (mut tail, mut zero_sum, mut firsts, mut reached) =
                (std::collections::VecDeque::new(), 0f64, 0usize, None);
            let mut report = ReportAcc::new(&matrix.card.report);
            let streamed = train::run::for_each_metric(&path, |r| {
                report.push(&r);
                if r.step_in_iteration != 0 {
                    return;
                }
                firsts += 1;
                zero_sum += r.frac_reward_zero_std as f64;
                if reached.is_none()
                    && matrix
                        .threshold
                        .is_some_and(|th| r.reward_mean as f64 >= th)
                {
                    reached = Some(r.iteration as f64);
                }
                if tail.len() == 10 {
                    tail.pop_front();
                }
                tail.push_back([r.mean_length, r.mean_length_correct, r.mean_length_wrong]);
            });
            let Ok(records) =
                streamed.and_then(|()| train::run::read_metrics_decimated(&path, 300))
            else {
                continue;
            };
            let Some(summary) = read_summary(&dir) else {
                continue;
            };
            finals.push(summary.final_reward_mean as f64);
            entropies.push(summary.final_entropy as f64);
            accs.push(summary.final_accuracy as f64);
            walls.push(summary.wall_time_secs);
            heldout.push(summary.final_heldout_accuracy.map_or(f64::NAN, f64::from));
            for (k, acc) in lengths.iter_mut().enumerate() {
                let v: Vec<f64> = tail
                    .iter()
                    .map(|l| l[k] as f64)
                    .filter(|x| x.is_finite())
                    .collect();
                if !v.is_empty() {
                    acc.push(v.iter().sum::<f64>() / v.len() as f64);
                }
            }
            zero.push(zero_sum / firsts.max(1) as f64);
            if let Some(it) = reached {
                reach.push(it);
            }
            reports.push(report.finish());
            seed_records.push(records);
        }
        let fr = mean_std(&finals);
        let half = t975(finals.len().saturating_sub(1)) * fr.1 / (finals.len() as f64).sqrt();
        summaries.push(CellSummary {
            label: cell.label.clone(),
            seeds: finals.len(),
            final_reward: fr,
            ci95: (fr.0 - half, fr.0 + half),
            reached: reach.len(),
            iterations_to_threshold: (!reach.is_empty()).then(|| mean_std(&reach).0),
            final_entropy: mean_std(&entropies).0,
            frac_zero_std: mean_std(&zero).0,
            final_accuracy: mean_std(&accs).0,
            heldout_accuracy: mean_std(&heldout).0,
            final_length: (
                mean_std(&lengths[0]).0,
                mean_std(&lengths[1]).0,
                mean_std(&lengths[2]).0,
            ),
            wall_secs: mean_std(&walls).0,
            report: report_over_seeds(&reports, matrix.card.report.len()),
        });
        for (name, pts) in seed_bands(&seed_records, &matrix.card.band_metrics()) {
            let mut series =
                Series::line(cell.label.clone(), pts.iter().map(|p| (p.0, p.1)).collect());
            series.band = Some(pts.iter().map(|p| (p.0, p.1 - p.2, p.1 + p.2)).collect());
            overlays.entry(name).or_default().push(series);
        }
    }
    let out = &opts.out;
    let mut csv = String::from(
        "cell,seeds,final_reward_mean,final_reward_std,ci95_low,ci95_high,reached_threshold,iterations_to_threshold,final_entropy,frac_reward_zero_std,final_accuracy,heldout_accuracy,mean_length,mean_length_correct,mean_length_wrong,wall_secs",
    );
    // The card's report after the fixed columns: `{metric}@{agg}` mean and std.
    for m in &matrix.card.report {
        let name = format!("{}@{}", m.metric, Agg::NAMES[m.agg as usize]);
        csv.push_str(&format!(",\"{name} mean\",\"{name} std\""));
    }
    csv.push('\n');
    for s in &summaries {
        csv.push_str(&format!(
            "\"{}\",{},{:.4},{:.4},{:.4},{:.4},{},{},{:.4},{:.4},{:.4},{:.4},{:.3},{:.3},{:.3},{:.3}",
            s.label,
            s.seeds,
            s.final_reward.0,
            s.final_reward.1,
            s.ci95.0,
            s.ci95.1,
            s.reached,
            s.iterations_to_threshold
                .map(|x| format!("{x:.1}"))
                .unwrap_or_default(),
            s.final_entropy,
            s.frac_zero_std,
            s.final_accuracy,
            s.heldout_accuracy,
            s.final_length.0,
            s.final_length.1,
            s.final_length.2,
            s.wall_secs
        ));
        for (mean, std) in &s.report {
            csv.push_str(&format!(",{mean:.5},{std:.5}"));
        }
        csv.push('\n');
    }
    let csv_path = out.join("summary.csv");
    std::fs::write(&csv_path, csv).map_err(io(&csv_path))?;
    let mut md = format!("# {}\n\n", matrix.name);
    if !matrix.description.is_empty() {
        md.push_str(&format!("{}\n\n", matrix.description.trim()));
    }
    md.push_str(&format!(
        "Base preset with {} · seeds {} · final reward = mean reward of the last iteration's rollouts (max {}).\n\n",
        if matrix.axes.is_empty() { "no axes".to_string() } else { matrix.axes.iter().map(|a| format!("`{}` ∈ {{{}}}", a.key, a.values.join(", "))).collect::<Vec<_>>().join(" × ") },
        if matrix.seeds.len() > 3 { format!("{}–{} ({} seeds)", matrix.seeds[0], matrix.seeds[matrix.seeds.len() - 1], matrix.seeds.len()) } else { format!("{:?}", matrix.seeds) },
        crate::task::reward::max_reward_of(&matrix.base)
    ));
    let th = matrix
        .threshold
        .map(|t| format!("iterations to reward ≥ {t} (runs that got there)"))
        .unwrap_or_else(|| "iterations to threshold".into());
    // Variable-length policies get their length columns (the length story).
    let lengths = matrix.base.model.kind == crate::config::ModelKind::Transformer;
    md.push_str(&format!(
        "| cell | final reward (mean ± std) | 95 % interval | {th} | final entropy | zero-std groups | greedy train accuracy |{} wall time |\n|---|---|---|---|---|---|---|{}---|\n",
        if lengths { " held-out accuracy | length, last 10 it. (all / correct / wrong) |" } else { "" },
        if lengths { "---|---|" } else { "" },
    ));
    for s in &summaries {
        let extra = if lengths {
            format!(
                " {:.3} | {:.2} / {:.2} / {:.2} |",
                s.heldout_accuracy, s.final_length.0, s.final_length.1, s.final_length.2
            )
        } else {
            String::new()
        };
        md.push_str(&format!(
            "| {} | {:.3} ± {:.3} | [{:.3}, {:.3}] | {} | {:.3} | {:.1} % | {:.3} |{extra} {:.2} s |\n",
            s.label,
            s.final_reward.0,
            s.final_reward.1,
            s.ci95.0,
            s.ci95.1,
            match (matrix.threshold, s.iterations_to_threshold) {
                (None, _) => "–".to_string(),
                (Some(_), Some(x)) => format!("{x:.1} ({}/{})", s.reached, s.seeds),
                (Some(_), None) => format!("never (0/{})", s.seeds),
            },
            s.final_entropy,
            100.0 * s.frac_zero_std,
            s.final_accuracy,
            s.wall_secs
        ));
    }
    if !matrix.card.claim.is_empty() {
        md.push_str(&format!(
            "\n**Claim** ({}): {}\n\n**Look at**: {}\n",
            matrix.card.source, matrix.card.claim, matrix.card.look_at
        ));
    }
    if !matrix.card.report.is_empty() {
        md.push_str("\n## What the mechanism shows (mean ± std over seeds)\n\n");
        let rows: Vec<(String, Vec<(f64, f64)>)> = summaries
            .iter()
            .map(|s| (s.label.clone(), s.report.clone()))
            .collect();
        md.push_str(&matrix.card.report_markdown(&rows));
    }
    let md_path = out.join("summary.md");
    std::fs::write(&md_path, md).map_err(io(&md_path))?;
    let chart_dir = out.join("charts");
    let mut charts = Vec::new();
    for (name, series) in &overlays {
        let stem = name.replace('/', "_");
        charts.extend(
            line_chart(
                &chart_dir,
                &stem,
                &format!("{}: {name} (mean ± std over seeds)", matrix.name),
                "iteration",
                name,
                series,
            )
            .map_err(io(&chart_dir))?,
        );
    }
    Ok((summaries, md_path, charts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_and_seeds_parse() {
        let a = Axis::parse("algorithm.advantage=raw,centered").unwrap();
        assert_eq!(a.values, vec!["raw", "centered"]);
        let a = Axis::parse("task.reward_weights={exact=1.0,distance=0.2},{exact=1.0}").unwrap();
        assert_eq!(a.values.len(), 2);
        assert_eq!(parse_seeds("0..20").unwrap().len(), 20);
        assert_eq!(parse_seeds("1,5").unwrap(), vec![1, 5]);
        assert!(parse_seeds("5..1").is_err());
        assert!(Axis::parse("nokey").is_err());
    }

    #[test]
    fn linked_keys_move_together() {
        let mut m = Matrix::from_experiment("length-bias").unwrap();
        m.axes = vec![
            Axis::parse("algorithm.advantage&algorithm.loss_agg_mode=normalized&seq-mean-token-mean,centered&seq-mean-token-sum-norm")
                .unwrap(),
        ];
        let cells = m.cells().unwrap();
        assert_eq!(cells.len(), 2, "two arms, not a 2×2 grid");
        assert_eq!(
            cells[0].config.algorithm.advantage,
            crate::config::AdvantageMode::Normalized
        );
        assert_eq!(
            cells[0].config.algorithm.loss_agg_mode,
            crate::config::LossAggMode::SeqMeanTokenMean
        );
        assert_eq!(
            cells[1].config.algorithm.advantage,
            crate::config::AdvantageMode::Centered
        );
        assert_eq!(
            cells[1].config.algorithm.loss_agg_mode,
            crate::config::LossAggMode::SeqMeanTokenSumNorm
        );
        let mut bad = m.clone();
        bad.axes = vec![Axis::parse("algorithm.advantage&algorithm.mu=raw&2,centered").unwrap()];
        let e = bad.cells().unwrap_err().to_string();
        assert!(e.contains("2 linked keys but 1 values"), "{e}");
    }

    #[test]
    fn bad_keys_and_values_fail_before_running() {
        let base = RunConfig::preset("lecture17").unwrap();
        let m = Matrix {
            name: "t".into(),
            base: base.clone(),
            axes: vec![Axis::parse("algorithm.advantag=raw").unwrap()],
            seeds: vec![0],
            threshold: None,
            card: Card::default(),
            description: String::new(),
        };
        let e = m.cells().unwrap_err().to_string();
        assert!(e.contains("algorithm.advantag"), "{e}");
        let m = Matrix {
            axes: vec![Axis::parse("algorithm.epsilon_low=0.2,1.5").unwrap()],
            ..m
        };
        let e = m.cells().unwrap_err().to_string();
        assert!(e.contains("algorithm.epsilon_low"), "{e}");
    }

    #[test]
    fn every_experiment_file_parses_into_valid_cells() {
        for (name, _) in EXPERIMENTS {
            let m = Matrix::from_experiment(name).unwrap();
            assert!(!m.cells().unwrap().is_empty(), "{name}");
        }
    }

    #[test]
    fn grid_is_a_product() {
        let m = Matrix {
            name: "t".into(),
            base: RunConfig::preset("lecture17").unwrap(),
            axes: vec![
                Axis::parse("algorithm.advantage=raw,centered").unwrap(),
                Axis::parse("algorithm.loss=naive,clipped,unclipped").unwrap(),
            ],
            seeds: vec![0, 1],
            threshold: None,
            card: Card::default(),
            description: String::new(),
        };
        let cells = m.cells().unwrap();
        assert_eq!(cells.len(), 6);
        assert_eq!(
            cells[5].config.algorithm.loss,
            crate::config::LossMode::Unclipped
        );
    }
}

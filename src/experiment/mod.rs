//! Comparison experiments: a base config × `--vary` axes × seeds, run in parallel,
//! resumable, summarised in `summary.csv` / `summary.md` with overlay charts (mean ± std
//! over seeds). Experiment files (`assets/experiments/*.toml` with an `[experiment]`
//! table) describe one matrix each.

use crate::config::{ConfigError, DeviceChoice, RunConfig};
use crate::metrics::{Getter, StepRecord};
use crate::report::stats::mean_std;
use crate::report::{Series, line_chart};
use crate::train::run::read_summary;
use crate::train::{self, RunOptions};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use thiserror::Error;

mod report;
mod run;

pub use report::{
    BAND_METRICS, CellBands, CellSummary, fmt_mean_std, load_compare_dir, report_over_seeds,
    seed_bands,
};
pub use run::{CompareOptions, CompareOutcome, run_matrix};

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
    #[error("--seeds `{0}`: {1}")]
    SeedsOutOfRange(String, String),
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
        let range = |why: String| ExperimentError::SeedsOutOfRange(s.into(), why);
        if b <= a {
            return Err(range(format!(
                "the range is empty (A..B runs A up to B − 1: B must be above A, e.g. {a}..{})",
                a.saturating_add(5)
            )));
        }
        if b - a > MAX_SEEDS as u64 {
            return Err(range(format!(
                "{} seeds; at most {MAX_SEEDS} in one matrix",
                b - a
            )));
        }
        let seeds: Vec<u64> = (a..b).collect();
        check_seeds_fit(s, &seeds)?;
        return Ok(seeds);
    }
    let seeds: Vec<u64> = s
        .split(',')
        .map(|x| x.trim().parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    if seeds.len() > MAX_SEEDS {
        return Err(ExperimentError::SeedsOutOfRange(
            s.into(),
            format!("{} seeds; at most {MAX_SEEDS} in one matrix", seeds.len()),
        ));
    }
    if let Some(dup) = first_repeat(&seeds) {
        return Err(ExperimentError::Duplicate(format!(
            "seed {dup} is listed twice"
        )));
    }
    check_seeds_fit(s, &seeds)?;
    Ok(seeds)
}

/// Every seed fits a TOML integer (i64): each run's `config.toml` must read back (`--config`,
/// `--resume`).
fn check_seeds_fit(s: &str, seeds: &[u64]) -> Result<(), ExperimentError> {
    match seeds.iter().find(|&&x| x > i64::MAX as u64) {
        Some(x) => Err(ExperimentError::SeedsOutOfRange(
            s.into(),
            format!("seed {x} is past {} (run.seed is a TOML integer)", i64::MAX),
        )),
        None => Ok(()),
    }
}

/// The most seeds `--seeds` takes (a matrix's runs are cells × seeds, each a directory).
pub const MAX_SEEDS: usize = 10_000;

/// The first element that occurs twice (in one pass: a list of seeds can be long).
fn first_repeat<T: Eq + std::hash::Hash + Clone>(xs: &[T]) -> Option<T> {
    let mut seen = std::collections::HashSet::with_capacity(xs.len());
    xs.iter().find(|x| !seen.insert(*x)).cloned()
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
    /// `key=value`: each cell is compared, seed by seed, with its sibling cell at this value
    /// (the same settings otherwise): the first iteration whose logged rollouts differ (the
    /// mismatch lab: with and without a correction the draws share their uniforms).
    pub part_from: Option<(String, String)>,
    /// `[x, y]`: every seed's steps as points, x against y, one colour per cell
    /// (`charts/scatter-X-vs-Y`: the entropy mechanism's predicted against measured change).
    pub scatter: Option<(String, String)>,
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
    /// Pearson's r between two metrics over the steps that log both (`corr(a,b)`).
    Corr,
}

impl Agg {
    pub const NAMES: &[&str] = &["mean", "last10", "final", "max", "min", "first", "corr"];
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "mean" => Agg::Mean,
            "last10" => Agg::Last10,
            "final" => Agg::Final,
            "max" => Agg::Max,
            "min" => Agg::Min,
            "first" => Agg::First,
            "corr" => Agg::Corr,
            _ => return None,
        })
    }
    fn words(self) -> &'static str {
        match self {
            Agg::Mean => "mean over the run",
            Agg::Last10 => "mean, last 10 it.",
            Agg::Final => "last record",
            Agg::Max => "max over the run",
            Agg::Min => "min over the run",
            Agg::First => "first",
            Agg::Corr => "Pearson r over the run's steps",
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
        // `corr(a,b)`: Pearson's r of two metrics over a run's steps.
        if let Some(pair) = s.strip_prefix("corr(").and_then(|r| r.strip_suffix(')')) {
            let Some((a, b)) = pair.split_once(',') else {
                return Err(ExperimentError::BadReport(format!(
                    "`{s}`: corr takes two metrics, corr(a,b)"
                )));
            };
            for m in [a.trim(), b.trim()] {
                Self::parse(m)?;
            }
            return Ok(Self {
                metric: format!("corr({},{})", a.trim(), b.trim()),
                agg: Agg::Corr,
            });
        }
        // `eval/pass@k` holds an `@` of its own: the suffix is an aggregation only when it
        // names one.
        let (metric, agg) = match s.rsplit_once('@') {
            Some((m, a)) if Agg::parse(a).is_some() => (m.to_string(), Agg::parse(a)),
            _ => (s.to_string(), Some(Agg::Mean)),
        };
        let agg = agg.unwrap_or(Agg::Mean);
        if agg == Agg::Corr {
            return Err(ExperimentError::BadReport(format!(
                "`{s}`: @corr needs two metrics, corr(a,b)"
            )));
        }
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

    /// The two metrics of a `corr(a,b)`.
    pub fn pair(&self) -> Option<(&str, &str)> {
        self.metric
            .strip_prefix("corr(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|p| p.split_once(','))
    }

    /// The metrics it reads: one, or a correlation's two.
    pub fn reads(&self) -> Vec<&str> {
        match self.pair() {
            Some((a, b)) => vec![a, b],
            None => vec![self.metric.as_str()],
        }
    }
}

/// Pearson's r, accumulated: n, Σx, Σy, Σx², Σy², Σxy.
#[derive(Debug, Clone, Copy, Default)]
struct Pearson([f64; 6]);

impl Pearson {
    fn push(&mut self, x: f64, y: f64) {
        for (s, v) in self.0.iter_mut().zip([1.0, x, y, x * x, y * y, x * y]) {
            *s += v;
        }
    }

    fn r(&self) -> f64 {
        let [n, sx, sy, sxx, syy, sxy] = self.0;
        let cov = sxy - sx * sy / n;
        let (vx, vy) = (sxx - sx * sx / n, syy - sy * sy / n);
        cov / (vx * vy).sqrt()
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
    /// Per `corr(a,b)` metric: its two getters and sums.
    pairs: Vec<Option<(Getter, Getter, Pearson)>>,
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
            pairs: metrics
                .iter()
                .map(|m| {
                    let (a, b) = m.pair()?;
                    Some((
                        crate::metrics::getter(a)?,
                        crate::metrics::getter(b)?,
                        Pearson::default(),
                    ))
                })
                .collect(),
        }
    }

    pub fn push(&mut self, r: &StepRecord) {
        for (ga, gb, acc) in self.pairs.iter_mut().flatten() {
            if let (Some(x), Some(y)) = (ga(r), gb(r))
                && x.is_finite()
                && y.is_finite()
            {
                acc.push(x as f64, y as f64);
            }
        }
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
                if let Some((_, _, acc)) = &self.pairs[k] {
                    return if acc.0[0] >= 2.0 { acc.r() } else { f64::NAN };
                }
                if self.sum[k].1 == 0 {
                    return f64::NAN;
                }
                match m.agg {
                    Agg::Mean => self.sum[k].0 / self.sum[k].1 as f64,
                    Agg::Final => self.last[k],
                    Agg::First => self.first[k],
                    Agg::Max | Agg::Min => self.extreme[k],
                    Agg::Corr => f64::NAN,
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
    #[serde(default)]
    part_from: Option<String>,
    #[serde(default)]
    scatter: Vec<String>,
}

/// The compiled-in experiment files.
pub const EXPERIMENTS: &[(&str, &str)] = &[
    (
        "lecture-table",
        include_str!("../../assets/experiments/lecture-table.toml"),
    ),
    (
        "loss-modes",
        include_str!("../../assets/experiments/loss-modes.toml"),
    ),
    (
        "loss-family",
        include_str!("../../assets/experiments/loss-family.toml"),
    ),
    (
        "advantage-family",
        include_str!("../../assets/experiments/advantage-family.toml"),
    ),
    (
        "entropy-controls",
        include_str!("../../assets/experiments/entropy-controls.toml"),
    ),
    (
        "mismatch-lab",
        include_str!("../../assets/experiments/mismatch-lab.toml"),
    ),
    (
        "multi-reward",
        include_str!("../../assets/experiments/multi-reward.toml"),
    ),
    (
        "kl-beta",
        include_str!("../../assets/experiments/kl-beta.toml"),
    ),
    (
        "difficulty-bias",
        include_str!("../../assets/experiments/difficulty-bias.toml"),
    ),
    (
        "sparse-vs-shaped",
        include_str!("../../assets/experiments/sparse-vs-shaped.toml"),
    ),
    (
        "entropy-collapse",
        include_str!("../../assets/experiments/entropy-collapse.toml"),
    ),
    (
        "bug-gallery",
        include_str!("../../assets/experiments/bug-gallery.toml"),
    ),
    (
        "length-bias",
        include_str!("../../assets/experiments/length-bias-matrix.toml"),
    ),
    (
        "r1-vs-r1-zero",
        include_str!("../../assets/experiments/r1-vs-r1-zero-matrix.toml"),
    ),
    (
        "dynamic-sampling",
        include_str!("../../assets/experiments/dynamic-sampling.toml"),
    ),
    (
        "entropy-mechanism",
        include_str!("../../assets/experiments/entropy-mechanism.toml"),
    ),
    (
        "reward-hacking",
        include_str!("../../assets/experiments/reward-hacking.toml"),
    ),
    (
        "pass-at-k",
        include_str!("../../assets/experiments/pass-at-k.toml"),
    ),
    (
        "group-size",
        include_str!("../../assets/experiments/group-size.toml"),
    ),
    (
        "prompt-sampling",
        include_str!("../../assets/experiments/prompt-sampling.toml"),
    ),
    (
        "ppo-vs-grpo",
        include_str!("../../assets/experiments/ppo-vs-grpo.toml"),
    ),
    (
        "ppo-vs-grpo-transformer",
        include_str!("../../assets/experiments/ppo-vs-grpo-transformer.toml"),
    ),
    (
        "distill-vs-rl",
        include_str!("../../assets/experiments/distill-vs-rl.toml"),
    ),
    (
        "std-blowup",
        include_str!("../../assets/experiments/std-blowup.toml"),
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
                part_from: e
                    .part_from
                    .map(|p| match p.split_once('=') {
                        Some((k, v)) => Ok((k.trim().to_string(), v.trim().to_string())),
                        None => Err(ExperimentError::BadReport(format!(
                            "part_from = \"{p}\": write key=value"
                        ))),
                    })
                    .transpose()?,
                scatter: match e.scatter.as_slice() {
                    [] => None,
                    [x, y] => {
                        for m in [x, y] {
                            ReportMetric::parse(m)?;
                        }
                        Some((x.clone(), y.clone()))
                    }
                    _ => {
                        return Err(ExperimentError::BadReport(
                            "scatter = [\"x metric\", \"y metric\"]: two metrics".into(),
                        ));
                    }
                },
            },
        })
    }
}

pub(super) fn run_dir(out: &Path, cell: &Cell, seed: u64) -> PathBuf {
    out.join("runs").join(format!("{}__seed{seed}", cell.slug))
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
        assert!(
            parse_seeds("5..1")
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        assert!(
            parse_seeds("0..0")
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        // A huge range is refused at once (it was collected, then checked for repeats in
        // quadratic time: 0..1000000 hung with nothing printed).
        let e = parse_seeds("0..1000000").unwrap_err().to_string();
        assert!(
            e.contains("1000000 seeds") && e.contains("at most 10000"),
            "{e}"
        );
        assert_eq!(parse_seeds("0..10000").unwrap().len(), 10_000);
        let list: Vec<String> = (0..10_000).rev().map(|i| i.to_string()).collect();
        assert_eq!(parse_seeds(&list.join(",")).unwrap().len(), 10_000);
        assert!(
            parse_seeds("4,1,4")
                .unwrap_err()
                .to_string()
                .contains("seed 4")
        );
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

//! The app's data store: the records of the current run and of loaded runs, with the
//! series the plots draw. It knows nothing of egui; views read from it each frame.

use crate::config::RunConfig;
use crate::metrics::{GroupRecord, StepRecord};
use std::path::{Path, PathBuf};

/// A growing series kept decimated as it grows: points are folded into buckets of `k`
/// (doubling when there are too many), each bucket drawn as its min and max, so a plot of
/// 100k points draws at most `2 · MAX_BUCKETS` of them and appending costs O(1).
#[derive(Debug, Clone, Default)]
pub struct Series {
    k: usize,
    /// (x of first point, min y, max y) per bucket; the last bucket may be partial.
    buckets: Vec<(f64, f64, f64)>,
    in_last: usize,
    pub len: usize,
    pub last: Option<[f64; 2]>,
}

/// A plot is a few hundred pixels wide: 600 min/max buckets is more than it can show.
const MAX_BUCKETS: usize = 600;

impl Series {
    pub fn push(&mut self, x: f64, y: f64) {
        if !y.is_finite() {
            return;
        }
        if self.k == 0 {
            self.k = 1;
        }
        self.len += 1;
        self.last = Some([x, y]);
        if self.in_last > 0 && self.in_last < self.k {
            let b = self.buckets.last_mut().expect("partial bucket");
            b.1 = b.1.min(y);
            b.2 = b.2.max(y);
            self.in_last += 1;
            return;
        }
        self.buckets.push((x, y, y));
        self.in_last = 1;
        if self.buckets.len() > MAX_BUCKETS {
            // Merge pairs: buckets of 2k.
            let merged: Vec<_> = self
                .buckets
                .chunks(2)
                .map(|c| {
                    (
                        c[0].0,
                        c.iter().map(|b| b.1).fold(f64::INFINITY, f64::min),
                        c.iter().map(|b| b.2).fold(f64::NEG_INFINITY, f64::max),
                    )
                })
                .collect();
            // The newest bucket holds one point: alone after the merge, or after a full one.
            let odd = self.buckets.len() % 2 == 1;
            self.in_last = if odd { 1 } else { self.k + 1 };
            self.buckets = merged;
            self.k *= 2;
        }
    }

    /// Points to draw: every point while small, else min and max of each bucket.
    pub fn points(&self) -> Vec<[f64; 2]> {
        if self.k <= 1 {
            return self.buckets.iter().map(|b| [b.0, b.1]).collect();
        }
        let mut out = Vec::with_capacity(self.buckets.len() * 2);
        for b in &self.buckets {
            out.push([b.0, b.1]);
            if b.2 != b.1 {
                out.push([b.0, b.2]);
            }
        }
        out
    }
}

/// Names of the step-level series every run keeps.
pub const SERIES: &[&str] = &[
    "reward/mean",
    "kl",
    "entropy",
    "clip_ratio/low",
    "clip_ratio/high",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/mean_length_correct",
    "completions/mean_length_wrong",
    "completions/clipped_ratio",
    "loss",
    "grad_norm",
    "accuracy/train",
    "accuracy/heldout",
    "reward/exact_match",
    "entropy_coef",
];

/// One run's data: records, series, and the logged groups by iteration.
#[derive(Debug, Clone, Default)]
pub struct RunData {
    pub name: String,
    pub dir: Option<PathBuf>,
    pub config: Option<RunConfig>,
    pub series: Vec<Series>,
    /// Exponential moving average of reward/mean (the smoothing slider), recomputed on change.
    pub reward_smoothed: Vec<[f64; 2]>,
    smoothing: f64,
    ema: Option<f64>,
    /// Every `reward/mean` point (for re-smoothing).
    reward_raw: Vec<[f64; 2]>,
    /// (iteration, groups) for each iteration that logged groups.
    pub groups: Vec<(usize, Vec<GroupRecord>)>,
    /// The mean response length of each logged iteration's batch (beside `groups`): the
    /// token view weighs a token as its batch did.
    pub group_mean_length: Vec<f32>,
    pub steps: usize,
    pub last: Option<StepRecord>,
}

impl RunData {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            series: vec![Series::default(); SERIES.len()],
            smoothing: 0.6,
            ..Default::default()
        }
    }

    pub fn series(&self, name: &str) -> &Series {
        let i = SERIES
            .iter()
            .position(|n| *n == name)
            .expect("known series");
        &self.series[i]
    }

    /// x = iteration + step/μ (fractional iterations, shared by every plot).
    fn x(r: &StepRecord, mu: usize) -> f64 {
        r.iteration as f64 + r.step_in_iteration as f64 / mu.max(1) as f64
    }

    pub fn push(&mut self, mut r: StepRecord, mu: usize) {
        let x = Self::x(&r, mu);
        for (i, name) in SERIES.iter().enumerate() {
            if let Some(v) = r.scalar(name).filter(|v| v.is_finite()) {
                self.series[i].push(x, v as f64);
            }
        }
        let y = r.reward_mean as f64;
        self.reward_raw.push([x, y]);
        let e = match self.ema {
            Some(prev) => self.smoothing * prev + (1.0 - self.smoothing) * y,
            None => y,
        };
        self.ema = Some(e);
        self.reward_smoothed.push([x, e]);
        if let Some(g) = r.groups.take() {
            self.groups.push((r.iteration, g));
            self.group_mean_length.push(r.mean_length);
        }
        self.steps += 1;
        self.last = Some(r);
    }

    /// Change the smoothing weight (0 = raw, 0.99 = very smooth), TensorBoard style.
    pub fn set_smoothing(&mut self, w: f64) {
        if (w - self.smoothing).abs() < 1e-9 {
            return;
        }
        self.smoothing = w;
        self.ema = None;
        self.reward_smoothed.clear();
        for &[x, y] in &self.reward_raw {
            let e = match self.ema {
                Some(prev) => w * prev + (1.0 - w) * y,
                None => y,
            };
            self.ema = Some(e);
            self.reward_smoothed.push([x, e]);
        }
    }

    /// The raw reward curve, decimated for drawing.
    pub fn reward_raw_points(&self) -> Vec<[f64; 2]> {
        decimate(&self.reward_raw, 1200)
    }

    pub fn reward_smoothed_points(&self) -> Vec<[f64; 2]> {
        decimate(&self.reward_smoothed, 1200)
    }

    /// Load a run directory written by `grpo-lab train`.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let config = RunConfig::from_file(&dir.join("config.toml")).map_err(|e| e.to_string())?;
        let records = crate::train::read_metrics(&dir.join("metrics.jsonl"))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut run = RunData::new(
            dir.file_name()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_else(|| dir.display().to_string()),
        );
        let mu = config.algorithm.steps_per_iteration();
        for r in records {
            run.push(r, mu);
        }
        run.dir = Some(dir.to_path_buf());
        run.config = Some(config);
        Ok(run)
    }
}

/// Every `n/max`-th point (for curves that need their exact values, like the smoothed one).
fn decimate(points: &[[f64; 2]], max: usize) -> Vec<[f64; 2]> {
    if points.len() <= max {
        return points.to_vec();
    }
    let stride = points.len().div_ceil(max);
    let mut out: Vec<[f64; 2]> = points.iter().step_by(stride).copied().collect();
    if let Some(last) = points.last() {
        out.push(*last);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_decimates_and_keeps_extremes() {
        let mut s = Series::default();
        for i in 0..100_000 {
            s.push(i as f64, if i == 54_321 { 1000.0 } else { (i % 7) as f64 });
        }
        let pts = s.points();
        assert!(pts.len() <= 2 * MAX_BUCKETS, "{}", pts.len());
        assert!(
            pts.iter().any(|p| p[1] == 1000.0),
            "the spike must survive decimation"
        );
        assert_eq!(s.len, 100_000);
        let mut small = Series::default();
        for i in 0..10 {
            small.push(i as f64, i as f64);
        }
        assert_eq!(small.points().len(), 10);
    }
}

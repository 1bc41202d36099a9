//! What a matrix leaves: each cell's results over seeds (`summary.md`, `summary.csv`), the
//! overlay charts and their seed bands, the report metrics of the cards.

use super::*;

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
            .map(String::as_str)
            .chain(self.report.iter().flat_map(|r| r.reads()))
        {
            if !v.iter().any(|x| x == m) && !BAND_METRICS.contains(&m) {
                v.push(m.to_string());
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
pub(super) fn t975(df: usize) -> f64 {
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

pub(super) fn summarise(
    matrix: &Matrix,
    cells: &[Cell],
    opts: &CompareOptions,
) -> Result<(Vec<CellSummary>, PathBuf, Vec<PathBuf>), ExperimentError> {
    let mut summaries = Vec::new();
    let mut overlays: BTreeMap<String, Vec<Series>> = BTreeMap::new();
    let mut scatter = Vec::new();
    let mut finished = 0;
    for cell in cells {
        let seeds: Vec<SeedStats> = matrix
            .seeds
            .iter()
            .filter_map(|&seed| read_seed(matrix, &run_dir(&opts.out, cell, seed)))
            .collect();
        finished += seeds
            .iter()
            .filter(|s| s.summary.status == "completed" || s.summary.status.starts_with("diverged"))
            .count();
        summaries.push(cell_summary(matrix, cell, &seeds));
        let records: Vec<Vec<StepRecord>> = seeds.into_iter().map(|s| s.records).collect();
        if let Some(s) = scatter_series(matrix, &cell.label, &records) {
            scatter.push(s);
        }
        for (name, pts) in seed_bands(&records, &matrix.card.band_metrics()) {
            let mut series =
                Series::line(cell.label.clone(), pts.iter().map(|p| (p.0, p.1)).collect());
            series.band = Some(pts.iter().map(|p| (p.0, p.1 - p.2, p.1 + p.2)).collect());
            overlays.entry(name).or_default().push(series);
        }
    }
    let out = &opts.out;
    let csv_path = out.join("summary.csv");
    std::fs::write(&csv_path, summary_csv(matrix, &summaries)).map_err(io(&csv_path))?;
    let md_path = out.join("summary.md");
    let mut md = summary_md(matrix, cells, &summaries);
    let planned = cells.len() * matrix.seeds.len();
    if finished < planned {
        // An interrupted matrix: its table holds what the finished and stopped runs wrote.
        let note = format!(
            "**Partial: {finished} of {planned} runs finished** (the matrix was stopped; the same command finishes it).\n\n"
        );
        let at = md.find("\n\n").map_or(md.len(), |i| i + 2);
        md.insert_str(at, &note);
    }
    if let Some(from) = &matrix.card.part_from {
        md.push_str(&parting_md(matrix, cells, from, &opts.out));
    }
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
    if let Some((x, y)) = &matrix.card.scatter {
        let stem = format!("scatter-{}-vs-{}", x.replace('/', "_"), y.replace('/', "_"));
        charts.extend(
            line_chart(
                &chart_dir,
                &stem,
                &format!("{}: {y} vs {x} (every step)", matrix.name),
                x,
                y,
                &scatter,
            )
            .map_err(io(&chart_dir))?,
        );
    }
    Ok((summaries, md_path, charts))
}

/// A cell's points for the card's scatter: every step that logs both metrics, every seed.
fn scatter_series(matrix: &Matrix, label: &str, runs: &[Vec<StepRecord>]) -> Option<Series> {
    let (x, y) = matrix.card.scatter.as_ref()?;
    let (gx, gy) = (crate::metrics::getter(x)?, crate::metrics::getter(y)?);
    let points = runs
        .iter()
        .flatten()
        .filter_map(|r| Some((gx(r)? as f64, gy(r)? as f64)))
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    Some(Series {
        scatter: true,
        ..Series::line(label, points)
    })
}

/// What one seed's run contributes to its cell.
struct SeedStats {
    summary: crate::metrics::RunSummary,
    /// Mean length (all / correct / wrong) over the last 10 iterations, where finite.
    lengths: [Option<f64>; 3],
    frac_zero_std: f64,
    reached: Option<f64>,
    report: Vec<f64>,
    /// Decimated records, for the bands.
    records: Vec<StepRecord>,
}

/// One seed's run: statistics streamed (constant memory for any run length), bands from the
/// decimated read the charts use. `None` where the run has no metrics or no summary.
fn read_seed(matrix: &Matrix, dir: &std::path::Path) -> Option<SeedStats> {
    let path = dir.join("metrics.jsonl");
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
    let records = streamed
        .and_then(|()| train::run::read_metrics_decimated(&path, 300))
        .ok()?;
    let summary = read_summary(dir)?;
    let lengths = [0, 1, 2].map(|k| {
        let v: Vec<f64> = tail
            .iter()
            .map(|l: &[f32; 3]| l[k] as f64)
            .filter(|x| x.is_finite())
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    });
    Some(SeedStats {
        summary,
        lengths,
        frac_zero_std: zero_sum / firsts.max(1) as f64,
        reached,
        report: report.finish(),
        records,
    })
}

/// A cell's row: means (and the final reward's spread) over its seeds.
fn cell_summary(matrix: &Matrix, cell: &Cell, seeds: &[SeedStats]) -> CellSummary {
    let over = |f: &dyn Fn(&SeedStats) -> f64| -> Vec<f64> { seeds.iter().map(f).collect() };
    let finals = over(&|s| s.summary.final_reward_mean as f64);
    let reach: Vec<f64> = seeds.iter().filter_map(|s| s.reached).collect();
    let length = |k: usize| -> f64 {
        let v: Vec<f64> = seeds.iter().filter_map(|s| s.lengths[k]).collect();
        mean_std(&v).0
    };
    let reports: Vec<Vec<f64>> = seeds.iter().map(|s| s.report.clone()).collect();
    let fr = mean_std(&finals);
    let half = t975(finals.len().saturating_sub(1)) * fr.1 / (finals.len() as f64).sqrt();
    CellSummary {
        label: cell.label.clone(),
        seeds: finals.len(),
        final_reward: fr,
        ci95: (fr.0 - half, fr.0 + half),
        reached: reach.len(),
        iterations_to_threshold: (!reach.is_empty()).then(|| mean_std(&reach).0),
        final_entropy: mean_std(&over(&|s| s.summary.final_entropy as f64)).0,
        frac_zero_std: mean_std(&over(&|s| s.frac_zero_std)).0,
        final_accuracy: mean_std(&over(&|s| s.summary.final_accuracy as f64)).0,
        heldout_accuracy: mean_std(&over(&|s| {
            s.summary.final_heldout_accuracy.map_or(f64::NAN, f64::from)
        }))
        .0,
        final_length: (length(0), length(1), length(2)),
        wall_secs: mean_std(&over(&|s| s.summary.wall_time_secs)).0,
        report: report_over_seeds(&reports, matrix.card.report.len()),
    }
}

/// `summary.csv`: the fixed columns, then the card's report (`{metric}@{agg}` mean and std).
fn summary_csv(matrix: &Matrix, summaries: &[CellSummary]) -> String {
    let mut csv = String::from(
        "cell,seeds,final_reward_mean,final_reward_std,ci95_low,ci95_high,reached_threshold,iterations_to_threshold,final_entropy,frac_reward_zero_std,final_accuracy,heldout_accuracy,mean_length,mean_length_correct,mean_length_wrong,wall_secs",
    );
    for m in &matrix.card.report {
        let name = format!("{}@{}", m.metric, Agg::NAMES[m.agg as usize]);
        csv.push_str(&format!(",\"{name} mean\",\"{name} std\""));
    }
    csv.push('\n');
    for s in summaries {
        // One seed: the std and the interval left empty (undefined).
        let spread = |x: f64| {
            if s.seeds > 1 {
                format!("{x:.4}")
            } else {
                String::new()
            }
        };
        csv.push_str(&format!(
            "\"{}\",{},{:.4},{},{},{},{},{},{:.4},{:.4},{:.4},{:.4},{:.3},{:.3},{:.3},{:.3}",
            s.label,
            s.seeds,
            s.final_reward.0,
            spread(s.final_reward.1),
            spread(s.ci95.0),
            spread(s.ci95.1),
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
    csv
}

/// `summary.md`: the matrix, the table of cells, the card's claim and its report.
fn summary_md(matrix: &Matrix, cells: &[Cell], summaries: &[CellSummary]) -> String {
    // The reward's maximum, per cell where an axis changes the reward.
    let maxes: Vec<f32> = cells
        .iter()
        .map(|c| crate::task::reward::max_reward_of(&c.config))
        .collect();
    let max = if maxes.iter().all(|&m| m == maxes[0]) {
        format!("max {}", maxes.first().copied().unwrap_or(0.0))
    } else {
        let each: Vec<String> = maxes.iter().map(|m| m.to_string()).collect();
        format!("max by cell, in the table's order: {}", each.join(" / "))
    };
    let mut md = format!("# {}\n\n", matrix.name);
    if !matrix.description.is_empty() {
        md.push_str(&format!("{}\n\n", matrix.description.trim()));
    }
    md.push_str(&format!(
        "Base preset with {} · seeds {} · final reward = mean reward of the last iteration's rollouts ({max}).\n\n",
        if matrix.axes.is_empty() { "no axes".to_string() } else { matrix.axes.iter().map(|a| format!("`{}` ∈ {{{}}}", a.key, a.values.join(", "))).collect::<Vec<_>>().join(" × ") },
        if matrix.seeds.len() > 3 { format!("{}–{} ({} seeds)", matrix.seeds[0], matrix.seeds[matrix.seeds.len() - 1], matrix.seeds.len()) } else { format!("{:?}", matrix.seeds) },
    ));
    let th = matrix
        .threshold
        .map(|t| format!("iterations to reward ≥ {t} (runs that got there)"))
        .unwrap_or_else(|| "iterations to threshold".into());
    // Variable-length policies get their length columns (the length story).
    let lengths = matrix.base.model.kind == crate::config::ModelKind::Transformer;
    md.push_str(&format!(
        "| cell | final reward (mean ± std) | 95 % interval | {th} | final entropy | zero-std groups | greedy train accuracy |{} wall time |\n|---|---|---|---|---|---|---|{}---|\n",
        if lengths { " held-out accuracy after the last update | length, last 10 it. (all / correct / wrong) |" } else { "" },
        if lengths { "---|---|" } else { "" },
    ));
    for s in summaries {
        let extra = if lengths {
            format!(
                " {:.3} | {:.2} / {:.2} / {:.2} |",
                s.heldout_accuracy, s.final_length.0, s.final_length.1, s.final_length.2
            )
        } else {
            String::new()
        };
        // One seed has no spread and no interval (its std is undefined, not 0).
        let (reward, interval) = if s.seeds > 1 {
            (
                format!("{:.3} ± {:.3}", s.final_reward.0, s.final_reward.1),
                format!("[{:.3}, {:.3}]", s.ci95.0, s.ci95.1),
            )
        } else {
            (format!("{:.3} (one seed)", s.final_reward.0), "–".into())
        };
        md.push_str(&format!(
            "| {} | {reward} | {interval} | {} | {:.3} | {:.1} % | {:.3} |{extra} {:.2} s |\n",
            s.label,
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
    md
}

/// Each iteration's logged rollouts (`[groups][G]` responses) of a run, in order.
fn rollouts(dir: &Path) -> Vec<(usize, Vec<Vec<Vec<u32>>>)> {
    let mut out = Vec::new();
    let _ = train::run::for_each_metric(&dir.join("metrics.jsonl"), |r| {
        if let Some(groups) = r.groups {
            out.push((
                r.iteration,
                groups.into_iter().map(|g| g.responses).collect(),
            ));
        }
    });
    out
}

/// The first iteration at which two runs' logged rollouts differ (`None`: never, within the
/// shorter run).
pub fn first_parting(
    a: &[(usize, Vec<Vec<Vec<u32>>>)],
    b: &[(usize, Vec<Vec<Vec<u32>>>)],
) -> Option<usize> {
    a.iter().zip(b).find(|(x, y)| x != y).map(|(x, _)| x.0)
}

/// `summary.md`'s section for `part_from = key=value`: per cell away from that value, over the
/// seeds, the first iteration whose logged rollouts differ from its sibling's at the value.
fn parting_md(
    matrix: &Matrix,
    cells: &[Cell],
    (key, value): &(String, String),
    out: &Path,
) -> String {
    let at = format!("{key}={value}");
    let mut md = format!(
        "\n## When the runs part\n\nThe first iteration whose logged rollouts differ from the same seed's run at `{at}` (same settings otherwise; the draws share their counter-based uniforms, so they part only once the policies do). Over {} seeds.\n\n| cell | median | min | max | never |\n|---|---|---|---|---|\n",
        matrix.seeds.len()
    );
    let prefix = format!("{key}=");
    for cell in cells {
        let Some(own) = cell.sets.iter().position(|s| s.starts_with(&prefix)) else {
            continue;
        };
        if cell.sets[own] == at {
            continue;
        }
        let mut sibling_sets = cell.sets.clone();
        sibling_sets[own] = at.clone();
        let Some(sibling) = cells.iter().find(|c| c.sets == sibling_sets) else {
            continue;
        };
        let mut parts = Vec::new();
        let mut never = 0;
        for &seed in &matrix.seeds {
            let a = rollouts(&super::run_dir(out, cell, seed));
            let b = rollouts(&super::run_dir(out, sibling, seed));
            match first_parting(&a, &b) {
                Some(it) => parts.push(it as f64),
                None => never += 1,
            }
        }
        parts.sort_by(f64::total_cmp);
        let cellv = |x: Option<&f64>| x.map_or("–".to_string(), |v| format!("{v}"));
        let median = (!parts.is_empty()).then(|| {
            let n = parts.len();
            (parts[(n - 1) / 2] + parts[n / 2]) / 2.0
        });
        md.push_str(&format!(
            "| {} | {} | {} | {} | {never} |\n",
            cell.label,
            cellv(median.as_ref()),
            cellv(parts.first()),
            cellv(parts.last()),
        ));
    }
    md
}

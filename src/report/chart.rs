//! Line charts with optional bands, written as PNG and SVG.

use crate::config::{AdvantageMode, RunConfig};
use crate::metrics::StepRecord;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

#[cfg(not(target_arch = "wasm32"))]
const FONT_NAME: &str = "grpo-lab-sans";
/// In a browser plotters asks the page for fonts by CSS family.
#[cfg(target_arch = "wasm32")]
const FONT_NAME: &str = "sans-serif";
/// DejaVu Sans, embedded: charts and the app never need a system font.
pub static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// On wasm32 plotters measures and draws text through the browser (no font registry).
#[cfg(not(target_arch = "wasm32"))]
fn ensure_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        plotters::style::register_font(FONT_NAME, FontStyle::Normal, FONT)
            .map_err(|_| ())
            .expect("embedded font is valid");
    });
}

#[cfg(target_arch = "wasm32")]
fn ensure_font() {}

/// One line of a chart, with an optional band (e.g. ±std) drawn faintly behind it.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub band: Option<Vec<(f64, f64, f64)>>,
    pub dashed: bool,
    /// Points only (a scatter), no line.
    pub scatter: bool,
}

impl Series {
    pub fn line(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            name: name.into(),
            points,
            band: None,
            dashed: false,
            scatter: false,
        }
    }
}

/// Tableau's ten, then four darker ones so that a chart of up to 14 series (the transformer's
/// scaling sweep on a device draws 13) repeats no colour.
const PALETTE: [RGBColor; 14] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(0, 0, 128),
    RGBColor(128, 0, 0),
    RGBColor(0, 100, 100),
];

/// The x and y ranges of a chart: every finite point and band edge, `[0, 1]` where there is
/// none, y padded by 5 %.
fn extent(series: &[Series]) -> ((f64, f64), (f64, f64)) {
    let finite = |v: f64| v.is_finite();
    let xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|v| finite(*v));
    let (mut x0, mut x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let ys = series.iter().flat_map(|s| {
        s.points
            .iter()
            .map(|p| p.1)
            .chain(s.band.iter().flatten().flat_map(|b| [b.1, b.2]))
    });
    let (mut y0, mut y1) = ys
        .filter(|v| finite(*v))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
            (a.min(y), b.max(y))
        });
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if !y0.is_finite() {
        (y0, y1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0).abs() * 0.05).max(1e-6);
    let (y0, y1) = (y0 - pad, y1 + pad);
    ((x0, x1), (y0, y1))
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let finite = |v: f64| v.is_finite();
    let ((x0, x1), (y0, y1)) = extent(series);
    let font = |size| (FONT_NAME, size).into_font();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, font(22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(font(13))
        .axis_desc_style(font(15))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        if let Some(band) = &s.band {
            let poly: Vec<(f64, f64)> = band
                .iter()
                .map(|b| (b.0, b.2))
                .chain(band.iter().rev().map(|b| (b.0, b.1)))
                .filter(|p| finite(p.1))
                .collect();
            chart
                .draw_series(std::iter::once(Polygon::new(
                    poly,
                    color.mix(0.18).filled(),
                )))
                .map_err(|e| e.to_string())?;
        }
        let pts: Vec<(f64, f64)> = s.points.iter().copied().filter(|p| finite(p.1)).collect();
        let style = ShapeStyle::from(&color).stroke_width(2);
        let anno = if s.scatter {
            chart
                .draw_series(
                    pts.iter()
                        .map(|&p| Circle::new(p, 2, color.mix(0.5).filled())),
                )
                .map_err(|e| e.to_string())?
        } else if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(pts, 6, 4, style))
                .map_err(|e| e.to_string())?
        } else {
            chart
                .draw_series(LineSeries::new(pts, style))
                .map_err(|e| e.to_string())?
        };
        anno.label(s.name.clone()).legend(move |(x, y)| {
            PathElement::new(
                vec![(x, y), (x + 18, y)],
                ShapeStyle::from(&color).stroke_width(2),
            )
        });
    }
    if series.len() > 1 || series.iter().any(|s| !s.name.is_empty()) {
        chart
            .configure_series_labels()
            .label_font(font(13))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// Draw one chart as `stem.png` and `stem.svg` in `dir`; returns both paths (on wasm32,
/// where plotters has no PNG encoder, the SVG only).
pub fn line_chart(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> std::io::Result<Vec<PathBuf>> {
    ensure_font();
    std::fs::create_dir_all(dir)?;
    let svg = dir.join(format!("{stem}.svg"));
    let to_io = |e: String| std::io::Error::other(format!("{title}: {e}"));
    let mut paths = Vec::new();
    #[cfg(not(target_arch = "wasm32"))]
    {
        let png = dir.join(format!("{stem}.png"));
        draw(
            BitMapBackend::new(&png, (900, 540)).into_drawing_area(),
            title,
            x_label,
            y_label,
            series,
        )
        .map_err(to_io)?;
        paths.push(png);
    }
    draw(
        SVGBackend::new(&svg, (900, 540)).into_drawing_area(),
        title,
        x_label,
        y_label,
        series,
    )
    .map_err(to_io)?;
    paths.push(svg);
    Ok(paths)
}

/// The first record of each iteration: rollout-level metrics live there.
fn per_iteration(records: &[StepRecord]) -> Vec<&StepRecord> {
    records
        .iter()
        .filter(|r| r.step_in_iteration == 0)
        .collect()
}

/// Step-level metrics at fractional iterations (`iteration + step/μ`).
fn per_step(
    records: &[StepRecord],
    mu: usize,
    get: impl Fn(&StepRecord) -> f32,
) -> Vec<(f64, f64)> {
    records
        .iter()
        .map(|r| {
            (
                r.iteration as f64 + r.step_in_iteration as f64 / mu as f64,
                get(r) as f64,
            )
        })
        .collect()
}

/// The standard charts of a run: reward, advantages, KL, entropy, length, accuracy.
pub fn run_charts(
    records: &[StepRecord],
    config: &RunConfig,
    dir: &Path,
) -> std::io::Result<Vec<PathBuf>> {
    let it = per_iteration(records);
    let mu = config.algorithm.steps_per_iteration().max(1);
    let name = &config.run.name;
    let kl = Series::line(
        format!("kl ({})", config.algorithm.kl_estimator),
        per_step(records, mu, |r| r.kl),
    );
    let ent = Series::line("entropy", per_step(records, mu, |r| r.entropy));
    // (file stem, title, y axis, series)
    let charts: [(&str, String, &str, Vec<Series>); 6] = [
        (
            "reward",
            format!("{name}: reward per iteration"),
            "reward",
            reward_series(&it, config),
        ),
        (
            "advantages",
            format!("{name}: mean |advantage| of logged groups, every mode"),
            "mean |A|",
            advantage_series(records, config),
        ),
        (
            "kl",
            format!("{name}: KL to the reference"),
            "KL per token",
            vec![kl],
        ),
        (
            "entropy",
            format!("{name}: policy entropy"),
            "nats per position",
            vec![ent],
        ),
        (
            "length",
            format!("{name}: response length"),
            "tokens",
            length_series(&it),
        ),
        (
            "accuracy",
            format!("{name}: exact-match accuracy"),
            "fraction",
            accuracy_series(&it),
        ),
    ];
    let mut out = Vec::new();
    for (stem, title, y, series) in &charts {
        out.extend(line_chart(dir, stem, title, "iteration", y, series)?);
    }
    Ok(out)
}

fn x(r: &StepRecord) -> f64 {
    r.iteration as f64
}

/// Mean reward ± std per iteration, the minimum and the most a response can score.
fn reward_series(it: &[&StepRecord], config: &RunConfig) -> Vec<Series> {
    let mut reward = Series::line(
        "mean reward (± std)",
        it.iter().map(|r| (x(r), r.reward_mean as f64)).collect(),
    );
    reward.band = Some(
        it.iter()
            .map(|r| {
                (
                    x(r),
                    (r.reward_mean - r.reward_std) as f64,
                    (r.reward_mean + r.reward_std) as f64,
                )
            })
            .collect(),
    );
    let max_reward = crate::task::reward::max_reward_of(config) as f64;
    let n_iter = it.last().map(|r| x(r)).unwrap_or(1.0);
    let mut best = Series::line(
        "max possible",
        vec![(0.0, max_reward), (n_iter, max_reward)],
    );
    best.dashed = true;
    let mut lo = Series::line(
        "min",
        it.iter().map(|r| (x(r), r.reward_min as f64)).collect(),
    );
    lo.dashed = true;
    vec![reward, lo, best]
}

/// Mean |A| of the logged groups under every mode: how each mode scales the same signal.
fn advantage_series(records: &[StepRecord], config: &RunConfig) -> Vec<Series> {
    AdvantageMode::GROUP
        .iter()
        .map(|m| {
            let pts = records
                .iter()
                .filter_map(|r| {
                    let groups = r.groups.as_ref()?;
                    let vals: Vec<f32> = groups
                        .iter()
                        .flat_map(|g| g.advantages.get(m.name()).cloned().unwrap_or_default())
                        .collect();
                    (!vals.is_empty()).then(|| {
                        (
                            x(r),
                            vals.iter().map(|v| v.abs() as f64).sum::<f64>() / vals.len() as f64,
                        )
                    })
                })
                .collect();
            let label = if *m == config.algorithm.advantage {
                format!("{} (drives update)", m.name())
            } else {
                m.name().to_string()
            };
            Series::line(label, pts)
        })
        .collect()
}

/// Response length per iteration: mean, min, max, and the mean of correct and wrong ones.
fn length_series(it: &[&StepRecord]) -> Vec<Series> {
    vec![
        Series::line(
            "mean",
            it.iter().map(|r| (x(r), r.mean_length as f64)).collect(),
        ),
        Series {
            dashed: true,
            ..Series::line(
                "min",
                it.iter().map(|r| (x(r), r.min_length as f64)).collect(),
            )
        },
        Series {
            dashed: true,
            ..Series::line(
                "max",
                it.iter().map(|r| (x(r), r.max_length as f64)).collect(),
            )
        },
        Series::line(
            "correct",
            it.iter()
                .filter(|r| r.mean_length_correct.is_finite())
                .map(|r| (x(r), r.mean_length_correct as f64))
                .collect(),
        ),
        Series::line(
            "wrong",
            it.iter()
                .filter(|r| r.mean_length_wrong.is_finite())
                .map(|r| (x(r), r.mean_length_wrong as f64))
                .collect(),
        ),
    ]
}

/// Exact-match accuracy: greedy on train (and held out), sampled responses, flat groups.
fn accuracy_series(it: &[&StepRecord]) -> Vec<Series> {
    let mut acc = vec![
        Series::line(
            "train (greedy)",
            it.iter().map(|r| (x(r), r.accuracy_train as f64)).collect(),
        ),
        Series::line(
            "sampled responses exact",
            it.iter().map(|r| (x(r), r.exact_match as f64)).collect(),
        ),
        Series::line(
            "groups with zero std",
            it.iter()
                .map(|r| (x(r), r.frac_reward_zero_std as f64))
                .collect(),
        ),
    ];
    if it.iter().any(|r| r.accuracy_heldout.is_some()) {
        acc.insert(
            1,
            Series::line(
                "held-out (greedy)",
                it.iter()
                    .filter_map(|r| Some((x(r), r.accuracy_heldout? as f64)))
                    .collect(),
            ),
        );
    }
    acc
}

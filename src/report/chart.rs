//! Line charts with optional bands, written as PNG and SVG.

use crate::config::{AdvantageMode, RunConfig};
use crate::metrics::StepRecord;
use plotters::coord::types::RangedCoordf64;
use plotters::element::MultiLineText;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
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

/// At most this many tick labels on an axis (plotters' default).
const MAX_TICKS: usize = 11;
/// The PNG's and the SVG's size in pixels.
const SIZE: (u32, u32) = (900, 540);
/// A range narrower than this, relative to its values, is flat: f32 rounding, not data.
const FLAT: f64 = 1e-6;

/// The smallest and largest of `values` that are finite, `None` where none is.
fn finite_range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.filter(|v| v.is_finite()).fold(None, |r, v| match r {
        None => Some((v, v)),
        Some((a, b)) => Some((v.min(a), v.max(b))),
    })
}

/// Every y a chart draws: points and band edges.
fn all_y(series: &[Series]) -> impl Iterator<Item = f64> + '_ {
    series.iter().flat_map(|s| {
        s.points
            .iter()
            .map(|p| p.1)
            .chain(s.band.iter().flatten().flat_map(|b| [b.1, b.2]))
    })
}

/// Whether the x axis counts whole things (iterations, steps, or whole numbers only): its
/// ticks are then whole numbers, labelled `2`, not `2.0` (and never `0.5` on a short run).
/// Per-step points at fractional iterations (`iteration + step/μ`) keep an integer axis.
fn whole_x(x_label: &str, series: &[Series]) -> bool {
    let label = x_label.trim().to_ascii_lowercase();
    if matches!(
        label.as_str(),
        "iteration" | "iterations" | "step" | "steps"
    ) {
        return true;
    }
    let mut xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|x| x.is_finite())
        .peekable();
    xs.peek().is_some() && xs.all(|x| x.fract() == 0.0)
}

/// The x range: the points' (`[0, 1]` where there is none), at least 1 wide, out to whole
/// numbers on a whole axis so that its ticks fall on them.
fn x_range(series: &[Series], whole: bool) -> (f64, f64) {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (mut x0, mut x1) = finite_range(xs).unwrap_or((0.0, 1.0));
    if whole {
        (x0, x1) = (x0.floor(), x1.ceil());
    }
    if x1 - x0 < 1.0 && (whole || x1 <= x0) {
        x1 = x0 + 1.0;
    }
    (x0, x1)
}

/// The y range: the data's (`[0, 1]` where there is none) padded by 5 %. A flat series gets
/// a range around its value (±10 % of it, ±1 at 0) instead: padding a zero-width range by a
/// hair gave eleven ticks that all read `3.0`. Within `bounds` (a fraction's `[0, 1]`) the
/// range is cut to them before the padding.
fn y_range(series: &[Series], bounds: Option<(f64, f64)>) -> (f64, f64) {
    let (mut y0, mut y1) = finite_range(all_y(series)).unwrap_or((0.0, 1.0));
    if y1 - y0 <= FLAT * y0.abs().max(y1.abs()) {
        let v = (y0 + y1) / 2.0;
        let half = if v.abs() < f64::MIN_POSITIVE.sqrt() {
            1.0
        } else {
            0.1 * v.abs()
        };
        (y0, y1) = (v - half, v + half);
        if let Some((lo, hi)) = bounds {
            (y0, y1) = (y0.max(lo), y1.min(hi));
        }
    }
    let pad = 0.05 * (y1 - y0);
    (y0 - pad, y1 + pad)
}

/// The series with every y (points and band edges) clamped to `bounds`: a fraction's mean ±
/// std over seeds stays within `[0, 1]`.
fn clamp_series(series: &[Series], (lo, hi): (f64, f64)) -> Vec<Series> {
    let clamp = |y: f64| if y.is_finite() { y.clamp(lo, hi) } else { y };
    series
        .iter()
        .map(|s| Series {
            points: s.points.iter().map(|&(x, y)| (x, clamp(y))).collect(),
            band: s.band.as_ref().map(|band| {
                band.iter()
                    .map(|&(x, a, b)| (x, clamp(a), clamp(b)))
                    .collect()
            }),
            ..s.clone()
        })
        .collect()
}

/// How an axis writes its tick values: as many decimals as the step between ticks needs, so
/// that neighbouring labels always differ (`2`, `2.5`, `0.05`), in scientific notation where
/// plain digits would not fit the label area.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TickFormat {
    step: f64,
    /// Digits after the point: of the plain number, or of the mantissa where scientific.
    decimals: usize,
    scientific: bool,
}

impl TickFormat {
    /// The format of the ticks plotters draws on `range` with at most `max_ticks` labels.
    fn of(range: (f64, f64), max_ticks: usize) -> Self {
        let ticks = RangedCoordf64::from(range.0..range.1).key_points(max_ticks);
        let step = ticks
            .windows(2)
            .map(|w| w[1] - w[0])
            .fold(f64::INFINITY, f64::min);
        let step = if step.is_finite() && step > 0.0 {
            step
        } else {
            (range.1 - range.0).abs().max(f64::MIN_POSITIVE)
        };
        // The nudge keeps a step of 0.1 that reads 0.09999999999999998 at one decimal.
        let step_exp = (step.log10() + 1e-9).floor() as i32;
        let largest = range.0.abs().max(range.1.abs());
        let top_exp = if largest > 0.0 {
            largest.log10().floor() as i32
        } else {
            0
        };
        if step_exp < -4 || top_exp >= 7 {
            Self {
                step,
                decimals: (top_exp - step_exp).max(0) as usize,
                scientific: true,
            }
        } else {
            Self {
                step,
                decimals: (-step_exp).max(0) as usize,
                scientific: false,
            }
        }
    }

    fn label(&self, v: f64) -> String {
        // A tick a rounding error off 0 would read `-0.0`.
        let v = if v.abs() < self.step * 1e-6 { 0.0 } else { v };
        if self.scientific {
            format!("{v:.*e}", self.decimals)
        } else {
            format!("{v:.*}", self.decimals)
        }
    }
}

/// The legend's corners and edges, in the order taken on a tie.
const LEGEND_PLACES: [SeriesLabelPosition; 8] = [
    SeriesLabelPosition::UpperRight,
    SeriesLabelPosition::UpperLeft,
    SeriesLabelPosition::LowerRight,
    SeriesLabelPosition::LowerLeft,
    SeriesLabelPosition::MiddleRight,
    SeriesLabelPosition::MiddleLeft,
    SeriesLabelPosition::UpperMiddle,
    SeriesLabelPosition::LowerMiddle,
];

/// The legend box's size in pixels, as plotters lays it out (`SeriesLabelStyle::draw`: the
/// labels' text, a 30 px sample of each line, 10 px margins).
fn legend_size(names: &[&str], style: &TextStyle) -> Option<(i32, i32)> {
    let mut text = MultiLineText::<_, &str>::new((0, 0), style);
    for name in names {
        text.push_line(*name);
    }
    let (w, h) = text.estimate_dimension().ok()?;
    Some((w + 30 + 2 * 10, h + 2 * 10))
}

/// The legend box's top-left corner in the plot area at `place` (plotters' own layout).
fn legend_origin(place: &SeriesLabelPosition, size: (i32, i32), area: (i32, i32)) -> (i32, i32) {
    use SeriesLabelPosition::*;
    let x = match place {
        UpperLeft | MiddleLeft | LowerLeft => 5,
        UpperMiddle | MiddleMiddle | LowerMiddle => (area.0 - size.0) / 2,
        _ => area.0 - size.0 - 5,
    };
    let y = match place {
        UpperLeft | UpperMiddle | UpperRight => 5,
        MiddleLeft | MiddleMiddle | MiddleRight => (area.1 - size.1) / 2,
        _ => area.1 - size.1 - 5,
    };
    (x, y)
}

/// What the chart draws, as pixels of the plot area with a weight each: lines sampled every
/// few pixels, scatter points, and band edges at a quarter (a band is faint).
fn drawn_pixels(series: &[Series], to_px: impl Fn(f64, f64) -> (f64, f64)) -> Vec<(f64, f64, f64)> {
    let mut out = Vec::new();
    let mut trace = |pts: &[(f64, f64)], joined: bool, weight: f64| {
        let px: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(x, y)| to_px(x, y))
            .collect();
        out.extend(px.iter().map(|p| (p.0, p.1, weight)));
        if joined {
            for w in px.windows(2) {
                let n = ((w[1].0 - w[0].0).hypot(w[1].1 - w[0].1) / 4.0)
                    .ceil()
                    .max(1.0);
                for k in 1..n as usize {
                    let t = k as f64 / n;
                    let lerp = |a: f64, b: f64| a + t * (b - a);
                    out.push((lerp(w[0].0, w[1].0), lerp(w[0].1, w[1].1), weight));
                }
            }
        }
    };
    for s in series {
        trace(&s.points, !s.scatter, 1.0);
        if let Some(band) = &s.band {
            let lower: Vec<(f64, f64)> = band.iter().map(|b| (b.0, b.1)).collect();
            let upper: Vec<(f64, f64)> = band.iter().map(|b| (b.0, b.2)).collect();
            trace(&lower, true, 0.25);
            trace(&upper, true, 0.25);
        }
    }
    out
}

/// Where the legend hides the least: of [`LEGEND_PLACES`], the one whose box covers the least
/// drawn data (the lower right, plotters' usual spot, sat on the lines of most charts), and
/// how much it still covers there.
fn legend_place(
    pixels: &[(f64, f64, f64)],
    size: (i32, i32),
    area: (i32, i32),
) -> (SeriesLabelPosition, f64) {
    let covered = |place: &SeriesLabelPosition| {
        let (x, y) = legend_origin(place, size, area);
        let (x0, y0, x1, y1) = (
            (x - 3) as f64,
            (y - 3) as f64,
            (x + size.0 + 3) as f64,
            (y + size.1 + 3) as f64,
        );
        pixels
            .iter()
            .filter(|p| p.0 >= x0 && p.0 <= x1 && p.1 >= y0 && p.1 <= y1)
            .map(|p| p.2)
            .sum::<f64>()
    };
    let mut best = (SeriesLabelPosition::UpperRight, f64::INFINITY);
    for place in LEGEND_PLACES {
        let c = covered(&place);
        if c < best.1 {
            best = (place, c);
        }
    }
    best
}

/// The top of a y range with room above the data for a legend `legend_h` pixels tall in a
/// plot `plot_h` tall: where every place would hide lines, the data moves down instead.
/// `None` where the legend would take more than 40 % of the height (the data would be
/// squashed; it then covers what it must).
fn headroom((y0, y1): (f64, f64), legend_h: i32, plot_h: u32) -> Option<f64> {
    let f = (legend_h + 10) as f64 / plot_h.max(1) as f64;
    (f <= 0.4).then(|| y1 + (y1 - y0) * f / (1.0 - f))
}

/// The legend's size and its place on `chart`, or `None` for a chart without one (a single
/// unnamed series). Returns a y range with headroom where no place is free.
fn legend_layout<DB: DrawingBackend>(
    chart: &ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    series: &[Series],
    y: (f64, f64),
    style: &TextStyle,
) -> Option<(SeriesLabelPosition, Option<f64>)> {
    if series.len() < 2 && series.iter().all(|s| s.name.is_empty()) {
        return None;
    }
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    let Some(size) = legend_size(&names, style) else {
        return Some((SeriesLabelPosition::UpperRight, None));
    };
    let (w, h) = chart.plotting_area().dim_in_pixel();
    let base = chart.plotting_area().get_base_pixel();
    let to_px = |x: f64, y: f64| {
        let (px, py) = chart.backend_coord(&(x, y));
        ((px - base.0) as f64, (py - base.1) as f64)
    };
    let (place, covered) = legend_place(&drawn_pixels(series, to_px), size, (w as i32, h as i32));
    // More than a touch of a line (a few samples, 4 px apart) hidden: make room.
    let top = (covered > 2.0).then(|| headroom(y, size.1, h)).flatten();
    Some((place, top))
}

/// A chart's axes, worked out from its series before anything is drawn.
struct Axes {
    x: (f64, f64),
    y: (f64, f64),
    x_ticks: usize,
    /// Light grid lines per labelled one at most: on a whole axis they too fall on whole
    /// numbers (no line at iteration 0.1).
    x_light: usize,
    x_format: TickFormat,
    y_format: TickFormat,
}

impl Axes {
    fn of(series: &[Series], x_label: &str, bounds: Option<(f64, f64)>) -> Self {
        let whole = whole_x(x_label, series);
        let x = x_range(series, whole);
        // Whole ticks: no more labels than whole numbers in the range, so plotters' step
        // (1, 2, 5 × 10ᵏ) is at least 1 and, on a range from and to whole numbers, lands on them.
        let wholes = ((x.1 - x.0) as usize).saturating_add(1);
        let (x_ticks, x_light) = if whole {
            let ticks = MAX_TICKS.min(wholes);
            // Light lines at whole numbers, at most 10 between labels (one per iteration would
            // grey a long run's plot, and grow its SVG with the run).
            (ticks, wholes.div_ceil(ticks).min(10))
        } else {
            (MAX_TICKS, 10)
        };
        let y = y_range(series, bounds);
        Self {
            x,
            y,
            x_ticks,
            x_light,
            x_format: TickFormat::of(x, x_ticks),
            y_format: TickFormat::of(y, MAX_TICKS),
        }
    }

    /// The same axes with the y range raised to `top` (room for the legend).
    fn with_y_top(self, top: f64) -> Self {
        let y = (self.y.0, top);
        Self {
            y,
            y_format: TickFormat::of(y, MAX_TICKS),
            ..self
        }
    }
}

/// One chart on `root`: axes from the data, the series, the legend where it hides least.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
    bounds: Option<(f64, f64)>,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let font = |size| (FONT_NAME, size).into_font();
    // The title first (as ChartBuilder's caption would, inside the margin): the chart can then
    // be laid out twice, the second time with room for the legend, without drawing it twice.
    let area = root
        .margin(12, 12, 12, 12)
        .titled(title, font(22))
        .map_err(|e| e.to_string())?;
    let build = |axes: &Axes| {
        ChartBuilder::on(&area)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(axes.x.0..axes.x.1, axes.y.0..axes.y.1)
            .map_err(|e| e.to_string())
    };
    let label_style = TextStyle::from(font(13));
    let mut axes = Axes::of(series, x_label, bounds);
    let mut chart = build(&axes)?;
    let (mut legend, top) = match legend_layout(&chart, series, axes.y, &label_style) {
        Some((place, top)) => (Some(place), top),
        None => (None, None),
    };
    if let Some(top) = top {
        axes = axes.with_y_top(top);
        chart = build(&axes)?;
        legend = legend_layout(&chart, series, axes.y, &label_style).map(|l| l.0);
    }
    let (x_format, y_format) = (axes.x_format, axes.y_format);
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_labels(axes.x_ticks)
        .x_max_light_lines(axes.x_light)
        .y_labels(MAX_TICKS)
        .x_label_formatter(&|v| x_format.label(*v))
        .y_label_formatter(&|v| y_format.label(*v))
        .label_style(font(13))
        .axis_desc_style(font(15))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in series.iter().enumerate() {
        draw_series(&mut chart, s, PALETTE[i % PALETTE.len()])?;
    }
    if !series
        .iter()
        .any(|s| s.points.iter().any(|p| p.1.is_finite()))
    {
        // A run that diverged at its first step logs nothing: say so, not an empty grid.
        let centre = ((axes.x.0 + axes.x.1) / 2.0, (axes.y.0 + axes.y.1) / 2.0);
        let style = font(18)
            .color(&RGBColor(120, 120, 120))
            .pos(Pos::new(HPos::Center, VPos::Center));
        chart
            .plotting_area()
            .draw(&Text::new("no data logged", centre, style))
            .map_err(|e| e.to_string())?;
    }
    if let Some(place) = legend {
        chart
            .configure_series_labels()
            .label_font(label_style)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .position(place)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// One series: its band faintly, then its line (dashed or solid) or its points, with the
/// legend entry that names it.
fn draw_series<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    s: &Series,
    color: RGBColor,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let finite = |v: f64| v.is_finite();
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
    let anno = if let [only] = pts[..]
        && !s.scatter
    {
        // A line of one point (a run that stopped in its first iteration) draws nothing.
        chart
            .draw_series(std::iter::once(Circle::new(only, 4, color.filled())))
            .map_err(|e| e.to_string())?
    } else if s.scatter {
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
    Ok(())
}

/// Draw one chart as `stem.png` and `stem.svg` in `dir`; returns both paths (on wasm32,
/// where plotters has no PNG encoder, the SVG only). A chart of a metric that is a fraction
/// (`y_label` names one, e.g. `accuracy/heldout` in `compare`) keeps its lines and bands
/// within `[0, 1]`.
pub fn line_chart(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> std::io::Result<Vec<PathBuf>> {
    let bounds = crate::metrics::in_unit_interval(y_label).then_some((0.0, 1.0));
    bounded_line_chart(dir, stem, title, (x_label, y_label), series, bounds)
}

/// [`line_chart`] with every y clamped to `bounds` (and the axis cut to them around a flat
/// series): a quantity that cannot leave them is never drawn outside, not even its ± std band.
pub fn bounded_line_chart(
    dir: &Path,
    stem: &str,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
    bounds: Option<(f64, f64)>,
) -> std::io::Result<Vec<PathBuf>> {
    ensure_font();
    std::fs::create_dir_all(dir)?;
    let clamped;
    let series = match bounds {
        Some(b) => {
            clamped = clamp_series(series, b);
            &clamped[..]
        }
        None => series,
    };
    let svg = dir.join(format!("{stem}.svg"));
    let to_io = |e: String| std::io::Error::other(format!("{title}: {e}"));
    let mut paths = Vec::new();
    #[cfg(not(target_arch = "wasm32"))]
    {
        let png = dir.join(format!("{stem}.png"));
        draw(
            BitMapBackend::new(&png, SIZE).into_drawing_area(),
            title,
            (x_label, y_label),
            series,
            bounds,
        )
        .map_err(to_io)?;
        paths.push(png);
    }
    draw(
        SVGBackend::new(&svg, SIZE).into_drawing_area(),
        title,
        (x_label, y_label),
        series,
        bounds,
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
        // Every line of the accuracy chart is a fraction.
        let bounds = (*stem == "accuracy").then_some((0.0, 1.0));
        let axes = ("iteration", *y);
        out.extend(bounded_line_chart(dir, stem, title, axes, series, bounds)?);
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
    // Across the whole x axis, which is at least one iteration wide (a run that stopped in
    // its first iteration would get a line of no length).
    let n_iter = it.last().map_or(1.0, |r| x(r).max(1.0));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts of an SVG chart with their `text-anchor`: plotters writes the y axis's tick
    /// labels anchored at their `end`, the x axis's at their `middle` (as the title).
    fn svg_texts(svg: &Path) -> Vec<(String, String)> {
        let svg = std::fs::read_to_string(svg).unwrap();
        svg.split("<text")
            .skip(1)
            .filter_map(|chunk| {
                let (attrs, rest) = chunk.split_once('>')?;
                let (text, _) = rest.split_once("</text>")?;
                let anchor = attrs.split("text-anchor=\"").nth(1)?.split('"').next()?;
                Some((anchor.to_string(), text.trim().to_string()))
            })
            .collect()
    }

    /// Draw `series` (y axis `y_label`) and return its (x, y) tick labels.
    fn tick_labels(stem: &str, y_label: &str, series: &[Series]) -> (Vec<String>, Vec<String>) {
        let dir =
            std::env::temp_dir().join(format!("grpo-lab-chart-{stem}-{}", std::process::id()));
        let paths = line_chart(&dir, stem, "t", "iteration", y_label, series).unwrap();
        let texts = svg_texts(paths.last().unwrap());
        let _ = std::fs::remove_dir_all(&dir);
        let numbers = |anchor: &str| {
            texts
                .iter()
                .filter(|(a, t)| a == anchor && t.parse::<f64>().is_ok())
                .map(|(_, t)| t.clone())
                .collect::<Vec<_>>()
        };
        (numbers("middle"), numbers("end"))
    }

    fn flat(v: f64, n: usize) -> Series {
        Series::line("flat", (0..n).map(|i| (i as f64, v)).collect())
    }

    #[test]
    fn a_flat_series_gets_distinct_y_tick_labels() {
        for v in [3.0, 0.0, -2.5, 5.0, 1e-4, 6.3e6, 1e9] {
            let (_, y) = tick_labels("flat", "tokens", &[flat(v, 20)]);
            assert!(y.len() >= 3, "{v}: {y:?}");
            let mut distinct = y.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), y.len(), "{v}: {y:?}");
        }
    }

    #[test]
    fn an_iteration_axis_is_labelled_in_whole_numbers() {
        for n in [1, 2, 3, 20, 1000] {
            let (x, _) = tick_labels("whole", "tokens", &[flat(1.0, n)]);
            assert!(x.len() >= 2, "{n}: {x:?}");
            assert!(x.iter().all(|t| t.parse::<i64>().is_ok()), "{n}: {x:?}");
        }
        // Per-step points at fractional iterations keep whole ticks.
        let steps = Series::line("kl", (0..15).map(|i| (i as f64 / 10.0, 0.1)).collect());
        let (x, _) = tick_labels("steps", "kl", &[steps]);
        assert_eq!(x, ["0", "1", "2"]);
    }

    #[test]
    fn a_fraction_band_stays_within_zero_and_one() {
        let mut s = Series::line("accuracy", vec![(0.0, 0.01), (1.0, 0.02), (2.0, 0.9)]);
        s.band = Some(vec![
            (0.0, -0.03, 0.05),
            (1.0, -0.01, 0.05),
            (2.0, 0.7, 1.2),
        ]);
        let (_, y) = tick_labels("band", "accuracy/heldout", &[s]);
        let values: Vec<f64> = y.iter().map(|t| t.parse().unwrap()).collect();
        assert!(values.iter().all(|v| (0.0..=1.0).contains(v)), "{y:?}");
        // The axis is cut to [0, 1] around a flat fraction too.
        let (_, y) = tick_labels("band-flat", "accuracy/heldout", &[flat(0.0, 5)]);
        assert!(y.iter().all(|t| t.parse::<f64>().unwrap() >= 0.0), "{y:?}");
    }

    #[test]
    fn tick_labels_carry_the_decimals_of_their_step() {
        let f = TickFormat::of((0.0, 1.0), MAX_TICKS);
        assert_eq!(f.label(0.30000000000000004), "0.3");
        assert_eq!(f.label(-1e-17), "0.0");
        let f = TickFormat::of((2.7, 3.0), MAX_TICKS);
        assert_eq!(f.label(2.75), "2.75");
        assert_eq!(TickFormat::of((2.7, 3.3), MAX_TICKS).label(2.8), "2.8");
        assert_eq!(TickFormat::of((0.0, 20.0), MAX_TICKS).label(4.0), "4");
    }

    #[test]
    fn the_legend_goes_where_the_lines_are_not() {
        let area = (800, 400);
        let size = (150, 80);
        // Lines along the bottom and across the top-right corner: the upper left is free.
        let mut px: Vec<(f64, f64, f64)> = (0..800).map(|x| (x as f64, 390.0, 1.0)).collect();
        px.extend((600..800).map(|x| (x as f64, 20.0, 1.0)));
        assert!(matches!(
            legend_place(&px, size, area).0,
            SeriesLabelPosition::UpperLeft
        ));
        // Lines everywhere: the data moves down by the legend's height (and 10 px), unless
        // that would take more than 40 % of the plot.
        let top = headroom((0.0, 1.0), 90, 400).unwrap();
        assert!((top - 1.0 / (1.0 - 0.25)).abs() < 1e-12, "{top}");
        assert_eq!(headroom((0.0, 1.0), 200, 400), None);
        // Nothing drawn: the upper right.
        assert!(matches!(
            legend_place(&[], size, area).0,
            SeriesLabelPosition::UpperRight
        ));
    }
}

//! The Live plots tab: mean reward, every response's reward per prompt, one group's
//! advantages under every mode, and the per-iteration curves (length, KL, entropy, clip ratio,
//! groups with no learning signal); and the plot helpers the other tabs share.

use super::GrpoApp;
use super::shapes::PALETTE;
use super::store::{RunData, Series};
use crate::config::AdvantageMode;
use crate::task::SortTokenizer;
use egui::{Color32, RichText};
use egui_plot::{Bar, BarChart, Legend, Line, Plot, Points};
use std::sync::OnceLock;

pub(super) fn tokenizer() -> &'static SortTokenizer {
    static T: OnceLock<SortTokenizer> = OnceLock::new();
    T.get_or_init(|| SortTokenizer::load().expect("compiled-in tokenizer"))
}

/// Save the window (or one rectangle of it) as a PNG, from the next frame.
pub fn save_screenshot(ctx: &egui::Context, rect: Option<egui::Rect>, name: String) {
    let ppp = ctx.pixels_per_point();
    ctx.request_screenshot(move |image| {
        let image = match rect {
            Some(r) => image.region(&r, Some(ppp)),
            None => (*image).clone(),
        };
        match super::files::png_bytes(&image).and_then(|png| super::files::deliver(&name, &png)) {
            Ok(done) => log::info!("grpo-lab: {done}"),
            Err(e) => log::warn!("grpo-lab: could not save {name}: {e}"),
        }
    });
}

/// Prompts the group-rewards legend names (the rest share one entry).
const LEGEND_PROMPTS: usize = 8;

/// A plot `width` points wide of bars in groups of G, one group per mode (`modes` groups of
/// `gn` bars at `m·(gn + 2) + i`), with room on the right for the legend (~150 points), which
/// then never covers the last mode's bars.
pub(super) fn bars_plot<'a>(id: &str, modes: usize, gn: usize, width: f32) -> Plot<'a> {
    let end = (modes * (gn + 2)) as f64;
    let room = (150.0 / width.max(1.0) as f64).min(0.6);
    Plot::new(id)
        .width(width)
        .legend(Legend::default())
        .allow_scroll(false)
        .include_x(-1.0)
        .include_x(end / (1.0 - room))
}

pub(super) fn plot<'a>(id: &str, link: egui::Id, width: f32) -> Plot<'a> {
    plot_without_legend(id, link, width).legend(Legend::default())
}

pub(super) fn plot_without_legend<'a>(id: &str, link: egui::Id, width: f32) -> Plot<'a> {
    Plot::new(id)
        .height(170.0)
        .width(width)
        .link_axis(link, [true, false])
        .link_cursor(link, [true, false])
        .x_axis_label("iteration")
        .y_grid_spacer(nice_grid_spacer)
        .y_axis_formatter(tick_text)
        .allow_scroll(false)
}

/// The next step of 1, 2, 5, 10, 20, 50, … at or above `x` (> 0).
fn nice_step(x: f64) -> f64 {
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= x * (1.0 - 1e-9))
        .unwrap_or(10.0 * p)
}

/// Grid lines with labels every 1, 2 or 5 × 10ⁿ, at least ~24 points apart. egui_plot's
/// default steps by powers of 10: a plot of 0…12 at 170 points high had its 1s too close to
/// label and its 10s past its top, and its axis read only "0". The three steps divide one
/// another (a minor step, the labelled one, a major one), so the labels are evenly spaced.
pub(super) fn nice_grid_spacer(input: egui_plot::GridInput) -> Vec<egui_plot::GridMark> {
    // `base_step_size`: the value of egui_plot's smallest grid spacing (8 points).
    let base = input.base_step_size.abs();
    if !base.is_finite() || base < f64::MIN_POSITIVE {
        return Vec::new();
    }
    let label = nice_step(3.0 * base);
    let mantissa = (label / 10f64.powf(label.log10().floor())).round();
    let (minor, major) = match mantissa as u32 {
        1 => (label / 2.0, label * 5.0),
        2 => (label / 2.0, label * 5.0),
        _ => (label / 5.0, label * 2.0),
    };
    let (lo, hi) = input.bounds;
    let mut marks: Vec<egui_plot::GridMark> = Vec::new();
    // The largest step a value is on decides its line (and its label's digits).
    for step in [major, label, minor] {
        let (first, last) = ((lo / step).ceil(), (hi / step).floor());
        if !(first.is_finite() && last.is_finite()) || last - first > 2000.0 {
            continue;
        }
        for k in first as i64..=last as i64 {
            let value = k as f64 * step;
            if !marks.iter().any(|m| (m.value - value).abs() < 0.1 * minor) {
                marks.push(egui_plot::GridMark {
                    value,
                    step_size: step,
                });
            }
        }
    }
    marks.sort_by(|a, b| a.value.total_cmp(&b.value));
    marks
}

/// A tick's number with the digits its step needs (egui_plot's default rounds the digits of
/// a step of 0.5 to none, and labelled 1.5 and 2.5 both "2").
pub(super) fn tick_text(
    mark: egui_plot::GridMark,
    _range: &std::ops::RangeInclusive<f64>,
) -> String {
    let digits = (-(mark.step_size.log10() + 1e-9).floor()).max(0.0) as usize;
    let v = if mark.value.abs() < 1e-12 * mark.step_size.max(1e-300) {
        0.0
    } else {
        mark.value
    };
    format!("{v:.digits$}")
}

pub(super) fn line(name: &str, pts: Vec<[f64; 2]>, color: Color32) -> Line<'static> {
    Line::new(name.to_string(), pts).color(color)
}

/// A curve drawn with no legend entry of its own, shown and hidden with the entry `name`
/// (the same item id): the faint raw curve behind its moving average, a band under its line.
/// Two items of one name in egui_plot's legend merge into one entry whose dot is greyed when
/// their colours differ; an unnamed item is left out of the legend, and the id keeps the
/// entry's click (hide) and hover (highlight) on both.
pub(super) fn unlisted_line(name: &str, pts: Vec<[f64; 2]>, color: Color32) -> Line<'static> {
    Line::new("", pts).color(color).id(name)
}

pub(super) fn png_button(ui: &mut egui::Ui, rect: egui::Rect, name: &str) {
    if ui
        .small_button("PNG")
        .on_hover_text(format!("Save this plot as grpo-lab-{name}.png"))
        .clicked()
    {
        save_screenshot(ui.ctx(), Some(rect), format!("grpo-lab-{name}.png"));
    }
}

pub(super) fn titled(ui: &mut egui::Ui, title: &str, help: &str) {
    ui.label(RichText::new(title).strong()).on_hover_text(help);
}

pub fn plots_ui(app: &mut GrpoApp, ui: &mut egui::Ui) {
    let link = egui::Id::NULL.with("iteration-axis");
    ui.horizontal(|ui| {
        ui.label("Smoothing").on_hover_text("Exponential moving average of every curve (TensorBoard style); the raw curve stays faint behind.");
        if ui.add(egui::Slider::new(&mut app.persisted.smoothing, 0.0..=0.99).text("EMA weight")).changed() {
            app.run.set_smoothing(app.persisted.smoothing);
        }
        ui.label(format!("{} steps logged", app.run.steps));
    });
    let app = &*app;
    let run = &app.run;
    let smoothing = app.persisted.smoothing;
    let w = ((ui.available_width() - 30.0) / 2.0).max(200.0);
    egui::ScrollArea::vertical().show(ui, |ui| {
        egui::Grid::new("plots")
            .num_columns(2)
            .spacing([12.0, 8.0])
            .show(ui, |ui| {
                ui.vertical(|ui| reward_plot(app, ui, link, w));
                ui.vertical(|ui| group_rewards_plot(app, ui, link, w));
                ui.end_row();
                ui.vertical(|ui| advantages_plot(app, ui, w));
                let length = [
                    ("mean", "completions/mean_length"),
                    ("min", "completions/min_length"),
                    ("max", "completions/max_length"),
                    ("correct", "completions/mean_length_correct"),
                    ("wrong", "completions/mean_length_wrong"),
                ];
                let length: Vec<_> = length
                    .iter()
                    .enumerate()
                    .map(|(k, (name, key))| (*name, run.series(key), PALETTE[k]))
                    .collect();
                small_plot(ui, smoothing, link, w, "length", "Response length", &length);
                ui.end_row();
                let kl = [("kl", run.series("kl"), PALETTE[3])];
                small_plot(ui, smoothing, link, w, "kl", "KL to the reference", &kl);
                // With an entropy bonus the coefficient shares the plot (the adaptive one moves).
                let coef = run.series("entropy_coef");
                let mut ent = vec![("entropy", run.series("entropy"), PALETTE[4])];
                if coef.len > 0 {
                    ent.push(("entropy_coef", coef, PALETTE[6]));
                }
                small_plot(ui, smoothing, link, w, "entropy", "Entropy", &ent);
                ui.end_row();
                let clip = [
                    ("low", run.series("clip_ratio/low"), PALETTE[5]),
                    ("high", run.series("clip_ratio/high"), PALETTE[6]),
                ];
                small_plot(ui, smoothing, link, w, "clip", "Clip ratio", &clip);
                let flat = [
                    (
                        "frac_reward_zero_std",
                        run.series("frac_reward_zero_std"),
                        PALETTE[7],
                    ),
                    ("accuracy/train", run.series("accuracy/train"), PALETTE[2]),
                ];
                let title = "Groups with no learning signal";
                small_plot(ui, smoothing, link, w, "zero-std", title, &flat);
                ui.end_row();
            });
    });
}

/// Mean reward, smoothed over the raw curve, under the largest possible reward.
fn reward_plot(app: &GrpoApp, ui: &mut egui::Ui, link: egui::Id, w: f32) {
    let run = &app.run;
    let max_reward = app
        .running
        .as_ref()
        .map(|c| crate::task::reward::max_reward_of(c) as f64);
    super::help::title(ui, "Mean reward", "reward");
    plot("reward", link, w).show(ui, |p| {
        let faint = PALETTE[0].gamma_multiply(0.25);
        p.line(line("raw", run.reward_raw_points(), faint));
        p.line(line("smoothed", run.reward_smoothed_points(), PALETTE[0]));
        if let (Some(m), Some(last)) = (max_reward, run.series("reward/mean").last) {
            let top = vec![[0.0, m], [last[0].max(1.0), m]];
            let dashed = egui_plot::LineStyle::dashed_loose();
            p.line(line("max possible", top, Color32::GRAY).style(dashed));
        }
    });
    png_button(ui, ui.min_rect(), "reward");
}

/// Every response's reward, group by group: one colour per prompt where the prompts recur
/// across iterations, else one colour per group slot.
fn group_rewards_plot(app: &GrpoApp, ui: &mut egui::Ui, link: egui::Id, w: f32) {
    let run = &app.run;
    super::help::title(ui, "Group rewards", "groups");
    plot("groups", link, w).show(ui, |p| {
        let g_max = run
            .groups
            .last()
            .and_then(|(_, gs)| gs.iter().map(|g| g.rewards.len()).max())
            .unwrap_or(1);
        // At most ~80 iterations of points: thousands of circles cost more to tessellate
        // than to read.
        let stride = (run.groups.len() / 80).max(1);
        let plotted: Vec<_> = run.groups.iter().step_by(stride).collect();
        // Colouring by prompt means something only where prompts come back: on a fixed
        // prompt list (lecture17) the same prompt is a curve you can follow. On a task that
        // draws new prompts every iteration (transformer-sort: 32 of 4096) the latest
        // iteration's prompts have no earlier points, and every other point was one grey
        // "other prompts". There the colour is the group's slot within its iteration (the
        // inspector's group k of each iteration): every point coloured, the same 8 colours in
        // every iteration. The rule is read from the data: most of the latest iteration's
        // named prompts also appear in an earlier plotted iteration. (With one iteration the
        // two readings agree; it names the prompts.)
        let named = named_prompts(run);
        let earlier: std::collections::HashSet<usize> = plotted
            .iter()
            .take(plotted.len().saturating_sub(1))
            .flat_map(|(_, gs)| gs.iter().take(LEGEND_PROMPTS).map(|g| g.prompt_index))
            .collect();
        let recurring = named.iter().filter(|p| earlier.contains(p)).count();
        let by_prompt = plotted.len() <= 1 || 2 * recurring >= named.len().max(1);
        // (key, points): the prompt index, or the group's slot.
        let mut series: std::collections::BTreeMap<usize, Vec<[f64; 2]>> = Default::default();
        for (it, groups) in &plotted {
            for (slot, g) in groups.iter().take(LEGEND_PROMPTS).enumerate() {
                let key = if by_prompt { g.prompt_index } else { slot };
                let pts = series.entry(key).or_default();
                for (i, r) in g.rewards.iter().enumerate() {
                    let jitter = (i as f64 / g_max as f64 - 0.5) * 0.4;
                    pts.push([*it as f64 + jitter, *r as f64]);
                }
            }
        }
        for (key, pts) in series {
            let (name, colour) = if by_prompt {
                // The legend names the latest iteration's first groups (the inspector's) and
                // gathers every other prompt under one grey entry: never hundreds of rows.
                match named.iter().position(|&x| x == key) {
                    Some(k) => {
                        let name = app.train_prompts.get(key).map_or_else(
                            || format!("prompt {key}"),
                            |p| format!("[{}]", tokenizer().decode(p)),
                        );
                        (name, PALETTE[k % PALETTE.len()])
                    }
                    None => ("other prompts".to_string(), Color32::GRAY),
                }
            } else {
                (format!("group #{key}"), PALETTE[key % PALETTE.len()])
            };
            p.points(Points::new(name, pts).radius(1.2).color(colour));
        }
    });
    png_button(ui, ui.min_rect(), "groups");
}

/// The prompts the group-rewards legend names: the latest iteration's first groups'.
fn named_prompts(run: &RunData) -> Vec<usize> {
    run.groups.last().map_or_else(Vec::new, |(_, gs)| {
        gs.iter()
            .take(LEGEND_PROMPTS)
            .map(|g| g.prompt_index)
            .collect()
    })
}

/// The inspector's group of the latest iteration under every advantage mode, side by side.
fn advantages_plot(app: &GrpoApp, ui: &mut egui::Ui, w: f32) {
    let run = &app.run;
    let group = run.groups.last().and_then(|(it, gs)| {
        gs.get(app.inspector_group.min(gs.len().saturating_sub(1)))
            .map(|g| (*it, g))
    });
    let which = group.map_or_else(String::new, |(it, g)| {
        format!(" — [{}], iteration {it}", tokenizer().decode(&g.prompt))
    });
    let title = format!("Advantages, every mode, same group{which}");
    super::help::title(ui, &title, "advantages");
    let gn = group.map_or(1, |(_, g)| g.rewards.len());
    bars_plot("advantages", AdvantageMode::GROUP.len(), gn, w)
        .height(170.0)
        .show(ui, |p| {
            let Some((_, g)) = group else { return };
            for (m, mode) in AdvantageMode::GROUP.iter().enumerate() {
                let values = g.advantages.get(mode.name()).cloned().unwrap_or_default();
                let bars: Vec<Bar> = values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| Bar::new((m * (gn + 2) + i) as f64, *v as f64).width(0.8))
                    .collect();
                let colour = PALETTE[m % PALETTE.len()];
                p.bar_chart(BarChart::new(mode.name(), bars).color(colour));
            }
        });
    png_button(ui, ui.min_rect(), "advantages");
}

/// TensorBoard's smoothing: an exponential moving average of the points with weight `w`
/// (NaN points are skipped).
pub fn ema(points: &[[f64; 2]], w: f64) -> Vec<[f64; 2]> {
    let mut last: Option<f64> = None;
    points
        .iter()
        .filter(|p| p[1].is_finite())
        .map(|p| {
            let e = last.map_or(p[1], |prev| w * prev + (1.0 - w) * p[1]);
            last = Some(e);
            [p[0], e]
        })
        .collect()
}

fn small_plot(
    ui: &mut egui::Ui,
    smoothing: f64,
    link: egui::Id,
    w: f32,
    id: &str,
    title: &str,
    series: &[(&str, &Series, Color32)],
) {
    ui.vertical(|ui| {
        super::help::title(ui, title, id);
        let mut pl = plot(id, link, w);
        if id == "length" {
            pl = pl.include_y(0.0);
        }
        pl.show(ui, |p| {
            for (name, s, color) in series {
                if smoothing > 0.0 {
                    // The raw curve faint behind its moving average, as the reward's; the
                    // legend's entry is the average's (in its colour), and hides both.
                    let raw = s.points();
                    let smooth = ema(&raw, smoothing);
                    p.line(unlisted_line(name, raw, color.gamma_multiply(0.25)));
                    p.line(line(name, smooth, *color));
                } else {
                    p.line(line(name, s.points(), *color));
                }
            }
        });
        png_button(ui, ui.min_rect(), id);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(lo: f64, hi: f64, points: f64) -> Vec<String> {
        let marks = nice_grid_spacer(egui_plot::GridInput {
            bounds: (lo, hi),
            base_step_size: (hi - lo) / points * 8.0,
        });
        let label = marks.iter().map(|m| m.step_size).fold(0.0, f64::max);
        let min_label = marks
            .iter()
            .map(|m| m.step_size)
            .filter(|s| (hi - lo) / s * 24.0 <= points * 1.0001)
            .fold(label, f64::min);
        marks
            .iter()
            .filter(|m| m.step_size >= min_label)
            .map(|m| tick_text(*m, &(lo..=hi)))
            .collect()
    }

    /// A length axis of 0…8.5 over 130 points is labelled every 2 (egui_plot's default showed
    /// only "0"); a reward axis's halves have their digit (1.5 read "2" by default); a small KL's
    /// labels never repeat.
    #[test]
    fn axes_get_evenly_spaced_readable_labels() {
        assert_eq!(labels(0.0, 8.5, 130.0), ["0", "2", "4", "6", "8"]);
        assert_eq!(labels(0.0, 2.3, 130.0), ["0", "0.5", "1", "1.5", "2"]);
        let kl = labels(0.0, 0.0024, 130.0);
        let mut dedup = kl.clone();
        dedup.dedup();
        assert_eq!(kl, dedup, "{kl:?}");
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(2.0), 2.0);
        assert_eq!(nice_step(6.0), 10.0);
    }
}

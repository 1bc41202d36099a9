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
        .allow_scroll(false)
}

pub(super) fn line(name: &str, pts: Vec<[f64; 2]>, color: Color32) -> Line<'static> {
    Line::new(name.to_string(), pts).color(color)
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

/// Every response's reward, group by group, one colour per named prompt.
fn group_rewards_plot(app: &GrpoApp, ui: &mut egui::Ui, link: egui::Id, w: f32) {
    let run = &app.run;
    super::help::title(ui, "Group rewards", "groups");
    plot("groups", link, w).show(ui, |p| {
        let mut per_prompt: std::collections::BTreeMap<usize, Vec<[f64; 2]>> = Default::default();
        let g_max = run
            .groups
            .last()
            .and_then(|(_, gs)| gs.iter().map(|g| g.rewards.len()).max())
            .unwrap_or(1);
        // At most ~80 iterations of points: thousands of circles cost more to tessellate
        // than to read.
        let stride = (run.groups.len() / 80).max(1);
        for (it, groups) in run.groups.iter().step_by(stride) {
            for g in groups.iter().take(8) {
                let pts = per_prompt.entry(g.prompt_index).or_default();
                for (i, r) in g.rewards.iter().enumerate() {
                    let jitter = (i as f64 / g_max as f64 - 0.5) * 0.4;
                    pts.push([*it as f64 + jitter, *r as f64]);
                }
            }
        }
        // The legend names the latest iteration's first groups (the inspector's) and gathers
        // every other prompt under one grey entry: never hundreds of rows.
        let named = named_prompts(run);
        for (pi, pts) in per_prompt {
            let (name, colour) = match named.iter().position(|&x| x == pi) {
                Some(k) => {
                    let name = app.train_prompts.get(pi).map_or_else(
                        || format!("prompt {pi}"),
                        |p| format!("[{}]", tokenizer().decode(p)),
                    );
                    (name, PALETTE[k % PALETTE.len()])
                }
                None => ("other prompts".to_string(), Color32::GRAY),
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
                    // The raw curve faint behind its moving average, as the reward's.
                    let raw = s.points();
                    p.line(line(name, ema(&raw, smoothing), *color));
                    p.line(line(name, raw, color.gamma_multiply(0.25)));
                } else {
                    p.line(line(name, s.points(), *color));
                }
            }
        });
        png_button(ui, ui.min_rect(), id);
    });
}

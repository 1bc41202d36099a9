//! The panels. Each `*_ui` reads the app's store and draws; nothing here trains.

use super::store::RunData;
use super::worker::Command;
use super::{GrpoApp, presets};
use crate::config::{AdvantageMode, ConfigError, RunConfig};
use crate::metrics::GroupRecord;
use crate::objective::advantage;
use crate::task::RewardFn;
use egui::{Color32, RichText};
use egui_plot::{Bar, BarChart, Plot};
use std::path::PathBuf;

const ERROR: Color32 = Color32::from_rgb(200, 60, 60);
use super::plots::{bars_plot, line, plot, plot_without_legend, titled, tokenizer};
use super::shapes::PALETTE;

// ---------------------------------------------------------------- config

/// The key a validation error is about.
pub(super) fn error_key(e: &ConfigError) -> String {
    match e {
        ConfigError::InvalidValue { key, .. } | ConfigError::UnknownKey { key, .. } => key.clone(),
        _ => String::new(),
    }
}

pub fn config_ui(app: &mut GrpoApp, ui: &mut egui::Ui) {
    let err = app.field_error.clone();
    let d = &mut app.draft;
    ui.heading("Config");
    ui.horizontal_wrapped(|ui| {
        ui.label("Preset")
            .on_hover_text("Start from a preset in assets/experiments");
        for name in presets() {
            if ui.small_button(name).clicked()
                && let Ok(c) = RunConfig::preset(name)
            {
                *d = c;
            }
        }
    });
    // Validate the draft: a bad value is refused at its field, and the trainer keeps running.
    app.revalidate();
    ui.separator();
    let refusal = app.config_panel.typed_error.clone();
    let refusal = refusal.or_else(|| app.field_error.clone());
    let valid = refusal.is_none();
    let needs_reset = app.needs_reset();
    ui.horizontal(|ui| {
        if ui
            .add_enabled(valid && !needs_reset, egui::Button::new("Apply"))
            .on_hover_text("Send algorithm, optimizer and sampling changes to the running trainer")
            .clicked()
        {
            app.running = Some(app.draft.clone());
            app.send(Command::Update(Box::new(app.draft.clone())));
        }
        if ui
            .add_enabled(valid, egui::Button::new("Reset with this config"))
            .clicked()
        {
            let c = app.draft.clone();
            app.reset(c);
        }
    });
    if needs_reset {
        ui.label(RichText::new("Task, model, seed or device changed: needs a reset").italics());
    }
    if let Some((_, msg)) = &refusal {
        ui.label(
            RichText::new(format!("Not applied: {msg}"))
                .color(ERROR)
                .small(),
        );
    }
    ui.separator();
    ui.horizontal(|ui| {
        let l = ui.label("File");
        ui.add(egui::TextEdit::singleline(&mut app.persisted.save_path).char_limit(4096))
            .labelled_by(l.id);
        if ui
            .button("Save TOML")
            .on_hover_text("Write the config to this file (a download in the browser); drop a .toml file on the window to load one")
            .clicked()
        {
            match super::files::deliver(&app.persisted.save_path, app.draft.to_toml().as_bytes()) {
                Ok(done) => app.notice = Some(done),
                Err(e) => app.error = Some(e),
            }
        }
    });
    ui.horizontal(|ui| {
        if ui
            .button("Copy as one line")
            .on_hover_text("The config as one shareable line: the nearest preset and the keys that differ from it")
            .clicked()
        {
            app.share_string = share_string(&app.draft);
            ui.ctx().copy_text(app.share_string.clone());
        }
        if ui
            .button("Load line")
            .on_hover_text("Paste a shared line into the box, then load it")
            .clicked()
        {
            match parse_share_string(&app.share_string) {
                Ok(c) => app.draft = c,
                Err(e) => app.error = Some(e),
            }
        }
    });
    let l = ui.label("Shared line");
    // Bounded: a whole config is ~2 kB; a paste of megabytes would only cost memory.
    ui.add(
        egui::TextEdit::singleline(&mut app.share_string)
            .char_limit(16 * 1024)
            .hint_text("grpo-lab:{…}"),
    )
    .labelled_by(l.id);
    ui.separator();
    // Every key of the field table, by section, with a search box (the actions above stay in
    // reach however many sections are open).
    super::config_panel::fields_ui(&mut app.config_panel, &mut app.draft, &err, ui);
}

/// The config as one line (TensorFlow Playground style): the nearest preset and the keys
/// that differ from it ([`RunConfig::to_json_line`]).
pub fn share_string(c: &RunConfig) -> String {
    format!("grpo-lab:{}", c.to_json_line())
}

/// A shared line, short (a preset and what differs) or long (a whole config).
pub fn parse_share_string(s: &str) -> Result<RunConfig, String> {
    let json = s
        .trim()
        .strip_prefix("grpo-lab:")
        .ok_or("a shared config starts with `grpo-lab:`")?;
    RunConfig::from_json_line(json).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------- inspector

pub fn inspector_ui(app: &mut GrpoApp, ui: &mut egui::Ui) {
    if app.run.groups.is_empty() {
        ui.label("No groups yet: take a step (the groups of an iteration are logged on its last optimizer step).");
        return;
    }
    let sel = iteration_slider(app, ui);
    let (iteration, groups) = &app.run.groups[sel];
    let gi = app.inspector_group.min(groups.len() - 1);
    let (prompts, clicked) = prompt_strip(ui, groups, gi);
    if let Some(i) = clicked {
        app.inspector_group = i;
    }
    app.tour.mark("prompts", prompts.rect);
    let g = &groups[gi];
    let config = app.running.clone().unwrap_or_default();
    let reward_fn = RewardFn::from_task(&config.task);
    ui.label(format!(
        "iteration {iteration} · prompt [{}] · truth [{}] · driving mode: {}",
        tokenizer().decode(&g.prompt),
        tokenizer().decode(&crate::task::sort::sorted(&g.prompt)),
        config.algorithm.advantage
    ));
    if g.zero_std {
        ui.label(RichText::new("∅ All rewards in this group are equal: no learning signal (every centered advantage is 0).").color(ERROR).strong());
    }
    let mean_length = app.run.group_mean_length.get(sel).copied().unwrap_or(
        g.responses.iter().map(Vec::len).sum::<usize>() as f32 / g.responses.len().max(1) as f32,
    );
    let batch = super::tokens::batch_shape(&config, g.responses.len(), mean_length);
    let marks = egui::ScrollArea::vertical()
        .id_salt("inspector")
        .show(ui, |ui| {
            // Folded by default (each token row says its reward and A; at 1280×800 the token
            // view and the formula card are on screen whole); the guided iteration opens it.
            let to_responses = app.tour.take_scroll("responses");
            let open = to_responses.then_some(true);
            let grid = egui::CollapsingHeader::new(
                "Responses: reward, its parts, the advantage A under every mode",
            )
            .default_open(false)
            .open(open)
            .show(ui, |ui| {
                egui::ScrollArea::horizontal()
                    .id_salt("inspector grid")
                    .show(ui, |ui| responses_grid(ui, g, &config, &reward_fn));
            });
            let responses = grid.header_response.rect.union(
                grid.body_response
                    .map_or(grid.header_response.rect, |b| b.rect),
            );
            ui.separator();
            let (tokens, formula) =
                super::tokens::token_view_ui(&mut app.token_view, ui, g, &config, batch);
            // The guided iteration brings its panel into view (the responses table from its
            // header down: it opens over the next frames).
            if to_responses {
                ui.scroll_to_rect(grid.header_response.rect, Some(egui::Align::TOP));
            }
            for (name, rect) in [("tokens", tokens), ("formula", formula)] {
                if let Some(r) = rect
                    && app.tour.take_scroll(name)
                {
                    ui.scroll_to_rect(r, Some(egui::Align::TOP));
                }
            }
            // What of each panel is in view: the tour frames that, never the part scrolled
            // under the tabs or the top bar.
            let clip = ui.clip_rect();
            [
                ("responses", Some(responses)),
                ("tokens", tokens),
                ("formula", formula),
            ]
            .map(|(name, r)| (name, r.map(|r| r.intersect(clip))))
        })
        .inner;
    for (name, rect) in marks {
        if let Some(r) = rect {
            app.tour.mark(name, r);
        }
    }
}

/// The inspector's choice of a logged iteration (the latest unless one is pinned); its index.
fn iteration_slider(app: &mut GrpoApp, ui: &mut egui::Ui) -> usize {
    let last = app.run.groups.len() - 1;
    let mut sel = app.inspector_iteration.unwrap_or(last).min(last);
    ui.horizontal(|ui| {
        ui.label("Iteration");
        let groups = &app.run.groups;
        if ui
            .add(
                egui::Slider::new(&mut sel, 0..=last)
                    .text("logged iteration")
                    .custom_formatter(|v, _| {
                        groups
                            .get(v as usize)
                            .map(|(i, _)| i.to_string())
                            .unwrap_or_default()
                    }),
            )
            .changed()
        {
            app.inspector_iteration = if sel == last { None } else { Some(sel) };
        }
        if app.inspector_iteration.is_some() && ui.button("follow latest").clicked() {
            app.inspector_iteration = None;
        }
    });
    sel
}

/// The iteration's prompts as one widget, each drawn from its tokens' own text layouts (which
/// repeat across iterations, so a new iteration lays out no text): the selected one
/// highlighted, `∅` after a group with no learning signal; the clicked prompt's index.
fn prompt_strip(
    ui: &mut egui::Ui,
    groups: &[GroupRecord],
    selected: usize,
) -> (egui::Response, Option<usize>) {
    // The prompts' tokens monospace; the label and ∅ (not in the monospace font) proportional.
    let galley = |ui: &egui::Ui, text: &str, mono: bool| {
        let style = if mono {
            egui::TextStyle::Monospace
        } else {
            egui::TextStyle::Body
        };
        super::mono::unwrapped(ui, RichText::new(text), style)
    };
    let label = galley(ui, "Prompt ", false);
    let (pad, gap, width) = (3.0, 6.0, ui.available_width().max(1.0));
    let h = label.size().y + 2.0 * pad;
    // Each prompt's galleys: "[", its tokens, "]", "∅".
    let prompts: Vec<Vec<_>> = groups
        .iter()
        .map(|g| {
            let mut parts = vec![galley(ui, "[", true)];
            for (k, &tok) in g.prompt.iter().enumerate() {
                if k > 0 {
                    parts.push(galley(ui, " ", true));
                }
                parts.push(galley(ui, &tokenizer().decode(&[tok]), true));
            }
            parts.push(galley(ui, "]", true));
            if g.zero_std {
                parts.push(galley(ui, " ∅", false));
            }
            parts
        })
        .collect();
    let sizes: Vec<egui::Vec2> = prompts
        .iter()
        .map(|p| egui::vec2(p.iter().map(|g| g.size().x).sum::<f32>() + 2.0 * pad, h))
        .collect();
    let (rects, size) = super::mono::flow(&sizes, width, label.size().x, 2.0, |_| gap);
    let boxes: Vec<_> = rects.into_iter().zip(prompts).collect();
    let (rect, r) = ui.allocate_exact_size(egui::vec2(width, size.y), egui::Sense::click());
    r.widget_info(|| {
        let all: Vec<String> = groups
            .iter()
            .map(|g| format!("[{}]", tokenizer().decode(&g.prompt)))
            .collect();
        egui::WidgetInfo::labeled(egui::Role::Label, true, format!("Prompt {}", all.join(" ")))
    });
    let at = |p: egui::Pos2| {
        boxes
            .iter()
            .position(|(b, _)| b.translate(rect.min.to_vec2()).contains(p))
    };
    let hovered = r.hover_pos().and_then(at);
    if ui.is_rect_visible(rect) {
        let painter = ui.painter();
        let v = ui.visuals();
        let colour = v.text_color();
        let ly = rect.min.y + pad;
        painter.galley(egui::pos2(rect.min.x, ly), label, colour);
        for (k, (b, parts)) in boxes.iter().enumerate() {
            let b = b.translate(rect.min.to_vec2());
            let mut colour = colour;
            if k == selected {
                painter.rect_filled(b, 3.0, v.selection.bg_fill);
                colour = v.selection.stroke.color;
            } else if hovered == Some(k) {
                painter.rect_filled(b, 3.0, v.widgets.hovered.weak_bg_fill);
            }
            let mut px = b.min.x + pad;
            for p in parts {
                let w = p.size().x;
                // Each part on the box's middle (the label's font is not the tokens').
                let py = b.center().y - p.size().y / 2.0;
                painter.galley(egui::pos2(px, py), p.clone(), colour);
                px += w;
            }
        }
    }
    let clicked = r
        .clicked()
        .then(|| r.interact_pointer_pos().and_then(at))
        .flatten();
    (r, clicked)
}

/// The group's responses: tokens, reward and its parts, the advantage under every mode (the
/// driving one marked).
fn responses_grid(
    ui: &mut egui::Ui,
    g: &crate::metrics::GroupRecord,
    config: &RunConfig,
    reward_fn: &RewardFn,
) {
    egui::Grid::new("inspector")
        .striped(true)
        .num_columns(4 + AdvantageMode::GROUP.len())
        .show(ui, |ui| {
            ui.strong("#");
            ui.strong("response");
            ui.strong("reward");
            ui.strong("parts");
            for m in AdvantageMode::GROUP {
                // Short headers (the section's title says they are advantages), the full name on
                // hover; ◀ marks the mode that drives.
                let short = match m {
                    AdvantageMode::BatchNormalized => "batch-norm.",
                    AdvantageMode::Normalized => "normalized",
                    m => m.name(),
                };
                let t = if *m == config.algorithm.advantage {
                    format!("{short} ◀")
                } else {
                    short.to_string()
                };
                ui.strong(t)
                    .on_hover_text(format!("A under `algorithm.advantage = {}`", m.name()));
            }
            ui.end_row();
            for (i, resp) in g.responses.iter().enumerate() {
                ui.label(i.to_string());
                ui.monospace(tokenizer().decode(resp));
                ui.label(format!("{:.2}", g.rewards[i]));
                let parts = reward_fn.score_logged(config, &g.prompt, resp).parts;
                let parts = parts
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                // Wrapped in a bounded column: a weighted reward's parts are long.
                ui.scope(|ui| {
                    ui.set_max_width(250.0);
                    ui.add(egui::Label::new(RichText::new(parts).small()).wrap());
                });
                for m in AdvantageMode::GROUP {
                    let v = g
                        .advantages
                        .get(m.name())
                        .and_then(|a| a.get(i))
                        .copied()
                        .unwrap_or(f32::NAN);
                    ui.label(format!("{v:+.3}"));
                }
                ui.end_row();
            }
        });
}

// ---------------------------------------------------------------- playground

pub fn playground_ui(app: &mut GrpoApp, ui: &mut egui::Ui) {
    ui.label(
        "Drag the rewards of one group; every advantage mode updates live. No training needed.",
    );
    let rewards = &mut app.persisted.playground_rewards;
    let mut g = rewards.len();
    ui.horizontal(|ui| {
        ui.label("G");
        if ui
            .add(egui::Slider::new(&mut g, 1..=16).text("responses"))
            .changed()
        {
            rewards.resize(g, 0.0);
        }
        if ui
            .button("all equal")
            .on_hover_text("A group with zero variance: no learning signal")
            .clicked()
        {
            rewards.iter_mut().for_each(|r| *r = 1.0);
        }
        if ui
            .button("one success")
            .on_hover_text("Sparse reward: one 1 among 0s")
            .clicked()
        {
            rewards
                .iter_mut()
                .enumerate()
                .for_each(|(i, r)| *r = if i == 0 { 1.0 } else { 0.0 });
        }
    });
    ui.horizontal_wrapped(|ui| {
        for (i, r) in rewards.iter_mut().enumerate() {
            let l = ui.label(format!("r{i}"));
            ui.add(egui::DragValue::new(r).speed(0.05))
                .labelled_by(l.id);
        }
    });
    let all = advantage::all_advantages(rewards, rewards.len());
    let s = all.groups[0];
    ui.label(format!(
        "mean {:.4} · unbiased std {:.4} · max {}{}",
        s.mean,
        s.std,
        s.max,
        if s.zero_std {
            " · all equal: every centered mode gives 0"
        } else {
            ""
        }
    ));
    let formulas = [
        ("raw", "A = r"),
        ("centered", "A = r − mean(r)"),
        (
            "normalized",
            "A = (r − mean) / (std + 1e-5), std unbiased (GRPO)",
        ),
        ("max", "A = r where r = max(r), else 0"),
        ("rloo", "A_i = r_i − mean_{j≠i} r_j"),
        ("batch_normalized", "A = (r − mean) / (batch std + 1e-5)"),
    ];
    egui::Grid::new("playground").striped(true).show(ui, |ui| {
        ui.strong("mode");
        ui.strong("formula");
        ui.strong("advantages");
        ui.end_row();
        for (name, formula) in formulas {
            ui.label(name);
            ui.label(formula);
            let v: Vec<String> = all.by_mode[name]
                .iter()
                .map(|x| format!("{x:+.4}"))
                .collect();
            ui.monospace(v.join("  "));
            ui.end_row();
        }
    });
    bars_plot(
        "playground-bars",
        formulas.len(),
        rewards.len(),
        ui.available_width(),
    )
    .height(200.0)
    .show(ui, |p| {
        let gn = rewards.len();
        for (m, (name, _)) in formulas.iter().enumerate() {
            let bars: Vec<Bar> = all.by_mode[*name]
                .iter()
                .enumerate()
                .map(|(i, v)| Bar::new((m * (gn + 2) + i) as f64, *v as f64).width(0.8))
                .collect();
            p.bar_chart(BarChart::new(*name, bars).color(PALETTE[m % PALETTE.len()]));
        }
    });
    super::shapes::objective_shapes_ui(&app.draft, ui);
}

// ---------------------------------------------------------------- runs

pub fn runs_ui(app: &mut GrpoApp, ui: &mut egui::Ui) {
    runs_path_row(app, ui);
    experiment_row(app, ui);
    if !app.compare.is_empty() {
        compare_ui(app, ui);
        return;
    }
    if ui
        .add_enabled(app.run.steps > 0, egui::Button::new("Keep the current run"))
        .on_hover_text("Add the run in progress to the overlays, then reset with another config to compare them side by side")
        .clicked()
    {
        let mut kept = app.run.clone();
        if let Some(c) = &app.running {
            kept.name = format!("{} · {} · {} · seed {} ({} steps)", c.run.name, c.algorithm.advantage, c.algorithm.loss, c.run.seed, kept.steps);
            kept.config = Some(c.clone());
        }
        app.overlays.push((kept, true));
    }
    let mut remove = None;
    for (i, (r, on)) in app.overlays.iter_mut().enumerate() {
        ui.horizontal(|ui| {
            ui.checkbox(on, &r.name);
            if let Some(c) = &r.config {
                ui.label(
                    RichText::new(format!(
                        "{} · {} · seed {} · {} steps",
                        c.algorithm.advantage, c.algorithm.loss, c.run.seed, r.steps
                    ))
                    .small(),
                );
            }
            if ui.small_button("✖").clicked() {
                remove = Some(i);
            }
        });
    }
    if let Some(i) = remove {
        app.overlays.remove(i);
    }
    overlay_plots(app, ui);
}

/// The run directory to add, and the buttons that add it (or a compare directory).
fn runs_path_row(app: &mut GrpoApp, ui: &mut egui::Ui) {
    // A browser tab reads no directories: the buttons could only fail there.
    if cfg!(target_arch = "wasm32") {
        ui.label(
            egui::RichText::new(
                "Run directories are read from disk by the desktop app; in the browser, ▶ Run in the app below (or Keep the current run) brings runs to compare here.",
            )
            .small(),
        );
        return;
    }
    ui.horizontal(|ui| {
        let l = ui.label("Run directory");
        ui.add(egui::TextEdit::singleline(&mut app.runs_path).char_limit(4096))
            .labelled_by(l.id);
        if ui
            .button("Add")
            .on_hover_text("A directory written by `grpo-lab train`")
            .clicked()
        {
            add_runs(app, false);
        }
        if ui
            .button("Add all inside")
            .on_hover_text("Every run directory inside (a compare directory's runs too)")
            .clicked()
        {
            add_runs(app, true);
        }
        if ui
            .button("Open compare dir")
            .on_hover_text(
                "A directory written by `grpo-lab compare`: each cell as mean ± std over its seeds",
            )
            .clicked()
        {
            match crate::experiment::load_compare_dir(std::path::Path::new(&app.runs_path)) {
                Ok(c) if !c.is_empty() => app.compare = c,
                Ok(_) => app.error = Some(format!("no compare runs in {}", app.runs_path)),
                Err(e) => app.error = Some(e.to_string()),
            }
        }
    });
}

/// The current run and every shown overlay on the same axes: reward, entropy, KL.
fn overlay_plots(app: &mut GrpoApp, ui: &mut egui::Ui) {
    let link = egui::Id::NULL.with("runs-axis");
    let smoothing = app.persisted.smoothing;
    for r in app.overlays.iter_mut().map(|(r, _)| r) {
        r.set_smoothing(smoothing);
    }
    let shown: Vec<&RunData> = std::iter::once(&app.run)
        .filter(|r| r.steps > 0)
        .chain(app.overlays.iter().filter(|(_, on)| *on).map(|(r, _)| r))
        .collect();
    titled(
        ui,
        "Mean reward (smoothed)",
        "Every shown run on the same axes",
    );
    plot("runs-reward", link, ui.available_width()).show(ui, |p| {
        for (k, r) in shown.iter().enumerate() {
            p.line(line(
                &r.name,
                r.reward_smoothed_points(),
                PALETTE[k % PALETTE.len()],
            ));
        }
    });
    titled(ui, "Entropy", "");
    plot("runs-entropy", link, ui.available_width()).show(ui, |p| {
        for (k, r) in shown.iter().enumerate() {
            p.line(line(
                &r.name,
                r.series("entropy").points(),
                PALETTE[k % PALETTE.len()],
            ));
        }
    });
    titled(ui, "KL", "");
    plot("runs-kl", link, ui.available_width()).show(ui, |p| {
        for (k, r) in shown.iter().enumerate() {
            p.line(line(
                &r.name,
                r.series("kl").points(),
                PALETTE[k % PALETTE.len()],
            ));
        }
    });
}

/// Run one of the compiled-in experiments inside the app, seeds one after another (in the
/// browser too); its cells fill the compare view as seeds finish.
fn experiment_row(app: &mut GrpoApp, ui: &mut egui::Ui) {
    ui.horizontal_wrapped(|ui| {
        let l = ui.label("Experiment");
        egui::ComboBox::from_id_salt("experiment-choice")
            .selected_text(app.experiment_choice.clone())
            .show_ui(ui, |ui| {
                for (name, _) in crate::experiment::EXPERIMENTS {
                    ui.selectable_value(&mut app.experiment_choice, name.to_string(), *name);
                }
            })
            .response
            .labelled_by(l.id);
        let running = app.experiment.as_ref().is_some_and(|e| !e.is_done());
        if running {
            if ui.button("■ Stop").clicked() {
                app.experiment = None;
            }
        } else if ui
            .button("▶ Run in the app")
            .on_hover_text("Every cell × seed of the experiment, one run after another, here (the CLI's `grpo-lab compare --experiment NAME` runs them in parallel); the bands fill in as seeds finish")
            .clicked()
        {
            match crate::experiment::Matrix::from_experiment(&app.experiment_choice) {
                Ok(m) => app.start_experiment(m),
                Err(e) => app.error = Some(e.to_string()),
            }
        }
        if let Some(e) = &app.experiment {
            ui.label(RichText::new(e.progress()).small())
                .on_hover_text(e.description.clone());
        }
    });
}

/// A compare directory: every cell's mean over seeds with a ±std band, on linked axes.
fn compare_ui(app: &mut GrpoApp, ui: &mut egui::Ui) {
    ui.horizontal(|ui| {
        ui.label(
            RichText::new(format!(
                "{} cells, mean ± std over seeds",
                app.compare.len()
            ))
            .strong(),
        );
        if ui.button("Close compare view").clicked() {
            app.compare.clear();
        }
    });
    let link = egui::Id::NULL.with("compare-axis");
    let w = ui.available_width();
    egui::ScrollArea::vertical().show(ui, |ui| {
        let mut metrics: Vec<String> = crate::experiment::BAND_METRICS.iter().map(|m| m.to_string()).collect();
        for (_, bands) in &app.compare {
            for m in bands.keys() {
                if !metrics.contains(m) {
                    metrics.push(m.clone());
                }
            }
        }
        for metric in &metrics {
            titled(ui, metric, "Per iteration: the mean over the cell's seeds; the band is ± one standard deviation");
            band_plot(plot(&format!("compare-{metric}"), link, w), ui, metric, &app.compare);
        }
    });
}

/// One metric of every cell: the mean over its seeds per iteration, with a ± std band.
fn band_plot(pl: Plot<'_>, ui: &mut egui::Ui, metric: &str, cells: &crate::experiment::CellBands) {
    pl.show(ui, |p| {
        for (k, (cell, bands)) in cells.iter().enumerate() {
            let Some(pts) = bands.get(metric) else {
                continue;
            };
            let color = PALETTE[k % PALETTE.len()];
            let xs: Vec<f64> = pts.iter().map(|p| p.0).collect();
            let lo: Vec<f64> = pts.iter().map(|p| p.1 - p.2).collect();
            let hi: Vec<f64> = pts.iter().map(|p| p.1 + p.2).collect();
            // The band unnamed but with the line's id: the legend lists the line alone (in its
            // colour; two items of one name and two colours grey its dot), and its one entry
            // per cell shows or hides both.
            p.add(
                egui_plot::FilledArea::new("", &xs, &lo, &hi)
                    .fill_color(color.gamma_multiply(0.15))
                    .id(cell.as_str()),
            );
            p.line(line(cell, pts.iter().map(|p| [p.0, p.1]).collect(), color));
        }
    });
}

// ---------------------------------------------------------------- experiments

/// One card per experiment: the claim and its source, what to look at, the matrix, ▶ Run
/// (every cell × seed, here, a slice of each frame), then the curves with ± std bands and the
/// result table as seeds finish.
pub fn experiments_ui(app: &mut GrpoApp, ui: &mut egui::Ui) {
    ui.label("Each card is one claim of the lectures, tested by a matrix of configs × seeds. ▶ Run trains every cell and seed here, one run after another; the curves (mean ± std over the seeds finished so far) and the table fill in as seeds finish. `grpo-lab compare --experiment NAME` runs the same matrix from the command line, in parallel, and writes the same table to summary.md.");
    ui.add_space(4.0);
    let mut start = None;
    let mut stop = false;
    egui::ScrollArea::vertical().show(ui, |ui| {
        super::lab::card_ui(app, ui);
        ui.add_space(6.0);
        for (ci, m) in app.cards.iter().enumerate() {
            egui::Frame::group(ui.style()).show(ui, |ui| {
                ui.set_width(ui.available_width());
                ui.horizontal(|ui| {
                    ui.label(RichText::new(&m.name).heading());
                    let running = app.experiment.as_ref().is_some_and(|e| e.name == m.name && !e.is_done());
                    if running {
                        if ui.button("■ Stop").clicked() {
                            stop = true;
                        }
                    } else if ui
                        .add_enabled(app.experiment.as_ref().is_none_or(|e| e.is_done()), egui::Button::new("▶ Run"))
                        .on_hover_text(format!("Train every cell × seed here ({} runs), one after another", m.cells().map_or(0, |c| c.len()) * m.seeds.len()))
                        .clicked()
                    {
                        start = Some(ci);
                    }
                });
                if !m.card.claim.is_empty() {
                    ui.label(RichText::new(&m.card.claim).strong());
                    ui.label(RichText::new(format!("Source: {}", m.card.source)).small().italics());
                }
                if !m.card.look_at.is_empty() {
                    ui.label(format!("Look at: {}", m.card.look_at));
                }
                let axes = m.axes.iter().map(|a| format!("{} ∈ {{{}}}", a.key, a.values.join(", "))).collect::<Vec<_>>().join(" × ");
                ui.label(RichText::new(format!("Matrix: preset {} · {} · {} seeds — {}", m.base.run.name, if axes.is_empty() { "no axes".into() } else { axes }, m.seeds.len(), m.description)).small());
                let Some(e) = app.experiment_named(&m.name) else { return };
                ui.label(RichText::new(e.progress()).small().color(if e.error.is_some() { Color32::RED } else { ui.visuals().weak_text_color() }));
                if e.bands.is_empty() {
                    return;
                }
                let metrics: Vec<String> = std::iter::once("reward/mean".to_string()).chain(e.card.plots.iter().cloned()).take(3).collect();
                let w = ((ui.available_width() - 24.0) / metrics.len() as f32).max(160.0);
                let link = egui::Id::NULL.with(("experiment-axis", ci));
                ui.horizontal(|ui| {
                    for metric in &metrics {
                        ui.vertical(|ui| {
                            titled(ui, metric, "Per iteration: the mean over the cell's seeds finished so far; the band is ± one standard deviation");
                            // No legend over a small plot: the table's cell names carry the colours.
                            band_plot(plot_without_legend(&format!("card-{}-{metric}", m.name), link, w).height(150.0), ui, metric, &e.bands);
                        });
                    }
                });
                let columns = e.columns();
                // A wide table scrolls inside the card instead of widening it.
                egui::ScrollArea::horizontal().id_salt(("card-table-scroll", ci)).show(ui, |ui| {
                egui::Grid::new(("card-table", ci)).striped(true).spacing([10.0, 2.0]).show(ui, |ui| {
                    ui.label(RichText::new("cell").strong());
                    ui.label(RichText::new("seeds").strong());
                    for c in &columns {
                        // The metric, then how each run is reduced, on a second line.
                        ui.vertical(|ui| {
                            ui.label(RichText::new(&c.metric).strong());
                            ui.label(RichText::new(c.agg_words()).small());
                        });
                    }
                    ui.end_row();
                    for row in &e.table {
                        // The colour of the cell's curves (bands are listed in the same order).
                        let k = e.bands.iter().position(|(label, _)| label.starts_with(&format!("{} (", row.label))).unwrap_or(0);
                        ui.label(RichText::new(format!("■ {}", row.label)).color(PALETTE[k % PALETTE.len()]));
                        ui.label(row.seeds.to_string());
                        for (mean, std) in &row.values {
                            ui.label(crate::experiment::fmt_mean_std(*mean, *std));
                        }
                        ui.end_row();
                    }
                });
                });
            });
            ui.add_space(6.0);
        }
    });
    if stop {
        app.experiment = None;
    }
    if let Some(ci) = start {
        let m = app.cards[ci].clone();
        app.start_experiment(m);
    }
}

fn add_runs(app: &mut GrpoApp, inside: bool) {
    let root = PathBuf::from(&app.runs_path);
    let dirs: Vec<PathBuf> = if inside {
        // A compare directory keeps its runs under `runs/`.
        let scan = if root.join("runs").is_dir() {
            root.join("runs")
        } else {
            root.clone()
        };
        let mut v: Vec<PathBuf> = std::fs::read_dir(&scan)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.join("metrics.jsonl").exists())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    } else {
        vec![root.clone()]
    };
    if dirs.is_empty() {
        app.error = Some(format!("no run directories in {}", root.display()));
    }
    for d in dirs {
        if app.overlays.iter().any(|(r, _)| r.dir.as_ref() == Some(&d)) {
            continue;
        }
        match RunData::load(&d) {
            Ok(r) => app.overlays.push((r, true)),
            Err(e) => app.error = Some(e),
        }
    }
}

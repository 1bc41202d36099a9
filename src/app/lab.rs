//! The gradient lab's card in the Experiments tab (the desktop app and the browser alike): the
//! lecture17 policy (the exact ∇J) or transformer-sort's (a large-sample ∇J, labelled as such)
//! at an iteration, every estimator against the truth, run a slice of each frame
//! (`lab::gradient::Session`), then its two charts (cosine and SNR against G per advantage
//! mode), its table, the KL estimators and what they show — the numbers
//! `grpo-lab gradient-lab --preset P` prints for the same θ.

use super::GrpoApp;
use super::shapes::PALETTE;
use crate::config::RunConfig;
use crate::lab::gradient::{self, LabArgs, Report, Session};
use egui::{Color32, RichText};
use egui_plot::{Legend, Line, Plot};

/// The presets the card offers: the lecture model (exact) and the transformer (sampled).
pub const LAB_PRESETS: [&str; 2] = ["lecture17", "transformer-sort"];

/// The card's settings and its session.
pub struct LabCard {
    /// The preset studied: one of [`LAB_PRESETS`].
    pub preset: &'static str,
    pub at_iteration: usize,
    pub mu_step: usize,
    pub session: Option<Session>,
}

impl Default for LabCard {
    fn default() -> Self {
        Self {
            preset: LAB_PRESETS[0],
            at_iteration: 20,
            mu_step: 0,
            session: None,
        }
    }
}

impl LabCard {
    /// The lab's arguments for the card's settings: the CLI's defaults; past μ step 0, RLOO
    /// under every objective (so that only the objectives differ), as the CLI does.
    pub fn args(&self, config: &RunConfig) -> LabArgs {
        LabArgs {
            at_iteration: self.at_iteration,
            mu_step: self.mu_step,
            ..LabArgs::for_config(config)
        }
        .off_policy_defaults(false)
    }

    /// Start the lab on the card's preset at its settings.
    pub fn start(&mut self) {
        let config = RunConfig::preset(self.preset).expect("a compiled-in preset");
        let a = self.args(&config);
        self.session = Some(match gradient::trainer_for(config, None) {
            Ok(t) => Session::start(t, &a),
            Err(e) => Session::Failed(e),
        });
    }

    pub fn running(&self) -> bool {
        self.session.as_ref().is_some_and(|s| !s.is_done())
    }

    /// Work for at most `budget` (the frame loop's slice).
    pub fn advance(&mut self, budget: web_time::Duration) {
        if let Some(s) = &mut self.session {
            s.advance(budget);
        }
    }

    /// One line for the status sink (the browser's tests read it): the progress, or the
    /// headline numbers once done.
    pub fn status(&self) -> Option<String> {
        let s = self.session.as_ref()?;
        Some(match s {
            Session::Done(r) => {
                let best = r
                    .estimators
                    .iter()
                    .max_by(|a, b| a.cosine_mean.total_cmp(&b.cosine_mean))
                    .expect("estimators");
                format!(
                    "gradient lab done · exact {} · J {:.5} · ‖∇J‖ {:.5} · best {} G {} cosine {:.4}",
                    r.exact, r.j, r.true_grad_norm, best.name, best.g, best.cosine_mean
                )
            }
            Session::Failed(e) => format!("gradient lab failed: {e}"),
            _ => {
                let (what, done, total) = s.progress();
                format!("gradient lab: {what} {done}/{total}")
            }
        })
    }
}

/// The card: what it shows, its settings and ▶ Run, then the results.
pub fn card_ui(app: &mut GrpoApp, ui: &mut egui::Ui) {
    let card = &mut app.gradient_lab;
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.horizontal(|ui| {
            ui.label(RichText::new("gradient-lab").heading());
            if card.running() {
                if ui.button("■ Stop").clicked() {
                    card.session = None;
                }
            } else if ui
                .button("▶ Run")
                .on_hover_text("Train the preset to the iteration, then draw the batches and set every estimate against ∇J (exact on lecture17, a large-sample estimate on transformer-sort), here")
                .clicked()
            {
                card.start();
            }
            egui::ComboBox::from_id_salt("gradient-lab-preset")
                .selected_text(card.preset)
                .show_ui(ui, |ui| {
                    for p in LAB_PRESETS {
                        ui.selectable_value(&mut card.preset, p, p);
                    }
                })
                .response
                .on_hover_text("lecture17: 125 answers per prompt, enumerated (∇J exact); transformer-sort: answers drawn token by token, ∇J from 2¹⁸ answers with its standard error (~1.5 min in a release build on 2 cores)");
            ui.add(egui::DragValue::new(&mut card.at_iteration).range(0..=100).prefix("at iteration "))
                .on_hover_text("θ_old: the preset's policy after this many iterations (the reference is iteration 0's)");
            ui.add(egui::DragValue::new(&mut card.mu_step).range(0..=9).prefix("μ step "))
                .on_hover_text("θ: θ_old after this many of the next iteration's μ optimizer steps; past 0 the objectives (naive, clipped, CISPO, SAPO, GMPO, GSPO) differ, each with RLOO advantages");
        });
        ui.label(RichText::new("Every estimator against the true gradient: a baseline cuts variance (RLOO without bias; the group mean is RLOO × (G−1)/G); std normalisation bends the direction; at an equal budget larger groups are a better baseline; k1 and k3 estimate the KL without bias, k2 with one.").strong());
        ui.label(RichText::new("Source: GRPO-SPEC §3; Ahmadian et al. 2024 (RLOO); Liu et al. 2025 (Dr. GRPO); Schulman 2020, \"Approximating KL divergence\"").small().italics());
        ui.label("Look at: the cosine and SNR against G per mode (lecture17's 125 answers per prompt are enumerated, so ∇J is exact; transformer-sort's cannot be, so its ∇J is a large-sample estimate whose own error the report states); bias against its noise floor in the table.");
        ui.label(RichText::new(format!("Same numbers as `grpo-lab gradient-lab --preset {} --at-iteration {} --mu-step {}`", card.preset, card.at_iteration, card.mu_step)).small());
        if let Some(line) = card.status() {
            let failed = matches!(card.session, Some(Session::Failed(_)));
            ui.label(RichText::new(line).small().color(if failed { Color32::RED } else { ui.visuals().weak_text_color() }));
        }
        if let Some(r) = card.session.as_ref().and_then(|s| s.report()) {
            report_ui(r, ui);
        }
    });
}

/// The x axis of the lab's plots: log₂ G, each tick labelled with its G (`2`, `4`, … `256`),
/// none past the largest G (the room kept there for the legend).
fn g_axis<'a>(g_max: usize) -> egui_plot::AxisHints<'a> {
    egui_plot::AxisHints::new_x()
        .label("G (group size, log scale)")
        // A tick every doubling: at ~50 points apart they are labelled (the default needs 60).
        .label_spacing(24.0..=40.0)
        .formatter(move |mark, _| {
            let g = mark.value.exp2();
            let whole = (mark.value - mark.value.round()).abs() < 1e-9;
            if whole && mark.value >= 0.0 && g <= g_max as f64 + 0.5 {
                format!("{}", g.round() as u64)
            } else {
                String::new()
            }
        })
}

/// The x axis of plots `w` points wide: log₂ G from the smallest group (at most 1) to past the
/// largest, leaving room on the right for the legend (~185 points); and the largest G.
fn g_range(r: &Report, w: f32) -> (f64, f64, usize) {
    let logs = || r.estimators.iter().map(|e| (e.g.max(1) as f64).log2());
    let g_lo = logs().fold(f64::INFINITY, f64::min).min(1.0);
    let g_max_log = logs().fold(f64::NEG_INFINITY, f64::max).max(g_lo + 1.0);
    let room = (185.0 / w as f64).min(0.6);
    let g_hi = g_lo + (g_max_log - g_lo) / (1.0 - room);
    (g_lo, g_hi, g_max_log.exp2().round() as usize)
}

fn report_ui(r: &Report, ui: &mut egui::Ui) {
    let names = r.estimator_names();
    let w = ((ui.available_width() - 24.0) / 2.0).max(200.0);
    let (g_lo, g_hi, g_max) = g_range(r, w);
    ui.horizontal(|ui| {
        for (title, get) in [
            (
                "cosine to ∇J",
                (|e: &gradient::EstimatorStats| e.cosine_mean) as fn(&_) -> f64,
            ),
            ("SNR  ‖E ĝ‖ / √tr Cov ĝ", |e| e.snr),
        ] {
            ui.vertical(|ui| {
                ui.label(RichText::new(title).strong());
                Plot::new(("gradient-lab", title))
                    .width(w)
                    .height(170.0)
                    .custom_x_axes(vec![g_axis(g_max)])
                    .x_grid_spacer(egui_plot::uniform_grid_spacer(|_| [1.0, 2.0, 4.0]))
                    .y_grid_spacer(super::plots::nice_grid_spacer)
                    .y_axis_formatter(super::plots::tick_text)
                    .legend(Legend::default())
                    // Room on the right for the legend (~170 points): the curves end left of
                    // it instead of running under it.
                    .include_x(g_lo)
                    .include_x(g_hi)
                    .allow_scroll(false)
                    .show(ui, |p| {
                        for (k, name) in names.iter().enumerate() {
                            let pts: Vec<[f64; 2]> = r
                                .estimators
                                .iter()
                                .filter(|e| e.name == *name)
                                .map(|e| [(e.g as f64).log2(), get(e)])
                                .collect();
                            p.line(
                                Line::new(name.to_string(), pts).color(PALETTE[k % PALETTE.len()]),
                            );
                        }
                    });
            });
        }
    });
    ui.label(format!(
        "J(θ) = {:.5} · ‖∇J‖ = {:.5} ({}) · KL(π_θ ‖ π_ref) {} {:.5}: k1 {:.5} ± {:.5}, k2 {:.5} ± {:.5}, k3 {:.5} ± {:.5}",
        r.j,
        r.true_grad_norm,
        if r.exact {
            "exact".to_string()
        } else {
            format!(
                "a large-sample estimate, ± {:.1} %; J ± {:.5}",
                100.0 * r.true_grad_se,
                r.j_se
            )
        },
        if r.exact { "exact" } else { "sampled" },
        r.kl.exact,
        r.kl.k1,
        r.kl.k1_std,
        r.kl.k2,
        r.kl.k2_std,
        r.kl.k3,
        r.kl.k3_std
    ));
    egui::CollapsingHeader::new(format!("table: {} estimators", r.estimators.len()))
        .id_salt("gradient-lab-table")
        .show(ui, |ui| {
            egui::Grid::new("gradient-lab-grid")
                .striped(true)
                .spacing([10.0, 2.0])
                .show(ui, |ui| {
                    for h in [
                        "estimator",
                        "G",
                        "cosine",
                        "SNR",
                        "scale",
                        "bias (floor)",
                        "variance",
                    ] {
                        ui.label(RichText::new(h).strong());
                    }
                    ui.end_row();
                    for e in &r.estimators {
                        ui.label(&e.name);
                        ui.label(e.g.to_string());
                        ui.label(format!("{:.3} ± {:.3}", e.cosine_mean, e.cosine_std));
                        ui.label(format!("{:.3}", e.snr));
                        ui.label(format!("{:.4}", e.scale));
                        ui.label(format!("{:.3} ({:.3})", e.bias, e.bias_floor));
                        ui.label(format!("{:.3}", e.variance));
                        ui.end_row();
                    }
                });
        });
    for c in r.checks() {
        ui.label(RichText::new(format!("• {c}")).small());
    }
}

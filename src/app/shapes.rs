//! The playground's objective shapes: how hard each loss pushes a token's log π, −∂ℓ/∂log π,
//! against the token's ratio r = π/π_old, for A = +1 and A = −1. Each point is a one-token
//! response through `objective::loss` itself (`response_terms`), at the knobs of the config
//! being edited (ε, δ, the dual clip, CISPO's cap, SAPO's τ), so the curves are the trained
//! ones; the clip edges are drawn where the clipped loss has them.

use crate::config::{ImportanceSamplingLevel, LossAggMode, LossMode, RunConfig};
use crate::objective::loss::{LossSettings, response_terms};
use egui::Color32;
use egui_plot::{Legend, Line, Plot, PlotPoints, VLine};

/// The app's palette (every plot's series colours; here a colour per loss).
pub(super) const PALETTE: [Color32; 8] = [
    Color32::from_rgb(31, 119, 180),
    Color32::from_rgb(255, 127, 14),
    Color32::from_rgb(44, 160, 44),
    Color32::from_rgb(214, 39, 40),
    Color32::from_rgb(148, 103, 189),
    Color32::from_rgb(140, 86, 75),
    Color32::from_rgb(227, 119, 194),
    // Cyan, not Tableau's grey: grey is the plots' "other prompts" and reference lines.
    Color32::from_rgb(23, 190, 207),
];
use PALETTE as COLORS;

/// Every per-token loss, with its formula (ℓ, minimised).
pub const LOSSES: [(LossMode, &str); 6] = [
    (LossMode::Naive, "naive: −A·log π"),
    (LossMode::Unclipped, "unclipped: −A·r"),
    (
        LossMode::Clipped,
        "clipped (PPO): −min(rA, clip(r, 1−ε_low, 1+ε_high)A)",
    ),
    (LossMode::Cispo, "cispo: −sg(min(r, cap))·A·log π"),
    (LossMode::Sapo, "sapo: −(4/τ)·σ(τ(r−1))·A"),
    (
        LossMode::Gmpo,
        "gmpo: −A·exp(clip(log r, −ε_low, ε_high)), one token",
    ),
];

/// The ratios drawn.
const R_MIN: f32 = 0.25;
const R_MAX: f32 = 2.0;
const POINTS: usize = 176;

/// One loss's settings for a one-token response at a config's knobs: its own mode, at the
/// token level, no KL, no entropy terms, weight 1.
pub fn settings(c: &RunConfig, mode: LossMode) -> LossSettings {
    let base = LossSettings::of(c);
    // The dual clip and δ extend the clipped loss only (the config's rule).
    let clipped = mode == LossMode::Clipped;
    LossSettings {
        mode,
        level: ImportanceSamplingLevel::Token,
        agg: LossAggMode::SeqMeanTokenMean,
        beta: 0.0,
        entropy_coef: 0.0,
        top_entropy_quantile: 1.0,
        dual_clip: if clipped { base.dual_clip } else { 0.0 },
        delta: if clipped { base.delta } else { 0.0 },
        bug_ratio_quotient: false,
        unfrozen_old_policy: false,
        shared_reference: false,
        ..base
    }
}

/// −∂ℓ/∂log π of one token with ratio `r` and advantage `a` (log π_old = 0, log π = ln r).
pub fn push(s: &LossSettings, a: f32, r: f32) -> f32 {
    let t = response_terms(s, &[r.ln()], &[0.0], &[0.0], a);
    -t.dlogp[0]
}

/// The two plots (A = +1, A = −1) and the formulas.
pub fn objective_shapes_ui(c: &RunConfig, ui: &mut egui::Ui) {
    ui.add_space(8.0);
    ui.heading("Objective shapes");
    ui.label(format!(
        "How hard each loss pushes a token's log π (−∂ℓ/∂log π; up = more likely) against its ratio r = π/π_old, at the config's knobs: ε {} / {}, CISPO cap {}, SAPO τ {} / {}{}{}. Flat at 0 = the token's gradient is gone (clipped).",
        c.algorithm.epsilon_low,
        c.algorithm.epsilon_high,
        c.algorithm.cispo_max_ratio,
        c.algorithm.sapo_temperature_pos,
        c.algorithm.sapo_temperature_neg,
        if c.algorithm.dual_clip > 0.0 { format!(", dual clip {}", c.algorithm.dual_clip) } else { String::new() },
        if c.algorithm.delta > 0.0 { format!(", δ {}", c.algorithm.delta) } else { String::new() },
    ));
    let settings: Vec<LossSettings> = LOSSES.iter().map(|(m, _)| settings(c, *m)).collect();
    let (lo, hi) = (
        1.0 - c.algorithm.epsilon_low,
        1.0 + c.algorithm.epsilon_high,
    );
    let width = (ui.available_width() / 2.0 - 8.0).max(200.0);
    ui.horizontal(|ui| {
        for a in [1.0f32, -1.0] {
            ui.vertical(|ui| {
                ui.strong(if a > 0.0 {
                    "A = +1 (a good answer)"
                } else {
                    "A = −1 (a bad answer)"
                });
                Plot::new(format!("shape-{a}"))
                    .width(width)
                    .height(230.0)
                    .legend(Legend::default())
                    .allow_scroll(false)
                    .x_axis_label("r = π/π_old")
                    .show(ui, |p| {
                        p.vline(VLine::new("clip edges", lo).color(Color32::GRAY));
                        p.vline(VLine::new("clip edges", hi).color(Color32::GRAY));
                        for (k, (mode, _)) in LOSSES.iter().enumerate() {
                            let pts: PlotPoints = (0..=POINTS)
                                .map(|i| {
                                    let r = R_MIN + (R_MAX - R_MIN) * i as f32 / POINTS as f32;
                                    [r as f64, push(&settings[k], a, r) as f64]
                                })
                                .collect();
                            p.line(Line::new(mode.name(), pts).color(COLORS[k]).width(1.6));
                        }
                    });
            });
        }
    });
    egui::Grid::new("shape-formulas").show(ui, |ui| {
        for (k, (_, formula)) in LOSSES.iter().enumerate() {
            ui.colored_label(COLORS[k], "■");
            ui.label(*formula);
            ui.end_row();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shapes_are_the_losses_own_gradients() {
        let c = RunConfig::preset("lecture17").unwrap();
        let mut c = c
            .with_overrides(&[
                "algorithm.epsilon_low=0.2".into(),
                "algorithm.epsilon_high=0.2".into(),
            ])
            .unwrap();
        c.algorithm.cispo_max_ratio = 1.5;
        let s = |m| settings(&c, m);
        let near = |x: f32, y: f32| assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        // naive: −A·log π pushes by A at any ratio; unclipped: by A·r.
        near(push(&s(LossMode::Naive), 1.0, 1.7), 1.0);
        near(push(&s(LossMode::Unclipped), -1.0, 1.5), -1.5);
        // PPO: inside the range A·r; past 1 + ε for A > 0 (below 1 − ε for A < 0) nothing.
        near(push(&s(LossMode::Clipped), 1.0, 1.1), 1.1);
        near(push(&s(LossMode::Clipped), 1.0, 1.3), 0.0);
        near(push(&s(LossMode::Clipped), -1.0, 0.7), 0.0);
        near(push(&s(LossMode::Clipped), -1.0, 1.3), -1.3);
        // CISPO keeps the gradient past the cap, with the capped weight.
        near(push(&s(LossMode::Cispo), 1.0, 1.9), 1.5);
        // SAPO at r = 1: slope 1, the push is A·r·4σ(1−σ) = 1.
        near(push(&s(LossMode::Sapo), 1.0, 1.0), 1.0);
        // GMPO on one token: PPO's clip in log space (e^0.2 ≈ 1.221 > 1.2).
        near(push(&s(LossMode::Gmpo), 1.0, 1.21), 1.21);
        near(push(&s(LossMode::Gmpo), 1.0, 1.25), 0.0);
    }
}

//! The inspector's token view and formula card (#28 §1–2): every response of a logged group as
//! a row of tokens, each coloured by a chosen quantity (its share of the objective, advantage,
//! ratio with the clipped tokens marked, KL term, entropy, Cov(log π, A) term), a hover with
//! every number of the token; and, for the clicked token, the configured objective written out
//! with its numbers step by step to its contribution to the loss, beside a second objective's
//! for the same token. The numbers are `objective::explain`'s (the engines' own text).

use super::plots::tokenizer;
use crate::config::RunConfig;
use crate::metrics::GroupRecord;
use crate::objective::explain::{
    self, AdvantageInputs, BatchShape, COMPARE, GroupInputs, GroupTerms, Quantity, Step,
};
use crate::objective::loss::LossSettings;
use egui::{Color32, RichText};

/// What the token view shows.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenView {
    pub quantity: Quantity,
    /// The clicked token: (response, position).
    pub selected: Option<(usize, usize)>,
    /// The objective the formula card compares with (an index into `explain::COMPARE`).
    pub compare: Option<usize>,
}

impl Default for TokenView {
    fn default() -> Self {
        Self {
            quantity: Quantity::Contribution,
            selected: Some((0, 0)),
            compare: None,
        }
    }
}

/// A token's colour for `x` in [−1, 1] (of the group's largest) under `q`.
pub fn colour(q: Quantity, x: f32) -> Color32 {
    if !x.is_finite() {
        return Color32::TRANSPARENT;
    }
    let a = (x.abs().clamp(0.0, 1.0) * 170.0) as u8;
    let (pos, neg) = match q {
        // Raises the loss (the update makes the token less likely) / lowers it.
        Quantity::Contribution => ((220, 50, 47), (38, 139, 210)),
        Quantity::Advantage => ((40, 160, 60), (220, 50, 47)),
        // Likelier than at the rollout / less likely.
        Quantity::Ratio => ((230, 140, 20), (120, 80, 200)),
        Quantity::Kl => ((230, 140, 20), (38, 139, 210)),
        Quantity::Entropy => ((20, 160, 160), (20, 160, 160)),
        // Lowers the entropy / raises it.
        Quantity::Covariance => ((220, 50, 47), (38, 139, 210)),
    };
    let (r, g, b) = if x > 0.0 { pos } else { neg };
    Color32::from_rgba_unmultiplied(r, g, b, a)
}

/// How to read the colours of `q`, one line.
fn reading(q: Quantity) -> &'static str {
    match q {
        Quantity::Contribution => {
            "red raises the loss (the update makes that token less likely), blue lowers it (likelier); pale: little weight or a clipped token"
        }
        Quantity::Advantage => {
            "green: better than the group (A > 0), red: worse; every token of a response shares its A (except GAE)"
        }
        Quantity::Ratio => {
            "orange: likelier now than at the rollout (ρ > 1), purple: less likely; ✂ marks a token the clip holds (no gradient)"
        }
        Quantity::Kl => {
            "orange: the policy has moved away from the reference at this token; the estimator's own sign for k1"
        }
        Quantity::Entropy => {
            "deeper: the policy was less sure at this position (the entropy over the vocabulary)"
        }
        Quantity::Covariance => {
            "red lowers the entropy (a likely token with A above the mean, or an unlikely one below), blue raises it"
        }
    }
}

/// The step's batch shape as `config` draws it, for a logged iteration whose responses were
/// `mean_length` tokens long on average.
pub fn batch_shape(config: &RunConfig, g: usize, mean_length: f32) -> BatchShape {
    let train = match config.task.prompts.len() {
        0 => config.task.train_size,
        n => n,
    };
    let parts = config.algorithm.steps_per_generation.max(1);
    let responses = (config.batch_prompts(train) * g / parts).max(1);
    BatchShape {
        responses,
        tokens: ((responses as f32 * mean_length).round() as usize).max(1),
    }
}

/// The group's tokens under `s`.
pub fn group_terms(
    s: &LossSettings,
    g: &GroupRecord,
    advantages: &[f32],
    batch: BatchShape,
) -> GroupTerms {
    GroupTerms::of(
        s,
        &GroupInputs {
            logp: &g.logp,
            old_logp: &g.old_logp,
            ref_logp: &g.ref_logp,
            entropy: &g.entropy,
            advantages,
        },
        batch,
    )
}

/// The advantage each response of `g` was trained with (the logged driving one, else its mode's).
pub fn driving(g: &GroupRecord, config: &RunConfig) -> Vec<f32> {
    if g.driving.len() == g.responses.len() {
        return g.driving.clone();
    }
    g.advantages
        .get(config.algorithm.advantage.name())
        .cloned()
        .unwrap_or_else(|| vec![0.0; g.responses.len()])
}

/// The token view of a logged group, then the formula card of its clicked token; where the
/// token rows and the card were drawn (for the guided iteration).
pub fn token_view_ui(
    view: &mut TokenView,
    ui: &mut egui::Ui,
    g: &GroupRecord,
    config: &RunConfig,
    batch: BatchShape,
) -> (Option<egui::Rect>, Option<egui::Rect>) {
    if g.logp.is_empty() {
        ui.label("This group's tokens were not trained on this iteration (the replay buffer replaced it): no per-token numbers.");
        return (None, None);
    }
    let s = LossSettings::of(config);
    let adv = driving(g, config);
    let terms = group_terms(&s, g, &adv, batch);
    ui.horizontal_wrapped(|ui| {
        ui.label("Colour tokens by");
        for q in Quantity::ALL {
            let known = match q {
                Quantity::Kl => terms.has_ref,
                Quantity::Entropy => terms.has_entropy,
                Quantity::Covariance => !g.cov_terms.is_empty(),
                _ => true,
            };
            let r = ui.add_enabled(known, egui::RadioButton::new(view.quantity == q, q.name()));
            let r = if known {
                r
            } else {
                r.on_disabled_hover_text(match q {
                    Quantity::Entropy => "this engine keeps each token's entropy on its device",
                    Quantity::Covariance => {
                        "set run.entropy_dynamics = true to log each token's covariance term"
                    }
                    _ => "this log has no log π_ref per token",
                })
            };
            if r.clicked() {
                view.quantity = q;
            }
        }
    });
    let q = view.quantity;
    let scale = terms.scale(q, &g.cov_terms);
    legend(ui, q, scale);
    let sel = view
        .selected
        .filter(|&(i, t)| terms.at(i, t).is_some())
        .or(Some((0, 0)));
    view.selected = sel;
    let rows = egui::ScrollArea::vertical()
        .id_salt("token rows")
        .max_height(260.0)
        .show(ui, |ui| {
            for (i, resp) in g.responses.iter().enumerate() {
                ui.horizontal_wrapped(|ui| {
                    ui.spacing_mut().item_spacing.x = 4.0;
                    ui.monospace(format!(
                        "#{i:<2} r {:>5.2} A {:>+6.2} │",
                        g.rewards.get(i).copied().unwrap_or(f32::NAN),
                        adv.get(i).copied().unwrap_or(f32::NAN)
                    ));
                    for (t, &tok) in resp.iter().enumerate() {
                        if let Some(clicked) =
                            token_chip(ui, view, &s, &terms, g, (i, t), tok, scale)
                        {
                            view.selected = Some(clicked);
                        }
                    }
                });
            }
        });
    for c in &terms.caveats {
        ui.label(RichText::new(format!("Note: {c}.")).small().weak());
    }
    ui.separator();
    let card = view.selected.map(|(i, t)| {
        ui.scope(|ui| formula_card(view, ui, g, config, &s, &terms, (i, t), batch))
            .response
            .rect
    });
    (Some(rows.inner_rect), card)
}

/// One token as a coloured chip; `Some(at)` when clicked.
#[allow(clippy::too_many_arguments)]
fn token_chip(
    ui: &mut egui::Ui,
    view: &TokenView,
    s: &LossSettings,
    terms: &GroupTerms,
    g: &GroupRecord,
    (i, t): (usize, usize),
    tok: u32,
    scale: f32,
) -> Option<(usize, usize)> {
    let q = view.quantity;
    let text = tokenizer().decode(&[tok]);
    if terms.at(i, t).is_none() {
        ui.monospace(RichText::new(text).weak());
        return None;
    }
    let v = terms.value(q, i, t, &g.cov_terms);
    let x = if q == Quantity::Ratio { v.ln() } else { v } / scale;
    let clipped = terms.clipped(s, i, t);
    let mut rich = RichText::new(if clipped {
        format!(" {text}✂")
    } else {
        format!(" {text} ")
    })
    .monospace();
    if view.selected == Some((i, t)) {
        rich = rich.strong().underline();
    }
    // The colour is painted behind the text rather than laid out with it: the text's layout
    // then repeats across tokens, groups and steps (egui's galley cache hits), and a new
    // group costs no new layouts — the view's share of a frame when the trainer logs.
    let galley = egui::WidgetText::from(rich).into_galley(
        ui,
        Some(egui::TextWrapMode::Extend),
        f32::INFINITY,
        egui::TextStyle::Monospace,
    );
    let (rect, r) = ui.allocate_exact_size(galley.size(), egui::Sense::click());
    r.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Label, true, galley.text()));
    if ui.is_rect_visible(rect) {
        ui.painter().rect_filled(rect, 0.0, colour(q, x));
        ui.painter().galley(
            rect.min,
            galley,
            ui.visuals().widgets.style(&r).text_color(),
        );
    }
    // The hover's text is built only while it shows.
    let r = r.on_hover_ui(|ui| {
        ui.label(hover(terms, g, (i, t), &text, clipped));
    });
    r.clicked().then_some((i, t))
}

/// Every number of a token, for its hover.
fn hover(
    terms: &GroupTerms,
    g: &GroupRecord,
    (i, t): (usize, usize),
    text: &str,
    clipped: bool,
) -> String {
    let Some(k) = terms.at(i, t) else {
        return String::new();
    };
    let x = &terms.terms;
    let mut out = format!(
        "token {t} of response {i}: {text}\nlog π_old {:.4} → log π {:.4}\nρ {:.4}",
        terms.old_logp[k], terms.logp[k], x.ratio[k]
    );
    if let Some(sr) = x.seq_ratio.get(k) {
        out += &format!(" (the response's {sr:.4})");
    }
    if clipped {
        out += " ✂ clipped: no gradient through the ratio";
    }
    out += &format!(
        "\nA {:+.4}\nℓ_t {:+.5}  ∂ℓ {:+.4}\nweight w_t {:.3e}\ncontribution {:+.3e}",
        x.adv[k], x.term[k], x.dterm[k], x.weight[k], terms.contribution[k]
    );
    if terms.has_ref {
        out += &format!(
            "\nlog π_ref {:.4}  KL_t {:.5}",
            terms.ref_logp[k], x.kl_tokens[k]
        );
    }
    if terms.has_entropy {
        out += &format!("\nentropy H_t {:.4}", terms.entropy[k]);
    }
    if let Some(c) = g.cov_terms.get(i).and_then(|c| c.get(t)) {
        out += &format!("\nCov(log π, A) term {c:+.5}");
    }
    out + "\n(click: the formula with these numbers)"
}

/// The colour scale of `q`: its two ends and what they mean.
fn legend(ui: &mut egui::Ui, q: Quantity, scale: f32) {
    ui.horizontal_wrapped(|ui| {
        let (lo, hi) = match q {
            Quantity::Ratio => (
                format!("{:.3}", (-scale).exp()),
                format!("{:.3}", scale.exp()),
            ),
            Quantity::Entropy => ("0".to_string(), format!("{scale:.3}")),
            _ => (format!("{:+.3e}", -scale), format!("{:+.3e}", scale)),
        };
        ui.small(lo);
        let (rect, _) = ui.allocate_exact_size(egui::vec2(160.0, 12.0), egui::Sense::hover());
        let steps = 16;
        for k in 0..steps {
            let x = -1.0 + 2.0 * (k as f32 + 0.5) / steps as f32;
            let x = if q.diverging() { x } else { (x + 1.0) / 2.0 };
            let w = rect.width() / steps as f32;
            let r = egui::Rect::from_min_size(
                rect.min + egui::vec2(k as f32 * w, 0.0),
                egui::vec2(w, rect.height()),
            );
            ui.painter().rect_filled(r, 0.0, colour(q, x));
        }
        ui.small(hi);
        ui.small(RichText::new(reading(q)).weak());
    });
}

/// The clicked token's formula card, and the compared objective's beside it.
#[allow(clippy::too_many_arguments)]
fn formula_card(
    view: &mut TokenView,
    ui: &mut egui::Ui,
    g: &GroupRecord,
    config: &RunConfig,
    s: &LossSettings,
    terms: &GroupTerms,
    (i, t): (usize, usize),
    batch: BatchShape,
) {
    let tok = g.responses[i].get(t).copied().unwrap_or(0);
    let a = &config.algorithm;
    ui.horizontal_wrapped(|ui| {
        ui.strong(format!(
            "Formula for token {t} (\"{}\") of response #{i}",
            tokenizer().decode(&[tok])
        ));
        ui.label(
            RichText::new(format!(
                "loss {} · level {} · {} · KL {} β {} · advantage {}",
                a.loss,
                a.importance_sampling_level,
                a.loss_agg_mode,
                a.kl_estimator,
                a.beta,
                a.advantage
            ))
            .small(),
        );
    });
    ui.horizontal(|ui| {
        let l = ui.label("compare with");
        egui::ComboBox::from_id_salt("compare objective")
            .selected_text(view.compare.map_or("none", |c| COMPARE[c].name))
            .show_ui(ui, |ui| {
                ui.selectable_value(&mut view.compare, None, "none");
                for (k, v) in COMPARE.iter().enumerate() {
                    ui.selectable_value(&mut view.compare, Some(k), v.name);
                }
            })
            .response
            .labelled_by(l.id);
    });
    let adv = explain::advantage_step(
        &AdvantageInputs {
            mode: a.advantage,
            rewards: &g.rewards,
        },
        i,
        terms.terms.adv[i * terms.t],
    );
    let mut mine = vec![adv];
    mine.extend(explain::token_steps(s, terms, i, t));
    let theirs = view.compare.map(|c| {
        let s2 = explain::compared(s, c);
        let t2 = group_terms(&s2, g, &driving(g, config), batch);
        let mut steps = vec![mine[0].clone()];
        steps.extend(explain::token_steps(&s2, &t2, i, t));
        (COMPARE[c].name, steps)
    });
    match &theirs {
        Some((name, steps)) if ui.available_width() >= 640.0 => {
            ui.columns(2, |cols| {
                steps_ui(&mut cols[0], "configured", &mine, Some(steps));
                steps_ui(&mut cols[1], name, steps, Some(&mine));
            });
        }
        Some((name, steps)) => {
            steps_ui(ui, "configured", &mine, Some(steps));
            steps_ui(ui, name, steps, Some(&mine));
        }
        None => steps_ui(ui, "configured", &mine, None),
    }
}

/// One objective's steps; a step whose formula or value differs from `other`'s is highlighted.
fn steps_ui(ui: &mut egui::Ui, title: &str, steps: &[Step], other: Option<&Vec<Step>>) {
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.strong(title);
        for st in steps {
            let twin = other.and_then(|o| o.iter().find(|x| x.what == st.what));
            let differs = match (other, twin) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(_), Some(x)) => x.formula != st.formula || !same(x.value, st.value),
            };
            let head = RichText::new(format!("{} = {}", st.what, number(st.value))).strong();
            let head = if differs {
                head.background_color(Color32::from_rgba_unmultiplied(240, 200, 40, 90))
            } else {
                head
            };
            ui.label(head);
            ui.label(RichText::new(&st.formula).monospace());
            ui.label(
                RichText::new(format!("  = {}", st.numbers))
                    .monospace()
                    .small()
                    .weak(),
            );
        }
    });
}

fn same(a: f32, b: f32) -> bool {
    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-6 * a.abs().max(b.abs())
}

fn number(v: f32) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e4) {
        format!("{v:+.4e}")
    } else {
        format!("{v:+.4}")
    }
}

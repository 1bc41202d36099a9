//! The inspector's token view and formula card (#28 §1–2): every response of a logged group as
//! a row of tokens, each coloured by a chosen quantity (its share of the objective, advantage,
//! ratio with the clipped tokens marked, KL term, entropy, Cov(log π, A) term), a hover with
//! every number of the token; and, for the clicked token, the configured objective written out
//! with its numbers step by step to its contribution to the loss, beside a second objective's
//! for the same token. The numbers are `objective::explain`'s (the engines' own text).

use super::mono;
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

/// The token view's name of `q`. The first quantity is coloured by what the step does to the
/// token (see [`token_value`]), not by its share of the loss the quantity's own name says.
pub fn quantity_label(q: Quantity) -> &'static str {
    match q {
        Quantity::Contribution => "update: −∂L/∂log π",
        q => q.name(),
    }
}

/// The number a token is coloured by under `q`: `value` (the quantity's own) except for the
/// objective, coloured by `update` = −∂L/∂log π_t, the step's push on the token's log-prob.
///
/// Not by the sign of its contribution w·ℓ: that sign says nothing of the direction. The naive
/// loss ℓ = −A·log π is positive for a token with A > 0 (log π < 0) — one the step makes
/// likelier — and so is the clipped loss's −ρ·A for one with A < 0 — one it makes less likely.
/// −∂L/∂log π is positive exactly when a gradient step raises log π (the token gets likelier)
/// under every loss: the weight, the clip (0 where it holds), the KL's pull and a sequence
/// ratio's coupling are in it. (The entropy bonus acts through the whole distribution, not
/// through this token's log π: it is not.)
pub fn token_value(q: Quantity, terms: &GroupTerms, i: usize, t: usize, cov: &[Vec<f32>]) -> f32 {
    match (q, terms.at(i, t)) {
        (Quantity::Contribution, Some(k)) => update(terms, k),
        (Quantity::Contribution, None) => f32::NAN,
        (q, _) => terms.value(q, i, t, cov),
    }
}

/// −∂L/∂log π_t at `[G·T]` index `k` (0 where the loss has no derivative recorded).
fn update(terms: &GroupTerms, k: usize) -> f32 {
    terms.terms.dlogp.get(k).map_or(0.0, |d| -d)
}

/// The colour scale's end for `q`: the group's largest |value| of what the tokens are coloured
/// by (for the ratio, the largest |log ρ|).
pub fn colour_scale(q: Quantity, terms: &GroupTerms, cov: &[Vec<f32>]) -> f32 {
    if q != Quantity::Contribution {
        return terms.scale(q, cov);
    }
    let mut m = 0.0f32;
    for (i, &len) in terms.lengths.iter().enumerate() {
        for t in 0..len {
            let v = token_value(q, terms, i, t, cov);
            if v.is_finite() {
                m = m.max(v.abs());
            }
        }
    }
    m.max(1e-12)
}

/// A token's colour for `x` in [−1, 1] (of the group's largest) under `q`.
pub fn colour(q: Quantity, x: f32) -> Color32 {
    if !x.is_finite() {
        return Color32::TRANSPARENT;
    }
    let a = (x.abs().clamp(0.0, 1.0) * 170.0) as u8;
    let (pos, neg) = match q {
        // −∂L/∂log π > 0: the step makes the token likelier (blue) / less likely (red).
        Quantity::Contribution => ((38, 139, 210), (220, 50, 47)),
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
            "blue: the step makes the token likelier (−∂L/∂log π > 0), red: less likely; pale: little weight, or a clipped token (no gradient)"
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
            let r = ui.add_enabled(
                known,
                egui::RadioButton::new(view.quantity == q, quantity_label(q)),
            );
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
    let scale = colour_scale(q, &terms, &g.cov_terms);
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
                let head = format!(
                    "#{i:<2} r {:>5.2} A {:>+6.2} |",
                    g.rewards.get(i).copied().unwrap_or(f32::NAN),
                    adv.get(i).copied().unwrap_or(f32::NAN)
                );
                let row = Row {
                    i,
                    head,
                    tokens: resp,
                    scale,
                };
                if let Some(clicked) = token_row(ui, view, &s, &terms, g, row) {
                    view.selected = Some(clicked);
                }
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

/// A token row's item: (position in the response, text, galley, fill).
type RowItem = (Option<usize>, String, std::sync::Arc<egui::Galley>, Color32);

/// One response's row of the token view.
struct Row<'a> {
    i: usize,
    /// Its reward and advantage, before the tokens.
    head: String,
    tokens: &'a [u32],
    /// The colour scale (the group's largest |value|).
    scale: f32,
}

/// A row's items — (position in the response, text, galley, fill) — the head's pieces first
/// (their layouts repeat: see `mono`), then every token; and how many pieces the head has.
fn row_items(
    ui: &egui::Ui,
    view: &TokenView,
    s: &LossSettings,
    terms: &GroupTerms,
    g: &GroupRecord,
    row: &Row<'_>,
) -> (usize, Vec<RowItem>) {
    let (q, i) = (view.quantity, row.i);
    let galley = |ui: &egui::Ui, rich: RichText| {
        // The colour is painted behind the text rather than laid out with it: the text's
        // layout then repeats across tokens, groups and steps (egui's galley cache hits).
        mono::unwrapped(ui, rich, egui::TextStyle::Monospace)
    };
    let head = mono::pieces(&row.head);
    let mut items: Vec<RowItem> = head
        .iter()
        .map(|p| {
            let gl = galley(ui, RichText::new(*p).monospace());
            (None, String::new(), gl, Color32::TRANSPARENT)
        })
        .collect();
    for (t, &tok) in row.tokens.iter().enumerate() {
        let text = tokenizer().decode(&[tok]);
        if terms.at(i, t).is_none() {
            let gl = galley(ui, RichText::new(&text).monospace().weak());
            items.push((None, text, gl, Color32::TRANSPARENT));
            continue;
        }
        let v = token_value(q, terms, i, t, &g.cov_terms);
        let x = if q == Quantity::Ratio { v.ln() } else { v } / row.scale;
        let shown = if terms.clipped(s, i, t) {
            format!(" {text}✂")
        } else {
            format!(" {text} ")
        };
        let mut rich = RichText::new(shown).monospace();
        if view.selected == Some((i, t)) {
            rich = rich.strong().underline();
        }
        items.push((Some(t), text, galley(ui, rich), colour(q, x)));
    }
    (head.len(), items)
}

/// A response as one widget: its head, then each token as a coloured chip, wrapped at the
/// panel's width; the hover shows the numbers of the token under the pointer and a click
/// selects it (`Some(at)`). One widget per row rather than per token: the view's cost per
/// frame is that of its ~G rows, not of its ~G·T tokens.
fn token_row(
    ui: &mut egui::Ui,
    view: &TokenView,
    s: &LossSettings,
    terms: &GroupTerms,
    g: &GroupRecord,
    row: Row<'_>,
) -> Option<(usize, usize)> {
    let (i, gap) = (row.i, 4.0);
    let width = ui.available_width().max(1.0);
    let (head, items) = row_items(ui, view, s, terms, g, &row);
    // The items left to right, wrapping at the width; the head's pieces side by side, a gap
    // after it and after each token.
    let sizes: Vec<egui::Vec2> = items.iter().map(|it| it.2.size()).collect();
    let glue = |k: usize| if k + 1 < head { 0.0 } else { gap };
    let (rects, size) = mono::flow(&sizes, width, 0.0, gap, glue);
    // A little air under the row, so that the chips of two rows do not touch.
    let (rect, r) = ui.allocate_exact_size(egui::vec2(width, size.y + 2.0), egui::Sense::click());
    r.widget_info(|| {
        let tokens: Vec<&str> = items[head..].iter().map(|it| it.1.as_str()).collect();
        egui::WidgetInfo::labeled(
            egui::Role::Label,
            true,
            format!("response {i}: {}", tokens.join(" ")),
        )
    });
    let at = |p: egui::Pos2| {
        rects
            .iter()
            .zip(&items)
            .find(|(b, it)| it.0.is_some() && b.translate(rect.min.to_vec2()).contains(p))
            .and_then(|(_, it)| it.0)
    };
    let hovered = r.hover_pos().and_then(at);
    if ui.is_rect_visible(rect) {
        let painter = ui.painter();
        let text_colour = ui.visuals().text_color();
        for (b, (t, _, gl, fill)) in rects.iter().zip(&items) {
            let b = b.translate(rect.min.to_vec2());
            if *fill != Color32::TRANSPARENT {
                painter.rect_filled(b, 0.0, *fill);
            }
            if t.is_some() && *t == hovered {
                painter.rect_stroke(
                    b,
                    0.0,
                    ui.visuals().widgets.hovered.fg_stroke,
                    egui::StrokeKind::Inside,
                );
            }
            painter.galley(b.min, gl.clone(), text_colour);
        }
    }
    if let Some(t) = hovered {
        // The hover's text is built only while it shows.
        let text = &items[head + t].1;
        let clipped = terms.clipped(s, i, t);
        r.clone().on_hover_ui_at_pointer(|ui| {
            ui.label(hover(terms, g, (i, t), text, clipped));
        });
    }
    // A click without a pointer (a screen reader's) selects the row's first trained token.
    let first = || items.iter().find_map(|it| it.0);
    r.clicked()
        .then(|| match r.interact_pointer_pos() {
            Some(p) => at(p),
            None => first(),
        })
        .flatten()
        .map(|t| (i, t))
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
        "\nA {:+.4}\nℓ_t {:+.5}  ∂ℓ {:+.4}\nweight w_t {:.3e}\ncontribution {:+.3e}\nupdate −∂L/∂log π {:+.3e} ({})",
        x.adv[k],
        x.term[k],
        x.dterm[k],
        x.weight[k],
        terms.contribution[k],
        update(terms, k),
        match update(terms, k) {
            u if u > 0.0 => "the step makes it likelier",
            u if u < 0.0 => "the step makes it less likely",
            _ => "the step leaves it",
        }
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
            Quantity::Ratio => ratio_ends(scale),
            Quantity::Entropy => ("0".to_string(), format!("{scale:.3}")),
            // The scale's floor: every token's value is 0 (a group with no learning signal).
            _ if scale <= 1e-12 => ("0".to_string(), "0 (every token)".to_string()),
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

/// The ratio scale's two ends, ρ = e^(∓scale), with enough digits to tell them from 1 and
/// from each other (`{:.3}` read "1.000 … 1.000" once every ratio was within 1e-3 of 1).
fn ratio_ends(scale: f32) -> (String, String) {
    let scale = scale as f64;
    if scale < 1e-9 {
        // The scale's floor: every ratio is 1 (a first step, before θ moved).
        return ("1".into(), "1 (every ρ = 1)".into());
    }
    // Digits after the point: enough for the scale's first two significant digits.
    let digits = (1.0 - scale.log10().floor()).clamp(3.0, 9.0) as usize;
    let (lo, hi) = ((-scale).exp(), scale.exp());
    (format!("{lo:.digits$}"), format!("{hi:.digits$}"))
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
            let weak = ui.visuals().weak_text_color();
            let look = mono::Look {
                small: true,
                colour: Some(weak),
            };
            mono::label(ui, &format!("  = {}", st.numbers), look);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LossMode;

    /// Two one-token responses, A = +1 and A = −1, under `loss`, at ρ = `ratio`: each token's
    /// colour value under the objective.
    fn update_values(loss: LossMode, ratio: f32) -> Vec<f32> {
        let mut c = RunConfig::preset("lecture17").unwrap();
        c.algorithm.loss = loss;
        c.algorithm.beta = 0.0;
        c.algorithm.entropy_coef = 0.0;
        let s = LossSettings::of(&c);
        let old = (0.5f32).ln();
        let logp = vec![vec![old + ratio.ln()]; 2];
        let old_logp = vec![vec![old]; 2];
        let terms = GroupTerms::of(
            &s,
            &GroupInputs {
                logp: &logp,
                old_logp: &old_logp,
                ref_logp: &[],
                entropy: &[],
                advantages: &[1.0, -1.0],
            },
            BatchShape {
                responses: 2,
                tokens: 2,
            },
        );
        (0..2)
            .map(|i| token_value(Quantity::Contribution, &terms, i, 0, &[]))
            .collect()
    }

    /// The objective's colour is the step's direction on the token, the same for every loss:
    /// blue (likelier) for A > 0, red (less likely) for A < 0. The sign of the contribution
    /// w·ℓ it was coloured by before is the opposite for the naive loss (ℓ = −A·log π > 0 for
    /// A > 0) and the direction for the clipped one (ℓ = −ρ·A < 0): not a direction.
    #[test]
    fn the_objective_colour_is_the_update_direction_for_every_loss() {
        let blue = colour(Quantity::Contribution, 1.0);
        let red = colour(Quantity::Contribution, -1.0);
        assert!(blue.b() > blue.r() && red.r() > red.b(), "{blue:?} {red:?}");
        for loss in [
            LossMode::Naive,
            LossMode::Clipped,
            LossMode::Unclipped,
            LossMode::Cispo,
        ] {
            let v = update_values(loss, 1.0);
            assert!(v[0] > 0.0 && v[1] < 0.0, "{loss:?}: {v:?}");
            let scale = v[0].abs().max(v[1].abs());
            assert_eq!(colour(Quantity::Contribution, v[0] / scale), blue);
            assert_eq!(colour(Quantity::Contribution, v[1] / scale), red);
        }
        // Past the clip (ρ = 2 > 1 + ε for A > 0) the clipped loss gives the token no push:
        // no colour; the naive loss has no clip.
        let clipped = update_values(LossMode::Clipped, 2.0);
        assert_eq!(clipped[0], 0.0);
        assert!(update_values(LossMode::Naive, 2.0)[0] > 0.0);
    }

    /// The ratio scale's ends are readable however close to 1 every ratio is.
    #[test]
    fn the_ratio_legend_shows_enough_digits() {
        assert_eq!(ratio_ends(0.3), ("0.741".into(), "1.350".into()));
        let (lo, hi) = ratio_ends(4e-4);
        assert_eq!((lo.as_str(), hi.as_str()), ("0.99960", "1.00040"));
        let (lo, hi) = ratio_ends(2e-6);
        assert_ne!(lo, hi);
        assert!(hi.starts_with("1.000002"), "{hi}");
        assert_eq!(ratio_ends(1e-12).0, "1");
    }
}

//! "Walk me through one iteration" (#28 §3): GRPO-SPEC §2's steps on the live run — prompts →
//! G samples → rewards → advantages → log π_old / log π_ref → the per-token objective → μ
//! optimizer steps → the record — each highlighting the panel where it happens with a sentence
//! or two that reads this run's own numbers. The panels mark where they drew
//! ([`Tour::mark`]); the tour draws its card and a frame around the marked panel on top.

use super::{GrpoApp, Tab};
use crate::config::RunConfig;
use crate::objective::explain::Quantity;
use egui::{Color32, Rect};

/// Where the tour is, and where the panels drew last frame.
#[derive(Debug, Default)]
pub struct Tour {
    /// The step shown (`None`: no tour).
    pub step: Option<usize>,
    targets: Vec<(&'static str, Rect)>,
    /// The panel a step just entered wants scrolled into view (taken by the panel).
    scroll: Option<&'static str>,
}

impl Tour {
    pub fn start(&mut self) {
        self.step = Some(0);
    }

    pub fn active(&self) -> bool {
        self.step.is_some()
    }

    /// A panel drew at `rect` this frame (kept only while a tour runs). A panel in a scroll
    /// area marks the part of it in view (`Rect::NOTHING` when none is): the frame is drawn on
    /// the window's top layer and would otherwise sit over whatever covers the rest.
    pub fn mark(&mut self, name: &'static str, rect: Rect) {
        if self.step.is_none() {
            return;
        }
        match self.targets.iter_mut().find(|(n, _)| *n == name) {
            Some((_, r)) => *r = rect,
            None => self.targets.push((name, rect)),
        }
    }

    /// Whether the panel `name` should scroll itself into view now (once per step).
    pub fn take_scroll(&mut self, name: &str) -> bool {
        let yes = self.scroll == Some(name);
        if yes {
            self.scroll = None;
        }
        yes
    }

    fn target(&self, name: &str) -> Option<Rect> {
        self.targets
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, r)| *r)
    }

    /// The rectangle the current step frames (`None`: no tour, or its panel is not drawn or
    /// is scrolled out of view).
    pub fn highlighted(&self) -> Option<Rect> {
        let step = STEPS.get(self.step?)?;
        self.target(step.target).filter(|r| r.is_positive())
    }
}

/// One step of the walk: its title, the tab it shows, the panel it highlights, the token
/// view's colour, and its text for a config.
pub struct TourStep {
    pub title: &'static str,
    pub tab: Tab,
    pub target: &'static str,
    pub quantity: Option<Quantity>,
    pub text: fn(&RunConfig) -> String,
}

pub const STEPS: &[TourStep] = &[
    TourStep {
        title: "1 · Choose prompts",
        tab: Tab::Inspector,
        target: "prompts",
        quantity: None,
        text: |c| {
            let drawn = c.batch_prompts(train_prompts(c));
            format!(
                "Each iteration draws its batch of prompts ({}; sampling: {}). The inspector shows {}: click one to see its group. ∅ marks a group with no learning signal.",
                match c.algorithm.prompts_per_iteration {
                    0 => format!("every training prompt, {drawn}"),
                    b => format!("B = {b}"),
                },
                c.algorithm.prompt_sampling,
                if c.run.log_groups >= drawn {
                    format!("all {drawn} of them")
                } else {
                    format!("the first {} of them (run.log_groups)", c.run.log_groups)
                }
            )
        },
    },
    TourStep {
        title: "2 · Roll out G samples",
        tab: Tab::Inspector,
        target: "responses",
        quantity: None,
        text: |c| {
            format!(
                "The policy as it is at the iteration's start (π_old, frozen from here on) samples G = {} responses to each prompt at temperature {}. Each row is one response.",
                c.algorithm.num_generations, c.sampling.temperature
            )
        },
    },
    TourStep {
        title: "3 · Verify: rewards",
        tab: Tab::Inspector,
        target: "responses",
        quantity: None,
        text: |c| {
            format!(
                "The verifier ({}) scores each response; \"parts\" shows its terms. Nothing here is learned: the reward is a program.",
                crate::task::RewardFn::from_task(&c.task).describe()
            )
        },
    },
    TourStep {
        title: "4 · Advantages, every mode",
        tab: Tab::Inspector,
        target: "responses",
        quantity: Some(Quantity::Advantage),
        text: |c| {
            format!(
                "The group's rewards become one advantage per response, here under every mode side by side; ◀ marks the one that drives the update ({}). Equal rewards give every centered mode 0: that group teaches nothing.",
                c.algorithm.advantage
            )
        },
    },
    TourStep {
        title: "5 · log π_old and log π_ref",
        tab: Tab::Inspector,
        target: "tokens",
        quantity: Some(Quantity::Ratio),
        text: |c| {
            format!(
                "Once per iteration every sampled token is scored by π_old (the ratio's denominator) and by the reference π_ref (the KL's, β = {}). Hover a token: both numbers, and the ratio ρ = π_θ/π_old its latest step read.",
                c.algorithm.beta
            )
        },
    },
    TourStep {
        title: "6 · The objective, token by token",
        tab: Tab::Inspector,
        target: "formula",
        quantity: Some(Quantity::Contribution),
        text: |c| {
            format!(
                "Each token adds w_t·(ℓ_t + β·KL_t − c·H_t) to the loss: loss {}, aggregation {}. The colours say what the step does to each token: blue likelier, red less likely. Click a token and its formula fills with its numbers; \"compare with\" puts another objective beside it.",
                c.algorithm.loss, c.algorithm.loss_agg_mode
            )
        },
    },
    TourStep {
        title: "7 · μ optimizer steps",
        tab: Tab::Inspector,
        target: "controls",
        quantity: Some(Quantity::Ratio),
        text: |c| {
            format!(
                "The same rollouts feed μ = {} optimizer steps (× {} mini-batches). +1 Step takes one: the ratios leave 1, and once a token moves past 1 ± ε the clip (✂) stops its gradient. +μ Iteration finishes the iteration.",
                c.algorithm.mu, c.algorithm.steps_per_generation
            )
        },
    },
    TourStep {
        title: "8 · Record, and again",
        tab: Tab::Plots,
        target: "plots",
        quantity: None,
        text: |_| {
            "Every step logs reward, KL, entropy, clip fractions and lengths; each plot's ? says how a healthy and an unhealthy curve look. Then the next iteration draws new prompts. ▶ Play runs them all.".into()
        },
    },
];

/// The task's training prompts: its fixed list, else its generated training set.
fn train_prompts(c: &RunConfig) -> usize {
    match c.task.prompts.len() {
        0 => c.task.train_size,
        n => n,
    }
}

/// Start the tour on the app: one iteration first where none has been logged.
pub fn start(app: &mut GrpoApp) {
    app.tour.start();
    if app.run.groups.is_empty() && !app.finished {
        app.send(super::worker::Command::Iteration);
    }
    enter(app, 0);
}

fn enter(app: &mut GrpoApp, k: usize) {
    let s = &STEPS[k];
    app.tour.step = Some(k);
    app.tour.scroll = Some(s.target);
    app.persisted.tab = s.tab;
    if let Some(q) = s.quantity {
        app.token_view.quantity = q;
    }
}

/// The tour's card and its highlight, over the whole window.
pub fn tour_ui(app: &mut GrpoApp, ctx: &egui::Context) {
    let Some(k) = app.tour.step else {
        return;
    };
    let s = &STEPS[k];
    let config = app.running.clone().unwrap_or_default();
    if let Some(rect) = app.tour.highlighted() {
        ctx.layer_painter(egui::LayerId::new(
            egui::Order::Foreground,
            egui::Id::NULL.with("tour highlight"),
        ))
        .rect_stroke(
            rect.expand(3.0),
            6.0,
            egui::Stroke::new(3.0, Color32::from_rgb(240, 180, 20)),
            egui::StrokeKind::Outside,
        );
    }
    let mut next = Some(k);
    egui::Window::new("Walk through one iteration")
        .id(egui::Id::NULL.with("tour"))
        .anchor(egui::Align2::RIGHT_BOTTOM, egui::vec2(-16.0, -16.0))
        .default_width(380.0)
        .resizable(false)
        .collapsible(false)
        .show(ctx, |ui| {
            ui.strong(format!("{} ({} of {})", s.title, k + 1, STEPS.len()));
            ui.label((s.text)(&config));
            if app.run.groups.is_empty() && s.tab == Tab::Inspector {
                ui.label(egui::RichText::new("(the first iteration is running…)").weak());
            }
            ui.horizontal(|ui| {
                if ui.add_enabled(k > 0, egui::Button::new("◀ Back")).clicked() {
                    next = Some(k - 1);
                }
                if k + 1 < STEPS.len() {
                    if ui.button("Next ▶").clicked() {
                        next = Some(k + 1);
                    }
                } else if ui.button("Done").clicked() {
                    next = None;
                }
                if ui.button("End tour").clicked() {
                    next = None;
                }
            });
        });
    match next {
        Some(n) if n != k => enter(app, n),
        Some(_) => {}
        None => app.tour.step = None,
    }
}

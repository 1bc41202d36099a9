//! The panels. Each `*_ui` reads the app's store and draws; nothing here trains.

use super::store::RunData;
use super::worker::Command;
use super::{GrpoApp, choices, enum_names, presets};
use crate::config::{
    AdvantageMode, ConfigError, LengthReward, LossMode, ModelKind, PromptSampling, RunConfig,
    field_info,
};
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
fn error_key(e: &ConfigError) -> String {
    match e {
        ConfigError::InvalidValue { key, .. } | ConfigError::UnknownKey { key, .. } => key.clone(),
        _ => String::new(),
    }
}

/// One labelled field with its tooltip (label and help from the config's field table) and,
/// when the draft is invalid there, the reason under it.
fn field(
    ui: &mut egui::Ui,
    app_error: &Option<(String, String)>,
    key: &str,
    add: impl FnOnce(&mut egui::Ui, egui::Id),
) {
    fields(ui, app_error, &[key], add)
}

/// One row for a key whose value is one of an enum's names: a combo box of them.
fn enum_field<T: PartialEq + Copy>(
    ui: &mut egui::Ui,
    app_error: &Option<(String, String)>,
    key: &str,
    value: &mut T,
    all: &[T],
    name: fn(T) -> &'static str,
) {
    let names = enum_names(all, name);
    field(ui, app_error, key, |ui, l| combo(ui, l, key, value, &names));
}

/// One row for several keys (labelled by the first; the others' widgets carry their own
/// tooltips via [`hint`]); an error naming any of them shows under it.
fn fields(
    ui: &mut egui::Ui,
    app_error: &Option<(String, String)>,
    keys: &[&str],
    add: impl FnOnce(&mut egui::Ui, egui::Id),
) {
    ui.horizontal(|ui| {
        let l = match field_info(keys[0]) {
            Some(f) => ui.label(f.label).on_hover_text(f.tooltip()),
            None => ui.label(keys[0]),
        };
        add(ui, l.id);
    });
    if let Some((k, msg)) = app_error
        && keys.contains(&k.as_str())
    {
        ui.label(RichText::new(format!("✖ {msg}")).color(ERROR).small());
    }
}

/// A widget's tooltip from its field's help.
fn hint(r: egui::Response, key: &str) -> egui::Response {
    match field_info(key) {
        Some(f) => r.on_hover_text(f.tooltip()),
        None => r,
    }
}

fn combo<T: PartialEq + Copy>(
    ui: &mut egui::Ui,
    label: egui::Id,
    id: &str,
    value: &mut T,
    options: &[(T, &'static str)],
) {
    let current = options
        .iter()
        .find(|(v, _)| v == value)
        .map(|(_, n)| *n)
        .unwrap_or("?");
    egui::ComboBox::from_id_salt(id)
        .selected_text(current)
        .show_ui(ui, |ui| {
            for (v, name) in options {
                ui.selectable_value(value, *v, *name);
            }
        })
        .response
        .labelled_by(label);
}

pub fn config_ui(app: &mut GrpoApp, ui: &mut egui::Ui) {
    let (adv, loss, kl, agg, reward, device, kernels) = choices();
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
    ui.collapsing("Run", |ui| {
        field(ui, &err, "run.seed", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.run.seed)).labelled_by(l);
        });
        field(ui, &err, "run.iterations", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.run.iterations))
                .labelled_by(l);
        });
        field(ui, &err, "run.device", |ui, l| {
            combo(ui, l, "device", &mut d.run.device, &device)
        });
        field(ui, &err, "run.kernels", |ui, l| {
            combo(ui, l, "kernels", &mut d.run.kernels, &kernels)
        });
        field(ui, &err, "run.entropy_dynamics", |ui, l| {
            ui.checkbox(&mut d.run.entropy_dynamics, "").labelled_by(l);
        });
    })
    .header_response
    .on_hover_text("Length, seed, device");
    ui.collapsing("Task", |ui| {
        field(ui, &err, "task.reward", |ui, l| {
            combo(ui, l, "reward", &mut d.task.reward, &reward)
        });
        let aggregations = enum_names(
            crate::config::RewardAggregation::ALL,
            crate::config::RewardAggregation::name,
        );
        field(ui, &err, "task.reward_aggregation", |ui, l| {
            combo(
                ui,
                l,
                "reward-aggregation",
                &mut d.task.reward_aggregation,
                &aggregations,
            )
        });
        field(ui, &err, "task.n", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.task.n)).labelled_by(l);
        });
        field(ui, &err, "task.vocab", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.task.vocab))
                .labelled_by(l);
        });
        if d.task.prompts.is_empty() {
            field(ui, &err, "task.train_size", |ui, l| {
                ui.add(egui::DragValue::new(&mut d.task.train_size))
                    .labelled_by(l);
            });
        } else {
            ui.label(format!(
                "fixed prompts: {}",
                d.task
                    .prompts
                    .iter()
                    .map(|p| format!("[{}]", tokenizer().decode(p)))
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
        field(ui, &err, "task.heldout_size", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.task.heldout_size))
                .labelled_by(l);
        });
    });
    if d.model.kind == ModelKind::Transformer {
        ui.collapsing("Lengths & shaping", |ui| {
            field(ui, &err, "task.max_len", |ui, l| {
                ui.add(egui::DragValue::new(&mut d.task.max_len))
                    .labelled_by(l);
            });
            field(ui, &err, "task.format_reward", |ui, l| {
                ui.add(egui::DragValue::new(&mut d.task.format_reward).speed(0.01))
                    .labelled_by(l);
            });
            let lr = [
                (LengthReward::None, "none"),
                (LengthReward::Kimi, "kimi"),
                (LengthReward::Overlong, "overlong"),
            ];
            field(ui, &err, "task.length_reward", |ui, l| {
                combo(ui, l, "length-reward", &mut d.task.length_reward, &lr)
            });
            field(ui, &err, "task.length_reward_weight", |ui, l| {
                ui.add(egui::DragValue::new(&mut d.task.length_reward_weight).speed(0.01))
                    .labelled_by(l);
            });
            field(ui, &err, "task.overlong_buffer", |ui, l| {
                ui.add(egui::DragValue::new(&mut d.task.overlong_buffer))
                    .labelled_by(l);
            });
        });
    }
    ui.collapsing("Model", |ui| {
        let kinds = [
            (ModelKind::Lecture, "lecture"),
            (ModelKind::Transformer, "transformer"),
        ];
        field(ui, &err, "model.kind", |ui, l| {
            combo(ui, l, "model-kind", &mut d.model.kind, &kinds)
        });
        field(ui, &err, "model.d_model", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.model.d_model))
                .labelled_by(l);
        });
        if d.model.kind == ModelKind::Transformer {
            field(ui, &err, "model.layers", |ui, l| {
                ui.add(egui::DragValue::new(&mut d.model.layers))
                    .labelled_by(l);
            });
            field(ui, &err, "model.heads", |ui, l| {
                ui.add(egui::DragValue::new(&mut d.model.heads))
                    .labelled_by(l);
            });
            field(ui, &err, "model.context", |ui, l| {
                ui.add(egui::DragValue::new(&mut d.model.context))
                    .labelled_by(l);
            });
        }
        field(ui, &err, "model.init_scale", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.model.init_scale).speed(0.01))
                .labelled_by(l);
        });
    });
    egui::CollapsingHeader::new("Algorithm")
        .default_open(true)
        .show(ui, |ui| {
            let transformer = d.model.kind == crate::config::ModelKind::Transformer;
            let a = &mut d.algorithm;
            field(ui, &err, "algorithm.num_generations", |ui, l| {
                ui.add(egui::DragValue::new(&mut a.num_generations))
                    .labelled_by(l);
            });
            let mu_keys = ["algorithm.mu", "algorithm.steps_per_generation"];
            fields(ui, &err, &mu_keys, |ui, l| {
                ui.add(egui::DragValue::new(&mut a.mu)).labelled_by(l);
                let spg = egui::DragValue::new(&mut a.steps_per_generation)
                    .range(1..=1000)
                    .prefix("× mini-batches ");
                hint(ui.add(spg), mu_keys[1]);
            });
            field(ui, &err, "algorithm.advantage", |ui, l| {
                combo(ui, l, "advantage", &mut a.advantage, &adv)
            });
            if a.advantage == crate::config::AdvantageMode::PasskAnalytic {
                field(ui, &err, "algorithm.passk_advantage_k", |ui, l| {
                    ui.add(egui::DragValue::new(&mut a.passk_advantage_k))
                        .labelled_by(l);
                });
            }
            // W-REINFORCE's weights, one row (the field's error names either key).
            field(ui, &err, "algorithm.positive_weight", |ui, l| {
                ui.add(egui::DragValue::new(&mut a.positive_weight).speed(0.01))
                    .labelled_by(l);
                ui.add(
                    egui::DragValue::new(&mut a.negative_weight)
                        .speed(0.01)
                        .prefix("A < 0: "),
                );
            });
            if let Some((k, msg)) = &err
                && k == "algorithm.negative_weight"
            {
                ui.label(RichText::new(format!("✖ {msg}")).color(ERROR).small());
            }
            field(ui, &err, "algorithm.loss", |ui, l| {
                combo(ui, l, "loss", &mut a.loss, &loss)
            });
            let levels = enum_names(
                crate::config::ImportanceSamplingLevel::ALL,
                crate::config::ImportanceSamplingLevel::name,
            );
            field(ui, &err, "algorithm.importance_sampling_level", |ui, l| {
                combo(ui, l, "level", &mut a.importance_sampling_level, &levels)
            });
            // Each loss's own knobs, where that loss is chosen.
            let knobs: &[(&str, f64)] = match a.loss {
                LossMode::Clipped => &[("algorithm.dual_clip", 0.05), ("algorithm.delta", 0.05)],
                LossMode::Cispo => &[("algorithm.cispo_max_ratio", 0.1)],
                LossMode::Sapo => &[
                    ("algorithm.sapo_temperature_pos", 0.01),
                    ("algorithm.sapo_temperature_neg", 0.01),
                ],
                _ => &[],
            };
            for &(key, speed) in knobs {
                let value = match key {
                    "algorithm.dual_clip" => &mut a.dual_clip,
                    "algorithm.delta" => &mut a.delta,
                    "algorithm.cispo_max_ratio" => &mut a.cispo_max_ratio,
                    "algorithm.sapo_temperature_pos" => &mut a.sapo_temperature_pos,
                    _ => &mut a.sapo_temperature_neg,
                };
                field(ui, &err, key, |ui, l| {
                    ui.add(egui::DragValue::new(value).speed(speed))
                        .labelled_by(l);
                });
            }
            field(ui, &err, "algorithm.epsilon_low", |ui, l| {
                ui.add(egui::DragValue::new(&mut a.epsilon_low).speed(0.005))
                    .labelled_by(l);
            });
            field(ui, &err, "algorithm.epsilon_high", |ui, l| {
                ui.add(egui::DragValue::new(&mut a.epsilon_high).speed(0.005))
                    .labelled_by(l);
            });
            field(ui, &err, "algorithm.beta", |ui, l| {
                ui.add(egui::DragValue::new(&mut a.beta).speed(0.001))
                    .labelled_by(l);
            });
            field(ui, &err, "algorithm.kl_estimator", |ui, l| {
                combo(ui, l, "kl", &mut a.kl_estimator, &kl)
            });
            field(ui, &err, "algorithm.ref_period", |ui, l| {
                ui.add(egui::DragValue::new(&mut a.ref_period))
                    .labelled_by(l);
            });
            field(ui, &err, "algorithm.loss_agg_mode", |ui, l| {
                combo(ui, l, "agg", &mut a.loss_agg_mode, &agg)
            });
            let ent_keys = ["algorithm.entropy_coef", "algorithm.adaptive_entropy"];
            fields(ui, &err, &ent_keys, |ui, l| {
                ui.add(egui::DragValue::new(&mut a.entropy_coef).speed(0.001))
                    .labelled_by(l);
                hint(
                    ui.checkbox(&mut a.adaptive_entropy, "adaptive"),
                    ent_keys[1],
                );
            });
            // Skywork-OR1's controller: the target and step on one row, the bounds on the next.
            if a.adaptive_entropy {
                field(ui, &err, "algorithm.entropy_target", |ui, l| {
                    ui.add(egui::DragValue::new(&mut a.entropy_target).speed(0.01))
                        .labelled_by(l);
                    ui.add(
                        egui::DragValue::new(&mut a.entropy_coef_delta)
                            .speed(0.001)
                            .prefix("step ± "),
                    );
                });
                field(ui, &err, "algorithm.entropy_coef_min", |ui, l| {
                    ui.add(egui::DragValue::new(&mut a.entropy_coef_min).speed(0.001))
                        .labelled_by(l);
                    ui.add(
                        egui::DragValue::new(&mut a.entropy_coef_max)
                            .speed(0.01)
                            .prefix("max "),
                    );
                });
            }
            field(ui, &err, "algorithm.top_entropy_quantile", |ui, l| {
                ui.add(egui::DragValue::new(&mut a.top_entropy_quantile).speed(0.01))
                    .labelled_by(l);
            });
            // The covariance rules, where their loss is chosen (Clip-Cov: clipped; KL-Cov:
            // unclipped), with their numbers when one is on.
            if matches!(a.loss, LossMode::Clipped | LossMode::Unclipped) {
                let rules = enum_names(
                    crate::config::CovPenalty::ALL,
                    crate::config::CovPenalty::name,
                );
                field(ui, &err, "algorithm.cov_penalty", |ui, l| {
                    combo(ui, l, "cov-penalty", &mut a.cov_penalty, &rules)
                });
                let knobs: &[(&str, f64)] = match a.cov_penalty {
                    crate::config::CovPenalty::ClipCov => &[
                        ("algorithm.clip_cov_ratio", 1e-4),
                        ("algorithm.clip_cov_lb", 0.05),
                        ("algorithm.clip_cov_ub", 0.05),
                    ],
                    crate::config::CovPenalty::KlCov => &[
                        ("algorithm.kl_cov_ratio", 1e-4),
                        ("algorithm.kl_cov_coef", 0.01),
                    ],
                    crate::config::CovPenalty::None => &[],
                };
                for &(key, speed) in knobs {
                    let value = match key {
                        "algorithm.clip_cov_ratio" => &mut a.clip_cov_ratio,
                        "algorithm.clip_cov_lb" => &mut a.clip_cov_lb,
                        "algorithm.clip_cov_ub" => &mut a.clip_cov_ub,
                        "algorithm.kl_cov_ratio" => &mut a.kl_cov_ratio,
                        _ => &mut a.kl_cov_coef,
                    };
                    field(ui, &err, key, |ui, l| {
                        ui.add(egui::DragValue::new(value).speed(speed))
                            .labelled_by(l);
                    });
                }
            }
            // The two ways of replacing groups without a signal, side by side (one at a time).
            let flat_keys = ["algorithm.dynamic_sampling", "algorithm.replay_buffer"];
            fields(ui, &err, &flat_keys, |ui, l| {
                ui.checkbox(&mut a.dynamic_sampling, "").labelled_by(l);
                ui.add(egui::DragValue::new(&mut a.max_resample_rounds).prefix("max rounds "));
                let replay = egui::DragValue::new(&mut a.replay_buffer).prefix("replay ");
                hint(ui.add(replay), flat_keys[1]);
            });
            if transformer {
                field(ui, &err, "algorithm.mask_truncated_completions", |ui, l| {
                    ui.checkbox(&mut a.mask_truncated_completions, "")
                        .labelled_by(l);
                });
            }
            field(ui, &err, "algorithm.prompts_per_iteration", |ui, l| {
                ui.add(egui::DragValue::new(&mut a.prompts_per_iteration))
                    .labelled_by(l);
            });
            let ps = [
                (PromptSampling::Uniform, "uniform"),
                (PromptSampling::Prioritized, "prioritized"),
                (PromptSampling::Curriculum, "curriculum"),
            ];
            field(ui, &err, "algorithm.prompt_sampling", |ui, l| {
                combo(ui, l, "prompt-sampling", &mut a.prompt_sampling, &ps)
            });
            ui.label(
                RichText::new("Bug gallery (deliberate bugs)")
                    .small()
                    .strong(),
            );
            for (key, on) in [
                (
                    "algorithm.bugs.ratio_as_logprob_quotient",
                    &mut a.bugs.ratio_as_logprob_quotient,
                ),
                (
                    "algorithm.bugs.unfrozen_old_policy",
                    &mut a.bugs.unfrozen_old_policy,
                ),
                (
                    "algorithm.bugs.shared_reference",
                    &mut a.bugs.shared_reference,
                ),
                (
                    "algorithm.bugs.std_without_eps",
                    &mut a.bugs.std_without_eps,
                ),
            ] {
                if let Some(f) = field_info(key) {
                    ui.checkbox(on, f.label).on_hover_text(f.tooltip());
                }
            }
        });
    ui.collapsing("Cold start (SFT)", |ui| {
        field(ui, &err, "sft.steps", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.sft.steps))
                .labelled_by(l);
        });
        field(ui, &err, "sft.examples", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.sft.examples))
                .labelled_by(l);
        });
        field(ui, &err, "sft.lr", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.sft.lr).speed(1e-4))
                .labelled_by(l);
        });
    });
    ui.collapsing("Optimizer & sampling", |ui| {
        field(ui, &err, "optimizer.lr", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.optimizer.lr).speed(1e-4))
                .labelled_by(l);
        });
        field(ui, &err, "optimizer.max_grad_norm", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.optimizer.max_grad_norm).speed(0.01))
                .labelled_by(l);
        });
        field(ui, &err, "sampling.temperature", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.sampling.temperature).speed(0.01))
                .labelled_by(l);
        });
        field(ui, &err, "sampling.top_k", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.sampling.top_k))
                .labelled_by(l);
        });
        field(ui, &err, "sampling.top_p", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.sampling.top_p).speed(0.01))
                .labelled_by(l);
        });
        // The mismatch lab: a gap between sampler and learner on purpose, and its correction.
        use crate::config::{IsCorrection, LearnerScores, SamplerPrecision};
        let learner = &mut d.sampling.learner_scores;
        enum_field(
            ui,
            &err,
            "sampling.learner_scores",
            learner,
            LearnerScores::ALL,
            LearnerScores::name,
        );
        let precision = &mut d.sampling.sampler_precision;
        enum_field(
            ui,
            &err,
            "sampling.sampler_precision",
            precision,
            SamplerPrecision::ALL,
            SamplerPrecision::name,
        );
        field(ui, &err, "sampling.keep_sampling_mask", |ui, l| {
            ui.checkbox(&mut d.sampling.keep_sampling_mask, "")
                .labelled_by(l);
        });
        let correction = &mut d.algorithm.is_correction;
        enum_field(
            ui,
            &err,
            "algorithm.is_correction",
            correction,
            IsCorrection::ALL,
            IsCorrection::name,
        );
        field(ui, &err, "algorithm.max_staleness", |ui, l| {
            ui.add(egui::DragValue::new(&mut d.algorithm.max_staleness))
                .labelled_by(l);
        });
    });

    // Validate the draft: a bad value is refused at its field, and the trainer keeps running.
    app.field_error = app
        .draft
        .validate()
        .err()
        .map(|e| (error_key(&e), e.to_string()));
    ui.separator();
    let valid = app.field_error.is_none();
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
    if let Some((_, msg)) = &app.field_error {
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
    ui.horizontal_wrapped(|ui| {
        ui.label("Prompt");
        for (i, g) in groups.iter().enumerate() {
            let label = format!(
                "[{}]{}",
                tokenizer().decode(&g.prompt),
                if g.zero_std { " ∅" } else { "" }
            );
            if ui.selectable_label(i == gi, label).clicked() {
                app.inspector_group = i;
            }
        }
    });
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
    if !g.cov_terms.is_empty() {
        ui.label(RichText::new("Tokens coloured by their term of Cov(log π, A) over the batch (the entropy mechanism, Cui et al. 2025): red lowers the entropy (a likely token with a better-than-average advantage, or an unlikely one with a worse), blue raises it; the deeper, the larger. Hover a token for its term.").small());
    }
    // The ratio and the clip flags from the one per-token formula the engines use.
    let settings = crate::objective::loss::LossSettings::of(&config);
    egui::ScrollArea::both().show(ui, |ui| {
        egui::Grid::new("inspector")
            .striped(true)
            .num_columns(4 + AdvantageMode::GROUP.len())
            .show(ui, |ui| {
                ui.strong("#");
                ui.strong("response");
                ui.strong("reward");
                ui.strong("parts");
                for m in AdvantageMode::GROUP {
                    let t = if *m == config.algorithm.advantage {
                        format!("A {} ◀", m.name())
                    } else {
                        format!("A {}", m.name())
                    };
                    ui.strong(t);
                }
                ui.strong("per token: log π_old → log π (ratio ρ, clipped?)");
                ui.end_row();
                for i in 0..g.responses.len() {
                    response_row(ui, g, i, &config, &reward_fn, &settings);
                }
            });
    });
}

/// The inspector's choice of a logged iteration (the latest unless one is pinned); its index.
fn iteration_slider(app: &mut GrpoApp, ui: &mut egui::Ui) -> usize {
    let last = app.run.groups.len() - 1;
    let mut sel = app.inspector_iteration.unwrap_or(last).min(last);
    ui.horizontal(|ui| {
        ui.label("Iteration");
        let iterations: Vec<usize> = app.run.groups.iter().map(|(i, _)| *i).collect();
        if ui
            .add(
                egui::Slider::new(&mut sel, 0..=last)
                    .text("logged iteration")
                    .custom_formatter(|v, _| {
                        iterations
                            .get(v as usize)
                            .map(|i| i.to_string())
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

/// One response of a logged group: its tokens, reward and its parts, its advantage under every
/// mode, and per token log π_old → log π with the ratio and whether the clip is active.
fn response_row(
    ui: &mut egui::Ui,
    g: &crate::metrics::GroupRecord,
    i: usize,
    config: &RunConfig,
    reward_fn: &RewardFn,
    settings: &crate::objective::loss::LossSettings,
) {
    let resp = &g.responses[i];
    ui.label(i.to_string());
    ui.monospace(tokenizer().decode(resp));
    ui.label(format!("{:.2}", g.rewards[i]));
    let parts = reward_fn.score_logged(config, &g.prompt, resp).parts;
    ui.label(
        parts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    for m in AdvantageMode::GROUP {
        let v = g
            .advantages
            .get(m.name())
            .and_then(|a| a.get(i))
            .copied()
            .unwrap_or(f32::NAN);
        ui.label(format!("{v:+.3}"));
    }
    let adv = g
        .advantages
        .get(config.algorithm.advantage.name())
        .and_then(|a| a.get(i))
        .copied()
        .unwrap_or(0.0);
    // The objective's own text over the response's logged tokens (the response's ratio at
    // the sequence level).
    let (old, new) = (
        g.old_logp.get(i).cloned().unwrap_or_default(),
        g.logp.get(i).cloned().unwrap_or_default(),
    );
    let known = resp.len().min(old.len()).min(new.len());
    let (old, new) = (&old[..known], &new[..known]);
    let terms = crate::objective::loss::response_terms(settings, new, old, old, adv);
    let (p, ratios) = (settings.pg(), terms.clipped_ratio(settings));
    let tokens: Vec<String> = (0..resp.len())
        .map(|t| {
            if t >= known {
                return "–".into();
            }
            let ratio = ratios[t];
            let (low, high) = crate::objective::loss::reference::clip_flags(&p, ratio, adv);
            format!(
                "{:.2}→{:.2} ({ratio:.3}{})",
                old[t],
                new[t],
                if low || high { " ✂" } else { "" }
            )
        })
        .collect();
    match g.cov_terms.get(i) {
        // Each token on the colour of its covariance term (`run.entropy_dynamics`).
        Some(terms) => {
            let scale = g
                .cov_terms
                .iter()
                .flatten()
                .fold(0.0f32, |m, x| m.max(x.abs()))
                .max(1e-12);
            ui.horizontal(|ui| {
                for (t, text) in tokens.iter().enumerate() {
                    let c = terms.get(t).copied().unwrap_or(0.0);
                    ui.label(
                        RichText::new(text)
                            .monospace()
                            .background_color(cov_colour(c / scale)),
                    )
                    .on_hover_text(format!(
                        "covariance term (A − mean A)(log π − mean log π) = {c:+.4}: {}",
                        if c > 0.0 {
                            "lowers the entropy"
                        } else {
                            "raises the entropy"
                        }
                    ));
                }
            });
        }
        None => {
            ui.monospace(tokens.join("  "));
        }
    }
    ui.end_row();
}

/// A token's background for its covariance term, `x` in [−1, 1] of the group's largest:
/// red where it lowers the entropy, blue where it raises it, faint near 0.
pub fn cov_colour(x: f32) -> Color32 {
    let a = (x.abs().clamp(0.0, 1.0) * 150.0) as u8;
    if x > 0.0 {
        Color32::from_rgba_unmultiplied(220, 50, 47, a)
    } else {
        Color32::from_rgba_unmultiplied(38, 139, 210, a)
    }
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
            // The band under the line's name: one legend entry per cell shows or hides both.
            p.add(
                egui_plot::FilledArea::new(cell.clone(), &xs, &lo, &hi)
                    .fill_color(color.gamma_multiply(0.15)),
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

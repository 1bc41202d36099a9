//! The app, driven like a user would, rendered with wgpu (lavapipe in CI): a snapshot of
//! each panel after a short deterministic run, and interaction tests.

use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use grpo_lab::app::{AppOptions, GrpoApp, Tab, tour};
use grpo_lab::config::{AdvantageMode, DeviceChoice, RunConfig};
use grpo_lab::objective::explain::Quantity;

fn short_config() -> RunConfig {
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.iterations = 4;
    c.run.device = DeviceChoice::Cpu;
    c
}

fn harness(config: RunConfig) -> Harness<'static, GrpoApp> {
    harness_of([1280.0, 800.0], config, true)
}

/// The app at `size` (points) on `config`, its trainer inline (in the frames) or on its own
/// thread as the desktop app runs it.
fn harness_of(size: [f32; 2], config: RunConfig, inline: bool) -> Harness<'static, GrpoApp> {
    Harness::builder()
        .with_size(size)
        .wgpu()
        .build_eframe(move |cc| {
            GrpoApp::new(
                Some(cc),
                AppOptions {
                    inline_trainer: inline,
                    config: Some(config),
                    fresh: true,
                    ..Default::default()
                },
            )
        })
}

#[test]
fn step_iteration_play_and_reset_do_what_they_say() {
    let mut h = harness(short_config());
    h.run();
    assert_eq!(h.state().run.steps, 0);
    h.get_by_label("+1 Step").click();
    h.run();
    assert_eq!(h.state().run.steps, 1, "Step = one optimizer step");
    h.get_by_label("+μ Iteration").click();
    h.run();
    assert_eq!(
        h.state().run.steps,
        10,
        "Iteration = to the end of the iteration (μ = 10)"
    );
    h.get_by_label("▶ Play").click();
    h.run();
    assert_eq!(h.state().run.steps, 40, "Play = to the end of the run");
    assert!(h.state().finished);
    h.get_by_label("⟲ Reset").click();
    h.run();
    assert_eq!(h.state().run.steps, 0, "Reset = a new run");
    assert!(!h.state().finished);
}

#[test]
fn changing_the_advantage_mode_changes_the_next_records() {
    let mut h = harness(short_config());
    h.run();
    h.get_by_label("+μ Iteration").click();
    h.run();
    // Switch the driving mode to raw and apply it live (no reset needed).
    h.state_mut().draft.algorithm.advantage = AdvantageMode::Raw;
    h.run();
    assert_eq!(
        h.state().draft.algorithm.advantage,
        AdvantageMode::Raw,
        "the panel keeps the edit"
    );
    assert!(!h.state().needs_reset());
    h.get_by_label("Apply").click();
    h.run();
    h.get_by_label("+μ Iteration").click();
    h.run();
    let (_, groups) = h.state().run.groups.last().unwrap().clone();
    let raw: Vec<f32> = groups
        .iter()
        .flat_map(|g| g.advantages["raw"].clone())
        .collect();
    let centered: Vec<f32> = groups
        .iter()
        .flat_map(|g| g.advantages["normalized"].clone())
        .collect();
    let mean_abs = |v: &[f32]| v.iter().map(|x| x.abs()).sum::<f32>() / v.len() as f32;
    let last = h.state().run.last.clone().unwrap();
    assert_eq!(last.iteration, 1);
    assert!(
        (last.advantage_mean_abs - mean_abs(&raw)).abs() < 1e-5,
        "the new records carry the raw advantages: {} vs raw {} / normalized {} (iteration {}, step {})",
        last.advantage_mean_abs,
        mean_abs(&raw),
        mean_abs(&centered),
        last.iteration,
        last.step
    );
    assert!((last.advantage_mean_abs - mean_abs(&centered)).abs() > 1e-3);
    // A bad value is refused at its field, with the reason, and the trainer is untouched.
    h.state_mut().draft.algorithm.num_generations = 0;
    h.run();
    let err = h.state().field_error.clone().unwrap();
    assert_eq!(err.0, "algorithm.num_generations");
    assert!(
        h.query_by_label_contains("✖ invalid value for `algorithm.num_generations`")
            .is_some()
    );
    h.state_mut().draft.algorithm.num_generations = 10;
    h.state_mut().draft.algorithm.epsilon_low = 1.5;
    h.run();
    assert_eq!(
        h.state().field_error.clone().unwrap().0,
        "algorithm.epsilon_low"
    );
    assert_eq!(
        h.state().running.as_ref().unwrap().algorithm.epsilon_low,
        0.01
    );
}

#[test]
fn playground_matches_the_advantages_command() {
    let mut h = harness(short_config());
    h.state_mut().persisted.tab = Tab::Playground;
    h.state_mut().persisted.playground_rewards = vec![1.0, 2.0, 2.0, 5.0];
    h.run();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .args(["advantages", "--rewards", "1,2,2,5", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for mode in [
        "raw",
        "centered",
        "normalized",
        "max",
        "rloo",
        "batch_normalized",
    ] {
        let shown: Vec<String> = v[mode]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| format!("{:+.4}", x.as_f64().unwrap()))
            .collect();
        let row = shown.join("  ");
        assert!(
            h.query_all_by_label(&row).count() >= 1,
            "{mode}: the playground should show {row}"
        );
    }
}

#[test]
fn panel_snapshots_after_a_short_run() {
    let mut h = harness(short_config());
    h.run();
    h.get_by_label("+μ Iteration").click();
    h.run();
    h.get_by_label("+μ Iteration").click();
    h.run();
    for (tab, name) in [
        (Tab::Plots, "plots"),
        (Tab::Inspector, "inspector"),
        (Tab::Playground, "playground"),
        (Tab::Runs, "runs"),
    ] {
        h.state_mut().persisted.tab = tab;
        h.run();
        h.snapshot(name);
    }
}

#[test]
fn opens_a_compare_directory_with_bands() {
    // A fixed path: it shows in the snapshot.
    let out = std::env::temp_dir().join("grpo-lab-test-app-compare");
    let _ = std::fs::remove_dir_all(&out);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .args([
            "compare",
            "--preset",
            "lecture17",
            "--set",
            "run.iterations=5",
            "--vary",
            "algorithm.advantage=raw,centered",
            "--seeds",
            "0..3",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut h = harness(short_config());
    h.state_mut().persisted.tab = Tab::Runs;
    h.state_mut().runs_path = out.display().to_string();
    h.run();
    h.get_by_label("Open compare dir").click();
    h.run();
    let cells: Vec<String> = h.state().compare.iter().map(|(c, _)| c.clone()).collect();
    assert_eq!(cells, vec!["advantage_centered", "advantage_raw"]);
    assert_eq!(
        h.state().compare[0].1["reward/mean"].len(),
        5,
        "one point per iteration, averaged over 3 seeds"
    );
    h.snapshot("compare");
}

#[test]
fn runs_started_in_the_app_can_be_overlaid() {
    let mut h = harness(short_config());
    h.state_mut().persisted.tab = Tab::Runs;
    h.run();
    h.get_by_label("+μ Iteration").click();
    h.run();
    h.get_by_label("Keep the current run").click();
    h.run();
    h.state_mut().draft.algorithm.advantage = AdvantageMode::Raw;
    h.get_by_label("⟲ Reset").click();
    h.run();
    h.get_by_label("+μ Iteration").click();
    h.run();
    assert_eq!(h.state().overlays.len(), 1);
    assert_eq!(h.state().overlays[0].0.steps, 10);
    assert_eq!(
        h.state().running.as_ref().unwrap().algorithm.advantage,
        AdvantageMode::Raw
    );
    assert!(
        h.query_all_by_label_contains("normalized · naive · seed 5")
            .count()
            >= 1
    );
}

/// The transformer policy in the app: an iteration runs, the inspector shows its
/// variable-length responses with `<eos>` and one log-prob per token.
#[test]
fn transformer_runs_in_the_app_and_the_inspector_shows_eos() {
    let mut c = RunConfig::preset("transformer-sort").unwrap();
    c.task.train_size = 256;
    c.task.heldout_size = 32;
    c.model.d_model = 32;
    c.sft.steps = 20;
    c.run.iterations = 2;
    c.run.device = DeviceChoice::Cpu;
    let mut h = harness(c);
    h.run();
    h.get_by_label("+μ Iteration").click();
    h.run();
    assert_eq!(h.state().run.steps, 2);
    let (_, groups) = h.state().run.groups.last().unwrap().clone();
    let eos = grpo_lab::task::tokenizer::EOS_ID;
    assert!(
        groups
            .iter()
            .any(|g| g.responses.iter().any(|r| r.last() == Some(&eos)))
    );
    for g in &groups {
        for (r, lp) in g.responses.iter().zip(&g.logp) {
            assert_eq!(r.len(), lp.len());
        }
    }
    // The token view on variable lengths (`<eos>` a token like any other) fits at 1280×800,
    // with a compared objective beside the configured one.
    for g in &groups {
        for (r, e) in g.responses.iter().zip(&g.entropy) {
            assert_eq!(r.len(), e.len(), "one entropy per token");
        }
    }
    h.state_mut().persisted.tab = Tab::Inspector;
    h.state_mut().token_view.compare = Some(3);
    h.run();
    assert!(h.query_all_by_label_contains("<eos>").count() > 1);
    assert_fits(&h, 1280.0, "transformer token view");
    // The responses table opened: a weighted reward's parts wrap in their column.
    h.get_by_label_contains("Responses: reward, its parts")
        .click();
    h.run();
    assert_fits(&h, 1280.0, "transformer responses table");
    h.snapshot("inspector-transformer");
    h.state_mut().persisted.tab = Tab::Plots;
    h.run();
    h.snapshot("plots-transformer");
}

/// The Experiments tab: a card runs its matrix here, seed after seed, and shows the bands and
/// its result table when done.
#[test]
fn an_experiment_card_runs_its_matrix_and_shows_the_table() {
    let mut h = harness(short_config());
    h.state_mut().persisted.tab = Tab::Experiments;
    h.run();
    // The first card is the lecture's table: two seeds, four iterations, to keep it short.
    let mut m = grpo_lab::experiment::Matrix::from_experiment("lecture-table").unwrap();
    m.seeds = vec![0, 1];
    m.base.run.iterations = 4;
    let cells = m.cells().unwrap().len();
    h.state_mut().start_experiment(m);
    for _ in 0..2000 {
        h.step();
        if h.state().experiment.as_ref().is_some_and(|e| e.is_done()) {
            break;
        }
    }
    let e = h.state().experiment.as_ref().expect("the experiment");
    assert!(e.is_done() && e.error.is_none(), "{:?}", e.error);
    assert_eq!(e.table.len(), cells);
    assert!(e.table.iter().all(|r| r.seeds == 2));
    // Its final reward column is each cell's mean of the seeds' last rewards.
    let last: Vec<f64> = e.table.iter().map(|r| r.values[0].0).collect();
    assert!(last.iter().all(|x| (0.0..=5.0).contains(x)), "{last:?}");
    h.run();
    h.get_by_label("mean, last 10 it.");
    h.snapshot("experiments");
}

/// With the adaptive entropy bonus the app keeps the coefficient's series (drawn beside the
/// entropy); without a bonus there is none.
#[test]
fn the_entropy_coefficient_is_plotted_when_there_is_a_bonus() {
    for adaptive in [false, true] {
        let mut c = short_config();
        c.algorithm.adaptive_entropy = adaptive;
        let mut h = harness(c);
        h.run();
        h.get_by_label("+μ Iteration").click();
        h.run();
        let run = &h.state().run;
        assert!(run.series("entropy").len > 0);
        assert_eq!(
            run.series("entropy_coef").len > 0,
            adaptive,
            "adaptive = {adaptive}"
        );
    }
}

/// The gradient lab's card (Experiments tab) runs the lab here, a slice of each frame, and
/// shows the same numbers as `grpo-lab gradient-lab` for the same θ.
#[test]
fn the_gradient_lab_card_runs_and_matches_the_library() {
    let mut h = harness(short_config());
    h.state_mut().persisted.tab = Tab::Experiments;
    h.run();
    {
        let card = &mut h.state_mut().gradient_lab;
        card.at_iteration = 2;
    }
    // The first ▶ Run is the gradient lab's (its card comes first).
    h.get_all_by_label("▶ Run").next().unwrap().click();
    for _ in 0..5000 {
        h.step();
        if !h.state().gradient_lab.running() {
            break;
        }
    }
    let status = h.state().gradient_lab.status().unwrap();
    assert!(
        status.starts_with("gradient lab done · exact true"),
        "{status}"
    );
    let shown = h
        .state()
        .gradient_lab
        .session
        .as_ref()
        .and_then(|s| s.report())
        .cloned()
        .unwrap();
    let config = RunConfig::preset("lecture17").unwrap();
    let a = h.state().gradient_lab.args(&config);
    let direct = grpo_lab::lab::gradient::run_all(config, None, &a, true).unwrap();
    assert_eq!(shown.j, direct.j);
    assert_eq!(shown.estimators.len(), direct.estimators.len());
    for (x, y) in shown.estimators.iter().zip(&direct.estimators) {
        assert_eq!((x.cosine_mean, x.snr), (y.cosine_mean, y.snr), "{}", x.name);
    }
    h.run();
    h.get_by_label("table: 40 estimators");
    h.snapshot("gradient-lab");
}

/// With `run.entropy_dynamics` the inspector colours each token by its term of Cov(log π, A)
/// (the entropy mechanism), with the legend and the number on hover.
#[test]
fn the_inspector_colours_tokens_by_their_covariance_term() {
    let mut c = short_config();
    c.run.entropy_dynamics = true;
    let mut h = harness(c);
    h.run();
    h.get_by_label("+μ Iteration").click();
    h.run();
    let groups = &h.state().run.groups;
    assert!(!groups.is_empty() && !groups[0].1[0].cov_terms.is_empty());
    h.state_mut().persisted.tab = Tab::Inspector;
    h.run();
    h.get_by_label("Cov(log π, A) term").click();
    h.run();
    assert_eq!(h.state().token_view.quantity, Quantity::Covariance);
    assert!(
        h.query_by_label_contains("red lowers the entropy (a likely token with A above the mean")
            .is_some()
    );
    h.snapshot("inspector-entropy");
}

/// Everything the inspector lays out at 1280×800 ends inside the window: the token view wraps
/// its rows, the formula card (and the compared one beside it) fit.
fn assert_fits(h: &Harness<'static, GrpoApp>, width: f32, what: &str) {
    let mut widest = (0.0f32, String::new());
    for n in h.query_all_by_label_contains("") {
        let r = n.rect();
        if r.max.x > widest.0 {
            widest = (r.max.x, format!("{n:?}").chars().take(160).collect());
        }
    }
    assert!(
        widest.0 <= width + 0.5,
        "{what}: a widget ends at x = {} of {width}: {}",
        widest.0,
        widest.1
    );
}

/// The token view (#28 §1): every token coloured by the chosen quantity with a legend, every
/// number of a token on hover, clicked → the formula card with its numbers (§2), and "compare
/// with" puts a second objective beside it with the differing steps marked; nothing cut off at
/// 1280×800, on the lecture model and on the transformer (variable lengths, `<eos>`).
#[test]
fn the_token_view_and_formula_card_fit_and_explain_a_token() {
    let mut c = short_config();
    c.algorithm.loss = grpo_lab::config::LossMode::Clipped;
    c.algorithm.epsilon_low = 0.2;
    c.algorithm.epsilon_high = 0.2;
    let mut h = harness(c);
    h.run();
    h.get_by_label("+μ Iteration").click();
    h.run();
    h.state_mut().persisted.tab = Tab::Inspector;
    h.run();
    // The whole quantity menu, with the ones this run has.
    for q in Quantity::ALL {
        let label = grpo_lab::app::tokens::quantity_label(q);
        assert!(h.query_by_label(label).is_some(), "{label}");
    }
    // Entropy is recorded by the fused lecture engine: colour by it.
    let (_, groups) = h.state().run.groups.last().unwrap().clone();
    assert_eq!(groups[0].entropy.len(), groups[0].responses.len());
    assert_eq!(groups[0].ref_logp.len(), groups[0].responses.len());
    assert!(
        groups[0].entropy[0]
            .iter()
            .all(|h| h.is_finite() && *h >= 0.0)
    );
    h.get_by_label("entropy H").click();
    h.run();
    assert_eq!(h.state().token_view.quantity, Quantity::Entropy);
    h.get_by_label("ratio ρ = π/π_old").click();
    h.run();
    // The formula card of the default token, then of a clicked one.
    assert!(h.query_by_label_contains("Formula for token 0").is_some());
    h.state_mut().token_view.selected = Some((2, 1));
    h.run();
    assert!(h.query_by_label_contains("Formula for token 1 (").is_some());
    for step in [
        "advantage = ",
        "ratio = ",
        "policy-gradient term = ",
        "aggregation weight = ",
        "contribution to the loss = ",
    ] {
        assert_eq!(
            h.query_all_by_label_contains(step).count(),
            1,
            "one `{step}` in the card"
        );
    }
    assert!(
        h.query_by_label_contains("ℓ_t = −min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)")
            .is_some()
    );
    // The responses table (folded by default) opens with every mode's advantage, and fits too.
    assert!(h.query_by_label("batch-norm.").is_none());
    h.get_by_label_contains("Responses: reward, its parts")
        .click();
    h.run();
    assert!(h.query_by_label("batch-norm.").is_some());
    assert_fits(&h, 1280.0, "lecture17 token view");
    h.snapshot("inspector-tokens");
    // Compare with CISPO: a second card, the policy-gradient step differs (the responses
    // table folded again so the cards show whole).
    h.state_mut().token_view.compare = Some(5);
    h.get_by_label_contains("Responses: reward, its parts")
        .click();
    h.run();
    assert!(h.query_by_label("batch-norm.").is_none());
    assert_eq!(
        h.query_all_by_label_contains("policy-gradient term = ")
            .count(),
        2
    );
    assert!(
        h.query_by_label_contains("ℓ_t = −sg(min(ρ, cap))·A·log π_t")
            .is_some()
    );
    assert_fits(&h, 1280.0, "lecture17 formula cards");
    h.snapshot("inspector-formula-compare");
    // A row is one widget that hit-tests its chips: clicks left to right along response 2
    // select nothing on its head, then its tokens in order, each of them.
    h.state_mut().token_view.selected = Some((0, 0));
    h.run();
    let row = h.get_by_label_contains("response 2: ").rect();
    let tokens = h.state().run.groups.last().unwrap().1[0].responses[2].len();
    let mut seen = Vec::new();
    let mut x = row.left() + 1.0;
    while x < row.right() {
        let pos = egui::pos2(x, row.center().y);
        click_at(&mut h, pos);
        let sel = h.state().token_view.selected.unwrap();
        if sel != (0, 0) && seen.last() != Some(&sel) {
            seen.push(sel);
        }
        x += 4.0;
    }
    assert_eq!(seen, (0..tokens).map(|t| (2, t)).collect::<Vec<_>>());
    // The prompt strip: a click on the second prompt shows its group.
    let strip = h.get_by_label_contains("Prompt [").rect();
    assert_eq!(h.state().inspector_group, 0);
    let mut x = strip.left();
    while h.state().inspector_group == 0 && x < strip.right() {
        let pos = egui::pos2(x, strip.top() + 8.0);
        click_at(&mut h, pos);
        x += 4.0;
    }
    assert_eq!(h.state().inspector_group, 1, "the second prompt, first");
}

/// A mouse click at `pos` (the node's own `click` clicks its centre), then a frame.
fn click_at(h: &mut Harness<'static, GrpoApp>, pos: egui::Pos2) {
    h.hover_at(pos);
    for pressed in [true, false] {
        h.event(egui::Event::PointerButton {
            pos,
            button: egui::PointerButton::Primary,
            pressed,
            modifiers: egui::Modifiers::default(),
        });
    }
    h.run();
}

/// The app with the guided iteration started: its first step showing.
fn touring() -> Harness<'static, GrpoApp> {
    let mut h = harness(short_config());
    h.run();
    h.get_by_label("▶▶ Walk me through").click();
    h.run();
    h.run();
    assert_eq!(h.state().tour.step, Some(0));
    h
}

/// The guided iteration (#28 §3): eight steps in GRPO-SPEC §2's order, each on its tab with its
/// panel highlighted; Next / Back / End.
#[test]
fn the_guided_iteration_walks_the_spec_s_steps() {
    let mut h = touring();
    assert!(
        !h.state().run.groups.is_empty(),
        "the tour runs an iteration first"
    );
    assert_eq!(h.state().persisted.tab, Tab::Inspector);
    assert!(h.state().public_status().ends_with("tour 1/8"));
    h.get_by_label_contains("1 · Choose prompts");
    for k in 1..tour::STEPS.len() {
        h.get_by_label("Next ▶").click();
        h.run();
        assert_eq!(h.state().tour.step, Some(k));
        assert_eq!(h.state().persisted.tab, tour::STEPS[k].tab);
        h.get_by_label_contains(tour::STEPS[k].title);
        if k == 5 {
            h.snapshot("tour-objective");
        }
    }
    h.get_by_label("◀ Back").click();
    h.run();
    assert_eq!(h.state().tour.step, Some(tour::STEPS.len() - 2));
    h.get_by_label("End tour").click();
    h.run();
    assert_eq!(h.state().tour.step, None);
}

/// The config panel is the field table (#28 §6): every key, by section, with a search box.
#[test]
fn the_config_panel_shows_every_key_and_searches() {
    let mut h = harness_of([1280.0, 4200.0], short_config(), true);
    h.run();
    h.get_by_label("⊞ all").click();
    h.run();
    let count = |h: &Harness<'static, GrpoApp>, key: &str| {
        let label = grpo_lab::config::field_info(key).unwrap().label;
        h.query_all_by_label(label).count()
    };
    for f in grpo_lab::config::FIELDS {
        assert!(count(&h, f.key) >= 1, "{} ({}) has no row", f.key, f.label);
    }
    h.snapshot("config-panel-full");
    // Search narrows to the matching keys (GAE's γ and λ are found by "gae").
    h.state_mut().config_panel.search = "gae".into();
    h.run_steps(100);
    assert!(count(&h, "algorithm.gamma") >= 1);
    assert_eq!(count(&h, "task.vocab"), 0);
    // An edit through the panel reaches the draft: the bug gallery's switch.
    h.state_mut().config_panel.search = "shared_reference".into();
    h.run_steps(100);
    let label = grpo_lab::config::field_info("algorithm.bugs.shared_reference")
        .unwrap()
        .label;
    h.get_by_label(label).click();
    h.run();
    assert!(h.state().draft.algorithm.bugs.shared_reference);
}

/// Every plot of the Plots tab explains itself: its "?" opens how to read it and what a healthy
/// and an unhealthy curve look like (and closes it again); a snapshot shows one open.
#[test]
fn each_plot_s_question_mark_says_how_to_read_it() {
    let mut h = harness(short_config());
    h.state_mut().persisted.tab = Tab::Plots;
    h.run();
    h.get_by_label("+μ Iteration").click();
    h.run();
    let marks = h.get_all_by_label("?").count();
    assert_eq!(marks, grpo_lab::app::help::PLOTS.len(), "one ? per plot");
    assert!(h.query_by_label_contains("Unhealthy").is_none());
    h.get_all_by_label("?").nth(5).unwrap().click();
    h.run();
    let entropy = grpo_lab::app::help::of("entropy").unwrap();
    h.get_by_label(entropy.unhealthy);
    h.get_by_label("How to read it");
    h.snapshot("plot-help");
    h.get_all_by_label("?").nth(5).unwrap().click();
    h.run();
    assert!(h.query_by_label_contains("Unhealthy").is_none());
}

/// The config panel keeps its width while the search box has text (it grew on every frame:
/// a row sized from the panel's width widened the panel), and after the search is cleared.
#[test]
fn the_config_panel_keeps_its_width_while_searching() {
    let mut h = harness(short_config());
    h.run();
    let panel_right = |h: &Harness<'static, GrpoApp>| h.get_by_label("Live plots").rect().left();
    let before = panel_right(&h);
    let mut widths = Vec::new();
    // A few words, then every key (each shows its own rows), then none.
    let mut searches = vec!["a", "clip", "learning rate"];
    searches.extend(grpo_lab::config::FIELDS.iter().map(|f| f.key));
    searches.push("");
    for search in searches {
        h.state_mut().config_panel.search = search.into();
        for _ in 0..4 {
            h.step();
            widths.push((search, panel_right(&h)));
        }
    }
    for (search, w) in &widths {
        assert!(
            (w - before).abs() < 1.0,
            "searching {search:?}: the panel's edge moved from {before} to {w}: {widths:?}"
        );
    }
}

/// +1 Step while paused, on the trainer's own thread (as the app runs): the step's record
/// arrives between frames, and the window is woken to draw it without any input.
#[test]
fn a_step_taken_while_paused_is_drawn_without_input() {
    let mut h = harness_of([1280.0, 800.0], short_config(), false);
    // The run starts on the thread; frames until it has.
    let started = std::time::Instant::now();
    while h.state().device.is_empty() && started.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        h.step();
    }
    h.run();
    assert_eq!(h.state().run.steps, 0);
    assert!(!h.ctx.has_requested_repaint(), "the window is idle");
    // What +1 Step sends, without a frame (a click's own frames may draw the record
    // themselves); from here no input: only a repaint the trainer asks for draws the step.
    h.state_mut().send(grpo_lab::app::worker::Command::Step);
    let started = std::time::Instant::now();
    let mut woken = false;
    while started.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        if h.ctx.has_requested_repaint() {
            woken = true;
            h.step();
            if h.state().run.steps == 1 {
                break;
            }
        }
    }
    assert!(
        woken,
        "the trainer's step never asked the window to repaint"
    );
    assert_eq!(h.state().run.steps, 1);
    assert!(
        h.query_by_label_contains("paused · iteration 1/4 · step 1 ·")
            .is_some(),
        "the status line shows the step"
    );
}

/// The app with `text` typed into the G field and Enter pressed.
fn typed_into_g(text: &str) -> Harness<'static, GrpoApp> {
    let mut h = harness(short_config());
    h.run();
    // The field (labelled by its label: the node with a value), clicked: it edits as text,
    // all selected; typed text goes to the focused widget.
    h.get_all_by_label("G (group size)")
        .find(|n| n.value().as_deref() == Some("10"))
        .expect("the G field")
        .click();
    h.run();
    assert!(
        h.get_all_by_label("G (group size)").any(|n| n.is_focused()),
        "the G field has the keyboard"
    );
    h.get_all_by_label("G (group size)")
        .next()
        .unwrap()
        .type_text(text);
    h.run();
    h.key_press(egui::Key::Enter);
    h.run();
    h.run();
    h
}

/// A group size of 0 typed into its field is refused there with the reason (the field's
/// range clamped typed text: 0 silently became 1).
#[test]
fn a_typed_group_size_of_0_is_refused_at_its_field() {
    let h = typed_into_g("0");
    assert_eq!(h.state().draft.algorithm.num_generations, 0);
    assert_eq!(
        h.state().field_error.as_ref().map(|e| e.0.as_str()),
        Some("algorithm.num_generations")
    );
    assert!(
        h.query_by_label_contains("✖ invalid value for `algorithm.num_generations`")
            .is_some()
    );
    assert_eq!(
        h.state()
            .running
            .as_ref()
            .unwrap()
            .algorithm
            .num_generations,
        10,
        "the trainer keeps its config"
    );
}

/// A negative whole number typed where the draft holds an unsigned one (G = −3) is refused at
/// its field, naming the key and the range, and nothing applies (it reverted without a word).
#[test]
fn a_typed_negative_group_size_is_refused_at_its_field() {
    let h = typed_into_g("-3");
    assert_eq!(h.state().draft.algorithm.num_generations, 10);
    assert_eq!(
        h.state()
            .config_panel
            .typed_error
            .as_ref()
            .map(|e| e.0.as_str()),
        Some("algorithm.num_generations")
    );
    let shown =
        "✖ invalid value for `algorithm.num_generations`: -3 is out of range; allowed 1..=4096";
    assert!(h.query_by_label_contains(shown).is_some(), "{shown}");
    assert!(
        h.query_by_label_contains("Not applied: invalid value")
            .is_some()
    );
    assert!(
        h.get_by_label("Reset with this config")
            .accesskit_node()
            .is_disabled(),
        "nothing applies while the field is refused"
    );
    // The field shows the draft's value again, and another draft (a preset) clears the
    // refusal: Reset applies again.
    assert!(
        h.get_all_by_label("G (group size)")
            .any(|n| n.value().as_deref() == Some("10"))
    );
    let mut h = h;
    h.get_all_by_label("lecture17")
        .next()
        .expect("the preset button")
        .click();
    h.run();
    h.run();
    assert_eq!(h.state().config_panel.typed_error, None);
    assert!(
        !h.get_by_label("Reset with this config")
            .accesskit_node()
            .is_disabled()
    );
}

/// The controls stay one line however long the status is: the bar's height is the same while
/// training at 5-digit iterations as when paused at the start.
#[test]
fn the_controls_bar_stays_one_line() {
    let mut h = harness(short_config());
    h.run();
    let bar = |h: &Harness<'static, GrpoApp>| h.get_by_label("Live plots").rect().top();
    let before = bar(&h);
    h.state_mut().device = "a very long engine label, ".repeat(8);
    h.run();
    assert_eq!(
        bar(&h),
        before,
        "the tabs moved: the bar took a second line"
    );
    assert!(h.query_by_label("Save PNG").is_some());
    assert_fits(&h, 1280.0, "the controls bar");
}

/// The guided iteration frames what its text describes: with the inspector scrolled down past
/// the responses table, steps 2–4 bring the table back into view and frame it, inside the
/// inspector (not over the top bar).
#[test]
fn the_tour_frames_the_responses_table_in_view() {
    let mut h = touring();
    // Scroll the inspector to its end (the responses table above the view).
    let rows = h.get_by_label_contains("response 2: ").rect();
    for _ in 0..10 {
        h.hover_at(egui::pos2(rows.center().x, 700.0));
        h.event(egui::Event::MouseWheel {
            unit: egui::MouseWheelUnit::Point,
            delta: egui::vec2(0.0, -400.0),
            phase: egui::TouchPhase::Move,
            source: egui::MouseWheelSource::Unknown,
            modifiers: egui::Modifiers::default(),
        });
        h.run();
    }
    let tabs = h.get_by_label("Group inspector").rect();
    for k in 1..4 {
        h.get_by_label("Next ▶").click();
        h.run();
        assert_eq!(h.state().tour.step, Some(k));
        let frame = h.state().tour.highlighted().expect("a framed panel");
        let header = h
            .get_by_label_contains("Responses: reward, its parts")
            .rect();
        assert!(
            frame.top() > tabs.bottom() && frame.intersects(header),
            "step {}: the frame {frame:?} is not on the responses table {header:?} below the tabs {tabs:?}",
            k + 1
        );
    }
}

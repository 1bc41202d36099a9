//! The egui desktop app: watch GRPO learn, and steer it.
//!
//! Data and UI apart (as rerun does): the trainer runs on its own thread and streams
//! `StepRecord`s; `store` keeps them; the `*_ui` functions only read the store each frame
//! and send commands back. Persisted UI state is kept apart from live state.

pub mod config_panel;
pub mod experiments;
pub mod files;
pub mod help;
pub mod lab;
pub mod mono;
pub mod plots;
pub mod shapes;
pub mod store;
pub mod tokens;
pub mod tour;
pub mod views;
pub mod worker;

use crate::config::{PRESETS, RunConfig};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;
use store::RunData;
use web_time::Instant;
use worker::{Command, Event, Worker};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tab {
    Plots,
    Inspector,
    Playground,
    Runs,
    Experiments,
}

impl Tab {
    /// The tab `name` names (`plots`, `inspector`, `playground`, `runs`, `experiments`).
    pub fn from_name(name: &str) -> Result<Tab, String> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .ok_or_else(|| {
                format!(
                    "unknown tab `{name}`; allowed: {}",
                    Self::NAMES.map(|(n, _)| n).join(", ")
                )
            })
    }

    const NAMES: [(&'static str, Tab); 5] = [
        ("plots", Tab::Plots),
        ("inspector", Tab::Inspector),
        ("playground", Tab::Playground),
        ("runs", Tab::Runs),
        ("experiments", Tab::Experiments),
    ];

    const ALL: [(Tab, &'static str); 5] = [
        (Tab::Plots, "Live plots"),
        (Tab::Inspector, "Group inspector"),
        (Tab::Playground, "Advantage playground"),
        (Tab::Runs, "Runs"),
        (Tab::Experiments, "Experiments"),
    ];
}

/// What survives a restart (eframe persistence).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Persisted {
    /// The config being edited, as TOML.
    pub config_toml: String,
    pub smoothing: f64,
    pub tab: Tab,
    pub run_dirs: Vec<PathBuf>,
    pub playground_rewards: Vec<f32>,
    pub save_path: String,
}

impl Default for Persisted {
    fn default() -> Self {
        Self {
            config_toml: RunConfig::preset("lecture17").expect("preset").to_toml(),
            smoothing: 0.6,
            tab: Tab::Plots,
            run_dirs: Vec::new(),
            playground_rewards: vec![1.0, 2.0, 2.0, 5.0],
            save_path: "grpo-lab-config.toml".into(),
        }
    }
}

/// Options for starting the app.
#[derive(Debug, Clone, Default)]
pub struct AppOptions {
    /// Run the trainer inline (tests): steps happen inside frames, deterministically.
    pub inline_trainer: bool,
    /// Start from this config instead of the persisted one.
    pub config: Option<RunConfig>,
    /// Start training at once.
    pub autoplay: bool,
    /// Measure frame work for this long, print a report, close.
    pub measure_secs: Option<f64>,
    /// Ignore persisted state (tests, measurements).
    pub fresh: bool,
    /// Open on this tab.
    pub tab: Option<Tab>,
    /// Start the guided iteration (`app --tour`, the browser's `?tour=1`).
    pub tour: bool,
    /// Train inside the frame loop for at most this long per frame (the browser: no threads);
    /// implies the inline trainer.
    pub frame_budget: Option<Duration>,
    /// Told the status line whenever it changes (the browser's `document.title` and `#status`).
    pub status_sink: Option<fn(&str)>,
    /// Told every record as it arrives (the browser's test hook).
    pub record_sink: Option<fn(&crate::metrics::StepRecord)>,
}

/// Frame-time measurement (the `--measure` mode).
#[derive(Debug, Default)]
struct Measure {
    until: Option<Instant>,
    started: Option<Instant>,
    ui_ms: Vec<f64>,
    cpu_ms: Vec<f64>,
    /// The UI thread's CPU time in `draw` (what `ui_ms` holds less the time it waited for a core).
    ui_cpu_ms: Vec<f64>,
    steps_at_start: usize,
    /// When the trainer finished (its speed is measured up to then).
    trainer_done_at: Option<Instant>,
    done: bool,
}

pub struct GrpoApp {
    pub persisted: Persisted,
    /// The config being edited.
    pub draft: RunConfig,
    /// Where each invalid field's message goes: (config key, message).
    pub field_error: Option<(String, String)>,
    /// The draft `field_error` was computed for.
    validated: Option<RunConfig>,
    /// The config of the run in progress.
    pub running: Option<RunConfig>,
    pub run: RunData,
    pub overlays: Vec<(RunData, bool)>,
    /// A compare directory read back: per cell, bands over seeds.
    pub compare: crate::experiment::CellBands,
    pub worker: Worker,
    pub playing: bool,
    pub finished: bool,
    pub device: String,
    pub train_prompts: Vec<Vec<u32>>,
    pub status: String,
    pub error: Option<String>,
    /// The last thing done that the user asked for (a file saved, a config loaded).
    pub notice: Option<String>,
    pub share_string: String,
    pub inspector_group: usize,
    pub inspector_iteration: Option<usize>,
    /// The inspector's token view: the colour quantity, the clicked token, the compared objective.
    pub token_view: tokens::TokenView,
    /// The config panel's search and its view of the draft.
    pub config_panel: config_panel::ConfigPanel,
    /// "Walk me through one iteration".
    pub tour: tour::Tour,
    pub runs_path: String,
    /// Records per second, from arrival times.
    rate: (Instant, usize, f64),
    measure: Measure,
    inline: bool,
    /// What the window's own wgpu device reported (never fatal); see [`WindowGpuErrors`].
    pub window_gpu: WindowGpuErrors,
    /// The trainer thread ended on its own (it panicked); the next ⟲ Reset starts a new one.
    trainer_gone: bool,
    /// Between a Reset and the new run's `Started`: records still queued from the old run
    /// are dropped, not mixed into the new one.
    awaiting_start: bool,
    frame_budget: Option<Duration>,
    status_sink: Option<fn(&str)>,
    record_sink: Option<fn(&crate::metrics::StepRecord)>,
    /// What `status_sink` was last told.
    published: String,
    /// Config files dropped on the window.
    drops: files::Drops,
    /// An experiment running inside the app (Runs tab), and the one picked to run.
    pub experiment: Option<experiments::InAppExperiment>,
    pub experiment_choice: String,
    /// Experiments run earlier in this session, by name (their cards keep the results).
    pub experiment_results: Vec<experiments::InAppExperiment>,
    /// The compiled-in experiments, parsed once (the Experiments tab's cards).
    pub cards: Vec<crate::experiment::Matrix>,
    /// The gradient lab's card (Experiments tab).
    pub gradient_lab: lab::LabCard,
}

/// Errors on the window's own wgpu device (uncaptured validation errors, a lost device,
/// surface trouble), kept for the status area instead of panicking (wgpu's default
/// uncaptured-error handler panics). `run_app` installs the handlers that feed it.
#[derive(Debug, Clone, Default)]
pub struct WindowGpuErrors(std::sync::Arc<std::sync::Mutex<WindowGpuErrorsState>>);

#[derive(Debug, Default)]
struct WindowGpuErrorsState {
    count: usize,
    last: Option<String>,
    /// Repainted on a new error, so the status line shows it even while paused.
    ctx: Option<egui::Context>,
}

impl WindowGpuErrors {
    fn lock(&self) -> std::sync::MutexGuard<'_, WindowGpuErrorsState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep `what` (one line) for the status area; print the first few on stderr.
    pub fn report(&self, what: &str) {
        let mut line = what.split_whitespace().collect::<Vec<_>>().join(" ");
        if line.chars().count() > 300 {
            line = line.chars().take(300).collect::<String>() + "…";
        }
        let ctx = {
            let mut s = self.lock();
            s.count += 1;
            if s.count <= 5 || s.count.is_power_of_two() {
                eprintln!(
                    "grpo-lab: window renderer error #{} (the app keeps going): {line}",
                    s.count
                );
            }
            s.last = Some(line);
            s.ctx.clone()
        };
        if let Some(ctx) = ctx {
            ctx.request_repaint();
        }
    }

    /// How many errors so far, and the last one.
    pub fn summary(&self) -> Option<(usize, String)> {
        let s = self.lock();
        s.last.clone().map(|l| (s.count, l))
    }

    #[cfg(feature = "native")]
    fn set_context(&self, ctx: &egui::Context) {
        self.lock().ctx = Some(ctx.clone());
    }
}

impl GrpoApp {
    /// Run an experiment's matrix inside the app (the Experiments tab's ▶, the Runs tab's
    /// ▶ Run in the app): one at a time; the one it replaces keeps its results on its card.
    pub fn start_experiment(&mut self, matrix: crate::experiment::Matrix) {
        match experiments::InAppExperiment::of(matrix) {
            Ok(e) => {
                if let Some(old) = self.experiment.take() {
                    self.experiment_results.retain(|r| r.name != old.name);
                    self.experiment_results.push(old);
                }
                self.experiment_results.retain(|r| r.name != e.name);
                self.compare.clear();
                self.experiment = Some(e);
            }
            Err(e) => self.error = Some(e),
        }
    }

    /// The experiment of this name that runs now or ran earlier in this session.
    pub fn experiment_named(&self, name: &str) -> Option<&experiments::InAppExperiment> {
        self.experiment
            .iter()
            .chain(&self.experiment_results)
            .find(|e| e.name == name)
    }

    pub fn new(cc: Option<&eframe::CreationContext<'_>>, options: AppOptions) -> Self {
        let persisted: Persisted = if options.fresh {
            Persisted::default()
        } else {
            cc.and_then(|cc| cc.storage)
                .and_then(|s| eframe::get_value(s, eframe::APP_KEY))
                .unwrap_or_default()
        };
        let draft = options
            .config
            .clone()
            .or_else(|| RunConfig::from_toml_str(&persisted.config_toml, "saved config").ok())
            .unwrap_or_else(|| RunConfig::preset("lecture17").expect("preset"));
        if let Some(cc) = cc {
            install_fallback_font(&cc.egui_ctx);
        }
        let inline = options.inline_trainer || options.frame_budget.is_some();
        let worker = if inline {
            Worker::inline()
        } else {
            Worker::spawn()
        };
        let mut overlays = Vec::new();
        for dir in &persisted.run_dirs {
            if let Ok(r) = RunData::load(dir) {
                overlays.push((r, true));
            }
        }
        let mut app = Self {
            share_string: String::new(),
            persisted,
            draft: draft.clone(),
            field_error: None,
            validated: None,
            running: None,
            run: RunData::new("current"),
            overlays,
            compare: Vec::new(),
            worker,
            playing: false,
            finished: false,
            device: String::new(),
            train_prompts: Vec::new(),
            status: "starting…".into(),
            error: None,
            notice: None,
            inspector_group: 0,
            inspector_iteration: None,
            token_view: tokens::TokenView::default(),
            config_panel: config_panel::ConfigPanel::default(),
            tour: tour::Tour::default(),
            runs_path: "runs".into(),
            rate: (Instant::now(), 0, 0.0),
            measure: Measure::default(),
            inline,
            window_gpu: WindowGpuErrors::default(),
            trainer_gone: false,
            awaiting_start: false,
            frame_budget: options.frame_budget,
            status_sink: options.status_sink,
            record_sink: options.record_sink,
            published: String::new(),
            drops: files::Drops::default(),
            experiment: None,
            experiment_choice: "lecture-table".into(),
            experiment_results: Vec::new(),
            cards: crate::experiment::EXPERIMENTS
                .iter()
                .filter_map(|(name, _)| crate::experiment::Matrix::from_experiment(name).ok())
                .collect(),
            gradient_lab: lab::LabCard::default(),
        };
        app.reset(draft);
        if let Some(tab) = options.tab {
            app.persisted.tab = tab;
        }
        if options.tour {
            tour::start(&mut app);
        }
        if options.autoplay {
            app.worker.send(Command::Play);
        }
        if let Some(secs) = options.measure_secs {
            app.measure.until = Some(Instant::now() + Duration::from_secs_f64(secs));
            app.measure.started = Some(Instant::now());
        }
        app
    }

    /// A new run from `config`.
    pub fn reset(&mut self, config: RunConfig) {
        if self.trainer_gone {
            // The old trainer thread panicked: start a fresh one for the new run.
            self.worker = Worker::spawn();
            self.trainer_gone = false;
        }
        self.run = RunData::new("current");
        self.run.set_smoothing(self.persisted.smoothing);
        self.finished = false;
        self.error = None;
        self.inspector_iteration = None;
        self.running = Some(config.clone());
        self.awaiting_start = true;
        self.worker.send(Command::Reset(Box::new(config)));
        self.pump();
    }

    pub fn send(&mut self, cmd: Command) {
        self.worker.send(cmd);
        self.pump();
    }

    /// Inline mode: let the trainer run its queued work now.
    pub fn pump(&mut self) {
        if let Some(budget) = self.frame_budget {
            self.worker.pump_for(budget);
            self.drain_events();
        } else if self.inline {
            self.worker.pump(100_000);
            self.drain_events();
        }
    }

    /// Read what the trainer sent; never blocks.
    pub fn drain_events(&mut self) {
        let mu = self
            .running
            .as_ref()
            .map(|c| c.algorithm.steps_per_iteration())
            .unwrap_or(1);
        loop {
            let ev = match self.worker.events.try_recv() {
                Ok(ev) => ev,
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    // The trainer thread ended without being asked to: it panicked (its
                    // message is on stderr). The window stays; say so instead of "training".
                    if !self.trainer_gone {
                        self.trainer_gone = true;
                        self.playing = false;
                        self.error = Some(
                            "the trainer stopped unexpectedly (it panicked; see the terminal). \
                             ⟲ Reset starts a new trainer."
                                .into(),
                        );
                    }
                    break;
                }
            };
            match ev {
                Event::Started {
                    device,
                    train_prompts,
                    config,
                } => {
                    self.device = device;
                    self.train_prompts = train_prompts;
                    self.running = Some(*config);
                    self.awaiting_start = false;
                }
                // The old run's last records, sent before the trainer saw the Reset.
                Event::Record(_) if self.awaiting_start => {}
                Event::Record(r) => {
                    if let Some(sink) = self.record_sink {
                        sink(&r);
                    }
                    self.run.push(*r, mu)
                }
                Event::Playing(p) => self.playing = p,
                Event::Finished => self.finished = true,
                Event::Error(e) => {
                    // Also to the log (the browser's console), where the panel is not seen.
                    log::error!("{e}");
                    self.error = Some(e);
                }
            }
        }
        let (t0, n0, _) = self.rate;
        let dt = t0.elapsed().as_secs_f64();
        if dt > 1.0 {
            self.rate = (
                Instant::now(),
                self.run.steps,
                (self.run.steps - n0) as f64 / dt,
            );
        }
    }

    /// `field_error` for the draft, recomputed only when the draft changed (validating every
    /// frame was a tenth of the frame's work).
    fn revalidate(&mut self) {
        if self.validated.as_ref() != Some(&self.draft) {
            self.field_error = self
                .draft
                .validate()
                .err()
                .map(|e| (views::error_key(&e), e.to_string()));
            self.validated = Some(self.draft.clone());
        }
    }

    /// Which config changes need a new run (new model or prompts) rather than a live update.
    pub fn needs_reset(&self) -> bool {
        match &self.running {
            None => true,
            Some(r) => !crate::grpo::Trainer::needs_reset(r, &self.draft).is_empty(),
        }
    }

    /// The run's state, `iteration I/N · step S · reward R`, shared by the status line and
    /// the public status.
    fn progress(&self) -> (&'static str, String) {
        let it = self.run.last.as_ref().map(|r| r.iteration + 1).unwrap_or(0);
        let total = self.running.as_ref().map(|c| c.run.iterations).unwrap_or(0);
        let reward = self
            .run
            .last
            .as_ref()
            .map(|r| format!("{:.3}", r.reward_mean))
            .unwrap_or_else(|| "–".into());
        let state = if self.finished {
            "finished"
        } else if self.playing {
            "training"
        } else {
            "paused"
        };
        let mut line = format!(
            "iteration {it}/{total} · step {} · reward {reward}",
            self.run.steps
        );
        // The run's first step begins with the cold start, one long call (~40 s on burn's
        // lavapipe path) that gives no record: said, so the line does not look stuck.
        if let Some(c) = &self.running
            && self.playing
            && !self.finished
            && self.run.last.is_none()
            && c.sft.steps > 0
        {
            line.push_str(&format!(
                " · cold start: {} supervised steps first",
                c.sft.steps
            ));
        }
        (state, line)
    }

    /// One line for screen readers and tests (the browser's `#status` and title):
    /// `grpo-lab · lecture17 · iteration 37/100 · step 370 · reward 3.41 · training · cpu`.
    pub fn public_status(&self) -> String {
        let name = self
            .running
            .as_ref()
            .map(|c| c.run.name.as_str())
            .unwrap_or("");
        let (state, progress) = self.progress();
        let state = match &self.error {
            // The banner holds the whole text; a status line a title can carry.
            Some(e) if e.chars().count() > 200 => {
                format!("error: {}…", e.chars().take(200).collect::<String>())
            }
            Some(e) => format!("error: {e}"),
            None => state.to_string(),
        };
        let lab = self
            .gradient_lab
            .status()
            .map(|l| format!(" · {l}"))
            .unwrap_or_default();
        let tour = self
            .tour
            .step
            .map(|k| format!(" · tour {}/{}", k + 1, tour::STEPS.len()))
            .unwrap_or_default();
        let device = match self.device.as_str() {
            "" => "no engine",
            d => d,
        };
        format!("grpo-lab · {name} · {progress} · {state} · {device}{lab}{tour}")
    }

    fn status_line(&self) -> String {
        let (state, progress) = self.progress();
        let rate = if self.inline || !self.playing {
            String::new()
        } else {
            format!(" · {:.0} steps/s", self.rate.2)
        };
        format!(
            "{state} · {progress}{rate} · seed {} · {}",
            self.running.as_ref().map(|c| c.run.seed).unwrap_or(0),
            self.device
        )
    }

    fn controls_ui(&mut self, ui: &mut egui::Ui) {
        // One line whatever the status says: the buttons, then the status in the width left
        // (cut with "…", whole on hover), Save PNG at the right end. (Wrapped, a long status
        // — "· N steps/s" while training, a 5-digit iteration, the transformer's engine —
        // took a second line, and everything under the bar jumped as training started.)
        ui.horizontal(|ui| {
            if self.playing {
                if ui
                    .button("‖ Pause")
                    .on_hover_text("Stop after the current step")
                    .clicked()
                {
                    self.send(Command::Pause);
                }
            } else if ui
                .add_enabled(!self.finished, egui::Button::new("▶ Play"))
                .on_hover_text("Train at full speed")
                .clicked()
            {
                self.send(Command::Play);
            }
            if ui
                .add_enabled(
                    !self.playing && !self.finished,
                    egui::Button::new("+1 Step"),
                )
                .on_hover_text("One optimizer step (rolls out first when an iteration begins)")
                .clicked()
            {
                self.send(Command::Step);
            }
            if ui
                .add_enabled(
                    !self.playing && !self.finished,
                    egui::Button::new("+μ Iteration"),
                )
                .on_hover_text(
                    "Run to the end of the current iteration: rollout, then μ optimizer steps",
                )
                .clicked()
            {
                self.send(Command::Iteration);
            }
            if ui
                .button("⟲ Reset")
                .on_hover_text("Start a new run from the config on the left")
                .clicked()
            {
                let c = self.draft.clone();
                self.reset(c);
            }
            if ui
                .add_enabled(!self.tour.active(), egui::Button::new("▶▶ Walk me through"))
                .on_hover_text("One iteration of GRPO, step by step, on this run's panels")
                .clicked()
            {
                tour::start(self);
            }
            ui.separator();
            ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                if ui
                    .button("Save PNG")
                    .on_hover_text("Save the whole window as grpo-lab-window.png")
                    .clicked()
                {
                    plots::save_screenshot(ui.ctx(), None, "grpo-lab-window.png".into());
                }
                ui.with_layout(egui::Layout::left_to_right(egui::Align::Center), |ui| {
                    let w = ui.available_width();
                    mono::truncated(ui, &self.status_line(), mono::Look::PLAIN, w);
                });
            });
        });
        if let Some(e) = &self.error {
            ui.colored_label(egui::Color32::from_rgb(200, 60, 60), format!("⚠ {e}"));
        } else if let Some(n) = &self.notice {
            ui.label(egui::RichText::new(n).weak());
        }
        if let Some((n, last)) = self.window_gpu.summary() {
            ui.colored_label(
                egui::Color32::from_rgb(200, 130, 40),
                format!("⚠ window renderer: {n} wgpu error(s), none fatal; last: {last}"),
            )
            .on_hover_text(
                "Errors on the window's own wgpu device (the trainer never shares it). \
                 Frames with surface errors are skipped or the surface is reconfigured.",
            );
        }
    }

    fn measure_frame(
        &mut self,
        ctx: &egui::Context,
        (ui_ms, ui_cpu_ms): (f64, Option<f64>),
        frame: &eframe::Frame,
    ) {
        let Some(until) = self.measure.until else {
            return;
        };
        if self.measure.done {
            return;
        }
        if self.measure.ui_ms.is_empty() {
            self.measure.steps_at_start = self.run.steps;
        }
        self.measure.ui_ms.push(ui_ms);
        self.measure.ui_cpu_ms.extend(ui_cpu_ms);
        if self.finished && self.measure.trainer_done_at.is_none() {
            self.measure.trainer_done_at = Some(Instant::now());
        }
        if let Some(cpu) = frame.info().cpu_usage {
            self.measure.cpu_ms.push(cpu as f64 * 1000.0);
        }
        if Instant::now() >= until {
            self.measure.done = true;
            let q = |v: &Vec<f64>, p: f64| crate::report::stats::quantile(v, p);
            let secs = self
                .measure
                .started
                .map(|s| s.elapsed().as_secs_f64())
                .unwrap_or(1.0);
            let report = serde_json::json!({
                "frames": self.measure.ui_ms.len(),
                "seconds": secs,
                "fps": self.measure.ui_ms.len() as f64 / secs,
                "app_ui_ms_p50": q(&self.measure.ui_ms, 0.5),
                "app_ui_ms_p95": q(&self.measure.ui_ms, 0.95),
                "app_ui_cpu_ms_p50": q(&self.measure.ui_cpu_ms, 0.5),
                "app_ui_cpu_ms_p95": q(&self.measure.ui_cpu_ms, 0.95),
                "frame_cpu_ms_p50": q(&self.measure.cpu_ms, 0.5),
                "frame_cpu_ms_p95": q(&self.measure.cpu_ms, 0.95),
                "points_in_plots": self.run.steps,
                "trainer_steps_per_sec": (self.run.steps - self.measure.steps_at_start) as f64
                    / self.measure.trainer_done_at.zip(self.measure.started).map(|(d, s)| d.duration_since(s).as_secs_f64()).unwrap_or(secs),
                "device": self.device,
            });
            println!("{report}");
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        }
    }

    /// The whole window; shared by eframe and the tests.
    pub fn draw(&mut self, ui: &mut egui::Ui) {
        if let Some(budget) = self.frame_budget {
            // The browser: the trainer runs here, between frames' drawing, for a bounded time.
            self.worker.pump_for(budget);
        }
        // The trainer thread wakes the window when a step the user asked for arrives.
        self.worker.set_repaint(ui.ctx());
        self.drain_events();
        self.drops.collect(ui.ctx());
        if let Some((name, text)) = self.drops.take() {
            match text.and_then(|t| RunConfig::from_toml_str(&t, &name).map_err(|e| e.to_string()))
            {
                Ok(c) => {
                    self.draft = c;
                    self.notice = Some(format!("loaded {name}; ⟲ Reset runs it"));
                }
                Err(e) => self.error = Some(format!("{name}: {e}")),
            }
        }
        if let Some(e) = &mut self.experiment
            && !e.is_done()
        {
            // Seeds one after another, a slice of each frame (as the trainer in a browser).
            let budget = self.frame_budget.unwrap_or(Duration::from_millis(12));
            if e.advance(budget) && self.persisted.tab == Tab::Runs {
                self.compare = e.bands.clone();
            }
            if let Some(err) = e.error.clone() {
                self.error = Some(format!("experiment {err}"));
            }
            ui.ctx().request_repaint();
        }
        if self.gradient_lab.running() {
            let budget = self.frame_budget.unwrap_or(Duration::from_millis(12));
            self.gradient_lab.advance(budget);
            ui.ctx().request_repaint();
        }
        if let Some(sink) = self.status_sink {
            let line = self.public_status();
            if line != self.published {
                sink(&line);
                self.published = line;
            }
        }
        let controls = egui::Panel::top("controls").show(ui, |ui| {
            ui.add_space(4.0);
            self.controls_ui(ui);
            ui.add_space(2.0);
        });
        self.tour.mark("controls", controls.response.rect);
        egui::Panel::left("config")
            .resizable(true)
            .default_size(300.0)
            .show(ui, |ui| {
                egui::ScrollArea::vertical().show(ui, |ui| views::config_ui(self, ui));
            });
        egui::CentralPanel::default().show(ui, |ui| {
            ui.horizontal(|ui| {
                for (tab, label) in Tab::ALL {
                    ui.selectable_value(&mut self.persisted.tab, tab, label);
                }
            });
            ui.separator();
            match self.persisted.tab {
                Tab::Plots => {
                    self.tour.mark("plots", ui.available_rect_before_wrap());
                    plots::plots_ui(self, ui)
                }
                Tab::Inspector => views::inspector_ui(self, ui),
                Tab::Playground => {
                    egui::ScrollArea::vertical().show(ui, |ui| views::playground_ui(self, ui));
                }
                Tab::Runs => views::runs_ui(self, ui),
                Tab::Experiments => views::experiments_ui(self, ui),
            }
        });
        tour::tour_ui(self, ui.ctx());
        if self.playing && self.frame_budget.is_some() {
            // The trainer runs inside frames: keep them coming.
            ui.ctx().request_repaint();
        } else if self.playing {
            // Cap repaints while training so the trainer keeps the cores.
            ui.ctx().request_repaint_after(Duration::from_millis(100));
        }
    }
}

impl eframe::App for GrpoApp {
    fn ui(&mut self, ui: &mut egui::Ui, frame: &mut eframe::Frame) {
        // The thread's CPU time only while measuring (it is a system call, not a clock read).
        let measuring = self.measure.until.is_some() && !self.measure.done;
        let (t, cpu) = (Instant::now(), measuring.then(thread_cpu_ms).flatten());
        self.draw(ui);
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let cpu = cpu
            .zip(thread_cpu_ms().filter(|_| measuring))
            .map(|(a, b)| b - a);
        let ctx = ui.ctx().clone();
        self.measure_frame(&ctx, (ms, cpu), frame);
        if self.measure.until.is_some() && !self.measure.done {
            // Keep frames coming (at the training cap) even after the trainer finishes.
            ctx.request_repaint_after(Duration::from_millis(100));
        }
    }

    fn save(&mut self, storage: &mut dyn eframe::Storage) {
        self.persisted.config_toml = self.draft.to_toml();
        self.persisted.run_dirs = self
            .overlays
            .iter()
            .filter_map(|(r, _)| r.dir.clone())
            .collect();
        eframe::set_value(storage, eframe::APP_KEY, &self.persisted);
    }
}

/// This thread's CPU time in ms (where the OS tells it): the app's own work without the time
/// its thread waited for a core (on two cores the trainer and the rasterizer's threads compete).
fn thread_cpu_ms() -> Option<f64> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's duration.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        (rc == 0).then(|| ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6)
    }
    #[cfg(not(unix))]
    None
}

/// DejaVu Sans (embedded) after egui's own fonts, for the symbols they lack (▶ ‖ ⟲ ✖ ∅ ✂).
pub fn install_fallback_font(ctx: &egui::Context) {
    use egui::epaint::text::{FontInsert, FontPriority, InsertFontFamily};
    ctx.add_font(FontInsert::new(
        "dejavu-sans",
        egui::FontData::from_static(crate::report::chart::FONT),
        vec![
            InsertFontFamily {
                family: egui::FontFamily::Proportional,
                priority: FontPriority::Lowest,
            },
            InsertFontFamily {
                family: egui::FontFamily::Monospace,
                priority: FontPriority::Lowest,
            },
        ],
    ));
}

/// Whether a display server is reachable (X11 or Wayland).
pub fn display_available() -> bool {
    std::env::var_os("DISPLAY").is_some_and(|d| !d.is_empty())
        || std::env::var_os("WAYLAND_DISPLAY").is_some_and(|d| !d.is_empty())
}

/// Open the window. The window renders on a wgpu device of its own, which eframe creates;
/// it never shares the trainer's (burn/cubecl) device: cubecl installs an uncaptured-error
/// handler on its device that panics, and a device busy with training makes
/// `Surface::configure` (which waits for the device to go idle) fail on a resize.
/// Errors on the window's device are reported in the status area, never fatal.
#[cfg(feature = "native")]
pub fn run_app(options: AppOptions) -> Result<(), String> {
    use eframe::egui_wgpu::{SurfaceErrorAction, wgpu};
    let mut native = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_inner_size([1280.0, 800.0])
            .with_title("grpo-lab — watch GRPO learn"),
        ..Default::default()
    };
    // `wgpu_setup` stays `CreateNew`: eframe opens its own instance, adapter and device.
    let errors = WindowGpuErrors::default();
    let on_status = std::sync::Arc::clone(&native.wgpu_options.on_surface_status);
    let status_errors = errors.clone();
    // When the last reconfigure after a validation error was (at most one a second).
    let last_retry = std::sync::Mutex::new(None::<Instant>);
    native.wgpu_options.on_surface_status =
        std::sync::Arc::new(move |status: &wgpu::CurrentSurfaceTexture| match status {
            // Routine: a resize (reconfigure), a hidden window (skip), a surface to recreate.
            wgpu::CurrentSurfaceTexture::Outdated
            | wgpu::CurrentSurfaceTexture::Occluded
            | wgpu::CurrentSurfaceTexture::Lost => (*on_status)(status),
            // The surface could not be acquired (e.g. its configure failed): configure it
            // again, at most once a second; skip the frame otherwise. (The error itself went
            // to the uncaptured-error handler installed below, which reports it.)
            wgpu::CurrentSurfaceTexture::Validation => {
                let mut last = last_retry.lock().unwrap_or_else(|e| e.into_inner());
                if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    *last = Some(Instant::now());
                    SurfaceErrorAction::Reconfigure
                } else {
                    SurfaceErrorAction::SkipFrame
                }
            }
            other => {
                status_errors.report(&format!("surface: {other:?}; frame skipped"));
                SurfaceErrorAction::SkipFrame
            }
        });
    eframe::run_native(
        "grpo-lab",
        native,
        Box::new(move |cc| {
            errors.set_context(&cc.egui_ctx);
            if let Some(rs) = &cc.wgpu_render_state {
                // wgpu's default handler panics on any uncaptured error; log and show instead.
                let e = errors.clone();
                rs.device
                    .on_uncaptured_error(std::sync::Arc::new(move |err: wgpu::Error| {
                        e.report(&format!("{err}"));
                    }));
                let e = errors.clone();
                rs.device.set_device_lost_callback(move |reason, message| {
                    // `Destroyed` is the window closing.
                    if reason != wgpu::DeviceLostReason::Destroyed {
                        e.report(&format!(
                            "the window's device was lost ({reason:?}): {message}"
                        ));
                    }
                });
            }
            let mut app = GrpoApp::new(Some(cc), options);
            app.window_gpu = errors;
            Ok(Box::new(app))
        }),
    )
    .map_err(|e| e.to_string())
}

pub(crate) fn presets() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _)| *n).collect()
}

#[cfg(test)]
mod tests {
    use super::{AppOptions, GrpoApp, WindowGpuErrors};
    use crate::config::{DeviceChoice, RunConfig};

    #[test]
    fn a_dead_trainer_is_reported_and_reset_starts_a_new_one() {
        let mut config = RunConfig::preset("lecture17").unwrap();
        config.run.iterations = 2;
        config.run.device = DeviceChoice::Cpu;
        let mut app = GrpoApp::new(
            None,
            AppOptions {
                inline_trainer: true,
                config: Some(config.clone()),
                fresh: true,
                ..Default::default()
            },
        );
        // What a panicked trainer thread leaves behind: a channel with no sender.
        app.worker.events = std::sync::mpsc::channel().1;
        app.playing = true;
        app.drain_events();
        assert!(!app.playing);
        assert!(
            app.error
                .as_deref()
                .unwrap_or("")
                .contains("trainer stopped")
        );
        app.device.clear();
        app.reset(config);
        assert!(app.error.is_none());
        let t = std::time::Instant::now();
        while app.device.is_empty() {
            assert!(t.elapsed().as_secs() < 60, "the new trainer never started");
            std::thread::sleep(std::time::Duration::from_millis(20));
            app.drain_events();
        }
        assert!(app.error.is_none(), "{:?}", app.error);
    }

    /// Before the first record the status line says the cold start runs (while playing).
    #[test]
    fn the_status_line_names_the_cold_start_before_the_first_record() {
        let mut config = RunConfig::preset("transformer-sort").unwrap();
        config.run.device = DeviceChoice::Cpu;
        let mut app = GrpoApp::new(
            None,
            AppOptions {
                inline_trainer: true,
                config: Some(config),
                fresh: true,
                ..Default::default()
            },
        );
        let t = std::time::Instant::now();
        while app.device.is_empty() {
            assert!(t.elapsed().as_secs() < 60, "the trainer never started");
            std::thread::sleep(std::time::Duration::from_millis(20));
            app.drain_events();
        }
        assert!(!app.status_line().contains("cold start"), "paused");
        app.playing = true;
        assert!(
            app.status_line()
                .contains("cold start: 100 supervised steps first"),
            "{}",
            app.status_line()
        );
    }

    /// Reset while the trainer thread plays: the old run's records still queued are dropped,
    /// so the new run's series start at its own step 1.
    #[test]
    fn reset_while_training_keeps_no_record_of_the_old_run() {
        let mut config = RunConfig::preset("lecture17").unwrap();
        config.run.iterations = 100_000;
        config.run.device = DeviceChoice::Cpu;
        let mut app = GrpoApp::new(
            None,
            AppOptions {
                inline_trainer: false,
                config: Some(config.clone()),
                fresh: true,
                ..Default::default()
            },
        );
        let wait = |app: &mut GrpoApp, what: &str, done: &dyn Fn(&GrpoApp) -> bool| {
            let t = std::time::Instant::now();
            while !done(app) {
                assert!(t.elapsed().as_secs() < 60, "{what}");
                std::thread::sleep(std::time::Duration::from_millis(5));
                app.drain_events();
            }
        };
        wait(&mut app, "the first run never started", &|a| {
            !a.device.is_empty()
        });
        app.send(super::worker::Command::Play);
        wait(&mut app, "no steps", &|a| a.run.steps > 200);
        // The trainer keeps sending while the Reset travels to it.
        let mut second = config.clone();
        second.run.seed = 11;
        app.reset(second);
        app.send(super::worker::Command::Play);
        wait(&mut app, "the second run never stepped", &|a| {
            a.run.steps > 0
        });
        app.send(super::worker::Command::Pause);
        let last = app.run.last.as_ref().expect("a record");
        assert_eq!(
            last.step, app.run.steps,
            "records of the old run leaked into the new one"
        );
    }

    #[test]
    fn window_gpu_errors_are_kept_as_one_line_and_counted() {
        let e = WindowGpuErrors::default();
        assert_eq!(e.summary(), None);
        e.report(
            "Validation Error\n\nCaused by:\n  In Surface::configure\n    Failed to wait for GPU",
        );
        e.report("surface: Timeout; frame skipped");
        let (n, last) = e.summary().unwrap();
        assert_eq!(n, 2);
        assert_eq!(last, "surface: Timeout; frame skipped");
        e.report(&"x ".repeat(400));
        assert!(e.summary().unwrap().1.chars().count() <= 301);
    }
}

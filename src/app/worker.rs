//! The trainer behind the app: on its own thread (the window never blocks on it), or
//! inline (tests drive it step by step). Commands go in; records and status come out.

use crate::config::RunConfig;
use crate::grpo::Trainer;
use crate::metrics::StepRecord;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::thread::JoinHandle;

#[derive(Debug, Clone)]
pub enum Command {
    Play,
    Pause,
    /// One optimizer step.
    Step,
    /// Up to the end of the current iteration.
    Iteration,
    /// A new run from this config.
    Reset(Box<RunConfig>),
    /// Change knobs that need no new model (algorithm, optimizer, sampling); takes effect at
    /// the next iteration's rollout for the rollout knobs, at the next step for the rest.
    Update(Box<RunConfig>),
    Shutdown,
}

#[derive(Debug, Clone)]
pub enum Event {
    /// A new run started: its device and prompt sets.
    Started {
        device: String,
        train_prompts: Vec<Vec<u32>>,
        config: Box<RunConfig>,
    },
    Record(Box<StepRecord>),
    Playing(bool),
    Finished,
    Error(String),
}

#[cfg(all(target_arch = "wasm32", feature = "web"))]
thread_local! {
    /// Why the browser's WebGPU adapter did not open, once it has failed.
    static NO_ADAPTER: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// A trainer for `config` on the engine `--device` (auto: the fastest) picks, after the
/// memory check a run makes; the reason, when not.
pub(crate) fn start_trainer(config: &RunConfig) -> Result<Trainer, String> {
    crate::train::run::check_memory(config).map_err(|e| e.to_string())?;
    let selected = crate::engine::select(config.run.device, config);
    // In a browser the WebGPU adapter opens asynchronously: start opening it, and the run
    // starts when asked again.
    #[cfg(all(target_arch = "wasm32", feature = "web"))]
    if let Err(crate::gpu::DeviceError::Pending) = &selected {
        // An adapter that failed to open does not open on the next ask either: say why.
        if let Some(why) = NO_ADAPTER.with(|n| n.borrow().clone()) {
            return Err(why);
        }
        let (choice, _) = crate::engine::resolve(config.run.device, config);
        wasm_bindgen_futures::spawn_local(async move {
            if let Err(e) = crate::gpu::Compute::select_async(choice).await {
                // (Its text is the native one, naming drivers: the console keeps it.)
                log::error!("{e}");
                NO_ADAPTER.with(|n| {
                    *n.borrow_mut() = Some(
                        "this browser opened no WebGPU adapter, which this config needs (run.engine = wgsl, run.kernels = gpu, or run.device = gpu | software): open it in a browser with WebGPU (or reload to try again), or set those to auto to train on the CPU engines".into(),
                    )
                });
            }
        });
        return Err(
            "opening the browser's WebGPU adapter: ⟲ Reset in a moment starts the run on it".into(),
        );
    }
    let (compute, why) = selected.map_err(|e| e.to_string())?;
    log::info!("{why}");
    // The window keeps a core: `run.threads = 0` (every core) trains on the others.
    let mut config = config.clone();
    if config.run.threads == 0 {
        config.run.threads = crate::engine::cores::available().saturating_sub(1).max(1);
    }
    Trainer::new(config, compute).map_err(|e| e.to_string())
}

/// The trainer state machine shared by both modes.
struct Core {
    trainer: Option<Trainer>,
    playing: bool,
    /// Steps left to run for `Iteration` while paused.
    pending_steps: usize,
}

impl Core {
    fn new() -> Self {
        Self {
            trainer: None,
            playing: false,
            pending_steps: 0,
        }
    }

    fn handle(&mut self, cmd: Command, tx: &Sender<Event>) -> bool {
        match cmd {
            Command::Play => {
                self.playing = self.trainer.as_ref().is_some_and(|t| !t.is_done());
                let _ = tx.send(Event::Playing(self.playing));
            }
            Command::Pause => {
                self.playing = false;
                self.pending_steps = 0;
                let _ = tx.send(Event::Playing(false));
            }
            Command::Step => self.pending_steps = self.pending_steps.max(1),
            Command::Iteration => {
                if let Some(t) = &self.trainer {
                    self.pending_steps = t.steps_left_in_iteration();
                }
            }
            Command::Reset(config) => {
                self.playing = false;
                self.pending_steps = 0;
                let _ = tx.send(Event::Playing(false));
                match start_trainer(&config) {
                    Ok(t) => {
                        let _ = tx.send(Event::Started {
                            device: t.engine_label(),
                            train_prompts: t.prompts.train.clone(),
                            config,
                        });
                        self.trainer = Some(t);
                    }
                    Err(e) => {
                        // The old run is over either way: no Play may continue it under the
                        // new config the window now shows.
                        self.trainer = None;
                        let _ = tx.send(Event::Error(e));
                    }
                }
            }
            Command::Update(config) => {
                if let Some(t) = &mut self.trainer {
                    // The trainer owns which fields change live; the rest needs a reset.
                    let ignored = t.apply_live(&config);
                    if !ignored.is_empty() {
                        let _ = tx.send(Event::Error(format!(
                            "not applied live (needs a reset): {}",
                            ignored.join(", ")
                        )));
                    }
                }
            }
            Command::Shutdown => return false,
        }
        true
    }

    fn wants_step(&self) -> bool {
        (self.playing || self.pending_steps > 0)
            && self.trainer.as_ref().is_some_and(|t| !t.is_done())
    }

    /// One step; false when the device has not answered yet (try again later).
    fn do_step(&mut self, tx: &Sender<Event>) -> bool {
        let Some(t) = &mut self.trainer else {
            return true;
        };
        // A panic inside a step (a device fault deep in a backend) stops this run, keeps the
        // thread and the records already shown, and says so; ⟲ Reset starts a new run.
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.step()));
        match step {
            Ok(Ok(r)) => {
                let _ = tx.send(Event::Record(Box::new(r)));
            }
            // The device has not answered yet (the WGSL engine in a browser): the same step
            // again on a later frame.
            Ok(Err(e)) if e.is_pending() => return false,
            Ok(Err(e)) => {
                self.playing = false;
                let _ = tx.send(Event::Error(e.to_string()));
                let _ = tx.send(Event::Playing(false));
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                self.playing = false;
                self.pending_steps = 0;
                self.trainer = None;
                let _ = tx.send(Event::Error(format!(
                    "the trainer failed ({what}); its records are kept, ⟲ Reset starts a new run"
                )));
                let _ = tx.send(Event::Playing(false));
                return true;
            }
        }
        self.pending_steps = self.pending_steps.saturating_sub(1);
        if t.is_done() {
            self.playing = false;
            self.pending_steps = 0;
            let _ = tx.send(Event::Finished);
            let _ = tx.send(Event::Playing(false));
        }
        true
    }
}

/// A handle to the trainer.
pub struct Worker {
    tx: Sender<Command>,
    pub events: Receiver<Event>,
    thread: Option<JoinHandle<()>>,
    /// The window to wake when the thread has news the window would otherwise not draw
    /// until the next input: a paused run's requested step, a command's answer.
    repaint: std::sync::Arc<std::sync::OnceLock<egui::Context>>,
    /// Inline mode: the trainer runs inside `pump`, on the caller's thread.
    inline: Option<(Core, Receiver<Command>, Sender<Event>)>,
}

impl Worker {
    /// The trainer on its own thread.
    pub fn spawn() -> Self {
        let (tx, rx) = channel::<Command>();
        let (etx, erx) = channel::<Event>();
        let repaint = std::sync::Arc::new(std::sync::OnceLock::<egui::Context>::new());
        let window = repaint.clone();
        let thread = std::thread::Builder::new()
            .name("grpo-trainer".into())
            .spawn(move || {
                let wake = || {
                    if let Some(ctx) = window.get() {
                        ctx.request_repaint();
                    }
                };
                let mut core = Core::new();
                loop {
                    // Drain commands without blocking while there is work, block otherwise.
                    let cmd = if core.wants_step() {
                        match rx.try_recv() {
                            Ok(c) => Some(c),
                            Err(TryRecvError::Empty) => None,
                            Err(TryRecvError::Disconnected) => return,
                        }
                    } else {
                        match rx.recv() {
                            Ok(c) => Some(c),
                            Err(_) => return,
                        }
                    };
                    if let Some(c) = cmd {
                        if !core.handle(c, &etx) {
                            return;
                        }
                        wake();
                        continue;
                    }
                    core.do_step(&etx);
                    // A step the user asked for while paused (+1 Step, +μ Iteration), or the
                    // last one (finished, failed): the window draws it now. While playing,
                    // the window repaints on its own (capped, so the trainer keeps the cores).
                    if !core.playing {
                        wake();
                    }
                }
            })
            .expect("spawn trainer thread");
        Self {
            tx,
            events: erx,
            thread: Some(thread),
            repaint,
            inline: None,
        }
    }

    /// The trainer inline: commands run when `pump` is called (deterministic, for tests).
    pub fn inline() -> Self {
        let (tx, rx) = channel::<Command>();
        let (etx, erx) = channel::<Event>();
        Self {
            tx,
            events: erx,
            thread: None,
            repaint: Default::default(),
            inline: Some((Core::new(), rx, etx)),
        }
    }

    /// Wake `ctx`'s window when the trainer thread delivers what the window would not
    /// otherwise draw until the next input (set once; later calls are no-ops).
    pub fn set_repaint(&self, ctx: &egui::Context) {
        if self.repaint.get().is_none() {
            let _ = self.repaint.set(ctx.clone());
        }
    }

    pub fn send(&self, cmd: Command) {
        let _ = self.tx.send(cmd);
    }

    /// Inline mode: handle queued commands and run the requested steps (at most `max_steps`).
    pub fn pump(&mut self, max_steps: usize) {
        self.pump_while(|done| done < max_steps);
    }

    /// Inline mode: handle queued commands, then step for at most `budget` (the browser's
    /// frame loop: at least one step when one is wanted, so progress never stalls).
    pub fn pump_for(&mut self, budget: std::time::Duration) {
        let start = web_time::Instant::now();
        self.pump_while(|done| done == 0 || start.elapsed() < budget);
    }

    /// Inline mode: handle queued commands, then step while steps are wanted and `more(steps
    /// done so far)` says so.
    fn pump_while(&mut self, mut more: impl FnMut(usize) -> bool) {
        if let Some((core, rx, etx)) = &mut self.inline {
            while let Ok(c) = rx.try_recv() {
                core.handle(c, etx);
            }
            let mut n = 0;
            while core.wants_step() && more(n) {
                if !core.do_step(etx) {
                    // Waiting for the device: the next frame asks again.
                    break;
                }
                n += 1;
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

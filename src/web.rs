//! The browser entry (feature `web`, wasm32): the same app in a tab. No threads: the trainer
//! runs inside the frame loop for at most [`FRAME_BUDGET`] per frame, on the CPU engines
//! (compiled to wasm with SIMD). The page (`web/index.html`) has a canvas `#grpo_canvas` and
//! an `aria-live` element `#status`; the status line goes there and into `document.title`.
//! `…/index.html#grpo-lab:{…}` (the app's one-line config) starts that run at once.

use crate::app::{AppOptions, GrpoApp};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

/// Training time per frame: the UI keeps ~60 fps.
pub const FRAME_BUDGET: std::time::Duration = std::time::Duration::from_millis(8);

/// Hand `text` to the page's `window.grpoReport(kind, text)`, where the page defines it
/// (`index.html?report`: the tests' hook).
fn report(kind: &str, text: &str) {
    let Some(window) = web_sys::window() else {
        return;
    };
    if let Ok(f) = js_sys::Reflect::get(&window, &"grpoReport".into())
        && let Ok(f) = f.dyn_into::<js_sys::Function>()
    {
        let _ = f.call2(&JsValue::NULL, &kind.into(), &text.into());
    }
}

/// Each iteration's first record, as `{"iteration":…,"reward_mean":…}` (tests compare the
/// rewards with `grpo-lab train`'s).
fn publish_record(r: &crate::metrics::StepRecord) {
    if r.step_in_iteration == 0 {
        let line = serde_json::json!({"iteration": r.iteration, "reward_mean": r.reward_mean});
        report("record", &line.to_string());
    }
}

/// The page's `#status` element and title.
fn publish_status(line: &str) {
    let line = &format!("{line} · wasm");
    report("status", line);
    let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
        return;
    };
    doc.set_title(line);
    if let Some(el) = doc.get_element_by_id("status") {
        el.set_text_content(Some(line));
    }
}

/// The config in the URL's hash (`#grpo-lab:{…}`, percent-encoded or not), if any.
fn config_from_hash() -> Option<Result<crate::config::RunConfig, String>> {
    let hash = web_sys::window()?.location().hash().ok()?;
    let hash = hash.strip_prefix('#').unwrap_or(&hash);
    if hash.is_empty() {
        return None;
    }
    let text = js_sys::decode_uri_component(hash)
        .ok()
        .and_then(|s| s.as_string())
        .unwrap_or_else(|| hash.to_string());
    // A plain anchor (`#top`) is no config; a config without its `grpo-lab:` is one written
    // by hand, told what it lacks.
    if !(text.starts_with("grpo-lab") || text.trim_start().starts_with('{')) {
        return None;
    }
    Some(crate::app::views::parse_share_string(&text))
}

/// `?tab=plots|inspector|playground|runs|experiments`: the tab to open (links to a view, screenshots).
fn tab_from_query() -> Option<crate::app::Tab> {
    let search = web_sys::window()?.location().search().ok()?;
    let value = search
        .trim_start_matches('?')
        .split('&')
        .find_map(|kv| kv.strip_prefix("tab="))?;
    crate::app::Tab::from_name(value).ok()
}

/// Whether the URL's query holds `kv` (`?lab=gradient`: the gradient lab's card runs at once).
fn query_has(kv: &str) -> bool {
    web_sys::window()
        .and_then(|w| w.location().search().ok())
        .is_some_and(|q| q.trim_start_matches('?').split('&').any(|x| x == kv))
}

/// Called by wasm-bindgen when the module loads.
/// `?render=gl`: the window drawn with WebGL2 even where WebGPU is there (training may still
/// use WebGPU). Headless Chromium's GPU process fails presenting a WebGPU canvas, and some
/// drivers draw WebGPU canvases badly; WebGL2 works on both.
fn web_options() -> eframe::WebOptions {
    let mut options = eframe::WebOptions::default();
    let gl = web_sys::window()
        .and_then(|w| w.location().search().ok())
        .is_some_and(|q| {
            q.trim_start_matches('?')
                .split('&')
                .any(|kv| kv == "render=gl")
        });
    if gl && let eframe::egui_wgpu::WgpuSetup::CreateNew(new) = &mut options.wgpu_options.wgpu_setup
    {
        new.instance_descriptor.backends = eframe::wgpu::Backends::GL;
    }
    options
}

#[wasm_bindgen(start)]
pub fn start() {
    eframe::WebLogger::init(log::LevelFilter::Info).ok();
    wasm_bindgen_futures::spawn_local(async {
        let Some(doc) = web_sys::window().and_then(|w| w.document()) else {
            return;
        };
        let Some(canvas) = doc
            .get_element_by_id("grpo_canvas")
            .and_then(|e| e.dyn_into::<web_sys::HtmlCanvasElement>().ok())
        else {
            publish_status("grpo-lab · error · the page has no <canvas id=grpo_canvas>");
            return;
        };
        let (config, hash_error) = match config_from_hash() {
            Some(Ok(c)) => (Some(c), None),
            Some(Err(e)) => (None, Some(e)),
            None => (None, None),
        };
        let autoplay = config.is_some();
        // A run that asks for a wgpu device (`run.device = gpu`, or `run.engine = wgsl`):
        // WebGPU's adapter and device are promises, opened here once so the trainer finds them.
        if let Some(c) = &config {
            let (choice, _) = crate::engine::resolve(c.run.device, c);
            if choice != crate::config::DeviceChoice::Cpu
                && let Err(e) = crate::gpu::Compute::select_async(choice).await
            {
                log::warn!("{e}");
            }
        }
        let started = eframe::WebRunner::new()
            .start(
                canvas,
                web_options(),
                Box::new(move |cc| {
                    let mut app = GrpoApp::new(
                        Some(cc),
                        AppOptions {
                            config,
                            autoplay,
                            frame_budget: Some(FRAME_BUDGET),
                            status_sink: Some(publish_status),
                            record_sink: Some(publish_record),
                            ..Default::default()
                        },
                    );
                    if let Some(tab) = tab_from_query() {
                        app.persisted.tab = tab;
                    }
                    if query_has("tour=1") {
                        crate::app::tour::start(&mut app);
                    }
                    if query_has("lab=gradient") {
                        app.persisted.tab = crate::app::Tab::Experiments;
                        app.gradient_lab.start();
                    }
                    if let Some(e) = hash_error {
                        app.error = Some(format!("the link's config: {e}"));
                    }
                    Ok(Box::new(app))
                }),
            )
            .await;
        if let Err(e) = started {
            publish_status(&format!("grpo-lab · error · the app did not start: {e:?}"));
        }
    });
}

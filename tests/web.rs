//! The browser build in headless Chromium (issue: grpo-lab in a browser tab). `.ci/run` builds
//! `web/dist` (`web/build.sh`) and installs Debian's `chromium` first; locally, without them,
//! these tests say so and pass — under `CI` they fail instead.
//!
//! A tiny static server (std only) serves `web/dist` and collects what the page reports with
//! `index.html?report`: the status line (`#status`), each iteration's reward, errors.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

fn dist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("web/dist")
}

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// The browser and the bundle, or `None` (a skip, said on stderr) off CI.
fn prerequisites() -> Option<&'static str> {
    let browser = chromium();
    let built = dist().join("index.html").exists() && dist().join("grpo_lab_bg.wasm").exists();
    match (browser, built) {
        (Some(b), true) => Some(b),
        _ => {
            let why = format!(
                "web test skipped: {}{}",
                if built {
                    ""
                } else {
                    "no web/dist (run web/build.sh); "
                },
                if browser.is_some() {
                    ""
                } else {
                    "no chromium (apt-get install chromium)"
                }
            );
            assert!(std::env::var_os("CI").is_none(), "{why}");
            eprintln!("{why}");
            None
        }
    }
}

#[derive(Default)]
struct Reports {
    /// (seconds since the server started, status line)
    status: Vec<(f64, String)>,
    records: Vec<serde_json::Value>,
    errors: Vec<String>,
}

struct Server {
    port: u16,
    reports: Arc<Mutex<Reports>>,
}

fn serve() -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let reports = Arc::new(Mutex::new(Reports::default()));
    let (r, start) = (reports.clone(), Instant::now());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let r = r.clone();
            std::thread::spawn(move || {
                let _ = handle(stream, &r, start);
            });
        }
    });
    Server { port, reports }
}

fn handle(stream: TcpStream, reports: &Mutex<Reports>, start: Instant) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request)? == 0 {
            return Ok(());
        }
        let mut parts = request.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let path = target.split(['?', '#']).next().unwrap_or("/");
        let (status, kind, bytes) = if method == "POST" {
            let text = String::from_utf8_lossy(&body).to_string();
            let mut r = reports.lock().unwrap();
            match path {
                "/report/status" => r.status.push((start.elapsed().as_secs_f64(), text)),
                "/report/record" => r.records.extend(serde_json::from_str(&text).ok()),
                _ => r.errors.push(text),
            }
            ("204 No Content", "text/plain", Vec::new())
        } else {
            let name = if path == "/" {
                "index.html"
            } else {
                &path[1..]
            };
            match std::fs::read(dist().join(name))
                .ok()
                .filter(|_| !name.contains(".."))
            {
                Some(b) => {
                    let kind = match name.rsplit('.').next() {
                        Some("html") => "text/html; charset=utf-8",
                        Some("js") => "text/javascript",
                        Some("wasm") => "application/wasm",
                        _ => "application/octet-stream",
                    };
                    ("200 OK", kind, b)
                }
                None => ("404 Not Found", "text/plain", b"not found".to_vec()),
            }
        };
        write!(
            out,
            "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\r\n",
            bytes.len()
        )?;
        out.write_all(&bytes)?;
        out.flush()?;
    }
}

/// Chromium on `url`, headless, WebGL2 for the window (no WebGPU flags: egui falls back).
fn open(browser: &str, url: &str, profile: &Path) -> Child {
    open_with(browser, url, profile, &[])
}

fn open_with(browser: &str, url: &str, profile: &Path, extra: &[&str]) -> Child {
    Command::new(browser)
        .args([
            "--headless=new",
            "--no-sandbox",
            // Containers often have a small /dev/shm.
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--window-size=1280,800",
            &format!("--user-data-dir={}", profile.display()),
        ])
        .args(extra)
        .arg(url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium")
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `iteration I/N` and `step S` from a status line.
fn parse_status(line: &str) -> Option<(usize, usize)> {
    let after = |key: &str| -> Option<usize> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    Some((after("iteration ")?, after("step ")?))
}

fn hash_of(config: &grpo_lab::config::RunConfig) -> String {
    // Percent-encode what a URL fragment may not hold as is.
    grpo_lab::app::views::share_string(config)
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b':' | b',' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A link with a config in its hash plays that run in the tab: the status line advances, the
/// reward changes, no error reaches the console, and the first 50 iterations' rewards are those
/// `grpo-lab train` writes for the same config and seed on the CPU.
#[test]
fn a_link_plays_lecture17_in_the_tab_as_the_cli_does() {
    let Some(browser) = prerequisites() else {
        return;
    };
    let dir = common::temp_dir("web-lecture17");
    let mut config = grpo_lab::config::RunConfig::preset("lecture17").unwrap();
    config.run.iterations = 300;
    config.run.device = grpo_lab::config::DeviceChoice::Cpu;
    let server = serve();
    let url = format!(
        "http://127.0.0.1:{}/index.html?report#{}",
        server.port,
        hash_of(&config)
    );
    let _chrome = Killed(open(browser, &url, &dir.join("profile")));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let r = server.reports.lock().unwrap();
        let done =
            r.records.len() >= 50 && r.status.last().is_some_and(|(_, s)| s.contains("finished"));
        if done || Instant::now() > deadline {
            break;
        }
    }
    let r = server.reports.lock().unwrap();
    let statuses: Vec<&String> = r.status.iter().map(|(_, s)| s).collect();
    assert!(r.errors.is_empty(), "console errors: {:?}", r.errors);
    let its: Vec<usize> = statuses
        .iter()
        .filter_map(|s| parse_status(s))
        .map(|(i, _)| i)
        .collect();
    assert!(
        its.iter().max() > its.iter().min(),
        "the iteration never advanced: {statuses:?}"
    );
    assert!(
        statuses
            .iter()
            .any(|s| s.contains("lecture17") && s.contains("wasm")),
        "{statuses:?}"
    );
    // Steps per second in the tab, from the status lines' times (a measurement, not a limit).
    let timed: Vec<(f64, usize)> = r
        .status
        .iter()
        .filter_map(|(t, s)| parse_status(s).map(|(_, step)| (*t, step)))
        .filter(|(_, step)| *step > 0)
        .collect();
    if let (Some(first), Some(last)) = (timed.first(), timed.last())
        && last.0 > first.0
    {
        eprintln!(
            "lecture17 in headless Chromium: {:.0} optimizer steps/s ({} steps in {:.2} s)",
            (last.1 - first.1) as f64 / (last.0 - first.0),
            last.1 - first.1,
            last.0 - first.0
        );
    }
    // The same run on the CLI.
    let cli_dir = dir.join("cli");
    std::fs::write(dir.join("config.toml"), config.to_toml()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .args(["train", "--quiet", "--config"])
        .arg(dir.join("config.toml"))
        .arg("--out")
        .arg(&cli_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: BTreeMap<usize, f32> = grpo_lab::train::read_metrics(&cli_dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|r| r.step_in_iteration == 0)
        .map(|r| (r.iteration, r.reward_mean))
        .collect();
    let tab: BTreeMap<usize, f32> = r
        .records
        .iter()
        .map(|v| {
            (
                v["iteration"].as_u64().unwrap() as usize,
                v["reward_mean"].as_f64().unwrap() as f32,
            )
        })
        .collect();
    assert!(tab.len() >= 50, "{} iterations reported", tab.len());
    for it in 0..50 {
        assert_eq!(tab.get(&it), cli.get(&it), "iteration {it}: tab vs CLI");
    }
}

/// What a run on WebGPU in the tab reported, or `None` where this Chromium offers no WebGPU
/// adapter at all (said on stderr).
struct TabRun {
    statuses: Vec<String>,
    /// (seconds since the page was asked for, status line)
    timed: Vec<(f64, String)>,
    /// Each iteration's first record's reward.
    rewards: BTreeMap<usize, f32>,
}

/// Play `config` (with `run.engine = wgsl`) in headless Chromium with WebGPU on, until its
/// status says it finished, an error reached the console, or `limit` passed; `query` is added
/// to the page's query (`&tab=runs`). The window is drawn with WebGL2 (`render=gl`): headless
/// Chromium's GPU process dies presenting a WebGPU canvas; the training still runs on WebGPU.
/// Its adapter is Chromium's own SwiftShader (Vulkan on the CPU, its Subzero JIT), not the
/// system's lavapipe; the developer features put its name in the status line.
fn play_on_webgpu(
    browser: &str,
    config: &grpo_lab::config::RunConfig,
    dir: &Path,
    (limit, query): (Duration, &str),
) -> Option<TabRun> {
    let server = serve();
    let url = format!(
        "http://127.0.0.1:{}/index.html?report&render=gl{}#{}",
        server.port,
        query,
        hash_of(config)
    );
    let _chrome = Killed(open_with(
        browser,
        &url,
        &dir.join("profile"),
        &[
            "--enable-unsafe-webgpu",
            "--enable-features=Vulkan",
            "--use-vulkan=native",
            "--enable-webgpu-developer-features",
        ],
    ));
    let deadline = Instant::now() + limit;
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let r = server.reports.lock().unwrap();
        let done =
            r.status.last().is_some_and(|(_, s)| s.contains("finished")) || !r.errors.is_empty();
        if done || Instant::now() > deadline {
            break;
        }
    }
    let r = server.reports.lock().unwrap();
    // A browser without WebGPU at all (no adapter of any kind) cannot run these tests.
    if r.errors.iter().any(|e| e.contains("adapters seen: none")) {
        eprintln!(
            "skipped: this Chromium offers no WebGPU adapter ({:?})",
            r.errors
        );
        return None;
    }
    assert!(r.errors.is_empty(), "console errors: {:?}", r.errors);
    let statuses: Vec<String> = r.status.iter().map(|(_, s)| s.clone()).collect();
    assert!(
        statuses.last().is_some_and(|s| s.contains("finished")),
        "did not finish in {limit:?}: {:?}",
        statuses.last()
    );
    let rewards = r
        .records
        .iter()
        .map(|v| {
            (
                v["iteration"].as_u64().unwrap() as usize,
                v["reward_mean"].as_f64().unwrap() as f32,
            )
        })
        .collect();
    Some(TabRun {
        statuses,
        timed: r.status.clone(),
        rewards,
    })
}

/// Each iteration's reward of `config` trained by the CLI on lavapipe (`--device software`),
/// or `None` where no software adapter is there.
fn cli_rewards(config: &grpo_lab::config::RunConfig, dir: &Path) -> Option<BTreeMap<usize, f32>> {
    let cli_dir = dir.join("cli");
    std::fs::write(dir.join("config.toml"), config.to_toml()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .args(["train", "--quiet", "--device", "software", "--config"])
        .arg(dir.join("config.toml"))
        .arg("--out")
        .arg(&cli_dir)
        .output()
        .unwrap();
    out.status.success().then(|| {
        grpo_lab::train::read_metrics(&cli_dir.join("metrics.jsonl"))
            .unwrap()
            .into_iter()
            .filter(|r| r.step_in_iteration == 0)
            .map(|r| (r.iteration, r.reward_mean))
            .collect()
    })
}

/// With `run.engine = wgsl` the lecture model trains on the WGSL engine over WebGPU in the tab
/// (one submission per iteration, read back asynchronously between frames): the status line
/// names the engine, the iterations advance to the end, the reward rises, no console error;
/// the first iterations' rewards are those of the same run on the CLI's WGSL engine (on
/// lavapipe), until a float rounding of the two devices tips a sampled token.
#[test]
fn the_wgsl_engine_trains_on_webgpu_in_the_tab() {
    let Some(browser) = prerequisites() else {
        return;
    };
    let dir = common::temp_dir("web-wgsl");
    let mut config = grpo_lab::config::RunConfig::preset("lecture17").unwrap();
    config.run.iterations = 60;
    config.run.engine = grpo_lab::config::EngineChoice::Wgsl;
    let Some(run) = play_on_webgpu(browser, &config, &dir, (Duration::from_secs(150), "")) else {
        return;
    };
    assert!(
        run.statuses
            .iter()
            .any(|s| s.contains("WGSL lecture engine")),
        "not on the WGSL engine: {:?}",
        run.statuses
    );
    let tab = run.rewards;
    assert_eq!(tab.len(), 60, "{tab:?}");
    let mean = |its: std::ops::Range<usize>| -> f32 {
        its.clone().map(|i| tab[&i]).sum::<f32>() / its.len() as f32
    };
    assert!(
        mean(50..60) > mean(0..10),
        "the reward did not rise: {tab:?}"
    );
    // The same run on the CLI (lavapipe): the opening iterations agree.
    if let Some(cli) = cli_rewards(&config, &dir) {
        for it in 0..3 {
            assert_eq!(tab.get(&it), cli.get(&it), "iteration {it}: tab vs CLI");
        }
    }
    eprintln!(
        "lecture17 on WebGPU in headless Chromium: reward {:.3} → {:.3}; {:?}",
        mean(0..10),
        mean(50..60),
        run.statuses.last()
    );
}

/// With `run.engine = wgsl` the transformer trains on its WGSL engine over WebGPU in the tab
/// (transformer-sort, shrunk: its cold start, rollouts with the KV cache, dynamic sampling's
/// redraws, the steps — each call's read-back collected on a later frame): the status line
/// names the engine, the run finishes, no console error, and the rewards are those of the
/// same run on the CLI's WGSL engine on lavapipe.
#[test]
fn the_wgsl_transformer_trains_on_webgpu_in_the_tab() {
    let Some(browser) = prerequisites() else {
        return;
    };
    let dir = common::temp_dir("web-wgsl-transformer");
    let overrides: Vec<String> = [
        "algorithm.prompts_per_iteration=8",
        "sft.steps=20",
        "sft.examples=128",
        "sft.batch_size=32",
        "run.eval_every=0",
        "run.checkpoint_every=0",
        "run.engine=wgsl",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut config = grpo_lab::config::RunConfig::preset("transformer-sort")
        .unwrap()
        .with_overrides(&overrides)
        .unwrap();
    config.run.iterations = 3;
    let started = Instant::now();
    // The runs tab: its frames draw less than the plots' (the software-drawn window and
    // SwiftShader share the two cores), and each device call's answer waits for a frame.
    let limit = (Duration::from_secs(240), "&tab=runs");
    let Some(run) = play_on_webgpu(browser, &config, &dir, limit) else {
        return;
    };
    let in_tab = started.elapsed();
    for (t, s) in &run.timed {
        eprintln!("{t:7.2} s  {s}");
    }
    assert!(
        run.statuses
            .iter()
            .any(|s| s.contains("WGSL transformer engine")),
        "not on the WGSL transformer engine: {:?}",
        run.statuses
    );
    let tab = run.rewards;
    assert_eq!(tab.len(), 3, "{tab:?}");
    let cli = cli_rewards(&config, &dir);
    eprintln!(
        "transformer-sort (shrunk) on WebGPU in headless Chromium, {in_tab:.1?}: rewards {tab:?}, CLI {cli:?}; {:?}",
        run.statuses.last()
    );
    if let Some(cli) = cli {
        for it in 0..3 {
            assert_eq!(tab.get(&it), cli.get(&it), "iteration {it}: tab vs CLI");
        }
    }
}

/// The transformer trains in the tab too (burn's CPU backend compiled to wasm, or the fused
/// engine where it covers the config).
#[test]
fn transformer_sort_runs_in_the_tab() {
    let Some(browser) = prerequisites() else {
        return;
    };
    let dir = common::temp_dir("web-transformer");
    let config = grpo_lab::config::RunConfig::preset("transformer-sort").unwrap();
    let server = serve();
    let url = format!(
        "http://127.0.0.1:{}/index.html?report#{}",
        server.port,
        hash_of(&config)
    );
    let _chrome = Killed(open(browser, &url, &dir.join("profile")));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut reached = 0;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let r = server.reports.lock().unwrap();
        assert!(r.errors.is_empty(), "console errors: {:?}", r.errors);
        reached = r.records.len();
        if reached >= 3 {
            break;
        }
    }
    let r = server.reports.lock().unwrap();
    assert!(
        reached >= 3,
        "transformer-sort: {reached} iterations in 120 s; status: {:?}",
        r.status.last()
    );
    eprintln!("transformer-sort in the tab: {:?}", r.status.last());
}

/// `?tour=1` starts the guided iteration in the tab: the page's status says which step.
#[test]
fn a_link_starts_the_guided_iteration() {
    let Some(browser) = prerequisites() else {
        return;
    };
    let dir = common::temp_dir("web-tour");
    let server = serve();
    let url = format!(
        "http://127.0.0.1:{}/index.html?report&tour=1&tab=inspector",
        server.port
    );
    let _chrome = Killed(open(browser, &url, &dir.join("profile")));
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen = None;
    while Instant::now() < deadline && seen.is_none() {
        std::thread::sleep(Duration::from_millis(250));
        let r = server.reports.lock().unwrap();
        assert!(r.errors.is_empty(), "console errors: {:?}", r.errors);
        seen = r
            .status
            .iter()
            .find(|(_, s)| s.contains(" · tour 1/8"))
            .map(|(_, s)| s.clone());
    }
    let r = server.reports.lock().unwrap();
    assert!(
        seen.is_some(),
        "no \"tour 1/8\" in the status: {:?}",
        r.status.last()
    );
}

/// A screenshot of the page while it trains (WebGL2 renders in headless screenshots), kept in
/// `target/web-screenshot.png` to look at.
#[test]
fn the_page_renders() {
    let Some(browser) = prerequisites() else {
        return;
    };
    let dir = common::temp_dir("web-shot");
    let server = serve();
    // The preset's 100 iterations: done within the virtual time budget (a page that repaints
    // without end never lets the budget run out).
    let config = grpo_lab::config::RunConfig::preset("lecture17").unwrap();
    let url = format!("http://127.0.0.1:{}/#{}", server.port, hash_of(&config));
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/web-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    let mut child = Command::new(browser)
        .args([
            "--headless=new",
            "--no-sandbox",
            // Containers often have a small /dev/shm.
            "--disable-dev-shm-usage",
            "--window-size=1280,800",
            "--virtual-time-budget=8000",
            &format!("--user-data-dir={}", dir.join("profile").display()),
            &format!("--screenshot={}", shot.display()),
            &url,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium --screenshot did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.success());
    let png = std::fs::read(&shot).expect("a screenshot");
    let img = image::load_from_memory(&png).unwrap().to_rgba8();
    // Not a blank page: many distinct colours (text, plots).
    let distinct: std::collections::HashSet<[u8; 4]> = img.pixels().map(|p| p.0).collect();
    assert!(
        distinct.len() > 50,
        "{} colours in {}",
        distinct.len(),
        shot.display()
    );
    eprintln!(
        "screenshot: {} ({} colours)",
        shot.display(),
        distinct.len()
    );
}

/// `?lab=gradient`: the gradient lab's card runs in the tab (a slice of each frame) to the end,
/// with the numbers `grpo-lab gradient-lab --preset lecture17` prints for the same θ.
#[test]
fn the_gradient_lab_runs_in_the_tab_as_the_cli_does() {
    let Some(browser) = prerequisites() else {
        return;
    };
    let dir = common::temp_dir("web-gradient-lab");
    let server = serve();
    let url = format!(
        "http://127.0.0.1:{}/index.html?report&lab=gradient",
        server.port
    );
    let _chrome = Killed(open(browser, &url, &dir.join("profile")));
    let deadline = Instant::now() + Duration::from_secs(180);
    let done = loop {
        std::thread::sleep(Duration::from_millis(250));
        let r = server.reports.lock().unwrap();
        if let Some((t, s)) = r
            .status
            .iter()
            .find(|(_, s)| s.contains("gradient lab done"))
        {
            break Some((*t, s.clone()));
        }
        if Instant::now() > deadline || !r.errors.is_empty() {
            break None;
        }
    };
    let r = server.reports.lock().unwrap();
    assert!(r.errors.is_empty(), "console errors: {:?}", r.errors);
    let (seconds, status) =
        done.unwrap_or_else(|| panic!("no 'gradient lab done' in 180 s: {:?}", r.status.last()));
    eprintln!("gradient lab in headless Chromium: done {seconds:.1} s after the server started");
    let out = Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .args(["gradient-lab", "--preset", "lecture17", "--json", "--quiet"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let number = |key: &str| -> f64 {
        let rest = &status[status
            .find(key)
            .unwrap_or_else(|| panic!("{key} in {status}"))
            + key.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    assert!(status.contains("exact true"), "{status}");
    let j = cli["j"].as_f64().unwrap();
    assert!((number("· J ") - j).abs() < 1e-4, "{status} vs J {j}");
    let best = cli["estimators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["cosine_mean"].as_f64().unwrap())
        .fold(f64::MIN, f64::max);
    assert!(
        (number("cosine ") - best).abs() < 1e-3,
        "{status} vs best cosine {best}"
    );
}

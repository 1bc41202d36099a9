//! Benchmarks behind `grpo-lab bench` and `grpo-lab bench-rollout`: the GRPO step of a
//! config (median ms per optimizer step, its parts, peak memory, optionally against the
//! vectorized PyTorch reference), scaling curves around a config, and the WGSL rollout
//! kernels against the Rust reference. The CLI parses the arguments, builds the config and
//! opens the device; everything here takes plain options and prints the report.
//!
//! Native only: it reads `/proc`, runs Python, writes charts and times with `Instant`.

use crate::config::{RewardKind, RunConfig};
use crate::gpu::Compute;
use crate::grpo::{Timings, Trainer};
use crate::objective::advantage;
use crate::report::stats::{median, quantile};
use crate::task::RewardFn;
use anyhow::Result;
use std::path::{Path, PathBuf};

pub mod host;

/// A mistake in what the user asked for (a bad config or argument, a missing adapter): the
/// CLI prints it as is and exits with 2. Any other error is the program's.
#[derive(Debug)]
pub struct UserError(pub String);

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

/// Wrap anything printable as a [`UserError`].
pub fn user(e: impl std::fmt::Display) -> anyhow::Error {
    UserError(e.to_string()).into()
}

/// What `grpo-lab bench` times and how it reports.
#[derive(Debug, Clone, Default)]
pub struct BenchOptions {
    /// The preset's name, shown in the report (`None`: "config").
    pub preset: Option<String>,
    /// Iterations to time (after one warm-up iteration).
    pub iterations: usize,
    /// One JSON object instead of text.
    pub json: bool,
    /// Also time the vectorized PyTorch reference (bench/reference) with this Python.
    pub pytorch: Option<String>,
    /// Threads for PyTorch.
    pub pytorch_threads: usize,
    /// Scaling curves instead, written to this directory.
    pub scaling: Option<PathBuf>,
    /// Also time burn's autodiff path (`run.engine = burn`) on the same device.
    pub vs_burn: bool,
    /// `--threads`: the fused engines' threads for every point of a sweep (default 1, so the
    /// size axes compare with earlier sweeps); the sweep's threads axis varies them.
    pub threads: Option<usize>,
    /// `--axes`: which of a sweep's axes run.
    pub axes: SweepAxes,
}

/// The axes of a scaling sweep that run (`bench --scaling DIR --axes sizes,threads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepAxes {
    /// The size axes (B·G, n, D; the transformer's D, layers, B·G and `max_len`).
    pub sizes: bool,
    /// The fused engines' threads axis: 1, 2, 4, … every core, timed in turn.
    pub threads: bool,
}

impl Default for SweepAxes {
    fn default() -> Self {
        Self {
            sizes: true,
            threads: true,
        }
    }
}

/// The threads axis of a sweep: 1, 2, 4, … and every core this machine has.
fn thread_counts() -> Vec<usize> {
    let all = crate::engine::cores::available();
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |x| Some(x * 2))
        .take_while(|&x| x < all)
        .collect();
    v.push(all);
    v
}

/// `grpo-lab bench`: the step time of `config` on `compute` (or, with
/// [`BenchOptions::scaling`], the scaling curves around it).
pub fn bench(config: RunConfig, compute: &Compute, options: &BenchOptions) -> Result<()> {
    match &options.scaling {
        Some(out) => bench_scaling(&config, compute, options, out),
        None => bench_step(config, compute, options),
    }
}

/// Median ms per optimizer step (rollout share included) over `iterations` iterations after
/// one warm-up iteration.
pub fn time_config(config: RunConfig, compute: &Compute, iterations: usize) -> Result<f64> {
    Ok(time_config_cpu(config, compute, iterations)?.0)
}

/// [`time_config`] and the median on-CPU ms per step of this process (all its threads; `None`
/// where `/proc` does not tell): on a shared machine the wall time also counts the waits for
/// a core, the CPU time does not.
pub fn time_config_cpu(
    mut config: RunConfig,
    compute: &Compute,
    iterations: usize,
) -> Result<(f64, Option<f64>)> {
    config.run.iterations = iterations + 1;
    config.run.log_groups = 0;
    // The training step is measured (and compared with PyTorch), not pass@k's evaluation.
    config.run.eval_every = 0;
    let mu = config.algorithm.mu;
    let mut trainer = Trainer::new(config, compute.clone()).map_err(user)?;
    for _ in 0..mu {
        trainer.step().map_err(user)?;
    }
    let mut per_step = Vec::new();
    let mut cpu_per_step = Vec::new();
    for _ in 0..iterations {
        let cpu = process_cpu_ns();
        let t = std::time::Instant::now();
        for _ in 0..mu {
            trainer.step().map_err(user)?;
        }
        per_step.push(t.elapsed().as_secs_f64() * 1000.0 / mu as f64);
        if let (Some(a), Some(b)) = (cpu, process_cpu_ns()) {
            cpu_per_step.push(b.saturating_sub(a) as f64 / 1e6 / mu as f64);
        }
    }
    let cpu = (cpu_per_step.len() == iterations).then(|| median(&cpu_per_step));
    Ok((median(&per_step), cpu))
}

/// Nanoseconds this process's live threads have run on a CPU (Linux: the first field of
/// `/proc/self/task/*/schedstat`).
pub fn process_cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let path = entry.ok()?.path().join("schedstat");
        let text = std::fs::read_to_string(path).ok()?;
        total += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// The device as a chart's title names it: a wgpu label `wgpu (NAME (DETAILS), BACKEND, TYPE)`
/// by its adapter's name alone (`llvmpipe`), which keeps the title inside the chart; any other
/// label as it is.
fn chart_device(label: &str) -> &str {
    let Some(inner) = label.strip_prefix("wgpu (") else {
        return label;
    };
    let name = inner.rsplitn(3, ", ").nth(2).unwrap_or(inner);
    name.split(" (").next().unwrap_or(name)
}

/// Step time as one dimension grows at a time around the config; the local log-log slope
/// tells overhead-bound (≈ 0) from compute-bound (≈ 1 for B×G and n, ≈ 2 for D).
pub fn bench_scaling(
    base: &RunConfig,
    compute: &Compute,
    options: &BenchOptions,
    out: &Path,
) -> Result<()> {
    if base.model.kind == crate::config::ModelKind::Transformer {
        return bench_scaling_transformer(base, compute, options, out);
    }
    // The size axes on `--threads` (default 1, so they compare with earlier sweeps).
    let base = &base
        .with_overrides(&[format!("run.threads={}", options.threads.unwrap_or(1))])
        .map_err(user)?;
    let axes: [(&str, &str, Vec<usize>); 3] = [
        (
            "B·G",
            "algorithm.prompts_per_iteration",
            vec![1, 4, 16, 64, 256, 1024, 4096],
        ),
        ("n", "task.n", vec![4, 8, 16, 32]),
        ("D", "model.d_model", vec![8, 16, 32, 64, 128, 256]),
    ];
    let g = base.algorithm.num_generations;
    if options.axes.threads && !options.axes.sizes && compute.is_wgpu() {
        return Err(user(
            "--axes threads: the threads axis is the fused CPU engines' (--device cpu); on a wgpu device an engine has no threads",
        ));
    }
    let mut series = Vec::new();
    let mut table = String::from("axis,value,size,ms_per_step,slope\n");
    println!(
        "scaling around {} on {} ({} iterations per point):",
        options.preset.as_deref().unwrap_or("config"),
        compute.label,
        options.iterations
    );
    let axes = if options.axes.sizes { &axes[..] } else { &[] };
    for (name, key, values) in axes {
        let mut pts: Vec<(f64, f64)> = Vec::new();
        for &v in values {
            let mut sets = vec![format!("{key}={v}")];
            if *key == "algorithm.prompts_per_iteration" {
                sets.push(format!(
                    "task.train_size={}",
                    (v * 2).max(base.task.train_size)
                ));
            }
            let config = base.with_overrides(&sets).map_err(user)?;
            let ms = time_config(config, compute, options.iterations)?;
            let size = if *key == "algorithm.prompts_per_iteration" {
                v * g
            } else {
                v
            };
            let slope = pts
                .last()
                .map(|&(x0, y0)| (ms.log10() - y0) / ((size as f64).log10() - x0))
                .unwrap_or(f64::NAN);
            println!("  {name:>4} = {size:>6}: {ms:>9.3} ms/step   local slope {slope:>5.2}");
            table.push_str(&format!("{name},{v},{size},{ms:.4},{slope:.3}\n"));
            pts.push(((size as f64).log10(), ms.log10()));
        }
        series.push(crate::report::Series::line(
            format!("{name} (others at the preset)"),
            pts,
        ));
    }
    if !compute.is_wgpu() {
        // The fused step's threads axis (on a wgpu device the engine has no threads).
        threads_axis(base, compute, options, (&mut series, &mut table), "")?;
    }
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("scaling.csv"), table)?;
    let charts = crate::report::line_chart(
        out,
        "scaling",
        &format!(
            "step time vs size on {} (log10–log10)",
            chart_device(&compute.label)
        ),
        "log10(size: B·G responses, n, D, or threads)",
        "log10(ms per optimizer step)",
        &series,
    )?;
    println!("table: {}", out.join("scaling.csv").display());
    println!("chart: {}", charts[0].display());
    Ok(())
}

/// One axis of the transformer's sweep: its name, the values on the fused engine and the
/// (fewer) values on burn's path, and the overrides for one value.
struct Axis {
    name: &'static str,
    fused: &'static [usize],
    burn: &'static [usize],
    sets: fn(usize, &RunConfig) -> Vec<String>,
    /// The size plotted for a value (responses for B·G).
    size: fn(usize, &RunConfig) -> usize,
}

/// The transformer sweep's axes: each varied alone around the base config.
fn transformer_axes() -> [Axis; 4] {
    let one = |v: usize, _: &RunConfig| v;
    [
        Axis {
            name: "D",
            fused: &[32, 64, 128, 256],
            burn: &[32, 64, 128],
            sets: |v, _| vec![format!("model.d_model={v}")],
            size: one,
        },
        Axis {
            name: "layers",
            fused: &[1, 2, 3, 4],
            burn: &[1, 2, 4],
            sets: |v, _| vec![format!("model.layers={v}")],
            size: one,
        },
        Axis {
            name: "B·G",
            fused: &[4, 16, 32, 128, 512],
            burn: &[4, 32, 128],
            sets: |v, c| {
                vec![
                    format!("algorithm.prompts_per_iteration={v}"),
                    format!("task.train_size={}", (v * 2).max(c.task.train_size)),
                ]
            },
            size: |v, c| v * c.algorithm.num_generations,
        },
        Axis {
            name: "max_len",
            fused: &[8, 16, 32, 64],
            burn: &[8, 16, 32],
            sets: |v, c| {
                vec![
                    format!("task.max_len={v}"),
                    format!("model.context={}", (c.task.n + v).max(c.model.context)),
                ]
            },
            size: one,
        },
    ]
}

/// The transformer sweep's engines (name, the override, where, legend): the fused engine on the
/// CPU; with a wgpu device the WGSL transformer engine on it (burn's points on lavapipe, where a
/// step is seconds); burn's path on the run's device.
fn sweep_engines<'a>(
    compute: &'a Compute,
    cpu: &'a Compute,
) -> Vec<(&'static str, &'static str, &'a Compute, &'static str)> {
    let mut engines = vec![("fused", "run.fused_step=auto", cpu, "fused engine")];
    if compute.gpu.is_some() {
        engines.push(("wgsl", "run.engine=wgsl", compute, "WGSL engine"));
    }
    engines.push(("burn", "run.fused_step=off", compute, "burn's path, dashed"));
    engines
}

/// The transformer's scaling sweep: D, layers, B·G and `max_len` one at a time around the
/// preset, on the fused engine (on the CPU) and on burn's autodiff path (`run.fused_step=off`,
/// fewer points: it is 6× slower) — and, on a wgpu device, the WGSL engine (burn's points) —
/// without the cold start or dynamic sampling (a step's cost, not a
/// recipe's), so responses have init's lengths (`<eos>` drawn with ≈ 1/V chance per token).
fn bench_scaling_transformer(
    base: &RunConfig,
    compute: &Compute,
    options: &BenchOptions,
    out: &Path,
) -> Result<()> {
    let base = base
        .with_overrides(&[
            "sft.steps=0".to_string(),
            "algorithm.dynamic_sampling=false".to_string(),
            format!("run.threads={}", options.threads.unwrap_or(1)),
        ])
        .map_err(user)?;
    let axes = transformer_axes();
    let mut series = Vec::new();
    let mut table = String::from("engine,axis,value,size,cpu_ms_per_step,wall_ms_per_step,slope\n");
    println!(
        "scaling around {} on {} ({} iterations per point; no cold start, no dynamic sampling):",
        options.preset.as_deref().unwrap_or("config"),
        compute.label,
        options.iterations
    );
    let cpu = Compute::cpu();
    let engines = if options.axes.sizes {
        sweep_engines(compute, &cpu)
    } else {
        Vec::new()
    };
    // On a hardware GPU the WGSL engine takes the fused engine's points (its larger shapes are
    // where a GPU could pay) and is timed on the wall clock: the host mostly waits for the
    // device there, and on-CPU time would not count the device's work.
    let hardware = compute
        .gpu
        .as_ref()
        .is_some_and(|g| !g.summary.is_software());
    for (engine, set, on, legend) in engines {
        for axis in &axes {
            let values = if engine == "fused" || (engine == "wgsl" && hardware) {
                axis.fused
            } else {
                axis.burn
            };
            let mut pts: Vec<(f64, f64)> = Vec::new();
            for &v in values {
                let mut sets = (axis.sets)(v, &base);
                sets.push(set.to_string());
                let config = base.with_overrides(&sets).map_err(user)?;
                let (wall, cpu) = time_config_cpu(config, on, options.iterations)?;
                // On-CPU time where known (the sweep runs minutes on a shared machine), but
                // wall time for the engines on a hardware GPU.
                let (ms, clock) = match cpu {
                    Some(cpu) if !(hardware && engine != "fused") => (cpu, "on CPU"),
                    _ => (wall, "wall  "),
                };
                let size = (axis.size)(v, &base);
                let slope = pts
                    .last()
                    .map(|&(x0, y0)| (ms.log10() - y0) / ((size as f64).log10() - x0))
                    .unwrap_or(f64::NAN);
                println!(
                    "  {engine:>5} {:>7} = {size:>5}: {ms:>9.3} ms/step {clock} (wall {wall:>9.3})   local slope {slope:>5.2}",
                    axis.name
                );
                table.push_str(&format!(
                    "{engine},{},{v},{size},{ms:.4},{wall:.4},{slope:.3}\n",
                    axis.name
                ));
                pts.push(((size as f64).log10(), ms.log10()));
            }
            let mut line = crate::report::Series::line(format!("{} ({legend})", axis.name), pts);
            line.dashed = engine == "burn";
            series.push(line);
        }
    }
    threads_axis(&base, &cpu, options, (&mut series, &mut table), "fused,")?;
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("scaling.csv"), table)?;
    let charts = crate::report::line_chart(
        out,
        "scaling",
        &format!(
            "transformer step time vs size on {} (log10–log10)",
            chart_device(&compute.label)
        ),
        "log10(size: D, layers, B·G responses, max_len, or threads)",
        if hardware {
            "log10(ms per optimizer step: on-CPU for the fused engine, wall on the GPU)"
        } else {
            "log10(on-CPU ms per optimizer step)"
        },
        &series,
    )?;
    println!("table: {}", out.join("scaling.csv").display());
    println!("chart: {}", charts[0].display());
    Ok(())
}

/// One point of the threads axis: threads, wall ms per step, the local log-log slope.
type ThreadsRow = (usize, f64, f64);

/// The threads axis where `--axes` asks for it: its line into the chart's series, its rows
/// into the CSV table (`engine` the transformer table's first column, with its comma; its
/// on-CPU column empty, as wall time is what threads shorten).
fn threads_axis(
    base: &RunConfig,
    compute: &Compute,
    options: &BenchOptions,
    (series, table): (&mut Vec<crate::report::Series>, &mut String),
    engine: &str,
) -> Result<()> {
    if !options.axes.threads {
        return Ok(());
    }
    let (line, rows) = threads_sweep(base, compute, options)?;
    series.push(line);
    let cpu = if engine.is_empty() { "" } else { "," };
    for (threads, wall, slope) in rows {
        table.push_str(&format!(
            "{engine}threads,{threads},{threads},{cpu}{wall:.4},{slope:.3}\n"
        ));
    }
    Ok(())
}

/// The sweep's threads axis: the fused engine at the base config on 1, 2, 4, … every core, in
/// wall time (on-CPU time adds the threads up); its line and `(threads, ms, local slope)` rows.
/// Every thread count's trainer is warmed up first, then their timed iterations alternate
/// ([`time_in_turn`]): on a shared machine whose speed drifts, the speed-ups compare
/// iterations timed moments apart.
fn threads_sweep(
    base: &RunConfig,
    compute: &Compute,
    options: &BenchOptions,
) -> Result<(crate::report::Series, Vec<ThreadsRow>)> {
    let counts = thread_counts();
    let mut trainers = Vec::with_capacity(counts.len());
    for threads in &counts {
        let mut config = base
            .with_overrides(&[format!("run.threads={threads}")])
            .map_err(user)?;
        config.run.iterations = options.iterations + 1;
        config.run.log_groups = 0;
        config.run.eval_every = 0;
        trainers.push(warm_up(&config, compute)?.0);
    }
    let mu = base.algorithm.mu;
    let (timed, load) = host::measured(|| {
        let mut each: Vec<&mut Trainer> = trainers.iter_mut().collect();
        time_in_turn(&mut each, options.iterations, mu)
    });
    let timed = timed?;
    drop(trainers);
    println!(
        "  the thread counts' timed iterations alternate{}",
        load.map(|l| format!(" (the machine meanwhile: {})", l.phrase()))
            .unwrap_or_default()
    );
    let one = &timed[0].per_step;
    let mut pts: Vec<(f64, f64)> = Vec::new();
    let mut rows = Vec::new();
    for (&threads, t) in counts.iter().zip(&timed) {
        let wall = median(&t.per_step);
        let each: Vec<f64> = (one.iter().zip(&t.per_step)).map(|(a, b)| a / b).collect();
        println!(
            "  fused threads = {threads:>3}: {wall:>9.3} ms/step wall   speed-up {:>5.2}×   (iteration by iteration: median {:.2}×, p10 {:.2}×, p90 {:.2}×)",
            median(one) / wall,
            median(&each),
            quantile(&each, 0.1),
            quantile(&each, 0.9),
        );
        let slope = pts
            .last()
            .map(|&(x0, y0)| (wall.log10() - y0) / ((threads as f64).log10() - x0))
            .unwrap_or(f64::NAN);
        rows.push((threads, wall, slope));
        pts.push(((threads as f64).log10(), wall.log10()));
    }
    let line = crate::report::Series::line("threads (fused engine, wall ms)", pts);
    Ok((line, rows))
}

/// The step time of one config: median ms per optimizer step, its parts, the first step,
/// peak memory, and optionally the PyTorch reference's on the same weights and prompts.
fn bench_step(mut config: RunConfig, compute: &Compute, options: &BenchOptions) -> Result<()> {
    config.run.iterations = options.iterations + 1;
    config.run.log_groups = 0;
    config.run.eval_every = 0;
    let mu = config.algorithm.mu;
    let (warm, first_load) = host::measured(|| warm_up(&config, compute));
    let (mut trainer, [setup_ms, cold_start_ms, first_step_ms]) = warm?;
    // burn's path (`--vs-burn`) is warmed up before the timed iterations, which then take the
    // two engines in turn: a machine whose speed drifts over minutes moves both alike.
    let (burn_warm, burn_load) = warm_burn(&config, compute, options.vs_burn)?;
    let (mut burn_trainer, burn_times) = burn_warm.unzip();
    let counts_before = trainer.engine().device_counts();
    let (ours, burn_timed, timed_load) =
        time_with_burn(&mut trainer, burn_trainer.as_mut(), options.iterations, mu)?;
    let Timed {
        per_step,
        cpu_per_step,
        rollout_steps,
        plain_steps,
        parts,
    } = ours;
    let ms = median(&per_step);
    let counts = trainer.engine().device_counts();
    let parts_json = parts_json(&parts, mu);
    let memory_mib = peak_rss_mib();
    let (pytorch, pytorch_load) = match &options.pytorch {
        Some(python) => {
            host::measured(|| pytorch_reference(python, &config, &trainer, options).map(Some))
        }
        None => (Ok(None), None),
    };
    let pytorch = pytorch?;
    // What else the machine ran while each phase was timed (steal: the hypervisor's).
    let host_load = host::phases_json(&[
        ("timed", timed_load),
        ("first_step", first_load),
        ("burn", burn_load),
        ("pytorch", pytorch_load),
    ]);
    let mut report = serde_json::json!({
        "preset": options.preset,
        "device": compute.label,
        "engine": trainer.engine_label(),
        "threads": trainer.engine().threads(),
        "shape": {
            "prompts_per_iteration": config.batch_prompts(trainer.prompts.train.len()),
            "num_generations": config.algorithm.num_generations,
            "n": config.task.n, "vocab": config.task.vocab, "d_model": config.model.d_model, "mu": mu,
        },
        "iterations_timed": options.iterations,
        "ms_per_step": ms,
        "ms_per_step_p10": quantile(&per_step, 0.1),
        "ms_per_step_p90": quantile(&per_step, 0.9),
        "cpu_ms_per_step": Some(median(&cpu_per_step)).filter(|&ms| ms > 0.0), // 0: too short
        "first_step_ms": first_step_ms,
        "setup_ms": setup_ms,
        "dispatches_per_step": counts.map(|c| c.dispatches_per_step),
        "dispatches_per_rollout": counts.map(|c| c.dispatches_per_rollout),
        "submissions_per_iteration": counts.zip(counts_before).map(|(after, before)| {
            (after.submissions - before.submissions) as f64 / options.iterations as f64
        }),
        "cold_start_ms": cold_start_ms,
        "rollout_step_ms": median(&rollout_steps),
        "optimizer_step_ms": median(&plain_steps),
        "parts_ms_per_step": parts_json,
        "peak_rss_mib": memory_mib,
        "host_load": host_load,
        "pytorch": pytorch,
        "ratio_vs_pytorch": pytorch.as_ref().map(|p| ms / p["ms_per_step"].as_f64().unwrap_or(f64::NAN)),
        // The same ratio in on-CPU time (both processes), where both report it.
        "cpu_ratio_vs_pytorch": pytorch.as_ref().and_then(|p| {
            let theirs = p["cpu_ms_per_step"].as_f64()?;
            Some(median(&cpu_per_step) / theirs).filter(|&r| r.is_finite() && r > 0.0)
        }),
        // The spread: our fast tail against PyTorch's slow one, and the other way round.
        "ratio_range": pytorch.as_ref().map(|p| {
            let theirs = |k: &str| p[k].as_f64().unwrap_or(f64::NAN);
            [
                quantile(&per_step, 0.1) / theirs("ms_per_step_p90"),
                quantile(&per_step, 0.9) / theirs("ms_per_step_p10"),
            ]
        }),
    });
    if let (Some(map), serde_json::Value::Object(burn)) = (
        report.as_object_mut(),
        burn_json(
            (burn_trainer.as_ref(), burn_times),
            burn_timed.as_ref(),
            (&per_step, first_step_ms),
        ),
    ) {
        map.extend(burn);
    }
    if options.json {
        println!("{report}");
    } else {
        print_step_report(&report, config.sft.steps);
    }
    Ok(())
}

/// Each part's share of one optimizer step (ms), median over the timed iterations.
fn parts_json(parts: &[Timings], mu: usize) -> serde_json::Value {
    let part = |get: fn(&Timings) -> f64| {
        median(
            &parts
                .iter()
                .map(|p| get(p) * 1000.0 / mu as f64)
                .collect::<Vec<_>>(),
        )
    };
    serde_json::json!({
        "rollout": part(|p| p.rollout),
        "advantages": part(|p| p.advantages),
        "old_ref_logp": part(|p| p.old_ref_logp),
        "evaluation": part(|p| p.evaluation),
        "step": part(|p| p.step),
    })
}

/// `--vs-burn`'s fields of `bench`'s report (null without it): burn's path's median ms per
/// step, its first step and cold start (`warm`: [`warm_up`]'s times), the speed-ups, and each
/// iteration's ratio, burn's over ours, the two timed back to back ([`time_in_turn`]).
fn burn_json(
    (trainer, warm): (Option<&Trainer>, Option<[f64; 3]>),
    timed: Option<&Timed>,
    (ours, first_step_ms): (&[f64], f64),
) -> serde_json::Value {
    let burn_ms = timed.map(|b| median(&b.per_step));
    let ms = median(ours);
    serde_json::json!({
        // What `--vs-burn` timed against, named as its trainer names it.
        "burn_engine": trainer.map(|t| t.engine_label()),
        "burn_ms_per_step": burn_ms,
        "speedup_vs_burn": burn_ms.map(|b| b / ms),
        "speedup_vs_burn_by_iteration": timed.map(|b| {
            b.per_step.iter().zip(ours).map(|(theirs, ours)| theirs / ours).collect::<Vec<_>>()
        }),
        "burn_first_step_ms": warm.map(|w| w[2]),
        "burn_cold_start_ms": warm.map(|w| w[1]),
        "first_step_speedup_vs_burn": warm.map(|w| w[2] / first_step_ms),
    })
}

/// [`time_in_turn`] for `bench`: ours, and burn's path where given; each one's times and the
/// machine's load meanwhile.
fn time_with_burn(
    ours: &mut Trainer,
    burn: Option<&mut Trainer>,
    iterations: usize,
    mu: usize,
) -> Result<(Timed, Option<Timed>, Option<host::HostLoad>)> {
    let (timed, load) = host::measured(|| {
        let mut trainers: Vec<&mut Trainer> = std::iter::once(ours).chain(burn).collect();
        time_in_turn(&mut trainers, iterations, mu)
    });
    let mut timed = timed?.into_iter();
    Ok((timed.next().unwrap_or_default(), timed.next(), load))
}

/// A trainer past its first iteration and [`warm_up`]'s times.
type Warm = (Trainer, [f64; 3]);

/// burn's path warmed up for `--vs-burn` (its trainer and [`warm_up`]'s times; `None` without
/// it), and the machine's load meanwhile.
fn warm_burn(
    config: &RunConfig,
    compute: &Compute,
    vs_burn: bool,
) -> Result<(Option<Warm>, Option<host::HostLoad>)> {
    if !vs_burn {
        return Ok((None, None));
    }
    let (warm, load) = host::measured(|| warm_up(&burn_config(config), compute));
    Ok((Some(warm?), load))
}

/// The config on burn's autodiff path (same device), for `--vs-burn`'s speed-ups: warmed up as
/// [`bench_step`] warms the engine, so its first step (cold start included) is measured in the
/// same run, and then timed in turn with it ([`time_in_turn`]).
fn burn_config(config: &RunConfig) -> RunConfig {
    let mut burn = config.clone();
    burn.run.engine = crate::config::EngineChoice::Burn;
    // On the CPU `run.engine` picks nothing (the fused engines take what they cover unless
    // `run.fused_step = off`): without this, `--device cpu --vs-burn` timed the fused engine
    // against itself.
    burn.run.fused_step = crate::config::FusedChoice::Off;
    burn
}

/// `iterations` rounds of one whole iteration of each trainer in turn (ours first; for
/// `--vs-burn` burn's path, for the threads axis each thread count), so that a machine whose
/// speed drifts moves them alike: each trainer's times. Between two trainers the bench waits
/// out the last one's idle workers, which spin a moment before they sleep, and wakes the next
/// one's, which slept meanwhile (in a run they spin from one job to the next).
fn time_in_turn(trainers: &mut [&mut Trainer], iterations: usize, mu: usize) -> Result<Vec<Timed>> {
    let mut timed: Vec<Timed> = trainers.iter().map(|_| Timed::default()).collect();
    let alone = trainers.len() == 1;
    for _ in 0..iterations {
        for (trainer, t) in trainers.iter_mut().zip(&mut timed) {
            if !alone {
                std::thread::sleep(crate::engine::cores::IDLE_SPIN * 2);
                trainer.engine().cores().wake();
            }
            t.extend(time_iterations(trainer, 1, mu)?);
        }
    }
    Ok(timed)
}

/// `bench-rollout`'s sizes within what it allows.
fn check_rollout_options(a: &RolloutBenchOptions) -> Result<()> {
    // A vocabulary of at least 2, as task.vocab.
    for (name, value, min, max) in [
        ("--prompts", a.prompts, 1, 1 << 20),
        ("--generations", a.generations, 1, 1 << 12),
        ("--n", a.n, 1, 64),
        ("--vocab", a.vocab, 2, 1024),
        ("--repeats", a.repeats, 1, 1000),
    ] {
        if !(min..=max).contains(&value) {
            return Err(user(format!("{name} {value}: allowed {min}..={max}")));
        }
    }
    let floats = a.prompts as u128 * (a.generations as u128 + a.vocab as u128) * a.n as u128;
    if floats > 1 << 28 {
        return Err(user(format!(
            "--prompts × (--generations + --vocab) × --n = {floats} values: over the 2^28 this benchmark allows (1 GiB of f32)"
        )));
    }
    Ok(())
}

/// A trainer past its first iteration, and how long it took (ms) to build its engine (the WGSL
/// engine compiles its shaders there), to run the supervised cold start (when the config has
/// one; timed apart so the first step's own warm-up shows) and to reach the first step's end.
fn warm_up(config: &RunConfig, compute: &Compute) -> Result<(Trainer, [f64; 3])> {
    let setup = std::time::Instant::now();
    let mut trainer = Trainer::new(config.clone(), compute.clone()).map_err(user)?;
    let setup_ms = setup.elapsed().as_secs_f64() * 1000.0;
    let t0 = std::time::Instant::now();
    trainer.cold_start().map_err(user)?;
    let cold_start_ms = t0.elapsed().as_secs_f64() * 1000.0;
    trainer.step().map_err(user)?;
    let first_step_ms = t0.elapsed().as_secs_f64() * 1000.0;
    while !trainer.at_iteration_boundary() {
        trainer.step().map_err(user)?;
    }
    Ok((trainer, [setup_ms, cold_start_ms, first_step_ms]))
}

/// Per-step times of the timed iterations (ms) and each iteration's parts.
#[derive(Default)]
struct Timed {
    per_step: Vec<f64>,
    cpu_per_step: Vec<f64>,
    rollout_steps: Vec<f64>,
    plain_steps: Vec<f64>,
    parts: Vec<Timings>,
}

impl Timed {
    /// `later`'s iterations after these.
    fn extend(&mut self, later: Timed) {
        self.per_step.extend(later.per_step);
        self.cpu_per_step.extend(later.cpu_per_step);
        self.rollout_steps.extend(later.rollout_steps);
        self.plain_steps.extend(later.plain_steps);
        self.parts.extend(later.parts);
    }
}

/// Times `iterations` whole iterations of `mu` steps each.
fn time_iterations(trainer: &mut Trainer, iterations: usize, mu: usize) -> Result<Timed> {
    let mut t = Timed::default();
    for _ in 0..iterations {
        trainer.reset_timings();
        let cpu = process_cpu_ns();
        let started = std::time::Instant::now();
        for _ in 0..mu {
            let r = trainer.step().map_err(user)?;
            let ms = r.step_time_secs as f64 * 1000.0;
            if r.step_in_iteration == 0 {
                t.rollout_steps.push(ms);
            } else {
                t.plain_steps.push(ms);
            }
        }
        t.per_step
            .push(started.elapsed().as_secs_f64() * 1000.0 / mu as f64);
        if let (Some(a), Some(b)) = (cpu, process_cpu_ns()) {
            t.cpu_per_step
                .push(b.saturating_sub(a) as f64 / 1e6 / mu as f64);
        }
        t.parts.push(trainer.timings());
    }
    Ok(t)
}

/// A number of a report (NaN where it is absent).
fn num(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The phases of `bench`'s `host_load`, as its report names them.
const HOST_PHASES: &[(&str, &str)] = &[
    ("timed", "timed steps"),
    ("first_step", "first step"),
    ("burn", "burn's first step"),
    ("pytorch", "PyTorch"),
];

/// `bench`'s report for a reader.
fn print_step_report(report: &serde_json::Value, sft_steps: usize) {
    let ms = num(&report["ms_per_step"]);
    println!(
        "{} on {} ({})",
        report["preset"].as_str().unwrap_or("config"),
        report["device"].as_str().unwrap_or("?"),
        report["engine"].as_str().unwrap_or("?"),
    );
    println!(
        "  ms/step (median, rollout share included): {ms:.3}  [p10 {:.3}, p90 {:.3}]",
        num(&report["ms_per_step_p10"]),
        num(&report["ms_per_step_p90"])
    );
    for line in host::report_lines(&report["host_load"], HOST_PHASES) {
        println!("{line}");
    }
    println!(
        "  first step (its first-use costs included: a device's kernel compilation): {:.1} ms, of which the cold start ({sft_steps} supervised steps) {:.1} ms; building the engine (the WGSL engine compiles its shaders there) {:.1} ms",
        num(&report["first_step_ms"]),
        num(&report["cold_start_ms"]),
        num(&report["setup_ms"])
    );
    if let (Some(step), Some(rollout), Some(subs)) = (
        report["dispatches_per_step"].as_u64(),
        report["dispatches_per_rollout"].as_u64(),
        report["submissions_per_iteration"].as_f64(),
    ) {
        println!(
            "  device work: {step} dispatches per optimizer step, {rollout} per rollout; {subs:.1} submissions per iteration (μ = {})",
            report["shape"]["mu"]
        );
    }
    if let Some(b) = report["burn_ms_per_step"].as_f64() {
        println!(
            "  burn's autodiff path on the same device ({}): {b:.3} ms/step, first step {:.1} ms (cold start {:.1} ms); this engine is {:.1}× faster per step, {:.1}× on the first step",
            report["burn_engine"].as_str().unwrap_or("?"),
            num(&report["burn_first_step_ms"]),
            num(&report["burn_cold_start_ms"]),
            b / ms,
            num(&report["first_step_speedup_vs_burn"]),
        );
        if let Some(pairs) = report["speedup_vs_burn_by_iteration"].as_array() {
            let pairs: Vec<String> = pairs.iter().map(|p| format!("{:.1}×", num(p))).collect();
            println!(
                "  the two engines' timed iterations alternated (ours, then burn's); per iteration: {}",
                pairs.join(", ")
            );
        }
    }
    println!(
        "  first step of an iteration (rollout + step): {:.3} ms; other steps: {:.3} ms",
        num(&report["rollout_step_ms"]),
        num(&report["optimizer_step_ms"])
    );
    let parts = &report["parts_ms_per_step"];
    println!(
        "  parts per step (ms, median): rollout {:.3} · advantages {:.3} · log π_old/π_ref {:.3} · evaluation {:.3} · step (forward, backward, Adam) {:.3}",
        num(&parts["rollout"]),
        num(&parts["advantages"]),
        num(&parts["old_ref_logp"]),
        num(&parts["evaluation"]),
        num(&parts["step"]),
    );
    if let Some(m) = report["peak_rss_mib"].as_f64() {
        println!("  peak resident memory: {m:.0} MiB");
    }
    if report["pytorch"].is_object() {
        print_pytorch(report);
    }
}

/// The PyTorch reference's lines of `bench`'s report.
fn print_pytorch(report: &serde_json::Value) {
    let (p, ms) = (&report["pytorch"], num(&report["ms_per_step"]));
    println!(
        "  vectorized PyTorch {} ({} thread): {:.3} ms/step [p10 {:.3}, p90 {:.3}], first step {:.1} ms; greedy answers at init agree",
        p["torch"].as_str().unwrap_or("?"),
        p["threads"],
        num(&p["ms_per_step"]),
        num(&p["ms_per_step_p10"]),
        num(&p["ms_per_step_p90"]),
        num(&p["first_step_ms"]),
    );
    if let Some(parts) = p.get("parts_ms_per_step").filter(|x| x.is_object()) {
        println!(
            "  PyTorch parts per step (ms, median): rollout {:.3} · advantages {:.3} · log π_old/π_ref {:.3} · evaluation {:.3} · forward + backward {:.3} · optimizer {:.3}",
            num(&parts["rollout"]),
            num(&parts["advantages"]),
            num(&parts["old_ref_logp"]),
            num(&parts["evaluation"]),
            num(&parts["forward_backward"]),
            num(&parts["optimizer"]),
        );
        println!(
            "  PyTorch first step {:.1} ms, of which the cold start {:.1} ms; peak resident memory {:.0} MiB ({:.0} MiB after `import torch`)",
            num(&p["first_step_ms"]),
            num(&p["cold_start_ms"]),
            num(&p["peak_rss_mib"]),
            num(&p["rss_after_import_mib"]),
        );
    }
    if let Some(r) = p.get("no_cache") {
        let their_ms = num(&r["ms_per_step"]);
        println!(
            "  PyTorch recomputing the prefix (no KV cache): {:.3} ms/step [p10 {:.3}, p90 {:.3}] (rollout {:.3}, evaluation {:.3}), ratio {:.2}×",
            their_ms,
            num(&r["ms_per_step_p10"]),
            num(&r["ms_per_step_p90"]),
            num(&r["parts_ms_per_step"]["rollout"]),
            num(&r["parts_ms_per_step"]["evaluation"]),
            ms / their_ms
        );
    }
    if let Some(r) = p.get("reordered") {
        let their_ms = num(&r["ms_per_step"]);
        println!(
            "  PyTorch with grpo-lab's order of products (not the baseline): {:.3} ms/step [p10 {:.3}, p90 {:.3}], ratio {:.2}×",
            their_ms,
            num(&r["ms_per_step_p10"]),
            num(&r["ms_per_step_p90"]),
            ms / their_ms
        );
    }
    let range = |i: usize| num(&report["ratio_range"][i]);
    println!(
        "  ratio grpo-lab / PyTorch: {:.2}× [{:.2}, {:.2}] (medians; p10/p90 against p90/p10; < 1 is faster)",
        num(&report["ratio_vs_pytorch"]),
        range(0),
        range(1)
    );
    if let Some(r) = report["cpu_ratio_vs_pytorch"].as_f64() {
        println!(
            "  on-CPU time per step (waits for a core excluded): grpo-lab {:.3} ms, PyTorch {:.3} ms, ratio {r:.2}×",
            num(&report["cpu_ms_per_step"]),
            num(&p["cpu_ms_per_step"]),
        );
    }
}

/// Peak resident memory of this process (Linux), in MiB.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Run `bench/reference/grpo_ref.py` on the trainer's initial weights and prompts; refuse to
/// report a ratio unless both implementations give the same greedy responses and rewards at init.
fn pytorch_reference(
    python: &str,
    config: &RunConfig,
    trainer: &Trainer,
    options: &BenchOptions,
) -> Result<serde_json::Value> {
    use crate::model::lecture::{LecturePolicy, LectureWeights};
    if config.model.kind == crate::config::ModelKind::Transformer {
        return pytorch_transformer(python, config, trainer, options);
    }
    let (t, m) = (&config.task, &config.model);
    let w = LectureWeights::init(t.vocab, t.n, m.d_model, m.init_scale, config.run.seed);
    let prompts = &trainer.prompts.train;
    let spec = serde_json::json!({
        "seed": config.run.seed,
        "shape": {
            "vocab": t.vocab, "n": t.n, "d_model": m.d_model,
            "num_generations": config.algorithm.num_generations, "mu": config.algorithm.mu,
            "prompts_per_iteration": config.batch_prompts(prompts.len()),
        },
        "lr": config.optimizer.lr,
        "weights": { "embedding": w.embedding, "encode": w.encode, "decode": w.decode },
        "prompts": prompts,
        "iterations": options.iterations,
        "warmup": 2,
    });
    let report = run_reference(python, &spec, options)?;
    // The same weights must give the same greedy answers and rewards in both implementations.
    let device = burn::tensor::Device::flex();
    let model = LecturePolicy::from_weights(&w, t.vocab, t.n, m.d_model, &device);
    let flat: Vec<i64> = prompts.iter().flatten().map(|&x| x as i64).collect();
    let logits = model.forward(burn::tensor::Tensor::from_data(
        burn::tensor::TensorData::new(flat, [prompts.len(), t.n]),
        &device,
    ));
    let logits: Vec<f32> = logits.into_data().try_to_vec::<f32>().expect("f32");
    let greedy = crate::objective::sampling::argmax_rows(&logits, t.vocab);
    let reward_fn = RewardFn::from_task(t);
    let theirs = report["greedy_rewards"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut disagree = 0;
    for (i, (p, resp)) in prompts.iter().zip(greedy.chunks(t.n)).enumerate() {
        let ours = reward_fn.reward(p, resp) as f64;
        if theirs.get(i).and_then(|x| x.as_f64()) != Some(ours) {
            disagree += 1;
        }
    }
    if disagree > 0 || theirs.len() != prompts.len() {
        return Err(user(format!(
            "the PyTorch reference disagrees with grpo-lab on {disagree} of {} greedy rewards at init: not comparing times",
            prompts.len()
        )));
    }
    Ok(report)
}

/// Run `bench/reference/grpo_ref.py` on `spec` and parse the JSON it prints.
fn run_reference(
    python: &str,
    spec: &serde_json::Value,
    options: &BenchOptions,
) -> Result<serde_json::Value> {
    let dir = std::env::temp_dir().join(format!("grpo-lab-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let spec_path = dir.join("spec.json");
    std::fs::write(&spec_path, spec.to_string())?;
    // The checkout this binary was built from, else the working directory's `bench/` (a
    // binary carried to another machine beside its checkout).
    let script = [Path::new(env!("CARGO_MANIFEST_DIR")), Path::new(".")]
        .iter()
        .map(|root| root.join("bench/reference/grpo_ref.py"))
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("bench/reference/grpo_ref.py"));
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(&spec_path)
        .arg("--threads")
        .arg(options.pytorch_threads.to_string())
        .output()
        .map_err(|e| user(format!("cannot run {python}: {e}")));
    let _ = std::fs::remove_dir_all(&dir);
    let out = out?;
    if !out.status.success() {
        return Err(user(format!(
            "the PyTorch reference failed (is it installed? `{python} -m pip install ./bench/reference`):\n{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| user(format!("the PyTorch reference printed no report ({e})")))
}

/// What of a transformer config the PyTorch loop (`bench/reference/transformer_ref.py`) does
/// not implement; empty when it computes the same iteration as the trainer.
pub fn transformer_reference_gaps(c: &RunConfig) -> Vec<String> {
    use crate::config::{AdvantageMode, LengthReward, LossAggMode, LossMode};
    let a = &c.algorithm;
    let mut gaps = Vec::new();
    let mut need = |ok: bool, what: &str| {
        if !ok {
            gaps.push(what.to_string());
        }
    };
    need(!a.dynamic_sampling, "algorithm.dynamic_sampling=false");
    need(a.loss == LossMode::Clipped, "algorithm.loss=clipped");
    need(
        a.advantage == AdvantageMode::Normalized,
        "algorithm.advantage=normalized",
    );
    need(
        a.loss_agg_mode == LossAggMode::TokenMean,
        "algorithm.loss_agg_mode=token-mean",
    );
    need(a.beta == 0.0, "algorithm.beta=0");
    need(
        !a.entropy_bonus(),
        "algorithm.entropy_coef=0 (and no adaptive_entropy)",
    );
    need(!a.bugs.any(), "no bug-gallery switch");
    need(
        c.sampling.top_k == 0 && c.sampling.top_p >= 1.0,
        "sampling.top_k=0 and sampling.top_p=1",
    );
    need(
        c.task.length_reward == LengthReward::None,
        "task.length_reward=none",
    );
    need(
        RewardFn::from_task(&c.task).kernel_weights()[2] == 0.0,
        "rewards from exact and distance only",
    );
    need(
        c.algorithm.prompt_sampling == crate::config::PromptSampling::Uniform,
        "algorithm.prompt_sampling=uniform",
    );
    gaps
}

/// The transformer's PyTorch loop on the trainer's initial weights, prompts and held-out
/// prompts; refuses to report unless both give the same greedy answers to every held-out
/// prompt at init.
fn pytorch_transformer(
    python: &str,
    config: &RunConfig,
    trainer: &Trainer,
    options: &BenchOptions,
) -> Result<serde_json::Value> {
    use crate::engine::Engine;
    use crate::engine::transformer_cpu::FusedTransformerEngine;
    let gaps = transformer_reference_gaps(config);
    if !gaps.is_empty() {
        return Err(user(format!(
            "the PyTorch transformer loop implements one GRPO variant; this config also needs: {} (add --set for each)",
            gaps.join(", ")
        )));
    }
    let shape = crate::model::transformer_shape(config);
    let mut ours = FusedTransformerEngine::new(config);
    let weights = ours.flat_weights();
    let heldout: Vec<Vec<u32>> = if trainer.prompts.heldout.is_empty() {
        trainer.prompts.train.iter().take(256).cloned().collect()
    } else {
        trainer.prompts.heldout.clone()
    };
    let max_len = config.max_len();
    let views: Vec<&[u32]> = heldout.iter().map(|p| p.as_slice()).collect();
    let greedy = ours.greedy(&views, max_len).map_err(user)?;
    let (t, a, o) = (&config.task, &config.algorithm, &config.optimizer);
    let kw = RewardFn::from_task(t).kernel_weights();
    let spec = serde_json::json!({
        "model": "transformer",
        "seed": config.run.seed,
        "shape": {
            "vocab": shape.vocab, "context": shape.context, "d_model": shape.d_model,
            "heads": shape.heads, "layers": shape.layers, "d_ff": shape.d_ff,
        },
        "settings": {
            "n": t.n, "num_generations": a.num_generations, "mu": a.mu,
            "prompts_per_iteration": config.batch_prompts(trainer.prompts.train.len()),
            "max_len": max_len, "temperature": config.sampling.temperature,
            "lr": o.lr, "beta1": o.beta1, "beta2": o.beta2, "eps": o.eps,
            "epsilon_low": a.epsilon_low, "epsilon_high": a.epsilon_high,
            "max_grad_norm": o.max_grad_norm,
            "reward_weights": { "distance": kw[0], "exact": kw[1] },
            "format_reward": t.format_reward,
            // The trainer scores log π_ref every iteration (for the logged KL) even at β = 0.
            "ref_logp": true,
            "sft": {
                "steps": config.sft.steps, "examples": config.sft.examples,
                "batch_size": config.sft.batch_size, "lr": config.sft.lr,
            },
        },
        "weights": weights,
        "prompts": trainer.prompts.train,
        "heldout": heldout,
        "iterations": options.iterations,
        "warmup": 1,
        "no_cache_iterations": options.iterations.div_ceil(3),
    });
    let report = run_reference(python, &spec, options)?;
    let theirs: Vec<Vec<u32>> = report["greedy"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    r.as_array()
                        .map(|x| {
                            x.iter()
                                .map(|v| v.as_u64().unwrap_or(u64::MAX) as u32)
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default();
    let disagree = greedy.iter().zip(&theirs).filter(|(x, y)| x != y).count()
        + greedy.len().abs_diff(theirs.len());
    if disagree > 0 {
        return Err(user(format!(
            "the PyTorch reference disagrees with grpo-lab on {disagree} of {} greedy answers at init: not comparing times",
            greedy.len()
        )));
    }
    Ok(report)
}

/// What `grpo-lab bench-rollout` times: random logits of this shape.
#[derive(Debug, Clone)]
pub struct RolloutBenchOptions {
    pub prompts: usize,
    pub generations: usize,
    pub n: usize,
    pub vocab: usize,
    /// Timed rounds (after one untimed round that compiles and allocates).
    pub repeats: usize,
    pub json: bool,
}

/// `grpo-lab bench-rollout`: rollout + verify + advantages on random logits, the WGSL kernels
/// on `compute`'s wgpu adapter against the Rust reference.
pub fn bench_rollout(compute: &Compute, a: &RolloutBenchOptions) -> Result<()> {
    use crate::gpu::kernels::Kernels;
    use crate::objective::sampling::{self, SamplingParams};
    check_rollout_options(a)?;
    let Some(ctx) = compute.gpu.clone() else {
        return Err(user(
            "bench-rollout needs a wgpu adapter (--device software or gpu)",
        ));
    };
    let kernels = Kernels::new(ctx).map_err(user)?;
    let (b, g, n, v) = (a.prompts, a.generations, a.n, a.vocab);
    let mut rng = crate::rng::SplitMix64::new(0);
    let logits: Vec<f32> = (0..b * n * v).map(|_| rng.normal() as f32 * 2.0).collect();
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|_| (0..n).map(|_| rng.below(v as u64) as u32).collect())
        .collect();
    let flat: Vec<u32> = prompts.iter().flatten().copied().collect();
    let reward_fn = RewardFn::single(RewardKind::InclusionOrdering);
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    };
    let mut reference_ms = Vec::new();
    let mut kernel_ms = Vec::new();
    let mut agree = 0usize;
    for it in 0..a.repeats as u32 + 1 {
        let t = std::time::Instant::now();
        let tokens = sampling::sample_independent(&logits, b, n, v, g, params, 7, it);
        let rewards: Vec<f32> = tokens
            .chunks(n)
            .enumerate()
            .map(|(i, r)| reward_fn.reward(&prompts[i / g], r))
            .collect();
        let adv = advantage::all_advantages(&rewards, g);
        let r_ms = t.elapsed().as_secs_f64() * 1000.0;
        let t = std::time::Instant::now();
        let (k_tokens, k_score, k_adv) = kernels
            .rollout(
                &logits,
                &flat,
                (b, n, v, g, n),
                params,
                7,
                it,
                reward_fn.kernel_weights(),
                true,
            )
            .map_err(user)?;
        let k_ms = t.elapsed().as_secs_f64() * 1000.0;
        if it > 0 {
            // the first round compiles and allocates: not timed
            reference_ms.push(r_ms);
            kernel_ms.push(k_ms);
        }
        agree = k_tokens.iter().zip(&tokens).filter(|(x, y)| x == y).count();
        let _ = (k_score, k_adv, adv);
    }
    let (r, k) = (median(&reference_ms), median(&kernel_ms));
    let report = serde_json::json!({
        "device": compute.label,
        "shape": { "prompts": b, "generations": g, "n": n, "vocab": v },
        "reference_ms": r, "reference_ms_p10": quantile(&reference_ms, 0.1), "reference_ms_p90": quantile(&reference_ms, 0.9),
        "kernel_ms": k, "kernel_ms_p10": quantile(&kernel_ms, 0.1), "kernel_ms_p90": quantile(&kernel_ms, 0.9),
        "speedup": r / k,
        "tokens_identical_fraction": agree as f64 / (b * g * n) as f64,
    });
    if a.json {
        println!("{report}");
    } else {
        println!(
            "rollout + verify + advantages, {b} prompts × {g} responses × n = {n}, vocab {v}, on {}",
            compute.label
        );
        println!("  Rust reference: {r:.2} ms (median of {})", a.repeats);
        println!(
            "  WGSL kernels:   {k:.2} ms (upload of the logits and read-back of tokens, rewards, advantages included)"
        );
        println!(
            "  ratio reference / kernels: {}×; identical tokens: {:.6}",
            crate::bench::significant(r / k),
            agree as f64 / (b * g * n) as f64
        );
    }
    Ok(())
}

/// `x` with three significant digits (a ratio of 0.0035 is not "0.00").
pub(crate) fn significant(x: f64) -> String {
    if !x.is_finite() || x == 0.0 {
        return format!("{x}");
    }
    let decimals = (2 - x.abs().log10().floor() as i32).max(0) as usize;
    format!("{x:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::{chart_device, significant, time_in_turn, warm_up};

    #[test]
    fn a_ratio_keeps_three_significant_digits() {
        assert_eq!(significant(0.0035123), "0.00351");
        assert_eq!(significant(5.7), "5.70");
        assert_eq!(significant(123.4), "123");
        assert_eq!(significant(0.0), "0");
    }
    use crate::config::RunConfig;
    use crate::gpu::context::Compute;

    #[test]
    fn in_turn_times_each_engine_its_own_iterations() {
        let compute = Compute::cpu();
        let config = RunConfig::preset("lecture17").unwrap();
        let mu = config.algorithm.mu;
        let other = config.with_overrides(&["run.seed=1".into()]).unwrap();
        let (mut ours, _) = warm_up(&config, &compute).unwrap();
        let (mut theirs, _) = warm_up(&other, &compute).unwrap();
        let (i0, j0) = (ours.iteration(), theirs.iteration());
        let timed = time_in_turn(&mut [&mut ours, &mut theirs], 3, mu).unwrap();
        assert_eq!(timed.len(), 2);
        assert_eq!((ours.iteration() - i0, theirs.iteration() - j0), (3, 3));
        for t in &timed {
            assert_eq!((t.per_step.len(), t.parts.len()), (3, 3));
            assert!(t.per_step.iter().all(|&ms| ms > 0.0 && ms.is_finite()));
        }
        // Alone: only ours moves.
        let alone = time_in_turn(&mut [&mut ours], 2, mu).unwrap();
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].per_step.len(), 2);
        assert_eq!((ours.iteration() - i0, theirs.iteration() - j0), (5, 3));
    }

    #[test]
    fn a_chart_names_a_wgpu_device_by_its_adapter() {
        let lavapipe = "wgpu (llvmpipe (LLVM 15.0.6, 256 bits), Vulkan, Cpu)";
        assert_eq!(chart_device(lavapipe), "llvmpipe");
        assert_eq!(
            chart_device("wgpu (NVIDIA H100 80GB HBM3, Vulkan, DiscreteGpu)"),
            "NVIDIA H100 80GB HBM3"
        );
        assert_eq!(
            chart_device("cpu (burn flex backend)"),
            "cpu (burn flex backend)"
        );
    }
}

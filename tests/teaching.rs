//! The teaching experiments' machinery, end to end through the real trainer: pass@k at each
//! evaluation, the rollout budget, PPO's critic (GAE) with its checkpoint, distillation from a
//! teacher preset, and the mechanism metrics (ratio range, KL(π_old‖π), advantage by group
//! difficulty, wrong-answer lengths).

mod common;

use common::*;
use grpo_lab::config::{AdvantageMode, RunConfig};
use grpo_lab::gpu::Compute;
use grpo_lab::grpo::Trainer;
use grpo_lab::metrics::StepRecord;
use grpo_lab::train::{self, RunOptions};

fn records(config: RunConfig) -> (Trainer, Vec<StepRecord>) {
    let mut t = Trainer::new(config, Compute::cpu()).unwrap();
    let mut out = Vec::new();
    while !t.is_done() {
        out.push(t.step().unwrap());
    }
    (t, out)
}

fn random_sort(iterations: usize) -> RunConfig {
    let mut c = RunConfig::preset("random-sort").unwrap();
    c.run.iterations = iterations;
    c.run.checkpoint_every = 2;
    c
}

#[test]
fn pass_at_k_is_logged_at_each_evaluation_and_leaves_training_alone() {
    let mut c = random_sort(5);
    c.run.eval_every = 2;
    c.run.pass_k = 8;
    c.run.pass_samples = 12;
    let (_, with) = records(c.clone());
    let evaluated: Vec<usize> = with
        .iter()
        .filter(|r| r.pass_at_1.is_some())
        .map(|r| r.iteration)
        .collect();
    // Iterations 0, 2, 4, on each of their μ steps.
    let mu = c.algorithm.mu;
    assert_eq!(
        evaluated,
        [0, 2, 4]
            .iter()
            .flat_map(|&i| vec![i; mu])
            .collect::<Vec<_>>()
    );
    for r in with.iter().filter(|r| r.pass_at_1.is_some()) {
        let (p1, p4, pk) = (
            r.pass_at_1.unwrap(),
            r.pass_at_4.unwrap(),
            r.pass_at_k.unwrap(),
        );
        // pass@k grows with k and is a probability.
        assert!(
            (0.0..=1.0).contains(&p1) && p1 <= p4 + 1e-6 && p4 <= pk + 1e-6,
            "{p1} {p4} {pk}"
        );
    }
    // The evaluation samples from a stream of its own: the training curves do not move.
    c.run.eval_every = 0;
    let (_, without) = records(c);
    assert!(without.iter().all(|r| r.pass_at_k.is_none()));
    let rewards = |v: &[StepRecord]| v.iter().map(|r| r.reward_mean).collect::<Vec<_>>();
    assert_eq!(rewards(&with), rewards(&without));
    // No held-out split: nothing to evaluate.
    let mut no_split = short_lecture(3);
    no_split.task.heldout_size = 0;
    let (_, lecture) = records(no_split);
    assert!(lecture.iter().all(|r| r.pass_at_1.is_none()));
}

#[test]
fn a_rollout_budget_ends_the_run_and_counts_dynamic_samplings_redraws() {
    let mut c = RunConfig::preset("random-sort").unwrap();
    c.run.iterations = 100;
    c.run.eval_every = 0;
    let per_iteration = c.algorithm.num_generations * c.algorithm.prompts_per_iteration;
    c.run.rollout_budget = 3 * per_iteration + 1;
    let (t, recs) = records(c.clone());
    // Three iterations do not reach it, the fourth does: the run ends there.
    assert_eq!(t.iteration(), 4);
    assert_eq!(recs.last().unwrap().rollouts, 4 * per_iteration);
    // With dynamic sampling the redraws count: the same budget buys fewer iterations.
    c.algorithm.dynamic_sampling = true;
    c.run.rollout_budget = 6 * per_iteration;
    let (t, recs) = records(c);
    let last = recs.last().unwrap();
    let redrawn: usize = recs
        .iter()
        .filter(|r| r.step_in_iteration == 0)
        .map(|r| r.resampled_groups)
        .sum();
    assert_eq!(
        last.rollouts,
        t.iteration() * per_iteration + redrawn * 16,
        "every response drawn is counted"
    );
    assert!(last.rollouts >= 6 * per_iteration);
    assert!(t.iteration() < 6 || redrawn == 0);
}

#[test]
fn ppo_with_a_critic_learns_and_its_checkpoint_resumes_bit_identically() {
    let mut c = random_sort(30);
    c.algorithm.advantage = AdvantageMode::Gae;
    c.run.eval_every = 0;
    let (t, recs) = records(c.clone());
    assert!(t.critic_parameters() > 0);
    let first: Vec<&StepRecord> = recs.iter().filter(|r| r.step_in_iteration == 0).collect();
    let (start, end) = (first[0].reward_mean, first[first.len() - 1].reward_mean);
    assert!(end > start + 0.1, "PPO learns: {start} → {end}");
    // The critic learns too: its error on the returns falls.
    assert!(
        first
            .iter()
            .all(|r| r.value_loss.is_finite() && r.value_explained_var.is_finite())
    );
    let late: f32 = first[first.len() - 10..]
        .iter()
        .map(|r| r.value_loss)
        .sum::<f32>()
        / 10.0;
    assert!(
        late < first[0].value_loss,
        "{:?}",
        first.iter().map(|r| r.value_loss).collect::<Vec<_>>()
    );
    // GRPO's records carry no critic numbers.
    let (_, grpo) = records(random_sort(2));
    assert!(grpo.iter().all(|r| r.value_loss.is_nan()));

    // Interrupted at iteration 4 and resumed: the critic's state is in the checkpoint.
    c.run.iterations = 8;
    c.run.checkpoint_every = 2;
    let full = temp_dir("gae-full");
    train::run(
        c.clone(),
        Compute::cpu(),
        RunOptions {
            out: full.clone(),
            ..Default::default()
        },
    )
    .unwrap();
    let part = temp_dir("gae-part");
    let mut short = c.clone();
    short.run.iterations = 4;
    train::run(
        short,
        Compute::cpu(),
        RunOptions {
            out: part.clone(),
            ..Default::default()
        },
    )
    .unwrap();
    std::fs::write(part.join("config.toml"), c.to_toml()).unwrap();
    train::run(
        c,
        Compute::cpu(),
        RunOptions {
            out: part.clone(),
            resume: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        metrics_without_timing(&full.join("metrics.jsonl")),
        metrics_without_timing(&part.join("metrics.jsonl"))
    );
}

#[test]
fn a_student_learns_from_its_teachers_answers() {
    // lecture17's three prompts; the teacher (lecture17 with a softer init and clipping, which
    // sorts them) answers, the student fine-tunes on those answers and nothing else.
    let mut student = short_lecture(1);
    student.sft.teacher = "lecture17".into();
    student.sft.steps = 60;
    student.sft.batch_size = 3;
    student.sft.lr = 0.05;
    student.validate().unwrap();
    let (mut t, _) = records(student.clone());
    let (acc_taught, _) = t.evaluate().unwrap();
    // The same student trained on the sorted answers instead.
    student.sft.teacher = "none".into();
    let (mut oracle, _) = records(student.clone());
    let (acc_oracle, _) = oracle.evaluate().unwrap();
    // lecture17 itself (the teacher) collapses below the maximum: its answers are partly wrong,
    // and the student imitates them rather than the truth.
    assert!(
        acc_oracle > acc_taught,
        "oracle {acc_oracle} vs taught {acc_taught}"
    );

    // A teacher of another task is refused, naming the key.
    let mut bad = RunConfig::preset("transformer-sort").unwrap();
    bad.sft.teacher = "lecture17".into();
    let e = bad.validate().unwrap_err().to_string();
    assert!(
        e.contains("sft.teacher") && e.contains("another task"),
        "{e}"
    );
    bad.sft.teacher = "no-such-preset".into();
    let e = bad.validate().unwrap_err().to_string();
    assert!(
        e.contains("sft.teacher") && e.contains("transformer-sort"),
        "{e}"
    );
}

#[test]
fn the_mechanism_metrics_are_logged() {
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.iterations = 5;
    c.algorithm.loss = grpo_lab::config::LossMode::Clipped;
    c.model.init_scale = 0.3;
    c.optimizer.lr = 0.01;
    let (_, recs) = records(c.clone());
    for r in &recs {
        if r.step_in_iteration == 0 {
            // Before the first update of an iteration π = π_old.
            assert!(
                (r.ratio_min - 1.0).abs() < 1e-5 && (r.ratio_max - 1.0).abs() < 1e-5,
                "{r:?}"
            );
            assert!(r.ppo_kl.abs() < 1e-6);
        } else {
            assert!(r.ratio_min <= 1.0 && r.ratio_max >= 1.0);
            assert!(r.ratio_min <= r.ratio_mean && r.ratio_mean <= r.ratio_max);
        }
        assert!(r.advantage_std.is_finite() && r.advantage_std >= 0.0);
    }
    assert!(
        recs.iter().any(|r| r.ppo_kl > 0.0),
        "the policy moves away from π_old"
    );
    // Wrong-answer lengths on the transformer: p90 ≥ mean, a fraction in [0, 1].
    let mut t = RunConfig::preset("length-bias").unwrap();
    t.run.iterations = 2;
    t.sft.steps = 5;
    let (_, recs) = records(t);
    for r in recs.iter().filter(|r| r.mean_length_wrong.is_finite()) {
        assert!(r.wrong_length_p90 >= r.min_length);
        assert!((0.0..=1.0).contains(&r.wrong_longer_frac));
    }
}

//! `grpo::iteration` knows nothing about burn, gemm or wgpu: a fake engine of a few lines
//! drives `Trainer` through whole iterations, and the algorithm around it (prompts, rewards,
//! advantages, the record, the live config) behaves as the spec says.

use grpo_lab::config::RunConfig;
use grpo_lab::engine::{
    Batch, Engine, EngineError, SampleRequest, Samples, Snapshot, StepOutput, StepRequest,
    StepScalars, Which,
};
use grpo_lab::grpo::Trainer;
use std::sync::{Arc, Mutex};

/// Answers every prompt with its sorted numbers for the first response of each group and the
/// prompt itself for the others; counts the calls it gets.
#[derive(Default)]
struct Fake {
    calls: Arc<Mutex<Vec<String>>>,
    /// The last rollout's prompts and rows, and each step's advantages.
    seen: Arc<Mutex<Seen>>,
    /// Every odd response comes back cut (not closed with `<eos>`).
    cut_odd: bool,
}

#[derive(Default)]
struct Seen {
    prompts: Vec<Vec<u32>>,
    rows: Vec<Vec<u32>>,
    advantages: Vec<Vec<f32>>,
    masks: Vec<Vec<f32>>,
}

impl Fake {
    fn log(&self, s: &str) {
        self.calls.lock().unwrap().push(s.to_string());
    }
}

impl Engine for Fake {
    fn label(&self) -> String {
        "fake".into()
    }
    fn sample(&mut self, req: &SampleRequest) -> Result<Samples, EngineError> {
        self.log("sample");
        let mut rows = Vec::new();
        for p in req.prompts {
            for j in 0..req.g {
                let mut r = p.to_vec();
                if j == 0 {
                    r.sort();
                }
                rows.push(r);
            }
        }
        let closed: Vec<bool> = (0..rows.len())
            .map(|i| !(self.cut_odd && i % 2 == 1))
            .collect();
        let mut seen = self.seen.lock().unwrap();
        seen.prompts = req.prompts.iter().map(|p| p.to_vec()).collect();
        seen.rows = rows.clone();
        drop(seen);
        Ok(Samples {
            rows,
            closed,
            ..Default::default()
        })
    }
    fn greedy(&mut self, prompts: &[&[u32]], _: usize) -> Result<Vec<Vec<u32>>, EngineError> {
        Ok(prompts.iter().map(|p| p.to_vec()).collect())
    }
    fn token_logp(&mut self, w: Which, b: &Batch, _: f32) -> Result<Vec<f32>, EngineError> {
        self.log(if w == Which::Policy {
            "logp"
        } else {
            "ref_logp"
        });
        Ok(vec![-1.0; b.responses.len()])
    }
    fn step(&mut self, b: &Batch, req: &StepRequest) -> Result<StepOutput, EngineError> {
        self.log("step");
        assert_eq!(req.advantages.len(), b.b * b.g);
        assert_eq!(req.old_logp.len(), b.responses.len());
        let loss = -req.advantages.iter().sum::<f32>();
        self.seen
            .lock()
            .unwrap()
            .advantages
            .push(req.advantages.to_vec());
        self.seen.lock().unwrap().masks.push(b.mask.clone());
        Ok(StepOutput {
            scalars: StepScalars {
                loss,
                kl: 0.0,
                clip_low: 0.0,
                clip_high: 0.0,
                ratio_mean: 1.0,
                entropy: 0.5,
                grad_norm: 1.0,
            },
            logp: vec![-1.0; req.logp_rows * b.t],
        })
    }
    fn supervised(&mut self, _: &[Batch], _: f64) -> Result<f32, EngineError> {
        Ok(0.0)
    }
    fn refresh_reference(&mut self) {
        self.log("refresh_reference");
    }
    fn flat_weights(&self) -> Vec<f32> {
        Vec::new()
    }
    fn snapshot(&self) -> Result<Snapshot, EngineError> {
        Ok(Vec::new())
    }
    fn restore(&mut self, _: &Snapshot) -> Result<(), EngineError> {
        Ok(())
    }
    fn supports(&self, _: &RunConfig) -> bool {
        true
    }
}

#[test]
fn a_fake_engine_drives_whole_iterations() {
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.iterations = 3;
    c.algorithm.mu = 2;
    c.algorithm.ref_period = 2;
    // pass@k's evaluation samples too (every run.eval_every iterations): off here, so the
    // calls are the iteration's own.
    c.run.eval_every = 0;
    let fake = Fake::default();
    let calls = fake.calls.clone();
    let mut t = Trainer::with_engine(c.clone(), Box::new(fake)).unwrap();
    let mut records = Vec::new();
    while !t.is_done() {
        records.push(t.step().unwrap());
    }
    assert_eq!(records.len(), 6);
    let calls = calls.lock().unwrap().clone();
    // Per iteration: sample, log π_old, log π_ref, then μ = 2 steps; the reference refreshed
    // at iteration 2 (ref_period 2), before its rollout.
    let one = ["sample", "logp", "ref_logp", "step", "step"];
    let mut want: Vec<&str> = Vec::new();
    want.extend(one);
    want.extend(one);
    want.push("refresh_reference");
    want.extend(one);
    assert_eq!(calls, want);
    // Each group: one sorted answer and G − 1 copies of the prompt; [1, 2, 3] is sorted
    // already, so its whole group is right: (1 + 1 + G) / 3G — the verifier's count, not the
    // engine's.
    let g = c.algorithm.num_generations as f32;
    let r = &records[0];
    assert!(
        (r.exact_match - (2.0 + g) / (3.0 * g)).abs() < 1e-6,
        "{}",
        r.exact_match
    );
    // lecture17 drives the update with normalized advantages: they sum to 0 in every group,
    // so the fake engine's loss (−Σ A) is 0; the all-equal group is flagged.
    assert!(r.loss.abs() < 1e-4, "{}", r.loss);
    assert!((r.frac_reward_zero_std - 1.0 / 3.0).abs() < 1e-6);
    assert_eq!(r.step_in_iteration, 0);
    assert_eq!(records[1].step_in_iteration, 1);
    // The logged groups (with per-token log π) come with the iteration's last step.
    assert!(records[0].groups.is_none());
    assert!(
        records[1]
            .groups
            .as_ref()
            .is_some_and(|g| !g[0].logp.is_empty())
    );
    // Greedy accuracy: the fake answers with the prompt itself, sorted only if it was.
    assert!((r.accuracy_train - 1.0 / 3.0).abs() < 1e-6);
}

#[test]
fn the_trainer_owns_the_live_fields() {
    let c = RunConfig::preset("lecture17").unwrap();
    let mut t = Trainer::with_engine(c.clone(), Box::new(Fake::default())).unwrap();
    let mut live = c.clone();
    live.algorithm.mu = 3;
    live.optimizer.lr = 0.5;
    live.sft.steps = 7; // not live: needs a reset
    live.run.iterations = 9;
    let ignored = t.apply_live(&live);
    assert_eq!(ignored, vec!["sft"]);
    assert_eq!(t.config.algorithm.mu, 3);
    assert_eq!(t.config.optimizer.lr, 0.5);
    assert_eq!(t.config.sft.steps, c.sft.steps);
    assert_eq!(t.config.run.iterations, 9);
    // "+μ Iteration" asks the trainer, which counts from the iteration in progress.
    assert_eq!(t.steps_left_in_iteration(), 3);
    t.step().unwrap();
    assert_eq!(t.steps_left_in_iteration(), 2);
    assert!(Trainer::needs_reset(&c, &live).contains(&"sft"));
}

#[test]
fn a_frame_loop_steps_within_its_budget() {
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.iterations = 2;
    let mut t = Trainer::with_engine(c, Box::new(Fake::default())).unwrap();
    // A zero budget still takes one step per frame; a cap bounds a frame.
    assert_eq!(t.run_for(0.0, 100).unwrap().len(), 1);
    assert_eq!(t.run_for(10.0, 5).unwrap().len(), 5);
    let rest = t.run_for(10.0, 1000).unwrap();
    assert_eq!(rest.len(), 20 - 6);
    assert!(t.is_done() && t.run_for(10.0, 10).unwrap().is_empty());
}

/// Each 2025–26 estimator drives the step with `objective::advantage::estimate`'s values for
/// the rollout's rewards (ReMax's baseline: the greedy answers', the engine's own), W-REINFORCE's
/// weight applied after.
#[test]
fn every_estimator_drives_the_step_with_its_own_values() {
    use grpo_lab::config::AdvantageMode::*;
    use grpo_lab::objective::advantage::{Rollouts, estimate, weight_by_sign};
    use grpo_lab::task::reward::{RewardFn, score_batch};
    for mode in [
        Gpg,
        ReinforcePp,
        ReinforcePpBaseline,
        Remax,
        Opo,
        Passk,
        PasskAnalytic,
    ] {
        let mut c = RunConfig::preset("lecture17").unwrap();
        c.run.iterations = 1;
        c.algorithm.mu = 1;
        c.run.eval_every = 0;
        c.algorithm.advantage = mode;
        c.algorithm.passk_advantage_k = 3;
        c.algorithm.negative_weight = 0.5;
        let fake = Fake::default();
        let seen = fake.seen.clone();
        let mut t = Trainer::with_engine(c.clone(), Box::new(fake)).unwrap();
        t.step().unwrap();
        let seen = seen.lock().unwrap();
        let g = c.algorithm.num_generations;
        let prompts: Vec<&[u32]> = seen.prompts.iter().map(|p| p.as_slice()).collect();
        let f = RewardFn::from_task(&c.task);
        let (rewards, exact) = score_batch(&f, &c, &prompts, &seen.rows, g);
        // The fake's greedy answer is the prompt itself.
        let (greedy, _) = score_batch(&f, &c, &prompts, &seen.prompts, 1);
        let lengths = vec![c.task.n; rewards.len()];
        let mut want = estimate(
            mode,
            &Rollouts {
                rewards: &rewards,
                g,
                lengths: &lengths,
                exact: &exact,
                greedy_rewards: Some(&greedy),
                passk_k: 3,
            },
        );
        weight_by_sign(&mut want, 1.0, 0.5);
        assert!(
            want.iter().any(|&a| a != 0.0),
            "{mode}: a case with no signal"
        );
        assert_eq!(seen.advantages.len(), 1);
        for (x, y) in seen.advantages[0].iter().zip(&want) {
            assert!(
                (x - y).abs() < 1e-6,
                "{mode}: {:?} vs {want:?}",
                seen.advantages[0]
            );
        }
    }
}

/// DAPO's overlong filtering: the responses that came back cut leave the step's loss mask
/// whole; the others keep theirs; the advantages still read every reward.
#[test]
fn truncated_completions_leave_the_loss_mask() {
    for on in [false, true] {
        let mut c = RunConfig::preset("transformer-sort").unwrap();
        c.run.iterations = 1;
        c.algorithm.mu = 1;
        c.run.eval_every = 0;
        c.sft.steps = 0;
        c.algorithm.mask_truncated_completions = on;
        let fake = Fake {
            cut_odd: true,
            ..Default::default()
        };
        let seen = fake.seen.clone();
        let mut t = Trainer::with_engine(c.clone(), Box::new(fake)).unwrap();
        t.step().unwrap();
        let seen = seen.lock().unwrap();
        let mask = &seen.masks[0];
        let t_len = mask.len() / seen.rows.len();
        for (i, (row, resp)) in mask.chunks(t_len).zip(&seen.rows).enumerate() {
            let real = row.iter().filter(|&&m| m != 0.0).count();
            let want = if on && i % 2 == 1 { 0 } else { resp.len() };
            assert_eq!(
                real, want,
                "mask_truncated_completions = {on}, response {i}"
            );
        }
    }
    // The lecture model is never cut: the key is refused there, naming the model.
    let e = RunConfig::preset("lecture17")
        .unwrap()
        .with_overrides(&["algorithm.mask_truncated_completions=true".into()])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mask_truncated_completions") && e.contains("transformer"),
        "{e}"
    );
}

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
    /// Each step's measured entropy, in turn (0.5 when empty).
    entropies: Vec<f32>,
}

#[derive(Default)]
struct Seen {
    prompts: Vec<Vec<u32>>,
    rows: Vec<Vec<u32>>,
    advantages: Vec<Vec<f32>>,
    masks: Vec<Vec<f32>>,
    /// Each step's batch prompts and entropy coefficient.
    step_prompts: Vec<Vec<u32>>,
    entropy_coefs: Vec<f32>,
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
        let mut seen = self.seen.lock().unwrap();
        seen.masks.push(b.mask.clone());
        seen.step_prompts.push(b.prompts.clone());
        seen.entropy_coefs.push(req.loss.entropy_coef);
        let k = seen.entropy_coefs.len() - 1;
        drop(seen);
        let entropy = if self.entropies.is_empty() {
            0.5
        } else {
            self.entropies[k % self.entropies.len()]
        };
        Ok(StepOutput {
            scalars: StepScalars {
                loss,
                kl: 0.0,
                clip_low: 0.0,
                clip_high: 0.0,
                ratio_mean: 1.0,
                entropy,
                grad_norm: 1.0,
                entropy_measured: None,
                entropy_first_order: None,
            },
            logp: vec![-1.0; req.logp_rows * b.t],
            entropy: Vec::new(),
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
/// One step of `c` on the fake engine: what the engine saw (the rollout, the step's advantages).
fn one_step(c: &RunConfig) -> Seen {
    let fake = Fake::default();
    let seen = fake.seen.clone();
    let mut t = Trainer::with_engine(c.clone(), Box::new(fake)).unwrap();
    t.step().unwrap();
    std::mem::take(&mut *seen.lock().unwrap())
}

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
        let seen = one_step(&c);
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

/// GDPO (`task.reward_aggregation = normalize_then_sum`) with a single reward: that reward
/// normalized in its group, (r − mean)/(std + 1e-5), is what the advantage mode reads — not the
/// raw reward (it was, where the one term made no mixture to split).
#[test]
fn gdpo_normalizes_a_single_reward_too() {
    use grpo_lab::config::{AdvantageMode, RewardAggregation};
    use grpo_lab::objective::advantage::advantages;
    use grpo_lab::task::reward::{RewardFn, score_batch};
    let mut c = RunConfig::preset("lecture17").unwrap();
    (c.run.iterations, c.algorithm.mu, c.run.eval_every) = (1, 1, 0);
    c.algorithm.advantage = AdvantageMode::Centered;
    c.task.reward_aggregation = RewardAggregation::NormalizeThenSum;
    let f = RewardFn::from_task(&c.task);
    assert_eq!(f.terms(), 1);
    let seen = one_step(&c);
    let g = c.algorithm.num_generations;
    let prompts: Vec<&[u32]> = seen.prompts.iter().map(|p| p.as_slice()).collect();
    let (rewards, _) = score_batch(&f, &c, &prompts, &seen.rows, g);
    let normalized = advantages(AdvantageMode::Normalized, &rewards, g);
    let want = advantages(AdvantageMode::Centered, &normalized, g);
    let raw = advantages(AdvantageMode::Centered, &rewards, g);
    assert!(want.iter().zip(&raw).any(|(a, b)| (a - b).abs() > 1e-3));
    for (x, y) in seen.advantages[0].iter().zip(&want) {
        assert!((x - y).abs() < 1e-5, "{:?} vs {want:?}", seen.advantages[0]);
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

/// TRL's `steps_per_generation`: the rollout's groups split once into mini-batches of whole
/// groups, in order, one optimizer step each; the μ passes go over them in turn, each step
/// seeing exactly its groups' advantages.
#[test]
fn mini_batches_of_whole_groups_take_the_steps_in_turn() {
    let run = |s: usize, mu: usize| {
        let mut c = RunConfig::preset("lecture17").unwrap();
        c.run.iterations = 1;
        c.run.eval_every = 0;
        c.algorithm.mu = mu;
        c.algorithm.steps_per_generation = s;
        let fake = Fake::default();
        let seen = fake.seen.clone();
        let mut t = Trainer::with_engine(c, Box::new(fake)).unwrap();
        let mut records = Vec::new();
        t.run_iteration(|r| {
            records.push(r);
            true
        })
        .unwrap();
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        (records, seen)
    };
    let (whole, all) = run(1, 1);
    assert_eq!(whole.len(), 1);
    let (records, parts) = run(3, 2);
    assert_eq!(records.len(), 6, "μ = 2 passes over 3 mini-batches");
    let steps: Vec<usize> = records.iter().map(|r| r.step_in_iteration).collect();
    assert_eq!(steps, vec![0, 1, 2, 3, 4, 5]);
    let g = 10;
    let n = 3;
    for (k, (adv, prompts)) in parts.advantages.iter().zip(&parts.step_prompts).enumerate() {
        let group = k % 3;
        assert_eq!(adv.len(), g, "step {k}: one group of G");
        assert_eq!(
            adv[..],
            all.advantages[0][group * g..(group + 1) * g],
            "step {k}"
        );
        assert_eq!(
            prompts[..],
            all.step_prompts[0][group * n..(group + 1) * n],
            "step {k}"
        );
    }
    // The last record logs the groups with each row's log π as its mini-batch last read it.
    let groups = records.last().unwrap().groups.as_ref().unwrap();
    assert!(
        groups
            .iter()
            .all(|gr| gr.logp.len() == g && gr.logp[0].len() == n)
    );
    // More mini-batches than groups is refused, naming the key.
    let e = RunConfig::preset("lecture17")
        .unwrap()
        .with_overrides(&["algorithm.steps_per_generation=4".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("algorithm.steps_per_generation"), "{e}");
}

/// Skywork-OR1's adaptive entropy coefficient, as TRL steps it: no bonus before a measurement
/// or while the last entropy is above the target; ±δ after each step within its bounds; the
/// state goes through a checkpoint and the resumed run applies the same coefficients.
#[test]
fn the_adaptive_entropy_coefficient_steers_and_survives_a_resume() {
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.iterations = 5;
    c.run.eval_every = 0;
    c.algorithm.mu = 1;
    c.algorithm.adaptive_entropy = true;
    c.algorithm.entropy_coef = 0.01;
    c.algorithm.entropy_target = 0.2;
    c.algorithm.entropy_coef_delta = 0.005;
    let entropies = vec![0.5, 0.1, 0.1, 0.3, 0.1];
    let fake = || Fake {
        entropies: entropies.clone(),
        ..Default::default()
    };
    let whole = fake();
    let seen = whole.seen.clone();
    let mut t = Trainer::with_engine(c.clone(), Box::new(whole)).unwrap();
    let coefs: Vec<f32> = (0..5)
        .map(|_| t.step().unwrap().entropy_coef.unwrap())
        .collect();
    let want = [0.005, 0.01, 0.015, 0.01, 0.015];
    for (x, y) in coefs.iter().zip(want) {
        assert!((x - y).abs() < 1e-7, "{coefs:?}");
    }
    let applied = seen.lock().unwrap().entropy_coefs.clone();
    let want_applied = [0.0, 0.0, 0.01, 0.015, 0.0];
    for (x, y) in applied.iter().zip(want_applied) {
        assert!((x - y).abs() < 1e-7, "{applied:?}");
    }
    // Interrupted after two steps, resumed from the snapshot's state (through JSON).
    let first = fake();
    let mut a = Trainer::with_engine(c.clone(), Box::new(first)).unwrap();
    a.step().unwrap();
    a.step().unwrap();
    let (state, blobs) = a.snapshot().unwrap();
    let state: grpo_lab::grpo::TrainerState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    assert!(state.entropy_control.is_some());
    let second = Fake {
        entropies: entropies[2..].to_vec(),
        ..Default::default()
    };
    let seen_b = second.seen.clone();
    let mut b = Trainer::with_engine(c, Box::new(second)).unwrap();
    b.restore(state, &blobs).unwrap();
    for _ in 0..3 {
        b.step().unwrap();
    }
    let resumed = seen_b.lock().unwrap().entropy_coefs.clone();
    assert_eq!(
        resumed[..],
        applied[2..],
        "the resumed run applies what the whole run did"
    );
}

/// TRL's replay buffer: groups with a reward signal are stored; a flat group is replaced in
/// the training batch by a stored one (its prompt, rows and advantages); the buffer goes
/// through a checkpoint.
#[test]
fn flat_groups_are_replaced_from_the_replay_buffer() {
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.iterations = 2;
    c.run.eval_every = 0;
    c.algorithm.mu = 1;
    c.algorithm.replay_buffer = 4;
    let fake = Fake::default();
    let seen = fake.seen.clone();
    let mut t = Trainer::with_engine(c.clone(), Box::new(fake)).unwrap();
    let r = t.step().unwrap();
    // lecture17's third prompt [1, 2, 3] is sorted already: the fake answers it sorted G
    // times, a flat group. The first two have a sorted and G − 1 unsorted answers.
    assert_eq!(r.replay_replaced, Some(1.0));
    assert_eq!(r.replay_size, Some(2.0));
    let seen = seen.lock().unwrap();
    let (g, n) = (10, 3);
    let prompts = &seen.step_prompts[0];
    let adv = &seen.advantages[0];
    let replayed = &prompts[2 * n..3 * n];
    assert!(replayed != [1, 2, 3], "the flat group is gone");
    let from = (0..2)
        .find(|&k| &prompts[k * n..(k + 1) * n] == replayed)
        .expect("a stored group of this rollout");
    assert_eq!(adv[2 * g..3 * g], adv[from * g..(from + 1) * g]);
    assert!(adv[2 * g..].iter().any(|&a| a != 0.0));
    drop(seen);
    // Its logged group keeps the fresh rollout's text and no log π (it was not trained on).
    let groups = r.groups.as_ref().unwrap();
    assert!(groups[2].logp.is_empty() && !groups[0].logp.is_empty());
    let (state, _) = t.snapshot().unwrap();
    let state: grpo_lab::grpo::TrainerState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    assert_eq!(state.replay.unwrap().groups.len(), 2);
    for bad in ["algorithm.dynamic_sampling=true", "algorithm.advantage=gae"] {
        let e = RunConfig::preset("lecture17")
            .unwrap()
            .with_overrides(&["algorithm.replay_buffer=4".into(), bad.into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("algorithm.replay_buffer"), "{bad}: {e}");
    }
}

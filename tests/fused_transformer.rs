//! The transformer's fused CPU engine is held equal to burn's autodiff path: the same rollouts
//! for the same seed, the same rewards, metrics and weights within stated tolerances after a
//! few iterations, on ragged batches (`<eos>` at every position, truncation), for every loss
//! mode, KL estimator and aggregation, the entropy bonus, grad-norm clipping and the supervised
//! cold start. Checkpoints resume exactly on it; burn's checkpoints continue on burn's path.

mod common;

use common::{close, step_scalars};
use grpo_lab::config::{FusedChoice, KlEstimator, LossAggMode, LossMode, RunConfig};
use grpo_lab::engine::transformer_cpu::FusedTransformerEngine;
use grpo_lab::engine::{Batch, Engine, SampleRequest, Which};
use grpo_lab::gpu::Compute;
use grpo_lab::grpo::Trainer;
use grpo_lab::metrics::StepRecord;
use grpo_lab::objective::sampling::SamplingParams;

/// Metrics agree within this, relative to 1 + |x|. The two paths sum in different orders
/// (gemm's blocking against burn's kernels, f64 token sums against f32 tensor means), ~1e-6
/// relative per step; Adam amplifies rounding noise in near-zero gradient components into
/// ±lr steps, so after a few iterations the logged metrics drift by up to ~1e-4.
const TOL: f32 = 1e-3;
/// Weights agree within this, relative to 1 + |w|, after the runs below: measured ≤ 5e-5
/// (2–6 steps of lr ≤ 3e-3; a component whose gradient is rounding noise can move by ±lr per
/// step on one path and not the other), so 10× headroom.
const WEIGHT_TOL: f32 = 5e-4;

/// A small transformer on a 4-number vocabulary with a high init scale: responses close with
/// `<eos>` anywhere from the first position to none at all (truncated at `max_len`).
fn ragged() -> RunConfig {
    let mut c = RunConfig::preset("transformer-sort").unwrap();
    c.task.n = 3;
    c.task.vocab = 4;
    c.task.train_size = 48;
    c.task.heldout_size = 8;
    c.task.max_len = 5;
    c.model.d_model = 16;
    c.model.heads = 2;
    c.model.context = 8;
    c.model.init_scale = 12.0;
    c.algorithm.num_generations = 6;
    c.algorithm.prompts_per_iteration = 6;
    c.algorithm.dynamic_sampling = false;
    c.algorithm.mu = 2;
    c.optimizer.lr = 3e-3;
    c.sft.steps = 0;
    c.run.iterations = 3;
    c.run.log_groups = 6;
    c.validate().unwrap();
    c
}

/// Run `config` on the fused engine and on burn's path; returns both runs' records.
fn compare(config: &RunConfig) -> (Vec<StepRecord>, Vec<StepRecord>) {
    let mut runs = Vec::new();
    for choice in [FusedChoice::Auto, FusedChoice::Off] {
        let mut c = config.clone();
        c.run.fused_step = choice;
        let mut t = Trainer::new(c, Compute::cpu()).unwrap();
        let fused = t.engine_label().contains("fused");
        assert_eq!(fused, choice == FusedChoice::Auto, "{}", t.engine_label());
        let mut records = Vec::new();
        while !t.is_done() {
            records.push(t.step().unwrap());
        }
        runs.push((records, t.engine().flat_weights()));
    }
    let ((fused, wf), (burn, wb)) = (&runs[0], &runs[1]);
    assert_eq!(fused.len(), burn.len());
    for (a, b) in fused.iter().zip(burn) {
        assert_eq!(
            a.groups
                .as_ref()
                .map(|g| g.iter().map(|x| &x.responses).collect::<Vec<_>>()),
            b.groups
                .as_ref()
                .map(|g| g.iter().map(|x| &x.responses).collect::<Vec<_>>()),
            "step {}: rollouts differ",
            a.step
        );
        assert_eq!(a.reward_mean, b.reward_mean, "step {}", a.step);
        assert_eq!(a.mean_length, b.mean_length, "step {}", a.step);
        assert_eq!(a.accuracy_heldout, b.accuracy_heldout, "step {}", a.step);
        for (name, x, y) in step_scalars(a, b) {
            assert!(
                close(x, y, TOL),
                "step {} {name}: fused {x} vs burn {y}",
                a.step
            );
        }
        // Per-token log π and log π_old of the logged groups (π_old from the sampling pass on
        // the fused engine, teacher-forced on burn's).
        for (ga, gb) in a.groups.iter().flatten().zip(b.groups.iter().flatten()) {
            for (x, y) in ga
                .old_logp
                .iter()
                .flatten()
                .zip(gb.old_logp.iter().flatten())
            {
                assert!(close(*x, *y, TOL), "step {}: log π_old {x} vs {y}", a.step);
            }
            for (x, y) in ga.logp.iter().flatten().zip(gb.logp.iter().flatten()) {
                assert!(close(*x, *y, TOL), "step {}: log π {x} vs {y}", a.step);
            }
        }
    }
    let worst = wf
        .iter()
        .zip(wb)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(0.0f32, f32::max);
    eprintln!(
        "worst relative weight difference after {} steps: {worst:.2e}",
        fused.len()
    );
    assert!(worst < WEIGHT_TOL, "weights differ by {worst} (relative)");
    (fused.clone(), burn.clone())
}

/// Every response length from 1 to `max_len` occurs, and some responses are truncated.
fn assert_ragged(records: &[StepRecord], max_len: usize) {
    let eos = grpo_lab::task::tokenizer::EOS_ID;
    let mut lengths = vec![false; max_len + 1];
    let mut truncated = false;
    for r in records {
        for g in r.groups.iter().flatten() {
            for resp in &g.responses {
                lengths[resp.len()] = true;
                truncated |= resp.last() != Some(&eos);
            }
        }
    }
    assert!(lengths[1..].iter().all(|x| *x), "lengths seen: {lengths:?}");
    assert!(truncated, "no truncated response");
}

#[test]
fn fused_transformer_equals_burn_on_ragged_batches() {
    let c = ragged();
    let (fused, _) = compare(&c);
    assert_ragged(&fused, c.task.max_len);
}

#[test]
fn fused_transformer_equals_burn_for_every_loss_mode_and_kl_estimator() {
    for (i, (loss, est)) in [
        (LossMode::Clipped, KlEstimator::K3),
        (LossMode::Unclipped, KlEstimator::K1),
        (LossMode::Naive, KlEstimator::K2),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = ragged();
        c.run.iterations = 2;
        c.run.seed = i as u64;
        c.algorithm.loss = loss;
        c.algorithm.kl_estimator = est;
        c.algorithm.beta = 0.1;
        c.algorithm.ref_period = 1;
        c.optimizer.max_grad_norm = 0.5;
        c.sampling.temperature = 0.8;
        compare(&c);
    }
}

#[test]
fn fused_transformer_equals_burn_for_every_aggregation_and_the_entropy_bonus() {
    for (i, agg) in LossAggMode::ALL.iter().enumerate() {
        let mut c = ragged();
        c.run.iterations = 2;
        c.run.seed = 10 + i as u64;
        c.algorithm.loss_agg_mode = *agg;
        c.algorithm.entropy_coef = if i == 1 { 0.0 } else { 0.02 };
        c.sampling.top_k = if i == 2 { 3 } else { 0 };
        c.sampling.top_p = if i == 0 { 0.9 } else { 1.0 };
        compare(&c);
    }
}

/// `run.entropy_dynamics` on the transformer: the fused step and burn's path measure the same
/// entropy change and the same first-order change ∇θH·Δθ, which is the measured one to first
/// order at a small learning rate.
#[test]
fn fused_transformer_equals_burn_on_the_entropy_mechanism() {
    let mut c = ragged();
    c.run.iterations = 2;
    c.optimizer.lr = 1e-4;
    c.run.entropy_dynamics = true;
    let (fused, burn) = compare(&c);
    for (a, b) in fused.iter().zip(&burn) {
        let (m, f) = (
            a.entropy_measured_delta.unwrap(),
            a.entropy_first_order_delta.unwrap(),
        );
        let (bm, bf) = (
            b.entropy_measured_delta.unwrap(),
            b.entropy_first_order_delta.unwrap(),
        );
        assert!(m != 0.0 && m.is_finite(), "step {}: {m}", a.step);
        assert!(
            (m - f).abs() < 0.05 * m.abs(),
            "step {}: measured {m} vs ∇H·Δθ {f}",
            a.step
        );
        assert!(
            (m - bm).abs() < 0.02 * m.abs() + 1e-6,
            "step {}: measured {m} vs burn {bm}",
            a.step
        );
        assert!(
            (f - bf).abs() < 0.02 * f.abs() + 1e-6,
            "step {}: ∇H·Δθ {f} vs burn {bf}",
            a.step
        );
    }
}

/// Dynamic sampling replaces flat groups with fresh rollouts; the fused engine carries their
/// sampling-pass log-probs and greedy answers into the batch, and still equals burn's path.
#[test]
fn fused_transformer_equals_burn_with_dynamic_sampling() {
    let mut c = ragged();
    c.task.reward = grpo_lab::config::RewardKind::Distance;
    c.task.reward_weights.clear();
    c.task.format_reward = 0.0;
    c.algorithm.dynamic_sampling = true;
    c.algorithm.max_resample_rounds = 2;
    c.algorithm.num_generations = 3;
    c.model.init_scale = 30.0;
    let (fused, _) = compare(&c);
    assert!(
        fused.iter().any(|r| r.resample_rounds > 0),
        "no group was resampled"
    );
}

/// The mismatch lab on the transformer: a bf16 sampler, a top-k sampler behind a learner at
/// temperature 1 with the sampler's support kept, and stale rollouts — each records the
/// sampler's own log π inside the KV-cache loop, and the fused engine still equals burn's path
/// (the same draws, the same corrected update).
#[test]
fn fused_transformer_equals_burn_across_the_sampler_learner_gap() {
    for (i, sets) in [
        &[
            "sampling.sampler_precision=bf16",
            "algorithm.is_correction=tis",
        ][..],
        &[
            "sampling.learner_scores=full",
            "sampling.temperature=0.8",
            "sampling.top_k=3",
            "sampling.keep_sampling_mask=true",
            "algorithm.is_correction=mis",
            "algorithm.is_threshold_low=0.5",
        ],
        &["algorithm.max_staleness=1", "algorithm.is_correction=tis"],
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = ragged();
        c.run.iterations = 3;
        c.run.seed = 20 + i as u64;
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let c = c.with_overrides(&sets).unwrap();
        let (fused, _) = compare(&c);
        assert!(fused.iter().all(|r| r.is_ratio_mean.is_some()), "{sets:?}");
        let gap = fused.last().unwrap().logp_diff_max.unwrap();
        assert!(gap > 0.0 && gap.is_finite(), "{sets:?}: gap {gap}");
    }
}

/// The supervised cold start on the fused engine equals burn's (the same held-out accuracy
/// after it, the same first rollouts and metrics after it).
#[test]
fn fused_cold_start_equals_burn() {
    let mut c = ragged();
    c.model.init_scale = 1.0;
    c.sft.steps = 8;
    c.sft.batch_size = 8;
    c.sft.examples = 32;
    c.run.iterations = 1;
    compare(&c);
}

/// The preset's own shape (a shortened run, dynamic sampling on): same rollouts, metrics and
/// weights.
#[test]
fn fused_transformer_equals_burn_on_the_preset_shape() {
    let mut c = RunConfig::preset("transformer-sort").unwrap();
    c.task.train_size = 256;
    c.task.heldout_size = 32;
    c.algorithm.prompts_per_iteration = 8;
    c.sft.steps = 3;
    c.sft.batch_size = 16;
    c.run.iterations = 2;
    c.run.log_groups = 8;
    compare(&c);
}

/// `log π` seen while sampling token by token with the KV cache equals the teacher-forced
/// `log π` the loss uses, for the same tokens (within 1e-5: the cache computes each position
/// with products of other shapes, so only the rounding differs).
#[test]
fn sampling_time_logprobs_equal_teacher_forced() {
    let c = ragged();
    let mut engine = FusedTransformerEngine::new(&c);
    let prompts: Vec<Vec<u32>> = vec![vec![3, 1, 0], vec![0, 0, 2], vec![2, 1, 3]];
    let refs: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
    for temperature in [1.0f32, 0.7] {
        let g = 5;
        let samples = engine
            .sample(&SampleRequest {
                prompts: &refs,
                g,
                max_len: c.task.max_len,
                params: SamplingParams {
                    temperature,
                    top_k: 0,
                    top_p: 1.0,
                },
                seed: 4,
                stream: 1,
                sampler: Default::default(),
                verify: None,
            })
            .unwrap();
        let eos = c.task.vocab as u32;
        let flat: Vec<u32> = prompts.iter().flatten().copied().collect();
        let batch = Batch::padded(flat, c.task.n, &samples.rows, g, eos);
        let forced = engine
            .token_logp(Which::Policy, &batch, temperature)
            .unwrap();
        let seen = samples.logp.unwrap();
        assert_eq!(seen.len(), forced.len());
        for (i, (a, b)) in seen.iter().zip(&forced).enumerate() {
            assert!((a - b).abs() < 1e-5, "token {i}: sampled {a} vs forced {b}");
        }
        // Greedy answers that came with the rollout equal a greedy pass.
        assert_eq!(
            samples.greedy.unwrap(),
            engine.greedy(&refs, c.task.max_len).unwrap()
        );
    }
}

/// A run checkpointed between iterations and restored into a fresh trainer continues
/// bit-identically on the fused engine; a checkpoint of burn's path continues on burn's.
#[test]
fn fused_checkpoints_resume_exactly_and_burns_continue_on_burn() {
    let mut c = ragged();
    c.run.iterations = 4;
    let mut whole = Trainer::new(c.clone(), Compute::cpu()).unwrap();
    let mut first = Trainer::new(c.clone(), Compute::cpu()).unwrap();
    let mut straight = Vec::new();
    while !whole.is_done() {
        straight.push(whole.step().unwrap());
    }
    for _ in 0..2 * c.algorithm.mu {
        first.step().unwrap();
    }
    let (state, snapshot) = first.snapshot().unwrap();
    assert!(snapshot.iter().any(|(n, _)| n == "fused_adam.bin"));
    let mut resumed = Trainer::new(c.clone(), Compute::cpu()).unwrap();
    resumed.restore(state, &snapshot).unwrap();
    let mut after = Vec::new();
    while !resumed.is_done() {
        after.push(resumed.step().unwrap());
    }
    let strip = |r: &StepRecord| {
        let mut r = r.clone();
        r.step_time_secs = 0.0;
        r.tokens_per_second = 0.0;
        r
    };
    for (a, b) in straight[2 * c.algorithm.mu..].iter().zip(&after) {
        // Debug text: NaN fields (a length mean over no correct response) compare equal.
        assert_eq!(format!("{:?}", strip(a)), format!("{:?}", strip(b)));
    }
    assert_eq!(
        whole.engine().flat_weights(),
        resumed.engine().flat_weights()
    );

    // burn's checkpoint: refused by the fused engine, continued on burn's path.
    let mut off = c.clone();
    off.run.fused_step = FusedChoice::Off;
    let mut burn = Trainer::new(off, Compute::cpu()).unwrap();
    for _ in 0..c.algorithm.mu {
        burn.step().unwrap();
    }
    let (mut state, snapshot) = burn.snapshot().unwrap();
    // As if written on a GPU (burn's path) with the same config otherwise.
    state.config_toml = None;
    let mut engine = FusedTransformerEngine::new(&c);
    assert!(matches!(
        engine.restore(&snapshot),
        Err(grpo_lab::engine::EngineError::WrittenByBurn)
    ));
    let mut t = Trainer::new(c, Compute::cpu()).unwrap();
    t.restore(state, &snapshot).unwrap();
    assert!(t.engine_label().contains("burn"), "{}", t.engine_label());
    t.step().unwrap();
}

//! The fused CPU step for the lecture model is held equal to burn's autodiff path: same
//! rollouts, same losses and metrics within 1e-3, same weights within 1e-3 after several
//! iterations, for the loss modes, the KL estimators, clipping and grad-norm clipping.

mod common;

use common::*;
use grpo_lab::config::{FusedChoice, KlEstimator, LossMode, RunConfig};
use grpo_lab::gpu::Compute;
use grpo_lab::grpo::Trainer;

fn weights(t: &Trainer) -> Vec<f32> {
    t.engine().flat_weights()
}

/// Metrics and weights agree within this, relative to 1 + |x|. Not tighter: Adam turns
/// rounding noise in near-zero gradient components into ±lr steps, so two correct orders of
/// summation drift apart by ~1e-4 over a few iterations (measured: ≤ 4e-4 on lecture17).
const TOL: f32 = 1e-3;

fn compare(config: RunConfig, iterations: usize, weight_tol: f32) {
    let mut runs = Vec::new();
    for choice in [FusedChoice::Auto, FusedChoice::Off] {
        let mut c = config.clone();
        c.run.fused_step = choice;
        c.run.iterations = iterations;
        let mut t = Trainer::new(c, Compute::cpu()).unwrap();
        let mut records = Vec::new();
        while !t.is_done() {
            records.push(t.step().unwrap());
        }
        runs.push((records, weights(&t)));
    }
    let ((fused, wf), (burn, wb)) = (&runs[0], &runs[1]);
    for (a, b) in fused.iter().zip(burn) {
        assert_eq!(
            a.groups.as_ref().map(|g| &g[0].responses),
            b.groups.as_ref().map(|g| &g[0].responses),
            "step {}",
            a.step
        );
        assert_eq!(a.reward_mean, b.reward_mean, "step {}", a.step);
        for (name, x, y) in step_scalars(a, b) {
            if std::env::var_os("FUSED_REPORT").is_some() && !close(x, y, 1e-6) {
                eprintln!("step {} {name}: fused {x} vs burn {y}", a.step);
            }
            assert!(
                close(x, y, TOL),
                "step {} {name}: fused {x} vs burn {y}",
                a.step
            );
        }
    }
    let worst = wf
        .iter()
        .zip(wb)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(0.0f32, f32::max);
    eprintln!("worst relative weight difference after {iterations} iterations: {worst:.2e}");
    assert!(
        worst < weight_tol,
        "weights differ by {worst} (relative) after {iterations} iterations"
    );
}

#[test]
fn fused_step_equals_burn_on_lecture17() {
    // The lecture's init makes the policy nearly deterministic: many gradient components are
    // rounding noise, which Adam turns into ±lr steps, so weights drift by up to ~20·lr·ε-scale
    // in those components (measured 3e-3 after 20 steps); everything the policy does agrees.
    compare(short_lecture(2), 2, 1e-2);
}

#[test]
fn fused_step_equals_burn_with_clipping_kl_and_grad_clipping() {
    for (loss, est) in [
        (LossMode::Clipped, KlEstimator::K3),
        (LossMode::Unclipped, KlEstimator::K1),
        (LossMode::Clipped, KlEstimator::K2),
    ] {
        let mut c = short_lecture(3);
        c.model.init_scale = 0.3;
        c.optimizer.lr = 0.01;
        c.algorithm.loss = loss;
        c.algorithm.epsilon_low = 0.2;
        c.algorithm.epsilon_high = 0.28;
        c.algorithm.beta = 0.1;
        c.algorithm.kl_estimator = est;
        c.optimizer.max_grad_norm = 0.5;
        c.sampling.temperature = 0.8;
        compare(c, 3, TOL);
    }
}

/// The 2025–26 objectives train the same on the fused lecture step as on burn's path, at a
/// temperature ≠ 1 (where the fused step folds 1/T into its coefficients).
#[test]
fn fused_step_equals_burn_for_every_new_objective() {
    for sets in [
        &["algorithm.loss=cispo", "algorithm.loss_agg_mode=token-mean"][..],
        &["algorithm.loss=sapo"],
        &[
            "algorithm.loss=gmpo",
            "algorithm.epsilon_low=0.4",
            "algorithm.epsilon_high=0.4",
        ],
        &[
            "algorithm.importance_sampling_level=sequence",
            "algorithm.epsilon_low=0.003",
            "algorithm.epsilon_high=0.004",
        ],
        &[
            "algorithm.importance_sampling_level=sequence",
            "algorithm.loss_agg_mode=luspo",
        ],
        &["algorithm.importance_sampling_level=sequence_token"],
        &["algorithm.dual_clip=1.5", "algorithm.delta=1.4"],
        // The covariance rules: a window that holds every token and ratios that pick some.
        &[
            "algorithm.cov_penalty=clip_cov",
            "algorithm.clip_cov_ratio=0.05",
            "algorithm.clip_cov_lb=-100",
            "algorithm.clip_cov_ub=100",
        ],
        &[
            "algorithm.loss=unclipped",
            "algorithm.cov_penalty=kl_cov",
            "algorithm.kl_cov_ratio=0.05",
            "algorithm.kl_cov_coef=0.5",
        ],
        // The mismatch lab: a learner at temperature 1 behind a top-k sampler at 0.8, TIS and
        // the unbiased KL; a bf16 sampler with sequence-level MIS; OPSM.
        &[
            "sampling.learner_scores=full",
            "sampling.top_k=3",
            "algorithm.is_correction=tis",
            "algorithm.is_threshold_low=0.5",
            "algorithm.beta=0.1",
            "algorithm.unbiased_kl=true",
        ],
        &[
            "sampling.sampler_precision=bf16",
            "algorithm.is_correction=mis",
            "algorithm.is_level=sequence",
            "algorithm.is_threshold_high=1.02",
        ],
        &[
            "algorithm.is_correction=opsm",
            "algorithm.opsm_threshold=0.02",
        ],
        &["algorithm.max_staleness=1", "algorithm.is_correction=tis"],
        // The kept sampling mask: a top-2 sampler, the learner renormalised over its support
        // (every distribution it scores, the reference's too, under a KL).
        &[
            "sampling.top_k=2",
            "sampling.keep_sampling_mask=true",
            "algorithm.beta=0.1",
        ],
        &[
            "sampling.top_p=0.6",
            "sampling.learner_scores=full",
            "sampling.keep_sampling_mask=true",
            "algorithm.is_correction=tis",
        ],
    ] {
        let mut c = short_lecture(2);
        c.model.init_scale = 0.3;
        c.optimizer.lr = 0.01;
        c.algorithm.loss = LossMode::Clipped;
        c.sampling.temperature = 0.8;
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let c = c.with_overrides(&sets).expect("a valid objective");
        compare(c, 2, TOL);
    }
}

#[test]
fn fused_step_equals_burn_on_random_prompts() {
    let mut c = RunConfig::preset("random-sort").unwrap();
    c.task.train_size = 128;
    c.algorithm.prompts_per_iteration = 32;
    compare(c, 2, TOL);
}

/// A config changed mid-run to something the fused path does not cover (the app's Apply)
/// continues on burn's path from the fused path's weights.
#[test]
fn switching_to_an_uncovered_config_mid_run_continues_on_burn() {
    let mut t = Trainer::new(short_lecture(3), Compute::cpu()).unwrap();
    for _ in 0..15 {
        t.step().unwrap();
    }
    let before = t.step().unwrap();
    t.config.algorithm.entropy_coef = 0.01;
    let after = t.step().unwrap();
    assert!(after.loss.is_finite() && after.grad_norm > 0.0);
    // The burn path picked up the trained weights, not the initial ones: its entropy continues
    // from where the fused path left it.
    assert!(
        (after.entropy - before.entropy).abs() < 0.05,
        "{} vs {}",
        after.entropy,
        before.entropy
    );
    while !t.is_done() {
        t.step().unwrap();
    }
}

/// The fused forward takes its products in an order chosen for `vocab < batch`; it must stay
/// exact when the vocabulary is the larger one (few prompts, many tokens).
#[test]
fn fused_step_equals_burn_when_the_vocabulary_outnumbers_the_batch() {
    let mut c = RunConfig::preset("random-sort").unwrap();
    c.task.n = 3;
    c.task.vocab = 24;
    c.task.train_size = 64;
    c.task.heldout_size = 16;
    c.model.d_model = 12;
    c.algorithm.prompts_per_iteration = 4;
    c.algorithm.num_generations = 6;
    // Two iterations (8 steps): at lr 1e-2 this tiny policy gets near-deterministic fast, and
    // from the third iteration Adam's ±lr steps on rounding-noise gradients make any two
    // correct implementations drift apart (the previous fused code drifted identically).
    compare(c, 2, TOL);
}

/// The mismatch lab on the real engines: a configured gap shows in TRL's `sampling/*`
/// metrics (none without one); a correction changes the update, never the draws — with and
/// without it the first rollout is the same, token for token; bf16 logits move the draws.
#[test]
fn a_sampler_learner_gap_is_measured_and_corrected_from_the_same_draws() {
    let run = |sets: &[&str]| {
        let mut c = short_lecture(2);
        c.sampling.temperature = 0.7;
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let c = c.with_overrides(&sets).unwrap();
        let mut t = Trainer::new(c, Compute::cpu()).unwrap();
        let mut records = Vec::new();
        while !t.is_done() {
            records.push(t.step().unwrap());
        }
        records
    };
    let plain = run(&[]);
    assert!(plain.iter().all(|r| r.is_ratio_mean.is_none()));
    let gap = ["sampling.learner_scores=full", "sampling.top_k=3"];
    let uncorrected = run(&gap[..1]);
    let corrected = run(&[
        gap[0],
        gap[1],
        "algorithm.is_correction=mis",
        "algorithm.is_threshold_low=0.9",
        "algorithm.is_threshold_high=1.1",
    ]);
    let first = |r: &[grpo_lab::metrics::StepRecord]| {
        let groups = r.iter().find_map(|x| x.groups.clone()).unwrap();
        groups[0].responses.clone()
    };
    assert_eq!(
        first(&plain),
        first(&uncorrected),
        "a learner at T = 1 draws the same"
    );
    let truncated = run(&[gap[0], gap[1]]);
    assert_eq!(
        first(&truncated),
        first(&corrected),
        "the correction moves no draw"
    );
    let r = &corrected[0];
    let (lo, mean, hi) = (
        r.is_ratio_min.unwrap(),
        r.is_ratio_mean.unwrap(),
        r.is_ratio_max.unwrap(),
    );
    assert!(
        lo <= mean && mean <= hi && r.is_masked.unwrap() > 0.0,
        "{r:?}"
    );
    assert!(r.logp_diff_max.unwrap() > 0.0 && r.is_ess.unwrap() <= 1.0);
    // The weights zero part of the tokens: the update differs from the uncorrected one.
    let last = |r: &[grpo_lab::metrics::StepRecord]| r.last().unwrap().loss;
    assert_ne!(last(&truncated), last(&corrected));
    // Without a correction the raw weight is logged (its band never masks).
    assert_eq!(truncated[0].is_masked, Some(0.0));
    let bf16 = run(&["sampling.sampler_precision=bf16"]);
    assert!(bf16[0].logp_diff_max.unwrap() > 0.0);
}

/// DeepSeek-V3.2's keep-sampling-mask: behind a top-2 sampler at the learner's temperature the
/// learner's log π_old is the very distribution drawn from (the gap falls to rounding), while
/// without it the truncation is a gap of the dropped mass; the draws are the same either way,
/// and the support travels with the groups dynamic sampling puts in.
#[test]
fn the_kept_sampling_mask_closes_the_truncation_gap() {
    let run = |keep: bool| {
        let mut c = short_lecture(3);
        c.sampling.temperature = 0.7;
        c.sampling.top_k = 2;
        c.sampling.keep_sampling_mask = keep;
        c.algorithm.is_correction = grpo_lab::config::IsCorrection::Tis;
        c.algorithm.dynamic_sampling = true;
        c.validate().unwrap();
        let mut t = Trainer::new(c, Compute::cpu()).unwrap();
        let mut records = Vec::new();
        while !t.is_done() {
            records.push(t.step().unwrap());
        }
        records
    };
    let (kept, open) = (run(true), run(false));
    let first = |r: &[grpo_lab::metrics::StepRecord]| {
        let groups = r.iter().find_map(|x| x.groups.clone()).unwrap();
        groups[0].responses.clone()
    };
    assert_eq!(first(&kept), first(&open), "the mask moves no draw");
    for r in &kept {
        let gap = r.logp_diff_max.unwrap();
        assert!(gap < 1e-5, "step {}: gap {gap} with the mask kept", r.step);
        assert!((r.is_ratio_mean.unwrap() - 1.0).abs() < 1e-5, "{r:?}");
    }
    assert!(
        kept.iter().any(|r| r.resample_rounds > 0),
        "no group was resampled"
    );
    let gap = open[0].logp_diff_max.unwrap();
    assert!(gap > 0.05, "the truncation gap without the mask: {gap}");
    // The renormalised distribution has less entropy than the full one it came from.
    assert!(
        kept[0].entropy < open[0].entropy,
        "{} vs {}",
        kept[0].entropy,
        open[0].entropy
    );
}

/// Stale rollouts: iteration i draws with the policy of iteration i − k (its first k iterations
/// with the first policy), the learner rescoring them; the kept policies go through a
/// checkpoint, so a resumed run draws and trains exactly as the uninterrupted one.
#[test]
fn stale_rollouts_draw_from_older_policies_and_survive_a_resume() {
    let mut c = short_lecture(4);
    c.sampling.temperature = 0.9;
    c.model.init_scale = 0.3;
    c.optimizer.lr = 0.01;
    c.algorithm.mu = 2;
    c.algorithm.max_staleness = 2;
    c.algorithm.is_correction = grpo_lab::config::IsCorrection::Tis;
    let steps = |t: &mut Trainer, n: usize| -> Vec<grpo_lab::metrics::StepRecord> {
        (0..n).map(|_| t.step().unwrap()).collect()
    };
    let mut whole = Trainer::new(c.clone(), Compute::cpu()).unwrap();
    let all = steps(&mut whole, 8);
    // Iteration 0 draws with the policy it learns with: no gap but rounding; then a real one.
    let gap = |r: &grpo_lab::metrics::StepRecord| r.logp_diff_mean.unwrap();
    assert!(gap(&all[0]) < 1e-5, "{}", gap(&all[0]));
    assert!(
        gap(&all[4]) > 1e-3 && gap(&all[6]) > gap(&all[2]),
        "{all:?}"
    );
    // Interrupted after two iterations, resumed from its checkpoint (through JSON).
    let mut first = Trainer::new(c.clone(), Compute::cpu()).unwrap();
    steps(&mut first, 4);
    let (state, blobs) = first.snapshot().unwrap();
    assert!(
        blobs.iter().any(|(n, _)| n.starts_with("stale-1-")),
        "two kept policies"
    );
    let state = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let mut second = Trainer::new(c, Compute::cpu()).unwrap();
    second.restore(state, &blobs).unwrap();
    let resumed = steps(&mut second, 4);
    for (a, b) in all[4..].iter().zip(&resumed) {
        assert_eq!(
            (a.loss, a.logp_diff_mean),
            (b.loss, b.logp_diff_mean),
            "step {}",
            a.step
        );
    }
}

/// `run.entropy_dynamics`: every step logs Cov(log π, A) and the law's −lr·Cov; the fused step
/// and burn's path measure the same entropy change and the same ∇H·Δθ, which is that change to
/// first order (a small learning rate: the second-order rest is small); without the switch
/// nothing is logged.
#[test]
fn the_entropy_mechanism_is_logged_predicted_and_measured() {
    let mut c = RunConfig::preset("lecture17").unwrap();
    c.run.iterations = 2;
    c.algorithm.mu = 3;
    c.optimizer.lr = 1e-4;
    c.run.entropy_dynamics = true;
    let run = |fused: FusedChoice| {
        let mut c = c.clone();
        c.run.fused_step = fused;
        let mut t = Trainer::new(c, Compute::cpu()).unwrap();
        let mut records = Vec::new();
        while !t.is_done() {
            records.push(t.step().unwrap());
        }
        records
    };
    let (fused, burn) = (run(FusedChoice::Auto), run(FusedChoice::Off));
    for (a, b) in fused.iter().zip(&burn) {
        let (cov, predicted) = (
            a.entropy_covariance.unwrap(),
            a.entropy_predicted_delta.unwrap(),
        );
        assert!(
            (predicted + 1e-4 * cov).abs() < 1e-9,
            "{predicted} vs −lr·{cov}"
        );
        assert!(close(cov, b.entropy_covariance.unwrap(), TOL));
        let (measured, first) = (
            a.entropy_measured_delta.unwrap(),
            a.entropy_first_order_delta.unwrap(),
        );
        assert!(measured != 0.0 && measured.is_finite());
        assert!(
            (measured - first).abs() < 0.05 * measured.abs(),
            "step {}: measured {measured} vs first order {first}",
            a.step
        );
        let burn_measured = b.entropy_measured_delta.unwrap();
        assert!(
            (measured - burn_measured).abs() < 0.05 * measured.abs() + 1e-7,
            "step {}: fused {measured} vs burn {burn_measured}",
            a.step
        );
        let burn_first = b.entropy_first_order_delta.unwrap();
        assert!(
            (first - burn_first).abs() < 0.05 * first.abs() + 1e-7,
            "step {}: fused ∇H·Δθ {first} vs burn's {burn_first}",
            a.step
        );
        // The entropy after step k is the entropy before step k + 1 (same batch).
        if let Some(next) = fused
            .iter()
            .find(|r| r.step == a.step + 1 && r.iteration == a.iteration)
        {
            assert!((a.entropy + measured - next.entropy).abs() < 1e-5);
        }
    }
    // The logged groups carry each token's covariance term.
    let logged = fused.iter().find_map(|r| r.groups.as_ref()).unwrap();
    assert_eq!(logged[0].cov_terms.len(), logged[0].responses.len());
    c.run.entropy_dynamics = false;
    let mut t = Trainer::new(c.clone(), Compute::cpu()).unwrap();
    let r = t.step().unwrap();
    assert!(r.entropy_covariance.is_none() && r.entropy_measured_delta.is_none());
    // A live switch (the app's Run ▸ Entropy dynamics): no reset needed, the next step logs.
    c.run.entropy_dynamics = true;
    assert!(Trainer::needs_reset(&t.config, &c).is_empty());
    assert!(t.apply_live(&c).is_empty());
    let r = t.step().unwrap();
    assert!(r.entropy_covariance.is_some() && r.entropy_measured_delta.is_some());
}

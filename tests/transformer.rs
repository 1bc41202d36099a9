//! The autoregressive policy: masks, aggregations on ragged batches, autoregressive =
//! teacher-forced log-probs, dynamic sampling's bound, length metrics, bad shapes.

mod common;

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use common::*;
use grpo_lab::config::{KlEstimator, LossAggMode, LossMode, ModelKind, RunConfig};
use grpo_lab::engine::autodiff::read_back;
use grpo_lab::gpu::Compute;
use grpo_lab::grpo::Trainer;
use grpo_lab::model::Policy;
use grpo_lab::objective::loss::{self, LossSettings, TokenInputs, TokenTerms, reference};
use grpo_lab::objective::sampling;
use grpo_lab::rng::SplitMix64;

/// A tiny transformer sorting task (fast enough for debug builds).
fn tiny() -> RunConfig {
    let mut c = RunConfig::preset("transformer-sort").unwrap();
    c.task.n = 3;
    c.task.vocab = 5;
    c.task.train_size = 64;
    c.task.heldout_size = 16;
    c.task.max_len = 6;
    c.model.d_model = 16;
    c.model.heads = 2;
    c.model.context = 8;
    c.algorithm.num_generations = 4;
    c.algorithm.prompts_per_iteration = 4;
    c.sft.steps = 0;
    c.run.iterations = 2;
    c.run.log_groups = 2;
    c.validate().unwrap();
    c
}

fn ints3(v: &[i64], s: [usize; 3], d: &Device) -> Tensor<3, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), s), d)
}

/// The three aggregations against hand values on a ragged batch; padding holds junk.
#[test]
fn aggregations_hand_values_on_ragged_batch() {
    // B = 1, G = 2, T = 3: response 0 has 3 tokens (1, 2, 3), response 1 has 1 token (4).
    let x = [1.0f32, 2.0, 3.0, 4.0, 100.0, -7.0];
    let mask = [1.0f32, 1.0, 1.0, 1.0, 0.0, 0.0];
    let agg = |m| -> f32 {
        let w = reference::aggregation_weights(m, &mask, 3, 3);
        w.iter().zip(&x).map(|(w, x)| w * x).sum()
    };
    // GRPO: mean over each response, then over responses: (2 + 4) / 2.
    assert!((agg(LossAggMode::SeqMeanTokenMean) - 3.0).abs() < 1e-6);
    // DAPO: every real token weighs the same: 10 / 4.
    assert!((agg(LossAggMode::TokenMean) - 2.5).abs() < 1e-6);
    // Dr. GRPO: a constant normaliser, responses × max length: 10 / (2 · 3).
    assert!((agg(LossAggMode::SeqMeanTokenSumNorm) - 10.0 / 6.0).abs() < 1e-6);
}

/// Padding never reaches the loss, the KL, the clip fractions or the entropy: changing
/// everything at padded positions (tokens, log π_old, log π_ref) changes nothing.
#[test]
fn padding_never_contributes() {
    let c = tiny();
    let d = Device::flex().autodiff();
    let policy = Policy::new(&c, &d);
    let prompts = Tensor::<2, Int>::from_data(TensorData::new(vec![2i64, 0, 1], [1, 3]), &d);
    let lengths = [2usize, 4, 1, 3];
    let (g, t) = (4, 4);
    let mut rng = SplitMix64::new(3);
    let mask: Vec<f32> = (0..g * t)
        .map(|i| (i % t < lengths[i / t]) as u32 as f32)
        .collect();
    let tokens_a: Vec<i64> = (0..g * t).map(|_| rng.below(6) as i64).collect();
    let junk = |v: &[f32], rng: &mut SplitMix64| -> Vec<f32> {
        v.iter()
            .zip(&mask)
            .map(|(x, m)| {
                if *m == 1.0 {
                    *x
                } else {
                    (rng.next_f64() * 20.0 - 10.0) as f32
                }
            })
            .collect()
    };
    let old: Vec<f32> = (0..g * t).map(|_| -(rng.next_f64() as f32) * 2.0).collect();
    let refp: Vec<f32> = (0..g * t).map(|_| -(rng.next_f64() as f32) * 2.0).collect();
    let tokens_b: Vec<i64> = tokens_a
        .iter()
        .zip(&mask)
        .map(|(x, m)| if *m == 1.0 { *x } else { (x + 1) % 6 })
        .collect();
    let (old_b, ref_b) = (junk(&old, &mut rng), junk(&refp, &mut rng));
    for agg in LossAggMode::ALL {
        let s = LossSettings {
            mode: LossMode::Clipped,
            epsilon_low: 0.2,
            epsilon_high: 0.28,
            beta: 0.1,
            kl_in_loss: true,
            kl_estimator: KlEstimator::K3,
            agg: *agg,
            bug_ratio_quotient: false,
            max_len: t,
            entropy_coef: 0.02,
            ..LossSettings::plain(LossMode::Clipped, KlEstimator::K3, *agg)
        };
        let run = |tokens: &[i64], old: &[f32], refp: &[f32]| -> Vec<f32> {
            let (logp, ent) =
                policy.score(prompts.clone(), ints3(tokens, [1, g, t], &d), 1.0, None);
            let (logp, ent) = read_back(&logp, &ent);
            let mut out = TokenTerms::default();
            let inputs = TokenInputs {
                logp: &logp,
                old_logp: old,
                ref_logp: refp,
                sampler_logp: None,
                advantages: &[1.0, -0.5, 0.3, -0.8],
                mask: &mask,
                entropy: Some(&ent),
                t,
            };
            loss::evaluate(&s, &inputs, &mut out);
            // The coefficients: 0 on padding, and (below) the same on real tokens.
            for (i, (&c, &m)) in out.dlogp.iter().zip(&mask).enumerate() {
                assert!(m == 1.0 || c == 0.0, "padding {i} has coefficient {c}");
            }
            let mut v = vec![
                out.loss as f32,
                out.kl,
                out.clip_low,
                out.clip_high,
                out.ratio_mean,
                out.entropy,
            ];
            v.extend(out.dlogp.iter().chain(&out.dentropy));
            v
        };
        let a = run(&tokens_a, &old, &refp);
        let b = run(&tokens_b, &old_b, &ref_b);
        for (x, y) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + x.abs()),
                "{agg}: {a:?} vs {b:?}"
            );
        }
    }
}

/// The log-probs seen while sampling token by token equal the teacher-forced ones that
/// the loss uses, for the same tokens, at T = 1 and T = 0.7.
#[test]
fn autoregressive_logprobs_equal_teacher_forced() {
    let mut c = tiny();
    c.model.init_scale = 20.0; // far from uniform, so a mismatch would show
    let d = Device::flex();
    let policy = Policy::new(&c, &d);
    let prompts: Vec<Vec<u32>> = vec![vec![3, 1, 4], vec![0, 0, 2]];
    let refs: Vec<&Vec<u32>> = prompts.iter().collect();
    let (g, v) = (3, c.task.vocab + 1);
    for temperature in [1.0f32, 0.7] {
        let params = sampling::SamplingParams {
            temperature,
            top_k: 0,
            top_p: 1.0,
        };
        let mut seen: Vec<Vec<f32>> = vec![Vec::new(); prompts.len() * g];
        let mut done = vec![false; prompts.len() * g];
        let generated = policy
            .generate(&refs, g, c.max_len(), &d, |logits, t| {
                let rows = logits.len() / v;
                let toks = sampling::sample_independent(logits, rows, 1, v, 1, params, 9, t as u32);
                for r in 0..rows {
                    if done[r] {
                        continue;
                    }
                    let row: Vec<f32> = logits[r * v..(r + 1) * v]
                        .iter()
                        .map(|x| x / temperature)
                        .collect();
                    let m = row.iter().fold(f32::MIN, |a, &b| a.max(b));
                    let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f32>().ln();
                    seen[r].push(row[toks[r] as usize] - lse);
                    done[r] = toks[r] as usize == v - 1;
                }
                Ok::<_, ()>(toks)
            })
            .unwrap();
        let t = generated.rows.iter().map(|r| r.len()).max().unwrap();
        let mut ids = Vec::new();
        for r in &generated.rows {
            for i in 0..t {
                ids.push(*r.get(i).unwrap_or(&(v as u32 - 1)) as i64);
            }
        }
        let pt =
            Tensor::<2, Int>::from_data(TensorData::new(vec![3i64, 1, 4, 0, 0, 2], [2, 3]), &d);
        let (logp, _) = policy.score(pt, ints3(&ids, [2, g, t], &d), temperature, None);
        let logp = logp.into_data().try_to_vec::<f32>().unwrap();
        for (r, row) in generated.rows.iter().enumerate() {
            assert_eq!(seen[r].len(), row.len());
            for (i, want) in seen[r].iter().enumerate() {
                let got = logp[r * t + i];
                assert!(
                    (got - want).abs() < 1e-4,
                    "row {r} token {i}: {got} vs {want}"
                );
            }
        }
        // Closed rows end with <eos>; the others are truncated at max_len.
        for (row, closed) in generated.rows.iter().zip(&generated.closed) {
            assert_eq!(*closed, row.last() == Some(&(v as u32 - 1)));
            assert!(row.len() <= c.max_len());
            if !closed {
                assert_eq!(row.len(), c.max_len());
            }
        }
    }
    // A log-softmax sanity check of the reference computation itself.
    let l = log_softmax(Tensor::<1>::from_floats([0.0, 0.0], &d), 0);
    let first = l.narrow(0, 0, 1).into_data().try_to_vec::<f32>().unwrap()[0];
    assert!((first + std::f32::consts::LN_2).abs() < 1e-6);
}

/// Dynamic sampling with a reward that is flat for every group stops after its bound
/// and counts what it did.
#[test]
fn dynamic_sampling_is_bounded() {
    let mut c = short_lecture(2);
    c.task.reward = grpo_lab::config::RewardKind::Exact;
    c.task.reward_weights.clear();
    c.model.init_scale = 0.01; // near-uniform: exact matches are rare but possible
    c.task.prompts = vec![vec![4, 3, 2]];
    c.algorithm.num_generations = 2;
    c.algorithm.dynamic_sampling = true;
    c.algorithm.max_resample_rounds = 3;
    let mut trainer = Trainer::new(c, Compute::cpu()).unwrap();
    let r = trainer.step().unwrap();
    assert!(r.resample_rounds <= 3, "{}", r.resample_rounds);
    assert_eq!(
        r.resampled_groups, r.resample_rounds,
        "one group, resampled each round"
    );
    if r.frac_reward_zero_std == 1.0 {
        assert_eq!(
            r.resample_rounds, 3,
            "flat after the bound: all rounds were used"
        );
    }
    assert_eq!(r.zero_std_first_draw, 1.0);
}

/// A short transformer run: lengths and truncation are logged, the run is a function of its
/// seed, and groups carry one log-prob per real token.
#[test]
fn transformer_run_is_deterministic_and_logs_lengths() {
    let c = tiny();
    let (a, b) = (temp_dir("tf-a"), temp_dir("tf-b"));
    for dir in [&a, &b] {
        grpo_lab::train::run(
            c.clone(),
            Compute::cpu(),
            grpo_lab::train::RunOptions {
                out: dir.to_path_buf(),
                ..Default::default()
            },
        )
        .unwrap();
    }
    let ma = metrics_without_timing(&a.join("metrics.jsonl"));
    assert_eq!(ma, metrics_without_timing(&b.join("metrics.jsonl")));
    let records = grpo_lab::train::read_metrics(&a.join("metrics.jsonl")).unwrap();
    for r in &records {
        assert!(r.min_length >= 1.0 && r.max_length <= c.max_len() as f32);
        assert!(r.min_length <= r.mean_length && r.mean_length <= r.max_length);
        assert!((0.0..=1.0).contains(&r.clipped_ratio));
        if let Some(groups) = &r.groups {
            for gr in groups {
                for (resp, lp) in gr.responses.iter().zip(&gr.logp) {
                    assert_eq!(resp.len(), lp.len());
                    let closed = resp.last() == Some(&grpo_lab::task::tokenizer::EOS_ID);
                    assert!(closed || resp.len() == c.max_len());
                }
            }
        }
    }
    assert!(records.iter().any(|r| r.groups.is_some()));
}

/// The kernel path samples the same tokens as the Rust path for the transformer too.
#[test]
fn transformer_kernel_and_reference_paths_agree() {
    let Some(wgpu) = wgpu_compute() else { return };
    let mut runs = Vec::new();
    for kernels in [
        grpo_lab::config::KernelChoice::Gpu,
        grpo_lab::config::KernelChoice::Reference,
    ] {
        let mut c = tiny();
        c.run.kernels = kernels;
        let mut t = Trainer::new(c, wgpu.clone()).unwrap();
        runs.push((0..2).map(|_| t.step().unwrap()).collect::<Vec<_>>());
    }
    for (a, b) in runs[0].iter().zip(&runs[1]) {
        assert_eq!(a.reward_mean, b.reward_mean);
        assert_eq!(a.groups, b.groups);
    }
}

#[test]
fn bad_shapes_name_both_numbers() {
    let c = tiny();
    let err = |sets: &[&str]| {
        c.with_overrides(&sets.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap_err()
            .to_string()
    };
    let e = err(&["task.max_len=2"]);
    assert!(
        e.contains("task.max_len") && e.contains('2') && e.contains("task.n = 3"),
        "{e}"
    );
    let e = err(&["model.context=6"]);
    assert!(
        e.contains("model.context") && e.contains('6') && e.contains("= 8"),
        "{e}"
    );
    let e = err(&["model.vocab=12"]);
    assert!(
        e.contains("model.vocab") && e.contains("12") && e.contains("6 tokens"),
        "{e}"
    );
    let e = err(&["model.heads=3"]);
    assert!(e.contains("model.heads") && e.contains("16"), "{e}");
    let mut lecture = short_lecture(1);
    lecture.task.format_reward = 1.0;
    let e = lecture.validate().unwrap_err().to_string();
    assert!(
        e.contains("task.format_reward") && e.contains("transformer"),
        "{e}"
    );
    assert_eq!(c.model.kind, ModelKind::Transformer);
}

/// The curriculum starts from the easiest quarter of the training prompts (fewest inversions).
#[test]
fn curriculum_starts_easy() {
    let mut c = RunConfig::preset("random-sort").unwrap();
    c.algorithm.prompt_sampling = grpo_lab::config::PromptSampling::Curriculum;
    c.algorithm.prompts_per_iteration = 32;
    c.run.iterations = 8;
    c.run.log_groups = 32;
    let mut t = Trainer::new(c.clone(), Compute::cpu()).unwrap();
    let inv = |p: &[u32]| {
        (0..p.len())
            .flat_map(|i| (i + 1..p.len()).map(move |j| (i, j)))
            .filter(|&(i, j)| p[i] > p[j])
            .count()
    };
    let mut all: Vec<usize> = t.prompts.train.iter().map(|p| inv(p)).collect();
    all.sort();
    let quarter = all[all.len() / 4];
    let mut first = None;
    while first.is_none() {
        first = t.step().unwrap().groups;
    }
    for g in first.unwrap() {
        assert!(
            inv(&g.prompt) <= quarter,
            "{:?} is not among the easiest quarter",
            g.prompt
        );
    }
    let e = c
        .with_overrides(&["algorithm.prompts_per_iteration=0".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("algorithm.prompt_sampling"), "{e}");
}

/// The entropy bonus is wired into the loss: the same first step with `entropy_coef = c`
/// logs `loss − c·H` (token-mean aggregation, so H is the logged entropy).
#[test]
fn entropy_bonus_enters_the_loss() {
    let mut c = tiny();
    c.algorithm.loss_agg_mode = LossAggMode::TokenMean;
    let first = |coef: f64| {
        let mut c = c.clone();
        c.algorithm.entropy_coef = coef;
        Trainer::new(c, Compute::cpu()).unwrap().step().unwrap()
    };
    let (a, b) = (first(0.0), first(0.05));
    assert_eq!(a.entropy, b.entropy);
    let want = a.loss - 0.05 * a.entropy;
    assert!((b.loss - want).abs() < 1e-5, "{} vs {want}", b.loss);
}

/// Logged rewards of a transformer run equal the verifier on the answer plus the format and
/// DAPO overlong terms, recomputed from the logged responses.
#[test]
fn autoregressive_rewards_add_format_and_overlong_terms() {
    use grpo_lab::task::reward::{ArResponse, overlong_penalty};
    let mut c = tiny();
    c.task.format_reward = 0.5;
    c.task.length_reward = grpo_lab::config::LengthReward::Overlong;
    c.task.overlong_buffer = 3;
    c.task.reward_weights.clear();
    c.task.reward = grpo_lab::config::RewardKind::Distance;
    c.run.log_groups = 4;
    let mut t = Trainer::new(c.clone(), Compute::cpu()).unwrap();
    let f = grpo_lab::task::RewardFn::from_task(&c.task);
    let mut checked = 0;
    for _ in 0..2 {
        let r = t.step().unwrap();
        for g in r.groups.iter().flatten() {
            for (resp, got) in g.responses.iter().zip(&g.rewards) {
                let a = ArResponse::parse(resp, grpo_lab::task::tokenizer::EOS_ID);
                let want = f.reward_ar(&g.prompt, &a)
                    + if a.closed { 0.5 } else { 0.0 }
                    + overlong_penalty(a.length, c.max_len(), 3, !a.closed);
                assert!((got - want).abs() < 1e-6, "{resp:?}: {got} vs {want}");
                let parts = f.score_logged(&c, &g.prompt, resp).parts;
                let sum: f32 = ["matching_positions", "format", "overlong"]
                    .iter()
                    .filter_map(|k| parts.get(*k))
                    .sum();
                assert!((got - sum).abs() < 1e-6, "parts {parts:?} vs {got}");
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
}

/// A run killed during its cold start resumes from the iteration-0 checkpoint (taken before
/// the cold start) by running the cold start again: the same metrics and the same
/// `sft_heldout_accuracy` as an uninterrupted run.
#[test]
fn a_resume_before_the_cold_start_runs_it() {
    let mut c = tiny();
    c.sft.steps = 5;
    c.sft.batch_size = 8;
    c.run.iterations = 2;
    let run = |dir: &std::path::Path, resume: bool| {
        grpo_lab::train::run(
            c.clone(),
            Compute::cpu(),
            grpo_lab::train::RunOptions {
                out: dir.to_path_buf(),
                resume,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let (full, killed) = (temp_dir("sft-full"), temp_dir("sft-killed"));
    let whole = run(&full, false);
    assert!(whole.summary.sft_heldout_accuracy.is_some());
    // Killed during the cold start: only the iteration-0 checkpoint, no metrics yet.
    run(&killed, false);
    let ck = killed.join("checkpoints");
    for e in std::fs::read_dir(&ck).unwrap().flatten() {
        if e.path().is_dir() && e.file_name() != "iter-000000" {
            std::fs::remove_dir_all(e.path()).unwrap();
        }
    }
    std::fs::write(ck.join("latest"), "iter-000000").unwrap();
    std::fs::write(killed.join("metrics.jsonl"), "").unwrap();
    let resumed = run(&killed, true);
    assert_eq!(
        resumed.summary.sft_heldout_accuracy,
        whole.summary.sft_heldout_accuracy
    );
    assert_eq!(
        metrics_without_timing(&full.join("metrics.jsonl")),
        metrics_without_timing(&killed.join("metrics.jsonl"))
    );
}

/// The adaptive entropy coefficient reaches each CPU engine's loss (the lecture model's and
/// the transformer's): no bonus on the first step (nothing measured yet), then `− c·H` with
/// the coefficient the controller raised (the target above any entropy), logged as
/// `entropy_coef`.
#[test]
fn the_adaptive_entropy_bonus_reaches_each_engines_loss() {
    let mut lecture = RunConfig::preset("lecture17").unwrap();
    lecture.run.eval_every = 0;
    let mut transformer = tiny();
    transformer.algorithm.loss_agg_mode = LossAggMode::TokenMean;
    for mut base in [lecture, transformer] {
        base.algorithm.mu = 2;
        base.run.iterations = 1;
        let mut on = base.clone();
        on.algorithm.adaptive_entropy = true;
        on.algorithm.entropy_target = 100.0;
        on.algorithm.entropy_coef_delta = 0.5;
        let mut a = Trainer::new(base, Compute::cpu()).unwrap();
        let mut b = Trainer::new(on, Compute::cpu()).unwrap();
        let (a1, b1) = (a.step().unwrap(), b.step().unwrap());
        assert!(
            (a1.loss - b1.loss).abs() < 1e-5,
            "{} vs {}",
            a1.loss,
            b1.loss
        );
        assert_eq!((a1.entropy_coef, b1.entropy_coef), (None, Some(0.5)));
        let (a2, b2) = (a.step().unwrap(), b.step().unwrap());
        let want = a2.loss - 0.5 * b2.entropy;
        assert!(
            b2.entropy > 0.01 && (b2.loss - want).abs() < 1e-4,
            "{}: loss {} vs {} − 0.5·{}",
            b.engine_label(),
            b2.loss,
            a2.loss,
            b2.entropy
        );
        assert_eq!(b2.entropy_coef, Some(1.0), "capped at entropy_coef_max");
    }
}

//! Gradients: autodiff against finite differences, and `π_old` frozen.

mod common;

use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor, TensorData};
use common::*;
use grpo_lab::config::{KlEstimator, LossAggMode, LossMode};
use grpo_lab::engine::autodiff::{read_back, surrogate};
use grpo_lab::gpu::Compute;
use grpo_lab::grpo::Trainer;
use grpo_lab::model::lecture::{LecturePolicy, LectureWeights};
use grpo_lab::objective::loss::{self, LossSettings, TokenInputs, TokenTerms};

const V: usize = 5;
const N: usize = 3;
const D: usize = 4;
const G: usize = 3;

/// The naive loss of a fixed batch under `model`: its value (from the objective, on the host)
/// and the surrogate whose gradient is the loss's (`engine::autodiff::surrogate`).
fn naive_loss(model: &LecturePolicy, device: &Device) -> (f64, Tensor<1>) {
    let prompts =
        Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 0, 2, 3, 2, 4], [2, N]), device);
    let responses: Vec<i64> = (0..2 * G * N).map(|i| ((i * 7 + 3) % V) as i64).collect();
    let responses = Tensor::<3, Int>::from_data(TensorData::new(responses, [2, G, N]), device);
    let policy = grpo_lab::model::Policy::Lecture(model.clone());
    let (logp, entropy) = policy.score(prompts, responses, 1.0, None);
    let (lp, ent) = read_back(&logp, &entropy);
    let mut settings = LossSettings::plain(
        LossMode::Naive,
        KlEstimator::K3,
        LossAggMode::SeqMeanTokenMean,
    );
    settings.max_len = N;
    let mask = vec![1.0; lp.len()];
    let mut terms = TokenTerms::default();
    let inputs = TokenInputs {
        logp: &lp,
        old_logp: &lp,
        ref_logp: &lp,
        sampler_logp: None,
        advantages: &[1.0, -0.5, 0.25, -1.0, 2.0, 0.0],
        mask: &mask,
        entropy: Some(&ent),
        t: N,
    };
    loss::evaluate(&settings, &inputs, &mut terms);
    (terms.loss, surrogate(logp, entropy, &terms, device))
}

/// d(loss)/dθ by autodiff against central differences (h = 1e-2, f32), every parameter
/// entry of the lecture model; tolerance 2e-3 absolute + 1e-2 relative.
#[test]
fn naive_loss_gradient_matches_finite_differences() {
    let device = Device::flex().autodiff();
    let w = LectureWeights::init(V, N, D, 1.0, 2);
    let model = LecturePolicy::from_weights(&w, V, N, D, &device);
    let grads = GradientsParams::from_grads(naive_loss(&model, &device).1.backward(), &model);
    let auto = [
        grads
            .get::<2>(model.embedding.id)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap(),
        grads
            .get::<3>(model.encode.id)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap(),
        grads
            .get::<3>(model.decode.id)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap(),
    ];
    let plain = Device::flex();
    let eval = |w: &LectureWeights| -> f64 {
        let m = LecturePolicy::from_weights(w, V, N, D, &plain);
        naive_loss(&m, &plain).0
    };
    let h = 1e-2f32;
    let mut checked = 0;
    for (which, auto) in auto.iter().enumerate() {
        for i in 0..auto.len() {
            let mut plus = LectureWeights {
                embedding: w.embedding.clone(),
                encode: w.encode.clone(),
                decode: w.decode.clone(),
            };
            let mut minus = LectureWeights {
                embedding: w.embedding.clone(),
                encode: w.encode.clone(),
                decode: w.decode.clone(),
            };
            let (p, m) = match which {
                0 => (&mut plus.embedding, &mut minus.embedding),
                1 => (&mut plus.encode, &mut minus.encode),
                _ => (&mut plus.decode, &mut minus.decode),
            };
            p[i] += h;
            m[i] -= h;
            let fd = (eval(&plus) - eval(&minus)) / (2.0 * h as f64);
            let ad = auto[i] as f64;
            assert!(
                (fd - ad).abs() <= 2e-3 + 1e-2 * ad.abs(),
                "param {which} entry {i}: autodiff {ad}, finite differences {fd}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, V * D + 2 * N * D * D);
}

/// At the first step of an iteration θ = θ_old, so the unclipped loss −A·ρ has the same
/// gradient as the naive −A·log π. If gradient flowed through π_old, ρ would be
/// exp(logπ − logπ) ≡ 1 and the gradient would vanish: the bug-gallery switch shows it.
#[test]
fn gradient_does_not_flow_through_pi_old() {
    let first_step_grad = |mutate: &dyn Fn(&mut grpo_lab::config::RunConfig)| {
        let mut c = short_lecture(1);
        mutate(&mut c);
        let mut t = Trainer::new(c, Compute::cpu()).unwrap();
        t.step().unwrap().grad_norm
    };
    let naive = first_step_grad(&|c| c.algorithm.loss = LossMode::Naive);
    let unclipped = first_step_grad(&|c| c.algorithm.loss = LossMode::Unclipped);
    let clipped = first_step_grad(&|c| c.algorithm.loss = LossMode::Clipped);
    assert!(naive > 1e-3, "naive gradient {naive}");
    assert!(
        (unclipped - naive).abs() <= 1e-4 * naive,
        "unclipped {unclipped} vs naive {naive}"
    );
    assert!(
        (clipped - naive).abs() <= 1e-4 * naive,
        "clipped {clipped} vs naive {naive}"
    );
    let bug = first_step_grad(&|c| {
        c.algorithm.loss = LossMode::Unclipped;
        c.algorithm.bugs.unfrozen_old_policy = true;
    });
    assert!(
        bug < 1e-6,
        "with π_old unfrozen the ratio's gradient should vanish, got {bug}"
    );
}

/// The reference is a real copy: after training steps it still gives the initial policy's
/// log-probs, so the KL to it grows from exactly 0.
#[test]
fn reference_is_a_copy_and_kl_starts_at_zero() {
    let mut c = short_lecture(1);
    c.algorithm.beta = 0.04;
    c.algorithm.ref_period = 0;
    let mut t = Trainer::new(c, Compute::cpu()).unwrap();
    let first = t.step().unwrap();
    assert_eq!(first.kl, 0.0);
    let mut last = first;
    while !t.is_done() {
        last = t.step().unwrap();
    }
    assert!(last.kl > 0.0, "KL stayed {}", last.kl);
}

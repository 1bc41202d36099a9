//! The transformer on the device (`engine::wgsl_lecture::transformer`, `shaders/transformer.wgsl`)
//! held to the fused CPU engine (`engine::fused_transformer`), on the wgpu adapter (lavapipe
//! in CI), on random shapes — one head and several, one layer and two, widths and vocabularies
//! that are odd and not multiples of the matmul tile, prompts of 1 token, responses of 1,
//! rows of every length from 0 to T (a row's padding is not in the batch's layout: skipped):
//! - log π and the entropy of every token (temperature 1 and 0.7);
//! - every weight's gradient from per-token coefficients of log π and of the entropy;
//! - the weights after several Adam steps with the grad-norm clip.

mod common;

use common::wgpu_compute;
use grpo_lab::engine::Which;
use grpo_lab::engine::fused_transformer::{FusedTransformer, Hyper, Layout, StepInput};
use grpo_lab::engine::wgsl_lecture::transformer::WgslTransformer;
use grpo_lab::model::TransformerShape;
use grpo_lab::objective::adam::AdamState;
use grpo_lab::rng::SplitMix64;

const HYPER: Hyper = Hyper {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
};

/// One random case: a shape, weights, a batch.
struct Case {
    shape: TransformerShape,
    n: usize,
    g: usize,
    t: usize,
    w: Vec<f32>,
    prompts: Vec<u32>,
    responses: Vec<u32>,
    lens: Vec<usize>,
    mask: Vec<f32>,
}

impl Case {
    /// log π and the entropy of this case's tokens on the device.
    fn scores(&self, dev: &mut WgslTransformer, which: Which, t: f32) -> (Vec<f32>, Vec<f32>) {
        let (p, r, l) = (&self.prompts, &self.responses, &self.lens);
        now(dev.scores(which, p, r, l, self.g, self.t, t)).unwrap()
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        (vocab, d_model, heads, layers, d_ff): (usize, usize, usize, usize, usize),
        (n, b, g, t): (usize, usize, usize, usize),
    ) -> Self {
        let shape = TransformerShape {
            vocab,
            context: n + t + 2,
            d_model,
            heads,
            layers,
            d_ff,
        };
        let mut rng = SplitMix64::new(seed);
        let total = Layout::of(&shape).total;
        let w: Vec<f32> = (0..total).map(|_| rng.normal() as f32 * 0.4).collect();
        let tok = |rng: &mut SplitMix64| rng.below(vocab as u64) as u32;
        let prompts: Vec<u32> = (0..b * n).map(|_| tok(&mut rng)).collect();
        let rows = b * g;
        let responses: Vec<u32> = (0..rows * t).map(|_| tok(&mut rng)).collect();
        // Every length from 0 to T among the rows, the last row full.
        let lens: Vec<usize> = (0..rows)
            .map(|r| {
                if r + 1 == rows {
                    t
                } else {
                    rng.below(t as u64 + 1) as usize
                }
            })
            .collect();
        let mask = lens
            .iter()
            .flat_map(|&l| (0..t).map(move |i| if i < l { 1.0 } else { 0.0 }))
            .collect();
        Self {
            shape,
            n,
            g,
            t,
            w,
            prompts,
            responses,
            lens,
            mask,
        }
    }

    fn input<'a>(&'a self, zeros: &'a [f32]) -> StepInput<'a> {
        StepInput {
            prompts: &self.prompts,
            responses: &self.responses,
            mask: &self.mask,
            g: self.g,
            t: self.t,
            advantages: zeros,
            token_advantages: None,
            old_logp: zeros,
            ref_logp: zeros,
            sampler_logp: None,
            support: None,
        }
    }

    fn fused(&self) -> FusedTransformer {
        FusedTransformer::new(self.shape, self.n, self.w.clone(), HYPER)
    }

    fn device(&self) -> Option<WgslTransformer> {
        let ctx = wgpu_compute()?.gpu.expect("wgpu context");
        Some(WgslTransformer::new(ctx, self.shape, self.n, &self.w, HYPER).expect("engine"))
    }

    /// Random per-token coefficients (0 on padding, as the objective leaves them).
    fn coefs(&self, seed: u64, scale: f32) -> Vec<f32> {
        let mut rng = SplitMix64::new(seed);
        self.mask
            .iter()
            .map(|&m| m * rng.normal() as f32 * scale)
            .collect()
    }
}

/// The cases: (vocab, d_model, heads, layers, d_ff), (n, b, g, t).
fn cases() -> Vec<Case> {
    vec![
        Case::new(1, (11, 16, 2, 1, 24), (5, 3, 4, 6)),
        Case::new(2, (7, 12, 3, 2, 13), (1, 2, 3, 1)),
        Case::new(3, (5, 4, 1, 2, 7), (3, 1, 1, 4)),
        Case::new(4, (11, 36, 4, 2, 37), (2, 5, 3, 3)),
        // Heads of 12 and 24: attention4 in registers (≤ 16) and through memory (> 16).
        Case::new(5, (9, 24, 2, 1, 16), (3, 2, 3, 4)),
        Case::new(6, (9, 48, 2, 1, 20), (3, 2, 2, 4)),
        // A width not a multiple of 4: the scalar LayerNorm, embedding and b₂ (add_bias).
        Case::new(8, (6, 10, 2, 2, 9), (2, 2, 3, 3)),
        // D = 64 and F = 128 (transformer-sort's D): the products' epilogues on lavapipe
        // (matmul_subgroup.wgsl's GELU after W₁, one and two rows an invocation; the LayerNorm
        // after W_o and W₂), passes of more and fewer than 64 rows.
        Case::new(9, (7, 64, 4, 2, 128), (3, 6, 4, 5)),
    ]
}

/// A sampled rollout's pick: f32 logits, no recorded sampler log π.
fn draw(
    temperature: f32,
    top_k: usize,
    top_p: f32,
    seed: u64,
    stream: u32,
) -> grpo_lab::engine::fused_transformer::Pick {
    use grpo_lab::engine::{Draw, SamplerSide};
    use grpo_lab::objective::sampling::SamplingParams;
    grpo_lab::engine::fused_transformer::Pick::Sample(Draw {
        params: SamplingParams {
            temperature,
            top_k,
            top_p,
        },
        seed,
        stream,
        sampler: SamplerSide {
            bf16: false,
            record_logp: false,
            keep_support: false,
        },
    })
}

/// A device call's answer: it waits for the device (`WgslTransformer::blocking`), so its
/// future is done at the first poll.
fn now<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("a blocking device call answered Pending"),
    }
}

/// Largest `|a − b| / (1 + |b|)`.
fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

#[test]
fn log_probs_and_entropies_equal_the_fused_engine() {
    for (i, c) in cases().iter().enumerate() {
        let Some(mut dev) = c.device() else { return };
        let mut fused = c.fused();
        for temperature in [1.0f32, 0.7] {
            let (logp, ent) = c.scores(&mut dev, Which::Policy, temperature);
            let want = fused.token_logp_ragged(
                None,
                &c.prompts,
                &c.responses,
                &c.lens,
                c.g,
                c.t,
                temperature,
                None,
            );
            let zeros = vec![0.0f32; c.mask.len()];
            let ones = c.mask.clone();
            let (_, want_ent) =
                fused.coefficient_gradient(&c.input(&zeros), &zeros, Some(&ones), temperature);
            let (e1, e2) = (worst(&logp, &want), worst(&ent, &want_ent));
            assert!(e1 < 2e-5, "case {i} T={temperature}: log π off by {e1}");
            assert!(e2 < 2e-5, "case {i} T={temperature}: entropy off by {e2}");
            // Padding holds 0, as the fused pass leaves it.
            for (k, &m) in c.mask.iter().enumerate() {
                if m == 0.0 {
                    assert_eq!((logp[k], ent[k]), (0.0, 0.0), "case {i}: padding {k}");
                }
            }
        }
        // The reference copy starts as the policy.
        let (rlogp, _) = c.scores(&mut dev, Which::Reference, 1.0);
        let want =
            fused.token_logp_ragged(None, &c.prompts, &c.responses, &c.lens, c.g, c.t, 1.0, None);
        assert!(worst(&rlogp, &want) < 2e-5, "case {i}: the reference");
    }
}

#[test]
fn gradients_equal_the_fused_engine() {
    for (i, c) in cases().iter().enumerate() {
        let Some(mut dev) = c.device() else { return };
        let mut fused = c.fused();
        let zeros = vec![0.0f32; c.mask.len()];
        for (temperature, entropy) in [(1.0f32, false), (0.8, true)] {
            let dlogp = c.coefs(10 + i as u64, 0.3);
            let dent = entropy.then(|| c.coefs(20 + i as u64, 0.2));
            c.scores(&mut dev, Which::Policy, temperature);
            let grad = now(dev.gradient(&dlogp, dent.as_deref())).unwrap();
            let (want, _) =
                fused.coefficient_gradient(&c.input(&zeros), &dlogp, dent.as_deref(), temperature);
            let scale = want.iter().fold(0.0f32, |m, g| m.max(g.abs()));
            let off = grad
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                off <= 1e-4 * scale.max(1e-3),
                "case {i} T={temperature} entropy={entropy}: gradient off by {off} (largest {scale})"
            );
        }
    }
}

#[test]
fn adam_steps_equal_the_fused_engine() {
    for (i, c) in cases().iter().enumerate().take(3) {
        let Some(mut dev) = c.device() else { return };
        let mut fused = c.fused();
        let mut adam = AdamState::new(c.w.len());
        let zeros = vec![0.0f32; c.mask.len()];
        let (lr, max_norm) = (3e-3, 0.5f32);
        for step in 0..3u64 {
            let dlogp = c.coefs(100 * step + i as u64, 0.3);
            c.scores(&mut dev, Which::Policy, 1.0);
            let norm = now(dev.step(&dlogp, None, lr, max_norm)).unwrap();
            let (grad, _) = fused.coefficient_gradient(&c.input(&zeros), &dlogp, None, 1.0);
            let want = grad.iter().map(|g| g * g).sum::<f32>().sqrt();
            assert!(
                (norm - want).abs() <= 1e-4 * want.max(1e-3),
                "case {i} step {step}: norm {norm} vs {want}"
            );
            let scale = if want > max_norm {
                max_norm / want
            } else {
                1.0
            };
            adam.step(&mut fused.w, &grad, scale, lr as f32, &HYPER);
        }
        let w = dev.weights().unwrap();
        let off = worst(&w, &fused.w);
        assert!(off < 1e-4, "case {i}: weights off by {off} after 3 steps");
    }
}

#[test]
fn rollouts_equal_the_fused_engine() {
    use grpo_lab::engine::fused_transformer::Pick;
    let draw = |temperature, top_k, top_p, seed| draw(temperature, top_k, top_p, seed, 3);
    let mut differing = 0;
    let mut tokens = 0;
    for (i, c) in cases().iter().enumerate() {
        let Some(mut dev) = c.device() else { return };
        let mut fused = c.fused();
        let picks = [
            (draw(1.0, 0, 1.0, 7 + i as u64), 1.0, true),
            (draw(0.7, 3, 0.9, 8), 0.7, false),
            (Pick::Greedy, 1.0, false),
        ];
        for (k, (pick, temperature, with_greedy)) in picks.iter().enumerate() {
            let got =
                now(dev.generate(&c.prompts, c.g, c.t, pick, *temperature, *with_greedy)).unwrap();
            let want = fused.generate(&c.prompts, c.g, c.t, pick, *temperature, *with_greedy);
            assert_eq!(got.greedy, want.greedy, "case {i} pick {k}: greedy answers");
            tokens += want.rows.iter().map(|r| r.len()).sum::<usize>();
            if got.rows != want.rows {
                differing += 1;
                eprintln!("case {i} pick {k}: rows {:?} vs {:?}", got.rows, want.rows);
                continue;
            }
            assert_eq!(got.closed, want.closed, "case {i} pick {k}: closed rows");
            let off = worst(&got.logp, &want.logp);
            assert!(off < 2e-5, "case {i} pick {k}: log π off by {off}");
        }
    }
    // Draws within rounding of a token boundary may differ; none did in these cases.
    assert_eq!(
        differing, 0,
        "rollouts differing from the fused engine's ({tokens} tokens)"
    );
}

#[test]
fn greedy_decoding_and_sampled_rollouts_keep_their_own_plans() {
    // An iteration evaluates greedily (every held-out prompt, one row each) and samples G rows
    // per training prompt: two shapes. Each keeps its plan, so alternating them builds none
    // again, and what each answers does not change with what ran between.
    use grpo_lab::engine::fused_transformer::Pick;
    let c = &cases()[0];
    let Some(mut dev) = c.device() else { return };
    let sample = draw(1.0, 0, 1.0, 11, 3);
    let mut rounds = Vec::new();
    let mut built = Vec::new();
    for _ in 0..3 {
        let sampled = now(dev.generate(&c.prompts, c.g, c.t, &sample, 1.0, true)).unwrap();
        let greedy = now(dev.generate(&c.prompts, 1, c.t, &Pick::Greedy, 1.0, false)).unwrap();
        rounds.push((sampled.rows, sampled.logp, greedy.rows));
        built.push(dev.plans_built);
    }
    assert!(c.g > 1, "the case must give the two calls different shapes");
    assert_eq!(built, vec![2, 2, 2], "plans built after each round");
    assert_eq!(rounds[1], rounds[0]);
    assert_eq!(rounds[2], rounds[0]);
}

#[test]
fn a_decode_that_stops_where_the_last_one_closed_answers_as_a_whole_one() {
    // A decode's first submission stops where its plan's last decode had every row closed,
    // and a second one goes on only if a row is still open there. At every stopping point,
    // against a decode of every position in one submission: the same rows, greedy answers,
    // closed flags and log π, whether the decode stopped there or went on.
    let mut c = Case::new(7, (5, 16, 2, 1, 24), (3, 3, 4, 7));
    // <eos> made likely (the final LayerNorm's bias times the head's <eos> column), so that
    // rows close at every position and some decodes have all closed before the last.
    let (lay, d, v) = (Layout::of(&c.shape), c.shape.d_model, c.shape.vocab);
    for j in 0..d {
        c.w[lay.lnf_b + j] = 1.0;
        c.w[lay.head + j * v + v - 1] = 2.0 / d as f32;
    }
    // The rows left open go on in the decode's own plan (tail_rows 0, or more open rows than
    // it), or alone on the tail's plan (`decode_tail`: their draws under their own streams, a
    // plan of 16 rows or of 7, fewer than the decode's 15 — then some go on in the decode's).
    let Some(mut whole) = c.device() else { return };
    let Some(mut split) = c.device() else { return };
    whole.tail_rows = 0;
    use grpo_lab::engine::fused_transformer::Pick;
    let mut counts = std::collections::BTreeMap::new();
    for tail_rows in [0, 16, 7] {
        split.tail_rows = tail_rows;
        for seed in 0..6u64 {
            let (pick, with_greedy) = match seed {
                5 => (Pick::Greedy, false),
                _ => (draw(1.0, 0, 1.0, seed, 5), true),
            };
            whole.decoded = [usize::MAX; 3];
            let want = now(whole.generate(&c.prompts, c.g, c.t, &pick, 1.0, with_greedy)).unwrap();
            for stop in 1..c.t {
                split.decoded = [stop; 3];
                let before = (split.submissions, split.tails);
                let got =
                    now(split.generate(&c.prompts, c.g, c.t, &pick, 1.0, with_greedy)).unwrap();
                let at = format!("tail_rows {tail_rows}, seed {seed}, stop {stop}");
                assert_eq!(got.rows, want.rows, "{at}");
                assert_eq!(got.greedy, want.greedy, "{at}");
                assert_eq!(got.closed, want.closed, "{at}");
                assert_eq!(got.logp, want.logp, "{at}");
                let way = match (split.submissions - before.0, split.tails - before.1) {
                    (1, 0) => "stopped",
                    (2, 0) => "went on",
                    (2, 1) => "went on alone",
                    k => panic!("{k:?} submissions and tails for one decode ({at})"),
                };
                *counts.entry((tail_rows, way)).or_insert(0) += 1;
            }
        }
    }
    let count = |tail_rows, way| counts.get(&(tail_rows, way)).copied().unwrap_or(0);
    for tail_rows in [0, 16, 7] {
        assert!(count(tail_rows, "stopped") > 0, "{counts:?}");
    }
    assert!(
        count(0, "went on") > 0 && count(0, "went on alone") == 0,
        "{counts:?}"
    );
    assert!(
        count(16, "went on alone") > 0 && count(16, "went on") == 0,
        "{counts:?}"
    );
    assert!(
        count(7, "went on alone") > 0 && count(7, "went on") > 0,
        "{counts:?}"
    );
}

// ------------------------------------------------------------------ the engine as a whole

/// Train `config` (transformer-sort, shrunk) on the fused CPU engine and on the WGSL engine:
/// the same rollouts and rewards, step scalars within 1e-3, weights within 1e-3.
fn compare(overrides: &[&str], iterations: usize) {
    use common::{close, step_scalars};
    use grpo_lab::config::{EngineChoice, RunConfig};
    use grpo_lab::gpu::Compute;
    use grpo_lab::grpo::Trainer;
    let Some(wgpu) = wgpu_compute() else { return };
    let mut base = RunConfig::preset("transformer-sort").unwrap();
    let mut all = vec![
        "algorithm.prompts_per_iteration=4",
        "algorithm.num_generations=4",
        "model.d_model=16",
        "model.heads=2",
        "sft.steps=3",
        "sft.examples=32",
        "sft.batch_size=16",
        "run.eval_every=0",
        "run.checkpoint_every=0",
    ];
    all.extend_from_slice(overrides);
    let all: Vec<String> = all.iter().map(|s| s.to_string()).collect();
    base = base.with_overrides(&all).unwrap();
    base.run.iterations = iterations;
    let mut runs = Vec::new();
    for on_gpu in [false, true] {
        let mut c = base.clone();
        c.run.engine = if on_gpu {
            EngineChoice::Wgsl
        } else {
            EngineChoice::Auto
        };
        let compute = if on_gpu { wgpu.clone() } else { Compute::cpu() };
        let mut t = Trainer::new(c, compute).unwrap();
        let label = t.engine_label();
        assert_eq!(label.contains("WGSL transformer"), on_gpu, "{label}");
        let mut records = Vec::new();
        while !t.is_done() {
            records.push(t.step().unwrap());
        }
        runs.push((records, t.engine().flat_weights()));
    }
    let ((cpu, wc), (gpu, wg)) = (&runs[0], &runs[1]);
    assert_eq!(cpu.len(), gpu.len());
    for (a, b) in cpu.iter().zip(gpu) {
        assert_eq!(
            a.groups.as_ref().map(|g| &g[0].responses),
            b.groups.as_ref().map(|g| &g[0].responses),
            "step {}",
            a.step
        );
        assert_eq!(a.reward_mean, b.reward_mean, "step {}", a.step);
        for (name, x, y) in step_scalars(a, b) {
            assert!(
                close(x, y, 1e-3),
                "step {} {name}: fused CPU {x} vs WGSL {y}",
                a.step
            );
        }
    }
    // The steps moved the weights: a gradient that was not 0.
    assert!(
        gpu.iter().any(|r| r.grad_norm > 1e-3),
        "no step with a gradient: {:?}",
        gpu.iter().map(|r| r.grad_norm).collect::<Vec<_>>()
    );
    let off = worst(wg, wc);
    eprintln!(
        "{overrides:?}: worst relative weight difference after {iterations} iterations: {off:.2e}"
    );
    assert!(off < 1e-3, "weights differ by {off}");
}

#[test]
fn engine_equals_the_fused_engine_on_transformer_sort() {
    compare(&[], 3);
}

#[test]
fn engine_equals_the_fused_engine_with_the_2025_objectives() {
    for loss in [
        &[
            "algorithm.importance_sampling_level=sequence",
            "algorithm.loss_agg_mode=seq-mean-token-mean",
            "algorithm.epsilon_low=3e-4",
            "algorithm.epsilon_high=4e-4",
        ][..],
        &["algorithm.loss=cispo"],
        &[
            "algorithm.loss=gmpo",
            "algorithm.loss_agg_mode=seq-mean-token-mean",
        ],
        &[
            "algorithm.loss=sapo",
            "algorithm.beta=0.04",
            "algorithm.ref_period=1",
        ],
        &[
            "algorithm.loss=clipped",
            "algorithm.entropy_coef=0.01",
            "algorithm.loss_agg_mode=seq-mean-token-mean",
        ],
    ] {
        compare(loss, 2);
    }
}

/// In a browser nothing may wait for the device: the engine answers `Pending` until a call's
/// read-back has arrived, the trainer asks the same step again, and the calls of the
/// iteration it had made already are answered from what the engine kept. Driven that way
/// (natively, `answer_between_calls`), a run with the cold start, dynamic sampling's redraws,
/// held-out greedy accuracy and pass@k writes the same records and the same weights, bit for
/// bit, as the run whose calls wait.
#[test]
fn the_engine_answers_between_calls_as_it_does_waiting() {
    use grpo_lab::config::RunConfig;
    use grpo_lab::engine::wgsl_lecture::WgslTransformerEngine;
    use grpo_lab::grpo::Trainer;
    let Some(wgpu) = wgpu_compute() else { return };
    let overrides: Vec<String> = [
        "algorithm.prompts_per_iteration=4",
        "algorithm.num_generations=4",
        "model.d_model=16",
        "model.heads=2",
        "sft.steps=3",
        "sft.examples=32",
        "sft.batch_size=16",
        "task.heldout_size=6",
        "run.eval_every=2",
        "run.pass_k=2",
        "run.checkpoint_every=0",
        "run.engine=wgsl",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut c = RunConfig::preset("transformer-sort")
        .unwrap()
        .with_overrides(&overrides)
        .unwrap();
    c.run.iterations = 3;
    assert!(c.algorithm.dynamic_sampling);
    let without_timing = |r: &grpo_lab::metrics::StepRecord| {
        let mut v = serde_json::to_value(r).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("step_time_secs");
        o.remove("tokens_per_second");
        v
    };
    let mut waiting = Trainer::new(c.clone(), wgpu.clone()).unwrap();
    let mut want = Vec::new();
    while !waiting.is_done() {
        want.push(without_timing(&waiting.step().unwrap()));
    }
    let ctx = wgpu.gpu.clone().expect("a wgpu device");
    let mut engine = WgslTransformerEngine::new(&c, ctx).unwrap();
    engine.answer_between_calls();
    let mut t = Trainer::with_engine(c, Box::new(engine)).unwrap();
    let (mut got, mut pending) = (Vec::new(), 0usize);
    let started = std::time::Instant::now();
    while !t.is_done() {
        // A call asked again that starts over instead of collecting would never end.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{} steps in 60 s, {pending} answers of Pending",
            got.len()
        );
        match t.step() {
            Ok(r) => got.push(without_timing(&r)),
            Err(e) if e.is_pending() => {
                pending += 1;
                std::thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(pending > 0, "no call answered Pending");
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(&want) {
        assert_eq!(a, b, "a record differs");
    }
    let (wa, wb) = (t.engine().flat_weights(), waiting.engine().flat_weights());
    assert!(!wa.is_empty());
    assert!(
        wa.iter().zip(&wb).all(|(a, b)| a.to_bits() == b.to_bits()),
        "the weights differ"
    );
    eprintln!(
        "{} steps; {pending} answers of Pending; {:?}",
        got.len(),
        t.engine().device_counts()
    );
}

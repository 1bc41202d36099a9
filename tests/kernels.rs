//! Every WGSL kernel against its plain-Rust reference on random inputs, on the wgpu
//! adapter (lavapipe in CI). Integer outputs must be identical; floats must agree within
//! |gpu − ref| ≤ 1e-5 · max(1, |ref|) (relative, and absolute near zero).

mod common;

use common::wgpu_compute;
use grpo_lab::config::{AdvantageMode, RewardKind};
use grpo_lab::gpu::kernels::{KernelError, Kernels};
use grpo_lab::objective::advantage;
use grpo_lab::objective::sampling::{self, SamplingParams};
use grpo_lab::rng::SplitMix64;
use grpo_lab::task::RewardFn;
use grpo_lab::task::reward;
use std::sync::OnceLock;

const TOL: f32 = 1e-5;

fn close(what: &str, case: usize, gpu: f32, want: f32) {
    assert!(
        (gpu - want).abs() <= TOL * want.abs().max(1.0) || (gpu.is_nan() && want.is_nan()),
        "case {case}: {what}: kernel {gpu} vs reference {want}"
    );
}

fn kernels() -> Option<&'static Kernels> {
    static K: OnceLock<Option<Kernels>> = OnceLock::new();
    K.get_or_init(|| {
        let compute = wgpu_compute()?;
        Some(Kernels::new(compute.gpu.expect("wgpu context")).expect("kernels compile"))
    })
    .as_ref()
}

/// Sizes that stress the edges: 1, odd, not a multiple of the workgroup (64), and larger.
fn size(rng: &mut SplitMix64, choices: &[usize]) -> usize {
    choices[rng.below(choices.len() as u64) as usize]
}

fn random_logits(rng: &mut SplitMix64, count: usize, kind: u64) -> Vec<f32> {
    (0..count)
        .map(|_| match kind {
            0 => rng.normal() as f32 * 3.0,
            1 => (rng.normal() * 1e4) as f32,   // huge
            2 => (rng.normal() * 1e-30) as f32, // tiny: nearly uniform
            _ => (rng.below(3) as f32) - 1.0,   // many exact ties
        })
        .collect()
}

#[test]
fn sample_kernel_matches_reference() {
    let Some(k) = kernels() else { return };
    let mut rng = SplitMix64::new(1);
    let mut draws = 0;
    let mut mismatches = 0;
    for case in 0..1000 {
        let b = size(&mut rng, &[1, 2, 3, 7]);
        let t = size(&mut rng, &[1, 3, 8]);
        let v = size(&mut rng, &[1, 2, 5, 16, 33, 100]);
        let g = size(&mut rng, &[1, 4, 9, 65]);
        let kind = rng.below(4);
        let logits = random_logits(&mut rng, b * t * v, kind);
        let params = SamplingParams {
            temperature: [1.0, 0.7, 1.3, 0.05][rng.below(4) as usize],
            top_k: if rng.below(3) == 0 {
                1 + rng.below(v as u64) as usize
            } else {
                0
            },
            top_p: if rng.below(3) == 0 {
                0.05 + 0.9 * rng.next_f64() as f32
            } else {
                1.0
            },
        };
        let seed = rng.next_u64();
        let iteration = rng.below(1000) as u32;
        let gpu = k
            .sample(&logits, b, t, v, g, params, seed, iteration)
            .unwrap();
        let want = sampling::sample_independent(&logits, b, t, v, g, params, seed, iteration);
        for (i, (&x, &y)) in gpu.iter().zip(&want).enumerate() {
            if x != y {
                // exp() on the device may differ from Rust's by an ulp: a draw may then land on
                // the other side of a CDF (or top-p) boundary, but only when it is that close.
                let (ti, gi, bi) = (i % t, (i / t) % g, i / (t * g));
                let row = &logits[(bi * t + ti) * v..(bi * t + ti + 1) * v];
                assert!(
                    near_boundary(
                        row,
                        params,
                        sampling::token_uniform(seed, iteration, bi as u32, gi as u32, ti as u32)
                    ),
                    "case {case}: B={b} T={t} V={v} G={g} {params:?}: token {i}: kernel {x}, reference {y}, not at a boundary"
                );
                mismatches += 1;
            }
        }
        draws += gpu.len();
    }
    assert!(draws > 100_000);
    // Identical tokens in all but boundary ties (about 1 draw in 10^5 here).
    assert!(
        mismatches * 10_000 <= draws,
        "{mismatches} of {draws} draws differ"
    );
}

/// Whether `u` lands within float error (1e-5 relative) of a CDF boundary of the row, or
/// the row has a token whose top-p decision is that close.
fn near_boundary(row: &[f32], p: SamplingParams, u: f32) -> bool {
    let w = sampling::token_weights(row, p);
    let kept: f32 = w.iter().sum();
    let target = u * kept;
    let mut cum = 0.0f32;
    for x in &w {
        cum += x;
        if (target - cum).abs() <= 1e-5 * kept {
            return true;
        }
    }
    if p.top_p < 1.0 {
        let all = sampling::token_weights(
            row,
            SamplingParams {
                top_k: 0,
                top_p: 1.0,
                ..p
            },
        );
        let total: f32 = all.iter().sum();
        let mut sorted = all.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let mut before = 0.0f32;
        for x in sorted {
            if (before - p.top_p * total).abs() <= 1e-5 * total {
                return true;
            }
            before += x;
        }
    }
    false
}

/// The kernel's empirical frequencies match softmax(logits / T): chi-square, 5 categories,
/// 4 degrees of freedom, 0.999 quantile 18.47; fixed seed.
#[test]
fn sample_kernel_frequencies_match_softmax() {
    let Some(k) = kernels() else { return };
    let logits = [0.5f32, -1.0, 2.0, 0.0, 1.0];
    for temperature in [1.0f32, 0.5, 2.0] {
        let p = SamplingParams {
            temperature,
            top_k: 0,
            top_p: 1.0,
        };
        let n = 50_000;
        let tokens = k.sample(&logits, 1, 1, 5, n, p, 42, 0).unwrap();
        let probs: Vec<f64> = {
            let scaled: Vec<f64> = logits
                .iter()
                .map(|l| (*l as f64 / temperature as f64).exp())
                .collect();
            let z: f64 = scaled.iter().sum();
            scaled.iter().map(|x| x / z).collect()
        };
        let mut counts = [0f64; 5];
        tokens.iter().for_each(|&t| counts[t as usize] += 1.0);
        let chi2: f64 = (0..5)
            .map(|i| (counts[i] - probs[i] * n as f64).powi(2) / (probs[i] * n as f64))
            .sum();
        assert!(
            chi2 < 18.47,
            "T={temperature}: chi2 {chi2}, counts {counts:?}"
        );
    }
}

#[test]
fn reward_kernel_matches_reference() {
    let Some(k) = kernels() else { return };
    let mut rng = SplitMix64::new(2);
    for case in 0..1000 {
        let b = size(&mut rng, &[1, 2, 5, 67]);
        let g = size(&mut rng, &[1, 3, 16]);
        let n = size(&mut rng, &[1, 2, 3, 8, 64]);
        let t = n + rng.below(3) as usize;
        let vocab = 1 + rng.below(12);
        let prompts: Vec<u32> = (0..b * n).map(|_| rng.below(vocab) as u32).collect();
        let mut responses: Vec<u32> = (0..b * g * t)
            .map(|_| rng.below(vocab + 1) as u32)
            .collect();
        let lengths: Vec<u32> = (0..b * g).map(|_| rng.below(t as u64 + 1) as u32).collect();
        // Some responses are exactly sorted, so `exact` is exercised.
        for bg in 0..b * g {
            if rng.below(4) == 0 {
                let mut s = prompts[(bg / g) * n..(bg / g + 1) * n].to_vec();
                s.sort();
                responses[bg * t..bg * t + n].copy_from_slice(&s);
            }
        }
        let reward_fn = match rng.below(4) {
            0 => RewardFn::single(RewardKind::Distance),
            1 => RewardFn::single(RewardKind::InclusionOrdering),
            2 => RewardFn::single(RewardKind::Exact),
            _ => {
                let mut task = grpo_lab::config::TaskConfig::default();
                task.reward_weights
                    .insert("exact".into(), 1.0 + rng.next_f64());
                task.reward_weights
                    .insert("distance".into(), rng.next_f64() * 0.5);
                task.reward_weights
                    .insert("inclusion_ordering".into(), -rng.next_f64());
                RewardFn::from_task(&task)
            }
        };
        let out = k
            .score(
                &prompts,
                &responses,
                &lengths,
                b,
                g,
                t,
                n,
                reward_fn.kernel_weights(),
            )
            .unwrap();
        for bg in 0..b * g {
            let prompt = &prompts[(bg / g) * n..(bg / g + 1) * n];
            let resp = &responses[bg * t..bg * t + lengths[bg] as usize];
            let (inc, ord) = reward::inclusion_ordering_parts(prompt, resp);
            let want = [
                reward::distance(prompt, resp),
                inc,
                ord,
                reward::exact(prompt, resp),
            ];
            assert_eq!(
                out.parts[bg], want,
                "case {case} response {bg}: {prompt:?} / {resp:?}"
            );
            close(
                "reward",
                case,
                out.rewards[bg],
                reward_fn.reward(prompt, resp),
            );
        }
    }
}

#[test]
fn advantage_kernel_matches_reference() {
    let Some(k) = kernels() else { return };
    let mut rng = SplitMix64::new(3);
    for case in 0..1000 {
        let b = size(&mut rng, &[1, 2, 3, 65, 300]);
        let g = size(&mut rng, &[1, 2, 5, 16, 64]);
        let rewards: Vec<f32> = match rng.below(4) {
            0 => (0..b * g).map(|_| rng.below(6) as f32).collect(), // integer rewards, many ties
            1 => (0..b * g).map(|_| (rng.normal() * 3.0) as f32).collect(), // negative too
            // every group all-equal (0.56568925: a value whose f32 mean rounds off it)
            2 => (0..b * g)
                .map(|i| ((i / g) % 3) as f32 * 0.565_689_25)
                .collect(),
            _ => (0..b * g)
                .map(|_| if rng.below(2) == 0 { 1.0 } else { 0.0 })
                .collect(), // sparse 0/1
        };
        let out = k.advantages(&rewards, g).unwrap();
        for (bi, group) in rewards.chunks(g).enumerate() {
            if group.iter().all(|&r| r == group[0]) {
                // A flat group: exactly 0 under every centered mode (raw, max keep r).
                for m in [1, 2, 4, 5] {
                    let a = &out.by_mode[m][bi * g..(bi + 1) * g];
                    assert!(a.iter().all(|&x| x == 0.0), "case {case} mode {m}: {a:?}");
                }
            }
        }
        for (m, mode) in AdvantageMode::GROUP.iter().enumerate() {
            let want = advantage::advantages(*mode, &rewards, g);
            for (i, (x, y)) in out.by_mode[m].iter().zip(&want).enumerate() {
                close(
                    &format!("{} [{i}] (B={b} G={g})", mode.name()),
                    case,
                    *x,
                    *y,
                );
            }
        }
        for (bi, s) in out.groups.iter().enumerate() {
            let want = advantage::GroupStats::of(&rewards[bi * g..(bi + 1) * g]);
            assert_eq!(s.zero_std, want.zero_std, "case {case} group {bi}");
            assert_eq!((s.max, s.min), (want.max, want.min));
            close("mean", case, s.mean, want.mean);
            close("std", case, s.std, want.std);
        }
        close(
            "batch std",
            case,
            out.batch_std,
            advantage::batch_std(&rewards),
        );
    }
}

#[test]
fn shader_errors_name_the_file_and_oversized_batches_are_refused() {
    let Some(k) = kernels() else { return };
    let e = grpo_lab::gpu::kernels::check_shader(
        k.context(),
        "broken.wgsl",
        "@compute @workgroup_size(64) fn main() { let x: u32 = 1.5; }",
        "main",
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, KernelError::Shader { .. }) && msg.contains("broken.wgsl"),
        "{msg}"
    );
    // An advantage buffer of 6·B·G floats just over the binding limit.
    let limit = k.context().device.limits().max_storage_buffer_binding_size as usize;
    if limit > 512 << 20 {
        eprintln!(
            "binding limit {limit} bytes: skipping the oversized-batch check (it would allocate too much)"
        );
        return;
    }
    let g = 16;
    let count = (limit / 24 / g + 1) * g;
    let e = k.advantages(&vec![1.0; count], g).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, KernelError::TooLarge { .. }), "{msg}");
    assert!(
        msg.contains(&limit.to_string()) && msg.contains(&(count as u64 * 24).to_string()),
        "{msg}"
    );
}

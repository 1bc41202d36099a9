//! The mismatch lab's keys in each framework: the corrections TRL writes as
//! `vllm_importance_sampling_*` / `off_policy_mask_threshold` / `use_bias_correction_kl` and
//! OpenRLHF as its vLLM IS correction; the gaps themselves (`sampling.learner_scores`,
//! `sampling.sampler_precision`) are the lab's own knobs: in a framework the inference engine
//! makes the gap, no key does.

use super::*;
use crate::config::{IsCorrection, IsLevel, LearnerScores, SamplerPrecision};

/// The row of a mismatch-lab key (`None`: not one).
pub(super) fn mismatch_row(x: &Ctx, key: &str) -> Option<Mapped> {
    Some(match key {
        "algorithm.is_correction" => correction(x),
        "algorithm.is_level"
        | "algorithm.is_threshold_low"
        | "algorithm.is_threshold_high"
        | "algorithm.opsm_threshold" => knob(x),
        "algorithm.unbiased_kl" => unbiased_kl(x),
        "algorithm.max_staleness" => staleness(x),
        "sampling.learner_scores" => learner_scores(x),
        "sampling.sampler_precision" => sampler_precision(x),
        "sampling.keep_sampling_mask" => keep_sampling_mask(x),
        _ => return None,
    })
}

fn correction(x: &Ctx) -> Mapped {
    let a = &x.c.algorithm;
    let band = || Val::List(vec![f(a.is_threshold_low), f(a.is_threshold_high)]);
    match (x.fw, a.is_correction) {
        (Framework::Trl, IsCorrection::None) => exact(
            vec![kv("vllm_importance_sampling_correction", Val::Bool(false))],
            "off (TRL's default is on behind vLLM, where a gap always exists)",
        ),
        (Framework::Trl, IsCorrection::Opsm) => exact(
            vec![
                kv("vllm_importance_sampling_correction", Val::Bool(false)),
                kv("off_policy_mask_threshold", f(a.opsm_threshold)),
            ],
            "OPSM (DeepSeek-V3.2 eq. 9)",
        ),
        (Framework::Trl, kind) => {
            let level = if kind == IsCorrection::Icepop {
                IsLevel::Token
            } else {
                a.is_level
            };
            let rule = if kind == IsCorrection::Tis {
                "truncate"
            } else {
                "mask"
            };
            let low = if a.is_threshold_low > 0.0 {
                f(a.is_threshold_low)
            } else {
                Val::None
            };
            exact(
                vec![
                    kv("vllm_importance_sampling_correction", Val::Bool(true)),
                    kv(
                        "vllm_importance_sampling_mode",
                        Val::str(format!("{}_{rule}", level.name())),
                    ),
                    kv("vllm_importance_sampling_clip_min", low),
                    kv("vllm_importance_sampling_clip_max", f(a.is_threshold_high)),
                ],
                if kind == IsCorrection::Icepop {
                    "IcePop is TRL's token_mask (the same rule)"
                } else {
                    ""
                },
            )
        }
        (_, IsCorrection::None) => exact(vec![], "no correction"),
        (Framework::OpenRlhf, kind)
            if a.is_level == IsLevel::Token
                && matches!(
                    kind,
                    IsCorrection::Tis | IsCorrection::Mis | IsCorrection::Icepop
                ) =>
        {
            let name = if kind == IsCorrection::Tis {
                "tis"
            } else {
                "icepop"
            };
            exact(
                vec![
                    kv("algo.advantage.is_correction_enable", Val::Bool(true)),
                    kv("algo.advantage.is_correction_type", Val::str(name)),
                    kv("algo.advantage.is_correction_threshold", band()),
                ],
                "tis clamps to the band, icepop zeroes outside it (token-level mis is icepop)",
            )
        }
        (Framework::OpenRlhf, kind) => refused(format!(
            "OpenRLHF has tis / icepop per token and seq-mask-tis (a sequence mask by the geometric mean, then per-token weights), not {kind} at is_level = {}",
            a.is_level
        )),
        (fw, kind) => refused(format!(
            "{}'s rollout correction (algorithm.rollout_correction: rollout_is / rollout_rs) has modes of its own; {kind} is not mapped to them",
            fw.name()
        )),
    }
}

fn knob(x: &Ctx) -> Mapped {
    if x.c.algorithm.is_correction == IsCorrection::None {
        inert(vec![], "read by algorithm.is_correction only")
    } else {
        exact(vec![], "written by the algorithm.is_correction row")
    }
}

fn unbiased_kl(x: &Ctx) -> Mapped {
    let on = x.c.algorithm.unbiased_kl;
    match x.fw {
        Framework::Trl => exact(vec![kv("use_bias_correction_kl", Val::Bool(on))], ""),
        _ if !on => exact(vec![], "the KL estimate as is"),
        fw => refused(format!(
            "{} has no importance-weighted KL estimate",
            fw.name()
        )),
    }
}

fn learner_scores(x: &Ctx) -> Mapped {
    match x.c.sampling.learner_scores {
        LearnerScores::Sampled => exact(
            vec![],
            "the learner scores at the sampling temperature, as every framework does",
        ),
        LearnerScores::Full => refused(
            "a deliberate gap of the mismatch lab (the learner at temperature 1): no framework has a key for it",
        ),
    }
}

fn sampler_precision(x: &Ctx) -> Mapped {
    match x.c.sampling.sampler_precision {
        SamplerPrecision::F32 => exact(vec![], "the sampler in f32"),
        SamplerPrecision::Bf16 => refused(
            "a deliberate gap of the mismatch lab: in a framework the inference engine's dtype makes it (vLLM's dtype), not a trainer key",
        ),
    }
}

fn keep_sampling_mask(x: &Ctx) -> Mapped {
    if x.c.sampling.keep_sampling_mask {
        refused(
            "DeepSeek-V3.2's keep-sampling-mask needs the inference engine's kept support per token (vLLM's sampling-mask replay, used by prime-rl and SkyRL); TRL, verl and OpenRLHF have no key for it",
        )
    } else {
        exact(
            vec![],
            "the learner scores the full vocabulary, as every framework does",
        )
    }
}

fn staleness(x: &Ctx) -> Mapped {
    match x.c.algorithm.max_staleness {
        0 => exact(
            vec![],
            "on-policy rollouts (every framework's synchronous trainer)",
        ),
        k => refused(format!(
            "rollouts {k} iterations stale come from an asynchronous trainer (OpenRLHF's async queue, verl's one-step-off-policy / fully async recipes), a different entry point from the one exported"
        )),
    }
}

//! The one-shot commands that look at one thing: a response's reward (`score`), a group's
//! advantages (`advantages`), one response's objective (`objective`) and the adapters with
//! what `--device auto` picks (`devices`).

use crate::{parse_floats, parse_list};
use anyhow::Result;
use clap::Args;
use grpo_lab::bench::user;
use grpo_lab::config::{AdvantageMode, RewardKind, RunConfig};
use grpo_lab::objective::advantage;
use grpo_lab::task::{RewardFn, SortTokenizer};

pub(crate) fn score_cmd(
    reward: RewardKind,
    prompt: &str,
    response: &str,
    json: bool,
) -> Result<()> {
    // Numbers the tokenizer holds: below 1024, task.vocab's most (the verifiers score numbers;
    // a response's <eos> is the trainer's to strip).
    let max = grpo_lab::task::tokenizer::MAX_NUMBERS - 1;
    let prompt = parse_list(prompt, max).map_err(|e| user(format!("--prompt: {e}")))?;
    let response = parse_list(response, max).map_err(|e| user(format!("--response: {e}")))?;
    if prompt.is_empty() || prompt.len() > 64 {
        return Err(user(format!(
            "--prompt has {} numbers: allowed 1..=64 (task.n)",
            prompt.len()
        )));
    }
    let r = RewardFn::single(reward).score(&prompt, &response);
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let tok = SortTokenizer::load()?;
        println!("prompt   {}", tok.decode(&prompt));
        println!("response {}", tok.decode(&response));
        println!(
            "truth    {}",
            tok.decode(&grpo_lab::task::sort::sorted(&prompt))
        );
        println!("{}: {}", reward.name(), r.reward);
        for (k, v) in &r.parts {
            println!("  {k}: {v}");
        }
    }
    Ok(())
}

pub(crate) fn advantages_cmd(rewards: &str, json: bool) -> Result<()> {
    let rewards = parse_floats(rewards).map_err(|e| user(format!("--rewards: {e}")))?;
    if rewards.is_empty() {
        return Err(user("--rewards is empty"));
    }
    let g = rewards.len();
    let all = advantage::all_advantages(&rewards, g);
    // The advantages are computed in f32, as the trainer does: a group whose deviations from
    // the mean square past f32's range (|r − mean| ≳ 1.8e19) has no finite std to divide by.
    let s = all.groups[0];
    let finite = [s.mean, s.std].iter().all(|v| v.is_finite())
        && all.by_mode.values().flatten().all(|v| v.is_finite());
    if !finite {
        return Err(user(format!(
            "--rewards: the group's mean or std overflows f32 (mean {}, std {}); allowed: rewards whose deviations from their mean stay under ~1e19, as the trainer computes advantages in f32 too",
            s.mean, s.std
        )));
    }
    if json {
        println!("{}", serde_json::to_string(&all.by_mode)?);
    } else {
        let s = all.groups[0];
        println!(
            "rewards {rewards:?}: mean {:.4}, std (unbiased) {:.4}, max {}{}",
            s.mean,
            s.std,
            s.max,
            match (s.zero_std, s.mean) {
                (false, _) => "",
                (true, m) if m > 0.0 => {
                    " — all equal: the group-relative modes give 0 (no learning signal); raw and max keep the reward itself, which still pushes every answer up"
                }
                (true, m) if m < 0.0 => {
                    " — all equal: the group-relative modes give 0 (no learning signal); raw and max keep the reward itself, which pushes every answer down"
                }
                (true, _) => " — all equal, at 0: no mode gives a learning signal",
            }
        );
        for m in AdvantageMode::GROUP {
            let v: Vec<String> = all.by_mode[m.name()]
                .iter()
                .map(|x| format!("{x:.4}"))
                .collect();
            println!("{:>17}: [{}]", m.name(), v.join(", "));
        }
    }
    Ok(())
}

#[derive(Args)]
pub(crate) struct ObjectiveArgs {
    /// The loss (algorithm.loss): naive, unclipped, clipped, cispo, sapo, gmpo.
    #[arg(long)]
    loss: String,
    /// Where the ratio lives (algorithm.importance_sampling_level): token, sequence, sequence_token.
    #[arg(long, default_value = "token")]
    importance_sampling_level: String,
    /// Comma-separated log π of each token, e.g. -1.0,-2.1,-0.4
    #[arg(long, allow_hyphen_values = true)]
    logp: String,
    /// Comma-separated log π_old, one per token.
    #[arg(long, allow_hyphen_values = true)]
    old_logp: String,
    /// Comma-separated log π_ref (needed where algorithm.beta > 0).
    #[arg(long, allow_hyphen_values = true)]
    ref_logp: Option<String>,
    /// Comma-separated log π of the sampler that drew the tokens (the mismatch lab's
    /// algorithm.is_correction; log π_old where absent).
    #[arg(long, allow_hyphen_values = true)]
    sampler_logp: Option<String>,
    /// The response's advantage.
    #[arg(long, allow_hyphen_values = true)]
    advantage: f32,
    /// Any other algorithm key, e.g. --set algorithm.epsilon_high=0.28 (repeatable).
    #[arg(long = "set")]
    sets: Vec<String>,
    /// `{"tokens": [{"objective", "dlogp", "ratio", "loss_term", "kl", "weight", "is_weight"}, ..], "loss", ..}`
    #[arg(long)]
    json: bool,
}

pub(crate) fn objective_cmd(a: ObjectiveArgs) -> Result<()> {
    use grpo_lab::objective::calculator;
    // Only the objective's own keys mean anything here; --loss and the level have their flags.
    for set in &a.sets {
        let key = set.split_once('=').map_or(set.as_str(), |(k, _)| k).trim();
        if !key.starts_with("algorithm.") {
            return Err(user(format!(
                "--set {key}: one response's objective reads only algorithm.* keys (allowed: algorithm.KEY=VALUE; `grpo-lab config-docs` lists them)"
            )));
        }
        if let Some(flag) = [
            ("algorithm.loss", "--loss"),
            (
                "algorithm.importance_sampling_level",
                "--importance-sampling-level",
            ),
        ]
        .iter()
        .find_map(|(k, flag)| (*k == key).then_some(flag))
        {
            return Err(user(format!("--set {key}: given by {flag}; set it there")));
        }
    }
    let mut sets = vec![
        format!("algorithm.loss={}", a.loss),
        format!(
            "algorithm.importance_sampling_level={}",
            a.importance_sampling_level
        ),
    ];
    sets.extend(a.sets.iter().cloned());
    let config = RunConfig::default()
        .with_overrides(&sets)
        .map_err(|e| user(e.to_string()))?;
    let floats = |flag: &str, s: &str| parse_floats(s).map_err(|e| user(format!("{flag}: {e}")));
    let logp = floats("--logp", &a.logp)?;
    let old = floats("--old-logp", &a.old_logp)?;
    let refl = a
        .ref_logp
        .as_deref()
        .map(|s| floats("--ref-logp", s))
        .transpose()?;
    let sampler = a
        .sampler_logp
        .as_deref()
        .map(|s| floats("--sampler-logp", s))
        .transpose()?;
    let got = calculator::calculate(
        &config,
        &logp,
        &old,
        refl.as_deref(),
        sampler.as_deref(),
        a.advantage,
    )
    .map_err(|e| user(e.to_string()))?;
    if a.json {
        println!("{}", serde_json::to_string(&got)?);
    } else {
        print!("{}", got.table(&config));
    }
    Ok(())
}

pub(crate) fn devices_cmd(json: bool) -> Result<()> {
    let adapters = grpo_lab::gpu::context::list_adapters();
    let hw = adapters
        .iter()
        .find(|a| !a.is_software())
        .map(|a| a.name.as_str());
    let mut picks = Vec::new();
    for preset in ["lecture17", "transformer-sort"] {
        let config = RunConfig::preset(preset).map_err(user)?;
        let (choice, why) = grpo_lab::engine::auto_device(&config, hw);
        picks.push((preset, choice.name(), why));
    }
    if json {
        // The adapters, and `--device auto`'s pick for each model's preset with its reason.
        let auto: serde_json::Map<String, serde_json::Value> = picks
            .iter()
            .map(|(preset, device, why)| {
                let pick = serde_json::json!({ "device": device, "why": why });
                (preset.to_string(), pick)
            })
            .collect();
        let all = serde_json::json!({ "adapters": adapters, "auto": auto });
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    if adapters.is_empty() {
        println!(
            "no wgpu adapter found (install lavapipe: apt-get install -y mesa-vulkan-drivers libvulkan1)"
        );
    }
    for (i, a) in adapters.iter().enumerate() {
        println!(
            "[{i}] {} — {} {} ({})",
            a.name, a.backend, a.device_type, a.driver
        );
        println!(
            "    max storage binding {} MiB, max buffer {} MiB, workgroup ≤ {} invocations, {} workgroups/dim, {} storage buffers/stage",
            a.max_storage_buffer_binding_size >> 20,
            a.max_buffer_size >> 20,
            a.max_compute_invocations_per_workgroup,
            a.max_compute_workgroups_per_dimension,
            a.max_storage_buffers_per_shader_stage
        );
        match a.subgroup_sizes {
            Some((lo, hi)) => println!("    subgroups of {lo}..{hi} invocations"),
            None => println!("    no subgroup operations"),
        }
    }
    println!("cpu — burn's pure-Rust CPU backend (--device cpu), always available");
    for (preset, device, why) in picks {
        println!("--device auto picks for {preset}: {device} ({why})");
    }
    Ok(())
}

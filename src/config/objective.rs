//! Which objectives go together: loss × importance-sampling level × aggregation, and the
//! knobs that only one loss reads. Each refusal names both keys and what would work.

use super::*;

/// The losses that have a ratio to put at the sequence level (GSPO's clip, SAPO's gate, or
/// the plain ratio). `naive` has no ratio, CISPO's is detached (its gradient is each token's
/// own log π), GMPO is sequence-level by construction.
const SEQUENCE_LOSSES: &[LossMode] = &[LossMode::Unclipped, LossMode::Clipped, LossMode::Sapo];
/// GSPO-token: the sequence ratio's value, each token's own gradient; any loss with a ratio.
const SEQUENCE_TOKEN_LOSSES: &[LossMode] = &[
    LossMode::Unclipped,
    LossMode::Clipped,
    LossMode::Cispo,
    LossMode::Sapo,
];

/// The modes that read GDPO's normalized sum (`task.reward_aggregation = normalize_then_sum`)
/// as a group-relative signal: the others need a raw reward (its max, the greedy answer's,
/// a success count) or are PPO's critic.
pub const NORMALIZED_SUM_MODES: &[AdvantageMode] = &[
    AdvantageMode::Centered,
    AdvantageMode::Normalized,
    AdvantageMode::Rloo,
    AdvantageMode::BatchNormalized,
    AdvantageMode::ReinforcePp,
    AdvantageMode::ReinforcePpBaseline,
];

fn names(modes: &[LossMode]) -> String {
    modes
        .iter()
        .map(|m| m.name())
        .collect::<Vec<_>>()
        .join(", ")
}

impl RunConfig {
    /// The objective's keys against each other (the rules of `config-docs`).
    pub(super) fn validate_objective(&self) -> Result<(), ConfigError> {
        let a = &self.algorithm;
        let level = a.importance_sampling_level;
        let key_level = "algorithm.importance_sampling_level";
        match level {
            ImportanceSamplingLevel::Token => {}
            // GMPO's own reason comes after.
            _ if a.loss == LossMode::Gmpo => {}
            ImportanceSamplingLevel::Sequence if !SEQUENCE_LOSSES.contains(&a.loss) => {
                return bad(
                    key_level,
                    format!(
                        "sequence with algorithm.loss = {}: the sequence level needs a loss with a ratio whose gradient flows ({})",
                        a.loss,
                        names(SEQUENCE_LOSSES)
                    ),
                );
            }
            ImportanceSamplingLevel::SequenceToken if !SEQUENCE_TOKEN_LOSSES.contains(&a.loss) => {
                return bad(
                    key_level,
                    format!(
                        "sequence_token with algorithm.loss = {}: allowed losses {}",
                        a.loss,
                        names(SEQUENCE_TOKEN_LOSSES)
                    ),
                );
            }
            _ => {}
        }
        let agg = a.loss_agg_mode;
        if a.loss == LossMode::Gmpo {
            if level != ImportanceSamplingLevel::Token {
                return bad(
                    key_level,
                    format!(
                        "{level} with algorithm.loss = gmpo: GMPO's geometric mean is sequence-level already (keep the level at token)"
                    ),
                );
            }
            if agg != LossAggMode::SeqMeanTokenMean {
                return bad(
                    "algorithm.loss_agg_mode",
                    format!(
                        "{agg} with algorithm.loss = gmpo: GMPO's loss is the mean over responses (seq-mean-token-mean)"
                    ),
                );
            }
        }
        let seq_aggs = [LossAggMode::SeqMeanTokenMean, LossAggMode::Luspo];
        if level == ImportanceSamplingLevel::Sequence && !seq_aggs.contains(&agg) {
            return bad(
                "algorithm.loss_agg_mode",
                format!(
                    "{agg} with algorithm.importance_sampling_level = sequence: one ratio per response is averaged over responses — seq-mean-token-mean (GSPO) or luspo (× length); a token sum would weigh a response by its length twice"
                ),
            );
        }
        if agg == LossAggMode::Luspo && level != ImportanceSamplingLevel::Sequence {
            return bad(
                "algorithm.loss_agg_mode",
                format!(
                    "luspo with algorithm.importance_sampling_level = {level}: LUSPO scales a sequence-level loss by its length (set the level to sequence)"
                ),
            );
        }
        self.validate_clip_knobs()?;
        self.validate_advantage()?;
        self.validate_cov()?;
        self.validate_schedule()?;
        self.validate_mismatch()?;
        let b = &a.bugs;
        let ratio_bug = b.ratio_as_logprob_quotient || b.unfrozen_old_policy;
        if ratio_bug && (level != ImportanceSamplingLevel::Token || a.loss == LossMode::Gmpo) {
            return bad(
                "algorithm.bugs",
                format!(
                    "the ratio bugs are token-level (algorithm.importance_sampling_level = {level}, algorithm.loss = {}): use the token level and a per-token loss",
                    a.loss
                ),
            );
        }
        Ok(())
    }

    /// Dual clip and δ: clipped-loss knobs, each above the clip it extends.
    fn validate_clip_knobs(&self) -> Result<(), ConfigError> {
        let a = &self.algorithm;
        if a.dual_clip != 0.0 {
            if a.loss != LossMode::Clipped {
                return bad(
                    "algorithm.dual_clip",
                    format!(
                        "{} with algorithm.loss = {}: the dual clip caps PPO's clipped loss (set algorithm.loss = clipped, or dual_clip = 0)",
                        a.dual_clip, a.loss
                    ),
                );
            }
            if a.dual_clip <= 1.0 {
                return bad(
                    "algorithm.dual_clip",
                    format!("{} must be > 1 (verl: 3), or 0 = off", a.dual_clip),
                );
            }
        }
        if a.delta != 0.0 {
            if a.loss != LossMode::Clipped {
                return bad(
                    "algorithm.delta",
                    format!(
                        "{} with algorithm.loss = {}: δ caps the clipped loss's unclipped branch (set algorithm.loss = clipped, or delta = 0)",
                        a.delta, a.loss
                    ),
                );
            }
            if a.delta <= 1.0 + a.epsilon_high {
                return bad(
                    "algorithm.delta",
                    format!(
                        "{} must be > 1 + algorithm.epsilon_high = {} (below it δ would cut into the clip range), or 0 = off",
                        a.delta,
                        1.0 + a.epsilon_high
                    ),
                );
            }
        }
        Ok(())
    }

    /// Clip-Cov works on PPO's clipped loss, KL-Cov on the unclipped one (verl's forms), each
    /// token by its own ratio.
    fn validate_cov(&self) -> Result<(), ConfigError> {
        let a = &self.algorithm;
        let want = match a.cov_penalty {
            CovPenalty::None => return Ok(()),
            CovPenalty::ClipCov => LossMode::Clipped,
            CovPenalty::KlCov => LossMode::Unclipped,
        };
        if a.loss != want {
            return bad(
                "algorithm.cov_penalty",
                format!(
                    "{} with algorithm.loss = {}: it is defined on the {want} loss (set algorithm.loss = {want})",
                    a.cov_penalty, a.loss
                ),
            );
        }
        if a.importance_sampling_level != ImportanceSamplingLevel::Token {
            return bad(
                "algorithm.cov_penalty",
                format!(
                    "{} with algorithm.importance_sampling_level = {}: a token's covariance rule needs each token's own ratio (level token)",
                    a.cov_penalty, a.importance_sampling_level
                ),
            );
        }
        if a.cov_penalty == CovPenalty::ClipCov && a.clip_cov_ub <= a.clip_cov_lb {
            return bad(
                "algorithm.clip_cov_ub",
                format!(
                    "{} ≤ algorithm.clip_cov_lb = {}: no covariance lies between them",
                    a.clip_cov_ub, a.clip_cov_lb
                ),
            );
        }
        Ok(())
    }

    /// The adaptive entropy coefficient's bounds, the mini-batches and the replay buffer.
    fn validate_schedule(&self) -> Result<(), ConfigError> {
        let a = &self.algorithm;
        if a.adaptive_entropy && a.entropy_coef_max < a.entropy_coef_min {
            return bad(
                "algorithm.entropy_coef_max",
                format!(
                    "{} < algorithm.entropy_coef_min = {}: the adaptive coefficient has no room",
                    a.entropy_coef_max, a.entropy_coef_min
                ),
            );
        }
        self.validate_mini_batches()?;
        if a.replay_buffer > 0 {
            if self.records_sampler_logp() {
                return bad(
                    "algorithm.replay_buffer",
                    "with a recorded sampler–learner gap (sampling.learner_scores = full, sampler_precision = bf16, or a correction with top-k / top-p): a stored group keeps no sampler log π".into(),
                );
            }
            if a.dynamic_sampling {
                return bad(
                    "algorithm.replay_buffer",
                    "with algorithm.dynamic_sampling = true: both replace the groups without a reward signal (dynamic sampling by fresh ones); choose one".into(),
                );
            }
            let per_token = a.advantage == AdvantageMode::Gae
                || (a.advantage == AdvantageMode::ReinforcePp && a.gamma < 1.0);
            if per_token {
                return bad(
                    "algorithm.replay_buffer",
                    format!(
                        "with algorithm.advantage = {} (algorithm.gamma = {}): a stored group carries one advantage per response, and this mode gives one per token",
                        a.advantage, a.gamma
                    ),
                );
            }
        }
        Ok(())
    }

    /// `steps_per_generation` cuts the iteration's B groups into equal mini-batches of whole
    /// groups: the frameworks it mirrors need equal ones (verl's `ppo_mini_batch_size` =
    /// B / S, TRL's `steps_per_generation`), and unequal ones would weigh a group by the size
    /// of the mini-batch it fell in. B is what [`RunConfig::batch_prompts`] draws:
    /// `prompts_per_iteration`, or every training prompt when it is 0
    /// (`validate_algorithm` has refused a B above the training prompts).
    fn validate_mini_batches(&self) -> Result<(), ConfigError> {
        let s = self.algorithm.steps_per_generation;
        let (b, from) = match (
            self.algorithm.prompts_per_iteration,
            self.task.prompts.len(),
        ) {
            (0, 0) => (self.task.train_size, "0: every prompt of task.train_size"),
            (0, _) => (self.task.prompts.len(), "0: every prompt of task.prompts"),
            (b, _) => (b, ""),
        };
        if b == 0 || b.is_multiple_of(s) {
            return Ok(());
        }
        let from = if from.is_empty() {
            b.to_string()
        } else {
            format!("{from}, B = {b}")
        };
        bad(
            "algorithm.steps_per_generation",
            format!(
                "{s} does not divide the iteration's prompts B (algorithm.prompts_per_iteration = {from}): the mini-batches of whole groups must be equal; allowed a divisor of {b}: {}",
                divisors_up_to(b, 1000)
            ),
        )
    }

    /// The mismatch lab: the corrections' band and level, and the kept sampling mask's needs.
    fn validate_mismatch(&self) -> Result<(), ConfigError> {
        let a = &self.algorithm;
        let s = &self.sampling;
        if s.keep_sampling_mask {
            let vocab = self.learner_vocab();
            if s.top_k == 0 && s.top_p >= 1.0 {
                return bad(
                    "sampling.keep_sampling_mask",
                    "without sampling.top_k or sampling.top_p: the sampler keeps every token, so there is no mask to keep".into(),
                );
            }
            if vocab > 64 {
                return bad(
                    "sampling.keep_sampling_mask",
                    format!(
                        "with {vocab} tokens to choose from (task.vocab): a kept support is one 64-bit word per token"
                    ),
                );
            }
            if a.replay_buffer > 0 {
                return bad(
                    "algorithm.replay_buffer",
                    "with sampling.keep_sampling_mask = true: a stored group keeps no sampler support".into(),
                );
            }
        }
        if a.is_threshold_high <= a.is_threshold_low {
            return bad(
                "algorithm.is_threshold_high",
                format!(
                    "{} ≤ algorithm.is_threshold_low = {}: the IS weight's band is empty",
                    a.is_threshold_high, a.is_threshold_low
                ),
            );
        }
        let per_token = matches!(a.is_correction, IsCorrection::Icepop | IsCorrection::Opsm);
        if per_token && a.is_level == IsLevel::Sequence {
            return bad(
                "algorithm.is_level",
                format!(
                    "sequence with algorithm.is_correction = {}: {} is defined by its paper at one level (icepop masks tokens, opsm masks sequences by their mean log-ratio); is_level is read by tis and mis",
                    a.is_correction, a.is_correction
                ),
            );
        }
        Ok(())
    }

    /// The estimators' own numbers, and which of them read GDPO's normalized sum.
    fn validate_advantage(&self) -> Result<(), ConfigError> {
        let a = &self.algorithm;
        let g = a.num_generations;
        match a.advantage {
            AdvantageMode::PasskAnalytic if a.passk_advantage_k == 0 || a.passk_advantage_k > g => {
                return bad(
                    "algorithm.passk_advantage_k",
                    format!(
                        "{} with algorithm.num_generations = {g}: Pass@k draws k of the group's G answers (1 ≤ k ≤ G)",
                        a.passk_advantage_k
                    ),
                );
            }
            AdvantageMode::Passk if g < 2 => {
                return bad(
                    "algorithm.advantage",
                    format!(
                        "passk with algorithm.num_generations = {g}: it compares a group's best answer with its second best (G ≥ 2)"
                    ),
                );
            }
            _ => {}
        }
        if self.task.reward_aggregation == RewardAggregation::NormalizeThenSum
            && !NORMALIZED_SUM_MODES.contains(&a.advantage)
        {
            let allowed: Vec<&str> = NORMALIZED_SUM_MODES.iter().map(|m| m.name()).collect();
            return bad(
                "task.reward_aggregation",
                format!(
                    "normalize_then_sum with algorithm.advantage = {}: GDPO's sum of normalized rewards is zero-mean in each group, which only a group-relative mode reads as meant ({})",
                    a.advantage,
                    allowed.join(", ")
                ),
            );
        }
        if self.task.reward_aggregation == RewardAggregation::NormalizeThenSum
            && a.kl_penalty == KlPenaltyMode::Reward
            && a.beta > 0.0
        {
            return bad(
                "task.reward_aggregation",
                "normalize_then_sum with algorithm.kl_penalty = reward (β > 0): the KL would be subtracted from a sum of normalized rewards, on no scale of its own (put the KL in the loss: kl_penalty = loss)".into(),
            );
        }
        Ok(())
    }
}

/// The divisors of `b` up to `max` (the field's own bound), in order, as a list for a message.
fn divisors_up_to(b: usize, max: usize) -> String {
    let shown: Vec<String> = (1..=b.min(max))
        .filter(|d| b.is_multiple_of(*d))
        .map(|d| d.to_string())
        .collect();
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(sets: &[&str]) -> String {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        RunConfig::preset("scaled")
            .unwrap()
            .with_overrides(&sets)
            .unwrap_err()
            .to_string()
    }

    /// GMPO at a sequence level is refused for GMPO's own reason (the generic one, "needs a
    /// ratio whose gradient flows", said something false of it).
    #[test]
    fn gmpo_at_a_sequence_level_gets_its_own_reason() {
        for level in ["sequence", "sequence_token"] {
            let e = refusal(&[
                "algorithm.loss=gmpo",
                &format!("algorithm.importance_sampling_level={level}"),
            ]);
            assert!(e.contains("sequence-level already"), "{level}: {e}");
        }
    }

    #[test]
    fn the_mismatch_lab_s_rules_name_both_keys() {
        let e = refusal(&[
            "algorithm.is_threshold_low=2",
            "algorithm.is_threshold_high=1",
        ]);
        assert!(
            e.contains("algorithm.is_threshold_high") && e.contains("is_threshold_low"),
            "{e}"
        );
        for rule in ["icepop", "opsm"] {
            let e = refusal(&[
                &format!("algorithm.is_correction={rule}"),
                "algorithm.is_level=sequence",
            ]);
            assert!(e.contains("algorithm.is_level") && e.contains(rule), "{e}");
        }
        // Every gap runs on the transformer too: each records the sampler's own log π.
        for sets in [
            &["sampling.sampler_precision=bf16"][..],
            &["sampling.learner_scores=full", "sampling.temperature=0.7"],
            &["sampling.top_k=3", "algorithm.is_correction=tis"],
            &["algorithm.max_staleness=2"],
        ] {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            let c = RunConfig::preset("transformer-sort")
                .unwrap()
                .with_overrides(&sets)
                .unwrap();
            assert!(c.records_sampler_logp(), "{sets:?}");
        }
        let e = refusal(&[
            "sampling.learner_scores=full",
            "sampling.temperature=0.7",
            "algorithm.replay_buffer=8",
        ]);
        assert!(
            e.contains("algorithm.replay_buffer") && e.contains("learner_scores"),
            "{e}"
        );
        // OPSM with no gap compares π_θ with π_old, on the transformer too.
        let mut c = RunConfig::preset("transformer-sort").unwrap();
        c.algorithm.is_correction = IsCorrection::Opsm;
        c.validate().unwrap();
        assert!(!c.records_sampler_logp());
    }

    #[test]
    fn the_estimators_rules_name_both_keys() {
        let e = refusal(&[
            "algorithm.advantage=passk_analytic",
            "algorithm.passk_advantage_k=17",
        ]);
        assert!(
            e.contains("algorithm.passk_advantage_k") && e.contains("num_generations = 16"),
            "{e}"
        );
        let e = refusal(&["algorithm.advantage=passk", "algorithm.num_generations=1"]);
        assert!(
            e.contains("algorithm.advantage") && e.contains("num_generations"),
            "{e}"
        );
        for mode in [
            "raw",
            "max",
            "gae",
            "gpg",
            "remax",
            "opo",
            "passk",
            "passk_analytic",
        ] {
            let e = refusal(&[
                "task.reward_aggregation=normalize_then_sum",
                &format!("algorithm.advantage={mode}"),
            ]);
            assert!(
                e.contains("task.reward_aggregation") && e.contains(mode),
                "{e}"
            );
        }
        let e = refusal(&[
            "task.reward_aggregation=normalize_then_sum",
            "algorithm.kl_penalty=reward",
            "algorithm.beta=0.1",
        ]);
        assert!(e.contains("kl_penalty = reward"), "{e}");
        let ok = RunConfig::preset("scaled").unwrap();
        for mode in NORMALIZED_SUM_MODES {
            ok.with_overrides(&[
                "task.reward_aggregation=normalize_then_sum".into(),
                format!("algorithm.advantage={mode}"),
            ])
            .unwrap();
        }
        // The covariance rules: each on its own loss, at the token level, a non-empty window.
        let e = refusal(&["algorithm.cov_penalty=clip_cov", "algorithm.loss=naive"]);
        assert!(
            e.contains("algorithm.cov_penalty")
                && e.contains("loss = naive")
                && e.contains("clipped"),
            "{e}"
        );
        let e = refusal(&[
            "algorithm.cov_penalty=kl_cov",
            "algorithm.loss=unclipped",
            "algorithm.importance_sampling_level=sequence",
        ]);
        assert!(
            e.contains("kl_cov") && e.contains("importance_sampling_level"),
            "{e}"
        );
        let e = refusal(&[
            "algorithm.cov_penalty=clip_cov",
            "algorithm.loss=clipped",
            "algorithm.clip_cov_ub=0.5",
        ]);
        assert!(
            e.contains("algorithm.clip_cov_ub") && e.contains("clip_cov_lb"),
            "{e}"
        );
        ok.with_overrides(&[
            "algorithm.advantage=passk_analytic".into(),
            "algorithm.passk_advantage_k=16".into(),
        ])
        .unwrap();
    }
}

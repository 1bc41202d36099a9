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
        self.validate_clip_knobs()?;
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
}

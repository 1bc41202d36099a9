//! The entropy bonus's coefficient from one step to the next: fixed (`algorithm.entropy_coef`)
//! or Skywork-OR1's adaptive controller (arXiv 2505.22312 §3.2; TRL `use_adaptive_entropy`,
//! `grpo_trainer.py` at f2cd577):
//!
//! - the step applies `c` when the mean token entropy measured at the previous step was at or
//!   below `entropy_target`, and 0 otherwise (0 too before any measurement: TRL starts from
//!   `+∞`, "no bonus until a real measurement arrives");
//! - after the step, with `H` its measured mean token entropy: `c ← min(c + δ, c_max)` when
//!   `H ≤ target`, else `c ← max(c − δ, c_min)`.
//!
//! `c` starts at `entropy_coef`. The state (`c` and the last `H`) travels in checkpoints, so a
//! resumed run steers exactly as an uninterrupted one.

use crate::config::AlgorithmConfig;
use serde::{Deserialize, Serialize};

/// The controller's state between optimizer steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EntropyControl {
    /// The coefficient `c` (the fixed one, or the adaptive one after the last update).
    pub coef: f64,
    /// The mean token entropy of the last optimizer step (`None`: no step yet, TRL's `+∞`).
    pub last_entropy: Option<f64>,
}

impl EntropyControl {
    pub fn start(a: &AlgorithmConfig) -> Self {
        Self {
            coef: a.entropy_coef,
            last_entropy: None,
        }
    }

    /// The coefficient of the bonus `− c·H` in this step's loss.
    pub fn applied(&self, a: &AlgorithmConfig) -> f64 {
        if !a.adaptive_entropy {
            return a.entropy_coef;
        }
        match self.last_entropy {
            Some(h) if h <= a.entropy_target => self.coef,
            _ => 0.0,
        }
    }

    /// After a step whose mean token entropy was `entropy`: the adaptive coefficient moves by
    /// `entropy_coef_delta` within its bounds (a fixed one follows the config, which the app
    /// may have changed live). A non-finite measurement (a step that returned none) leaves the
    /// state as it was.
    pub fn update(&mut self, entropy: f64, a: &AlgorithmConfig) {
        if !a.adaptive_entropy {
            self.coef = a.entropy_coef;
            return;
        }
        if !entropy.is_finite() {
            return;
        }
        self.coef = if entropy <= a.entropy_target {
            (self.coef + a.entropy_coef_delta).min(a.entropy_coef_max)
        } else {
            (self.coef - a.entropy_coef_delta).max(a.entropy_coef_min)
        };
        self.last_entropy = Some(entropy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adaptive() -> AlgorithmConfig {
        AlgorithmConfig {
            adaptive_entropy: true,
            entropy_coef: 0.01,
            entropy_target: 0.2,
            entropy_coef_delta: 0.005,
            entropy_coef_min: 0.0,
            entropy_coef_max: 0.02,
            ..Default::default()
        }
    }

    #[test]
    fn the_controller_follows_trls_rule_step_by_step() {
        let a = adaptive();
        let mut c = EntropyControl::start(&a);
        // No measurement yet: no bonus, whatever the coefficient.
        assert_eq!(c.applied(&a), 0.0);
        // Entropy above the target: the coefficient falls, and the bonus stays off.
        c.update(0.5, &a);
        assert!((c.coef - 0.005).abs() < 1e-12);
        assert_eq!(c.applied(&a), 0.0);
        c.update(0.3, &a);
        assert_eq!(c.coef, 0.0);
        c.update(0.3, &a);
        assert_eq!(c.coef, 0.0, "floored at entropy_coef_min");
        // At the target (ties count as below): it rises and applies.
        c.update(0.2, &a);
        assert!((c.coef - 0.005).abs() < 1e-12);
        assert_eq!(c.applied(&a), c.coef);
        for _ in 0..10 {
            c.update(0.1, &a);
        }
        assert_eq!(c.coef, 0.02, "capped at entropy_coef_max");
        assert_eq!(c.last_entropy, Some(0.1));
        // A step that measured nothing changes nothing.
        let before = c;
        c.update(f64::NAN, &a);
        assert_eq!(c, before);
    }

    #[test]
    fn a_fixed_coefficient_is_applied_as_configured() {
        let mut a = AlgorithmConfig {
            entropy_coef: 0.003,
            ..Default::default()
        };
        let mut c = EntropyControl::start(&a);
        assert_eq!(c.applied(&a), 0.003);
        c.update(0.0, &a);
        assert_eq!((c.coef, c.applied(&a)), (0.003, 0.003));
        a.entropy_coef = 0.0;
        c.update(1.0, &a);
        assert_eq!((c.coef, c.applied(&a)), (0.0, 0.0));
    }

    #[test]
    fn the_state_survives_json() {
        let a = adaptive();
        let mut c = EntropyControl::start(&a);
        let fresh: EntropyControl =
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(fresh, c);
        c.update(0.15, &a);
        let back: EntropyControl =
            serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }
}

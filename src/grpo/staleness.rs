//! Stale rollouts (`algorithm.max_staleness = k`, the mismatch lab's asynchronous gap): the
//! engine's state at the start of each of the last k + 1 iterations is kept, and iteration i
//! samples with the oldest — the policy of iteration max(0, i − k) — while the learner scores
//! with the current one. Kept states go into checkpoints (`stale-{j}-{name}`), so a resumed
//! run samples from the same policies.

use super::{TrainError, Trainer};
use crate::engine::{SampleRequest, Samples, Snapshot};

/// The checkpoint names of kept state `j`'s blobs.
const PREFIX: &str = "stale-";

impl Trainer {
    /// Step 1½: keep the current policy as a future sampler (the last k + 1 of them).
    pub(super) fn remember_policy(&mut self) -> Result<(), TrainError> {
        let k = self.config.algorithm.max_staleness;
        if k == 0 {
            self.stale.clear();
            return Ok(());
        }
        self.stale.push_back(self.engine.snapshot()?);
        while self.stale.len() > k + 1 {
            self.stale.pop_front();
        }
        Ok(())
    }

    /// Draw with the oldest kept policy (the current one when none is older); `true` with the
    /// samples when they came from an older policy (their log π and greedy answers are its).
    pub(super) fn sample_as_sampler(
        &mut self,
        req: &SampleRequest,
    ) -> Result<(Samples, bool), TrainError> {
        if self.stale.len() < 2 {
            return Ok((self.engine.sample(req)?, false));
        }
        let current = self.engine.snapshot()?;
        self.engine.restore(&self.stale[0])?;
        let drawn = self.engine.sample(req);
        self.engine.restore(&current)?;
        Ok((drawn?, true))
    }

    /// The kept policies as checkpoint blobs.
    pub(super) fn stale_blobs(&self) -> Snapshot {
        let mut out = Vec::new();
        for (j, snapshot) in self.stale.iter().enumerate() {
            for (name, bytes) in snapshot {
                out.push((format!("{PREFIX}{j}-{name}"), bytes.clone()));
            }
        }
        out
    }

    /// Take the kept policies out of a checkpoint's blobs (the rest is the engine's).
    pub(super) fn restore_stale(&mut self, blobs: &Snapshot) -> Snapshot {
        let mut kept: Vec<Snapshot> = Vec::new();
        let mut rest = Vec::new();
        for (name, bytes) in blobs {
            let parsed = name
                .strip_prefix(PREFIX)
                .and_then(|s| s.split_once('-'))
                .and_then(|(j, inner)| Some((j.parse::<usize>().ok()?, inner)));
            match parsed {
                Some((j, inner)) => {
                    if kept.len() <= j {
                        kept.resize_with(j + 1, Vec::new);
                    }
                    kept[j].push((inner.to_string(), bytes.clone()));
                }
                None => rest.push((name.clone(), bytes.clone())),
            }
        }
        self.stale = kept.into_iter().filter(|s| !s.is_empty()).collect();
        rest
    }
}

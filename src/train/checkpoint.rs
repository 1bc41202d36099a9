//! Checkpoints on disk: the trainer's state (`state.json`) and its engine's named blobs
//! (`policy.bpk`, `reference.bpk` in burn's format, and the optimizer state), one directory
//! per iteration. Each file is written to a temporary name and renamed into place, so a crash
//! leaves either the old file or the new one, never half of one.

use crate::grpo::{TrainError, Trainer, TrainerState};
use std::fs;
use std::io::Write;
use std::path::Path;

fn err(dir: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint {
        path: dir.display().to_string(),
        reason: e.to_string(),
    }
}

/// Write `bytes` to `path` through a temporary file, synced, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)
}

/// Write the trainer's state between iterations into `dir`.
pub fn save(trainer: &Trainer, dir: &Path) -> Result<(), TrainError> {
    let (state, blobs) = trainer.snapshot()?;
    fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    for (name, bytes) in &blobs {
        write_atomic(&dir.join(name), bytes).map_err(|e| err(dir, e))?;
    }
    let state = serde_json::to_vec(&state).map_err(|e| err(dir, e))?;
    // state.json last: a directory with it is complete.
    write_atomic(&dir.join("state.json"), &state).map_err(|e| err(dir, e))
}

/// Restore what `save` wrote; the run then continues bit-identically.
pub fn load(trainer: &mut Trainer, dir: &Path) -> Result<(), TrainError> {
    let text = fs::read_to_string(dir.join("state.json")).map_err(|e| err(dir, e))?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|e| err(dir, e))?;
    let mut blobs = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| err(dir, e))? {
        let path = entry.map_err(|e| err(dir, e))?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().to_string());
        if let Some(name) = name.filter(|n| n != "state.json" && !n.ends_with(".tmp")) {
            blobs.push((name, fs::read(&path).map_err(|e| err(dir, e))?));
        }
    }
    blobs.sort();
    trainer.restore(state, &blobs)
}

//! An experiment (a config × seed matrix from `assets/experiments`) run inside the app, one
//! seed after another, a bounded slice of time per frame — the same in the browser (no
//! threads) and on the desktop. Each finished seed updates the cells' mean ± std bands that
//! the Runs tab draws, so the overlay fills in live.

use crate::experiment::{
    Agg, Card, Cell, CellBands, Matrix, ReportAcc, ReportMetric, report_over_seeds, seed_bands,
};
use crate::grpo::Trainer;
use crate::metrics::StepRecord;
use web_time::{Duration, Instant};

pub struct InAppExperiment {
    pub name: String,
    pub description: String,
    pub card: Card,
    cells: Vec<Cell>,
    seeds: Vec<u64>,
    /// The next (cell, seed) to start, as `cell · seeds + seed`.
    next: usize,
    current: Option<(usize, Trainer, Vec<StepRecord>)>,
    /// Per cell, each finished seed's records (groups dropped).
    finished: Vec<Vec<Vec<StepRecord>>>,
    pub error: Option<String>,
    /// Each cell's bands and the result table over the seeds finished so far (refreshed when a
    /// seed finishes: the frame loop only reads them).
    pub bands: CellBands,
    pub table: Vec<TableRow>,
}

/// One cell's row of an experiment card's table: its label, seeds finished, and per column
/// (`InAppExperiment::columns`) the mean and std over those seeds.
#[derive(Debug, Clone)]
pub struct TableRow {
    pub label: String,
    pub seeds: usize,
    pub values: Vec<(f64, f64)>,
}

impl InAppExperiment {
    pub fn of(matrix: Matrix) -> Result<Self, String> {
        let cells = matrix.cells().map_err(|e| e.to_string())?;
        Ok(Self {
            name: matrix.name.clone(),
            description: matrix.description.clone(),
            card: matrix.card.clone(),
            finished: vec![Vec::new(); cells.len()],
            cells,
            seeds: matrix.seeds,
            next: 0,
            current: None,
            error: None,
            bands: Vec::new(),
            table: Vec::new(),
        })
    }

    pub fn total_runs(&self) -> usize {
        self.cells.len() * self.seeds.len()
    }

    pub fn runs_done(&self) -> usize {
        self.finished.iter().map(Vec::len).sum()
    }

    pub fn is_done(&self) -> bool {
        self.error.is_some() || (self.current.is_none() && self.next >= self.total_runs())
    }

    /// What runs now, for the progress line.
    pub fn progress(&self) -> String {
        match &self.current {
            Some((cell, t, _)) => format!(
                "{} · {}/{} runs done · now {} seed {} (iteration {}/{})",
                self.name,
                self.runs_done(),
                self.total_runs(),
                self.cells[*cell].label,
                t.config.run.seed,
                t.iteration(),
                t.config.run.iterations
            ),
            None => format!(
                "{} · {}/{} runs done",
                self.name,
                self.runs_done(),
                self.total_runs()
            ),
        }
    }

    /// Train for at most `budget`; `true` when a seed finished (the bands changed).
    pub fn advance(&mut self, budget: Duration) -> bool {
        let start = Instant::now();
        let mut changed = false;
        while !self.is_done() && start.elapsed() < budget {
            if self.current.is_none() {
                let (cell, seed) = (
                    self.next / self.seeds.len(),
                    self.seeds[self.next % self.seeds.len()],
                );
                self.next += 1;
                let mut config = self.cells[cell].config.clone();
                config.run.seed = seed;
                match super::worker::start_trainer(&config) {
                    Ok(t) => self.current = Some((cell, t, Vec::new())),
                    Err(e) => {
                        self.error = Some(format!("{}: {e}", self.cells[cell].label));
                        break;
                    }
                }
            }
            let Some((cell, t, records)) = &mut self.current else {
                break;
            };
            match t.step() {
                Ok(mut r) => {
                    r.groups = None;
                    records.push(r);
                }
                Err(e) => {
                    self.error = Some(format!("{}: {e}", self.cells[*cell].label));
                    break;
                }
            }
            if t.is_done() {
                let (cell, _, records) = self.current.take().expect("current run");
                self.finished[cell].push(records);
                changed = true;
            }
        }
        if changed {
            self.bands = self.compute_bands();
            self.table = self.compute_table();
        }
        changed
    }

    /// The metrics of the table: the final reward, then the card's report.
    pub fn columns(&self) -> Vec<ReportMetric> {
        std::iter::once(ReportMetric {
            metric: "reward/mean".into(),
            agg: Agg::Final,
        })
        .chain(self.card.report.iter().cloned())
        .collect()
    }

    fn compute_table(&self) -> Vec<TableRow> {
        let columns = self.columns();
        self.cells
            .iter()
            .zip(&self.finished)
            .filter(|(_, runs)| !runs.is_empty())
            .map(|(c, runs)| {
                let per_seed: Vec<Vec<f64>> = runs
                    .iter()
                    .map(|records| {
                        let mut acc = ReportAcc::new(&columns);
                        records.iter().for_each(|r| acc.push(r));
                        acc.finish()
                    })
                    .collect();
                TableRow {
                    label: c.label.clone(),
                    seeds: runs.len(),
                    values: report_over_seeds(&per_seed, columns.len()),
                }
            })
            .collect()
    }

    /// Each cell's bands over the seeds finished so far.
    fn compute_bands(&self) -> CellBands {
        self.cells
            .iter()
            .zip(&self.finished)
            .filter(|(_, runs)| !runs.is_empty())
            .map(|(c, runs)| {
                (
                    format!("{} ({} seeds)", c.label, runs.len()),
                    seed_bands(runs, &self.card.band_metrics()),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every cell × seed runs to its end; the bands hold each cell's seeds, and a cell's
    /// numbers are those of the same config trained on its own.
    #[test]
    fn an_experiment_runs_every_cell_and_seed_in_slices() {
        let mut m = Matrix::from_experiment("lecture-table").unwrap();
        m.seeds = vec![3, 4];
        m.base.run.iterations = 4;
        let mut e = InAppExperiment::of(m.clone()).unwrap();
        let cells = e.cells.len();
        let mut frames = 0;
        while !e.is_done() {
            e.advance(Duration::from_millis(1));
            frames += 1;
            assert!(frames < 100_000);
        }
        assert!(e.error.is_none(), "{:?}", e.error);
        assert_eq!(e.runs_done(), cells * 2);
        let bands = e.bands.clone();
        assert_eq!(e.table.len(), cells);
        assert!(
            e.table
                .iter()
                .all(|r| r.seeds == 2 && r.values[0].0.is_finite())
        );
        assert_eq!(bands.len(), cells);
        for (label, b) in &bands {
            assert!(label.ends_with("(2 seeds)"), "{label}");
            assert_eq!(b["reward/mean"].len(), 4, "{label}");
        }
        // Cell 0, seed 4, on its own.
        let mut config = e.cells[0].config.clone();
        config.run.seed = 4;
        let mut t = super::super::worker::start_trainer(&config).unwrap();
        let mut alone = Vec::new();
        while !t.is_done() {
            let r = t.step().unwrap();
            if r.step_in_iteration == 0 {
                alone.push(r.reward_mean);
            }
        }
        let kept: Vec<f32> = e.finished[0][1]
            .iter()
            .filter(|r| r.step_in_iteration == 0)
            .map(|r| r.reward_mean)
            .collect();
        assert_eq!(kept, alone);
    }
}

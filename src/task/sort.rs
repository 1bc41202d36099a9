//! Prompt sets for sorting: the lecture's fixed prompts, or random prompts, with a
//! held-out split that never meets the training prompts.

use crate::config::TaskConfig;
use crate::rng::SplitMix64;
use std::collections::HashSet;
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum TaskError {
    #[error(
        "task asks for {requested} distinct prompts (train_size + heldout_size) but only {possible} exist for n = {n}, vocab = {vocab}{repeats}"
    )]
    TooFewPrompts {
        requested: u128,
        possible: u128,
        n: usize,
        vocab: usize,
        repeats: &'static str,
    },
}

/// Training and held-out prompts. Every prompt has `n` numbers in `0..vocab`.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSet {
    pub train: Vec<Vec<u32>>,
    pub heldout: Vec<Vec<u32>>,
}

/// The truth for a prompt: `sorted(prompt)`.
pub fn sorted(prompt: &[u32]) -> Vec<u32> {
    let mut s = prompt.to_vec();
    s.sort_unstable();
    s
}

/// `f(sorted(prompt))` with the truth on the stack where the prompt is short (every task's
/// is): a verifier runs once per response, thousands of times an iteration.
pub fn with_sorted<R>(prompt: &[u32], f: impl FnOnce(&[u32]) -> R) -> R {
    let mut buf = [0u32; 64];
    match buf.get_mut(..prompt.len()) {
        Some(s) => {
            s.copy_from_slice(prompt);
            s.sort_unstable();
            f(s)
        }
        None => f(&sorted(prompt)),
    }
}

impl PromptSet {
    /// Build the prompt set of a task; a pure function of the config and the seed.
    pub fn build(task: &TaskConfig, seed: u64) -> Result<Self, TaskError> {
        let mut rng = SplitMix64::for_stream(seed, "prompts");
        let possible = task.prompt_space();
        let fixed: Vec<Vec<u32>> = task.prompts.clone();
        let random_train = if fixed.is_empty() { task.train_size } else { 0 };
        let exclude: HashSet<Vec<u32>> = fixed.iter().cloned().collect();
        let available = task.heldout_room();
        // Random sets must fit whole. Beside fixed prompts the held-out split takes what is
        // left: `validate` refuses a larger task.heldout_size (naming the room), so the cut
        // below only meets a config built in code and never validated.
        let heldout_want = if fixed.is_empty() {
            task.heldout_size
        } else {
            (task.heldout_size as u128).min(available) as usize
        };
        let requested = (random_train + heldout_want) as u128;
        if requested > available {
            return Err(TaskError::TooFewPrompts {
                requested,
                possible: available,
                n: task.n,
                vocab: task.vocab,
                repeats: if task.allow_repeats {
                    ""
                } else {
                    " without repeats"
                },
            });
        }
        let drawn = draw_distinct(
            &mut rng,
            task.n,
            task.vocab,
            task.allow_repeats,
            random_train + heldout_want,
            &exclude,
            possible,
        );
        let (train_part, heldout) = drawn.split_at(random_train);
        let train = if fixed.is_empty() {
            train_part.to_vec()
        } else {
            fixed
        };
        Ok(Self {
            train,
            heldout: heldout.to_vec(),
        })
    }
}

fn random_prompt(rng: &mut SplitMix64, n: usize, vocab: usize, allow_repeats: bool) -> Vec<u32> {
    if allow_repeats {
        (0..n).map(|_| rng.below(vocab as u64) as u32).collect()
    } else {
        let mut pool: Vec<u32> = (0..vocab as u32).collect();
        // Partial Fisher–Yates: the first n of a shuffled pool.
        for i in 0..n {
            let j = i + rng.below((vocab - i) as u64) as usize;
            pool.swap(i, j);
        }
        pool.truncate(n);
        pool
    }
}

fn draw_distinct(
    rng: &mut SplitMix64,
    n: usize,
    vocab: usize,
    allow_repeats: bool,
    count: usize,
    exclude: &HashSet<Vec<u32>>,
    possible: u128,
) -> Vec<Vec<u32>> {
    if count == 0 {
        return Vec::new();
    }
    // Small spaces: enumerate and shuffle (rejection sampling would crawl near the limit).
    if possible <= 4 * count as u128 + exclude.len() as u128 && possible <= 1 << 20 {
        let mut all = Vec::new();
        let mut cur = vec![0u32; n];
        loop {
            let distinct_ok = allow_repeats || {
                let s: HashSet<_> = cur.iter().collect();
                s.len() == n
            };
            if distinct_ok && !exclude.contains(&cur) {
                all.push(cur.clone());
            }
            // Odometer increment.
            let mut i = n;
            loop {
                if i == 0 {
                    rng.shuffle(&mut all);
                    all.truncate(count);
                    return all;
                }
                i -= 1;
                cur[i] += 1;
                if (cur[i] as usize) < vocab {
                    break;
                }
                cur[i] = 0;
            }
        }
    }
    let mut seen: HashSet<Vec<u32>> = exclude.clone();
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let p = random_prompt(rng, n, vocab, allow_repeats);
        if seen.insert(p.clone()) {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(n: usize, vocab: usize, train: usize, heldout: usize, repeats: bool) -> TaskConfig {
        TaskConfig {
            n,
            vocab,
            prompts: vec![],
            train_size: train,
            heldout_size: heldout,
            allow_repeats: repeats,
            ..TaskConfig::default()
        }
    }

    #[test]
    fn splits_are_disjoint_distinct_and_in_range() {
        for (n, vocab, train, held, rep) in [
            (3, 5, 60, 40, true),
            (8, 16, 500, 100, true),
            (4, 6, 200, 100, false),
            (2, 2, 3, 1, true),
        ] {
            let set = PromptSet::build(&task(n, vocab, train, held, rep), 7).unwrap();
            assert_eq!((set.train.len(), set.heldout.len()), (train, held));
            let all: HashSet<_> = set.train.iter().chain(&set.heldout).collect();
            assert_eq!(all.len(), train + held, "prompts repeat or splits meet");
            for p in set.train.iter().chain(&set.heldout) {
                assert_eq!(p.len(), n);
                assert!(p.iter().all(|&x| (x as usize) < vocab));
                if !rep {
                    assert_eq!(p.iter().collect::<HashSet<_>>().len(), n);
                }
            }
        }
    }

    #[test]
    fn deterministic_per_seed() {
        let t = task(5, 10, 100, 20, true);
        assert_eq!(
            PromptSet::build(&t, 1).unwrap(),
            PromptSet::build(&t, 1).unwrap()
        );
        assert_ne!(
            PromptSet::build(&t, 1).unwrap(),
            PromptSet::build(&t, 2).unwrap()
        );
    }

    #[test]
    fn fixed_prompts_keep_heldout_apart() {
        let t = TaskConfig::default();
        let set = PromptSet::build(&t, 0).unwrap();
        assert_eq!(set.train, t.prompts);
        assert_eq!(set.heldout.len(), 32);
        assert!(set.heldout.iter().all(|p| !t.prompts.contains(p)));
    }

    #[test]
    fn too_many_prompts_is_an_error_naming_the_numbers() {
        let e = PromptSet::build(&task(2, 3, 8, 4, true), 0).unwrap_err();
        assert!(
            e.to_string().contains("12") && e.to_string().contains("9"),
            "{e}"
        );
    }

    /// Beside fixed prompts the held-out split may take every prompt left, the room that
    /// `validate` allows: a fixed prompt outside the space (a repeat with
    /// `allow_repeats = false`) takes nothing from it.
    #[test]
    fn heldout_takes_exactly_the_room_validate_allows() {
        let t = TaskConfig {
            prompts: vec![vec![2, 2, 0], vec![1, 0, 2]],
            allow_repeats: false,
            heldout_size: 59,
            ..TaskConfig::default()
        };
        assert_eq!(t.heldout_room(), 59);
        let set = PromptSet::build(&t, 3).unwrap();
        assert_eq!(set.heldout.len(), 59);
        let all: HashSet<_> = set.heldout.iter().chain(&set.train).collect();
        assert_eq!(
            all.len(),
            61,
            "held-out prompts repeat or meet the training ones"
        );
    }
}

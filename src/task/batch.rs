//! The frozen batch of one iteration, the data every engine, the critic and the record read.

/// The frozen batch of one iteration: `B` prompts, `B·G` responses padded to `T`.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub b: usize,
    pub g: usize,
    /// Padded width: `n` for the lecture model, the longest response for the transformer.
    pub t: usize,
    pub n: usize,
    /// `[B·n]`
    pub prompts: Vec<u32>,
    /// `[B·G·T]`, padded with `pad` after each response's end.
    pub responses: Vec<u32>,
    pub pad: u32,
    /// `[B·G·T]`: 1 for real tokens.
    pub mask: Vec<f32>,
    /// Tokens of each response.
    pub lengths: Vec<usize>,
    /// `[B·G·T]` the sampler's support at each token (bit `j` for token `j`), which the learner
    /// renormalises over (`sampling.keep_sampling_mask`); `None`: the full vocabulary.
    pub support: Option<Vec<u64>>,
}

/// A span of a batch's responses and the part of its padded `[B·G·T]` arrays they fill
/// ([`Batch::padded_by`]).
pub struct PadSpan<'a> {
    rows: &'a [Vec<u32>],
    t: usize,
    pad: u32,
    responses: &'a mut [std::mem::MaybeUninit<u32>],
    mask: &'a mut [std::mem::MaybeUninit<f32>],
    filled: bool,
}

impl PadSpan<'_> {
    /// Each row's tokens then `pad` to the width, and its mask (1 on its tokens, 0 after).
    pub fn fill(&mut self) {
        let t = self.t;
        let out = self
            .responses
            .chunks_exact_mut(t)
            .zip(self.mask.chunks_exact_mut(t));
        for (r, (tokens, mask)) in self.rows.iter().zip(out) {
            let real = r.len().min(t);
            let (head, tail) = tokens.split_at_mut(real);
            head.iter_mut().zip(r).for_each(|(x, &v)| _ = x.write(v));
            tail.iter_mut().for_each(|x| _ = x.write(self.pad));
            let (head, tail) = mask.split_at_mut(real);
            head.iter_mut().for_each(|m| _ = m.write(1.0));
            tail.iter_mut().for_each(|m| _ = m.write(0.0));
        }
        self.filled = true;
    }
}

impl Batch {
    /// `B` prompts of `n` tokens (`[B·n]`) and their `B·G` responses, padded with `pad` to the
    /// longest response (at least one position).
    pub fn padded(prompts: Vec<u32>, n: usize, rows: &[Vec<u32>], g: usize, pad: u32) -> Self {
        let whole = rows.len().max(1);
        Self::padded_by(prompts, n, rows, g, pad, whole, |spans| {
            spans.iter_mut().for_each(PadSpan::fill)
        })
    }

    /// [`Batch::padded`] with the responses cut into spans of `span` rows, which `fill` fills
    /// (each with [`PadSpan::fill`]: on threads, where the caller has them).
    ///
    /// # Panics
    /// If `fill` leaves a span unfilled.
    pub fn padded_by(
        prompts: Vec<u32>,
        n: usize,
        rows: &[Vec<u32>],
        g: usize,
        pad: u32,
        span: usize,
        fill: impl FnOnce(&mut [PadSpan]),
    ) -> Self {
        let t = rows.iter().map(|r| r.len()).max().unwrap_or(1).max(1);
        let len = rows.len() * t;
        let mut responses: Vec<u32> = Vec::with_capacity(len);
        let mut mask: Vec<f32> = Vec::with_capacity(len);
        let mut spans: Vec<PadSpan> = (rows.chunks(span.max(1)))
            .zip(responses.spare_capacity_mut()[..len].chunks_mut(span.max(1) * t))
            .zip(mask.spare_capacity_mut()[..len].chunks_mut(span.max(1) * t))
            .map(|((rows, responses), mask)| PadSpan {
                rows,
                t,
                pad,
                responses,
                mask,
                filled: false,
            })
            .collect();
        fill(&mut spans);
        assert!(
            spans.iter().all(|s| s.filled),
            "a span of the batch left unfilled"
        );
        drop(spans);
        // SAFETY: the spans cover the first `len` elements of both, and each span wrote all of
        // its own (checked above).
        unsafe {
            responses.set_len(len);
            mask.set_len(len);
        }
        Self {
            b: rows.len() / g.max(1),
            g,
            t,
            n,
            prompts,
            responses,
            pad,
            mask,
            lengths: rows.iter().map(|r| r.len()).collect(),
            support: None,
        }
    }

    /// Groups `range` (`[k·G, …)` rows) as a batch of their own, at the same padded width.
    pub fn groups(&self, range: std::ops::Range<usize>) -> Batch {
        let (g, t, n) = (self.g, self.t, self.n);
        let rows = range.start * g * t..range.end * g * t;
        Batch {
            b: range.len(),
            g,
            t,
            n,
            prompts: self.prompts[range.start * n..range.end * n].to_vec(),
            responses: self.responses[rows.clone()].to_vec(),
            pad: self.pad,
            mask: self.mask[rows.clone()].to_vec(),
            lengths: self.lengths[range.start * g..range.end * g].to_vec(),
            support: self.support.as_ref().map(|s| s[rows].to_vec()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ragged() -> Vec<Vec<u32>> {
        (0..14u32)
            .map(|i| (0..i % 6).map(|k| 10 * i + k).collect())
            .collect()
    }

    #[test]
    fn a_batch_filled_by_spans_in_any_order_is_the_whole_one() {
        let rows = ragged();
        let prompts: Vec<u32> = (0..7 * 3).collect();
        let whole = Batch::padded(prompts.clone(), 3, &rows, 2, 99);
        assert_eq!(whole.t, 5);
        assert_eq!(
            &whole.responses[..10],
            &[99, 99, 99, 99, 99, 10, 99, 99, 99, 99]
        );
        assert_eq!(&whole.mask[5..10], &[1.0, 0.0, 0.0, 0.0, 0.0]);
        for span in [1, 3, 4, 13, 14, 50] {
            let by = Batch::padded_by(prompts.clone(), 3, &rows, 2, 99, span, |spans| {
                spans.iter_mut().rev().for_each(PadSpan::fill)
            });
            assert_eq!(by.responses, whole.responses, "spans of {span}");
            assert_eq!(by.mask, whole.mask);
            assert_eq!((by.b, by.t, by.lengths), (7, 5, whole.lengths.clone()));
        }
    }

    #[test]
    #[should_panic(expected = "left unfilled")]
    fn a_span_left_unfilled_is_refused() {
        let rows = ragged();
        Batch::padded_by(vec![0; 21], 3, &rows, 2, 99, 4, |spans| {
            spans[1..].iter_mut().for_each(PadSpan::fill)
        });
    }
}

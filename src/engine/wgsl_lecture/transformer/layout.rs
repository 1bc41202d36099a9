//! Where a batch sits in the transformer's device buffers: each block's activations, the
//! flat rows (the prompts' positions once per prompt, then each response position's rows), the
//! per-token regions, the backward's, and the tables of a ragged batch's order in `ints`.

use super::*;

/// One block's activations in `work` (element offsets).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct BlockAt {
    pub(super) xhat1: usize,
    pub(super) rstd1: usize,
    pub(super) a1: usize,
    pub(super) qkv: usize,
    pub(super) att: usize,
    pub(super) ctx: usize,
    pub(super) xhat2: usize,
    pub(super) rstd2: usize,
    pub(super) a2: usize,
    pub(super) hpre: usize,
    pub(super) cdf: usize,
    pub(super) hact: usize,
}

/// Where everything sits in `work` and `ints` for `rows` rows of `T` response tokens answering
/// `b` prompts (`g` rows each, then the greedy rows: `sampled = b·g`).
#[derive(Debug, Clone, Default)]
pub(super) struct TfLayout {
    pub(super) rows: usize,
    pub(super) t: usize,
    pub(super) s: usize,
    pub(super) b: usize,
    pub(super) g: usize,
    /// Flat rows at most: the prompts' positions once per prompt, then the responses' (every
    /// row at every position; a batch of ragged answers holds fewer, [`Self::live`]).
    pub(super) nr: usize,
    /// The rows at each response position `n..s` (`open[p − n]`): the first ones of the batch's
    /// order, longest first ([`Self::arrange`]).
    pub(super) open: Vec<usize>,
    pub(super) x: usize,
    pub(super) blocks: Vec<BlockAt>,
    pub(super) xhatf: usize,
    pub(super) rstdf: usize,
    pub(super) af: usize,
    pub(super) logits: usize,
    pub(super) logz: usize,
    pub(super) logp: usize,
    pub(super) ent: usize,
    pub(super) mask: usize,
    pub(super) coef: usize,
    pub(super) dcoef: usize,
    pub(super) dl: usize,
    pub(super) dx: usize,
    pub(super) da: usize,
    pub(super) dctx: usize,
    pub(super) dqkv: usize,
    pub(super) ds: usize,
    pub(super) dh: usize,
    pub(super) grad: usize,
    pub(super) part: usize,
    pub(super) sums: usize,
    /// A rollout position's logits `[rows, V]` (at its first position, first the prompts'
    /// `[b, V]`), and its log π `[rows·T]`.
    pub(super) step_logits: usize,
    pub(super) prompt_logits: usize,
    pub(super) roll_logp: usize,
    pub(super) len: usize,
    pub(super) i_seq: usize,
    pub(super) i_resp: usize,
    /// A rollout's drawn tokens `[rows]`, then each row's closed flag and length `[2·rows]`.
    pub(super) i_drawn: usize,
    pub(super) i_state: usize,
    /// The tables of the batch's order (see transformer.wgsl's `start`): the first flat row of
    /// each position `n..=s`, each row's rank, each response flat row's row and position,
    /// each row's positions past the prompt.
    pub(super) i_start: usize,
    pub(super) i_rank: usize,
    pub(super) i_row: usize,
    pub(super) i_pos: usize,
    pub(super) i_npos: usize,
    pub(super) ints: usize,
}

impl TfLayout {
    /// The first flat row of position `p` (`p ≤ s`).
    pub(super) fn start(&self, p: usize) -> usize {
        let n = self.n();
        if p < n {
            p * self.b
        } else {
            n * self.b + self.open[..p - n].iter().sum::<usize>()
        }
    }

    /// The flat rows of the batch.
    pub(super) fn live(&self) -> usize {
        self.start(self.s)
    }

    /// The batch order for rows holding `npos[r]` positions past the prompt (`≤ s − n`;
    /// `T − 1` for every row of a rollout or the cold start): longest first, ties in row order.
    /// Returns the rows at each position (for `open`), the order and the tables from
    /// `i_start` on.
    pub(super) fn arrange(&self, npos: &[usize]) -> (Vec<usize>, Vec<usize>, Vec<u32>) {
        let (n, width) = (self.n(), self.s - self.n());
        let mut order: Vec<usize> = (0..self.rows).collect();
        order.sort_by_key(|&r| std::cmp::Reverse(npos[r]));
        let open: Vec<usize> = (0..width)
            .map(|q| npos.iter().filter(|&&c| c > q).count())
            .collect();
        let mut rank = vec![0u32; self.rows];
        for (k, &r) in order.iter().enumerate() {
            rank[r] = k as u32;
        }
        let first = n * self.b;
        let mut starts = Vec::with_capacity(width + 1);
        let (mut row_of, mut pos_of) = (vec![0u32; self.nr - first], vec![0u32; self.nr - first]);
        let mut at = first;
        for (q, &count) in open.iter().enumerate() {
            starts.push(at as u32);
            for (k, &r) in order[..count].iter().enumerate() {
                row_of[at - first + k] = r as u32;
                pos_of[at - first + k] = (n + q) as u32;
            }
            at += count;
        }
        starts.push(at as u32);
        let mut words = starts;
        words.extend(rank);
        words.extend(row_of);
        words.extend(pos_of);
        words.extend(npos.iter().map(|&c| c as u32));
        (open, order, words)
    }

    /// The prompt's length.
    pub(super) fn n(&self) -> usize {
        self.s + 1 - self.t
    }

    /// The flat rows of positions `t0..t1`: the first, and how many.
    pub(super) fn span(&self, (t0, t1): (usize, usize)) -> (usize, usize) {
        (self.start(t0), self.start(t1) - self.start(t0))
    }

    /// The regions of a batch; `params = 0` (a rollout's plan) leaves out the backward's.
    pub(super) fn new(
        shape: &TransformerShape,
        n: usize,
        (rows, b, g): (usize, usize, usize),
        t: usize,
        params: usize,
    ) -> Self {
        let (d, f, v, hh) = (shape.d_model, shape.d_ff, shape.vocab, shape.heads);
        let s = n + t - 1;
        let nr = n * b + (s - n) * rows;
        let mut at = 0usize;
        // Every region from a multiple of 4 elements (the vector paths of matmul.wgsl).
        let mut take = |len: usize| {
            let here = at;
            at = (at + len.max(1)).next_multiple_of(4);
            here
        };
        let x = take(nr * d);
        let blocks = (0..shape.layers)
            .map(|_| BlockAt {
                xhat1: take(nr * d),
                rstd1: take(nr),
                a1: take(nr * d),
                qkv: take(nr * 3 * d),
                att: take(nr * hh * s),
                ctx: take(nr * d),
                xhat2: take(nr * d),
                rstd2: take(nr),
                a2: take(nr * d),
                hpre: take(nr * f),
                cdf: take(nr * f),
                hact: take(nr * f),
            })
            .collect();
        let tokens = rows * t;
        // The backward's regions only with a gradient to hold.
        let nb = if params > 0 { nr } else { 0 };
        let mut l = TfLayout {
            rows,
            t,
            s,
            b,
            g,
            nr,
            open: vec![rows; s - n],
            x,
            blocks,
            xhatf: take(nr * d),
            rstdf: take(nr),
            af: take(nr * d),
            logits: take(nr * v),
            logz: take(tokens),
            logp: take(tokens),
            ent: take(tokens),
            mask: take(tokens),
            coef: take(tokens),
            dcoef: take(tokens),
            dl: take(nb * v),
            dx: take(nb * d),
            da: take(nb * d),
            dctx: take(nb * d),
            dqkv: take(nb * 3 * d),
            ds: take(nb * hh * s),
            dh: take(nb * f),
            grad: take(params),
            part: take(params.div_ceil(CHUNK)),
            sums: take(8),
            step_logits: take(rows * v),
            prompt_logits: take(b * v),
            roll_logp: take(tokens),
            ..Default::default()
        };
        l.len = at;
        l.i_seq = 0;
        l.i_resp = nr;
        l.i_drawn = nr + tokens;
        l.i_state = l.i_drawn + rows;
        l.i_start = l.i_state + 2 * rows;
        l.i_rank = l.i_start + s - n + 1;
        l.i_row = l.i_rank + rows;
        l.i_pos = l.i_row + nr - n * b;
        l.i_npos = l.i_pos + nr - n * b;
        l.ints = l.i_npos + rows;
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ragged_batch_holds_each_row_where_it_predicts() {
        let shape = TransformerShape {
            vocab: 5,
            context: 8,
            d_model: 4,
            heads: 1,
            layers: 1,
            d_ff: 4,
        };
        // Prompts of 2, 2 prompts × 2 responses of up to 4 tokens: positions 2..5 past them.
        let mut at = TfLayout::new(&shape, 2, (4, 2, 2), 4, 0);
        assert_eq!((at.live(), at.nr), (16, 16));
        let (open, order, words) = at.arrange(&[1, 3, 0, 3]);
        assert_eq!(order, [1, 3, 0, 2]);
        assert_eq!(open, [3, 2, 2]);
        let table =
            |words: &[u32], from: usize, len: usize| words[from - at.i_start..][..len].to_vec();
        assert_eq!(table(&words, at.i_start, 4), [4, 7, 9, 11]);
        assert_eq!(table(&words, at.i_rank, 4), [2, 0, 3, 1]);
        assert_eq!(table(&words, at.i_row, 7), [1, 3, 0, 1, 3, 1, 3]);
        assert_eq!(table(&words, at.i_pos, 7), [2, 2, 2, 3, 3, 4, 4]);
        assert_eq!(table(&words, at.i_npos, 4), [1, 3, 0, 3]);
        assert_eq!(words.len(), at.ints - at.i_start);
        // Every row at every position: the order is the rows'.
        let (dense, order, words) = at.arrange(&[3; 4]);
        assert_eq!((&dense, order), (&vec![4; 3], vec![0, 1, 2, 3]));
        assert_eq!(table(&words, at.i_start, 4), [4, 8, 12, 16]);
        assert_eq!(table(&words, at.i_row, 4), [0, 1, 2, 3]);
        at.open = open;
        assert_eq!((at.start(3), at.live()), (7, 11));
    }
}

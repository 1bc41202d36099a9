//! A small decoder-only transformer (GPT-2 shape: pre-LayerNorm blocks of causal
//! multi-head attention and a GELU MLP, learned positions, an untied output head).
//!
//! Tokens: the numbers `0..vocab` and `<eos>` = `vocab`. A sequence is the prompt's `n`
//! numbers followed by the response; the logits at position `n − 1 + t` predict
//! response token `t`, so no separator is needed (the prompt length is fixed).
//! Weights are drawn from our own seeded stream, so a run is the same on every backend.

use crate::rng::SplitMix64;
use burn::module::{Module, Param};
use burn::tensor::activation::{gelu, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};

/// The shape of a transformer policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransformerShape {
    /// Token ids, `<eos>` included (numbers + 1).
    pub vocab: usize,
    /// Longest sequence (prompt + response) the model can read.
    pub context: usize,
    pub d_model: usize,
    pub heads: usize,
    pub layers: usize,
    /// MLP width.
    pub d_ff: usize,
}

#[derive(Module, Debug)]
pub struct Block {
    pub ln1_g: Param<Tensor<1>>,
    pub ln1_b: Param<Tensor<1>>,
    /// `[D, 3D]`: query, key, value.
    pub wqkv: Param<Tensor<2>>,
    /// `[D, D]`
    pub wo: Param<Tensor<2>>,
    pub ln2_g: Param<Tensor<1>>,
    pub ln2_b: Param<Tensor<1>>,
    /// `[D, F]`
    pub w1: Param<Tensor<2>>,
    pub b1: Param<Tensor<1>>,
    /// `[F, D]`
    pub w2: Param<Tensor<2>>,
    pub b2: Param<Tensor<1>>,
}

#[derive(Module, Debug)]
pub struct TransformerPolicy {
    /// `[V, D]`
    pub tok_emb: Param<Tensor<2>>,
    /// `[context, D]`
    pub pos_emb: Param<Tensor<2>>,
    pub blocks: Vec<Block>,
    pub lnf_g: Param<Tensor<1>>,
    pub lnf_b: Param<Tensor<1>>,
    /// `[D, V]`
    pub head: Param<Tensor<2>>,
    pub heads: usize,
}

fn param1(v: Vec<f32>, device: &Device) -> Param<Tensor<1>> {
    let n = v.len();
    Param::from_tensor(Tensor::from_data(TensorData::new(v, [n]), device))
}
fn param2(v: Vec<f32>, shape: [usize; 2], device: &Device) -> Param<Tensor<2>> {
    Param::from_tensor(Tensor::from_data(TensorData::new(v, shape), device))
}

/// LayerNorm over the last dimension (ε = 1e-5, as PyTorch).
fn layer_norm(x: Tensor<3>, g: Tensor<1>, b: Tensor<1>) -> Tensor<3> {
    let [r, s, d] = x.dims();
    let mean = x.clone().mean_dim(2).expand([r, s, d]);
    let centered = x.sub(mean);
    let var = centered
        .clone()
        .powi_scalar(2)
        .mean_dim(2)
        .expand([r, s, d]);
    let normed = centered.div(var.add_scalar(1e-5).sqrt());
    let g = g.reshape([1, 1, d]).expand([r, s, d]);
    let b = b.reshape([1, 1, d]).expand([r, s, d]);
    normed.mul(g).add(b)
}

/// `x [rows, F] + bias [F]`.
fn add_bias(x: Tensor<2>, b: Tensor<1>) -> Tensor<2> {
    let [rows, f] = x.dims();
    x.add(b.reshape([1, f]).expand([rows, f]))
}

impl TransformerPolicy {
    /// GPT-2's init: every matrix `N(0, 0.02)`, the residual projections `N(0, 0.02/√(2L))`,
    /// LayerNorm gains 1 and biases 0; all times `init_scale`.
    pub fn new(shape: TransformerShape, init_scale: f64, seed: u64, device: &Device) -> Self {
        let TransformerShape {
            vocab,
            context,
            d_model: d,
            heads,
            layers,
            d_ff: f,
        } = shape;
        assert!(
            d.is_multiple_of(heads),
            "d_model must be a multiple of heads"
        );
        let mut rng = SplitMix64::for_stream(seed, "transformer-init");
        let mut draw = |count: usize, std: f64| -> Vec<f32> {
            (0..count)
                .map(|_| (rng.normal() * std * init_scale) as f32)
                .collect()
        };
        let std = 0.02;
        let resid = std / ((2 * layers.max(1)) as f64).sqrt();
        let tok_emb = param2(draw(vocab * d, std), [vocab, d], device);
        let pos_emb = param2(draw(context * d, std), [context, d], device);
        let blocks = (0..layers)
            .map(|_| Block {
                ln1_g: param1(vec![1.0; d], device),
                ln1_b: param1(vec![0.0; d], device),
                wqkv: param2(draw(d * 3 * d, std), [d, 3 * d], device),
                wo: param2(draw(d * d, resid), [d, d], device),
                ln2_g: param1(vec![1.0; d], device),
                ln2_b: param1(vec![0.0; d], device),
                w1: param2(draw(d * f, std), [d, f], device),
                b1: param1(vec![0.0; f], device),
                w2: param2(draw(f * d, resid), [f, d], device),
                b2: param1(vec![0.0; d], device),
            })
            .collect();
        Self {
            tok_emb,
            pos_emb,
            blocks,
            lnf_g: param1(vec![1.0; d], device),
            lnf_b: param1(vec![0.0; d], device),
            head: param2(draw(d * vocab, std), [d, vocab], device),
            heads,
        }
    }

    /// A policy with the given weights, flattened in the module's visiting order (`tok_emb`,
    /// `pos_emb`, each block's `ln1_g, ln1_b, wqkv, wo, ln2_g, ln2_b, w1, b1, w2, b2`, `lnf_g`,
    /// `lnf_b`, `head`): what `engine::autodiff::flat_params` returns.
    pub fn from_flat(shape: TransformerShape, flat: &[f32], device: &Device) -> Self {
        let TransformerShape {
            vocab,
            context,
            d_model: d,
            heads,
            layers,
            d_ff: f,
        } = shape;
        let mut at = 0;
        let mut take = |count: usize| -> Vec<f32> {
            let v = flat[at..at + count].to_vec();
            at += count;
            v
        };
        let tok_emb = param2(take(vocab * d), [vocab, d], device);
        let pos_emb = param2(take(context * d), [context, d], device);
        let blocks = (0..layers)
            .map(|_| Block {
                ln1_g: param1(take(d), device),
                ln1_b: param1(take(d), device),
                wqkv: param2(take(d * 3 * d), [d, 3 * d], device),
                wo: param2(take(d * d), [d, d], device),
                ln2_g: param1(take(d), device),
                ln2_b: param1(take(d), device),
                w1: param2(take(d * f), [d, f], device),
                b1: param1(take(f), device),
                w2: param2(take(f * d), [f, d], device),
                b2: param1(take(d), device),
            })
            .collect();
        let (lnf_g, lnf_b) = (param1(take(d), device), param1(take(d), device));
        let head = param2(take(d * vocab), [d, vocab], device);
        assert_eq!(at, flat.len(), "flat weights of another shape");
        Self {
            tok_emb,
            pos_emb,
            blocks,
            lnf_g,
            lnf_b,
            head,
            heads,
        }
    }

    pub fn context(&self) -> usize {
        self.pos_emb.val().dims()[0]
    }
    pub fn vocab(&self) -> usize {
        self.tok_emb.val().dims()[0]
    }

    /// `tokens [R, S]` → `logits [R, S, V]`; position `i` sees positions `0..=i` only.
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let [r, s] = tokens.dims();
        let [_, d] = self.tok_emb.val().dims();
        assert!(
            s <= self.context(),
            "sequence of {s} tokens is longer than the model's context of {}",
            self.context()
        );
        let device = tokens.device();
        let h = self.heads;
        let dh = d / h;
        let pos = self
            .pos_emb
            .val()
            .narrow(0, 0, s)
            .reshape([1, s, d])
            .expand([r, s, d]);
        let mut x = self
            .tok_emb
            .val()
            .select(0, tokens.reshape([r * s]))
            .reshape([r, s, d])
            .add(pos);
        // Causal mask: −1e9 above the diagonal (exp underflows to exactly 0).
        let mask: Vec<f32> = (0..s * s)
            .map(|i| if i % s > i / s { -1e9 } else { 0.0 })
            .collect();
        let mask = Tensor::<2>::from_data(TensorData::new(mask, [s, s]), &device)
            .reshape([1, 1, s, s])
            .expand([r, h, s, s]);
        let scale = 1.0 / (dh as f32).sqrt();
        for blk in &self.blocks {
            let a = layer_norm(x.clone(), blk.ln1_g.val(), blk.ln1_b.val());
            let qkv = a
                .reshape([r * s, d])
                .matmul(blk.wqkv.val())
                .reshape([r, s, 3 * d]);
            let heads_of = |t: Tensor<3>| t.reshape([r, s, h, dh]).swap_dims(1, 2); // [R, H, S, dh]
            let q = heads_of(qkv.clone().narrow(2, 0, d));
            let k = heads_of(qkv.clone().narrow(2, d, d));
            let v = heads_of(qkv.narrow(2, 2 * d, d));
            let att = softmax(
                q.matmul(k.swap_dims(2, 3))
                    .mul_scalar(scale)
                    .add(mask.clone()),
                3,
            );
            let y = att
                .matmul(v)
                .swap_dims(1, 2)
                .reshape([r * s, d])
                .matmul(blk.wo.val())
                .reshape([r, s, d]);
            x = x.add(y);
            let m = layer_norm(x.clone(), blk.ln2_g.val(), blk.ln2_b.val()).reshape([r * s, d]);
            let m = gelu(add_bias(m.matmul(blk.w1.val()), blk.b1.val()));
            let m = add_bias(m.matmul(blk.w2.val()), blk.b2.val()).reshape([r, s, d]);
            x = x.add(m);
        }
        let [_, vocab] = self.head.val().dims();
        layer_norm(x, self.lnf_g.val(), self.lnf_b.val())
            .reshape([r * s, d])
            .matmul(self.head.val())
            .reshape([r, s, vocab])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> TransformerShape {
        TransformerShape {
            vocab: 6,
            context: 8,
            d_model: 8,
            heads: 2,
            layers: 2,
            d_ff: 16,
        }
    }

    fn tokens(rows: &[&[i64]], device: &Device) -> Tensor<2, Int> {
        let s = rows[0].len();
        let flat: Vec<i64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_data(TensorData::new(flat, [rows.len(), s]), device)
    }

    /// Changing a later token never changes earlier positions' logits (the mask is causal),
    /// and a prefix gives the same logits as the full sequence on the shared positions.
    #[test]
    fn causal_and_prefix_consistent() {
        let device = Device::flex();
        let m = TransformerPolicy::new(shape(), 10.0, 1, &device);
        let a = m
            .forward(tokens(&[&[1, 2, 3, 4, 5]], &device))
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let b = m
            .forward(tokens(&[&[1, 2, 3, 0, 0]], &device))
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let p = m
            .forward(tokens(&[&[1, 2, 3]], &device))
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let v = 6;
        for i in 0..3 * v {
            assert!((a[i] - b[i]).abs() < 1e-5, "{} vs {}", a[i], b[i]);
            assert!((a[i] - p[i]).abs() < 1e-5, "{} vs {}", a[i], p[i]);
        }
        assert!((3 * v..5 * v).any(|i| (a[i] - b[i]).abs() > 1e-4));
    }

    #[test]
    fn init_is_seeded() {
        let device = Device::flex();
        let w = |seed| {
            TransformerPolicy::new(shape(), 1.0, seed, &device)
                .head
                .val()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap()
        };
        assert_eq!(w(3), w(3));
        assert_ne!(w(3), w(4));
    }
}

//! The lecture's per-position policy (CS336 lecture 17; GRPO-SPEC §6).
//!
//! A prompt of `n` numbers is embedded (`[V, D]`), each position transformed by its own
//! encode matrix and summed into one vector; each response position has its own decode
//! matrix; logits come back through the shared embedding. Response positions are
//! decoded independently: the response does not condition on itself.

use crate::rng::SplitMix64;
use burn::module::{Module, Param};
use burn::tensor::{Device, Int, Tensor, TensorData};

#[derive(Module, Debug)]
pub struct LecturePolicy {
    /// Token embedding, shared by input and output: `[V, D]`.
    pub embedding: Param<Tensor<2>>,
    /// One `D×D` matrix per prompt position: `[n, D, D]`.
    pub encode: Param<Tensor<3>>,
    /// One `D×D` matrix per response position: `[n, D, D]`.
    pub decode: Param<Tensor<3>>,
}

/// The initial weights as plain numbers (row-major), a pure function of shape, scale and seed.
/// The embedding is `N(0, 1)` (PyTorch's `nn.Embedding`), the matrices `N(0, 1)/√D`, as in the
/// lecture's code; all times `init_scale`.
pub struct LectureWeights {
    pub embedding: Vec<f32>,
    pub encode: Vec<f32>,
    pub decode: Vec<f32>,
}

impl LectureWeights {
    pub fn init(vocab: usize, n: usize, d: usize, init_scale: f64, seed: u64) -> Self {
        let mut rng = SplitMix64::for_stream(seed, "lecture-init");
        let mut draw = |count: usize, scale: f64| -> Vec<f32> {
            (0..count).map(|_| (rng.normal() * scale) as f32).collect()
        };
        let matrix_scale = init_scale / (d as f64).sqrt();
        Self {
            embedding: draw(vocab * d, init_scale),
            encode: draw(n * d * d, matrix_scale),
            decode: draw(n * d * d, matrix_scale),
        }
    }
}

impl LecturePolicy {
    pub fn new(
        vocab: usize,
        n: usize,
        d: usize,
        init_scale: f64,
        seed: u64,
        device: &Device,
    ) -> Self {
        Self::from_weights(
            &LectureWeights::init(vocab, n, d, init_scale, seed),
            vocab,
            n,
            d,
            device,
        )
    }

    pub fn from_weights(
        w: &LectureWeights,
        vocab: usize,
        n: usize,
        d: usize,
        device: &Device,
    ) -> Self {
        let t2 = |v: &Vec<f32>, s: [usize; 2]| {
            Tensor::<2>::from_data(TensorData::new(v.clone(), s), device)
        };
        let t3 = |v: &Vec<f32>, s: [usize; 3]| {
            Tensor::<3>::from_data(TensorData::new(v.clone(), s), device)
        };
        Self {
            embedding: Param::from_tensor(t2(&w.embedding, [vocab, d])),
            encode: Param::from_tensor(t3(&w.encode, [n, d, d])),
            decode: Param::from_tensor(t3(&w.decode, [n, d, d])),
        }
    }

    /// The weights as plain numbers.
    pub fn weights(&self) -> LectureWeights {
        let v = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().expect("f32 weights");
        let v3 = |t: Tensor<3>| t.into_data().try_to_vec::<f32>().expect("f32 weights");
        LectureWeights {
            embedding: v(self.embedding.val()),
            encode: v3(self.encode.val()),
            decode: v3(self.decode.val()),
        }
    }

    /// A real copy of the weights, detached from autodiff, on `device`: the reference policy.
    pub fn snapshot(&self, device: &Device) -> Self {
        let [vocab, d] = self.embedding.val().dims();
        let [n, _, _] = self.encode.val().dims();
        Self::from_weights(&self.weights(), vocab, n, d, device).no_grad()
    }

    /// `Σ ‖∇‖²` over every parameter, as a one-element tensor (no read-back).
    pub fn grad_norm_sq(&self, grads: &burn::optim::GradientsParams) -> Tensor<1> {
        let sq2 = |id| grads.get::<2>(id).map(|g| g.powi_scalar(2).sum());
        let sq3 = |id| grads.get::<3>(id).map(|g| g.powi_scalar(2).sum());
        let device = self.embedding.val().device();
        [
            sq2(self.embedding.id),
            sq3(self.encode.id),
            sq3(self.decode.id),
        ]
        .into_iter()
        .flatten()
        .fold(Tensor::<1>::zeros([1], &device), |acc, x| acc.add(x))
    }

    /// Every gradient times `factor` (global-norm clipping).
    pub fn scale_grads(
        &self,
        mut grads: burn::optim::GradientsParams,
        factor: f32,
    ) -> burn::optim::GradientsParams {
        if let Some(g) = grads.remove::<2>(self.embedding.id) {
            grads.register(self.embedding.id, g.mul_scalar(factor));
        }
        for id in [self.encode.id, self.decode.id] {
            if let Some(g) = grads.remove::<3>(id) {
                grads.register(id, g.mul_scalar(factor));
            }
        }
        grads
    }

    /// `prompts [B, n]` → `logits [B, n, V]`, one distribution per response position.
    pub fn forward(&self, prompts: Tensor<2, Int>) -> Tensor<3> {
        let [b, n] = prompts.dims();
        let embedding = self.embedding.val(); // [V, D]
        let [vocab, d] = embedding.dims();
        // embeddings: [B, n, D] → [B, n·D]
        let emb = embedding
            .clone()
            .select(0, prompts.reshape([b * n]))
            .reshape([b, n * d]);
        // encoded[b, d2] = Σ_{p, d1} emb[b, p, d1] · encode[p, d1, d2]      → [B, D]
        let encoded = emb.matmul(self.encode.val().reshape([n * d, d]));
        // decoded[b, p, d1] = Σ_{d2} encoded[b, d2] · decode[p, d2, d1]     → [B, n·D]
        let decode = self.decode.val().swap_dims(0, 1).reshape([d, n * d]);
        let decoded = encoded.matmul(decode).reshape([b * n, d]);
        // logits[b, p, v] = Σ_{d1} decoded[b, p, d1] · embedding[v, d1]     → [B, n, V]
        decoded.matmul(embedding.transpose()).reshape([b, n, vocab])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forward pass against the lecture's einsums written out as loops.
    #[test]
    #[allow(clippy::needless_range_loop)] // the einsums' indices, as the lecture writes them
    fn forward_matches_einsum_loops() {
        let (vocab, n, d) = (5, 3, 4);
        let device = Device::flex();
        let w = LectureWeights::init(vocab, n, d, 1.0, 3);
        let model = LecturePolicy::from_weights(&w, vocab, n, d, &device);
        let prompts = [[1u32, 0, 2], [3, 2, 4]];
        let pt = Tensor::<2, Int>::from_data(
            TensorData::new(
                prompts
                    .iter()
                    .flatten()
                    .map(|&x| x as i64)
                    .collect::<Vec<_>>(),
                [2, n],
            ),
            &device,
        );
        let logits = model.forward(pt).into_data().try_to_vec::<f32>().unwrap();
        for (b, prompt) in prompts.iter().enumerate() {
            let mut enc = vec![0f32; d];
            for p in 0..n {
                for d1 in 0..d {
                    for d2 in 0..d {
                        enc[d2] += w.embedding[prompt[p] as usize * d + d1]
                            * w.encode[(p * d + d1) * d + d2];
                    }
                }
            }
            for p in 0..n {
                let mut dec = vec![0f32; d];
                for d2 in 0..d {
                    for d1 in 0..d {
                        dec[d1] += enc[d2] * w.decode[(p * d + d2) * d + d1];
                    }
                }
                for v in 0..vocab {
                    let want: f32 = (0..d).map(|d1| dec[d1] * w.embedding[v * d + d1]).sum();
                    let got = logits[(b * n + p) * vocab + v];
                    assert!(
                        (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn init_is_seeded_and_scaled() {
        let a = LectureWeights::init(5, 3, 10, 1.0, 5);
        assert_eq!(
            a.embedding,
            LectureWeights::init(5, 3, 10, 1.0, 5).embedding
        );
        assert_ne!(
            a.embedding,
            LectureWeights::init(5, 3, 10, 1.0, 6).embedding
        );
        let var = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / v.len() as f64;
        let big = LectureWeights::init(50, 8, 64, 1.0, 1);
        assert!((var(&big.embedding) - 1.0).abs() < 0.1);
        assert!((var(&big.encode) - 1.0 / 64.0).abs() < 0.01 / 6.4);
    }

    #[test]
    fn snapshot_is_a_real_copy() {
        let device = Device::flex();
        let m = LecturePolicy::new(5, 3, 4, 1.0, 0, &device);
        let s = m.snapshot(&device);
        assert_eq!(s.weights().embedding, m.weights().embedding);
        assert_eq!(s.weights().decode, m.weights().decode);
    }
}

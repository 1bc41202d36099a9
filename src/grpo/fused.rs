//! A fused CPU path for the lecture model's optimizer step: forward, loss, backward and Adam
//! written out by hand over plain buffers, with every matrix product through `gemm` (the
//! crate burn's CPU backend uses too), and no autodiff graph, no tensor allocations per op.
//!
//! For a policy this small a burn step is mostly framework overhead; this path does the same
//! arithmetic (nine matrix products per step) and nothing else. It is held equal to the burn
//! path by `tests/fused.rs` (same weights after several iterations within a stated tolerance)
//! and is used only for configurations it covers (`FusedLecture::supports`).

use crate::config::{KlEstimator, LossMode, ModelKind, RunConfig};
use crate::grpo::loss::LossSettings;
use crate::model::lecture::LectureWeights;

/// `A · B` (row-major, `[m, k] · [k, n]` → `[m, n]`), `A` or `B` read transposed when asked.
fn product(
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
    a_transposed: bool,
    b_transposed: bool,
) -> Vec<f32> {
    assert!(a.len() >= m * k && b.len() >= k * n);
    let mut c = vec![0.0f32; m * n];
    let (a_cs, a_rs) = if a_transposed {
        (m as isize, 1)
    } else {
        (1, k as isize)
    };
    let (b_cs, b_rs) = if b_transposed {
        (k as isize, 1)
    } else {
        (1, n as isize)
    };
    // SAFETY: `a` and `b` hold at least m·k and k·n values (asserted above), `c` holds m·n,
    // and the strides describe those row-major layouts.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    c
}

/// `exp(x)` for a max-shifted logit (`x ≤ 0`); below −80 it is 0 to f32 precision anyway,
/// and skipping the call avoids libm's slow underflow path.
#[inline]
fn exp_shifted(x: f32) -> f32 {
    if x < -80.0 { 0.0 } else { x.exp() }
}

/// `(log Σ exp(x/T), Σ exp(x/T − max))` of one row; the shifted weights go to `out` if given.
fn log_z(row: &[f32], inv_t: f32, mut out: Option<&mut [f32]>) -> (f32, f32) {
    let m = row.iter().fold(f32::MIN, |a, &x| a.max(x * inv_t));
    let mut sum = 0.0f32;
    for (i, &x) in row.iter().enumerate() {
        let e = exp_shifted(x * inv_t - m);
        if let Some(o) = out.as_deref_mut() {
            o[i] = e;
        }
        sum += e;
    }
    (m + sum.ln(), sum)
}

/// The scalars one optimizer step reports (on either path).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepScalars {
    pub loss: f32,
    pub kl: f32,
    pub clip_low: f32,
    pub clip_high: f32,
    pub ratio_mean: f32,
    pub entropy: f32,
    pub grad_norm: f32,
}

/// Adam's state for one parameter array, as burn's `Adam` keeps it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdamMoments {
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

/// The lecture model's weights and Adam state on the host, with scratch buffers.
#[derive(Debug, Clone)]
pub struct FusedLecture {
    pub vocab: usize,
    pub n: usize,
    pub d: usize,
    /// `[V, D]`
    pub embedding: Vec<f32>,
    /// `[n·D, D]` (the lecture's `[n, D, D]` layout).
    pub encode: Vec<f32>,
    /// `[D, n·D]`: `decode[p, d2, d1]` at `d2·nD + p·D + d1` (the matrix the forward multiplies).
    pub decode_t: Vec<f32>,
    /// Adam moments of embedding, encode, decode_t; the step count.
    pub adam: [AdamMoments; 3],
    pub time: i32,
    beta1: f32,
    beta2: f32,
    eps: f32,
}

/// Forward activations of a batch.
struct Forward {
    /// `[B, n·D]`
    e: Vec<f32>,
    /// `[B, D]`
    enc: Vec<f32>,
    /// `[B, n·D]` = `[B·n, D]`
    dec: Vec<f32>,
    /// `[B·n, V]`
    logits: Vec<f32>,
}

impl FusedLecture {
    /// Whether this path computes exactly what the configured burn step computes.
    pub fn supports(c: &RunConfig) -> bool {
        let a = &c.algorithm;
        c.model.kind == ModelKind::Lecture && !a.bugs.any() && a.entropy_coef == 0.0
    }

    pub fn new(w: &LectureWeights, vocab: usize, n: usize, d: usize, c: &RunConfig) -> Self {
        let o = &c.optimizer;
        let mut s = Self {
            vocab,
            n,
            d,
            embedding: Vec::new(),
            encode: Vec::new(),
            decode_t: Vec::new(),
            adam: Default::default(),
            time: 0,
            beta1: o.beta1 as f32,
            beta2: o.beta2 as f32,
            eps: o.eps as f32,
        };
        s.set_weights(w);
        s.adam = [s.embedding.len(), s.encode.len(), s.decode_t.len()].map(|len| AdamMoments {
            m: vec![0.0; len],
            v: vec![0.0; len],
        });
        s
    }

    /// Load weights in the lecture's layout.
    pub fn set_weights(&mut self, w: &LectureWeights) {
        let (n, d) = (self.n, self.d);
        self.embedding = w.embedding.clone();
        self.encode = w.encode.clone();
        self.decode_t = vec![0.0; n * d * d];
        for p in 0..n {
            for d2 in 0..d {
                for d1 in 0..d {
                    self.decode_t[d2 * n * d + p * d + d1] = w.decode[(p * d + d2) * d + d1];
                }
            }
        }
    }

    /// The weights in the lecture's layout.
    pub fn weights(&self) -> LectureWeights {
        let (n, d) = (self.n, self.d);
        let mut decode = vec![0.0; n * d * d];
        for p in 0..n {
            for d2 in 0..d {
                for d1 in 0..d {
                    decode[(p * d + d2) * d + d1] = self.decode_t[d2 * n * d + p * d + d1];
                }
            }
        }
        LectureWeights {
            embedding: self.embedding.clone(),
            encode: self.encode.clone(),
            decode,
        }
    }

    fn forward(&self, prompts: &[u32]) -> Forward {
        let (n, d, v) = (self.n, self.d, self.vocab);
        let b = prompts.len() / n;
        let mut e = vec![0.0f32; b * n * d];
        for (i, &tok) in prompts.iter().enumerate() {
            let t = tok as usize;
            e[i * d..(i + 1) * d].copy_from_slice(&self.embedding[t * d..(t + 1) * d]);
        }
        let enc = product(&e, &self.encode, (b, n * d, d), false, false);
        let dec = product(&enc, &self.decode_t, (b, d, n * d), false, false);
        let logits = product(&dec, &self.embedding, (b * n, d, v), false, true);
        Forward {
            e,
            enc,
            dec,
            logits,
        }
    }

    /// Adam's state as bytes: the step count, then m and v of each array (f32, little-endian).
    pub fn adam_bytes(&self) -> Vec<u8> {
        let mut out = self.time.to_le_bytes().to_vec();
        for st in &self.adam {
            for x in st.m.iter().chain(&st.v) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out
    }

    /// Restore what `adam_bytes` wrote (for these shapes).
    pub fn load_adam_bytes(&mut self, bytes: &[u8]) -> Result<(), String> {
        let want = 4 + self.adam.iter().map(|a| 8 * a.m.len()).sum::<usize>();
        if bytes.len() != want {
            return Err(format!(
                "fused_adam.bin holds {} bytes, expected {want} for this model",
                bytes.len()
            ));
        }
        self.time = i32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        let mut floats = bytes[4..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")));
        for st in &mut self.adam {
            for x in st.m.iter_mut().chain(st.v.iter_mut()) {
                *x = floats.next().expect("sized above");
            }
        }
        Ok(())
    }

    /// `log π` at `temperature` of every response token: `prompts [B·n]`, `responses
    /// [B·G·n]` → `[B·G·n]`, computed exactly as `step` computes it.
    pub fn token_logp(&self, prompts: &[u32], responses: &[u32], temperature: f32) -> Vec<f32> {
        let (n, v) = (self.n, self.vocab);
        let b = prompts.len() / n;
        let g = responses.len() / (b * n);
        let f = self.forward(prompts);
        let inv_t = 1.0 / temperature;
        let logz: Vec<f32> = f
            .logits
            .chunks(v)
            .map(|row| log_z(row, inv_t, None).0)
            .collect();
        let mut out = vec![0.0f32; responses.len()];
        for bi in 0..b {
            for gi in 0..g {
                for p in 0..n {
                    let t = (bi * g + gi) * n + p;
                    let r = bi * n + p;
                    out[t] = f.logits[r * v + responses[t] as usize] * inv_t - logz[r];
                }
            }
        }
        out
    }

    /// `logits [B, n, V]` of the current weights (for rollouts and evaluation).
    pub fn logits(&self, prompts: &[u32]) -> Vec<f32> {
        self.forward(prompts).logits
    }

    /// One optimizer step of the GRPO loss on a fixed-length batch.
    /// `prompts [B·n]`, `responses [B·G·n]`, `advantages [B·G]`, `old_logp`/`ref_logp [B·G·n]`.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        prompts: &[u32],
        responses: &[u32],
        advantages: &[f32],
        old_logp: &[f32],
        ref_logp: &[f32],
        s: &LossSettings,
        temperature: f32,
        lr: f64,
        max_grad_norm: f32,
    ) -> (StepScalars, Vec<f32>) {
        let (n, d, v) = (self.n, self.d, self.vocab);
        let b = prompts.len() / n;
        let g = advantages.len() / b;
        let f = self.forward(prompts);
        // Softmax of each (prompt, position) row at the temperature; entropy per row.
        let rows = b * n;
        let mut probs = vec![0.0f32; rows * v];
        let mut logz = vec![0.0f32; rows];
        let mut entropy = 0.0f64;
        let inv_t = 1.0 / temperature;
        for r in 0..rows {
            let row = &f.logits[r * v..(r + 1) * v];
            let prow = &mut probs[r * v..(r + 1) * v];
            let (lz, total) = log_z(row, inv_t, Some(prow));
            logz[r] = lz;
            let mut h = 0.0f32;
            for (p, &x) in prow.iter_mut().zip(row) {
                *p /= total;
                if *p > 0.0 {
                    h -= *p * (x * inv_t - lz);
                }
            }
            entropy += h as f64;
        }
        // Per-token loss terms and dL/dlogp; every aggregation is the mean over B·G·n tokens
        // when all responses have n tokens.
        let tokens = b * g * n;
        let w = 1.0 / tokens as f32;
        let mut dlogits = vec![0.0f32; rows * v];
        let mut token_logp = vec![0.0f32; tokens];
        let mut row_coef = vec![0.0f32; rows];
        let (mut loss, mut kl_sum, mut low, mut high, mut ratio_sum) =
            (0.0f64, 0.0f64, 0usize, 0usize, 0.0f64);
        let kl_on = s.kl_in_loss && s.beta > 0.0;
        for bi in 0..b {
            for gi in 0..g {
                let adv = advantages[bi * g + gi];
                for p in 0..n {
                    let t = (bi * g + gi) * n + p;
                    let r = bi * n + p;
                    let tok = responses[t] as usize;
                    let logp = f.logits[r * v + tok] * inv_t - logz[r];
                    token_logp[t] = logp;
                    let ratio = (logp - old_logp[t]).exp();
                    let (term, mut dterm) = match s.mode {
                        LossMode::Naive => (-adv * logp, -adv),
                        LossMode::Unclipped => (-adv * ratio, -adv * ratio),
                        LossMode::Clipped => {
                            let clipped = ratio.clamp(1.0 - s.epsilon_low, 1.0 + s.epsilon_high);
                            let (u, c) = (ratio * adv, clipped * adv);
                            if u <= c {
                                (-u, -adv * ratio)
                            } else if ratio > 1.0 - s.epsilon_low && ratio < 1.0 + s.epsilon_high {
                                (-c, -adv * ratio)
                            } else {
                                (-c, 0.0)
                            }
                        }
                    };
                    let delta = ref_logp[t] - logp;
                    let (k, dk) = match s.kl_estimator {
                        KlEstimator::K1 => (-delta, 1.0),
                        KlEstimator::K2 => (delta * delta / 2.0, -delta),
                        KlEstimator::K3 => (delta.exp() - delta - 1.0, 1.0 - delta.exp()),
                    };
                    let mut total = term;
                    if kl_on {
                        total += s.beta * k;
                        dterm += s.beta * dk;
                    }
                    loss += (total * w) as f64;
                    kl_sum += k as f64;
                    ratio_sum += ratio as f64;
                    low += (ratio < 1.0 - s.epsilon_low && adv < 0.0) as usize;
                    high += (ratio > 1.0 + s.epsilon_high && adv > 0.0) as usize;
                    // d logp / d logits = (onehot − softmax) / T: the one-hot part now, the
                    // softmax part once per row with the summed coefficient below.
                    let coef = dterm * w * inv_t;
                    dlogits[r * v + tok] += coef;
                    row_coef[r] += coef;
                }
            }
        }
        for r in 0..rows {
            let c = row_coef[r];
            let drow = &mut dlogits[r * v..(r + 1) * v];
            for (dl, &pr) in drow.iter_mut().zip(&probs[r * v..(r + 1) * v]) {
                *dl -= c * pr;
            }
        }
        // Backward through the three products.
        let mut d_emb = product(&dlogits, &f.dec, (v, rows, d), true, false);
        let d_dec = product(&dlogits, &self.embedding, (rows, v, d), false, false);
        let d_decode_t = product(&f.enc, &d_dec, (d, b, n * d), true, false);
        let d_enc = product(&d_dec, &self.decode_t, (b, n * d, d), false, true);
        let d_encode = product(&f.e, &d_enc, (n * d, b, d), true, false);
        let d_e = product(&d_enc, &self.encode, (b, d, n * d), false, true);
        for (i, &tok) in prompts.iter().enumerate() {
            let t = tok as usize;
            for k in 0..d {
                d_emb[t * d + k] += d_e[i * d + k];
            }
        }
        let grad_sq: f32 = [&d_emb, &d_encode, &d_decode_t]
            .iter()
            .map(|gr| gr.iter().map(|x| x * x).sum::<f32>())
            .sum();
        let grad_norm = grad_sq.sqrt();
        let scale = if max_grad_norm > 0.0 && grad_norm > max_grad_norm {
            max_grad_norm / grad_norm
        } else {
            1.0
        };
        // Adam, as burn's: m̂/(√v + ε·√(1−β2^t)) · √(1−β2^t)/(1−β1^t).
        self.time += 1;
        let bc2 = (1.0 - self.beta2.powi(self.time)).sqrt();
        let factor = bc2 / (1.0 - self.beta1.powi(self.time));
        let lr = lr as f32;
        let (b1, b2, eps) = (self.beta1, self.beta2, self.eps);
        for (param, (grad, st)) in [&mut self.embedding, &mut self.encode, &mut self.decode_t]
            .into_iter()
            .zip(
                [d_emb, d_encode, d_decode_t]
                    .iter()
                    .zip(self.adam.iter_mut()),
            )
        {
            for i in 0..param.len() {
                let gr = grad[i] * scale;
                st.m[i] = st.m[i] * b1 + gr * (1.0 - b1);
                st.v[i] = st.v[i] * b2 + gr * gr * (1.0 - b2);
                let update = st.m[i] * factor / (st.v[i].sqrt() + eps * bc2);
                param[i] -= update * lr;
            }
        }
        let scalars = StepScalars {
            loss: loss as f32,
            kl: (kl_sum / tokens as f64) as f32,
            clip_low: low as f32 / tokens as f32,
            clip_high: high as f32 / tokens as f32,
            ratio_mean: (ratio_sum / tokens as f64) as f32,
            entropy: (entropy / rows as f64) as f32,
            grad_norm,
        };
        (scalars, token_logp)
    }
}

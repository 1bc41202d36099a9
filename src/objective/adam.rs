//! Adam, once for every CPU engine (the fused lecture step, the fused transformer, the WGSL
//! kernels' host reference) and the critic, in burn's form:
//! `x −= lr · m·f / (√v + ε·√(1−β2^t))` with `f = √(1−β2^t)/(1−β1^t)`, the gradient times the
//! global-norm clipping `scale`. `shaders/lecture_step.wgsl`'s `adam` is its WGSL mirror.

/// Adam's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
}

/// Everything one update of one element needs: the hyperparameters, the bias corrections of
/// step `t`, the learning rate and the clipping scale.
#[derive(Debug, Clone, Copy)]
pub struct AdamStep {
    pub b1: f32,
    pub b2: f32,
    pub eps: f32,
    /// `√(1−β2^t)`
    pub bc2: f32,
    /// `√(1−β2^t)/(1−β1^t)`
    pub factor: f32,
    pub lr: f32,
    /// The gradient's global-norm clipping factor (1 = none).
    pub scale: f32,
}

impl AdamStep {
    /// Step `time` (1 for the first) of Adam with `h`.
    pub fn at(h: &Hyper, time: i32, lr: f32, scale: f32) -> Self {
        let (bc2, factor) = corrections(h, time);
        Self {
            b1: h.beta1,
            b2: h.beta2,
            eps: h.eps,
            bc2,
            factor,
            lr,
            scale,
        }
    }

    /// One element: its moments move, then the weight.
    #[inline(always)]
    pub fn element(&self, x: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
        let gs = g * self.scale;
        *m = *m * self.b1 + gs * (1.0 - self.b1);
        *v = *v * self.b2 + gs * gs * (1.0 - self.b2);
        let update = *m * self.factor / (v.sqrt() + self.eps * self.bc2);
        *x -= update * self.lr;
    }

    /// Every element of `w` (inlined, so the fused engines' AVX2 bodies vectorize it).
    #[inline(always)]
    pub fn apply(&self, w: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32]) {
        for (((x, &g), m), v) in w.iter_mut().zip(grad).zip(m).zip(v) {
            self.element(x, g, m, v);
        }
    }
}

/// Adam's bias corrections at step `time`: `(√(1−β2^t), √(1−β2^t)/(1−β1^t))`.
pub fn corrections(h: &Hyper, time: i32) -> (f32, f32) {
    let bc2 = (1.0 - h.beta2.powi(time)).sqrt();
    (bc2, bc2 / (1.0 - h.beta1.powi(time)))
}

/// Adam's state over flat weights, with one step count for them all (every parameter gets a
/// gradient at every step).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdamState {
    pub m: Vec<f32>,
    pub v: Vec<f32>,
    pub time: i32,
}

impl AdamState {
    pub fn new(len: usize) -> Self {
        Self {
            m: vec![0.0; len],
            v: vec![0.0; len],
            time: 0,
        }
    }

    /// One step over `w`.
    pub fn step(&mut self, w: &mut [f32], grad: &[f32], scale: f32, lr: f32, h: &Hyper) {
        self.time += 1;
        AdamStep::at(h, self.time, lr, scale).apply(w, grad, &mut self.m, &mut self.v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook form `x −= lr·m̂/(√v̂ + ε̂)`, with ε̂ = ε (burn's ε sits inside the
    /// corrections: the same update, in another rounding), in f64.
    #[test]
    fn matches_the_textbook_update() {
        let h = Hyper {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        let mut s = AdamState::new(3);
        let mut w = [0.5f32, -1.0, 2.0];
        let (mut m, mut v, mut x) = ([0f64; 3], [0f64; 3], w.map(f64::from));
        for t in 1..=5 {
            let g = [0.1f32 * t as f32, -0.3, 0.0];
            s.step(&mut w, &g, 0.5, 0.01, &h);
            for i in 0..3 {
                let gs = g[i] as f64 * 0.5;
                m[i] = 0.9 * m[i] + 0.1 * gs;
                v[i] = 0.999 * v[i] + 0.001 * gs * gs;
                let (mh, vh) = (
                    m[i] / (1.0 - 0.9f64.powi(t)),
                    v[i] / (1.0 - 0.999f64.powi(t)),
                );
                x[i] -= 0.01 * mh / (vh.sqrt() + 1e-8);
                assert!(
                    (w[i] as f64 - x[i]).abs() < 1e-6,
                    "t {t} i {i}: {} vs {}",
                    w[i],
                    x[i]
                );
            }
        }
        assert_eq!(s.time, 5);
    }
}

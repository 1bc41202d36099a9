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
    ///
    /// No subnormal number enters or leaves the moments: a gradient too small for its share
    /// of `m` (`|g·s|·(1−β1)`) or of `v` (`(g·s)²·(1−β2)`) to be a normal f32 adds nothing to
    /// it, and a moment that falls below f32's smallest normal is stored as zero. x86 cores
    /// compute on subnormals through microcode, ~100× slower, and a policy that has sharpened
    /// feeds Adam exactly those (gradients of 1e-20, moments decaying through 1e-38 for
    /// thousands of steps): `scaled`'s steps ran 1.8× slower by iteration 900, Adam 28 % of
    /// the run. What is dropped is below 1.2e-38, which `√v + ε·√(1−β2^t)` (≥ 3·10⁻¹⁰ at
    /// ε = 1e-8) cannot see: the update is the plain formula's wherever it is not itself
    /// below a weight's last bit.
    #[inline(always)]
    pub fn element(&self, x: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
        let gs = g * self.scale;
        let (tiny_m, tiny_v) = self.tiny();
        let gm = if gs.abs() < tiny_m { 0.0 } else { gs };
        let gv = if gs.abs() < tiny_v { 0.0 } else { gs };
        *m = normal_or_zero(*m * self.b1 + gm * (1.0 - self.b1));
        *v = normal_or_zero(*v * self.b2 + gv * gv * (1.0 - self.b2));
        let update = *m * self.factor / (v.sqrt() + self.eps * self.bc2);
        *x -= update * self.lr;
    }

    /// The least `|g·s|` whose share of `m` and of `v` is a normal f32:
    /// `(N/(1−β1), √(N/(1−β2)))` with `N` = f32's smallest normal (loop-invariant: hoisted
    /// out of [`Self::apply`]'s loop).
    #[inline(always)]
    pub fn tiny(&self) -> (f32, f32) {
        (
            f32::MIN_POSITIVE / (1.0 - self.b1),
            (f32::MIN_POSITIVE / (1.0 - self.b2)).sqrt(),
        )
    }

    /// Every element of `w` (inlined, so the fused engines' AVX2 bodies vectorize it).
    #[inline(always)]
    pub fn apply(&self, w: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32]) {
        for (((x, &g), m), v) in w.iter_mut().zip(grad).zip(m).zip(v) {
            self.element(x, g, m, v);
        }
    }
}

/// `x`, or zero where `x` is subnormal (below f32's smallest normal in magnitude).
#[inline(always)]
pub fn normal_or_zero(x: f32) -> f32 {
    if x.abs() < f32::MIN_POSITIVE { 0.0 } else { x }
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

    /// The plain formula (no flushing), the oracle of the test below.
    fn plain(a: &AdamStep, x: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
        let gs = g * a.scale;
        *m = *m * a.b1 + gs * (1.0 - a.b1);
        *v = *v * a.b2 + gs * gs * (1.0 - a.b2);
        *x -= *m * a.factor / (v.sqrt() + a.eps * a.bc2) * a.lr;
    }

    /// Gradients that shrink through the subnormal range (a policy that has sharpened): the
    /// moments never hold a subnormal, the weights equal the plain formula's bit for bit, and
    /// where the gradients are ordinary the moments are the plain formula's too.
    #[test]
    fn subnormals_never_enter_the_moments() {
        let h = Hyper {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        let w0 = [0.5f32, -1.0, 2.0, 0.25, -0.125, 1.5];
        let (mut w, mut pw) = (w0, w0);
        let (mut m, mut v, mut pm, mut pv) = ([0f32; 6], [0f32; 6], [0f32; 6], [0f32; 6]);
        let mut flushed = 0;
        for t in 1..=3000 {
            let a = AdamStep::at(&h, t, 1e-3, 1.0);
            // Ordinary gradients for 50 steps, then shrinking by 10× every 20 steps (down
            // past 1e-45, where they are zero).
            let scale = if t <= 50 {
                1.0
            } else {
                10f32.powi(-((t - 50) / 20))
            };
            for i in 0..6 {
                let g = scale * [0.3f32, -0.2, 0.05, -0.01, 0.7, -0.4][i];
                a.element(&mut w[i], g, &mut m[i], &mut v[i]);
                plain(&a, &mut pw[i], g, &mut pm[i], &mut pv[i]);
                assert!(!m[i].is_subnormal() && !v[i].is_subnormal(), "t {t} i {i}");
                assert_eq!(w[i].to_bits(), pw[i].to_bits(), "t {t} i {i}");
                if t <= 50 {
                    assert_eq!(
                        (m[i].to_bits(), v[i].to_bits()),
                        (pm[i].to_bits(), pv[i].to_bits())
                    );
                }
                flushed += usize::from(pm[i].is_subnormal() || pv[i].is_subnormal());
            }
        }
        // The plain formula did reach subnormal moments (the case this is about).
        assert!(flushed > 1000, "{flushed}");
        // m forgets at 0.9 a step: zero by now; v (0.999) still holds the ordinary steps'.
        assert!(m.iter().all(|&x| x == 0.0) && v.iter().all(|&x| x.is_normal()));
    }
}

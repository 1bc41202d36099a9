// Shared by every kernel (prepended to each file by gpu::kernels).

// PCG-RXS-M-XS 32-bit hash (Jarzynski & Olano 2020); same as rng::pcg_hash.
fn pcg_hash(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

// Starting values of a running max / min. Not ±f32::MAX: wgpu on WebGPU passes the shader
// through naga, which prints f32::MAX as 340282350000000000000000000000000000000 — past the
// f32 range as written, which Chrome's compiler refuses. ±3.4e38 prints as it is; a max or min
// over finite values below it is the same.
const F32_LOWEST: f32 = -3.4e38;
const F32_HIGHEST: f32 = 3.4e38;

// Invocation index for 1-D work spread over a 2-D grid of 64-wide workgroups.
fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}

// The per-token GRPO objective (GRPO-SPEC §4), once for every kernel; reference:
// objective::loss::reference (pg_term, kl_term). lecture_step.wgsl trains with them.
// The policy-gradient term and its derivative with respect to log π: (term, ∂term/∂logπ)
// for mode 0 naive, 1 unclipped, 2 clipped (clip range [lo, hi]); dr = ∂r/∂logπ (r itself
// for r = exp(logπ − logπ_old)).
fn pg_term(mode: u32, a: f32, r: f32, dr: f32, l: f32, lo: f32, hi: f32) -> vec2<f32> {
    if (mode == 0u) { return vec2<f32>(-a * l, -a); }
    if (mode == 1u) { return vec2<f32>(-a * r, -a * dr); }
    let u = r * a;
    let c = clamp(r, lo, hi) * a;
    let live = u <= c || (r > lo && r < hi);
    var d = 0.0;
    if (live) { d = -a * dr; }
    return vec2<f32>(-min(u, c), d);
}

// A KL estimate of Δ = log π_ref − log π (0 k1, 1 k2, 2 k3) and β·∂KL/∂logπ.
fn kl_term(estimator: u32, l: f32, rf: f32, beta: f32) -> vec2<f32> {
    if (estimator == 0u) { return vec2<f32>(l - rf, beta); }
    let delta = rf - l;
    if (estimator == 1u) { return vec2<f32>(delta * delta / 2.0, -beta * delta); }
    let e = exp(delta);
    return vec2<f32>(e - delta - 1.0, beta * (1.0 - e));
}

// Whether the clip is active on a token, low and high, as 0/1: the ratio below lo with a < 0,
// or above hi with a > 0 (reference: objective::loss::reference::clip_flags).
fn clip_flags(ratio: f32, a: f32, lo: f32, hi: f32) -> vec2<f32> {
    return vec2<f32>(select(0.0, 1.0, ratio < lo && a < 0.0), select(0.0, 1.0, ratio > hi && a > 0.0));
}

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

// flat_index with the workgroups folded: workgroup 2w does block w, 2w + 1 block W − 1 − w (a
// permutation of the W blocks). For work whose cost grows along the index (causal attention
// over position-major rows): lavapipe hands each of its N threads one contiguous run of a
// dispatch's workgroups (W / N of them, llvmpipe's lp_cs_tpool), so in index order the thread
// with the last positions did most of the work (attention's kernels ran at 0.6 of two threads'
// speed on transformer-sort). Folded, every run of an even number of workgroups holds pairs
// of cheap and dear blocks. The same invocations, so the same results.
fn folded_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    let total = nwg.x * nwg.y;
    let w = gid.x / 64u + gid.y * nwg.x;
    let half = w / 2u;
    let block = select(total - 1u - half, half, (w & 1u) == 0u);
    return block * 64u + gid.x % 64u;
}

// LayerNorm's backward sums over a row, one quad of dh = dy·g and of x̂ at a time, in order
// (transformer.wgsl's ln_backward4 and matmul_subgroup.wgsl's epilogue): (m₁ + Σ dh,
// m₂ + Σ dh·x̂).
fn ln_back_sums(m: vec2<f32>, dh: vec4<f32>, hv: vec4<f32>) -> vec2<f32> {
    var m1 = m.x;
    var m2 = m.y;
    m1 += dh.x;
    m2 += dh.x * hv.x;
    m1 += dh.y;
    m2 += dh.y * hv.y;
    m1 += dh.z;
    m2 += dh.z * hv.z;
    m1 += dh.w;
    m2 += dh.w * hv.w;
    return vec2<f32>(m1, m2);
}

// The per-token GRPO objective (GRPO-SPEC §4), once for every kernel; reference:
// objective::loss::reference (pg_term, kl_term, clip_flags), with its PgParams: the loss (0
// naive, 1 unclipped, 2 clipped, 3 cispo, 4 sapo), the clip range [lo, hi], the dual clip c
// and δ (0 = off), CISPO's cap, SAPO's τ for a > 0 and a ≤ 0. lecture_step.wgsl trains with
// them. (GMPO and the sequence levels need a response's mean log-ratio first: CPU engines.)
struct Pg {
    mode: u32, lo: f32, hi: f32, dual_clip: f32,
    delta: f32, cispo_cap: f32, tau_pos: f32, tau_neg: f32,
}

// The policy-gradient term and its derivative with respect to log π: (term, ∂term/∂logπ)
// for advantage a, ratio r, dr = ∂r/∂logπ (r itself for r = exp(logπ − logπ_old)), l = log π.
fn pg_term(p: Pg, a: f32, r: f32, dr: f32, l: f32) -> vec2<f32> {
    if (p.mode == 0u) { return vec2<f32>(-a * l, -a); }
    if (p.mode == 1u) { return vec2<f32>(-a * r, -a * dr); }
    if (p.mode == 3u) {
        let w = select(r, p.cispo_cap, r > p.cispo_cap);
        return vec2<f32>(-w * a * l, -w * a);
    }
    if (p.mode == 4u) {
        let tau = select(p.tau_neg, p.tau_pos, a > 0.0);
        let sg = 1.0 / (1.0 + exp(-tau * (r - 1.0)));
        return vec2<f32>(-(4.0 / tau) * sg * a, -a * 4.0 * sg * (1.0 - sg) * dr);
    }
    let capped = p.delta > 0.0 && r > p.delta;
    let rd = select(r, p.delta, capped);
    let u = rd * a;
    let c = clamp(r, p.lo, p.hi) * a;
    let live = (u <= c || (r > p.lo && r < p.hi)) && !capped;
    let l_clip = -min(u, c);
    var d = 0.0;
    if (live) { d = -a * dr; }
    let cap = -a * p.dual_clip;
    if (p.dual_clip > 0.0 && a < 0.0 && l_clip > cap) { return vec2<f32>(cap, 0.0); }
    return vec2<f32>(l_clip, d);
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
// or above hi with a > 0; CISPO: above its cap with a > 0; SAPO, naive and unclipped never
// (reference: objective::loss::reference::clip_flags).
fn clip_flags(p: Pg, ratio: f32, a: f32) -> vec2<f32> {
    if (p.mode == 3u) { return vec2<f32>(0.0, select(0.0, 1.0, ratio > p.cispo_cap && a > 0.0)); }
    if (p.mode == 4u || p.mode <= 1u) { return vec2<f32>(0.0, 0.0); }
    return vec2<f32>(select(0.0, 1.0, ratio < p.lo && a < 0.0), select(0.0, 1.0, ratio > p.hi && a > 0.0));
}

// LayerNorm's ε (engine::fused_transformer::LN_EPS): transformer.wgsl's LayerNorms and
// matmul_subgroup.wgsl's LayerNorm epilogue.
const LN_EPS: f32 = 1e-5;

// Φ(x) as engine::fused_transformer::normal_cdf: erfc(−x/√2)/2 with Numerical Recipes' erfc.
fn normal_cdf(x: f32) -> f32 {
    let z = abs(x) * 0.70710678;
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.2655122 + t * (1.0000237 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.135204 + t * (1.4885159 + t * (-0.82215223 + t * 0.17087277))))))));
    let half_erfc = 0.5 * t * exp(-z * z + poly);
    return select(half_erfc, 1.0 - half_erfc, x >= 0.0);
}

// GELU's derivative Φ(x) + x·φ(x) with Φ(x) known (engine::fused_transformer::gelu_grad_from):
// transformer.wgsl's gelu_backward kernels and matmul_subgroup.wgsl's GELU-backward epilogue.
fn gelu_grad4(x: vec4<f32>, cdf: vec4<f32>) -> vec4<f32> {
    return cdf + x * 0.3989423 * exp(-0.5 * x * x);
}

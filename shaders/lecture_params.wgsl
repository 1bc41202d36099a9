// The parameters of every lecture-step dispatch (`Lp`, engine::wgsl_lecture::StepParams),
// prepended to lecture_step.wgsl and lecture_vec.wgsl.

struct Lp {
    b: u32, g: u32, n: u32, v: u32,
    d: u32, tokens: u32, rows: u32, count: u32,
    w_off: u32, t_off: u32, m_off: u32, enc_off: u32,
    logits_off: u32, logz_off: u32, ent_off: u32, adv_off: u32,
    out_off: u32, coef_off: u32, stats_off: u32, dl_off: u32,
    denc_off: u32, dt_off: u32, grad_off: u32, part_off: u32,
    sums_off: u32, src_off: u32, i_prompts: u32, i_tokens: u32,
    i_greedy: u32, p_count: u32, am_off: u32, av_off: u32,
    ref_off: u32, old_off: u32, rf_off: u32, mode: u32,
    estimator: u32, kl_on: u32, square: u32, chunk: u32,
    nchunks: u32, channels: u32, _u0: u32, _u1: u32,
    inv_t: f32, cw: f32, beta: f32, lo: f32,
    hi: f32, lr: f32, b1: f32, b2: f32,
    eps: f32, bc2: f32, factor: f32, max_norm: f32,
}

@group(0) @binding(0) var<uniform> lp: Lp;

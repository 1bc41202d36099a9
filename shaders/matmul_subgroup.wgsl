// `matmul_window` with B's loads spread over a subgroup (appended to matmul.wgsl where the
// adapter has subgroups of at least 8 invocations; naga 30 takes the subgroup built-ins without
// an `enable subgroups;` line, which it does not parse yet).
// Reference: engine::wgsl_lecture::reference::matmul, as matmul_window.
//
// Why: llvmpipe runs a subgroup as one SIMD vector (8 invocations on AVX2) and loads a value
// whose address it cannot prove uniform lane by lane — matmul_window's B entries are the same
// for every invocation, yet each of its 32 loads per k costs 8 scalar loads. Here lane ℓ of the
// subgroup loads only column quads ℓ and ℓ + 8 of B's row and `subgroupBroadcast` hands quad q
// to every lane (an extract and a splat). An invocation owns 64 columns (SG_COLS), twice
// matmul_window's, so A — read lane by lane, llvmpipe's dearest access — is read half as often;
// and C's quads are stored as vectors where C's rows start at multiples of 4. The products,
// their order and the clamped indices are matmul_window's: the results are bit-identical to it.
// Measured side by side on lavapipe at transformer-sort's products (1952 × 256 × 64 and the
// like): 2.2–3× matmul_window.
// Lanes past the eighth (subgroups of 16 or more) load quads 7 and 15 again and use nothing of
// theirs.
//
// WHOLE (a pipeline constant) stores C's blocks as whole quads where the host says every one is
// (see the end of the kernel). VEC_B (a pipeline constant) says how a lane reads its 4×4 block of B (rows k .. k + 3, its
// column quad) from the window: 0 entry by entry (any strides); 1 B row-major with rows from
// multiples of 4 (b_cs = 1; b_off, b_rs multiples of 4): one vec4 per row; 2 B along k
// (b_rs = 1; b_off, b_cs, k multiples of 4 — the transposed weights of the backward pass): one
// vec4 per column, transposed in registers. The same values in every mode.

override VEC_B: u32 = 0u;
override WHOLE: bool = false;
// B_WORK (a pipeline constant) reads B's quads from the work buffer instead of the window (VEC_B
// 1 or 2 only; the host binds a window all the same): the weight gradients' ∂W = Xᵀ·dY, whose
// B (rows of X or dY) spans far more than a window, as one product over all its k in one
// dispatch. The window's loads and these are the same vec4 loads lane by lane, so nothing is
// lost by the storage buffer (measured standalone on lavapipe: as fast or faster).
override B_WORK: bool = false;

// Row `row`'s sum of A (its entries in k order, A's zeros past k added as nothing changes) into
// work[e_sum + row] where the host asks (B_WORK products, e_flags bit 2; the column blocks'
// first workgroups): ∂b = Σ_t dY[t] of a weight gradient ∂Wᵀ = dYᵀ·X, A = dYᵀ — what
// transformer.wgsl's col_sum4 added in its own dispatch, in the same order: the same bits.
fn row_sum(row: u32, col0: u32, sum: f32) {
    if (B_WORK && (mm.e_flags & 4u) != 0u && col0 == 0u && row < mm.m) {
        let i = mm.e_sum + row;
        work[i >> 2u][i & 3u] = sum;
    }
}

// Quad i of B's source.
fn b_src(i: u32) -> vec4<f32> {
    if (B_WORK) { return work[i]; }
    return window[i];
}

const SG_COLS: u32 = 64u;

// B's rows k .. k + 3 at column quad `quad` (from the first column `b0` points at), in the
// VEC_B mode's reads.
fn b_block(b0: u32, k: u32, kl: u32, quad: u32) -> mat4x4<f32> {
    if (VEC_B == 1u) {
        let at = (b0 >> 2u) + quad;
        let rs = mm.b_rs >> 2u;
        return mat4x4<f32>(
            b_src(at + k * rs),
            b_src(at + min(k + 1u, kl) * rs),
            b_src(at + min(k + 2u, kl) * rs),
            b_src(at + min(k + 3u, kl) * rs),
        );
    }
    if (VEC_B == 2u) {
        let at = (b0 + 4u * quad * mm.b_cs + k) >> 2u;
        let cs = mm.b_cs >> 2u;
        return transpose(mat4x4<f32>(
            b_src(at),
            b_src(at + cs),
            b_src(at + 2u * cs),
            b_src(at + 3u * cs),
        ));
    }
    return mat4x4<f32>(
        win4(b0 + k * mm.b_rs, quad),
        win4(b0 + min(k + 1u, kl) * mm.b_rs, quad),
        win4(b0 + min(k + 2u, kl) * mm.b_rs, quad),
        win4(b0 + min(k + 3u, kl) * mm.b_rs, quad),
    );
}

// One quad of C's row gi from column gj: a whole vec4 where C's rows start at multiples of 4,
// its columns are contiguous and the quad is in range, else element by element (store_row).
fn store_quad(gi: u32, gj: u32, acc: vec4<f32>) {
    if (((mm.c_off | mm.c_rs) & 3u) == 0u && (mm.flags & 4u) == 0u && gi < mm.m && gj + 3u < mm.n) {
        let at = (mm.c_off + gi * mm.c_rs + gj) >> 2u;
        if ((mm.flags & 1u) != 0u) {
            work[at] = work[at] + acc;
        } else {
            work[at] = acc;
        }
    } else {
        store_row(gi, gj, 0u, acc);
    }
}

// Eight whole quads of C from quad `at` (the WHOLE pipelines' stores), added to C where the
// product accumulates.
fn store8(at: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>) {
    if ((mm.flags & 1u) != 0u) {
        work[at] = work[at] + a0;
        work[at + 1u] = work[at + 1u] + a1;
        work[at + 2u] = work[at + 2u] + a2;
        work[at + 3u] = work[at + 3u] + a3;
        work[at + 4u] = work[at + 4u] + a4;
        work[at + 5u] = work[at + 5u] + a5;
        work[at + 6u] = work[at + 6u] + a6;
        work[at + 7u] = work[at + 7u] + a7;
    } else {
        work[at] = a0;
        work[at + 1u] = a1;
        work[at + 2u] = a2;
        work[at + 3u] = a3;
        work[at + 4u] = a4;
        work[at + 5u] = a5;
        work[at + 6u] = a6;
        work[at + 7u] = a7;
    }
}

// The epilogues (EPI, a pipeline constant; the host asks for them on WHOLE products only): what
// ran as its own dispatch after the product, with one pass over C fewer.
//   1, 2  GELU: h = C (+ C's old value where the product accumulates) + b₁ (at e_bias in the
//         model), GELU's output h·Φ(h) at e_out; with 2 (a pass the backward reads) h at C and
//         Φ(h) at e_aux — bias_gelu4's arithmetic.
//   3, 4  a LayerNorm of C's rows (the one-row kernel with n = SG_COLS: an invocation holds a
//         whole row): x = C (+ the old value) (+ b at e_bias where e_flags bit 0 says: the
//         block's b₂, which the next LayerNorm used to add) stored at C, then layer_norm4's
//         sums in its order, y = x̂·g + β at e_out (g at e_gain, β after it); with 4 also x̂
//         at e_aux and 1/σ at e_rstd.
//   5     GELU's backward: dh = C (+ the old value) times Φ(h) + h·φ(h), stored at C (h at
//         e_aux, Φ(h) at e_out) — gelu_backward4's arithmetic.
//   6     LayerNorm's backward of C's rows, C the LayerNorm's dy (the one-row kernel with n =
//         SG_COLS, as 3 and 4): C (+ the old value) stored, then ln_backward4's sums in its
//         order, dx = (1/σ)·(dy·g − m₁ − x̂·m₂) at e_out, added to where e_flags bit 1 says (g at
//         e_gain, x̂ at e_aux, 1/σ at e_rstd).
// The same operations in the same order as the dispatches they replace: the same values.
override EPI: u32 = 0u;

// The model again, read-only (the bias, gain and β of the epilogues; the same buffer as the
// window).
@group(0) @binding(5) var<storage, read> params: array<vec4<f32>>;

fn gelu_quad(gi: u32, j: u32, acc: vec4<f32>) {
    let o = gi * mm.c_rs + j;
    let at = (mm.c_off + o) >> 2u;
    var c = acc;
    if ((mm.flags & 1u) != 0u) { c = work[at] + acc; }
    if (EPI == 5u) {
        work[at] = c * gelu_grad4(work[(mm.e_aux + o) >> 2u], work[(mm.e_out + o) >> 2u]);
        return;
    }
    let h = c + params[(mm.e_bias + j) >> 2u];
    let p = vec4<f32>(normal_cdf(h.x), normal_cdf(h.y), normal_cdf(h.z), normal_cdf(h.w));
    if (EPI == 2u) {
        work[at] = h;
        work[(mm.e_aux + o) >> 2u] = p;
    }
    work[(mm.e_out + o) >> 2u] = h * p;
}

// Quad g (0 … 3) of four, by selects: how the epilogues' and the stores' loops pick their
// accumulators. Not a local array: llvmpipe keeps one in memory, and its JIT took longer over
// one indexed by the loop (1.2–1.4 s a pipeline) than over the sixteen quads written out.
fn pick4(g: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) -> vec4<f32> {
    return select(select(a0, a1, g == 1u), select(a2, a3, g == 3u), g >= 2u);
}

// The GELU epilogue of sixteen quads, `a_{4g+i}` in `a_i` of group g (the one-row kernel: row gi's
// 64 columns from j; the two-row kernel: groups 0 and 1 row gi's 32 columns, 2 and 3 row gh's), in
// a loop over the four groups: four inlined copies of gelu_quad, not sixteen (llvmpipe's JIT of
// a GELU pipeline, on a cold Mesa shader cache: 0.40–0.50 → 0.14–0.19 s). The loop's selects are
// a few per quad against normal_cdf's arithmetic. A row past C's is skipped.
fn gelu16(gi: u32, gh: u32, j: u32, two: bool, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>, a8: vec4<f32>, a9: vec4<f32>, a10: vec4<f32>, a11: vec4<f32>, a12: vec4<f32>, a13: vec4<f32>, a14: vec4<f32>, a15: vec4<f32>) {
    // 4, written from a uniform so that the loop stays a loop (NIR unrolls a constant count).
    let groups = min(4u, mm.m + 4u);
    for (var g = 0u; g < groups; g++) {
        var row = gi;
        var col = j + 16u * g;
        if (two) {
            row = select(gi, gh, g >= 2u);
            col = j + 16u * (g % 2u);
        }
        if (row < mm.m) {
            gelu_quad(row, col, pick4(g, a0, a4, a8, a12));
            gelu_quad(row, col + 4u, pick4(g, a1, a5, a9, a13));
            gelu_quad(row, col + 8u, pick4(g, a2, a6, a10, a14));
            gelu_quad(row, col + 12u, pick4(g, a3, a7, a11, a15));
        }
    }
}

// Quad q of row gi's x for the LayerNorm epilogue: C after the product (and the bias), stored.
fn norm_x(gi: u32, q: u32, acc: vec4<f32>) -> vec4<f32> {
    let at = ((mm.c_off + gi * mm.c_rs) >> 2u) + q;
    var c = acc;
    if ((mm.flags & 1u) != 0u) { c = work[at] + acc; }
    if ((mm.e_flags & 1u) != 0u) { c = c + params[(mm.e_bias >> 2u) + q]; }
    work[at] = c;
    return c;
}

// A running sum and a quad's four entries added to it in order.
fn sum4(t: f32, v: vec4<f32>) -> f32 {
    return t + v.x + v.y + v.z + v.w;
}

// A running sum and the squares of a quad's four deviations from `mean`, in order.
fn sq4(t: f32, v: vec4<f32>, mean: f32) -> f32 {
    let c = v - vec4<f32>(mean);
    return t + c.x * c.x + c.y * c.y + c.z * c.z + c.w * c.w;
}

// Quad q of row gi's LayerNorm output (and x̂) from x, the mean and 1/σ.
fn norm_y(gi: u32, q: u32, x: vec4<f32>, mean: f32, r: f32) {
    let o = ((gi * mm.c_rs) >> 2u) + q;
    let h = (x - vec4<f32>(mean)) * r;
    if (EPI == 4u) { work[(mm.e_aux >> 2u) + o] = h; }
    let g = (mm.e_gain >> 2u) + q;
    work[(mm.e_out >> 2u) + o] = h * params[g] + params[g + (mm.n >> 2u)];
}

// Row gi (sixteen quads: n = SG_COLS) through the LayerNorm epilogue: layer_norm4's sums in
// its order. In loops, as gelu16: x quad by quad (stored at C by norm_x, four groups of four
// picked by selects), then the squares and y from x read back from C (this invocation's own
// stores). The same values in the same order as with the sixteen quads written out (whose
// pipelines took llvmpipe's JIT 0.5–0.64 s, now ~0.2 s).
fn norm16(gi: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>, a8: vec4<f32>, a9: vec4<f32>, a10: vec4<f32>, a11: vec4<f32>, a12: vec4<f32>, a13: vec4<f32>, a14: vec4<f32>, a15: vec4<f32>) {
    let nq = mm.n >> 2u;
    var t = 0.0;
    for (var g = 0u; g < nq / 4u; g++) {
        t = sum4(t, norm_x(gi, 4u * g, pick4(g, a0, a4, a8, a12)));
        t = sum4(t, norm_x(gi, 4u * g + 1u, pick4(g, a1, a5, a9, a13)));
        t = sum4(t, norm_x(gi, 4u * g + 2u, pick4(g, a2, a6, a10, a14)));
        t = sum4(t, norm_x(gi, 4u * g + 3u, pick4(g, a3, a7, a11, a15)));
    }
    let mean = t / f32(mm.n);
    let at = (mm.c_off + gi * mm.c_rs) >> 2u;
    var s = 0.0;
    for (var q = 0u; q < nq; q++) {
        s = sq4(s, work[at + q], mean);
    }
    let r = 1.0 / sqrt(s / f32(mm.n) + LN_EPS);
    if (EPI == 4u) {
        let i = mm.e_rstd + gi;
        work[i >> 2u][i & 3u] = r;
    }
    for (var q = 0u; q < nq; q++) {
        norm_y(gi, q, work[at + q], mean, r);
    }
}

// Row gi (sixteen quads: n = SG_COLS) through LayerNorm's backward (EPI 6): C stored by norm_x
// (no bias: e_flags bit 0 is clear), then ln_backward4's two passes over the row read back.
fn ln_back16(gi: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>, a8: vec4<f32>, a9: vec4<f32>, a10: vec4<f32>, a11: vec4<f32>, a12: vec4<f32>, a13: vec4<f32>, a14: vec4<f32>, a15: vec4<f32>) {
    let nq = mm.n >> 2u;
    for (var g = 0u; g < nq / 4u; g++) {
        _ = norm_x(gi, 4u * g, pick4(g, a0, a4, a8, a12));
        _ = norm_x(gi, 4u * g + 1u, pick4(g, a1, a5, a9, a13));
        _ = norm_x(gi, 4u * g + 2u, pick4(g, a2, a6, a10, a14));
        _ = norm_x(gi, 4u * g + 3u, pick4(g, a3, a7, a11, a15));
    }
    let at = (mm.c_off + gi * mm.c_rs) >> 2u;
    let o = (gi * mm.c_rs) >> 2u;
    let gq = mm.e_gain >> 2u;
    let hq = (mm.e_aux >> 2u) + o;
    var m = vec2<f32>(0.0);
    for (var q = 0u; q < nq; q++) {
        m = ln_back_sums(m, work[at + q] * params[gq + q], work[hq + q]);
    }
    let m1 = m.x / f32(mm.n);
    let m2 = m.y / f32(mm.n);
    let i = mm.e_rstd + gi;
    let r = work[i >> 2u][i & 3u];
    let add = (mm.e_flags & 2u) != 0u;
    let xq = (mm.e_out >> 2u) + o;
    for (var q = 0u; q < nq; q++) {
        let dx = r * (work[at + q] * params[gq + q] - vec4<f32>(m1) - work[hq + q] * m2);
        if (add) {
            work[xq + q] = work[xq + q] + dx;
        } else {
            work[xq + q] = dx;
        }
    }
}

@compute @workgroup_size(WIN_ROWS)
fn matmul_window_subgroup(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    // A product of at most 64 rows (one row block, nwg.x = 1) may come cut into nwg.z
    // workgroups of `rows_wg` rows (a multiple of 8, so whole subgroups return): lavapipe gives
    // each of its threads one contiguous run of a dispatch's workgroups, so a single workgroup
    // ran on one thread (∂W_o's 64 × 64 × 640, 0.55 ms a supervised step, at 0.44 of two
    // threads' speed). The same rows, products and order: the same bits.
    var rows_wg = WIN_ROWS;
    if (nwg.z > 1u) {
        rows_wg = min(WIN_ROWS, ((mm.m + nwg.z - 1u) / nwg.z + 7u) / 8u * 8u);
    }
    if (lid.x >= rows_wg) { return; }
    // Row blocks along x, column blocks along y (WindowPrograms::grid: lavapipe's threads each
    // take one contiguous run of workgroups, x fastest, so each holds whole sets of row blocks).
    let gi = wid.x * WIN_ROWS + wid.z * rows_wg + lid.x;
    // A subgroup whose rows are all past C's is done (the same for all its lanes, so the
    // broadcasts below stay whole): llvmpipe runs a workgroup's subgroups one after another and
    // skips the rest of a returned one, where it computed clamped rows for nothing before —
    // ∂Wᵀ of the head (11 rows) ran 8 subgroups for 2, a rollout's 288 rows 384. Bits unchanged.
    if (subgroupAll(gi >= mm.m)) { return; }
    let ar = mm.a_off + min(gi, mm.m - 1u) * mm.a_rs;
    let j0 = wid.y * SG_COLS;
    let b0 = mm.b_off + j0 * mm.b_cs;
    let b1 = b0 + 32u * mm.b_cs;
    let kl = mm.k - 1u;
    let quad = min(lane, 7u);
    // Sixteen named accumulators and the four k of a step written out: llvmpipe keeps an array,
    // or a struct passed by value or pointer, in memory (2.5× slower here, measured).
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
    var acc8 = vec4<f32>(0.0);
    var acc9 = vec4<f32>(0.0);
    var acc10 = vec4<f32>(0.0);
    var acc11 = vec4<f32>(0.0);
    var acc12 = vec4<f32>(0.0);
    var acc13 = vec4<f32>(0.0);
    var acc14 = vec4<f32>(0.0);
    var acc15 = vec4<f32>(0.0);
    var sa = 0.0;
    for (var k = 0u; k < mm.k; k += 4u) {
        let av = a_quad(ar, k, kl);
        if (B_WORK) { sa = sum4(sa, av); }
        let r = b_block(b0, k, kl, quad);
        let s = b_block(b1, k, kl, quad);
        let x0 = vec4<f32>(av.x);
        acc0 = fma(x0, subgroupBroadcast(r[0], 0u), acc0);
        acc1 = fma(x0, subgroupBroadcast(r[0], 1u), acc1);
        acc2 = fma(x0, subgroupBroadcast(r[0], 2u), acc2);
        acc3 = fma(x0, subgroupBroadcast(r[0], 3u), acc3);
        acc4 = fma(x0, subgroupBroadcast(r[0], 4u), acc4);
        acc5 = fma(x0, subgroupBroadcast(r[0], 5u), acc5);
        acc6 = fma(x0, subgroupBroadcast(r[0], 6u), acc6);
        acc7 = fma(x0, subgroupBroadcast(r[0], 7u), acc7);
        acc8 = fma(x0, subgroupBroadcast(s[0], 0u), acc8);
        acc9 = fma(x0, subgroupBroadcast(s[0], 1u), acc9);
        acc10 = fma(x0, subgroupBroadcast(s[0], 2u), acc10);
        acc11 = fma(x0, subgroupBroadcast(s[0], 3u), acc11);
        acc12 = fma(x0, subgroupBroadcast(s[0], 4u), acc12);
        acc13 = fma(x0, subgroupBroadcast(s[0], 5u), acc13);
        acc14 = fma(x0, subgroupBroadcast(s[0], 6u), acc14);
        acc15 = fma(x0, subgroupBroadcast(s[0], 7u), acc15);
        let x1 = vec4<f32>(av.y);
        acc0 = fma(x1, subgroupBroadcast(r[1], 0u), acc0);
        acc1 = fma(x1, subgroupBroadcast(r[1], 1u), acc1);
        acc2 = fma(x1, subgroupBroadcast(r[1], 2u), acc2);
        acc3 = fma(x1, subgroupBroadcast(r[1], 3u), acc3);
        acc4 = fma(x1, subgroupBroadcast(r[1], 4u), acc4);
        acc5 = fma(x1, subgroupBroadcast(r[1], 5u), acc5);
        acc6 = fma(x1, subgroupBroadcast(r[1], 6u), acc6);
        acc7 = fma(x1, subgroupBroadcast(r[1], 7u), acc7);
        acc8 = fma(x1, subgroupBroadcast(s[1], 0u), acc8);
        acc9 = fma(x1, subgroupBroadcast(s[1], 1u), acc9);
        acc10 = fma(x1, subgroupBroadcast(s[1], 2u), acc10);
        acc11 = fma(x1, subgroupBroadcast(s[1], 3u), acc11);
        acc12 = fma(x1, subgroupBroadcast(s[1], 4u), acc12);
        acc13 = fma(x1, subgroupBroadcast(s[1], 5u), acc13);
        acc14 = fma(x1, subgroupBroadcast(s[1], 6u), acc14);
        acc15 = fma(x1, subgroupBroadcast(s[1], 7u), acc15);
        let x2 = vec4<f32>(av.z);
        acc0 = fma(x2, subgroupBroadcast(r[2], 0u), acc0);
        acc1 = fma(x2, subgroupBroadcast(r[2], 1u), acc1);
        acc2 = fma(x2, subgroupBroadcast(r[2], 2u), acc2);
        acc3 = fma(x2, subgroupBroadcast(r[2], 3u), acc3);
        acc4 = fma(x2, subgroupBroadcast(r[2], 4u), acc4);
        acc5 = fma(x2, subgroupBroadcast(r[2], 5u), acc5);
        acc6 = fma(x2, subgroupBroadcast(r[2], 6u), acc6);
        acc7 = fma(x2, subgroupBroadcast(r[2], 7u), acc7);
        acc8 = fma(x2, subgroupBroadcast(s[2], 0u), acc8);
        acc9 = fma(x2, subgroupBroadcast(s[2], 1u), acc9);
        acc10 = fma(x2, subgroupBroadcast(s[2], 2u), acc10);
        acc11 = fma(x2, subgroupBroadcast(s[2], 3u), acc11);
        acc12 = fma(x2, subgroupBroadcast(s[2], 4u), acc12);
        acc13 = fma(x2, subgroupBroadcast(s[2], 5u), acc13);
        acc14 = fma(x2, subgroupBroadcast(s[2], 6u), acc14);
        acc15 = fma(x2, subgroupBroadcast(s[2], 7u), acc15);
        let x3 = vec4<f32>(av.w);
        acc0 = fma(x3, subgroupBroadcast(r[3], 0u), acc0);
        acc1 = fma(x3, subgroupBroadcast(r[3], 1u), acc1);
        acc2 = fma(x3, subgroupBroadcast(r[3], 2u), acc2);
        acc3 = fma(x3, subgroupBroadcast(r[3], 3u), acc3);
        acc4 = fma(x3, subgroupBroadcast(r[3], 4u), acc4);
        acc5 = fma(x3, subgroupBroadcast(r[3], 5u), acc5);
        acc6 = fma(x3, subgroupBroadcast(r[3], 6u), acc6);
        acc7 = fma(x3, subgroupBroadcast(r[3], 7u), acc7);
        acc8 = fma(x3, subgroupBroadcast(s[3], 0u), acc8);
        acc9 = fma(x3, subgroupBroadcast(s[3], 1u), acc9);
        acc10 = fma(x3, subgroupBroadcast(s[3], 2u), acc10);
        acc11 = fma(x3, subgroupBroadcast(s[3], 3u), acc11);
        acc12 = fma(x3, subgroupBroadcast(s[3], 4u), acc12);
        acc13 = fma(x3, subgroupBroadcast(s[3], 5u), acc13);
        acc14 = fma(x3, subgroupBroadcast(s[3], 6u), acc14);
        acc15 = fma(x3, subgroupBroadcast(s[3], 7u), acc15);
    }
    // WHOLE (the host's promise: C row-major from multiples of 4, n a multiple of SG_COLS, so
    // every block's 64 columns are in range): 16 vector stores with no per-quad test, and no
    // store_quad in the pipeline at all. With store_quad's tests and element-wise fallback
    // compiled in, llvmpipe ran the whole kernel ~25 % slower (640 × 256 × 64: 0.94 → 0.72 ms;
    // 1280 × 192 × 64: 1.38 → 1.03 ms), whichever path a dispatch then took.
    row_sum(gi, j0, sa);
    if (WHOLE) {
        if (gi >= mm.m) { return; }
        if (EPI == 1u || EPI == 2u || EPI == 5u) {
            gelu16(gi, gi, j0, false, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15);
            return;
        }
        if (EPI == 6u) {
            ln_back16(gi, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15);
            return;
        }
        if (EPI == 3u || EPI == 4u) {
            norm16(gi, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15);
            return;
        }
        let at = (mm.c_off + gi * mm.c_rs + j0) >> 2u;
        store8(at, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
        store8(at + 8u, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15);
        return;
    }
    // Not WHOLE: one store_quad in a loop over the quads in C's columns, the quad picked by
    // selects, not sixteen written out. Each inlined store_quad carries store_row's fallback, a
    // scatter lane by lane, and llvmpipe's JIT compiled sixteen of them: ~0.8–0.9 s a pipeline
    // against ~0.13 s now (first dispatches on a cold Mesa shader cache, where a machine's first
    // run pays them; four such pipelines on transformer-sort). The stores run once per
    // invocation, after its k loop. The same stores, so the same values.
    let n = min(16u, (mm.n - min(j0, mm.n) + 3u) / 4u);
    for (var q = 0u; q < n; q++) {
        let lo = pick8(q, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
        let hi = pick8(q - 8u, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15);
        store_quad(gi, j0 + 4u * q, select(hi, lo, q < 8u));
    }
}

// Quad q (0 … 7) of eight, by selects, as pick4.
fn pick8(q: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>) -> vec4<f32> {
    return select(pick4(q, a0, a1, a2, a3), pick4(q - 4u, a4, a5, a6, a7), q >= 4u);
}

// `matmul_window_subgroup` with two rows of C per invocation (rows gi and gi + 64 of a block of
// 128) and 32 columns: each lane loads one quad of B's row per k (quad ℓ of the 32 columns),
// shared by both rows. On llvmpipe those window loads are gathers, ~45 % of the one-row
// kernel's time (measured by leaving them out); here there are half as many per product, for a
// second row of A (~10 %): 640 × 256 × 64 0.77 → 0.66 ms, 1280 × 192 × 64 1.10 → 0.95 ms in a
// standalone program on lavapipe. For products of more than 64 rows (the host's choice): with
// fewer, the second row would be idle work. The same products in the same order: bit-identical
// to matmul_window. WHOLE here means n a multiple of SG2_COLS.
const SG2_COLS: u32 = 32u;

@compute @workgroup_size(WIN_ROWS)
fn matmul_window_subgroup2(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    // Rows gi and gi + 64 of the block; in a last block of fewer than 128 rows, gi and gi + h
    // (h the half of its rows, rounded up to whole subgroups of 8), and the lanes past h have
    // none (their rows set past C's: nothing stored). With gi + 64 the second rows of such a
    // block were all past C's and computed for nothing (∂W_qkvᵀ's 192 rows on transformer-
    // sort: a quarter of the product's work). Each row's products and order are as before:
    // the same bits.
    let base = wid.x * 2u * WIN_ROWS;
    let half = min(WIN_ROWS, ((mm.m - min(base, mm.m) + 1u) / 2u + 7u) / 8u * 8u);
    let live = lid.x < half;
    let gi = select(mm.m, base + lid.x, live);
    // Done where both rows of every lane are past C's (as in the one-row kernel): on llvmpipe
    // (subgroups of 8) the lanes past h are whole subgroups.
    if (subgroupAll(gi >= mm.m)) { return; }
    let gh = select(mm.m, gi + half, live);
    let ar = mm.a_off + min(gi, mm.m - 1u) * mm.a_rs;
    let ah = mm.a_off + min(gh, mm.m - 1u) * mm.a_rs;
    let j0 = wid.y * SG2_COLS;
    let b0 = mm.b_off + j0 * mm.b_cs;
    let kl = mm.k - 1u;
    let quad = min(lane, 7u);
    // Row gi in acc0 .. acc7, row gi + 64 in acc8 .. acc15 (named, as in the one-row kernel).
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
    var acc8 = vec4<f32>(0.0);
    var acc9 = vec4<f32>(0.0);
    var acc10 = vec4<f32>(0.0);
    var acc11 = vec4<f32>(0.0);
    var acc12 = vec4<f32>(0.0);
    var acc13 = vec4<f32>(0.0);
    var acc14 = vec4<f32>(0.0);
    var acc15 = vec4<f32>(0.0);
    var sa = 0.0;
    var sh = 0.0;
    for (var k = 0u; k < mm.k; k += 4u) {
        let av = a_quad(ar, k, kl);
        let ah4 = a_quad(ah, k, kl);
        if (B_WORK) {
            sa = sum4(sa, av);
            sh = sum4(sh, ah4);
        }
        let r = b_block(b0, k, kl, quad);
        let x0 = vec4<f32>(av.x);
        let y0 = vec4<f32>(ah4.x);
        let b00 = subgroupBroadcast(r[0], 0u);
        acc0 = fma(x0, b00, acc0);
        acc8 = fma(y0, b00, acc8);
        let b01 = subgroupBroadcast(r[0], 1u);
        acc1 = fma(x0, b01, acc1);
        acc9 = fma(y0, b01, acc9);
        let b02 = subgroupBroadcast(r[0], 2u);
        acc2 = fma(x0, b02, acc2);
        acc10 = fma(y0, b02, acc10);
        let b03 = subgroupBroadcast(r[0], 3u);
        acc3 = fma(x0, b03, acc3);
        acc11 = fma(y0, b03, acc11);
        let b04 = subgroupBroadcast(r[0], 4u);
        acc4 = fma(x0, b04, acc4);
        acc12 = fma(y0, b04, acc12);
        let b05 = subgroupBroadcast(r[0], 5u);
        acc5 = fma(x0, b05, acc5);
        acc13 = fma(y0, b05, acc13);
        let b06 = subgroupBroadcast(r[0], 6u);
        acc6 = fma(x0, b06, acc6);
        acc14 = fma(y0, b06, acc14);
        let b07 = subgroupBroadcast(r[0], 7u);
        acc7 = fma(x0, b07, acc7);
        acc15 = fma(y0, b07, acc15);
        let x1 = vec4<f32>(av.y);
        let y1 = vec4<f32>(ah4.y);
        let b10 = subgroupBroadcast(r[1], 0u);
        acc0 = fma(x1, b10, acc0);
        acc8 = fma(y1, b10, acc8);
        let b11 = subgroupBroadcast(r[1], 1u);
        acc1 = fma(x1, b11, acc1);
        acc9 = fma(y1, b11, acc9);
        let b12 = subgroupBroadcast(r[1], 2u);
        acc2 = fma(x1, b12, acc2);
        acc10 = fma(y1, b12, acc10);
        let b13 = subgroupBroadcast(r[1], 3u);
        acc3 = fma(x1, b13, acc3);
        acc11 = fma(y1, b13, acc11);
        let b14 = subgroupBroadcast(r[1], 4u);
        acc4 = fma(x1, b14, acc4);
        acc12 = fma(y1, b14, acc12);
        let b15 = subgroupBroadcast(r[1], 5u);
        acc5 = fma(x1, b15, acc5);
        acc13 = fma(y1, b15, acc13);
        let b16 = subgroupBroadcast(r[1], 6u);
        acc6 = fma(x1, b16, acc6);
        acc14 = fma(y1, b16, acc14);
        let b17 = subgroupBroadcast(r[1], 7u);
        acc7 = fma(x1, b17, acc7);
        acc15 = fma(y1, b17, acc15);
        let x2 = vec4<f32>(av.z);
        let y2 = vec4<f32>(ah4.z);
        let b20 = subgroupBroadcast(r[2], 0u);
        acc0 = fma(x2, b20, acc0);
        acc8 = fma(y2, b20, acc8);
        let b21 = subgroupBroadcast(r[2], 1u);
        acc1 = fma(x2, b21, acc1);
        acc9 = fma(y2, b21, acc9);
        let b22 = subgroupBroadcast(r[2], 2u);
        acc2 = fma(x2, b22, acc2);
        acc10 = fma(y2, b22, acc10);
        let b23 = subgroupBroadcast(r[2], 3u);
        acc3 = fma(x2, b23, acc3);
        acc11 = fma(y2, b23, acc11);
        let b24 = subgroupBroadcast(r[2], 4u);
        acc4 = fma(x2, b24, acc4);
        acc12 = fma(y2, b24, acc12);
        let b25 = subgroupBroadcast(r[2], 5u);
        acc5 = fma(x2, b25, acc5);
        acc13 = fma(y2, b25, acc13);
        let b26 = subgroupBroadcast(r[2], 6u);
        acc6 = fma(x2, b26, acc6);
        acc14 = fma(y2, b26, acc14);
        let b27 = subgroupBroadcast(r[2], 7u);
        acc7 = fma(x2, b27, acc7);
        acc15 = fma(y2, b27, acc15);
        let x3 = vec4<f32>(av.w);
        let y3 = vec4<f32>(ah4.w);
        let b30 = subgroupBroadcast(r[3], 0u);
        acc0 = fma(x3, b30, acc0);
        acc8 = fma(y3, b30, acc8);
        let b31 = subgroupBroadcast(r[3], 1u);
        acc1 = fma(x3, b31, acc1);
        acc9 = fma(y3, b31, acc9);
        let b32 = subgroupBroadcast(r[3], 2u);
        acc2 = fma(x3, b32, acc2);
        acc10 = fma(y3, b32, acc10);
        let b33 = subgroupBroadcast(r[3], 3u);
        acc3 = fma(x3, b33, acc3);
        acc11 = fma(y3, b33, acc11);
        let b34 = subgroupBroadcast(r[3], 4u);
        acc4 = fma(x3, b34, acc4);
        acc12 = fma(y3, b34, acc12);
        let b35 = subgroupBroadcast(r[3], 5u);
        acc5 = fma(x3, b35, acc5);
        acc13 = fma(y3, b35, acc13);
        let b36 = subgroupBroadcast(r[3], 6u);
        acc6 = fma(x3, b36, acc6);
        acc14 = fma(y3, b36, acc14);
        let b37 = subgroupBroadcast(r[3], 7u);
        acc7 = fma(x3, b37, acc7);
        acc15 = fma(y3, b37, acc15);
    }
    row_sum(gi, j0, sa);
    row_sum(gh, j0, sh);
    if (WHOLE && (EPI == 1u || EPI == 2u || EPI == 5u)) {
        gelu16(gi, gh, j0, true, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15);
        return;
    }
    if (WHOLE) {
        if (gi < mm.m) {
            let at = (mm.c_off + gi * mm.c_rs + j0) >> 2u;
            store8(at, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
        }
        if (gh < mm.m) {
            let at = (mm.c_off + gh * mm.c_rs + j0) >> 2u;
            store8(at, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15);
        }
        return;
    }
    // Not WHOLE: a loop, as in the one-row kernel (row gi's quads, then row gh's).
    let n = min(8u, (mm.n - min(j0, mm.n) + 3u) / 4u);
    for (var q = 0u; q < 2u * n; q++) {
        let e = q % n;
        let lo = pick8(e, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
        let hi = pick8(e, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15);
        store_quad(select(gh, gi, q < n), j0 + 4u * e, select(hi, lo, q < n));
    }
}

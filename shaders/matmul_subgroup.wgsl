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

const SG_COLS: u32 = 64u;

// B's rows k .. k + 3 at column quad `quad` (from the first column `b0` points at), in the
// VEC_B mode's reads.
fn b_block(b0: u32, k: u32, kl: u32, quad: u32) -> mat4x4<f32> {
    if (VEC_B == 1u) {
        let at = (b0 >> 2u) + quad;
        let rs = mm.b_rs >> 2u;
        return mat4x4<f32>(
            window[at + k * rs],
            window[at + min(k + 1u, kl) * rs],
            window[at + min(k + 2u, kl) * rs],
            window[at + min(k + 3u, kl) * rs],
        );
    }
    if (VEC_B == 2u) {
        let at = (b0 + 4u * quad * mm.b_cs + k) >> 2u;
        let cs = mm.b_cs >> 2u;
        return transpose(mat4x4<f32>(
            window[at],
            window[at + cs],
            window[at + 2u * cs],
            window[at + 3u * cs],
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

@compute @workgroup_size(WIN_ROWS)
fn matmul_window_subgroup(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let gi = wid.y * WIN_ROWS + lid.x;
    let ar = mm.a_off + min(gi, mm.m - 1u) * mm.a_rs;
    let j0 = wid.x * SG_COLS;
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
    for (var k = 0u; k < mm.k; k += 4u) {
        let av = a_quad(ar, k, kl);
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
    if (WHOLE) {
        if (gi >= mm.m) { return; }
        let at = (mm.c_off + gi * mm.c_rs + j0) >> 2u;
        store8(at, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
        store8(at + 8u, acc8, acc9, acc10, acc11, acc12, acc13, acc14, acc15);
        return;
    }
    store_quad(gi, j0, acc0);
    store_quad(gi, j0 + 4u, acc1);
    store_quad(gi, j0 + 8u, acc2);
    store_quad(gi, j0 + 12u, acc3);
    store_quad(gi, j0 + 16u, acc4);
    store_quad(gi, j0 + 20u, acc5);
    store_quad(gi, j0 + 24u, acc6);
    store_quad(gi, j0 + 28u, acc7);
    store_quad(gi, j0 + 32u, acc8);
    store_quad(gi, j0 + 36u, acc9);
    store_quad(gi, j0 + 40u, acc10);
    store_quad(gi, j0 + 44u, acc11);
    store_quad(gi, j0 + 48u, acc12);
    store_quad(gi, j0 + 52u, acc13);
    store_quad(gi, j0 + 56u, acc14);
    store_quad(gi, j0 + 60u, acc15);
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
    let gi = wid.y * 2u * WIN_ROWS + lid.x;
    let gh = gi + WIN_ROWS;
    let ar = mm.a_off + min(gi, mm.m - 1u) * mm.a_rs;
    let ah = mm.a_off + min(gh, mm.m - 1u) * mm.a_rs;
    let j0 = wid.x * SG2_COLS;
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
    for (var k = 0u; k < mm.k; k += 4u) {
        let av = a_quad(ar, k, kl);
        let ah4 = a_quad(ah, k, kl);
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
    store_quad(gi, j0, acc0);
    store_quad(gi, j0 + 4u, acc1);
    store_quad(gi, j0 + 8u, acc2);
    store_quad(gi, j0 + 12u, acc3);
    store_quad(gi, j0 + 16u, acc4);
    store_quad(gi, j0 + 20u, acc5);
    store_quad(gi, j0 + 24u, acc6);
    store_quad(gi, j0 + 28u, acc7);
    store_quad(gh, j0, acc8);
    store_quad(gh, j0 + 4u, acc9);
    store_quad(gh, j0 + 8u, acc10);
    store_quad(gh, j0 + 12u, acc11);
    store_quad(gh, j0 + 16u, acc12);
    store_quad(gh, j0 + 20u, acc13);
    store_quad(gh, j0 + 24u, acc14);
    store_quad(gh, j0 + 28u, acc15);
}

//! A one-warp kernel that checks the tensor-core building blocks end to end:
//! `cp.async` global → shared, `ldmatrix.x4` into the A fragment, B fragments
//! from a row-major `W[8, 16]`, and `mma.m16n8k16`. The host compares its
//! `C = A · Wᵀ` with a CPU product, which pins down the fragment maps that
//! the GEMM kernels rely on.

use crate::ptx;

/// Fragment maps of `mma.m16n8k16` (g = lane / 4, t = lane % 4):
/// - A (16×16, row): a0 = A[g][2t..2t+2], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
/// - B (16×8, col) = W[8, 16] rows: b0 = W[g][2t..2t+2], b1 = W[g][2t+8..2t+10]
/// - C (16×8): c0,c1 = C[g][2t, 2t+1], c2,c3 = C[g+8][2t, 2t+1]
///
/// # Safety
/// `a`: 256 b16 values (16-aligned); `w`: 128 b16 values; `c`: 128 f32;
/// one warp, ≥ 512 bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn run(a: *const u16, w: *const u16, c: *mut f32, bf16: bool) {
    let lane = ptx::lane();
    let smem = ptx::smem_base();
    // 512 bytes of A = 32 chunks of 16 bytes: one per lane.
    unsafe { ptx::cp_async_16(smem + 16 * lane, (a as *const u8).add(16 * lane as usize)) };
    ptx::cp_async_commit();
    ptx::cp_async_wait::<0>();
    ptx::bar_sync();
    // Lane l addresses row l % 16, column half l / 16 (row stride 32 bytes).
    let frag_a = unsafe { ldmatrix_a(smem, lane) };
    let g = (lane / 4) as usize;
    let t = (lane % 4) as usize;
    let wp = w as *const u32;
    let frag_b = unsafe { [*wp.add((g * 16 + 2 * t) / 2), *wp.add((g * 16 + 2 * t + 8) / 2)] };
    let d = if bf16 { ptx::mma_bf16(frag_a, frag_b, [0.0; 4]) } else { ptx::mma_f16(frag_a, frag_b, [0.0; 4]) };
    unsafe {
        *c.add(g * 8 + 2 * t) = d[0];
        *c.add(g * 8 + 2 * t + 1) = d[1];
        *c.add((g + 8) * 8 + 2 * t) = d[2];
        *c.add((g + 8) * 8 + 2 * t + 1) = d[3];
    }
}

#[inline(always)]
unsafe fn ldmatrix_a(smem: u32, lane: u32) -> [u32; 4] {
    unsafe { ptx::ldmatrix_x4(smem + (lane % 16) * 32 + (lane / 16) * 16) }
}

/* tg_gemm_f32's arguments checked and described as a batch (gemm_internal.h): plain C, shared by the GEMM library
 * and the BLAS kernel, which builds without AVX-512. */
#include "gemm_internal.h"

/* A batch whose B is shared and whose other operands step by whole row blocks is one taller GEMM. */
static void fold_batch_into_rows(gemm_batch *g) {
    int64_t m = g->m;
    int foldable = g->batch > 1 && g->b_bs == 0 && g->a_bs == m * g->a_rs && g->c_bs == m * g->c_rs &&
                   (!g->ep.bias || g->bias_bs == m * g->ep.bias_rs) &&
                   (!g->ep.residual || g->residual_bs == m * g->ep.residual_rs);
    if (!foldable) return;
    g->m *= g->batch;
    g->batch = 1;
}

int tg_describe_gemm(gemm_batch *g, pack_b_fn pack, TG_GEMM_PARAMS) {
    if (bias && bias_cs != 0 && bias_cs != 1) return TG_GEMM_BAD_STRIDE;
    int gradient = activation == TG_ACT_GELU_TANH_GRAD && residual; /* reads the residual, after no flag */
    if (!(tg_activation_known(activation & ~TG_ACT_AFTER_RESIDUAL) || gradient) || !tg_activation_known(a_prologue) ||
        !tg_activation_known(b_prologue))
        return TG_GEMM_BAD_ACTIVATION;
    *g = (gemm_batch){
        .batch = batch, .m = m, .n = n, .k = k,
        .a = a, .a_bs = a_bs, .a_rs = a_rs, .a_cs = a_cs,
        .b = b, .b_bs = b_bs, .b_src = {.pack = pack, .rs = b_rs, .cs = b_cs},
        .c = c, .c_bs = c_bs, .c_rs = c_rs, .bias_bs = bias_bs, .residual_bs = residual_bs,
        .ep = tg_epilogue_of(alpha, activation, bias, bias_rs, bias_cs, residual, residual_rs),
        .a_prologue = a_prologue, .b_prologue = b_prologue,
    };
    fold_batch_into_rows(g);
    return TG_GEMM_OK;
}

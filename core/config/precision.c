#include "precision.h"

#include "../util/util.h"

#include <string.h>

const char *tr_dtype_name(enum tr_dtype d)
{
    switch (d) {
    case TR_F32: return "fp32";
    case TR_BF16: return "bf16";
    case TR_F16: return "fp16";
    case TR_I32: return "i32";
    default: return "an unknown dtype";
    }
}

int tr_precision_check(const struct tr_precision_policy *pol, const char *plugin,
                       const char *where, const char *device, tr_err *err)
{
    /* master and grad: the optimizers, the gradient clip and the all-reduce
     * all read and write fp32 buffers; there is no half copy to update */
    if (pol->master != TR_F32)
        return tr_fail(err,
                       "%s: precision '%s' asks for master = %s, which device '%s' cannot "
                       "honour: every backend keeps master weights and optimizer state in "
                       "fp32; use a policy with master = fp32 (all shipped ones: "
                       "precision = \"bf16\" computes in bf16 with fp32 master weights)",
                       where, plugin, tr_dtype_name(pol->master), device);
    if (pol->grad != TR_F32)
        return tr_fail(err,
                       "%s: precision '%s' asks for grad = %s, which device '%s' cannot "
                       "honour: every backend keeps parameter gradients in fp32; use a policy "
                       "with grad = fp32 (all shipped ones do)",
                       where, plugin, tr_dtype_name(pol->grad), device);
    if (pol->compute != TR_F32 && pol->compute != TR_BF16 && pol->compute != TR_F16)
        return tr_fail(err,
                       "%s: precision '%s' asks for compute = %s, which device '%s' cannot "
                       "honour: GEMMs run in fp32, bf16 or fp16; fix the plugin's policy",
                       where, plugin, tr_dtype_name(pol->compute), device);
    /* tf32 is a tensor-core format: the cuda backend runs fp32 GEMMs in it
     * (cuBLASLt's fast-TF32 compute), the cpu backend has no such GEMM.
     * Accepting the flag there would price and promise a speed no run gets,
     * so it is refused rather than ignored. */
    if (pol->allow_tf32 && strcmp(device, "cuda") != 0)
        return tr_fail(err,
                       "%s: precision '%s' asks for allow_tf32 = true, which device '%s' "
                       "cannot honour: only the cuda backend runs GEMMs in tf32 (CPUs have no "
                       "tf32 arithmetic); remove allow_tf32 (fp32 GEMMs stay fp32), or use "
                       "precision = \"bf16\" for half-precision speed",
                       where, plugin, device);
    return TR_OK;
}

double tr_precision_peak_tflops(const struct tr_hardware *hw, const struct tr_precision_policy *pol,
                                const char **kind)
{
    /* the table's bf16 column is the 16-bit tensor-core peak, fp16's too */
    int half = pol->compute == TR_BF16 || pol->compute == TR_F16;
    /* fp32 GEMMs under allow_tf32 run on the tf32 tensor cores */
    int tf32 = !half && pol->allow_tf32;
    if (kind)
        *kind = tf32 ? "tf32" : tr_dtype_name(half ? pol->compute : TR_F32);
    if (!hw)
        return 0;
    return half ? hw->tflops_bf16 : tf32 ? hw->tflops_tf32 : hw->tflops_fp32;
}

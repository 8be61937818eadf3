// The kernels for AVX-512 with VNNI (F, BW, VL, DQ): Intel since Cascade Lake, AMD since Zen 4.
// Only this file's functions carry the target; nothing from torch is compiled here.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <limits>

#include "kernel_table.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2")
namespace nanoserve::avx512 {
#define NS_AVX512 1
#define NS_ROW_TILE 8
#define NS_ISA_NAME "avx512-vnni"
#include "simd.h"
#include "recurrent.h"
#include "kernels.h"
}  // namespace nanoserve::avx512
#pragma GCC pop_options

namespace nanoserve {
const KernelTable kAvx512Table = avx512::table;
}
